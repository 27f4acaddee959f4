"""The rest of the tenant-scoped `fabric_api` calls on a Citus cluster (`make test-citus`):
bulk import, propose_many, the working tier's hand-off, agent and MCP tokens, the temporal
tier, procedures as of a time, the model consolidator's kinds (reflection, distillation,
promotion, corroboration, contradiction flags), review flags, the graph tier (entities and
mentions, agent lineage links, reasoning steps, entity merges) and a subject's erasure.

Each call runs once on tenants on the same worker and on different ones where that matters,
the rule it enforces is tried once (its SQLSTATE, nothing written), and the other tenant
sees nothing. Skipped unless MEMFABRIC_CITUS_URL names a coordinator (citus_cluster.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from test_citus_fabric import _outbox, _staged, episode, form, open_run, recall, relay

from citus_cluster import Cluster, cluster
from conftest import MEMORY_TOOLS, PROFILE_WIDE

__all__ = ["cluster"]  # the session fixture, used by name

PAIRS = ["same", "apart"]
TEMPORAL_TOOLS = [*MEMORY_TOOLS, "tool:temporal-read"]


def call(c: Cluster, login: str, query: str, *args: Any) -> Any:
    """The call's one value; then the relay, so that a delegated call's events are in the
    outbox as a call on the coordinator's are (what `memfabric serve` does within its poll)."""
    with c.connect(login) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    relay(c)
    return row[0]


def counts(c: Cluster, tenant: str) -> dict[str, int]:
    """Rows of the tenant in every table a call of this file writes, and its events."""
    tables = (
        "proposals",
        "memory_records",
        "memory_lineage",
        "memory_record_versions",
        "approvals",
        "review_flags",
        "recommendations",
        "contradiction_flags",
        "memory_corroborations",
        "entities",
        "memory_mentions",
        "agent_lineage_links",
        "reasoning_steps",
        "step_touches",
        "agent_tokens",
        "mcp_tokens",
        "measurements",
        "erasure_receipts",
        "runs",
        "memory_embeddings",
    )
    with c.connect() as su:
        got = {
            t: su.execute(
                f"SELECT count(*) FROM fabric.{t} WHERE tenant_id = %s",  # noqa: S608
                (tenant,),
            ).fetchone()[0]  # type: ignore[index]
            for t in tables
        }
        got["events"] = su.execute(
            "SELECT count(*) FROM fabric.events WHERE tenant_id = %s", (tenant,)
        ).fetchone()[0]  # type: ignore[index]
    got["shard_events"] = _staged(c)
    return got


def refused(c: Cluster, tenant: str, send: Callable[[], Any], sqlstate: str) -> None:
    """`send` raises `sqlstate` and writes nothing in `tenant` (runs aside: none opened)."""
    before = counts(c, tenant)
    with pytest.raises(psycopg.Error) as info:
        send()
    assert info.value.sqlstate == sqlstate, info.value
    assert counts(c, tenant) == before


def events(c: Cluster, tenant: str, event_type: str) -> list[dict[str, Any]]:
    rows = c.rows(
        "SELECT memory_id::text, payload FROM fabric.events WHERE tenant_id = %s "
        "AND event_type = %s ORDER BY xid, occurred_at",
        tenant,
        event_type,
    )
    return [{"memory_id": r[0], "payload": r[1]} for r in rows]


def records_of(c: Cluster, tenant: str, where: str = "true") -> list[str]:
    rows = c.rows(
        f"SELECT memory_id::text FROM fabric.memory_records WHERE tenant_id = %s AND {where}",  # noqa: S608
        tenant,
    )
    return [r[0] for r in rows]


# -- bulk import ---------------------------------------------------------------------------


def element(tenant: str, text: str, **overrides: Any) -> dict[str, Any]:
    el: dict[str, Any] = {
        "scope": {"tenant_id": tenant, "subject_id": "user-8842", "visibility": "subject"},
        "content": {"text": text},
        "provenance": {"correlation_id": "corr-crm", "formation_method": "import"},
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        "retention_class": "durable",
    }
    el.update(overrides)
    return el


IMPORT = "SELECT fabric_api.import_records(%s, %s, %s)"


@pytest.mark.parametrize("pair", PAIRS)
def test_an_import_forms_records_in_its_tenant_only(cluster: Cluster, pair: str) -> None:
    first, second = getattr(cluster, pair)
    before = counts(cluster, second)
    import_id = f"imp-{uuid.uuid4().hex[:12]}"
    records = [
        element(first, f"{pair} imported from the crm {uuid.uuid4()}"),
        element(first, "a wrong visibility", scope={"tenant_id": first, "visibility": "galaxy"}),
    ]
    answer = call(cluster, "mf_committer", IMPORT, first, import_id, Jsonb(records))
    assert counts(cluster, second) == before
    assert (answer["formed"], answer["refused"]) == (1, 1)
    assert answer["refusals"][0]["position"] == 1  # 0-based
    (imported,) = records_of(
        cluster,
        first,
        f"formation_method = 'import' AND content->>'text' LIKE '{pair} imported from the crm %%'",
    )
    assert _outbox(cluster, imported) == [("memory.record.formed", first)]
    assert len(events(cluster, first, "memory.import.completed")) >= 1
    assert _staged(cluster) == 0
    assert imported in recall(cluster, first)
    assert imported not in recall(cluster, second)
    # the same import id with another body is refused, writing nothing
    refused(
        cluster,
        first,
        lambda: call(cluster, "mf_committer", IMPORT, first, import_id, Jsonb(records[:1])),
        "23505",
    )


