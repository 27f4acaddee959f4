"""`make bench-import`: bulk import against the same records through propose + commit.

Prints, never asserts. One run: N fresh episodic records imported with
`fabric_api.import_records` in batches (the committer's one call per batch, each its own
transaction), and M other fresh records of the same shape formed one by one (agent
`propose` in its run, committer `commit`, each call its own transaction). Both sides write
what their path writes; the import additionally skips the proposal rows and their events
(docs/import.md). Rates are records per second of wall time; the ratio is the last line.
Beside them, the same records with no rules: the superuser inserts each batch into a copy of
`fabric.memory_records` (schema bench_import_norules, recreated each run: same columns,
defaults, generated columns, indexes and the row-rules CHECK; no trigger, foreign key or
RLS policy), the content hash, search text and length computed inline, one statement a
batch -- what the records themselves cost, with none of the governance (element checks,
formation events, statistics, mentions, subject keys, foreign keys) around them. `import /
the same rows with no rules` compares the import on one connection with it.
When the server runs on this machine, the server CPU time of the import connections is
printed too (microseconds a record, from /proc): on a shared machine it moves much less
than wall time, so it is the figure to compare between changes.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from benchlib import backend_cpu, call, create_logins
from psycopg.types.json import Jsonb

from memfabric import db

Conn = psycopg.Connection[tuple[Any, ...]]
TENANT, SUBJECT, SESSION = "bench-import", "user-bench", "sess-bench"
AGENT, COMMITTER = "bench-imp-003", "bench-imp-010"
LOGINS = {
    "bench_imp_agent": None,
    "bench_imp_committer": "fabric_committer",
    "bench_imp_orchestrator": "fabric_orchestrator",
    "bench_imp_admin": "fabric_admin",
}
TOOLS = ["tool:memory-propose"]
PROFILE = {"propose_scope": {"tiers": ["episodic"], "visibility": ["subject", "agent"]}}
IMPORT = "SELECT fabric_api.import_records(%s, %s, %s)"
NORULES_DDL = """
DROP SCHEMA IF EXISTS bench_import_norules CASCADE;
CREATE SCHEMA bench_import_norules;
CREATE TABLE bench_import_norules.memory_records (LIKE fabric.memory_records INCLUDING ALL);
"""
# The import's INSERT with the values its trigger derives computed inline (one statement).
NORULES = """
INSERT INTO bench_import_norules.memory_records (tenant_id, tier, visibility, subject_id,
  agent_id, session_id, content, content_hash, source_event_id, correlation_id, formed_by,
  formation_method, confidence, valid_from, valid_until, retention_class, compliance_labels,
  search_tsv, search_length)
SELECT %(t)s, 'episodic', e -> 'scope' ->> 'visibility', e -> 'scope' ->> 'subject_id',
  e -> 'scope' ->> 'agent_id', e -> 'scope' ->> 'session_id', e -> 'content',
  fabric.content_hash(e -> 'content'), %(src)s, e -> 'provenance' ->> 'correlation_id',
  %(by)s, 'import', (e ->> 'confidence')::float8,
  (e -> 'validity_interval' ->> 'valid_from')::timestamptz,
  (e -> 'validity_interval' ->> 'valid_until')::timestamptz, e ->> 'retention_class',
  ARRAY(SELECT jsonb_array_elements_text(e -> 'compliance_labels')), x.tsv,
  fabric._search_length(x.tsv)
