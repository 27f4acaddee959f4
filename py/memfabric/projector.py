"""The projector: committed state from the outbox into Qdrant and the graph.

One cursor per projection (`qdrant`, `graph`), so an outage of one never stalls the other.
Events are read after the cursor and below the snapshot's xmin (the database does that),
records are hydrated from Postgres as rows (`projection_events_v2`, `projection_records_v2`,
`projection_snapshot_v2`; embeddings arrive as binary `ext.vector` through pgvector's
adapter), embeddings are computed outside any transaction and stored a batch at a time
through `fabric_api.store_embeddings` (which refuses erased records), then the
projection is written idempotently (point id = memory_id, Cypher MERGE) and flushed before
the cursor moves: at-least-once, never skipping. NOTIFY only wakes the loop.

With `flush_seconds` > 0 the serial projector flushes the vector store at most that often
instead of after every batch: a batch's points are searchable once upserted, the cursor
moves only right after a flush (to the last event applied before it), and events applied
but not yet flushed are read past with the read-ahead feed. A crash in between loses at most
the unflushed points, which the next life re-applies from the cursor (docs/projections.md).
A shard process that died and was restarted (`WritesLost` from the flush) is the same
crash for the vector projection: the cursor stays, and the projector drains again from it.
"""

from __future__ import annotations

import contextlib
import queue
import random
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from pgvector import Vector

from memfabric.call import Cast, fabric_call, fabric_rows, register_vector, relay_events
from memfabric.constants import INDEXED_TIERS
from memfabric.embedding import Embedder, EmbeddingError, text_of
from memfabric.errors import FabricError, OperationalFailure, connection_lost
from memfabric.graph import OPTIONAL_ROW_KEYS, ROW_KEYS, GraphStore
from memfabric.vectors import MemoryPayload, ShardFailure, VectorPoint, VectorStore, WritesLost

Json = dict[str, Any]
Progress = Callable[[str], None]
PROJECTIONS = ("qdrant", "graph")
# the event of a reasoning step (no memory_id: the graph reads the step by its event)
STEP_EVENT = "memory.reasoning_step.recorded"
# the events of an applied same-as merge (the graph reads the merge by its events)
MERGE_EVENT = "memory.entity.merged"
# after a NOTIFY whose events are still above the horizon: the first look again (seconds)
HELD_RETRY_SECONDS = 0.05


@dataclass
class _Batch:
    """Events read ahead of the cursor, their records, and (vectors) their new embeddings."""

    events: list[Json]
    records: list[Json]
    embedded: list[list[float]] | None = None


def _ts(value: str | datetime | None) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def vector_payload(record: Json) -> MemoryPayload:
    """A projection record (a row of projection_records_v2, or a record of the deprecated
    jsonb feeds, whose instants are ISO strings) as the vector payload."""
    instants = {"valid_from": _ts(record["valid_from"]), "valid_until": _ts(record["valid_until"])}
    return MemoryPayload.from_row(record | instants)


def projection_record(row: Json) -> Json:
    """A row of projection_records_v2 / projection_snapshot_v2 with its ids as strings (the
    stores' point and node keys); instants stay datetimes, the embedding a pgvector.Vector."""
    return row | {
        "memory_id": str(row["memory_id"]),
        "supersedes": None if row["supersedes"] is None else str(row["supersedes"]),
        "derived_from": [str(d) for d in row["derived_from"] or ()],
    }


def graph_row(record: Json) -> Json:
    """A projection record as a row for GraphStore.upsert_memories (its ROW_KEYS, and the
    record's correlation id)."""
    return {k: record[k] for k in ROW_KEYS} | {k: record.get(k) for k in OPTIONAL_ROW_KEYS}


