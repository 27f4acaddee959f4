"""Recall re-decides authorization and scope on every call: a change to the agent's tools,
its tenant enablement, its memory profile or its run binds the very next recall of a run
already open, on the same connection (nothing a session or a run remembers outlives it).

Each test recalls once (served), changes one thing as the admin or the orchestrator, and
recalls again on the same agent connection."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, PROFILE_WIDE, Fabric, call

pytestmark = pytest.mark.rollback

AGENT, LOGIN = "com-agt-003", "mf_agent_a"


def recall(conn: psycopg.Connection[Any], run: uuid.UUID, **request: Any) -> dict[str, Any]:
    return call(conn, "fabric_api.recall", Jsonb({"run_id": str(run), **request}))  # type: ignore[no-any-return]


def recall_events(fabric: Fabric, run: uuid.UUID) -> list[str]:
    return [
        e["event_type"]
        for e in fabric.events(f"run_id = '{run}' AND event_type LIKE 'memory.recall.%'")
    ]


def admin(fabric: Fabric, query: str, *args: Any) -> None:
    fabric.session("mf_admin").execute(query, args)


@pytest.fixture
def served(fabric: Fabric) -> tuple[uuid.UUID, psycopg.Connection[Any], str]:
    """An open run whose first recall is served one record, and the agent's connection."""
    run = fabric.open_run(AGENT)
    memory_id = fabric.form(run, "invoices in EUR please")
    conn = fabric.connect(LOGIN)
    answer = recall(conn, run)
    assert answer["status"] == "served" and [r["memory_id"] for r in answer["records"]] == [
        memory_id
    ]
    return run, conn, memory_id


CHANGES = {
    # the tenant layer loses the tool
    "tenant_enablement": (
        "SELECT fabric_api.enable_agent('acme', %s, ARRAY['tool:memory-propose'])",
        (AGENT,),
    ),
    # the agent is left enabled in the tenant with no tools at all
    "disabled in the tenant": ("SELECT fabric_api.enable_agent('acme', %s, '{}')", (AGENT,)),
    # the agent's own tools_allowed loses it
    "tools_allowed": (
        "SELECT fabric_api.register_agent(%s, 'mf_agent_a', %s, ARRAY['tool:memory-propose'])",
        (AGENT, Jsonb(PROFILE_WIDE)),
    ),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_revoking_the_recall_tool_mid_run_denies_the_very_next_recall(
    fabric: Fabric, served: tuple[uuid.UUID, psycopg.Connection[Any], str], change: str
) -> None:
    run, conn, _ = served
    query, args = CHANGES[change]
    admin(fabric, query, *args)
    answer = recall(conn, run)
    assert answer["status"] == "denied", answer
    layer = "tools_allowed" if change == "tools_allowed" else "tenant_enablement"
    assert layer in answer["reason"]
    assert answer["records"] == []
    assert recall_events(fabric, run) == ["memory.recall.served", "memory.recall.denied"]
    # Granted again, the next recall is served again: nothing stuck either way.
    admin(fabric, "SELECT fabric_api.enable_agent('acme', %s, %s)", AGENT, MEMORY_TOOLS)
    admin(
        fabric,
        "SELECT fabric_api.register_agent(%s, 'mf_agent_a', %s, %s)",
        AGENT,
        Jsonb(PROFILE_WIDE),
        MEMORY_TOOLS,
    )
    assert recall(conn, run)["status"] == "served"


@pytest.mark.clone  # needs a transaction of its own to roll back
def test_a_revocation_rolled_back_changes_nothing(
    fabric: Fabric, served: tuple[uuid.UUID, psycopg.Connection[Any], str]
) -> None:
    run, conn, memory_id = served
    with fabric.connect("mf_admin", autocommit=False) as tx:
        tx.execute("SELECT fabric_api.enable_agent('acme', %s, '{}')", (AGENT,))
        # Not committed: the agent's next recall is still served.
        answer = recall(conn, run)
        assert answer["status"] == "served", answer
        tx.rollback()
    assert [r["memory_id"] for r in recall(conn, run)["records"]] == [memory_id]


def test_a_memory_profile_change_mid_run_binds_the_very_next_recall(
    fabric: Fabric, served: tuple[uuid.UUID, psycopg.Connection[Any], str]
) -> None:
    run, conn, memory_id = served
    tenant_wide = fabric.form(
        run, "acme bills monthly", scope={"tenant_id": "acme", "visibility": "tenant"}
    )
    before = recall(conn, run)
    assert before["status"] == "served"
    assert {r["memory_id"] for r in before["records"]} == {memory_id, tenant_wide}
    narrower = {
        **PROFILE_WIDE,
        "recall_scope": {"tiers": ["semantic"], "visibility": ["subject"]},
    }
    admin(
        fabric,
        "SELECT fabric_api.register_agent(%s, 'mf_agent_a', %s, %s)",
        AGENT,
        Jsonb(narrower),
        MEMORY_TOOLS,
    )
    # The episodic tier is no longer readable: a request for it is denied ...
    denied = recall(conn, run, tiers=["episodic"])
    assert denied["status"] == "denied", denied
    assert "memory_profile.recall_scope.tiers" in denied["reason"]
    assert denied["records"] == []
    # ... and a request with the profile's defaults reads only what the new profile allows.
    answer = recall(conn, run)
    assert answer["status"] == "served"
    assert answer["tiers_served"] == ["semantic"]
    assert answer["scope_applied"]["visibility"] == ["subject"]
    assert answer["records"] == []


def test_closing_the_run_mid_run_refuses_the_very_next_recall_and_writes_nothing(
    fabric: Fabric, served: tuple[uuid.UUID, psycopg.Connection[Any], str]
) -> None:
    run, conn, _ = served
    fabric.session("mf_orchestrator").execute("SELECT fabric_api.close_run(%s)", (run,))
    before = fabric.counts()
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
        recall(conn, run)
    assert caught.value.sqlstate == "42501"
    assert fabric.counts() == before
