"""The audit cookbook (docs/audit.md) runs: every query is extracted from the page and run
as the auditor login against a fabric built through the governed API, and each answer is
checked against what the fixture did. The relations themselves: auditors only, tenant
first, no content and no subject id."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from conftest import Fabric
from memfabric.worker import erase, run_decay_once, seal_once

ROOT = Path(__file__).resolve().parents[2]
COOKBOOK = ROOT / "docs" / "audit.md"
QUESTION = re.compile(r"^### (Q\d+)\. .*?\n```sql\n(.*?)```", re.S | re.M)
VARIABLE = re.compile(r":'(\w+)'")

DAY = "now() - interval '1 day', now() + interval '1 day'"
WINDOWED = ("events", "approvals", "erasures", "tool_denials", "recall_history", "recalled_records")
RELATIONS = (*WINDOWED, "record_history")


def relation(name: str, tenant: str = "acme", memory_id: str | None = None) -> tuple[Any, ...]:
    """A relation's query over the last and next day (or one record) and its parameters."""
    tail = sql.SQL("%s::uuid" if name == "record_history" else DAY)
    query = sql.SQL("SELECT to_jsonb(r) FROM fabric_audit.{}(%s, {}) r").format(
        sql.Identifier(name), tail
    )
    params = (tenant, memory_id or str(uuid.uuid4())) if name == "record_history" else (tenant,)
    return query, params


def cookbook() -> dict[str, str]:
    """Question id -> its query, in psycopg's named-parameter form."""
    found = {
        qid: VARIABLE.sub(r"%(\1)s", query) for qid, query in QUESTION.findall(COOKBOOK.read_text())
    }
    assert found, "no question found in docs/audit.md"
    return found


def approval(fabric: Fabric, memory_id: str, target: dict[str, Any], decision: str) -> str:
    a = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_approval(%s, 'promote', %s, 'needed')",
        memory_id,
        Jsonb(target),
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, %s, 'reviewed')", a, decision)
    return str(a)


def build(fabric: Fabric) -> dict[str, Any]:
    """A month of a tenant's life, through the governed API only."""
    w: dict[str, Any] = {}
    run = fabric.open_run()  # com-agt-003 serving user-8842
    e1, e2 = fabric.form(run, "ep one"), fabric.form(run, "ep two")
    s1 = fabric.form(
        run,
        "s",
        tier="semantic",
        content={"key": "billing.currency", "value": "EUR"},
        derived_from=[e1, e2],
    )
    fabric.call("mf_committer", "SELECT fabric_api.promote(%s, 'profile', NULL, NULL)", s1)
    e3 = fabric.form(run, "ep three")
    used = approval(fabric, e3, {"tier": "relational"}, "approved")
    fabric.call("mf_committer", "SELECT fabric_api.promote(%s, 'relational', %s, NULL)", e3, used)
    denied = approval(fabric, e2, {"tier": "relational"}, "denied")
    # a profile fact, recalled, then superseded twice: p0 -> p1 -> p2
    p0 = fabric.form(
        run,
        "p",
        tier="profile",
        content={"key": "billing.entity", "value": "A"},
        derived_from=[fabric.form(run, "ep p0")],
        validity_interval={"valid_from": "2026-06-01T00:00:00Z", "valid_until": None},
    )
    answer = fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["profile"]})
    recalled = {r["memory_id"] for r in answer["records"]}
    assert p0 in recalled, answer
    chain = [p0]
    for value, valid_from in (("B", "2026-07-02T09:14:00Z"), ("C", "2026-08-01T00:00:00Z")):
        proposal = fabric.proposed(
            run,
            "p",
            tier="profile",
            content={"key": "billing.entity", "value": value},
            derived_from=[fabric.form(run, f"ep {value}")],
            validity_interval={"valid_from": valid_from, "valid_until": None},
        )
        chain.append(
            str(
                fabric.call(
                    "mf_committer",
                    "SELECT fabric_api.supersede(%s, %s, NULL)",
                    chain[-1],
                    proposal,
                )["memory_id"]
            )
        )
    # a record whose validity ended: decay expires it
    lapsed = fabric.form(
        run,
        "lapsed",
        validity_interval={
            "valid_from": "2026-06-01T00:00:00Z",
            "valid_until": "2026-08-01T00:00:00Z",
        },
    )
    decay = run_decay_once(fabric.connect("mf_committer"))
    # a tool refused: the run's active tool set lacks tool:memory-recall
    narrow = fabric.open_run(tools=["tool:memory-propose"])
    refused = fabric.recall("mf_agent_a", {"run_id": str(narrow), "tiers": ["episodic"]})
    assert refused["status"] == "denied", refused
    # one record erased (s1 derives from it), and a whole data subject erased
    a = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", e1)[
        "approval_id"
    ]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", a)
    erase(fabric.connect("mf_committer"), str(a))
    gone_run = fabric.open_run(subject="user-gone", session="sess-gone")
    gone = [fabric.form(gone_run, "gone one"), fabric.form(gone_run, "gone two")]
    fabric.recall("mf_agent_a", {"run_id": str(gone_run), "tiers": ["episodic"]})
    subject_approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', 'user-gone', 'art. 17')",
    )["approval_id"]
    fabric.call(
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')",
        subject_approval,
    )
    erase(fabric.connect("mf_committer"), str(subject_approval))
    seal_once(fabric.connect("mf_committer"))
    w.update(
        run=run, e1=e1, e2=e2, e3=e3, s1=s1, used=used, denied=denied, chain=chain,
        lapsed=lapsed, decay=decay, narrow=narrow, gone=gone,
        subject_approval=str(subject_approval), recalled=recalled,
    )  # fmt: skip
    return w


