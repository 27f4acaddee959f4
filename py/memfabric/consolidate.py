"""WF-OS-MEMORY-CONSOLIDATE (docs/consolidation.md): candidates -> consolidator -> scope
validation -> policy gate -> commit -> Outcome Envelope, run as two identities: the
consolidator (os-agt-011) reads and recommends, the committer (os-agt-010) commits. Validation,
thresholds, authority and approvals live in the database; this module only decides what to
recommend, and records what happened.

Two consolidators run the same workflow: the deterministic one (the default: agreeing
episodes become one assertion) and, with a model configured, `ModelConsolidator`
(memfabric.formation: reflect and revise, one episode at a time, after the run cursor).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from memfabric.call import Cast, fabric_call
from memfabric.errors import FabricError, Misconfigured, connection_lost
from memfabric.formation import Counters, ReflectAndRevise, recommendation
from memfabric.hashing import content_hash
from memfabric.llm import LLM, LLMUnusable

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


class ModelConsolidator:
    """os-agt-011 with a model: each episode after the run cursor goes through the
    generate -> critique -> revise graph (memfabric.formation), in order; an episode whose
    answers are unusable ends the run's items there (deferred to the next run)."""

    def __init__(self, llm: LLM, checkpointer: Any = None) -> None:
        self.llm = llm
        self.graph = ReflectAndRevise(llm, checkpointer)

    @property
    def model(self) -> Json:
        return {"backend": self.llm.backend.backend, "model": self.llm.backend.model}


def require_instance_endpoint(
    consolidator_conn: psycopg.Connection[Any], tenant_id: str, llm: LLM | None
) -> None:
    """The model a worker uses is the instance's (`model_uri` of its configuration, where
    the air-gap rule holds): an OpenAI-compatible endpoint must be that URI, and a worker
    with no model or an in-process one must find none configured. Refused before the
    worker starts when they differ."""
    settings = fabric_call(consolidator_conn, "fabric_api.consolidation_settings", tenant_id)
    configured = ((settings or {}).get("model_uri") or "").rstrip("/")
    url = getattr(llm.backend, "url", "") if llm is not None else ""
    if llm is not None and url and url.rstrip("/") != configured:
        raise Misconfigured(
            f"tenant {tenant_id}: MEMFABRIC_LLM_URL is not the instance's model_uri"
            f" ({configured or 'none configured'})",
            hint="the instance's configuration names its model: fabric_api.configure_instance"
            f"('{tenant_id}', NULL, '{{\"model_uri\": \"<the same URL>\"}}') as an admin",
        )
    if configured and not url:
        raise Misconfigured(
            f"tenant {tenant_id}: the instance's model is {configured},"
            " but MEMFABRIC_LLM_URL does not name it",
            hint="set MEMFABRIC_LLM_URL to the instance's model_uri",
        )


def seed_instance_endpoint(
    admin_conn: psycopg.Connection[Any],
    consolidator_conn: psycopg.Connection[Any],
    tenant_id: str,
    llm: LLM | None,
) -> bool:
    """A local deployment's MEMFABRIC_LLM_URL seeds the instance's `model_uri` when it names
    none: through the admin's `fabric_api.configure_instance`, so the database judges it like
    any configuration (an air-gapped instance refuses an endpoint whose host is not local,
    and nothing is written). An instance that names a model keeps it; `require_instance_endpoint`
    then refuses a worker whose URL differs. Returns whether it seeded."""
    url = getattr(llm.backend, "url", "") if llm is not None else ""
    if not url:
        return False
    settings = fabric_call(consolidator_conn, "fabric_api.consolidation_settings", tenant_id)
    if (settings or {}).get("model_uri"):
        return False
    fabric_call(admin_conn, "fabric_api.configure_instance", tenant_id, None, {"model_uri": url})
    return True


MAX_UNUSABLE = 3  # runs in a row without a usable answer for one episode before it is abandoned


def cursor_stalled(cursor: Json | None) -> bool:
    """Whether the episode after the cursor has ended MAX_UNUSABLE runs in a row unusable."""
    return bool(cursor) and int((cursor or {}).get("unusable_runs") or 0) >= MAX_UNUSABLE


