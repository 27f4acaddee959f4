"""MCP bearer tokens: only the orchestrator that opened a run issues its token, only the hash
is stored, a token expires with its run (or earlier) and can be revoked, and only the
gateway role resolves one, to the run's agent login."""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric

pytestmark = pytest.mark.rollback


def issue(
    fabric: Fabric, run: uuid.UUID, ttl: str | None = None, login: str = "mf_orchestrator"
) -> str:
    row = (
        fabric.connect(login)
        .execute("SELECT fabric_api.issue_mcp_token(%s, %s::interval)", (run, ttl))
        .fetchone()
    )
    assert row is not None
    return str(row[0])


def resolve(fabric: Fabric, token: str, login: str = "mf_gateway") -> dict[str, Any]:
    row = (
        fabric.connect(login)
        .execute("SELECT fabric_api.resolve_mcp_token(%s)", (token,))
        .fetchone()
    )
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def refused(fn: Any, *args: Any) -> str | None:
    """The SQLSTATE of the refusal, with "+hint" when the fabric added a hint (a missing
    EXECUTE grant is PostgreSQL's refusal, without one)."""
    with pytest.raises(psycopg.Error) as info:
        fn(*args)
    return f"{info.value.sqlstate}{'+hint' if info.value.diag.message_hint else ''}"


def test_a_token_resolves_to_the_runs_agent_login_and_only_its_hash_is_stored(
    fabric: Fabric,
) -> None:
    run = fabric.open_run()
    token = issue(fabric, run)
    assert token.startswith("mft_") and len(token) == 68
    resolved = resolve(fabric, token)
    assert resolved["login"] == "mf_agent_a"
    assert resolved["run_id"] == str(run)
    assert (resolved["tenant_id"], resolved["agent_id"]) == ("acme", "com-agt-003")
    with fabric.su() as c:
        rows = c.execute("SELECT to_jsonb(t)::text FROM fabric.mcp_tokens t").fetchall()
    assert len(rows) == 1 and token not in rows[0][0]
    assert fabric.count("mcp_tokens", f"token_hash = sha256('{token}'::bytea)") == 1
    assert fabric.count("events", "event_type = 'fabric.mcp_token.issued'") == 1


@pytest.mark.parametrize("login", ["mf_agent_a", "mf_admin", "mf_committer", "mf_gateway"])
def test_only_the_orchestrator_issues_tokens(fabric: Fabric, login: str) -> None:
    run = fabric.open_run()
    assert refused(issue, fabric, run, None, login) == "42501"  # no EXECUTE grant
    assert fabric.count("mcp_tokens") == 0


@pytest.mark.parametrize("login", ["mf_agent_a", "mf_orchestrator", "mf_admin", "mf_stranger"])
def test_only_the_gateway_resolves_tokens(fabric: Fabric, login: str) -> None:
    token = issue(fabric, fabric.open_run())
    assert refused(resolve, fabric, token, login) == "42501"  # no EXECUTE grant


@pytest.mark.clone
def test_no_token_for_an_unknown_closed_or_expired_run(fabric: Fabric) -> None:
    closed = fabric.open_run()
    fabric.session("mf_orchestrator").execute("SELECT fabric_api.close_run(%s)", (closed,))
    expired = fabric.open_run(ttl="200 milliseconds")
    time.sleep(0.3)
    for run in (uuid.uuid4(), closed, expired):
        assert refused(issue, fabric, run) == "42501+hint"
    assert fabric.count("mcp_tokens") == 0


def refusal(fabric: Fabric, run: uuid.UUID, login: str) -> tuple[str, str, str]:
    """The SQLSTATE, message and hint of a refused issue, which wrote nothing."""
    before = (fabric.counts(), fabric.count("mcp_tokens"))
    with pytest.raises(psycopg.Error) as info:
        issue(fabric, run, login=login)
    assert (fabric.counts(), fabric.count("mcp_tokens")) == before
    diag = info.value.diag
    return (str(info.value.sqlstate), str(diag.message_primary), str(diag.message_hint))


def test_a_token_only_for_a_live_run_this_orchestrator_opened_each_refusal_named(
    fabric: Fabric,
) -> None:
    """Another orchestrator's run, an unknown run and a closed run: the refusal names the
    rule and says what to do (the run lookup agents enter by, with the token's words)."""
    other = f"mf_orch_{uuid.uuid4().hex[:8]}"
    fabric.session().execute(f"CREATE ROLE {other} LOGIN")
    fabric.session().execute(f"GRANT fabric_orchestrator TO {other}")
    foreign = (
        "42501",
        "an MCP token is issued only for a run the calling orchestrator opened",
        "open the run with fabric_api.open_run under this login, then issue its token",
    )
    run = fabric.open_run()
    assert refusal(fabric, run, other) == foreign
    assert refusal(fabric, uuid.uuid4(), "mf_orchestrator") == foreign
    fabric.session("mf_orchestrator").execute("SELECT fabric_api.close_run(%s)", (run,))
    assert refusal(fabric, run, "mf_orchestrator") == (
        "42501",
        "the run is closed or expired",
        "open a new run and issue a token for it",
    )
    # the closed run of another orchestrator is refused as not its own, before it is judged
    assert refusal(fabric, run, other) == foreign


