"""One Qdrant Edge shard, opened in this process (`LocalShard`) or owned by a child process
(`ProcessShard`), behind the same small interface `EdgeVectorStore` uses.

Why a child: `qdrant_edge` holds the Python interpreter lock while it searches, so the
shards of one recall (episodic, semantic) are searched one after the other in a process,
whatever its threads do. A shard owned by a child process is searched there, and a search
over several shards asks them all before waiting for any (`start_query` / `result`): they
run at once when cores are free. The child is the shard's only opener (Qdrant Edge allows
one per directory): every read and write of that shard goes through it. Requests and answers
are pickled frames on the child's stdin and stdout; the answers are the same values the
shard gives in process (docs/benchmarks.md, "Semantic recall at 100,000 records: where the
time goes"). A child that dies is restarted by the next operation (`ProcessShard`; bounded,
and unflushed writes reported by `take_lost`: docs/projections.md)."""

from __future__ import annotations

import contextlib
import logging
import pickle
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import qdrant_edge

from memfabric.children import end_child, serve_parent
from memfabric.vectors.filters import FilterSpec, _edge_filter
from memfabric.vectors.model import ShardUnavailable

_LENGTH = struct.Struct("<Q")
_log = logging.getLogger(__name__)
Hits = list[tuple[str, float]]
Row = tuple[str, list[float], dict[str, Any]]
Page = tuple[list[tuple[str, Any]], str | None]


@dataclass(frozen=True)
class ShardInfo:
    points_count: int
    indexed_vectors_count: int
    segments_count: int
    payload_schema: frozenset[str]


class Shard(Protocol):
    def info(self) -> ShardInfo: ...
    def create_field_index(self, name: str, kind: str) -> None: ...
    def upsert(self, rows: list[Row]) -> None: ...
    def held(self, ids: list[str]) -> list[str]: ...
    def start_held(self, ids: list[str]) -> None: ...
    def held_result(self) -> list[str]: ...
    def delete(self, ids: list[str]) -> None: ...
    def set_payload(self, ids: list[str], payload: dict[str, Any]) -> None: ...
    def start_query(self, vector: list[float], spec: FilterSpec, n: int, exact: bool) -> None: ...
    def result(self) -> Hits: ...
    def count(self) -> int: ...
    def scroll(self, offset: str | None, limit: int) -> Page: ...
    def flush(self) -> None: ...
    def take_lost(self) -> bool: ...
    def close(self) -> None: ...


def edge_config(dims: int, indexing_threshold_kb: int | None) -> qdrant_edge.EdgeConfig:
    import qdrant_edge as qe

    optimizers = None
    if indexing_threshold_kb is not None:
        optimizers = qe.EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb)
    return qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(size=dims, distance=qe.Distance.Cosine),
        optimizers=optimizers,
    )