@dataclass
class RunSummary:
    workflow_event_id: str
    candidates: int = 0
    recommended: int = 0
    committed: int = 0
    corroborated: int = 0
    superseded: int = 0
    flagged: int = 0
    rejected: int = 0
    awaiting_approval: int = 0
    deferred: int = 0
    unusable: int = 0
    abandoned: list[str] = field(default_factory=list)
    refused: Counters = field(default_factory=Counters)
    reasons: list[str] = field(default_factory=list)
    item_ms: list[float] = field(default_factory=list)
    envelope: Json = field(default_factory=dict)
    outside_window: bool = False  # deferred whole: the instance's schedule window is closed


class _Run:
    """One run's bookkeeping: the commits and the Outcome Envelope (ids and counts only)."""

    def __init__(self, reader: Any, committer: Any, tenant_id: str, workflow: str) -> None:
        self.reader, self.committer, self.tenant = reader, committer, tenant_id
        self.summary = RunSummary(workflow)
        self.proposed: list[Json] = []
        self.approvals: list[Json] = []
        self.read: list[str] = []

    def file(self, kind: str, sources: list[str], proposal: Json, decision: str) -> Json:
        filed = fabric_call(
            self.reader,
            "fabric_api.recommend",
            {
                "tenant_id": self.tenant,
                "kind": kind,
                "workflow_event_id": self.summary.workflow_event_id,
                "sources": sources,
                "proposal": proposal,
            },
        )
        self.summary.recommended += 1
        return self.commit(str(filed["recommendation_id"]), kind, sources, decision)

    def commit(self, rid: str, kind: str, sources: list[str], decision: str) -> Json:
        try:
            result: Json = fabric_call(self.committer, "fabric_api.commit_recommendation", rid)
        except FabricError as exc:
            if connection_lost(exc):
                raise
            # refused by a rule (nothing written): the run goes on; the recommendation stays
            # pending, named with the SQLSTATE in the envelope
            result = {"status": "refused", "reason": f"refused at commit ({exc.sqlstate})"}
        status = str(result.get("status"))
        s = self.summary
        entry: Json = {
            "recommendation_id": rid,
            "kind": kind,
            "decision": decision,
            "sources": sources,
            "status": status,
        }
        if status == "committed":
            s.committed += 1
            record = result.get("record") or {}
            entry["memory_id"] = record.get("memory_id")
            if record.get("supersedes"):
                s.superseded += 1
                entry["supersedes"] = record["supersedes"]
        elif status == "corroborated":
            s.corroborated += 1
            entry["memory_id"] = result["memory_id"]
        elif status == "flagged":
            s.flagged += 1
            entry.update(
                flag_id=result["flag_id"], memory_id=result["memory_id"], reason=result["reason"]
            )
        elif status == "awaiting_approval":
            s.awaiting_approval += 1
            entry["approval_id"] = result["approval_id"]
            self.approvals.append(
                {
                    "recommendation_id": rid,
                    "approval_id": result["approval_id"],
                    "status": "awaiting",
                }
            )
        elif "record" in result or "memory_id" in result:  # a promotion's answer: the record
            status = entry["status"] = "committed"
            s.committed += 1
            entry["memory_id"] = result.get("memory_id") or (result.get("record") or {}).get(
                "memory_id"
            )
        else:
            s.rejected += 1
            s.reasons.append(str(result.get("reason")))
            entry["reason"] = result.get("reason")
        self.proposed.append(entry)
        return result

    def resume(self) -> None:
        """The policy gate, resumed: recommendations that wait for an approval (filed by an
        earlier run, before any restart) commit once approved, end once denied or expired."""
        waiting = fabric_call(self.committer, "fabric_api.awaiting_recommendations", self.tenant)
        for w in waiting:
            before = len(self.proposed)
            self.commit(str(w["recommendation_id"]), "promotion", [], "resumed")
            status = self.proposed[before]["status"]
            if status == "awaiting_approval":
                self.proposed.pop()  # still waiting: listed under approvals, not proposed again
                continue
            self.approvals.append(
                {
                    "recommendation_id": str(w["recommendation_id"]),
                    "approval_id": str(w["approval_id"]),
                    "status": "approved" if status == "committed" else status,
                }
            )

    def envelope(
        self, consolidator: str, model: Json | None, calls: list[Any], budget: int, started: float
    ) -> Json:
        s = self.summary
        cost = {
            "calls": len(calls),
            "prompt_tokens": sum(c.prompt_tokens for c in calls),
            "completion_tokens": sum(c.completion_tokens for c in calls),
            "latency_ms": round(sum(c.latency_ms for c in calls), 3),
            "per_call": [c.as_json() for c in calls],
        }
        return {
            "workflow": "WF-OS-MEMORY-CONSOLIDATE",
            "consolidator": consolidator,
            "model": model,
            "budget": budget,
            "duration_ms": round((time.monotonic() - started) * 1000, 3),
            "read": self.read,
            "abandoned": s.abandoned,
            "proposed": self.proposed,
            "approvals": self.approvals,
            "refused": vars(s.refused),
            "counts": {
                "candidates": s.candidates,
                "recommended": s.recommended,
                "committed": s.committed,
                "corroborated": s.corroborated,
                "superseded": s.superseded,
                "flagged": s.flagged,
                "rejected": s.rejected,
                "awaiting_approval": s.awaiting_approval,
                "deferred": s.deferred,
                "unusable": s.unusable,
                "abandoned": len(s.abandoned),
                "refused": sum(vars(s.refused).values()),
            },
            "cost": cost,
            "item_ms": s.item_ms,
        }