# OSErrors that no retry mends: a missing or mistyped path, a permission (a vector directory
# or socket path the service cannot use). Other OSErrors (a refused or reset connection, a
# timeout, a broken pipe, a full disk being cleared) are worth backing off for.
_NOT_TRANSIENT_OS_ERRORS = (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


def recoverable(exc: BaseException) -> bool:
    """Does the projector outlive `exc` (back off, drain again from the cursor)? Yes for a
    lost or refused connection to PostgreSQL, the vector store, the graph or the embedding
    endpoint; no for anything else, which is a bug and must surface."""
    from neo4j import exceptions as graph_errors
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    if isinstance(exc, FabricError | psycopg.Error):
        return connection_lost(exc)  # retrying from the cursor is safe
    if isinstance(exc, UnexpectedResponse):
        return (exc.status_code or 0) >= 500
    if isinstance(exc, _NOT_TRANSIENT_OS_ERRORS):
        return False  # a path or a permission that is wrong stays wrong: the operator's to fix
    return isinstance(
        exc,
        OperationalFailure
        | EmbeddingError
        | OSError
        | ShardFailure
        | ResponseHandlingException
        | graph_errors.ServiceUnavailable
        | graph_errors.SessionExpired
        | graph_errors.TransientError,
    )


def projectable(record: Json) -> bool:
    """A point exists only for records with content in an indexed tier; erased,
    window-closed and relational records have none (superseded ones stay, filtered out).
    Nor has a record whose subject has no key (the feed gives no pseudonym, so no scope
    key): it is never projected under its id in clear."""
    return (
        record["content"] is not None
        and record["tier"] in INDEXED_TIERS
        and record["scope_key"] is not None
    )


@dataclass
class Projector:
    """Applies outbox events to the vector store and/or the graph."""

    conninfo: str  # a login that is a member of fabric_projector
    embedder: Embedder
    store: VectorStore | None = None
    graph: GraphStore | None = None
    batch: int = 500
    progress: Progress = lambda _: None
    guard: threading.Lock | None = field(default=None, repr=False)  # shared with a broker
    # what binding the embedder moved (runtime.contract_change), when opening it did: the
    # vector collections searched are new and hold only what is projected from then on
    contract_change: str | None = field(default=None, repr=False)
    # the vector projection in `run`/`drain`: flush (then move the cursor) at most every
    # this many seconds, not after every batch; 0: after every batch
    flush_seconds: float = 0.0
    # per projection: the last event applied but not yet flushed, and when the first
    # such batch was applied (time.monotonic); empty when flush_seconds is 0
    _unflushed: dict[str, tuple[Json, float]] = field(default_factory=dict, repr=False)

    def _guarded(self) -> contextlib.AbstractContextManager[object]:
        return self.guard if self.guard is not None else contextlib.nullcontext()

    def _call(self, conn: psycopg.Connection[Any], name: str, *args: Any) -> Any:
        return fabric_call(conn, name, *args)

    # -- applying records ----------------------------------------------------------------------

    def embed_missing(self, records: Sequence[Json]) -> list[list[float]]:
        """Embeddings of the projectable records that have none stored, in their order
        (no database work: the pipelined projector runs this on its own thread)."""
        missing = [r for r in records if projectable(r) and r.get("embedding") is None]
        return self.embedder.embed([text_of(r["content"]) for r in missing]) if missing else []

    def vectors_for(
        self,
        conn: psycopg.Connection[Any],
        records: Sequence[Json],
        embedded: Sequence[list[float]] | None = None,
    ) -> dict[str, list[float]]:
        """Stored embeddings where they exist; the rest embedded now (or taken from
        `embedded`, computed by `embed_missing` for these records) and stored (refused, and
        skipped, if the record was erased meanwhile)."""
        out: dict[str, list[float]] = {}
        missing = []
        for r in records:
            if r.get("embedding") is not None:
                out[r["memory_id"]] = r["embedding"].to_list()
            else:
                missing.append(r)
        if missing:
            if embedded is None:
                embedded = self.embedder.embed([text_of(r["content"]) for r in missing])
            out |= self.store_embeddings(conn, missing, embedded)
        return out

    def store_embeddings(
        self,
        conn: psycopg.Connection[Any],
        records: Sequence[Json],
        vectors: Sequence[list[float]],
    ) -> dict[str, list[float]]:
        """Store the embeddings of `records` in one call; returns those stored (a record
        erased or changed meanwhile stores nothing and is skipped)."""
        register_vector(conn)
        rows = fabric_rows(
            conn,
            "fabric_api.store_embeddings",
            Cast([r["memory_id"] for r in records], "uuid[]"),
            self.embedder.model,
            self.embedder.version,
            [Vector(v) for v in vectors],
            [r["content_hash"] for r in records],
            binary=True,
        )
        stored = {str(row["memory_id"]) for row in rows if row["stored"]}
        return {
            r["memory_id"]: list(v)
            for r, v in zip(records, vectors, strict=True)
            if r["memory_id"] in stored
        }

    def apply_vectors(
        self,
        conn: psycopg.Connection[Any],
        records: Sequence[Json],
        embedded: Sequence[list[float]] | None = None,
        *,
        flush: bool = True,
    ) -> None:
        assert self.store is not None
        live = [r for r in records if projectable(r)]
        vectors = self.vectors_for(conn, live, embedded)
        by_tier: dict[str, list[VectorPoint]] = {t: [] for t in INDEXED_TIERS}
        for r in live:
            if r["memory_id"] in vectors:
                by_tier[r["tier"]].append(VectorPoint(vector_payload(r), vectors[r["memory_id"]]))
        drops: dict[str, list[str]] = {}
        for tier in INDEXED_TIERS:
            keep = {p.memory_id for p in by_tier[tier]}
            drop = [r["memory_id"] for r in records if r["memory_id"] not in keep]
            if drop:
                drops[tier] = drop  # erased, or moved to another tier
        # one request to every tier at once (a point upserted into a tier is never dropped
        # from it, so the deletes may all go first)
        self.store.delete_many(drops)
        for tier in INDEXED_TIERS:
            if by_tier[tier]:
                self.store.upsert(tier, by_tier[tier])
        if flush:
            self.store.flush()

    def apply_graph(self, conn: psycopg.Connection[Any], records: Sequence[Json]) -> None:
        """The records' nodes and lineage, the agent lineage links whose outcome they are,
        and the entities they mention (read from PostgreSQL now: current state, so a replay
        writes the same); a record whose content is gone drops its mentions."""
        assert self.graph is not None
        self.graph.upsert_memories([graph_row(r) for r in records])
        ids = Cast([r["memory_id"] for r in records], "uuid[]")
        emptied: dict[str, list[str]] = {}
        erased: dict[str, list[str]] = {}
        for r in records:
            if r["content"] is None:
                emptied.setdefault(r["tenant_id"], []).append(r["memory_id"])
            if r["consolidation_state"] == "tombstoned":
                erased.setdefault(r["tenant_id"], []).append(r["memory_id"])
        for tenant, gone in emptied.items():
            self.graph.drop_mentions(tenant, gone)
        self.graph.upsert_links(fabric_rows(conn, "fabric_api.projection_agent_links", ids))
        self.graph.upsert_mentions(fabric_rows(conn, "fabric_api.projection_mentions", ids))
        for tenant, forgotten in erased.items():
            self.graph.forget(tenant, forgotten)

    def apply_steps(
        self, projection: str, conn: psycopg.Connection[Any], events: Sequence[Json]
    ) -> None:
        """The reasoning steps these events recorded and the same-as merges they applied,
        into the graph (the vector store holds neither). Merges are read as they stand now,
        after the batch's records: one an erasure undid meanwhile writes nothing."""
        if projection != "graph":
            return
        assert self.graph is not None
        steps = [e["event_id"] for e in events if e["event_type"] == STEP_EVENT]
        if steps:
            rows = fabric_rows(conn, "fabric_api.projection_steps", Cast(steps, "uuid[]"))
            self.graph.upsert_steps(rows)
        merges = [e["event_id"] for e in events if e["event_type"] == MERGE_EVENT]
        if merges:
            rows = fabric_rows(conn, "fabric_api.projection_same_as", Cast(merges, "uuid[]"))
            self.graph.upsert_same_as(rows)

    def apply(
        self,
        projection: str,
        conn: psycopg.Connection[Any],
        records: Sequence[Json],
        embedded: Sequence[list[float]] | None = None,
        *,
        flush: bool = True,
    ) -> None:
        """Write `records` to the projection; the vector store is flushed unless `flush` is
        false (the graph commits each write by itself)."""
        if projection == "qdrant":
            self.apply_vectors(conn, records, embedded, flush=flush)
        else:
            self.apply_graph(conn, records)

    def records(self, conn: psycopg.Connection[Any], ids: Sequence[str]) -> list[Json]:
        register_vector(conn)
        rows = fabric_rows(
            conn,
            "fabric_api.projection_records_v2",
            Cast([str(i) for i in ids], "uuid[]"),
            self.embedder.model,
            self.embedder.version,
            binary=True,
        )
        return [projection_record(r) for r in rows]

    def events(
        self, conn: psycopg.Connection[Any], projection: str, after: Json | None = None
    ) -> list[Json]:
        """The next batch of events after the cursor, and after the event `after` when
        reading ahead (xid as text: there is no client type for xid8). On a Citus cluster
        the delegated calls' events are relayed into the outbox first."""
        relay_events(conn)
        ahead = () if after is None else (Cast(str(after["xid"]), "xid8"), after["event_id"])
        return fabric_rows(conn, "fabric_api.projection_events_v2", projection, self.batch, *ahead)

    def move_cursor(self, conn: psycopg.Connection[Any], projection: str, last: Json) -> None:
        self._call(
            conn,
            "fabric_api.set_projection_cursor",
            projection,
            Cast(str(last["xid"]), "xid8"),
            last["event_id"],
        )

    # -- the outbox ----------------------------------------------------------------------------

    def _deferred(self, projection: str) -> bool:
        """Is this projection's flush (and so its cursor) left to the cadence?"""
        return projection == "qdrant" and self.flush_seconds > 0 and self.store is not None

    def flush_due(self, projection: str) -> float | None:
        """Seconds until the unflushed batches of `projection` are due (0: now), or None."""
        pending = self._unflushed.get(projection)
        if pending is None:
            return None
        return max(0.0, pending[1] + self.flush_seconds - time.monotonic())

    def settle(
        self, conn: psycopg.Connection[Any], projection: str, *, force: bool = False
    ) -> None:
        """Flush the vector store and move the cursor to the last event applied, if the
        unflushed batches are due (or `force`). The cursor never passes a flush."""
        due = self.flush_due(projection)
        if due is None or (due > 0 and not force):
            return
        last = self._unflushed[projection][0]
        assert self.store is not None
        try:
            with self._guarded():
                self.store.flush()
        except WritesLost:
            # a shard's child died before this flush: what was applied since the cursor
            # may be gone, so the next drain reads again from the cursor (writes are
            # idempotent), which stays where it is
            del self._unflushed[projection]
            raise
        self.move_cursor(conn, projection, last)
        del self._unflushed[projection]

    def _applied(
        self, conn: psycopg.Connection[Any], projection: str, last: Json, deferred: bool
    ) -> None:
        """A batch up to event `last` is applied: with the flush cadence (`deferred`) it is
        noted unflushed and settled if due; otherwise the cursor moves past it."""
        if deferred:
            pending = self._unflushed.get(projection)
            self._unflushed[projection] = (last, pending[1] if pending else time.monotonic())
            self.settle(conn, projection)
        else:
            self.move_cursor(conn, projection, last)

    def drain(
        self, conn: psycopg.Connection[Any], projection: str, max_batches: int | None = None
    ) -> int:
        """Apply the events the cursor has not passed (all of them, or at most
        `max_batches` batches); returns how many were applied. With `flush_seconds`, the
        vector store is flushed and the cursor moved when due, and always at the end of a
        full drain (`max_batches` None)."""
        deferred = self._deferred(projection)
        applied = batches = 0
        while max_batches is None or batches < max_batches:
            pending = self._unflushed.get(projection)
            events = self.events(conn, projection, pending[0] if pending else None)
            if not events:
                break
            ids = sorted({str(e["memory_id"]) for e in events if e["memory_id"]})
            if ids:
                records = self.records(conn, ids)
                with self._guarded():
                    self.apply(projection, conn, records, flush=not deferred)
            self.apply_steps(projection, conn, events)
            self._applied(conn, projection, events[-1], deferred)
            applied += len(events)
            batches += 1
        if deferred and max_batches is None:
            self.settle(conn, projection, force=True)
        return applied

    def run(
        self,
        projections: Sequence[str] = PROJECTIONS,
        *,
        poll_seconds: float = 1.0,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """LISTEN, drain, wait; on a lost connection or projection back end, back off
        (capped, jittered) and drain again from the cursor. Any other exception is a bug
        and ends the loop."""
        backoff = 0.5
        while not should_stop():
            # a new life starts from the cursor: what was applied but not flushed is read again
            self._unflushed.clear()
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    conn.execute("LISTEN fabric_events")
                    try:
                        # > 0: a NOTIFY found nothing readable, so an older transaction still
                        # holds the horizon (it may end without a NOTIFY): look again this
                        # soon, twice as late each time, instead of after a whole poll interval
                        held, notified = 0.0, False
                        while not should_stop():
                            # One batch per projection per turn: under steady writes neither
                            # projection waits for the other to run dry.
                            busy = False
                            for projection in projections:
                                n = self.drain(conn, projection, max_batches=1)
                                if n:
                                    busy = True
                                    self.progress(f"{projection}: applied {n} events")
                            backoff = 0.5
                            if busy:
                                held = 0.0
                                continue
                            if notified or held:
                                held = min(held * 2 if held else HELD_RETRY_SECONDS, poll_seconds)
                            # idle: wait for a NOTIFY, at most until unflushed batches are due
                            wait = min(poll_seconds, held) if held else poll_seconds
                            for projection in projections:
                                due = self.flush_due(projection)
                                if due is not None:
                                    wait = min(wait, due)
                            notified = bool(select.select([conn.fileno()], [], [], wait)[0])
                            if notified:
                                for _ in conn.notifies(timeout=0):
                                    pass
                            for projection in projections:
                                self.settle(conn, projection)
                    except KeyboardInterrupt:  # Ctrl-C (`memfabric serve` asks to stop instead)
                        for projection in projections:
                            # a shard lost writes: the cursor stays, the next start re-applies
                            with contextlib.suppress(ShardFailure):
                                self.settle(conn, projection, force=True)
                        raise
                    for projection in projections:  # asked to stop: make what was applied durable
                        self.settle(conn, projection, force=True)
            except Exception as exc:
                if not recoverable(exc):
                    raise
                if should_stop():
                    return
                delay = min(backoff, 30.0) * (0.5 + random.random())  # noqa: S311 - jitter
                self.progress(f"projection paused ({type(exc).__name__}); retrying in {delay:.1f}s")
                time.sleep(delay)
                backoff *= 2

    # -- pipelined -------------------------------------------------------------------------------

    def run_pipelined(
        self,
        projections: Sequence[str] = PROJECTIONS,
        *,
        poll_seconds: float = 1.0,
        should_stop: Callable[[], bool] = lambda: False,
        depth: int = 2,
    ) -> None:
        """`run`, with each projection on its own thread and each in three stages joined by
        queues of at most `depth` batches: a reader (events after the last batch read,
        ahead of the cursor, and their records), the embedder (CPU: what has no stored
        embedding; what was read meanwhile is embedded in one call), and a writer (stores
        the embeddings, writes the projection, flushes, then moves the cursor; with
        `flush_seconds` the vector store is flushed and the cursor moved at most that
        often, as in `run`). The cursor moves only after its batches are written and
        flushed, in order; on a failure every stage stops and the projection starts again from its
        cursor (batches read ahead are read again; writes are idempotent). A lost
        connection or back end backs off and retries as in `run`; anything else stops
        every projection and is raised."""
        failed: list[BaseException] = []

        def stopping() -> bool:
            return bool(failed) or should_stop()

        threads = [
            threading.Thread(
                target=self._follow,
                args=(projection, poll_seconds, stopping, failed, depth),
                name=f"projector-{projection}",
                daemon=True,
            )
            for projection in projections
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise failed[0]

    def _follow(
        self,
        projection: str,
        poll_seconds: float,
        should_stop: Callable[[], bool],
        failed: list[BaseException],
        depth: int,
    ) -> None:
        backoff = 0.5
        while not should_stop():
            try:
                self._pipeline(projection, poll_seconds, should_stop, depth)
            except Exception as exc:
                if not recoverable(exc):
                    failed.append(exc)
                    return
                if should_stop():
                    return
                delay = min(backoff, 30.0) * (0.5 + random.random())  # noqa: S311 - jitter
                self.progress(
                    f"{projection}: paused ({type(exc).__name__}); retrying in {delay:.1f}s"
                )
                time.sleep(delay)
                backoff *= 2
            else:
                backoff = 0.5

    def _pipeline(
        self, projection: str, poll_seconds: float, should_stop: Callable[[], bool], depth: int
    ) -> None:
        """One life of a projection's three stages; returns when asked to stop, raises the
        first stage's failure."""
        halt = threading.Event()
        errors: list[Exception] = []
        read: queue.Queue[_Batch] = queue.Queue(maxsize=depth)
        embedded: queue.Queue[_Batch] = queue.Queue(maxsize=depth)

        def halted() -> bool:
            return halt.is_set() or should_stop()

        def put(q: queue.Queue[_Batch], batch: _Batch) -> bool:
            while not halted():
                with contextlib.suppress(queue.Full):
                    q.put(batch, timeout=0.1)
                    return True
            return False

        def get(q: queue.Queue[_Batch]) -> _Batch | None:
            while not halted():
                with contextlib.suppress(queue.Empty):
                    return q.get(timeout=0.1)
            return None

        def stage(body: Callable[[], None]) -> Callable[[], None]:
            def guarded() -> None:
                try:
                    body()
                except Exception as exc:
                    errors.append(exc)
                    halt.set()

            return guarded

        def reader() -> None:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                conn.execute("LISTEN fabric_events")
                after: Json | None = None
                while not halted():
                    events = self.events(conn, projection, after)
                    if not events:
                        if select.select([conn.fileno()], [], [], min(poll_seconds, 0.5))[0]:
                            for _ in conn.notifies(timeout=0):
                                pass
                        continue
                    ids = sorted({str(e["memory_id"]) for e in events if e["memory_id"]})
                    records = self.records(conn, ids) if ids else []
                    if not put(read, _Batch(events, records)):
                        return
                    after = events[-1]

        def embedder() -> None:
            while (batch := get(read)) is not None:
                # What else was read meanwhile is embedded in the same call: bigger
                # batches when behind, one model call per turn.
                batches = [batch]
                with contextlib.suppress(queue.Empty):
                    while True:
                        batches.append(read.get_nowait())
                if projection == "qdrant":
                    self._embed_batches(batches)
                for b in batches:
                    if not put(embedded, b):
                        return

        stages = [
            threading.Thread(target=stage(body), name=f"projector-{projection}-{body.__name__}")
            for body in (reader, embedder)
        ]
        deferred = self._deferred(projection)
        self._unflushed.pop(projection, None)  # a new life starts from the cursor
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                for t in stages:
                    t.start()
                while not halted():
                    due = self.flush_due(projection)
                    try:
                        batch = embedded.get(timeout=0.1 if due is None else min(0.1, due))
                    except queue.Empty:
                        self.settle(conn, projection)  # due: flush, then move the cursor
                        continue
                    if batch.records:
                        with self._guarded():
                            self.apply(
                                projection, conn, batch.records, batch.embedded, flush=not deferred
                            )
                    self.apply_steps(projection, conn, batch.events)
                    self._applied(conn, projection, batch.events[-1], deferred)
                    self.progress(f"{projection}: applied {len(batch.events)} events")
                # stopped, or another stage failed: what was applied was applied in order,
                # so it is flushed and the cursor moved past it
                self.settle(conn, projection, force=True)
        finally:
            halt.set()
            for t in stages:
                if t.is_alive() or t.ident is not None:
                    t.join()
        if errors:
            raise errors[0]

    def _embed_batches(self, batches: Sequence[_Batch]) -> None:
        """`embed_missing` for several batches in one embedder call, split back per batch."""
        missing = [
            [r for r in b.records if projectable(r) and r.get("embedding") is None] for b in batches
        ]
        flat = [r for rs in missing for r in rs]
        vectors = self.embedder.embed([text_of(r["content"]) for r in flat]) if flat else []
        start = 0
        for b, rs in zip(batches, missing, strict=True):
            b.embedded = vectors[start : start + len(rs)]
            start += len(rs)

    # -- rebuild ---------------------------------------------------------------------------------

    def snapshot(self, conn: psycopg.Connection[Any], page: int = 1000) -> Iterator[list[Json]]:
        after_tenant: str | None = None
        after_memory: str | None = None
        register_vector(conn)
        while True:
            rows = [
                projection_record(r)
                for r in fabric_rows(
                    conn,
                    "fabric_api.projection_snapshot_v2",
                    after_tenant,
                    Cast(after_memory, "uuid"),
                    page,
                    self.embedder.model,
                    self.embedder.version,
                    binary=True,
                )
            ]
            if not rows:
                return
            yield rows
            after_tenant, after_memory = rows[-1]["tenant_id"], rows[-1]["memory_id"]

    def step_snapshot(
        self, conn: psycopg.Connection[Any], page: int = 1000
    ) -> Iterator[list[Json]]:
        """Every reasoning step, a page at a time (for the graph's rebuild)."""
        after_tenant: str | None = None
        after_step: str | None = None
        while True:
            rows = fabric_rows(
                conn,
                "fabric_api.projection_steps_snapshot",
                after_tenant,
                Cast(after_step, "uuid"),
                page,
            )
            if not rows:
                return
            yield rows
            after_tenant, after_step = rows[-1]["tenant_id"], str(rows[-1]["step_id"])

    def same_as_snapshot(
        self, conn: psycopg.Connection[Any], page: int = 1000
    ) -> Iterator[list[Json]]:
        """Every applied same-as merge, a page at a time (for the graph's rebuild)."""
        after_tenant: str | None = None
        after_entity: str | None = None
        while True:
            rows = fabric_rows(
                conn,
                "fabric_api.projection_same_as_snapshot",
                after_tenant,
                Cast(after_entity, "uuid"),
                page,
            )
            if not rows:
                return
            yield rows
            after_tenant, after_entity = rows[-1]["tenant_id"], str(rows[-1]["entity_id"])

    def unfinished_rebuilds(self) -> dict[str, datetime]:
        """This projector's projections whose last rebuild began and did not end (a crash,
        `memfabric serve` stopped), with when it began: they may be incomplete until
        rebuilt (`rebuild` clears the note when it ends)."""
        mine = [p for p, store in (("qdrant", self.store), ("graph", self.graph)) if store]
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            began = {
                p: self._call(conn, "fabric_api.unfinished_projection_rebuild", p) for p in mine
            }
        return {p: when for p, when in began.items() if when is not None}

    def rebuild(self, projection: str, *, on_page: Callable[[int], None] = lambda _: None) -> int:
        """Wipe the projection and rebuild it from Postgres alone (stored embeddings are
        reused; nothing already embedded is embedded again). Returns records projected."""
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            horizon = str(self._call(conn, "fabric_api.projection_horizon"))
            # noted before the wipe, cleared by the rewind below: a rebuild that does not
            # end is remembered, and `memfabric serve` runs it again at start
            self._call(conn, "fabric_api.begin_projection_rebuild", projection)
            if projection == "qdrant":
                assert self.store is not None
                self.store.wipe()
            else:
                assert self.graph is not None
                self.graph.wipe()
                self.graph.ensure_schema()
            total = 0
            for rows in self.snapshot(conn):
                self.apply(projection, conn, rows)
                total += len(rows)
                on_page(len(rows))
            if projection == "graph":
                assert self.graph is not None
                for steps in self.step_snapshot(conn):
                    self.graph.upsert_steps(steps)
                for merges in self.same_as_snapshot(conn):
                    self.graph.upsert_same_as(merges)
            # Every transaction below the horizon is in the snapshot; later events replay.
            below = str(max(int(horizon) - 1, 0))
            self._call(
                conn,
                "fabric_api.set_projection_cursor",
                projection,
                Cast(below, "xid8"),
                "ffffffff-ffff-ffff-ffff-ffffffffffff",
                True,
            )
            return total
