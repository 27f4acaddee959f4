"""The SDK: a method for every fabric function, on the role that may call it; typed answers;
the minimal envelope; the same calls async."""

from __future__ import annotations

import asyncio
import inspect
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conftest import MEMORY_TOOLS, Fabric
from conftest import episode as conftest_episode
from memfabric import AsyncFabric, Envelope, Record, aio, episode, errors, sdk
from memfabric import Fabric as SdkFabric

# Functions of fabric_api / fabric_audit that the SDK deliberately has no method for, each
# with the reason.
_CHECKPOINTER = (
    "LangGraph's deletes: memfabric.langgraph's checkpointer sends them as the service login"
    " (the SDK has no checkpointer role)"
)
INTERNAL: dict[str, str] = {
    "fabric_api.delete_checkpoint_threads": _CHECKPOINTER,
    "fabric_api.delete_checkpoint_namespaces": _CHECKPOINTER,
    "fabric_api.delete_checkpoint_writes": _CHECKPOINTER,
    "fabric_api.delete_unkept_checkpoints": _CHECKPOINTER,
    "fabric_api.delete_checkpoint_blobs": _CHECKPOINTER,
    # the operational-store broker's handshake, not a call of a role's own
    "fabric_api.issue_broker_ticket": "memfabric.operational.RemoteOpsBroker takes one on the "
    "caller's own connection to open its socket session",
    "fabric_api.redeem_broker_ticket": "memfabric serve's operational broker (OpsGate) redeems "
    "it to learn the login PostgreSQL authenticated",
}

# The group role each SDK role stands for (its methods must be executable by it).
GROUP = {
    "admin": "fabric_admin",
    "orchestrator": "fabric_orchestrator",
    "agent": "fabric_agent",
    "committer": "fabric_committer",
    "policy": "fabric_policy",
    "consolidator": "fabric_consolidator",
    "auditor": "fabric_auditor",
    "projector": "fabric_projector",
    "tracer": "fabric_tracer",
    "mcp_gateway": "fabric_mcp_gateway",
    "workflow": "fabric_workflow",
}
CALLED = re.compile(r'"((?:fabric_api|fabric_audit)\.[a-z_0-9]+)"')


def called_by(role: type[Any]) -> set[str]:
    return set(CALLED.findall(inspect.getsource(role)))


def database_functions(fabric: Fabric) -> set[str]:
    rows = (
        fabric.session()
        .execute(
            "SELECT n.nspname || '.' || p.proname FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname IN ('fabric_api', 'fabric_audit')"
        )
        .fetchall()
    )
    return {r[0] for r in rows}


@pytest.mark.parametrize("roles", [sdk.ROLES, aio.ROLES], ids=["sync", "async"])
def test_every_fabric_function_has_an_sdk_method(fabric: Fabric, roles: dict[str, Any]) -> None:
    functions = database_functions(fabric)
    covered = set().union(*(called_by(role) for role in roles.values()))
    assert sorted(functions - covered - INTERNAL.keys()) == []
    assert sorted(covered - functions) == []  # no method calls a function that is gone
    assert all(reason.strip() for reason in INTERNAL.values())


@pytest.mark.parametrize("roles", [sdk.ROLES, aio.ROLES], ids=["sync", "async"])
def test_each_role_calls_only_what_its_group_may_execute(
    fabric: Fabric, roles: dict[str, Any]
) -> None:
    conn = fabric.su()
    refused = []
    for name, role in roles.items():
        for function in sorted(called_by(role)):
            row = conn.execute(
                "SELECT bool_or(has_function_privilege(%s, p.oid, 'EXECUTE')) FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname || '.' || p.proname = %s",
                (GROUP[name], function),
            ).fetchone()
            if not (row and row[0]):
                refused.append((name, function))
    assert refused == []


def test_the_envelope_requires_what_propose_requires() -> None:
    with pytest.raises(TypeError):
        Envelope(tier="episodic", tenant_id="acme", visibility="subject", content={})  # type: ignore[call-arg]
    fields = set(inspect.signature(Envelope).parameters)
    assert not fields & {"memory_id", "consolidation_state", "formed_by", "recorded_at"}
    minimal = episode({"text": "x"}, tenant_id="acme", source_event_id="evt-1", confidence=0.9)
    assert minimal.to_json() == {
        "tier": "episodic",
        "scope": {"tenant_id": "acme", "visibility": "subject"},
        "content": {"text": "x"},
        "provenance": {"source_event_id": "evt-1", "formation_method": "extraction"},
        "confidence": 0.9,
    }


def test_agent_loop_is_governed_calls_with_typed_answers(fabric: Fabric) -> None:
    with SdkFabric(fabric.url, max_size=2) as mf:
        run = mf.orchestrator("mf_orchestrator").open_run(
            "acme", "com-agt-003", "user-8842", "sess-1", MEMORY_TOOLS
        )
        agent = mf.agent("mf_agent_a", run)
        proposal = agent.remember(
            {"text": "prefers invoices in EUR"}, source_event_id="evt-sdk-1", confidence=0.9
        )
        assert proposal.status == "validated" and proposal.proposal_id is not None
        record = mf.committer("mf_committer").commit(proposal.proposal_id)
        assert isinstance(record, Record) and record.consolidation_state == "raw"
        answer = agent.recall("invoices EUR", mode="text")
        assert [r.memory_id for r in answer.records] == [record.memory_id]
        assert [r.memory_id for r in agent.get([record.memory_id, uuid.uuid4()])] == [
            record.memory_id
        ]
        before = fabric.counts()
        with pytest.raises(errors.NotAuthorized):
            mf.agent("mf_agent_b", run).remember(
                {"text": "x"}, source_event_id="evt-sdk-2", confidence=0.5
            )
        assert fabric.counts() == before


