"""The vector projection's data: collection contracts, the payload of one memory record,
points, and the checks and conversions they share (epoch microseconds, scope keys)."""

from __future__ import annotations

import hashlib
import json
import math
import operator
import re
import struct
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, SupportsFloat

from memfabric.constants import (
    INDEXED_TIERS,
    RETENTION_CLASSES,
    STATES,
    VISIBILITIES,
    confidence_in_range,
)

DISTANCE = "Cosine"
# The payload's shape, part of every collection's contract. 1: the subject and session ids in
# clear (subject_id, session_id, and in scope_id / scope_key); 2: their pseudonyms
# (subject_ref, session_ref; docs/projections.md, "Identifiers"). A new shape is a new
# contract, so new collections, filled by a rebuild.
PAYLOAD_VERSION = 2
_PAYLOAD_V1 = 1  # contracts recorded without a payload version (their names are kept)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# The open end of an open-ended record's `valid_until_ts`: 2**62 microseconds (year
# ~148,000), beyond every datetime Python holds, so `valid_until_ts > at` always holds.
# Range bounds travel as IEEE doubles: exact to the microsecond up to 2**53 us (2255-06-05);
# later instants compare at a coarser grain (at most 32 us by year 9999).
OPEN_ENDED_TS = 2**62

# Payload indexes: every field a filter may name (docs/projections.md: the required fields are
# "indexed for filterable search"). Kinds: keyword, tenant (keyword, is_tenant), float,
# int_range (integer, range lookups only), datetime.
PAYLOAD_INDEXES: tuple[tuple[str, str], ...] = (
    ("tenant_id", "tenant"),
    ("memory_id", "keyword"),
    ("tier", "keyword"),
    ("visibility", "keyword"),
    ("scope_type", "keyword"),
    ("scope_id", "keyword"),
    ("scope_key", "keyword"),
    ("subject_ref", "keyword"),
    ("agent_id", "keyword"),
    ("session_ref", "keyword"),
    ("content_hash", "keyword"),
    ("consolidation_state", "keyword"),
    ("retention_class", "keyword"),
    ("compliance_labels", "keyword"),
    ("version", "keyword"),
    ("confidence", "float"),
    ("valid_from_ts", "int_range"),
    ("valid_until_ts", "int_range"),
    ("valid_from", "datetime"),
    ("valid_until", "datetime"),
)

# Fields a projector may change on an existing point (lifecycle and decay), R-LIFE-1.
# Everything else (content hash, scope, ids, valid_from) is immutable after commit; a
# changed record is re-upserted from Postgres, an erased one deleted.
MUTABLE_FIELDS = frozenset(
    {"consolidation_state", "valid_until", "confidence", "compliance_labels", "retention_class"}
)

_SCROLL_PAGE = 512  # points per scroll request, on either backend

VectorLike = Iterable[SupportsFloat]


class VectorStoreError(Exception):
    """A refusal by the vector projection layer."""


class VectorStoreLocked(VectorStoreError):
    """Another process has this Edge data directory open (one process per shard)."""


class ContractMismatch(VectorStoreError):
    """A physical collection exists but does not hold the contract its name promises."""


class NotBound(VectorStoreError):
    """No collection contract is active for a tier: call ensure_collections() first."""


class ShardFailure(VectorStoreError):
    """A shard's child process died (memfabric.vectors.shards.ProcessShard); what the
    caller does about it: retry later (the projector backs off and drains again from its
    cursor)."""


class WritesLost(ShardFailure):
    """`flush()` after a shard's child died holding writes not yet flushed: they are lost
    (the shard was restarted from its last flush). Nothing since the last successful
    flush is durable: re-apply from there (the projector drains again from its cursor)."""


class ShardUnavailable(ShardFailure):
    """A shard's child died again and again: not restarted for now (bounded restarts);
    the message names the shard's directory and the last failure."""


def collection_name(tier: str) -> str:
    """The logical (alias) name of a tier's collection: `mem_<tier>`."""
    _check_tier(tier)
    return f"mem_{tier}"


def epoch_us(at: datetime) -> int:
    """Exact epoch microseconds of an aware datetime (the unit of `*_ts` payload fields)."""
    _check_aware(at, "datetime")
    return (at - _EPOCH) // _MICROSECOND


def rfc3339(at: datetime) -> str:
    """UTC RFC 3339 with microseconds, the form of `valid_from` / `valid_until` payloads."""
    _check_aware(at, "datetime")
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def scope_key(visibility: str, scope_id: str | None) -> str:
    """A scope key of `visibility` and its scope id, as Postgres builds it: the projections'
    scope id of a subject or session is its pseudonym ('subject:hmac:…'), of an agent its id
    ('agent:os-agt-003'); 'tenant' has none."""
    if visibility not in VISIBILITIES:
        raise ValueError(f"unknown visibility {visibility!r}")
    if visibility == "tenant":
        return "tenant"
    if not scope_id:
        what = "agent_id" if visibility == "agent" else f"{visibility}_ref"
        raise ValueError(f"visibility {visibility!r} needs its {what}")
    return f"{visibility}:{scope_id}"


