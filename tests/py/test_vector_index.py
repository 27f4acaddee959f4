"""The Edge vector index: `EdgeVectorStore.build_index` (a child process optimizes a copy of
the shard, the copy is swapped in with the writes it missed replayed) and `index_status`.

Real Qdrant Edge on /dev/shm when it exists; 3,000 points of 384 dimensions with an
indexing threshold of 1,000 KB, so the engine builds an HNSW index on a shard this small.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memfabric.errors import Misconfigured
from memfabric.settings import Settings
from memfabric.vectors import EdgeVectorStore, MemoryPayload, RecallFilter, VectorPoint

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
DIMS = 384
SUBJECTS = [f"user-{i}" for i in range(5)]
SHM = Path("/dev/shm")  # noqa: S108 (tmpfs: shards fsync a lot)


def points(n: int, seed: int) -> list[VectorPoint]:
    rng = np.random.default_rng(seed)
    vecs = rng.normal(size=(n, DIMS)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    out = []
    for i in range(n):
        payload = MemoryPayload(
            memory_id=str(uuid.UUID(int=(seed << 64) | i)),
            tenant_id="acme",
            tier="semantic",
            visibility="subject",
            subject_id=SUBJECTS[i % len(SUBJECTS)],
            content_hash="sha256:" + "ab" * 32,
            confidence=0.9,
            valid_from=T0,
            valid_until=None,
            consolidation_state="raw",
            retention_class="durable",
            compliance_labels=(),
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
def store(root: Path) -> Iterator[EdgeVectorStore]:
    s = EdgeVectorStore(root / "edge", indexing_threshold_kb=1000)
    s.ensure_collections("bench-model", "1", DIMS)
    yield s
    s.close()


def queries(n: int) -> list[list[float]]:
    rng = np.random.default_rng(99)
    q = rng.normal(size=(n, DIMS))
    return [list(map(float, x / np.linalg.norm(x))) for x in q]


@pytest.mark.slow  # an HNSW build over 3,000 points in a child process: 6-10 s
def test_a_fresh_shard_has_no_index_and_a_build_indexes_every_point(
    store: EdgeVectorStore,
) -> None:
    store.upsert("semantic", points(3000, 1))
    store.flush()
    before = store.index_status()["semantic"]
    assert (before["points"], before["indexed"], before["building"]) == (3000, 0, False)
    exact_before = [store.search(["semantic"], q, flt(), 10, exact=True) for q in queries(10)]

    result = store.build_index(["semantic"])["semantic"]
    assert result["result"] == "built", result
    after = store.index_status()["semantic"]
    assert (after["points"], after["indexed"]) == (3000, 3000)
    # exact search reads the same vectors: identical answers after the swap
    assert [store.search(["semantic"], q, flt(), 10, exact=True) for q in queries(10)] == (
        exact_before
    )
    # approximate search through the index finds each query's true nearest point
    for q, exact in zip(queries(10), exact_before, strict=True):
        approx = store.search(["semantic"], q, flt(), 10)
        assert approx[0] == exact[0]
        assert len({i for i, _ in approx} & {i for i, _ in exact}) >= 8


@pytest.mark.slow  # an HNSW build over 3,000 points in a child process: 6-10 s
def test_a_second_build_without_new_points_is_skipped(store: EdgeVectorStore) -> None:
    store.upsert("semantic", points(3000, 1))
    assert store.build_index()["semantic"]["result"] == "built"
    assert store.build_index()["semantic"]["result"] == "skipped"
    store.upsert("semantic", points(10, 2))
    # below the threshold asked for: nothing is copied
    assert store.build_index(min_unindexed=100)["semantic"]["result"] == "skipped"
    assert store.build_index(["episodic"])["episodic"]["result"] == "skipped"  # empty


@pytest.mark.slow  # an HNSW build over 3,000 points in a child process: 6-10 s
def test_writes_during_the_build_are_replayed_on_the_built_copy(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = points(3000, 1)
    store.upsert("semantic", first)
    late = points(50, 3)
    doomed = [p.payload.memory_id for p in first[:20]]
    superseded = [p.payload.memory_id for p in first[20:40]]
    started, go_on = threading.Event(), threading.Event()
    import memfabric.vectors.edge as edge

    real_run = edge.subprocess.run

    def run(*args: Any, **kwargs: Any) -> Any:
        started.set()  # the copy is taken; hold the child until the writes are in
        assert go_on.wait(60)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(edge.subprocess, "run", run)
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
    assert store.count("semantic") == 3000 + 50 - 20
    kept = {i for i, _ in store.scroll("semantic")}
    assert not kept & set(doomed)
    assert {p.payload.memory_id for p in late} <= kept
    live = {
        i
        for s in SUBJECTS
        for i, _ in store.search(["semantic"], queries(1)[0], flt(s), 5000, exact=True)
    }
    assert not live & set(superseded)
    assert len(live) == 3000 + 50 - 40
    assert not (store.root / "building").exists()


@pytest.mark.slow  # an HNSW build over 3,000 points in a child process: 6-10 s
def test_a_wipe_during_the_build_discards_it(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.upsert("semantic", points(3000, 1))
    import memfabric.vectors.edge as edge

    real_run = edge.subprocess.run

    def run(*args: Any, **kwargs: Any) -> Any:
        store.wipe()  # the rebuild of a projection drops the shard meanwhile
        store.upsert("semantic", points(7, 4))
        return real_run(*args, **kwargs)

    monkeypatch.setattr(edge.subprocess, "run", run)
    assert store.build_index()["semantic"]["result"] == "discarded"
    assert store.count("semantic") == 7
    assert store.index_status()["semantic"]["indexed"] == 0


def test_a_failed_build_leaves_the_live_shard_as_it_was(
    store: EdgeVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.upsert("semantic", points(3000, 1))
    import memfabric.vectors.edge as edge

    monkeypatch.setattr(edge, "_BUILD_CHILD", "import sys; sys.exit('engine gave up')")
    with pytest.raises(edge.VectorStoreError, match="engine gave up"):
        store.build_index()
    assert store.count("semantic") == 3000
    store.upsert("semantic", points(5, 5))  # nothing is journalled any more, writes go on
    assert store.count("semantic") == 3005
    assert not (store.root / "building").exists()


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


@pytest.mark.slow  # an HNSW build over 3,000 points in a child process: 6-10 s
def test_cli_status_and_build_index_on_the_embedded_shards(root: Path) -> None:
    import json

    from typer.testing import CliRunner

    from memfabric.cli import app

    s = EdgeVectorStore(root / "edge", indexing_threshold_kb=1000)
    s.ensure_collections("bench-model", "1", DIMS)
    s.upsert("semantic", points(3000, 1))
    s.close()
    runner = CliRunner()
    status = runner.invoke(app, ["vectors", "status"], env=cli_env(root))
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["semantic"]["indexed"] == 0
    built = runner.invoke(app, ["vectors", "build-index", "--tier", "semantic"], env=cli_env(root))
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout)["semantic"]["result"] == "built"
    status = runner.invoke(app, ["vectors", "status"], env=cli_env(root))
    assert json.loads(status.stdout)["semantic"]["indexed"] == 3000
    on_server = runner.invoke(
        app, ["vectors", "status"], env={**cli_env(root), "QDRANT_URL": "http://127.0.0.1:1"}
    )
    assert on_server.exit_code != 0
    assert "builds its indexes itself" in on_server.output


@pytest.mark.slow  # an HNSW build over 3,000 points in a child process: 6-10 s
def test_the_serve_socket_builds_without_its_lock(root: Path) -> None:
    """build_index through the broker socket runs while the serve lock is held elsewhere
    (the projector applying a batch): only the store's own mutex is taken."""
    from memfabric.broker import LocalBroker, RemoteBroker, serve_socket

    store = EdgeVectorStore(root / "edge", indexing_threshold_kb=1000)
    store.ensure_collections("bench-model", "1", DIMS)
    store.upsert("semantic", points(3000, 1))
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
