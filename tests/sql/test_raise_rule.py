"""fabric._raise_rule is the one way a rule refuses: its SQLSTATE, message, hint and detail
arrive exactly as given, an absent hint or detail is absent (not empty), and no agent can
call it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.rollback


def _raise(conn: psycopg.Connection[Any], *args: str | None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(
            "SELECT fabric._raise_rule(%s, %s, %s, %s)",
            (*args, *([None] * (4 - len(args)))),
        )
    return caught.value


def test_condition_name_message_hint_and_detail_arrive_as_given(fabric: Any) -> None:
    with fabric.su() as conn:
        error = _raise(conn, "invalid_parameter_value", "the rule", "the fix", "the detail")
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == "the rule"
    assert error.diag.message_hint == "the fix"
    assert error.diag.message_detail == "the detail"


@pytest.mark.parametrize(
    ("hint", "detail"), [(None, None), ("the fix", None), (None, "the detail")]
)
def test_an_absent_hint_or_detail_is_absent(
    fabric: Any, hint: str | None, detail: str | None
) -> None:
    with fabric.su() as conn:
        error = _raise(conn, "MF004", "the rule", hint, detail)
    assert error.sqlstate == "MF004"
    assert error.diag.message_hint == hint
    assert error.diag.message_detail == detail


def test_no_agent_can_call_it(fabric: Any) -> None:
    with fabric.connect("mf_agent_a") as conn:
        error = _raise(conn, "MF004", "forged")
    assert error.sqlstate == "42501"
