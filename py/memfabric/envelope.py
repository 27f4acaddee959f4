"""The proposal envelope as a typed builder: what `fabric_api.propose` requires is required
here, what the fabric assigns is absent.

The database validates every envelope (`fabric_api.propose`); this module only spells its
shape so that the minimal envelope can be read from a signature. Required: the tier, the
tenant (first in every scope), the visibility, the content, the event that caused the memory
(`source_event_id`: the caller names it, nothing here mints one), how it was formed and the
confidence. Assigned by the fabric, so absent: `memory_id`, `consolidation_state`,
`formed_by` and `recorded_at`. Optional fields that are None are left out of the JSON, so
the database applies its own defaults (retention `durable`, version `1.0.0`, validity from
now, subject and session from the run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

# The domain types are memfabric.constants'; named here too for callers that import them
# from the envelope.
from memfabric.constants import FormationMethod as FormationMethod
from memfabric.constants import RetentionClass as RetentionClass
from memfabric.constants import Tier as Tier
from memfabric.constants import Visibility as Visibility

Json = dict[str, Any]
Timestamp = datetime | str


def _instant(value: Timestamp | None) -> str | None:
    """RFC 3339 with an offset (the database refuses a naive or relative time)."""
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        raise ValueError("validity times need a time zone (e.g. datetime.now(UTC))")
    return value.isoformat()


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """One proposal: `Envelope(tier=..., tenant_id=..., ...)` or the constructors below."""

    tier: Tier
    tenant_id: str
    visibility: Visibility
    content: Mapping[str, Any]
    source_event_id: str
    formation_method: FormationMethod
    confidence: float
    subject_id: str | None = None  # the run's when omitted; only the run's may be named
    session_id: str | None = None
    agent_id: str | None = None  # the calling agent's own id, or nothing
    correlation_id: str | None = None
    causation_id: str | None = None
    derived_from: Sequence[UUID | str] = field(default_factory=tuple)
    supersedes: UUID | str | None = None
    valid_from: Timestamp | None = None
    valid_until: Timestamp | None = None
    retention_class: RetentionClass | None = None
    compliance_labels: Sequence[str] = field(default_factory=tuple)
    version: str | None = None
    business_instance_id: str | None = None

    def to_json(self) -> Json:
        """The envelope as `fabric_api.propose` reads it."""
        scope: Json = {"tenant_id": self.tenant_id, "visibility": self.visibility}
        for key in ("subject_id", "session_id", "agent_id"):
            if getattr(self, key) is not None:
                scope[key] = getattr(self, key)
        provenance: Json = {
            "source_event_id": self.source_event_id,
            "formation_method": self.formation_method,
        }
        for key in ("correlation_id", "causation_id"):
            if getattr(self, key) is not None:
                provenance[key] = getattr(self, key)
        env: Json = {
            "tier": self.tier,
            "scope": scope,
            "content": dict(self.content),
            "provenance": provenance,
            "confidence": self.confidence,
        }
        if self.derived_from:
            env["derived_from"] = [str(m) for m in self.derived_from]
        if self.supersedes is not None:
            env["supersedes"] = str(self.supersedes)
        if self.valid_from is not None or self.valid_until is not None:
            env["validity_interval"] = {
                "valid_from": _instant(self.valid_from),
                "valid_until": _instant(self.valid_until),
            }
        if self.compliance_labels:
            env["compliance_labels"] = list(self.compliance_labels)
        for key in ("retention_class", "version", "business_instance_id"):
            if getattr(self, key) is not None:
                env[key] = getattr(self, key)
        return env


def episode(
    content: Mapping[str, Any],
    *,
    tenant_id: str,
    source_event_id: str,
    confidence: float,
    visibility: Visibility = "subject",
    formation_method: FormationMethod = "extraction",
    **optional: Any,
) -> Envelope:
    """A raw episode: what happened, caused by the event `source_event_id` (visibility
    `subject` and formation `extraction` unless named)."""
    return Envelope(
        tier="episodic",
        tenant_id=tenant_id,
        visibility=visibility,
        content=content,
        source_event_id=source_event_id,
        formation_method=formation_method,
        confidence=confidence,
        **optional,
    )


def assertion(
    tier: Literal["semantic", "procedural", "profile"],
    content: Mapping[str, Any],
    *,
    tenant_id: str,
    source_event_id: str,
    derived_from: Sequence[UUID | str],
    confidence: float,
    visibility: Visibility = "subject",
    formation_method: FormationMethod = "extraction",
    **optional: Any,
) -> Envelope:
    """A derived record (a fact, a procedure, a profile entry): it names the episodes it was
    derived from (the database refuses a semantic record without one)."""
    return Envelope(
        tier=tier,
        tenant_id=tenant_id,
        visibility=visibility,
        content=content,
        source_event_id=source_event_id,
        formation_method=formation_method,
        confidence=confidence,
        derived_from=tuple(derived_from),
        **optional,
    )
