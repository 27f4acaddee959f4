"""`memfabric check`: the binding checklist of docs/checklist.md, run against a live
deployment (the database, the runtime settings, the Python bindings installed beside it).

Each item answers pass, fail, deviation (a decision documented in docs/, named with its
page) or not applicable, with the evidence it looked at. An item whose part is not built
(the LangGraph store, the MCP server) fails and says so. The database is read as the
connection given (the superuser or the migration role: catalogs and fabric tables).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from memfabric.settings import Settings

PASS, FAIL, DEVIATION, NOT_APPLICABLE = "pass", "fail", "deviation", "not applicable"
STATUSES = (PASS, FAIL, DEVIATION, NOT_APPLICABLE)
Conn = psycopg.Connection[Any]

STORE_MODULE, MCP_MODULE = "memfabric.langgraph", "memfabric.mcp_server"
STORE_METHODS = ("aget", "aput", "adelete", "asearch", "alist_namespaces")
NAMESPACE = ("tenant_id", "tier", "scope_id")
MEMORY_TABLES = ("memory_records", "memory_embeddings", "proposals", "memory_lineage",
                 "memory_record_versions", "events")  # fmt: skip
# The proposing entry points: each enters through fabric._propose_entry (the committer
# refusal, the run, the three-layer tool authorization).
PROPOSING_FUNCTIONS = (
    "fabric_api.propose(jsonb, uuid)",
    "fabric_api.propose_many(jsonb, uuid)",
    "fabric_api.handoff(jsonb, uuid)",
)
# The tenant-keyed doors (delegated on a Citus cluster) and the call each must make: the
# plain door's, whose checks then apply to every caller of both.
WRAPPERS = {
    "fabric_api.propose(text, jsonb, uuid)": "fabric_api.propose(p_envelope, p_run_id)",
    "fabric_api.propose_many(text, jsonb, uuid)": "fabric_api.propose_many(p_envelopes, p_run_id)",
    "fabric_api.recall(text, jsonb)": "fabric_api.recall(p_request)",
    "fabric_api.commit(text, uuid)": "fabric_api.commit(p_proposal_id)",
}
COMMIT_FUNCTIONS = ("commit", "commit_pending", "promote", "demote", "supersede",
                    "commit_recommendation", "erase")  # fmt: skip
# NOLOGIN roles that own or run the fabric's own functions (recall candidates, lookups).
INTERNAL_ROLES = ("fabric_retriever", "fabric_lookup")
LANGSMITH_SWITCHES = ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING")
NAMS_DEVIATION = "docs/checklist.md#13-the-graph-library"
DECIDED_DEVIATIONS = "docs/concepts.md#decided-deviations"


@dataclass(frozen=True)
class Result:
    number: int
    key: str
    status: str
    evidence: str

    def line(self) -> str:
        return f"{self.number:>2}. {self.key:<28} {self.status:<15} {self.evidence}"


# How old the oldest unsealed event may be before `audit-trail-sealed` fails: a sealer that
# runs keeps it near its poll interval; minutes mean sealing has stopped or cannot keep up.
SEAL_MAX_AGE_SECONDS = 300.0


@dataclass
class Context:
    conn: Conn
    env: Mapping[str, str]
    drill: Callable[[], Mapping[str, Any]] | None = None
    seal_max_age: float = SEAL_MAX_AGE_SECONDS

    def rows(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        return self.conn.execute(query, args).fetchall()

    def value(self, query: str, *args: Any) -> Any:
        row = self.conn.execute(query, args).fetchone()
        return None if row is None else row[0]


Check = Callable[[Context], tuple[str, str]]


# --- helpers ---------------------------------------------------------------------------


def _module(name: str) -> tuple[Any, str]:
    """The module, or None and why it cannot be imported."""
    if importlib.util.find_spec(name) is None:
        return None, f"{name} is not importable: not built yet"
    try:
        return importlib.import_module(name), ""
    except Exception as exc:  # an import that fails is a binding that is not there
        return None, f"{name} fails to import ({type(exc).__name__})"


def _store_class(module: Any) -> Any:
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__.startswith(STORE_MODULE) and all(
            callable(getattr(cls, m, None)) for m in STORE_METHODS
        ):
            return cls
    return None


def _source(ctx: Context, function: str) -> str:
    """A function's body: its source text, or, for an SQL-standard body (RETURN expression),
    which keeps no text, the body as PostgreSQL prints it."""
    # a signature names one function (to_regprocedure); a bare name, one without overloads
    return str(
        ctx.value(
            "SELECT coalesce(nullif(prosrc, ''), pg_get_function_sqlbody(oid))"
            " FROM pg_proc WHERE oid = CASE WHEN strpos(%s, '(') > 0"
            " THEN to_regprocedure(%s) ELSE to_regproc(%s) END",
            function,
            function,
            function,
        )
        or ""
    )


def _unwrapped(ctx: Context, names: tuple[str, ...]) -> list[str]:
    """The tenant-keyed doors among `names` (function names) that do not make the plain
    door's call."""
    return [
        f"{door} does not call {call}"
        for door, call in WRAPPERS.items()
        if door.split("(")[0] in names and call not in _source(ctx, door)
    ]