def window() -> dict[str, str]:
    now = datetime.now(UTC)
    return {
        "tenant": "acme",
        "from": (now - timedelta(days=1)).isoformat(),
        "to": (now + timedelta(days=1)).isoformat(),
        "at": (now + timedelta(minutes=1)).isoformat(),
    }


def ids(rows: list[dict[str, Any]], column: str = "memory_id") -> list[str]:
    return [str(r[column]) for r in rows]


def test_the_cookbook_answers_its_questions_as_the_auditor(fabric: Fabric) -> None:
    w = build(fabric)
    queries = cookbook()
    assert len(queries) >= 12
    base = window()
    truth = fabric.su()
    formed = truth.execute(
        "SELECT count(*) FROM fabric.memory_records m JOIN fabric.proposals p "
        "USING (tenant_id, proposal_id) "
        "WHERE m.tenant_id = 'acme' AND p.proposed_by = 'com-agt-003'"
    ).fetchone()
    assert formed is not None

    def q1(rows: list[dict[str, Any]]) -> None:
        assert [(r["agent_id"], r["recalls"]) for r in rows] == [("com-agt-003", 2)]

    def q2(rows: list[dict[str, Any]]) -> None:
        assert [(str(r["erased"]), str(r["derived"]), r["depth"]) for r in rows] == [
            (w["e1"], w["s1"], 1)
        ]
        assert rows[0]["flags_open"] == 1

    def q3(rows: list[dict[str, Any]]) -> None:
        got = {(str(r["memory_id"]), r["to_tier"], r["approved_by"]) for r in rows}
        assert got == {(w["s1"], "profile", None), (w["e3"], "relational", "mf_policy")}
        (with_approval,) = [r for r in rows if r["approval_id"] is not None]
        assert str(with_approval["approval_id"]) == w["used"]
        assert with_approval["promoted_by"] == "os-agt-010"

    def q4(rows: list[dict[str, Any]]) -> None:
        assert sorted(ids(rows)) == sorted(w["recalled"]) == sorted([w["chain"][0], w["s1"]])
        got = {str(r["memory_id"]): r for r in rows}
        assert got[w["chain"][0]]["content"] == {"key": "billing.entity", "value": "A"}
        assert got[w["chain"][0]]["consolidation_state"] == "raw"  # not yet replaced then
        assert got[w["s1"]]["content"] == {"key": "billing.currency", "value": "EUR"}

    def q5(rows: list[dict[str, Any]]) -> None:
        assert [(r["agent_id"], r["tool"], r["missing_layers"], r["denials"]) for r in rows] == [
            ("com-agt-003", "tool:memory-recall", ["active_tool_set"], 1)
        ]

    def q6(rows: list[dict[str, Any]]) -> None:
        expected = [(0, w["s1"]), *sorted([(1, w["e1"]), (1, w["e2"])])]
        assert [(r["depth"], str(r["memory_id"])) for r in rows] == expected
        assert all(r["source_event_id"].startswith("evt-7b21-") for r in rows)
        assert {r["proposed_by"] for r in rows} == {"com-agt-003"}
        assert {r["committed_by"] for r in rows} == {"os-agt-010"}
        assert rows[0]["formed_as"] == "semantic"

    def q7(rows: list[dict[str, Any]]) -> None:
        p0, _p1, p2 = w["chain"]
        assert [(r["direction"], r["depth"], str(r["memory_id"])) for r in rows] == [
            ("superseded_by", 1, p2),
            ("supersedes", 1, p0),
        ]
        assert rows[1]["superseded_at"] is not None and rows[0]["superseded_at"] is None

    def q8(rows: list[dict[str, Any]]) -> None:
        expired = sum(r["records"] for r in rows)
        assert expired == w["decay"]["expired"] >= 1
        assert {r["decayed_by"] for r in rows} == {"os-agt-010"}

    def q9(rows: list[dict[str, Any]]) -> None:
        assert {r["agent"] for r in rows} == {"com-agt-003"}
        assert sum(r["records"] for r in rows) == formed[0]

    def q10(rows: list[dict[str, Any]]) -> None:
        assert ids(rows) == [w["chain"][0]]
        assert rows[0]["superseded_at"] > rows[0]["recalled_at"]

    def q11(rows: list[dict[str, Any]]) -> None:
        (r,) = rows
        assert r["outcome"] == "used" and r["decided_by"] == "mf_policy"
        assert r["records_erased"] == len(w["gone"])
        assert r["all_content_destroyed"] is True and r["review_flags_open"] == 0
        assert r["events_still_linked"] == 0 and r["profile_left"] == 0

    def q12(rows: list[dict[str, Any]]) -> None:
        assert [(r["revision"], r["tier"], r["action"], r["changed_by"]) for r in rows] == [
            (1, "episodic", "record.formed", "os-agt-010"),
            (2, "relational", "record.promoted", "os-agt-010"),
        ]
        assert rows[0]["known_until"] == rows[1]["known_from"] and rows[1]["known_until"] is None

    def q13(rows: list[dict[str, Any]]) -> None:
        assert [(r["action"], r["outcome"], r["approvals"]) for r in rows] == [
            ("promote", "denied", 1)
        ]

    def q14(rows: list[dict[str, Any]]) -> None:
        (r,) = rows
        assert r["chain_ok"] is True and r["unsealed"] == 0 and r["sealed"] == r["events"] > 20

    def q15(rows: list[dict[str, Any]]) -> None:
        got = {(r["agent_id"], r["status"]): r for r in rows}
        assert set(got) == {("com-agt-003", "served"), ("com-agt-003", "denied")}
        assert got["com-agt-003", "served"]["recalls"] == 2
        assert got["com-agt-003", "served"]["records_returned"] >= 1
        assert got["com-agt-003", "denied"]["records_returned"] == 0

    def q16(rows: list[dict[str, Any]]) -> None:
        assert sorted(ids(rows)) == sorted([w["e1"], *w["gone"]])
        assert {r["action"] for r in rows} == {"erase", "erase_subject"}
        assert {r["decided_by"] for r in rows} == {"mf_policy"}

    checks: dict[str, tuple[dict[str, str], Callable[[list[dict[str, Any]]], None]]] = {
        "Q1": ({"subject": "user-8842"}, q1),
        "Q2": ({}, q2),
        "Q3": ({}, q3),
        "Q4": ({"subject": "user-8842", "agent": "com-agt-003"}, q4),
        "Q5": ({}, q5),
        "Q6": ({"memory_id": w["s1"]}, q6),
        "Q7": ({"memory_id": w["chain"][1]}, q7),
        "Q8": ({}, q8),
        "Q9": ({}, q9),
        "Q10": ({}, q10),
        "Q11": ({"subject": "user-gone", "approval_id": w["subject_approval"]}, q11),
        "Q12": ({"memory_id": w["e3"]}, q12),
        "Q13": ({}, q13),
        "Q14": ({}, q14),
        "Q15": ({}, q15),
        "Q16": ({}, q16),
    }
    assert set(checks) == set(queries), "every cookbook question has its check, and only those"
    auditor = fabric.connect("mf_auditor")
    for qid, query in queries.items():
        params, check = checks[qid]
        with auditor.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(query, {**base, **params}).fetchall()  # type: ignore[arg-type]
        try:
            check(rows)
        except AssertionError as exc:
            raise AssertionError(f"{qid}: {rows!r}") from exc


