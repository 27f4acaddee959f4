"""Semantic and hybrid recall end to end, two versions of the code side by side on the same data.

Prints, never asserts (docs/benchmarks.md, "Semantic and hybrid recall at 100,000 records").
The data is bench_projection's phase 4 (tenant benchb: --records bulk-loaded as the superuser
with random unit vectors as embeddings; its Postgres rows stay for the next run), loaded into
two databases of one server: --url (this checkout's schema, `memfabric db migrate`) and
--base-url (the schema of the code compared against, migrated from that checkout). The Edge
shards are rebuilt from --url into --dir and, with --index, get their HNSW index; they stay
there (a marker file names the records they hold), so a later run reuses them and the build
(minutes at 100,000 records) is paid once. Each question is asked as the agent of a random
subject (tiers episodic + semantic, limit 10, min_confidence 0.3, label pii excluded) four
ways, interleaved query by query with the order rotated: semantic and hybrid through this
checkout's `memfabric.recall.recall` on --url, and the same through the baseline's flow on
--base-url (resolution, then the query embedding and the Edge search, then the re-check: one
step after the other, as 0.4.0 does), each step of the baseline timed. The answers of both
sides are compared (the same records in the same order). Ratios new / base are the last lines.
The new side's steps are timed too (its broker wrapped: the embedding, which overlaps the
resolution, and the Edge search; "rest" is the calls and the re-check around them). With
--new-dir (a copy of --dir) the new side searches its own shards, opened as --new-shards
says (child: each shard in a child process, MEMFABRIC_EDGE_SHARDS=child). --writes R: while
the questions are asked, a thread does what the projector does for R new records a second:
embeds each one's text (the same MiniLM as the questions) and upserts it into every store
of the run (in another tenant, so no answer changes).
--base-flow new: the base side runs this checkout's flow too (`recall`, its shards --dir
inline), so with --new-dir and --new-shards child the ratios are child against inline
shards, all else equal (--base-url may then be --url).
--embedder KIND: the new side embeds its questions with that embedder (e5: its `query:`
prefix), the base side with MiniLM, on the same shards (their vectors are random, so the
search costs the same whichever model asked: the difference is the question's embedding);
with --base-flow new the two sides differ in nothing else (their answers differ: another
query vector).
--database-only measures the database's part alone (no broker, no embedding): text recall and
the re-check call of semantic and hybrid recall with the same 50 candidates on both sides.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from bench_projection import (
    AGENT,
    BULK,
    COMMITTER,
    LOGINS,
    QUERIES,
    SCOPE,
    SUBJECTS,
    TOOLS,
    BenchProjector,
    Counting,
    bulk_load,
    call,
    connect,
    open_runs,
    semantic_request,
)
from benchlib import create_logins
from psycopg.types.json import Jsonb

from memfabric import db
from memfabric.broker import LocalBroker, hits_as_candidates, recall_filter
from memfabric.call import fabric_call
from memfabric.constants import INDEXED_TIERS, RECALL_MAX_CANDIDATES
from memfabric.embedding import embedder_from_settings
from memfabric.recall import CANDIDATE_FACTOR, MIN_CANDIDATES, recall
from memfabric.vectors import EdgeVectorStore, MemoryPayload, VectorPoint

Json = dict[str, Any]
ORDER = ("new", "base", "new-h", "base-h")


def setup(url: str) -> None:
    """Logins (cluster-wide), the bench tenant and its agents (idempotent). No projector
    runs here, so unlike bench_projection the cursors are left alone."""
    with connect(url) as su:
        create_logins(su, LOGINS)
    with connect(url, "benchp_admin") as admin:
        register = "SELECT fabric_api.register_agent(%s, %s, %s, %s)"
        profile = Jsonb({"propose_scope": SCOPE, "recall_scope": SCOPE})
        call(admin, register, AGENT, "benchp_agent", profile, TOOLS)
        call(admin, register, COMMITTER, "benchp_committer", Jsonb({}), [])
        call(admin, "SELECT fabric_api.create_tenant(%s)", BULK)
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", BULK, AGENT, TOOLS)
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", BULK, COMMITTER, [])


def shards(url: str, where: Path, records: int, emb: Counting, index: bool,
           processes: bool = False) -> EdgeVectorStore:  # fmt: skip
    """The Edge shards of the bulk tenant in `where`, rebuilt (and indexed) once."""
    contract = hashlib.sha256(emb.version.encode()).hexdigest()[:8]  # shards of this version
    marker = where / f"built-{records}-{contract}{'-index' if index else ''}"
    store = EdgeVectorStore(where, shard_processes=processes)
    store.ensure_collections(emb.model, emb.version, emb.dims)
    if marker.exists():
        print(f"  reusing the shards in {where}", flush=True)
        return store
    t = time.perf_counter()
    pb = BenchProjector(db.url_for(url, "benchp_projector"), emb, store, None, tenant=BULK)
    n = pb.rebuild("qdrant")
    print(f"  rebuilt {n:,} records into Edge in {time.perf_counter() - t:.0f} s", flush=True)
    if index:
        t = time.perf_counter()
        built = store.build_index()
        print(f"  index built in {time.perf_counter() - t:.0f} s: "
              f"{ {k: v['result'] for k, v in built.items()} }", flush=True)  # fmt: skip
    store.flush()
    marker.touch()
    return store


class TimedBroker(LocalBroker):
    """The new side's broker, its embedding and search timed (seconds, per call)."""

    def __init__(self, store: Any, embedder: Any) -> None:
        super().__init__(store, embedder, {})
        self.times: dict[str, float] = {}

    def embed_query(self, query: str) -> list[float]:
        t = time.perf_counter()
        try:
            return super().embed_query(query)
        finally:
            self.times["embed"] = time.perf_counter() - t

    def search_vector(self, resolved: Json, vector: list[float], limit: int,
                      exact: bool = False) -> list[tuple[str, float]]:  # fmt: skip
        t = time.perf_counter()
        try:
            return super().search_vector(resolved, vector, limit, exact)
        finally:
            self.times["edge"] = time.perf_counter() - t