def test_an_import_by_a_login_that_is_not_a_committer_is_refused(cluster: Cluster) -> None:
    first, _ = cluster.apart
    refused(
        cluster,
        first,
        lambda: call(
            cluster, "mf_agent_a", IMPORT, first, "imp-agent", Jsonb([element(first, "x")])
        ),
        "42501",
    )


# -- propose_many --------------------------------------------------------------------------


def enveloped(tenant: str, text: str, **overrides: Any) -> dict[str, Any]:
    env = episode(tenant, text)
    env.update(overrides)
    return env


PROPOSE_MANY = "SELECT fabric_api.propose_many(%s, %s)"


@pytest.mark.parametrize("pair", PAIRS)
def test_propose_many_files_a_batch_in_the_runs_tenant(cluster: Cluster, pair: str) -> None:
    first, second = getattr(cluster, pair)
    source = form(cluster, first, f"{pair} an episode behind a fact")
    foreign = form(cluster, second, f"{pair} an episode of the other tenant")
    run = open_run(cluster, first)
    batch = [
        enveloped(first, f"{pair} first of a batch"),
        enveloped(
            first,
            "a fact",
            tier="semantic",
            content={"key": f"k.{uuid.uuid4()}", "value": "v"},
            derived_from=[source],
        ),
        enveloped(
            first,
            "a fact",
            tier="semantic",
            content={"key": f"k.{uuid.uuid4()}", "value": "v"},
            derived_from=[foreign],
        ),
        enveloped(second, "another tenant's scope"),
        {"not": "an envelope"},
    ]
    before = counts(cluster, second)
    answers = call(cluster, "mf_agent_a", PROPOSE_MANY, Jsonb(batch), run)
    assert [a["status"] for a in answers] == ["validated", "validated", "error", "error", "error"]
    assert [a.get("sqlstate") for a in answers[2:]] == ["23503", "42501", "22023"]
    filed = cluster.rows(
        "SELECT tenant_id, status FROM fabric.proposals WHERE proposal_id = ANY (%s::uuid[])",
        [a["proposal_id"] for a in answers[:2]],
    )
    assert filed == [(first, "validated")] * 2
    assert counts(cluster, second) == before
    # the batch again: each position is a replay, nothing new is filed
    again = call(cluster, "mf_agent_a", PROPOSE_MANY, Jsonb(batch[:2]), run)
    assert [(a["proposal_id"], a.get("replayed")) for a in again] == [
        (a["proposal_id"], True) for a in answers[:2]
    ]
    # the committer commits the batch's records on the tenant's worker
    committed = call(
        cluster,
        "mf_committer",
        "SELECT fabric_api.commit_many(%s::uuid[])",
        [a["proposal_id"] for a in answers[:2]],
    )
    assert len(committed) == 2


def test_a_committer_cannot_propose_many_and_nothing_is_written(cluster: Cluster) -> None:
    first, _ = cluster.apart
    run = open_run(cluster, first)
    refused(
        cluster,
        first,
        lambda: call(cluster, "mf_committer", PROPOSE_MANY, Jsonb([episode(first, "x")]), run),
        "42501",
    )


# -- the working tier's hand-off -----------------------------------------------------------


def item(text: str) -> dict[str, Any]:
    return {
        "event_id": f"evt-item-{uuid.uuid4()}",
        "correlation_id": "corr-5e1b",
        "content": {"text": text},
    }


