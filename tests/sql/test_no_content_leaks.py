"""No refusal echoes content (R-PROP-1, R-LOG-1).

A canary string rides in the content of every refused write. It must appear in none of
the error's fields (message, detail, hint, context, internal query) nor in the server log.
Each test also checks that the refusal did reach the log, so the canary's absence there
means something.

Why the owner's raw constraint violations carry no "Failing row contains (...)" DETAIL:
PostgreSQL omits row and key values from CHECK, NOT NULL, FK, unique and exclusion errors
when row level security applies to the current user, and every content table is FORCE
RLS under fabric_owner. Roles that bypass RLS (superuser, the migration role) do get the
DETAIL, and jsonb input errors carry a CONTEXT quoting the input: the install sets
log_error_verbosity = terse on the database, so neither reaches the server log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback


@pytest.fixture
def canary() -> str:
    return "CANARY-" + uuid.uuid4().hex


def log_text(fabric: Fabric) -> str:
    return Path(fabric.server.logfile).read_text(encoding="utf-8", errors="replace")


@pytest.fixture
def refuse(fabric: Fabric, canary: str) -> Iterator[Callable[..., psycopg.Error]]:
    """refuse(action, sqlstate): run the action, expect that error, check it for the canary."""

    def run(action: Callable[[], Any], sqlstate: str) -> psycopg.Error:
        log_before = len(log_text(fabric).encode())
        with pytest.raises(psycopg.Error) as info:
            action()
        exc = info.value
        assert exc.sqlstate == sqlstate, (exc.sqlstate, exc.diag.message_primary)
        diag = exc.diag
        fields = {
            "message_primary": diag.message_primary,
            "message_detail": diag.message_detail,
            "message_hint": diag.message_hint,
            "context": diag.context,
            "internal_query": diag.internal_query,
            "str": str(exc),
        }
        for name, value in fields.items():
            assert canary not in (value or ""), f"the canary leaked into {name}"
        new_log = Path(fabric.server.logfile).read_bytes()[log_before:].decode("utf-8", "replace")
        assert f"ERROR:  {diag.message_primary}" in new_log, "the refusal never reached the log"
        return exc

    yield run
    assert canary not in log_text(fabric), "the canary reached the server log"


def test_log_min_error_statement_is_panic_in_the_tests_database(fabric: Fabric) -> None:
    """Without it the statement text (a raw INSERT's content) is logged with every error."""
    for login in (None, "mf_agent_a", "mf_committer"):
        row = fabric.connect(login).execute("SHOW log_min_error_statement").fetchone()
        assert row == ("panic",)


# --- refusals through the API ---------------------------------------------------------------


def test_a_non_double_number_next_to_the_canary_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    run = fabric.open_run()
    text = json.dumps(episode(content={"text": canary, "n": "@N@"})).replace(
        '"@N@"', "9007199254740993"
    )
    agent = fabric.connect("mf_agent_a")
    refuse(lambda: agent.execute("SELECT fabric_api.propose(%s::jsonb, %s)", (text, run)), "22003")


def test_a_hash_mismatch_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    run = fabric.open_run()
    env = episode(content={"text": canary}, content_hash="sha256:" + "ab" * 32)
    refuse(lambda: fabric.propose("mf_agent_a", env, run), "22023")


def test_the_size_limit_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    run = fabric.open_run()
    env = episode(content={"text": canary + " " + "x" * 70000, "again": canary})
    refuse(lambda: fabric.propose("mf_agent_a", env, run), "54000")


def test_the_depth_limit_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    run = fabric.open_run()
    deep: Any = canary
    for _ in range(40):
        deep = {canary: deep}
    refuse(lambda: fabric.propose("mf_agent_a", episode(content=deep), run), "54000")


def test_a_wrong_tenant_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    run = fabric.open_run()
    env = episode(content={"text": canary}, scope={"tenant_id": "globex", "visibility": "tenant"})
    refuse(lambda: fabric.propose("mf_agent_a", env, run), "42501")


def test_an_unknown_run_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    env = episode(content={"text": canary})
    refuse(lambda: fabric.propose("mf_agent_a", env, uuid.uuid4()), "42501")


def test_events_of_a_committed_record_carry_no_content(fabric: Fabric, canary: str) -> None:
    run = fabric.open_run()
    result = fabric.propose("mf_agent_a", episode(content={"text": canary}), run)
    fabric.commit(result["proposal_id"])
    events = fabric.events()
    assert {"memory.proposal.validated", "memory.record.formed"} <= {
        e["event_type"] for e in events
    }
    assert canary not in json.dumps(events)


# --- the owner's raw writes -----------------------------------------------------------------

RAW_INSERT = """
INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, content,
  source_event_id, formed_by, formation_method, confidence, valid_from, retention_class,
  supersedes)
VALUES ('acme', 'episodic', 'subject', 'user-8842', %(content)s, %(source)s, 'os-agt-010',
  'extraction', %(confidence)s, '2026-07-02T09:14:00Z', 'durable', %(supersedes)s)
"""


def raw(canary: str, **overrides: Any) -> dict[str, Any]:
    params = {
        "content": Jsonb({"text": canary, "note": f"about {canary}"}),
        "source": "evt-raw-1",
        "confidence": 0.9,
        "supersedes": None,
    }
    return params | overrides


def committed_canary(fabric: Fabric, canary: str) -> str:
    return fabric.form(fabric.open_run(), content={"text": canary})


def test_the_owners_content_update_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    memory_id = committed_canary(fabric, canary)
    conn = fabric.owner()
    refuse(
        lambda: conn.execute(
            "UPDATE fabric.memory_records SET content = jsonb_build_object('text', %s::text)"
            " WHERE memory_id = %s",
            (canary + "-changed", memory_id),
        ),
        "MF001",
    )


def test_the_owners_delete_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    committed_canary(fabric, canary)
    conn = fabric.owner()
    refuse(
        lambda: conn.execute(
            "DELETE FROM fabric.memory_records WHERE content ->> 'text' = %s", (canary,)
        ),
        "MF001",
    )
    assert fabric.count("memory_records") == 1


def test_a_check_violation_on_a_raw_insert_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    conn = fabric.owner()
    exc = refuse(lambda: conn.execute(RAW_INSERT, raw(canary, confidence=5)), "23514")
    assert exc.diag.constraint_name == "memory_records_confidence_in_unit_interval"
    assert exc.diag.message_detail is None


@pytest.mark.clone  # sets session settings with set_config
def test_a_raw_insert_whose_statement_holds_the_content_is_not_logged(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    """The statement text itself is content here: only log_min_error_statement keeps it out."""
    conn = fabric.owner()
    literal = sql.Literal(json.dumps({"text": canary})).as_string(conn)
    statement = RAW_INSERT.replace("%(content)s", literal + "::jsonb")
    assert canary in statement
    refuse(lambda: conn.execute(statement, raw(canary, confidence=5)), "23514")


def test_a_not_null_violation_on_a_raw_insert_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    conn = fabric.owner()
    exc = refuse(lambda: conn.execute(RAW_INSERT, raw(canary, source=None)), "23502")
    assert exc.diag.message_detail is None


def test_a_foreign_key_violation_on_a_raw_insert_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    conn = fabric.owner()
    refuse(lambda: conn.execute(RAW_INSERT, raw(canary, supersedes=uuid.uuid4())), "23503")
    assert fabric.count("memory_records") == 0


def test_a_hash_mismatch_on_a_raw_insert_is_not_echoed(
    fabric: Fabric, canary: str, refuse: Callable[..., psycopg.Error]
) -> None:
    conn = fabric.owner()
    statement = RAW_INSERT.replace("supersedes)\nVALUES", "supersedes, content_hash)\nVALUES")
    statement = statement.replace(
        "%(supersedes)s)", "%(supersedes)s, 'sha256:' || repeat('0', 64))"
    )
    assert statement.count("content_hash") == 1 and "repeat('0', 64)" in statement
    refuse(lambda: conn.execute(statement, raw(canary)), "22023")
    assert fabric.count("memory_records") == 0


# --- paths outside the fabric's functions: closed by log_error_verbosity = terse -------------


@pytest.mark.clone  # uses the raw driver connection
def test_a_superusers_check_violation_is_not_logged_with_content(
    fabric: Fabric, canary: str
) -> None:
    conn = fabric.su()
    conn.execute(
        "SELECT set_config('fabric.tenant_id', 'acme', false),"
        " set_config('fabric.actor', 'os-agt-010', false)"
    )
    with pytest.raises(errors.CheckViolation):
        conn.execute(RAW_INSERT, raw(canary, confidence=5))
    assert canary not in log_text(fabric)


def test_a_jsonb_input_error_is_not_logged_with_content(fabric: Fabric, canary: str) -> None:
    run = fabric.open_run()
    with pytest.raises(psycopg.Error):
        fabric.propose("mf_agent_a", episode(content={"text": canary + "\x00"}), run)
    assert canary not in log_text(fabric)