def _grantees(ctx: Context, signatures: tuple[str, ...]) -> set[str]:
    """Roles other than the owner that may EXECUTE any of these functions (PUBLIC as 'PUBLIC')."""
    rows = ctx.rows(
        "SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END "
        "FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a "
        "WHERE p.oid = ANY (%s::regprocedure[]) AND a.privilege_type = 'EXECUTE' "
        "AND a.grantee <> p.proowner",
        list(signatures),
    )
    return {r[0] for r in rows}


def _table_grants(ctx: Context, privileges: tuple[str, ...]) -> list[str]:
    rows = ctx.rows(
        "SELECT c.relname || ':' || a.privilege_type || ':' || "
        "CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, "
        "aclexplode(c.relacl) a "
        "WHERE n.nspname = 'fabric' AND c.relname = ANY (%s) AND a.grantee <> c.relowner "
        "AND (a.grantee = 0 OR a.grantee::regrole::text <> ALL (%s)) "
        "AND a.privilege_type = ANY (%s) ORDER BY 1",
        list(MEMORY_TABLES),
        list(INTERNAL_ROLES),
        list(privileges),
    )
    return [r[0] for r in rows]


def _disabled_triggers(ctx: Context, table: str, names: tuple[str, ...]) -> list[str]:
    rows = ctx.rows(
        "SELECT t.tgname FROM pg_trigger t WHERE t.tgrelid = to_regclass(%s) "
        "AND t.tgname = ANY (%s) AND t.tgenabled = 'O'",
        f"fabric.{table}",
        list(names),
    )
    return sorted(set(names) - {r[0] for r in rows})


# --- the items -------------------------------------------------------------------------


def store_methods(_ctx: Context) -> tuple[str, str]:
    module, why = _module(STORE_MODULE)
    if module is None:
        return FAIL, why
    cls = _store_class(module)
    if cls is None:
        return FAIL, f"{STORE_MODULE} has no store class with {', '.join(STORE_METHODS)}"
    # The store refuses a write before it reads anything, so a bare instance answers.
    store = cls.__new__(cls)
    namespace, key = ("tenant", "semantic", "tenant"), "check"
    attempts: dict[str, Callable[[], Any]] = {
        "put": lambda: store.put(namespace, key, {"check": True}),
        "delete": lambda: store.delete(namespace, key),
        "aput": lambda: asyncio.run(store.aput(namespace, key, {"check": True})),
        "adelete": lambda: asyncio.run(store.adelete(namespace, key)),
    }
    wrote = []
    for name, attempt in attempts.items():
        try:
            attempt()
            wrote.append(f"{name} succeeded")
        except PermissionError:
            continue  # GovernedWriteRefused names the governed path
        except Exception as exc:  # a refusal that is not the governed one
            wrote.append(f"{name} failed with {type(exc).__name__}")
    if wrote:
        return FAIL, f"{STORE_MODULE}.{cls.__name__}: {'; '.join(wrote)}"
    return PASS, (
        f"{STORE_MODULE}.{cls.__name__} has the five methods; put, delete, aput and adelete "
        "refuse with the governed path (propose, request_erasure)"
    )


