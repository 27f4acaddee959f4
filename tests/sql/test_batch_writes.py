"""fabric_api.propose_many and fabric_api.commit_many: the governed write path, set-based.

propose_many answers each envelope exactly as propose would (validated, rejected, denied,
replayed, or the error propose would raise, answered at its position), and commit_many forms
the records commit would form, all or none. The property test draws batches that break every
kind of rule and reuse idempotency keys, and checks that each position's answer and SQLSTATE
equal the single call's and that the rows written (proposals, records, lineage, history,
events) equal those of the same calls one by one, ids and timestamps aside.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, Fabric, call, episode

pytestmark = pytest.mark.rollback

PROPOSE_MANY = "SELECT fabric_api.propose_many(%s, %s)"


def one(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


def refused(fabric: Fabric, send: Any) -> psycopg.Error:
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        send()
    assert fabric.counts() == before, "a refused call wrote a row"
    return info.value


# --- propose_many ------------------------------------------------------------------------


def test_a_batch_answers_each_envelope_in_order(fabric: Fabric) -> None:
    run = fabric.open_run()
    agent = fabric.connect("mf_agent_a")
    first = episode("prefers invoices in EUR")
    batch = [
        first,
        episode(tier="relational"),
        {"tier": "episodic"},  # structural: no scope
        first,  # the same envelope again: a replay of position 0
        episode(scope={"tenant_id": "globex", "visibility": "subject"}),
    ]
    answers = one(agent, PROPOSE_MANY, Jsonb(batch), run)
    assert [a["status"] for a in answers] == [
        "validated",
        "rejected",
        "error",
        "validated",
        "error",
    ]
    assert answers[1]["reason"].startswith("agents never propose into the relational tier")
    assert answers[2]["sqlstate"] == "22023"
    assert answers[2]["reason"].startswith("scope must be an object")
    assert answers[3] == {**answers[0], "replayed": True}
    assert answers[4]["sqlstate"] == "42501"
    assert answers[4]["reason"] == "scope.tenant_id is not the tenant of the run"
    # two proposals, two proposal events; nothing for the errors and the replay
    assert fabric.count("proposals", f"run_id = '{run}'") == 2
    assert fabric.count("events", "event_type LIKE 'memory.proposal.%'") == 2


def test_an_empty_batch_answers_an_empty_list_and_writes_nothing(fabric: Fabric) -> None:
    run = fabric.open_run()
    before = fabric.counts()
    assert one(fabric.connect("mf_agent_a"), PROPOSE_MANY, Jsonb([]), run) == []
    assert fabric.counts() == before


@pytest.mark.parametrize("envelopes", [None, {"tier": "episodic"}, "[]", 3])
def test_envelopes_that_are_not_an_array_fail_the_batch(fabric: Fabric, envelopes: Any) -> None:
    run = fabric.open_run()
    agent = fabric.connect("mf_agent_a")
    err = refused(fabric, lambda: one(agent, PROPOSE_MANY, Jsonb(envelopes), run))
    assert err.sqlstate == "22023"
    assert err.diag.message_primary == "envelopes must be a JSON array of proposal envelopes"


def test_more_than_a_thousand_envelopes_fail_the_batch(fabric: Fabric) -> None:
    run = fabric.open_run()
    agent = fabric.connect("mf_agent_a")
    err = refused(fabric, lambda: one(agent, PROPOSE_MANY, Jsonb([episode()] * 1001), run))
    assert err.sqlstate == "54000"


def test_a_committer_cannot_propose_a_batch(fabric: Fabric) -> None:
    run = fabric.open_run()
    committer = fabric.connect("mf_committer")
    err = refused(fabric, lambda: one(committer, PROPOSE_MANY, Jsonb([episode()]), run))
    assert err.sqlstate == "42501"


def test_an_agent_cannot_propose_a_batch_in_another_agents_run(fabric: Fabric) -> None:
    run = fabric.open_run()
    other = fabric.connect("mf_agent_b")
    err = refused(fabric, lambda: one(other, PROPOSE_MANY, Jsonb([episode()]), run))
    assert err.sqlstate == "42501"


def test_a_batch_without_the_propose_tool_is_denied_at_every_position(fabric: Fabric) -> None:
    run = fabric.open_run(tools=["tool:memory-recall"])
    agent = fabric.connect("mf_agent_a")
    answers = one(agent, PROPOSE_MANY, Jsonb([episode(), "not an envelope", episode()]), run)
    assert [a["status"] for a in answers] == ["denied"] * 3
    assert answers[0]["reason"].startswith("tool:memory-propose is not authorized")
    assert fabric.count("proposals") == 0
    assert fabric.count("events", "event_type = 'agent.tool.unauthorized'") == 3


# --- commit_many -------------------------------------------------------------------------


def _validated(fabric: Fabric, n: int) -> tuple[uuid.UUID, list[str]]:
    run = fabric.open_run()
    answers = one(
        fabric.connect("mf_agent_a"),
        PROPOSE_MANY,
        Jsonb([episode(f"note {i}") for i in range(n)]),
        run,
    )
    assert all(a["status"] == "validated" for a in answers)
    return run, [a["proposal_id"] for a in answers]


def test_commit_many_returns_the_records_as_a_fresh_read_returns_them(fabric: Fabric) -> None:
    _, ids = _validated(fabric, 3)
    committer = fabric.connect("mf_committer")
    records = call(committer, "fabric_api.commit_many", ids)
    assert [r["content"]["text"] for r in records] == ["note 0", "note 1", "note 2"]
    for record in records:
        again = one(
            fabric.su(),
            "SELECT fabric._record_json(m) FROM fabric.memory_records m WHERE memory_id = %s",
            record["memory_id"],
        )
        assert record == again
    formed = fabric.count("events", "event_type = 'memory.record.formed'")
    assert formed == 3
    assert fabric.count("proposals", "status = 'committed'") == 3


def test_commit_many_writes_lineage_rows(fabric: Fabric) -> None:
    _, ids = _validated(fabric, 1)
    committer = fabric.connect("mf_committer")
    (base,) = call(committer, "fabric_api.commit_many", ids)
    run = fabric.open_run()
    semantic = episode(
        tier="semantic", content={"assertion": "prefers EUR"}, derived_from=[base["memory_id"]]
    )
    (answer,) = one(fabric.connect("mf_agent_a"), PROPOSE_MANY, Jsonb([semantic]), run)
    assert answer["status"] == "validated", answer
    (record,) = call(committer, "fabric_api.commit_many", [answer["proposal_id"]])
    assert record["derived_from"] == [base["memory_id"]]
    assert fabric.count("memory_lineage") == 1


@pytest.mark.parametrize(
    ("case", "sqlstate"),
    [("unknown", "P0002"), ("rejected", "55000"), ("twice", "55000"), ("committed", "55000")],
)
def test_commit_many_is_all_or_none(fabric: Fabric, case: str, sqlstate: str) -> None:
    run, ids = _validated(fabric, 2)
    committer = fabric.connect("mf_committer")
    if case == "unknown":
        ids.append(str(uuid.uuid4()))
    elif case == "rejected":
        (answer,) = one(
            fabric.connect("mf_agent_a"), PROPOSE_MANY, Jsonb([episode(tier="relational")]), run
        )
        ids.append(answer["proposal_id"])
    elif case == "twice":
        ids.append(ids[0])
    else:
        call(committer, "fabric_api.commit", ids[1])
    err = refused(fabric, lambda: call(committer, "fabric_api.commit_many", ids))
    assert err.sqlstate == sqlstate
    assert fabric.count("proposals", "status = 'validated'") == (1 if case == "committed" else 2)


def test_commit_many_refuses_a_contradiction_inside_the_batch(fabric: Fabric) -> None:
    _, base_ids = _validated(fabric, 1)
    committer = fabric.connect("mf_committer")
    (base,) = call(committer, "fabric_api.commit_many", base_ids)
    run = fabric.open_run()
    facts = [
        episode(
            tier="semantic",
            content={"key": "currency", "value": v},
            derived_from=[base["memory_id"]],
        )
        for v in ("EUR", "USD")
    ]
    answers = one(fabric.connect("mf_agent_a"), PROPOSE_MANY, Jsonb(facts), run)
    ids = [a["proposal_id"] for a in answers]
    err = refused(fabric, lambda: call(committer, "fabric_api.commit_many", ids))
    assert err.sqlstate == "23P01"


def test_commit_many_needs_a_committer_enabled_in_the_tenant(fabric: Fabric) -> None:
    _, ids = _validated(fabric, 1)
    err = refused(fabric, lambda: call(fabric.connect("mf_agent_a"), "fabric_api.commit_many", ids))
    assert err.sqlstate == "42501"
    su = fabric.su()
    su.execute(
        "DELETE FROM fabric.tenant_agents WHERE tenant_id = 'acme' AND agent_id = 'os-agt-010'"
    )
    committer = fabric.connect("mf_committer")
    err = refused(fabric, lambda: call(committer, "fabric_api.commit_many", ids))
    assert err.sqlstate == "42501"


def test_commit_pending_refuses_only_the_proposal_that_breaks_a_rule(fabric: Fabric) -> None:
    """The drain forms its batch set-based; one proposal that fails at commit is refused
    alone (the batch is redone proposal by proposal)."""
    _, base_ids = _validated(fabric, 1)
    committer = fabric.connect("mf_committer")
    (base,) = call(committer, "fabric_api.commit_many", base_ids)
    run = fabric.open_run()
    batch = [
        episode("before"),
        episode(
            tier="semantic", content={"key": "k", "value": 1}, derived_from=[base["memory_id"]]
        ),
        episode(
            tier="semantic", content={"key": "k", "value": 2}, derived_from=[base["memory_id"]]
        ),
        episode("after"),
    ]
    answers = one(fabric.connect("mf_agent_a"), PROPOSE_MANY, Jsonb(batch), run)
    assert all(a["status"] == "validated" for a in answers)
    result = call(committer, "fabric_api.commit_pending", 100)
    assert result == {"committed": 3, "rejected": 1, "retry": 0}
    assert fabric.count("events", "payload ->> 'sqlstate' = '23P01'") == 1


# --- the property: the same as one by one -------------------------------------------------

TEXTS = ["asked for invoices in EUR", "works night shifts", "prefers a call"]


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _breaker(kind: str, source_event: str) -> dict[str, Any] | str:
    """An envelope that breaks one rule."""
    e = episode()
    e["provenance"]["source_event_id"] = source_event
    table: dict[str, Any] = {
        "not_object": "an envelope",
        "extra_key": {**e, "memory_id": str(uuid.uuid4())},
        "bad_tier": {**e, "tier": "working"},
        "no_confidence": {k: v for k, v in e.items() if k != "confidence"},
        "bad_time": {**e, "validity_interval": {"valid_from": "yesterday"}},
        "deep": {**e, "content": {"a": _nested(33)}},
        "other_tenant": {**e, "scope": {"tenant_id": "globex", "visibility": "subject"}},
        "other_subject": {
            **e,
            "scope": {"tenant_id": "acme", "subject_id": "u-2", "visibility": "subject"},
        },
        "unknown_parent": {**e, "tier": "semantic", "derived_from": [str(uuid.uuid4())]},
        "unknown_instance": {**e, "business_instance_id": "nowhere"},
        "uncaused": {**e, "provenance": {"formation_method": "extraction"}},
        "consolidation": {
            **e,
            "provenance": {**e["provenance"], "formation_method": "consolidation"},
        },
        "relational": {**e, "tier": "relational"},
        "supersedes": {**e, "supersedes": str(uuid.uuid4())},
        "ephemeral": {**e, "retention_class": "ephemeral"},
        "confidence_range": {**e, "confidence": 1.5},
        "backwards": {
            **e,
            "validity_interval": {
                "valid_from": "2026-07-02T09:14:00Z",
                "valid_until": "2026-07-01T00:00:00Z",
            },
        },
        "not_semver": {**e, "version": "1.0"},
        "orphan_semantic": {**e, "tier": "semantic"},
        "null_parents": {**e, "tier": "semantic", "derived_from": None},
    }
    return table[kind]  # type: ignore[no-any-return]


BREAKERS = [
    "not_object", "extra_key", "bad_tier", "no_confidence", "bad_time", "deep", "other_tenant",
    "other_subject", "unknown_parent", "unknown_instance", "uncaused", "consolidation",
    "relational", "supersedes", "ephemeral", "confidence_range", "backwards", "not_semver",
    "orphan_semantic", "null_parents",
]  # fmt: skip
SPECS = st.one_of(
    st.tuples(st.just("breaker"), st.sampled_from(BREAKERS), st.just(0), st.just(0.9)),
    st.tuples(
        st.sampled_from(["episodic", "semantic"]),
        st.sampled_from(TEXTS),
        st.integers(0, 2),  # source event: a small pool, so keys repeat
        st.sampled_from([0.9, 0.5, 1.5]),  # 1.5: a rejected twin whose key a fix takes over
    ),
)


def _envelope(spec: tuple[Any, ...], tag: str, base: str, position: int) -> Any:
    kind, what, event, confidence = spec
    if kind == "breaker":
        return _breaker(what, f"evt-{tag}-b{position}")
    env = episode(f"{what} {tag}", confidence=confidence)
    env["provenance"]["source_event_id"] = f"evt-{tag}-{event}"
    if kind == "semantic":
        env["tier"] = "semantic"
        env["derived_from"] = [base]
    return env


def _answer(conn: psycopg.Connection[Any], env: Any, run: Any) -> dict[str, Any]:
    try:
        return one(conn, "SELECT fabric_api.propose(%s, %s)", Jsonb(env), run)  # type: ignore[no-any-return]
    except psycopg.Error as exc:
        return {
            "proposal_id": None,
            "status": "error",
            "sqlstate": exc.sqlstate,
            "reason": exc.diag.message_primary,
            "hint": exc.diag.message_hint,
        }


def _normal(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Answers with proposal ids replaced by the position that filed them."""
    names: dict[Any, str] = {}
    out = []
    for i, a in enumerate(answers):
        if a["proposal_id"] is not None and a["proposal_id"] not in names:
            names[a["proposal_id"]] = f"P{i}"
        out.append({**a, "proposal_id": names.get(a["proposal_id"])})
    return out