class LocalShard:
    """The shard opened in this process."""

    def __init__(
        self,
        directory: str,
        dims: int | None,
        indexing_threshold_kb: int | None,
        *,
        create: bool,
        filter_of: Callable[[FilterSpec], Any] = _edge_filter,
    ) -> None:
        import qdrant_edge as qe

        if create:
            assert dims is not None
            self._shard = qe.EdgeShard.create(directory, edge_config(dims, indexing_threshold_kb))
        elif dims is None:
            self._shard = qe.EdgeShard.load(directory)
        else:  # config given: the engine checks the shard is compatible with it
            self._shard = qe.EdgeShard.load(directory, edge_config(dims, indexing_threshold_kb))
        self._filter_of = filter_of
        self._pending: Hits | None = None
        self._held: list[str] | None = None

    def info(self) -> ShardInfo:
        i = self._shard.info()
        return ShardInfo(
            i.points_count, i.indexed_vectors_count, i.segments_count, frozenset(i.payload_schema)
        )

    def create_field_index(self, name: str, kind: str) -> None:
        import qdrant_edge as qe

        self._shard.update(qe.UpdateOperation.create_field_index(name, edge_index(kind)))

    def upsert(self, rows: list[Row]) -> None:
        import qdrant_edge as qe

        points = [qe.Point(pid, vec, payload) for pid, vec, payload in rows]
        self._shard.update(qe.UpdateOperation.upsert_points(points))

    def held(self, ids: list[str]) -> list[str]:
        return [str(r.id) for r in self._shard.retrieve(list(ids), False, False)]

    def start_held(self, ids: list[str]) -> None:
        self._held = self.held(ids)  # in process: done at once

    def held_result(self) -> list[str]:
        held, self._held = self._held, None
        assert held is not None, "held_result() without start_held()"
        return held

    def delete(self, ids: list[str]) -> None:
        import qdrant_edge as qe

        self._shard.update(qe.UpdateOperation.delete_points(list(ids)))

    def set_payload(self, ids: list[str], payload: dict[str, Any]) -> None:
        import qdrant_edge as qe

        # by filter: set_payload by id list fails on an id the shard does not hold
        has_id = qe.HasIdCondition(set(ids))
        op = qe.UpdateOperation.set_payload_by_filter(qe.Filter(must=[has_id]), payload)
        self._shard.update(op)

    def query(self, vector: list[float], spec: FilterSpec, n: int, exact: bool) -> Hits:
        import qdrant_edge as qe

        request = qe.QueryRequest(
            limit=n,
            query=qe.Query.Nearest(vector),
            filter=self._filter_of(spec),
            with_payload=False,
            with_vector=False,
            params=qe.SearchParams(exact=exact),
        )
        return [(str(p.id), float(p.score)) for p in self._shard.query(request)]

    def start_query(self, vector: list[float], spec: FilterSpec, n: int, exact: bool) -> None:
        self._pending = self.query(vector, spec, n, exact)  # in process: done at once

    def result(self) -> Hits:
        hits, self._pending = self._pending, None
        assert hits is not None, "result() without start_query()"
        return hits

    def count(self) -> int:
        import qdrant_edge as qe

        return int(self._shard.count(qe.CountRequest(exact=True)))

    def scroll(self, offset: str | None, limit: int) -> Page:
        import qdrant_edge as qe

        records, nxt = self._shard.scroll(
            qe.ScrollRequest(offset=offset, limit=limit, with_payload=True, with_vector=False)
        )
        page = [(str(r.id), dict(r.payload or {})) for r in records]
        return page, None if nxt is None else str(nxt)

    def flush(self) -> None:
        self._shard.flush()

    def take_lost(self) -> bool:
        return False  # in process: nothing dies alone

    def close(self) -> None:
        self._shard.close()


# A shard whose child died is restarted on its directory at once, then after RESTART_BACKOFF,
# twice that, ... seconds; a shard whose child died MAX_RESTARTS times within RESTART_WINDOW
# seconds is not restarted until the oldest of those deaths is that old (ShardUnavailable):
# a crash loop (a child that dies at once, or cannot open the shard) trips it in about 2 s,
# a kill every few seconds across the shards does not.
MAX_RESTARTS = 5
RESTART_WINDOW = 10.0
RESTART_BACKOFF = 0.1
# the operations that change the shard: each one leaves it unflushed until `flush`
_WRITES = frozenset({"upsert", "delete", "set_payload", "create_field_index"})


class _ChildDied(OSError):
    """The child is gone (EOF on its stdout, a broken pipe, or never restarted)."""


