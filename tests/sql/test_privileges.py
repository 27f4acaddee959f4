"""Privileges (R-API-1): a committed golden matrix of role x object x
privilege, diffed against the live database so that no grant widens silently.

Regenerate after an intended change, then review the diff of the file:
    MEMFABRIC_UPDATE_GOLDEN=1 .venv/bin/pytest tests/sql/test_privileges.py
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from conftest import Fabric

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "privileges.txt"
SCHEMAS = ("fabric", "fabric_api", "fabric_audit", "fabric_migrations", "langgraph")
ROLES = (
    "fabric_owner",
    "fabric_lookup",
    "fabric_retriever",
    "fabric_admin",
    "fabric_orchestrator",
    "fabric_agent",
    "fabric_committer",
    "fabric_consolidator",
    "fabric_policy",
    "fabric_auditor",
    "fabric_projector",
    "fabric_maintainer",
    "fabric_tracer",
    "fabric_checkpointer",
    "fabric_mcp_gateway",
    "fabric_workflow",
    "fabric_migrator",
    "mf_agent_a",
    "mf_committer",
    "mf_maintainer",
    "mf_tracer",
    "mf_service",
    "mf_stranger",
    "mf_workflow",
    "public",
)
AGENT_LOGINS = ("fabric_agent", "mf_agent_a", "mf_stranger")
TABLE_PRIVILEGES = (
    "SELECT",
    "INSERT",
    "UPDATE",
    "DELETE",
    "TRUNCATE",
    "REFERENCES",
    "TRIGGER",
    "MAINTAIN",
)
COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")
HEADER = [
    "# <role> <privilege> <object>: every privilege held in the fabric schemas.",
    "# Checked by tests/sql/test_privileges.py; after an intended change regenerate with",
    "# MEMFABRIC_UPDATE_GOLDEN=1 pytest tests/sql/test_privileges.py and review the diff.",
]

# One query per kind of object; %(roles)s and %(schemas)s are arrays. Run with
# search_path = pg_catalog so every object name is schema-qualified.
MATRIX_SQL = {
    "schema": """
        SELECT r, p, 'schema ' || n.nspname
        FROM unnest(%(roles)s::text[]) r, unnest(ARRAY['USAGE', 'CREATE']) p, pg_namespace n
        WHERE n.nspname = ANY (%(schemas)s) AND has_schema_privilege(r, n.oid, p)""",
    "table": """
        SELECT r, p, c.oid::regclass::text
        FROM unnest(%(roles)s::text[]) r, unnest(%(table_privs)s::text[]) p, pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY (%(schemas)s) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND has_table_privilege(r, c.oid, p)""",
    "column": """
        SELECT r, p, c.oid::regclass::text || '(' || a.attname || ')'
        FROM unnest(%(roles)s::text[]) r, unnest(%(column_privs)s::text[]) p, pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE n.nspname = ANY (%(schemas)s) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND has_any_column_privilege(r, c.oid, p)
          AND NOT has_table_privilege(r, c.oid, p)
          AND has_column_privilege(r, c.oid, a.attnum, p)""",
    "sequence": """
        SELECT r, p, c.oid::regclass::text
        FROM unnest(%(roles)s::text[]) r, unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) p, pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY (%(schemas)s) AND c.relkind = 'S'
          AND has_sequence_privilege(r, c.oid, p)""",
    "function": """
        SELECT r, 'EXECUTE', f.oid::regprocedure::text
        FROM unnest(%(roles)s::text[]) r, pg_proc f
        JOIN pg_namespace n ON n.oid = f.pronamespace
        WHERE n.nspname = ANY (%(schemas)s) AND has_function_privilege(r, f.oid, 'EXECUTE')""",
}


def normalise(name: str) -> str:
    """Monthly event and measurement partitions are one object each for the matrix."""
    return re.sub(r"\bfabric\.(events|measurements)_\d{4}_\d{2}\b", r"fabric.\1_YYYY_MM", name)


def live_matrix(fabric: Fabric) -> dict[str, set[tuple[str, str, str]]]:
    """kind -> {(role, privilege, object)}."""
    params: dict[str, Any] = {
        "roles": list(ROLES),
        "schemas": list(SCHEMAS),
        "table_privs": list(TABLE_PRIVILEGES),
        "column_privs": list(COLUMN_PRIVILEGES),
    }
    with psycopg.connect(fabric.url, autocommit=True) as c:
        c.execute("SET search_path = pg_catalog")
        return {
            kind: {(r, p, normalise(o)) for r, p, o in c.execute(query, params)}  # type: ignore[arg-type]
            for kind, query in MATRIX_SQL.items()
        }


def lines(matrix: dict[str, set[tuple[str, str, str]]]) -> list[str]:
    return sorted({f"{r} {p} {o}" for rows in matrix.values() for r, p, o in rows})


def test_privileges_match_the_golden_matrix(fabric: Fabric) -> None:
    live = lines(live_matrix(fabric))
    if os.environ.get("MEMFABRIC_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text("\n".join([*HEADER, *live]) + "\n")
    golden = [ln for ln in GOLDEN.read_text().splitlines() if ln and not ln.startswith("#")]
    diff = "\n".join(
        difflib.unified_diff(
            golden, live, "tests/golden/privileges.txt", "live database", lineterm=""
        )
    )
    assert live == golden, (
        "privileges changed; if intended, regenerate with MEMFABRIC_UPDATE_GOLDEN=1 and review:\n"
        + diff
    )


def test_the_matrix_sees_the_grants_it_must_see(fabric: Fabric) -> None:
    """Guards the generator: if these vanish, the golden diff would be vacuous."""
    live = set(lines(live_matrix(fabric)))
    assert {
        "fabric_agent EXECUTE fabric_api.propose(jsonb,uuid)",
        "mf_agent_a EXECUTE fabric_api.propose(jsonb,uuid)",
        "mf_committer EXECUTE fabric_api.commit(uuid)",
        "fabric_lookup SELECT fabric.runs(run_id)",
        "fabric_owner SELECT fabric.events_YYYY_MM",
        "fabric_agent USAGE schema fabric_api",
    } <= live


def test_agent_logins_hold_no_table_privileges(fabric: Fabric) -> None:
    matrix = live_matrix(fabric)
    held = sorted(
        (r, p, o)
        for kind in ("table", "column", "sequence")
        for r, p, o in matrix[kind]
        if r in AGENT_LOGINS
    )
    assert held == []
    schemas = sorted((r, p, o) for r, p, o in matrix["schema"] if r in AGENT_LOGINS)
    assert schemas == [
        ("fabric_agent", "USAGE", "schema fabric_api"),
        ("mf_agent_a", "USAGE", "schema fabric_api"),
    ]


def test_no_fabric_api_function_is_executable_by_public(fabric: Fabric) -> None:
    with fabric.su() as c:
        rows = c.execute(
            "SELECT count(*), count(*) FILTER (WHERE has_function_privilege('public', p.oid,"
            " 'EXECUTE')) FROM pg_proc p WHERE p.pronamespace = 'fabric_api'::regnamespace"
        ).fetchone()
    assert rows is not None
    total, public = rows
    assert total > 0
    assert public == 0


def test_no_fabric_table_is_reachable_by_public(fabric: Fabric) -> None:
    matrix = live_matrix(fabric)
    assert sorted(row for rows in matrix.values() for row in rows if row[0] == "public") == []


def search_paths(fabric: Fabric, where: str) -> list[tuple[str, list[str] | None]]:
    query = (
        "SELECT p.oid::regprocedure::text, p.proconfig FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname IN ('fabric', 'fabric_api', 'fabric_audit') AND "
    )
    with fabric.su() as c:
        c.execute("SET search_path = pg_catalog")
        return c.execute(query + where + " ORDER BY 1").fetchall()  # type: ignore[return-value]


def pins(config: list[str] | None) -> bool:
    """search_path=pg_catalog first and pg_temp explicitly last (else temp objects win)."""
    paths = [c.removeprefix("search_path=") for c in config or [] if c.startswith("search_path=")]
    if len(paths) != 1:
        return False
    parts = [p.strip() for p in paths[0].split(",")]
    return parts[0] == "pg_catalog" and parts[-1] == "pg_temp"


def test_security_definer_functions_pin_search_path(fabric: Fabric) -> None:
    functions = search_paths(fabric, "p.prosecdef")
    assert len(functions) >= 10
    assert [name for name, config in functions if not pins(config)] == []


def test_every_fabric_function_pins_search_path(fabric: Fabric) -> None:
    """Every function, not only the definers (triggers run as any writer), but for the SQL
    functions with an SQL-standard body (RETURN expression), which resolve no name when they run:
    theirs were bound when they were created (below)."""
    functions = search_paths(fabric, "p.prokind = 'f' AND p.prosqlbody IS NULL")
    assert [name for name, config in functions if not pins(config)] == []


# The SQL functions with an SQL-standard body: without a SET clause the planner inlines them into
# the expression that calls them (docs/benchmarks.md, "Governed recall: fewer layers").
INLINED = [
    "fabric._event_id()",
    "fabric._formed_event_type(text,text,text)",
    "fabric._formed_payload(text,text,text,text,text,text)",
    "fabric._pseudonym(bytea,text,text)",
    "fabric._recall_request_is_common(jsonb)",
    "fabric._run_is_live(fabric.runs)",
    "fabric._tool_layers_missing(boolean,boolean,fabric.runs,text)",
]


def test_functions_without_search_path_bind_their_names_when_created(fabric: Fabric) -> None:
    """A function without SET search_path is one whose body was parsed, and its names bound
    to the objects they named, when it was created: one search_path the caller sets cannot
    redirect a call or an operator in it. Those are exactly the inlined helpers; none is a
    definer."""
    with fabric.su() as c:
        c.execute("SET search_path = pg_catalog")
        rows = c.execute(
            "SELECT p.oid::regprocedure::text, p.prosqlbody IS NOT NULL, p.prosecdef,"
            " l.lanname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " JOIN pg_language l ON l.oid = p.prolang"
            " WHERE n.nspname IN ('fabric', 'fabric_api', 'fabric_audit')"
            "   AND p.prokind = 'f' AND p.proconfig IS NULL ORDER BY 1"
        ).fetchall()
    assert [r[0] for r in rows] == INLINED
    assert all(bound and not definer and lang == "sql" for _, bound, definer, lang in rows)


def test_the_inlined_helpers_are_inlined(fabric: Fabric) -> None:
    """The planner puts their bodies in the calling expression: no call of them is left."""
    calls = {
        "fabric.runs r": "fabric._run_is_live(r),"
        " fabric._tool_layers_missing(true, false, r, 'tool:memory-recall'),"
        " fabric._pseudonym('\\x00'::bytea, 'session', r.session_id::text),"
        " fabric._recall_request_is_common(pg_catalog.jsonb_build_object('run_id', r.run_id)),"
        " fabric._event_id()",
        "fabric.memory_records n": "fabric._formed_event_type(n.tier, n.consolidation_state,"
        " n.formation_method), fabric._formed_payload(n.tier, n.visibility,"
        " n.consolidation_state, n.formation_method, n.content_hash, n.retention_class)",
    }
    with fabric.su() as c:
        c.execute("SET search_path = pg_catalog")
        for source, expressions in calls.items():
            plan = c.execute(
                sql.SQL("EXPLAIN (VERBOSE, FORMAT JSON) SELECT {} FROM {}").format(
                    sql.SQL(expressions),
                    sql.SQL(source),  # the test's own constants
                )
            ).fetchone()
            assert plan is not None
            assert "fabric._" not in str(plan[0]), plan[0]


def test_every_api_function_documents_an_example(fabric: Fabric) -> None:
    with fabric.su() as c:
        c.execute("SET search_path = pg_catalog")
        rows = c.execute(
            "SELECT p.oid::regprocedure::text, obj_description(p.oid, 'pg_proc') FROM pg_proc p"
            " WHERE p.pronamespace = 'fabric_api'::regnamespace ORDER BY 1"
        ).fetchall()
    assert rows
    assert [name for name, comment in rows if "Example" not in (comment or "")] == []
