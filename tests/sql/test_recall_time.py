"""Time-aware recall (memfabric.recall's `temporal`): a question that names a past time is
narrowed to the records valid then, through a filter the database enforces; it never
widens what the run may read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from conftest import Fabric, episode
from memfabric.recall import recall, time_filtered

pytestmark = pytest.mark.rollback

NOW = datetime(2024, 11, 20, 18, 0, tzinfo=UTC)


def said(fabric: Fabric, run: Any, text: str, when: str, login: str = "mf_agent_a") -> str:
    envelope = episode(text, validity_interval={"valid_from": when, "valid_until": None})
    return fabric.form(run, envelope=envelope, login=login)


def ask(
    fabric: Fabric, run: Any, query: str, temporal: bool = False, limit: int = 10
) -> dict[str, Any]:
    conn = fabric.connect("mf_agent_a")
    request = {"run_id": str(run), "mode": "text", "tiers": ["episodic"], "query": query}
    return recall(conn, {**request, "limit": limit}, now=NOW, temporal=temporal)


def ids(answer: dict[str, Any]) -> list[str]:
    return [r["memory_id"] for r in answer["records"]]


def test_a_question_naming_a_month_drops_what_was_said_after_it(fabric: Fabric) -> None:
    run = fabric.open_run()
    march = said(fabric, run, "I work as a nurse at Pinewood Clinic", "2024-03-04T19:00:00Z")
    july = said(fabric, run, "I work as a barista at Lumen Studio now", "2024-07-09T19:00:00Z")
    question = "What did I say about work in March 2024?"
    plain = ask(fabric, run, question)
    assert set(ids(plain)) == {march, july}
    timed = ask(fabric, run, question, temporal=True)
    assert ids(timed) == [march]
    assert timed["time_filter"] == {
        "said": "March 2024",
        "since": "2024-03-01T00:00:00+00:00",
        "until": "2024-04-01T00:00:00+00:00",
        "valid_at": "2024-03-31T23:59:59.999999+00:00",
    }
    assert "time_filter" not in plain


def test_the_time_filter_never_widens_the_scope(fabric: Fabric) -> None:
    """Another subject's record said in the window stays out: the window only narrows what
    the run may read."""
    mine = fabric.open_run()
    theirs = fabric.open_run(subject="user-9999")
    own = said(fabric, mine, "moved into a flat in Porto", "2024-05-03T10:00:00Z")
    other = said(fabric, theirs, "moved into a flat in Porto too", "2024-05-04T10:00:00Z")
    readable = set(ids(ask(fabric, mine, "flat in Porto", limit=50)))
    timed = ask(fabric, mine, "Where was the flat in May 2024? Porto?", temporal=True, limit=50)
    assert timed["status"] == "served" and "time_filter" in timed
    assert ids(timed) == [own]
    assert set(ids(timed)) <= readable and other not in readable


def test_a_request_with_its_own_valid_at_or_no_past_time_is_left_as_it_is() -> None:
    base = {"run_id": "x", "query": "What did Tom say in May 2024?"}
    own = {**base, "filters": {"valid_at": "2024-01-01T00:00:00Z"}}
    assert time_filtered(own, NOW) == (own, None)
    for query in ("What's Tom's job?", "What will Tom do this year?", "in May 2025"):
        request = {**base, "query": query}
        assert time_filtered(request, NOW) == (request, None)
    by_id = {"run_id": "x", "query": "May 2024", "filters": {"memory_ids": ["a"]}}
    assert time_filtered(by_id, NOW) == (by_id, None)
    narrowed, read = time_filtered({**base, "filters": {"min_confidence": 0.5}}, NOW)
    assert read is not None
    assert narrowed["filters"] == {"min_confidence": 0.5, "valid_at": read["valid_at"]}


def test_without_temporal_recall_reads_no_time(fabric: Fabric) -> None:
    run = fabric.open_run()
    later = said(fabric, run, "I work as a barista at Lumen Studio", "2024-07-09T19:00:00Z")
    assert ids(ask(fabric, run, "work in March 2024")) == [later]
