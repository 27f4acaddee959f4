"""The record triggers that write per statement: one statement forming or changing many
records still gives each record its own event and history row, with the record's own ids,
in the statement's transaction; rows the statement leaves unchanged get none; and a
statement without an acting agent writes nothing at all.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric

ACTOR = "os-agt-010"
CORRELATION, CAUSATION = "corr-9d4a", "evt-7b1f"  # conftest.episode()'s provenance


def committed(fabric: Fabric, n: int) -> list[str]:
    """n records proposed through one run and committed through the API."""
    run = fabric.open_run()
    return [fabric.form(run, f"asked for invoices #{i}") for i in range(n)]


def in_tx(conn: psycopg.Connection[Any], query: str) -> list[Any]:
    """Rows of this transaction's events or history (by its xid or its time)."""
    return [r[0] for r in conn.execute(query).fetchall()]


TX_EVENTS = (
    "SELECT to_jsonb(e) FROM fabric.events e WHERE e.xid = pg_current_xact_id()"
    " ORDER BY e.memory_id"
)
TX_HISTORY = (
    "SELECT to_jsonb(v) FROM fabric.memory_record_versions v"
    " WHERE upper(v.known_during) = now() ORDER BY v.memory_id"
)


def test_one_update_of_many_records_keeps_each_ones_history_and_event(fabric: Fabric) -> None:
    ids = committed(fabric, 3)
    counts = fabric.counts()
    conn = fabric.owner(autocommit=False)
    conn.execute(
        "UPDATE fabric.memory_records SET consolidation_state = 'consolidated'"
        " WHERE memory_id = ANY (%s::uuid[])",
        (ids,),
    )
    events = in_tx(conn, TX_EVENTS)
    assert sorted(e["memory_id"] for e in events) == sorted(ids)
    for e in events:
        assert e["event_type"] == "memory.record.consolidated"
        assert (e["correlation_id"], e["causation_id"]) == (CORRELATION, CAUSATION)
        assert e["actor_agent_id"] == ACTOR
        assert (e["payload"]["from_state"], e["payload"]["to_state"]) == ("raw", "consolidated")
    history = in_tx(conn, TX_HISTORY)
    assert sorted(v["memory_id"] for v in history) == sorted(ids)
    assert {(v["revision"], v["consolidation_state"], v["ended_by"]) for v in history} == {
        (1, "raw", ACTOR)
    }
    conn.rollback()
    assert fabric.counts() == counts


def test_rows_a_statement_leaves_unchanged_get_no_history_or_event(fabric: Fabric) -> None:
    ids = committed(fabric, 3)
    conn = fabric.owner(autocommit=False)
    conn.execute(
        "UPDATE fabric.memory_records SET consolidation_state = CASE WHEN memory_id = %s::uuid"
        " THEN 'expired' ELSE consolidation_state END, valid_until = CASE WHEN memory_id ="
        " %s::uuid THEN now() ELSE valid_until END WHERE memory_id = ANY (%s::uuid[])",
        (ids[1], ids[1], ids),
    )
    assert [(e["memory_id"], e["event_type"]) for e in in_tx(conn, TX_EVENTS)] == [
        (ids[1], "memory.record.expired")
    ]
    assert [(v["memory_id"], v["revision"]) for v in in_tx(conn, TX_HISTORY)] == [(ids[1], 1)]
    conn.rollback()


def test_one_statement_without_an_acting_agent_writes_nothing(fabric: Fabric) -> None:
    ids = committed(fabric, 3)
    counts = fabric.counts()
    conn = fabric.owner(actor=None, autocommit=False)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'consolidated'"
            " WHERE memory_id = ANY (%s::uuid[])",
            (ids,),
        )
    assert info.value.sqlstate == "MF004"
    conn.rollback()
    assert fabric.counts() == counts


