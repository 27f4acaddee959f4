"""Projection lag, projector throughput, rebuild rates, semantic and hybrid recall at 100k.

Prints, never asserts (docs/benchmarks.md). Needs `make migrate` and `scripts/graph.sh up`.
1. Lag: one governed episodic write every 1/--rate s while `Projector.run()` (Edge in a temp
   dir, the local graph, real MiniLM) runs in a thread: the later of a record's two `apply`s
   minus its commit return. 2. One full drain of a --backlog, embedding included.
3. Rebuilds from stored embeddings (embed calls counted). 4. --records bulk-loaded as the
   superuser (triggers off, random unit vectors stored as embeddings, search text and the
   per-scope search statistics derived set-based as the triggers would), rebuilt into Edge
   and copied. The rebuilt shards get their HNSW index (`build_index`: a child process on a
   copy, swapped in) while semantic recall runs against them and --build_rate vector writes/s
   arrive; then `recall()` end to end in semantic and in hybrid mode (query embedding
   included) against the unindexed copy and the indexed shards, and the same filtered query
   straight to Edge, interleaved query by query. --only-recall runs phase 4 alone (no graph).
--rates 25,50,100 runs instead, for the vector projection alone (Edge and the embedder, the
bound; no graph server needed), each of --variants side by side: the serial projector
(`Projector.run`) and the pipelined one (`Projector.run_pipelined`), each with the embedder in
process or in a child process (`ProcessEmbedder`), and `serial+cadence` (the serial projector
flushing Edge at most every --flush-ms, `Projector.flush_seconds`; its lag is commit to
searchable, and commit to durable is printed too; `pipelined+cadence` the same for the
pipelined one): lag p50/p95 at each write rate (--seconds each; the governed writes come
from a child process, so the projector's threads cannot slow them down: --writers threads,
each writing --write-batch records a transaction, `propose_many` + `commit_many` when more
than one; one writer of single `propose` + `commit` reaches only 30-50 writes/s here), the
rate asked and reached, where the lag goes (commit to read, read to embedded, storing the
embeddings, Edge's upsert and flush), the embedder's share of the time and the CPU a record
costs in each process (PostgreSQL's is the whole server's: give the bench a server of its
own), then a full drain of a --backlog each; ratios to the first variant are the last lines.
Tenants benchp (writes) and benchb (bulk; rows stay, reused). The product's Projector is kept
to its tenant (other tenants' records and snapshot rows skipped, graph wipes per tenant); the
global projection cursors are put back as found, so no other projector may be connected.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from benchlib import SUBJECT_KEYS, call, create_logins
from pgvector.psycopg.vector import register_vector_info
from psycopg.types import TypeInfo
from psycopg.types.json import Jsonb

from memfabric import db
from memfabric.broker import LocalBroker
from memfabric.call import Cast, fabric_rows, register_vector
from memfabric.embedding import MiniLMEmbedder, embedder_from_settings
from memfabric.graph import graph_from_env
from memfabric.projector import Projector, projection_record
from memfabric.recall import CANDIDATE_FACTOR, MIN_CANDIDATES, recall
from memfabric.vectors import EdgeVectorStore, MemoryPayload, RecallFilter, VectorPoint

Conn, Row, Write = psycopg.Connection[Any], tuple[str, str, str], Callable[[], str]
OK = ("NOT met", "met")
TENANT, BULK, AGENT, COMMITTER = "benchp", "benchb", "benchp-agt-001", "benchp-agt-010"
TOOLS, TIERS = ["tool:memory-propose", "tool:memory-recall"], ["episodic", "semantic"]
SCOPE = {"tiers": TIERS, "visibility": ["subject", "tenant"]}
GROUPS = ("committer", "orchestrator", "admin", "projector")
LOGINS = {"benchp_agent": None, **{f"benchp_{g}": f"fabric_{g}" for g in GROUPS}}
ZERO, TOP = "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"
SUBJECTS, LIMIT = 2000, 10
ORDER = ("e2e", "hybrid", "embed+edge", "edge", "e2e+ix", "hybrid+ix", "edge+ix")
FILTERS = {"min_confidence": 0.3, "compliance_labels_excluded": ["pii"]}
TEXTS = """Customer asked to be invoiced in euros from next quarter|which currency do invoices use
The shipment to Rotterdam was delayed two days at customs|what happened to the shipment
User prefers short answers and replies in Dutch|how does the user like to be answered
Support ticket about a failed card payment was escalated|open payment problems
Agreed to a call on Thursday about the renewal terms|when is the renewal call
The billing entity changed to Acme Logistics BV|who is the billing entity"""
TOPICS, QUERIES = zip(*(line.split("|") for line in TEXTS.splitlines()), strict=True)
OPEN_RUN = "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, '6 hours'::interval)"
SET_CURSOR = "SELECT fabric_api.set_projection_cursor(%s, %s::xid8, %s::uuid, true)"
BULK_COPY = """COPY fabric.memory_records (tenant_id, memory_id, tier, visibility, subject_id,
  session_id, agent_id, content, content_hash, source_event_id, formed_by, formation_method,
  confidence, valid_from, valid_until, consolidation_state, retention_class, compliance_labels,
  search_length) FROM STDIN"""
EMBEDDINGS = """COPY fabric.memory_embeddings (tenant_id, memory_id, model, model_version, dims,
  embedding, content_hash) FROM STDIN (FORMAT BINARY)"""
OTHER_PROJECTORS = """SELECT DISTINCT usename FROM pg_stat_activity
  WHERE usename <> 'benchp_projector' AND pg_has_role(usename, 'fabric_projector', 'MEMBER')
  AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = usename)"""
# The fixture shortcut skips the triggers: derive the search text and fold the statistics
# the way they would have (the same functions), for the bulk tenant only.
SEARCH_TEXT = """UPDATE fabric.memory_records SET search_tsv = fabric._search_text(content),
  search_length = fabric._search_length(fabric._search_text(content))
  WHERE tenant_id = %(t)s AND content IS NOT NULL AND search_tsv IS NULL"""
SEARCH_STATS = """INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
SELECT tenant_id, scope_key, '', count(*), sum(fabric._search_length(search_tsv))
  FROM fabric.memory_records WHERE tenant_id = %(t)s AND search_tsv IS NOT NULL
 GROUP BY tenant_id, scope_key
