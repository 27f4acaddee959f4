"""How memfabric serve runs its projector and shards: MEMFABRIC_PROJECTOR_EMBED, _PIPELINE
and MEMFABRIC_EDGE_SHARDS."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memfabric.constants import INDEXED_TIERS
from memfabric.embedding import (
    E5_DIMS,
    E5_MODEL,
    E5_VERSION,
    MINILM_DIMS,
    MINILM_MODEL,
    MINILM_VERSION,
    E5Embedder,
    MiniLMEmbedder,
    ProcessEmbedder,
)
from memfabric.errors import Misconfigured
from memfabric.runtime import contract_change, embedder_for
from memfabric.settings import PROJECTION_ENV, Settings, usable_cpus
from memfabric.vectors import EdgeVectorStore


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


def test_without_a_setting_the_deployment_embedder_is_e5_inline_and_in_a_child() -> None:
    """The default of a new deployment (migration 0056), and the fallback when the database
    names none: e5, the same contract in process and in the projector's child."""
    inline, child = embedder_for(None), embedder_for({"embedder": "e5"}, child=True)
    assert isinstance(inline, E5Embedder) and isinstance(child, ProcessEmbedder)
    assert child.kind == "e5"
    assert (child.model, child.version, child.dims) == (E5_MODEL, E5_VERSION, E5_DIMS)
    assert (inline.model, inline.version, inline.dims) == (E5_MODEL, E5_VERSION, E5_DIMS)


def test_the_flush_cadence_is_milliseconds_a_second_by_default() -> None:
    assert Settings.from_env({}).projector_flush_ms == 1000
    assert Settings.from_env({"MEMFABRIC_PROJECTOR_FLUSH_MS": "0"}).projector_flush_ms == 0
    assert Settings.from_env({"MEMFABRIC_PROJECTOR_FLUSH_MS": "250"}).projector_flush_ms == 250
    assert "MEMFABRIC_PROJECTOR_FLUSH_MS" in PROJECTION_ENV
    for bad in ("-1", "soon"):
        with pytest.raises(Misconfigured, match="MEMFABRIC_PROJECTOR_FLUSH_MS"):
            Settings.from_env({"MEMFABRIC_PROJECTOR_FLUSH_MS": bad})


def test_edge_shards_auto_means_child_only_in_serve_with_two_cpus() -> None:
    s = Settings.from_env({})
    assert s.edge_shards == "auto"
    assert s.shard_processes(serving=False) is False  # a library, a test, `make demo`
    assert s.shard_processes(serving=True) is (usable_cpus() >= 2)
    for value, expected in (("child", True), ("inline", False)):
        chosen = Settings.from_env({"MEMFABRIC_EDGE_SHARDS": value})
        assert chosen.shard_processes(serving=True) is expected
        assert chosen.shard_processes(serving=False) is expected
    with pytest.raises(Misconfigured, match="MEMFABRIC_EDGE_SHARDS"):
        Settings.from_env({"MEMFABRIC_EDGE_SHARDS": "process"})


def test_edge_shards_auto_follows_this_process_cpu_affinity() -> None:
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # this process may run on one CPU only
        assert usable_cpus() == 1
        assert Settings.from_env({}).shard_processes(serving=True) is False
        if len(before) >= 2:
            os.sched_setaffinity(0, set(sorted(before)[:2]))
            assert Settings.from_env({}).shard_processes(serving=True) is True
    finally:
        os.sched_setaffinity(0, before)


def test_a_changed_embedder_contract_is_told_with_the_rebuild_to_run(tmp_path: Path) -> None:
    """An upgrade that changes the embedder's version (0.8.0's text rule) binds new, empty
    collections: `memfabric serve` says so, naming the command that fills them."""
    store = EdgeVectorStore(tmp_path / "edge")
    try:
        first = store.aliases()
        store.ensure_collections(MINILM_MODEL, "old;text=v1", MINILM_DIMS)
        assert (
            contract_change(first, store.aliases(), store.collections()) is None
        )  # a first binding moves nothing
        before = store.aliases()
        store.ensure_collections(MINILM_MODEL, "old;text=v1", MINILM_DIMS)
        assert (
            contract_change(before, store.aliases(), store.collections()) is None
        )  # the same contract again
        store.ensure_collections(MINILM_MODEL, MINILM_VERSION, MINILM_DIMS)
        after = store.aliases()
        told = contract_change(before, after, store.collections())
    finally:
        store.close()
    assert told is not None and "memfabric rebuild qdrant" in told
    assert told.startswith("the embedder's contract changed ("), told
    assert all(f"mem_{tier}" in told for tier in INDEXED_TIERS)
    assert before["mem_episodic"] in told and after["mem_episodic"] in told