def _check_tier(tier: str) -> None:
    if tier not in INDEXED_TIERS:
        raise ValueError(f"tier {tier!r} has no vector collection (indexed: {INDEXED_TIERS})")


def _check_aware(at: datetime, what: str) -> None:
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime")


def _norm_id(value: object) -> str:
    try:
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
    except ValueError:
        raise ValueError(f"memory_id must be a UUID, got {value!r}") from None


def _as_vector(vector: VectorLike, dims: int) -> list[float]:
    tolist = getattr(vector, "tolist", None)  # numpy: one C call instead of one per element
    values: list[float] = list(map(float, tolist() if callable(tolist) else vector))
    if len(values) != dims:
        raise ValueError(f"vector has {len(values)} dimensions, the collection contract {dims}")
    norm = sum(map(operator.mul, values, values))  # inf or nan when any element is
    if not math.isfinite(norm) or norm == 0.0:
        raise ValueError("vector must be finite and non-zero (Cosine distance)")
    return values


def _f32(score: float) -> float:
    """Scores as Qdrant types them (f32). Edge and a server already return f32 values;
    qdrant-client's local mode computes in f64 with BLAS, where identical vectors can score
    one ulp apart, which would break memory_id tie-breaking."""
    return float(struct.unpack("<f", struct.pack("<f", score))[0])


def _slug(text: str, width: int) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:width].strip("-") or "x"


