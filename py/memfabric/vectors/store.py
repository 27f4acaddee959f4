"""The vector store (`VectorStore`): its interface and the logic both backends share
(validation, contract binding, tie-stable merging), one abstract base class; a backend
supplies the primitives."""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from memfabric.constants import INDEXED_TIERS
from memfabric.vectors.filters import FilterSpec, RecallFilter
from memfabric.vectors.model import (
    CollectionContract,
    ContractMismatch,
    NotBound,
    VectorLike,
    VectorPoint,
    VectorStoreError,
    _as_vector,
    _check_tier,
    _f32,
    _norm_id,
    _partial_payload,
)

_BATCH = 1024  # points per backend write
_TIE_FETCH_CAP = 65536  # the most hits fetched to settle ties at the cut

# --------------------------------------------------------------------------------------
# Shared logic


class VectorStore(abc.ABC):
    """The vector projection: one collection per indexed tier, bound to one contract each.

    The shared logic lives here (validation, contract binding, tie-stable merging); a
    backend (Qdrant Edge, a Qdrant server) supplies the primitives."""

    def __init__(self) -> None:
        self._mutex = threading.RLock()
        self._bound: dict[str, CollectionContract] | None = None
        self._closed = False

    # primitives --------------------------------------------------------------------
    def _open_all(self, contracts: Sequence[CollectionContract]) -> None:  # noqa: B027
        """A backend may open the collections of `contracts` at once before
        `_open_or_create` is called for each (nothing by default)."""

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

    def _forget(self, physical: str) -> None:
        """Drop a collection and every record of it (a backend whose `_drop` keeps the
        collection's record, to recreate it, removes that too)."""
        self._drop(physical)

    def _aliased(self) -> set[str]:
        """The physical collections an alias points at (a backend may count aliases other
        than the fabric's logical names)."""
        return set(self._alias_map().values())

    def _release_unbound(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Free what only collections other than the bound ones hold (Edge: open shards)."""

    # public --------------------------------------------------------------------------
    def ensure_collections(
        self, model: str, version: str, dims: int, *, activate: bool = True
    ) -> dict[str, CollectionContract]:
        """Create (or open) the physical collections of this contract with their payload
        indexes and bind this store to them. `activate` moves the logical aliases to them
        (the cutover); without it only this store uses them, e.g. to build a new version
        while recall still reads the old one, then `cutover()`."""
        with self._mutex:
            self._check_open()
            bound: dict[str, CollectionContract] = {
                t: CollectionContract(f"mem_{t}", model, version, dims) for t in INDEXED_TIERS
            }
            self._open_all(list(bound.values()))
            for contract in bound.values():
                self._open_or_create(contract)
            self._bound = bound
            self._release_unbound()
            if activate:
                self.cutover()
            return dict(bound)

    def cutover(self) -> None:
        """Point every logical name at the collection this store is bound to."""
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
        """tier -> the contract this store reads and writes."""
        with self._mutex:
            return dict(self._bindings())

    def aliases(self) -> dict[str, str]:
        """logical name -> physical collection, as the backend has them now."""
        with self._mutex:
            self._check_open()
            return self._alias_map()

    def collections(self) -> dict[str, CollectionContract]:
        """Every physical fabric collection present, old versions included."""
        with self._mutex:
            self._check_open()
            out: dict[str, CollectionContract] = {}
            for name in sorted(self._physical_names()):
                contract = self._contract_of(name)
                if contract is not None:
                    out[name] = contract
            return out

    def superseded(self) -> dict[str, CollectionContract]:
        """The physical fabric collections that no alias points at and this store is not
        bound to: contracts an alias cutover left behind (a new embedder, a new payload
        version), never read again, still holding what was projected into them."""
        with self._mutex:
            self._check_open()
            keep = self._aliased() | {c.physical_name for c in (self._bound or {}).values()}
            return {n: c for n, c in self.collections().items() if n not in keep}

    def drop_superseded(self) -> dict[str, CollectionContract]:
        """Drop every `superseded()` collection with its data, at once and for good (a
        projection is rebuilt from PostgreSQL, never restored from one); what was dropped.
        A collection built beside the live one by another store (`activate=False`) is not
        aliased yet: cut it over before dropping from elsewhere."""
        with self._mutex:
            gone = self.superseded()
            for physical in gone:
                self._forget(physical)
            return gone

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
        self.delete_many({tier: ids})

    def delete_many(self, drops: Mapping[str, Sequence[str]]) -> None:
        """`delete` of each tier's ids (tier -> ids); a backend may ask its collections at
        once (the projector deletes each record from every tier but its own)."""
        asks: list[tuple[str, list[str]]] = []
        for tier, ids in drops.items():
            physical = self._contract(tier).physical_name
            norm = [_norm_id(i) for i in ids]
            asks += [(physical, norm[i : i + _BATCH]) for i in range(0, len(norm), _BATCH)]
        if asks:
            self._delete_many_raw(asks)

    def _delete_many_raw(self, asks: Sequence[tuple[str, list[str]]]) -> None:
        """`_delete_raw` of each (physical, ids); a backend may ask them all at once."""
        for physical, ids in asks:
            self._delete_raw(physical, ids)

    def set_payload(self, tier: str, ids: Sequence[str], payload: Mapping[str, Any]) -> None:
        """Change lifecycle fields (MUTABLE_FIELDS) of existing points; unknown ids are
        skipped."""
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
        """Top `limit` (memory_id, score) over the tiers' collections, by score descending
        then memory_id ascending."""
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
        physicals = [c.physical_name for c in contracts]
        firsts = self._query_many_raw([(p, limit + 1) for p in physicals], query, spec, exact)
        for physical, first in zip(physicals, firsts, strict=True):
            hits.extend(self._top(physical, query, spec, limit, exact, first))
        hits.sort(key=lambda h: (-h[1], h[0]))
        out: list[tuple[str, float]] = []
        seen: set[str] = set()
        for memory_id, score in hits:  # a record mid-promotion may sit in two tiers
            if memory_id not in seen:
                seen.add(memory_id)
                out.append((memory_id, score))
        return out[:limit]

    def _query_many_raw(
        self, asks: Sequence[tuple[str, int]], vector: list[float], spec: FilterSpec, exact: bool
    ) -> list[list[tuple[str, float]]]:
        """`_query_raw` of each (physical, n); a backend may ask them all at once."""
        return [self._query_raw(physical, vector, spec, n, exact) for physical, n in asks]

    def _top(
        self,
        physical: str,
        query: list[float],
        spec: FilterSpec,
        k: int,
        exact: bool,
        first: list[tuple[str, float]] | None = None,
    ) -> list[tuple[str, float]]:
        """Top k by (score desc, memory_id asc). The engine orders equal scores its own way,
        so fetch past the k-th score until the tie group at the boundary is complete.
        `first`: the answer to the first fetch (k + 1), already asked."""
        n = k + 1
        while True:
            raw = first if first is not None else self._query_raw(physical, query, spec, n, exact)
            first = None
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
        """Make every write so far durable (call before advancing a projection cursor).
        Raises `WritesLost` (after flushing) when a shard's child process died holding
        writes since the last flush: those may be gone, so nothing before this flush may be
        counted durable; re-apply from the last successful one."""
        with self._mutex:
            self._check_open()
            self._flush_raw()

    def wipe(self) -> None:
        """Drop and recreate (empty) the collections this store is bound to."""
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

    def __enter__(self) -> VectorStore:
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