def namespaces(_ctx: Context) -> tuple[str, str]:
    module, why = _module(STORE_MODULE)
    if module is None:
        return FAIL, why
    declared = tuple(getattr(module, "NAMESPACE", ()) or ())
    if declared != NAMESPACE:
        return FAIL, f"{STORE_MODULE}.NAMESPACE is {declared!r}, expected {NAMESPACE!r}"
    return PASS, f"{STORE_MODULE}.NAMESPACE = {declared!r}"


def scope_before_retrieval(ctx: Context) -> tuple[str, str]:
    problems = []
    if "resolve_recall_scope" not in _source(ctx, "fabric_api.recall(jsonb)"):
        problems.append("fabric_api.recall does not call fabric.resolve_recall_scope")
    problems += _unwrapped(ctx, ("fabric_api.recall",))
    readers = _table_grants(ctx, ("SELECT",))
    if readers:
        problems.append(f"roles read memory tables directly: {', '.join(readers)}")
    unforced = ctx.rows(
        "SELECT c.relname FROM pg_class c WHERE c.oid = ANY (%s::regclass[]) "
        "AND NOT (c.relrowsecurity AND c.relforcerowsecurity) ORDER BY 1",
        [f"fabric.{t}" for t in ("memory_records", "memory_embeddings", "proposals")],
    )
    if unforced:
        problems.append(f"row level security not forced on {', '.join(r[0] for r in unforced)}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, (
        "fabric_api.recall resolves scope (fabric.resolve_recall_scope) before retrieval; "
        "no role but the owner reads memory tables; row level security forced"
    )


def tools_from_active_set(ctx: Context) -> tuple[str, str]:
    problems = []
    # recall judges the three layers in the statement that reads the agent's profile, by the
    # one verdict fabric._tool_denial gives too (fabric._tool_layers_missing)
    if "_tool_layers_missing(" not in _source(ctx, "fabric_api.recall(jsonb)"):
        problems.append("fabric_api.recall does not check tool authorization")
    for fn in PROPOSING_FUNCTIONS:
        if "_propose_entry" not in _source(ctx, fn):
            problems.append(f"{fn} does not check tool authorization")
    problems += _unwrapped(
        ctx, ("fabric_api.recall", "fabric_api.propose", "fabric_api.propose_many")
    )
    if "_propose_denial" not in _source(ctx, "fabric._propose_entry"):
        problems.append("fabric._propose_entry does not check tool authorization")
    if "_tool_denial" not in _source(ctx, "fabric._propose_denial"):
        problems.append("fabric._propose_denial does not check tool authorization")
    if "_tool_layers_missing(" not in _source(ctx, "fabric._tool_denial"):
        problems.append("fabric._tool_denial does not judge by fabric._tool_layers_missing")
    if "active_tool_set" not in _source(ctx, "fabric._tool_layers_missing"):
        problems.append("fabric._tool_layers_missing does not read the run's active_tool_set")
    callers = _grantees(
        ctx,
        (
            "fabric_api.recall(jsonb)",
            "fabric_api.propose(jsonb, uuid)",
            "fabric_api.recall(text, jsonb)",
            "fabric_api.propose(text, jsonb, uuid)",
        ),
    )
    if callers - {"fabric_agent"}:
        problems.append(f"recall/propose executable by {', '.join(sorted(callers))}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, (
        "recall and propose pass three-layer authorization (agent, tenant, run active_tool_set); "
        "EXECUTE held by fabric_agent only"
    )