@dataclass(frozen=True)
class CollectionContract:
    """What a physical collection holds: name (logical), model, model version, dims,
    distance, and the payload's shape (`PAYLOAD_VERSION`).

    Two contracts that differ in anything are two physical collections.
    """

    name: str
    model: str
    model_version: str
    dims: int
    distance: str = DISTANCE
    payload: int = PAYLOAD_VERSION

    def __post_init__(self) -> None:
        if self.name not in {f"mem_{t}" for t in INDEXED_TIERS}:
            raise ValueError(f"{self.name!r} is not a fabric tier collection")
        if not self.model or not self.model_version:
            raise ValueError("model and model_version are part of the contract: both required")
        if isinstance(self.dims, bool) or not isinstance(self.dims, int) or self.dims < 1:
            raise ValueError(f"dims must be a positive integer, got {self.dims!r}")
        if self.distance != DISTANCE:
            raise ValueError(f"fabric collections use {DISTANCE} distance, not {self.distance!r}")
        if self.payload not in (_PAYLOAD_V1, PAYLOAD_VERSION):
            raise ValueError(f"unknown payload version {self.payload!r}")

    @property
    def tier(self) -> str:
        return self.name.removeprefix("mem_")

    @property
    def fingerprint(self) -> str:
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:10]

    @cached_property
    def physical_name(self) -> str:
        """e.g. `mem_semantic__all-minilm-l6-v2_1-0_384d_3f9a1c2b7e`: readable, and unique
        through the hash of the whole contract. Computed once per contract (every search
        names its shards by it)."""
        return (
            f"{self.name}__{_slug(self.model, 40)}_{_slug(self.model_version, 20)}"
            f"_{self.dims}d_{self.fingerprint}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The contract as recorded; a payload of version 1 is left out, as it was before
        payloads had versions, so such a collection keeps its name (the fingerprint)."""
        out: dict[str, Any] = {
            "name": self.name,
            "model": self.model,
            "model_version": self.model_version,
            "dims": self.dims,
            "distance": self.distance,
        }
        if self.payload != _PAYLOAD_V1:
            out["payload"] = self.payload
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CollectionContract:
        return cls(
            name=str(data["name"]),
            model=str(data["model"]),
            model_version=str(data["model_version"]),
            dims=int(data["dims"]),
            distance=str(data.get("distance", DISTANCE)),
            payload=int(data.get("payload", _PAYLOAD_V1)),
        )


# --------------------------------------------------------------------------------------
# Points


@dataclass(frozen=True)
class MemoryPayload:
    """The vector payload of one record, validated; `to_payload()` adds derived fields.

    The subject and session are the pseudonyms the database gives the projections
    (`subject_ref`, `session_ref` of the feed): a projection never holds their ids in clear.
    """

    memory_id: str
    tenant_id: str
    tier: str
    visibility: str
    content_hash: str
    confidence: float
    valid_from: datetime
    consolidation_state: str
    retention_class: str
    subject_ref: str | None = None
    agent_id: str | None = None
    session_ref: str | None = None
    valid_until: datetime | None = None
    compliance_labels: tuple[str, ...] = ()
    version: str = "1.0.0"

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_id", _norm_id(self.memory_id))
        object.__setattr__(self, "compliance_labels", tuple(self.compliance_labels))
        if not self.tenant_id:
            raise ValueError("tenant_id is required")
        _check_tier(self.tier)
        if self.consolidation_state not in STATES:
            raise ValueError(f"unknown consolidation_state {self.consolidation_state!r}")
        if self.retention_class not in RETENTION_CLASSES:
            raise ValueError(f"unknown retention_class {self.retention_class!r}")
        scope_key(self.visibility, self.scope_id)  # visibility known and its id present
        conf = float(self.confidence)
        if not confidence_in_range(conf):
            raise ValueError(f"confidence must be in [0, 1], got {self.confidence!r}")
        object.__setattr__(self, "confidence", conf)
        _check_aware(self.valid_from, "valid_from")
        if self.valid_until is not None:
            _check_aware(self.valid_until, "valid_until")
            if self.valid_until <= self.valid_from:
                raise ValueError("valid_until must be after valid_from")
        if not all(isinstance(x, str) for x in self.compliance_labels):
            raise ValueError("compliance_labels must be strings")

    @property
    def scope_type(self) -> str:
        return self.visibility

    @property
    def scope_id(self) -> str | None:
        return {
            "session": self.session_ref,
            "agent": self.agent_id,
            "subject": self.subject_ref,
            "tenant": self.tenant_id,
        }.get(self.visibility)

    @property
    def scope_key(self) -> str:
        return scope_key(self.visibility, self.scope_id)

    def to_payload(self) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id,
            "tenant_id": self.tenant_id,
            "tier": self.tier,
            "visibility": self.visibility,
            "scope_type": self.scope_type,
            "scope_id": self.scope_id,
            "scope_key": self.scope_key,
            "subject_ref": self.subject_ref,
            "agent_id": self.agent_id,
            "session_ref": self.session_ref,
            "content_hash": self.content_hash,
            "confidence": self.confidence,
            "valid_from": rfc3339(self.valid_from),
            "valid_until": None if self.valid_until is None else rfc3339(self.valid_until),
            "valid_from_ts": epoch_us(self.valid_from),
            "valid_until_ts": (
                OPEN_ENDED_TS if self.valid_until is None else epoch_us(self.valid_until)
            ),
            "consolidation_state": self.consolidation_state,
            "retention_class": self.retention_class,
            "compliance_labels": list(self.compliance_labels),
            "version": self.version,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> MemoryPayload:
        """From a row of the projection feed (`fabric_api.projection_records_v2`)."""
        return cls(
            memory_id=str(row["memory_id"]),
            tenant_id=row["tenant_id"],
            tier=row["tier"],
            visibility=row["visibility"],
            subject_ref=row.get("subject_ref"),
            agent_id=row.get("agent_id"),
            session_ref=row.get("session_ref"),
            content_hash=row["content_hash"],
            confidence=float(row["confidence"]),
            valid_from=row["valid_from"],
            valid_until=row.get("valid_until"),
            consolidation_state=row["consolidation_state"],
            retention_class=row["retention_class"],
            compliance_labels=tuple(row.get("compliance_labels") or ()),
            version=row.get("version") or "1.0.0",
        )


@dataclass(frozen=True)
class VectorPoint:
    """One projected record: the point id is its memory_id."""

    payload: MemoryPayload
    vector: VectorLike

    @property
    def memory_id(self) -> str:
        return self.payload.memory_id


def _partial_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a set_payload change and add the derived fields it implies."""
    unknown = set(payload) - MUTABLE_FIELDS
    if unknown:
        raise ValueError(
            f"set_payload may change only {sorted(MUTABLE_FIELDS)}; got {sorted(unknown)} "
            "(an immutable change is a re-upsert from Postgres)"
        )
    out: dict[str, Any] = {}
    for key, value in payload.items():
        if key == "consolidation_state":
            if value not in STATES or value == "tombstoned":
                raise ValueError(f"consolidation_state {value!r}: tombstoned points are deleted")
            out[key] = value
        elif key == "valid_until":
            if value is None:
                out["valid_until"], out["valid_until_ts"] = None, OPEN_ENDED_TS
            else:
                out["valid_until"], out["valid_until_ts"] = rfc3339(value), epoch_us(value)
        elif key == "confidence":
            conf = float(value)
            if not confidence_in_range(conf):
                raise ValueError(f"confidence must be in [0, 1], got {value!r}")
            out[key] = conf
        elif key == "compliance_labels":
            labels = list(value)
            if not all(isinstance(x, str) for x in labels):
                raise ValueError("compliance_labels must be strings")
            out[key] = labels
        else:  # retention_class
            if value not in RETENTION_CLASSES:
                raise ValueError(f"unknown retention_class {value!r}")
            out[key] = value
    return out
