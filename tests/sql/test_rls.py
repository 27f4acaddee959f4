"""Tenancy (R-TENANT-1, R-TENANT-2): FORCE ROW LEVEL SECURITY keyed only on the
transaction setting fabric.tenant_id, so even the owner sees nothing without it and only
its tenant with it; agent logins hold no table privileges at all; only the narrow roles
bypass RLS.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback

RLS_TABLES = [
    "tenant_agents",
    "tenant_agent_tools",
    "runs",
    "proposals",
    "memory_records",
    "memory_lineage",
    "memory_record_versions",
    "mcp_tokens",
]
# One new row of tenant globex per table, written while the setting is acme. Lineage is
# left out: its formation trigger (MF001) refuses any row whose record is not visible, so
# the policy is never the first thing to answer (test_immutability covers that trigger).
FOREIGN_ROWS = {
    "tenant_agents": "INSERT INTO fabric.tenant_agents (tenant_id, agent_id)"
    " VALUES ('globex', 'com-agt-003')",
    "tenant_agent_tools": "INSERT INTO fabric.tenant_agent_tools (tenant_id, agent_id, tool_id)"
    " VALUES ('globex', 'com-agt-003', 'tool:memory-recall')",
    "runs": "INSERT INTO fabric.runs (tenant_id, agent_id, active_tool_set, expires_at)"
    " VALUES ('globex', 'glx-agt-001', '{}', now() + interval '1 hour')",
    "proposals": "INSERT INTO fabric.proposals (tenant_id, run_id, proposed_by, status, reason,"
    " tier, visibility, formation_method, confidence, valid_from, retention_class, version)"
    " VALUES ('globex', gen_random_uuid(), 'glx-agt-001', 'rejected', 'forged', 'episodic',"
    " 'tenant', 'extraction', 0.5, now(), 'durable', '1.0.0')",
    "memory_records": "INSERT INTO fabric.memory_records (tenant_id, tier, visibility, content,"
    " content_hash, source_event_id, formed_by, formation_method, confidence, valid_from,"
    " retention_class) VALUES ('globex', 'episodic', 'tenant', '{\"text\": \"forged\"}', NULL,"
    " 'evt-1', 'os-agt-010', 'extraction', 0.5, now(), 'durable')",
    "memory_record_versions": "INSERT INTO fabric.memory_record_versions (tenant_id, memory_id,"
    " revision, tier, consolidation_state, known_during, ended_by) VALUES ('globex',"
    " gen_random_uuid(), 1, 'episodic', 'raw', tstzrange(now() - interval '1 hour', now()),"
    " 'os-agt-010')",
    "mcp_tokens": "INSERT INTO fabric.mcp_tokens (tenant_id, token_hash, run_id, agent_id,"
    " expires_at) SELECT 'globex', sha256('forged'), run_id, agent_id, now() + interval '1 hour'"
    " FROM fabric.runs LIMIT 1",
}


# --- helpers ----------------------------------------------------------------------------


def populate(fabric: Fabric) -> None:
    """Rows of both tenants in every RLS table: runs, proposals, an episode, a semantic
    record derived from it (lineage) and one transition (history)."""
    for tenant, agent, login in (
        ("acme", "com-agt-003", "mf_agent_a"),
        ("globex", "glx-agt-001", "mf_agent_g"),
    ):
        run = fabric.open_run(agent_id=agent, tenant=tenant)
        fabric.session("mf_orchestrator").execute("SELECT fabric_api.issue_mcp_token(%s)", (run,))
        scope = {"tenant_id": tenant, "visibility": "subject"}
        source = fabric.form(run, f"{tenant} episode", login, scope=scope)
        fabric.form(
            run,
            f"{tenant} fact",
            login,
            scope=scope,
            tier="semantic",
            derived_from=[source],
        )
        fabric.owner(tenant).execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'consolidated'"
            " WHERE memory_id = %s",
            (source,),
        )
    for table in RLS_TABLES:
        for tenant in ("acme", "globex"):
            assert fabric.count(table, f"tenant_id = '{tenant}'") > 0, (table, tenant)


def owner_count(conn: psycopg.Connection[Any], table: str, where: str = "true") -> int:
    q = sql.SQL("SELECT count(*) FROM fabric.{} WHERE ").format(sql.Identifier(table))
    row = conn.execute(q + sql.SQL(where)).fetchone()  # type: ignore[operator]
    assert row is not None
    return int(row[0])


# --- the owner under FORCE RLS ----------------------------------------------------------------


@pytest.mark.parametrize("table", RLS_TABLES)
@pytest.mark.clone
def test_no_tenant_setting_shows_no_rows(fabric: Fabric, table: str) -> None:
    populate(fabric)
    conn = fabric.owner(None)
    assert owner_count(conn, table) == 0
    conn.execute("SELECT set_config('fabric.tenant_id', '', false)")
    assert owner_count(conn, table) == 0


@pytest.mark.parametrize("table", RLS_TABLES)
def test_the_tenant_setting_shows_only_that_tenant(fabric: Fabric, table: str) -> None:
    populate(fabric)
    conn = fabric.owner("acme")
    assert owner_count(conn, table) == fabric.count(table, "tenant_id = 'acme'")
    assert owner_count(conn, table, "tenant_id <> 'acme'") == 0


@pytest.mark.parametrize("table", list(FOREIGN_ROWS))
@pytest.mark.clone
def test_the_owner_cannot_write_into_another_tenant(fabric: Fabric, table: str) -> None:
    populate(fabric)
    counts = fabric.counts()
    tenant_rows = fabric.count(table)
    with pytest.raises(psycopg.Error) as info:
        fabric.owner("acme").execute(FOREIGN_ROWS[table])
    assert info.value.sqlstate == "42501", info.value
    assert fabric.count(table) == tenant_rows
    assert fabric.counts() == counts


@pytest.mark.parametrize("table", ["runs", "proposals", "tenant_agents"])
def test_the_owner_cannot_move_a_row_into_another_tenant(fabric: Fabric, table: str) -> None:
    populate(fabric)
    before = fabric.count(table, "tenant_id = 'acme'")
    with pytest.raises(psycopg.Error) as info:
        fabric.owner("acme").execute(
            sql.SQL("UPDATE fabric.{} SET tenant_id = 'globex'").format(sql.Identifier(table))
        )
    assert info.value.sqlstate == "42501", info.value
    assert fabric.count(table, "tenant_id = 'acme'") == before


def test_every_tenant_table_forces_rls(fabric: Fabric) -> None:
    """Any table keyed by tenant_id gets FORCE RLS, except the tenants themselves and the
    content-free outbox and its seals (protected by grants, R-API-1)."""
    with fabric.su() as c:
        rows = c.execute(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,"
            "       (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid)"
            " FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid"
            " WHERE c.relnamespace = 'fabric'::regnamespace AND c.relkind IN ('r', 'p')"
            "   AND NOT c.relispartition AND a.attname = 'tenant_id' AND a.attnum = 1"
            "   AND c.relname NOT IN ('tenants', 'events', 'event_seals') ORDER BY 1"
        ).fetchall()
    assert set(RLS_TABLES) <= {r[0] for r in rows}
    assert [r[0] for r in rows if not (r[1] and r[2] and r[3] > 0)] == []


# --- agent logins: no table privileges, whatever they set -------------------------------------


@pytest.mark.clone
def test_an_agent_login_can_read_no_table_even_naming_a_tenant(fabric: Fabric) -> None:
    populate(fabric)
    with fabric.su() as c:
        tables = [
            r[0]
            for r in c.execute(
                "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname IN ('fabric', 'fabric_audit')"
                " AND c.relkind IN ('r', 'p', 'v', 'm') ORDER BY 1"
            )
        ]
        member = c.execute("SELECT pg_has_role('mf_agent_a', 'fabric_agent', 'MEMBER')").fetchone()
    assert member == (True,)
    assert set(RLS_TABLES) <= {t.removeprefix("fabric.") for t in tables}
    conn = fabric.connect("mf_agent_a")
    conn.execute("SET fabric.tenant_id = 'globex'")
    outcomes = {}
    for table in tables:
        for statement in ("SELECT * FROM {} LIMIT 1", "DELETE FROM {}"):
            try:
                conn.execute(statement.format(table))
                outcomes[(table, statement)] = "allowed"
            except psycopg.Error as exc:
                outcomes[(table, statement)] = exc.sqlstate or "?"
    assert set(outcomes.values()) == {"42501"}, {k: v for k, v in outcomes.items() if v != "42501"}


def test_an_agent_can_never_use_a_run_of_another_tenant(fabric: Fabric) -> None:
    populate(fabric)
    # A globex run of a globex agent, and one of an agent enabled in both tenants.
    runs = [
        fabric.open_run(agent_id="glx-agt-001", tenant="globex"),
        fabric.open_run(agent_id="com-agt-004", tenant="globex"),
    ]
    counts = fabric.counts()
    for run in runs:
        for scope_tenant in ("globex", "acme"):
            envelope = episode(scope={"tenant_id": scope_tenant, "visibility": "subject"})
            with pytest.raises(psycopg.Error) as info:
                fabric.propose("mf_agent_a", envelope, run)
            assert info.value.sqlstate == "42501", info.value
    assert fabric.counts() == counts


def test_an_agent_cannot_name_another_tenant_inside_its_own_run(fabric: Fabric) -> None:
    run = fabric.open_run()
    counts = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        fabric.propose(
            "mf_agent_a", episode(scope={"tenant_id": "globex", "visibility": "subject"}), run
        )
    assert info.value.sqlstate == "42501", info.value
    assert fabric.counts() == counts


def test_a_run_is_opened_only_in_a_tenant_that_enabled_the_agent(fabric: Fabric) -> None:
    counts = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        fabric.open_run(agent_id="com-agt-003", tenant="globex")
    assert info.value.sqlstate == "42501", info.value
    assert fabric.counts() == counts


# --- who bypasses RLS, who owns what -------------------------------------------------------------


def test_only_the_narrow_roles_bypass_rls(fabric: Fabric) -> None:
    with fabric.su() as c:
        roles = {
            r[0]
            for r in c.execute("SELECT rolname FROM pg_roles WHERE rolbypassrls AND NOT rolsuper")
        }
    # R-TENANT-2: the migration role and fabric_lookup, and the dedicated retrieval
    # owner for non-leakproof full-text search (migration 0003).
    assert roles == {"fabric_migrator", "fabric_lookup", "fabric_retriever"}


def test_the_owner_is_neither_superuser_nor_bypassrls(fabric: Fabric) -> None:
    with fabric.su() as c:
        row = c.execute(
            "SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles"
            " WHERE rolname = 'fabric_owner'"
        ).fetchone()
        owners = {
            r[0]
            for r in c.execute(
                "SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname IN ('fabric', 'fabric_api',"
                " 'fabric_audit')"
            )
        }
    assert row == (False, False, False)
    assert owners == {"fabric_owner"}


def owned_by(fabric: Fabric, role: str) -> dict[str, set[str]]:
    with fabric.su() as c:
        c.execute("SET search_path = pg_catalog")
        return {
            kind: {r[0] for r in c.execute(query, (role,))}
            for kind, query in {
                "functions": "SELECT oid::regprocedure::text FROM pg_proc"
                " WHERE proowner = to_regrole(%s)",
                "relations": "SELECT oid::regclass::text FROM pg_class"
                " WHERE relowner = to_regrole(%s)",
                "types": "SELECT oid::regtype::text FROM pg_type WHERE typowner = to_regrole(%s)",
                "schemas": "SELECT nspname FROM pg_namespace WHERE nspowner = to_regrole(%s)",
            }.items()
        }


@pytest.mark.clone
def test_the_lookup_role_owns_only_the_lookup_functions(fabric: Fabric) -> None:
    owned = owned_by(fabric, "fabric_lookup")
    assert (owned["relations"], owned["types"], owned["schemas"]) == (set(), set(), set())
    assert {
        "fabric._tenant_of_run(uuid)",
        "fabric._tenant_of_proposal(uuid)",
        "fabric._tenant_of_record(uuid)",
        "fabric._tenants_with_validated_proposals()",
    } <= owned["functions"]
    assert {f.split("(")[0].split(".")[0] for f in owned["functions"]} == {"fabric"}


def test_the_lookup_functions_are_narrow_and_only_the_owner_calls_them(fabric: Fabric) -> None:
    """Each returns a key (or a yes/no), never a row, and only fabric_owner executes it."""
    with fabric.su() as c:
        rows = c.execute(
            "SELECT p.oid::regprocedure::text, p.prosecdef, p.prorettype::regtype::text,"
            "       (SELECT array_agg(DISTINCT CASE a.grantee WHEN 0 THEN 'PUBLIC'"
            "               ELSE pg_get_userbyid(a.grantee) END)"
            "          FROM aclexplode(p.proacl) a WHERE a.privilege_type = 'EXECUTE')"
            " FROM pg_proc p WHERE p.proowner = 'fabric_lookup'::regrole ORDER BY 1"
        ).fetchall()
    assert rows
    for name, secdef, rettype, executors in rows:
        assert secdef, name
        assert rettype in {"text", "boolean"}, name
        assert set(executors) <= {"fabric_owner", "fabric_lookup"}, (name, executors)


@pytest.mark.clone
def test_the_retriever_role_owns_only_functions(fabric: Fabric) -> None:
    owned = owned_by(fabric, "fabric_retriever")
    assert owned["functions"]
    assert (owned["relations"], owned["types"], owned["schemas"]) == (set(), set(), set())


# --- the standard policies, exactly ------------------------------------------------------------

# The commands whose rows each tenant table admits (rls/<table>.sql through
# fabric._tenant_policies). Every command gets one policy <command>_same_tenant, keyed only on
# the tenant setting: SELECT and DELETE filter rows (USING), INSERT checks new rows (WITH
# CHECK), UPDATE does both.
TENANT_POLICIES = {
    "agent_lineage_links": ("select", "insert"),
    "approvals": ("select", "insert", "update"),
    "consolidation_outcomes": ("select", "insert"),
    "contradiction_flags": ("select", "insert", "update"),
    "entities": ("select", "insert", "update", "delete"),
    "erasure_receipts": ("select", "insert", "update"),
    "instance_config": ("select", "insert", "update", "delete"),
    "mcp_tokens": ("select", "insert", "update"),
    "memory_corroborations": ("select", "insert"),
    "agent_tokens": ("select", "insert", "update"),
    "measurements": ("select", "insert", "delete"),
    "memory_embeddings": ("select", "insert", "update", "delete"),
    "memory_lineage": ("select", "insert", "update"),
    "memory_mentions": ("select", "insert", "delete"),
    "memory_record_versions": ("select", "insert", "update"),
    "memory_records": ("select", "insert", "update"),
    "proposals": ("select", "insert", "update"),
    "reasoning_steps": ("select", "insert"),
    "recommendations": ("select", "insert", "update"),
    "review_flags": ("select", "insert", "update"),
    "runs": ("select", "insert", "update"),
    "search_stats": ("select", "insert", "delete"),
    "shard_events": ("select", "insert", "delete"),
    "step_touches": ("select", "insert"),
    "subject_keys": ("select", "insert", "delete"),
    "temporal_summaries": ("select", "insert", "update"),
    "tenant_agent_tools": ("select", "insert", "update", "delete"),
    "tenant_agents": ("select", "insert", "update"),
}
POLICIES = (
    "SELECT tablename, policyname, cmd, permissive, roles::text[], qual, with_check"
    " FROM pg_policies WHERE schemaname = 'fabric' ORDER BY 1, 2"
)
# tenant_id is the domain fabric.tenant_ident in most tables (deparsed with its cast to text)
# and plain text in a few.
TENANT_COLUMN_IS_TEXT = (
    "SELECT c.relname, a.atttypid = 'text'::regtype FROM pg_class c"
    " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id'"
    " WHERE c.relnamespace = 'fabric'::regnamespace"
)


def expected_policy(table: str, command: str, text_column: bool) -> tuple[Any, ...]:
    column = "tenant_id" if text_column else "(tenant_id)::text"
    same_tenant = f"({column} = current_setting('fabric.tenant_id'::text, true))"
    using = same_tenant if command in ("select", "update", "delete") else None
    check = same_tenant if command in ("insert", "update") else None
    name = f"{command}_same_tenant"
    return (table, name, command.upper(), "PERMISSIVE", ["public"], using, check)


def test_every_tenant_table_has_exactly_the_standard_policies(fabric: Fabric) -> None:
    with fabric.su() as c:
        text_column = dict(c.execute(TENANT_COLUMN_IS_TEXT).fetchall())
        policies = [tuple(r) for r in c.execute(POLICIES)]
        forced = c.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'fabric'::regnamespace"
            " AND relrowsecurity AND relforcerowsecurity ORDER BY 1"
        ).fetchall()
    assert policies == sorted(
        expected_policy(table, command, text_column[table])
        for table, commands in TENANT_POLICIES.items()
        for command in commands
    )
    assert [r[0] for r in forced] == sorted(TENANT_POLICIES)


def test_the_policy_helper_refuses_an_unknown_command_and_changes_nothing(
    fabric: Fabric,
) -> None:
    with fabric.su() as c:
        before = c.execute(POLICIES).fetchall()
        for commands in ("{select,truncate}", "{select,NULL}", None):
            with pytest.raises(psycopg.Error) as info:
                c.execute("CALL fabric._tenant_policies('fabric.runs', %s::text[])", (commands,))
            assert info.value.sqlstate == "22023", info.value
            c.rollback()
        assert c.execute(POLICIES).fetchall() == before


def test_the_policy_helper_is_the_migration_roles_alone(fabric: Fabric) -> None:
    for login in ("mf_agent_a", "mf_orchestrator"):
        with pytest.raises(psycopg.Error) as info:
            fabric.connect(login).execute(
                "CALL fabric._tenant_policies('fabric.runs', ARRAY['select'])"
            )
        assert info.value.sqlstate == "42501", info.value


def test_the_policy_helper_states_the_whole_set(fabric: Fabric) -> None:
    """A command left out of the list loses its standard policy: each rls/ file is the whole
    set, so deleting a command from a file revokes it at the next migrate."""
    with fabric.su() as c:
        c.execute("CALL fabric._tenant_policies('fabric.runs', ARRAY['select', 'delete'])")
        rows = c.execute(
            "SELECT policyname FROM pg_policies WHERE schemaname = 'fabric'"
            " AND tablename = 'runs' ORDER BY 1"
        ).fetchall()
    assert [r[0] for r in rows] == ["delete_same_tenant", "select_same_tenant"]
