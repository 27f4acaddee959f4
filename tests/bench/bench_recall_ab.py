"""Governed recall against its select+audit baseline, this build beside the one before it,
in one run on one database: a `make bench-recall` fixture kept with `--keep`, into which the
recall functions as they were before (tests/fixtures/recall_reference.sql, schema recall_ref,
owned as the fabric's are) are installed beside the current ones, so that both builds read
the same records and write into the same trail.

Prints, never asserts. Three measures, each from its own connection: governed recall now
(`fabric_api.recall` as the agent, tier episodic, limit 8, filter-only unless --word), as
before (`recall_ref.recall`, the same request), and the select+audit baseline of
`bench_recall.py` (the same retrieval and one audit row, one transaction, as the superuser).
Each round runs a block of --block calls of every measure, the blocks in a shuffled order,
over the same (tenant, subject) runs; a CHECKPOINT every --checkpoint rounds, so that every
measure pays the full-page images that follow one alike. Printed: p50 / p95 ms of wall time,
the server CPU per call (the backend's /proc/<pid>/schedstat: it moves much less than wall
time on a shared machine), governed / baseline p95 for each build, governance's CPU per call
(governed minus baseline), and how many answers' records differ between the builds (0).

    .venv/bin/python tests/bench/bench_recall_ab.py --db memfabric_bench_recall_many
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_projection import call, connect, pct
from bench_recall import (
    AGENT,
    AUDIT_DDL,
    BASE_AUDIT,
    BASE_SELECT,
    LIMIT,
    OPEN_RUN,
    TOOLS,
    TOPICS,
    server_cpu_ms,
)
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from memfabric import db

REFERENCE = Path(__file__).parent.parent / "fixtures" / "recall_reference.sql"
FUNCTIONS = {"governed now": "fabric_api.recall", "governed before": "recall_ref.recall"}


def install_reference(su: Any) -> None:
    """The functions as they were, in schema recall_ref (made again), owned as the fabric's."""
    su.execute("DROP SCHEMA IF EXISTS recall_ref CASCADE")
    su.execute("CREATE SCHEMA recall_ref")
    su.execute(REFERENCE.read_text())
    for (signature,) in su.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace = 'recall_ref'::regnamespace"
    ).fetchall():
        su.execute(sql.SQL("ALTER FUNCTION {} OWNER TO fabric_owner").format(sql.SQL(signature)))
    su.execute("GRANT USAGE ON SCHEMA recall_ref TO PUBLIC")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--db", required=True, help="a database kept by make bench-recall")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block", type=int, default=40, help="calls of one measure in a row")
    ap.add_argument("--checkpoint", type=int, default=3, help="a CHECKPOINT every N rounds")
    ap.add_argument("--word", action="store_true", help="one topic word (text) instead")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    url = make_conninfo(db.database_url(), dbname=args.db)
    with connect(url) as su:
        su.autocommit = True
        install_reference(su)
        if not su.execute("SELECT to_regclass('bench_baseline.events')").fetchone()[0]:
            su.execute(AUDIT_DDL)  # the baseline's table, as bench_recall makes it
        tenants = [r[0] for r in su.execute("SELECT tenant_id FROM fabric.tenants ORDER BY 1")]
    pairs = [(rng.choice(tenants), f"user-{rng.randrange(10)}") for _ in range(50)]
    with connect(url, "benchr_orchestrator") as orch:
        runs = {p: call(orch, OPEN_RUN, p[0], AGENT, p[1], "sess-1", TOOLS) for p in pairs}
    names = [*FUNCTIONS, "baseline"]
    conns = {n: connect(url, None if n == "baseline" else "benchr_agent") for n in names}
    answers: dict[tuple[str, int], list[str]] = {}

    def one(name: str, k: int, pair: tuple[str, str], word: str | None) -> None:
        conn = conns[name]
        if name in FUNCTIONS:
            request = {"run_id": str(runs[pair]), "tiers": ["episodic"], "limit": LIMIT}
            if word:
                request |= {"query": word, "mode": "text"}
            answer = call(conn, f"SELECT {FUNCTIONS[name]}(%s)", Jsonb(request))
            assert answer["status"] == "served", answer
            answers[(name, k)] = [r["memory_id"] for r in answer["records"]]
            return
        keys = [f"subject:{pair[1]}", "tenant"]
        with conn.transaction():
            rows = conn.execute(BASE_SELECT, (pair[0], keys, word, LIMIT + 1)).fetchall()
            payload = {"status": "served", "agent_id": AGENT, "tiers_served": ["episodic"],
                       "memory_ids": [str(r[0]) for r in rows[:LIMIT]]}  # fmt: skip
            conn.execute(BASE_AUDIT, (pair[0], "corr", AGENT, runs[pair], Jsonb(payload)))

    def calls() -> list[tuple[tuple[str, str], str | None]]:
        return [(rng.choice(pairs), f"topic{rng.randrange(TOPICS)}" if args.word else None)
                for _ in range(args.block)]  # fmt: skip

    took: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    try:
        warm = calls()
        for name in names:  # plans and caches
            for k, (pair, word) in enumerate(warm):
                one(name, -1 - k, pair, word)
        for r in range(args.rounds):
            if args.checkpoint and r % args.checkpoint == 0:
                conns["baseline"].execute("CHECKPOINT")
            block = calls()
            order = names[:]
            rng.shuffle(order)
            for name in order:
                for k, (pair, word) in enumerate(block):
                    c = server_cpu_ms(conns[name])
                    t = time.perf_counter()
                    one(name, r * args.block + k, pair, word)
                    took[name].append((time.perf_counter() - t) * 1000)
                    if c is not None and (c2 := server_cpu_ms(conns[name])) is not None:
                        cpu[name].append(c2 - c)
    finally:
        for conn in conns.values():
            conn.close()
    kind = "one topic word" if args.word else "filter-only"
    n = args.rounds * args.block
    print(f"{args.db}, {kind}: {n} calls per measure in blocks of {args.block},"
          f" {args.rounds} rounds in shuffled order")  # fmt: skip
    print(f"  {'measure':<16} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8} {'server CPU us':>14}")
    for name in names:
        us = statistics.fmean(cpu[name]) * 1000 if cpu[name] else float("nan")
        print(f"  {name:<16} {pct(took[name], 50):8.2f} {pct(took[name], 95):8.2f}"
              f" {statistics.fmean(took[name]):8.2f} {us:14.0f}")  # fmt: skip
    for name in FUNCTIONS:
        ratio = pct(took[name], 95) / pct(took["baseline"], 95)
        extra = (statistics.fmean(cpu[name]) - statistics.fmean(cpu["baseline"])) * 1000
        print(f"{name}: governed / select+audit p95 {ratio:.2f}x"
              f" (p50 {pct(took[name], 50) / pct(took['baseline'], 50):.2f}x);"
              f" governance's server CPU per call {extra:.0f} us")  # fmt: skip
    differ = sum(answers[("governed now", k)] != answers[("governed before", k)] for k in range(n))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"answers whose records differ between the builds: {differ} of {n}")
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
