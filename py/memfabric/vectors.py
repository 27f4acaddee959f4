"""Vector projection of the indexed tiers: one Qdrant collection per tier, two backends.

Postgres is write-authoritative; these collections are a disposable projection (R-PROJ-1,
docs/projections.md). Every point is one memory record: id = `memory_id`, the record's
embedding, and the Guide's required payload fields plus `scope_key` and integer epoch
microseconds for the validity bounds (`valid_from_ts`, `valid_until_ts`, open end =
`OPEN_ENDED_TS`), so a recall's validity test is two integer range conditions in one flat
conjunction on either backend, microsecond-exact (see OPEN_ENDED_TS for the limit).

Collections are versioned by their contract (logical name, model, model version, dims,
Cosine): `mem_semantic__<model>_<version>_<dims>d_<hash>` is the physical collection and
the logical name `mem_semantic` an alias to it (a Qdrant alias on a server, the manifest
of the data directory on Edge). A new model, version or dimension is a new physical
collection and an alias cutover, never a change in place; the old collection stays until
someone drops it.

Recall filters are always pushed into the vector query (tenant, scope keys, live states,
validity at an instant, minimum confidence, excluded labels); results go back to Postgres
as `(memory_id, score)` pairs, scores as f32 (Qdrant's type), ties broken by `memory_id` so
exact search is reproducible across a wipe and rebuild.

Backends:

- `EdgeVectorStore(path)`: Qdrant Edge (`qdrant-edge-py`), Qdrant's engine in process, one
  shard directory per physical collection. One process only may open a data directory
  (Qdrant's rule for an EdgeShard); the store takes an exclusive `flock` on
  `<path>/.lock` and a second opener fails at once with `VectorStoreLocked`. In the
  embedded deployment `memfabric serve` is that process. `optimize()` is never called.
- `QdrantServerStore(url=…)`: a Qdrant server through `qdrant-client` (production), or its
  local mode (`location=":memory:"` / `path=`), which is brute force and only for tests.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import hashlib
import json
import math
import operator
import os
import re
import shutil
import struct
import threading
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, SupportsFloat, runtime_checkable

if TYPE_CHECKING:
    import qdrant_edge
    from qdrant_client import QdrantClient
    from qdrant_client.http import models as qm

# Named here too (explicit re-exports) for callers that import them from memfabric.vectors.
from memfabric.constants import INDEXED_TIERS as INDEXED_TIERS
from memfabric.constants import LIVE_STATES as LIVE_STATES
from memfabric.constants import RETENTION_CLASSES as RETENTION_CLASSES
from memfabric.constants import STATES as STATES
from memfabric.constants import VISIBILITIES as VISIBILITIES
from memfabric.constants import confidence_in_range

DISTANCE = "Cosine"

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
    ("subject_id", "keyword"),
    ("agent_id", "keyword"),
    ("session_id", "keyword"),
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

_BATCH = 1024
_SCROLL_PAGE = 512
_TIE_FETCH_CAP = 65536
_MANIFEST_FORMAT = "memfabric.vectors.edge/1"

VectorLike = Iterable[SupportsFloat]


class VectorStoreError(Exception):
    """A refusal by the vector projection layer."""


class VectorStoreLocked(VectorStoreError):
    """Another process has this Edge data directory open (one process per shard)."""


class ContractMismatch(VectorStoreError):
    """A physical collection exists but does not hold the contract its name promises."""


class NotBound(VectorStoreError):
    """No collection contract is active for a tier: call ensure_collections() first."""


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
    """The record's scope key exactly as Postgres generates it ('subject:user-8842', 'tenant')."""
    if visibility not in VISIBILITIES:
        raise ValueError(f"unknown visibility {visibility!r}")
    if visibility == "tenant":
        return "tenant"
    if not scope_id:
        raise ValueError(f"visibility {visibility!r} needs its {visibility}_id")
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


# --------------------------------------------------------------------------------------
# Contracts


