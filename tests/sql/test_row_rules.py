"""The row rules of proposals and memory_records (migration 0025): one CHECK constraint a
table, calling fabric._proposals_row_rules / fabric._memory_records_row_rules, refuses
exactly the rows the 28 constraints it replaced refused, with the same SQLSTATE and the same
constraint name (the first broken rule by name, as PostgreSQL checks constraints in name
order), and passes a NULL rule as a CHECK constraint does.

The constraints of revision 0024 are taken from the migration's downgrade and put on
temporary copies of the two tables; every generated row is written to the copy and given to
the function, and the two answers are compared."""

from __future__ import annotations

import importlib.util
import math
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from conftest import Fabric

pytestmark = pytest.mark.rollback

MIGRATION = Path(__file__).parents[2] / "migrations" / "versions" / "0025_row_rules.py"
T0 = datetime(2026, 7, 2, 9, 14, tzinfo=UTC)
HASH = "sha256:" + "a" * 64


def _downgrade() -> str:
    spec = importlib.util.spec_from_file_location("migration_0025", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.DOWNGRADE)


def _old_constraints(conn: psycopg.Connection[Any]) -> None:
    """Temporary copies of the two tables with the constraints of revision 0024."""
    text = _downgrade()
    for table, copy in (("proposals", "rules_p"), ("memory_records", "rules_m")):
        conn.execute(
            sql.SQL("CREATE TEMP TABLE {} (LIKE fabric.{} INCLUDING DEFAULTS)").format(
                sql.Identifier(copy), sql.Identifier(table)
            )
        )
        head = f"ALTER TABLE fabric.{table}\n  DROP CONSTRAINT {table}_row_rules,"
        start = text.index(head)
        statement = text[start : text.index(";", start)]
        conn.execute(statement.replace(head, f"ALTER TABLE pg_temp.{copy}"))
    n = conn.execute(
        "SELECT count(*) FROM pg_constraint WHERE contype = 'c'"
        " AND conrelid IN ('pg_temp.rules_p'::regclass, 'pg_temp.rules_m'::regclass)"
    ).fetchone()
    assert n == (28,)


def _answer(conn: psycopg.Connection[Any], query: sql.Composed, values: dict[str, Any]) -> Any:
    """None when the row passes, else (SQLSTATE, constraint name, table name)."""
    try:
        conn.execute(query, values)
    except errors.CheckViolation as e:
        return (e.sqlstate, e.diag.constraint_name, e.diag.table_name)
    return None


def _pick(rng: random.Random, good: list[Any], bad: list[Any]) -> Any:
    return rng.choice(good) if rng.random() < 0.85 else rng.choice(good + bad)


PROPOSAL_VALUES: dict[str, tuple[list[Any], list[Any]]] = {
    "status": (["validated", "rejected", "committed", "withdrawn"], ["bogus"]),
    "reason": ([None, "a reason"], []),
    "tier": (["episodic", "semantic", "procedural", "profile"], ["relational", "bogus"]),
    "visibility": (["session", "agent", "subject", "tenant"], ["bogus"]),
    "content": ([Jsonb({"text": "x"})], [Jsonb([1]), Jsonb("x"), None]),
    "content_hash": ([HASH, None], ["sha256:" + "A" * 64, "sha256:abc", "md5:" + "a" * 67]),
    "source_event_id": (["evt-1"], [None]),
    "formation_method": (["extraction", "declaration", "import"], ["consolidation", "bogus"]),
    "supersedes": ([None], [uuid.UUID(int=7)]),
    "confidence": ([0.0, 0.5, 1.0], [-0.1, 1.5, math.nan]),
    "valid_from": ([T0], []),
    "valid_until": ([None, T0 + timedelta(hours=1)], [T0, T0 - timedelta(hours=1)]),
    "retention_class": (["durable", "operational", "regulated"], ["audit", "ephemeral", "x"]),
    "version": (["1.0.0", "0.2.10-rc.1+b7"], ["1.0", "01.0.0", "1.0.0 "]),
    "committed_by": ([None], ["os-agt-010"]),
    "memory_id": ([None], [uuid.UUID(int=9)]),
    "request_hash": ([None, HASH], ["sha256:xyz"]),
    "from_tier": ([None], ["working", "semantic"]),
}

RECORD_VALUES: dict[str, tuple[list[Any], list[Any]]] = {
    "tier": (["episodic", "semantic", "procedural", "profile", "relational"], ["bogus"]),
    "visibility": (["session", "agent", "subject", "tenant"], ["bogus"]),
    "scope_key": (["subject:user-1"], [None]),
    "content": ([Jsonb({"text": "x"})], [None, Jsonb([1])]),
    "content_hash": ([HASH], ["sha256:abc", "sha256:" + "g" * 64]),
    "formation_method": (
        ["extraction", "declaration", "consolidation", "reflection", "import"],
        ["bogus"],
    ),
    "confidence": ([0.0, 0.5, 1.0], [-0.1, 1.5, math.nan]),
    "valid_from": ([T0], []),
    "valid_until": ([None, T0 + timedelta(days=1)], [T0, T0 - timedelta(days=1)]),
    "consolidation_state": (
        ["raw", "consolidated", "reflected", "superseded"],
        ["expired", "tombstoned", "bogus"],
    ),
    "retention_class": (["durable", "operational", "regulated"], ["audit", "ephemeral", "x"]),
    "version": (["1.0.0", "2.1.3-alpha"], ["1", "1.0.0.0"]),
    "erased_at": ([None], [T0]),
    "erasure_approval_id": ([None], [uuid.UUID(int=3)]),
}


