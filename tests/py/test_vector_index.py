"""The Edge vector index: `EdgeVectorStore.build_index` (a child process optimizes a copy of
the shard, the copy is swapped in with the writes it missed replayed) and `index_status`.

Real Qdrant Edge on /dev/shm when it exists; BUILT (1,000) points of 384 dimensions with an
indexing threshold of 300 KB, so the engine builds an HNSW index on a shard this small.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import point_payload
from memfabric.errors import Misconfigured
from memfabric.settings import Settings
from memfabric.vectors import EdgeVectorStore, RecallFilter, VectorPoint

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
DIMS = 384
SUBJECTS = [f"user-{i}" for i in range(5)]
SHM = Path("/dev/shm")  # noqa: S108 (tmpfs: shards fsync a lot)
BUILT, THRESHOLD_KB = 1000, 300  # points a build indexes (1.5 MB of vectors), and the threshold


def points(n: int, seed: int) -> list[VectorPoint]:
    rng = np.random.default_rng(seed)
    vecs = rng.normal(size=(n, DIMS)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    out = []
    for i in range(n):
        payload = point_payload(
            memory_id=str(uuid.UUID(int=(seed << 64) | i)),
            subject=SUBJECTS[i % len(SUBJECTS)],
            agent=None,
            session=None,
        )
        out.append(VectorPoint(payload, vecs[i]))
    return out


def flt(subject: str = "user-1") -> RecallFilter:
    return RecallFilter("acme", [f"subject:{subject}"], NOW, 0.0, [])


@pytest.fixture
def root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="mf-index-", dir=SHM if SHM.is_dir() else None))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def store(root: Path, request: pytest.FixtureRequest) -> Iterator[EdgeVectorStore]:
    # Inline shards unless a test asks for BOTH_MODES: the build and the swap are the parts
    # a child-owned shard (MEMFABRIC_EDGE_SHARDS=child) does differently; each build costs
    # seconds, so the other tests run once.
    s = EdgeVectorStore(
        root / "edge",
        indexing_threshold_kb=THRESHOLD_KB,
        shard_processes=getattr(request, "param", False),
    )
    s.ensure_collections("bench-model", "1", DIMS)
    yield s
    s.close()


BOTH_MODES = pytest.mark.parametrize("store", [False, True], ids=["inline", "child"], indirect=True)


def queries(n: int) -> list[list[float]]:
    rng = np.random.default_rng(99)
    q = rng.normal(size=(n, DIMS))
    return [list(map(float, x / np.linalg.norm(x))) for x in q]


@BOTH_MODES
@pytest.mark.slow  # an HNSW build in a child process: 2-5 s
def test_a_fresh_shard_has_no_index_and_a_build_indexes_every_point(
    store: EdgeVectorStore,
) -> None:
    store.upsert("semantic", points(BUILT, 1))
    store.flush()
    before = store.index_status()["semantic"]
    assert (before["points"], before["indexed"], before["building"]) == (BUILT, 0, False)
    exact_before = [store.search(["semantic"], q, flt(), 10, exact=True) for q in queries(10)]

    result = store.build_index(["semantic"])["semantic"]
    assert result["result"] == "built", result
    after = store.index_status()["semantic"]
    assert (after["points"], after["indexed"]) == (BUILT, BUILT)
    # exact search reads the same vectors: identical answers after the swap
    assert [store.search(["semantic"], q, flt(), 10, exact=True) for q in queries(10)] == (
        exact_before
    )
    # approximate search through the index finds each query's true nearest point
    for q, exact in zip(queries(10), exact_before, strict=True):
        approx = store.search(["semantic"], q, flt(), 10)
        assert approx[0] == exact[0]
        assert len({i for i, _ in approx} & {i for i, _ in exact}) >= 8


@pytest.mark.slow  # an HNSW build in a child process: 2-5 s
def test_a_second_build_without_new_points_is_skipped(store: EdgeVectorStore) -> None:
    store.upsert("semantic", points(BUILT, 1))
    assert store.build_index()["semantic"]["result"] == "built"
    assert store.build_index()["semantic"]["result"] == "skipped"
    store.upsert("semantic", points(10, 2))
    # below the threshold asked for: nothing is copied
    assert store.build_index(min_unindexed=100)["semantic"]["result"] == "skipped"
    assert store.build_index(["episodic"])["episodic"]["result"] == "skipped"  # empty


@BOTH_MODES
@pytest.mark.slow  # an HNSW build in a child process: 2-5 s
def test_writes_during_the_build_are_replayed_on_the_built_copy(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = points(BUILT, 1)
    store.upsert("semantic", first)
    late = points(50, 3)
    doomed = [p.payload.memory_id for p in first[:20]]
    superseded = [p.payload.memory_id for p in first[20:40]]
    started, go_on = threading.Event(), threading.Event()
    import memfabric.vectors.edge as edge

    real_run = edge._start_build

    def run(*args: Any, **kwargs: Any) -> Any:
        started.set()  # the copy is taken; hold the child until the writes are in
        assert go_on.wait(60)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(edge, "_start_build", run)
    results: dict[str, Any] = {}
    builder = threading.Thread(target=lambda: results.update(store.build_index()))
    builder.start()
    assert started.wait(60)
    assert store.index_status()["semantic"]["building"]
    store.upsert("semantic", late)
    store.delete("semantic", doomed)
    store.set_payload("semantic", superseded, {"consolidation_state": "superseded"})
    # searches and writes go on while the build runs
    assert store.search(["semantic"], queries(1)[0], flt(), 5)
    go_on.set()
    builder.join(120)
    assert results["semantic"]["result"] == "built"
    assert results["semantic"]["replayed"] == 3
    assert store.count("semantic") == BUILT + 50 - 20
    kept = {i for i, _ in store.scroll("semantic")}
    assert not kept & set(doomed)
    assert {p.payload.memory_id for p in late} <= kept
    live = {
        i
        for s in SUBJECTS
        for i, _ in store.search(["semantic"], queries(1)[0], flt(s), 5000, exact=True)
    }
    assert not live & set(superseded)
    assert len(live) == BUILT + 50 - 40
    assert not (store.root / "building").exists()


@pytest.mark.slow  # an HNSW build in a child process: 2-5 s
def test_a_wipe_during_the_build_discards_it(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.upsert("semantic", points(BUILT, 1))
    import memfabric.vectors.edge as edge

    real_popen = edge._start_build

    def popen(*args: Any, **kwargs: Any) -> Any:
        store.wipe()  # the rebuild of a projection drops the shard meanwhile
        store.upsert("semantic", points(7, 4))
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(edge, "_start_build", popen)
    assert store.build_index()["semantic"]["result"] == "discarded"
    assert store.count("semantic") == 7
    assert store.index_status()["semantic"]["indexed"] == 0


def test_a_failed_build_leaves_the_live_shard_as_it_was(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.upsert("semantic", points(BUILT, 1))
    import memfabric.vectors.edge as edge

    monkeypatch.setattr(edge, "_BUILD_CHILD", "import sys; sys.exit('engine gave up')")
    with pytest.raises(edge.VectorStoreError, match="engine gave up"):
        store.build_index()
    assert store.count("semantic") == BUILT
    store.upsert("semantic", points(5, 5))  # nothing is journalled any more, writes go on
    assert store.count("semantic") == BUILT + 5
    assert not (store.root / "building").exists()


# A build that takes long (the engine's HNSW build of a large shard takes minutes): the
# child sleeps in its place, marked so the test finds it among the processes.
_LONG_BUILD = "import time; time.sleep(600)  # a long index build"


def long_builds(parent: int) -> list[int]:
    """The live (not yet exited) long builds whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and stat[0] != "Z" and b"a long index build" in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return found


