"""Recall with a question (text mode: BM25 over the tenant's records) on a Citus cluster:
served from the tenant's shard, ranked, and only the run's tenant (same worker or not).

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb
from test_citus_fabric import episode, form, open_run

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


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_neighbours_are_the_runs_tenants_turns_next_to_a_hit(cluster: Cluster, pair: str) -> None:
    """The neighbour expansion (fabric._recall_neighbours, then the by-ids re-check) runs on
    the tenant's shard: the turns next to a hit, never another tenant's turn said between
    them with the same subject and session; the audit event names every record served."""
    first, second = getattr(cluster, pair)
    word = f"zn{uuid.uuid4().hex[:8]}"
    # a minute of its own, far from every other test's records
    start = datetime(2031, 1, 1, tzinfo=UTC) + timedelta(minutes=uuid.uuid4().int % 10**5 * 10)

    def said(tenant: str, text: str, minute: float) -> str:
        envelope = episode(tenant, text)
        at = (start + timedelta(minutes=minute)).isoformat()
        envelope["validity_interval"] = {"valid_from": at, "valid_until": None}
        with cluster.connect("mf_agent_a") as agent:
            proposed = agent.execute(
                "SELECT fabric_api.propose(%s, %s)", (Jsonb(envelope), open_run(cluster, tenant))
            ).fetchone()
        assert proposed is not None and proposed[0]["status"] == "validated", proposed
        with cluster.connect("mf_committer") as committer:
            committed = committer.execute(
                "SELECT fabric_api.commit(%s)", (proposed[0]["proposal_id"],)
            ).fetchone()
        assert committed is not None
        return str(committed[0]["memory_id"])

    before = said(first, "the turn before", -2)
    hit = said(first, f"the {word} turn", 0)
    after = said(first, "the turn after", 2)
    theirs = [said(second, "another tenant's turn", m) for m in (-1, 1)]
    run = open_run(cluster, first)
    for extra in ({}, {"mode": "semantic", "candidates": [{"memory_id": hit, "score": 1}]}):
        request = {"run_id": str(run), "tiers": ["episodic"], "query": word, "limit": 1,
                   "neighbours": {"turns": 1, "of": 1},
                   "filters": {"valid_at": "2100-01-01T00:00:00Z"}, **extra}  # fmt: skip
        with cluster.connect("mf_agent_a") as agent:
            row = agent.execute("SELECT fabric_api.recall(%s)", (Jsonb(request),)).fetchone()
        assert row is not None and row[0]["status"] == "served", row
        ids = [r["memory_id"] for r in row[0]["records"]]
        assert ids == [hit, before, after] and not set(ids) & set(theirs), (ids, extra)
        assert [r["retrieval"] for r in row[0]["records"][1:]] == [{"neighbour_of": hit}] * 2
        with cluster.connect() as su:
            event = su.execute(
                "SELECT payload FROM fabric.events WHERE run_id = %s"
                " AND event_type = 'memory.recall.served' ORDER BY event_id DESC LIMIT 1",
                (run,),
            ).fetchone()
        assert event is not None and event[0]["memory_ids"] == ids
        assert event[0]["neighbours"] == {"turns": 1, "of": 1, "served": 2}
