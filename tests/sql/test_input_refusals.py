"""Input the API used to accept, each now refused where it enters: the SQLSTATE docs/errors.md
names for it (22023 unless a closer one is listed), a hint, and nothing written.

A question the database cannot answer (which tenant, which host) is refused, never answered
"allowed"; a list that names an item twice is refused, not deduplicated in silence; a
position or time that would stop a worker for good is refused.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, Fabric, episode

pytestmark = pytest.mark.rollback

MORE = ("instance_config", "tenant_agents", "tenant_agent_tools", "approvals", "projection_cursors")


def world(fabric: Fabric) -> dict[str, Any]:
    """Row counts of every table these calls could write, and the trace cursor."""
    counts: dict[str, Any] = {**fabric.counts(), **{t: fabric.count(t) for t in MORE}}
    row = (
        fabric.session(None)
        .execute("SELECT to_jsonb(c) FROM fabric.projection_cursors c ORDER BY projection")
        .fetchall()
    )
    counts["cursors"] = [r[0] for r in row]
    row = fabric.session(None).execute("SELECT to_jsonb(c) FROM fabric.instance_config c")
    counts["instances"] = sorted(str(r[0]) for r in row.fetchall())
    return counts


def refused(
    fabric: Fabric, send: Callable[[], Any], sqlstate: str, hint: bool = True
) -> psycopg.Error:
    before = world(fabric)
    with pytest.raises(psycopg.Error) as info:
        send()
    error = info.value
    assert error.sqlstate == sqlstate, (error.sqlstate, str(error))
    assert error.diag.message_hint or not hint, "no hint"
    assert world(fabric) == before, "a refused input wrote something"
    return error


def call(fabric: Fabric, login: str, query: str, *args: Any) -> Any:
    row = fabric.connect(login).execute(query, args).fetchone()
    assert row is not None
    return row[0]


# --- check_working_uri: a tenant that exists, a URI with a host ----------------------------


@pytest.mark.parametrize(
    ("tenant", "sqlstate"), [(None, "22023"), ("", "22023"), ("no-such-tenant", "P0002")]
)
def test_check_working_uri_refuses_a_missing_or_unknown_tenant(
    fabric: Fabric, tenant: str | None, sqlstate: str
) -> None:
    refused(
        fabric,
        lambda: call(
            fabric,
            "mf_admin",
            "SELECT fabric_api.check_working_uri(%s, 'redis://127.0.0.1:6379/0')",
            tenant,
        ),
        sqlstate,
    )


@pytest.mark.parametrize("uri", [None, "", "garbage", "redis://"])
def test_check_working_uri_refuses_a_uri_without_a_host(fabric: Fabric, uri: str | None) -> None:
    refused(
        fabric,
        lambda: call(fabric, "mf_admin", "SELECT fabric_api.check_working_uri('acme', %s)", uri),
        "22023",
    )


def test_check_working_uri_still_answers_a_real_question(fabric: Fabric) -> None:
    for uri in ("redis://127.0.0.1:6379/0", "unix:///run/redis.sock", "rediss://cache:6380/0"):
        call(fabric, "mf_agent_a", "SELECT fabric_api.check_working_uri('acme', %s)", uri)


# --- check_trace_endpoint: an endpoint with a host ---------------------------------------


@pytest.mark.parametrize("endpoint", [None, "", "garbage", "http://", "127.0.0.1:4318"])
def test_check_trace_endpoint_refuses_an_endpoint_without_a_host(
    fabric: Fabric, endpoint: str | None
) -> None:
    refused(
        fabric,
        lambda: call(fabric, "mf_tracer", "SELECT fabric_api.check_trace_endpoint(%s)", endpoint),
        "22023",
    )
    assert call(fabric, "mf_tracer", "SELECT fabric_api.check_trace_endpoint('http://[::1]:4318')")


# --- configure_instance: NULL is the default instance, '' is no identifier ----------------


def test_configure_instance_refuses_an_empty_instance_id(fabric: Fabric) -> None:
    error = refused(
        fabric,
        lambda: call(
            fabric,
            "mf_admin",
            "SELECT fabric_api.configure_instance('acme', '', %s)",
            Jsonb({"min_corroborating_episodes": 5}),
        ),
        "22023",
    )
    assert (error.diag.message_primary or "").startswith("business_instance_id")


def test_configure_instance_with_null_configures_the_default_instance(fabric: Fabric) -> None:
    instances = fabric.count("instance_config")
    answer = call(
        fabric,
        "mf_admin",
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb({"min_corroborating_episodes": 5}),
    )
    assert answer["min_corroborating_episodes"] == 5
    assert fabric.count("instance_config") == instances
    assert (
        fabric.count(
            "instance_config",
            "tenant_id = 'acme' AND business_instance_id = '' AND min_corroborating_episodes = 5",
        )
        == 1
    )


# --- propose: content that says nothing, a source named twice ------------------------------


def propose_many(fabric: Fabric, envelopes: list[dict[str, Any]], run: uuid.UUID) -> Any:
    return call(
        fabric, "mf_agent_a", "SELECT fabric_api.propose_many(%s, %s)", Jsonb(envelopes), run
    )


def test_empty_content_is_refused_by_propose_and_propose_many(fabric: Fabric) -> None:
    run = fabric.open_run()
    env = episode(content={})
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", env, run), "22023")
    assert (error.diag.message_primary or "").startswith("content ")
    before = world(fabric)
    (answer,) = propose_many(fabric, [env], run)
    assert (answer["status"], answer["sqlstate"]) == ("error", "22023"), answer
    assert world(fabric) == before
    item = {"event_id": "evt-turn-1", "content": {}}
    refused(
        fabric,
        lambda: call(fabric, "mf_agent_a", "SELECT fabric_api.handoff(%s, %s)", Jsonb([item]), run),
        "22023",
    )


def test_empty_content_is_refused_by_import(fabric: Fabric) -> None:
    element = {
        "scope": {"tenant_id": "acme", "subject_id": "user-8842", "visibility": "subject"},
        "content": {},
        "confidence": 0.9,
    }
    before = world(fabric)
    answer = call(
        fabric,
        "mf_committer",
        "SELECT fabric_api.import_records('acme', 'imp-empty', %s)",
        Jsonb([element]),
    )
    assert answer["formed"] == 0, answer
    assert answer["refusals"] == [
        {"position": 0, "sqlstate": "22023", "reason": "content must not be empty"}
    ]
    assert fabric.count("memory_records") == before["memory_records"]
    assert fabric.count("proposals") == before["proposals"]


@pytest.mark.parametrize("case", ["same-text", "upper-and-lower"])
def test_a_source_named_twice_in_derived_from_is_refused(fabric: Fabric, case: str) -> None:
    run = fabric.open_run()
    source = fabric.form(run)
    twice = [source, source if case == "same-text" else source.upper()]
    env = episode(tier="semantic", content={"key": "k", "value": "v"}, derived_from=twice)
    error = refused(fabric, lambda: fabric.propose("mf_agent_a", env, run), "22023")
    assert (error.diag.message_primary or "").startswith("derived_from ")
    before = world(fabric)
    (answer,) = propose_many(fabric, [env], run)
    assert (answer["status"], answer["sqlstate"]) == ("error", "22023"), answer
    assert world(fabric) == before
    once = episode(tier="semantic", content={"key": "k", "value": "v"}, derived_from=[source])
    assert fabric.propose("mf_agent_a", once, run)["status"] == "validated"


# --- recall: each tier once ------------------------------------------------------------------


@pytest.mark.parametrize("repeat", [2, 10_000])
def test_recall_refuses_a_tier_named_twice(fabric: Fabric, repeat: int) -> None:
    run = fabric.open_run()
    request = {"run_id": str(run), "tiers": ["semantic"] * repeat}
    error = refused(fabric, lambda: fabric.recall("mf_agent_a", request), "22023")
    assert (error.diag.message_primary or "").startswith("tiers ")


# --- tools: each once --------------------------------------------------------------------


def test_enable_agent_refuses_a_tool_named_twice(fabric: Fabric) -> None:
    tools = ["tool:memory-recall"] * 10_000
    refused(
        fabric,
        lambda: call(
            fabric,
            "mf_admin",
            "SELECT fabric_api.enable_agent('globex', 'com-agt-005', %s)",
            tools,
        ),
        "22023",
    )


def test_open_run_refuses_a_tool_named_twice(fabric: Fabric) -> None:
    tools = [*MEMORY_TOOLS, *["tool:memory-recall"] * 10_000]
    refused(fabric, lambda: fabric.open_run(tools=tools), "22023")


# --- the trace cursor: only to an event the feed served -------------------------------------


@pytest.mark.parametrize(
    "position",
    [
        ("18446744073709551615", str(uuid.uuid4())),  # past every event: tracing would stop
        ("1", str(uuid.uuid4())),  # no such event
    ],
)
def test_set_trace_cursor_refuses_a_position_the_feed_never_served(
    fabric: Fabric, position: tuple[str, str]
) -> None:
    refused(
        fabric,
        lambda: call(
            fabric, "mf_tracer", "SELECT fabric_api.set_trace_cursor(%s::xid8, %s)", *position
        ),
        "22023",
    )


@pytest.mark.clone
def test_set_trace_cursor_moves_to_a_served_event(fabric: Fabric) -> None:
    run = fabric.open_run()
    fabric.recall("mf_agent_a", {"run_id": str(run)})
    fabric.settle()
    (last,) = call(fabric, "mf_tracer", "SELECT fabric_api.trace_events(500)")[-1:]
    moved = call(
        fabric,
        "mf_tracer",
        "SELECT fabric_api.set_trace_cursor(%s::xid8, %s)",
        last["xid"],
        last["event_id"],
    )
    assert moved == {"xid": last["xid"], "event_id": last["event_id"]}
    assert call(fabric, "mf_tracer", "SELECT fabric_api.trace_lag()") == 0


# --- decay: at a finite time -----------------------------------------------------------------


def test_run_decay_refuses_minus_infinity(fabric: Fabric) -> None:
    fabric.form(fabric.open_run(), retention_class="operational")
    refused(
        fabric,
        lambda: call(fabric, "mf_committer", "SELECT fabric_api.run_decay('-infinity')"),
        "22023",
    )


# --- PostgreSQL's own input errors, as docs/errors.md lists them -----------------------------


def test_json_nested_past_the_servers_stack_is_54001_and_maps_to_limit_exceeded(
    fabric: Fabric,
) -> None:
    from memfabric.errors import LimitExceeded, from_sqlstate

    run = fabric.open_run()
    deep = '{"a": ' + "[" * 30_000 + "]" * 30_000 + "}"
    raw = json.dumps(episode(content={"a": 1})).replace('{"a": 1}', deep)
    refused(
        fabric,
        lambda: call(fabric, "mf_agent_a", "SELECT fabric_api.propose(%s::jsonb, %s)", raw, run),
        "54001",
        hint=False,  # PostgreSQL's own error, raised while it reads the argument
    )
    assert from_sqlstate("54001") is LimitExceeded


def test_a_confidence_with_more_digits_than_numeric_holds_is_22003(fabric: Fabric) -> None:
    run = fabric.open_run()
    long = "0." + "1" * 17_000
    raw = json.dumps(episode()).replace('"confidence": 0.9', f'"confidence": {long}')
    refused(
        fabric,
        lambda: call(fabric, "mf_agent_a", "SELECT fabric_api.propose(%s::jsonb, %s)", raw, run),
        "22003",
        hint=False,
    )