STATE = {
    "proposals": """SELECT p.proposal_id::text, p.status, p.reason, p.tier, p.visibility,
        p.subject_id, p.agent_id, p.session_id, p.content, p.source_event_id, p.correlation_id,
        p.causation_id, p.formation_method, p.derived_from, p.confidence, p.valid_until,
        p.retention_class, p.compliance_labels, p.version, p.request_hash IS NULL,
        p.committed_by, p.memory_id::text
        FROM fabric.proposals p WHERE p.run_id = %(run)s""",
    "records": """SELECT m.proposal_id::text, m.memory_id::text, m.tier, m.visibility,
        m.subject_id, m.content, m.source_event_id, m.formed_by,
        m.formation_method, m.confidence, m.consolidation_state, m.revision, m.search_tsv::text
        FROM fabric.memory_records m WHERE m.run_id = %(run)s""",
    "lineage": """SELECT l.memory_id::text, l.derived_from_id::text FROM fabric.memory_lineage l
        JOIN fabric.memory_records m ON m.memory_id = l.memory_id WHERE m.run_id = %(run)s""",
    "history": """SELECT v.memory_id::text, v.revision, v.tier, v.consolidation_state
        FROM fabric.memory_record_versions v JOIN fabric.memory_records m
        ON m.memory_id = v.memory_id WHERE m.run_id = %(run)s""",
    "events": """SELECT e.event_type, e.correlation_id, e.causation_id, e.actor_agent_id,
        e.proposal_id::text, e.memory_id::text, e.payload - 'content_hash' - 'expires_at'
        FROM fabric.events e WHERE e.run_id = %(run)s""",
}


