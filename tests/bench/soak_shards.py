"""Soak of supervised child shards: a serve-like process (one Edge store with its shards in
child processes, the serial projector (--pipelined: the pipelined one) with its flush
cadence, recall through a broker over the same store) under governed writes and recalls for
--seconds, while a random shard child is killed with SIGKILL every --kill-every seconds.

Prints, never asserts (docs/benchmarks.md, "Child shards supervised"): kills, restarts, the
projector's rewinds (`WritesLost` from a flush: it drains again from its cursor), recalls
and the errors they raised (and how many fell within --window seconds of a kill, the
documented restart window), and at the end, after the projector has caught up, the records
committed during the soak against the shards' points (missing, orphans). Exit status 1 if
they disagree or a recall raised outside the window.

Tenant benchp of bench_projection (its logins, tenant and agents, made idempotently); the
projector is kept to that tenant and starts after everything committed before, so the
shards (a fresh directory) must hold exactly what the soak wrote. The projection cursors are
global: no other projector may run on --url, and they are put back as found.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench_projection import (
    AGENT,
    OPEN_RUN,
    QUERIES,
    TENANT,
    TOOLS,
    BenchProjector,
    call,
    connect,
    semantic_request,
    set_cursors,
    setup,
    writer,
)

from memfabric import db
from memfabric.broker import LocalBroker
from memfabric.constants import INDEXED_TIERS
from memfabric.embedding import embedder_from_settings
from memfabric.recall import recall
from memfabric.vectors import EdgeVectorStore
from memfabric.vectors.shards import ProcessShard


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--url", default=None, help="the database (DATABASE_URL)")
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--kill-every", type=float, default=10.0, help="seconds between kills")
    ap.add_argument("--rate", type=float, default=20.0, help="governed writes a second")
    ap.add_argument("--recalls", type=float, default=5.0, help="recalls a second")
    ap.add_argument("--flush-ms", type=float, default=1000.0, help="the projector's cadence")
    ap.add_argument("--window", type=float, default=5.0, help="the restart window (s)")
    ap.add_argument("--embedder", default="minilm-static", help="minilm or minilm-static")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pipelined", action="store_true", help="the pipelined projector")
    args = ap.parse_args()
    url = args.url or db.database_url()
    rng = random.Random(args.seed)
    emb = embedder_from_settings(args.embedder)
    emb.embed(["warm up"])
    saved = setup(url)
    tmp = Path(tempfile.mkdtemp(prefix="soak-shards-", dir="/dev/shm"))
    store = EdgeVectorStore(tmp / "edge", shard_processes=True)
    store.ensure_collections(emb.model, emb.version, emb.dims)
    guard = threading.Lock()
    rewinds: list[str] = []  # the projector's pauses: a flush's WritesLost, a lost shard

    def progress(line: str) -> None:
        if "paused" in line:
            rewinds.append(line)

    p = BenchProjector(db.url_for(url, "benchp_projector"), emb, store, None, guard=guard,
                       progress=progress, flush_seconds=args.flush_ms / 1000)  # fmt: skip
    broker = LocalBroker(store, emb, {})
    with connect(url, "benchp_orchestrator") as orch:
        run_id = call(orch, OPEN_RUN, TENANT, AGENT, "user-w", "sess-w", TOOLS)
    set_cursors(p)  # after everything committed so far: the shards hold only the soak's
    stop, writing = threading.Event(), threading.Event()
    written: list[str] = []
    kills: list[float] = []
    recalls: list[tuple[float, float, str | None]] = []  # (start, seconds, error)
    failures: list[BaseException] = []

    def projector() -> None:
        try:
            run = p.run_pipelined if args.pipelined else p.run
            run(("qdrant",), poll_seconds=0.2, should_stop=stop.is_set)
        except BaseException as exc:
            failures.append(exc)

    def write_loop() -> None:
        write, start, i = writer(url, run_id), time.monotonic(), 0
        while not writing.is_set():
            written.extend(write())
            i += 1
            writing.wait(max(0.0, start + i / args.rate - time.monotonic()))

    def recall_loop() -> None:
        with connect(url, "benchp_agent") as conn:
            i, start = 0, time.monotonic()
            while not writing.is_set():
                mode = ("semantic", "hybrid")[i % 2]
                request = {**semantic_request(run_id, QUERIES[i % len(QUERIES)]), "mode": mode}
                t = time.monotonic()
                error = None
                try:
                    answer = recall(conn, request, broker)
                    if answer["status"] != "served":
                        error = f"status {answer['status']}"
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                recalls.append((t, time.monotonic() - t, error))
                i += 1
                writing.wait(max(0.0, start + i / args.recalls - time.monotonic()))

    def kill_loop() -> None:
        while not writing.wait(args.kill_every):
            shard = rng.choice(list(store._shards.values()))
            child = shard._child if isinstance(shard, ProcessShard) else None
            if child is None or child.poll() is not None:
                continue  # being restarted right now
            os.kill(child.pid, signal.SIGKILL)
            kills.append(time.monotonic())

    threads = [threading.Thread(target=f, name=f.__name__)
               for f in (projector, write_loop, recall_loop, kill_loop)]  # fmt: skip
    began = time.monotonic()
    load = [os.getloadavg()[0]]
    try:
        for t in threads:
            t.start()
        while time.monotonic() - began < args.seconds and not failures:
            time.sleep(min(10.0, args.seconds))
            load.append(os.getloadavg()[0])
        writing.set()
        for t in threads[1:]:
            t.join()
        # caught up: every record written is in the shards (or give up after 120 s)
        want = set(written)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not failures:
            with guard:
                held = {i for tier in INDEXED_TIERS for i, _ in store.scroll(tier)}
            if want <= held and p.flush_due("qdrant") is None:
                break
            time.sleep(0.5)
        stop.set()
        threads[0].join()
        held = {i for tier in INDEXED_TIERS for i, _ in store.scroll(tier)}
        restarts = sum(s.restarts for s in store._shards.values() if isinstance(s, ProcessShard))
    finally:
        writing.set()
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join()
        set_cursors(p, saved)
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    missing, orphans = sorted(want - held), sorted(held - want)
    errors = [(t, e) for t, _, e in recalls if e is not None]
    outside = [e for t, e in errors if not any(0 <= t - k <= args.window for k in kills)]
    served = [s for _, s, e in recalls if e is None]
    q = statistics.quantiles(served, n=100, method="inclusive") if len(served) > 1 else [0] * 99
    for _, e in errors[:5]:
        print(f"  recall error: {e}")
    kinds = [line.split("(", 1)[1].split(")", 1)[0] for line in rewinds if "(" in line]
    for kind in sorted(set(kinds)):
        print(f"  projector paused by {kind}: {kinds.count(kind)} times")
    for exc in failures:
        print(f"  projector failed: {type(exc).__name__}: {exc}")
    print(f"\n{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; nproc {os.cpu_count()}; "
          f"load average (1 min) {min(load):.1f}-{max(load):.1f}; {args.seconds:g} s, a kill "
          f"every {args.kill_every:g} s, {args.rate:g} writes/s, {args.recalls:g} recalls/s, "
          f"flush every {args.flush_ms:g} ms, {args.embedder}, "
          f"{'pipelined' if args.pipelined else 'serial'} projector")  # fmt: skip
    print(f"kills {len(kills)}, restarts {restarts}, projector rewinds {len(rewinds)}")
    print(f"written {len(written)}, in the shards {len(held)}: missing {len(missing)}, "
          f"orphans {len(orphans)}")  # fmt: skip
    print(f"recalls {len(recalls)}: errors {len(errors)} ({len(outside)} outside the "
          f"{args.window:g} s window); served p50 {q[49] * 1e3:.1f} ms, p95 {q[94] * 1e3:.1f} ms,"
          f" max {max(served, default=0) * 1e3:.1f} ms")  # fmt: skip
    ok = not missing and not orphans and not outside and not failures
    print("agree" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
