"""Immutability of committed memory (R-REC-1, R-LINEAGE-1): content, scope and provenance never
change after commit, with exactly two carve-outs (erasure, operational window closure); the
outbox, the record history and the lineage are append-only, even for the owner.

Every attack runs as the owner (superuser, SET ROLE fabric_owner) with a full governance
context, so the only thing standing in the way is the rule under test.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric

pytestmark = pytest.mark.rollback

ACTOR = "os-agt-010"
# (column, SQL expression giving a different value) for every immutable envelope column.
IMMUTABLE = [
    ("content", '\'{"text": "rewritten"}\'::jsonb'),
    ("content_hash", "'sha256:' || repeat('0', 64)"),
    ("search_tsv", "to_tsvector('simple', 'forged')"),
    ("search_length", "search_length + 1"),
    ("tenant_id", "'globex'"),
    ("memory_id", "gen_random_uuid()"),
    ("visibility", "'tenant'"),
    ("subject_id", "'user-9999'"),
    ("session_id", "'sess-other'"),
    ("agent_id", "'com-agt-004'"),
    ("business_instance_id", "'instance-2'"),
    ("source_event_id", "'evt-forged'"),
    ("correlation_id", "'corr-forged'"),
    ("causation_id", "'evt-forged'"),
    ("formed_by", "'os-agt-011'"),
    ("formation_method", "'declaration'"),
    ("confidence", "0.1"),
    ("valid_from", "valid_from - interval '1 day'"),
    ("recorded_at", "recorded_at - interval '1 day'"),
    ("supersedes", "memory_id"),
    ("retention_class", "'operational'"),
    ("compliance_labels", "ARRAY['pii']"),
    ("version", "'2.0.0'"),
    ("proposal_id", "NULL"),
    ("run_id", "gen_random_uuid()"),
    ("revision", "revision + 1"),
    ("known_since", "known_since - interval '1 day'"),
    ("erased_at", "now()"),
    ("erasure_approval_id", "gen_random_uuid()"),
]
# Columns that change only along R-LIFE-1 (tested in test_lifecycle_and_history.py),
# and the generated columns (scope_key from visibility and its id, assertion_key from
# content.key), which follow the columns they derive from.
LIFECYCLE = {"tier", "consolidation_state", "valid_until"}
DERIVED = {"scope_key", "assertion_key"}


# --- helpers ----------------------------------------------------------------------------


def refused(conn: psycopg.Connection[Any], query: Any, params: Any, sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == sqlstate, info.value


def erase_sql() -> str:
    return (
        "UPDATE fabric.memory_records SET content = NULL, subject_id = NULL, session_id = NULL,"
        " agent_id = NULL, consolidation_state = 'tombstoned', erased_at = now(),"
        " erasure_approval_id = %s WHERE memory_id = %s"
    )


# --- the envelope ------------------------------------------------------------------------


@pytest.mark.parametrize(("column", "value"), IMMUTABLE, ids=[c for c, _ in IMMUTABLE])
@pytest.mark.clone  # its SQL reads now() (one value in a transaction)
def test_committed_envelope_column_never_changes(fabric: Fabric, column: str, value: str) -> None:
    memory_id = fabric.form()
    before, counts = fabric.record(memory_id), fabric.counts()
    query = sql.SQL("UPDATE fabric.memory_records SET {} = {} WHERE memory_id = %s").format(
        sql.Identifier(column),
        sql.SQL(value),  # type: ignore[arg-type]
    )
    refused(fabric.owner(), query, (memory_id,), "MF001")
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


def test_content_is_not_removed_outside_an_ending_transition(fabric: Fabric) -> None:
    memory_id = fabric.form()
    before, counts = fabric.record(memory_id), fabric.counts()
    refused(
        fabric.owner(),
        "UPDATE fabric.memory_records SET content = NULL WHERE memory_id = %s",
        (memory_id,),
        "MF001",
    )
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


def test_every_record_column_is_immutable_or_lifecycle_governed(fabric: Fabric) -> None:
    """A column added later must be placed under a rule (and into IMMUTABLE above)."""
    with fabric.su() as c:
        columns = {
            r[0]
            for r in c.execute(
                "SELECT attname FROM pg_attribute"
                " WHERE attrelid = 'fabric.memory_records'::regclass"
                " AND attnum > 0 AND NOT attisdropped"
            )
        }
    assert columns == {c for c, _ in IMMUTABLE} | LIFECYCLE | DERIVED


def test_records_are_never_deleted(fabric: Fabric) -> None:
    memory_id = fabric.form()
    counts = fabric.counts()
    refused(
        fabric.owner(),
        "DELETE FROM fabric.memory_records WHERE memory_id = %s",
        (memory_id,),
        "MF001",
    )
    assert fabric.counts() == counts


def test_records_are_never_truncated(fabric: Fabric) -> None:
    fabric.form()
    counts = fabric.counts()
    # Plain TRUNCATE already fails on the foreign keys; CASCADE reaches the trigger.
    refused(fabric.owner(), "TRUNCATE fabric.memory_records CASCADE", None, "MF001")
    assert fabric.counts() == counts


# --- carve-out 1: erasure ---------------------------------------------------------------


def semantic_with_lineage(fabric: Fabric, canary: str = "semantic fact") -> tuple[str, str]:
    """(episode id, semantic id derived from it)."""
    episode_id = fabric.form()
    semantic_id = fabric.form(
        text=canary,
        tier="semantic",
        derived_from=[episode_id],
        scope={"tenant_id": "acme", "visibility": "subject"},
    )
    return episode_id, semantic_id


@pytest.mark.clone  # sets the approval context with set_config
def test_erasure_under_approval_leaves_a_tombstone(fabric: Fabric) -> None:
    episode_id, memory_id = semantic_with_lineage(fabric)
    before = fabric.record(memory_id)
    assert before["scope_key"] == "subject:user-8842"
    approval = uuid.uuid4()
    conn = fabric.owner()
    conn.execute("SELECT set_config('fabric.approval_id', %s, false)", (str(approval),))
    conn.execute(erase_sql(), (approval, memory_id))

    after = fabric.record(memory_id)
    assert after["consolidation_state"] == "tombstoned"
    assert after["content"] is None
    assert (after["subject_id"], after["session_id"], after["agent_id"]) == (None, None, None)
    assert after["scope_key"] is None
    assert after["search_tsv"] is None
    assert after["erased_at"] is not None
    assert after["erasure_approval_id"] == str(approval)
    # The tombstone keeps exactly what R-ERASE-1 keeps: hash, provenance, lineage, validity.
    for kept in (
        "content_hash",
        "source_event_id",
        "correlation_id",
        "causation_id",
        "formed_by",
        "formation_method",
        "tier",
        "tenant_id",
        "valid_from",
        "valid_until",
        "recorded_at",
    ):
        assert after[kept] == before[kept], kept
    assert fabric.count("memory_lineage", f"memory_id = '{memory_id}'") == 1
    assert fabric.count("memory_lineage", f"derived_from_id = '{episode_id}'") == 1
    forgotten = fabric.events(
        f"memory_id = '{memory_id}' AND event_type = 'memory.record.forgotten'"
    )
    assert len(forgotten) == 1
    assert forgotten[0]["payload"]["approval_id"] == str(approval)


@pytest.mark.clone  # sets the approval context with set_config
def test_erasure_without_the_approval_context_is_refused(fabric: Fabric) -> None:
    memory_id = fabric.form()
    before, counts = fabric.record(memory_id), fabric.counts()
    refused(fabric.owner(), erase_sql(), (uuid.uuid4(), memory_id), "MF002")
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


@pytest.mark.clone  # sets the approval context with set_config
def test_erasure_names_the_approval_in_force(fabric: Fabric) -> None:
    memory_id = fabric.form()
    before, counts = fabric.record(memory_id), fabric.counts()
    conn = fabric.owner()
    conn.execute("SELECT set_config('fabric.approval_id', %s, false)", (str(uuid.uuid4()),))
    refused(conn, erase_sql(), (uuid.uuid4(), memory_id), "MF002")
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


@pytest.mark.clone  # its SQL reads now() (one value in a transaction)
def test_erasure_destroys_the_scope_ids(fabric: Fabric) -> None:
    memory_id = fabric.form()
    before, counts = fabric.record(memory_id), fabric.counts()
    approval = uuid.uuid4()
    conn = fabric.owner()
    conn.execute("SELECT set_config('fabric.approval_id', %s, false)", (str(approval),))
    refused(
        conn,
        "UPDATE fabric.memory_records SET content = NULL, consolidation_state = 'tombstoned',"
        " erased_at = now(), erasure_approval_id = %s WHERE memory_id = %s",
        (approval, memory_id),
        "MF002",
    )
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


# --- carve-out 2: operational window closure ----------------------------------------------


def close_window_sql() -> str:
    return (
        "UPDATE fabric.memory_records SET content = NULL, consolidation_state = 'expired',"
        " valid_until = timestamptz '2026-08-01T00:00:00Z' WHERE memory_id = %s"
    )


def test_operational_window_closure_removes_content(fabric: Fabric) -> None:
    memory_id = fabric.form(retention_class="operational")
    before = fabric.record(memory_id)
    fabric.owner().execute(close_window_sql(), (memory_id,))
    after = fabric.record(memory_id)
    assert after["content"] is None
    assert after["search_tsv"] is None
    assert after["consolidation_state"] == "expired"
    assert after["valid_until"].startswith("2026-08-01T00:00:00")
    assert after["content_hash"] == before["content_hash"]
    assert after["subject_id"] == before["subject_id"]
    expired = fabric.events(f"memory_id = '{memory_id}' AND event_type = 'memory.record.expired'")
    assert len(expired) == 1
    assert expired[0]["payload"]["content_removed"] is True


def test_window_closure_is_only_for_operational_records(fabric: Fabric) -> None:
    memory_id = fabric.form(retention_class="durable")
    before, counts = fabric.record(memory_id), fabric.counts()
    refused(fabric.owner(), close_window_sql(), (memory_id,), "MF001")
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


def test_content_removal_needs_an_ending_transition(fabric: Fabric) -> None:
    memory_id = fabric.form(retention_class="operational")
    before, counts = fabric.record(memory_id), fabric.counts()
    refused(
        fabric.owner(),
        "UPDATE fabric.memory_records SET content = NULL, consolidation_state = 'superseded'"
        " WHERE memory_id = %s",
        (memory_id,),
        "MF001",
    )
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


# --- append-only tables -------------------------------------------------------------------


def current_partition(fabric: Fabric) -> str:
    with fabric.su() as c:
        row = c.execute(
            "SELECT tableoid::regclass::text FROM fabric.events ORDER BY occurred_at DESC LIMIT 1"
        ).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {} SET payload = '{{}}'",
        "UPDATE {} SET occurred_at = occurred_at - interval '1 year'",
        "DELETE FROM {}",
        "TRUNCATE {}",
    ],
    ids=["update", "update-moving-partition", "delete", "truncate"],
)
@pytest.mark.parametrize("target", ["parent", "partition"])
def test_events_are_append_only_even_for_the_owner(
    fabric: Fabric, statement: str, target: str
) -> None:
    fabric.form()
    table = "fabric.events" if target == "parent" else current_partition(fabric)
    before = fabric.events()
    assert before
    refused(fabric.owner(), statement.format(table), None, "MF003")
    assert fabric.events() == before


def transitioned(fabric: Fabric) -> str:
    """A record with one row of history."""
    memory_id = fabric.form()
    fabric.owner().execute(
        "UPDATE fabric.memory_records SET consolidation_state = 'consolidated'"
        " WHERE memory_id = %s",
        (memory_id,),
    )
    assert fabric.count("memory_record_versions", f"memory_id = '{memory_id}'") == 1
    return memory_id


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE fabric.memory_record_versions SET consolidation_state = 'reflected'",
        "UPDATE fabric.memory_record_versions SET known_during = tstzrange(now(), NULL)",
        "DELETE FROM fabric.memory_record_versions",
        "TRUNCATE fabric.memory_record_versions",
    ],
    ids=["update-state", "update-known-during", "delete", "truncate"],
)
@pytest.mark.clone  # its SQL reads now() (one value in a transaction)
def test_record_history_is_append_only(fabric: Fabric, statement: str) -> None:
    transitioned(fabric)
    with fabric.su() as c:
        before = c.execute("SELECT to_jsonb(v) FROM fabric.memory_record_versions v").fetchall()
    refused(fabric.owner(), statement, None, "MF003")
    with fabric.su() as c:
        assert (
            c.execute("SELECT to_jsonb(v) FROM fabric.memory_record_versions v").fetchall()
            == before
        )


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE fabric.memory_lineage SET derived_from_id = memory_id",
        "DELETE FROM fabric.memory_lineage",
        "TRUNCATE fabric.memory_lineage",
    ],
    ids=["update", "delete", "truncate"],
)
def test_lineage_rows_never_change(fabric: Fabric, statement: str) -> None:
    semantic_with_lineage(fabric)
    with fabric.su() as c:
        before = c.execute("SELECT to_jsonb(l) FROM fabric.memory_lineage l").fetchall()
    assert len(before) == 1
    refused(fabric.owner(), statement, None, "MF001")
    with fabric.su() as c:
        assert c.execute("SELECT to_jsonb(l) FROM fabric.memory_lineage l").fetchall() == before


@pytest.mark.clone  # the rule allows lineage in the forming transaction: needs separate commits
def test_lineage_is_fixed_when_a_record_is_formed(fabric: Fabric) -> None:
    older = fabric.form(text="first")
    newer = fabric.form(text="second")
    counts = fabric.counts()
    refused(
        fabric.owner(),
        "INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)"
        " VALUES ('acme', %s, %s)",
        (newer, older),
        "MF001",
    )
    assert fabric.counts() == counts