def test_batches_answer_per_envelope_and_commit_all_or_none(fabric: Fabric) -> None:
    envelope = {
        "tier": "episodic",
        "scope": {"tenant_id": "acme", "visibility": "subject"},
        "content": {"text": "prefers invoices in EUR"},
        "provenance": {"source_event_id": "evt-sdk-many", "formation_method": "extraction"},
        "confidence": 0.9,
    }

    async def flow(run: Any) -> list[str]:
        async with AsyncFabric(fabric.url, max_size=1) as amf:
            answers = await amf.agent("mf_agent_a", run).propose_many([envelope, envelope])
            return [a.status for a in answers]

    with SdkFabric(fabric.url, max_size=2) as mf:
        orchestrator = mf.orchestrator("mf_orchestrator")
        run = orchestrator.open_run("acme", "com-agt-003", "user-8842", "sess-1", MEMORY_TOOLS)
        answers = mf.agent("mf_agent_a", run).propose_many([envelope, {"tier": "episodic"}])
        assert [a.status for a in answers] == ["validated", "error"]
        assert answers[1].raw["sqlstate"] == "22023"
        assert answers[0].proposal_id is not None
        (record,) = mf.committer("mf_committer").commit_many([answers[0].proposal_id])
        assert isinstance(record, Record) and record.content == envelope["content"]
        assert asyncio.run(flow(run)) == ["committed", "committed"]  # replays
        with pytest.raises(errors.WrongState):
            mf.committer("mf_committer").commit_many([answers[0].proposal_id])


def test_a_run_id_alone_needs_its_tenant(fabric: Fabric) -> None:
    with SdkFabric(fabric.url) as mf, pytest.raises(ValueError, match="tenant_id"):
        mf.agent("mf_agent_a", uuid.uuid4())


def test_async_fabric_makes_the_same_calls(fabric: Fabric) -> None:
    async def flow() -> tuple[str, list[uuid.UUID], uuid.UUID]:
        async with AsyncFabric(fabric.url, max_size=2) as mf:
            run = await mf.orchestrator("mf_orchestrator").open_run(
                "acme", "com-agt-003", "user-8842", "sess-1", MEMORY_TOOLS
            )
            agent = mf.agent("mf_agent_a", run)
            proposal = await agent.remember(
                {"text": "ships to Rotterdam"}, source_event_id="evt-async-1", confidence=0.8
            )
            assert proposal.proposal_id is not None
            record = await mf.committer("mf_committer").commit(proposal.proposal_id)
            answer = await agent.recall("Rotterdam", mode="text")
            with pytest.raises(errors.NotAuthorized):
                await mf.auditor("mf_agent_a").verify_event_chain("acme")
            return answer.status, [r.memory_id for r in answer.records], record.memory_id

    status, ids, memory_id = asyncio.run(flow())
    assert status == "served" and ids == [memory_id]


def test_the_plumbing_calls_bind_their_arguments(fabric: Fabric) -> None:
    """The calls the docs only list (projector, tracer, audit reads, decay, subject erasure)
    each reach their function with well-typed arguments."""
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", conftest_episode(), run)
    memory_id = fabric.commit(proposal["proposal_id"])["memory_id"]
    fabric.recall("mf_agent_a", {"run_id": str(run), "query": "x"})  # one event to trace
    now = datetime.now(UTC)
    fabric.settle()  # the commit's events below the horizon before the one read
    with SdkFabric(fabric.url, max_size=1) as mf:
        projector = mf.projector("mf_projector")
        events = projector.projection_events_v2("graph", 10)
        assert events and projector.projection_horizon() > 0
        assert projector.set_projection_cursor("graph", events[-1]["xid"], events[-1]["event_id"])
        assert projector.unfinished_projection_rebuild("graph") is None
        began = projector.begin_projection_rebuild("graph")["rebuild_started_at"]
        assert projector.unfinished_projection_rebuild("graph") == datetime.fromisoformat(began)
        projector.set_projection_cursor("graph", events[-1]["xid"], events[-1]["event_id"], True)
        assert projector.unfinished_projection_rebuild("graph") is None
        records = projector.projection_records_v2([memory_id])
        assert [str(r["memory_id"]) for r in records] == [memory_id]
        snapshot = projector.projection_snapshot_v2(limit=5)
        assert [str(r["memory_id"]) for r in snapshot] == [memory_id]
        tracer = mf.tracer("mf_tracer")
        feed = tracer.trace_events(10)
        assert [e["event_type"] for e in feed] == ["memory.recall.served"]
        assert tracer.trace_lag() == 1
        assert tracer.set_trace_cursor(feed[-1]["xid"], feed[-1]["event_id"]) is not None
        assert tracer.trace_events(10) == [] and tracer.trace_lag() == 0
        assert tracer.check_trace_endpoint("http://127.0.0.1:4318/v1/traces")
        auditor = mf.auditor("mf_auditor")
        assert [r["memory_id"] for r in auditor.records_as_of("acme", now)] == [
            uuid.UUID(memory_id)
        ]
        assert auditor.profile_at("acme", "user-8842", now) == []
        assert auditor.subject_events("acme", "user-8842", now - timedelta(hours=1), now)
        committer = mf.committer("mf_committer")
        assert committer.run_decay(now=now, batch=10)["expired"] == 0
        assert committer.commit_pending(5) == {"committed": 0, "rejected": 0, "retry": 0}
        erasure = committer.request_subject_erasure("acme", "user-8842", "subject asked")
        assert committer.working_erasure_scope(erasure.approval_id) is not None
        assert mf.consolidator("mf_consolidator").review_queue("acme") == []
