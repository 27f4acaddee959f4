"""The DDL guard (sql/270_ddl_guard.sql) holds for every class of command that can change the
fabric, for a login that was (wrongly) granted fabric_owner: GRANT and REVOKE, ALTER DEFAULT
PRIVILEGES, policies, rules and triggers on the fabric's tables (objects whose schema column
is empty in what an event trigger is told), a table made a child of a fabric table, a fabric
table moved out of its schema, a publication of a fabric table. Each is tried both with the
owner's privileges inherited and after SET ROLE fabric_owner, and each leaves the catalog as
it was. The migration role, superusers and other schemas are left alone."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric

MIGRATOR = "fabric_migrator"


@dataclass(frozen=True)
class Case:
    """A command refused to the leaked owner; `probe` reads (as the superuser) what it would
    change, `setup` runs before as the superuser. `{login}` names the leaked login."""

    statement: str
    probe: str
    setup: tuple[str, ...] = ()


POLICIES = (
    "SELECT array_agg(polname || ':' || polcmd::text || ':'"
    " || coalesce(pg_get_expr(polqual, polrelid), '') || ':'"
    " || coalesce(obj_description(oid, 'pg_policy'), '') ORDER BY polname)"
    " FROM pg_policy WHERE polrelid = 'fabric.memory_records'::regclass"
)
RULES = (
    "SELECT array_agg(ev_class::regclass::text || ':' || rulename || ':' || ev_enabled::text"
    " ORDER BY 1) FROM pg_rewrite"
    " WHERE ev_class IN ('fabric.events'::regclass, 'fabric.tenants'::regclass)"
)
TRIGGERS = (
    "SELECT array_agg(tgrelid::regclass::text || ':' || tgname || ':' || tgenabled::text || ':'"
    " || coalesce(obj_description(oid, 'pg_trigger'), '') ORDER BY 1) FROM pg_trigger"
    " WHERE tgrelid IN ('fabric.events'::regclass, 'langgraph.checkpoints'::regclass)"
)
DEFAULT_ACLS = (
    "SELECT array_agg(defaclrole::regrole::text || ':' || defaclnamespace::regnamespace::text"
    " || ':' || defaclobjtype::text || ':' || defaclacl::text ORDER BY 1) FROM pg_default_acl"
)
SCRATCH = (
    "CREATE SCHEMA scratch AUTHORIZATION {login}",
    "GRANT CREATE ON SCHEMA scratch TO fabric_owner",
)

CASES: dict[str, Case] = {
    # GRANT and REVOKE: the event trigger learns the kind of object, never which objects
    "grant select on a table": Case(
        "GRANT SELECT ON fabric.memory_records TO mf_agent_a",
        "SELECT has_table_privilege('mf_agent_a', 'fabric.memory_records', 'SELECT')",
    ),
    "grant select on a column": Case(
        "GRANT SELECT (content) ON fabric.memory_records TO mf_agent_a",
        "SELECT has_column_privilege('mf_agent_a', 'fabric.memory_records', 'content', 'SELECT')",
    ),
    "grant on all tables of a schema": Case(
        "GRANT ALL ON ALL TABLES IN SCHEMA fabric TO mf_stranger",
        "SELECT count(*) FROM pg_class WHERE relnamespace = 'fabric'::regnamespace"
        " AND relkind IN ('r', 'p') AND has_table_privilege('mf_stranger', oid, 'SELECT')",
    ),
    "grant execute on the private helpers": Case(
        "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fabric TO mf_agent_a",
        "SELECT count(*) FROM pg_proc WHERE pronamespace = 'fabric'::regnamespace"
        " AND has_function_privilege('mf_agent_a', oid, 'EXECUTE')",
    ),
    "grant usage on a schema": Case(
        "GRANT USAGE ON SCHEMA fabric TO mf_stranger",
        "SELECT has_schema_privilege('mf_stranger', 'fabric', 'USAGE')",
    ),
    "revoke execute from a group": Case(
        "REVOKE EXECUTE ON FUNCTION fabric_api.recall(jsonb) FROM fabric_agent",
        "SELECT has_function_privilege('fabric_agent', 'fabric_api.recall(jsonb)', 'EXECUTE')",
    ),
    "revoke a table privilege": Case(
        "REVOKE SELECT ON langgraph.checkpoints FROM fabric_checkpointer",
        "SELECT has_table_privilege('fabric_checkpointer', 'langgraph.checkpoints', 'SELECT')",
    ),
    "alter default privileges for the owner": Case(
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_owner GRANT SELECT ON TABLES TO mf_agent_a",
        DEFAULT_ACLS,
    ),
    "alter default privileges in a fabric schema": Case(
        "ALTER DEFAULT PRIVILEGES IN SCHEMA fabric GRANT SELECT ON TABLES TO mf_agent_a",
        DEFAULT_ACLS,
    ),
    # policies, rules and triggers: no schema of their own, their table's
    "create policy": Case(
        "CREATE POLICY everything ON fabric.memory_records USING (true)",
        POLICIES,
    ),
    "alter policy": Case(
        "ALTER POLICY select_same_tenant ON fabric.memory_records USING (true)",
        POLICIES,
    ),
    "rename policy": Case(
        "ALTER POLICY select_same_tenant ON fabric.memory_records RENAME TO select_any",
        POLICIES,
    ),
    "drop policy": Case("DROP POLICY select_same_tenant ON fabric.memory_records", POLICIES),
    "comment on policy": Case(
        "COMMENT ON POLICY select_same_tenant ON fabric.memory_records IS 'x'", POLICIES
    ),
    "create rule": Case(
        "CREATE RULE swallow AS ON INSERT TO fabric.events DO INSTEAD NOTHING",
        RULES,
    ),
    "drop rule": Case(
        "DROP RULE kept ON fabric.tenants",
        RULES,
        setup=("CREATE RULE kept AS ON DELETE TO fabric.tenants DO INSTEAD NOTHING",),
    ),
    "rename rule": Case(
        "ALTER RULE kept ON fabric.tenants RENAME TO gone",
        RULES,
        setup=("CREATE RULE kept AS ON DELETE TO fabric.tenants DO INSTEAD NOTHING",),
    ),
    "create trigger": Case(
        "CREATE TRIGGER _050_swallow BEFORE INSERT ON fabric.events"
        " FOR EACH ROW EXECUTE FUNCTION fabric.tg_events__append_only()",
        TRIGGERS,
    ),
    "create or replace trigger": Case(
        "CREATE OR REPLACE TRIGGER _100_thread_metadata BEFORE DELETE ON langgraph.checkpoints"
        " FOR EACH ROW EXECUTE FUNCTION fabric.tg_events__append_only()",
        TRIGGERS,
    ),
    "rename trigger": Case(
        "ALTER TRIGGER _100_thread_metadata ON langgraph.checkpoints RENAME TO _999_renamed",
        TRIGGERS,
    ),
    "drop trigger": Case("DROP TRIGGER _100_thread_metadata ON langgraph.checkpoints", TRIGGERS),
    "comment on trigger": Case(
        "COMMENT ON TRIGGER _100_thread_metadata ON langgraph.checkpoints IS 'x'", TRIGGERS
    ),
    # tables outside the fabric's schemas that reach into it
    "a child of a fabric table": Case(
        "CREATE TABLE scratch.rogue () INHERITS (fabric.tenants)",
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'fabric.tenants'::regclass",
        setup=SCRATCH,
    ),
    "a fabric table moved out of its schema": Case(
        "ALTER TABLE fabric.tenants SET SCHEMA scratch",
        "SELECT to_regclass('fabric.tenants') IS NOT NULL",
        setup=SCRATCH,
    ),
    # an object of the login's own that reaches the fabric with the owner's privileges
    "a definer function over a fabric table": Case(
        "CREATE FUNCTION scratch.leak() RETURNS SETOF fabric.memory_records"
        " LANGUAGE sql SECURITY DEFINER AS 'SELECT * FROM fabric.memory_records'",
        "SELECT count(*) FROM pg_proc WHERE proname = 'leak'",
        setup=SCRATCH,
    ),
    "a view over a fabric table": Case(
        "CREATE VIEW scratch.leak AS SELECT * FROM fabric.memory_records",
        "SELECT count(*) FROM pg_class WHERE relname = 'leak'",
        setup=SCRATCH,
    ),
    "a publication of a fabric table": Case(
        "CREATE PUBLICATION leak FOR TABLE fabric.events",
        "SELECT count(*) FROM pg_publication",
        setup=(
            "DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO {login}, fabric_owner',"
            " current_database()); END $$",
        ),
    ),
}


@pytest.fixture
def leaked_owner(fabric: Fabric) -> Iterator[str]:
    """A login that was (wrongly) granted fabric_owner; dropped afterwards (roles are
    cluster-wide)."""
    login = f"mf_leak_{uuid.uuid4().hex[:8]}"
    with fabric.su() as su:
        su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        su.execute(sql.SQL("GRANT fabric_owner TO {}").format(sql.Identifier(login)))
    yield login
    with psycopg.connect(fabric.url, autocommit=True) as su:
        su.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(login)))
        su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login)))


def probe(fabric: Fabric, query: str) -> Any:
    row = fabric.session(None).execute(query).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


@pytest.mark.parametrize("set_role", [False, True], ids=["inherited", "set-role"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_guard_refuses_every_class_of_command_to_a_leaked_owner(
    fabric: Fabric, leaked_owner: str, case: str, set_role: bool
) -> None:
    c = CASES[case]
    with fabric.su() as su:
        for statement in c.setup:
            su.execute(statement.replace("{login}", leaked_owner))  # type: ignore[arg-type]
    before = probe(fabric, c.probe)
    if set_role:
        conn = fabric.owner(None, actor=None, login=leaked_owner)
    else:
        conn = fabric.connect(leaked_owner)
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
        conn.execute(c.statement)  # type: ignore[arg-type]
    assert "migration role" in str(info.value)
    assert info.value.diag.message_hint and "migration" in info.value.diag.message_hint
    assert probe(fabric, c.probe) == before


def test_a_rule_cannot_swallow_the_events_of_a_proposal(fabric: Fabric, leaked_owner: str) -> None:
    """The attack of the issue, end to end: with the rule refused, a proposal still has its
    event."""
    conn = fabric.owner(None, actor=None, login=leaked_owner)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE RULE swallow AS ON INSERT TO fabric.events DO INSTEAD NOTHING")
    events = fabric.count("events")
    fabric.proposed()
    assert fabric.count("events") > events


def test_a_login_outside_the_owner_cannot_set_defaults_in_a_fabric_schema(
    fabric: Fabric,
) -> None:
    before = probe(fabric, DEFAULT_ACLS)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="migration role"):
        fabric.connect("mf_stranger").execute(
            "ALTER DEFAULT PRIVILEGES IN SCHEMA fabric GRANT SELECT ON TABLES TO mf_stranger"
        )
    assert probe(fabric, DEFAULT_ACLS) == before


def test_other_schemas_and_temporary_tables_are_left_alone(fabric: Fabric) -> None:
    """A login that holds none of the fabric's ownership grants, writes policies, rules and
    triggers in its own schema; a temporary table of its own is no business of the guard."""
    with fabric.su() as su:
        su.execute("CREATE SCHEMA scratch AUTHORIZATION mf_stranger")
    stranger = fabric.connect("mf_stranger")
    stranger.execute("CREATE TABLE scratch.t (x int)")
    stranger.execute("GRANT SELECT ON scratch.t TO mf_agent_a")
    stranger.execute("REVOKE SELECT ON scratch.t FROM mf_agent_a")
    stranger.execute(
        "ALTER DEFAULT PRIVILEGES IN SCHEMA scratch GRANT SELECT ON TABLES TO mf_agent_a"
    )
    stranger.execute("CREATE POLICY p ON scratch.t USING (true)")
    stranger.execute("CREATE RULE r AS ON DELETE TO scratch.t DO INSTEAD NOTHING")
    stranger.execute("DROP RULE r ON scratch.t")
    stranger.execute("DROP POLICY p ON scratch.t")
    stranger.execute("CREATE TEMPORARY TABLE stash (x int)")
    stranger.execute("DROP TABLE scratch.t")


def test_the_migration_role_still_changes_policies_rules_triggers_and_grants(
    fabric: Fabric,
) -> None:
    before = [probe(fabric, q) for q in (POLICIES, RULES, TRIGGERS, DEFAULT_ACLS)]
    migrator = fabric.owner(None, actor=None, login=MIGRATOR)
    for statement in (
        "CREATE POLICY probe ON fabric.memory_records USING (false)",
        "DROP POLICY probe ON fabric.memory_records",
        "CREATE RULE probe AS ON DELETE TO fabric.tenants DO INSTEAD NOTHING",
        "DROP RULE probe ON fabric.tenants",
        "CREATE TRIGGER _050_probe BEFORE INSERT ON fabric.events"
        " FOR EACH ROW EXECUTE FUNCTION fabric.tg_events__append_only()",
        "DROP TRIGGER _050_probe ON fabric.events",
        "GRANT SELECT ON fabric.tenants TO mf_stranger",
        "REVOKE SELECT ON fabric.tenants FROM mf_stranger",
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_owner GRANT SELECT ON TABLES TO mf_stranger",
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_owner REVOKE SELECT ON TABLES FROM mf_stranger",
    ):
        migrator.execute(statement)  # type: ignore[arg-type]
    assert [probe(fabric, q) for q in (POLICIES, RULES, TRIGGERS, DEFAULT_ACLS)] == before