def _state(su: psycopg.Connection[Any], run: Any, tag: str) -> dict[str, list[str]]:
    ids: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for name, query in STATE.items():
        rows = su.execute(query, {"run": run}).fetchall()
        text = [repr(r).replace(tag, "TAG") for r in rows]
        out[name] = text
    # proposal and memory ids: named by the order of the proposals' contents
    for row in su.execute(
        "SELECT proposal_id::text, memory_id::text FROM fabric.proposals WHERE run_id = %s"
        " ORDER BY content::text, source_event_id, confidence, status, request_hash IS NULL,"
        " tier, derived_from::text",  # two refusals of one key may differ only in these
        (run,),
    ).fetchall():
        ids[row[0]] = f"P{len(ids)}"
        if row[1]:
            ids[row[1]] = f"M{len(ids)}"
    for name, rows in out.items():
        normal = []
        for r in rows:
            for raw, alias in ids.items():
                r = r.replace(raw, alias)
            normal.append(r)
        out[name] = sorted(normal)
    return out


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@pytest.mark.slow
@pytest.mark.clone
@given(specs=st.lists(SPECS, min_size=1, max_size=10), denied=st.sampled_from([False] * 5 + [True]))
def test_a_batch_leaves_the_state_the_same_calls_one_by_one_leave(
    fabric: Fabric, specs: list[tuple[Any, ...]], denied: bool
) -> None:
    _check_on_own_connections(fabric, specs, denied)


