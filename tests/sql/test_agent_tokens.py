"""Agent tokens: an orchestrator fixes a run template when it issues one; only the gateway's
login opens runs from it, each naming the token; a token never widens its template (the
tool set lies within the agent's enablement); revoking it closes its runs."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from conftest import MEMORY_TOOLS, Fabric

pytestmark = pytest.mark.rollback


def issue(
    fabric: Fabric,
    tools: list[str] | None = None,
    login: str = "mf_orchestrator",
    run_ttl: str = "1 hour",
    session: str | None = None,
    subject: str = "user-8842",
) -> dict[str, Any]:
    row = (
        fabric.connect(login)
        .execute(
            "SELECT fabric_api.issue_agent_token('acme', 'com-agt-003', %s, %s, %s, %s::interval)",
            (subject, session, MEMORY_TOOLS if tools is None else tools, run_ttl),
        )
        .fetchone()
    )
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def open_run(fabric: Fabric, token: str, login: str = "mf_gateway") -> dict[str, Any]:
    row = fabric.connect(login).execute("SELECT fabric_api.open_token_run(%s)", (token,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def refused(fn: Any, *args: Any, **kwargs: Any) -> str | None:
    with pytest.raises(psycopg.Error) as info:
        fn(*args, **kwargs)
    return info.value.sqlstate


def test_the_gateway_opens_runs_from_the_template_and_each_names_the_token(
    fabric: Fabric,
) -> None:
    issued = issue(fabric)
    assert issued["token"].startswith("mfa_") and len(issued["token"]) == 68
    first = open_run(fabric, issued["token"])
    second = open_run(fabric, issued["token"])
    assert first["login"] == "mf_agent_a" and first["run_id"] != second["run_id"]
    rows = (
        fabric.session(None)
        .execute(
            "SELECT tenant_id, agent_id, subject_id, active_tool_set, opened_by, token_id::text,"
            " session_id FROM fabric.runs WHERE token_id IS NOT NULL ORDER BY opened_at"
        )
        .fetchall()
    )
    assert [r[:6] for r in rows] == [
        ("acme", "com-agt-003", "user-8842", MEMORY_TOOLS, "mf_gateway", issued["token_id"])
    ] * 2
    assert rows[0][6] != rows[1][6]  # no session in the template: each run its own
    opened = fabric.count(
        "events",
        f"event_type = 'fabric.run.opened' AND payload->>'token_id' = '{issued['token_id']}'",
    )
    assert opened == 2
    stored = fabric.session(None).execute("SELECT to_jsonb(t)::text FROM fabric.agent_tokens t")
    assert all(issued["token"] not in r[0] for r in stored.fetchall())


def test_a_token_never_widens_the_agents_enablement(fabric: Fabric) -> None:
    # a tool the agent is not enabled for in acme
    fabric.session(None).execute(
        "INSERT INTO fabric.tools (tool_id, agent_id, description)"
        " VALUES ('tool:memory-export', 'com-agt-003', 'export')"
    )
    before = fabric.counts()
    assert refused(issue, fabric, [*MEMORY_TOOLS, "tool:memory-export"]) == "42501"
    assert fabric.count("agent_tokens") == 0 and fabric.counts() == before


def test_only_an_orchestrator_issues_and_only_the_gateway_opens(fabric: Fabric) -> None:
    assert refused(issue, fabric, login="mf_agent_a") == "42501"
    token = issue(fabric)["token"]
    before = fabric.counts()
    assert refused(open_run, fabric, token, "mf_agent_a") == "42501"  # never the agent's own
    assert refused(open_run, fabric, token, "mf_orchestrator") == "42501"
    assert refused(open_run, fabric, "mfa_" + "0" * 64) == "42501"
    assert fabric.counts() == before


def test_revoking_closes_the_tokens_runs_and_opens_no_more(fabric: Fabric) -> None:
    issued = issue(fabric)
    run = open_run(fabric, issued["token"])
    other = fabric.open_run()  # a run of the same agent, not the token's
    assert (
        refused(
            fabric.connect("mf_orchestrator").execute,
            "SELECT fabric_api.revoke_agent_token('acme', gen_random_uuid())",
        )
        == "P0002"
    )
    answer = fabric.call(
        "mf_orchestrator", "SELECT fabric_api.revoke_agent_token('acme', %s)", issued["token_id"]
    )
    assert answer["runs_closed"] == 1
    closed = (
        fabric.session(None)
        .execute(
            "SELECT run_id::text, closed_at IS NOT NULL FROM fabric.runs WHERE run_id IN (%s, %s)",
            (run["run_id"], other),
        )
        .fetchall()
    )
    assert dict(closed) == {run["run_id"]: True, str(other): False}
    assert refused(open_run, fabric, issued["token"]) == "42501"


def test_a_subject_erasure_revokes_the_subjects_tokens_and_forgets_the_subject(
    fabric: Fabric,
) -> None:
    """A token whose template names an erased subject would open new runs for that person
    and keep the id: the erasure revokes it and clears its subject and session; another
    subject's token is untouched."""
    erased = issue(fabric, session="sess-1f9c")
    kept = issue(fabric, subject="user-9999")
    approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'art. 17')",
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    answer = fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)
    assert "fabric.agent_tokens" in answer["vacuum"]
    rows = dict(
        fabric.session(None)
        .execute(
            "SELECT token_id::text, jsonb_build_array(subject_id, session_id,"
            " revoked_at IS NOT NULL) FROM fabric.agent_tokens"
        )
        .fetchall()
    )
    assert rows == {
        erased["token_id"]: [None, None, True],
        kept["token_id"]: ["user-9999", None, False],
    }
    assert refused(open_run, fabric, erased["token"]) == "42501"
    assert open_run(fabric, kept["token"])["login"] == "mf_agent_a"


def test_a_run_never_outlives_its_template_ttl(fabric: Fabric) -> None:
    issued = issue(fabric, run_ttl="2 minutes", session="sess-desk")
    run = open_run(fabric, issued["token"])
    lasts = (
        fabric.session(None)
        .execute(
            "SELECT expires_at - opened_at <= interval '2 minutes', session_id FROM fabric.runs"
            " WHERE run_id = %s",
            (run["run_id"],),
        )
        .fetchone()
    )
    assert lasts == (True, "sess-desk")
    assert refused(issue, fabric, run_ttl="8 days") == "22023"
