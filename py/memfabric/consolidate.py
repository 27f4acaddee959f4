"""WF-OS-MEMORY-CONSOLIDATE (docs/concepts.md, "Consolidation"): candidates -> consolidator
-> scope validation -> policy gate -> commit, run as two identities: the consolidator
(os-agt-011) reads and recommends, the committer (os-agt-010) commits. Validation and
thresholds live in the database; this module only decides what to recommend.
"""

from __future__ import annotations

import json
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from memfabric.call import fabric_call
from memfabric.hashing import content_hash

Json = dict[str, Any]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Recommendation:
    kind: str  # consolidation | reflection | promotion | distillation
    sources: tuple[str, ...]
    proposal: Json


class Consolidator(Protocol):
    """Decides what to recommend from the candidates; never commits anything."""

    def recommend(self, batch: Json) -> list[Recommendation]: ...


class DeterministicConsolidator:
    """Episodic records of one scope that agree on an assertion (`content.key` and
    `content.value`), corroborated by at least the instance's threshold of episodes, become
    one semantic assertion. A key already live with the same content hash is skipped, so
    repeated runs form nothing new."""

    def recommend(self, batch: Json) -> list[Recommendation]:
        need = int(batch["thresholds"]["min_corroborating_episodes"])
        live = {
            (a["scope_key"], a["key"], a["content_hash"])
            for a in batch["live_assertions"]
            if a["tier"] == "semantic"
        }
        groups: dict[tuple[str, str, str], list[Json]] = defaultdict(list)
        for c in batch["candidates"]:
            content = c.get("content") or {}
            if "key" not in content or "value" not in content:
                continue
            value = json.dumps(content["value"], sort_keys=True)
            groups[(c["scope_key"], str(content["key"]), value)].append(c)
        out = []
        for (scope_key, key, value), members in sorted(groups.items()):
            if len({m["memory_id"] for m in members}) < need:
                continue
            assertion = {"key": key, "value": json.loads(value)}
            if (scope_key, key, content_hash(assertion)) in live:
                continue
            confidence = round(sum(m["confidence"] for m in members) / len(members), 6)
            out.append(
                Recommendation(
                    kind="consolidation",
                    sources=tuple(sorted(m["memory_id"] for m in members)),
                    proposal={"tier": "semantic", "content": assertion, "confidence": confidence},
                )
            )
        return out


@dataclass
class LLMConsolidator:
    """A consolidator backed by a local OpenAI-compatible chat endpoint (vLLM, TEI). It only
    proposes; the database validates every recommendation exactly as for the deterministic
    one. Never called in tests (no model runs here)."""

    base_url: str
    model: str
    timeout: float = 60.0
    api_key: str | None = None

    def recommend(self, batch: Json) -> list[Recommendation]:
        prompt = (
            "You consolidate episodic memory records into semantic assertions. Answer only "
            'with JSON: {"recommendations": [{"sources": [memory_id, ...], "key": str, '
            '"value": any, "confidence": number}]}. Only group records of one scope_key that '
            "agree. Records:\n" + json.dumps(batch["candidates"], default=str)
        )
        body = json.dumps(
            {
                "model": self.model,
                "temperature": 0,
                "messages": [{"role": "user", "content": prompt}],
            }
        ).encode()
        request = urllib.request.Request(  # noqa: S310 - a configured local endpoint
            self.base_url.rstrip("/") + "/v1/chat/completions",
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}),
            },
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
            answer = json.loads(response.read())
        parsed = json.loads(answer["choices"][0]["message"]["content"])
        return [
            Recommendation(
                kind="consolidation",
                sources=tuple(r["sources"]),
                proposal={
                    "tier": "semantic",
                    "content": {"key": r["key"], "value": r["value"]},
                    "confidence": float(r["confidence"]),
                },
            )
            for r in parsed["recommendations"]
        ]


@dataclass
class RunSummary:
    workflow_event_id: str
    candidates: int = 0
    recommended: int = 0
    committed: int = 0
    rejected: int = 0
    deferred: int = 0
    reasons: list[str] = field(default_factory=list)


def run_consolidation(
    consolidator_conn: psycopg.Connection[Any],
    committer_conn: psycopg.Connection[Any],
    tenant_id: str,
    consolidator: Consolidator | None = None,
    budget: int | None = None,
    progress: Progress = lambda _: None,
) -> RunSummary:
    """One run of the workflow for one tenant. Under budget pressure the surplus is
    deferred to the next run; validation and the policy gate are never skipped."""
    consolidator = consolidator or DeterministicConsolidator()
    workflow = str(fabric_call(consolidator_conn, "fabric_api.start_workflow_run", tenant_id))
    summary = RunSummary(workflow)
    batch = fabric_call(
        consolidator_conn, "fabric_api.consolidation_candidates", tenant_id, workflow
    )
    summary.candidates = len(batch["candidates"])
    recommendations = consolidator.recommend(batch)
    if budget is not None and len(recommendations) > budget:
        summary.deferred = len(recommendations) - budget
        recommendations = recommendations[:budget]
    for rec in recommendations:
        filed = fabric_call(
            consolidator_conn,
            "fabric_api.recommend",
            {
                "tenant_id": tenant_id,
                "kind": rec.kind,
                "workflow_event_id": workflow,
                "sources": list(rec.sources),
                "proposal": rec.proposal,
            },
        )
        summary.recommended += 1
        result = fabric_call(
            committer_conn, "fabric_api.commit_recommendation", filed["recommendation_id"]
        )
        if result["status"] == "committed":
            summary.committed += 1
        else:
            summary.rejected += 1
            summary.reasons.append(result["reason"])
    progress(
        f"{tenant_id}: {summary.candidates} candidates, {summary.committed} committed, "
        f"{summary.rejected} rejected, {summary.deferred} deferred"
    )
    return summary