def commit_authority(ctx: Context) -> tuple[str, str]:
    problems = []
    signatures = tuple(
        r[0]
        for r in ctx.rows(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = 'fabric_api'::regnamespace AND p.proname = ANY (%s)",
            list(COMMIT_FUNCTIONS),
        )
    )
    callers = _grantees(ctx, signatures)
    if callers - {"fabric_committer"}:
        problems.append(f"commit functions executable by {', '.join(sorted(callers))}")
    writers = _table_grants(ctx, ("INSERT", "UPDATE", "DELETE", "TRUNCATE"))
    if writers:
        problems.append(f"roles write memory tables directly: {', '.join(writers)}")
    for fn in PROPOSING_FUNCTIONS:
        if "_propose_entry" not in _source(ctx, fn):
            problems.append(f"{fn} does not refuse committers")
    problems += _unwrapped(
        ctx, ("fabric_api.commit", "fabric_api.propose", "fabric_api.propose_many")
    )
    if "_enter_proposer" not in _source(ctx, "fabric._propose_entry"):
        problems.append("fabric._propose_entry does not refuse committers")
    if "fabric_committer" not in _source(ctx, "fabric._enter_proposer"):
        problems.append("fabric._enter_proposer does not refuse committers")
    if problems:
        return FAIL, "; ".join(problems)
    committers = ctx.rows(
        "SELECT a.agent_id FROM fabric.agents a JOIN pg_roles r ON r.rolname = a.login "
        "WHERE pg_has_role(r.oid, 'fabric_committer', 'MEMBER') ORDER BY 1"
    )
    return PASS, (
        f"{len(signatures)} commit functions executable by fabric_committer only; no direct "
        f"writes; committer agents: {', '.join(r[0] for r in committers) or 'none'}"
    )


def record_provenance(ctx: Context) -> tuple[str, str]:
    nullable = ctx.rows(
        "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = 'fabric.memory_records'::regclass "
        "AND a.attname = ANY (%s) AND NOT a.attnotnull ORDER BY 1",
        ["source_event_id", "valid_from", "content_hash", "formed_by"],
    )
    problems = []
    if nullable:
        problems.append(f"memory_records allows NULL {', '.join(r[0] for r in nullable)}")
    underived = ctx.value(
        "SELECT count(*) FROM fabric.memory_records m "
        "WHERE m.formation_method IN ('consolidation', 'reflection') AND NOT EXISTS ("
        "SELECT 1 FROM fabric.memory_lineage l "
        "WHERE l.tenant_id = m.tenant_id AND l.memory_id = m.memory_id)"
    )
    if underived:
        problems.append(f"{underived} consolidated/reflected records without derived_from")
    if problems:
        return FAIL, "; ".join(problems)
    records = ctx.value("SELECT count(*) FROM fabric.memory_records")
    return PASS, (
        f"source_event_id, valid_from, content_hash required; derived_from present on every "
        f"derived record ({records} records)"
    )


