"""Governed recall against its select+audit baseline on two builds side by side: the same
`make bench-recall` fixture in two databases (kept with `--keep`, one copied from the other
with CREATE DATABASE ... TEMPLATE), one migrated by each build, measured in one run.

Prints, never asserts. Four measures, each from its own connection: governed recall
(`fabric_api.recall` as the agent, tier episodic, limit 8, filter-only unless --word) and the
select+audit baseline of `bench_recall.py` (the same retrieval and one audit row, one
transaction, as the superuser), on the "before" and on the "after" database. Each round runs
a block of --block calls of every measure, the blocks in a shuffled order, over the same
(tenant, subject) runs; a CHECKPOINT every --checkpoint rounds, so that both builds pay the
full-page images that follow one alike. Printed: p50 / p95 ms of wall time, the server CPU
per call (the backend's /proc/<pid>/schedstat: it moves much less than wall time on a shared
machine), governed / baseline p95 per build and governance's CPU per call (governed minus
baseline), and how many answers' records differ between the builds (the same data: 0).

    .venv/bin/python tests/bench/bench_recall_ab.py \\
        --before memfabric_bench_recall_many --after rcost_after_many
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from datetime import UTC, datetime
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
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from memfabric import db


def pairs_of(url: str, n: int, rng: random.Random) -> list[tuple[str, str]]:
    """n random (tenant, subject) pairs of the fixture (its tenants as the database holds them)."""
    with connect(url) as su:
        tenants = [r[0] for r in su.execute("SELECT tenant_id FROM fabric.tenants ORDER BY 1")]
    return [(rng.choice(tenants), f"user-{rng.randrange(10)}") for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--before", required=True, help="the database migrated by the old build")
    ap.add_argument("--after", required=True, help="the database migrated by the new build")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block", type=int, default=40, help="calls of one measure in a row")
    ap.add_argument("--checkpoint", type=int, default=3, help="a CHECKPOINT every N rounds")
    ap.add_argument("--word", action="store_true", help="one topic word (text) instead")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    server = db.database_url()
    urls = {b: make_conninfo(server, dbname=d) for b, d in (("before", args.before),
                                                             ("after", args.after))}  # fmt: skip
    pairs = pairs_of(urls["before"], 50, rng)
    conns: dict[str, Any] = {}
    runs: dict[str, dict[tuple[str, str], Any]] = {}
    try:
        for build, url in urls.items():
            with connect(url, "benchr_orchestrator") as orch:
                runs[build] = {p: call(orch, OPEN_RUN, p[0], AGENT, p[1], "sess-1", TOOLS)
                               for p in pairs}  # fmt: skip
            conns[f"governed {build}"] = connect(url, "benchr_agent")
            conns[f"baseline {build}"] = connect(url)
            with connect(url) as su:  # the baseline's table, as bench_recall makes it
                if not su.execute("SELECT to_regclass('bench_baseline.events')").fetchone()[0]:
                    su.execute(AUDIT_DDL)
        answers: dict[tuple[str, int], list[str]] = {}

        def one(name: str, k: int, pair: tuple[str, str], word: str | None) -> None:
            kind, build = name.split()
            conn = conns[name]
            if kind == "governed":
                request = {"run_id": str(runs[build][pair]), "tiers": ["episodic"],
                           "limit": LIMIT}  # fmt: skip
                if word:
                    request |= {"query": word, "mode": "text"}
                answer = call(conn, "SELECT fabric_api.recall(%s)", Jsonb(request))
                assert answer["status"] == "served", answer
                answers[(build, k)] = [r["memory_id"] for r in answer["records"]]
                return
            keys = [f"subject:{pair[1]}", "tenant"]
            with conn.transaction():
                rows = conn.execute(BASE_SELECT, (pair[0], keys, word, LIMIT + 1)).fetchall()
                payload = {"status": "served", "agent_id": AGENT, "tiers_served": ["episodic"],
                           "memory_ids": [str(r[0]) for r in rows[:LIMIT]]}  # fmt: skip
                conn.execute(BASE_AUDIT, (pair[0], "corr", AGENT, runs[build][pair],
                                          Jsonb(payload)))  # fmt: skip

        names = list(conns)
        calls = [(rng.choice(pairs), f"topic{rng.randrange(TOPICS)}" if args.word else None)
                 for _ in range(args.block)]  # fmt: skip
        for name in names:  # warm plans and caches
            for k, (pair, word) in enumerate(calls[:10]):
                one(name, k, pair, word)
        took: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            if args.checkpoint and r % args.checkpoint == 0:
                conns["baseline before"].execute("CHECKPOINT")
            calls = [(rng.choice(pairs), f"topic{rng.randrange(TOPICS)}" if args.word else None)
                     for _ in range(args.block)]  # fmt: skip
            order = names[:]
            rng.shuffle(order)
            for name in order:
                for k, (pair, word) in enumerate(calls):
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
    print(f"{kind}: {n} calls per measure in blocks of {args.block}, {args.rounds} rounds")
    print(f"  {'measure':<18} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8} {'server CPU us':>14}")
    for name in names:
        us = statistics.fmean(cpu[name]) * 1000 if cpu[name] else float("nan")
        print(f"  {name:<18} {pct(took[name], 50):8.2f} {pct(took[name], 95):8.2f}"
              f" {statistics.fmean(took[name]):8.2f} {us:14.0f}")  # fmt: skip
    for build in urls:
        gov, base = f"governed {build}", f"baseline {build}"
        ratio = pct(took[gov], 95) / pct(took[base], 95)
        extra = (statistics.fmean(cpu[gov]) - statistics.fmean(cpu[base])) * 1000
        print(f"{build}: governed / select+audit p95 {ratio:.2f}x"
              f" (p50 {pct(took[gov], 50) / pct(took[base], 50):.2f}x);"
              f" governance's server CPU per call {extra:.0f} us")  # fmt: skip
    both = [k for k in range(n) if ("before", k) in answers and ("after", k) in answers]
    differ = sum(answers[("before", k)] != answers[("after", k)] for k in both)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"answers whose records differ between the builds: {differ}")
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