@pytest.mark.parametrize("pair", PAIRS)
def test_a_handoff_commits_as_a_promotion_from_working_in_its_tenant(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    run = open_run(cluster, first)
    key = call(cluster, "mf_agent_a", "SELECT fabric_api.working_key(%s)", run)
    assert key["tenant_id"] == first and key["subject_key"].startswith("w-")
    other = call(
        cluster, "mf_agent_a", "SELECT fabric_api.working_key(%s)", open_run(cluster, second)
    )
    assert other["subject_key"] != key["subject_key"]  # one key per tenant and subject
    (answer,) = call(
        cluster,
        "mf_agent_a",
        "SELECT fabric_api.handoff(%s, %s)",
        Jsonb([item(f"{pair} asked for invoices in EUR")]),
        run,
    )
    assert answer["status"] == "validated"
    committed = call(cluster, "mf_committer", "SELECT fabric_api.commit(%s)", answer["proposal_id"])
    memory_id = committed["memory_id"]
    assert _outbox(cluster, memory_id) == [
        ("memory.record.formed", first),
        ("memory.record.promoted", first),
    ] or sorted(_outbox(cluster, memory_id)) == [
        ("memory.record.formed", first),
        ("memory.record.promoted", first),
    ]
    assert _staged(cluster) == 0
    assert memory_id in recall(cluster, first) and memory_id not in recall(cluster, second)


def test_a_committer_cannot_hand_off_and_nothing_is_written(cluster: Cluster) -> None:
    first, _ = cluster.apart
    run = open_run(cluster, first)
    refused(
        cluster,
        first,
        lambda: call(
            cluster, "mf_committer", "SELECT fabric_api.handoff(%s, %s)", Jsonb([item("x")]), run
        ),
        "42501",
    )


# -- agent and MCP tokens --------------------------------------------------------------------


@pytest.mark.parametrize("pair", PAIRS)
def test_an_agent_token_opens_runs_in_its_tenant_until_revoked(cluster: Cluster, pair: str) -> None:
    first, second = getattr(cluster, pair)
    issued = call(
        cluster,
        "mf_orchestrator",
        "SELECT fabric_api.issue_agent_token(%s, 'com-agt-003', 'user-8842', 'sess-t', %s, "
        "'1 hour'::interval)",
        first,
        MEMORY_TOOLS,
    )
    opened = call(cluster, "mf_gateway", "SELECT fabric_api.open_token_run(%s)", issued["token"])
    assert opened["tenant_id"] == first
    mine = form_in_run(cluster, first, uuid.UUID(opened["run_id"]), f"{pair} by token")
    assert mine in recall(cluster, first) and mine not in recall(cluster, second)
    # another tenant cannot revoke it: the token is not found there
    refused(
        cluster,
        second,
        lambda: call(
            cluster,
            "mf_orchestrator",
            "SELECT fabric_api.revoke_agent_token(%s, %s)",
            second,
            issued["token_id"],
        ),
        "P0002",
    )
    revoked = call(
        cluster,
        "mf_orchestrator",
        "SELECT fabric_api.revoke_agent_token(%s, %s)",
        first,
        issued["token_id"],
    )
    assert revoked["runs_closed"] == 1
    refused(
        cluster,
        first,
        lambda: call(
            cluster, "mf_gateway", "SELECT fabric_api.open_token_run(%s)", issued["token"]
        ),
        "42501",
    )


def form_in_run(c: Cluster, tenant: str, run: uuid.UUID, text: str) -> str:
    proposed = call(
        c, "mf_agent_a", "SELECT fabric_api.propose(%s, %s)", Jsonb(episode(tenant, text)), run
    )
    return str(
        call(c, "mf_committer", "SELECT fabric_api.commit(%s)", proposed["proposal_id"])[
            "memory_id"
        ]
    )


@pytest.mark.parametrize("pair", PAIRS)
def test_an_mcp_token_resolves_to_its_run_until_revoked(cluster: Cluster, pair: str) -> None:
    first, second = getattr(cluster, pair)
    run = open_run(cluster, first)
    token = call(
        cluster,
        "mf_orchestrator",
        "SELECT fabric_api.issue_mcp_token(%s, %s::interval)",
        run,
        "1 hour",
    )
    other = call(
        cluster,
        "mf_orchestrator",
        "SELECT fabric_api.issue_mcp_token(%s, %s::interval)",
        open_run(cluster, second),
        "1 hour",
    )
    resolved = call(cluster, "mf_gateway", "SELECT fabric_api.resolve_mcp_token(%s)", token)
    assert (resolved["tenant_id"], resolved["run_id"]) == (first, str(run))
    theirs = call(cluster, "mf_gateway", "SELECT fabric_api.resolve_mcp_token(%s)", other)
    assert theirs["tenant_id"] == second
    revoked = call(cluster, "mf_orchestrator", "SELECT fabric_api.revoke_mcp_token(%s)", token)
    assert revoked["revoked_at"]
    refused(
        cluster,
        first,
        lambda: call(cluster, "mf_gateway", "SELECT fabric_api.resolve_mcp_token(%s)", token),
        "42501",
    )
    assert call(cluster, "mf_gateway", "SELECT fabric_api.resolve_mcp_token(%s)", other)


def test_an_orchestrator_closes_the_run_it_opened(cluster: Cluster) -> None:
    """The run keeps its opener's login (not the owner's, as a worker would fill it in)."""
    first, _ = cluster.apart
    run = open_run(cluster, first)
    opener = cluster.row("SELECT opened_by FROM fabric.runs WHERE run_id = %s", run)
    assert opener == ("mf_orchestrator",)
    closed = call(cluster, "mf_orchestrator", "SELECT fabric_api.close_run(%s)", run)
    assert closed["closed_at"]
    (payload,) = cluster.row(
        "SELECT payload FROM fabric.events WHERE run_id = %s AND event_type = 'fabric.run.closed'",
        run,
    )
    assert payload["closed_as"] == "opener"


# -- embeddings, search statistics, the consolidator's reads ----------------------------------


@pytest.mark.parametrize("pair", PAIRS)
def test_the_projector_stores_embeddings_of_its_tenants_records(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    mine = form(cluster, first, f"{pair} an embedded note")
    (content_hash,) = cluster.row(
        "SELECT content_hash FROM fabric.memory_records WHERE memory_id = %s", mine
    )
    store = "SELECT fabric_api.store_embedding(%s, 'm', 'v1', '[1,0,0]', %s)"
    call(cluster, "mf_projector", store, mine, content_hash)
    many = (
        "SELECT fabric_api.store_embeddings(%s::uuid[], 'm', 'v2',"
        " ARRAY['[0,1,0]']::ext.vector[], %s)"
    )
    before = counts(cluster, second)
    call(cluster, "mf_projector", many, [mine], [content_hash])
    assert counts(cluster, second)["memory_embeddings"] == before["memory_embeddings"]
    rows = cluster.rows(
        "SELECT tenant_id, model_version FROM fabric.memory_embeddings WHERE memory_id = %s"
        " ORDER BY 2",
        mine,
    )
    assert {r[0] for r in rows} == {first} and rows
    refused(  # a stale content hash stores nothing
        cluster,
        first,
        lambda: call(cluster, "mf_projector", store, mine, "sha256:" + "0" * 64),
        "55000",
    )


def test_search_statistics_are_compacted_across_the_tenants(cluster: Cluster) -> None:
    answer = call(cluster, "mf_committer", "SELECT fabric_api.compact_search_stats(100)")
    assert isinstance(answer, dict)


@pytest.mark.parametrize("pair", PAIRS)
def test_the_consolidators_reads_answer_for_their_tenant(cluster: Cluster, pair: str) -> None:
    first, _ = getattr(cluster, pair)
    settings = call(
        cluster, "mf_consolidator", "SELECT fabric_api.consolidation_settings(%s)", first
    )
    assert settings
    call(cluster, "mf_consolidator", "SELECT fabric_api.consolidation_cursor(%s)", first)
    waiting = call(cluster, "mf_committer", "SELECT fabric_api.awaiting_recommendations(%s)", first)
    assert isinstance(waiting, list)
    with cluster.connect("mf_admin") as admin:
        admin.execute(
            "SELECT fabric_api.check_working_uri(%s, 'redis://127.0.0.1:6379/0')", (first,)
        )


# -- the temporal tier ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def temporal_reader(cluster: Cluster) -> None:
    """com-agt-003 allowed tool:temporal-read, in every tenant of the cluster."""
    call(
        cluster,
        "mf_admin",
        "SELECT fabric_api.register_agent('com-agt-003', 'mf_agent_a', %s, %s)",
        Jsonb(PROFILE_WIDE),
        TEMPORAL_TOOLS,
    )
    for tenant in cluster.tenants:
        call(
            cluster,
            "mf_admin",
            "SELECT fabric_api.enable_agent(%s, 'com-agt-003', %s)",
            tenant,
            TEMPORAL_TOOLS,
        )


def point(at: str, value: float, **extra: Any) -> dict[str, Any]:
    return {"series": "trading.fill_latency_ms", "at": at, "value": value, **extra}


@pytest.mark.parametrize("pair", PAIRS)
def test_measurements_are_read_in_the_runs_tenant_only(
    cluster: Cluster, pair: str, temporal_reader: None
) -> None:
    first, second = getattr(cluster, pair)
    day = f"2026-08-{16 if pair == 'same' else 18}"
    written = call(
        cluster,
        "mf_workflow",
        "SELECT fabric_api.record_measurements(%s, %s)",
        first,
        Jsonb([point(f"{day}T10:05:00Z", 10), point(f"{day}T10:35:00Z", 20)]),
    )
    assert written == 2
    call(
        cluster,
        "mf_workflow",
        "SELECT fabric_api.record_measurements(%s, %s)",
        second,
        Jsonb([point(f"{day}T10:06:00Z", 999)]),
    )
    with cluster.connect("mf_orchestrator") as conn:
        run = conn.execute(
            "SELECT fabric_api.open_run(%s, 'com-agt-003', 'user-8842', 'sess-1', %s, "
            "'1 hour'::interval)",
            (first, TEMPORAL_TOOLS),
        ).fetchone()[0]  # type: ignore[index]
    relay(cluster)
    request = {
        "run_id": str(run),
        "series": "trading.fill_latency_ms",
        "window": "1 hour",
        "aggregate": "sum",
        "from": f"{day}T00:00:00Z",
        "until": f"{day}T23:00:00Z",
    }
    answer = call(cluster, "mf_agent_a", "SELECT fabric_api.read_measurements(%s)", Jsonb(request))
    assert answer["status"] == "served"
    assert [(p["value"], p["samples"]) for p in answer["points"]] == [(30.0, 2)]
    # a producer that is not a workflow writes nothing
    refused(
        cluster,
        first,
        lambda: call(
            cluster,
            "mf_agent_a",
            "SELECT fabric_api.record_measurements(%s, %s)",
            first,
            Jsonb([point(f"{day}T10:07:00Z", 1)]),
        ),
        "42501",
    )


def test_temporal_retention_removes_lapsed_operational_points_in_each_tenant(
    cluster: Cluster,
) -> None:
    first, second = cluster.apart
    series = f"retention.t{uuid.uuid4().hex[:8]}.points"
    for tenant in (first, second):
        call(cluster, "mf_workflow", "SELECT fabric_api.record_measurements(%s, %s)", tenant,
             Jsonb([{"series": series, "at": "2020-01-01T00:00:00Z", "value": 1},
                    {"series": series, "at": "2020-01-01T00:00:00Z", "value": 2,
                     "retention_class": "durable"}]))  # fmt: skip
    deleted = call(cluster, "mf_committer", "SELECT fabric_api.run_temporal_retention()")
    assert deleted >= 2
    kept = cluster.rows(
        "SELECT tenant_id, retention_class FROM fabric.measurements WHERE series = %s ORDER BY 1",
        series,
    )
    assert kept == [(first, "durable"), (second, "durable")]


# -- procedures as of a time -------------------------------------------------------------------


@pytest.mark.parametrize("pair", PAIRS)
def test_a_procedure_is_read_as_it_was_in_its_tenant(cluster: Cluster, pair: str) -> None:
    first, second = getattr(cluster, pair)
    source = form(cluster, first, f"{pair} the refund went through")
    key = f"skill.refund.{uuid.uuid4()}"
    run = open_run(cluster, first)
    v1_env = enveloped(
        first,
        "x",
        tier="procedural",
        derived_from=[source],
        version="1.0.0",
        content={"key": key, "value": "steps of 1.0.0"},
    )
    v1_prop = call(cluster, "mf_agent_a", "SELECT fabric_api.propose(%s, %s)", Jsonb(v1_env), run)
    v1 = call(cluster, "mf_committer", "SELECT fabric_api.commit(%s)", v1_prop["proposal_id"])
    v2_env = enveloped(
        first,
        "x",
        tier="procedural",
        derived_from=[source],
        version="1.1.0",
        content={"key": key, "value": "steps of 1.1.0"},
        validity_interval={"valid_from": "2026-09-01T00:00:00Z"},
    )
    v2_prop = call(cluster, "mf_agent_a", "SELECT fabric_api.propose(%s, %s)", Jsonb(v2_env), run)
    v2 = call(
        cluster,
        "mf_committer",
        "SELECT fabric_api.supersede(%s, %s)",
        v1["memory_id"],
        v2_prop["proposal_id"],
    )
    request = {"run_id": str(run), "memory_id": v2["memory_id"], "valid_at": "2026-08-01T00:00:00Z"}
    answer = call(
        cluster, "mf_agent_a", "SELECT fabric_api.recall_procedure_as_of(%s)", Jsonb(request)
    )
    assert answer["status"] == "served"
    assert [r["memory_id"] for r in answer["records"]] == [v1["memory_id"]]
    assert answer["records"][0]["content"]["value"] == "steps of 1.0.0"
    # the other tenant's run does not find the procedure
    other = {**request, "run_id": str(open_run(cluster, second))}
    theirs = call(
        cluster, "mf_agent_a", "SELECT fabric_api.recall_procedure_as_of(%s)", Jsonb(other)
    )
    assert (theirs["status"], theirs["records"]) == ("served", [])


# -- the model consolidator's kinds -------------------------------------------------------------


def workflow(c: Cluster, tenant: str) -> str:
    return str(call(c, "mf_consolidator", "SELECT fabric_api.start_workflow_run(%s)", tenant))


def recommend(c: Cluster, tenant: str, kind: str, sources: list[str], proposal: Any) -> str:
    filed = call(
        c,
        "mf_consolidator",
        "SELECT fabric_api.recommend(%s)",
        Jsonb(
            {
                "tenant_id": tenant,
                "kind": kind,
                "workflow_event_id": workflow(c, tenant),
                "sources": sources,
                "proposal": proposal,
            }
        ),
    )
    return str(filed["recommendation_id"])


def commit_recommendation(c: Cluster, recommendation: str) -> Any:
    return call(c, "mf_committer", "SELECT fabric_api.commit_recommendation(%s)", recommendation)


def fact(
    tenant: str,
    sources: list[str],
    tier: str = "semantic",
    key: str | None = None,
    method: str = "extraction",
) -> dict[str, Any]:
    env = enveloped(
        tenant,
        "x",
        tier=tier,
        derived_from=sources,
        content={"key": key or f"fact.{uuid.uuid4()}", "value": "v"},
    )
    env["provenance"]["formation_method"] = method
    return env


def formed(c: Cluster, tenant: str, env: dict[str, Any]) -> str:
    proposal = call(
        c, "mf_agent_a", "SELECT fabric_api.propose(%s, %s)", Jsonb(env), open_run(c, tenant)
    )
    assert proposal["status"] == "validated", proposal
    return str(
        call(c, "mf_committer", "SELECT fabric_api.commit(%s)", proposal["proposal_id"])[
            "memory_id"
        ]
    )


@pytest.mark.parametrize("pair", PAIRS)
def test_reflections_distillations_and_promotions_are_committed_in_their_tenant(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    # three episodes: the distillation's threshold (min_successful_trajectories)
    episodes = [form(cluster, first, f"{pair} the refund took {n} steps") for n in range(3)]
    before = counts(cluster, second)
    made = {}
    for kind in ("reflection", "distillation"):
        proposal = {"content": {"key": f"{kind}.{uuid.uuid4()}", "value": "v"}, "confidence": 0.8}
        answer = commit_recommendation(cluster, recommend(cluster, first, kind, episodes, proposal))
        assert answer["status"] == "committed", answer
        made[kind] = answer["record"]
    assert (made["reflection"]["tier"], made["reflection"]["consolidation_state"]) == (
        "semantic",
        "reflected",
    )
    assert made["distillation"]["tier"] == "procedural"
    for record in made.values():
        assert {t for _, t in _outbox(cluster, record["memory_id"])} == {first}
    assertion = formed(cluster, first, fact(first, episodes))
    promoted = commit_recommendation(
        cluster, recommend(cluster, first, "promotion", [assertion], {"target_tier": "profile"})
    )
    assert promoted["tier"] == "profile"
    assert _staged(cluster) == 0
    assert counts(cluster, second) == before


def test_a_recommendation_naming_another_tenants_source_is_refused(cluster: Cluster) -> None:
    first, second = cluster.apart
    theirs = form(cluster, second, "an episode of the other tenant")
    wf = workflow(cluster, first)
    refused(
        cluster,
        first,
        lambda: call(
            cluster,
            "mf_consolidator",
            "SELECT fabric_api.recommend(%s)",
            Jsonb(
                {
                    "tenant_id": first,
                    "kind": "reflection",
                    "workflow_event_id": wf,
                    "sources": [theirs],
                    "proposal": {},
                }
            ),
        ),
        "23503",
    )


@pytest.mark.parametrize("pair", PAIRS)
def test_a_contradicted_declaration_is_flagged_and_resolved_in_its_tenant(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    key = f"home.city.{uuid.uuid4().hex[:8]}"
    declared = formed(
        cluster, first, fact(first, [], tier="profile", key=key, method="declaration")
    )
    said = [form(cluster, first, f"{pair} I moved to Lisbon last month")]
    answer = commit_recommendation(
        cluster,
        recommend(
            cluster,
            first,
            "reflection",  # an inference: it never retires a declaration
            said,
            {
                "tier": "profile",
                "content": {"key": key, "value": "Lisbon"},
                "confidence": 0.9,
                "supersedes": declared,
            },
        ),
    )
    assert answer["status"] == "flagged", answer
    queue = call(cluster, "mf_consolidator", "SELECT fabric_api.contradiction_queue(%s)", first)
    (flag,) = [f for f in queue if f["flag_id"] == answer["flag_id"]]
    assert flag["memory_id"] == declared
    resolved = resolve_flag(
        cluster, first, second, "contradiction", flag["flag_id"], "maybe", "confirmed"
    )
    assert (resolved["decision"], resolved["memory_id"]) == ("keep", declared)
    assert ("memory.contradiction.resolved", first) in _outbox(cluster, declared)


@pytest.mark.parametrize("pair", PAIRS)
def test_erasing_a_corroborating_episode_flags_the_assertion_for_review_in_its_tenant(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    source, again = (form(cluster, first, f"{pair} invoices in EUR {n}") for n in range(2))
    assertion = formed(cluster, first, fact(first, [source]))
    corroborated = commit_recommendation(
        cluster, recommend(cluster, first, "corroboration", [again], {"corroborates": assertion})
    )
    assert corroborated["status"] == "corroborated"
    erase_record(cluster, again)
    queue = call(cluster, "mf_consolidator", "SELECT fabric_api.review_queue(%s)", first)
    (flag,) = [q for q in queue if q["tombstoned_source"] == again]
    assert flag["memory_id"] == assertion
    resolved = resolve_flag(
        cluster, first, second, "review", flag["flag_id"], "ignore", "still true"
    )
    assert (resolved["decision"], resolved["memory_id"]) == ("keep", assertion)


def resolve_flag(
    c: Cluster, first: str, second: str, kind: str, flag_id: str, unknown: str, reason: str
) -> dict[str, Any]:
    """A flag of `kind` ('contradiction' or 'review') in `first`: not in `second`'s queue; a
    decision that is none of the kind's refused (22023, nothing written); then kept, with
    `reason` (the answer of fabric_api.resolve_<kind>_flag)."""
    theirs = call(c, "mf_consolidator", f"SELECT fabric_api.{kind}_queue(%s)", second)
    assert flag_id not in [f["flag_id"] for f in theirs]
    resolve = f"SELECT fabric_api.resolve_{kind}_flag(%s, %s, %s)"
    refused(c, first, lambda: call(c, "mf_consolidator", resolve, flag_id, unknown, "x"), "22023")
    return call(c, "mf_consolidator", resolve, flag_id, "keep", reason)  # type: ignore[no-any-return]


def erase_record(c: Cluster, memory_id: str) -> None:
    approval = call(c, "mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", memory_id)
    call(
        c,
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')",
        approval["approval_id"],
    )
    call(c, "mf_committer", "SELECT fabric_api.erase(%s)", approval["approval_id"])


# -- the graph tier ---------------------------------------------------------------------------


def with_entities(tenant: str, text: str, declared: list[dict[str, Any]]) -> dict[str, Any]:
    return enveloped(tenant, text, content={"text": text, "entities": declared})


def mentions(c: Cluster, memory_id: str) -> list[tuple[str, str, str]]:
    rows = c.rows(
        "SELECT x.tenant_id, e.entity_key, x.source FROM fabric.memory_mentions x"
        " JOIN fabric.entities e USING (tenant_id, entity_id) WHERE x.memory_id = %s"
        " ORDER BY 2",
        memory_id,
    )
    return [tuple(r) for r in rows]  # type: ignore[misc]


def entity(c: Cluster, tenant: str, key: str) -> str:
    (entity_id,) = c.row(
        "SELECT entity_id::text FROM fabric.entities WHERE tenant_id = %s AND entity_key = %s",
        tenant,
        key,
    )
    return str(entity_id)


def formed_event(c: Cluster, memory_id: str) -> str:
    (event_id,) = c.row(
        "SELECT event_id::text FROM fabric.events WHERE memory_id = %s "
        "AND event_type = 'memory.record.formed'",
        memory_id,
    )
    return str(event_id)


@pytest.mark.parametrize("pair", PAIRS)
def test_entities_mentions_links_steps_and_merges_stay_in_their_tenant(
    cluster: Cluster, pair: str
) -> None:
    first, second = getattr(cluster, pair)
    tag = uuid.uuid4().hex[:8]
    declared = [
        {"type": "organization", "name": f"Acme {tag} GmbH"},
        {"type": "organization", "name": f"Acme {tag} AG"},
    ]
    run = open_run(cluster, first)
    outcome = formed(cluster, first, with_entities(first, f"{pair} ask @dana about it", declared))
    theirs = formed(cluster, second, with_entities(second, f"{pair} theirs", declared[:1]))
    keys = [k for _, k, _ in mentions(cluster, outcome)]
    assert f"name:acme {tag} gmbh" in keys and "subject:user-8842" in keys
    assert {t for t, _, _ in mentions(cluster, outcome)} == {first}
    assert {t for t, _, _ in mentions(cluster, theirs)} == {second}

    link = "SELECT fabric_api.record_agent_link(%s, 'com-agt-003', %s, 'caused', %s, 'corr-7f2a')"
    linked = call(cluster, "mf_workflow", link, first, outcome, formed_event(cluster, outcome))
    assert linked["recorded"] is True
    assert ("memory.agent_link.recorded", first) in _outbox(cluster, outcome)
    refused(  # an outcome of another tenant
        cluster,
        first,
        lambda: call(cluster, "mf_workflow", link, first, theirs, formed_event(cluster, theirs)),
        "42501",
    )

    gmbh, ag = (entity(cluster, first, f"name:acme {tag} {s}") for s in ("gmbh", "ag"))
    step = call(
        cluster,
        "mf_workflow",
        "SELECT fabric_api.record_step(%s, 'corr-7f2a', %s)",
        run,
        [uuid.UUID(gmbh)],
    )
    assert step["step_id"]
    refused(  # an entity of another tenant
        cluster,
        first,
        lambda: call(
            cluster,
            "mf_workflow",
            "SELECT fabric_api.record_step(%s, 'c-1', %s)",
            run,
            [uuid.UUID(entity(cluster, second, f"name:acme {tag} gmbh"))],
        ),
        "P0002",
    )

    merge = "SELECT fabric_api.propose_entity_merge(%s, %s, %s, 'renamed')"
    refused(  # into an entity of another tenant
        cluster,
        first,
        lambda: call(
            cluster,
            "mf_consolidator",
            merge,
            first,
            ag,
            entity(cluster, second, f"name:acme {tag} gmbh"),
        ),
        "P0002",
    )
    only_ag = formed(cluster, first, with_entities(first, f"{pair} the AG", declared[1:]))
    proposed = call(cluster, "mf_consolidator", merge, first, ag, gmbh)
    call(
        cluster,
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'same')",
        proposed["approval_id"],
    )
    merged = call(
        cluster, "mf_consolidator", "SELECT fabric_api.merge_entities(%s)", proposed["approval_id"]
    )
    assert merged["mentions"] == 1  # the outcome mentioned both already
    assert f"name:acme {tag} gmbh" in [k for _, k, _ in mentions(cluster, only_ag)]
    merged_events = events(cluster, first, "memory.entity.merged")
    assert {e["memory_id"] for e in merged_events} >= {outcome, only_ag}
    assert _staged(cluster) == 0
    # the projector reads the merge from the tenant's shards, by its events and in a rebuild
    event_ids = [
        r[0]
        for r in cluster.rows(
            "SELECT event_id FROM fabric.events WHERE tenant_id = %s "
            "AND event_type = 'memory.entity.merged'",
            first,
        )
    ]
    same_as = "SELECT tenant_id, entity_id::text, into_entity_id::text, correlation_id FROM "
    with cluster.connect("mf_projector") as projector:
        fed = projector.execute(same_as + "fabric_api.projection_same_as(%s)", (event_ids,))
        by_events = fed.fetchall()
        snapshot = projector.execute(
            same_as + "fabric_api.projection_same_as_snapshot(NULL, NULL, 10000)"
        ).fetchall()
    merge_row = (first, ag, gmbh, f"merge:{proposed['approval_id']}")
    assert merge_row in by_events and {r[0] for r in by_events} == {first}
    assert merge_row in snapshot
    assert not [r for r in snapshot if r[1] == ag and r[0] != first]


# -- a subject's erasure ----------------------------------------------------------------------


def open_subject_run(
    c: Cluster, tenant: str, subject: str, tools: list[str] = MEMORY_TOOLS
) -> uuid.UUID:
    with c.connect("mf_orchestrator") as conn:
        row = conn.execute(
            "SELECT fabric_api.open_run(%s, 'com-agt-003', %s, 'sess-e', %s, '1 hour'::interval)",
            (tenant, subject, tools),
        ).fetchone()
    assert row is not None
    relay(c)  # the delegated open_run's event, into the outbox
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("pair", PAIRS)
def test_a_subjects_erasure_tombstones_its_records_in_its_tenant_only(
    cluster: Cluster, pair: str, temporal_reader: None
) -> None:
    first, second = getattr(cluster, pair)
    subject = f"user-erased-{uuid.uuid4().hex[:8]}"
    mine, kept = [], []
    for tenant, into in ((first, mine), (second, kept)):
        run = open_subject_run(cluster, tenant, subject)
        env = with_entities(
            tenant, f"{pair} {subject} lives in Berlin", [{"type": "location", "name": "Berlin"}]
        )
        proposal = call(cluster, "mf_agent_a", "SELECT fabric_api.propose(%s, %s)", Jsonb(env), run)
        into.append(
            str(
                call(
                    cluster, "mf_committer", "SELECT fabric_api.commit(%s)", proposal["proposal_id"]
                )["memory_id"]
            )
        )
        call(
            cluster,
            "mf_workflow",
            "SELECT fabric_api.record_measurements(%s, %s)",
            tenant,
            Jsonb([point("2026-08-20T10:00:00Z", 1, subject_id=subject)]),
        )
    request = "SELECT fabric_api.request_subject_erasure(%s, %s, 'GDPR art. 17', false)"
    approval = call(cluster, "mf_committer", request, first, subject)["approval_id"]
    call(cluster, "mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    scope = call(cluster, "mf_committer", "SELECT fabric_api.working_erasure_scope(%s)", approval)
    assert scope["tenant_id"] == first
    erased = call(cluster, "mf_committer", "SELECT fabric_api.erase(%s)", approval)
    assert erased
    call(
        cluster,
        "mf_committer",
        "SELECT fabric_api.record_working_erasure(%s, 0, %s)",
        approval,
        [f"mf:{first}:{scope['subject_key']}:*"],
    )
    states = dict(
        cluster.rows(
            "SELECT memory_id::text, consolidation_state FROM fabric.memory_records"
            " WHERE memory_id = ANY (%s::uuid[])",
            [*mine, *kept],
        )
    )
    points = dict(
        cluster.rows(
            "SELECT tenant_id, count(*) FROM fabric.measurements WHERE subject_id = %s GROUP BY 1",
            subject,
        )
    )
    assert states == {mine[0]: "tombstoned", kept[0]: "raw"}
    assert mentions(cluster, mine[0]) == []
    assert [t for t, _, _ in mentions(cluster, kept[0])] == [second, second]
    assert points == {second: 1}
    assert ("memory.record.forgotten", first) in _outbox(cluster, mine[0])
    assert _staged(cluster) == 0