UNION ALL
SELECT m.tenant_id, m.scope_key, u.lexeme, count(*), 0
  FROM fabric.memory_records m CROSS JOIN LATERAL unnest(m.search_tsv) u
 WHERE m.tenant_id = %(t)s GROUP BY m.tenant_id, m.scope_key, u.lexeme"""
MACHINE = """SELECT format('PostgreSQL %%s, fsync=%%s, synchronous_commit=%%s', current_setting(
  'server_version'), current_setting('fsync'), current_setting('synchronous_commit'))"""


def connect(url: str, login: str | None = None) -> Conn:
    return psycopg.connect(db.url_for(url, login) if login else url, autocommit=True)


def pct(xs: Sequence[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


class Counting(MiniLMEmbedder):
    """The real model, counting what it embeds (a rebuild must embed nothing)."""

    texts = 0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.texts += len(texts)
        return super().embed(texts)


@dataclass
class BenchProjector(Projector):
    """The product's Projector, kept to one tenant, stamping when it applies each record."""

    tenant: str = TENANT
    applied: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))

    def records(self, conn: Conn, ids: Sequence[str]) -> list[dict[str, Any]]:
        return [r for r in super().records(conn, ids) if r["tenant_id"] == self.tenant]

    def apply(self, projection: str, conn: Conn, records: Sequence[Any],
              embedded: Sequence[list[float]] | None = None, *,
              flush: bool = True) -> None:  # fmt: skip
        super().apply(projection, conn, records, embedded, flush=flush)
        now, seen = time.perf_counter(), self.applied[projection]
        for r in records:
            seen.setdefault(r["memory_id"], now)

    def snapshot(self, conn: Conn, page: int = 1000) -> Iterator[list[Any]]:
        after, e = ZERO, self.embedder
        register_vector(conn)
        while True:
            rows = fabric_rows(conn, "fabric_api.projection_snapshot_v2", self.tenant,
                               Cast(after, "uuid"), page, e.model, e.version,
                               binary=True)  # fmt: skip
            mine = [projection_record(r) for r in rows if r["tenant_id"] == self.tenant]
            if mine:
                yield mine
            if not rows or len(mine) < len(rows):
                return
            after = mine[-1]["memory_id"]


def setup(url: str) -> list[tuple[str, str, str]]:
    """Logins, tenants and agents (idempotent); returns the cursors to put back."""
    with connect(url) as su:
        create_logins(su, LOGINS)
        if others := su.execute(OTHER_PROJECTORS).fetchall():
            raise SystemExit(f"projectors {others} are connected (the cursors are global)")
        cursors = su.execute("SELECT projection, last_xid::text, last_event_id::text"
                             " FROM fabric.projection_cursors").fetchall()  # fmt: skip
    with connect(url, "benchp_admin") as admin:
        register = "SELECT fabric_api.register_agent(%s, %s, %s, %s)"
        profile = Jsonb({"propose_scope": SCOPE, "recall_scope": SCOPE})
        call(admin, register, AGENT, "benchp_agent", profile, TOOLS)
        call(admin, register, COMMITTER, "benchp_committer", Jsonb({}), [])
        for tenant in (TENANT, BULK):
            call(admin, "SELECT fabric_api.create_tenant(%s)", tenant)
            call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", tenant, AGENT, TOOLS)
            call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", tenant, COMMITTER, [])
    return cursors


def set_cursors(p: Projector, cursors: Sequence[tuple[str, str, str]] | None = None) -> None:
    """Put the cursors back, or (None) move them past every transaction finished so far."""
    with psycopg.connect(p.conninfo, autocommit=True) as conn:
        below = str(max(int(call(conn, "SELECT fabric_api.projection_horizon()")) - 1, 0))
        for proj, xid, event in cursors or [(x, below, TOP) for x in ("qdrant", "graph")]:
            call(conn, SET_CURSOR, proj, xid, event)


def envelope(tag: str, i: int) -> dict[str, Any]:
    cause = f"evt-benchp-{tag}-{i}"
    return {"tier": "episodic", "scope": {"tenant_id": TENANT, "visibility": "subject"},
            "content": {"text": f"{TOPICS[i % len(TOPICS)]} ({tag}-{i})"},
            "provenance": {"source_event_id": cause, "correlation_id": f"corr-{tag}",
                           "causation_id": cause, "formation_method": "extraction"},
            "confidence": 0.9,
            "validity_interval": {"valid_from": "2026-07-02T09:14:00Z"}}  # fmt: skip


def writer(url: str, run_id: uuid.UUID, batch: int = 1) -> Callable[[], list[str]]:
    """Governed writes: propose as the agent, commit as the committer; one record per call
    (`propose` + `commit`, one transaction each), or `batch` records per call
    (`propose_many` + `commit_many`, one transaction each)."""
    agent, committer = connect(url, "benchp_agent"), connect(url, "benchp_committer")
    tag, count = uuid.uuid4().hex[:8], itertools.count(1)

    def write() -> list[str]:
        if batch == 1:
            env = envelope(tag, next(count))
            proposal = call(agent, "SELECT fabric_api.propose(%s, %s)", Jsonb(env), run_id)
            if proposal["status"] != "validated":
                raise SystemExit(f"proposal not validated: {proposal}")
            record = call(committer, "SELECT fabric_api.commit(%s)", proposal["proposal_id"])
            return [str(record["memory_id"])]
        envs = [envelope(tag, next(count)) for _ in range(batch)]
        proposals = call(agent, "SELECT fabric_api.propose_many(%s, %s)", Jsonb(envs), run_id)
        if any(x["status"] != "validated" for x in proposals):
            raise SystemExit(f"proposal not validated: {proposals}")
        ids = [x["proposal_id"] for x in proposals]
        records = call(committer, "SELECT fabric_api.commit_many(%s::uuid[])", ids)
        return [str(r["memory_id"]) for r in records]

    return write