def test_one_insert_of_many_records_emits_each_formation(fabric: Fabric) -> None:
    elements = [
        {
            "scope": {
                "subject_id": "user-8842",
                "agent_id": "com-agt-003",
                "visibility": "subject",
            },
            "content": {"text": f"imported turn {i} {uuid.uuid4().hex}"},
            "provenance": {"correlation_id": f"corr-{i}", "causation_id": f"cause-{i}"},
            "confidence": 0.8,
        }
        for i in range(4)
    ]
    conn = fabric.connect("mf_committer")
    result = conn.execute(
        "SELECT fabric_api.import_records('acme', %s, %s)",
        (f"imp-{uuid.uuid4().hex[:12]}", Jsonb(elements)),
    ).fetchone()
    assert result is not None and result[0]["formed"] == 4, result
    with psycopg.connect(fabric.url, autocommit=True) as su:
        rows = su.execute(
            "SELECT to_jsonb(m), to_jsonb(e) FROM fabric.memory_records m"
            " JOIN fabric.events e ON e.memory_id = m.memory_id"
            " WHERE m.source_event_id = %s",
            (str(result[0]["event_id"]),),
        ).fetchall()
        formed = su.execute(
            "SELECT count(*) FROM fabric.events e JOIN fabric.memory_records m"
            " ON m.memory_id = e.memory_id WHERE m.source_event_id = %s",
            (str(result[0]["event_id"]),),
        ).fetchone()
    assert formed == (4,)
    assert len(rows) == 4
    for record, event in rows:
        assert event["event_type"] == "memory.record.formed"
        assert (event["correlation_id"], event["causation_id"]) == (
            record["correlation_id"],
            record["causation_id"],
        )
        assert event["actor_agent_id"] == record["formed_by"]
        assert event["payload"] == {
            "tier": "episodic",
            "visibility": "subject",
            "state": "raw",
            "formation_method": "import",
            "content_hash": record["content_hash"],
            "retention_class": "durable",
        }
        assert event["xid"] == rows[0][1]["xid"]


def test_one_statement_of_different_transitions_emits_each_records_own_events(
    fabric: Fabric,
) -> None:
    """The events one UPDATE derives, per record and in order: a state change (with its
    payload: states, the shortened validity, content removed or not), the closing of an
    already expired record's window (same state, content removed), nothing for an unchanged
    row -- each record's own, in one statement."""
    run = fabric.open_run()
    kept = fabric.form(run, "asked for invoices #1")
    reflected = fabric.form(run, "asked for invoices #2")
    closed = fabric.form(run, "asked for invoices #3", retention_class="operational")
    window = fabric.form(run, "asked for invoices #4", retention_class="operational")
    conn = fabric.owner()
    conn.execute(
        "UPDATE fabric.memory_records SET consolidation_state = 'expired',"
        " valid_until = timestamptz '2026-08-01T00:00:00Z' WHERE memory_id = %s",
        (window,),
    )
    counts = fabric.counts()
    conn.execute(
        "UPDATE fabric.memory_records SET"
        " consolidation_state = CASE WHEN memory_id = %(r)s THEN 'reflected'"
        "   WHEN memory_id = %(c)s THEN 'expired' ELSE consolidation_state END,"
        " valid_until = CASE WHEN memory_id = %(c)s THEN timestamptz '2026-08-01T00:00:00Z'"
        "   ELSE valid_until END,"
        " content = CASE WHEN memory_id IN (%(c)s, %(w)s) THEN NULL ELSE content END"
        " WHERE memory_id IN (%(k)s, %(r)s, %(c)s, %(w)s)",
        {"k": kept, "r": reflected, "c": closed, "w": window},
    )
    after = fabric.counts()
    assert after["events"] == counts["events"] + 3
    events = {
        e["memory_id"]: (e["event_type"], e["payload"], e["correlation_id"], e["actor_agent_id"])
        for e in fabric.events(f"memory_id IN ('{reflected}', '{closed}', '{window}')")
        if e["event_type"] != "memory.record.formed"
        and not (e["memory_id"] == window and e["payload"].get("content_removed") is False)
    }
    own = (CORRELATION, ACTOR)
    assert events == {
        reflected: (
            "memory.reflection.completed",
            {
                "tier": "episodic",
                "from_state": "raw",
                "to_state": "reflected",
                "content_removed": False,
            },
            *own,
        ),
        closed: (
            "memory.record.expired",
            {
                "tier": "episodic",
                "from_state": "raw",
                "to_state": "expired",
                "valid_until": "2026-08-01T00:00:00+00:00",
                "content_removed": True,
            },
            *own,
        ),
        window: (
            "memory.record.expired",
            {
                "tier": "episodic",
                "from_state": "expired",
                "to_state": "expired",
                "content_removed": True,
            },
            *own,
        ),
    }
    assert fabric.count("events", f"memory_id = '{kept}'") == 1  # its formation only
