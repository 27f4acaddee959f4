"""fabric._raise_rule is the one way a rule refuses: its SQLSTATE, message, hint, detail and
constraint name arrive exactly as given, an absent hint, detail or constraint is absent (not
empty), and no agent can call it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.rollback


def _raise(conn: psycopg.Connection[Any], *args: str | None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(
            "SELECT fabric._raise_rule(%s, %s, %s, %s, %s)",
            (*args, *([None] * (5 - len(args)))),
        )
    return caught.value


def test_condition_name_message_hint_and_detail_arrive_as_given(fabric: Any) -> None:
    with fabric.su() as conn:
        error = _raise(conn, "invalid_parameter_value", "the rule", "the fix", "the detail")
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == "the rule"
    assert error.diag.message_hint == "the fix"
    assert error.diag.message_detail == "the detail"
    assert error.diag.constraint_name is None


def test_a_named_rule_arrives_as_the_constraint(fabric: Any) -> None:
    with fabric.su() as conn:
        error = _raise(conn, "check_violation", "the rule", "the fix", None, "the_rule_name")
    assert error.sqlstate == "23514"
    assert error.diag.message_primary == "the rule"
    assert error.diag.message_hint == "the fix"
    assert error.diag.message_detail is None
    assert error.diag.constraint_name == "the_rule_name"


def test_four_arguments_or_fewer_still_resolve(fabric: Any) -> None:
    with fabric.su() as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT fabric._raise_rule('MF004', 'the rule', 'the fix')")
    assert caught.value.sqlstate == "MF004"
    assert caught.value.diag.message_hint == "the fix"
    assert caught.value.diag.constraint_name is None


@pytest.mark.parametrize(
    ("hint", "detail", "constraint"),
    [
        (None, None, None),
        ("the fix", None, None),
        (None, "the detail", None),
        (None, None, "the_rule_name"),
        (None, "the detail", "the_rule_name"),
        ("the fix", "the detail", "the_rule_name"),
    ],
)
def test_an_absent_hint_detail_or_constraint_is_absent(
    fabric: Any, hint: str | None, detail: str | None, constraint: str | None
) -> None:
    with fabric.su() as conn:
        error = _raise(conn, "MF004", "the rule", hint, detail, constraint)
    assert error.sqlstate == "MF004"
    assert error.diag.message_hint == hint
    assert error.diag.message_detail == detail
    assert error.diag.constraint_name == constraint


def test_no_agent_can_call_it(fabric: Any) -> None:
    with fabric.connect("mf_agent_a") as conn:
        error = _raise(conn, "MF004", "forged")
    assert error.sqlstate == "42501"