def write_one(url: str, run_id: uuid.UUID) -> Write:
    w = writer(url, run_id)
    return lambda: w()[0]


def ms(xs: Sequence[float]) -> str:
    return f"{pct(xs, 50) * 1e3:.1f} / {pct(xs, 95) * 1e3:.1f} ms"


def lag_phase(p: BenchProjector, write: Write, args: argparse.Namespace) -> list[Row]:
    stop, committed = threading.Event(), {}
    kwargs = {"poll_seconds": 0.5, "should_stop": stop.is_set}
    thread = threading.Thread(target=p.run, kwargs=kwargs, daemon=True)
    thread.start()
    t0, step, i = time.perf_counter(), 1 / args.rate, 0
    start, end = t0 + args.warmup, t0 + args.warmup + args.seconds
    while (due := t0 + i * step) < end:  # on schedule; a late write does not shift the next
        time.sleep(max(0.0, due - time.perf_counter()))
        memory_id = write()
        if due >= start:
            committed[memory_id] = time.perf_counter()
        i += 1
    rate = len(committed) / (time.perf_counter() - start)
    q, g, deadline = p.applied["qdrant"], p.applied["graph"], time.perf_counter() + 120
    while time.perf_counter() < deadline and not all(m in q and m in g for m in committed):
        time.sleep(0.05)
    stop.set()
    thread.join(timeout=60)
    done = [m for m in committed if m in q and m in g]
    lags = [max(q[m], g[m]) - committed[m] for m in done]
    each = [[x[m] - committed[m] for m in done] for x in (q, g)]
    return [
        (f"projection lag p50 / p95, both projections ({len(done)} records)", ms(lags),
         f"p95 <= 1 s: {OK[pct(lags, 95) <= 1]}"),
        ("  Edge alone / graph alone", f"{ms(each[0])}; {ms(each[1])}", "p50 / p95"),
        ("write rate achieved during the lag run", f"{rate:.1f} writes/s",
         f"asked {args.rate:g}; {len(committed) - len(done)} not applied after 120 s"),
    ]  # fmt: skip


class Timed:
    """An embedder (in process or a ProcessEmbedder) with the time spent in `embed`."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.model, self.version, self.dims = inner, inner.model, inner.version, 384
        self.texts, self.calls, self.seconds, self.cpu = 0, 0, 0.0, 0.0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        t, c = time.perf_counter(), time.process_time()
        out: list[list[float]] = self.inner.embed(texts)
        self.seconds += time.perf_counter() - t
        self.cpu += time.process_time() - c  # this process's (onnxruntime's threads included)
        self.texts, self.calls = self.texts + len(texts), self.calls + 1
        return out


@dataclass
class StagedProjector(BenchProjector):
    """BenchProjector stamping each record when it was read, when its embedding was ready
    (store_embeddings called) and when that call returned; `applied` is after Edge's upsert
    (and flush, unless the flush is deferred: then searchable, not yet durable); `durable`
    when the cursor moved past it (after a flush)."""

    stamps: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    settled: list[float] = field(default_factory=list)  # seconds of each flush + cursor move

    def settle(self, conn: Conn, projection: str, *, force: bool = False) -> None:
        t, pending = time.perf_counter(), projection in self._unflushed
        super().settle(conn, projection, force=force)
        if pending and projection not in self._unflushed:
            self.settled.append(time.perf_counter() - t)

    def move_cursor(self, conn: Conn, projection: str, last: Any) -> None:
        super().move_cursor(conn, projection, last)
        now, durable = time.perf_counter(), self.stamps["durable"]
        for m in self.applied[projection]:  # serial: the cursor covers all applied so far
            durable.setdefault(m, now)

    def records(self, conn: Conn, ids: Sequence[str]) -> list[dict[str, Any]]:
        out = super().records(conn, ids)
        now, read = time.perf_counter(), self.stamps["read"]
        for r in out:
            read.setdefault(r["memory_id"], now)
        return out

    def store_embeddings(self, conn: Conn, records: Sequence[Any],
                         vectors: Sequence[list[float]]) -> dict[str, list[float]]:  # fmt: skip
        t = time.perf_counter()
        out = super().store_embeddings(conn, records, vectors)
        now, embedded, stored = time.perf_counter(), self.stamps["embedded"], self.stamps["stored"]
        for r in records:
            embedded.setdefault(r["memory_id"], t)
            stored.setdefault(r["memory_id"], now)
        return out


VARIANTS = {  # name: (pipelined, embedder in a child process, flush every --flush-ms)
    "serial": (False, False, False), "pipelined": (True, False, False),
    "serial+child": (False, True, False), "pipelined+child": (True, True, False),
    "serial+cadence": (False, False, True), "pipelined+cadence": (True, False, True),
}  # fmt: skip


def paced_writes(url: str, run_id: Any, rate: float, seconds: float, warmup: float,
                 out: Any, writers: int = 1, batch: int = 1) -> None:  # fmt: skip
    """In a child process: governed writes on schedule (a late write does not shift the
    next) from `writers` threads with their own connections, each writing `batch` records
    per transaction pair every writers * batch / rate s, their schedules staggered; puts
    ({memory_id: perf_counter at commit return}, achieved writes/s) for the writes due
    after the warm-up. perf_counter is CLOCK_MONOTONIC, one clock for all processes."""
    committed: dict[str, float] = {}
    written = itertools.count()
    cpu = time.process_time()
    t0 = time.perf_counter() + 0.5  # every writer connected before the first is due
    start, end = t0 + warmup, t0 + warmup + seconds
    step = writers * batch / rate
    ready = threading.Barrier(writers)

    def one(k: int) -> None:
        write, i = writer(url, run_id, batch), 0
        ready.wait()
        while (due := t0 + (i + k / writers) * step) < end:
            time.sleep(max(0.0, due - time.perf_counter()))
            ids = write()
            now = time.perf_counter()
            for _ in ids:
                next(written)
            if due >= start:
                committed.update(dict.fromkeys(ids, now))
            i += 1

    threads = [threading.Thread(target=one, args=(k,)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    achieved = len(committed) / (time.perf_counter() - start)
    out.put((committed, achieved, time.process_time() - cpu, next(written)))


def server_cpu(url: str) -> Callable[[], float]:
    """CPU seconds used so far by the PostgreSQL server of `url` (the postmaster, its live
    children and the children it has reaped), read from /proc: server-wide, so it is this
    bench's only on a server of its own."""
    with connect(url) as su:
        data = call(su, "SELECT current_setting('data_directory')")
    pid = int(Path(data, "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")

    def fields(stat: str) -> list[str]:
        return stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "

    def cpu() -> float:
        f = fields(Path(f"/proc/{pid}/stat").read_text())
        total = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError, ValueError):
                    g = fields((proc / "stat").read_text())
                    if int(g[1]) == pid:
                        total += int(g[11]) + int(g[12])
        return total / tick

    return cpu