FROM jsonb_array_elements(%(records)s) e
CROSS JOIN LATERAL (SELECT fabric._search_text(e -> 'content') AS tsv) x
"""
FILLER = "Customer prefers invoices in EUR via Acme Logistics BV; confirmed on the call."


def setup(url: str) -> uuid.UUID:
    """Logins, tenant, agents and one run (idempotent)."""
    with psycopg.connect(url, autocommit=True) as su:
        create_logins(su, LOGINS)
        known = su.execute("SELECT 1 FROM fabric.tenants WHERE tenant_id = %s", (TENANT,))
        fresh = known.fetchone() is None
    if fresh:
        with psycopg.connect(db.url_for(url, "bench_imp_admin"), autocommit=True) as admin:
            call(admin, "SELECT fabric_api.create_tenant(%s)", TENANT)
            register = "SELECT fabric_api.register_agent(%s, %s, %s, %s)"
            call(admin, register, AGENT, "bench_imp_agent", Jsonb(PROFILE), TOOLS)
            call(admin, register, COMMITTER, "bench_imp_committer", Jsonb({}), [])
            call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", TENANT, AGENT, TOOLS)
            call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", TENANT, COMMITTER, [])
    with psycopg.connect(db.url_for(url, "bench_imp_orchestrator"), autocommit=True) as orch:
        open_run = "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, %s::interval)"
        run_id: uuid.UUID = call(orch, open_run, TENANT, AGENT, SUBJECT, SESSION, TOOLS, "6 hours")
    return run_id


def element(tag: str, i: int) -> dict[str, Any]:
    """An import element: full scope, content unique per run and index."""
    return {
        "scope": {
            "tenant_id": TENANT,
            "subject_id": SUBJECT,
            "agent_id": AGENT,
            "session_id": SESSION,
            "visibility": "subject",
        },
        "content": {"text": f"{FILLER} turn {tag}-{i}", "turn": i},
        "provenance": {"correlation_id": f"corr-{tag}", "formation_method": "import"},
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        "retention_class": "durable",
        "compliance_labels": ["pii"],
    }


def envelope(el: dict[str, Any], source_event: str) -> dict[str, Any]:
    """The same record as a proposal of the agent in its run."""
    return {
        **el,
        "tier": "episodic",
        "provenance": {**el["provenance"], "source_event_id": source_event},
    }


def run_import(conns: list[Conn], tag: str, n: int, batch: int) -> float:
    """Import n records in batches, one batch in flight per connection."""

    def one_batch(conn: Conn, b0: int) -> None:
        records = [element(tag, i) for i in range(b0, min(b0 + batch, n))]
        res = call(conn, IMPORT, TENANT, f"bench-{tag}-{b0}", Jsonb(records))
        if res["refused"]:
            raise SystemExit(f"the bench's own records were refused: {res['refusals'][:3]}")

    starts = list(range(0, n, batch))
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(conns)) as pool:
        for future in [
            pool.submit(lambda k: [one_batch(conns[k], b) for b in starts[k :: len(conns)]], k)
            for k in range(len(conns))
        ]:
            future.result()
    return time.perf_counter() - start


def run_norules(su: Conn, tag: str, n: int, batch: int) -> float:
    """The same records, no rules: one INSERT a batch into the copy, each its own transaction."""
    start = time.perf_counter()
    for b0 in range(0, n, batch):
        records = [element(tag, i) for i in range(b0, min(b0 + batch, n))]
        args = {"t": TENANT, "src": f"bench-{tag}-{b0}", "by": COMMITTER, "records": Jsonb(records)}
        su.execute(NORULES, args, prepare=True)
    return time.perf_counter() - start


def run_single(agent: Conn, committer: Conn, run_id: uuid.UUID, tag: str, m: int) -> float:
    start = time.perf_counter()
    for i in range(m):
        env = envelope(element(tag, i), f"evt-{tag}-{i}")
        answer = call(agent, "SELECT fabric_api.propose(%s, %s)", Jsonb(env), run_id)
        if answer["status"] != "validated":
            raise SystemExit(f"the bench's own proposal was not validated: {answer}")
        call(committer, "SELECT fabric_api.commit(%s)", answer["proposal_id"])
    return time.perf_counter() - start


def machine(url: str) -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    with psycopg.connect(url, autocommit=True) as su:
        s: dict[str, str] = dict(su.execute("SELECT name, setting FROM pg_settings").fetchall())
    return (
        f"nproc {os.cpu_count()}, {cpu}; PostgreSQL {s['server_version']}, "
        f"fsync={s['fsync']}, synchronous_commit={s['synchronous_commit']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20000, help="records imported")
    parser.add_argument("--batch", type=int, default=1000, help="records per import call")
    parser.add_argument("--single", type=int, default=1000, help="records propose+commit")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured records per side")
    parser.add_argument("--jobs", type=int, default=2, help="import connections (the CLI's --jobs)")
    args = parser.parse_args()
    url = db.database_url()
    run_id = setup(url)
    tag = uuid.uuid4().hex[:8]
    agent = psycopg.connect(db.url_for(url, "bench_imp_agent"), autocommit=True)
    committers = [
        psycopg.connect(db.url_for(url, "bench_imp_committer"), autocommit=True)
        for _ in range(max(args.jobs, 1))
    ]
    one, many = committers[:1], committers
    su = psycopg.connect(url, autocommit=True)
    su.execute(NORULES_DDL)
    try:
        run_import(many, f"{tag}w", args.warmup, min(args.batch, args.warmup))
        run_norules(su, f"{tag}w", args.warmup, min(args.batch, args.warmup))
        run_single(agent, one[0], run_id, f"{tag}w", args.warmup)
        # Interleaved halves, so drift on the shared machine hits every side.
        t_imp = t_par = t_one = t_raw = 0.0
        cpu_imp: float | None = 0.0
        cpu_one: float | None = 0.0
        cpu_raw: float | None = 0.0
        for half in ("a", "b"):
            cpu_start = backend_cpu([su])
            t_raw += run_norules(su, f"{tag}{half}", args.records // 2, args.batch)
            cpu_end = backend_cpu([su])
            if cpu_raw is None or cpu_start is None or cpu_end is None:
                cpu_raw = None
            else:
                cpu_raw += cpu_end - cpu_start
            cpu_start = backend_cpu(one)
            t_imp += run_import(one, f"{tag}{half}", args.records // 2, args.batch)
            cpu_end = backend_cpu(one)
            if cpu_imp is None or cpu_start is None or cpu_end is None:
                cpu_imp = None
            else:
                cpu_imp += cpu_end - cpu_start
            cpu_start = backend_cpu([agent, one[0]])
            t_one += run_single(agent, one[0], run_id, f"{tag}{half}", args.single // 2)
            cpu_end = backend_cpu([agent, one[0]])
            if cpu_one is None or cpu_start is None or cpu_end is None:
                cpu_one = None
            else:
                cpu_one += cpu_end - cpu_start
            t_par += run_import(many, f"{tag}{half}p", args.records // 2, args.batch)
    finally:
        su.execute("DROP SCHEMA IF EXISTS bench_import_norules CASCADE")
        for conn in [agent, *committers, su]:
            conn.close()
    n, m = args.records // 2 * 2, args.single // 2 * 2
    imp_rate, par_rate, one_rate, raw_rate = n / t_imp, n / t_par, m / t_one, n / t_raw
    print(f"machine: {machine(url)}")
    print(f"settings: records {n}, batch {args.batch}, single {m}, warm-up {args.warmup}")
    b, k = args.batch, len(many)
    print(f"import_records (batch {b}, 1 connection): {n} in {t_imp:.2f} s = {imp_rate:,.0f}/s")
    print(f"import_records (batch {b}, {k} connections): {n} in {t_par:.2f} s = {par_rate:,.0f}/s")
    print(f"propose+commit single: {m} records in {t_one:.2f} s = {one_rate:,.0f}/s")
    print(f"the same rows, no rules (batch {b}, 1 connection): {n} in {t_raw:.2f} s"
          f" = {raw_rate:,.0f}/s")  # fmt: skip
    for label, cpu, count in (
        ("import_records (1 connection)", cpu_imp, n),
        ("the same rows, no rules", cpu_raw, n),
        ("propose+commit single", cpu_one, m),
    ):
        if cpu:
            print(
                f"{label} server CPU: {cpu * 1e6 / count:,.0f} µs a record"
                f" (= {count / cpu:,.0f}/s on one free core)"
            )
    print(f"import rate: {max(imp_rate, par_rate):,.0f} records/s (goal >= 10,000/s)")
    print(f"import (1 connection) / single propose+commit: {imp_rate / one_rate:.1f}x")
    if cpu_imp and cpu_raw:
        print(f"import / the same rows with no rules, server CPU: {cpu_raw / cpu_imp:.2f}")
    print(f"import / the same rows with no rules: {imp_rate / raw_rate:.2f} (goal >= 0.6)")
    print(f"import ({len(many)} connections) / single propose+commit: {par_rate / one_rate:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