class ProcessShard:
    """The shard owned by a child process (`_child_main`, started with `python -c`); every
    method asks it and waits, except `start_query`, which asks and returns (`result` waits).
    An engine error in the child is raised here as `RuntimeError` with its message.

    Supervised: a child that died (killed, crashed) is noticed by the next operation, which
    starts a new child on the same directory (bounded: `MAX_RESTARTS` within
    `RESTART_WINDOW` seconds, with backoff, then `ShardUnavailable` naming the directory)
    and asks it again once (every operation is idempotent: an upsert, delete or payload
    change applied twice leaves what once does). The new child opens the shard as its last
    flush left it: the writes sent since then may be lost, so `take_lost()` then answers
    True once (`EdgeVectorStore.flush` raises `WritesLost`, and the projector re-applies
    from its cursor, which never passes a flush)."""

    max_restarts = MAX_RESTARTS
    restart_window = RESTART_WINDOW
    restart_backoff = RESTART_BACKOFF

    def __init__(
        self,
        directory: str,
        dims: int | None,
        indexing_threshold_kb: int | None,
        *,
        create: bool,
    ) -> None:
        self.directory = directory
        self._dims = dims
        self._indexing_threshold_kb = indexing_threshold_kb
        self._child: subprocess.Popen[bytes] | None = None
        self._waiting = False
        self._closed = False
        self._asked: tuple[str, tuple[Any, ...]] | None = None  # the read _ask sent
        self._unflushed = False  # a write was answered since the last flush
        self._lost = False  # a child died holding unflushed writes (take_lost)
        self._deaths: list[float] = []  # time.monotonic() of each death, recent ones
        self.restarts = 0  # children started after the first one
        self._exit_status: int | None = None  # of the last child that ended
        self._start(create)

    @property
    def pid(self) -> int | None:
        """The child's process id (None while there is none)."""
        return None if self._child is None else self._child.pid

    def _start(self, create: bool) -> None:
        self._child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from memfabric.vectors.shards import _child_main; _child_main()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._waiting = False
        try:
            self._send("open", self.directory, self._dims, self._indexing_threshold_kb, create)
            self._receive()
        except BaseException:
            self._stop()
            raise

    def _revive(self, cause: BaseException) -> None:
        """The child died: start another on the directory (with backoff), or raise
        `ShardUnavailable` when it died too often lately."""
        self._stop()
        died = self._exit_status  # of the child that died (a negative number: its signal)
        if self._unflushed:
            self._lost, self._unflushed = True, False
        last: BaseException = cause
        attempts = 0
        while True:
            now = time.monotonic()
            self._deaths = [t for t in self._deaths if now - t < self.restart_window]
            if len(self._deaths) >= self.max_restarts or attempts >= self.max_restarts:
                raise ShardUnavailable(
                    f"the process of shard {self.directory} died or could not reopen it "
                    f"{max(len(self._deaths), attempts)} times in {self.restart_window:g} s; "
                    f"not restarted for now (last: {type(last).__name__}: {last})"
                ) from last
            self._deaths.append(now)
            attempts += 1
            if len(self._deaths) > 1:
                time.sleep(self.restart_backoff * 2 ** (len(self._deaths) - 2))
            try:
                self._start(False)  # never create: the shard exists since the first start
            except (_ChildDied, RuntimeError) as exc:  # died again, or cannot open the shard
                last = exc
                continue
            self.restarts += 1
            _log.warning(
                "the process of shard %s ended (exit status %s); restarted it (restart %d)",
                self.directory,
                died,
                self.restarts,
            )
            return

    def _send(self, op: str, *args: Any) -> None:
        if self._closed:
            raise OSError(f"the shard {self.directory} is closed")
        child = self._child
        if child is None or child.stdin is None:
            raise _ChildDied(f"the process of shard {self.directory} is gone")
        if self._waiting:  # an answer not read (a caller gave up): read it first
            with contextlib.suppress(RuntimeError):
                self._receive()
        try:
            _write_frame(child.stdin, pickle.dumps((op, args), pickle.HIGHEST_PROTOCOL))
        except OSError as exc:
            self._stop()
            raise _ChildDied(f"the process of shard {self.directory} ended") from exc
        self._waiting = True

    def _receive(self) -> Any:
        child = self._child
        if child is None or child.stdout is None:
            raise _ChildDied(f"the process of shard {self.directory} is gone")
        try:
            payload = _read_frame(child.stdout)
        except (EOFError, OSError) as exc:
            self._stop()
            raise _ChildDied(f"the process of shard {self.directory} ended unexpectedly") from exc
        self._waiting = False
        # the frames come from this process's own child, never from elsewhere
        ok, value = pickle.loads(payload)  # noqa: S301
        if not ok:
            raise RuntimeError(value)
        return value

    def _call(self, op: str, *args: Any) -> Any:
        """Ask the child and wait; a child that died is restarted and asked once more."""
        for attempt in (1, 2):
            try:
                self._send(op, *args)
                value = self._receive()
            except _ChildDied as exc:
                self._revive(exc)
                if attempt == 2:
                    raise ShardUnavailable(
                        f"the process of shard {self.directory} died twice on one {op}"
                    ) from exc
                continue
            # a write is unflushed once answered (a child that dies before answering it
            # is restarted and asked again: what it held before this write is what a
            # restart may lose)
            if op in _WRITES:
                self._unflushed = True
            elif op == "flush":
                self._unflushed = False
            return value
        raise AssertionError("unreachable")

    def take_lost(self) -> bool:
        """Did a child die holding unflushed writes since this was last asked?"""
        lost, self._lost = self._lost, False
        return lost

    def info(self) -> ShardInfo:
        info: ShardInfo = self._call("info")
        return info

    def create_field_index(self, name: str, kind: str) -> None:
        self._call("create_field_index", name, kind)

    def upsert(self, rows: list[Row]) -> None:
        self._call("upsert", rows)

    def held(self, ids: list[str]) -> list[str]:
        held: list[str] = self._call("held", ids)
        return held

    def delete(self, ids: list[str]) -> None:
        self._call("delete", ids)

    def set_payload(self, ids: list[str], payload: dict[str, Any]) -> None:
        self._call("set_payload", ids, payload)

    def query(self, vector: list[float], spec: FilterSpec, n: int, exact: bool) -> Hits:
        self.start_query(vector, spec, n, exact)
        return self.result()

    def start_query(self, vector: list[float], spec: FilterSpec, n: int, exact: bool) -> None:
        self._ask("query", vector, spec, n, exact)

    def result(self) -> Hits:
        hits: Hits = self._answer("query")
        return hits

    def start_held(self, ids: list[str]) -> None:
        self._ask("held", ids)

    def held_result(self) -> list[str]:
        held: list[str] = self._answer("held")
        return held

    def _ask(self, op: str, *args: Any) -> None:
        """Send a read and return; `_answer` waits for it (so several shards work at once)."""
        self._asked = (op, args)
        with contextlib.suppress(_ChildDied):  # _answer restarts the child and asks again
            self._send(op, *args)

    def _answer(self, op: str) -> Any:
        asked, self._asked = self._asked, None
        assert asked is not None and asked[0] == op, f"no {op} asked"
        try:
            return self._receive()
        except _ChildDied:
            return self._call(asked[0], *asked[1])

    def count(self) -> int:
        return int(self._call("count"))

    def scroll(self, offset: str | None, limit: int) -> Page:
        page: Page = self._call("scroll", offset, limit)
        return page

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._child is not None:
                with contextlib.suppress(_ChildDied):  # a dead child is not restarted to close
                    self._send("close")
                    self._receive()
        finally:
            self._closed = True
            self._stop()

    def _stop(self) -> None:
        child, self._child = self._child, None
        self._waiting = False
        end_child(child, grace=30)
        if child is not None:
            self._exit_status = child.returncode

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stop()


