"""The fabric on a Citus cluster (`make test-citus`): where its tables live, and the rules
that matter most across nodes — tenant isolation, governance, lifecycle, erasure, recall
scope — with tenants on different workers and on the same one.

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/cluster.py)."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from citus_cluster import Cluster, cluster
from citus_layout import layout
from conftest import LOGINS, MEMORY_TOOLS
from memfabric import db as mfdb

__all__ = ["cluster"]  # the session fixture, used by name


_events = itertools.count()


def episode(tenant: str, text: str, visibility: str = "subject") -> dict[str, Any]:
    return {
        "tier": "episodic",
        "scope": {"tenant_id": tenant, "visibility": visibility},
        "content": {"text": text},
        "provenance": {
            "source_event_id": f"evt-citus-{next(_events)}-{uuid.uuid4()}",
            "correlation_id": "corr-citus",
            "causation_id": "evt-citus",
            "formation_method": "extraction",
        },
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        "retention_class": "durable",
    }


def open_run(c: Cluster, tenant: str, agent: str = "com-agt-003") -> uuid.UUID:
    with c.connect("mf_orchestrator") as conn:
        row = conn.execute(
            "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, %s::interval)",
            (tenant, agent, "user-8842", "sess-1", MEMORY_TOOLS, "1 hour"),
        ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def form(c: Cluster, tenant: str, text: str) -> str:
    run = open_run(c, tenant)
    with c.connect("mf_agent_a") as agent:
        proposed = agent.execute(
            "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(tenant, text)), run)
        ).fetchone()
    assert proposed is not None and proposed[0]["status"] == "validated", proposed
    with c.connect("mf_committer") as committer:
        committed = committer.execute(
            "SELECT fabric_api.commit(%s)", (proposed[0]["proposal_id"],)
        ).fetchone()
    assert committed is not None
    return str(committed[0]["memory_id"])


def recall_answer(c: Cluster, tenant: str, query: str | None = None) -> dict[str, Any]:
    run = open_run(c, tenant)
    request = {"run_id": str(run), "tiers": ["episodic"], **({"query": query} if query else {})}
    with c.connect("mf_agent_a") as agent:
        row = agent.execute("SELECT fabric_api.recall(%s)", (Jsonb(request),)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def recall(c: Cluster, tenant: str) -> list[str]:
    return [r["memory_id"] for r in recall_answer(c, tenant)["records"]]


# -- where the tables live -------------------------------------------------------------------


def test_every_tenant_table_is_distributed_by_tenant_id_in_one_colocation_group(
    cluster: Cluster,
) -> None:
    with cluster.connect() as c:
        rows = c.execute(
            "SELECT logicalrelid::regclass::text, partmethod, "
            "column_to_column_name(logicalrelid, partkey), colocationid "
            "FROM pg_dist_partition WHERE logicalrelid::regclass::text = ANY (%s)",
            (list(layout.TENANT_TABLES),),
        ).fetchall()
    assert {r[0] for r in rows} == set(layout.TENANT_TABLES)
    assert {(r[1], r[2]) for r in rows} == {("h", "tenant_id")}
    assert len({r[3] for r in rows}) == 1


def test_the_registries_are_reference_tables(cluster: Cluster) -> None:
    with cluster.connect() as c:
        rows = c.execute(
            "SELECT logicalrelid::regclass::text FROM pg_dist_partition WHERE partmethod = 'n' "
            "AND repmodel = 't' AND logicalrelid::regclass::text = ANY (%s)",
            (list(layout.REFERENCE_TABLES),),
        ).fetchall()
    assert {r[0] for r in rows} == set(layout.REFERENCE_TABLES)


def test_the_tenants_are_placed_as_the_tests_need(cluster: Cluster) -> None:
    a, b = cluster.same
    assert cluster.placement[a] == cluster.placement[b]
    a, b = cluster.apart
    assert cluster.placement[a] != cluster.placement[b]


# -- tenant isolation: every login against every distributed table ------------------------


def _rows_seen(c: Cluster, login: str, table: str, tenant: str | None, other: str) -> int:
    """Rows of tenant `other` that `login` reads in `table` directly, inside a transaction
    block with the governance setting at `tenant` (as SET LOCAL, which reaches the workers);
    -1 when the login may not read the table at all."""
    with c.connect(login, autocommit=False) as conn:
        try:
            if tenant is not None:
                conn.execute(sql.SQL("SET LOCAL fabric.tenant_id = {}").format(sql.Literal(tenant)))
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE tenant_id = %s").format(
                    sql.Identifier(*table.split("."))
                ),
                (other,),
            ).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            return -1
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_no_login_reads_another_tenants_rows_in_any_distributed_table(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    with cluster.connect() as su:  # the seeded rows are there to be leaked
        seeded = su.execute(
            "SELECT count(*) FROM fabric.tenant_agents WHERE tenant_id = %s", (second,)
        ).fetchone()
    assert seeded is not None and seeded[0] > 0
    leaks = {
        (login, table, tenant): seen
        for login in LOGINS
        for table in layout.TENANT_TABLES
        for tenant in (None, first)
        if (seen := _rows_seen(cluster, login, table, tenant, second)) > 0
    }
    assert leaks == {}


# -- governance ------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_governed_write_is_recalled_in_its_tenant_only(cluster: Cluster, pair: str) -> None:
    first, second = getattr(cluster, pair)
    mine = form(cluster, first, f"{pair} note of {first}")
    theirs = form(cluster, second, f"{pair} note of {second}")
    got_first, got_second = recall(cluster, first), recall(cluster, second)
    assert mine in got_first and theirs not in got_first
    assert theirs in got_second and mine not in got_second


# Found while checking text recall's ranks on Citus, on main as well: the lexical statement
# that reads the query's document frequencies calls fabric._text_search_config() (a read of
# the reference table deployment_settings) inside a query Citus pushes to the tenant's shard,
# and Citus refuses the nested distributed read (XX000). Left open.
@pytest.mark.xfail(strict=True, reason="text recall's df statement nests a distributed read")
@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_text_recall_is_ranked_in_its_tenant_only(cluster: Cluster, pair: str) -> None:
    """The lexical statements on the tenant's shard, each record with its rank and score."""
    first, second = getattr(cluster, pair)
    mine = form(cluster, first, f"quarterly statement {pair} of {first}")
    theirs = form(cluster, second, f"quarterly statement {pair} of {second}")
    answer = recall_answer(cluster, first, "quarterly statement")
    ids = [r["memory_id"] for r in answer["records"]]
    assert mine in ids and theirs not in ids, answer
    ranks = [r["retrieval"] for r in answer["records"]]
    assert ranks == [{"lexical": n} for n in range(1, len(ids) + 1)]
    assert answer["records"][0]["score"] == 1.0


