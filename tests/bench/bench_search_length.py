"""`python tests/bench/bench_search_length.py`: lexical recall's statement with each record's
stored search length (memory_records.search_length, migration 0021) against the same
statement counting the length from the search text per candidate, as before 0021.

Prints, never asserts. One fresh database (DBNAME, dropped afterwards unless --keep) of
RECORDS records in one tenant with 10 subjects (bench_recall's generator and fixture: the
episodic half imported, the semantic half by the shortcut). Both functions are installed
side by side: fabric._recall_candidates as migrated, and a copy
(fabric._recall_candidates_recounted, owned like it by fabric_retriever) whose only
difference is the length: an unnest of the whole search text per candidate. Queried from one
connection as the superuser, interleaved query by query (the order alternates each turn), on
one subject's scope plus the tenant's, tier episodic, limit 50, for four queries: one word
every record holds through the filler ("invoice": every record in scope is a candidate), 30
topic words (about 2,000 candidates), bench_recall's 10-word question with one topic word,
and one topic word. Every pair of answers is compared: same records, same order, same
scores.
"""

from __future__ import annotations

import argparse
import os
import random
import time

from bench_projection import connect, pct
from bench_recall import DBNAME as RECALL_DBNAME
from bench_recall import QUESTION, TOPICS, fresh_database, load
from bench_write import machine
from psycopg import sql

from memfabric import db

DBNAME = f"{RECALL_DBNAME}_length"
STORED = "GREATEST(m.search_length, 1)::double precision AS n) dl"
RECOUNTED = """GREATEST(pg_catalog.sum(coalesce(pg_catalog.array_length(u.positions, 1), 1)), 1)
                 ::double precision AS n
          FROM pg_catalog.unnest(m.search_tsv) u) dl"""
MATCHING = """SELECT count(*) FROM fabric.memory_records WHERE tenant_id = %s
  AND scope_key = ANY (%s) AND search_tsv @@ replace(plainto_tsquery('english', %s)::text,
  '&', '|')::tsquery"""
CALL = """SELECT memory_id, score, record FROM {}(%s, %s, ARRAY['episodic'], now(), 0, '{{}}',
  %s, NULL, NULL, 50)"""


def install_recounted(url: str) -> None:
    """The migrated function's definition with the length counted per candidate."""
    with connect(url) as su:
        row = su.execute(
            "SELECT pg_get_functiondef('fabric._recall_candidates(text, text[], text[],"
            " timestamptz, double precision, text[], text, uuid[], double precision[],"
            " integer)'::regprocedure)"
        ).fetchone()
        assert row is not None
        body: str = row[0]
        # every statement of the function that reads the stored length (the lexical list and
        # the walk of a common lexeme's holders)
        assert body.count(STORED) >= 1, "the stored length is not where this bench expects it"
        body = body.replace(STORED, RECOUNTED).replace(
            "fabric._recall_candidates(", "fabric._recall_candidates_recounted(", 1
        )
        su.execute("SET ROLE fabric_retriever")
        su.execute(body)  # the function's own definition, renamed
        su.execute("RESET ROLE")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=int(os.environ.get("RECORDS", 100_000)))
    ap.add_argument("--queries", type=int, default=60, help="per question and function")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help=f"keep the database {DBNAME}")
    args = ap.parse_args()
    server = db.database_url()
    subjects = 10
    print(f"1 tenant x {subjects} subjects x {args.records // subjects} records; "
          f"database {DBNAME} ...", flush=True)  # fmt: skip
    url = fresh_database(server, DBNAME)
    try:
        took = load(url, ["b00"], subjects, args.records)
        print(f"loaded in {took:.0f} s", flush=True)
        install_recounted(url)
        rng = random.Random(args.seed)
        questions = {
            "one common word": lambda: "invoice",
            "30 topic words": lambda: " ".join(f"topic{t}" for t in rng.sample(range(TOPICS), 30)),
            "10-word question": lambda: QUESTION.format(topic=f"topic{rng.randrange(TOPICS)}"),
            "one topic word": lambda: f"topic{rng.randrange(TOPICS)}",
        }
        functions = {
            "stored": sql.SQL(CALL).format(sql.SQL("fabric._recall_candidates")),
            "recounted": sql.SQL(CALL).format(sql.SQL("fabric._recall_candidates_recounted")),
        }
        took_ms: dict[tuple[str, str], list[float]] = {
            (q, f): [] for q in questions for f in functions
        }
        differ = 0
        rows_: dict[str, int] = {}
        matched: dict[str, list[int]] = {q: [] for q in questions}
        with connect(url) as su:
            for turn in range(args.queries + 5):  # the first 5 turns warm up, unmeasured
                for q, make in questions.items():
                    text = make()
                    keys = [f"subject:user-{rng.randrange(subjects)}", "tenant"]
                    order = list(functions) if turn % 2 == 0 else list(reversed(functions))
                    answers = {}
                    for f in order:
                        t = time.perf_counter()
                        rows = su.execute(functions[f], ("b00", keys, text)).fetchall()
                        ms = (time.perf_counter() - t) * 1000
                        answers[f] = [(str(r[0]), r[1], r[2]) for r in rows]
                        if turn >= 5:
                            took_ms[(q, f)].append(ms)
                    differ += answers["stored"] != answers["recounted"]
                    rows_[q] = len(answers["stored"])
                    if turn < 5:  # candidates: records in scope holding any query lexeme
                        row = su.execute(MATCHING, ("b00", keys, text)).fetchone()
                        matched[q].append(row[0] if row else 0)
        cpu, pg = machine(url)
        print(f"{cpu}; {pg}; load average {os.getloadavg()}")
        print(f"answers that differ (records, order or scores): {differ}")
        print(f"{'question':<20} {'function':<10} {'p50 ms':>8} {'p95 ms':>8}"
              "  rows, records holding a query lexeme")  # fmt: skip
        for q in questions:
            for f in functions:
                xs = took_ms[(q, f)]
                print(f"{q:<20} {f:<10} {pct(xs, 50):8.1f} {pct(xs, 95):8.1f}  {rows_[q]}, "
                      f"~{sum(matched[q]) // len(matched[q])}")  # fmt: skip
            s, r = took_ms[(q, "stored")], took_ms[(q, "recounted")]
            print(f"{q:<20} {'ratio':<10} {pct(r, 50) / pct(s, 50):8.2f} "
                  f"{pct(r, 95) / pct(s, 95):8.2f}  recounted / stored")  # fmt: skip
    finally:
        if not args.keep:
            with connect(server) as su:
                su.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(DBNAME)
                    )
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