def transition_events(ctx: Context) -> tuple[str, str]:
    off = _disabled_triggers(
        ctx, "memory_records", ("_900_emit_formed", "_900_emit", "_800_history")
    )
    if off:
        return FAIL, f"memory_records triggers disabled: {', '.join(off)}"
    # The tier transitions first (records and their history, colocated on a Citus cluster),
    # materialized, then their events (the outbox: a table of the coordinator there, which
    # Citus joins to a distributed table only through such an intermediate result).
    silent = ctx.value(
        "WITH moved AS MATERIALIZED ("
        "  SELECT v.tenant_id, v.memory_id, nx.at, r.correlation_id "
        "  FROM fabric.memory_record_versions v "
        "  JOIN LATERAL (SELECT n.tier, lower(n.known_during) AS at "
        "    FROM fabric.memory_record_versions n WHERE n.tenant_id = v.tenant_id "
        "    AND n.memory_id = v.memory_id AND n.revision = v.revision + 1 "
        "    UNION ALL SELECT m.tier, m.known_since FROM fabric.memory_records m "
        "    WHERE m.tenant_id = v.tenant_id AND m.memory_id = v.memory_id "
        "    AND m.revision = v.revision + 1"
        "  ) nx ON nx.tier <> v.tier "
        "  JOIN fabric.memory_records r "
        "    ON r.tenant_id = v.tenant_id AND r.memory_id = v.memory_id) "
        "SELECT count(*) FROM moved v "
        "WHERE NOT EXISTS (SELECT 1 FROM fabric.events e WHERE e.memory_id = v.memory_id "
        "  AND e.tenant_id = v.tenant_id AND e.occurred_at = v.at "
        "  AND e.event_type IN ('memory.record.promoted', 'memory.record.demoted') "
        "  AND e.correlation_id IS NOT DISTINCT FROM v.correlation_id)"
    )
    if silent:
        return FAIL, f"{silent} tier transitions without their event and correlation id"
    transitions = ctx.value(
        "SELECT count(*) FROM fabric.events WHERE event_type = 'memory.record.promoted'"
    )
    return PASS, (
        f"memory_records emit trigger enabled; every tier transition has its event with the "
        f"record's correlation_id ({transitions} promotions)"
    )


def tombstones(ctx: Context) -> tuple[str, str]:
    problems = []
    off = _disabled_triggers(ctx, "memory_records", ("_300_no_delete", "_300_no_truncate"))
    if off:
        problems.append(f"memory_records triggers disabled: {', '.join(off)}")
    # One of the row rules of memory_records_row_rules (migration 0025).
    constraint = ctx.value(
        "SELECT c.convalidated AND position(%s IN p.prosrc) > 0 "
        "FROM pg_constraint c, pg_proc p "
        "WHERE c.conrelid = 'fabric.memory_records'::regclass "
        "AND c.conname = 'memory_records_row_rules' "
        "AND p.oid = 'fabric._memory_records_row_rules'::regproc",
        "THEN 'memory_records_tombstone_has_approval'",
    )
    if not constraint:
        problems.append("memory_records_tombstone_has_approval is missing or not validated")
    bad = ctx.value(
        "SELECT count(*) FROM fabric.memory_records m WHERE m.consolidation_state = 'tombstoned' "
        "AND (m.content IS NOT NULL OR m.content_hash IS NULL OR NOT EXISTS ("
        "SELECT 1 FROM fabric.erasure_receipts r "
        "WHERE r.tenant_id = m.tenant_id AND r.memory_id = m.memory_id))"
    )
    if bad:
        problems.append(f"{bad} tombstones with content, without hash or without receipt")
    if problems:
        return FAIL, "; ".join(problems)
    count = ctx.value(
        "SELECT count(*) FROM fabric.memory_records WHERE consolidation_state = 'tombstoned'"
    )
    return PASS, (
        f"records are never deleted (triggers on); {count} tombstones keep content_hash, "
        "lineage rows and a receipt"
    )


def recall_provenance(ctx: Context) -> tuple[str, str]:
    # the envelope is built by fabric._record_envelope, which fabric._record_json calls with
    # the lineage it reads (recall reads its winners' lineage itself)
    # (filter-only recall builds its top k by fabric._recall_envelope: the same fields with
    # score and retrieval, held equal by tests/sql/test_recall_audit_cost.py)
    for shaper in ("fabric._record_envelope", "fabric._recall_envelope"):
        shape = _source(ctx, shaper)
        missing = [k for k in ("'provenance'", "'validity_interval'") if k not in shape]
        if missing:
            return FAIL, f"{shaper} lacks {', '.join(missing)}"
    if "_record_envelope" not in _source(ctx, "fabric._record_json"):
        return FAIL, "fabric._record_json does not build its envelope by fabric._record_envelope"
    candidates = _source(ctx, "fabric._recall_candidates")
    if "_record_json" not in candidates and "_record_envelope" not in candidates:
        return FAIL, "recall candidates are not shaped by fabric._record_envelope"
    return (
        PASS,
        "every recalled record is shaped by fabric._record_envelope: provenance, validity_interval",
    )