def writer(stores: Sequence[EdgeVectorStore], emb: Counting, rate: float,
           stop: threading.Event, done: list[int]) -> None:  # fmt: skip
    """R records a second, each embedded and upserted into every store (tenant benchw)."""
    start, i, now = time.perf_counter(), 0, datetime.now(UTC)
    while not stop.is_set():
        vector = emb.embed([f"{QUERIES[i % len(QUERIES)]} written {i}"])[0]
        payload = MemoryPayload(
            memory_id=str(uuid.uuid4()), tenant_id="benchw", tier=("episodic", "semantic")[i % 2],
            visibility="tenant", content_hash="sha256:" + "0" * 64, confidence=0.9,
            valid_from=now, consolidation_state="raw", retention_class="durable")  # fmt: skip
        for store in stores:
            store.upsert(payload.tier, [VectorPoint(payload, vector)])
        i += 1
        done[0] = i
        stop.wait(max(0.0, start + i / rate - time.perf_counter()))


def base_recall(conn: psycopg.Connection[Any], request: Json, broker: LocalBroker,
                steps: dict[str, list[float]]) -> Json:  # fmt: skip
    """The baseline's flow, one step after the other (resolution, embedding, Edge search,
    re-check), each step timed."""
    t0 = time.perf_counter()
    resolved: Json = fabric_call(conn, "fabric_api.recall", request)
    t1 = time.perf_counter()
    flt = resolved["filter"]
    limit = min(RECALL_MAX_CANDIDATES, max(MIN_CANDIDATES, int(flt["limit"]) * CANDIDATE_FACTOR))
    vector = broker.embedder.embed([request["query"]])[0]
    t2 = time.perf_counter()
    tiers = [t for t in flt["tiers"] if t in INDEXED_TIERS]
    hits = broker.store.search(tiers, vector, recall_filter(flt), limit)
    t3 = time.perf_counter()
    answer: Json = fabric_call(
        conn, "fabric_api.recall", {**request, "candidates": hits_as_candidates(hits)}
    )
    t4 = time.perf_counter()
    mode = request["mode"]
    for name, sec in (("resolve", t1 - t0), ("embed", t2 - t1), ("edge", t3 - t2),
                      ("recheck", t4 - t3)):  # fmt: skip
        steps[f"{mode} {name}"].append(sec)
    return answer


SCOPE_IDS = """SELECT memory_id::text FROM fabric.memory_records
 WHERE tenant_id = %s AND scope_key = ANY (%s) ORDER BY memory_id LIMIT 50"""