@dataclass(frozen=True)
class CollectionContract:
    """What a physical collection holds: name (logical), model, model version, dims, distance.

    Two contracts that differ in anything are two physical collections.
    """

    name: str
    model: str
    model_version: str
    dims: int
    distance: str = DISTANCE

    def __post_init__(self) -> None:
        if self.name not in {f"mem_{t}" for t in INDEXED_TIERS}:
            raise ValueError(f"{self.name!r} is not a fabric tier collection")
        if not self.model or not self.model_version:
            raise ValueError("model and model_version are part of the contract: both required")
        if isinstance(self.dims, bool) or not isinstance(self.dims, int) or self.dims < 1:
            raise ValueError(f"dims must be a positive integer, got {self.dims!r}")
        if self.distance != DISTANCE:
            raise ValueError(f"fabric collections use {DISTANCE} distance, not {self.distance!r}")

    @property
    def tier(self) -> str:
        return self.name.removeprefix("mem_")

    @property
    def fingerprint(self) -> str:
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:10]

    @property
    def physical_name(self) -> str:
        """e.g. `mem_semantic__all-minilm-l6-v2_1-0_384d_3f9a1c2b7e`: readable, and unique
        through the hash of the whole contract."""
        return (
            f"{self.name}__{_slug(self.model, 40)}_{_slug(self.model_version, 20)}"
            f"_{self.dims}d_{self.fingerprint}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "model_version": self.model_version,
            "dims": self.dims,
            "distance": self.distance,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CollectionContract:
        return cls(
            name=str(data["name"]),
            model=str(data["model"]),
            model_version=str(data["model_version"]),
            dims=int(data["dims"]),
            distance=str(data.get("distance", DISTANCE)),
        )


# --------------------------------------------------------------------------------------
# Points


@dataclass(frozen=True)
class MemoryPayload:
    """The vector payload of one record, validated; `to_payload()` adds derived fields."""

    memory_id: str
    tenant_id: str
    tier: str
    visibility: str
    content_hash: str
    confidence: float
    valid_from: datetime
    consolidation_state: str
    retention_class: str
    subject_id: str | None = None
    agent_id: str | None = None
    session_id: str | None = None
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
            "session": self.session_id,
            "agent": self.agent_id,
            "subject": self.subject_id,
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
            "subject_id": self.subject_id,
            "agent_id": self.agent_id,
            "session_id": self.session_id,
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
        """From a `fabric.memory_records` row (a dict row of psycopg, for instance)."""
        return cls(
            memory_id=str(row["memory_id"]),
            tenant_id=row["tenant_id"],
            tier=row["tier"],
            visibility=row["visibility"],
            subject_id=row.get("subject_id"),
            agent_id=row.get("agent_id"),
            session_id=row.get("session_id"),
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


# --------------------------------------------------------------------------------------
# Recall filter


@dataclass(frozen=True)
class MatchCond:
    """`key` equals one of `values` (for an array field: any element does)."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class RangeCond:
    key: str
    gte: float | None = None
    gt: float | None = None
    lte: float | None = None
    lt: float | None = None


Condition = MatchCond | RangeCond


@dataclass(frozen=True)
class FilterSpec:
    """A backend-neutral conjunction: all of `must`, none of `must_not`."""

    must: tuple[Condition, ...]
    must_not: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class RecallFilter:
    """What a recall may see, pushed into every vector query (never post-filtered).

    tenant and scope keys are mandatory and non-empty (fail closed); `valid_at` is the
    instant the records must be valid at (start inclusive, end exclusive); `states` is a
    subset of the live states.
    """

    tenant_id: str
    scope_keys: Sequence[str]
    valid_at: datetime
    min_confidence: float = 0.0
    excluded_labels: Sequence[str] = ()
    states: Sequence[str] = field(default=LIVE_STATES)

    def __post_init__(self) -> None:
        if isinstance(self.scope_keys, str) or isinstance(self.excluded_labels, str):
            raise TypeError("scope_keys and excluded_labels are sequences of strings")
        object.__setattr__(self, "scope_keys", tuple(dict.fromkeys(self.scope_keys)))
        object.__setattr__(self, "excluded_labels", tuple(dict.fromkeys(self.excluded_labels)))
        object.__setattr__(self, "states", tuple(dict.fromkeys(self.states)))
        if not self.tenant_id:
            raise ValueError("a recall filter needs its tenant_id")
        if not self.scope_keys or not all(self.scope_keys):
            raise ValueError("a recall filter needs at least one scope key")
        _check_aware(self.valid_at, "valid_at")
        conf = float(self.min_confidence)
        if not confidence_in_range(conf):
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence!r}")
        if not self.states or not set(self.states) <= set(LIVE_STATES):
            raise ValueError(f"states must be a non-empty subset of {LIVE_STATES}")

    def spec(self) -> FilterSpec:
        at = float(epoch_us(self.valid_at))  # exact while below 2**53 us (until 2255)
        must: list[Condition] = [
            MatchCond("tenant_id", (self.tenant_id,)),
            MatchCond("scope_key", tuple(self.scope_keys)),
            MatchCond("consolidation_state", tuple(self.states)),
            RangeCond("valid_from_ts", lte=at),
            RangeCond("valid_until_ts", gt=at),
        ]
        if self.min_confidence > 0.0:
            must.append(RangeCond("confidence", gte=float(self.min_confidence)))
        must_not: tuple[Condition, ...] = ()
        if self.excluded_labels:
            must_not = (MatchCond("compliance_labels", tuple(self.excluded_labels)),)
        return FilterSpec(tuple(must), must_not)

    def to_filter(self) -> qm.Filter:
        """The filter as a `qdrant_client` model (server and local mode)."""
        return _client_filter(self.spec())

    def to_edge_filter(self) -> qdrant_edge.Filter:
        """The same filter as a `qdrant_edge` object."""
        return _edge_filter(self.spec())


def _client_filter(spec: FilterSpec) -> qm.Filter:
    from qdrant_client.http import models as m

    def cond(c: Condition) -> m.FieldCondition:
        if isinstance(c, RangeCond):
            return m.FieldCondition(
                key=c.key, range=m.Range(gte=c.gte, gt=c.gt, lte=c.lte, lt=c.lt)
            )
        if len(c.values) == 1:
            return m.FieldCondition(key=c.key, match=m.MatchValue(value=c.values[0]))
        return m.FieldCondition(key=c.key, match=m.MatchAny(any=list(c.values)))

    must: list[m.Condition] = [cond(c) for c in spec.must]
    must_not: list[m.Condition] = [cond(c) for c in spec.must_not]
    return m.Filter(must=must, must_not=must_not or None)


def _edge_filter(spec: FilterSpec) -> qdrant_edge.Filter:
    import qdrant_edge as qe

    def cond(c: Condition) -> qe.FieldCondition:
        if isinstance(c, RangeCond):
            return qe.FieldCondition(
                c.key, range=qe.RangeFloat(gte=c.gte, gt=c.gt, lte=c.lte, lt=c.lt)
            )
        if len(c.values) == 1:
            return qe.FieldCondition(c.key, match=qe.MatchValue(c.values[0]))
        return qe.FieldCondition(c.key, match=qe.MatchAny(list(c.values)))

    must: list[Any] = [cond(c) for c in spec.must]
    must_not: list[Any] = [cond(c) for c in spec.must_not]
    return qe.Filter(must=must, must_not=must_not or None)


# --------------------------------------------------------------------------------------
# The protocol


@runtime_checkable
class VectorStore(Protocol):
    """The vector projection: one collection per indexed tier, bound to one contract each."""

    def ensure_collections(
        self, model: str, version: str, dims: int, *, activate: bool = True
    ) -> dict[str, CollectionContract]:
        """Create (or open) the physical collections of this contract with their payload
        indexes and bind this store to them. `activate` moves the logical aliases to them
        (the cutover); without it only this store uses them, e.g. to build a new version
        while recall still reads the old one, then `cutover()`."""
        ...

    def cutover(self) -> None:
        """Point every logical name at the collection this store is bound to."""
        ...

    def contracts(self) -> dict[str, CollectionContract]:
        """tier -> the contract this store reads and writes."""
        ...

    def aliases(self) -> dict[str, str]:
        """logical name -> physical collection, as the backend has them now."""
        ...

    def collections(self) -> dict[str, CollectionContract]:
        """Every physical fabric collection present, old versions included."""
        ...

    def upsert(self, tier: str, points: Sequence[VectorPoint]) -> None: ...

    def delete(self, tier: str, ids: Sequence[str]) -> None: ...

    def set_payload(self, tier: str, ids: Sequence[str], payload: Mapping[str, Any]) -> None:
        """Change lifecycle fields (MUTABLE_FIELDS) of existing points; unknown ids are
        skipped."""
        ...

    def search(
        self,
        tiers: Sequence[str],
        vector: VectorLike,
        rfilter: RecallFilter,
        limit: int,
        exact: bool = False,
    ) -> list[tuple[str, float]]:
        """Top `limit` (memory_id, score) over the tiers' collections, by score descending
        then memory_id ascending."""
        ...

    def count(self, tier: str) -> int: ...

    def scroll(self, tier: str) -> Iterator[tuple[str, dict[str, Any]]]: ...

    def flush(self) -> None:
        """Make every write so far durable (call before advancing a projection cursor)."""
        ...

    def wipe(self) -> None:
        """Drop and recreate (empty) the collections this store is bound to."""
        ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------
# Shared logic


class _StoreBase(abc.ABC):
    """Validation, contract binding, tie-stable merging; backends supply the primitives."""

    def __init__(self) -> None:
        self._mutex = threading.RLock()
        self._bound: dict[str, CollectionContract] | None = None
        self._closed = False

    # primitives --------------------------------------------------------------------
    @abc.abstractmethod
    def _open_or_create(self, contract: CollectionContract) -> None:
        """A backend primitive."""

    @abc.abstractmethod
    def _drop(self, physical: str) -> None:
        """A backend primitive."""

    @abc.abstractmethod
    def _alias_map(self) -> dict[str, str]:
        """A backend primitive."""

    @abc.abstractmethod
    def _set_aliases(self, targets: Mapping[str, str]) -> None:
        """A backend primitive."""

    @abc.abstractmethod
    def _contract_of(self, physical: str) -> CollectionContract | None:
        """A backend primitive."""

    @abc.abstractmethod
    def _physical_names(self) -> list[str]:
        """A backend primitive."""

    @abc.abstractmethod
    def _upsert_raw(
        self, physical: str, rows: list[tuple[str, list[float], dict[str, Any]]]
    ) -> None:
        """A backend primitive."""

    @abc.abstractmethod
    def _delete_raw(self, physical: str, ids: list[str]) -> None:
        """A backend primitive."""

    @abc.abstractmethod
    def _set_payload_raw(self, physical: str, ids: list[str], payload: dict[str, Any]) -> None:
        """A backend primitive."""

    @abc.abstractmethod
    def _query_raw(
        self, physical: str, vector: list[float], spec: FilterSpec, n: int, exact: bool
    ) -> list[tuple[str, float]]:
        """A backend primitive."""

    @abc.abstractmethod
    def _count_raw(self, physical: str) -> int:
        """A backend primitive."""

    @abc.abstractmethod
    def _scroll_raw(
        self, physical: str, offset: str | None
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        """A backend primitive."""

    @abc.abstractmethod
    def _flush_raw(self) -> None:
        """A backend primitive."""

    @abc.abstractmethod
    def _close_raw(self) -> None:
        """A backend primitive."""

    def _release_unbound(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Free what only collections other than the bound ones hold (Edge: open shards)."""

    # public --------------------------------------------------------------------------
    def ensure_collections(
        self, model: str, version: str, dims: int, *, activate: bool = True
    ) -> dict[str, CollectionContract]:
        with self._mutex:
            self._check_open()
            bound: dict[str, CollectionContract] = {
                t: CollectionContract(f"mem_{t}", model, version, dims) for t in INDEXED_TIERS
            }
            for contract in bound.values():
                self._open_or_create(contract)
            self._bound = bound
            self._release_unbound()
            if activate:
                self.cutover()
            return dict(bound)

    def cutover(self) -> None:
        with self._mutex:
            bound = self._bindings()
            if not bound:
                raise NotBound("no contract bound: call ensure_collections() first")
            current = self._alias_map()
            targets = {
                c.name: c.physical_name
                for c in bound.values()
                if current.get(c.name) != c.physical_name
            }
            if targets:
                self._set_aliases(targets)

    def contracts(self) -> dict[str, CollectionContract]:
        with self._mutex:
            return dict(self._bindings())

    def aliases(self) -> dict[str, str]:
        with self._mutex:
            self._check_open()
            return self._alias_map()

    def collections(self) -> dict[str, CollectionContract]:
        with self._mutex:
            self._check_open()
            out: dict[str, CollectionContract] = {}
            for name in sorted(self._physical_names()):
                contract = self._contract_of(name)
                if contract is not None:
                    out[name] = contract
            return out

    def upsert(self, tier: str, points: Sequence[VectorPoint]) -> None:
        contract = self._contract(tier)
        rows: list[tuple[str, list[float], dict[str, Any]]] = []
        for point in points:
            p = point.payload
            if p.tier != tier:
                raise ValueError(f"point {p.memory_id} is a {p.tier} record, not {tier}")
            if p.consolidation_state == "tombstoned":
                raise ValueError(f"point {p.memory_id} is tombstoned: delete it, never upsert it")
            rows.append((p.memory_id, _as_vector(point.vector, contract.dims), p.to_payload()))
        for start in range(0, len(rows), _BATCH):
            self._upsert_raw(contract.physical_name, rows[start : start + _BATCH])

    def delete(self, tier: str, ids: Sequence[str]) -> None:
        contract = self._contract(tier)
        norm = [_norm_id(i) for i in ids]
        for start in range(0, len(norm), _BATCH):
            self._delete_raw(contract.physical_name, norm[start : start + _BATCH])

    def set_payload(self, tier: str, ids: Sequence[str], payload: Mapping[str, Any]) -> None:
        contract = self._contract(tier)
        norm = [_norm_id(i) for i in ids]
        change = _partial_payload(payload)
        if not change:
            return
        for start in range(0, len(norm), _BATCH):
            self._set_payload_raw(contract.physical_name, norm[start : start + _BATCH], change)

    def search(
        self,
        tiers: Sequence[str],
        vector: VectorLike,
        rfilter: RecallFilter,
        limit: int,
        exact: bool = False,
    ) -> list[tuple[str, float]]:
        if not isinstance(rfilter, RecallFilter):
            raise TypeError("search needs a RecallFilter: tenant and scope are always pushed down")
        if isinstance(tiers, str):
            raise TypeError("tiers is a sequence of tier names")
        if limit < 1:
            return []
        contracts = [self._contract(t) for t in dict.fromkeys(tiers)]
        if not contracts:
            return []
        dims = {c.dims for c in contracts}
        if len(dims) != 1:
            raise ContractMismatch(f"tiers {list(tiers)} are bound to different dimensions {dims}")
        query = _as_vector(vector, dims.pop())
        spec = rfilter.spec()
        hits: list[tuple[str, float]] = []
        for contract in contracts:
            hits.extend(self._top(contract.physical_name, query, spec, limit, exact))
        hits.sort(key=lambda h: (-h[1], h[0]))
        out: list[tuple[str, float]] = []
        seen: set[str] = set()
        for memory_id, score in hits:  # a record mid-promotion may sit in two tiers
            if memory_id not in seen:
                seen.add(memory_id)
                out.append((memory_id, score))
        return out[:limit]

    def _top(
        self, physical: str, query: list[float], spec: FilterSpec, k: int, exact: bool
    ) -> list[tuple[str, float]]:
        """Top k by (score desc, memory_id asc). The engine orders equal scores its own way,
        so fetch past the k-th score until the tie group at the boundary is complete."""
        n = k + 1
        while True:
            raw = self._query_raw(physical, query, spec, n, exact)
            hits = sorted(((i, _f32(s)) for i, s in raw), key=lambda h: (-h[1], h[0]))
            if len(hits) < n or hits[-1][1] < hits[k - 1][1] or n >= _TIE_FETCH_CAP:
                return hits[:k]
            n = min(n * 2, _TIE_FETCH_CAP)

    def count(self, tier: str) -> int:
        return self._count_raw(self._contract(tier).physical_name)

    def scroll(self, tier: str) -> Iterator[tuple[str, dict[str, Any]]]:
        physical = self._contract(tier).physical_name
        offset: str | None = None
        while True:
            page, offset = self._scroll_raw(physical, offset)
            yield from page
            if offset is None:
                return

    def flush(self) -> None:
        with self._mutex:
            self._check_open()
            self._flush_raw()

    def wipe(self) -> None:
        with self._mutex:
            bound = self._bindings()
            if not bound:
                raise NotBound("no contract bound: call ensure_collections() first")
            aliases = self._alias_map()
            for contract in bound.values():
                self._drop(contract.physical_name)
                self._open_or_create(contract)
            restore = {
                logical: physical
                for logical, physical in aliases.items()
                if physical in {c.physical_name for c in bound.values()}
            }
            if restore:
                self._set_aliases(restore)

    def close(self) -> None:
        with self._mutex:
            if not self._closed:
                self._closed = True
                self._close_raw()

    def __enter__(self) -> _StoreBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # helpers -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise VectorStoreError("the vector store is closed")

    def _bindings(self) -> dict[str, CollectionContract]:
        """The bound contracts; on first use, those the logical aliases point at."""
        self._check_open()
        if self._bound is None:
            bound: dict[str, CollectionContract] = {}
            for logical, physical in self._alias_map().items():
                contract = self._contract_of(physical)
                if contract is not None and contract.name == logical:
                    self._open_or_create(contract)
                    bound[contract.tier] = contract
            self._bound = bound
        return self._bound

    def _contract(self, tier: str) -> CollectionContract:
        _check_tier(tier)
        with self._mutex:
            contract = self._bindings().get(tier)
        if contract is None:
            raise NotBound(f"no collection contract for tier {tier!r}: call ensure_collections()")
        return contract


# --------------------------------------------------------------------------------------
# Qdrant Edge


class EdgeVectorStore(_StoreBase):
    """Qdrant Edge in process: `<path>/shards/<physical>/` per collection, `<path>/manifest.json`
    for aliases and contracts, `<path>/.lock` held (flock, exclusive) while open.

    One process per data directory: Qdrant allows a single open EdgeShard per directory,
    so the embedded deployment has one owner process (`memfabric serve`) and everything
    else talks to it. A second opener gets `VectorStoreLocked` at once.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _take_lock(self.root / ".lock")
        try:
            self._manifest = self._read_manifest()
        except BaseException:
            _release_lock(self._lock_fd)
            raise
        self._shards: dict[str, qdrant_edge.EdgeShard] = {}

    # manifest --------------------------------------------------------------------------
    @property
    def _manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def _read_manifest(self) -> dict[str, Any]:
        if not self._manifest_path.exists():
            return {"format": _MANIFEST_FORMAT, "collections": {}, "aliases": {}}
        data: dict[str, Any] = json.loads(self._manifest_path.read_text())
        if data.get("format") != _MANIFEST_FORMAT:
            raise VectorStoreError(f"{self._manifest_path}: unknown format {data.get('format')!r}")
        return data

    def _write_manifest(self) -> None:
        tmp = self._manifest_path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(self._manifest, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._manifest_path)
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _shard_dir(self, physical: str) -> Path:
        return self.root / "shards" / physical

    # primitives --------------------------------------------------------------------------
    def _open_or_create(self, contract: CollectionContract) -> None:
        import qdrant_edge as qe

        physical = contract.physical_name
        known = self._manifest["collections"].get(physical)
        if known is not None and CollectionContract.from_dict(known["contract"]) != contract:
            raise ContractMismatch(f"{physical} is recorded with another contract: {known}")
        if physical not in self._shards:
            config = qe.EdgeConfig(
                vectors=qe.EdgeVectorParams(size=contract.dims, distance=qe.Distance.Cosine)
            )
            directory = self._shard_dir(physical)
            try:
                if (directory / "edge_config.json").exists():
                    # config given: the engine checks the shard is compatible with it
                    shard = qe.EdgeShard.load(str(directory), config)
                else:
                    directory.mkdir(parents=True, exist_ok=True)
                    shard = qe.EdgeShard.create(str(directory), config)
            except Exception as exc:  # the engine raises a bare Exception
                raise VectorStoreError(f"cannot open {directory} as {contract}: {exc}") from exc
            self._shards[physical] = shard
        shard = self._shards[physical]
        present = set(shard.info().payload_schema)
        for name, kind in PAYLOAD_INDEXES:
            if name not in present:
                shard.update(qe.UpdateOperation.create_field_index(name, _edge_index(kind)))
        shard.flush()
        if known is None:
            self._manifest["collections"][physical] = {
                "contract": contract.to_dict(),
                "dir": f"shards/{physical}",
            }
            self._write_manifest()

    def _drop(self, physical: str) -> None:
        shard = self._shards.pop(physical, None)
        if shard is not None:
            shard.close()
        # the manifest keeps the entry: wipe() recreates the shard under the same contract
        shutil.rmtree(self._shard_dir(physical), ignore_errors=True)

    def _alias_map(self) -> dict[str, str]:
        return dict(self._manifest["aliases"])

    def _set_aliases(self, targets: Mapping[str, str]) -> None:
        for physical in targets.values():
            if physical not in self._manifest["collections"]:
                raise VectorStoreError(f"alias target {physical} does not exist")
        self._manifest["aliases"].update(targets)
        self._write_manifest()  # one atomic rename moves every alias together

    def _contract_of(self, physical: str) -> CollectionContract | None:
        known = self._manifest["collections"].get(physical)
        return None if known is None else CollectionContract.from_dict(known["contract"])

    def _physical_names(self) -> list[str]:
        return list(self._manifest["collections"])

    def _shard(self, physical: str) -> qdrant_edge.EdgeShard:
        self._check_open()
        shard = self._shards.get(physical)
        if shard is None:
            raise NotBound(f"{physical} is not open")
        return shard

    def _upsert_raw(
        self, physical: str, rows: list[tuple[str, list[float], dict[str, Any]]]
    ) -> None:
        import qdrant_edge as qe

        points = [qe.Point(pid, vec, payload) for pid, vec, payload in rows]
        self._shard(physical).update(qe.UpdateOperation.upsert_points(points))

    def _delete_raw(self, physical: str, ids: list[str]) -> None:
        import qdrant_edge as qe

        point_ids: list[qe.PointId] = list(ids)
        self._shard(physical).update(qe.UpdateOperation.delete_points(point_ids))

    def _set_payload_raw(self, physical: str, ids: list[str], payload: dict[str, Any]) -> None:
        import qdrant_edge as qe

        # by filter: set_payload by id list fails on an id the shard does not hold
        has_id = qe.HasIdCondition(set(ids))
        self._shard(physical).update(
            qe.UpdateOperation.set_payload_by_filter(qe.Filter(must=[has_id]), payload)
        )

    def _query_raw(
        self, physical: str, vector: list[float], spec: FilterSpec, n: int, exact: bool
    ) -> list[tuple[str, float]]:
        import qdrant_edge as qe

        request = qe.QueryRequest(
            limit=n,
            query=qe.Query.Nearest(vector),
            filter=_edge_filter(spec),
            with_payload=False,
            with_vector=False,
            params=qe.SearchParams(exact=exact),
        )
        return [(str(p.id), float(p.score)) for p in self._shard(physical).query(request)]

    def _count_raw(self, physical: str) -> int:
        import qdrant_edge as qe

        return self._shard(physical).count(qe.CountRequest(exact=True))

    def _scroll_raw(
        self, physical: str, offset: str | None
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        import qdrant_edge as qe

        records, nxt = self._shard(physical).scroll(
            qe.ScrollRequest(
                offset=offset, limit=_SCROLL_PAGE, with_payload=True, with_vector=False
            )
        )
        page = [(str(r.id), dict(r.payload or {})) for r in records]
        return page, None if nxt is None else str(nxt)

    def _flush_raw(self) -> None:
        for shard in self._shards.values():
            shard.flush()

    def _release_unbound(self) -> None:
        bound = {c.physical_name for c in (self._bound or {}).values()}
        for physical in [p for p in self._shards if p not in bound]:
            shard = self._shards.pop(physical)
            shard.flush()
            shard.close()

    def _close_raw(self) -> None:
        try:
            for shard in self._shards.values():
                with contextlib.suppress(Exception):
                    shard.flush()
                shard.close()
            self._shards.clear()
        finally:
            _release_lock(self._lock_fd)


def _edge_index(kind: str) -> Any:
    import qdrant_edge as qe

    if kind == "tenant":
        return qe.KeywordIndexParams(is_tenant=True)
    if kind == "keyword":
        return qe.PayloadSchemaType.Keyword
    if kind == "float":
        return qe.PayloadSchemaType.Float
    if kind == "int_range":
        return qe.IntegerIndexParams(lookup=False, range=True)
    if kind == "datetime":
        return qe.PayloadSchemaType.Datetime
    raise ValueError(kind)


def _take_lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, 64, 0).decode().strip()
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise VectorStoreLocked(
                f"{path.parent} is open in another process{f' (pid {holder})' if holder else ''}: "
                "a Qdrant Edge data directory has one owner process; query it through "
                "`memfabric serve` or stop that process first"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _release_lock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


# --------------------------------------------------------------------------------------
# Qdrant server (qdrant-client)


_CONTRACT_KEY = "memfabric_contract"


class QdrantServerStore(_StoreBase):
    """The same over `qdrant-client`: a server by `url`, or the client's local mode by
    `location=":memory:"` / `path=` (brute force, payload indexes ignored: tests only).

    The contract is kept in the collection's metadata; aliases are Qdrant aliases, moved
    together in one atomic alias update.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        location: str | None = None,
        path: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        timeout: int | None = None,
        client: QdrantClient | None = None,
    ) -> None:
        super().__init__()
        given = [x is not None for x in (url, location, path, client)]
        if sum(given) != 1:
            raise ValueError("give exactly one of url, location, path or client")
        self._local = location is not None or path is not None
        if client is None:
            from qdrant_client import QdrantClient

            client = QdrantClient(
                url=url,
                location=location,
                path=None if path is None else str(path),
                api_key=api_key,
                timeout=timeout,
            )
        self.client = client

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """Local mode warns that it ignores payload indexes and search params: known."""
        if not self._local:
            yield
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(Payload indexes|Local mode).*")
            yield

    def _open_or_create(self, contract: CollectionContract) -> None:
        from qdrant_client.http import models as m

        physical = contract.physical_name
        if self.client.collection_exists(physical):
            info = self.client.get_collection(physical)
            meta = (info.config.metadata or {}).get(_CONTRACT_KEY)
            params = info.config.params.vectors
            ok = (
                isinstance(params, m.VectorParams)
                and params.size == contract.dims
                and params.distance == m.Distance.COSINE
                and (meta is None or CollectionContract.from_dict(meta) == contract)
            )
            if not ok:
                raise ContractMismatch(
                    f"{physical} exists with another contract ({meta}, {params})"
                )
            present = set(info.payload_schema or {})
        else:
            self.client.create_collection(
                physical,
                vectors_config=m.VectorParams(size=contract.dims, distance=m.Distance.COSINE),
                metadata={_CONTRACT_KEY: contract.to_dict()},
            )
            present = set()
        with self._quiet():
            for name, kind in PAYLOAD_INDEXES:
                if name not in present:
                    self.client.create_payload_index(
                        physical, name, field_schema=_client_index(kind), wait=True
                    )

    def _drop(self, physical: str) -> None:
        self.client.delete_collection(physical)

    def _alias_map(self) -> dict[str, str]:
        logical = {f"mem_{t}" for t in INDEXED_TIERS}
        return {
            a.alias_name: a.collection_name
            for a in self.client.get_aliases().aliases
            if a.alias_name in logical
        }

    def _set_aliases(self, targets: Mapping[str, str]) -> None:
        from qdrant_client.http import models as m

        current = self._alias_map()
        ops: list[m.CreateAliasOperation | m.DeleteAliasOperation] = []
        for alias, physical in targets.items():
            if alias in current:
                ops.append(m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=alias)))
            ops.append(
                m.CreateAliasOperation(
                    create_alias=m.CreateAlias(collection_name=physical, alias_name=alias)
                )
            )
        self.client.update_collection_aliases(ops)

    def _contract_of(self, physical: str) -> CollectionContract | None:
        if not self.client.collection_exists(physical):
            return None
        meta = (self.client.get_collection(physical).config.metadata or {}).get(_CONTRACT_KEY)
        return None if meta is None else CollectionContract.from_dict(meta)

    def _physical_names(self) -> list[str]:
        return [
            c.name
            for c in self.client.get_collections().collections
            if c.name.startswith("mem_") and "__" in c.name
        ]

    def _upsert_raw(
        self, physical: str, rows: list[tuple[str, list[float], dict[str, Any]]]
    ) -> None:
        from qdrant_client.http import models as m

        points = [m.PointStruct(id=pid, vector=vec, payload=payload) for pid, vec, payload in rows]
        self.client.upsert(physical, points=points, wait=True)

    def _delete_raw(self, physical: str, ids: list[str]) -> None:
        from qdrant_client.http import models as m

        point_ids: list[m.ExtendedPointId] = list(ids)
        self.client.delete(physical, points_selector=m.PointIdsList(points=point_ids), wait=True)

    def _set_payload_raw(self, physical: str, ids: list[str], payload: dict[str, Any]) -> None:
        from qdrant_client.http import models as m

        # by filter: set_payload by id list fails on an id the collection does not hold
        point_ids: list[m.ExtendedPointId] = list(ids)
        selector = m.Filter(must=[m.HasIdCondition(has_id=point_ids)])
        self.client.set_payload(physical, payload=payload, points=selector, wait=True)

    def _query_raw(
        self, physical: str, vector: list[float], spec: FilterSpec, n: int, exact: bool
    ) -> list[tuple[str, float]]:
        from qdrant_client.http import models as m

        with self._quiet():
            response = self.client.query_points(
                physical,
                query=vector,
                query_filter=_client_filter(spec),
                search_params=m.SearchParams(exact=exact),
                limit=n,
                with_payload=False,
                with_vectors=False,
            )
        return [(_norm_id(p.id), float(p.score)) for p in response.points]

    def _count_raw(self, physical: str) -> int:
        return self.client.count(physical, exact=True).count

    def _scroll_raw(
        self, physical: str, offset: str | None
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        records, nxt = self.client.scroll(
            physical, limit=_SCROLL_PAGE, offset=offset, with_payload=True, with_vectors=False
        )
        page = [(_norm_id(r.id), dict(r.payload or {})) for r in records]
        return page, None if nxt is None else _norm_id(nxt)

    def _flush_raw(self) -> None:
        """Writes use wait=True: acknowledged writes are already in the server's WAL."""

    def _close_raw(self) -> None:
        self.client.close()


def _client_index(kind: str) -> Any:
    from qdrant_client.http import models as m

    if kind == "tenant":
        return m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, is_tenant=True)
    if kind == "keyword":
        return m.PayloadSchemaType.KEYWORD
    if kind == "float":
        return m.PayloadSchemaType.FLOAT
    if kind == "int_range":
        return m.IntegerIndexParams(type=m.IntegerIndexType.INTEGER, lookup=False, range=True)
    if kind == "datetime":
        return m.PayloadSchemaType.DATETIME
    raise ValueError(kind)


def store_from_env(data_dir: str | os.PathLike[str]) -> VectorStore:
    """QDRANT_URL (and QDRANT_API_KEY) set: a Qdrant server; otherwise Edge in `data_dir`."""
    from memfabric.settings import Settings

    settings = Settings.from_env()
    if settings.qdrant_url:
        return QdrantServerStore(settings.qdrant_url, api_key=settings.qdrant_api_key)
    return EdgeVectorStore(data_dir)