# --- the relations themselves ---------------------------------------------------------------


@pytest.mark.parametrize("name", RELATIONS)
def test_only_the_auditor_calls_the_relations(fabric: Fabric, name: str) -> None:
    query, params = relation(name)
    for login in ("mf_agent_a", "mf_committer", "mf_admin", "mf_policy", "mf_projector"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            fabric.connect(login).execute(query, params)
    assert fabric.session("mf_auditor").execute(query, params).fetchall() is not None


@pytest.mark.parametrize("name", RELATIONS)
def test_an_unknown_tenant_is_refused(fabric: Fabric, name: str) -> None:
    query, params = relation(name, tenant="nope")
    with pytest.raises(psycopg.Error) as caught:
        fabric.session("mf_auditor").execute(query, params)
    assert caught.value.sqlstate == "P0002"


def test_relations_hold_no_content_and_no_subject_id(fabric: Fabric) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    run = fabric.open_run(subject=canary, session=f"{canary}-s")
    memory_id = fabric.form(run, canary)
    fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
    auditor = fabric.connect("mf_auditor")
    seen = []
    for name in RELATIONS:
        query, params = relation(name, memory_id=memory_id)
        rows = auditor.execute(query, params).fetchall()
        seen.append(str(rows))
        if name in ("events", "record_history", "recall_history", "recalled_records"):
            assert rows, name
    assert canary not in "".join(seen)


def test_the_relations_are_tenant_first(fabric: Fabric) -> None:
    run = fabric.open_run()
    fabric.form(run, "acme only")
    auditor = fabric.connect("mf_auditor")
    assert auditor.execute(
        "SELECT count(*) FROM fabric_audit.events('globex', '-infinity', 'infinity') "
        "WHERE event_type = 'memory.record.formed'"
    ).fetchone() == (0,)
    assert auditor.execute(
        "SELECT count(*) FROM fabric_audit.events('acme', '-infinity', 'infinity') "
        "WHERE event_type = 'memory.record.formed'"
    ).fetchone() == (1,)


def test_recalls_and_recall_history_read_the_same_recalls(fabric: Fabric) -> None:
    """fabric_audit.recalls (the recall events as jsonb documents) and recall_history with
    recalled_records (the canonical relations) are two shapes of one set of events: the same
    recalls, in the same order, with the same memory ids in the same rank order."""
    run = fabric.open_run()
    fabric.form(run, "recalled one")
    fabric.form(run, "recalled two")
    fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
    narrow = fabric.open_run(tools=["tool:memory-propose"])
    denied = fabric.recall("mf_agent_a", {"run_id": str(narrow), "tiers": ["episodic"]})
    assert denied["status"] == "denied"
    fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["semantic"]})
    auditor = fabric.connect("mf_auditor")
    documents, history, ranked = (
        [r[0] for r in auditor.execute(*relation(name)).fetchall()]
        for name in ("recalls", "recall_history", "recalled_records")
    )
    ranked.sort(key=lambda r: (r["recall_id"], r["rank"]))
    assert [d["status"] for d in documents] == ["served", "denied", "served"]
    same = ("occurred_at", "status", "actor_login", "run_id", "correlation_id", "reason")
    assert [[d[c] for c in same] for d in documents] == [[h[c] for c in same] for h in history]
    for d, h in zip(documents, history, strict=True):
        returned = [r["memory_id"] for r in ranked if r["recall_id"] == h["recall_id"]]
        assert d["memory_ids"] == returned and h["returned"] == len(returned)
        assert d["request_hash"] == h["request_hash"]
        assert (d["tiers_served"] or []) == h["tiers_served"]
        assert (d["tiers_denied"] or []) == h["tiers_denied"]
    assert sum(len(d["memory_ids"]) for d in documents) == len(ranked) >= 2