def recall_spans(ctx: Context) -> tuple[str, str]:
    problems = []
    # LangGraph's langchain-core pulls the langsmith package in; what must hold is that
    # memfabric never uses it and nothing turns its tracing on.
    on = [v for v in LANGSMITH_SWITCHES if ctx.env.get(v, "").strip().lower() in ("1", "true")]
    if on:
        problems.append(f"LangSmith tracing is switched on ({', '.join(on)})")
    if any(r.startswith("langsmith") for r in (importlib.metadata.requires("memfabric") or [])):
        problems.append("memfabric declares a langsmith dependency")
    if not ctx.value("SELECT count(*) FROM fabric.projection_cursors WHERE projection = 'trace'"):
        problems.append("no trace cursor on the outbox")
    endpoint = ctx.env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or ctx.env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint:
        problems.append("no OTLP endpoint set (OTEL_EXPORTER_OTLP_ENDPOINT): spans go nowhere")
    if problems:
        return FAIL, "; ".join(problems)
    lag = ctx.value(
        "SELECT count(*) FROM fabric.events e, fabric.projection_cursors c "
        "WHERE c.projection = 'trace' AND e.event_type LIKE 'memory.recall.%%' "
        "AND (e.xid, e.event_id) > (c.last_xid, c.last_event_id)"
    )
    return (
        PASS,
        f"OTLP endpoint set; trace cursor present ({lag} recalls not exported yet); "
        "LangSmith neither declared nor switched on",
    )


def checkpoints(ctx: Context) -> tuple[str, str]:
    short = ctx.value(
        "SELECT count(*) FROM fabric.instance_config c WHERE c.checkpoint_retention <= "
        "greatest(c.approval_timeout, (SELECT max(v::interval) FROM jsonb_each_text("
        "c.approval_timeouts) AS t(k, v)))"
    )
    instances = ctx.value("SELECT count(*) FROM fabric.instance_config")
    module, why = _module(STORE_MODULE)
    if short:
        return FAIL, f"{short} of {instances} instances keep checkpoints shorter than an approval"
    if module is None:
        return FAIL, (
            f"no checkpointer binding ({why}); configured retention outlives approvals in "
            f"all {instances} instance(s)"
        )
    if not callable(getattr(module, "checkpointer", None)):
        return FAIL, f"{STORE_MODULE} has no checkpointer()"
    tables = ctx.value(
        "SELECT count(*) FROM pg_catalog.pg_class c WHERE c.relnamespace = "
        "'langgraph'::regnamespace AND c.relname IN ('checkpoints', 'checkpoint_blobs', "
        "'checkpoint_writes')"
    )
    if tables != 3:
        return FAIL, "the langgraph schema does not hold the checkpointer's three tables"
    if "_expire_checkpoints" not in _source(ctx, "fabric_api.run_decay"):
        return FAIL, "decay does not delete checkpoints past checkpoint_retention"
    return PASS, (
        f"checkpoints in schema langgraph; decay deletes threads past checkpoint_retention, "
        f"which outlives approvals in all {instances} instance(s); backup: pg_dump of the "
        "fabric and langgraph schemas (docs/langgraph.md)"
    )


def projection_drill(ctx: Context) -> tuple[str, str]:
    if ctx.drill is None:
        return FAIL, "no drill outcome: run `memfabric check --drill` (wipes and rebuilds)"
    try:
        outcome = ctx.drill()
    except Exception as exc:
        return FAIL, f"drill failed: {type(exc).__name__}: {exc}"
    if outcome.get("never_built"):
        return FAIL, f"projections never built: {', '.join(outcome['never_built'])}"
    if not outcome.get("identical"):
        return FAIL, "drill: answers differ after wipe and rebuild"
    stores = outcome.get("operational") or []
    return PASS, (
        f"drill identical after wipe and rebuild ({outcome.get('records')} records); "
        + (
            f"{len(stores)} operational store(s) rebuilt from their declared sources"
            if stores
            else "no operational stores are declared"
        )
    )


