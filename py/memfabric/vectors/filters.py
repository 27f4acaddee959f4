"""Recall filters: one backend-neutral conjunction (`FilterSpec`), translated for
qdrant-client (`_client_filter`) and for Qdrant Edge (`_edge_filter`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import qdrant_edge
    from qdrant_client.http import models as qm

from memfabric.constants import LIVE_STATES, confidence_in_range
from memfabric.vectors.model import _check_aware, epoch_us


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