def test_closing_the_store_ends_a_build_under_way_and_removes_its_copy(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `memfabric serve` does when it stops: the build's child ends with the store,
    its copy (building/) goes, and the caller of the build is told."""
    import memfabric.vectors.edge as edge

    store.upsert("semantic", points(50, 1))
    monkeypatch.setattr(edge, "_BUILD_CHILD", _LONG_BUILD)
    told: list[BaseException] = []

    def build() -> None:
        try:
            store.build_index(["semantic"])
        except BaseException as exc:
            told.append(exc)

    builder = threading.Thread(target=build)
    builder.start()
    (child,) = wait_for(lambda: long_builds(os.getpid()))
    try:
        assert (store.root / "building").is_dir()
        started = time.monotonic()
        store.close()
        assert time.monotonic() - started < 10
        builder.join(timeout=10)
        assert not builder.is_alive()
        assert not alive(child)
        assert not (store.root / "building").exists()
        assert len(told) == 1 and isinstance(told[0], edge.VectorStoreError), told
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_build_ends_when_the_process_that_asked_for_it_dies(root: Path) -> None:
    """A SIGKILL of the store's owner (no clean-up of its runs) ends the build's child too."""
    here = Path(__file__).resolve().parent
    script = f"""
import sys
sys.path[:0] = [{str(here.parent)!r}, {str(here)!r}]
import memfabric.vectors.edge as edge
from test_vector_index import DIMS, THRESHOLD_KB, points
edge._BUILD_CHILD = {_LONG_BUILD!r}
store = edge.EdgeVectorStore({str(root / "edge")!r}, indexing_threshold_kb=THRESHOLD_KB)
store.ensure_collections("bench-model", "1", DIMS)
store.upsert("semantic", points(50, 1))
store.build_index(["semantic"])
"""
    owner = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    child = 0
    try:
        (child,) = wait_for(lambda: long_builds(owner.pid), timeout=60)
        owner.kill()
        owner.wait()
        wait_for(lambda: not alive(child), timeout=10)
    finally:
        owner.kill()
        owner.wait()
        if child and alive(child):
            os.kill(child, signal.SIGKILL)


def test_reopening_finishes_a_half_done_swap(root: Path) -> None:
    path = root / "edge"
    store = EdgeVectorStore(path)
    store.ensure_collections("bench-model", "1", DIMS)
    store.upsert("semantic", points(30, 1))
    physical = store.contracts()["semantic"].physical_name
    store.close()
    live = path / "shards" / physical
    # crashed after the live shard was moved aside, before the copy took its place
    os.rename(live, live.with_name(live.name + ".old"))
    (path / "building" / physical).mkdir(parents=True)
    store = EdgeVectorStore(path)
    store.ensure_collections("bench-model", "1", DIMS)
    assert store.count("semantic") == 30
    assert not (path / "building").exists()
    store.close()
    # crashed after the copy took its place, before the old one was removed
    shutil.copytree(live, live.with_name(live.name + ".old"))
    store = EdgeVectorStore(path)
    store.ensure_collections("bench-model", "1", DIMS)
    assert store.count("semantic") == 30
    assert not live.with_name(live.name + ".old").exists()
    store.close()


def test_index_settings_parse_and_refuse_bad_values() -> None:
    default = Settings.from_env({})
    assert default.vector_index_after == 20_000
    assert default.vector_index_seconds == 60
    s = Settings.from_env(
        {"MEMFABRIC_VECTOR_INDEX_AFTER": "0", "MEMFABRIC_VECTOR_INDEX_SECONDS": "5"}
    )
    assert (s.vector_index_after, s.vector_index_seconds) == (0, 5)
    for name, value in [
        ("MEMFABRIC_VECTOR_INDEX_AFTER", "many"),
        ("MEMFABRIC_VECTOR_INDEX_AFTER", "-1"),
        ("MEMFABRIC_VECTOR_INDEX_SECONDS", "0"),
        ("MEMFABRIC_VECTOR_INDEX_SECONDS", "soon"),
    ]:
        with pytest.raises(Misconfigured, match=name):
            Settings.from_env({name: value})


def cli_env(root: Path) -> dict[str, str | None]:
    return {
        "MEMFABRIC_VECTOR_DIR": str(root / "edge"),
        "MEMFABRIC_SOCKET": str(root / "no.sock"),
        "QDRANT_URL": None,
    }


@pytest.mark.slow  # an HNSW build in a child process: 2-5 s
def test_cli_status_and_build_index_on_the_embedded_shards(root: Path) -> None:
    import json

    from typer.testing import CliRunner

    from memfabric.cli import app

    s = EdgeVectorStore(root / "edge", indexing_threshold_kb=THRESHOLD_KB)
    s.ensure_collections("bench-model", "1", DIMS)
    s.upsert("semantic", points(BUILT, 1))
    s.close()
    runner = CliRunner()
    status = runner.invoke(app, ["vectors", "status"], env=cli_env(root))
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["semantic"]["indexed"] == 0
    built = runner.invoke(app, ["vectors", "build-index", "--tier", "semantic"], env=cli_env(root))
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout)["semantic"]["result"] == "built"
    status = runner.invoke(app, ["vectors", "status"], env=cli_env(root))
    assert json.loads(status.stdout)["semantic"]["indexed"] == BUILT
    on_server = runner.invoke(
        app, ["vectors", "status"], env={**cli_env(root), "QDRANT_URL": "http://127.0.0.1:1"}
    )
    assert on_server.exit_code != 0
    assert "builds its indexes itself" in on_server.output


@pytest.mark.slow  # an HNSW build in a child process: 2-5 s
def test_the_serve_socket_builds_without_its_lock(root: Path) -> None:
    """build_index through the broker socket runs while the serve lock is held elsewhere
    (the projector applying a batch): only the store's own mutex is taken."""
    from memfabric.broker import LocalBroker, RemoteBroker, serve_socket

    store = EdgeVectorStore(root / "edge", indexing_threshold_kb=THRESHOLD_KB)
    store.ensure_collections("bench-model", "1", DIMS)
    store.upsert("semantic", points(BUILT, 1))
    lock = threading.Lock()
    broker = LocalBroker(
        store,
        None,  # type: ignore[arg-type]  # no search is asked
        {"build_index": lambda tiers=None: store.build_index(tiers)},
    )
    path = root / "serve.sock"
    server = serve_socket(broker, path, lock)
    try:
        with lock:  # held as the projector holds it while it applies
            result = RemoteBroker(path, timeout=120).run("build_index", tiers=["semantic"])
        assert result["semantic"]["result"] == "built"
    finally:
        server.shutdown()
        server.server_close()
        store.close()


# The catch-up of the swap: the writes made during the build are replayed on the built copy
# in rounds outside the lock, the last small delta under it. These tests stand the engine's
# build in for a child that optimizes nothing (the swap, not the HNSW build, is under test).
_NO_BUILD_CHILD = "import json; print(json.dumps({'optimized': True}))"


def ids(ps: list[VectorPoint]) -> list[str]:
    return [p.payload.memory_id for p in ps]


def moved(p: VectorPoint, subject: str) -> VectorPoint:
    return VectorPoint(replace(p.payload, subject_ref=subject), p.vector)


def snapshot(s: EdgeVectorStore) -> dict[str, dict[str, Any]]:
    return dict(s.scroll("semantic"))


class Rounds:
    """Stands in for `_replay`: records every op replayed on the built copy and runs the
    writes given for a call number (1-based) first, while the journal is still kept (the
    catch-up rounds run outside the lock; the last, locked round pops the journal)."""

    def __init__(
        self, store: EdgeVectorStore, writes: dict[int, Any], fail_at: int | None = None
    ) -> None:
        import memfabric.vectors.edge as edge

        self.store, self.writes, self.fail_at = store, writes, fail_at
        self.real = edge._replay
        self.ops: list[Any] = []
        self.unlocked_calls: list[int] = []

    def __call__(self, shard: Any, op: Any) -> None:
        self.ops.append(op)
        n = len(self.ops)
        if self.store._journals:
            self.unlocked_calls.append(n)
            if n in self.writes:
                self.writes.pop(n)(self.store)
        if n == self.fail_at:
            raise RuntimeError("replay gave up")
        self.real(shard, op)


def test_writes_during_each_catch_up_round_reach_the_swapped_shard_once(
    store: EdgeVectorStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memfabric.vectors.edge as edge

    first, a, b, c = points(300, 1), points(10, 11), points(10, 12), points(10, 13)
    store.upsert("semantic", first)
    store.catch_up_bound = 1
    monkeypatch.setattr(edge, "_BUILD_CHILD", _NO_BUILD_CHILD)
    during_build = [
        lambda s: s.upsert("semantic", a),
        lambda s: s.delete("semantic", ids(first[:5])),
        lambda s: s.set_payload(
            "semantic", ids(first[5:10]), {"consolidation_state": "superseded"}
        ),
    ]
    # made during round 1 (3 ops replayed: calls 1-3), round 2 (calls 4-5), round 3 (6-8);
    # the same points written again in later rounds: their order must hold
    round_writes = [
        [lambda s: s.upsert("semantic", b), lambda s: s.delete("semantic", ids(a[:3]))],
        [
            lambda s: s.delete("semantic", ids(b[:2])),
            lambda s: s.upsert("semantic", [moved(a[0], "user-4")]),
            lambda s: s.set_payload("semantic", ids(first[7:12]), {"consolidation_state": "raw"}),
        ],
        [lambda s: s.upsert("semantic", [*c[:5], moved(b[5], "user-0")])],
    ]
    # the same writes in the same order on a store that builds nothing: what the swap must give
    reference = EdgeVectorStore(root / "reference")
    reference.ensure_collections("bench-model", "1", DIMS)
    reference.upsert("semantic", first)
    for write in during_build + [w for ws in round_writes for w in ws]:
        write(reference)
    expected = snapshot(reference)
    reference.close()

    real_run = edge._start_build

    def run(*args: Any, **kwargs: Any) -> Any:
        for write in during_build:
            write(store)
        return real_run(*args, **kwargs)

    def each(ws: list[Any]) -> Any:
        return lambda s: [w(s) for w in ws]

    rounds = Rounds(
        store, {1: each(round_writes[0]), 4: each(round_writes[1]), 6: each(round_writes[2])}
    )
    monkeypatch.setattr(edge, "_start_build", run)
    monkeypatch.setattr(edge, "_replay", rounds)
    result = store.build_index()["semantic"]
    assert result["result"] == "built", result
    assert not rounds.writes, "a round's writes were not made"
    assert (result["catch_up_rounds"], result["replayed"], result["replayed_locked"]) == (3, 9, 1)
    assert rounds.unlocked_calls == list(range(1, 9))  # only the last write under the lock
    # each write made during the build or a round replayed once
    assert len(rounds.ops) == 9 and len({id(op) for op in rounds.ops}) == 9
    assert snapshot(store) == expected
    assert store.count("semantic") == 300 - 5 + 10 - 3 + 10 - 2 + 1 + 5  # a[0] came back
    assert store._journals == {} and not (store.root / "building").exists()


def test_the_round_limit_bounds_the_catch_up(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes that keep outpacing the bound: after `catch_up_rounds` rounds the rest is
    replayed under the lock, every write still once."""
    import memfabric.vectors.edge as edge

    store.upsert("semantic", points(300, 1))
    store.catch_up_bound, store.catch_up_rounds = 1, 3
    monkeypatch.setattr(edge, "_BUILD_CHILD", _NO_BUILD_CHILD)
    late = [points(4, 20 + k) for k in range(4)]
    real_run = edge._start_build

    def run(*args: Any, **kwargs: Any) -> Any:
        store.upsert("semantic", late[0][:2])
        store.upsert("semantic", late[0][2:])
        return real_run(*args, **kwargs)

    def two_writes(ps: list[VectorPoint]) -> Any:
        return lambda s: (s.upsert("semantic", ps[:2]), s.upsert("semantic", ps[2:]))

    # 2 ops per round: calls 1-2, 3-4, 5-6, then the limit: 2 ops under the lock
    rounds = Rounds(store, {1: two_writes(late[1]), 3: two_writes(late[2]), 5: two_writes(late[3])})
    monkeypatch.setattr(edge, "_start_build", run)
    monkeypatch.setattr(edge, "_replay", rounds)
    result = store.build_index()["semantic"]
    assert (result["catch_up_rounds"], result["replayed"], result["replayed_locked"]) == (3, 8, 2)
    assert rounds.unlocked_calls == list(range(1, 7))
    assert len({id(op) for op in rounds.ops}) == len(rounds.ops) == 8
    assert store.count("semantic") == 300 + 16
    assert {i for ps in late for i in ids(ps)} <= {i for i, _ in store.scroll("semantic")}


def test_writes_from_another_thread_throughout_the_build_all_land(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer thread never stops while the build, its catch-up rounds and the swap run."""
    import memfabric.vectors.edge as edge

    store.upsert("semantic", points(BUILT, 1))
    monkeypatch.setattr(edge, "_BUILD_CHILD", _NO_BUILD_CHILD)
    store.catch_up_bound = 2
    written: list[str] = []
    deleted: list[str] = []
    stop, copied, started = threading.Event(), threading.Event(), threading.Event()

    def writer() -> None:
        k = after_copy = 0
        while not stop.is_set():
            batch = points(3, 100 + k)
            store.upsert("semantic", batch)
            written.extend(ids(batch))
            if k % 5 == 4:  # delete one point of an earlier batch
                store.delete("semantic", [written[-10]])
                deleted.append(written[-10])
            k += 1
            after_copy += copied.is_set()
            if after_copy == 20:  # 20 writes journalled at least
                started.set()
            stop.wait(0.001)  # leave the builder the interpreter now and then

    real_run = edge._start_build

    def run(*args: Any, **kwargs: Any) -> Any:
        copied.set()  # the journal is kept from here on
        assert started.wait(60)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(edge, "_start_build", run)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        result = store.build_index()["semantic"]
    finally:
        stop.set()
        thread.join(60)
    assert result["result"] == "built", result
    assert result["replayed"] >= 20, result
    assert result["replayed_locked"] <= 2 or result["catch_up_rounds"] == store.catch_up_rounds
    kept = {i for i, _ in store.scroll("semantic")}
    assert len(written) == len(set(written))
    assert kept == {i for i in ids(points(BUILT, 1))} | set(written) - set(deleted)


def test_a_failure_in_a_catch_up_round_leaves_the_live_shard_serving(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memfabric.vectors.edge as edge

    first, a, b = points(300, 1), points(10, 11), points(10, 12)
    store.upsert("semantic", first)
    store.catch_up_bound = 0
    monkeypatch.setattr(edge, "_BUILD_CHILD", _NO_BUILD_CHILD)
    real_run = edge._start_build

    def run(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(edge, "_start_build", real_run)  # in the first build only
        store.upsert("semantic", a)
        return real_run(*args, **kwargs)

    # round 1 replays the write made during the build and gets one more; round 2 fails
    rounds = Rounds(
        store, {1: lambda s: s.delete("semantic", ids(first[:5]) + ids(a[:2]))}, fail_at=2
    )
    monkeypatch.setattr(edge, "_start_build", run)
    monkeypatch.setattr(edge, "_replay", rounds)
    with pytest.raises(RuntimeError, match="replay gave up"):
        store.build_index()
    assert rounds.unlocked_calls == [1, 2]  # it failed outside the lock
    assert store._journals == {} and not (store.root / "building").exists()
    assert store.index_status()["semantic"]["building"] is False
    assert store.count("semantic") == 300 + 10 - 7
    store.upsert("semantic", b)  # writes go on, nothing is journalled any more
    assert store._journals == {}
    kept = {i for i, _ in store.scroll("semantic")}
    assert kept == set(ids(first[5:]) + ids(a[2:]) + ids(b))
    assert store.search(["semantic"], queries(1)[0], flt(), 5)
    monkeypatch.setattr(edge, "_replay", rounds.real)  # the next build goes through
    assert store.build_index()["semantic"]["result"] == "built"
    assert {i for i, _ in store.scroll("semantic")} == kept


def test_a_wipe_during_a_catch_up_round_discards_the_build(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memfabric.vectors.edge as edge

    store.upsert("semantic", points(300, 1))
    monkeypatch.setattr(edge, "_BUILD_CHILD", _NO_BUILD_CHILD)
    real_run = edge._start_build

    def run(*args: Any, **kwargs: Any) -> Any:
        store.upsert("semantic", points(3, 2))
        return real_run(*args, **kwargs)

    def wipe(s: EdgeVectorStore) -> None:
        s.wipe()  # the rebuild of a projection drops the shard meanwhile
        s.upsert("semantic", points(7, 4))

    monkeypatch.setattr(edge, "_start_build", run)
    monkeypatch.setattr(edge, "_replay", Rounds(store, {1: wipe}))
    assert store.build_index()["semantic"]["result"] == "discarded"
    assert store.count("semantic") == 7
    assert store._journals == {} and not (store.root / "building").exists()