HOLDERS = """SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0)
  FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
  AND datname IS DISTINCT FROM current_database()"""


def horizon_holders(url: str, stop: threading.Event, stamps: dict[str, dict[str, float]]) -> None:
    """Every 0.2 s until `stop`: the age of the oldest transaction with an xid in another
    database of the server. The feed reads below the snapshot xmin, which is server-wide, so
    such a transaction holds back every event committed after it began."""
    worst = 0.0
    with connect(url) as su:
        while not stop.wait(0.2):
            worst = max(worst, float(call(su, HOLDERS)))
    stamps["holders"]["max"] = worst


@dataclass
class LagRun:
    lags: list[float]
    durable: list[float]  # commit to the cursor past it (after a flush)
    achieved: float
    missing: int
    parts: dict[str, list[float]]  # per record: queue+read, embed, store, edge
    embed_busy: float  # share of the run's wall time spent in embed()
    embed_rate: float  # texts per second of embed() time
    batch: float  # texts per embed() call
    load: float
    held: float  # longest-running transaction of another database seen during the run (s)
    cpu: dict[str, float]  # CPU seconds during the run: embed, projector, postgres, writer
    settled: list[float]  # the cadence's flushes (and cursor moves) during the run, seconds


PARTS = ("read", "embedded", "stored")
CPU_NOT = ("wall", "written")


def lag_run(p: StagedProjector, url: str, run_id: Any, rate: float, args: argparse.Namespace,
            variant: str) -> LagRun:  # fmt: skip
    """Vector projection alone, writes from another process at `rate` for --seconds."""
    import multiprocessing

    pipelined = VARIANTS[variant][0]
    stop, emb = threading.Event(), p.embedder
    assert isinstance(emb, Timed)
    texts, busy, calls, embed_cpu = emb.texts, emb.seconds, emb.calls, emb.cpu
    pg_cpu = server_cpu(url)
    settled = len(p.settled)
    cpu0 = (time.process_time(), pg_cpu())
    run = p.run_pipelined if pipelined else p.run
    kwargs = {"poll_seconds": 0.5, "should_stop": stop.is_set}
    thread = threading.Thread(target=run, args=(("qdrant",),), kwargs=kwargs, daemon=True)
    thread.start()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=paced_writes,
                        args=(url, run_id, rate, args.seconds, args.warmup, results,
                              args.writers, args.write_batch))  # fmt: skip
    t0 = time.perf_counter()
    child.start()
    held = threading.Thread(target=horizon_holders, args=(url, stop, p.stamps), daemon=True)
    held.start()
    committed, achieved, writer_cpu, written = results.get()
    child.join()
    q, deadline = p.applied["qdrant"], time.perf_counter() + 120
    while time.perf_counter() < deadline and not all(m in q for m in committed):
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    while time.perf_counter() < deadline and not all(m in p.stamps["durable"] for m in q):
        time.sleep(0.05)
    load = os.getloadavg()[0]
    stop.set()
    thread.join(timeout=60)
    held.join(timeout=5)
    own, in_embed = time.process_time() - cpu0[0], emb.cpu - embed_cpu
    cpu = {"embed": in_embed, "projector": own - in_embed, "postgres": pg_cpu() - cpu0[1],
           "writer": writer_cpu, "wall": wall, "written": written}  # fmt: skip
    done = [m for m in committed if m in q and all(m in p.stamps[s] for s in PARTS)]
    at = [committed, *(p.stamps[s] for s in PARTS), q]
    parts = {name: [at[k + 1][m] - at[k][m] for m in done]
             for k, name in enumerate(("queue+read", "embed", "store", "edge"))}  # fmt: skip
    n, took = emb.texts - texts, emb.seconds - busy
    durable = [p.stamps["durable"][m] - committed[m] for m in done if m in p.stamps["durable"]]
    return LagRun([q[m] - committed[m] for m in done], durable, achieved,
                  len(committed) - len(done),
                  parts, took / wall, n / took if took else 0.0,
                  n / max(emb.calls - calls, 1), load,
                  p.stamps.pop("holders", {}).get("max", 0.0), cpu,
                  p.settled[settled:])  # fmt: skip


def drain_run(p: StagedProjector, write: Write, n: int, pipelined: bool) -> tuple[float, float]:
    """Records/s of a full drain of an n-record backlog (vector projection, embedding in),
    and the embedder's texts/s during it."""
    ids = [write() for _ in range(n)]
    emb = p.embedder
    assert isinstance(emb, Timed)
    texts, busy = emb.texts, emb.seconds
    q, t = p.applied["qdrant"], time.perf_counter()
    if pipelined:
        p.run_pipelined(("qdrant",), poll_seconds=0.1,
                        should_stop=lambda: all(m in q for m in ids))  # fmt: skip
    else:
        with psycopg.connect(p.conninfo, autocommit=True) as conn:
            p.drain(conn, "qdrant")
    took = emb.seconds - busy
    return n / (time.perf_counter() - t), (emb.texts - texts) / took if took else 0.0