def graph_library(ctx: Context) -> tuple[str, str]:
    problems = []
    if ctx.env.get("MEMORY_API_KEY"):
        problems.append("MEMORY_API_KEY is set (the hosted service)")
    uri = Settings.from_env(ctx.env).graph_uri
    if not uri.startswith(("bolt://", "bolt+s://", "neo4j://", "neo4j+s://")):
        problems.append("the graph URI is not a Bolt URI")
    remote = ctx.value(
        "SELECT count(*) FROM fabric.instance_config c WHERE c.deployment_mode = 'air-gapped' "
        "AND ((c.model_uri IS NOT NULL AND NOT fabric._host_is_local(c.model_uri, c.local_hosts)) "
        "OR (c.embedding_uri IS NOT NULL "
        "AND NOT fabric._host_is_local(c.embedding_uri, c.local_hosts)))"
    )
    if remote:
        problems.append(f"{remote} air-gapped instances use a non-local model or embedder")
    if problems:
        return FAIL, "; ".join(problems)
    return DEVIATION, (
        f"NAMS is not bound: the projector writes the graph over Bolt itself "
        f"({NAMS_DEVIATION}); MEMORY_API_KEY unset; air-gapped instances local"
    )


def mcp_server(_ctx: Context) -> tuple[str, str]:
    module, why = _module(MCP_MODULE)
    if module is None:
        return FAIL, why
    tools = [str(t) for t in getattr(module, "TOOLS", ())]
    if not tools:
        return FAIL, f"{MCP_MODULE} declares no TOOLS to check against its tool policy"
    cypher = [t for t in tools if "cypher" in t.lower()]
    if cypher:
        return FAIL, f"{MCP_MODULE} exposes {', '.join(cypher)}"
    return PASS, f"{MCP_MODULE} exposes {', '.join(tools)}; no Cypher tool"


def audit_agent_unbound(ctx: Context) -> tuple[str, str]:
    problems = []
    for table in ("agents", "tenant_agent_tools", "runs"):
        off = ctx.rows(
            "SELECT t.tgname FROM pg_trigger t WHERE t.tgrelid = to_regclass(%s) "
            "AND NOT t.tgisinternal AND t.tgenabled = 'D' ORDER BY 1",
            f"fabric.{table}",
        )
        if off:
            problems.append(f"{table} triggers disabled: {', '.join(r[0] for r in off)}")
    bound = ctx.rows(
        "WITH audit AS (SELECT tool_id FROM fabric.tools WHERE agent_id = 'os-agt-008') "
        "SELECT 'agents:' || a.agent_id FROM fabric.agents a WHERE a.tools_allowed && "
        "  ARRAY(SELECT tool_id::text FROM audit) "
        "UNION ALL SELECT 'enabled:' || t.tenant_id || '/' || t.agent_id "
        "  FROM fabric.tenant_agent_tools t "
        "  WHERE t.tool_id IN (SELECT tool_id FROM audit) "
        "UNION ALL SELECT 'run:' || r.run_id FROM fabric.runs r WHERE r.active_tool_set && "
        "  ARRAY(SELECT tool_id::text FROM audit) "
        "UNION ALL SELECT 'os-agt-008 holds tools' FROM fabric.agents a "
        "  WHERE a.agent_id = 'os-agt-008' AND cardinality(a.tools_allowed) > 0 ORDER BY 1"
    )
    if bound:
        problems.append(f"audit tools bound: {', '.join(r[0] for r in bound)}")
    writers = ctx.rows(
        "SELECT r.rolname FROM pg_roles r WHERE pg_has_role(r.oid, 'fabric_auditor', 'MEMBER') "
        "AND r.rolcanlogin AND NOT r.rolsuper AND r.rolname <> 'fabric_migrator' "
        "AND pg_has_role(r.oid, 'fabric_committer', 'MEMBER') ORDER BY 1"
    )
    if writers:
        problems.append(f"auditor logins that can also commit: {', '.join(r[0] for r in writers)}")
    if problems:
        return FAIL, "; ".join(problems)
    tools = ctx.value("SELECT count(*) FROM fabric.tools WHERE agent_id = 'os-agt-008'")
    return PASS, (
        f"none of the {tools} os-agt-008 tools is allowed, enabled or active anywhere; "
        "no auditor login commits"
    )


