"""`make bench-write`: the governed write path against the same rows as plain INSERTs.

Prints, never asserts (docs/benchmarks.md). One run, governed and baseline alternating every --slice
pairs (25; whole batches) within each round, order flipped each turn, so noise hits both:
- governed single: `fabric_api.propose` as login bench_agent, then `fabric_api.commit` as
  bench_committer; two connections, each call its own autocommit transaction.
- baseline single: the same rows (proposal; record, its search statistics, lineage, events,
  proposal update) as plain INSERT/UPDATE, one transaction per side on the same two
  connections, pipelined: one round trip per side, like the one SELECT per side of the
  governed path.
- governed batch: one `fabric_api.propose_many` of B envelopes, then one
  `fabric_api.commit_many` of the B proposal ids (set-based on both sides); baseline batch:
  the same rows, one transaction per side (`executemany`, pipelined).
The server CPU of both connections per pair is printed too (from /proc, when the server runs on
this machine): on a shared machine it moves much less than wall time.
With --sealer, the sealer `memfabric serve` runs (memfabric.worker.run_sealer, as the bench's
committer, its default poll) seals beside the writers for the whole run, and a sampler reads
`fabric_api.sealing_lag` every --lag-every seconds while governed batches are written: the
unsealed tail's p50/p95/max (events written and not sealed yet) and the oldest unsealed
event's age are printed, with the events written and sealed per second, so whether sealing
keeps up with the commit rate shows (a tail that does not grow from the first third of the
samples to the last). Those samples are taken in a phase of its own after the rounds:
governed batches without a pause for --seal-seconds, the commit rate printed beside them.
Half the envelopes are episodic, half semantic derived_from the previous episode (lineage
rows). The baseline writes the events per pair and side the governed warm-up wrote
(counted in fabric.events), the same payloads, and a content hash precomputed client-side.

Baseline tables (schema bench_baseline, recreated each run) are `CREATE TABLE (LIKE fabric.x
INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING INDEXES)`: same columns, defaults, generated
scope_key, primary keys and secondary indexes (the fair choice: the governed writes maintain
them all; those on scope_key -- scope, search text, recall's top-k, one live assertion per
key -- are created again after scope_key is, as the records' definitions). NOT NULL stays;
no CHECK, foreign key, trigger or RLS policy; fabric.ident and
fabric.tenant_ident domain columns become text (a domain CHECK is governance too). events is
one plain table (fabric.events is partitioned by month). The derived search text (search_tsv,
when present) is computed in the baseline INSERT: data the governed row holds. The per-scope
search statistics (fabric.search_stats, when present) get the rows the governed commit's
statement trigger appends for the records it formed (up to 0.7.0 the baseline skipped them,
so its rate was higher than the same work's and the ratio understated).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from benchlib import backend_cpu, call, create_logins
from psycopg import sql
from psycopg.types.json import Jsonb

from memfabric import db
from memfabric.hashing import content_hash
from memfabric.worker import run_sealer, seal_once

Conn = psycopg.Connection[tuple[Any, ...]]
Rows = list[tuple[Any, ...]]
TENANT, SUBJECT, SESSION, CORR = "bench", "user-bench", "sess-bench", "corr-bench"
AGENT, COMMITTER = "bench-agt-001", "bench-agt-010"
LOGINS = {
    "bench_agent": None,
    "bench_committer": "fabric_committer",
    "bench_orchestrator": "fabric_orchestrator",
    "bench_admin": "fabric_admin",
}
TOOLS = ["tool:memory-propose"]
PROFILE = {
    "propose_scope": {"tiers": ["episodic", "semantic"], "visibility": ["subject", "tenant"]}
}
VALID_FROM = datetime(2026, 7, 2, 9, 14, tzinfo=UTC)
FILLER = "Customer prefers invoices in EUR via Acme Logistics BV; confirmed on the call. " * 3

PROPOSE = "SELECT fabric_api.propose(%s, %s)"
COMMIT = "SELECT fabric_api.commit(%s)"
COMMIT_PENDING = "SELECT fabric_api.commit_pending(%s)"
PROPOSE_MANY = "SELECT fabric_api.propose_many(%s, %s)"
COMMIT_MANY = "SELECT fabric_api.commit_many(%s)"
BASELINE_DDL = """
DROP SCHEMA IF EXISTS bench_baseline CASCADE;
CREATE SCHEMA bench_baseline;
DO $$
DECLARE c record; t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['proposals', 'memory_records', 'memory_lineage', 'events'] LOOP
    EXECUTE format('CREATE TABLE bench_baseline.%I (LIKE fabric.%I INCLUDING DEFAULTS'
                   ' INCLUDING GENERATED INCLUDING INDEXES)', t, t);
  END LOOP;
  ALTER TABLE bench_baseline.memory_records DROP COLUMN scope_key;  -- and its indexes
  FOR c IN SELECT a.attrelid::regclass AS rel, a.attname FROM pg_attribute a
           JOIN pg_class r ON r.oid = a.attrelid JOIN pg_type t ON t.oid = a.atttypid
           WHERE r.relnamespace = 'bench_baseline'::regnamespace AND r.relkind = 'r'
             AND t.typtype = 'd' AND t.typbasetype = 'text'::regtype AND a.attnum > 0 LOOP
    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE text', c.rel, c.attname);
  END LOOP;
