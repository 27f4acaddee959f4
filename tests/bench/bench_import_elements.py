"""The import's element checks alone: server CPU of `fabric._import_elements` a record.

Prints, never asserts. Each measure is one statement over 1,000 elements in a transaction
rolled back, run `--runs` times; the median of the backend's CPU (from
/proc/<pid>/schedstat, so the server must run on this machine) is printed in microseconds a
record. `read the array` is `jsonb_array_elements` over the same parameter (what any reader
pays); `fast path` is `fabric._import_elements` over the elements of `make bench-import`
(tests/bench/bench_import.py's `element()`), all read by the set-based query; `slow path` is
the same elements each with one field the fast test leaves to `fabric._import_element`
(a valid SemVer pre-release version), so every element is read one by one.

    .venv/bin/python tests/bench/bench_import_elements.py [--runs 8] [--records 1000]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import psycopg
from bench_import import TENANT, element
from benchlib import server_cpu_ms
from psycopg.types.json import Jsonb

from memfabric import db

MEASURES = {
    "read the array": "SELECT count(*) FROM jsonb_array_elements(%s)",
    "_import_elements": "SELECT count(*) FROM fabric._import_elements(%s, %s)",
}


def measure(conn: psycopg.Connection[Any], query: str, records: list[Any], runs: int) -> float:
    """Median µs a record of `query` over `records`, each run in a transaction rolled back."""
    args: tuple[Any, ...] = (Jsonb(records),) + ((TENANT,) if query.count("%s") == 2 else ())
    samples = []
    for _ in range(runs + 1):  # the first run plans and warms the caches: not counted
        with conn.transaction(force_rollback=True):
            start = server_cpu_ms(conn)
            conn.execute(query, args).fetchone()
            end = server_cpu_ms(conn)
            if start is None or end is None:
                raise SystemExit("the server runs elsewhere: its CPU cannot be read from /proc")
            samples.append((end - start) * 1000 / len(records))
    return statistics.median(samples[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="measured runs a measure")
    parser.add_argument("--records", type=int, default=1000, help="elements a statement")
    args = parser.parse_args()
    fast = [element("elem", i) for i in range(args.records)]
    slow = [{**el, "version": "1.0.0-rc.1"} for el in fast]
    with psycopg.connect(db.database_url(), autocommit=True) as conn:
        base = measure(conn, MEASURES["read the array"], fast, args.runs)
        rows = [
            ("fast path", measure(conn, MEASURES["_import_elements"], fast, args.runs)),
            ("slow path", measure(conn, MEASURES["_import_elements"], slow, args.runs)),
        ]
    print(f"{args.records} elements a statement, median of {args.runs} runs, server CPU")
    print(f"read the array: {base:.1f} µs a record")
    for label, value in rows:
        print(f"{label}: {value:.1f} µs a record ({value - base:.1f} beyond reading the array)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