def _live_after(live: list[Json], entry: Json, formed: Any, scope_key: str) -> None:
    """Keep the run's view of the record set current: what it formed is live, what it
    superseded is not (so a later episode of the same run corroborates or updates it)."""
    if entry["status"] != "committed" or not entry.get("memory_id"):
        return
    if entry.get("supersedes"):
        live[:] = [a for a in live if a["memory_id"] != entry["supersedes"]]
    live.append(
        {
            "memory_id": entry["memory_id"],
            "tier": formed.tier,
            "scope_key": scope_key,
            "key": formed.key,
            "content": {"key": formed.key, "value": formed.value},
            "formation_method": "reflection",
            "valid_from": formed.valid_from,
        }
    )


def run_consolidation(
    consolidator_conn: psycopg.Connection[Any],
    committer_conn: psycopg.Connection[Any],
    tenant_id: str,
    consolidator: Consolidator | ModelConsolidator | None = None,
    budget: int | None = None,
    progress: Progress = lambda _: None,
    subject_id: str | None = None,
) -> RunSummary:
    """One run of the workflow for one tenant: resume what waits for an approval, read the
    candidates, recommend, commit (scope validation and the policy gate in the database),
    persist the Outcome Envelope. The budget (default: the instance's
    `consolidation_budget`) bounds the recommendations (deterministic) or the episodes
    (model) of a run; the surplus is deferred to the next run, never skipped past
    validation or the policy gate. Runs of one tenant take turns (a session advisory lock on
    the consolidator's connection), so two workers never form from the same episodes.
    Outside the instance's schedule window (`consolidation_window_start`/`_end`) a scheduled
    run is deferred whole; a run for one subject (on demand) is not scheduled and runs."""
    if subject_id is None:
        settings = fabric_call(consolidator_conn, "fabric_api.consolidation_settings", tenant_id)
        if settings is not None and settings.get("in_window") is False:
            # the instance's schedule window (its configuration, judged by the database's
            # clock) is closed: the whole run is deferred, nothing is read or written
            progress(f"{tenant_id}: outside the consolidation window {settings['window']}")
            return RunSummary(workflow_event_id="", outside_window=True)
    lock = ("SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended(%s, 0))",
            "SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended(%s, 0))")  # fmt: skip
    key = f"memfabric.consolidation:{tenant_id}"
    consolidator_conn.execute(lock[0], (key,))
    try:
        return _run_consolidation(
            consolidator_conn, committer_conn, tenant_id, consolidator, budget, progress,
            subject_id,
        )  # fmt: skip
    finally:
        if not consolidator_conn.closed and not consolidator_conn.broken:
            consolidator_conn.execute(lock[1], (key,))


