"""Propose is idempotent on (tenant_id, agent, provenance.source_event_id, content_hash).

The same request under a taken key answers with the first proposal's id and current status
and writes nothing; another request under the same key is a 23505 error that writes
nothing; two connections proposing at once leave exactly one proposal.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, episode, wait_until_blocked

pytestmark = pytest.mark.rollback


def envelope(**overrides: Any) -> dict[str, Any]:
    """One fixed request: the same source event and content every call."""
    env = episode("asked for invoices in EUR", **overrides)
    env["provenance"] = {**env["provenance"], "source_event_id": "evt-retry-1"}
    return env


def refused(fabric: Fabric, send: Any) -> psycopg.Error:
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        send()
    assert fabric.counts() == before, "a refused proposal wrote a row"
    return info.value


def test_the_same_envelope_twice_is_one_proposal(fabric: Fabric) -> None:
    run = fabric.open_run()
    first = fabric.propose("mf_agent_a", envelope(), run)
    assert first["status"] == "validated" and "replayed" not in first
    before = fabric.counts()
    again = fabric.propose("mf_agent_a", envelope(), run)
    assert again == {
        "proposal_id": first["proposal_id"],
        "status": "validated",
        "reason": None,
        "replayed": True,
    }
    assert fabric.counts() == before, "a replayed proposal wrote a row or an event"


def test_a_retry_in_a_new_run_of_the_same_scope_is_the_same_proposal(fabric: Fabric) -> None:
    first = fabric.propose("mf_agent_a", envelope(), fabric.open_run())
    again = fabric.propose("mf_agent_a", envelope(), fabric.open_run())
    assert again["proposal_id"] == first["proposal_id"] and again["replayed"] is True
    assert fabric.count("proposals") == 1


def test_an_omitted_valid_from_is_the_same_request_at_any_time(fabric: Fabric) -> None:
    run = fabric.open_run()
    env = envelope()
    del env["validity_interval"]
    first = fabric.propose("mf_agent_a", env, run)
    again = fabric.propose("mf_agent_a", env, run)  # a later now(): still the same request
    assert again["proposal_id"] == first["proposal_id"]
    stated = envelope()  # the same instant written out is a different request
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", stated, run))
    assert error.sqlstate == "23505"


def test_a_replay_reports_the_commit_and_its_memory_id(fabric: Fabric) -> None:
    run = fabric.open_run()
    first = fabric.propose("mf_agent_a", envelope(), run)
    record = fabric.commit(first["proposal_id"])
    before = fabric.counts()
    again = fabric.propose("mf_agent_a", envelope(), run)
    assert again == {
        "proposal_id": first["proposal_id"],
        "status": "committed",
        "reason": None,
        "replayed": True,
        "memory_id": record["memory_id"],
    }
    assert fabric.counts() == before


def test_a_replay_reports_the_rejection(fabric: Fabric) -> None:
    run = fabric.open_run()
    env = envelope(tier="relational")
    first = fabric.propose("mf_agent_a", env, run)
    assert first["status"] == "rejected"
    before = fabric.counts()
    again = fabric.propose("mf_agent_a", env, run)
    assert again["proposal_id"] == first["proposal_id"]
    assert (again["status"], again["reason"]) == ("rejected", first["reason"])
    assert fabric.counts() == before


def test_a_corrected_envelope_takes_over_the_key_of_a_rejection(fabric: Fabric) -> None:
    """A rejected proposal gives its key up to another request under it (a corrected
    envelope), which is filed anew; the rejection keeps its row without the key, a retry of
    the correction replays it, and the rejected request under the key is now refused."""
    run = fabric.open_run()
    first = fabric.propose("mf_agent_a", envelope(tier="relational"), run)
    assert first["status"] == "rejected"
    second = fabric.propose("mf_agent_a", envelope(), run)
    assert second["status"] == "validated"
    assert second["proposal_id"] != first["proposal_id"]
    assert "replayed" not in second
    keys = fabric.su().execute(
        "SELECT proposal_id::text, status, request_hash IS NOT NULL FROM fabric.proposals"
    )
    assert sorted(keys.fetchall()) == sorted(
        [(first["proposal_id"], "rejected", False), (second["proposal_id"], "validated", True)]
    )
    # in the order they were filed (fabric.events orders a test's one transaction by call;
    # occurred_at alone ties there)
    events = fabric.events("event_type LIKE 'memory.proposal.%'")
    assert [(e["proposal_id"], e["event_type"]) for e in events] == [
        (first["proposal_id"], "memory.proposal.rejected"),
        (second["proposal_id"], "memory.proposal.validated"),
    ]
    again = fabric.propose("mf_agent_a", envelope(), run)
    assert (again["proposal_id"], again.get("replayed")) == (second["proposal_id"], True)
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", envelope(tier="relational"), run))
    assert error.sqlstate == "23505"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"confidence": 0.8}, id="confidence"),
        pytest.param({"tier": "procedural"}, id="tier"),
        pytest.param({"retention_class": "operational"}, id="retention"),
        pytest.param({"compliance_labels": ["pii"]}, id="labels"),
        pytest.param({"version": "1.0.1"}, id="version"),
        pytest.param(
            {"validity_interval": {"valid_from": "2026-07-03T00:00:00Z", "valid_until": None}},
            id="valid-from",
        ),
    ],
)
def test_another_envelope_under_a_taken_key_is_refused(
    fabric: Fabric, change: dict[str, Any]
) -> None:
    run = fabric.open_run()
    fabric.propose("mf_agent_a", envelope(), run)
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", envelope(**change), run))
    assert error.sqlstate == "23505"
    assert error.diag.message_primary is not None
    assert error.diag.message_primary.startswith("idempotency key reused")
    assert error.diag.message_hint is not None and "source_event_id" in error.diag.message_hint


def test_the_same_request_for_another_subject_is_refused(fabric: Fabric) -> None:
    fabric.propose("mf_agent_a", envelope(), fabric.open_run(subject="user-8842"))
    other = fabric.open_run(subject="user-9999")
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", envelope(), other))
    assert error.sqlstate == "23505"


def test_the_key_is_agent_event_and_content(fabric: Fabric) -> None:
    run = fabric.open_run()
    first = fabric.propose("mf_agent_a", envelope(), run)["proposal_id"]
    other_content = envelope()
    other_content["content"] = {"text": "asked for invoices in USD"}
    other_event = envelope()
    other_event["provenance"]["source_event_id"] = "evt-retry-2"
    ids = {
        first,
        fabric.propose("mf_agent_a", other_content, run)["proposal_id"],
        fabric.propose("mf_agent_a", other_event, run)["proposal_id"],
        fabric.propose("mf_agent_b", envelope(), fabric.open_run(agent_id="com-agt-004"))[
            "proposal_id"
        ],
    }
    assert len(ids) == 4 and fabric.count("proposals") == 4


def test_without_a_source_event_there_is_no_key(fabric: Fabric) -> None:
    run = fabric.open_run()
    env = envelope()
    del env["provenance"]["source_event_id"]
    first = fabric.propose("mf_agent_a", env, run)
    second = fabric.propose("mf_agent_a", env, run)
    assert first["status"] == second["status"] == "rejected"
    assert first["proposal_id"] != second["proposal_id"]


def test_an_erased_record_is_not_formed_again_by_a_replay(fabric: Fabric) -> None:
    run = fabric.open_run()
    first = fabric.propose("mf_agent_a", envelope(), run)
    memory_id = fabric.commit(first["proposal_id"])["memory_id"]
    committer = fabric.connect("mf_committer")
    approval = committer.execute(
        "SELECT fabric_api.request_erasure(%s, 'gdpr')", (memory_id,)
    ).fetchone()[0]["approval_id"]  # type: ignore[index]
    fabric.session("mf_policy").execute(
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval,)
    )
    committer.execute("SELECT fabric_api.erase(%s)", (approval,))
    before = fabric.counts()
    again = fabric.propose("mf_agent_a", envelope(), run)
    assert again["proposal_id"] == first["proposal_id"]
    assert (again["status"], again["memory_id"]) == ("committed", memory_id)
    assert fabric.counts() == before
    with fabric.su() as su:
        kept = su.execute(
            "SELECT content IS NULL, subject_id IS NULL, request_hash IS NOT NULL"
            " FROM fabric.proposals WHERE proposal_id = %s",
            (first["proposal_id"],),
        ).fetchone()
    assert kept == (True, True, True)


@pytest.mark.clone
def test_a_proposal_row_with_a_taken_key_is_refused_by_the_index(fabric: Fabric) -> None:
    """The rule holds below the API: the owner copying a proposal under its key fails."""
    run = fabric.open_run()
    first = fabric.propose("mf_agent_a", envelope(), run)["proposal_id"]
    owner = fabric.owner(actor=None)
    with pytest.raises(psycopg.errors.UniqueViolation) as info:
        owner.execute(
            "INSERT INTO fabric.proposals SELECT (jsonb_populate_record(p, jsonb_build_object("
            "'proposal_id', gen_random_uuid()))).* FROM fabric.proposals p"
            " WHERE proposal_id = %s",
            (first,),
        )
    assert info.value.diag.constraint_name == "proposals_idempotency_key"
    assert fabric.count("proposals") == 1


# --- two connections at once ----------------------------------------------------------------


def _race(fabric: Fabric, first_commits: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    run = fabric.open_run()
    a = fabric.connect("mf_agent_a", autocommit=False)
    b = fabric.connect("mf_agent_a", autocommit=False)
    b_pid = b.info.backend_pid
    first = a.execute("SELECT fabric_api.propose(%s, %s)", (Jsonb(envelope()), run)).fetchone()
    assert first is not None
    outcome: dict[str, Any] = {}

    def second() -> None:
        try:
            row = b.execute("SELECT fabric_api.propose(%s, %s)", (Jsonb(envelope()), run))
            outcome["answer"] = row.fetchone()[0]  # type: ignore[index]
            b.commit()
        except psycopg.Error as exc:  # pragma: no cover - reported by the assertion below
            outcome["error"] = exc.sqlstate

    thread = threading.Thread(target=second)
    thread.start()
    wait_until_blocked(fabric, b_pid)  # B has reached the key and waits for A's outcome
    if first_commits:
        a.commit()
    else:
        a.rollback()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome
    return first[0], outcome["answer"]


@pytest.mark.clone
def test_two_connections_proposing_at_once_form_one_proposal(fabric: Fabric) -> None:
    first, second = _race(fabric, first_commits=True)
    assert second["proposal_id"] == first["proposal_id"]
    assert second["status"] == "validated" and second["replayed"] is True
    assert fabric.count("proposals") == 1
    assert len(fabric.events("event_type = 'memory.proposal.validated'")) == 1


@pytest.mark.clone
def test_when_the_first_rolls_back_the_waiting_twin_files_its_own(fabric: Fabric) -> None:
    first, second = _race(fabric, first_commits=False)
    assert second["proposal_id"] != first["proposal_id"]
    assert second["status"] == "validated" and "replayed" not in second
    assert fabric.count("proposals") == 1
    assert uuid.UUID(second["proposal_id"])
