"""How memfabric serve runs its projector: MEMFABRIC_PROJECTOR_EMBED and _PIPELINE."""

from __future__ import annotations

import pytest

from memfabric.embedding import MiniLMEmbedder, ProcessEmbedder
from memfabric.errors import Misconfigured
from memfabric.runtime import embedder_for
from memfabric.settings import PROJECTION_ENV, Settings


def test_defaults_embed_inline_and_run_serially() -> None:
    s = Settings.from_env({})
    assert (s.projector_embed, s.projector_pipeline) == ("inline", "serial")
    s = Settings.from_env(
        {"MEMFABRIC_PROJECTOR_EMBED": " Child ", "MEMFABRIC_PROJECTOR_PIPELINE": "pipelined"}
    )
    assert (s.projector_embed, s.projector_pipeline) == ("child", "pipelined")
    assert {"MEMFABRIC_PROJECTOR_EMBED", "MEMFABRIC_PROJECTOR_PIPELINE"} <= set(PROJECTION_ENV)


@pytest.mark.parametrize(
    ("name", "value"),
    [("MEMFABRIC_PROJECTOR_EMBED", "gpu"), ("MEMFABRIC_PROJECTOR_PIPELINE", "parallel")],
)
def test_unknown_values_are_refused(name: str, value: str) -> None:
    with pytest.raises(Misconfigured, match=name):
        Settings.from_env({name: value})


def test_the_deployment_embedder_in_a_child_keeps_the_contract() -> None:
    inline = embedder_for({"embedder": "minilm"})
    child = embedder_for({"embedder": "minilm"}, child=True)
    assert isinstance(inline, MiniLMEmbedder) and isinstance(child, ProcessEmbedder)
    assert (child.model, child.version, child.dims) == (inline.model, inline.version, 384)
    assert child.pid is None  # started by the first embed, not by being configured
    http = embedder_for({"embedder": "http", "url": "http://127.0.0.1:1", "model": "m"}, child=True)
    assert isinstance(http, ProcessEmbedder) and http.kind == "http" and http.model == "m"


def test_the_flush_cadence_is_milliseconds_a_second_by_default() -> None:
    assert Settings.from_env({}).projector_flush_ms == 1000
    assert Settings.from_env({"MEMFABRIC_PROJECTOR_FLUSH_MS": "0"}).projector_flush_ms == 0
    assert Settings.from_env({"MEMFABRIC_PROJECTOR_FLUSH_MS": "250"}).projector_flush_ms == 250
    assert "MEMFABRIC_PROJECTOR_FLUSH_MS" in PROJECTION_ENV
    for bad in ("-1", "soon"):
        with pytest.raises(Misconfigured, match="MEMFABRIC_PROJECTOR_FLUSH_MS"):
            Settings.from_env({"MEMFABRIC_PROJECTOR_FLUSH_MS": bad})