def open_shard(
    directory: str,
    dims: int | None,
    indexing_threshold_kb: int | None,
    *,
    create: bool,
    process: bool,
    filter_of: Callable[[FilterSpec], Any] = _edge_filter,
) -> Shard:
    if process:
        return ProcessShard(directory, dims, indexing_threshold_kb, create=create)
    return LocalShard(directory, dims, indexing_threshold_kb, create=create, filter_of=filter_of)


def edge_index(kind: str) -> Any:
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


def _write_frame(out: IO[bytes], payload: bytes) -> None:
    out.write(_LENGTH.pack(len(payload)) + payload)
    out.flush()


def _read_frame(inp: IO[bytes]) -> bytes:
    head = inp.read(_LENGTH.size)
    if len(head) != _LENGTH.size:
        raise EOFError
    (size,) = _LENGTH.unpack(head)
    payload = inp.read(size)
    if len(payload) != size:
        raise EOFError
    return payload


def _child_main() -> None:
    """The child of `ProcessShard`: the first request opens the shard, each later one is
    `(op, args)` answered `(True, value)` or `(False, message)`. Ends at EOF or `close`,
    and quietly when the parent is gone (`serve_parent`)."""
    serve_parent(_serve_shard)


def _serve_shard(inp: IO[bytes], out: IO[bytes]) -> None:
    shard: LocalShard | None = None
    last: tuple[FilterSpec, Any] | None = None

    def filter_of(spec: FilterSpec) -> Any:
        nonlocal last
        if last is None or last[0] != spec:
            last = (spec, _edge_filter(spec))
        return last[1]

    while True:
        try:
            op, args = pickle.loads(_read_frame(inp))  # noqa: S301 - from the parent only
        except EOFError:
            break
        try:
            if op == "open":
                shard = LocalShard(*args[:3], create=args[3], filter_of=filter_of)
                value: Any = None
            else:
                assert shard is not None
                value = getattr(shard, op)(*args)
            answer = (True, value)
        except Exception as exc:  # the engine raises a bare Exception
            answer = (False, f"{type(exc).__name__}: {exc}")
        _write_frame(out, pickle.dumps(answer, pickle.HIGHEST_PROTOCOL))
        if op == "close":
            break