def test_a_ttl_must_be_positive(fabric: Fabric) -> None:
    run = fabric.open_run()
    for ttl in ("0 seconds", "-1 hour"):
        assert refused(issue, fabric, run, ttl) == "22023+hint"
    assert fabric.count("mcp_tokens") == 0


def test_a_token_never_outlives_its_run(fabric: Fabric) -> None:
    run = fabric.open_run(ttl="10 minutes")
    issue(fabric, run, "7 days")
    assert fabric.count("mcp_tokens", "expires_at = (SELECT r.expires_at FROM fabric.runs r)") == 1


@pytest.mark.clone
def test_an_expired_revoked_or_closed_token_does_not_resolve(fabric: Fabric) -> None:
    short = issue(fabric, fabric.open_run(), "1 second")
    revoked = issue(fabric, fabric.open_run())
    closed_run = fabric.open_run()
    closed = issue(fabric, closed_run)
    orchestrator = fabric.connect("mf_orchestrator")
    answer = orchestrator.execute("SELECT fabric_api.revoke_mcp_token(%s)", (revoked,)).fetchone()
    assert answer is not None and answer[0]["revoked_at"]
    again = orchestrator.execute("SELECT fabric_api.revoke_mcp_token(%s)", (revoked,)).fetchone()
    assert again is not None and again[0] == answer[0]  # idempotent
    orchestrator.execute("SELECT fabric_api.close_run(%s)", (closed_run,))
    time.sleep(1.1)
    for token in (short, revoked, closed, "mft_" + "0" * 64, "not a token", ""):
        assert refused(resolve, fabric, token) == "42501+hint"
    assert fabric.count("events", "event_type = 'fabric.mcp_token.revoked'") == 1


def test_revoking_an_unknown_token_is_refused(fabric: Fabric) -> None:
    orchestrator = fabric.connect("mf_orchestrator")
    for token in ("mft_" + "1" * 64, "garbage"):
        assert (
            refused(orchestrator.execute, "SELECT fabric_api.revoke_mcp_token(%s)", (token,))
            == "P0002+hint"
        )


def test_an_agent_cannot_read_or_write_the_token_table(fabric: Fabric) -> None:
    issue(fabric, fabric.open_run())
    conn = fabric.connect("mf_agent_a")
    for statement in (
        "SELECT * FROM fabric.mcp_tokens",
        "UPDATE fabric.mcp_tokens SET revoked_at = NULL",
    ):
        with pytest.raises(psycopg.Error) as info:
            conn.execute(statement)
        assert info.value.sqlstate == "42501"


@pytest.mark.clone
def test_the_stored_hash_must_be_a_sha256(fabric: Fabric) -> None:
    run = fabric.open_run()
    conn = fabric.owner(actor=None)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            "INSERT INTO fabric.mcp_tokens (tenant_id, token_hash, run_id, agent_id, expires_at)"
            " VALUES ('acme', '\\x00', %s, 'com-agt-003', now() + interval '1 hour')",
            (run,),
        )
    assert info.value.sqlstate == "23514"
    assert fabric.count("mcp_tokens") == 0


@pytest.mark.parametrize(
    ("function", "prefix"),
    [("_mcp_token_hash", "mft_"), ("_agent_token_hash", "mfa_"), ("_broker_ticket_hash", "mfb_")],
)
def test_a_secret_is_stored_only_in_its_kinds_issued_form(
    fabric: Fabric, function: str, prefix: str
) -> None:
    """MCP tokens, agent tokens and broker tickets share one form, each with its prefix:
    the prefix and 64 lowercase hex; only that is hashed (SHA-256), anything else is NULL
    and so matches no stored secret."""
    others = {"mft_", "mfa_", "mfb_"} - {prefix}
    hexes = "0123456789abcdef" * 4
    secrets = [
        prefix + hexes,
        *(other + hexes for other in sorted(others)),
        prefix + hexes[:-1],
        prefix + hexes + "0",
        prefix + hexes.upper(),
        prefix + hexes + "\n",
        " " + prefix + hexes,
        prefix,
        None,
    ]
    query = sql.SQL("SELECT fabric.{}(%s), sha256(convert_to(%s, 'UTF8'))").format(
        sql.Identifier(function)
    )
    got = [fabric.session().execute(query, (s, s)).fetchone() for s in secrets]
    assert got[0] is not None and got[0][0] == got[0][1]
    assert [row[0] if row else "?" for row in got[1:]] == [None] * (len(secrets) - 1)
