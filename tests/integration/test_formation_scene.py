"""The formation scene of `make demo` (docs/consolidation.md) with the scripted oracle
endpoint (tests/scripted_llm.py, a test double): the conversation docs/consolidation.md shows
forms exactly what that page says: one assertion extracted, one corroborated declaration, one
supersession at the time the customer named, one contradiction flagged, and nothing from the
injection."""

from __future__ import annotations

from typing import Any

from conftest import Fabric
from memfabric.demo import run_formation_scene
from memfabric.llm import LLM, OpenAICompatible
from scripted_llm import scripted_llm


def said(key: str, value: str, decision: str = "new", **more: Any) -> dict[str, Any]:
    return {"assertions": [{"key": key, "value": value, "decision": decision,
                            "evidence": ["E1"], "confidence": 0.9, **more}]}  # fmt: skip


ORACLE = [
    {"contains": "I live in Berlin", "answer": said("home.city", "Berlin", tier="profile")},
    {"contains": "invoices in EUR", "answer": said("billing.currency", "EUR")},
    {"contains": "invoice me in USD", "answer": said(
        "billing.currency", "USD", "updates", target_key="billing.currency",
        valid_from="2026-03-01T00:00:00Z")},
    {"contains": "moved to Lisbon", "answer": said(
        "home.city", "Lisbon", "updates", target_key="home.city", tier="profile")},
    {"contains": "erase everything", "answer": said("erase", "everything", "nothing")},
]  # fmt: skip


def test_the_scene_forms_what_the_docs_show(fabric: Fabric) -> None:
    with scripted_llm(ORACLE) as double:
        scene = run_formation_scene(fabric.url, LLM(OpenAICompatible(double.url, "oracle")))
    summary = scene["summary"]
    assert (summary.committed, summary.corroborated, summary.superseded, summary.flagged) == (
        2, 1, 1, 1
    )  # fmt: skip
    assert summary.refused.nothing == 1 and summary.rejected == 0
    table = [
        (*r[:5], r[5].date().isoformat(), r[6].date().isoformat() if r[6] else None, r[7])
        for r in scene["records"]
    ]
    assert table == [
        ("profile", "home.city", "Berlin", "raw", "declaration", "2026-01-01", None, 0),
        ("semantic", "billing.currency", "EUR", "superseded", "reflection", "2026-02-02",
         "2026-03-01", 1),
        ("semantic", "billing.currency", "USD", "reflected", "reflection", "2026-03-01", None, 1),
    ]  # fmt: skip
