"""The fabric on a Citus cluster (`make test-citus`): where its tables live, and the rules
that matter most across nodes — tenant isolation, governance, lifecycle, erasure, recall
scope — with tenants on different workers and on the same one.

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/cluster.py)."""

from __future__ import annotations

import itertools
import time
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
from memfabric.consolidate import DeterministicConsolidator, run_consolidation

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
    """A run opened by the orchestrator: a call delegated to the tenant's worker, whose
    event the relay then moves into the outbox (as the feeds' consumers do before they read),
    so the tests that follow start from an empty fabric.shard_events."""
    with c.connect("mf_orchestrator") as conn:
        row = conn.execute(
            "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, %s::interval)",
            (tenant, agent, "user-8842", "sess-1", MEMORY_TOOLS, "1 hour"),
        ).fetchone()
    assert row is not None
    relay(c)
    return row[0]  # type: ignore[no-any-return]


def relay(c: Cluster) -> int:
    """The relay of the delegated calls' events (fabric_api.relay_events), as an admin."""
    return c.relay()


def form(c: Cluster, tenant: str, text: str) -> str:
    run = open_run(c, tenant)
    with c.connect("mf_agent_a") as agent, c.connect("mf_committer") as committer:
        return form_on(agent, committer, tenant, text, run)


def form_on(
    agent: psycopg.Connection[Any],
    committer: psycopg.Connection[Any],
    tenant: str,
    text: str,
    run: Any,
    keyed: bool = False,
) -> str:
    """An episode proposed in `run` on the agent's connection and committed on the
    committer's: its memory_id (`form`, and the loads that keep their connections open).
    `keyed`: through the tenant-keyed calls, which Citus delegates to the tenant's worker
    (their events wait there for the relay)."""
    if keyed:
        proposed = agent.execute(
            "SELECT fabric_api.propose(%s, %s, %s)", (tenant, Jsonb(episode(tenant, text)), run)
        ).fetchone()
    else:
        proposed = agent.execute(
            "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(tenant, text)), run)
        ).fetchone()
    assert proposed is not None and proposed[0]["status"] == "validated", proposed
    committed = committer.execute(
        "SELECT fabric_api.commit(%s, %s)" if keyed else "SELECT fabric_api.commit(%s)",
        (tenant, proposed[0]["proposal_id"]) if keyed else (proposed[0]["proposal_id"],),
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


def test_the_coordinators_tables_are_citus_local_and_the_outbox_is_plain(cluster: Cluster) -> None:
    with cluster.connect() as c:
        managed = dict(
            c.execute(
                "SELECT logicalrelid::regclass::text, partmethod::text || repmodel::text "
                "FROM pg_dist_partition WHERE logicalrelid::regclass::text = ANY (%s)",
                (list(layout.COORDINATOR_TABLES) + list(layout.LOCAL_TABLES),),
            ).fetchall()
        )
    # a Citus local table: no distribution method, one placement (the coordinator's)
    assert managed == {t: "ns" for t in layout.COORDINATOR_TABLES}


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


@pytest.mark.parametrize("model", [None, "all-MiniLM-L6-v2"])
def test_the_projection_payload_is_read_with_or_without_a_model(
    cluster: Cluster, model: str | None
) -> None:
    """The graph projector reads payloads with no model (no embedding wanted): on a cluster
    that read must not plan a join the shards cannot run."""
    first, second = cluster.apart
    mine = form(cluster, first, f"payload read {model} of {first}")
    theirs = form(cluster, second, f"payload read {model} of {second}")
    with cluster.connect("mf_projector") as projector:
        rows = projector.execute(
            "SELECT memory_id::text, tenant_id, embedding IS NULL "
            "FROM fabric_api.projection_records_v2(%s, %s, %s)",
            ([mine, theirs], model, "v1" if model else None),
        ).fetchall()
    assert sorted(rows) == sorted([(mine, first, True), (theirs, second, True)])


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
    rows = c.rows(
        "SELECT event_type, tenant_id FROM fabric.events WHERE memory_id = %s "
        "ORDER BY xid, occurred_at, event_type",
        memory_id,
    )
    return [(r[0], r[1]) for r in rows]


def _staged(c: Cluster) -> int:
    return int(c.row("SELECT count(*) FROM fabric.shard_events")[0])


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_commit_writes_its_record_history_statistics_and_event_in_the_outbox(
    cluster: Cluster, pair: str
) -> None:
    first, _ = getattr(cluster, pair)
    memory_id = form(cluster, first, f"{pair} the invoice of acme is overdue")
    assert _outbox(cluster, memory_id) == [("memory.record.formed", first)]
    assert _staged(cluster) == 0
    stats = cluster.row(
        "SELECT count(*) FROM fabric.search_stats WHERE tenant_id = %s AND lexeme = 'invoic'",
        first,
    )
    key = cluster.row(
        "SELECT count(*) FROM fabric.subject_keys WHERE tenant_id = %s "
        "AND subject_id = 'user-8842'",
        first,
    )
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


# -- semantic records and lineage ---------------------------------------------------------
# A semantic record's rule (_950_semantic_needs_episode) is a deferred trigger on the shard:
# the API checks it before it returns (fabric._require_episodic_source, the rule's SQLSTATE),
# and the trigger checks it again when the coordinator commits on the tenant's worker.


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_semantic_record_is_promoted_and_demoted_with_its_events(
    cluster: Cluster, pair: str
) -> None:
    first, _ = getattr(cluster, pair)
    sources = [form(cluster, first, f"{pair} prefers answers in french {n}") for n in range(2)]
    record = episode(first, "x")
    record.update(  # two episodes: the promotion's threshold
        tier="semantic",
        content={"key": f"pref.lang.{uuid.uuid4()}", "value": "fr"},
        derived_from=sources,
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


def semantic(tenant: str, sources: list[str], key: str | None = None) -> dict[str, Any]:
    record = episode(tenant, "a fact")
    record.update(
        tier="semantic",
        content={"key": key or f"fact.{uuid.uuid4()}", "value": "v"},
        derived_from=sources,
    )
    return record


def _written(c: Cluster) -> tuple[int, ...]:
    """Rows of the tables a commit writes, all tenants (the superuser)."""
    return c.row(
        "SELECT (SELECT count(*) FROM fabric.memory_records), "
        "(SELECT count(*) FROM fabric.memory_lineage), "
        "(SELECT count(*) FROM fabric.memory_record_versions), "
        "(SELECT count(*) FROM fabric.events), (SELECT count(*) FROM fabric.shard_events), "
        "(SELECT count(*) FROM fabric.proposals WHERE status = 'committed')"
    )


def _no_longer_an_episode(c: Cluster, memory_id: str) -> None:
    """Promote an episode into relational (under an approval): a semantic proposal that
    named it as its only source has no episodic source any more."""
    with c.connect("mf_committer") as committer:
        row = committer.execute(
            "SELECT fabric_api.request_approval(%s, 'promote', %s, 'test')",
            (memory_id, Jsonb({"tier": "relational"})),
        ).fetchone()
        assert row is not None
        approval = row[0]["approval_id"]
        with c.connect("mf_policy") as policy:
            policy.execute("SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval,))
        committer.execute(
            "SELECT fabric_api.promote(%s, 'relational', %s, NULL)", (memory_id, approval)
        )


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_semantic_commit_without_an_episodic_source_is_refused_with_its_rule(
    cluster: Cluster, pair: str
) -> None:
    """The rule through the API: the proposal was validated with an episode as its source,
    which left the episodic tier before the commit. The commit raises the rule's SQLSTATE
    and names it (not "could not commit transaction" from the workers), writing nothing."""
    first, _ = getattr(cluster, pair)
    source = form(cluster, first, f"{pair} the episode that will be promoted away")
    proposal = _propose(cluster, first, semantic(first, [source]))
    _no_longer_an_episode(cluster, source)
    before = _written(cluster)
    for call in (
        "SELECT fabric_api.commit(%s)",
        "SELECT fabric_api.commit_many(ARRAY[%s]::uuid[])",
    ):
        with (
            cluster.connect("mf_committer") as committer,
            pytest.raises(psycopg.errors.CheckViolation) as info,
        ):
            committer.execute(call, (proposal,))
        assert info.value.diag.constraint_name == "memory_records_semantic_needs_episode"
        assert _written(cluster) == before


def _raw_semantic(c: Cluster, tenant: str, parent: str | None) -> None:
    """A semantic record formed by the owner's own INSERT on the coordinator, with one
    lineage row to parent (none when None), in one transaction block."""
    with c.connect(autocommit=False) as su:
        su.execute("SET LOCAL ROLE fabric_owner")
        su.execute(sql.SQL("SET LOCAL fabric.tenant_id = {}").format(sql.Literal(tenant)))
        su.execute("SET LOCAL fabric.actor = 'os-agt-010'")
        row = su.execute(
            "INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, "
            "content, source_event_id, formed_by, formation_method, confidence, valid_from, "
            "retention_class) VALUES (%s, 'semantic', 'subject', 'user-8842', %s, %s, "
            "'os-agt-010', 'extraction', 0.9, '2026-07-02T09:14:00Z', 'durable') "
            "RETURNING memory_id",
            (tenant, Jsonb({"text": "raw"}), f"evt-raw-{uuid.uuid4()}"),
        ).fetchone()
        assert row is not None
        if parent is not None:
            su.execute(
                "INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id) "
                "VALUES (%s, %s, %s)",
                (tenant, row[0], parent),
            )
        su.commit()


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_the_shards_deferred_rule_refuses_a_raw_semantic_insert_at_commit(
    cluster: Cluster, pair: str
) -> None:
    """Outside the API the shard's deferred trigger still holds the rule when the
    coordinator commits on the worker (reading the tenant's shards of that worker only).
    Citus reports a worker's refusal at commit as its own error, without the rule's
    SQLSTATE; nothing is written. The control: with an episode as parent it commits."""
    first, _ = getattr(cluster, pair)
    episode_id = form(cluster, first, f"{pair} a parent for a raw insert")
    before = _written(cluster)
    with pytest.raises(psycopg.errors.InternalError_, match="could not commit transaction"):
        _raw_semantic(cluster, first, None)
    assert _written(cluster) == before
    _raw_semantic(cluster, first, episode_id)
    row = cluster.row(
        "SELECT count(*) FROM fabric.memory_lineage WHERE tenant_id = %s AND derived_from_id = %s",
        first,
        episode_id,
    )
    assert row == (1,)


def test_a_semantic_record_derived_from_a_semantic_one_commits(cluster: Cluster) -> None:
    """The walk through derived_from (an episode two generations up), at propose, at the
    API's check and in the shard's deferred trigger."""
    first, _ = cluster.apart
    source = form(cluster, first, "the grandparent episode")
    with cluster.connect("mf_committer") as committer:
        parent = committer.execute(
            "SELECT fabric_api.commit(%s)", (_propose(cluster, first, semantic(first, [source])),)
        ).fetchone()
        assert parent is not None
        child = committer.execute(
            "SELECT fabric_api.commit(%s)",
            (_propose(cluster, first, semantic(first, [str(parent[0]["memory_id"])])),),
        ).fetchone()
    assert child is not None and child[0]["derived_from"] == [parent[0]["memory_id"]]


def _lineage(c: Cluster, memory_ids: list[str]) -> dict[str, list[str]]:
    rows = c.rows(
        "SELECT memory_id::text, array_agg(derived_from_id::text ORDER BY derived_from_id) "
        "FROM fabric.memory_lineage WHERE memory_id = ANY (%s::uuid[]) GROUP BY 1",
        memory_ids,
    )
    return {r[0]: r[1] for r in rows}


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_commit_many_writes_the_lineage_of_each_record(cluster: Cluster, pair: str) -> None:
    first, second = getattr(cluster, pair)
    sources = {
        t: sorted(form(cluster, t, f"{pair} source {n}") for n in range(2)) for t in (first, second)
    }
    proposals = [
        _propose(cluster, first, semantic(first, sources[first])),
        _propose(cluster, second, semantic(second, sources[second][:1])),
        _propose(
            cluster,
            first,
            {**episode(first, f"{pair} a derived episode"), "derived_from": sources[first][1:]},
        ),
    ]
    with cluster.connect("mf_committer") as committer:
        row = committer.execute(
            "SELECT fabric_api.commit_many(%s::uuid[])", (proposals,)
        ).fetchone()
    assert row is not None
    formed = [str(r["memory_id"]) for r in row[0]]
    assert _lineage(cluster, formed) == {
        formed[0]: sources[first],
        formed[1]: sources[second][:1],
        formed[2]: sources[first][1:],
    }
    assert [r["derived_from"] for r in row[0]] == [
        sources[first],
        sources[second][:1],
        sources[first][1:],
    ]
    assert _outbox(cluster, formed[1]) == [("memory.record.formed", second)]
    assert _staged(cluster) == 0


def test_the_drain_commits_with_lineage_and_rejects_only_what_breaks_the_rule(
    cluster: Cluster,
) -> None:
    first, second = cluster.apart
    good = {}
    for tenant in (first, second):
        source = form(cluster, tenant, f"drain source of {tenant}")
        good[tenant] = (_propose(cluster, tenant, semantic(tenant, [source])), source)
    doomed_source = form(cluster, first, "drain source promoted away")
    doomed = _propose(cluster, first, semantic(first, [doomed_source]))
    _no_longer_an_episode(cluster, doomed_source)
    with cluster.connect("mf_committer") as committer:
        row = committer.execute("SELECT fabric_api.commit_pending(10000)").fetchone()
    assert row is not None and row[0]["rejected"] >= 1 and row[0]["committed"] >= 2, row
    with cluster.connect() as su:
        states = dict(
            su.execute(
                "SELECT proposal_id::text, status FROM fabric.proposals "
                "WHERE proposal_id = ANY (%s::uuid[])",
                ([doomed, *(p for p, _ in good.values())],),
            ).fetchall()
        )
        formed = dict(
            su.execute(
                "SELECT proposal_id::text, memory_id::text FROM fabric.memory_records "
                "WHERE proposal_id = ANY (%s::uuid[])",
                ([p for p, _ in good.values()],),
            ).fetchall()
        )
    assert states == {doomed: "rejected", **{p: "committed" for p, _ in good.values()}}
    assert _lineage(cluster, list(formed.values())) == {
        formed[p]: [source] for p, source in good.values()
    }
    assert _staged(cluster) == 0


def test_a_consolidation_run_forms_a_semantic_record_on_a_cluster_tenant(
    cluster: Cluster,
) -> None:
    first, _ = cluster.apart
    key = f"invoice.currency.{uuid.uuid4()}"
    run = open_run(cluster, first)
    episodes = []
    with cluster.connect("mf_agent_a") as agent, cluster.connect("mf_committer") as committer:
        for n in range(3):
            record = episode(first, "x")
            record["content"] = {"key": key, "value": "EUR", "n": n}
            proposed = agent.execute(
                "SELECT fabric_api.propose(%s, %s)", (Jsonb(record), run)
            ).fetchone()
            assert proposed is not None
            committed = committer.execute(
                "SELECT fabric_api.commit(%s)", (proposed[0]["proposal_id"],)
            ).fetchone()
            assert committed is not None
            episodes.append(str(committed[0]["memory_id"]))
    with cluster.connect("mf_consolidator") as reader, cluster.connect("mf_committer") as committer:
        summary = run_consolidation(reader, committer, first, DeterministicConsolidator())
        again = run_consolidation(reader, committer, first, DeterministicConsolidator())
    assert (summary.recommended, summary.committed, summary.rejected) == (1, 1, 0), summary
    assert (again.recommended, again.committed) == (0, 0)
    rows = cluster.rows(
        "SELECT memory_id::text, tier, consolidation_state, tenant_id "
        "FROM fabric.memory_records WHERE formation_method = 'consolidation' "
        "AND content ->> 'key' = %s",
        key,
    )
    assert [r[1:] for r in rows] == [("semantic", "consolidated", first)]
    assert _lineage(cluster, [rows[0][0]]) == {rows[0][0]: sorted(episodes)}
    assert ("memory.record.consolidated", first) in _outbox(cluster, rows[0][0])
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
    states = dict(
        cluster.rows(
            "SELECT memory_id::text, consolidation_state FROM fabric.memory_records "
            "WHERE memory_id = ANY (%s::uuid[])",
            list(lapsed.values()),
        )
    )
    assert set(states.values()) == {"expired"}
    for tenant, memory_id in lapsed.items():
        assert ("memory.record.expired", tenant) in _outbox(cluster, memory_id)
    assert _staged(cluster) == 0


def test_a_corroboration_counts_toward_the_promotion_of_an_assertion(cluster: Cluster) -> None:
    """An assertion formed from one episode falls short of the promotion threshold; a
    corroborating episode, recommended and committed through the workflow, links it
    (memory_corroborations) and the promotion passes."""
    _, second = cluster.apart
    first_episode, again = (form(cluster, second, f"corroboration {n}") for n in range(2))
    with cluster.connect("mf_committer") as committer:
        row = committer.execute(
            "SELECT fabric_api.commit(%s)",
            (_propose(cluster, second, semantic(second, [first_episode])),),
        ).fetchone()
        assert row is not None
        assertion = str(row[0]["memory_id"])
        with pytest.raises(psycopg.errors.CheckViolation):
            committer.execute("SELECT fabric_api.promote(%s, 'profile')", (assertion,))
    with cluster.connect("mf_consolidator") as reader:
        workflow = reader.execute("SELECT fabric_api.start_workflow_run(%s)", (second,)).fetchone()
        assert workflow is not None
        recommended = reader.execute(
            "SELECT fabric_api.recommend(%s)",
            (
                Jsonb(
                    {
                        "tenant_id": second,
                        "kind": "corroboration",
                        "workflow_event_id": str(workflow[0]),
                        "sources": [again],
                        "proposal": {"corroborates": assertion},
                    }
                ),
            ),
        ).fetchone()
    assert recommended is not None
    with cluster.connect("mf_committer") as committer:
        committed = committer.execute(
            "SELECT fabric_api.commit_recommendation(%s)",
            (recommended[0]["recommendation_id"],),
        ).fetchone()
        promoted = committer.execute(
            "SELECT fabric_api.promote(%s, 'profile')", (assertion,)
        ).fetchone()
    assert committed is not None and committed[0]["status"] == "corroborated"
    assert (committed[0]["linked"], committed[0]["episodes"]) == ([again], 2)
    assert promoted is not None and promoted[0]["tier"] == "profile"
    assert ("memory.record.corroborated", second) in _outbox(cluster, assertion)
    assert _staged(cluster) == 0


def _configure(c: Cluster, tenant: str, window: str) -> None:
    """The tenant's operational window, as its administrator sets it; read back from the
    shard (the configuration is kept, not only answered)."""
    with c.connect("mf_admin") as admin:
        admin.execute(
            "SELECT fabric_api.configure_instance(%s, NULL, %s)",
            (tenant, Jsonb({"operational_window": window})),
        )
    c.relay()  # a delegated call: its event, into the outbox
    row = c.row(
        "SELECT operational_window = %s::interval FROM fabric.instance_config "
        "WHERE tenant_id = %s AND business_instance_id = ''",
        window,
        tenant,
    )
    assert row == (True,)


def test_decay_closes_the_window_of_due_operational_records_in_each_tenant(
    cluster: Cluster,
) -> None:
    """Window closure with due records, a tenant on each worker: the records are summarised
    into the temporal tier, their content removed and their window closed, each with its
    event in the outbox; a durable record of the same tenant is kept."""
    tenants = cluster.apart
    due: dict[str, list[str]] = {}
    kept = {}
    try:
        for tenant in tenants:
            _configure(cluster, tenant, "1 millisecond")
            run = open_run(cluster, tenant)
            records = [episode(tenant, f"an operational note {n} of {tenant}") for n in range(2)]
            for record in records:
                record["retention_class"] = "operational"
            records.append(episode(tenant, f"a durable note of {tenant}"))
            with cluster.connect("mf_agent_a") as agent:
                proposals = [
                    agent.execute(
                        "SELECT fabric_api.propose(%s, %s)", (Jsonb(record), run)
                    ).fetchone()[0]["proposal_id"]  # type: ignore[index]
                    for record in records
                ]
            with cluster.connect("mf_committer") as committer:
                row = committer.execute(
                    "SELECT fabric_api.commit_many(%s::uuid[])", (proposals,)
                ).fetchone()
            assert row is not None
            *due[tenant], kept[tenant] = [str(r["memory_id"]) for r in row[0]]
        time.sleep(0.05)
        with cluster.connect() as su:
            summarised_before = dict(
                su.execute(
                    "SELECT tenant_id, sum(records) FROM fabric.temporal_summaries "
                    "WHERE retention_class = 'operational' GROUP BY 1"
                ).fetchall()
            )
        with cluster.connect("mf_committer") as committer:
            report = committer.execute("SELECT fabric_api.run_decay()").fetchone()
    finally:
        for tenant in tenants:
            _configure(cluster, tenant, "90 days")
    assert report is not None and report[0]["windows_closed"] == 4, report
    closed = [m for ids in due.values() for m in ids]
    with cluster.connect() as su:
        rows = {
            r[0]: tuple(r[1:])
            for r in su.execute(
                "SELECT memory_id::text, consolidation_state, content IS NULL, "
                "valid_until IS NOT NULL FROM fabric.memory_records "
                "WHERE memory_id = ANY (%s::uuid[])",
                ([*closed, *kept.values()],),
            )
        }
        summarised = dict(
            su.execute(
                "SELECT tenant_id, sum(records) FROM fabric.temporal_summaries "
                "WHERE retention_class = 'operational' GROUP BY 1"
            ).fetchall()
        )
    assert rows == {
        **{m: ("expired", True, True) for m in closed},
        **{m: ("raw", False, False) for m in kept.values()},
    }
    for tenant in tenants:
        assert summarised[tenant] - summarised_before.get(tenant, 0) == 2
        for memory_id in due[tenant]:
            assert _outbox(cluster, memory_id) == [
                ("memory.record.formed", tenant),
                ("memory.record.expired", tenant),
            ]
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
    rows = dict(
        cluster.rows(
            "SELECT run_id, tenant_id FROM fabric.runs WHERE run_id = ANY (%s)", list(runs.values())
        )
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
    return int(c.row("SELECT count(*) FROM fabric.proposals")[0])


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_an_agent_proposes_in_the_tenant_of_its_run(cluster: Cluster, pair: str) -> None:
    for tenant in getattr(cluster, pair):
        run = open_run(cluster, tenant)
        with cluster.connect("mf_agent_a") as agent:
            row = agent.execute(
                "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(tenant, "a note")), run)
            ).fetchone()
        assert row is not None and row[0]["status"] == "validated", row
        filed = cluster.row(
            "SELECT tenant_id FROM fabric.proposals WHERE proposal_id = %s", row[0]["proposal_id"]
        )
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