END $$;
ALTER TABLE bench_baseline.memory_records ADD COLUMN scope_key text GENERATED ALWAYS AS (
  CASE visibility WHEN 'session' THEN 'session:' || session_id
    WHEN 'agent' THEN 'agent:' || agent_id WHEN 'subject' THEN 'subject:' || subject_id
    WHEN 'tenant' THEN 'tenant' END) STORED;
-- every index of the records on scope_key (dropped with the column above): the scope, the
-- search text (GIN), recall's top-k, one live assertion per key (GiST)
DO $$
DECLARE d text;
BEGIN
  FOR d IN SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
           WHERE i.indrelid = 'fabric.memory_records'::regclass
             AND pg_get_indexdef(i.indexrelid) LIKE '%scope_key%' LOOP
    EXECUTE regexp_replace(d, '^CREATE (UNIQUE )?INDEX \\S+ ON fabric\\.memory_records ',
                           'CREATE \\1INDEX ON bench_baseline.memory_records ');
  END LOOP;
END $$;
-- the per-scope search statistics (migration 0021), when present: rows the governed commit
-- appends (fabric.tg_memory_records__search_stats), so the baseline appends them too
DO $$
BEGIN
  IF pg_catalog.to_regclass('fabric.search_stats') IS NOT NULL THEN
    CREATE TABLE bench_baseline.search_stats (LIKE fabric.search_stats INCLUDING DEFAULTS
      INCLUDING GENERATED INCLUDING INDEXES);
  END IF;
END $$;
GRANT USAGE ON SCHEMA bench_baseline TO bench_agent, bench_committer;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA bench_baseline
  TO bench_agent, bench_committer;
-- the scoped search-text index's expression (memory_records_search_keys), copied above
GRANT EXECUTE ON FUNCTION fabric._search_keys(text, text[], text[])
  TO bench_agent, bench_committer;
"""
B_PROPOSAL = """INSERT INTO bench_baseline.proposals (tenant_id, proposal_id, run_id, proposed_by,
  status, tier, visibility, subject_id, session_id, content, content_hash, source_event_id,
  correlation_id, causation_id, formation_method, derived_from, confidence, valid_from,
  retention_class, version)
VALUES (%s, %s, %s, %s, 'validated', %s, 'subject', %s, %s, %s, %s, %s, %s, %s, 'extraction',
  %s, 0.9, %s, 'durable', '1.0.0')"""
B_RECORD = """INSERT INTO bench_baseline.memory_records (tenant_id, memory_id, tier, visibility,
  subject_id, agent_id, session_id, business_instance_id, content, content_hash,
  source_event_id, correlation_id, causation_id, formed_by, formation_method, confidence,
  valid_from, valid_until, retention_class, compliance_labels, version, proposal_id, run_id{})
SELECT p.tenant_id, %s, p.tier, p.visibility, p.subject_id, p.agent_id, p.session_id,
  p.business_instance_id, p.content, p.content_hash, p.source_event_id, p.correlation_id,
  p.causation_id, %s, p.formation_method, p.confidence, p.valid_from, p.valid_until,
  p.retention_class, p.compliance_labels, p.version, p.proposal_id, p.run_id{}
