"""The tenant-keyed calls (sql/296_delegation.sql): propose, propose_many, commit, recall and
close_run with the tenant first, the entry points a Citus cluster delegates to the tenant's
worker. On one node each is the call it wraps, with its run or proposal looked up in the
named tenant only: the same answers and events; a run or proposal of another tenant is not
found (the wrapped call's own refusal, nothing written); no tenant is 22023; the caller's
privileges are the wrapped call's. tests/citus runs them delegated."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback


def acme(text: str) -> dict[str, Any]:
    return episode(text, scope={"tenant_id": "acme", "visibility": "subject"})


def test_the_tenant_keyed_calls_answer_as_the_calls_they_wrap(fabric: Fabric) -> None:
    run = fabric.open_run()
    proposed = fabric.call(
        "mf_agent_a", "SELECT fabric_api.propose(%s, %s, %s)", "acme", Jsonb(acme("keyed")), run
    )
    assert proposed["status"] == "validated"
    record = fabric.call(
        "mf_committer", "SELECT fabric_api.commit(%s, %s)", "acme", proposed["proposal_id"]
    )
    assert record["memory_id"] == fabric.record(record["memory_id"])["memory_id"]
    batch = fabric.call(
        "mf_agent_a",
        "SELECT fabric_api.propose_many(%s, %s, %s)",
        "acme",
        Jsonb([acme("keyed one"), acme("keyed two")]),
        run,
    )
    assert [p["status"] for p in batch] == ["validated", "validated"]
    request = {"run_id": str(run), "tiers": ["episodic"], "limit": 10}
    keyed = fabric.call("mf_agent_a", "SELECT fabric_api.recall(%s, %s)", "acme", Jsonb(request))
    plain = fabric.recall("mf_agent_a", request)
    assert keyed["status"] == plain["status"] == "served"
    assert [r["memory_id"] for r in keyed["records"]] == [r["memory_id"] for r in plain["records"]]
    assert record["memory_id"] in [r["memory_id"] for r in keyed["records"]]
    closed = fabric.call("mf_orchestrator", "SELECT fabric_api.close_run(%s, %s)", "acme", run)
    assert closed["closed_at"] is not None
    types = [e["event_type"] for e in fabric.events(f"run_id = '{run}'")]
    assert types.count("memory.proposal.validated") == 3
    assert types.count("memory.record.formed") == 1
    assert types.count("memory.recall.served") == 2
    assert types.count("fabric.run.closed") == 1


def _refused(fabric: Fabric, login: str, query: str, *args: Any) -> psycopg.Error:
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        fabric.call(login, query, *args)
    assert fabric.counts() == before
    return info.value


def test_a_run_or_proposal_of_another_tenant_is_not_found_and_nothing_is_written(
    fabric: Fabric,
) -> None:
    run = fabric.open_run()  # acme's
    proposal = fabric.propose("mf_agent_a", acme("to commit"), run)["proposal_id"]
    err = _refused(
        fabric,
        "mf_agent_a",
        "SELECT fabric_api.propose(%s, %s, %s)",
        "globex",
        Jsonb(acme("x")),
        run,
    )
    assert err.sqlstate == "42501" and err.diag.message_hint  # as an unknown run
    err = _refused(
        fabric,
        "mf_agent_a",
        "SELECT fabric_api.propose_many(%s, %s, %s)",
        "globex",
        Jsonb([acme("y")]),
        run,
    )
    assert err.sqlstate == "42501"
    err = _refused(
        fabric,
        "mf_agent_a",
        "SELECT fabric_api.recall(%s, %s)",
        "globex",
        Jsonb({"run_id": str(run), "tiers": ["episodic"]}),
    )
    assert err.sqlstate == "42501"
    err = _refused(fabric, "mf_committer", "SELECT fabric_api.commit(%s, %s)", "globex", proposal)
    assert err.sqlstate == "P0002" and err.diag.message_primary == "unknown proposal"
    err = _refused(fabric, "mf_orchestrator", "SELECT fabric_api.close_run(%s, %s)", "globex", run)
    assert err.sqlstate == "P0002" and err.diag.message_primary == "unknown run"
    # the run and the proposal are untouched and still serve in their own tenant
    assert fabric.commit(proposal)["memory_id"]


@pytest.mark.parametrize("call", ["propose", "propose_many", "commit", "recall", "close_run"])
def test_a_call_without_its_tenant_is_refused(fabric: Fabric, call: str) -> None:
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", acme("kept"), run)["proposal_id"]
    login, args = {
        "propose": ("mf_agent_a", (Jsonb(acme("no tenant")), run)),
        "propose_many": ("mf_agent_a", (Jsonb([acme("no tenant")]), run)),
        "commit": ("mf_committer", (proposal,)),
        "recall": ("mf_agent_a", (Jsonb({"run_id": str(run), "tiers": ["episodic"]}),)),
        "close_run": ("mf_orchestrator", (run,)),
    }[call]
    query = f"SELECT fabric_api.{call}(%s::text, {', '.join(['%s'] * len(args))})"
    err = _refused(fabric, login, query, None, *args)
    assert err.sqlstate == "22023"
    assert "tenant_id" in (err.diag.message_primary or "") and err.diag.message_hint


def test_the_callers_privileges_are_the_wrapped_calls(fabric: Fabric) -> None:
    """An agent may not commit through the tenant-keyed door any more than through the
    plain one, nor close a run; the committer may not propose."""
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", acme("not mine to commit"), run)["proposal_id"]
    err = _refused(fabric, "mf_agent_b", "SELECT fabric_api.commit(%s, %s)", "acme", proposal)
    assert err.sqlstate == "42501"
    err = _refused(fabric, "mf_agent_a", "SELECT fabric_api.close_run(%s, %s)", "acme", run)
    assert err.sqlstate == "42501"
    err = _refused(
        fabric,
        "mf_auditor",
        "SELECT fabric_api.recall(%s, %s)",
        "acme",
        Jsonb({"run_id": str(run)}),
    )
    assert err.sqlstate == "42501"
    # another agent's run, named in its own tenant: refused as through fabric_api.propose
    err = _refused(
        fabric, "mf_agent_b", "SELECT fabric_api.propose(%s, %s, %s)", "acme", Jsonb(acme("b")), run
    )
    assert err.sqlstate == "42501"


@pytest.mark.clone  # sets a transaction setting by hand, on a connection of its own
def test_the_named_tenant_holds_for_the_call_only(fabric: Fabric) -> None:
    """fabric.call_tenant narrows the lookups of one call: it is cleared when the call
    returns; set by hand, it only narrows (a caller's own run is then not found)."""
    globex_run = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    request = Jsonb({"run_id": str(globex_run), "tiers": ["episodic"]})
    with fabric.connect("mf_agent_g") as conn:
        row = conn.execute(
            "SELECT fabric_api.recall('globex', %s) ->> 'status',"
            " current_setting('fabric.call_tenant', true)",
            (request,),
        ).fetchone()
        assert row == ("served", "")
        conn.execute("SELECT set_config('fabric.call_tenant', 'acme', false)")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT fabric_api.recall(%s)", (request,))
        assert info.value.sqlstate == "42501"
        conn.execute("SELECT set_config('fabric.call_tenant', '', false)")
        row = conn.execute("SELECT fabric_api.recall(%s) ->> 'status'", (request,)).fetchone()
        assert row == ("served",)


def test_the_relay_has_nothing_to_move_on_one_node(fabric: Fabric) -> None:
    run = fabric.open_run()
    fabric.propose("mf_agent_a", acme("written to the outbox at once"), run)
    assert fabric.count("shard_events") == 0
    assert fabric.call("mf_projector", "SELECT fabric_api.relay_events()") == 0
    assert fabric.count("events", "event_type = 'memory.proposal.validated'") >= 1