def database_phase(url: str, base_url: str, subjects: Sequence[str], runs: dict[str, Any]
                   ) -> tuple[dict[str, list[float]], int]:  # fmt: skip
    """The database's part alone, per query on each side: text recall, and the second call
    of semantic and of hybrid recall (the re-check, fusion and audit) with the same 50
    candidates (records of the subject's scope), interleaved; no broker, no embedding."""
    with connect(url) as su:
        ids = {s: su.execute(SCOPE_IDS, (BULK, [f"subject:{s}", "tenant"])).fetchall()
               for s in set(subjects)}  # fmt: skip
    out: dict[str, list[float]] = defaultdict(list)
    differ = 0
    with connect(url, "benchp_agent") as new, connect(base_url, "benchp_agent") as base:
        for k, subject in enumerate(subjects):
            cands = [{"memory_id": i, "score": 1 - n / 100} for n, (i,) in enumerate(ids[subject])]
            for mode in ("text", "semantic", "hybrid"):
                got = {}
                for side, conn in ((("new", new), ("base", base)) if k % 2 else
                                   (("base", base), ("new", new))):  # fmt: skip
                    request = {**semantic_request(runs[side][subject], QUERIES[k % len(QUERIES)]),
                               "mode": mode}  # fmt: skip
                    if mode != "text":
                        request["candidates"] = cands
                    t = time.perf_counter()
                    answer = fabric_call(conn, "fabric_api.recall", request)
                    if k >= 20:
                        out[f"{side} {mode}"].append(time.perf_counter() - t)
                    got[side] = [r["memory_id"] for r in answer["records"]]
                differ += got["new"] != got["base"]
    return out, differ


def ms(xs: Sequence[float]) -> str:
    return f"{pct(xs, 50) * 1e3:.1f} / {pct(xs, 95) * 1e3:.1f} ms"