FROM bench_baseline.proposals p WHERE p.tenant_id = %s AND p.proposal_id = %s"""
# The derived search text (migration 0003), when present: data the governed row carries.
TSV = (", search_tsv", """, jsonb_to_tsvector(%s::regconfig, p.content, '["string"]')""")
# ... and its length for BM25 (migration 0021), when present: what fabric._search_length
# counts, written out (the baseline's logins may not call the fabric's functions).
LENGTH = (
    ", search_length",
    """, (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)
       FROM unnest(jsonb_to_tsvector(%s::regconfig, p.content, '["string"]')) u)""",
)
HAS_LENGTH = """SELECT EXISTS (SELECT 1 FROM pg_attribute
  WHERE attrelid = 'fabric.memory_records'::regclass AND attname = 'search_length'
  AND NOT attisdropped)"""
HAS_TSV = """SELECT (SELECT text_search_config::text FROM fabric.deployment_settings)
  WHERE EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'fabric.memory_records'::regclass
                AND attname = 'search_tsv' AND NOT attisdropped)"""
WAITING = """SELECT tenant_id, count(*) FROM fabric.proposals
  WHERE status = 'validated' AND tenant_id <> %s GROUP BY 1"""
# The statistics rows the governed commit's statement trigger appends for the records a
# statement formed: per scope one row of documents and summed length, per scope and lexeme
# one row of documents (the records read back by their primary key, once per transaction).
B_STATS = """INSERT INTO bench_baseline.search_stats (tenant_id, scope_key, lexeme, docs, length)
SELECT r.tenant_id, r.scope_key, '', count(*), sum(r.search_length)
  FROM bench_baseline.memory_records r WHERE r.tenant_id = %(t)s AND r.memory_id = ANY(%(ids)s)
 GROUP BY r.tenant_id, r.scope_key
UNION ALL
SELECT r.tenant_id, r.scope_key, u.lexeme, count(*), 0
  FROM bench_baseline.memory_records r CROSS JOIN LATERAL unnest(r.search_tsv) u
 WHERE r.tenant_id = %(t)s AND r.memory_id = ANY(%(ids)s)
 GROUP BY r.tenant_id, r.scope_key, u.lexeme"""
HAS_STATS = "SELECT to_regclass('bench_baseline.search_stats') IS NOT NULL"
B_LINEAGE = "INSERT INTO bench_baseline.memory_lineage VALUES (%s, %s, %s)"
B_EVENT = """INSERT INTO bench_baseline.events (tenant_id, event_type, correlation_id,
  causation_id, actor_agent_id, run_id, memory_id, proposal_id, payload)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"""
B_DECIDE = """UPDATE bench_baseline.proposals SET status = 'committed', decided_at = now(),
  committed_by = %s, memory_id = %s WHERE tenant_id = %s AND proposal_id = %s"""


@dataclass
class Item:
    """One envelope's worth of work; its hash precomputed for the baseline."""

    i: int
    tier: str
    content: dict[str, Any]
    hash: str


@dataclass
class State:
    run_id: uuid.UUID
    record_sql: sql.Composed
    tsconfig: tuple[str, ...]  # the text search configuration, if records carry search_tsv
    stats: bool = False  # the baseline appends the search statistics rows (B_STATS)
    gov_episode: str = ""  # the last committed governed episode (memory_id)
    base_episode: uuid.UUID | None = None
    agent_events: tuple[str, ...] = ()
    committer_events: tuple[str, ...] = ()


Mode = tuple[str, Callable[[Conn, Conn, State, Sequence[Item], int], list[float]], int]


def make_items(start: int, n: int) -> list[Item]:
    items = []
    for i in range(start, start + n):
        content = {"text": f"bench {i:010d}: {FILLER}", "turn": i}
        items.append(Item(i, ("episodic", "semantic")[i % 2], content, content_hash(content)))
    return items


