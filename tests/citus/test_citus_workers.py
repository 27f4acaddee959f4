"""The background work on a Citus cluster, each through its real entry point (the Python
worker functions of `memfabric worker`/`serve`, `memfabric check`): the sealer, decay, the
commit worker, a projection rebuild and the drill, the binding checklist. After each the
tenant's event chain verifies (fabric_audit.verify_event_chain). Episodic records only.

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from test_citus_fabric import episode, form, open_run

from citus_cluster import Cluster, cluster, new_tenant
from memfabric import check as checklist
from memfabric import ops, worker
from memfabric.graph import GraphStore
from memfabric.projector import Projector
from servers import DATABASE, PASSWORD, GraphServer

__all__ = ["cluster"]  # the session fixture, used by name


def url_of(c: Cluster, login: str) -> str:
    return psycopg.conninfo.make_conninfo(c.url, user=login)


def seal(c: Cluster) -> int:
    with psycopg.connect(url_of(c, "mf_committer"), autocommit=True) as conn:
        return worker.seal_once(conn)


def verify(c: Cluster, tenant: str) -> dict[str, Any]:
    with c.connect("mf_auditor") as auditor:
        row = auditor.execute("SELECT fabric_audit.verify_event_chain(%s)", (tenant,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def sealed_and_verified(c: Cluster, *tenants: str) -> None:
    seal(c)
    for tenant in tenants:
        result = verify(c, tenant)
        assert result["ok"] and result["events"] > 0 and result["unsealed"] == 0, result


@pytest.fixture
def lone_tenant(cluster: Cluster) -> str:
    """A tenant of its own (a test that damages its chain keeps the damage to itself)."""
    return new_tenant(cluster)


def test_the_sealer_chains_tenants_of_both_workers_and_the_chain_verifies(
    cluster: Cluster,
) -> None:
    first, second = cluster.apart
    form(cluster, first, "a note to seal on one worker")
    form(cluster, second, "a note to seal on the other")
    assert seal(cluster) >= 2
    sealed_and_verified(cluster, first, second)
    with psycopg.connect(url_of(cluster, "mf_committer"), autocommit=True) as conn:
        lag = worker.sealing_lag(conn.info.dsn)
    assert lag["unsealed"] == 0


def test_an_altered_event_breaks_the_chain_on_the_cluster(
    cluster: Cluster, lone_tenant: str
) -> None:
    memory_id = form(cluster, lone_tenant, "an event to alter after sealing")
    sealed_and_verified(cluster, lone_tenant)
    with cluster.connect() as su:  # whoever holds the migration credentials
        su.execute("SET session_replication_role = replica")
        su.execute(
            "UPDATE fabric.events SET payload = payload || '{\"forged\": true}' "
            "WHERE tenant_id = %s AND memory_id = %s",
            (lone_tenant, memory_id),
        )
    result = verify(cluster, lone_tenant)
    assert not result["ok"]
    assert result["first_break"]["problem"] == "a sealed event was altered"


def test_the_decay_worker_expires_a_lapsed_record_and_the_chain_verifies(
    cluster: Cluster,
) -> None:
    first, _ = cluster.apart
    record = episode(first, "a lapsed note for the decay worker")
    record["validity_interval"] = {
        "valid_from": "2026-07-02T09:14:00Z",
        "valid_until": "2026-07-03T09:14:00Z",
    }
    run = open_run(cluster, first)
    with cluster.connect("mf_agent_a") as agent:
        proposed = agent.execute(
            "SELECT fabric_api.propose(%s, %s)", (Jsonb(record), run)
        ).fetchone()
    assert proposed is not None
    with cluster.connect("mf_committer") as committer:
        row = committer.execute(
            "SELECT fabric_api.commit(%s)", (proposed[0]["proposal_id"],)
        ).fetchone()
    assert row is not None
    memory_id = str(row[0]["memory_id"])
    with (
        psycopg.connect(url_of(cluster, "mf_committer"), autocommit=True) as conn,
        psycopg.connect(url_of(cluster, "mf_maintainer"), autocommit=True) as maintainer,
    ):
        report = worker.run_decay_once(conn, maintainer=maintainer)
    assert int(report["expired"]) >= 1, report  # type: ignore[call-overload]
    state = cluster.row(
        "SELECT consolidation_state FROM fabric.memory_records WHERE memory_id = %s", memory_id
    )
    event = cluster.row(
        "SELECT count(*) FROM fabric.events WHERE memory_id = %s "
        "AND event_type = 'memory.record.expired'",
        memory_id,
    )
    assert state == ("expired",) and event == (1,)
    sealed_and_verified(cluster, first)


def test_the_commit_worker_drains_both_workers_and_the_chain_verifies(cluster: Cluster) -> None:
    first, second = cluster.apart
    proposals = []
    for tenant in (first, second):
        run = open_run(cluster, tenant)
        with cluster.connect("mf_agent_a") as agent:
            row = agent.execute(
                "SELECT fabric_api.propose(%s, %s)",
                (Jsonb(episode(tenant, f"left for the commit worker in {tenant}")), run),
            ).fetchone()
        assert row is not None and row[0]["status"] == "validated"
        proposals.append(row[0]["proposal_id"])
    committed, rejected = worker.run_committer(
        url_of(cluster, "mf_committer"), once=True, progress=lambda _line: None
    )
    assert committed >= 2 and rejected == 0
    with cluster.connect() as su:
        rows = su.execute(
            "SELECT p.tenant_id, p.status FROM fabric.proposals p WHERE p.proposal_id = ANY (%s)",
            (proposals,),
        ).fetchall()
    assert sorted(rows) == sorted([(first, "committed"), (second, "committed")])
    sealed_and_verified(cluster, first, second)


@pytest.fixture
def projector(
    cluster: Cluster, minilm: Any, edge: Any, graph_server: GraphServer
) -> Iterator[Projector]:
    """The projector of `memfabric rebuild`/`drill` over the cluster: a Qdrant Edge store and
    the Bolt graph, both emptied first."""
    with GraphStore(graph_server.uri, "root", PASSWORD, DATABASE, retry_seconds=1.0) as graph:
        graph.ensure_schema()
        graph.wipe()
        yield Projector(url_of(cluster, "mf_projector"), minilm, edge, graph)


def test_rebuild_drill_and_the_checklist_on_the_cluster(
    cluster: Cluster, projector: Projector, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = cluster.apart
    mine = form(cluster, first, "a record to project from one worker")
    theirs = form(cluster, second, "a record to project from the other worker")
    rebuilt = ops.rebuild(projector, "all")
    assert rebuilt["rebuilt"]["qdrant"] >= 2 and rebuilt["rebuilt"]["graph"] >= 2
    assert projector.store is not None
    assert {mine, theirs} <= {pid for pid, _ in projector.store.scroll("episodic")}
    # the record's subject is an entity it mentions: read from the tenant's shards
    assert projector.graph is not None
    mentions = [e for e in projector.graph.export(first).edges if e[0] == "MENTIONS"]
    assert any(frm == f"{first}:{mine}" for _t, frm, _to in mentions), mentions
    verified = ops.verify(projector)
    assert verified["ok"], verified
    drilled = ops.drill(projector)
    assert drilled["identical"] and drilled["probes"] > 0, drilled
    seal(cluster)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    with cluster.connect() as su:
        results = checklist.run(su, env, drill=lambda: ops.drill(projector))
    assert [r.line() for r in results if r.status == checklist.FAIL] == []
    sealed_and_verified(cluster, first, second)
