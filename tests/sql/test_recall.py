"""Recall (R-RECALL-1, -2): authorized, scope-first, filters pushed into the query, audited."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, Fabric

pytestmark = pytest.mark.rollback

RECALL_ONLY = ["tool:memory-recall"]


def semantic(
    fabric: Fabric, run: uuid.UUID, text: str, sources: list[str], **overrides: Any
) -> str:
    return fabric.form(
        run,
        text,
        tier="semantic",
        derived_from=sources,
        content={"assertion": text},
        **overrides,
    )


def ids(answer: dict[str, Any]) -> list[str]:
    return [r["memory_id"] for r in answer["records"]]


@pytest.fixture
def world(fabric: Fabric) -> dict[str, Any]:
    """Records of every visibility in acme, one in globex with the same subject id."""
    run = fabric.open_run()
    ep = fabric.form(run, "invoices in EUR please")
    w: dict[str, Any] = {"run": run, "episode": ep}
    w["subject"] = semantic(fabric, run, "billing entity is Acme Logistics BV", [ep])
    w["tenant"] = semantic(
        fabric,
        run,
        "acme bills monthly",
        [ep],
        scope={"tenant_id": "acme", "visibility": "tenant"},
        confidence=0.6,
    )
    w["session"] = semantic(
        fabric,
        run,
        "session note about billing",
        [ep],
        scope={"tenant_id": "acme", "visibility": "session"},
    )
    w["agent"] = semantic(
        fabric,
        run,
        "agent private billing heuristic",
        [ep],
        scope={"tenant_id": "acme", "visibility": "agent"},
    )
    grun = fabric.open_run("glx-agt-001", tenant="globex")
    gep = fabric.form(
        grun,
        "globex episode",
        login="mf_agent_g",
        scope={"tenant_id": "globex", "visibility": "subject"},
    )
    w["globex"] = semantic(
        fabric,
        grun,
        "globex billing entity",
        [gep],
        login="mf_agent_g",
        scope={"tenant_id": "globex", "visibility": "subject"},
    )
    return w


def recall_run(fabric: Fabric, agent: str = "com-agt-003", **kw: Any) -> uuid.UUID:
    return fabric.open_run(agent, **kw)


def test_recall_requires_an_open_run_of_the_caller(fabric: Fabric, world: dict[str, Any]) -> None:
    other = fabric.open_run("com-agt-004")
    before = fabric.counts()
    for run_id in (uuid.uuid4(), other):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            fabric.recall("mf_agent_a", {"run_id": str(run_id)})
    assert fabric.counts() == before


def test_malformed_request_is_an_error_that_writes_nothing(fabric: Fabric) -> None:
    run = recall_run(fabric)
    before = fabric.counts()
    for bad in (
        {"run_id": "nope"},
        {"run_id": str(run), "tiers": "semantic"},
        {"run_id": str(run), "limit": 0},
        {"run_id": str(run), "surprise": 1},
        {"run_id": str(run), "filters": {"valid_at": "yesterday"}},
        {"run_id": str(run), "filters": {"min_confidence": 2}},
        {"run_id": str(run), "candidates": [{"memory_id": "x", "score": 1}]},
        # accepted as a uuid by PostgreSQL, but not in the canonical 8-4-4-4-12 form
        {"run_id": str(run), "candidates": [{"memory_id": "{" + str(run) + "}", "score": 1}]},
        {"run_id": str(run), "candidates": [{"memory_id": run.hex, "score": 1}]},
        {
            "run_id": str(run),
            "candidates": [
                {
                    "memory_id": "-".join(run.hex[i : i + 4] for i in (0, 4, 8, 12))
                    + "-"
                    + run.hex[16:],
                    "score": 1,
                }
            ],
        },
    ):
        with pytest.raises(psycopg.Error) as caught:
            fabric.recall("mf_agent_a", bad)
        assert caught.value.sqlstate in ("22023", "22007")
    assert fabric.counts() == before


@pytest.mark.parametrize("layer", ["tools_allowed", "tenant_enablement", "active_tool_set"])
def test_recall_tool_must_hold_in_all_three_layers(fabric: Fabric, layer: str) -> None:
    login, agent, tools = "mf_agent_a", "com-agt-003", MEMORY_TOOLS
    if layer == "tools_allowed":
        login, agent = "mf_agent_notools", "com-agt-009"
    elif layer == "tenant_enablement":
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.enable_agent('acme', 'com-agt-003', ARRAY['tool:memory-propose'])"
        )
    else:
        tools = ["tool:memory-propose"]
    run = fabric.open_run(agent, tools=tools)
    answer = fabric.recall(login, {"run_id": str(run)})
    assert answer["status"] == "denied"
    assert layer in answer["reason"]
    assert answer["records"] == []
    types = [
        e["event_type"]
        for e in fabric.events(f"run_id = '{run}' AND event_type <> 'fabric.run.opened'")
    ]
    assert types == ["agent.tool.unauthorized", "memory.recall.denied"]


@pytest.mark.parametrize(
    "scope",
    [
        {"tenant_id": "globex"},
        {"subject_id": "user-9999"},
        {"session_id": "sess-other"},
        {"agent_id": "com-agt-004"},
    ],
)
def test_recall_can_narrow_but_never_widen_scope(
    fabric: Fabric, world: dict[str, Any], scope: dict[str, str]
) -> None:
    run = recall_run(fabric)
    answer = fabric.recall("mf_agent_a", {"run_id": str(run), "scope": scope})
    assert answer["status"] == "denied"
    assert answer["records"] == []
    denied = fabric.events(f"run_id = '{run}' AND event_type = 'memory.recall.denied'")
    assert len(denied) == 1 and denied[0]["tenant_id"] == "acme"


def test_requesting_agent_other_than_caller_is_denied(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    run = recall_run(fabric)
    answer = fabric.recall("mf_agent_a", {"run_id": str(run), "requesting_agent": "com-agt-004"})
    assert answer["status"] == "denied"


def test_a_tier_outside_the_profile_denies_the_whole_request(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    run = recall_run(fabric, "com-agt-005")
    answer = fabric.recall("mf_agent_r", {"run_id": str(run), "tiers": ["semantic", "episodic"]})
    assert answer["status"] == "denied"
    assert answer["tiers_denied"] == ["episodic"]
    assert answer["records"] == []


def test_allow_partial_serves_the_readable_tiers_and_lists_the_denied(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    run = recall_run(fabric, "com-agt-005")
    answer = fabric.recall(
        "mf_agent_r", {"run_id": str(run), "tiers": ["semantic", "episodic"], "allow_partial": True}
    )
    assert answer["status"] == "partial"
    assert answer["tiers_denied"] == ["episodic"]
    assert world["episode"] not in ids(answer)
    assert world["subject"] in ids(answer)
    served = fabric.events(f"run_id = '{run}' AND event_type = 'memory.recall.served'")
    assert served[0]["payload"]["tiers_denied"] == ["episodic"]


def test_allow_partial_with_every_tier_denied_is_denied(fabric: Fabric) -> None:
    run = recall_run(fabric, "com-agt-005")
    answer = fabric.recall(
        "mf_agent_r", {"run_id": str(run), "tiers": ["episodic"], "allow_partial": True}
    )
    assert answer["status"] == "denied"


def test_visibility_session_agent_subject_tenant(fabric: Fabric, world: dict[str, Any]) -> None:
    same = fabric.recall("mf_agent_a", {"run_id": str(recall_run(fabric)), "tiers": ["semantic"]})
    assert set(ids(same)) == {world[k] for k in ("subject", "tenant", "session", "agent")}

    other_session = recall_run(fabric, session="sess-2")
    got = set(ids(fabric.recall("mf_agent_a", {"run_id": str(other_session)})))
    assert world["session"] not in got and world["subject"] in got

    other_subject = recall_run(fabric, subject="user-1234", session=None)
    got = set(ids(fabric.recall("mf_agent_a", {"run_id": str(other_subject)})))
    assert got == {world["tenant"], world["agent"]}

    other_agent = recall_run(fabric, "com-agt-005")
    got = set(ids(fabric.recall("mf_agent_r", {"run_id": str(other_agent)})))
    assert got == {world["subject"], world["tenant"]}


def test_there_is_no_cross_tenant_recall(fabric: Fabric, world: dict[str, Any]) -> None:
    run = fabric.open_run("glx-agt-001", tenant="globex")
    got = set(ids(fabric.recall("mf_agent_g", {"run_id": str(run), "tiers": ["semantic"]})))
    assert got == {world["globex"]}


def test_request_visibility_narrows(fabric: Fabric, world: dict[str, Any]) -> None:
    answer = fabric.recall(
        "mf_agent_a",
        {
            "run_id": str(recall_run(fabric)),
            "tiers": ["semantic"],
            "scope": {"visibility": "tenant"},
        },
    )
    assert ids(answer) == [world["tenant"]]
    assert answer["scope_applied"]["visibility"] == ["tenant"]


def test_valid_at_start_inclusive_end_exclusive(fabric: Fabric) -> None:
    run = fabric.open_run()
    rid = fabric.form(
        run,
        "bounded",
        validity_interval={
            "valid_from": "2026-01-01T00:00:00Z",
            "valid_until": "2026-02-01T00:00:00Z",
        },
    )
    recall = recall_run(fabric)

    def at(ts: str) -> list[str]:
        return ids(
            fabric.recall(
                "mf_agent_a",
                {"run_id": str(recall), "tiers": ["episodic"], "filters": {"valid_at": ts}},
            )
        )

    assert at("2026-01-01T00:00:00Z") == [rid]
    assert at("2026-01-31T23:59:59.999999Z") == [rid]
    assert at("2026-02-01T00:00:00Z") == []
    assert at("2025-12-31T23:59:59Z") == []


def test_min_confidence_and_compliance_exclusions_are_filters(fabric: Fabric) -> None:
    run = fabric.open_run()
    low = fabric.form(run, "low", confidence=0.3)
    pci = fabric.form(run, "card", compliance_labels=["pci", "pii"])
    plain = fabric.form(run, "plain", confidence=0.95)
    rr = str(recall_run(fabric))
    assert set(ids(fabric.recall("mf_agent_a", {"run_id": rr, "tiers": ["episodic"]}))) == {
        low,
        pci,
        plain,
    }
    got = ids(
        fabric.recall(
            "mf_agent_a",
            {
                "run_id": rr,
                "tiers": ["episodic"],
                "filters": {"min_confidence": 0.5, "compliance_labels_excluded": ["pci"]},
            },
        )
    )
    assert got == [plain]


def test_limit_defaults_to_eight_and_reports_truncation(fabric: Fabric) -> None:
    run = fabric.open_run()
    for i in range(10):
        fabric.form(run, f"episode {i}")
    rr = str(recall_run(fabric))
    answer = fabric.recall("mf_agent_a", {"run_id": rr, "tiers": ["episodic"]})
    assert len(answer["records"]) == 8 and answer["truncated"] is True
    answer = fabric.recall("mf_agent_a", {"run_id": rr, "tiers": ["episodic"], "limit": 10})
    assert len(answer["records"]) == 10 and answer["truncated"] is False
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        fabric.recall("mf_agent_a", {"run_id": rr, "limit": 101})


def test_text_recall_reports_truncation_and_ranks_as_a_deeper_list(fabric: Fabric) -> None:
    """Text recall reads the lexical list only as deep as the answer (limit + 1): the
    first records of a short answer are those of a long one, in the same order, with the
    same scores, and one record more than the limit is reported as truncated."""
    run = fabric.open_run()
    for i in range(10):
        fabric.form(run, f"invoice episode {i}" + " invoice" * (i % 3))
    rr = str(recall_run(fabric))
    ask = {"run_id": rr, "tiers": ["episodic"], "query": "invoice"}
    full = fabric.recall("mf_agent_a", {**ask, "limit": 10})
    assert len(full["records"]) == 10 and full["truncated"] is False
    short = fabric.recall("mf_agent_a", {**ask, "limit": 9})
    assert short["truncated"] is True
    assert [(r["memory_id"], r["score"], r["retrieval"]) for r in short["records"]] == [
        (r["memory_id"], r["score"], r["retrieval"]) for r in full["records"][:9]
    ]


@pytest.mark.clone
def test_superseded_tombstoned_and_contentless_records_are_never_returned(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    run = fabric.open_run()
    sup = fabric.form(run, "will be superseded")
    tomb = fabric.form(run, "will be erased")
    gone = fabric.form(run, "window closes", retention_class="operational")
    keep = fabric.form(run, "stays")
    with fabric.owner() as conn:
        conn.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'superseded', "
            "valid_until = valid_from + interval '1 day' WHERE memory_id = %s",
            (sup,),
        )
        approval = uuid.uuid4()
        conn.execute("SELECT set_config('fabric.approval_id', %s, false)", (str(approval),))
        conn.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'tombstoned', "
            "content = NULL, subject_id = NULL, session_id = NULL, agent_id = NULL, "
            "erased_at = now(), erasure_approval_id = %s WHERE memory_id = %s",
            (approval, tomb),
        )
        conn.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'expired', "
            "content = NULL, valid_until = valid_from + interval '1 day' "
            "WHERE memory_id = %s",
            (gone,),
        )
    got = set(
        ids(
            fabric.recall(
                "mf_agent_a",
                {
                    "run_id": str(recall_run(fabric)),
                    "tiers": ["episodic"],
                    "filters": {"valid_at": "2026-07-02T12:00:00Z"},
                },
            )
        )
    )
    assert keep in got and not got & {sup, tomb, gone}


def test_query_matches_and_ranks_ties_by_confidence_then_recency(fabric: Fabric) -> None:
    run = fabric.open_run()
    a = fabric.form(run, "invoice invoice currency", confidence=0.5)
    b = fabric.form(run, "invoice currency", confidence=0.9)
    c = fabric.form(
        run,
        "invoice currency",
        confidence=0.9,
        validity_interval={"valid_from": "2026-08-01T00:00:00Z"},
    )
    fabric.form(run, "unrelated weather note")
    answer = fabric.recall(
        "mf_agent_a",
        {"run_id": str(recall_run(fabric)), "tiers": ["episodic"], "query": "invoice currency"},
    )
    assert ids(answer) == [a, c, b]
    assert answer["records"][0]["score"] > answer["records"][1]["score"]


def test_without_query_order_is_confidence_then_recency(fabric: Fabric) -> None:
    run = fabric.open_run()
    old = fabric.form(
        run, "old", confidence=0.8, validity_interval={"valid_from": "2026-01-01T00:00:00Z"}
    )
    new = fabric.form(
        run, "new", confidence=0.8, validity_interval={"valid_from": "2026-06-01T00:00:00Z"}
    )
    top = fabric.form(
        run,
        "top",
        confidence=0.99,
        validity_interval={"valid_from": "2025-01-01T00:00:00Z"},
    )
    answer = fabric.recall("mf_agent_a", {"run_id": str(recall_run(fabric)), "tiers": ["episodic"]})
    assert ids(answer) == [top, new, old]


def test_candidates_are_reauthorized_refiltered_and_ordered_by_score(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    rr = str(recall_run(fabric, "com-agt-005"))
    candidates = [
        {"memory_id": world["globex"], "score": 0.99},  # another tenant
        {"memory_id": world["agent"], "score": 0.98},  # another agent's private record
        {"memory_id": world["episode"], "score": 0.97},  # a tier this agent may not read
        {"memory_id": world["tenant"], "score": 0.9},
        {"memory_id": world["subject"], "score": 0.5},
        {"memory_id": str(uuid.uuid4()), "score": 0.4},  # does not exist
    ]
    answer = fabric.recall("mf_agent_r", {"run_id": rr, "candidates": candidates})
    assert ids(answer) == [world["tenant"], world["subject"]]
    # Scores are ranks fused and normalized (1 for the top of one list), never the
    # broker's similarities; each record says where the vector search ranked it.
    assert [r["score"] for r in answer["records"]] == [1.0, round(61 / 62, 6)]
    assert [r["retrieval"] for r in answer["records"]] == [{"vector": 1}, {"vector": 2}]
    assert answer["mode_served"] == "semantic"


def test_response_carries_provenance_validity_and_lineage(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    answer = fabric.recall(
        "mf_agent_a",
        {
            "run_id": str(recall_run(fabric)),
            "tiers": ["semantic"],
            "scope": {"visibility": "subject"},
            "correlation_id": "corr-1",
        },
    )
    assert answer["status"] == "served" and answer["correlation_id"] == "corr-1"
    (record,) = answer["records"]
    assert record["memory_id"] == world["subject"]
    assert record["derived_from"] == [world["episode"]]
    assert record["provenance"]["source_event_id"].startswith("evt-7b21-")
    assert record["validity_interval"]["valid_from"].startswith("2026-07-02T09:14:00")
    assert record["tier"] == "semantic" and record["confidence"] == 0.9
    assert record["content"] == {"assertion": "billing entity is Acme Logistics BV"}
    assert answer["scope_applied"] == {
        "tenant_id": "acme",
        "subject_id": "user-8842",
        "session_id": "sess-1f9c",
        "agent_id": "com-agt-003",
        "visibility": ["subject"],
    }


@pytest.mark.clone
def test_every_recall_emits_one_audit_event_without_content_and_no_notify(fabric: Fabric) -> None:
    run = fabric.open_run()
    canary = f"CANARY-{uuid.uuid4().hex}"
    rid = fabric.form(run, canary)
    listener = fabric.connect()
    listener.execute("LISTEN fabric_events")
    rr = str(recall_run(fabric))
    before = fabric.count("memory_records"), fabric.count("memory_record_versions")
    served = fabric.recall(
        "mf_agent_a",
        {
            "run_id": rr,
            "tiers": ["episodic"],
            "query": canary,
            "correlation_id": "c-9",
            "causation_id": "e-9",
        },
    )
    denied = fabric.recall("mf_agent_a", {"run_id": rr, "scope": {"subject_id": "nobody"}})
    assert served["status"] == "served" and ids(served) == [rid] and denied["status"] == "denied"
    events = fabric.events(f"run_id = '{rr}' AND event_type LIKE 'memory.recall.%'")
    assert [e["event_type"] for e in events] == ["memory.recall.served", "memory.recall.denied"]
    first = events[0]
    assert first["correlation_id"] == "c-9" and first["causation_id"] == "e-9"
    assert first["actor_agent_id"] == "com-agt-003"
    assert first["payload"]["memory_ids"] == [rid]
    assert first["payload"]["request_hash"].startswith("hmac:")  # keyed: the run has a subject
    assert first["payload"]["scope"]["tenant_id"] == "acme"
    assert canary not in str(events)
    assert list(listener.notifies(timeout=0.3)) == []
    assert (fabric.count("memory_records"), fabric.count("memory_record_versions")) == before


@pytest.mark.clone
def test_auditor_reads_recall_history_and_others_are_refused(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    rr = str(recall_run(fabric))
    fabric.recall("mf_agent_a", {"run_id": rr, "tiers": ["semantic"]})
    auditor = fabric.connect("mf_auditor")
    rows = auditor.execute(
        "SELECT status, agent_id, run_id, memory_ids FROM fabric_audit.recalls"
        "('acme', now() - interval '1 hour', now() + interval '1 hour')"
    ).fetchall()
    assert [(r[0], r[1], str(r[2])) for r in rows] == [("served", "com-agt-003", rr)]
    assert len(rows[0][3]) == 4
    for login in ("mf_agent_a", "mf_committer", "mf_admin"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            fabric.connect(login).execute(
                "SELECT * FROM fabric_audit.recalls('acme', now() - interval '1 hour', now())"
            )


def test_auditor_has_no_write_privilege_and_no_tool(fabric: Fabric) -> None:
    auditor = fabric.connect("mf_auditor")
    for call in (
        "SELECT fabric_api.propose('{}', gen_random_uuid())",
        "SELECT fabric_api.recall('{}')",
        "SELECT fabric_api.commit(gen_random_uuid())",
        "INSERT INTO fabric.events (tenant_id, event_type) VALUES ('acme', 'x.y.z')",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            auditor.execute(call)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.register_agent('aud-1', 'mf_auditor', '{}', %s)",
            (["tool:memory-recall"],),
        )


def test_lineage_both_ways_with_depth(fabric: Fabric, world: dict[str, Any]) -> None:
    run = fabric.open_run()
    deeper = semantic(fabric, run, "derived from a semantic", [world["subject"]])
    rows = (
        fabric.session("mf_auditor")
        .execute(
            "SELECT direction, depth, memory_id::text FROM fabric_audit.lineage('acme', %s)",
            (world["subject"],),
        )
        .fetchall()
    )
    assert ("ancestor", 1, world["episode"]) in rows
    assert ("descendant", 1, deeper) in rows
    rows = (
        fabric.session("mf_auditor")
        .execute(
            "SELECT direction, depth, memory_id::text FROM fabric_audit.lineage('acme', %s)",
            (deeper,),
        )
        .fetchall()
    )
    assert ("ancestor", 2, world["episode"]) in rows


@pytest.mark.clone
def test_records_as_of_reconstructs_what_was_known(fabric: Fabric) -> None:
    run = fabric.open_run()
    rid = fabric.form(run, "fact", validity_interval={"valid_from": "2026-01-01T00:00:00Z"})
    auditor = fabric.connect("mf_auditor")
    (t_before_change,) = auditor.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
    with fabric.owner() as conn:
        conn.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'superseded', "
            "valid_until = '2026-03-01T00:00:00Z' WHERE memory_id = %s",
            (rid,),
        )

    def as_of(valid_at: str, known_at: Any) -> list[tuple[Any, ...]]:
        return auditor.execute(
            "SELECT memory_id::text, consolidation_state, valid_until, content IS NOT NULL "
            "FROM fabric_audit.records_as_of('acme', %s, %s)",
            (valid_at, known_at),
        ).fetchall()

    # Known before the supersession: still raw and open-ended, valid in April.
    assert as_of("2026-04-01T00:00:00Z", t_before_change) == [(rid, "raw", None, True)]
    # Known now: superseded, closed at March, so not valid in April but valid in February.
    assert as_of("2026-04-01T00:00:00Z", "infinity") == []
    (row,) = as_of("2026-02-01T00:00:00Z", "infinity")
    assert row[0] == rid and row[1] == "superseded"
    # Before the record was recorded, the fabric knew nothing of it.
    assert as_of("2026-02-01T00:00:00Z", "2000-01-01T00:00:00Z") == []
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.session("mf_agent_a").execute(
            "SELECT * FROM fabric_audit.records_as_of('acme', now())"
        )


@pytest.mark.clone
def test_recall_reads_through_one_scope_resolver(fabric: Fabric) -> None:
    """os-agt-012's path is one SQL function: its answer is what recall pushes down."""
    run = recall_run(fabric)
    conn = fabric.su()
    conn.execute("SELECT set_config('fabric.tenant_id', 'acme', false)")
    resolved = conn.execute(
        "SELECT fabric.resolve_recall_scope(a.memory_profile, r, %s) FROM fabric.agents a, "
        "fabric.runs r WHERE a.agent_id = 'com-agt-003' AND r.run_id = %s",
        (Jsonb({"tiers": ["semantic"]}), run),
    ).fetchone()
    assert resolved is not None
    assert resolved[0]["scope_keys"] == [
        "session:sess-1f9c",
        "agent:com-agt-003",
        "subject:user-8842",
        "tenant",
    ]
    assert resolved[0]["tiers"] == ["semantic"] and resolved[0]["denied_reason"] is None