def envelope(it: Item, episode: str) -> Jsonb:
    cause = f"evt-bench-{it.i}"
    prov = {"source_event_id": cause, "correlation_id": CORR, "causation_id": cause}
    return Jsonb({
        "tier": it.tier,
        "scope": {"tenant_id": TENANT, "visibility": "subject"},
        "content": it.content,
        "provenance": {**prov, "formation_method": "extraction"},
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        **({"derived_from": [episode]} if it.tier == "semantic" else {}),
    })  # fmt: skip


def setup(url: str) -> State:
    """Logins, tenant, agents and a run (idempotent); the baseline schema (fresh)."""
    with psycopg.connect(url, autocommit=True) as su:
        create_logins(su, LOGINS)
        su.execute(BASELINE_DDL)
        tsconfig = tuple(r[0] for r in su.execute(HAS_TSV))
        has_length = su.execute(HAS_LENGTH).fetchone()
        with_length = bool(tsconfig) and has_length is not None and bool(has_length[0])
        stats = with_length and bool(call(su, HAS_STATS))
        waiting = su.execute(WAITING, (TENANT,)).fetchall()
    if waiting:  # commit_pending drains every tenant: it would commit these too
        raise SystemExit(f"validated proposals wait in tenants {waiting}: drain them first")
    with psycopg.connect(db.url_for(url, "bench_admin"), autocommit=True) as admin:
        call(admin, "SELECT fabric_api.create_tenant(%s)", TENANT)
        register = "SELECT fabric_api.register_agent(%s, %s, %s, %s)"
        call(admin, register, AGENT, "bench_agent", Jsonb(PROFILE), TOOLS)
        call(admin, register, COMMITTER, "bench_committer", Jsonb({}), [])
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", TENANT, AGENT, TOOLS)
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", TENANT, COMMITTER, [])
    with psycopg.connect(db.url_for(url, "bench_orchestrator"), autocommit=True) as orch:
        open_run = "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, %s::interval)"
        run_id = call(orch, open_run, TENANT, AGENT, SUBJECT, SESSION, TOOLS, "6 hours")
    with psycopg.connect(db.url_for(url, "bench_committer"), autocommit=True) as committer:
        while call(committer, COMMIT_PENDING, 1000)["committed"]:  # a killed run's leftovers
            pass
    tsv = [sql.SQL(x if tsconfig else "") for x in TSV]
    if with_length:  # the length is computed from the same derivation (one more parameter)
        tsv = [x + sql.SQL(y) for x, y in zip(tsv, LENGTH, strict=True)]
        tsconfig = tsconfig * 2
    return State(run_id, sql.SQL(B_RECORD).format(*tsv), tsconfig, stats)


def governed_single(a: Conn, c: Conn, st: State, items: Sequence[Item], _: int) -> list[float]:
    lat = []
    for it in items:
        env = envelope(it, st.gov_episode)
        t0 = time.perf_counter()
        proposal = call(a, PROPOSE, env, st.run_id)
        record = call(c, COMMIT, uuid.UUID(proposal["proposal_id"]))
        lat.append(time.perf_counter() - t0)
        if it.tier == "episodic":
            st.gov_episode = record["memory_id"]
    return lat


def governed_batch(a: Conn, c: Conn, st: State, items: Sequence[Item], b: int) -> list[float]:
    lat = []
    for chunk in (items[k : k + b] for k in range(0, len(items), b)):
        envelopes = Jsonb([envelope(it, st.gov_episode).obj for it in chunk])
        t0 = time.perf_counter()
        answers = call(a, PROPOSE_MANY, envelopes, st.run_id)
        ids = [uuid.UUID(x["proposal_id"]) for x in answers if x["status"] == "validated"]
        records = call(c, COMMIT_MANY, ids)
        lat.append(time.perf_counter() - t0)
        if len(records) != len(chunk):
            raise SystemExit(
                f"commit_many formed {len(records)} of {len(chunk)}: not the same work"
            )
    return lat