def _run_consolidation(
    consolidator_conn: psycopg.Connection[Any],
    committer_conn: psycopg.Connection[Any],
    tenant_id: str,
    consolidator: Consolidator | ModelConsolidator | None = None,
    budget: int | None = None,
    progress: Progress = lambda _: None,
    subject_id: str | None = None,
) -> RunSummary:
    """The run itself, under the tenant's lock (`run_consolidation`)."""
    started = time.monotonic()
    consolidator = consolidator or DeterministicConsolidator()
    workflow = str(fabric_call(consolidator_conn, "fabric_api.start_workflow_run", tenant_id))
    run = _Run(consolidator_conn, committer_conn, tenant_id, workflow)
    summary = run.summary
    run.resume()
    through: tuple[str, str] | None = None
    calls: list[Any] = []
    if isinstance(consolidator, ModelConsolidator):
        cursor = fabric_call(consolidator_conn, "fabric_api.consolidation_cursor", tenant_id)
        batch = fabric_call(
            consolidator_conn,
            "fabric_api.consolidation_candidates",
            tenant_id,
            workflow,
            subject_id,
            1000 if budget is None else max(1, min(budget, 10000)),
            Cast(cursor["recorded_at"] if cursor else None, "timestamptz"),
            Cast(cursor["memory_id"] if cursor else None, "uuid"),
        )
        if budget is None:
            budget = int(batch.get("budget") or 0)
        episodes = batch["candidates"]
        summary.candidates = len(episodes)
        run.read = [str(e["memory_id"]) for e in episodes]
        live_by_scope: dict[str, list[Json]] = defaultdict(list)
        for a in batch["live_assertions"]:
            live_by_scope[a["scope_key"]].append(a)
        for n, episode in enumerate(episodes):
            if n >= budget:
                summary.deferred = len(episodes) - n
                break
            if n == 0 and cursor_stalled(cursor) and subject_id is None:
                # the model gave no usable answer for this episode in MAX_UNUSABLE runs in a
                # row: it no longer holds the tenant's formation back (named in the envelope)
                summary.abandoned.append(str(episode["memory_id"]))
                through = (str(episode["recorded_at"]), str(episode["memory_id"]))
                continue
            live = live_by_scope[episode["scope_key"]]
            item_started = time.monotonic()
            try:
                item = consolidator.graph.run(
                    episode, list(live), tenant_id=tenant_id, workflow_event_id=workflow
                )
            except LLMUnusable:
                summary.deferred = len(episodes) - n
                summary.unusable = 1
                break
            summary.refused.add(item.counters)
            for formed in item.formed:
                kind, proposal = recommendation(formed)
                run.file(kind, list(formed.sources), proposal, formed.decision)
                _live_after(live, run.proposed[-1], formed, episode["scope_key"])
            through = (str(episode["recorded_at"]), str(episode["memory_id"]))
            summary.item_ms.append(round((time.monotonic() - item_started) * 1000, 3))
        calls = consolidator.llm.drain_calls()
        name, model = "model", consolidator.model
        if subject_id is not None:
            through = None  # one subject's run keeps no tenant cursor (others come before)
    else:
        batch = fabric_call(
            consolidator_conn,
            "fabric_api.consolidation_candidates",
            tenant_id,
            workflow,
            subject_id,
        )
        if budget is None:
            budget = int(batch.get("budget") or 0)
        summary.candidates = len(batch["candidates"])
        run.read = [str(c["memory_id"]) for c in batch["candidates"]]
        recommendations = consolidator.recommend(batch)
        if len(recommendations) > budget:
            summary.deferred = len(recommendations) - budget
            recommendations = recommendations[:budget]
        for rec in recommendations:
            run.file(rec.kind, list(rec.sources), rec.proposal, rec.kind)
        name, model = "deterministic", None
    summary.envelope = run.envelope(name, model, calls, budget, started)
    fabric_call(
        consolidator_conn,
        "fabric_api.record_consolidation_outcome",
        tenant_id,
        workflow,
        summary.envelope,
        Cast(through[0] if through else None, "timestamptz"),
        Cast(through[1] if through else None, "uuid"),
    )
    progress(
        f"{tenant_id}: {summary.candidates} candidates, {summary.committed} committed, "
        f"{summary.corroborated} corroborated, {summary.flagged} flagged, "
        f"{summary.rejected} rejected, {summary.awaiting_approval} awaiting approval, "
        f"{summary.deferred} deferred, {sum(vars(summary.refused).values())} refused"
    )
    return summary
