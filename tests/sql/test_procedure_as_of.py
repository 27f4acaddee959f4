"""Procedures replayed as they were: an agent (not only the auditor) reads the version of a
procedure that was current at a time T, to replay a run against it, within its run's scope
and audited like a recall (fabric_api.recall_procedure_as_of)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback

V1_FROM = "2026-07-02T09:14:00Z"  # episode()'s default valid_from
AUG = "2026-08-01T00:00:00Z"
V2_FROM = "2026-09-01T00:00:00Z"


def as_of(fabric: Fabric, login: str, request: dict[str, Any]) -> dict[str, Any]:
    return fabric.call(  # type: ignore[no-any-return]
        login, "SELECT fabric_api.recall_procedure_as_of(%s)", Jsonb(request)
    )


@pytest.fixture
def run(fabric: Fabric) -> uuid.UUID:
    return fabric.open_run()


@pytest.fixture
def chain(fabric: Fabric, run: uuid.UUID) -> tuple[str, str]:
    """A refund procedure at 1.0.0 from V1_FROM, superseded by 1.1.0 from V2_FROM."""
    ep = fabric.form(run)
    v1 = fabric.form(
        run,
        tier="procedural",
        content={"key": "skill.refund", "value": "steps of 1.0.0"},
        derived_from=[ep],
        version="1.0.0",
    )
    env = episode(
        "x",
        tier="procedural",
        content={"key": "skill.refund", "value": "steps of 1.1.0"},
        derived_from=[ep],
        version="1.1.0",
        validity_interval={"valid_from": V2_FROM},
    )
    proposal = fabric.propose("mf_agent_a", env, run)["proposal_id"]
    v2 = fabric.call("mf_committer", "SELECT fabric_api.supersede(%s, %s)", v1, proposal)
    return v1, str(v2["memory_id"])


def test_the_version_current_at_valid_at_is_served_from_any_version(
    fabric: Fabric, run: uuid.UUID, chain: tuple[str, str]
) -> None:
    v1, v2 = chain
    for start in (v1, v2):
        for valid_at, expected in (
            (AUG, [v1]),
            (V2_FROM, [v2]),  # the successor from its valid_from on
            ("2026-10-01T00:00:00Z", [v2]),
            ("2026-01-01T00:00:00Z", []),  # before the procedure existed
        ):
            answer = as_of(
                fabric,
                "mf_agent_a",
                {"run_id": str(run), "memory_id": start, "valid_at": valid_at},
            )
            assert answer["status"] == "served"
            assert [r["memory_id"] for r in answer["records"]] == expected, (start, valid_at)
    past = as_of(fabric, "mf_agent_a", {"run_id": str(run), "memory_id": v2, "valid_at": AUG})[
        "records"
    ][0]
    assert past["content"]["value"] == "steps of 1.0.0" and past["version"] == "1.0.0"
    # plain recall serves live records only: the superseded version is not among them
    recalled = fabric.recall(
        "mf_agent_a",
        {"run_id": str(run), "tiers": ["procedural"], "filters": {"valid_at": AUG}},
    )
    assert v1 not in [r["memory_id"] for r in recalled["records"]]


def test_each_answer_is_audited_as_a_recall(
    fabric: Fabric, run: uuid.UUID, chain: tuple[str, str]
) -> None:
    v1, v2 = chain
    before = len(fabric.events("event_type = 'memory.recall.served'"))
    as_of(
        fabric,
        "mf_agent_a",
        {"run_id": str(run), "memory_id": v2, "valid_at": AUG, "correlation_id": "c-1"},
    )
    served = fabric.events("event_type = 'memory.recall.served'")
    assert len(served) == before + 1
    assert served[-1]["payload"]["memory_ids"] == [v1]
    assert served[-1]["payload"]["tiers_served"] == ["procedural"]


def test_a_version_outside_the_runs_scope_is_never_served(
    fabric: Fabric, chain: tuple[str, str]
) -> None:
    v1, v2 = chain
    other_subject = fabric.open_run(subject="user-9999")
    answer = as_of(
        fabric,
        "mf_agent_a",
        {"run_id": str(other_subject), "memory_id": v2, "valid_at": AUG},
    )
    assert answer["status"] == "served" and answer["records"] == []
    # another tenant's agent names the same id: nothing of acme
    globex = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    answer = as_of(fabric, "mf_agent_g", {"run_id": str(globex), "memory_id": v1, "valid_at": AUG})
    assert answer["records"] == []


def test_an_agent_that_may_not_read_procedures_is_denied(
    fabric: Fabric, chain: tuple[str, str]
) -> None:
    v1, _ = chain
    run_r = fabric.open_run(agent_id="com-agt-005")
    answer = as_of(fabric, "mf_agent_r", {"run_id": str(run_r), "memory_id": v1, "valid_at": AUG})
    assert answer["status"] == "denied" and answer["records"] == []
    assert "procedural" in answer["reason"]
    no_tools = fabric.open_run(agent_id="com-agt-003", tools=[])
    answer = as_of(
        fabric, "mf_agent_a", {"run_id": str(no_tools), "memory_id": v1, "valid_at": AUG}
    )
    assert answer["status"] == "denied" and "tool:memory-recall" in answer["reason"]


@pytest.mark.parametrize(
    "request_",
    [
        {"memory_id": "V1", "valid_at": AUG},
        {"run_id": "RUN", "valid_at": AUG},
        {"run_id": "RUN", "memory_id": "V1"},
        {"run_id": "RUN", "memory_id": "V1", "valid_at": AUG, "tiers": ["semantic"]},
        {"run_id": "RUN", "memory_id": 7, "valid_at": AUG},
    ],
    ids=["no-run", "no-memory-id", "no-valid-at", "unknown-key", "id-not-text"],
)
def test_a_malformed_request_is_refused_and_writes_nothing(
    fabric: Fabric, run: uuid.UUID, chain: tuple[str, str], request_: dict[str, Any]
) -> None:
    v1, _ = chain
    request = {k: (str(run) if v == "RUN" else v1 if v == "V1" else v) for k, v in request_.items()}
    before = fabric.counts()
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        as_of(fabric, "mf_agent_a", request)
    assert fabric.counts() == before


def test_a_valid_at_that_is_no_timestamp_is_refused_and_writes_nothing(
    fabric: Fabric, run: uuid.UUID, chain: tuple[str, str]
) -> None:
    v1, _ = chain
    before = fabric.counts()
    with pytest.raises(psycopg.errors.InvalidDatetimeFormat):
        as_of(fabric, "mf_agent_a", {"run_id": str(run), "memory_id": v1, "valid_at": "yesterday"})
    assert fabric.counts() == before


def test_a_foreign_run_is_refused_and_writes_nothing(
    fabric: Fabric, run: uuid.UUID, chain: tuple[str, str]
) -> None:
    v1, _ = chain
    before = fabric.counts()
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_of(fabric, "mf_agent_r", {"run_id": str(run), "memory_id": v1, "valid_at": V1_FROM})
    assert fabric.counts() == before


def test_a_longer_chain_is_walked_both_ways_from_the_middle(
    fabric: Fabric, run: uuid.UUID, chain: tuple[str, str]
) -> None:
    v1, v2 = chain
    env = episode(
        "x",
        tier="procedural",
        content={"key": "skill.refund", "value": "steps of 2.0.0"},
        derived_from=[fabric.form(run)],
        version="2.0.0",
        validity_interval={"valid_from": "2026-10-15T00:00:00Z"},
    )
    proposal = fabric.propose("mf_agent_a", env, run)["proposal_id"]
    v3 = str(
        fabric.call("mf_committer", "SELECT fabric_api.supersede(%s, %s)", v2, proposal)[
            "memory_id"
        ]
    )
    for valid_at, expected in (
        (AUG, v1),
        ("2026-09-15T00:00:00Z", v2),
        ("2026-11-01T00:00:00Z", v3),
    ):
        answer = as_of(
            fabric, "mf_agent_a", {"run_id": str(run), "memory_id": v2, "valid_at": valid_at}
        )
        assert [r["memory_id"] for r in answer["records"]] == [expected], valid_at
