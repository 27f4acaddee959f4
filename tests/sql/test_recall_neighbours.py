"""Recall's neighbour expansion (`"neighbours": {"turns": t, "of": n}`): the turns just before
and after each of the first hits in the same conversation come after the served records,
marked `retrieval.neighbour_of`. They never displace a hit, never widen the scope (every
rule a served record passes), and the audit event names every record served."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback

START = datetime(2026, 7, 2, 9, 0, tzinfo=UTC)
ASKED_AT = "2026-07-03T00:00:00Z"


def turn(
    fabric: Fabric,
    run: uuid.UUID,
    text: str,
    minute: float,
    login: str = "mf_agent_a",
    **overrides: Any,
) -> str:
    """A turn said `minute` minutes after START, valid from then; its memory_id."""
    at = (START + timedelta(minutes=minute)).isoformat()
    envelope = episode(text, validity_interval={"valid_from": at, "valid_until": None})
    envelope.update(overrides)
    return fabric.form(run, envelope=envelope, login=login)


def chat(fabric: Fabric, run: uuid.UUID, n: int, hit: int, start: float = 0) -> list[str]:
    """n turns a minute apart; only the one at `hit` mentions a quokka."""
    return [
        turn(fabric, run, "I saw a quokka at the zoo" if i == hit else f"small talk {i}", start + i)
        for i in range(n)
    ]


def ask(fabric: Fabric, run: uuid.UUID, login: str = "mf_agent_a", **extra: Any) -> dict[str, Any]:
    request = {
        "run_id": str(run),
        "query": "quokka",
        "tiers": ["episodic"],
        "limit": 1,
        "filters": {"valid_at": ASKED_AT},
        **extra,
    }
    return fabric.recall(login, request)


def ids(answer: dict[str, Any]) -> list[str]:
    return [r["memory_id"] for r in answer["records"]]


def last_recall_event(fabric: Fabric) -> dict[str, Any]:
    return fabric.events("event_type = 'memory.recall.served'")[-1]["payload"]  # type: ignore[no-any-return]


def test_the_turns_next_to_a_hit_come_after_the_served_records(fabric: Fabric) -> None:
    run = fabric.open_run()
    t = chat(fabric, run, 7, hit=3)
    plain = ask(fabric, run)
    assert ids(plain) == [t[3]]
    near = ask(fabric, run, neighbours={"turns": 1, "of": 1})
    assert ids(near) == [t[3], t[2], t[4]]
    assert near["records"][0] == plain["records"][0]  # the served record is unchanged
    for r in near["records"][1:]:
        assert r["retrieval"] == {"neighbour_of": t[3]} and r["score"] is None
        assert r["content"]["text"].startswith("small talk")
    assert near["truncated"] == plain["truncated"]
    event = last_recall_event(fabric)
    assert event["memory_ids"] == ids(near)
    assert event["neighbours"] == {"turns": 1, "of": 1, "served": 2}
    assert "neighbours" not in fabric.events("event_type = 'memory.recall.served'")[-2]["payload"]
    wide = ask(fabric, run, neighbours={"turns": 3})  # of: 3 by default, 1 served
    assert ids(wide) == [t[3], t[0], t[1], t[2], t[4], t[5], t[6]]


def test_neighbours_never_displace_a_hit_and_are_never_served_twice(fabric: Fabric) -> None:
    run = fabric.open_run()
    t = [
        turn(fabric, run, text, i)
        for i, text in enumerate(
            [
                "hello",
                "a quokka quokka quokka",
                "a quokka too",
                "bye",
                "later",
                "quokka again",
                "end",
            ]
        )
    ]
    plain = ask(fabric, run, limit=3)
    assert set(ids(plain)) == {t[1], t[2], t[5]}
    near = ask(fabric, run, limit=3, neighbours={"turns": 1, "of": 3})
    served = ids(near)
    assert served[:3] == ids(plain)  # the limit records first, as without the option
    added = served[3:]
    assert sorted(added) == sorted([t[0], t[3], t[4], t[6]])  # none served, none twice
    assert len(set(served)) == len(served)
    by = {r["memory_id"]: r["retrieval"]["neighbour_of"] for r in near["records"][3:]}
    assert by[t[4]] == t[5] and by[t[6]] == t[5]
    assert last_recall_event(fabric)["memory_ids"] == served


def test_of_counts_only_the_first_records_served(fabric: Fabric) -> None:
    run = fabric.open_run()
    t = [
        turn(fabric, run, text, i)
        for i, text in enumerate(["x", "quokka quokka quokka", "y", "z", "w", "a quokka", "v"])
    ]
    near = ask(fabric, run, limit=2, neighbours={"turns": 1, "of": 1})
    assert ids(near) == [t[1], t[5], t[0], t[2]]


def test_a_neighbour_is_within_an_hour_of_its_hit(fabric: Fabric) -> None:
    run = fabric.open_run()
    before = turn(fabric, run, "long ago", -61)
    hit = turn(fabric, run, "a quokka", 0)
    after = turn(fabric, run, "an hour later", 60)
    assert ids(ask(fabric, run, neighbours={"turns": 3})) == [hit, after]
    assert before not in ids(ask(fabric, run, neighbours={"turns": 3}))


@pytest.mark.clone
def test_neighbours_never_widen_the_scope(fabric: Fabric) -> None:
    """Every record that may not be served sits right next to the hit; none is a neighbour:
    the readable turns beyond them are."""
    run = fabric.open_run()
    hit = turn(fabric, run, "I saw a quokka", 0)
    # readable, but further away than every forbidden record below
    first, last = turn(fabric, run, "readable before", -30), turn(fabric, run, "readable after", 30)
    forbidden = {
        "another subject": turn(fabric, fabric.open_run(subject="user-9999"), "other subject", 1),
        "another session": turn(fabric, fabric.open_run(session="sess-2a7e"), "other session", -1),
        "another tenant": turn(
            fabric,
            fabric.open_run("glx-agt-001", tenant="globex"),
            "globex turn",
            2,
            login="mf_agent_g",
            scope={"tenant_id": "globex", "visibility": "subject"},
        ),
        "tenant visibility": turn(
            fabric, run, "tenant wide", -2, scope={"tenant_id": "acme", "visibility": "tenant"}
        ),
        "agent visibility": turn(
            fabric, run, "my private note", 3, scope={"tenant_id": "acme", "visibility": "agent"}
        ),
        "another tier": fabric.form(
            run,
            envelope=episode(
                "a fact",
                tier="semantic",
                content={"assertion": "a fact"},
                derived_from=[hit],
                validity_interval={
                    "valid_from": (START + timedelta(minutes=4)).isoformat(),
                    "valid_until": None,
                },
            ),
        ),
        "superseded": turn(fabric, run, "will be superseded", -3),
        "tombstoned": turn(fabric, run, "will be erased", 5),
        "expired": turn(fabric, run, "window closes", -4, retention_class="operational"),
        "no longer valid": fabric.form(
            run,
            envelope=episode(
                "valid for a minute",
                validity_interval={
                    "valid_from": (START + timedelta(minutes=6)).isoformat(),
                    "valid_until": (START + timedelta(minutes=7)).isoformat(),
                },
            ),
        ),
        "excluded label": turn(fabric, run, "labelled", -5, compliance_labels=["pii"]),
        "low confidence": turn(fabric, run, "unsure", 7, confidence=0.2),
    }
    with fabric.owner() as conn:
        conn.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'superseded', "
            "valid_until = valid_from + interval '1 second' WHERE memory_id = %s",
            (forbidden["superseded"],),
        )
        conn.execute("SELECT set_config('fabric.approval_id', %s, false)", (str(uuid.uuid4()),))
        conn.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'tombstoned', "
            "content = NULL, subject_id = NULL, session_id = NULL, agent_id = NULL, "
            "erased_at = now(), erasure_approval_id = current_setting('fabric.approval_id')::uuid"
            " WHERE memory_id = %s",
            (forbidden["tombstoned"],),
        )
        conn.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'expired', "
            "content = NULL, valid_until = valid_from + interval '1 second' WHERE memory_id = %s",
            (forbidden["expired"],),
        )
    # labels and confidence as filters
    valid_at = ASKED_AT
    request = {
        "run_id": str(run),
        "query": "quokka",
        "tiers": ["episodic"],
        "limit": 1,
        "scope": {"visibility": "subject"},
        "neighbours": {"turns": 1, "of": 1},
        "filters": {
            "valid_at": valid_at,
            "min_confidence": 0.5,
            "compliance_labels_excluded": ["pii"],
        },
    }
    answer = fabric.recall("mf_agent_a", request)
    assert ids(answer) == [hit, first, last]
    assert not set(ids(answer)) & set(forbidden.values())
    assert last_recall_event(fabric)["memory_ids"] == ids(answer)


def test_refusals_name_the_rule_and_write_nothing(fabric: Fabric) -> None:
    run = fabric.open_run()
    turn(fabric, run, "a quokka", 0)
    before = fabric.counts()
    base = {"run_id": str(run), "query": "quokka"}
    for bad, rule in [
        ({"neighbours": {"turns": 0}}, "neighbours must be"),
        ({"neighbours": {"turns": 4}}, "neighbours must be"),
        ({"neighbours": {"turns": "1"}}, "neighbours must be"),
        ({"neighbours": {"of": 0}}, "neighbours must be"),
        ({"neighbours": {"of": 11}}, "neighbours must be"),
        ({"neighbours": {"of": 2.5}}, "neighbours must be"),
        ({"neighbours": {"of": None}}, "neighbours must be"),
        ({"neighbours": {"hops": 1}}, "neighbours must be"),
        ({"neighbours": 1}, "neighbours must be"),
        ({"neighbours": {}, "query": "  "}, "neighbours need a query"),
        ({"neighbours": {}, "query": None}, "neighbours need a query"),
        (
            {"neighbours": {}, "query": None, "filters": {"memory_ids": [str(uuid.uuid4())]}},
            "neighbours need a query",
        ),
    ]:
        with pytest.raises(psycopg.Error) as caught:
            fabric.recall("mf_agent_a", {**base, **bad})
        assert caught.value.sqlstate == "22023", bad
        assert rule in str(caught.value), (bad, str(caught.value))
    assert fabric.counts() == before


def test_hybrid_and_semantic_recall_expand_their_hits(fabric: Fabric) -> None:
    """The second call of semantic and hybrid recall (the broker's candidates) expands the
    fused or vector list as text recall expands its own; graph recall its walk's list."""
    run = fabric.open_run()
    t = chat(fabric, run, 5, hit=2)
    for mode, found in (("semantic", "candidates"), ("hybrid", "candidates"),
                        ("graph", "graph_candidates")):  # fmt: skip
        answer = ask(
            fabric,
            run,
            mode=mode,
            neighbours={"turns": 1, "of": 1},
            **{found: [{"memory_id": t[2], "score": 0.9}]},
        )
        assert answer["mode_served"] == mode
        assert ids(answer) == [t[2], t[1], t[3]]
        assert [r["retrieval"] for r in answer["records"][1:]] == [{"neighbour_of": t[2]}] * 2
        assert last_recall_event(fabric)["memory_ids"] == ids(answer)