def pct(xs: Sequence[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--url", default=None, help="this checkout's database (DATABASE_URL)")
    ap.add_argument("--base-url", required=True, help="the baseline's database, same server")
    ap.add_argument("--dir", required=True, help="Edge shards, kept and reused")
    ap.add_argument("--index", action="store_true", help="build the HNSW index once")
    ap.add_argument("--load-only", action="store_true", help="load and build, no queries")
    ap.add_argument("--database-only", action="store_true", help="no broker: the DB's part")
    ap.add_argument("--new-dir", default=None, help="the new side's own copy of --dir")
    ap.add_argument("--new-shards", choices=("inline", "child"), default="inline",
                    help="how the new side's shards (--new-dir) are opened")  # fmt: skip
    ap.add_argument("--writes", type=float, default=0.0, help="records/s written meanwhile")
    ap.add_argument("--base-flow", choices=("old", "new"), default="old",
                    help="base side: 0.4.0's flow, or this checkout's (recall)")  # fmt: skip
    ap.add_argument("--embedder", default="minilm", choices=("minilm", "minilm-static", "e5"),
                    help="the new side's question embedder (the base side: MiniLM)")  # fmt: skip
    args = ap.parse_args()
    url, emb = args.url or db.database_url(), Counting()
    emb.embed(["warm up"])
    for u in (url, args.base_url):
        setup(u)
        have, took = bulk_load(u, args.records, args.seed, emb.model, emb.version)
        print(f"  {have:,} records in {BULK} of {u.rsplit('/', 1)[-1]}"
              f" ({f'loaded in {took:.0f} s' if took else 'reused'})", flush=True)  # fmt: skip
    rng = np.random.default_rng(args.seed + 1)
    subjects = [f"user-{s}" for s in rng.integers(SUBJECTS, size=args.queries + 20)]
    if args.database_only:
        runs = {"new": open_runs(url, subjects), "base": open_runs(args.base_url, subjects)}
        load = os.getloadavg()[0]
        db_out, differ = database_phase(url, args.base_url, subjects, runs)
        print(f"\n{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load average (1 min) "
              f"{load:.1f} before, {os.getloadavg()[0]:.1f} after; {args.records:,} records; "
              f"{args.queries} queries; answers that differ: {differ}\n")  # fmt: skip
        print("| database part | base p50 / p95 | new p50 / p95 | new / base p50, p95 |")
        print("|---|---|---|---|")
        for mode in ("text", "semantic", "hybrid"):
            b, n = db_out[f"base {mode}"], db_out[f"new {mode}"]
            print(f"| {mode} | {ms(b)} | {ms(n)} | {pct(n, 50) / pct(b, 50):.2f}x, "
                  f"{pct(n, 95) / pct(b, 95):.2f}x |")  # fmt: skip
        return 0
    store = shards(url, Path(args.dir), args.records, emb, args.index)
    if args.load_only:
        store.close()
        return 0
    broker = LocalBroker(store, emb, {})
    new_store = store
    if args.new_dir:
        new_store = shards(url, Path(args.new_dir), args.records, emb, args.index,
                           processes=args.new_shards == "child")  # fmt: skip
    elif args.new_shards != "inline":
        ap.error("--new-shards child needs --new-dir (a shard directory has one opener)")
    asks = emb if args.embedder == "minilm" else embedder_from_settings(args.embedder)
    asks.embed(["warm up"])  # its model loaded outside the timing
    timed = TimedBroker(new_store, asks)
    runs = {"new": open_runs(url, subjects), "base": open_runs(args.base_url, subjects)}
    out: dict[str, list[float]] = {w: [] for w in ORDER}
    steps: dict[str, list[float]] = {
        f"{m} {s}": [] for m in ("semantic", "hybrid") for s in ("resolve", "embed", "edge",
                                                                  "recheck")}  # fmt: skip
    new_steps: dict[str, list[float]] = {
        f"{m} {s}": [] for m in ("semantic", "hybrid") for s in ("embed", "edge", "rest")
    }
    differ, load = 0, [os.getloadavg()[0]]
    stop, written = threading.Event(), [0]
    if args.writes > 0:
        targets = [store] if new_store is store else [store, new_store]
        wargs = (targets, emb, args.writes, stop, written)
        write_thread = threading.Thread(target=writer, args=wargs)
        write_thread.start()
        t_writes = time.perf_counter()
    with connect(url, "benchp_agent") as new, connect(args.base_url, "benchp_agent") as base:
        for k, subject in enumerate(subjects):
            text, took, ids = QUERIES[k % len(QUERIES)], {}, {}
            turn = ORDER[k % len(ORDER) :] + ORDER[: k % len(ORDER)]
            part: dict[str, list[float]] = {name: [] for name in steps}
            new_part: dict[str, list[float]] = {name: [] for name in new_steps}
            for what in turn:
                side, mode = what.split("-")[0], "hybrid" if what.endswith("-h") else "semantic"
                request = {**semantic_request(runs[side][subject], text), "mode": mode}
                t = time.perf_counter()
                if side == "new":
                    timed.times.clear()
                    answer = recall(new, request, timed)
                    whole = time.perf_counter() - t
                    new_part[f"{mode} embed"].append(timed.times["embed"])
                    new_part[f"{mode} edge"].append(timed.times["edge"])
                    new_part[f"{mode} rest"].append(whole - timed.times["edge"]
                                                    - timed.times["embed"])  # fmt: skip
                elif args.base_flow == "new":
                    answer = recall(base, request, broker)
                else:
                    answer = base_recall(base, request, broker, part)
                took[what] = time.perf_counter() - t
                assert answer["status"] == "served", answer
                ids[what] = [r["memory_id"] for r in answer["records"]]
            differ += (ids["new"] != ids["base"]) + (ids["new-h"] != ids["base-h"])
            if k >= 20:  # the first 20 warm plans and caches
                for what, sec in took.items():
                    out[what].append(sec)
                for name, secs in part.items():
                    steps[name] += secs
                for name, secs in new_part.items():
                    new_steps[name] += secs
            if k % 50 == 0:
                load.append(os.getloadavg()[0])
    if args.writes > 0:
        stop.set()
        write_thread.join()
        print(f"  {written[0]:,} records written meanwhile "
              f"({written[0] / (time.perf_counter() - t_writes):.1f}/s)")  # fmt: skip
    store.close()
    if new_store is not store:
        new_store.close()
    load.append(os.getloadavg()[0])
    n = len(out["new"])
    print(f"\n{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; nproc {os.cpu_count()}; "
          f"load average (1 min) during the run {min(load):.1f}-{max(load):.1f}; "
          f"{args.records:,} records; {n} queries after 20 warm-up; "
          f"index {args.index}; new side's shards: "
          f"{args.new_shards if args.new_dir else 'the same as base'}; "
          f"writes meanwhile {args.writes:g}/s; base flow {args.base_flow} "
          f"(its shards inline); questions embedded by {args.embedder} (new side), "
          f"minilm (base side)")  # fmt: skip
    print(f"answers that differ between the two sides (records or order): {differ} of "
          f"{2 * len(subjects)}\n")  # fmt: skip
    print("| measure | p50 / p95 |\n|---|---|")
    for name, secs in steps.items():
        if secs:  # not with --base-flow new
            print(f"| base {name} | {ms(secs)} |")
    for name, secs in new_steps.items():
        print(f"| new {name} | {ms(secs)} |")
    for mode, key in (("semantic", ""), ("hybrid", "-h")):
        print(f"| {mode} end to end, base | {ms(out['base' + key])} |")
        print(f"| {mode} end to end, new | {ms(out['new' + key])} |")
    for mode, key in (("semantic", ""), ("hybrid", "-h")):
        new_, base_ = out["new" + key], out["base" + key]
        print(f"{mode} new / base: {pct(new_, 50) / pct(base_, 50):.2f}x p50, "
              f"{pct(new_, 95) / pct(base_, 95):.2f}x p95")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