def test_memory_ids_reads_only_the_named_records_the_run_may_see(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    """filters.memory_ids is a read by id inside the resolved scope: a record of another
    tenant, or of a visibility the run may not read, is absent, never an error."""
    run = recall_run(fabric)
    asked = [world["subject"], world["tenant"], world["globex"], str(uuid.uuid4())]
    answer = fabric.recall("mf_agent_a", {"run_id": str(run), "filters": {"memory_ids": asked}})
    assert answer["status"] == "served"
    assert sorted(ids(answer)) == sorted([world["subject"], world["tenant"]])
    assert all(r["score"] is None for r in answer["records"])
    # the agent-visible record of com-agt-003 is not readable by com-agt-004's run
    other = fabric.open_run("com-agt-004")
    seen = fabric.recall(
        "mf_agent_b", {"run_id": str(other), "filters": {"memory_ids": [world["agent"]]}}
    )
    assert ids(seen) == []


def test_memory_ids_is_validated_and_writes_nothing_when_refused(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    run = str(recall_run(fabric))
    one = [world["subject"]]
    before = fabric.counts()
    for bad in (
        {"memory_ids": []},
        {"memory_ids": "x"},
        {"memory_ids": ["not-a-uuid"]},
        {"memory_ids": [str(uuid.uuid4()) for _ in range(101)]},
        {"memory_ids": [1]},
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            fabric.recall("mf_agent_a", {"run_id": run, "filters": bad})
    for extra in ({"query": "billing"}, {"mode": "semantic", "query": "billing"}):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            fabric.recall("mf_agent_a", {"run_id": run, "filters": {"memory_ids": one}, **extra})
    assert fabric.counts() == before
