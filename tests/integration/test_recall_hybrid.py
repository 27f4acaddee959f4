"""Hybrid recall end to end: a real Qdrant Edge shard, the real MiniLM embedder, the broker
behind a real unix socket, and the database's fusion of lexical and vector ranks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import Fabric, drained, lent
from memfabric.broker import LocalBroker, RemoteBroker, serve_socket
from memfabric.embedding import MiniLMEmbedder
from memfabric.projector import Projector
from memfabric.recall import recall
from memfabric.vectors import EdgeVectorStore


@pytest.fixture(params=[False, True], ids=["inline", "child"])
def projector(
    fabric: Fabric,
    minilm: MiniLMEmbedder,
    request: pytest.FixtureRequest,
    kept_stores: dict[Any, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Projector]:
    """A projector of this test's database into an empty Edge store: the module's tests
    share one store of each kind, emptied after each test (`conftest.lent`)."""

    def make() -> EdgeVectorStore:
        # child: each shard owned by a child process (MEMFABRIC_EDGE_SHARDS=child)
        where = tmp_path_factory.mktemp("kept") / "qdrant"
        store = EdgeVectorStore(where, shard_processes=request.param)
        store.ensure_collections(minilm.model, minilm.version, minilm.dims)
        return store

    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    with lent(kept_stores, request.param, make) as store:
        yield Projector(url, minilm, store, None)


@pytest.fixture
def socket_broker(
    projector: Projector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """`memfabric serve`'s socket, served in this process; the environment points at it."""
    assert projector.store is not None
    path = tmp_path / "run" / "memfabric.sock"
    server = serve_socket(
        LocalBroker(projector.store, projector.embedder, {}), path, threading.Lock()
    )
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.setenv("MEMFABRIC_SOCKET", str(path))
    yield path
    server.shutdown()
    server.server_close()


def project(projector: Projector) -> None:
    """The vector projection drained once (`conftest.drained`)."""
    drained(projector, ("qdrant",))


def by_id(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["memory_id"]: r for r in answer["records"]}


def test_default_recall_is_hybrid_through_the_broker_it_finds(
    fabric: Fabric, projector: Projector, socket_broker: Path
) -> None:
    run = fabric.open_run()
    paraphrase = fabric.form(run, "Customer wants to be billed in euros")
    fabric.form(run, "The weather in Amsterdam was rainy")
    project(projector)
    # Formed after the projection ran: only the database can find it yet.
    unprojected = fabric.form(run, "Purchase order PO-7731 was approved")
    agent = fabric.connect("mf_agent_a")
    request = {"run_id": str(run), "tiers": ["episodic"], "limit": 10}

    answer = recall(agent, {**request, "query": "which currency for invoices?"})
    assert answer["status"] == "served"
    assert answer["mode_served"] == "hybrid"
    assert answer["records"][0]["memory_id"] == paraphrase  # no shared word: vector found it
    assert answer["records"][0]["retrieval"].keys() == {"vector"}

    found = by_id(recall(agent, {**request, "query": "purchase order PO-7731"}))
    assert found[unprojected]["retrieval"] == {"lexical": 1}  # a record only one retriever has
    assert all(0 < r["score"] <= 1 for r in found.values())
    both = [r for r in found.values() if r["retrieval"].keys() == {"lexical", "vector"}]
    assert all(r["score"] <= 1 for r in both)

    # No query with words: nothing to fuse, served text, never an error.
    assert recall(agent, {**request, "query": "   "})["mode_served"] == "text"
    events = fabric.count("events", "event_type LIKE 'memory.recall.%'")
    assert events == 3


def test_a_tier_without_a_collection_never_crashes_the_broker(
    fabric: Fabric, projector: Projector, socket_broker: Path
) -> None:
    with fabric.su() as su:
        su.execute(
            "UPDATE fabric.agents SET memory_profile = jsonb_set(memory_profile,"
            ' \'{recall_scope,tiers}\', \'["episodic", "semantic", "relational"]\')'
            " WHERE agent_id = 'com-agt-003'"
        )
    run = fabric.open_run()
    fabric.form(run, "Customer wants to be billed in euros")
    project(projector)
    agent = fabric.connect("mf_agent_a")
    broker = RemoteBroker(socket_broker, timeout=60)
    for mode in ("semantic", "hybrid"):
        answer = recall(
            agent,
            {
                "run_id": str(run),
                "mode": mode,
                "tiers": ["episodic", "relational"],
                "query": "billing currency",
            },
            broker,
        )
        assert answer["status"] == "served", answer
        assert answer["tiers_served_lexically"] == ["relational"]
        assert answer["tiers_denied"] == []
        assert answer["records"]
    # Asked directly for a tier it has no collection for, the broker answers nothing.
    resolved = {
        "tenant_id": "acme",
        "scope_keys": ["subject:user-8842"],
        "tiers": ["relational"],
        "valid_at": "2026-12-01T00:00:00+00:00",
        "min_confidence": 0,
        "excluded_labels": [],
    }
    assert broker.search(resolved, "billing", 5) == []
    only_relational = recall(
        agent,
        {"run_id": str(run), "mode": "semantic", "tiers": ["relational"], "query": "billing"},
        broker,
    )
    assert only_relational["status"] == "served"
    assert only_relational["records"] == []


def test_the_serve_socket_embeds_alone_and_searches_with_a_vector(
    fabric: Fabric, projector: Projector, socket_broker: Path, minilm: MiniLMEmbedder
) -> None:
    """op embed answers the query's vector (no filter, no search); op search with that
    vector answers what op search with the query answers."""
    run = fabric.open_run()
    fabric.form(run, "Customer asked to be invoiced in euros from next quarter")
    fabric.form(run, "The shipment to Rotterdam was delayed at customs")
    project(projector)
    broker = RemoteBroker(socket_broker, timeout=60)
    query = "which currency do invoices use"
    vector = broker.embed_query(query)
    assert vector == minilm.embed([query])[0]
    resolved = recall(
        fabric.connect("mf_agent_a"),
        {"run_id": str(run), "mode": "semantic", "query": query, "tiers": ["episodic"]},
        broker,
    )
    assert resolved["status"] == "served" and resolved["records"]
    # the subject's scope key as the projection holds it (its pseudonym: docs/security.md)
    ref = (
        fabric.su()
        .execute("SELECT subject_ref FROM fabric.subject_keys WHERE subject_id = 'user-8842'")
        .fetchone()
    )
    assert ref is not None
    flt = {"tenant_id": "acme", "scope_keys": [f"subject:{ref[0]}"], "tiers": ["episodic"],
           "valid_at": "2030-01-01T00:00:00+00:00", "min_confidence": 0.0,
           "excluded_labels": [], "limit": 5}  # fmt: skip
    by_query = broker.search(flt, query, 5)
    assert by_query and broker.search_vector(flt, vector, 5) == by_query
