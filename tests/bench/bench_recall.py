"""`make bench-recall`: governed recall at scale against the same work without governance
and against LangGraph's PostgresStore, on the same server and the same items.

Prints, never asserts. Two shapes of RECORDS records (default 1,000,000), each in
a fresh database (DBNAME, dropped afterwards unless --keep):
- many tenants: RECORDS / 1,000 tenants x 10 subjects x 100 records;
- big tenants: 10 tenants x 10 subjects x RECORDS / 100 records.
Records alternate episodic and semantic; 10% are tenant-visible, the rest subject-visible.
Content is ~700 bytes of text holding two topic words (one of 500) and a common filler.

The episodic records, the ones recall is asked for, are formed through the governed import
(`fabric_api.import_records` as a committer enabled in every tenant, the elements generated in
the database, up to 10,000 a call on two connections): every rule, formation event and
per-scope statistic is what an import writes. The semantic records beside them (which no
measured recall reads) cannot be imported, and go in by the fixture shortcut: generated
set-based by the superuser with triggers off (session_replication_role = replica), their
search statistics folded in afterwards, as tests/sql/test_recall_plan.py does.

With --profile, each shape is also profiled function by function (track_functions = all
for the agent's login): the self time per recall of every function the governed path calls,
filter-only, one word and the question, and the time fabric_api.recall spends outside the
retrieval function it shares with the baseline. track_functions adds its own overhead to
every call: read the profile for proportions, the measures above for time.

--keep keeps each shape's database (DBNAME_many, DBNAME_big); --reuse measures on them
again without loading (after `memfabric db migrate` on them to try a change).

Measured from one connection each, interleaved query by query (order rotated each turn):
- governed: `fabric_api.recall` as the agent inside an open run of (tenant, subject), tier
  episodic, visibility subject + tenant, limit 8: filter-only, one topic word, then a
  10-word question (QUESTION: four stop words, "customer" and "invoice" held by every
  record through the filler, one topic word held by a few, three words held by none);
- same SELECT + audit: `fabric._recall_candidates` with the scope governed recall resolves,
  then one INSERT of an audit row into a table like fabric.events holding a copy of the
  trail (--baseline empty: an empty one), in one transaction, as the superuser (no run,
  tool check, scope resolution, pseudonyms or JSON answer);
- PostgresStore: `PostgresStore.search((tenant, tier, subject), limit=8)` over the same
  items loaded into its `store` table (set-based, same shortcut). It has no full-text
  search without an embedding index, so it is measured filter-only.
Each governed and baseline call's server CPU (its backend's /proc schedstat) is printed too,
and governed - baseline per call: the work governance adds, which moves much less than the
wall-time ratios on a shared machine (the commit's WAL flush dominates their p95).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from bench_projection import call, connect, pct
from bench_write import machine
from benchlib import SUBJECT_KEYS, create_logins, server_cpu_ms
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from memfabric import db

DBNAME = "memfabric_bench_recall"
LOGINS = {
    "benchr_agent": None,
    "benchr_orchestrator": "fabric_orchestrator",
    "benchr_admin": "fabric_admin",
    "benchr_committer": "fabric_committer",
}
AGENT, COMMITTER = "benchr-agt-001", "benchr-cmt-001"
TOOLS = ["tool:memory-recall"]
SCOPE = {"tiers": ["episodic", "semantic"], "visibility": ["subject", "tenant"]}
PROPOSE = {"tiers": ["episodic"], "visibility": ["subject", "tenant"]}  # the import's standing
IMPORT_MAX = 10_000  # elements a call (fabric_api.import_records)
OPEN_RUN = "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, '12 hours'::interval)"
LIMIT, TOPICS = 8, 500
QUESTION = "what did the customer say about {topic} invoice last week"  # 10 words
FILLER = (
    "The customer called about the quarterly invoice and asked that every future statement "
    "be sent to the finance mailbox; the account manager confirmed the billing entity, the "
    "currency and the payment terms, noted the purchase order reference for the next "
    "renewal, and promised a written summary of the call with the open questions about "
    "delivery windows, the warehouse contact and the escalation path for late shipments. "
    "They also mentioned the onboarding checklist, the training schedule for new staff and "
    "the preferred channel for urgent requests outside business hours."
)

# Record i of tenant t (i = 1 .. per tenant): episodic when i is even, semantic when odd;
# subject (i / 2) % subjects; 10% tenant-visible; content with two topic words and the filler.
# The episodic records of one tenant in (lo, hi] go through the governed import: the elements
# are generated in the database and imported by the committer in the same statement.
IMPORT_SQL = """
SELECT fabric_api.import_records(%(tenant)s, %(import_id)s, (
  SELECT jsonb_agg(jsonb_build_object(
    'scope', jsonb_build_object('subject_id', 'user-' || ((i / 2) %% %(subjects)s),
      'session_id', 'sess-' || (i %% 7), 'agent_id', %(agent)s::text,
      'visibility', CASE WHEN (i / 20) %% 10 = 3 THEN 'tenant' ELSE 'subject' END),
    'content', jsonb_build_object('text', 'note ' || i || ' about topic'
      || abs(hashtext(%(tenant)s::text || i) %% %(topics)s) || ' and topic'
      || abs(hashtext(i || %(tenant)s::text) %% %(topics)s) || '. ' || %(filler)s::text),
    'provenance', jsonb_build_object('correlation_id', 'evt-' || i),
    'confidence', round((i %% 97) / 96.0, 2),
    'validity_interval', jsonb_build_object('valid_from', to_char(
      (now() - make_interval(days => 1 + i %% 400)) AT TIME ZONE 'UTC',
      'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
    'retention_class', 'durable') ORDER BY i)
  FROM generate_series(%(lo)s::integer + 1, %(hi)s::integer) AS i WHERE i %% 2 = 0))
"""
# The semantic records of some tenants, the same way otherwise: the fixture shortcut
# (set-based, triggers off).
RECORDS_SQL = """
INSERT INTO fabric.memory_records (tenant_id, memory_id, tier, visibility, subject_id,
  session_id, agent_id, content, content_hash, source_event_id, formed_by, formation_method,
  confidence, valid_from, valid_until, recorded_at, consolidation_state, retention_class,
  compliance_labels, search_tsv, search_length)
SELECT t.tenant_id, gen_random_uuid(), 'semantic',
       CASE WHEN (i / 20) %% 10 = 3 THEN 'tenant' ELSE 'subject' END,
       'user-' || ((i / 2) %% %(subjects)s), 'sess-' || (i %% 7), %(agent)s, c.content,
       fabric.content_hash(c.content), 'evt-' || i, %(agent)s, 'extraction',
       round((i %% 97) / 96.0, 2), now() - make_interval(days => 1 + i %% 400), NULL, now(),
       'raw', 'durable', '{}', x.tsv, fabric._search_length(x.tsv)
FROM unnest(%(tenants)s::text[]) AS t(tenant_id)
CROSS JOIN generate_series(1, %(per_tenant)s) AS i
CROSS JOIN fabric.deployment_settings s
CROSS JOIN LATERAL (SELECT jsonb_build_object('text', 'note ' || i || ' about topic'
  || abs(hashtext(t.tenant_id || i) %% %(topics)s) || ' and topic'
  || abs(hashtext(i || t.tenant_id) %% %(topics)s) || '. '
  || %(filler)s) AS content) c
CROSS JOIN LATERAL (SELECT jsonb_to_tsvector(s.text_search_config, c.content, '["string"]')
  AS tsv) x
WHERE i %% 2 = 1
"""
# The shortcut's rows bypassed the statistics trigger: their statistics, folded in.
STATS_SQL = """
INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
SELECT tenant_id, scope_key, '', count(*), sum(search_length)
  FROM fabric.memory_records WHERE tier = 'semantic' GROUP BY tenant_id, scope_key
UNION ALL
SELECT m.tenant_id, m.scope_key, u.lexeme, count(*), 0
  FROM fabric.memory_records m CROSS JOIN LATERAL unnest(m.search_tsv) u
 WHERE m.tier = 'semantic'
 GROUP BY m.tenant_id, m.scope_key, u.lexeme
"""
# The peer's items: the same records under (tenant, tier, subject) -- tenant-visible ones
# under (tenant, tier, "tenant") -- with the same value.
STORE_SQL = """
INSERT INTO public.store (prefix, key, value, created_at, updated_at)
SELECT m.tenant_id || '.' || m.tier || '.' || CASE m.visibility WHEN 'tenant' THEN 'tenant'
         ELSE m.subject_id END,
       m.memory_id::text,
       jsonb_build_object('content', m.content, 'confidence', m.confidence,
                          'valid_from', m.valid_from),
       m.recorded_at, m.valid_from
  FROM fabric.memory_records m
"""
# The baseline's audit table: fabric.events' columns, defaults, indexes and partitioning by
# time, its row's id time-ordered like a governed event's (`fabric._event_id`, UUID version
# 7; with --baseline-id random, the version-4 id of fabric.events' column default, the only
# baseline before 2026-12-05 04:30 UTC: a random id lands on random index leaves, so each
# baseline commit wrote about 4x the WAL of a governed recall and its flush's tail weighed
# more on the baseline's p95 than on governed recall's). With --baseline trail (the
# default) it holds a copy of the trail's rows, so the baseline's one INSERT lands in
# indexes as large as those the governed event lands in; with --baseline empty (the only
# baseline before 2026-12-05) it starts empty and stays small, which leaves the cost of a
# large trail to governed recall alone (docs/benchmarks.md, "Recall at the cost of its audit row").
AUDIT_DDL = """
DROP SCHEMA IF EXISTS bench_baseline CASCADE;
CREATE SCHEMA bench_baseline;
CREATE TABLE bench_baseline.events (LIKE fabric.events INCLUDING DEFAULTS INCLUDING INDEXES)
  PARTITION BY RANGE (occurred_at);
CREATE TABLE bench_baseline.events_default PARTITION OF bench_baseline.events DEFAULT;
"""
AUDIT_ID_V7 = (
    "ALTER TABLE bench_baseline.events ALTER COLUMN event_id SET DEFAULT fabric._event_id()"
)
AUDIT_COPY = "INSERT INTO bench_baseline.events SELECT * FROM fabric.events"
BASE_SELECT = """SELECT memory_id, record FROM fabric._recall_candidates(%s, %s, ARRAY['episodic'],
  now(), 0, '{}', %s, NULL, NULL, %s)"""
BASE_AUDIT = """INSERT INTO bench_baseline.events (tenant_id, event_type, correlation_id,
  actor_agent_id, run_id, payload) VALUES (%s, 'memory.recall.served', %s, %s, %s, %s)"""

Sample = dict[str, list[float]]


def fresh_database(url: str, dbname: str) -> str:
    with connect(url) as su:
        name = sql.Identifier(dbname)
        su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        su.execute(sql.SQL("CREATE DATABASE {}").format(name))
    burl = make_conninfo(url, dbname=dbname)
    db.migrate(burl)
    return burl


def load(url: str, tenants: list[str], subjects: int, per_tenant: int, baseline: str) -> float:
    """Tenants, the agent and the committer governed (admin API); the episodic records
    through the governed import, two connections at once; the semantic records, their
    statistics and the peer's items set-based (the fixture shortcut). Returns the seconds."""
    t0 = time.perf_counter()
    with connect(url) as su:
        create_logins(su, LOGINS)
    with connect(url, "benchr_admin") as admin:
        register = "SELECT fabric_api.register_agent(%s, %s, %s, %s)"
        profile = {"recall_scope": SCOPE, "propose_scope": PROPOSE}
        call(admin, register, AGENT, "benchr_agent", Jsonb(profile), TOOLS)
        call(admin, register, COMMITTER, "benchr_committer", Jsonb({}), [])
        for tenant in tenants:
            call(admin, "SELECT fabric_api.create_tenant(%s)", tenant)
            call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", tenant, AGENT, TOOLS)
            call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", tenant, COMMITTER, [])
    calls = [(t, lo, min(lo + 2 * IMPORT_MAX, per_tenant))
             for t in tenants for lo in range(0, per_tenant, 2 * IMPORT_MAX)]  # fmt: skip
    total = len(tenants) * (per_tenant // 2)
    progress = {"formed": 0, "next": max(1, total // 10)}  # printed every tenth
    lock = threading.Lock()

    def importer(part: list[tuple[str, int, int]]) -> None:
        with connect(url, "benchr_committer") as committer:
            for tenant, lo, hi in part:
                row = committer.execute(IMPORT_SQL, {
                    "tenant": tenant, "import_id": f"fixture-{lo}", "lo": lo, "hi": hi,
                    "subjects": subjects, "agent": AGENT, "topics": TOPICS, "filler": FILLER,
                }).fetchone()  # fmt: skip
                assert row is not None
                answer = row[0]
                if answer["refused"]:
                    raise SystemExit(f"the fixture was refused: {answer['refusals'][:3]}")
                with lock:
                    progress["formed"] += answer["formed"]
                    if progress["formed"] >= progress["next"]:
                        progress["next"] += max(1, total // 10)
                        print(f"  imported {progress['formed']} of {total} episodic records",
                              flush=True)  # fmt: skip

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(importer, calls[k::2]) for k in range(2)]:
            future.result()
    took = time.perf_counter() - t0
    print(f"  imported {progress['formed']} episodic records in {took:.0f} s", flush=True)
    from langgraph.store.postgres import PostgresStore

    with PostgresStore.from_conn_string(url) as store:
        store.setup()
    with connect(url) as su:
        su.execute("SET session_replication_role = replica")
        su.execute("SET maintenance_work_mem = '256MB'")
        chunk = max(1, 200_000 // per_tenant)
        for k in range(0, len(tenants), chunk):
            su.execute(RECORDS_SQL, {
                "tenants": tenants[k : k + chunk], "per_tenant": per_tenant,
                "subjects": subjects, "agent": AGENT, "topics": TOPICS, "filler": FILLER,
            })  # fmt: skip
        su.execute(STATS_SQL)
        su.execute(SUBJECT_KEYS)
        su.execute(STORE_SQL)
        audit_table(su, baseline)
        su.execute("VACUUM ANALYZE")
    return time.perf_counter() - t0


def audit_table(su: Any, baseline: str, baseline_id: str = "v7") -> None:
    """(Re)make the baseline's audit table: empty, or a copy of the trail (see AUDIT_DDL)."""
    su.execute(AUDIT_DDL)
    if baseline_id == "v7":
        su.execute(AUDIT_ID_V7)
    if baseline == "trail":
        su.execute(AUDIT_COPY)
    su.execute("VACUUM ANALYZE bench_baseline.events")


def measure(
    url: str, tenants: list[str], subjects: int, queries: int, seed: int
) -> tuple[Sample, Sample]:
    """Wall ms per call of each measure, and the server's CPU ms per call of the governed
    and baseline measures (their one connection each)."""
    rng = random.Random(seed)
    pairs = [(rng.choice(tenants), f"user-{rng.randrange(subjects)}") for _ in range(50)]
    with connect(url, "benchr_orchestrator") as orch:
        runs = {p: call(orch, OPEN_RUN, p[0], AGENT, p[1], "sess-1", TOOLS) for p in pairs}
    from langgraph.store.postgres import PostgresStore

    took: Sample = {}
    cpu: Sample = {}
    with (
        connect(url, "benchr_agent") as agent,
        connect(url) as base,
        PostgresStore.from_conn_string(url) as store,
    ):

        def governed(pair: tuple[str, str], word: str | None) -> None:
            request = {"run_id": str(runs[pair]), "tiers": ["episodic"], "limit": LIMIT,
                       **({"query": word, "mode": "text"} if word else {})}  # fmt: skip
            answer = call(agent, "SELECT fabric_api.recall(%s)", Jsonb(request))
            assert answer["status"] == "served", answer

        def baseline(pair: tuple[str, str], word: str | None) -> None:
            keys = [f"subject:{pair[1]}", "tenant"]
            with base.transaction():
                rows = base.execute(BASE_SELECT, (pair[0], keys, word, LIMIT + 1)).fetchall()
                payload = {"status": "served", "agent_id": AGENT, "tiers_served": ["episodic"],
                           "memory_ids": [str(r[0]) for r in rows[:LIMIT]]}  # fmt: skip
                base.execute(BASE_AUDIT, (pair[0], "corr", AGENT, runs[pair], Jsonb(payload)))

        def peer(pair: tuple[str, str], word: str | None) -> None:
            store.search((pair[0], "episodic", pair[1]), limit=LIMIT)

        # (name, function, query: none, one topic word, or the 10-word question)
        measures: list[tuple[str, Callable[[tuple[str, str], str | None], None], str]] = [
            ("governed filter", governed, ""),
            ("select+audit filter", baseline, ""),
            ("PostgresStore filter", peer, ""),
            ("governed text", governed, "word"),
            ("select+audit text", baseline, "word"),
            ("governed question", governed, "question"),
            ("select+audit question", baseline, "question"),
        ]
        for n in range(queries + 5):  # the first 5 rounds warm caches and plans
            pair, word = rng.choice(pairs), f"topic{rng.randrange(TOPICS)}"
            query = {"": None, "word": word, "question": QUESTION.format(topic=word)}
            turn = measures[n % len(measures) :] + measures[: n % len(measures)]
            for name, fn, kind in turn:
                conn = {governed: agent, baseline: base}.get(fn)
                c = server_cpu_ms(conn) if conn else None
                t = time.perf_counter()
                fn(pair, query[kind])
                if n >= 5:
                    took.setdefault(name, []).append((time.perf_counter() - t) * 1000)
                    if conn and c is not None and (c2 := server_cpu_ms(conn)) is not None:
                        cpu.setdefault(name, []).append(c2 - c)
    return took, cpu


KINDS = {"filter": None, "text": "{topic}", "question": QUESTION}
PROFILE_SQL = """
SELECT schemaname || '.' || funcname, calls, self_time, total_time
  FROM pg_stat_user_functions WHERE calls > 0 ORDER BY self_time DESC
"""


def profile(url: str, tenants: list[str], subjects: int, queries: int, seed: int) -> None:
    """Function-level profile of governed recall, per kind of request (see the docstring)."""
    rng = random.Random(seed)
    pairs = [(rng.choice(tenants), f"user-{rng.randrange(subjects)}") for _ in range(20)]
    with connect(url, "benchr_orchestrator") as orch:
        runs = [call(orch, OPEN_RUN, p[0], AGENT, p[1], "sess-1", TOOLS) for p in pairs]
    with connect(url) as su:
        su.execute("ALTER ROLE benchr_agent SET track_functions = 'all'")
        try:
            for kind, text in KINDS.items():
                su.execute("SELECT pg_stat_reset()")
                with connect(url, "benchr_agent") as agent:
                    for n in range(queries + 5):
                        request = {"run_id": str(rng.choice(runs)), "tiers": ["episodic"],
                                   "limit": LIMIT}  # fmt: skip
                        if text:
                            topic = f"topic{rng.randrange(TOPICS)}"
                            request |= {"mode": "text", "query": text.format(topic=topic)}
                        if n == 5:  # after warming plans and caches
                            agent.execute("SELECT pg_stat_force_next_flush()")
                            su.execute("SELECT pg_stat_reset()")
                        call(agent, "SELECT fabric_api.recall(%s)", Jsonb(request))
                    agent.execute("SELECT pg_stat_force_next_flush()")
                    agent.execute("SELECT 1")
                su.execute("SELECT pg_stat_clear_snapshot()")
                rows = su.execute(PROFILE_SQL).fetchall()
                per = {name: (calls, self_ms * 1000 / queries, total_ms * 1000 / queries)
                       for name, calls, self_ms, total_ms in rows}  # fmt: skip
                outer = per.get("fabric_api.recall", (0, 0.0, 0.0))[2]
                shared = per.get("fabric._recall_candidates", (0, 0.0, 0.0))[2]
                print(f"  profile, {kind}: {queries} recalls; fabric_api.recall {outer:.0f} us,"
                      f" of which fabric._recall_candidates {shared:.0f} us; outside it"
                      f" {outer - shared:.0f} us")  # fmt: skip
                print(f"    {'function':<40} {'calls/recall':>12} {'self us/recall':>15}")
                for name, (calls, self_us, _) in per.items():
                    if self_us >= 5:
                        print(f"    {name:<40} {calls / queries:12.1f} {self_us:15.0f}")
        finally:
            su.execute("ALTER ROLE benchr_agent RESET track_functions")


def report(shape: str, took: Sample, cpu: Sample) -> list[str]:
    print(f"\n{shape}: {len(next(iter(took.values())))} queries per measure, limit {LIMIT}")
    print(f"  {'measure':<22} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'mean ms':>8}"
          f" {'server CPU ms':>14}")  # fmt: skip
    for name, xs in took.items():
        used = f"{statistics.fmean(cpu[name]):14.3f}" if cpu.get(name) else f"{'':>14}"
        print(f"  {name:<22} {pct(xs, 50):8.2f} {pct(xs, 95):8.2f} {pct(xs, 99):8.2f}"
              f" {statistics.fmean(xs):8.2f} {used}")  # fmt: skip
    p95 = {name: pct(xs, 95) for name, xs in took.items()}
    p50 = {name: pct(xs, 50) for name, xs in took.items()}
    # Governance's own work per call, in the server (the wall-time ratios above carry the
    # commit's WAL flush, which both sides pay and which dominates p95 on a shared machine).
    extra = []
    for kind in ("filter", "text"):
        gov, base = f"governed {kind}", f"select+audit {kind}"
        if cpu.get(gov) and cpu.get(base):
            us = (statistics.fmean(cpu[gov]) - statistics.fmean(cpu[base])) * 1000
            extra.append(
                f"{shape}: governed - select+audit server CPU per call, {kind}: {us:.0f} us"
                f" (governed / select+audit p50 {p50[gov] / p50[base]:.2f}x)"
            )
    return [
        *extra,
        f"{shape}: governed / select+audit p95, filter-only: "
        f"{p95['governed filter'] / p95['select+audit filter']:.2f}x",
        f"{shape}: governed / select+audit p95, full text: "
        f"{p95['governed text'] / p95['select+audit text']:.2f}x",
        f"{shape}: governed / PostgresStore p95, filter-only: "
        f"{p95['governed filter'] / p95['PostgresStore filter']:.2f}x",
        f"{shape}: governed / select+audit p95, 10-word question: "
        f"{p95['governed question'] / p95['select+audit question']:.2f}x"
        f" (governed p50 / p95 / p99 {pct(took['governed question'], 50):.2f}"
        f" / {p95['governed question']:.2f} / {pct(took['governed question'], 99):.2f} ms;"
        f" p95 <= 15 ms: {'met' if p95['governed question'] <= 15 else 'NOT met'})",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=int(os.environ.get("RECORDS", 1_000_000)))
    ap.add_argument("--queries", type=int, default=300, help="per measure and shape")
    ap.add_argument("--shape", choices=["many", "big", "both"], default="both")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the databases DBNAME_*")
    ap.add_argument("--reuse", action="store_true", help="measure on the kept databases")
    ap.add_argument("--profile", action="store_true", help="also profile function by function")
    ap.add_argument(
        "--baseline",
        choices=["trail", "empty"],
        default=None,
        help="the baseline's audit table: a copy of the trail (default) or empty;"
        " with --reuse, given explicitly, it is made again",
    )
    ap.add_argument(
        "--baseline-id",
        choices=["v7", "random"],
        default="v7",
        help="the baseline audit row's id: time-ordered as a governed event's (default) or a"
        " random version-4 id (the baseline before 2026-12-05); with --reuse it remakes the table",
    )
    ap.add_argument("--dbname", default=DBNAME, help=f"the databases' prefix ({DBNAME})")
    args = ap.parse_args()
    server = db.database_url()
    shapes = {
        "many tenants": ([f"t{n:04d}" for n in range(max(1, args.records // 1000))], 10, 1000),
        "big tenants": ([f"b{n:02d}" for n in range(10)], 10, max(10, args.records // 10)),
    }
    if args.shape != "both":
        shapes = {k: v for k, v in shapes.items() if k.startswith(args.shape)}
    ratios: list[str] = []
    for shape, (tenants, subjects, per_tenant) in shapes.items():
        records = len(tenants) * per_tenant
        dbname = f"{args.dbname}_{shape.split()[0]}"
        print(f"{shape}: {len(tenants)} tenants x {subjects} subjects x"
              f" {per_tenant // subjects} records = {records}; database {dbname} ...",
              flush=True)  # fmt: skip
        url = make_conninfo(server, dbname=dbname) if args.reuse else fresh_database(server, dbname)
        try:
            if not args.reuse:
                took_s = load(url, tenants, subjects, per_tenant, args.baseline or "trail")
                print(f"  loaded in {took_s:.0f} s", flush=True)
            elif args.baseline or args.baseline_id != "v7":
                with connect(url) as su:
                    audit_table(su, args.baseline or "trail", args.baseline_id)
            took, used = measure(url, tenants, subjects, args.queries, args.seed)
            if args.profile:
                profile(url, tenants, subjects, min(args.queries, 200), args.seed)
            cpu, pg = machine(url)
        finally:
            if not (args.keep or args.reuse):
                with connect(server) as su:
                    su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(dbname)))  # fmt: skip
        ratios += report(f"{shape} ({records} records)", took, used)
    loadavg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {cpu}; {pg}; load average {loadavg}")
    print("\n".join(ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