def rates_phase(p: StagedProjector, url: str, run_id: Any, args: argparse.Namespace) -> list[Row]:
    from memfabric.embedding import ProcessEmbedder

    rows: list[Row] = []
    ratios: list[str] = []
    variants = args.variants.split(",")
    in_process, child = Timed(p.embedder), Timed(ProcessEmbedder(args.embedder))
    child.inner.start()
    child.embed(["warm up"])

    def use(variant: str) -> bool:
        pipelined, in_child, cadence = VARIANTS[variant]
        p.embedder = child if in_child else in_process
        p.flush_seconds = args.flush_ms / 1000 if cadence else 0.0
        return pipelined

    try:
        for rate in (float(r) for r in args.rates.split(",")):
            results = {}
            for variant in variants:
                print(f"  {rate:g} writes/s, {variant} ...", flush=True)
                use(variant)
                set_cursors(p)
                printed = len(rows)
                results[variant] = r = lag_run(p, url, run_id, rate, args, variant)
                rows.append((f"lag p50 / p95 at {rate:g} writes/s, {variant} ({len(r.lags)} "
                             "records)", ms(r.lags) if r.lags else "-",
                             f"asked {rate:g}, achieved {r.achieved:.1f} writes/s ({args.writers} "
                             f"writer(s) x {args.write_batch} a transaction); {r.missing} not "
                             "applied; "
                             f"p95 <= 1 s: {OK[bool(r.lags) and pct(r.lags, 95) <= 1]}; "
                             f"load {r.load:.1f}; another database's transaction held the "
                             f"horizon up to {r.held:.1f} s"))  # fmt: skip
                if r.lags:
                    split = "; ".join(f"{k} {statistics.mean(v) * 1e3:.0f}"
                                      for k, v in r.parts.items())  # fmt: skip
                    busy = (f"embedder busy {r.embed_busy:.0%} of the run at "
                            f"{r.embed_rate:.0f} texts/s, {r.batch:.1f} texts a call")  # fmt: skip
                    rows.append((f"  where the lag goes (mean ms), {variant}", split, busy))
                    c, n = r.cpu, r.cpu["written"]
                    used = sum(v for k, v in c.items() if k not in CPU_NOT) / c["wall"]
                    rows.append((f"  CPU ms a record written, {variant}",
                                 "; ".join(f"{k} {v / n * 1e3:.1f}" for k, v in c.items()
                                           if k not in CPU_NOT),
                                 f"{used:.2f} cores busy on average over {c['wall']:.0f} s "
                                 "(embed: in this process only; postgres: the whole server, "
                                 "the writes included; writer: the governed writers' client; "
                                 "projector: the rest of this process)"))  # fmt: skip
                if r.durable and (VARIANTS[variant][2] or not VARIANTS[variant][0]):
                    f = r.settled or [0.0]
                    flushes = (f"; {len(r.settled)} flushes of the cadence (each with its "
                               f"cursor move), mean {statistics.mean(f) * 1e3:.0f} ms, "
                               f"max {max(f) * 1e3:.0f} ms")  # fmt: skip
                    rows.append((f"  commit to durable (cursor moved) p50 / p95, {variant}",
                                 ms(r.durable), f"{len(r.durable)} records{flushes}"))  # fmt: skip
                for row in rows[printed:]:
                    print("   ", " | ".join(row), flush=True)
            base = results[variants[0]].lags
            for variant in variants[1:]:
                other = results[variant].lags
                if base and other:
                    ratios.append(f"lag p95 at {rate:g} writes/s: {variant} / {variants[0]} = "
                                  f"{pct(other, 95) / pct(base, 95):.2f}")  # fmt: skip
        write, drains = write_one(url, run_id), {}
        for variant in variants:
            print(f"  drain of {args.backlog}, {variant} ...", flush=True)
            pipelined = use(variant)
            set_cursors(p)
            drains[variant], embed_rate = drain_run(p, write, args.backlog, pipelined)
            rows.append((f"full drain of {args.backlog}, {variant}, embedding included",
                         f"{drains[variant]:.0f} records/s", f"goal >= 300/s: "
                         f"{OK[drains[variant] >= 300]}; embedder {embed_rate:.0f} texts/s "
                         f"while embedding; load {os.getloadavg()[0]:.1f}"))  # fmt: skip
            print("   ", " | ".join(rows[-1]), flush=True)
        for variant in variants[1:]:
            ratios.append(f"drain: {variant} / {variants[0]} = "
                          f"{drains[variant] / drains[variants[0]]:.2f}")  # fmt: skip
    finally:
        child.inner.close()
        p.embedder = in_process.inner
    return rows + [(r, "", "") for r in ratios]


def drain_phase(p: BenchProjector, emb: Counting, write: Write, n: int) -> list[Row]:
    t = time.perf_counter()
    for _ in range(n):
        write()
    writes, texts = n / (time.perf_counter() - t), emb.texts
    with psycopg.connect(p.conninfo, autocommit=True) as conn:
        t = time.perf_counter()
        p.drain(conn, "qdrant")
        tq = time.perf_counter() - t
        p.drain(conn, "graph")
        tg = time.perf_counter() - t - tq
    return [
        (f"full drain of a {n}-record backlog, embedding included",
         f"{n / (tq + tg):.0f} records/s",
         f"Edge+embed {tq:.1f} s, graph {tg:.1f} s; {emb.texts - texts} embedded"),
        ("governed writes building it (serial propose+commit)", f"{writes:.0f} records/s", ""),
    ]  # fmt: skip


def rebuild(p: BenchProjector, emb: Counting, projection: str) -> Row:
    texts, t = emb.texts, time.perf_counter()
    n = p.rebuild(projection)
    took = time.perf_counter() - t
    where = "Edge" if projection == "qdrant" else "graph"
    return (f"rebuild into {where} ({n:,} records)", f"{n / took:.0f} records/s",
            f"{took:.1f} s; {emb.texts - texts} embedded")  # fmt: skip