@pytest.mark.clone
def test_a_batch_of_every_breaker_leaves_the_state_the_same_calls_leave(fabric: Fabric) -> None:
    """The property for one fixed batch: every breaker, valid envelopes of both tiers (read
    set-based by propose_many) and a repeated key, each answered as propose answers it."""
    specs: list[tuple[Any, ...]] = [("breaker", b, 0, 0.9) for b in BREAKERS]
    specs += [("episodic", TEXTS[0], 0, 0.9), ("semantic", TEXTS[1], 1, 0.9)]
    specs += [("episodic", TEXTS[0], 0, 0.9), ("semantic", TEXTS[2], 2, 1.5)]
    _check_on_own_connections(fabric, specs, False)


def _check_on_own_connections(fabric: Fabric, specs: list[tuple[Any, ...]], denied: bool) -> None:
    """`_check` on connections of its own per login (hypothesis calls a test many times)."""
    logins = ("mf_orchestrator", "mf_agent_a", "mf_committer")
    conns = {login: psycopg.connect(fabric.url, user=login, autocommit=True) for login in logins}
    su = psycopg.connect(fabric.url, autocommit=True)
    try:
        _check(conns, su, specs, denied)
    finally:
        for c in [su, *conns.values()]:
            c.close()


def _open(conns: dict[str, psycopg.Connection[Any]], denied: bool) -> Any:
    tools = ["tool:memory-recall"] if denied else MEMORY_TOOLS
    return one(
        conns["mf_orchestrator"],
        "SELECT fabric_api.open_run('acme', 'com-agt-003', 'user-8842', 'sess-1f9c', %s, '1 hour')",
        tools,
    )