def audit_trail_sealed(ctx: Context) -> tuple[str, str]:
    lag = ctx.value("SELECT fabric_api.sealing_lag()")
    unsealed, age = int(lag["unsealed"]), float(lag["oldest_unsealed_seconds"])
    evidence = f"{unsealed} events unsealed, the oldest {age:.0f}s old"
    if age > ctx.seal_max_age:
        return FAIL, (
            f"{evidence} (more than {ctx.seal_max_age:.0f}s): sealing has stopped or cannot keep "
            "up; is `memfabric serve` running, and what does its [seal] line say?"
        )
    return PASS, f"{evidence} (at most {ctx.seal_max_age:.0f}s allowed)"


def decided_deviations(ctx: Context) -> tuple[str, str]:
    """The decisions that stay deviations, each read from the deployment it is about."""
    promote_tenant = ctx.value(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'fabric_api' AND p.proname IN ('promote', 'demote') "
        "AND EXISTS (SELECT 1 FROM unnest(p.proargnames) a WHERE strpos(a, 'tenant') > 0)"
    )
    if promote_tenant:
        return FAIL, "a promotion or demotion names a tenant: a cross-tenant path exists"
    demote_rule = ctx.value(
        "SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = 'fabric.memory_records'::regclass "
        "AND t.tgname = '_510_tier_change' AND t.tgenabled <> 'D'"
    )
    if not demote_rule:
        return FAIL, "the tier-change trigger (_510_tier_change) is missing or disabled"
    return DEVIATION, (
        "demotion only to a tier held before; valid_at serves live records only; no "
        "cross-tenant promotion; consolidation scheduled by the worker (or the n8n "
        f"workflow); os-agt-012 is the scope-resolution path ({DECIDED_DEVIATIONS})"
    )


ITEMS: tuple[tuple[int, str, Check], ...] = (
    (1, "store-five-methods", store_methods),
    (2, "namespace-tenant-first", namespaces),
    (3, "scope-before-retrieval", scope_before_retrieval),
    (4, "tools-from-active-set", tools_from_active_set),
    (5, "commit-authority", commit_authority),
    (6, "record-provenance", record_provenance),
    (7, "transition-events", transition_events),
    (8, "tombstone-erasure", tombstones),
    (9, "recall-provenance", recall_provenance),
    (10, "recall-spans", recall_spans),
    (11, "checkpoint-retention", checkpoints),
    (12, "projection-rebuild-drill", projection_drill),
    (13, "graph-library", graph_library),
    (14, "mcp-server", mcp_server),
    (15, "audit-agent-unbound", audit_agent_unbound),
    (16, "audit-trail-sealed", audit_trail_sealed),
    (17, "decided-deviations", decided_deviations),
)


def run(
    conn: Conn,
    env: Mapping[str, str] | None = None,
    drill: Callable[[], Mapping[str, Any]] | None = None,
    seal_max_age: float = SEAL_MAX_AGE_SECONDS,
) -> list[Result]:
    """Every item, in order; a query that fails makes its item fail (the rest still run)."""
    ctx = Context(conn, os.environ if env is None else env, drill, seal_max_age)
    results = []
    for number, key, item in ITEMS:
        try:
            status, evidence = item(ctx)
        except psycopg.Error as exc:
            status, evidence = FAIL, f"could not check: {exc.sqlstate} {exc.diag.message_primary}"
        results.append(Result(number, key, status, evidence))
    return results
