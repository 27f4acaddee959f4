"""The isolation of a test marked `rollback` (tests/conftest.py, `TxBackend`): one transaction
on the worker's shared database, rolled back at the test's end, in which each statement
behaves as the autocommit call it stands for. The first two tests run in this order (a
module runs on one worker, in file order): what the first writes, the second never sees."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import errors

from conftest import Fabric, NeedsClone

pytestmark = pytest.mark.rollback(always=True)  # about the transaction: even in a clone run


@pytest.fixture(autouse=True)
def _in_a_transaction(fabric: Fabric) -> None:
    assert fabric._tx is not None, "these tests are about the rolled-back transaction"


KEPT: list[Any] = []


def test_a_rollback_test_writes(fabric: Fabric) -> None:
    assert fabric._tx is not None
    fabric.form(fabric.open_run(), "written by the first test")
    assert fabric.count("memory_records") == 1
    KEPT.append(fabric.session("mf_orchestrator"))


def test_the_next_test_sees_the_template_again(fabric: Fabric) -> None:
    assert fabric.count("memory_records") == 0
    assert fabric.count("proposals") == 0
    assert fabric.count("runs") == 0
    # a connection kept from the first test cannot write into this test's transaction
    assert len(KEPT) == 1
    with pytest.raises(NeedsClone):
        KEPT[0].execute("SELECT 1")


def test_an_error_undoes_its_own_call_only(fabric: Fabric) -> None:
    run = fabric.open_run()
    fabric.form(run, "kept")
    proposal = fabric.proposed(run, "proposed once")
    fabric.commit(proposal)
    with pytest.raises(errors.ObjectNotInPrerequisiteState):
        fabric.commit(proposal)  # already committed
    assert fabric.count("memory_records") == 2
    fabric.form(run, "the transaction goes on after the error")
    assert fabric.count("memory_records") == 3


def test_a_calls_local_settings_do_not_reach_the_next_call(fabric: Fabric) -> None:
    """propose enters its tenant (fabric.tenant_id, local to its transaction): the next call
    on the same backend starts without it, as after a COMMIT."""
    fabric.proposed(fabric.open_run(), "enters acme")
    setting = fabric.call(None, "SELECT current_setting('fabric.tenant_id', true)")
    assert setting in (None, "")


def test_each_login_is_its_own_identity_on_the_shared_backend(fabric: Fabric) -> None:
    users = {
        login: fabric.session(login).execute("SELECT session_user, current_user").fetchone()
        for login in ("mf_agent_a", "mf_committer", None)
    }
    assert users["mf_agent_a"] == ("mf_agent_a", "mf_agent_a")
    assert users["mf_committer"] == ("mf_committer", "mf_committer")
    assert users[None] is not None and users[None][0] not in ("mf_agent_a", "mf_committer")
    owner = fabric.owner("globex", actor=None)
    assert owner.execute(
        "SELECT current_user, current_setting('fabric.tenant_id', true)"
    ).fetchone() == ("fabric_owner", "globex")
    # and the owner's role and setting stay with the owner's connection
    assert fabric.session("mf_agent_a").execute("SELECT current_user").fetchone() == ("mf_agent_a",)


@pytest.mark.parametrize(
    "statement",
    [
        "SET ROLE fabric_owner",
        "SELECT 1; COMMIT",
        "SELECT pg_advisory_lock(1)",
        "SELECT now()",
        "SELECT pg_current_snapshot()",
        "LISTEN fabric_events",
    ],
)
def test_what_a_transaction_cannot_stand_for_asks_for_a_clone(
    fabric: Fabric, statement: str
) -> None:
    with pytest.raises(NeedsClone):
        fabric.session("mf_agent_a").execute(statement)


def test_a_second_transaction_or_another_process_asks_for_a_clone(fabric: Fabric) -> None:
    with pytest.raises(NeedsClone):
        fabric.connect("mf_agent_a", autocommit=False)
    with pytest.raises(NeedsClone):
        fabric.url  # noqa: B018 - the property raises
    with pytest.raises(NeedsClone):
        fabric.settle()
