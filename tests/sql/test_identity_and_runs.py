"""Identity, runs and authority (R-ID-1, R-ID-2, R-RUN-1, R-TOOL-1, R-TOOL-2).

Who calls is session_user; a run binds an agent to one tenant, subject, session and
active tool set, and a request can only narrow them. An unknown, expired, closed or
foreign run is an error (42501) that writes nothing. A tool missing from any of the three
layers is an answer ("denied"), not an error, and leaves exactly one
agent.tool.unauthorized event in the run's tenant. R-TOOL-2: no tool backed by
os-agt-008 can be allowed to, or enabled for, any agent, whoever writes the row.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, PROFILE_WIDE, Fabric, episode

pytestmark = pytest.mark.rollback

REGISTRY = ("agents", "tenant_agents", "tenant_agent_tools", "tools", "tenants")


def world(fabric: Fabric) -> dict[str, int]:
    """Row counts of every table a refusal could have written to."""
    counts = fabric.counts()
    for table in REGISTRY:
        counts[table] = fabric.count(table)
    return counts


def propose_refused(fabric: Fabric, login: str, envelope: Any, run_id: uuid.UUID) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        fabric.propose(login, envelope, run_id)
    return info.value


def proposals_of_run(fabric: Fabric, run_id: uuid.UUID) -> int:
    return fabric.count("proposals", f"run_id = '{run_id}'")


# --- who is calling -----------------------------------------------------------------------


@pytest.mark.clone
def test_the_caller_is_session_user_not_current_user(fabric: Fabric) -> None:
    run = fabric.open_run()
    before = world(fabric)
    impostor = fabric.su()
    impostor.execute("SET ROLE mf_agent_a")  # current_user is the agent, session_user is not
    with pytest.raises(errors.InsufficientPrivilege):
        impostor.execute("SELECT fabric_api.propose(%s, %s)", (Jsonb(episode()), run))
    assert world(fabric) == before
    # the same call from the agent's own login is accepted: the run itself was fine
    assert fabric.propose("mf_agent_a", episode(), run)["status"] == "validated"


def test_a_login_that_is_not_a_registered_agent_has_no_door(fabric: Fabric) -> None:
    run = fabric.open_run()
    before = world(fabric)
    exc = propose_refused(fabric, "mf_stranger", episode(), run)
    assert isinstance(exc, errors.InsufficientPrivilege)
    assert exc.sqlstate == "42501"
    assert world(fabric) == before


def test_committers_cannot_propose(fabric: Fabric) -> None:
    # a perfectly valid run of the committer's own agent id, with the propose tool active
    run = fabric.open_run(agent_id="os-agt-010")
    before = world(fabric)
    exc = propose_refused(fabric, "mf_committer", episode(), run)
    assert exc.sqlstate == "42501"
    assert world(fabric) == before


# --- runs: unknown, expired, closed, foreign ----------------------------------------------


def test_an_unknown_run_is_refused_and_writes_nothing(fabric: Fabric) -> None:
    fabric.open_run()
    before = world(fabric)
    exc = propose_refused(fabric, "mf_agent_a", episode(), uuid.uuid4())
    assert exc.sqlstate == "42501"
    assert world(fabric) == before


@pytest.mark.clone
def test_an_expired_run_is_refused_and_writes_nothing(fabric: Fabric) -> None:
    run = fabric.open_run(ttl="200 milliseconds")
    time.sleep(0.3)
    before = world(fabric)
    exc = propose_refused(fabric, "mf_agent_a", episode(), run)
    assert exc.sqlstate == "42501"
    assert world(fabric) == before
    assert proposals_of_run(fabric, run) == 0


def test_a_closed_run_is_refused_and_writes_nothing(fabric: Fabric) -> None:
    run = fabric.open_run()
    assert fabric.propose("mf_agent_a", episode(), run)["status"] == "validated"
    fabric.session("mf_orchestrator").execute("SELECT fabric_api.close_run(%s)", (run,))
    before = world(fabric)
    exc = propose_refused(fabric, "mf_agent_a", episode(), run)
    assert exc.sqlstate == "42501"
    assert world(fabric) == before
    assert proposals_of_run(fabric, run) == 1


def test_another_agents_run_is_refused_and_writes_nothing(fabric: Fabric) -> None:
    run_of_b = fabric.open_run(agent_id="com-agt-004")
    before = world(fabric)
    exc = propose_refused(fabric, "mf_agent_a", episode(), run_of_b)
    assert exc.sqlstate == "42501"
    assert world(fabric) == before
    assert proposals_of_run(fabric, run_of_b) == 0


def test_a_run_of_another_tenant_is_refused_and_writes_nothing(fabric: Fabric) -> None:
    globex_run = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    before = world(fabric)
    exc = propose_refused(
        fabric,
        "mf_agent_a",
        episode(scope={"tenant_id": "globex", "visibility": "subject"}),
        globex_run,
    )
    assert exc.sqlstate == "42501"
    assert world(fabric) == before
    assert fabric.count("events", "tenant_id = 'globex' AND event_type LIKE 'memory.%'") == 0


# --- three-layer tool authorization: an answer, not an error ------------------------------


def assert_denied_once(
    fabric: Fabric, login: str, run: uuid.UUID, tenant: str, missing: list[str]
) -> None:
    before = world(fabric)
    result = fabric.propose(
        login, episode(scope={"tenant_id": tenant, "visibility": "subject"}), run
    )
    assert result["status"] == "denied"
    assert result["proposal_id"] is None
    assert isinstance(result["reason"], str) and result["reason"]
    after = world(fabric)
    assert after["proposals"] == before["proposals"]
    assert after["memory_records"] == before["memory_records"]
    assert after["events"] == before["events"] + 1
    assert {k: v for k, v in after.items() if k != "events"} == {
        k: v for k, v in before.items() if k != "events"
    }
    events = fabric.events(f"run_id = '{run}' AND event_type LIKE 'agent.%'")
    assert len(events) == 1
    assert events[0]["event_type"] == "agent.tool.unauthorized"
    assert events[0]["tenant_id"] == tenant
    assert events[0]["payload"]["tool"] == "tool:memory-propose"
    assert events[0]["payload"]["missing_layers"] == missing


def test_tool_missing_from_tools_allowed_is_denied_without_raising(fabric: Fabric) -> None:
    # enabled in the tenant and active in the run: only the agent's tools_allowed lacks it
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.enable_agent('acme', 'com-agt-009', %s)", (MEMORY_TOOLS,)
    )
    run = fabric.open_run(agent_id="com-agt-009")
    assert_denied_once(fabric, "mf_agent_notools", run, "acme", ["tools_allowed"])


def test_tool_missing_from_tenant_enablement_is_denied_without_raising(fabric: Fabric) -> None:
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.enable_agent('acme', 'com-agt-003', ARRAY['tool:memory-recall'])"
    )
    run = fabric.open_run()
    assert_denied_once(fabric, "mf_agent_a", run, "acme", ["tenant_enablement"])


def test_tool_missing_from_the_active_tool_set_is_denied_without_raising(fabric: Fabric) -> None:
    run = fabric.open_run(tools=[])
    assert_denied_once(fabric, "mf_agent_a", run, "acme", ["active_tool_set"])


def test_a_denial_is_recorded_in_the_runs_tenant(fabric: Fabric) -> None:
    run = fabric.open_run(agent_id="com-agt-004", tenant="globex", tools=["tool:memory-recall"])
    assert_denied_once(fabric, "mf_agent_b", run, "globex", ["active_tool_set"])
    assert (
        fabric.count("events", "tenant_id = 'acme' AND event_type = 'agent.tool.unauthorized'") == 0
    )


# --- R-TOOL-2: tools backed by os-agt-008 ---------------------------------------------


def test_register_agent_with_an_audit_tool_is_refused(fabric: Fabric) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.register_agent('new-agt-001', 'mf_stranger', '{}', %s)",
            (["tool:memory-recall", "tool:audit-lineage"],),
        )
    assert info.value.sqlstate == "23514"
    assert world(fabric) == before
    assert fabric.count("agents", "login = 'mf_stranger'") == 0
    member = fabric.session().execute("SELECT pg_has_role('mf_stranger', 'fabric_agent', 'MEMBER')")
    assert member.fetchone() == (False,)


def test_re_registering_an_agent_with_an_audit_tool_is_refused(fabric: Fabric) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation):
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.register_agent('com-agt-003', 'mf_agent_a', %s, %s)",
            (Jsonb(PROFILE_WIDE), [*MEMORY_TOOLS, "tool:audit-records-as-of"]),
        )
    assert world(fabric) == before
    row = fabric.session().execute(
        "SELECT tools_allowed FROM fabric.agents WHERE agent_id = 'com-agt-003'"
    )
    assert row.fetchone() == (MEMORY_TOOLS,)


def test_enable_agent_with_an_audit_tool_is_refused(fabric: Fabric) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.enable_agent('acme', 'com-agt-003', %s)",
            ([*MEMORY_TOOLS, "tool:audit-lineage"],),
        )
    assert info.value.sqlstate == "23514"
    assert world(fabric) == before


def test_the_owners_raw_insert_of_an_agent_with_an_audit_tool_is_refused(fabric: Fabric) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner(None, actor=None).execute(
            "INSERT INTO fabric.agents (agent_id, login, tools_allowed)"
            " VALUES ('raw-agt-001', 'mf_stranger', ARRAY['tool:audit-lineage'])"
        )
    assert info.value.diag.constraint_name == "tools_audit_agent_is_never_allowed"
    assert world(fabric) == before


def test_the_owners_raw_update_adding_an_audit_tool_is_refused(fabric: Fabric) -> None:
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner(None, actor=None).execute(
            "UPDATE fabric.agents SET tools_allowed = tools_allowed || 'tool:audit-recalls'::text"
            " WHERE agent_id = 'com-agt-003'"
        )
    assert info.value.diag.constraint_name == "tools_audit_agent_is_never_allowed"
    row = fabric.session().execute(
        "SELECT tools_allowed FROM fabric.agents WHERE agent_id = 'com-agt-003'"
    )
    assert row.fetchone() == (MEMORY_TOOLS,)


def test_the_owners_raw_tenant_enablement_of_an_audit_tool_is_refused(fabric: Fabric) -> None:
    before = world(fabric)
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner("acme", actor=None).execute(
            "INSERT INTO fabric.tenant_agent_tools (tenant_id, agent_id, tool_id)"
            " VALUES ('acme', 'com-agt-003', 'tool:audit-lineage')"
        )
    assert info.value.diag.constraint_name == "tools_audit_agent_is_never_allowed"
    assert world(fabric) == before


def test_a_tool_some_agent_holds_cannot_become_backed_by_os_agt_008(fabric: Fabric) -> None:
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner(None, actor=None).execute(
            "UPDATE fabric.tools SET agent_id = 'os-agt-008' WHERE tool_id = 'tool:memory-propose'"
        )
    assert info.value.diag.constraint_name == "tools_audit_agent_is_never_allowed"
    assert fabric.count("tools", "tool_id = 'tool:memory-propose' AND agent_id = 'os-agt-012'") == 1


def test_a_tool_enabled_in_some_tenant_cannot_become_backed_by_os_agt_008(fabric: Fabric) -> None:
    # held only at the tenant layer (not in any tools_allowed), which is still an enablement
    fabric.owner(None, actor=None).execute(
        "INSERT INTO fabric.tools (tool_id, agent_id, description)"
        " VALUES ('tool:export-notes', 'os-agt-012', 'export notes')"
    )
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.enable_agent('globex', 'com-agt-004', %s)",
        ([*MEMORY_TOOLS, "tool:export-notes"],),
    )
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner(None, actor=None).execute(
            "UPDATE fabric.tools SET agent_id = 'os-agt-008' WHERE tool_id = 'tool:export-notes'"
        )
    assert info.value.diag.constraint_name == "tools_audit_agent_is_never_allowed"
    assert fabric.count("tools", "tool_id = 'tool:export-notes' AND agent_id = 'os-agt-012'") == 1


# --- opening runs -------------------------------------------------------------------------


@pytest.mark.parametrize("login", ["mf_agent_a", "mf_admin", "mf_committer"])
def test_only_orchestrators_open_runs(fabric: Fabric, login: str) -> None:
    before = world(fabric)
    with pytest.raises(errors.InsufficientPrivilege):
        fabric.connect(login).execute(
            "SELECT fabric_api.open_run('acme', 'com-agt-003', 'user-8842', 'sess-1f9c', %s)",
            (MEMORY_TOOLS,),
        )
    assert world(fabric) == before


@pytest.mark.parametrize(
    ("tenant", "agent_id"),
    [("globex", "com-agt-003"), ("acme", "glx-agt-001"), ("acme", "no-such-agent")],
)
def test_a_run_needs_the_agent_enabled_in_the_tenant(
    fabric: Fabric, tenant: str, agent_id: str
) -> None:
    before = world(fabric)
    with pytest.raises(errors.InsufficientPrivilege):
        fabric.open_run(agent_id=agent_id, tenant=tenant)
    assert world(fabric) == before


# --- committing ---------------------------------------------------------------------------


@pytest.mark.parametrize("login", ["mf_agent_a", "mf_orchestrator", "mf_admin"])
def test_only_committers_commit(fabric: Fabric, login: str) -> None:
    run = fabric.open_run()
    proposal_id = fabric.propose("mf_agent_a", episode(), run)["proposal_id"]
    before = world(fabric)
    with pytest.raises(errors.InsufficientPrivilege):
        fabric.commit(proposal_id, login=login)
    assert world(fabric) == before
    assert fabric.count("proposals", f"proposal_id = '{proposal_id}' AND status = 'validated'") == 1


# --- a request can only narrow the run's scope --------------------------------------------


@pytest.mark.parametrize(
    "scope",
    [
        pytest.param({"tenant_id": "globex", "visibility": "tenant"}, id="other-tenant"),
        pytest.param(
            {"tenant_id": "acme", "visibility": "subject", "subject_id": "user-9999"},
            id="other-subject",
        ),
        pytest.param(
            {"tenant_id": "acme", "visibility": "session", "session_id": "sess-0000"},
            id="other-session",
        ),
        pytest.param(
            {"tenant_id": "acme", "visibility": "agent", "agent_id": "com-agt-004"},
            id="other-agent",
        ),
    ],
)
def test_a_request_cannot_widen_the_runs_scope(fabric: Fabric, scope: dict[str, str]) -> None:
    run = fabric.open_run()
    before = world(fabric)
    exc = propose_refused(fabric, "mf_agent_a", episode(scope=scope), run)
    assert exc.sqlstate == "42501"
    assert world(fabric) == before


@pytest.mark.parametrize(
    ("field", "visibility"), [("subject_id", "subject"), ("session_id", "session")]
)
def test_a_request_cannot_name_a_subject_or_session_the_run_lacks(
    fabric: Fabric, field: str, visibility: str
) -> None:
    run = fabric.open_run(subject=None, session=None)
    before = world(fabric)
    scope = {"tenant_id": "acme", "visibility": visibility, field: "user-8842"}
    exc = propose_refused(fabric, "mf_agent_a", episode(scope=scope), run)
    assert exc.sqlstate == "42501"
    assert world(fabric) == before


def test_omitted_subject_and_session_are_taken_from_the_run(fabric: Fabric) -> None:
    run = fabric.open_run(subject="user-8842", session="sess-1f9c")
    result = fabric.propose("mf_agent_a", episode(), run)  # scope names neither
    assert result["status"] == "validated"
    row = fabric.su().execute(
        "SELECT subject_id, session_id, agent_id FROM fabric.proposals WHERE proposal_id = %s",
        (result["proposal_id"],),
    )
    assert row.fetchone() == ("user-8842", "sess-1f9c", None)
    record = fabric.commit(result["proposal_id"])
    assert record["scope"]["subject_id"] == "user-8842"
    assert record["scope"]["session_id"] == "sess-1f9c"
    assert record["scope"]["tenant_id"] == "acme"


def test_naming_the_runs_own_scope_is_accepted(fabric: Fabric) -> None:
    run = fabric.open_run()
    scope = {
        "tenant_id": "acme",
        "subject_id": "user-8842",
        "session_id": "sess-1f9c",
        "agent_id": "com-agt-003",
        "visibility": "agent",
    }
    result = fabric.propose("mf_agent_a", episode(scope=scope), run)
    assert result["status"] == "validated"
    record = fabric.commit(result["proposal_id"])
    assert record["scope"]["agent_id"] == "com-agt-003"


# --- registering agents -------------------------------------------------------------------


def _superuser_name(fabric: Fabric) -> str:
    row = fabric.session().execute("SELECT current_user").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize(
    ("kind", "sqlstate"),
    [("superuser", "42501"), ("bypassrls", "42501"), ("nologin", "42704")],
)
def test_register_agent_refuses_privileged_or_non_login_roles(
    fabric: Fabric, kind: str, sqlstate: str
) -> None:
    login = {
        "superuser": _superuser_name(fabric),
        "bypassrls": "fabric_migrator",  # LOGIN BYPASSRLS (bootstrap)
        "nologin": "fabric_agent",  # a group role
    }[kind]
    flags = (
        fabric.session()
        .execute(
            "SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = %s", (login,)
        )
        .fetchone()
    )
    assert (
        flags
        == {
            "superuser": (True, True, True),
            "bypassrls": (False, True, True),
            "nologin": (False, False, False),
        }[kind]
    )
    before = world(fabric)
    with pytest.raises(psycopg.Error) as info:
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.register_agent('priv-agt-001', %s, '{}', %s)",
            (login, MEMORY_TOOLS),
        )
    assert info.value.sqlstate == sqlstate
    assert world(fabric) == before
    assert fabric.count("agents", f"login = '{login}'") == 0


# Every group role of the fabric but the two whose members act as agents (the committer and
# the consolidator) and the checkpointer (a LangGraph service may keep its threads under its
# agent login): a login holding one is refused as an agent, with a hint.
PRIVILEGED_GROUPS = (
    "fabric_admin",
    "fabric_orchestrator",
    "fabric_policy",
    "fabric_mcp_gateway",
    "fabric_projector",
    "fabric_tracer",
    "fabric_auditor",
    "fabric_maintainer",
    "fabric_owner",
    "fabric_lookup",
    "fabric_retriever",
)


@pytest.mark.parametrize("group", PRIVILEGED_GROUPS)
def test_register_agent_refuses_a_login_holding_a_privileged_group(
    fabric: Fabric, group: str
) -> None:
    login = f"mf_priv_{uuid.uuid4().hex[:8]}"
    su = fabric.session()
    su.execute(f"CREATE ROLE {login} LOGIN")
    su.execute(f"GRANT {group} TO {login}")
    before = world(fabric)
    with pytest.raises(psycopg.Error) as info:
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.register_agent('priv-agt-001', %s, '{}', %s)",
            (login, MEMORY_TOOLS),
        )
    assert info.value.sqlstate == "42501"
    assert info.value.diag.message_hint and "its own login" in info.value.diag.message_hint
    assert world(fabric) == before
    assert fabric.count("agents", f"login = '{login}'") == 0
    granted = su.execute(
        "SELECT count(*) FROM pg_auth_members WHERE roleid = 'fabric_agent'::regrole"
        " AND member = %s::regrole",
        (login,),
    ).fetchone()
    assert granted == (0,)


@pytest.mark.parametrize(
    "login", ["mf_admin", "mf_orchestrator", "mf_policy", "mf_gateway", "mf_projector"]
)
def test_register_agent_refuses_the_service_logins_of_the_world(fabric: Fabric, login: str) -> None:
    before = world(fabric)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.register_agent('priv-agt-001', %s, '{}', '{}')", (login,)
        )
    assert world(fabric) == before


@pytest.mark.parametrize(
    "group", ["fabric_committer", "fabric_consolidator", "fabric_checkpointer"]
)
def test_the_committer_the_consolidator_and_a_checkpointer_may_be_agents(
    fabric: Fabric, group: str
) -> None:
    login = f"mf_ok_{uuid.uuid4().hex[:8]}"
    su = fabric.session()
    su.execute(f"CREATE ROLE {login} LOGIN")
    su.execute(f"GRANT {group} TO {login}")
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.register_agent('ok-agt-001', %s, '{}', '{}')", (login,)
    )
    assert fabric.count("agents", f"login = '{login}'") == 1
