"""`memfabric.Memory.search` against the SDK's recall on the same data: the facade's cost.

Prints, never asserts. In a fresh database DBNAME on DATABASE_URL's server (a superuser URL;
dropped afterwards), a `Memory` adds RECORDS memories for one user (Mem0's `add`, each one a
proposal committed by the facade's committer), then the same questions are asked, interleaved
query by query, through `Memory.search(q, user_id=…, limit=5)` and through the SDK
(`Fabric.agent(login, run).recall(q, limit=5)` in the run the facade opened), ROUNDS times.
Both in text mode (no broker): what is measured is the facade, not the vector search.

    DATABASE_URL=postgresql://postgres@127.0.0.1:54329/postgres \\
        .venv/bin/python tests/bench/bench_memory.py --records 2000 --rounds 300
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import psycopg
from psycopg import sql

from memfabric import db as mfdb
from memfabric.memory import Memory, MemoryConfig
from memfabric.sdk import Fabric

WORDS = [
    "invoice",
    "rotterdam",
    "tea",
    "coffee",
    "pilot",
    "utrecht",
    "berlin",
    "cycling",
    "piano",
    "garden",
    "dentist",
    "mortgage",
    "vacation",
    "sister",
    "dog",
    "allergy",
    "peanuts",
    "running",
    "marathon",
    "python",
    "kotlin",
]


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--dbname", default="mf_bench_memory")
    args = parser.parse_args()
    base = os.environ["DATABASE_URL"]
    with psycopg.connect(base, autocommit=True) as su:
        su.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname))
        )
        su.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    url = psycopg.conninfo.make_conninfo(base, dbname=args.dbname)
    try:
        mfdb.migrate(url)
        rng = random.Random(7)
        with Memory(MemoryConfig(database_url=url, broker=False)) as m:
            started = time.perf_counter()
            for i in range(0, args.records, 50):
                batch = [
                    {"role": "user", "content": f"note {i + j}: " + " ".join(rng.sample(WORDS, 4))}
                    for j in range(min(50, args.records - i))
                ]
                m.add(batch, user_id="alice")
            load = time.perf_counter() - started
            m.search("tea", user_id="alice")  # the run is open
            run = next(iter(m._core.runs.values())).run_id
            with Fabric(url, max_size=1) as mf:
                agent = mf.agent(m.config.logins.agent, run, tenant_id=m.config.tenant_id)
                facade: list[float] = []
                sdk: list[float] = []
                for turn in range(args.rounds):
                    q = " ".join(rng.sample(WORDS, 2))
                    order = [("facade", facade), ("sdk", sdk)]
                    for name, times in order if turn % 2 else order[::-1]:
                        t = time.perf_counter()
                        if name == "facade":
                            m.search(q, user_id="alice", limit=5)
                        else:
                            agent.recall(q, limit=5, mode="text")
                        times.append(time.perf_counter() - t)
        print(f"{args.records} memories added in {load:.1f} s ({args.records / load:.0f}/s)")
        for name, times in (("Memory.search", facade), ("SDK recall", sdk)):
            print(f"{name:14} p50 {p(times, 50):6.2f} ms  p95 {p(times, 95):6.2f} ms")
        print(f"p95 ratio Memory.search / SDK recall: {p(facade, 95) / p(sdk, 95):.2f}")
    finally:
        with psycopg.connect(base, autocommit=True) as su:
            su.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(args.dbname)
                )
            )


if __name__ == "__main__":
    main()