def _check(
    conns: dict[str, psycopg.Connection[Any]],
    su: psycopg.Connection[Any],
    specs: list[tuple[Any, ...]],
    denied: bool,
) -> None:
    agent, committer = conns["mf_agent_a"], conns["mf_committer"]
    # the episode the semantic envelopes derive from, shared by both paths
    base_run = _open(conns, False)
    base = one(agent, "SELECT fabric_api.propose(%s, %s)", Jsonb(episode("base")), base_run)
    base_id = one(committer, "SELECT fabric_api.commit(%s)", base["proposal_id"])["memory_id"]

    tag1, tag2 = (str(uuid.uuid4().int)[-10:] for _ in range(2))
    run1, run2 = _open(conns, denied), _open(conns, denied)

    single = [_answer(agent, _envelope(s, tag1, base_id, i), run1) for i, s in enumerate(specs)]
    for a in single:
        if a["status"] == "validated" and not a.get("replayed"):
            one(committer, "SELECT fabric_api.commit(%s)", a["proposal_id"])

    batch = one(
        agent,
        PROPOSE_MANY,
        Jsonb([_envelope(s, tag2, base_id, i) for i, s in enumerate(specs)]),
        run2,
    )
    fresh = [
        a["proposal_id"] for a in batch if a["status"] == "validated" and not a.get("replayed")
    ]
    records = one(committer, "SELECT fabric_api.commit_many(%s)", fresh)
    assert len(records) == len(fresh)

    assert _normal(batch) == _normal(single)
    assert _state(su, run2, tag2) == _state(su, run1, tag1)
