"""R-TOOL-2, the audit agent's side: os-agt-008 is read-only.

It can never be registered with a tool or a propose scope (whoever writes the agents row,
on insert or update), never enabled in a tenant with a tool, and no run may name a tool
backed by os-agt-008 in its active tool set. Each refusal is 23514 and writes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, PROFILE_WIDE, Fabric, episode

REGISTRY = ("agents", "tenant_agents", "tenant_agent_tools", "tools", "tenants")
RECALL_ONLY = {"recall_scope": {"tiers": ["semantic"], "visibility": ["tenant"]}}


def world(fabric: Fabric) -> dict[str, int]:
    counts = fabric.counts()
    for table in REGISTRY:
        counts[table] = fabric.count(table)
    return counts


@pytest.fixture
def audit_login(fabric: Fabric) -> Iterator[str]:
    """A fresh plain login for attempts to register os-agt-008 (logins are cluster-wide, and
    registering one makes it a member of fabric_agent: dropped after the test)."""
    login = f"mf_audit_{uuid.uuid4().hex[:12]}"
    fabric.session().execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
    yield login
    fabric.close()
    with psycopg.connect(fabric.url, autocommit=True) as su:
        su.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))


def register(fabric: Fabric, login: str, profile: dict[str, Any], tools: list[str]) -> Any:
    return fabric.session("mf_admin").execute(
        "SELECT fabric_api.register_agent('os-agt-008', %s, %s, %s)",
        (login, Jsonb(profile), tools),
    )


@pytest.mark.parametrize(
    ("profile", "tools"),
    [
        ({}, MEMORY_TOOLS),
        ({}, ["tool:memory-recall"]),
        (PROFILE_WIDE, []),
        ({"propose_scope": {"tiers": [], "visibility": []}}, []),
    ],
    ids=["memory-tools", "recall-tool", "propose-scope", "empty-propose-scope"],
)
def test_os_agt_008_cannot_be_registered_with_a_tool_or_a_propose_scope(
    fabric: Fabric, audit_login: str, profile: dict[str, Any], tools: list[str]
) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        register(fabric, audit_login, profile, tools)
    assert info.value.sqlstate == "23514"
    assert info.value.diag.constraint_name == "audit_agent_is_read_only"
    assert info.value.diag.message_hint
    assert world(fabric) == before
    member = fabric.session().execute(
        "SELECT pg_has_role(%s, 'fabric_agent', 'MEMBER')", (audit_login,)
    )
    assert member.fetchone() == (False,)


def test_os_agt_008_registered_read_only_cannot_be_re_registered_with_tools(
    fabric: Fabric, audit_login: str
) -> None:
    register(fabric, audit_login, RECALL_ONLY, [])
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        register(fabric, audit_login, RECALL_ONLY, MEMORY_TOOLS)
    assert info.value.diag.constraint_name == "audit_agent_is_read_only"
    with pytest.raises(errors.CheckViolation):
        register(fabric, audit_login, PROFILE_WIDE, [])
    assert world(fabric) == before
    row = fabric.session().execute(
        "SELECT tools_allowed, memory_profile FROM fabric.agents WHERE agent_id = 'os-agt-008'"
    )
    assert row.fetchone() == ([], RECALL_ONLY)


@pytest.mark.parametrize(
    ("tools", "profile"),
    [(["tool:memory-propose"], {}), ([], {"propose_scope": {}})],
    ids=["tools", "propose-scope"],
)
def test_the_owners_raw_insert_of_a_writing_audit_agent_is_refused(
    fabric: Fabric, audit_login: str, tools: list[str], profile: dict[str, Any]
) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner(None, actor=None).execute(
            "INSERT INTO fabric.agents (agent_id, login, tools_allowed, memory_profile)"
            " VALUES ('os-agt-008', %s, %s, %s)",
            (audit_login, tools, Jsonb(profile)),
        )
    assert info.value.diag.constraint_name == "audit_agent_is_read_only"
    assert world(fabric) == before


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE fabric.agents SET tools_allowed = ARRAY['tool:memory-propose']"
        " WHERE agent_id = 'os-agt-008'",
        'UPDATE fabric.agents SET memory_profile = \'{"propose_scope": {"tiers": []}}\''
        " WHERE agent_id = 'os-agt-008'",
    ],
    ids=["tools", "propose-scope"],
)
def test_the_owners_raw_update_of_the_audit_agent_is_refused(
    fabric: Fabric, audit_login: str, statement: str
) -> None:
    register(fabric, audit_login, RECALL_ONLY, [])
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner(None, actor=None).execute(statement)
    assert info.value.diag.constraint_name == "audit_agent_is_read_only"
    row = fabric.session().execute(
        "SELECT tools_allowed, memory_profile FROM fabric.agents WHERE agent_id = 'os-agt-008'"
    )
    assert row.fetchone() == ([], RECALL_ONLY)


def test_a_writing_agent_renamed_to_os_agt_008_is_refused(fabric: Fabric, audit_login: str) -> None:
    """Renaming a writing agent (enabled nowhere) to os-agt-008 is an update path too."""
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.register_agent('new-agt-001', %s, %s, %s)",
        (audit_login, Jsonb(PROFILE_WIDE), MEMORY_TOOLS),
    )
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner(None, actor=None).execute(
            "UPDATE fabric.agents SET agent_id = 'os-agt-008' WHERE agent_id = 'new-agt-001'"
        )
    assert info.value.diag.constraint_name == "audit_agent_is_read_only"
    assert fabric.count("agents", "agent_id = 'os-agt-008'") == 0


def test_os_agt_008_cannot_be_enabled_with_a_tool(fabric: Fabric, audit_login: str) -> None:
    register(fabric, audit_login, RECALL_ONLY, [])
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.enable_agent('acme', 'os-agt-008', %s)", (["tool:memory-recall"],)
        )
    assert info.value.sqlstate == "23514"
    assert info.value.diag.constraint_name == "audit_agent_is_read_only"
    assert world(fabric) == before
    # enabled with no tools, it may be bound to runs, and still holds nothing
    fabric.session("mf_admin").execute("SELECT fabric_api.enable_agent('acme', 'os-agt-008', '{}')")
    assert fabric.count("tenant_agents", "agent_id = 'os-agt-008'") == 1


def test_the_owners_raw_enablement_of_an_audit_agent_tool_is_refused(
    fabric: Fabric, audit_login: str
) -> None:
    register(fabric, audit_login, RECALL_ONLY, [])
    fabric.session("mf_admin").execute("SELECT fabric_api.enable_agent('acme', 'os-agt-008', '{}')")
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner("acme", actor=None).execute(
            "INSERT INTO fabric.tenant_agent_tools (tenant_id, agent_id, tool_id)"
            " VALUES ('acme', 'os-agt-008', 'tool:memory-propose')"
        )
    assert info.value.diag.constraint_name == "audit_agent_is_read_only"
    assert world(fabric) == before


@pytest.mark.parametrize("tool", ["tool:audit-lineage", "tool:audit-recalls"])
def test_open_run_refuses_an_audit_tool_in_the_active_tool_set(fabric: Fabric, tool: str) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.open_run(tools=[*MEMORY_TOOLS, tool])
    assert info.value.sqlstate == "23514"
    assert info.value.diag.constraint_name == "tools_audit_agent_is_never_allowed"
    assert info.value.diag.message_hint
    assert world(fabric) == before


def test_a_raw_run_with_an_audit_tool_is_refused(fabric: Fabric) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner("acme", actor=None).execute(
            "INSERT INTO fabric.runs (tenant_id, agent_id, active_tool_set, expires_at)"
            " VALUES ('acme', 'com-agt-003', ARRAY['tool:audit-lineage'], now() + interval '1h')"
        )
    assert info.value.diag.constraint_name == "tools_audit_agent_is_never_allowed"
    assert world(fabric) == before


def test_the_audit_agent_cannot_write_memory_end_to_end(fabric: Fabric, audit_login: str) -> None:
    """The reported attack, with what the registry still accepts: no tool, so no write."""
    register(fabric, audit_login, RECALL_ONLY, [])
    fabric.session("mf_admin").execute("SELECT fabric_api.enable_agent('acme', 'os-agt-008', '{}')")
    run = fabric.open_run(agent_id="os-agt-008")
    before = fabric.counts()
    answer = fabric.propose(audit_login, episode(), run)
    assert answer["status"] == "denied"
    after = fabric.counts()
    assert after["proposals"] == before["proposals"]
    assert after["memory_records"] == before["memory_records"]


def test_an_unknown_tool_is_refused_without_echoing_it(fabric: Fabric) -> None:
    canary = "tool:CANARY-" + uuid.uuid4().hex
    before = world(fabric)
    with pytest.raises(errors.ForeignKeyViolation) as info:
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.enable_agent('acme', 'com-agt-003', %s)", ([canary],)
        )
    assert info.value.sqlstate == "23503"
    assert canary not in str(info.value)
    assert info.value.diag.message_hint
    assert world(fabric) == before
