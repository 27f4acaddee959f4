"""`EdgeVectorStore`: Qdrant Edge in process, one shard directory per physical
collection, the data directory locked to one process."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import qdrant_edge

from memfabric.vectors.filters import FilterSpec, _edge_filter
from memfabric.vectors.model import (
    _SCROLL_PAGE,
    PAYLOAD_INDEXES,
    CollectionContract,
    ContractMismatch,
    NotBound,
    VectorStoreError,
    VectorStoreLocked,
    WritesLost,
)
from memfabric.vectors.shards import Hits, Shard, open_shard
from memfabric.vectors.store import VectorStore

_MANIFEST_FORMAT = "memfabric.vectors.edge/1"


class EdgeVectorStore(VectorStore):
    """Qdrant Edge in process: `<path>/shards/<physical>/` per collection, `<path>/manifest.json`
    for aliases and contracts, `<path>/.lock` held (flock, exclusive) while open.

    One process per data directory: Qdrant allows a single open EdgeShard per directory,
    so the embedded deployment has one owner process (`memfabric serve`) and everything
    else talks to it. A second opener gets `VectorStoreLocked` at once.
    """

    # build_index: a swap replays the writes that arrived during the build in rounds outside
    # the lock until at most `catch_up_bound` remain (or after `catch_up_rounds` rounds),
    # then replays those under the lock and swaps
    catch_up_bound = 32
    catch_up_rounds = 8

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        indexing_threshold_kb: int | None = None,
        shard_processes: bool = False,
    ) -> None:
        """`indexing_threshold_kb`: the engine's threshold (KB of vectors) under which a
        segment is left without an HNSW index by `build_index` (unset: the engine's default,
        10,000 KB, about 6,500 vectors of 384 dimensions). `shard_processes`: each shard is
        owned by a child process (memfabric.vectors.shards), so a search over several tiers
        searches their shards at once instead of one after the other."""
        super().__init__()
        self.root = Path(path)
        self._indexing_threshold_kb = indexing_threshold_kb
        self.shard_processes = shard_processes
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _take_lock(self.root / ".lock")
        try:
            self._manifest = self._read_manifest()
            self._recover_swaps()
        except BaseException:
            _release_lock(self._lock_fd)
            raise
        self._shards: dict[str, Shard] = {}
        # shards written since their last flush: flush() syncs only these (a flush of a
        # shard costs fsyncs even when nothing changed; docs/benchmarks.md, "Keeping up")
        self._dirty: set[str] = set()
        # index builds (build_index): the writes each building shard received since its copy
        self._journals: dict[str, list[tuple[str, Any]]] = {}
        self._build_lock = threading.Lock()  # one build at a time
        self._building: str | None = None
        # the process building an index now (ended by close()), and whether close() began
        self._build_child: subprocess.Popen[str] | None = None
        self._closing = False
        self._left_unindexed: dict[str, int] = {}  # per shard, after its last build
        # shards whose restarted child lost unflushed writes, noted when the shard object was
        # replaced (an index swap) before a flush could report it (_flush_raw)
        self._lost: set[str] = set()
        # the engine filter of the last spec searched (_query_raw): read and replaced whole
        self._last_filter: tuple[FilterSpec, qdrant_edge.Filter] | None = None

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
    def _open(self, directory: Path, dims: int | None, *, create: bool = False) -> Shard:
        """The shard in `directory`, in this process or in its own (`shard_processes`);
        `dims` given: the engine checks the shard is compatible with that config."""
        return open_shard(
            str(directory),
            dims,
            self._indexing_threshold_kb,
            create=create,
            process=self.shard_processes,
            filter_of=self._edge_filter_of,
        )

    def _edge_filter_of(self, spec: FilterSpec) -> qdrant_edge.Filter:
        # One search asks every tier's shard with the same spec: its engine filter is built
        # once (about 0.1 ms) and reused while the spec object is the same.
        last = self._last_filter
        if last is not None and last[0] is spec:
            return last[1]
        flt = _edge_filter(spec)
        self._last_filter = (spec, flt)
        return flt

    def _open_all(self, contracts: Sequence[CollectionContract]) -> None:
        """Open the shards of `contracts` not open yet. With shard processes, at once: each
        child starts its interpreter and opens its shard while the others do (four tiers'
        children start in about the time of two instead of four)."""
        wanted = [c for c in contracts if c.physical_name not in self._shards]
        if not self.shard_processes or len(wanted) < 2:
            return
        for contract in wanted:
            self._recorded(contract)  # a collection of another contract is never opened
        with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
            futures = {c.physical_name: pool.submit(self._open_one, c) for c in wanted}
        failed: BaseException | None = None
        for physical, future in futures.items():
            try:
                self._shards[physical] = future.result()
            except BaseException as exc:  # every opened shard is kept (close() ends it)
                failed = failed or exc
        if failed is not None:
            raise failed

    def _recorded(self, contract: CollectionContract) -> dict[str, Any] | None:
        """The manifest's entry of the contract's collection (None: new), which must be of
        this contract."""
        physical = contract.physical_name
        known: dict[str, Any] | None = self._manifest["collections"].get(physical)
        if known is not None and CollectionContract.from_dict(known["contract"]) != contract:
            raise ContractMismatch(f"{physical} is recorded with another contract: {known}")
        return known

    @staticmethod
    def _index_payload(shard: Shard) -> None:
        """Create the payload indexes the shard lacks (all of them on a new shard)."""
        present = shard.info().payload_schema
        for name, kind in PAYLOAD_INDEXES:
            if name not in present:
                shard.create_field_index(name, kind)

    def _open_one(self, contract: CollectionContract) -> Shard:
        """The contract's shard, opened (created when new) with its payload indexes; the
        caller has checked the manifest's contract (`_recorded`)."""
        directory = self._shard_dir(contract.physical_name)
        try:
            if (directory / "edge_config.json").exists():
                shard = self._open(directory, contract.dims)
            else:
                directory.mkdir(parents=True, exist_ok=True)
                shard = self._open(directory, contract.dims, create=True)
        except Exception as exc:  # the engine raises a bare Exception
            raise VectorStoreError(f"cannot open {directory} as {contract}: {exc}") from exc
        try:
            self._index_payload(shard)
        except BaseException:
            shard.close()
            raise
        return shard

    def _open_or_create(self, contract: CollectionContract) -> None:
        physical = contract.physical_name
        known = self._recorded(contract)
        if physical not in self._shards:  # else opened by _open_all or an earlier binding,
            self._shards[physical] = self._open_one(contract)  # its indexes made at its open
        self._shards[physical].flush()
        if known is None:
            self._manifest["collections"][physical] = {
                "contract": contract.to_dict(),
                "dir": f"shards/{physical}",
            }
            self._write_manifest()

    def _drop(self, physical: str) -> None:
        self._journals.pop(physical, None)  # a build of the dropped shard is discarded
        self._lost.discard(physical)  # what it lost goes with it
        shard = self._shards.pop(physical, None)
        if shard is not None:
            shard.close()
        # the manifest keeps the entry: wipe() recreates the shard under the same contract
        shutil.rmtree(self._shard_dir(physical), ignore_errors=True)

    def _forget(self, physical: str) -> None:
        """Drop the shard and its manifest entry: its directory goes first, so a crash
        between the two leaves an entry that the next prune drops again, never a directory
        no entry names."""
        self._drop(physical)
        directory = self._shard_dir(physical)
        if directory.exists():  # _drop ignores errors: a shard left on disk is an error here
            shutil.rmtree(directory)
        if directory.parent.is_dir():
            _fsync_dir(directory.parent)
        del self._manifest["collections"][physical]
        self._write_manifest()

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

    def _shard(self, physical: str) -> Shard:
        self._check_open()
        shard = self._shards.get(physical)
        if shard is None:
            raise NotBound(f"{physical} is not open")
        return shard

    def _upsert_raw(
        self, physical: str, rows: list[tuple[str, list[float], dict[str, Any]]]
    ) -> None:
        with self._mutex:
            self._shard(physical).upsert(rows)
            self._dirty.add(physical)
            if physical in self._journals:  # an index build runs: replay this on its copy
                self._journals[physical].append(
                    ("upsert", [(pid, array("f", vec), payload) for pid, vec, payload in rows])
                )

    def _delete_raw(self, physical: str, ids: list[str]) -> None:
        self._delete_many_raw([(physical, ids)])

    def _delete_many_raw(self, asks: Sequence[tuple[str, list[str]]]) -> None:
        if len({physical for physical, _ in asks}) < len(asks):  # a shard answers one at a time
            for ask in asks:
                self._delete_many_raw([ask])
            return
        with self._mutex:
            # Only the points each shard holds: a delete of absent points (the projector
            # deletes each record from every other tier) would dirty the shard for nothing.
            # What is absent here is absent from a building copy with its journal too.
            # Every shard is asked before any answer is read (child shards work at once).
            shards = [(physical, self._shard(physical)) for physical, _ in asks]
            for (_, shard), (_, ids) in zip(shards, asks, strict=True):
                shard.start_held(list(ids))
            helds = [shard.held_result() for _, shard in shards]
            for (physical, shard), held in zip(shards, helds, strict=True):
                if not held:
                    continue
                shard.delete(held)
                self._dirty.add(physical)
                if physical in self._journals:
                    self._journals[physical].append(("delete", list(held)))

    def _set_payload_raw(self, physical: str, ids: list[str], payload: dict[str, Any]) -> None:
        with self._mutex:
            self._shard(physical).set_payload(list(ids), payload)
            self._dirty.add(physical)
            if physical in self._journals:
                self._journals[physical].append(("set_payload", (list(ids), dict(payload))))

    def _query_raw(
        self, physical: str, vector: list[float], spec: FilterSpec, n: int, exact: bool
    ) -> list[tuple[str, float]]:
        return self._query_many_raw([(physical, n)], vector, spec, exact)[0]

    def _query_many_raw(
        self, asks: Sequence[tuple[str, int]], vector: list[float], spec: FilterSpec, exact: bool
    ) -> list[Hits]:
        # Every shard is asked before any answer is read: shards owned by child processes
        # search at once (in this process, each answers as it is asked).
        with self._mutex:
            shards = [self._shard(physical) for physical, _ in asks]
            for shard, (_, n) in zip(shards, asks, strict=True):
                shard.start_query(vector, spec, n, exact)
            return [shard.result() for shard in shards]

    def _count_raw(self, physical: str) -> int:
        with self._mutex:
            return self._shard(physical).count()

    def _scroll_raw(
        self, physical: str, offset: str | None
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        with self._mutex:
            return self._shard(physical).scroll(offset, _SCROLL_PAGE)

    def _flush_raw(self) -> None:
        with self._mutex:
            for physical in sorted(self._dirty):
                shard = self._shards.get(physical)
                if shard is not None:
                    shard.flush()
                self._dirty.discard(physical)
            # A shard whose child died and was restarted (shard_processes) holding writes
            # not yet flushed lost them: this flush makes durable only what was written
            # since, so the caller must not treat everything before it as durable.
            lost = self._lost | {p for p, shard in self._shards.items() if shard.take_lost()}
            self._lost = set()
            if lost:
                raise WritesLost(
                    "the process of shard "
                    + ", ".join(str(self._shard_dir(p)) for p in sorted(lost))
                    + " died holding writes not yet flushed, and was restarted from its last "
                    "flush: re-apply what was written since the last successful flush"
                )

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
            if self._building is None:  # a build that would not end in time keeps its copy
                shutil.rmtree(self.root / "building", ignore_errors=True)
        finally:
            _release_lock(self._lock_fd)

    # the vector index ----------------------------------------------------------------------
    # Qdrant Edge builds an HNSW index only when its optimizer runs (`EdgeShard.optimize()`),
    # which holds the Python interpreter lock for the whole build (minutes at 100,000
    # points). So the build never runs in this process: the shard is flushed and copied,
    # a child process optimizes the copy, and the writes the copy missed are replayed on it
    # in rounds (the writes of each round journalled for the next) until few are left;
    # those are replayed under the lock and the copy is swapped in. Searches and writes go
    # on against the live shard meanwhile; they wait only while the copy is taken and
    # while the last round and the swap run.

    def index_status(self) -> dict[str, dict[str, Any]]:
        """Per bound tier: its physical collection, points, vectors in an HNSW index (the
        rest are searched by brute force), segments, and whether a build is running."""
        with self._mutex:
            out: dict[str, dict[str, Any]] = {}
            for tier, contract in sorted(self._bindings().items()):
                info = self._shard(contract.physical_name).info()
                out[tier] = {
                    "collection": contract.physical_name,
                    "points": info.points_count,
                    "indexed": info.indexed_vectors_count,
                    "segments": info.segments_count,
                    "building": self._building == contract.physical_name,
                }
            return out

    def build_index(
        self, tiers: Sequence[str] | None = None, *, min_unindexed: int = 1
    ) -> dict[str, dict[str, Any]]:
        """Build the HNSW index of each bound tier's shard (all, or `tiers`) that holds at
        least `min_unindexed` vectors outside an index, in a child process on a copy, then
        swap the copy in. Blocks the caller until done; other threads go on searching and
        writing. Returns per tier what was done (`skipped`, `unchanged` when the engine found
        nothing to optimize, `built`, `discarded` when the shard was wiped meanwhile) and the
        seconds each phase took; for `built`, the writes replayed on the copy (`replayed`),
        how many of them under the lock (`replayed_locked`) and the rounds of catching up.
        One build at a time: a second caller waits."""
        with self._build_lock:
            status = self.index_status()
            out: dict[str, dict[str, Any]] = {}
            for tier in tiers if tiers is not None else list(status):
                if tier not in status:
                    raise NotBound(f"no collection bound for tier {tier!r}")
                st = status[tier]
                if st["points"] - st["indexed"] < max(min_unindexed, 1):
                    out[tier] = {"result": "skipped", **st}
                    continue
                self._building = st["collection"]
                try:
                    out[tier] = self._build_one(st["collection"])
                finally:
                    self._building = None
                    shutil.rmtree(self.root / "building", ignore_errors=True)
            return out

    def build_index_when_due(self, after: int) -> dict[str, dict[str, Any]]:
        """`build_index` for the tiers holding at least `after` vectors outside an index
        beyond what their last build left there (segments under the engine's indexing
        threshold stay unindexed: they must not make every check build again)."""
        due = [
            tier
            for tier, st in self.index_status().items()
            if st["points"] - st["indexed"] - self._left_unindexed.get(st["collection"], 0)
            >= max(after, 1)
        ]
        if not due:
            return {}
        out = self.build_index(due)
        status = self.index_status()
        for tier, result in out.items():
            if result["result"] in ("built", "unchanged"):
                left = status[tier]["points"] - status[tier]["indexed"]
                self._left_unindexed[status[tier]["collection"]] = left
            else:
                self._left_unindexed.pop(status[tier]["collection"], None)
        return out

    def _build_one(self, physical: str) -> dict[str, Any]:
        building = self.root / "building"
        copy = building / physical
        t0 = time.perf_counter()
        with self._mutex:
            shard = self._shard(physical)
            shutil.rmtree(copy, ignore_errors=True)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shard.flush()
            _copy_tree(self._shard_dir(physical), copy)
            self._journals[physical] = []
        t1 = time.perf_counter()
        try:
            returncode, stdout, stderr = self._run_build_child(copy)
            if self._closing:
                raise VectorStoreError(f"the store closed while the index of {physical} was built")
            if returncode != 0:
                raise VectorStoreError(
                    f"building the index of {physical} failed: {stderr.strip()[-2000:]}"
                )
            built = json.loads(stdout.strip().splitlines()[-1])
        except BaseException:
            with self._mutex:
                self._journals.pop(physical, None)
            shutil.rmtree(copy, ignore_errors=True)
            raise
        t2 = time.perf_counter()
        timing: dict[str, Any] = {"copy_s": round(t1 - t0, 3), "build_s": round(t2 - t1, 3)}
        with self._mutex:
            delta = self._journals.get(physical)
            if delta is None or physical not in self._shards or not built["optimized"]:
                self._journals.pop(physical, None)
                shutil.rmtree(copy, ignore_errors=True)
                result = "discarded" if delta is None else "unchanged"
                return {"result": result, "collection": physical, **timing}
            self._journals[physical] = []  # the writes from now on: the next round
        # Catch up outside the lock: replay each round's writes on the built copy while
        # searches and writes go on against the live shard (and are journalled for the next
        # round); the lock is taken only for the last small delta and the swap.
        replayed = rounds = 0
        try:  # in this process whatever shard_processes says: only this build writes it
            fresh = open_shard(str(copy), None, None, create=False, process=False)
        except BaseException:
            with self._mutex:
                self._journals.pop(physical, None)
            shutil.rmtree(copy, ignore_errors=True)
            raise
        try:
            while True:
                for op in delta:
                    _replay(fresh, op)
                fresh.flush()
                replayed += len(delta)
                rounds += 1
                with self._mutex:
                    delta = self._journals.get(physical)
                    if delta is None or physical not in self._shards:  # wiped meanwhile
                        self._journals.pop(physical, None)
                        fresh.close()
                        shutil.rmtree(copy, ignore_errors=True)
                        timing["catch_up_s"] = round(time.perf_counter() - t2, 3)
                        return {"result": "discarded", "collection": physical, **timing}
                    if len(delta) > self.catch_up_bound and rounds < self.catch_up_rounds:
                        self._journals[physical] = []
                        continue
                    t3 = time.perf_counter()
                    self._journals.pop(physical)
                    for op in delta:
                        _replay(fresh, op)
                    fresh.flush()
                    fresh.close()
                    info = self._swap(physical, copy)
                    t4 = time.perf_counter()
                    break
        except BaseException:
            with self._mutex:
                self._journals.pop(physical, None)
            with contextlib.suppress(Exception):
                fresh.close()  # it may be closed already
            shutil.rmtree(copy, ignore_errors=True)
            raise
        return {
            "result": "built",
            "collection": physical,
            "points": info.points_count,
            "indexed": info.indexed_vectors_count,
            "segments": info.segments_count,
            "replayed": replayed + len(delta),
            "replayed_locked": len(delta),
            "catch_up_rounds": rounds,
            **timing,
            "catch_up_s": round(t3 - t2, 3),
            "swap_s": round(t4 - t3, 3),
        }

    def _run_build_child(self, copy: Path) -> tuple[int, str, str]:
        """Optimize the copy in a child process, which `close()` ends (and which ends by
        itself if this process dies first): (its exit status, stdout, stderr)."""
        child = _start_build(copy)
        with self._mutex:
            self._build_child = child
            if self._closing:  # close() began before the child existed: it ends here
                child.kill()
        try:
            stdout, stderr = child.communicate()
        finally:
            with self._mutex:
                self._build_child = None
        return child.returncode, stdout, stderr

    def close(self) -> None:
        """Close the shards; an index build under way is ended first (its child killed, its
        copy removed: the next build starts over), so nothing outlives the store's owner."""
        with self._mutex:
            self._closing = True
            child = self._build_child
        if child is not None:
            with contextlib.suppress(OSError):
                child.kill()
        # the build's own clean-up (the copy, the journal) ends with the build lock; a build
        # still catching up finishes its round first
        took = self._build_lock.acquire(timeout=60)
        try:
            super().close()
        finally:
            if took:
                self._build_lock.release()

    def _swap(self, physical: str, copy: Path) -> Any:
        """Under the mutex: the built copy takes the live shard's place (the live shard is
        put back if the copy cannot be opened); the new shard's info."""
        live = self._shard_dir(physical)
        aside = live.with_name(live.name + ".old")
        old = self._shards.pop(physical)
        if old.take_lost():  # reported by the next flush, whatever shard object serves then
            self._lost.add(physical)
        old.close()
        os.rename(live, aside)
        os.rename(copy, live)
        _fsync_dir(live.parent)
        self._dirty.add(physical)  # flushed on the next flush(), whatever happened here
        try:
            self._shards[physical] = self._open(live, None)
        except Exception:
            os.rename(live, copy)  # put the live shard back as it was
            os.rename(aside, live)
            self._shards[physical] = self._open(live, None)
            raise
        shutil.rmtree(aside, ignore_errors=True)
        return self._shards[physical].info()

    def _recover_swaps(self) -> None:
        """Finish what a crash left: a half-done swap, an unfinished build copy."""
        shards = self.root / "shards"
        if shards.is_dir():
            for aside in shards.glob("*.old"):
                live = aside.with_name(aside.name.removesuffix(".old"))
                if live.exists():
                    shutil.rmtree(aside)  # the swap was done: the built copy is live
                else:
                    os.rename(aside, live)  # the swap was not done: the old shard stays
        shutil.rmtree(self.root / "building", ignore_errors=True)


# Before anything else, the child of build_index asks Linux to kill it when the thread that
# started it ends (PR_SET_PDEATHSIG), then checks that its parent (argv[2]) is still there:
# the engine holds the interpreter lock for the whole build, so no thread of the child could
# watch for the parent itself, and an orphaned build would run on for minutes.
_END_WITH_PARENT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except (AttributeError, OSError):
    pass
if os.getppid() != int(sys.argv[2]):
    sys.exit("the process that asked for this index build has ended")
"""

# The child process of build_index: optimize the shard copy at argv[1] at low priority.
_BUILD_CHILD = """
import json, os, sys, time
import qdrant_edge as qe
os.nice(10)
t = time.perf_counter()
shard = qe.EdgeShard.load(sys.argv[1])
optimized = shard.optimize()
shard.flush()
info = shard.info()
shard.close()
print(json.dumps({"optimized": optimized, "seconds": time.perf_counter() - t,
                  "points": info.points_count, "indexed": info.indexed_vectors_count}))
"""


def _start_build(copy: Path) -> subprocess.Popen[str]:
    """The child process that optimizes the shard copy at `copy`."""
    return subprocess.Popen(
        [sys.executable, "-c", _END_WITH_PARENT + _BUILD_CHILD, str(copy), str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _replay(shard: Shard, op: tuple[str, Any]) -> None:
    """One journalled write, applied to the built copy as it was to the live shard."""
    kind, arg = op
    if kind == "upsert":
        shard.upsert([(pid, vec.tolist(), payload) for pid, vec, payload in arg])
    elif kind == "delete":
        shard.delete(arg)
    else:
        shard.set_payload(*arg)


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a shard directory keeping its preallocated files sparse (GNU cp; a reflink where
    the filesystem has them), else file by file."""
    cp = shutil.which("cp")
    if cp is not None:
        argv = [cp, "-a", "--reflink=auto", "--sparse=always", str(src), str(dst)]
        if subprocess.call(argv, stderr=subprocess.DEVNULL) == 0:
            return
        shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