# The columns a copy needs besides the rules' (NOT NULL without a default).
REQUIRED = {
    "rules_p": {"tenant_id": "acme", "run_id": uuid.UUID(int=1), "proposed_by": "os-agt-001"},
    "rules_m": {
        "tenant_id": "acme",
        "source_event_id": "evt-1",
        "formed_by": "os-agt-010",
        "search_length": 0,
    },
}


def _statements(copy: str, function: str, columns: list[str]) -> tuple[sql.Composed, sql.Composed]:
    """The INSERT into the copy and the call of the function, both of the named values."""
    fixed = REQUIRED[copy]
    names = [*fixed, *columns]
    insert = sql.SQL("INSERT INTO pg_temp.{} ({}) VALUES ({}, {})").format(
        sql.Identifier(copy),
        sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(map(sql.Literal, fixed.values())),
        sql.SQL(", ").join(map(sql.Placeholder, columns)),
    )
    call = sql.SQL("SELECT fabric.{}({})").format(
        sql.Identifier(function),
        sql.SQL(", ").join(
            sql.SQL("{} => {}").format(sql.Identifier(c), sql.Placeholder(c)) for c in columns
        ),
    )
    return insert, call


def _compare(
    conn: psycopg.Connection[Any],
    values: dict[str, tuple[list[Any], list[Any]]],
    copy_insert: sql.Composed,
    function_call: sql.Composed,
    table: str,
    rows: int,
) -> set[str | None]:
    rng = random.Random(20261201)
    seen: set[str | None] = set()
    for _ in range(rows):
        row = {name: _pick(rng, good, bad) for name, (good, bad) in values.items()}
        old = _answer(conn, copy_insert, row)
        new = _answer(conn, function_call, row)
        expected = None if old is None else (old[0], old[1], table)
        assert new == expected, row
        seen.add(None if old is None else old[1])
    return seen


@pytest.mark.slow  # 1,500 rows a table, each twice: 4-7 s
@pytest.mark.parametrize(
    ("copy", "function", "table"),
    [
        ("rules_p", "_proposals_row_rules", "proposals"),
        ("rules_m", "_memory_records_row_rules", "memory_records"),
    ],
)
def test_the_row_rules_refuse_what_their_constraints_refused(
    fabric: Fabric, copy: str, function: str, table: str
) -> None:
    values = PROPOSAL_VALUES if table == "proposals" else RECORD_VALUES
    conn = fabric.su()
    _old_constraints(conn)
    insert, call = _statements(copy, function, list(values))
    seen = _compare(conn, values, insert, call, table, 1500)
    names = conn.execute(
        "SELECT array_agg(conname::text) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype = 'c'",
        (f"pg_temp.{copy}",),
    ).fetchone()
    assert names is not None
    assert seen == {None, *names[0]}  # every rule was broken at least once (and some rows pass)


RAW_INSERT = """
INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, content,
  source_event_id, formed_by, formation_method, confidence, valid_from, retention_class,
  version)
VALUES ('acme', 'episodic', 'subject', 'user-8842', '{"text": "raw"}', 'evt-raw-1',
  'os-agt-010', 'extraction', %s, '2026-07-02T09:14:00Z', 'durable', %s)
"""


def test_a_raw_insert_breaking_two_rules_names_the_first_and_writes_nothing(
    fabric: Fabric,
) -> None:
    conn = fabric.owner()
    before = fabric.count("memory_records")
    with pytest.raises(errors.CheckViolation) as caught:
        conn.execute(RAW_INSERT, (5, "1.0"))
    exc = caught.value
    assert exc.sqlstate == "23514"
    assert exc.diag.constraint_name == "memory_records_confidence_in_unit_interval"
    assert (exc.diag.schema_name, exc.diag.table_name) == ("fabric", "memory_records")
    assert exc.diag.message_primary == (
        'new row for relation "memory_records" violates check constraint '
        '"memory_records_confidence_in_unit_interval"'
    )
    assert exc.diag.message_detail is None
    with pytest.raises(errors.CheckViolation) as caught:
        conn.execute(RAW_INSERT, (0.5, "1.0"))
    assert caught.value.sqlstate == "23514"
    assert caught.value.diag.constraint_name == "memory_records_version_is_semver"
    assert fabric.count("memory_records") == before
