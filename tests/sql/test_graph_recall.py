"""Graph recall in the database: where a walk starts (entity ids of the query's entities in
the caller's scope, else the subject; never names), the walk's candidates re-checked like
vector candidates (scope, tenant, state, erasure), fused with the other lists in hybrid,
and `mode_served` saying what answered."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback


def mentioning(text: str, *declared: dict[str, str]) -> dict[str, Any]:
    return episode(content={"text": text, "entities": list(declared)})


DANA = {"type": "person", "name": "Dana Scully"}
INITECH = {"type": "organization", "name": "Initech"}
LISBON = {"type": "location", "name": "Lisbon"}


@pytest.fixture
def world(fabric: Fabric) -> dict[str, Any]:
    run = fabric.open_run()
    works = fabric.form(run, envelope=mentioning("Dana Scully works for Initech", DANA, INITECH))
    based = fabric.form(run, envelope=mentioning("Initech is based in Lisbon", INITECH, LISBON))
    other_run = fabric.open_run(subject="user-9999")
    other = fabric.form(other_run, envelope=mentioning("Initech pays late", INITECH))
    return {"run": str(run), "works": works, "based": based, "other": other}


def recall(fabric: Fabric, request: dict[str, Any]) -> dict[str, Any]:
    return fabric.recall("mf_agent_a", request)


def entity_id(fabric: Fabric, key: str) -> str:
    row = (
        fabric.session(None)
        .execute("SELECT entity_id::text FROM fabric.entities WHERE entity_key = %s", (key,))
        .fetchone()
    )
    assert row is not None
    return str(row[0])


def test_a_graph_recall_starts_from_the_querys_entities_as_ids(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    request = {"run_id": world["run"], "query": "Where is Dana Scully's employer?", "mode": "graph"}
    resolved = recall(fabric, request)
    assert resolved["status"] == "resolved"
    assert resolved["graph"] == {
        "seeds": [entity_id(fabric, "name:dana scully")],
        "hops": 2,
        "via": ["MENTIONS"],
        "tiers": ["episodic", "procedural", "profile", "semantic"],
    }
    assert "Dana" not in str(resolved)
    expanded = recall(fabric, request | {"mode": "hybrid", "expand": {"hops": 3}})
    assert expanded["graph"]["hops"] == 3


def test_expand_via_names_the_edge_kinds_the_walk_follows(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    request = {"run_id": world["run"], "query": "Dana Scully", "mode": "hybrid"}
    via = ["SUPERSEDES", "INFLUENCED", "DERIVED_FROM", "SUPERSEDES"]
    resolved = recall(fabric, request | {"expand": {"hops": 2, "via": via}})
    assert resolved["graph"]["via"] == ["DERIVED_FROM", "INFLUENCED", "SUPERSEDES"]
    graph = recall(fabric, request | {"mode": "graph", "expand": {"hops": 1, "via": ["MENTIONS"]}})
    assert graph["graph"]["via"] == ["MENTIONS"]


def test_a_query_naming_no_entity_starts_from_the_subject_in_mode_graph_only(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    resolved = recall(fabric, {"run_id": world["run"], "query": "what then", "mode": "graph"})
    assert resolved["graph"]["seeds"] == [entity_id(fabric, "subject:user-8842")]
    # one list among others, the subject would rank nothing: expand starts from nowhere
    expanded = recall(
        fabric,
        {"run_id": world["run"], "query": "what then", "mode": "hybrid", "expand": {"hops": 2}},
    )
    assert expanded["graph"]["seeds"] == []


def test_an_entity_only_records_out_of_scope_mention_is_no_seed(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    run = fabric.open_run(subject="user-9999")
    fabric.form(run, envelope=mentioning("Oslo office", {"type": "location", "name": "Oslo"}))
    resolved = recall(fabric, {"run_id": world["run"], "query": "Oslo", "mode": "graph"})
    assert resolved["graph"]["seeds"] == [entity_id(fabric, "subject:user-8842")]


def test_graph_candidates_are_rechecked_like_vector_candidates(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    candidates = [
        {"memory_id": world["other"], "score": 5},  # another subject's record
        {"memory_id": str(uuid.uuid4()), "score": 4},  # no such record
        {"memory_id": world["based"], "score": 2},
        {"memory_id": world["works"], "score": 3},
    ]
    answer = recall(
        fabric,
        {"run_id": world["run"], "query": "Dana", "mode": "graph", "graph_candidates": candidates},
    )
    assert answer["status"] == "served" and answer["mode_served"] == "graph"
    assert [r["memory_id"] for r in answer["records"]] == [world["works"], world["based"]]
    assert [r["retrieval"] for r in answer["records"]] == [{"graph": 1}, {"graph": 2}]


def test_hybrid_fuses_the_graph_list_and_says_so(fabric: Fabric, world: dict[str, Any]) -> None:
    request = {"run_id": world["run"], "query": "Lisbon", "mode": "hybrid", "expand": {"hops": 2}}
    recall(fabric, request)  # the resolution
    answer = recall(
        fabric,
        request
        | {"candidates": [], "graph_candidates": [{"memory_id": world["works"], "score": 1}]},
    )
    assert answer["mode_served"] == "hybrid+graph"
    by_id = {r["memory_id"]: r["retrieval"] for r in answer["records"]}
    assert by_id == {world["based"]: {"lexical": 1}, world["works"]: {"graph": 1}}
    # without the graph (no server answered), the same request is plain hybrid
    recall(fabric, request)
    plain = recall(fabric, request | {"candidates": []})
    assert plain["mode_served"] == "hybrid"
    assert [r["memory_id"] for r in plain["records"]] == [world["based"]]


@pytest.mark.parametrize(
    "change",
    [
        {"mode": "graph", "query": "  "},
        {"mode": "graph", "query": None},
        {"mode": "text", "expand": {"hops": 2}},
        {"mode": "hybrid", "expand": {"hops": 4}},
        {"mode": "hybrid", "expand": {"hops": "2"}},
        {"mode": "hybrid", "expand": {}},
        {"mode": "hybrid", "expand": {"hops": 1, "via": ["LIKES"]}},
        {"mode": "hybrid", "expand": {"hops": 1, "via": ["MENTIONS", "mentions"]}},
        {"mode": "hybrid", "expand": {"hops": 1, "via": []}},
        {"mode": "hybrid", "expand": {"hops": 1, "via": "MENTIONS"}},
        {"mode": "hybrid", "expand": {"hops": 1, "via": [1]}},
        {"mode": "hybrid", "expand": {"hops": 1, "via": ["TOUCHED"]}},
        {"mode": "hybrid", "expand": {"hops": 1, "via": ["MENTIONS"] * 5}},
        {"mode": "hybrid", "expand": {"hops": 1, "depth": 1}},
        {"mode": "hybrid", "graph_candidates": []},
        {"graph_candidates": []},
        {"mode": "graph", "graph_candidates": [{"memory_id": "x", "score": 1}]},
        {"mode": "graph", "graph_candidates": {}},
    ],
)
def test_malformed_graph_requests_are_refused(
    fabric: Fabric, world: dict[str, Any], change: dict[str, Any]
) -> None:
    before = fabric.count("events")
    with pytest.raises(psycopg.Error) as info:
        recall(fabric, {"run_id": world["run"], "query": "Dana"} | change)
    assert info.value.sqlstate == "22023"
    assert fabric.count("events") == before


def touches(fabric: Fabric, entity: str) -> list[tuple[Any, ...]]:
    with fabric.acting("mf_auditor") as conn:
        return conn.execute(
            "SELECT agent_id, run_id::text, correlation_id"
            " FROM fabric_audit.entity_touches('acme', %s)",
            (entity,),
        ).fetchall()


def test_a_recall_that_walked_the_graph_records_the_entities_it_touched(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    dana, initech = entity_id(fabric, "name:dana scully"), entity_id(fabric, "name:initech")
    steps = fabric.count("reasoning_steps")
    request = {"run_id": world["run"], "query": "Where does Dana Scully work?", "mode": "hybrid"}
    recall(fabric, request)  # resolving touches nothing
    recall(fabric, request | {"candidates": []})  # nor does a recall without the graph
    assert fabric.count("reasoning_steps") == steps
    expanded = request | {"expand": {"hops": 2}, "correlation_id": "corr-recall-1"}
    recall(fabric, expanded)
    answer = recall(fabric, expanded | {"candidates": [], "graph_candidates": []})
    assert answer["status"] == "served"
    assert touches(fabric, dana) == [("com-agt-003", world["run"], "corr-recall-1")]
    assert touches(fabric, initech) == []  # reached, not started from
    (event,) = fabric.events("event_type = 'memory.reasoning_step.recorded'")
    assert event["correlation_id"] == "corr-recall-1"
    # mode graph without a correlation id: the step gets one of its own
    graph = {"mode": "graph", "graph_candidates": []}
    recall(fabric, {"run_id": world["run"], "query": "Initech"} | graph)
    ((agent, run, correlation),) = touches(fabric, initech)
    assert (agent, run) == ("com-agt-003", world["run"])
    assert correlation.startswith("recall:")
