"""Recall with a question (text mode: BM25 over the tenant's records) on a Citus cluster:
served from the tenant's shard, ranked, and only the run's tenant (same worker or not).

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg.types.json import Jsonb
from test_citus_fabric import form, open_run

from citus_cluster import Cluster, cluster

__all__ = ["cluster"]  # the session fixture, used by name


def ask(c: Cluster, tenant: str, query: str) -> dict[str, Any]:
    run = open_run(c, tenant)
    with c.connect("mf_agent_a") as agent:
        row = agent.execute(
            "SELECT fabric_api.recall(%s)",
            (Jsonb({"run_id": str(run), "tiers": ["episodic"], "query": query, "limit": 5}),),
        ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_question_is_answered_from_its_tenant_only_and_ranked(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    # words no other record holds
    word, rarer = f"zq{uuid.uuid4().hex[:8]}", f"zk{uuid.uuid4().hex[:8]}"
    best = form(cluster, first, f"the {word} invoice of the {rarer} account is overdue")
    other = form(cluster, first, f"an unrelated {word} note about lunch")
    theirs = form(cluster, second, f"the {word} {rarer} invoice of the other tenant")
    answer = ask(cluster, first, f"{word} {rarer}")
    assert answer["status"] == "served" and answer["mode_served"] == "text", answer
    ids = [r["memory_id"] for r in answer["records"]]
    assert ids == [best, other]  # both words before one; never the other tenant's
    assert all(r["scope"]["tenant_id"] == first for r in answer["records"])
    assert [r["memory_id"] for r in ask(cluster, second, f"{word} {rarer}")["records"]] == [theirs]
    assert ask(cluster, first, f"zq{uuid.uuid4().hex[:8]}")["records"] == []


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_recall_by_ids_serves_the_runs_tenants_records_only(cluster: Cluster, pair: str) -> None:
    """The by-ids re-check (filters.memory_ids; the vector store's candidates take the same
    statement) names records of both tenants: only the run's tenant's are served."""
    first, second = getattr(cluster, pair)
    mine = form(cluster, first, "a record named by id")
    theirs = form(cluster, second, "another tenant's record named by id")
    run = open_run(cluster, first)
    with cluster.connect("mf_agent_a") as agent:
        row = agent.execute(
            "SELECT fabric_api.recall(%s)",
            (
                Jsonb(
                    {
                        "run_id": str(run),
                        "tiers": ["episodic"],
                        "filters": {"memory_ids": [mine, theirs]},
                    }
                ),
            ),
        ).fetchone()
    assert row is not None and row[0]["status"] == "served", row
    assert [r["memory_id"] for r in row[0]["records"]] == [mine]
