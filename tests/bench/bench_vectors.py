"""Vector store: Qdrant Edge against qdrant-client's local mode, same data, same filters.

Prints, never asserts (docs/benchmarks.md). Run: `.venv/bin/python tests/bench/bench_vectors.py`.

N points (default 20,000, 384 dims, random unit vectors) in one tier collection, spread
over 10 tenants; per tenant 20 % tenant-visible and 80 % over 50 subjects; confidence
uniform; 10 % labelled `pii`. Queries are full recall filters (tenant, scope keys, live
states, valid at now, confidence >= 0.5, `pii` excluded), limit 10:

- narrow: one subject's key plus 'tenant' (about 2 % of the collection qualifies);
- broad: all 50 subject keys of one tenant plus 'tenant' (about 10 %).

Edge data lives in a temporary directory on disk unless --dir says otherwise; payload
indexes on every filter field; `optimize()` is never called. Local mode is brute force
in Python and ignores payload indexes (measured here), so it gets fewer queries.

`--index --writes-during-build RATE`: the index is built while one thread upserts RATE points
a second and another searches without pause; the latencies they saw (the swap's pause is
their max) and what the swap replayed are printed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from memfabric.vectors import (
    EdgeVectorStore,
    MemoryPayload,
    QdrantServerStore,
    RecallFilter,
    VectorPoint,
    VectorStore,
)

TENANTS = [f"tenant-{i}" for i in range(10)]
SUBJECTS = [f"user-{i}" for i in range(50)]
NOW = datetime(2025, 6, 1, tzinfo=UTC)


def make_points(n: int, dims: int, seed: int) -> list[VectorPoint]:
    rng = np.random.default_rng(seed)
    vecs = rng.normal(size=(n, dims)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    points = []
    for i in range(n):
        tenant_scoped = rng.random() < 0.2
        payload = MemoryPayload(
            memory_id=str(uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | i)),
            tenant_id=TENANTS[i % len(TENANTS)],
            tier="semantic",
            visibility="tenant" if tenant_scoped else "subject",
            subject_ref=None if tenant_scoped else SUBJECTS[int(rng.integers(len(SUBJECTS)))],
            content_hash="sha256:" + "0" * 64,
            confidence=float(rng.random()),
            valid_from=NOW - timedelta(days=int(rng.integers(1, 400))),
            valid_until=None if rng.random() < 0.8 else NOW + timedelta(days=30),
            consolidation_state="raw",
            retention_class="durable",
            compliance_labels=("pii",) if rng.random() < 0.1 else (),
        )
        points.append(VectorPoint(payload, vecs[i]))
    return points


def recall_filter(tenant: str, keys: list[str]) -> RecallFilter:
    return RecallFilter(tenant, keys, NOW, min_confidence=0.5, excluded_labels=["pii"])


def queries(n: int, dims: int, seed: int) -> list[tuple[list[float], RecallFilter, RecallFilter]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        q = rng.normal(size=dims)
        tenant = TENANTS[i % len(TENANTS)]
        subject = SUBJECTS[int(rng.integers(len(SUBJECTS)))]
        narrow = recall_filter(tenant, [f"subject:{subject}", "tenant"])
        broad = recall_filter(tenant, [f"subject:{s}" for s in SUBJECTS] + ["tenant"])
        out.append(((q / np.linalg.norm(q)).tolist(), narrow, broad))
    return out


def pct(samples: list[float], p: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(p * len(samples)))]


def build_under_load(
    store: EdgeVectorStore,
    qs: list[tuple[list[float], RecallFilter, RecallFilter]],
    dims: int,
    rate: int,
) -> dict[str, dict[str, object]]:
    """`build_index` while one thread upserts `rate` points a second (one write each) and
    another searches (narrow filters) without pause; prints the latencies both saw."""
    pool = make_points(5000, dims, seed=3)
    stop = threading.Event()
    search_ms: list[float] = []
    write_ms: list[float] = []

    def searcher() -> None:
        i = 0
        while not stop.is_set():
            vec, narrow, _ = qs[i % len(qs)]
            t = time.perf_counter()
            store.search(["semantic"], vec, narrow, 10)
            search_ms.append((time.perf_counter() - t) * 1000)
            i += 1

    def writer() -> None:
        start = time.perf_counter()
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            store.upsert("semantic", [pool[i % len(pool)]])
            write_ms.append((time.perf_counter() - t) * 1000)
            i += 1
            stop.wait(max(0.0, start + i / rate - time.perf_counter()))

    threads = [threading.Thread(target=searcher), threading.Thread(target=writer)]
    for th in threads:
        th.start()
    try:
        built = store.build_index()
    finally:
        stop.set()
        for th in threads:
            th.join()
    for what, lat in (("searches", search_ms), ("writes", write_ms)):
        print(
            f"  {what} during the build: {len(lat)}, p50 {statistics.median(lat):7.2f} ms"
            f"  p99 {pct(lat, 0.99):7.2f} ms  max {max(lat):8.1f} ms"
        )
    return built


def run(
    name: str,
    open_store: Callable[[], VectorStore],
    points: list[VectorPoint],
    qs: list[tuple[list[float], RecallFilter, RecallFilter]],
    dims: int,
    exact_too: bool,
    reopen: bool,
    build: bool = False,
    writes_during_build: int = 0,
) -> None:
    t = time.perf_counter()
    store = open_store()
    store.ensure_collections("bench-model", "1", dims)
    ensure_s = time.perf_counter() - t

    t = time.perf_counter()
    for start in range(0, len(points), 1000):
        store.upsert("semantic", points[start : start + 1000])
    store.flush()
    upsert_s = time.perf_counter() - t

    print(f"\n{name}: {len(points)} points x {dims} dims")
    print(f"  ensure_collections (4 collections, 20 payload indexes each): {ensure_s:7.2f} s")
    print(f"  upsert + flush: {upsert_s:7.2f} s = {len(points) / upsert_s:9.0f} points/s")
    modes: list[bool | str] = [False, True] if exact_too else [False]
    if build and isinstance(store, EdgeVectorStore):
        modes.append("index")
    for exact in modes:
        if exact == "index":
            assert isinstance(store, EdgeVectorStore)
            t = time.perf_counter()
            if writes_during_build:
                built = build_under_load(store, qs, dims, writes_during_build)
            else:
                built = store.build_index()
            print(f"  build_index (child process on a copy): {time.perf_counter() - t:7.1f} s")
            for tier, r in built.items():
                if r["result"] == "built":
                    print(f"    {tier}: {r}")
        for shape in ("narrow", "broad"):
            lat = []
            found = 0
            for vec, narrow, broad in qs:
                rfilter = narrow if shape == "narrow" else broad
                t = time.perf_counter()
                hits = store.search(["semantic"], vec, rfilter, 10, exact=exact is True)
                lat.append((time.perf_counter() - t) * 1000)
                found += len(hits)
            mode = {True: "exact ", False: "approx", "index": "HNSW  "}[exact]
            print(
                f"  query {shape:6} {mode}: p50 {statistics.median(lat):8.2f} ms"
                f"  p95 {pct(lat, 0.95):8.2f} ms  ({len(lat)} queries, {found / len(lat):.1f} hits)"
            )
    if reopen:
        store.close()
        t = time.perf_counter()
        store = open_store()
        n = store.count("semantic")
        print(f"  close + reopen + count ({n}): {time.perf_counter() - t:7.2f} s")
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=20_000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--edge-queries", type=int, default=200)
    ap.add_argument("--local-queries", type=int, default=20)
    ap.add_argument("--dir", type=Path, default=None, help="parent directory for Edge data")
    ap.add_argument("--skip-local", action="store_true")
    ap.add_argument("--index", action="store_true", help="then build the HNSW index, query again")
    ap.add_argument(
        "--writes-during-build",
        type=int,
        default=0,
        metavar="RATE",
        help="with --index: upsert RATE points/s and search without pause while it builds",
    )
    args = ap.parse_args()

    points = make_points(args.points, args.dims, seed=1)
    work = Path(tempfile.mkdtemp(prefix="mf-bench-vectors-", dir=args.dir))
    try:
        qs = queries(args.edge_queries, args.dims, seed=2)
        run(
            "Qdrant Edge",
            lambda: EdgeVectorStore(work / "edge"),
            points,
            qs,
            args.dims,
            True,
            True,
            args.index,
            args.writes_during_build,
        )
        if not args.skip_local:
            warnings.simplefilter("ignore")
            qs = queries(args.local_queries, args.dims, seed=2)
            run(
                "qdrant-client local (:memory:)",
                lambda: QdrantServerStore(location=":memory:"),
                points,
                qs,
                args.dims,
                False,
                False,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