RECALL_DOCUMENTS = (
    "SELECT jsonb_build_object('occurred_at', e.occurred_at, 'status', e.payload ->> 'status',"
    " 'agent_id', e.actor_agent_id, 'actor_login', e.actor_login, 'run_id', e.run_id,"
    " 'correlation_id', e.correlation_id, 'tiers_served', e.payload -> 'tiers_served',"
    " 'tiers_denied', e.payload -> 'tiers_denied', 'scope', e.payload -> 'scope',"
    " 'memory_ids', coalesce(e.payload -> 'memory_ids', '[]'),"
    " 'request_hash', e.payload ->> 'request_hash', 'reason', e.payload ->> 'reason')"
    " FROM fabric.events e WHERE e.tenant_id = 'acme'"
    " AND e.event_type IN ('memory.recall.served', 'memory.recall.denied')"
    " AND e.occurred_at >= now() - interval '1 day' AND e.occurred_at < now() + interval '1 day'"
    " ORDER BY e.occurred_at, e.event_id"
)


def test_recalls_gives_each_recall_event_of_the_tenant_as_its_documents(fabric: Fabric) -> None:
    """fabric_audit.recalls, the jsonb view of recall_history: each recall of the tenant in
    the window, in order, with the event's own documents (scope with its pseudonyms, tiers
    as the event holds them, absent ones NULL, memory ids in rank order) -- served,
    partial, denied, and a run without a subject; another tenant's recalls are not there."""
    run = fabric.open_run()
    fabric.form(run, "recalled one")
    fabric.form(run, "recalled two")
    fabric.recall(
        "mf_agent_a", {"run_id": str(run), "tiers": ["episodic"], "correlation_id": "c-1"}
    )
    partial = {"run_id": str(run), "tiers": ["episodic", "relational"], "allow_partial": True}
    narrow = fabric.open_run(tools=["tool:memory-propose"])
    statuses = [
        fabric.recall("mf_agent_a", partial)["status"],
        fabric.recall("mf_agent_a", {"run_id": str(narrow), "tiers": ["episodic"]})["status"],
        fabric.recall("mf_agent_a", {"run_id": str(fabric.open_run(subject=None, session=None))})[
            "status"
        ],
    ]
    fabric.recall("mf_agent_b", {"run_id": str(fabric.open_run("com-agt-004", "globex"))})
    auditor = fabric.connect("mf_auditor")
    documents = [r[0] for r in auditor.execute(*relation("recalls")).fetchall()]
    with fabric.su() as su:
        expected = [r[0] for r in su.execute(RECALL_DOCUMENTS).fetchall()]
    assert documents == expected
    assert statuses == ["partial", "denied", "served"]
    assert [d["status"] for d in documents] == ["served", *statuses]
    assert len(documents) == 4 and {d["agent_id"] for d in documents} == {"com-agt-003"}
    assert any(d["tiers_served"] is None for d in documents)  # the denied recall
    assert len(documents[0]["memory_ids"]) == 2
