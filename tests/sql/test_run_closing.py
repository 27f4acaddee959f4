"""Who closes a run: the orchestrator login that opened it, or an admin (an operator
stopping a run), as for the run's MCP tokens. Another orchestrator's run is refused
(42501) and nothing is written, in its tenant or any other; a close is audited with who
closed it and in which role."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback


def second_orchestrator(fabric: Fabric) -> str:
    """mf_stranger made an orchestrator for this test's transaction (rolled back after)."""
    fabric.su().execute("GRANT fabric_orchestrator TO mf_stranger")
    return "mf_stranger"


def close(fabric: Fabric, login: str, run: uuid.UUID) -> dict[str, Any]:
    row = fabric.connect(login).execute("SELECT fabric_api.close_run(%s)", (run,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def closed_at(fabric: Fabric, run: uuid.UUID) -> Any:
    row = (
        fabric.session(None)
        .execute("SELECT closed_at FROM fabric.runs WHERE run_id = %s", (run,))
        .fetchone()
    )
    assert row is not None
    return row[0]


@pytest.mark.parametrize("tenant", ["acme", "globex"])
def test_another_orchestrators_run_is_refused_and_writes_nothing(
    fabric: Fabric, tenant: str
) -> None:
    agent = "com-agt-003" if tenant == "acme" else "glx-agt-001"
    run = fabric.open_run(agent_id=agent, tenant=tenant)
    other = second_orchestrator(fabric)
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        close(fabric, other, run)
    assert info.value.sqlstate == "42501"
    assert info.value.diag.message_hint
    assert fabric.counts() == before
    assert closed_at(fabric, run) is None
    assert fabric.count("events", "event_type = 'fabric.run.closed'") == 0
    # the run still serves its agent
    assert (
        fabric.propose(
            "mf_agent_a" if tenant == "acme" else "mf_agent_g",
            episode(scope={"tenant_id": tenant, "visibility": "subject"}),
            run,
        )["status"]
        == "validated"
    )


def test_the_opener_closes_its_run_and_the_event_names_it(fabric: Fabric) -> None:
    run = fabric.open_run()
    answer = close(fabric, "mf_orchestrator", run)
    assert answer["closed_at"] is not None
    assert close(fabric, "mf_orchestrator", run) == answer  # idempotent, one event
    (event,) = fabric.events("event_type = 'fabric.run.closed'")
    assert event["run_id"] == str(run)
    assert event["actor_agent_id"] == "mf_orchestrator"
    assert event["payload"] == {
        "agent_id": "com-agt-003",
        "closed_by": "mf_orchestrator",
        "closed_as": "opener",
    }


def test_an_admin_closes_any_run_and_the_event_says_so(fabric: Fabric) -> None:
    run = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    assert close(fabric, "mf_admin", run)["closed_at"] is not None
    assert closed_at(fabric, run) is not None
    (event,) = fabric.events("event_type = 'fabric.run.closed'")
    assert event["tenant_id"] == "globex"
    assert event["payload"]["closed_by"] == "mf_admin"
    assert event["payload"]["closed_as"] == "admin"


@pytest.mark.parametrize("login", ["mf_agent_a", "mf_committer", "mf_stranger"])
def test_no_one_else_closes_a_run(fabric: Fabric, login: str) -> None:
    run = fabric.open_run()
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        close(fabric, login, run)
    assert info.value.sqlstate == "42501"
    assert fabric.counts() == before
    assert closed_at(fabric, run) is None


def test_an_unknown_run_is_not_found(fabric: Fabric) -> None:
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        close(fabric, "mf_orchestrator", uuid.uuid4())
    assert info.value.sqlstate == "P0002"
    assert fabric.counts() == before
