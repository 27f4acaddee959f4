"""Governed recall with fewer PL/pgSQL layers (docs/benchmarks.md, "Governed recall: fewer
layers"): the helpers that became SQL functions the planner inlines, the common request told
well formed by one expression, and recall's event written without fabric._emit answer and
refuse exactly as before. The recall tests hold the answers; these hold what was moved."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import re
import uuid
from typing import Any

from psycopg.types.json import Jsonb

from conftest import Fabric

RUN_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
GOOD = "9c0e5c5e-1b2d-4f3a-8e7d-0a1b2c3d4e5f"
RUN_IDS = [
    GOOD,
    GOOD.upper(),
    "9C0e5c5e-1B2d-4f3a-8E7d-0a1b2c3d4E5f",
    "00000000-0000-0000-0000-000000000000",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
    GOOD.replace("-", ""),  # 32 digits: a valid uuid, not the pattern
    "{" + GOOD + "}",
    GOOD[:-1],
    GOOD + "0",
    GOOD[:8] + GOOD[9] + "-" + GOOD[10:],  # a hyphen one place off
    GOOD[:9] + "-" + GOOD[10:],  # five hyphens
    GOOD.replace("a", "g"),
    GOOD.replace("e", "E").replace("0", "\uff10"),  # fullwidth zero
    GOOD.replace("1", "\u0661"),  # Arabic-Indic one
    GOOD.replace("a", "\uff41"),  # fullwidth a
    GOOD.replace("-", "\u2010"),  # Unicode hyphen
    GOOD[:35] + " ",
    " " + GOOD[1:],
    "",
    "run",
]
SHAPES: list[dict[str, Any]] = [
    {},
    {"tiers": ["episodic"]},
    {"tiers": ["semantic", "episodic"], "limit": 8},
    {"tiers": ["episodic", "episodic"]},
    {"tiers": ["episodic", "nope"]},
    {"tiers": "episodic"},
    {"tiers": []},
    {"limit": 8, "query": "invoices"},
    {"limit": 0},
    {"limit": 8.5},
    {"limit": "8"},
    {"limit": 2147483648},
    {"query": None},
    {"query": 7},
    {"query": "x" * 1001},
    {"mode": "text"},
    {"mode": "hybrid", "query": "billing entity"},
    {"mode": "semantic", "query": " \t"},
    {"mode": "graph"},
    {"mode": "fuzzy", "query": "x"},
    {"allow_partial": True, "requesting_agent": "com-agt-003"},
    {"allow_partial": "yes"},
    {"requesting_agent": 3},
    {"correlation_id": "corr-1", "causation_id": "cause-1"},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    {"filters": {"min_confidence": 0.5}},
    {"scope": {"visibility": "subject"}},
    {"unknown": 1},
]


def test_the_common_request_check_accepts_only_what_the_full_check_accepts(
    fabric: Fabric,
) -> None:
    """Every request fabric._recall_request_is_common passes, the full check passes too (it
    is run alone by adding an empty scope, which it accepts and the common check does not
    cover): over every run_id and shape below, 560 requests."""
    requests = [{"run_id": run_id, **shape} for run_id, shape in itertools.product(RUN_IDS, SHAPES)]
    requests += [{"run_id": 7}, {"tiers": ["episodic"]}, {"run_id": None}]
    with fabric.su() as c:
        rows = c.execute(
            "SELECT r, fabric._recall_request_is_common(r),"
            " fabric._recall_request_problem(r || '{\"scope\": {}}'),"
            " fabric._recall_request_problem(r)"
            " FROM jsonb_array_elements(%s) AS r",
            (Jsonb(requests),),
        ).fetchall()
    assert len(rows) == len(requests)
    for request, common, full, problem in rows:
        if common:
            assert full is None and problem is None, (request, full)
        # the run_id rule is the full check's pattern, letter for letter
        if set(request) == {"run_id"}:
            expected = isinstance(request["run_id"], str) and bool(
                RUN_ID.fullmatch(request["run_id"])
            )
            assert bool(common) is expected, request
            assert (problem is None) is expected, (request, problem)
    # and it covers the requests recall sees most
    covered = {json_key(r) for r, common, _, _ in rows if common}
    for shape in [*SHAPES[:3], SHAPES[7], SHAPES[15], SHAPES[16], SHAPES[20], SHAPES[23]]:
        assert json_key({"run_id": GOOD, **shape}) in covered, shape


def json_key(request: dict[str, Any]) -> str:
    return repr(sorted(request.items()))


def test_a_recall_event_carries_the_envelope_emit_writes(fabric: Fabric) -> None:
    """recall writes its one event itself, with fabric._emit's envelope: the actor and the run
    of the context, the request's correlation and causation ids, the login, a time-ordered id,
    no memory or proposal id; served and denied alike."""
    run = fabric.open_run()
    fabric.form(run, "invoices in EUR please")
    base = {"run_id": str(run), "correlation_id": "corr-7", "causation_id": "cause-7"}
    assert fabric.recall("mf_agent_a", base)["status"] == "served"
    assert fabric.recall("mf_agent_a", {**base, "scope": {"agent_id": "x"}})["status"] == "denied"
    events = fabric.events("event_type LIKE 'memory.recall.%'")
    assert [e["event_type"] for e in events] == ["memory.recall.served", "memory.recall.denied"]
    for event in events:
        assert uuid.UUID(event["event_id"]).version == 7
        assert event["tenant_id"] == "acme"
        assert event["actor_agent_id"] == "com-agt-003"
        assert event["actor_login"] == "mf_agent_a"
        assert event["run_id"] == str(run)
        assert (event["correlation_id"], event["causation_id"]) == ("corr-7", "cause-7")
        assert event["memory_id"] is None and event["proposal_id"] is None
        assert event["payload"]["agent_id"] == "com-agt-003"
    # the same envelope as an event fabric._emit writes in the same context
    opened = fabric.events(f"event_type = 'fabric.run.opened' AND run_id = '{run}'")
    assert set(opened[0]) == set(events[0])


def test_a_pseudonym_is_the_hmac_of_its_kind_and_value(fabric: Fabric) -> None:
    """fabric._pseudonym, now an SQL function inlined where it is called, gives the same
    HMAC-SHA-256 as before; no key or no value gives none."""
    key = bytes(range(32))
    with fabric.su() as c:
        row = c.execute(
            "SELECT fabric._pseudonym(%s, 'session', 'sess-1f9c'),"
            " fabric._pseudonym(%s, 'request', %s),"
            " fabric._pseudonym(NULL, 'session', 'sess-1f9c'),"
            " fabric._pseudonym(%s, 'session', NULL)",
            (key, key, '{"run_id": "é"}', key),
        ).fetchone()
    assert row is not None
    expect = "hmac:" + hmac.new(key, b"session:sess-1f9c", hashlib.sha256).hexdigest()
    request = "request:" + '{"run_id": "é"}'
    assert row[0] == expect
    assert row[1] == "hmac:" + hmac.new(key, request.encode(), hashlib.sha256).hexdigest()
    assert row[2] is None and row[3] is None


def test_the_tool_layers_and_a_runs_liveness_as_before(fabric: Fabric) -> None:
    """fabric._tool_layers_missing and fabric._run_is_live, inlined: each missing layer named
    in order, a closed or expired run not live."""
    run = fabric.open_run(tools=["tool:memory-propose"])
    rows = (
        fabric.session(None)
        .execute(
            "SELECT fabric._tool_layers_missing(a, e, r, t), fabric._run_is_live(r),"
            " fabric._run_is_live(jsonb_populate_record(r,"
            "   jsonb_build_object('expires_at', now() - interval '1 second'))),"
            " fabric._run_is_live(jsonb_populate_record(r, jsonb_build_object('closed_at', now())))"
            " FROM fabric.runs r, (VALUES (true, true, 'tool:memory-propose'),"
            "   (false, true, 'tool:memory-propose'), (true, false, 'tool:memory-recall'),"
            "   (false, false, 'tool:memory-recall'), (NULL, NULL, 'tool:memory-recall'))"
            "   AS x(a, e, t) WHERE r.run_id = %s",
            (run,),
        )
        .fetchall()
    )
    assert [r[0] for r in rows] == [
        [],
        ["tools_allowed"],
        ["tenant_enablement", "active_tool_set"],
        ["tools_allowed", "tenant_enablement", "active_tool_set"],
        ["tools_allowed", "tenant_enablement", "active_tool_set"],
    ]
    assert {(r[1], r[2], r[3]) for r in rows} == {(True, False, False)}


def test_the_answer_and_event_from_a_list_of_records_are_those_from_an_array(
    fabric: Fabric,
) -> None:
    """Filter-only, text, semantic and graph recall hand fabric._recall_answer their records
    as a list (jsonb[]), which goes into the answer's encoding once; the answer and the event
    are exactly those the same records as a jsonb array give (the memory ids read from the
    records, when the caller does not give them)."""
    run = fabric.open_run()
    for text in ("invoices in EUR please", "the billing entity is ACME GmbH", "ship to Berlin"):
        fabric.form(run, text)
    served = fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
    assert served["status"] == "served" and len(served["records"]) == 3
    s = fabric.session(None)
    rows = s.execute(
        "SELECT fabric._recall_answer(r, q, 'served', NULL, x.resolved, %(records)s, true,"
        "   x.served, NULL, NULL, NULL),"
        " fabric._recall_answer(r, q, 'served', NULL, x.resolved, NULL, true, x.served, NULL,"
        "   NULL, ARRAY(SELECT jsonb_array_elements(%(records)s)))"
        " FROM fabric.runs r, (SELECT %(request)s::jsonb) AS y(q),"
        " LATERAL (SELECT fabric.resolve_recall_scope(a.memory_profile, r, y.q),"
        '   \'{"mode_served": "text", "tiers_served_lexically": ["episodic"]}\'::jsonb'
        "   FROM fabric.agents a WHERE a.agent_id = r.agent_id) AS x(resolved, served)"
        " WHERE r.run_id = %(run)s",
        {
            "records": Jsonb(served["records"]),
            "request": Jsonb({"run_id": str(run), "correlation_id": "c-1"}),
            "run": run,
        },
    ).fetchall()
    assert len(rows) == 1
    from_array, from_list = rows[0]
    assert from_list == from_array
    assert from_list["records"] == served["records"]
    payloads = [
        {k: v for k, v in e["payload"].items() if k != "duration_ms"}
        for e in fabric.events("event_type = 'memory.recall.served' AND correlation_id = 'c-1'")
    ]
    assert len(payloads) == 2 and payloads[0] == payloads[1]
    assert payloads[0]["memory_ids"] == [r["memory_id"] for r in served["records"]]
