"""The SDK's calls of the temporal tier and of procedures replayed as they were: each reaches
its function with well-typed arguments, sync and async alike."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb

from conftest import PROFILE_WIDE, Fabric, episode
from memfabric import AsyncFabric
from memfabric import Fabric as SdkFabric

TOOLS = ["tool:memory-propose", "tool:memory-recall", "tool:temporal-read"]
POINTS = [
    {"series": "trading.fill_latency_ms", "at": "2026-08-16T10:05:00Z", "value": 10},
    {"series": "trading.fill_latency_ms", "at": "2026-08-16T10:35:00Z", "value": 20},
]


def test_measurements_and_past_procedures_through_the_sdk(fabric: Fabric) -> None:
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.register_agent('com-agt-003', 'mf_agent_a', %s, %s)",
        Jsonb(PROFILE_WIDE),
        TOOLS,
    )
    fabric.call("mf_admin", "SELECT fabric_api.enable_agent('acme', 'com-agt-003', %s)", TOOLS)
    run = fabric.open_run(tools=TOOLS)
    ep = fabric.form(run)
    v1 = fabric.form(
        run,
        tier="procedural",
        content={"key": "skill.refund", "value": "1.0.0 steps"},
        derived_from=[ep],
        version="1.0.0",
    )
    successor = episode(
        "x",
        tier="procedural",
        content={"key": "skill.refund", "value": "1.1.0 steps"},
        derived_from=[ep],
        version="1.1.0",
        validity_interval={"valid_from": "2026-09-01T00:00:00Z"},
    )
    proposal = fabric.propose("mf_agent_a", successor, run)["proposal_id"]
    v2 = fabric.call("mf_committer", "SELECT fabric_api.supersede(%s, %s)", v1, proposal)

    with SdkFabric(fabric.url, max_size=1) as mf:
        assert mf.workflow("mf_workflow").record_measurements("acme", POINTS) == 2
        agent = mf.agent("mf_agent_a", run, tenant_id="acme")
        answer = agent.read_measurements(
            "trading.fill_latency_ms",
            datetime(2026, 8, 16, tzinfo=UTC),
            "2026-08-17T00:00:00Z",
            "1 hour",
            "sum",
        )
        assert [p["value"] for p in answer["points"]] == [30.0]
        past = agent.recall_procedure_as_of(v2["memory_id"], datetime(2026, 8, 1, tzinfo=UTC))
        assert [str(r.memory_id) for r in past.records] == [v1]
        removed = mf.committer("mf_committer").run_temporal_retention(
            datetime(2027, 6, 1, tzinfo=UTC)
        )
        assert removed == 2

    async def flow() -> tuple[int, Any, list[str]]:
        async with AsyncFabric(fabric.url, max_size=1) as amf:
            written = await amf.workflow("mf_workflow").record_measurements("acme", POINTS)
            agent = amf.agent("mf_agent_a", run, tenant_id="acme")
            read = await agent.read_measurements(
                "trading.fill_latency_ms", "2026-08-16T00:00:00Z", "2026-08-17T00:00:00Z", "1 day"
            )
            past = await agent.recall_procedure_as_of(v1, "2026-10-01T00:00:00Z")
            await amf.committer("mf_committer").run_temporal_retention()
            return written, read["points"][0]["value"], [str(r.memory_id) for r in past.records]

    assert asyncio.run(flow()) == (2, 15.0, [str(v2["memory_id"])])
