"""How many workers a tenant-scoped call reaches on a Citus cluster (docs/scale-out.md): one,
the tenant's. Counted from Citus itself: with `citus.log_remote_commands` on, Citus reports
every command it sends to a worker ("issuing ...", "on server user@host:port ...").

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from test_citus_fabric import episode, open_run

from citus_cluster import Cluster, cluster

__all__ = ["cluster"]  # the session fixture, used by name

SERVER = re.compile(r"on server \S+@([^:]+):(\d+) connectionId: \d+")


def reached(c: Cluster, login: str, call: Callable[[psycopg.Connection[Any]], Any]) -> Any:
    """The (host, port) of every worker Citus sent a command to during `call`, and its
    result."""
    nodes: set[tuple[str, int]] = set()

    def note(diag: psycopg.errors.Diagnostic) -> None:
        m = SERVER.search(diag.message_detail or "")
        if m and (diag.message_primary or "").startswith("issuing"):
            nodes.add((m[1], int(m[2])))

    with c.connect(login) as conn:
        conn.add_notice_handler(note)
        conn.execute("SET client_min_messages = notice")
        conn.execute("SET citus.log_remote_commands = on")
        result = call(conn)
    return nodes, result


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_propose_commit_and_recall_reach_only_the_tenants_worker(
    cluster: Cluster, pair: str
) -> None:
    for tenant in getattr(cluster, pair):
        home = {cluster.placement[tenant]}
        run = open_run(cluster, tenant)
        nodes, proposed = reached(
            cluster,
            "mf_agent_a",
            lambda conn, t=tenant, r=run: conn.execute(
                "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(t, "reach")), r)
            ).fetchone()[0],
        )
        assert proposed["status"] == "validated" and nodes == home
        nodes, committed = reached(
            cluster,
            "mf_committer",
            lambda conn, p=proposed: conn.execute(
                "SELECT fabric_api.commit(%s)", (p["proposal_id"],)
            ).fetchone()[0],
        )
        assert committed["memory_id"] and nodes == home
        nodes, answer = reached(
            cluster,
            "mf_agent_a",
            lambda conn, r=run: conn.execute(
                "SELECT fabric_api.recall(%s)",
                (Jsonb({"run_id": str(r), "tiers": ["episodic"], "limit": 10}),),
            ).fetchone()[0],
        )
        assert answer["status"] == "served" and nodes == home


def test_a_run_the_directory_does_not_know_is_found_on_the_shards(cluster: Cluster) -> None:
    """A run noted nowhere (made before the directory, or its note lost) still serves: the
    lookup falls back to the runs' shards."""
    first, _ = cluster.apart
    run = open_run(cluster, first)
    with cluster.connect() as su:
        su.execute("DELETE FROM fabric.tenant_directory WHERE id = %s", (run,))
    with cluster.connect("mf_agent_a") as agent:
        row = agent.execute(
            "SELECT fabric_api.recall(%s)",
            (Jsonb({"run_id": str(run), "tiers": ["episodic"], "limit": 10}),),
        ).fetchone()
    assert row is not None and row[0]["status"] == "served"
    assert row[0]["scope_applied"]["tenant_id"] == first
