"""Projections (R-PROJ-1): the outbox into Qdrant (Edge, and qdrant-client for
the QDRANT_URL path) and the Bolt graph; semantic recall re-checked by the database;
rebuild, drill and verify; faults."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from neo4j.exceptions import ServiceUnavailable
from psycopg.types.json import Jsonb

from conftest import Fabric, drained, episode, lent
from memfabric import ops
from memfabric.broker import LocalBroker
from memfabric.embedding import MiniLMEmbedder
from memfabric.graph import GraphStore
from memfabric.operational import EdgeOperationalStore, OpsRow
from memfabric.projector import Projector
from memfabric.recall import arecall, recall
from memfabric.vectors import EdgeVectorStore, QdrantServerStore, VectorStore
from ops_pack import regime_fingerprints
from servers import DATABASE, PASSWORD, GraphServer, graph_sh

# starts the projection stores and takes a graph server away (up to a minute)
pytestmark = pytest.mark.slow


class CountingEmbedder:
    """The real model, counting what it embeds (to prove rebuilds re-embed nothing)."""

    def __init__(self, inner: MiniLMEmbedder) -> None:
        self.inner, self.texts = inner, 0
        self.model, self.version, self.dims = inner.model, inner.version, inner.dims

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.texts += len(texts)
        return self.inner.embed(texts)


@pytest.fixture(params=["edge", "qdrant-client"])
def vectors(
    request: pytest.FixtureRequest,
    minilm: MiniLMEmbedder,
    kept_stores: dict[Any, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VectorStore]:
    """An empty store of each backend: the module's tests share one, emptied after each test
    (`conftest.lent`)."""

    def make() -> VectorStore:
        store: VectorStore = (
            EdgeVectorStore(tmp_path_factory.mktemp("kept") / "qdrant")
            if request.param == "edge"
            else QdrantServerStore(location=":memory:")
        )
        store.ensure_collections(minilm.model, minilm.version, minilm.dims)
        return store

    with lent(kept_stores, request.param, make) as store:
        yield store


@pytest.fixture
def graph(graph_server: GraphServer) -> Iterator[GraphStore]:
    # one second of retries, not the driver's 30: the server-away test waits them out
    with GraphStore(graph_server.uri, "root", PASSWORD, DATABASE, retry_seconds=1.0) as g:
        g.ensure_schema()
        g.wipe()
        yield g


@pytest.fixture
def projector(
    fabric: Fabric, vectors: VectorStore, graph: GraphStore, minilm: MiniLMEmbedder
) -> Projector:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    return Projector(url, CountingEmbedder(minilm), vectors, graph)  # type: ignore[arg-type]


def drain(projector: Projector, settled: bool = True) -> int:
    """Both projections drained once (`conftest.drained`)."""
    return drained(projector, ("qdrant", "graph"), settled=settled)


def point_ids(store: VectorStore, tier: str) -> set[str]:
    return {i for i, _ in store.scroll(tier)}


@pytest.fixture
def seeded(fabric: Fabric) -> dict[str, Any]:
    run = fabric.open_run()
    a = fabric.form(run, "Customer asked to be invoiced in euros")
    b = fabric.form(run, "Customer confirmed euros as invoice currency")
    c = fabric.form(run, "The weather in Amsterdam was rainy")
    s = fabric.form(
        run,
        "invoices are in EUR",
        tier="semantic",
        derived_from=[a, b],
        content={"key": "invoice.currency", "value": "EUR", "text": "invoices are in EUR"},
    )
    fabric.settle()  # the tests drain once: every seeded event must be readable by then
    return {"run": run, "episodes": [a, b, c], "semantic": s}


def test_projection_follows_formation_promotion_supersession_and_erasure(
    fabric: Fabric, projector: Projector, seeded: dict[str, Any]
) -> None:
    store, graph = projector.store, projector.graph
    assert store is not None and graph is not None
    assert drain(projector) > 0
    assert point_ids(store, "episodic") == set(seeded["episodes"])
    assert point_ids(store, "semantic") == {seeded["semantic"]}
    assert graph.count_memories("acme") == 4
    assert fabric.count("memory_embeddings") == 4
    assert drain(projector) == 0  # nothing left after the cursor

    promoted = fabric.call(
        "mf_committer", "SELECT fabric_api.promote(%s, 'profile')", seeded["semantic"]
    )
    assert promoted["tier"] == "profile"
    drain(projector)
    assert point_ids(store, "semantic") == set() and point_ids(store, "profile") == {
        seeded["semantic"]
    }

    victim = seeded["episodes"][2]
    approval = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", victim)[
        "approval_id"
    ]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)
    drain(projector)
    assert point_ids(store, "episodic") == set(seeded["episodes"]) - {victim}
    export = graph.export("acme").as_json()
    assert "rainy" not in export and victim in export  # shell and edges kept
    assert fabric.count("memory_embeddings", f"memory_id = '{victim}'") == 0


def test_semantic_recall_is_resolved_searched_then_rechecked(
    fabric: Fabric, projector: Projector, seeded: dict[str, Any]
) -> None:
    drain(projector)
    assert projector.store is not None
    broker = LocalBroker(projector.store, projector.embedder, {})
    agent = fabric.connect("mf_agent_a")
    request = {
        "run_id": str(seeded["run"]),
        "mode": "semantic",
        "query": "which currency do invoices use",
        "tiers": ["episodic"],
        "limit": 2,
    }
    answer = recall(agent, request, broker)
    assert answer["status"] == "served"
    assert {r["memory_id"] for r in answer["records"]} == set(seeded["episodes"][:2])
    assert answer["records"][0]["score"] >= answer["records"][1]["score"]

    # A stale projection never leaks: erase one, do not project, recall again.
    victim = answer["records"][0]["memory_id"]
    approval = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'x')", victim)[
        "approval_id"
    ]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)
    stale = recall(agent, request, broker)
    assert stale["status"] == "served"
    kept = {r["memory_id"] for r in stale["records"]}
    assert victim not in kept and set(seeded["episodes"][:2]) - {victim} <= kept, kept

    hybrid = recall(agent, {**request, "mode": "hybrid", "query": "euros"}, broker)
    assert hybrid["status"] == "served" and hybrid["records"]
    denied = recall(agent, {**request, "scope": {"subject_id": "user-9999"}}, broker)
    assert denied["status"] == "denied"
    events = [e["event_type"] for e in fabric.events("event_type LIKE 'memory.recall.%'")]
    assert events == [
        "memory.recall.served",
        "memory.recall.served",
        "memory.recall.served",
        "memory.recall.denied",
    ]


def test_async_recall_embeds_during_the_resolution_and_answers_as_sync_recall(
    fabric: Fabric, projector: Projector, seeded: dict[str, Any]
) -> None:
    """arecall drives the same steps (the query embedded in a worker thread while the
    database resolves the scope): the same records in the same order, one audit event each."""
    drain(projector)
    assert projector.store is not None
    broker = LocalBroker(projector.store, projector.embedder, {})
    request = {"run_id": str(seeded["run"]), "query": "which currency do invoices use",
               "tiers": ["episodic"], "limit": 3}  # fmt: skip
    before = fabric.count("events", "event_type = 'memory.recall.served'")

    async def ask(mode: str) -> dict[str, Any]:
        conninfo = psycopg.conninfo.make_conninfo(fabric.url, user="mf_agent_a")
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            return await arecall(conn, {**request, "mode": mode}, broker)

    for mode in ("semantic", "hybrid"):
        sync = recall(fabric.connect("mf_agent_a"), {**request, "mode": mode}, broker)
        answer = asyncio.run(ask(mode))
        assert answer["status"] == "served" and answer["mode_served"] == mode
        assert [r["memory_id"] for r in answer["records"]] == [
            r["memory_id"] for r in sync["records"]
        ]
        assert answer["records"]
    assert fabric.count("events", "event_type = 'memory.recall.served'") == before + 4


def test_rebuild_and_drill_give_identical_answers_without_reembedding(
    fabric: Fabric, projector: Projector, seeded: dict[str, Any]
) -> None:
    drain(projector)
    embedded = projector.embedder.texts  # type: ignore[attr-defined]
    report = ops.verify(projector)
    assert report["ok"], report
    result = ops.drill(projector)
    assert result["identical"], result["differences"]
    assert result["rebuilt"] == {"qdrant": 4, "graph": 4}
    assert projector.embedder.texts - embedded == 4 * 2  # type: ignore[attr-defined]  # probes only
    assert ops.verify(projector)["ok"]
    assert drain(projector) == 0 or ops.verify(projector)["ok"]


def test_verify_reports_drift_and_orphans(
    fabric: Fabric, projector: Projector, seeded: dict[str, Any]
) -> None:
    drain(projector)
    assert projector.store is not None
    projector.store.delete("episodic", [seeded["episodes"][0]])
    projector.store.set_payload(
        "episodic", [seeded["episodes"][1]], {"consolidation_state": "expired"}
    )
    report = ops.verify(projector)
    assert not report["ok"]
    assert report["qdrant"]["missing"] == [seeded["episodes"][0]]
    assert report["qdrant"]["drift"] == [seeded["episodes"][1]]


def test_a_slow_transactions_events_are_never_skipped(fabric: Fabric, projector: Projector) -> None:
    run = fabric.open_run()
    slow_proposal = fabric.propose("mf_agent_a", episode("slow one"), run)["proposal_id"]
    fast_proposal = fabric.propose("mf_agent_a", episode("fast one"), run)["proposal_id"]
    slow = fabric.connect("mf_committer", autocommit=False)
    slow_id = slow.execute(
        "SELECT fabric_api.commit(%s) ->> 'memory_id'", (slow_proposal,)
    ).fetchone()[0]  # type: ignore[index]
    fast_id = fabric.commit(fast_proposal)["memory_id"]  # commits while the slow one is open
    drain(projector, settled=False)  # settling would wait for the slow one
    assert projector.store is not None
    assert point_ids(projector.store, "episodic") == set()  # held back below the slow xmin
    slow.commit()
    drain(projector)
    assert point_ids(projector.store, "episodic") == {slow_id, fast_id}


class FailingStore:
    """Wraps a store and fails once, after the first write of a batch (a crash mid-batch)."""

    def __init__(self, inner: VectorStore) -> None:
        self.inner, self.failed = inner, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def upsert(self, tier: str, points: Any) -> None:
        self.inner.upsert(tier, points[:1])
        if not self.failed:
            self.failed = True
            raise RuntimeError("killed mid-batch")
        self.inner.upsert(tier, points)


def test_projector_killed_mid_batch_resumes_without_loss(
    fabric: Fabric, projector: Projector, seeded: dict[str, Any]
) -> None:
    assert projector.store is not None
    crashing = Projector(
        projector.conninfo, projector.embedder, FailingStore(projector.store), None
    )  # type: ignore[arg-type]
    with psycopg.connect(projector.conninfo, autocommit=True) as conn, pytest.raises(RuntimeError):
        crashing.drain(conn, "qdrant")
    drain(projector)
    assert ops.verify(projector)["ok"]
    assert ops.drill(projector)["identical"]


# The graph server's restart is most of this test's time, and the vector backend plays no
# part in it: one backend is enough.
@pytest.mark.parametrize("vectors", ["edge"], indirect=True)
def test_graph_server_away_and_back(
    fabric: Fabric,
    projector: Projector,
    seeded: dict[str, Any],
    graph_server: GraphServer,
) -> None:
    drain(projector)
    graph_sh(graph_server.env, "down", timeout=60)
    try:
        run = seeded["run"]
        late = fabric.form(run, "formed while the graph was away")
        assert drained(projector, ("qdrant",)) > 0  # the vector projection goes on
        with pytest.raises(ServiceUnavailable):  # the driver's error while the server is away
            drained(projector, ("graph",))
    finally:
        assert graph_sh(graph_server.env, "up").returncode == 0
    with GraphStore(graph_server.uri, "root", PASSWORD, DATABASE) as fresh:
        projector.graph = fresh
        drain(projector)
        assert late in fresh.export("acme").as_json()
        assert ops.verify(projector)["ok"]


def test_projector_loop_wakes_on_notify_and_applies(fabric: Fabric, projector: Projector) -> None:
    stop = threading.Event()
    thread = threading.Thread(
        target=projector.run, kwargs={"poll_seconds": 0.2, "should_stop": stop.is_set}
    )
    thread.start()
    try:
        run = fabric.open_run()
        rid = fabric.form(run, "notified")
        assert projector.store is not None
        for _ in range(100):
            if rid in point_ids(projector.store, "episodic"):
                break
            threading.Event().wait(0.1)
        assert rid in point_ids(projector.store, "episodic")
    finally:
        stop.set()
        thread.join(timeout=30)


def test_only_projectors_read_the_feed(fabric: Fabric) -> None:
    for login in ("mf_agent_a", "mf_committer"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            fabric.connect(login).execute(
                "SELECT * FROM fabric_api.projection_events_v2('qdrant', 10)"
            )
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.session("mf_agent_a").execute(
            "SELECT * FROM fabric_api.projection_records_v2(%s::uuid[])", ([],)
        )
    _ = Jsonb


class StoreWithFault:
    """Wraps a store; its first `upsert` raises `fault` (then, if `once`, it works)."""

    def __init__(self, inner: VectorStore, fault: Exception, once: bool) -> None:
        self.inner, self.fault, self.once, self.raised = inner, fault, once, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def upsert(self, tier: str, points: Any) -> None:
        if not (self.once and self.raised):
            self.raised += 1
            raise self.fault
        self.inner.upsert(tier, points)


def run_for(
    projector: Projector, seconds: float, until: Callable[[], bool] = lambda: False
) -> None:
    """Projector.run until it returns, raises, `until()` holds, or `seconds` pass."""
    deadline = time.monotonic() + seconds
    projector.run(
        ("qdrant",), poll_seconds=0.1, should_stop=lambda: until() or time.monotonic() > deadline
    )


def test_the_projector_loop_lets_a_programming_error_surface(
    fabric: Fabric, edge: VectorStore, minilm: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    buggy = StoreWithFault(edge, TypeError("a bug in a backend"), once=False)
    fabric.form(fabric.open_run(), "a bug must not be retried forever")
    with pytest.raises(TypeError, match="a bug in a backend"):
        run_for(Projector(url, minilm, buggy, None), 20)  # type: ignore[arg-type]
    assert buggy.raised == 1
    assert point_ids(edge, "episodic") == set()


def test_the_projector_loop_outlives_a_lost_connection(
    fabric: Fabric, edge: VectorStore, minilm: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    flaky = StoreWithFault(edge, ConnectionResetError("the store went away"), once=True)
    rid = fabric.form(fabric.open_run(), "applied after the store came back")
    # until the record is applied after the fault (it ran the whole 5 s before)
    run_for(
        Projector(url, minilm, flaky, None),  # type: ignore[arg-type]
        5,
        until=lambda: flaky.raised == 1 and rid in point_ids(edge, "episodic"),
    )
    assert flaky.raised == 1
    assert point_ids(edge, "episodic") == {rid}


def test_a_rebuild_that_does_not_end_is_remembered_until_one_does(
    fabric: Fabric, projector: Projector, seeded: dict[str, Any]
) -> None:
    drain(projector)
    assert projector.store is not None and projector.unfinished_rebuilds() == {}
    crashing = Projector(
        projector.conninfo, projector.embedder, FailingStore(projector.store), None
    )  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="killed mid-batch"):
        crashing.rebuild("qdrant")  # wiped, one point written, then gone
    assert len(point_ids(projector.store, "episodic")) == 1
    assert list(projector.unfinished_rebuilds()) == ["qdrant"]
    assert drain(projector) == 0  # the cursor did not move: a drain does not bring them back
    report = ops.verify(projector)
    assert not report["ok"] and list(report["unfinished_rebuilds"]) == ["qdrant"], report
    assert len(report["qdrant"]["missing"]) == 3
    assert projector.rebuild("qdrant") == 4
    assert projector.unfinished_rebuilds() == {}
    assert point_ids(projector.store, "episodic") == set(seeded["episodes"])
    assert ops.verify(projector)["ok"]


# -- the drill catches what it is for: a projection that no longer answers as Postgres does --


def _wrong_payload(projector: Projector, seeded: dict[str, Any]) -> None:
    """A live episode's point says it expired: the probes' filter leaves it out."""
    assert projector.store is not None
    projector.store.set_payload(
        "episodic", [seeded["episodes"][0]], {"consolidation_state": "expired"}
    )


def _missing_point(projector: Projector, seeded: dict[str, Any]) -> None:
    assert projector.store is not None
    projector.store.delete("episodic", [seeded["episodes"][1]])


def _extra_node(projector: Projector, seeded: dict[str, Any]) -> None:
    """A (:Memory) node of the tenant that no record stands behind."""
    graph = projector.graph
    assert graph is not None
    with graph._driver.session(database=graph.database) as session:
        session.run(
            "CREATE (:Memory {tenant_id: 'acme', memory_id: $id})", id=str(uuid.uuid4())
        ).consume()


# corruption -> the probes it shows in: a vector probe ("acme|<text>") or the graph ("acme")
CORRUPTIONS = {
    "wrong payload": (_wrong_payload, "vector"),
    "missing point": (_missing_point, "vector"),
    "extra node": (_extra_node, "graph"),
}


@pytest.mark.parametrize("vectors", ["edge"], indirect=True)
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_the_drill_reports_a_corrupted_projection(
    fabric: Fabric, projector: Projector, seeded: dict[str, Any], corruption: str
) -> None:
    """Corrupt one projection behind the projector's back: the drill's probes before the
    wipe differ from those after the rebuild, and it says so (and which probes); the
    rebuild repaired it, so the next drill is identical."""
    drain(projector)
    corrupt, kind = CORRUPTIONS[corruption]
    corrupt(projector, seeded)
    drilled = ops.drill(projector)
    assert drilled["identical"] is False and drilled["differences"], drilled
    assert drilled["records"] == 4
    if kind == "graph":
        assert drilled["differences"] == ["acme"], drilled
    else:
        assert all(d.startswith("acme|") for d in drilled["differences"]), drilled
    again = ops.drill(projector)
    assert again["identical"] is True and again["differences"] == [], again


def on_disk(store: VectorStore) -> bytes:
    """Every byte an Edge store keeps on disk (shards, write-ahead logs, payload indexes,
    manifest); nothing for the in-memory qdrant-client store."""
    if not isinstance(store, EdgeVectorStore):
        return b""
    return b"".join(p.read_bytes() for p in sorted(store.root.rglob("*")) if p.is_file())


def test_the_projections_never_hold_the_subject_or_session_id(
    fabric: Fabric, projector: Projector
) -> None:
    """The vector payloads, the Edge shard files and the graph's nodes hold the subject and
    session only as pseudonyms, which recall's filter computes alike; once the subject is
    erased, its key is gone and nothing on disk names it (docs/security.md)."""
    store, graph = projector.store, projector.graph
    assert store is not None and graph is not None
    subject, session = "user-8842", "sess-1f9c"
    run = fabric.open_run(subject=subject, session=session)
    ids = {
        vis: fabric.form(
            run,
            f"Customer wants invoices in euros ({vis})",
            scope={"tenant_id": "acme", "visibility": vis},
        )
        for vis in ("subject", "session")
    }
    fabric.settle()
    drain(projector)
    payloads = {i: p for tier in ("episodic",) for i, p in store.scroll(tier)}
    assert set(ids.values()) <= set(payloads)
    nodes = graph.export("acme").as_json()
    disk = on_disk(store)
    for raw in (subject, session):
        assert raw not in str(payloads) and raw not in nodes
        assert raw.encode() not in disk
    row = (
        fabric.su()
        .execute(
            "SELECT subject_ref FROM fabric.subject_keys"
            " WHERE tenant_id = 'acme' AND subject_id = %s",
            (subject,),
        )
        .fetchone()
    )
    assert row is not None
    subject_ref = row[0]
    assert payloads[ids["subject"]]["scope_key"] == f"subject:{subject_ref}"
    assert payloads[ids["subject"]]["subject_ref"] == subject_ref
    assert payloads[ids["session"]]["scope_key"].startswith("session:hmac:")
    assert f"subject:{subject_ref}" in nodes

    # recall computes the same scope keys: the subject's records are found by vector search
    broker = LocalBroker(store, projector.embedder, {})
    agent = fabric.connect("mf_agent_a")
    request = {"run_id": str(run), "query": "which currency for invoices", "tiers": ["episodic"]}
    for mode in ("semantic", "hybrid"):
        answer = recall(agent, {**request, "mode": mode}, broker)
        found = {r["memory_id"]: r["retrieval"] for r in answer["records"]}
        assert all("vector" in found.get(i, {}) for i in ids.values()), (mode, found)

    approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', %s, 'art. 17')",
        subject,
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)
    fabric.settle()
    drain(projector)
    assert not set(ids.values()) & point_ids(store, "episodic")
    assert fabric.count("subject_keys", f"subject_ref = '{subject_ref}'") == 0  # unlinkable
    nodes = graph.export("acme").as_json()
    disk = on_disk(store)
    for raw in (subject, session):
        assert raw not in nodes and raw.encode() not in disk
    assert subject_ref not in nodes  # the tombstones keep no scope key


# One operational store of a pack, declared for the drill through MEMFABRIC_OPS_PACKS.
OPS_ROWS = [
    OpsRow("acme", "bi-eu", ("v1",), [1.0, 0.0, 0.0, 0.0], {"label": "calm"}),
    OpsRow("acme", "bi-eu", ("v2",), [0.8, 0.2, 0.0, 0.0], {"label": "trending"}),
]
OPS_PACK = [regime_fingerprints(OPS_ROWS, model="trd-fingerprint")]


def test_the_full_store_drill_rebuilds_the_declared_operational_stores_too(
    fabric: Fabric,
    projector: Projector,
    seeded: dict[str, Any],
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drain(projector)
    monkeypatch.setenv("MEMFABRIC_OPS_PACKS", f"{__name__}:OPS_PACK")
    monkeypatch.setenv("MEMFABRIC_OPS_DIR", str(tmp_path / "ops"))
    with EdgeOperationalStore(tmp_path / "ops", OPS_PACK[0]) as store:
        store.rebuild()
        # written around the declared source: the drill's rebuild drops it, so answers differ
        store.upsert([OpsRow("acme", "bi-eu", ("stray",), [0.9, 0.1, 0.0, 0.0])])
    drilled = ops.drill_declared(projector)
    (operational,) = drilled["operational"]
    assert operational["collection"] == "ops_trd_regime_fingerprints"
    assert operational["identical"] is False and drilled["identical"] is False
    again = ops.drill_declared(projector)
    assert again["identical"] is True and again["operational"][0]["points"] == 2
