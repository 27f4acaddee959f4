"""Moving a tenant between Citus workers under load (docs/scale-out.md, "Rebalancing"): a
tenant is isolated to a shard group of its own (`isolate_tenant_to_new_shard`) and that group
is moved to the other worker (`citus_move_shard_placement`, `block_writes`) while writers
propose, commit and recall in it. Afterwards every acknowledged write is there and
recallable, tenant isolation holds on the moved shards, and the tenant's chain verifies.

`force_logical` needs `wal_level = logical` on the workers (the test cluster runs `replica`);
`block_writes` holds the tenant's writes for the copy, which the writers wait out.

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from test_citus_fabric import _rows_seen, form_on, open_run

from citus_cluster import Cluster, cluster, new_tenant
from citus_layout import layout
from memfabric import worker

__all__ = ["cluster"]  # the session fixture, used by name

WRITERS = 2


class Load:
    """Writers that propose, commit and recall in one tenant until stopped, each on
    connections of its own; what was acknowledged, what recalls returned, what failed."""

    def __init__(self, c: Cluster, tenant: str) -> None:
        self.c, self.tenant = c, tenant
        self.stop = threading.Event()
        self.acked: list[str] = []
        self.recalled_tenants: set[str] = set()
        self.recalls = 0
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._write, daemon=True) for _ in range(WRITERS)]
        for t in self.threads:
            t.start()

    def _write(self) -> None:
        try:
            run = str(open_run(self.c, self.tenant))
            with self.c.connect("mf_agent_a") as agent, self.c.connect("mf_committer") as committer:
                while not self.stop.is_set():
                    text = f"moving tenant note {uuid.uuid4()}"
                    self.acked.append(form_on(agent, committer, self.tenant, text, run))
                    answer = agent.execute(
                        "SELECT fabric_api.recall(%s)",
                        (Jsonb({"run_id": run, "tiers": ["episodic"], "limit": 5}),),
                    ).fetchone()
                    assert answer is not None and answer[0]["status"] == "served"
                    self.recalled_tenants |= {r["scope"]["tenant_id"] for r in answer[0]["records"]}
                    self.recalls += 1
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def halt(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
            assert not t.is_alive()


def _placement(c: Cluster, tenant: str) -> tuple[int, str, int]:
    row = c.row(
        "SELECT s.shardid, n.nodename, n.nodeport FROM pg_dist_shard s "
        "JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid) "
        "WHERE s.shardid = get_shard_id_for_distribution_column("
        "'fabric.memory_records', %s::text)",
        tenant,
    )
    return int(row[0]), str(row[1]), int(row[2])


def _recall_all(c: Cluster, tenant: str, login: str = "mf_agent_a") -> set[str]:
    run = open_run(c, tenant)
    with c.connect(login) as agent:
        answer = agent.execute(
            "SELECT fabric_api.recall(%s)",
            (Jsonb({"run_id": str(run), "tiers": ["episodic"], "limit": 100}),),
        ).fetchone()
    assert answer is not None
    return {r["memory_id"] for r in answer[0]["records"]}


def test_a_tenant_moved_to_the_other_worker_under_load_loses_nothing(cluster: Cluster) -> None:
    tenant = new_tenant(cluster, "mv")
    neighbour, _ = cluster.apart
    before = _placement(cluster, tenant)
    load = Load(cluster, tenant)
    try:
        deadline = time.monotonic() + 60
        while len(load.acked) < 4 and not load.errors:  # the load is running
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with cluster.connect() as su:
            isolated = su.execute(
                "SELECT isolate_tenant_to_new_shard('fabric.memory_records', %s::text, "
                "'CASCADE', shard_transfer_mode => 'block_writes')",
                (tenant,),
            ).fetchone()
            assert isolated is not None
            shard, host, port = _placement(cluster, tenant)
            assert shard == isolated[0] and (host, port) == before[1:]
            to = next(w for w in cluster.workers if w != (host, port))
            acked_before_move = len(load.acked)
            # Citus's distributed deadlock detection may cancel a blocking move whose locks
            # the writers wait behind (the writers go on); the move's transaction rolls back,
            # the group stays where it was, and the operator runs it again (docs/scale-out.md)
            for attempt in range(1, 6):
                try:
                    su.execute(
                        "SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, "
                        "shard_transfer_mode => 'block_writes')",
                        (shard, host, port, *to),
                    )
                    break
                except psycopg.errors.DeadlockDetected:
                    assert attempt < 5, "the move was canceled five times"
                    assert _placement(cluster, tenant) == (shard, host, port)
                    time.sleep(0.5)
        # the load goes on on the new worker
        deadline = time.monotonic() + 60
        while len(load.acked) < acked_before_move + 4 and not load.errors:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        load.halt()
    assert load.errors == []
    assert _placement(cluster, tenant)[1:] == to
    assert load.recalled_tenants == {tenant}
    acked = set(load.acked)
    assert len(acked) == len(load.acked) >= 8
    # every acknowledged write is there, once, in its tenant, and recallable
    with cluster.connect() as su:
        rows = su.execute(
            "SELECT tenant_id, count(*) FROM fabric.memory_records "
            "WHERE memory_id = ANY (%s::uuid[]) GROUP BY 1",
            (list(acked),),
        ).fetchall()
        formed = su.execute(
            "SELECT count(DISTINCT memory_id) FROM fabric.events WHERE tenant_id = %s "
            "AND event_type = 'memory.record.formed' AND memory_id = ANY (%s::uuid[])",
            (tenant, list(acked)),
        ).fetchone()
    assert rows == [(tenant, len(acked))]
    assert formed == (len(acked),)
    assert acked <= _recall_all(cluster, tenant)
    # isolation holds on the moved shards: no login reads them from another tenant's context,
    # and the other tenant's recall sees none of them
    leaks = {
        (login, table): seen
        for login in ("mf_agent_a", "mf_committer", "mf_projector", "mf_auditor")
        for table in layout.TENANT_TABLES
        if (seen := _rows_seen(cluster, login, table, neighbour, tenant)) > 0
    }
    assert leaks == {}
    assert _recall_all(cluster, neighbour).isdisjoint(acked)
    # the chain verifies
    with psycopg.connect(
        psycopg.conninfo.make_conninfo(cluster.url, user="mf_committer"), autocommit=True
    ) as conn:
        worker.seal_once(conn)
    with cluster.connect("mf_auditor") as auditor:
        row = auditor.execute("SELECT fabric_audit.verify_event_chain(%s)", (tenant,)).fetchone()
    assert row is not None
    verified: dict[str, Any] = row[0]
    assert verified["ok"] and verified["unsealed"] == 0, verified
    assert verified["events"] >= 2 * len(acked)  # formed and recalled, at least
