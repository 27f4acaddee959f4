"""Recall made cheaper answers and audits exactly as before: every request below goes through
`fabric_api.recall` and through the functions it replaced (tests/fixtures/recall_reference.sql:
their bodies as of revision 0054, in a schema of their own), as the same agent on the same
records, and both leave the same answer and the same events, field by field (the event's id,
time, transaction and duration aside) -- served, partial, truncated, text, by ids, narrowed,
and every refusal that is answered (a denied recall and its events) or raised (its SQLSTATE,
and nothing written).

The reference is a snapshot, not a second definition: a change that means to alter recall's
answers or events deletes this test and its fixture (or refreshes the fixture from the
functions as they stand) in the same commit, and says so."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from conftest import Fabric

REFERENCE = Path(__file__).parent.parent / "fixtures" / "recall_reference.sql"
# the events' columns compared (event_id, occurred_at and xid differ by construction)
NEW_EVENTS = (
    "SELECT event_id, to_jsonb(e) - 'event_id' FROM (SELECT event_id, tenant_id, event_type,"
    " correlation_id, causation_id, actor_agent_id, actor_login, run_id, memory_id, proposal_id,"
    " payload - 'duration_ms' AS payload FROM fabric.events) e"
)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def install_reference(fabric: Fabric) -> None:
    """The reference functions, owned as the fabric's are and callable by every login."""
    su = fabric.connect(None)
    su.execute("CREATE SCHEMA recall_ref")
    su.execute(REFERENCE.read_text())  # type: ignore[call-overload]
    for (signature,) in su.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace = 'recall_ref'::regnamespace"
    ).fetchall():
        su.execute(sql.SQL("ALTER FUNCTION {} OWNER TO fabric_owner").format(sql.SQL(signature)))
    su.execute("GRANT USAGE ON SCHEMA recall_ref TO PUBLIC")


def outcome(fabric: Fabric, login: str, function: str, request: dict[str, Any]) -> Any:
    """What one recall leaves: its answer (or its SQLSTATE) and the events it wrote."""
    su = fabric.session(None)
    before = {r[0] for r in su.execute("SELECT event_id FROM fabric.events").fetchall()}
    with fabric.acting(login) as conn:
        try:
            row = conn.execute(f"SELECT {function}(%s)", (Jsonb(request),)).fetchone()
            answer: Any = row[0] if row else None
        except psycopg.Error as e:
            answer = e.sqlstate
    rows = [r[1] for r in su.execute(NEW_EVENTS).fetchall() if r[0] not in before]
    return answer, sorted(rows, key=lambda r: (r["event_type"], str(r)))


@pytest.fixture
def runs(fabric: Fabric) -> dict[str, uuid.UUID]:
    """Records of two tiers and visibilities; runs with and without a subject, a session and
    the recall tool."""
    run = fabric.open_run()
    ep = fabric.form(run, "invoices in EUR please")
    fabric.form(run, "the second invoice note", compliance_labels=["pci"])
    fabric.form(run, "billing entity is Acme Logistics BV", tier="semantic", derived_from=[ep],
                content={"assertion": "billing entity is Acme Logistics BV"})  # fmt: skip
    fabric.form(run, "acme bills monthly", scope={"tenant_id": "acme", "visibility": "tenant"})
    install_reference(fabric)
    return {
        "run": run,
        "no_session": fabric.open_run(session=None),
        "no_subject": fabric.open_run(subject=None, session=None),
        "no_tool": fabric.open_run(tools=["tool:memory-propose"]),
        "other_agent": fabric.open_run(agent_id="com-agt-005"),
    }


REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("mf_agent_a", "run", {}),
    ("mf_agent_a", "run", {"tiers": ["episodic"], "limit": 1}),
    ("mf_agent_a", "run", {"tiers": ["semantic", "episodic"], "limit": 8}),
    ("mf_agent_a", "run", {"query": "invoice", "mode": "text"}),
    ("mf_agent_a", "run", {"query": "invoice billing", "mode": "text", "limit": 1}),
    ("mf_agent_a", "run", {"query": "  ", "tiers": ["episodic"]}),
    (
        "mf_agent_a",
        "run",
        {"correlation_id": "c-1", "causation_id": "c-0", "traceparent": TRACEPARENT},
    ),
    ("mf_agent_a", "run", {"scope": {"visibility": "tenant"}}),
    ("mf_agent_a", "run", {"scope": {"visibility": ["tenant", "subject"]}, "tiers": ["episodic"]}),
    ("mf_agent_a", "run", {"scope": {"tenant_id": "acme", "subject_id": "user-8842"}}),
    ("mf_agent_a", "run", {"filters": {"min_confidence": 0.5}}),
    ("mf_agent_a", "run", {"filters": {"compliance_labels_excluded": ["pci"]}, "limit": 2}),
    ("mf_agent_a", "run", {"requesting_agent": "com-agt-003"}),
    ("mf_agent_a", "no_session", {"tiers": ["episodic"]}),
    ("mf_agent_a", "no_subject", {"tiers": ["episodic"]}),
    ("mf_agent_r", "other_agent", {"tiers": ["semantic"]}),
    # denied, answered: another tenant, another subject, another agent, a tier outside the
    # profile (with and without allow_partial), no readable tier, a tool outside the run
    ("mf_agent_a", "run", {"scope": {"tenant_id": "globex"}}),
    ("mf_agent_a", "run", {"scope": {"subject_id": "user-1"}}),
    ("mf_agent_a", "run", {"requesting_agent": "com-agt-004"}),
    ("mf_agent_a", "run", {"scope": {"visibility": "session", "session_id": "other"}}),
    ("mf_agent_r", "other_agent", {"tiers": ["semantic", "episodic"]}),
    ("mf_agent_r", "other_agent", {"tiers": ["semantic", "episodic"], "allow_partial": True}),
    ("mf_agent_r", "other_agent", {"tiers": ["episodic"]}),
    ("mf_agent_a", "no_tool", {}),
    # raised: a malformed request, an unknown limit, another agent's run, no run
    ("mf_agent_a", "run", {"limit": 100000}),
    ("mf_agent_a", "run", {"tiers": ["episodic", "episodic"]}),
    ("mf_agent_a", "run", {"mode": "nonsense"}),
    ("mf_agent_a", "run", {"correlation_id": 7}),
    ("mf_agent_a", "other_agent", {}),
    ("mf_stranger", "run", {}),
]


def test_recall_answers_and_audits_as_before(fabric: Fabric, runs: dict[str, uuid.UUID]) -> None:
    """(One database for every request: the reference functions are DDL, which a rollback
    test's shared backend cannot hold.)"""
    differ, seen = [], set()
    for login, run, extra in REQUESTS:
        request = {"run_id": str(runs[run]), **extra}
        new = outcome(fabric, login, "fabric_api.recall", request)
        old = outcome(fabric, login, "recall_ref.recall", request)
        if new != old:
            differ.append((login, run, extra, new, old))
        answer, events = new
        if isinstance(answer, dict):
            seen.add(answer["status"])
            seen.update({"truncated"} if answer["truncated"] else set())
            seen.update({"text"} if answer["mode_served"] == "text" and answer["records"]
                        and answer["records"][0]["retrieval"] else set())  # fmt: skip
        else:
            seen.add(answer)
            assert events == [], (login, run, extra)  # a raised refusal writes nothing
        seen.update(e["event_type"] for e in events)
    assert differ == []
    # the requests reach every outcome: served, partial, truncated, ranked, denied, raised
    assert seen >= {"served", "partial", "denied", "truncated", "text", "22023", "42501",
                    "memory.recall.served", "memory.recall.denied",
                    "agent.tool.unauthorized"}, seen  # fmt: skip
