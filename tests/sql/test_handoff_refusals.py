"""fabric_api.handoff enters as propose does (fabric._propose_entry): a committer is refused,
a run that is not the caller's, unknown, closed or expired is refused, each refusal an
error (42501) that writes nothing; without tool:memory-propose every item that is not a
replay is answered `denied`, with one agent.tool.unauthorized event per denied item.

Called in SQL, without a working tier: the hand-off's items are plain JSON here.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, call

pytestmark = pytest.mark.rollback

HANDOFF = "SELECT fabric_api.handoff(%s, %s)"
UNAUTHORIZED = "event_type = 'agent.tool.unauthorized'"
COMMITTER = "os-agt-010"  # the agent of the mf_committer login


def item(n: int) -> dict[str, Any]:
    return {
        "event_id": f"evt-item-{n}",
        "correlation_id": "corr-5e1b",
        "content": {"text": f"asked for invoices in EUR ({n})"},
    }


def handoff(conn: psycopg.Connection[Any], items: list[Any], run: uuid.UUID) -> list[Any]:
    row = conn.execute(HANDOFF, (Jsonb(items), run)).fetchone()
    assert row is not None
    answers: list[Any] = row[0]
    return answers


def refused(fabric: Fabric, login: str, items: list[Any], run: uuid.UUID) -> psycopg.Error:
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as caught:
        handoff(fabric.connect(login), items, run)
    assert fabric.counts() == before, "a refused hand-off wrote a row"
    return caught.value


def test_a_handoff_without_the_propose_tool_denies_each_new_item_with_one_event(
    fabric: Fabric,
) -> None:
    agent = fabric.connect("mf_agent_a")
    (first,) = handoff(agent, [item(1)], fabric.open_run())
    assert first["status"] == "validated"
    assert fabric.count("events", UNAUTHORIZED) == 0

    denied_run = fabric.open_run(tools=["tool:memory-recall"])
    answers = handoff(agent, [item(1), item(2), item(3)], denied_run)
    # item 1 was handed off already: its replay is no proposal, so nothing to deny
    assert answers[0] == {**first, "replayed": True, "event_id": "evt-item-1"}
    assert [a["status"] for a in answers[1:]] == ["denied", "denied"]
    assert answers[1]["proposal_id"] is None
    assert answers[1]["reason"].startswith("tool:memory-propose is not authorized")
    assert [a["event_id"] for a in answers[1:]] == ["evt-item-2", "evt-item-3"]
    assert fabric.count("proposals") == 1
    events = fabric.events(UNAUTHORIZED)
    assert len(events) == 2
    assert {e["run_id"] for e in events} == {str(denied_run)}
    assert {e["payload"]["tool"] for e in events} == {"tool:memory-propose"}


@pytest.mark.parametrize("run_of", ["its own", "an agent's"])
@pytest.mark.parametrize("items", [[item(1)], ["not an item"]], ids=["item", "malformed"])
def test_a_committer_cannot_hand_off(fabric: Fabric, run_of: str, items: list[Any]) -> None:
    """Even in a run of its own, and before its items are read (as in propose_many)."""
    run = fabric.open_run(agent_id=COMMITTER if run_of == "its own" else "com-agt-003")
    err = refused(fabric, "mf_committer", items, run)
    assert err.sqlstate == "42501"
    assert err.diag.message_primary is not None
    assert err.diag.message_primary.startswith("committers cannot propose")


def test_an_agent_cannot_hand_off_into_an_unknown_run(fabric: Fabric) -> None:
    err = refused(fabric, "mf_agent_a", [item(1)], uuid.uuid4())
    assert err.sqlstate == "42501"
    assert err.diag.message_primary == "no run of the calling agent has this run_id"


def test_an_agent_cannot_hand_off_into_a_closed_run(fabric: Fabric) -> None:
    run = fabric.open_run()
    call(fabric.connect("mf_orchestrator"), "fabric_api.close_run", run)
    err = refused(fabric, "mf_agent_a", [item(1)], run)
    assert err.sqlstate == "42501"
    assert err.diag.message_primary == "the run is closed or expired"


def test_a_refused_handoff_item_fails_the_whole_batch(fabric: Fabric) -> None:
    """An item propose would refuse with an error (a time that is no time) aborts the call:
    the earlier item is not filed either."""
    run = fabric.open_run()
    err = refused(fabric, "mf_agent_a", [item(1), {**item(2), "occurred_at": "noon"}], run)
    assert err.sqlstate is not None and err.sqlstate.startswith("22")
