"""The order of semantic and hybrid recall's steps (memfabric.recall): with a broker in this
process, the query is embedded while the database resolves the scope, and the vector store
is searched only after the resolution, with exactly its filter; a denied or malformed
resolution searches nothing. The steps are driven by hand here; the database round trips
themselves are tested end to end in tests/integration/test_projection.py."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from memfabric.broker import LocalBroker, RemoteBroker
from memfabric.embedding import MiniLMEmbedder
from memfabric.recall import _Database, _Embed, _FindBroker, _plan, _Search
from memfabric.vectors import EdgeVectorStore

REQUEST = {"run_id": "00000000-0000-4000-8000-000000000001", "mode": "semantic",
           "query": "which currency do invoices use", "limit": 3}  # fmt: skip
RESOLVED = {
    "status": "resolved",
    "filter": {"tenant_id": "acme", "scope_keys": ["subject:user-1", "tenant"],
               "tiers": ["episodic"], "valid_at": "2026-12-01T00:00:00+00:00",
               "min_confidence": 0.0, "excluded_labels": [], "limit": 3},
}  # fmt: skip


@pytest.fixture
def broker(tmp_path: Path, minilm: MiniLMEmbedder) -> Any:
    store = EdgeVectorStore(tmp_path / "edge")
    store.ensure_collections(minilm.model, minilm.version, minilm.dims)
    yield LocalBroker(store, minilm, {})
    store.close()


@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_the_query_is_embedded_while_the_scope_is_resolved(
    broker: LocalBroker, minilm: MiniLMEmbedder, mode: str
) -> None:
    plan = _plan({**REQUEST, "mode": mode}, False)
    assert isinstance(next(plan), _FindBroker)
    embed = plan.send(broker)
    assert isinstance(embed, _Embed), "the embedding starts before the resolution"
    vector = embed.start()
    resolve = plan.send(vector)
    assert isinstance(resolve, _Database) and "candidates" not in resolve.request
    search = plan.send(RESOLVED)
    assert isinstance(search, _Search), "the store is searched only after the resolution"
    assert search.flt == RESOLVED["filter"] and search.vector is vector
    assert vector.result() == minilm.embed([REQUEST["query"]])[0]
    assert search.run() == []  # the empty shard, searched with the resolved filter
    recheck = plan.send([("00000000-0000-4000-8000-0000000000aa", 0.5)])
    assert isinstance(recheck, _Database)
    assert recheck.request["candidates"] == [
        {"memory_id": "00000000-0000-4000-8000-0000000000aa", "score": 0.5}
    ]


@pytest.mark.parametrize("status", ["denied", "malformed"])
def test_a_refused_resolution_searches_nothing(broker: LocalBroker, status: str) -> None:
    plan = _plan(REQUEST, False)
    next(plan)
    vector: Future[list[float]] = plan.send(broker).start()
    plan.send(vector)
    refused = {"status": status, "reason": "no"}
    with pytest.raises(StopIteration) as done:
        plan.send(refused)
    assert done.value.value is refused
    vector.result()  # the embedding finishes and is dropped


def test_a_broker_in_another_process_embeds_during_the_resolution_too(tmp_path: Path) -> None:
    """`memfabric serve` is asked for the vector alone while the database resolves; when it
    cannot answer that (gone here; or older than the client), the search asks it with the
    query, as before, and its error is the search's."""
    plan = _plan(REQUEST, False)
    next(plan)
    broker = RemoteBroker(tmp_path / "no.sock")
    embed = plan.send(broker)
    assert isinstance(embed, _Embed)
    vector = embed.start()
    resolve = plan.send(vector)
    assert isinstance(resolve, _Database)
    search = plan.send(RESOLVED)
    assert isinstance(search, _Search) and search.vector is vector
    with pytest.raises(OSError):
        vector.result()
    with pytest.raises(OSError):
        search.run()  # the fallback: a search with the query, on the same (absent) socket