def bulk_load(url: str, n: int, seed: int, model: str, version: str) -> tuple[int, float]:
    """Records in BULK up to n, with stored embeddings (as the superuser, triggers off)."""
    with connect(url) as su:
        have = call(su, "SELECT count(*) FROM fabric.memory_records WHERE tenant_id = %s", BULK)
        if have >= n:
            search_text(su)  # rows of an older run may lack it
            rekey(su, model, version)
            return have, 0.0
        t, rng, now = time.perf_counter(), np.random.default_rng(seed + have), datetime.now(UTC)
        vecs = rng.normal(size=(n - have, 384)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        register_vector_info(su, vector := TypeInfo.fetch(su, "ext.vector"))
        su.execute("SET session_replication_role = replica")
        keys = []
        with su.transaction():
            with su.cursor().copy(BULK_COPY) as cp:
                for i in range(have, n):
                    mid, r = uuid.UUID(bytes=rng.bytes(16), version=4), rng.random(7)
                    start = now - timedelta(days=int(r[0] * 400), seconds=i)
                    until = None if r[1] < 0.85 else start + timedelta(days=1 + int(r[6] * 800))
                    keys.append((mid, "sha256:" + hashlib.sha256(mid.bytes).hexdigest()))
                    cp.write_row((BULK, mid, "episodic" if r[2] < 0.7 else "semantic",
                                  "tenant" if r[3] < 0.2 else "subject", f"user-{i % SUBJECTS}",
                                  f"sess-{i % 97}", AGENT, Jsonb({"text": f"{TOPICS[i % 6]} {i}"}),
                                  keys[-1][1], f"evt-bulk-{i}", AGENT, "extraction",
                                  round(float(r[4]), 3), start, until,
                                  "superseded" if r[5] < 0.03 else "raw", "durable",
                                  ["pii"] if r[5] > 0.95 else [], 0))  # fmt: skip
            with su.cursor().copy(EMBEDDINGS) as cp:
                cp.set_types(["text", "uuid", "text", "text", "int4", vector.oid, "text"])
                for (mid, h), v in zip(keys, vecs, strict=True):
                    cp.write_row((BULK, mid, model, version, 384, v, h))
        search_text(su)
        return n, time.perf_counter() - t


def rekey(su: Conn, model: str, version: str) -> None:
    """The bulk rows' stored embeddings (random vectors, no model's output) keyed by the
    embedder's version of this checkout, when an older run stored them under another (a
    change of the text rule changes every version): the rebuild reads them, not MiniLM."""
    su.execute("SET session_replication_role = replica")
    with su.transaction():
        su.execute("""DELETE FROM fabric.memory_embeddings o WHERE o.tenant_id = %(t)s
                        AND o.model = %(m)s AND o.model_version <> %(v)s
                        AND EXISTS (SELECT 1 FROM fabric.memory_embeddings n
                                    WHERE (n.tenant_id, n.memory_id, n.model, n.model_version)
                                        = (o.tenant_id, o.memory_id, o.model, %(v)s))""",
                   {"t": BULK, "m": model, "v": version})  # fmt: skip
        moved = su.execute("""UPDATE fabric.memory_embeddings SET model_version = %(v)s
                               WHERE tenant_id = %(t)s AND model = %(m)s
                                 AND model_version <> %(v)s""",
                           {"t": BULK, "m": model, "v": version}).rowcount  # fmt: skip
    su.execute("SET session_replication_role = DEFAULT")
    if moved:
        print(f"  {moved:,} stored embeddings re-keyed to version {version}", flush=True)


def search_text(su: Conn) -> None:
    """Search text and statistics for the bulk rows, as the triggers would have kept them."""
    su.execute("SET session_replication_role = replica")
    with su.transaction():
        if su.execute(SEARCH_TEXT, {"t": BULK}).rowcount:
            su.execute("DELETE FROM fabric.search_stats WHERE tenant_id = %s", (BULK,))
            su.execute(SEARCH_STATS, {"t": BULK})
        su.execute(SUBJECT_KEYS)
    su.execute("SET session_replication_role = DEFAULT")
    su.execute("VACUUM ANALYZE fabric.memory_records, fabric.memory_embeddings,"
               " fabric.search_stats")  # fmt: skip


def open_runs(url: str, subjects: Sequence[str]) -> dict[str, Any]:
    with connect(url, "benchp_orchestrator") as orch:
        return {s: call(orch, OPEN_RUN, BULK, AGENT, s, "sess-q", TOOLS) for s in set(subjects)}


def semantic_request(run_id: Any, text: str) -> dict[str, Any]:
    return {"run_id": str(run_id), "mode": "semantic", "query": text, "tiers": TIERS,
            "limit": LIMIT, "filters": FILTERS}  # fmt: skip


def build_phase(url: str, store: EdgeVectorStore, emb: Counting, args: Any) -> list[Row]:
    """Semantic recall end to end against a shard while its index is built (a child process
    on a copy, swapped in) and --build-rate vector writes per second arrive (points in the
    bulk tenant that Postgres does not hold: the re-check drops them, the shard takes them)."""
    rng = np.random.default_rng(args.seed + 2)
    subjects = [f"user-{s}" for s in rng.integers(SUBJECTS, size=4000)]
    runs, broker = open_runs(url, subjects[:50]), LocalBroker(store, emb, {})
    done, result, written = threading.Event(), {}, [0]

    def build() -> None:
        try:
            result.update(store.build_index())
        finally:
            done.set()

    def write() -> None:
        now = datetime.now(UTC)
        while not done.wait(1 / args.build_rate):
            v = rng.normal(size=384)
            payload = MemoryPayload(memory_id=str(uuid.uuid4()), tenant_id=BULK, tier="episodic",
                                    visibility="subject", subject_ref="user-w",
                                    content_hash="sha256:" + "0" * 64, confidence=0.9,
                                    valid_from=now, consolidation_state="raw",
                                    retention_class="durable")  # fmt: skip
            store.upsert("episodic", [VectorPoint(payload, v / np.linalg.norm(v))])
            written[0] += 1

    lat: list[float] = []
    threads = [threading.Thread(target=build), threading.Thread(target=write)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    with connect(url, "benchp_agent") as agent:
        for k, subject in enumerate(itertools.cycle(subjects[:50])):
            if done.is_set():
                break
            t = time.perf_counter()
            recall(agent, semantic_request(runs[subject], QUERIES[k % len(QUERIES)]), broker)
            lat.append(time.perf_counter() - t)
    for th in threads:
        th.join()
    took = time.perf_counter() - t0
    built = [r for r in result.values() if r["result"] == "built"]
    steps = "; ".join(f"{r['collection'].split('__')[0]}: copy {r['copy_s']:.1f} s, child "
                      f"{r['build_s']:.0f} s, swap {r['swap_s']:.1f} s, {r['replayed']} replayed"
                      for r in built)  # fmt: skip
    return [
        ("index build (child process on a copy, swapped in)", f"{took:.0f} s",
         f"{len(built)} shards built; {steps}"),
        (f"semantic recall end to end while the index is built ({len(lat)} queries)",
         f"{ms(lat)}", f"max {max(lat) * 1e3:.0f} ms; {written[0]} vector writes "
         f"({args.build_rate:g}/s) arriving meanwhile"),
    ]  # fmt: skip


def recall_phase(
    url: str, plain: EdgeVectorStore, indexed: EdgeVectorStore, emb: Counting, args: Any
) -> list[Row]:
    rng = np.random.default_rng(args.seed + 1)
    subjects = [f"user-{s}" for s in rng.integers(SUBJECTS, size=args.queries + 20)]
    runs = open_runs(url, subjects)
    vectors = dict(zip(QUERIES, emb.embed(QUERIES), strict=True))
    brokers = {"": LocalBroker(plain, emb, {}), "+ix": LocalBroker(indexed, emb, {})}
    stores = {"": plain, "+ix": indexed}
    out: dict[str, list[float]] = {w: [] for w in (*ORDER, "pg", "fusion", "fusion+ix")}
    served, fused, hits, overlap = [], [], [], []
    n = min(1000, max(MIN_CANDIDATES, LIMIT * CANDIDATE_FACTOR))  # what recall() asks for
    with connect(url, "benchp_agent") as agent:
        for k, subject in enumerate(subjects):
            text, took = QUERIES[k % len(QUERIES)], {}
            request = semantic_request(runs[subject], text)
            keys = [f"subject:{subject}", "tenant"]  # what the database resolves, as FILTERS
            flt = RecallFilter(BULK, keys, datetime.now(UTC), 0.3, ["pii"])
            turn = ORDER[k % len(ORDER) :] + ORDER[: k % len(ORDER)]  # noise hits them all
            for what in turn:
                base, ix = what.removesuffix("+ix"), "+ix" if what.endswith("+ix") else ""
                broker, store = brokers[ix], stores[ix]
                t = time.perf_counter()
                if base == "e2e":
                    served.append(len(recall(agent, request, broker)["records"]))
                elif base == "hybrid":
                    answer = recall(agent, {**request, "mode": "hybrid"}, broker)
                    assert answer["mode_served"] == "hybrid", answer
                    fused.append(len(answer["records"]))
                elif base == "embed+edge":
                    store.search(TIERS, emb.embed([text])[0], flt, n)
                else:
                    hits.append(len(store.search(TIERS, vectors[text], flt, n)))
                took[what] = time.perf_counter() - t
            took["pg"] = took["e2e"] - took["embed+edge"]  # paired: the same query and filter
            took["fusion"] = took["hybrid"] - took["e2e"]  # the lexical list and the fusion
            took["fusion+ix"] = took["hybrid+ix"] - took["e2e+ix"]
            if k >= 20:  # the first 20 warm plans and caches
                for what, sec in took.items():
                    out[what].append(sec)
                exact = {i for i, _ in indexed.search(TIERS, vectors[text], flt, n, exact=True)}
                approx = {i for i, _ in indexed.search(TIERS, vectors[text], flt, n)}
                overlap.append(len(exact & approx) / max(len(exact), 1))
    e2e, direct, hybrid = out["e2e"], out["embed+edge"], out["hybrid"]
    e2x, hybx = out["e2e+ix"], out["hybrid+ix"]
    return [
        (f"semantic recall end to end p50 / p95 ({len(e2e)} queries), no index", ms(e2e),
         f"{statistics.mean(served):.1f} served"),
        ("semantic recall end to end p50 / p95, index built", ms(e2x),
         f"p95 <= 30 ms: {OK[pct(e2x, 95) <= 0.030]}"),
        (f"hybrid recall end to end p50 / p95 ({len(hybrid)} queries), no index", ms(hybrid),
         f"{statistics.mean(fused):.1f} served; query embedding included"),
        ("hybrid recall end to end p50 / p95, index built", ms(hybx),
         f"p95 <= 40 ms: {OK[pct(hybx, 95) <= 0.040]}"),
        ("  hybrid - semantic, per query, no index / index built",
         f"{ms(out['fusion'])}; {ms(out['fusion+ix'])}",
         "lexical list (BM25 in the scope) and fusion"),
        ("  end to end - direct with embedding, per query", ms(out["pg"]),
         "Postgres: resolution, re-check, hydration (no index)"),
        ("direct Edge search, same filter, with query embedding", ms(direct),
         f"limit {n}, no index"),
        ("direct Edge search, same filter, no embedding: no index / index built",
         f"{ms(out['edge'])}; {ms(out['edge+ix'])}", f"{statistics.mean(hits):.1f} hits"),
        ("index built: share of the exact top candidates found", f"{statistics.mean(overlap):.3f}",
         f"mean over {len(overlap)} queries, top {n}"),
        ("cost of governance: end to end / direct with embedding",
         f"{pct(e2e, 50) / pct(direct, 50):.2f}x p50, {pct(e2e, 95) / pct(direct, 95):.2f}x p95",
         "interleaved query by query (no index)"),
        ("index built / no index, semantic end to end",
         f"{pct(e2x, 50) / pct(e2e, 50):.2f}x p50, {pct(e2x, 95) / pct(e2e, 95):.2f}x p95",
         "interleaved query by query"),
        ("index built / no index, hybrid end to end",
         f"{pct(hybx, 50) / pct(hybrid, 50):.2f}x p50, {pct(hybx, 95) / pct(hybrid, 95):.2f}x p95",
         "interleaved query by query"),
    ]  # fmt: skip


def ignore_lock(directory: str, names: list[str]) -> list[str]:
    return [".lock"] if ".lock" in names else []


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    opts = {"records": 100_000, "seconds": 20.0, "warmup": 3.0, "rate": 50.0, "backlog": 1000,
            "queries": 200, "seed": 7, "build_rate": 20.0}  # fmt: skip
    for name, default in opts.items():
        ap.add_argument(f"--{name}", type=type(default), default=default)
    ap.add_argument("--only-recall", action="store_true", help="phase 4 alone, no graph")
    ap.add_argument("--rates", default="", help="e.g. 25,50,100: serial vs pipelined, no graph")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of --rates, first the base")
    ap.add_argument("--embedder", default="minilm", help="of --rates: minilm or minilm-static")
    ap.add_argument("--writers", type=int, default=1,
                    help="of --rates: writer threads in the writer process")  # fmt: skip
    ap.add_argument("--write-batch", type=int, default=1,
                    help="of --rates: records a propose_many+commit_many")  # fmt: skip
    ap.add_argument("--edge-shards", default="inline", choices=("inline", "child"),
                    help="of --rates: Edge shards in this process or children")  # fmt: skip
    ap.add_argument("--flush-ms", type=float, default=1000.0,
                    help="of --rates, serial+cadence: flush at most this often")  # fmt: skip
    args = ap.parse_args()
    url, rows = db.database_url(), []
    emb = Counting() if args.embedder == "minilm" else embedder_from_settings(args.embedder)
    saved = setup(url)
    emb.embed(["warm up"])
    tmp = Path(tempfile.mkdtemp(prefix="bench-projection-"))
    child_shards = args.edge_shards == "child"  # of --rates: the store the projector writes
    stores = [EdgeVectorStore(tmp / "edge-writes", shard_processes=child_shards),
              EdgeVectorStore(tmp / "edge-bulk")]  # fmt: skip
    for s in stores:
        s.ensure_collections(emb.model, emb.version, emb.dims)
    graph = None if args.only_recall or args.rates else graph_from_env()
    if graph is not None:
        graph.wipe = partial(graph.wipe, tenant_id=TENANT)  # type: ignore[method-assign]
        graph.ensure_schema()  # the wipes keep to our tenant
        graph.wipe()
    conninfo = db.url_for(url, "benchp_projector")
    p = (StagedProjector if args.rates else BenchProjector)(conninfo, emb, stores[0], graph)
    pb = BenchProjector(conninfo, emb, stores[1], None, tenant=BULK)
    try:
        if args.rates:
            with connect(url, "benchp_orchestrator") as orch:
                run_id = call(orch, OPEN_RUN, TENANT, AGENT, "user-w", "sess-w", TOOLS)
            print(f"lag at {args.rates} writes/s and drain, {args.variants} (Edge) ...")
            assert isinstance(p, StagedProjector)
            rows += rates_phase(p, url, run_id, args)
        elif not args.only_recall:
            with connect(url, "benchp_orchestrator") as orch:
                run_id = call(orch, OPEN_RUN, TENANT, AGENT, "user-w", "sess-w", TOOLS)
            set_cursors(p)  # start after everything committed so far (other tenants' too)
            w = write_one(url, run_id)
            print(f"1/4 lag: {args.rate:g} writes/s for {args.warmup:g}+{args.seconds:g} s ...")
            rows += lag_phase(p, w, args)
            print(f"2/4 drain: {args.backlog} records committed with the projector stopped ...")
            rows += drain_phase(p, emb, w, args.backlog)
            print("3/4 rebuild from stored embeddings ...")
            rows += [rebuild(p, emb, "qdrant"), rebuild(p, emb, "graph")]
        have, load_s = 0, 0.0
        if not args.rates:
            print(f"4/4 semantic recall: loading {args.records:,} records ...")
            have, load_s = bulk_load(url, args.records, args.seed, emb.model, emb.version)
            rows.append(rebuild(pb, emb, "qdrant"))
            # a copy that stays without an index; the index is built on the rebuilt shard
            # while recall runs against it, then the two are queried side by side
            stores[1].flush()
            shutil.copytree(tmp / "edge-bulk", tmp / "edge-plain", ignore=ignore_lock)
            stores.append(EdgeVectorStore(tmp / "edge-plain"))
            stores[2].ensure_collections(emb.model, emb.version, emb.dims)
            print("4/4 index build while recall runs ...")
            rows += build_phase(url, stores[1], emb, args)
            for row in rows[-2:]:
                print("| " + " | ".join(row) + " |", flush=True)
            print("4/4 recall with and without the index ...")
            rows += recall_phase(url, stores[2], stores[1], emb, args)
    finally:
        set_cursors(p, saved)
        if graph is not None:
            graph.wipe()
            graph.close()
        for s in stores:
            s.close()
        shutil.rmtree(tmp, ignore_errors=True)
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    with connect(url) as su:
        pg = call(su, MACHINE)
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; nproc {os.cpu_count()}; {cpu}; {pg}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Shared machine, load average {load} (other work runs too): the numbers are noisy.")
    print(f"{have:,} records in {BULK} ({f'loaded in {load_s:.0f} s' if load_s else 'reused'});"
          " its Postgres rows stay for the next run; Edge dirs removed, graph tenant wiped,"
          " projection cursors put back.\n")  # fmt: skip
    print("| measure | value | note |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
