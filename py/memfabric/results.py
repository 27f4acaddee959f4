"""Typed answers of the fabric's functions. Each keeps `.raw`, the full JSON the database
returned, so a field this module does not name is never lost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

Json = dict[str, Any]


def _uuid(value: Any) -> UUID | None:
    return None if value is None else UUID(str(value))


@dataclass(frozen=True)
class Run:
    """An open run: the identity an agent acts under (tenant, agent, subject, session)."""

    run_id: UUID
    tenant_id: str
    agent_id: str | None = None  # None when built from a bare run id
    subject_id: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class Proposal:
    """The answer of `propose`: validated, rejected (with the rule as `reason`) or denied."""

    proposal_id: UUID | None
    status: str
    reason: str | None
    replayed: bool
    raw: Json = field(repr=False)

    @classmethod
    def from_json(cls, raw: Json) -> Proposal:
        return cls(
            _uuid(raw.get("proposal_id")),
            str(raw["status"]),
            raw.get("reason"),
            bool(raw.get("replayed", False)),
            raw,
        )


@dataclass(frozen=True)
class Record:
    """A memory record as the fabric returns it (commit, promotion, supersession, recall)."""

    memory_id: UUID
    tier: str
    consolidation_state: str | None
    content: Json | None
    confidence: float | None
    scope: Json
    provenance: Json
    derived_from: list[UUID]
    supersedes: UUID | None
    raw: Json = field(repr=False)

    @classmethod
    def from_json(cls, raw: Json) -> Record:
        return cls(
            UUID(str(raw["memory_id"])),
            str(raw["tier"]),
            raw.get("consolidation_state"),
            raw.get("content"),
            None if raw.get("confidence") is None else float(raw["confidence"]),
            raw.get("scope") or {},
            raw.get("provenance") or {},
            [UUID(str(m)) for m in raw.get("derived_from") or []],
            _uuid(raw.get("supersedes")),
            raw,
        )


@dataclass(frozen=True)
class RecallAnswer:
    """The answer of `recall`: `status` ok, denied or malformed (denials are audited)."""

    status: str
    reason: str | None
    records: list[Record]
    mode_served: str | None
    truncated: bool
    raw: Json = field(repr=False)

    @classmethod
    def from_json(cls, raw: Json) -> RecallAnswer:
        return cls(
            str(raw["status"]),
            raw.get("reason"),
            [Record.from_json(r) for r in raw.get("records") or []],
            raw.get("mode_served"),
            bool(raw.get("truncated", False)),
            raw,
        )


@dataclass(frozen=True)
class Approval:
    """A policy approval: filed (`status` None until decided), approved, denied."""

    approval_id: UUID
    status: str | None
    raw: Json = field(repr=False)

    @classmethod
    def from_json(cls, raw: Json) -> Approval:
        return cls(UUID(str(raw["approval_id"])), raw.get("status"), raw)


@dataclass(frozen=True)
class Receipt:
    """What an erasure did (`erase`) or its stored receipt (`fabric_audit.erasure_receipt`):
    which records, what was destroyed, under which approval."""

    approval_id: UUID | None
    erased: list[UUID]
    raw: Json = field(repr=False)

    @classmethod
    def from_json(cls, raw: Json) -> Receipt:
        erased = raw.get("erased")
        if erased is None and raw.get("memory_id") is not None:
            erased = [raw["memory_id"]]
        return cls(_uuid(raw.get("approval_id")), [UUID(str(m)) for m in erased or []], raw)
