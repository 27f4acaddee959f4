"""Two committers racing on one proposal: exactly one record, one memory.record.formed."""

from __future__ import annotations

import threading

import psycopg

from conftest import Fabric, episode, wait_until_blocked


def test_two_committers_racing_on_one_proposal_form_exactly_one_record(fabric: Fabric) -> None:
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode(), run)["proposal_id"]
    first = fabric.connect("mf_committer", autocommit=False)
    first.execute("SELECT fabric_api.commit(%s)", (proposal,))  # holds the proposal's row lock
    rival = fabric.session("mf_committer2")  # the connection fabric.commit uses below
    outcome: list[str] = []

    def second() -> None:
        try:
            fabric.commit(proposal, login="mf_committer2")
            outcome.append("committed")
        except psycopg.Error as exc:
            outcome.append(exc.sqlstate or "?")

    thread = threading.Thread(target=second)
    thread.start()
    wait_until_blocked(fabric, rival)
    assert outcome == []  # blocked on the lock, not done
    first.commit()
    thread.join(timeout=30)
    assert outcome == ["55000"]
    assert fabric.count("memory_records") == 1
    assert len(fabric.events("event_type = 'memory.record.formed'")) == 1
    assert fabric.count("proposals", "status = 'committed'") == 1