def baseline_rows(st: State, chunk: Sequence[Item]) -> tuple[Rows, Rows, Rows, Rows, Rows, Rows]:
    """Rows of: proposals, agent events; records, lineage, committer events, decisions."""
    prop, a_ev, rec, lin, c_ev, dec = ([] for _ in range(6))
    for it in chunk:
        pid, mid, cause = uuid.uuid4(), uuid.uuid4(), f"evt-bench-{it.i}"
        derived = [st.base_episode] if it.tier == "semantic" and st.base_episode else []
        body = (Jsonb(it.content), it.hash, cause, CORR, cause, derived, VALID_FROM)
        prop.append((TENANT, pid, st.run_id, AGENT, it.tier, SUBJECT, SESSION, *body))
        small = {"tier": it.tier, "visibility": "subject", "content_hash": it.hash}
        big = {
            **small,
            "state": "raw",
            "formation_method": "extraction",
            "retention_class": "durable",
        }
        ae, ce, run = st.agent_events, st.committer_events, st.run_id
        a_ev += [(TENANT, e, CORR, cause, AGENT, run, None, pid, Jsonb(small)) for e in ae]
        c_ev += [(TENANT, e, CORR, cause, COMMITTER, run, mid, pid, Jsonb(big)) for e in ce]
        rec.append((mid, COMMITTER, *st.tsconfig, TENANT, pid))
        lin += [(TENANT, mid, d) for d in derived]
        dec.append((COMMITTER, mid, TENANT, pid))
        if it.tier == "episodic":
            st.base_episode = mid
    return prop, a_ev, rec, lin, c_ev, dec


def baseline(a: Conn, c: Conn, st: State, items: Sequence[Item], b: int) -> list[float]:
    lat = []
    for chunk in (items[k : k + b] for k in range(0, len(items), b)):
        prop, a_ev, rec, lin, c_ev, dec = baseline_rows(st, chunk)
        t0 = time.perf_counter()
        with a.pipeline(), a.transaction(), a.cursor() as cur:
            cur.executemany(B_PROPOSAL, prop)
            cur.executemany(B_EVENT, a_ev)
        with c.pipeline(), c.transaction(), c.cursor() as cur:
            cur.executemany(st.record_sql, rec)
            if st.stats:
                # prepared, as the trigger's statement is (a plan kept for the session)
                cur.execute(B_STATS, {"t": TENANT, "ids": [r[0] for r in rec]}, prepare=True)
            if lin:
                cur.executemany(B_LINEAGE, lin)
            cur.executemany(B_EVENT, c_ev)
            cur.executemany(B_DECIDE, dec)
        lat.append(time.perf_counter() - t0)
    return lat


def events_per_pair(url: str, since: datetime, pairs: int, login: str) -> tuple[str, ...]:
    """Event types the governed path wrote per pair on one side (by the side's login)."""
    with psycopg.connect(url, autocommit=True) as su:
        rows = su.execute(
            "SELECT event_type, count(*) FROM fabric.events WHERE tenant_id = %s"
            " AND occurred_at >= %s AND actor_login = %s GROUP BY 1 ORDER BY 1",
            (TENANT, since, login),
        ).fetchall()
    return tuple(e for e, n in rows for _ in range(round(n / pairs)))


def machine(url: str) -> tuple[str, str]:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    with psycopg.connect(url, autocommit=True) as su:
        s: dict[str, str] = dict(su.execute("SELECT name, setting FROM pg_settings").fetchall())
    pg = f"PostgreSQL {s['server_version']}, fsync={s['fsync']}"
    return f"nproc {os.cpu_count()}, {cpu}", f"{pg}, sync_commit={s['synchronous_commit']}"