def _outbox(c: Cluster, memory_id: str) -> list[tuple[str, str]]:
    with c.connect() as su:
        rows = su.execute(
            "SELECT event_type, tenant_id FROM fabric.events WHERE memory_id = %s "
            "ORDER BY xid, occurred_at, event_type",
            (memory_id,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def _staged(c: Cluster) -> int:
    with c.connect() as su:
        row = su.execute("SELECT count(*) FROM fabric.shard_events").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_commit_writes_its_record_history_statistics_and_event_in_the_outbox(
    cluster: Cluster, pair: str
) -> None:
    first, _ = getattr(cluster, pair)
    memory_id = form(cluster, first, f"{pair} the invoice of acme is overdue")
    assert _outbox(cluster, memory_id) == [("memory.record.formed", first)]
    assert _staged(cluster) == 0
    with cluster.connect() as su:
        stats = su.execute(
            "SELECT count(*) FROM fabric.search_stats WHERE tenant_id = %s AND lexeme = 'invoic'",
            (first,),
        ).fetchone()
        key = su.execute(
            "SELECT count(*) FROM fabric.subject_keys WHERE tenant_id = %s "
            "AND subject_id = 'user-8842'",
            (first,),
        ).fetchone()
    assert stats is not None and stats[0] >= 1
    assert key == (1,)


def _propose(c: Cluster, tenant: str, record: dict[str, Any]) -> str:
    run = open_run(c, tenant)
    with c.connect("mf_agent_a") as agent:
        row = agent.execute("SELECT fabric_api.propose(%s, %s)", (Jsonb(record), run)).fetchone()
    assert row is not None and row[0]["status"] == "validated", row
    return str(row[0]["proposal_id"])


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_supersession_closes_the_old_record_with_its_history_and_events(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    old = form(cluster, first, f"{pair} the meeting is on monday")
    other = form(cluster, second, f"{pair} a note of the other tenant")
    newer = episode(first, f"{pair} the meeting moved to tuesday")
    newer["validity_interval"] = {"valid_from": "2026-08-01T00:00:00Z", "valid_until": None}
    successor = _propose(cluster, first, newer)
    with cluster.connect("mf_committer") as committer:
        row = committer.execute("SELECT fabric_api.supersede(%s, %s)", (old, successor)).fetchone()
    assert row is not None and row[0]["supersedes"] == old
    new_id = row[0]["memory_id"]
    with cluster.connect() as su:
        states = dict(
            su.execute(
                "SELECT memory_id::text, consolidation_state FROM fabric.memory_records "
                "WHERE memory_id = ANY (%s::uuid[])",
                ([old, new_id, other],),
            ).fetchall()
        )
        history = su.execute(
            "SELECT tenant_id, revision, consolidation_state FROM fabric.memory_record_versions "
            "WHERE memory_id = %s",
            (old,),
        ).fetchall()
    assert states == {old: "superseded", new_id: "raw", other: "raw"}
    assert history == [(first, 1, "raw")]
    assert ("memory.record.superseded", first) in _outbox(cluster, old)
    assert _outbox(cluster, new_id) == [("memory.record.formed", first)]
    assert _staged(cluster) == 0
    got = recall(cluster, first)
    assert new_id in got and old not in got


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_an_approved_erasure_tombstones_the_record_in_its_tenant_only(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    gone = form(cluster, first, f"{pair} the patient's name is alice")
    kept = form(cluster, second, f"{pair} the patient's name is bob")
    with cluster.connect("mf_committer") as committer:
        approval = committer.execute(
            "SELECT fabric_api.request_erasure(%s, 'gdpr')", (gone,)
        ).fetchone()
    assert approval is not None
    approval_id = approval[0]["approval_id"]
    with cluster.connect("mf_policy") as policy:
        policy.execute("SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval_id,))
    with cluster.connect("mf_committer") as committer:
        committer.execute("SELECT fabric_api.erase(%s)", (approval_id,))
    with cluster.connect() as su:
        rows = {
            r[0]: (r[1], r[2])
            for r in su.execute(
                "SELECT memory_id::text, consolidation_state, content IS NULL "
                "FROM fabric.memory_records WHERE memory_id = ANY (%s::uuid[])",
                ([gone, kept],),
            )
        }
    assert rows == {gone: ("tombstoned", True), kept: ("raw", False)}
    assert ("memory.record.forgotten", first) in _outbox(cluster, gone)
    assert _staged(cluster) == 0
    assert gone not in recall(cluster, first)
    assert kept in recall(cluster, second)


# What does not hold yet on a cluster (docs/citus.md, "What part one leaves open"): a
# semantic record's commit fails at the workers' commit ("could not commit transaction for
# shard"), where its deferred rule (_950_semantic_needs_episode) runs; so promotion and
# demotion, which start from a semantic record, are not exercised yet.
SEMANTIC_GAP = pytest.mark.xfail(
    strict=True,
    reason="a semantic record's deferred rule fails at the workers' commit (left open)",
)


@SEMANTIC_GAP
@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_semantic_record_is_promoted_and_demoted_with_its_events(
    cluster: Cluster, pair: str
) -> None:
    first, _ = getattr(cluster, pair)
    source = form(cluster, first, f"{pair} prefers answers in french")
    record = episode(first, "x")
    record.update(
        tier="semantic",
        content={"key": f"pref.lang.{uuid.uuid4()}", "value": "fr"},
        derived_from=[source],
    )
    with cluster.connect("mf_committer") as committer:
        row = committer.execute(
            "SELECT fabric_api.commit(%s)", (_propose(cluster, first, record),)
        ).fetchone()
        assert row is not None
        memory_id = str(row[0]["memory_id"])
        promoted = committer.execute(
            "SELECT fabric_api.promote(%s, 'profile')", (memory_id,)
        ).fetchone()
        demoted = committer.execute(
            "SELECT fabric_api.demote(%s, 'semantic')", (memory_id,)
        ).fetchone()
    assert promoted is not None and promoted[0]["tier"] == "profile"
    assert demoted is not None and demoted[0]["tier"] == "semantic"
    events = [e for e, _ in _outbox(cluster, memory_id)]
    assert sorted(events) == [
        "memory.record.demoted",
        "memory.record.formed",
        "memory.record.promoted",
    ]
    assert _staged(cluster) == 0


def test_decay_expires_a_lapsed_record_with_its_event_in_each_tenant(cluster: Cluster) -> None:
    first, second = cluster.apart
    lapsed = {}
    for tenant in (first, second):
        record = episode(tenant, f"a lapsed note of {tenant}")
        record["validity_interval"] = {
            "valid_from": "2026-07-02T09:14:00Z",
            "valid_until": "2026-07-03T09:14:00Z",
        }
        proposal = _propose(cluster, tenant, record)
        with cluster.connect("mf_committer") as committer:
            row = committer.execute("SELECT fabric_api.commit(%s)", (proposal,)).fetchone()
        assert row is not None
        lapsed[tenant] = str(row[0]["memory_id"])
    with cluster.connect("mf_committer") as committer:
        report = committer.execute("SELECT fabric_api.run_decay()").fetchone()
    assert report is not None and report[0]["expired"] >= 2, report
    with cluster.connect() as su:
        states = dict(
            su.execute(
                "SELECT memory_id::text, consolidation_state FROM fabric.memory_records "
                "WHERE memory_id = ANY (%s::uuid[])",
                (list(lapsed.values()),),
            ).fetchall()
        )
    assert set(states.values()) == {"expired"}
    for tenant, memory_id in lapsed.items():
        assert ("memory.record.expired", tenant) in _outbox(cluster, memory_id)
    assert _staged(cluster) == 0


def test_a_commit_refused_on_the_cluster_writes_nothing(cluster: Cluster) -> None:
    first, _ = cluster.apart
    run = open_run(cluster, first)
    with cluster.connect("mf_agent_a") as agent:
        row = agent.execute(
            "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(first, "not yours")), run)
        ).fetchone()
    assert row is not None
    with cluster.connect() as su:
        before = su.execute(
            "SELECT (SELECT count(*) FROM fabric.memory_records), "
            "(SELECT count(*) FROM fabric.events), (SELECT count(*) FROM fabric.shard_events)"
        ).fetchone()
    with (
        cluster.connect("mf_agent_a") as agent,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        agent.execute("SELECT fabric_api.commit(%s)", (row[0]["proposal_id"],))
    with cluster.connect() as su:
        after = su.execute(
            "SELECT (SELECT count(*) FROM fabric.memory_records), "
            "(SELECT count(*) FROM fabric.events), (SELECT count(*) FROM fabric.shard_events)"
        ).fetchone()
    assert after == before


def test_an_orchestrator_opens_a_run_in_each_tenant(cluster: Cluster) -> None:
    runs = {tenant: open_run(cluster, tenant) for tenant in cluster.tenants}
    with cluster.connect() as su:
        rows = dict(
            su.execute(
                "SELECT run_id, tenant_id FROM fabric.runs WHERE run_id = ANY (%s)",
                (list(runs.values()),),
            ).fetchall()
        )
    assert rows == {run: tenant for tenant, run in runs.items()}


def test_a_run_in_an_unknown_tenant_is_refused_and_writes_nothing(cluster: Cluster) -> None:
    with cluster.connect() as su:
        before = su.execute("SELECT count(*) FROM fabric.runs").fetchone()
    with pytest.raises(psycopg.errors.NoDataFound):
        open_run(cluster, "nobody")
    with cluster.connect() as su:
        assert su.execute("SELECT count(*) FROM fabric.runs").fetchone() == before


def _proposals(c: Cluster) -> int:
    with c.connect() as su:
        row = su.execute("SELECT count(*) FROM fabric.proposals").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_an_agent_proposes_in_the_tenant_of_its_run(cluster: Cluster, pair: str) -> None:
    for tenant in getattr(cluster, pair):
        run = open_run(cluster, tenant)
        with cluster.connect("mf_agent_a") as agent:
            row = agent.execute(
                "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(tenant, "a note")), run)
            ).fetchone()
        assert row is not None and row[0]["status"] == "validated", row
        with cluster.connect() as su:
            filed = su.execute(
                "SELECT tenant_id FROM fabric.proposals WHERE proposal_id = %s",
                (row[0]["proposal_id"],),
            ).fetchone()
        assert filed == (tenant,)


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_an_agent_cannot_name_another_tenant_and_nothing_is_written(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    run = open_run(cluster, first)
    before = _proposals(cluster)
    with (
        cluster.connect("mf_agent_a") as agent,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        agent.execute("SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(second, "x")), run))
    assert _proposals(cluster) == before


# -- recall scope ----------------------------------------------------------------------------


def _recall(c: Cluster, login: str, agent: str, tenant: str, request: dict[str, Any]) -> Any:
    run = open_run(c, tenant, agent)
    with c.connect(login) as conn:
        row = conn.execute(
            "SELECT fabric_api.recall(%s)", (Jsonb({"run_id": str(run), **request}),)
        ).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_tier_outside_the_recall_profile_denies_the_request(cluster: Cluster, pair: str) -> None:
    for tenant in getattr(cluster, pair):
        answer = _recall(cluster, "mf_agent_r", "com-agt-005", tenant, {"tiers": ["episodic"]})
        assert answer["status"] == "denied", answer
        assert answer["tiers_denied"] == ["episodic"]
        assert answer["records"] == []


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_recall_is_served_in_the_runs_tenant(cluster: Cluster, pair: str) -> None:
    for tenant in getattr(cluster, pair):
        answer = _recall(cluster, "mf_agent_a", "com-agt-003", tenant, {"tiers": ["episodic"]})
        assert answer["status"] == "served", answer
        assert answer["scope_applied"]["tenant_id"] == tenant
        assert all(r["scope"]["tenant_id"] == tenant for r in answer["records"])


def test_allow_partial_serves_the_readable_tiers_on_the_cluster(cluster: Cluster) -> None:
    first, _ = cluster.apart
    answer = _recall(
        cluster,
        "mf_agent_r",
        "com-agt-005",
        first,
        {"tiers": ["semantic", "episodic"], "allow_partial": True},
    )
    assert answer["status"] == "partial", answer
    assert answer["tiers_denied"] == ["episodic"]
    assert answer["tiers_served"] == ["semantic"]


# -- migrate again -----------------------------------------------------------------------------


def test_migrate_runs_again_on_the_cluster_and_keeps_the_layout(cluster: Cluster) -> None:
    layout_sql = (
        "SELECT logicalrelid::regclass::text, partmethod, colocationid FROM pg_dist_partition "
        "WHERE logicalrelid::regclass::text LIKE 'fabric.%' ORDER BY 1"
    )
    with cluster.connect() as c:
        before = c.execute(layout_sql).fetchall()
    mfdb.migrate(cluster.url)
    with cluster.connect() as c:
        assert c.execute(layout_sql).fetchall() == before
    first, _ = cluster.apart
    assert open_run(cluster, first) is not None
