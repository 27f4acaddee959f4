"""The operational stores behind serve's socket: a process other than serve reaches an
`ops_*` collection on Qdrant Edge only through it, as the login PostgreSQL authenticated
(a broker ticket taken on the caller's own connection, redeemed by serve on its own), and
only as far as that login's allowlist goes. Real PostgreSQL, a real unix socket, a real
Qdrant Edge shard; refusals answer a SQLSTATE and write nothing."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import Fabric
from memfabric.broker import LocalBroker, serve_socket
from memfabric.errors import InvalidEnvelope, NotAuthorized
from memfabric.operational import (
    EdgeOperationalStore,
    OperationalError,
    OpsGate,
    OpsRow,
    RemoteOpsBroker,
    redeem_with,
)
from memfabric.vectors import EdgeVectorStore
from ops_pack import regime_fingerprints

COLLECTION = "ops_trd_regime_fingerprints"
SOURCE = [
    OpsRow("acme", "bi-eu", ("v1",), [1, 0, 0, 0], {"label": "calm"}),
    OpsRow("globex", "bi-eu", ("v1",), [1, 0, 0, 0], {"label": "globex calm"}),
]
ROW = OpsRow("acme", "bi-eu", ("v9",), [0, 1, 0, 0], {"label": "new"})
# the pack's one store, as MEMFABRIC_OPS_PACKS declares it (and the served fixture builds it)
PACK = [regime_fingerprints(SOURCE)]
# the domain workflow writes; the agent com-agt-004 (mf_agent_b) only reads; mf_agent_a has
# no grant at all
GRANTS = {"mf_workflow": {COLLECTION: "rw"}, "mf_agent_b": {COLLECTION: "r"}}


@dataclass
class Served:
    socket: Path
    store: EdgeOperationalStore
    vectors: EdgeVectorStore


@pytest.fixture
def served(fabric: Fabric, tmp_path: Path) -> Iterator[Served]:
    """What `memfabric serve` runs: the vector broker (with its mem_* collections) and the
    operational store behind one socket, tickets redeemed as the projector login."""
    store = EdgeOperationalStore(tmp_path / "ops", PACK[0])
    store.rebuild()
    vectors = EdgeVectorStore(tmp_path / "vectors")
    vectors.ensure_collections("test-static", "1", 4)
    projector = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    gate = OpsGate([store], GRANTS, redeem_with(projector))
    path = tmp_path / "serve.sock"
    server = serve_socket(LocalBroker(vectors, None, {}), path, threading.Lock(), gate)  # type: ignore[arg-type]
    try:
        yield Served(path, store, vectors)
    finally:
        server.shutdown()
        server.server_close()
        store.close()
        vectors.close()


def as_login(fabric: Fabric, served: Served, login: str) -> RemoteOpsBroker:
    return RemoteOpsBroker(served.socket, fabric.connect(login))


def raw(path: Path, *requests: dict[str, Any]) -> list[dict[str, Any]]:
    """Requests on one socket connection, as any process could send them."""
    answers = []
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(path))
        reader = conn.makefile("rb")
        for request in requests:
            conn.sendall(json.dumps(request).encode() + b"\n")
            answers.append(json.loads(reader.readline()))
    return answers


def test_an_allowlisted_login_reads_and_writes_its_collection(
    fabric: Fabric, served: Served
) -> None:
    with as_login(fabric, served, "mf_workflow") as writer:
        assert writer.login == "mf_workflow"  # named by PostgreSQL, not by the client
        assert writer.collections() == {COLLECTION: "rw"}
        (written,) = writer.upsert(COLLECTION, [ROW])
        hits = writer.search(COLLECTION, "acme", "bi-eu", [0, 1, 0, 0], 5)
    assert hits[0][0] == written and hits[0][2]["label"] == "new"
    assert {h[2]["tenant_id"] for h in hits} == {"acme"}  # the scope filter still holds
    assert served.store.count() == len(SOURCE) + 1
    with as_login(fabric, served, "mf_agent_b") as reader:
        assert [h[0] for h in reader.search(COLLECTION, "acme", "bi-eu", [0, 1, 0, 0], 1)] == [
            written
        ]


def test_a_login_without_a_grant_is_refused_and_nothing_is_written(
    fabric: Fabric, served: Served
) -> None:
    with as_login(fabric, served, "mf_agent_a") as stranger:
        assert stranger.login == "mf_agent_a"
        assert stranger.collections() == {}
        with pytest.raises(NotAuthorized) as refused:
            stranger.search(COLLECTION, "acme", "bi-eu", [1, 0, 0, 0])
        assert refused.value.sqlstate == "42501"
        with pytest.raises(NotAuthorized):
            stranger.upsert(COLLECTION, [ROW])
    with as_login(fabric, served, "mf_agent_b") as reader, pytest.raises(NotAuthorized):
        reader.upsert(COLLECTION, [ROW])  # 'r' does not write
    assert served.store.count() == len(SOURCE)


def test_a_claimed_login_is_not_the_authenticated_one(fabric: Fabric, served: Served) -> None:
    search = {
        "op": "ops_search",
        "collection": COLLECTION,
        "tenant_id": "acme",
        "business_instance_id": "bi-eu",
        "vector": [1, 0, 0, 0],
    }
    upsert = {
        "op": "ops_upsert",
        "collection": COLLECTION,
        "rows": [{"tenant_id": "acme", "business_instance_id": "bi-eu", "key": ["v9"],
                  "vector": [0, 1, 0, 0]}],
    }  # fmt: skip
    # no ticket: claiming the writer's login is not being it
    for answer in raw(served.socket, {**upsert, "login": "mf_workflow"}, search):
        assert answer["ok"] is False and answer["code"] == "42501", answer
    # authenticated as mf_agent_a, claiming mf_workflow
    ticket = fabric.connect("mf_agent_a").execute("SELECT fabric_api.issue_broker_ticket()")
    hello, claimed = raw(
        served.socket,
        {"op": "ops_hello", "ticket": ticket.fetchone()[0]},  # type: ignore[index]
        {**upsert, "login": "mf_workflow"},
    )
    assert hello == {"ok": True, "login": "mf_agent_a"}
    assert claimed["ok"] is False and claimed["code"] == "42501"
    # a made-up ticket, and a ticket used once already
    (forged,) = raw(served.socket, {"op": "ops_hello", "ticket": "mfb_" + "0" * 64})
    assert forged["ok"] is False and forged["code"] == "42501"
    ticket = fabric.connect("mf_workflow").execute("SELECT fabric_api.issue_broker_ticket()")
    once = ticket.fetchone()[0]  # type: ignore[index]
    first, _ = raw(served.socket, {"op": "ops_hello", "ticket": once}, search)
    (again,) = raw(served.socket, {"op": "ops_hello", "ticket": once})
    assert first["ok"] is True and again["code"] == "42501"
    assert served.store.count() == len(SOURCE)


def test_a_malformed_request_is_refused_with_its_sqlstate_and_writes_nothing(
    fabric: Fabric, served: Served
) -> None:
    with as_login(fabric, served, "mf_workflow") as writer:
        row = {"tenant_id": "acme", "business_instance_id": "bi-eu", "key": ["v9"]}
        with pytest.raises(InvalidEnvelope):
            writer.ask({"op": "ops_upsert", "collection": COLLECTION,
                        "rows": [{**row, "vector": ["x", 1, 0, 0]}]})  # fmt: skip
        for bad in (
            OpsRow("", "bi-eu", ("v9",), [0, 1, 0, 0]),  # no tenant
            OpsRow("acme", "bi-eu", ("v9", "extra"), [0, 1, 0, 0]),  # not the domain key
        ):
            with pytest.raises(InvalidEnvelope) as refused:
                writer.upsert(COLLECTION, [ROW, bad])  # all or nothing
            assert refused.value.sqlstate == "22023"
        with pytest.raises(InvalidEnvelope):
            writer.search(COLLECTION, "acme", "bi-eu", [1, 0, 0, 0], 0)
        with pytest.raises(NotAuthorized):  # a refused hello leaves no login behind
            writer.ask({"op": "ops_hello", "ticket": "mfb_" + "1" * 64})
        with pytest.raises(NotAuthorized):
            writer.collections()
    assert served.store.count() == len(SOURCE)


def test_mem_collections_are_never_reachable_through_it(fabric: Fabric, served: Served) -> None:
    before = served.vectors.count("semantic")
    with as_login(fabric, served, "mf_workflow") as writer:
        for name in ("mem_semantic", "mem_episodic", "mf_semantic", ""):
            with pytest.raises(NotAuthorized):
                writer.search(name, "acme", "bi-eu", [1, 0, 0, 0])
            with pytest.raises(NotAuthorized):
                writer.upsert(name, [ROW])
    assert served.vectors.count("semantic") == before
    assert served.store.count() == len(SOURCE)


def test_only_serve_redeems_a_ticket_and_a_refusal_consumes_nothing(fabric: Fabric) -> None:
    ticket = fabric.connect("mf_agent_a").execute("SELECT fabric_api.issue_broker_ticket()")
    token = ticket.fetchone()[0]  # type: ignore[index]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.connect("mf_agent_b").execute("SELECT fabric_api.redeem_broker_ticket(%s)", (token,))
    assert fabric.count("broker_tickets") == 1
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # not an agent or a workflow
        fabric.connect("mf_stranger").execute("SELECT fabric_api.issue_broker_ticket()")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        fabric.connect("mf_agent_a").execute("SELECT fabric_api.issue_broker_ticket('1 day')")
    assert fabric.count("broker_tickets") == 1
    projector = fabric.connect("mf_projector")
    redeemed = projector.execute("SELECT fabric_api.redeem_broker_ticket(%s)", (token,))
    assert redeemed.fetchone() == ("mf_agent_a",)
    assert fabric.count("broker_tickets") == 0
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        projector.execute("SELECT fabric_api.redeem_broker_ticket(%s)", (token,))


def test_serve_holds_the_declared_stores_with_the_configured_allowlist(
    fabric: Fabric, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfabric.cli import _ops_gate

    projector = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    monkeypatch.setenv("MEMFABRIC_OPS_DIR", str(tmp_path / "ops"))
    assert _ops_gate(projector) is None  # no pack declared: serve holds no store
    monkeypatch.setenv("MEMFABRIC_OPS_PACKS", f"{__name__}:PACK")
    grants = tmp_path / "grants.json"
    grants.write_text(json.dumps(GRANTS))
    monkeypatch.setenv("MEMFABRIC_OPS_GRANTS", str(grants))
    gate = _ops_gate(projector)
    try:
        assert [s.collection.name for s in gate.stores] == [COLLECTION]
        assert gate.broker.grants("mf_agent_b") == {COLLECTION: "r"}
        ticket = fabric.connect("mf_agent_b").execute("SELECT fabric_api.issue_broker_ticket()")
        assert gate.hello(ticket.fetchone()[0]) == "mf_agent_b"  # type: ignore[index]
    finally:
        for store in gate.stores:
            store.close()
    # one login, an operational and a mem_* collection: serve does not start
    mixed = {"mf_agent_b": {COLLECTION: "r", "mem_semantic": "r"}}
    monkeypatch.setenv("MEMFABRIC_OPS_GRANTS", json.dumps(mixed))
    with pytest.raises(OperationalError):
        _ops_gate(projector)
