"""Governed recall at the cost of its own audit row (docs/benchmarks.md, "Recall at the cost of
its audit row"): what makes a recall cheaper is pinned here, so that it cannot come back
unnoticed, and every rule stays where it was (the recall tests hold the answers)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb
from test_recall_plan import auto_explain

from conftest import Fabric


def statements_of_a_recall(fabric: Fabric, request: dict[str, Any]) -> list[str]:
    """The executor statements one recall runs (auto_explain, nested statements included),
    as the agent, after a first recall on the same backend (plans made, the subject's key
    made)."""
    conn = fabric.connect(None)
    texts: list[str] = []

    def notice(d: Any) -> None:
        if d.message_primary and d.message_primary.startswith("duration:"):
            texts.append(json.loads(d.message_primary.split("\n", 1)[1])["Query Text"])

    auto_explain(conn)
    conn.execute(sql.SQL("SET SESSION AUTHORIZATION {}").format(sql.Identifier("mf_agent_a")))
    conn.execute("SELECT fabric_api.recall(%s)", (Jsonb(request),))
    conn.add_notice_handler(notice)
    answer = conn.execute("SELECT fabric_api.recall(%s)", (Jsonb(request),)).fetchone()
    assert answer is not None and answer[0]["status"] == "served", answer
    # the call itself is not one; nor is the resolution's sorting of the profile's lists,
    # which runs only for a profile whose lists are out of order (the test agent's)
    return [t for t in texts if "fabric_api.recall" not in t and "unnest(v_served_vis)" not in t]


def test_a_filter_only_recall_reads_profile_tools_and_subject_key_in_one_statement(
    fabric: Fabric,
) -> None:
    """Entering the run (3), one read of the agent's profile, the tool layers and the
    subject's key, the retrieval (2), the audit event's INSERT and its statement trigger: 8
    statements, where a recall ran 10 (the tool check and the subject's key read apart)."""
    run = fabric.open_run()
    fabric.form(run, "invoices in EUR please")
    texts = statements_of_a_recall(fabric, {"run_id": str(run), "tiers": ["episodic"]})
    assert len(texts) <= 8, "\n---\n".join(texts)
    assert not [t for t in texts if "subject_keys" in t and "memory_profile" not in t], texts
    assert not [t for t in texts if "tenant_agent_tools" in t and "memory_profile" not in t]


def test_a_recall_event_has_a_time_ordered_id(fabric: Fabric) -> None:
    """The audit event's id is a UUID version 7 whose first 48 bits are the Unix time in
    milliseconds: a new event's primary-key entry lands beside the last one, not on a
    random leaf of an index as large as the trail."""
    run = fabric.open_run()
    fabric.form(run, "invoices in EUR please")
    for _ in range(3):
        assert fabric.recall("mf_agent_a", {"run_id": str(run)})["status"] == "served"
    rows = (
        fabric.session(None)
        .execute(
            "SELECT event_id, occurred_at FROM fabric.events"
            " WHERE event_type = 'memory.recall.served' ORDER BY xid"
        )
        .fetchall()
    )
    assert len(rows) == 3
    stamps = []
    for event_id, occurred_at in rows:
        assert isinstance(event_id, uuid.UUID) and event_id.version == 7, event_id
        at = dt.datetime.fromtimestamp((event_id.int >> 80) / 1000, dt.UTC)
        assert abs(at - occurred_at) < dt.timedelta(seconds=5), (at, occurred_at)
        stamps.append(event_id.int >> 80)
    assert stamps == sorted(stamps)


def test_the_recall_envelope_is_the_record_envelope_with_score_and_retrieval(
    fabric: Fabric,
) -> None:
    """fabric._recall_envelope (the records of filter-only and text recall, built once) has
    exactly the fields of fabric._record_envelope, plus "score" and "retrieval" (null and {}
    unless given); a field added to one and not to the other fails here."""
    run = fabric.open_run()
    episode = fabric.form(run, "invoices in EUR please", compliance_labels=["pci"])
    fabric.form(run, "billing entity", tier="semantic", derived_from=[episode],
                content={"assertion": "billing entity"})  # fmt: skip
    differing = fabric.session(None).execute(
        "SELECT m.memory_id FROM fabric.memory_records m"
        " CROSS JOIN LATERAL (SELECT coalesce(jsonb_agg(l.derived_from_id"
        "   ORDER BY l.derived_from_id), '[]') AS d FROM fabric.memory_lineage l"
        "   WHERE l.tenant_id = m.tenant_id AND l.memory_id = m.memory_id) l"
        " WHERE fabric._recall_envelope(m, l.d) IS DISTINCT FROM"
        '       fabric._record_envelope(m, l.d) || \'{"score": null, "retrieval": {}}\''
        "    OR fabric._recall_envelope(m, l.d, 0.983871, '{\"lexical\": 2}') IS DISTINCT FROM"
        "       fabric._record_envelope(m, l.d)"
        '       || \'{"score": 0.983871, "retrieval": {"lexical": 2}}\''
    )
    assert differing.fetchall() == []
    assert fabric.count("memory_records") == 2


def test_text_recall_answers_each_record_with_its_rank(fabric: Fabric) -> None:
    """Text recall's records carry what a single lexical list is given by the fusion: score
    1 / (60 + rank) over 1 / 61, rounded to 6 places, and retrieval {"lexical": rank}; the
    retrieval builds them with the record now (fabric._recall_envelope), in its own order."""
    run = fabric.open_run()
    for n in range(3):
        fabric.form(run, "invoice " * (3 - n) + f"note {n}")
    answer = fabric.recall("mf_agent_a", {"run_id": str(run), "query": "invoice", "limit": 2})
    assert [r["retrieval"] for r in answer["records"]] == [{"lexical": 1}, {"lexical": 2}]
    assert [r["score"] for r in answer["records"]] == [1.0, round(61 / 62, 6)]
    assert answer["truncated"] is True
    assert [r["content"]["text"] for r in answer["records"]] == [
        "invoice invoice invoice note 0",
        "invoice invoice note 1",
    ]