@dataclass
class Sealing:
    """The sealer beside the writers and the samples of its lag (--sealer)."""

    url: str
    every: float
    poll: float
    sampling: threading.Event
    stop: threading.Event
    samples: list[tuple[float, int, float]]
    threads: list[threading.Thread]

    @classmethod
    def start(cls, url: str, every: float, poll: float) -> Sealing:
        sealing = cls(url, every, poll, threading.Event(), threading.Event(), [], [])
        login = db.url_for(url, "bench_committer")
        with psycopg.connect(login, autocommit=True) as conn:
            caught_up = seal_once(conn)  # what earlier runs left unsealed, before the clock
        print(f"sealer: {caught_up:,} events left unsealed by earlier work sealed first")
        sealer = threading.Thread(
            target=run_sealer,
            args=(login,),
            kwargs={"poll_seconds": poll, "should_stop": sealing.stop.is_set, "progress": print},
            daemon=True,
        )
        sampler = threading.Thread(target=sealing._sample, args=(login,), daemon=True)
        sealing.threads = [sealer, sampler]
        for t in sealing.threads:
            t.start()
        return sealing

    def _sample(self, login: str) -> None:
        with psycopg.connect(login, autocommit=True) as conn:
            while not self.stop.is_set():
                if self.sampling.is_set():
                    lag = call(conn, "SELECT fabric_api.sealing_lag()")
                    age = float(lag["oldest_unsealed_seconds"])
                    self.samples.append((time.monotonic(), int(lag["unsealed"]), age))
                time.sleep(self.every)

    def totals(self) -> tuple[int, int]:
        """(events, sealed events) of the whole database, read by the superuser."""
        with psycopg.connect(self.url, autocommit=True) as su:
            row = su.execute(
                "SELECT (SELECT count(*) FROM fabric.events),"
                " (SELECT count(*) FROM fabric.event_seals)"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def report(self, seconds: float, events: int, sealed: int) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        if len(self.samples) < 3:
            print("sealer: too few lag samples")
            return
        tail = [n for _, n, _ in self.samples]
        age = [a for _, _, a in self.samples]
        third = max(len(tail) // 3, 1)
        q = statistics.quantiles(tail, n=20)
        print(
            f"sealer beside the writers (run_sealer, poll {self.poll:g} s; lag read every"
            f" {self.every:g} s, {len(tail)} samples):"
        )
        print(
            f"  unsealed tail p50 {statistics.median(tail):,.0f}, p95 {q[18]:,.0f},"
            f" max {max(tail):,} events; oldest unsealed p95"
            f" {statistics.quantiles(age, n=20)[18]:.2f} s"
        )
        print(
            f"  tail mean, first third {statistics.fmean(tail[:third]):,.0f} / last third"
            f" {statistics.fmean(tail[-third:]):,.0f} events; written {events / seconds:,.0f}"
            f" events/s, sealed {sealed / seconds:,.0f} events/s over the run"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1000, help="pairs per mode, all rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured pairs per mode")
    parser.add_argument("--slice", type=int, default=25, help="pairs per turn within a round")
    parser.add_argument(
        "--sealer", action="store_true", help="seal beside the writers; print the unsealed tail"
    )
    parser.add_argument("--seal-poll", type=float, default=1.0, help="the sealer's poll (s)")
    parser.add_argument(
        "--seal-seconds", type=float, default=30.0, help="governed batches with the sealer (s)"
    )
    parser.add_argument("--lag-every", type=float, default=0.1, help="lag sample interval (s)")
    args = parser.parse_args()
    url = db.database_url()
    st = setup(url)
    per_round, b = max(args.pairs // args.rounds, 1), args.batch
    # unique turn numbers across runs too: a repeated envelope would be an idempotent replay
    first = int(time.time()) % 10**5 * 10**3 + 1
    turns = iter(range(first, first + 10**3))

    def fresh(n: int) -> list[Item]:  # unique turn numbers: unique contents and hashes
        return make_items(next(turns) * 10**6, n)

    agent = psycopg.connect(db.url_for(url, "bench_agent"), autocommit=True)
    committer = psycopg.connect(db.url_for(url, "bench_committer"), autocommit=True)
    modes: list[tuple[Mode, Mode]] = [
        (("governed single", governed_single, 1), ("baseline single", baseline, 1)),
        ((f"governed batch {b}", governed_batch, b), (f"baseline batch {b}", baseline, b)),
    ]
    lat: dict[str, list[float]] = {m[0]: [] for pair in modes for m in pair}
    wall = dict.fromkeys(lat, 0.0)
    cpu_used: dict[str, float | None] = dict.fromkeys(lat, 0.0)
    sealing = Sealing.start(url, args.lag_every, args.seal_poll) if args.sealer else None
    totals0 = totals1 = (0, 0)
    seconds, pairs = 1.0, 0
    with agent, committer:
        # Warm-up (plans, caches); the governed single part counts the events per pair.
        since = call(agent, "SELECT clock_timestamp()")
        governed_single(agent, committer, st, fresh(args.warmup), 1)
        st.agent_events = events_per_pair(url, since, args.warmup, "bench_agent")
        st.committer_events = events_per_pair(url, since, args.warmup, "bench_committer")
        print(f"events per pair (governed warm-up): agent {st.agent_events},"
              f" committer {st.committer_events}")  # fmt: skip
        for _, fn, size in [m for pair in modes for m in pair][1:]:
            fn(agent, committer, st, fresh(max(args.warmup // size, 1) * size), size)
        for r in range(args.rounds):
            line = []
            for gov, base in modes:
                took = dict.fromkeys((gov[0], base[0]), 0.0)
                step = gov[2] * max(1, args.slice // gov[2])  # whole batches
                for k, start in enumerate(range(0, per_round, step)):
                    for name, fn, size in (gov, base) if (r + k) % 2 == 0 else (base, gov):
                        items = fresh(min(step, per_round - start))
                        c0 = backend_cpu((agent, committer))
                        t0 = time.perf_counter()
                        lat[name] += fn(agent, committer, st, items, size)
                        took[name] += time.perf_counter() - t0
                        c1 = backend_cpu((agent, committer))
                        used = cpu_used[name]
                        both = None if c0 is None or c1 is None or used is None else c1 - c0
                        cpu_used[name] = None if both is None or used is None else used + both
                for name in took:
                    wall[name] += took[name]
                line.append(f"{gov[0]} {took[base[0]] / took[gov[0]]:.2f}")
            print(f"round {r + 1}/{args.rounds} governed/baseline: " + ", ".join(line))
        if sealing is not None:
            # Governed batches without a pause for --seal-seconds, the sealer beside them.
            totals0, started, pairs = sealing.totals(), time.monotonic(), 0
            sealing.sampling.set()
            while time.monotonic() - started < args.seal_seconds:
                governed_batch(agent, committer, st, fresh(b), b)
                pairs += b
            sealing.sampling.clear()
            seconds = time.monotonic() - started
            totals1 = sealing.totals()

    n = per_round * args.rounds
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpu, pg = machine(url)
    print(f"\n{when} | {cpu} | {pg}")
    print(f"N={n} pairs per mode in {args.rounds} rounds; batch p50/p95 are per batch of {b}\n")
    header = ("mode", "N", "pairs/s", "p50 ms", "p95 ms", "governed/baseline")
    table = []
    for gov, base in modes:
        for name in (gov[0], base[0]):
            p95 = statistics.quantiles(lat[name], n=20)[18] if len(lat[name]) > 1 else lat[name][0]
            ratio = f"{wall[base[0]] / wall[gov[0]]:.2f}" if name == gov[0] else ""
            p50 = statistics.median(lat[name])
            table.append((name, str(n), f"{n / wall[name]:.0f}", f"{p50 * 1e3:.2f}",
                          f"{p95 * 1e3:.2f}", ratio))  # fmt: skip
    widths = [max(len(row[k]) for row in (header, *table)) for k in range(len(header))]
    for row in (header, *table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print(f"\nMarkdown ({when}; {cpu}; {pg}):\n")
    print("| " + " | ".join(header) + " |\n|" + "|".join("---" for _ in header) + "|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print()
    for gov, base in modes:
        g, b_ = cpu_used[gov[0]], cpu_used[base[0]]
        if g and b_:  # both connections' server processes, /proc ticks summed over the run
            print(f"server CPU a pair: {gov[0]} {g * 1e6 / n:,.0f} µs, {base[0]}"
                  f" {b_ * 1e6 / n:,.0f} µs (baseline/governed {b_ / g:.2f})")  # fmt: skip
    for (gov, base), goal in zip(modes, ("0.6", "0.5"), strict=True):
        ratio = wall[base[0]] / wall[gov[0]]
        print(f"ratio {gov[0]} / {base[0]}: {ratio:.2f} (goal >= {goal})")
    if sealing is not None:
        rate = pairs / seconds
        print(f"\ngoverned batch {b} for {seconds:.1f} s with the sealer: {rate:,.0f} pairs/s")
        sealing.report(seconds, totals1[0] - totals0[0], totals1[1] - totals0[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
