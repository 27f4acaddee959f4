"""The projection feed's database half, old path against new, side by side in one run.

Prints, never asserts (docs/benchmarks.md). Against a migrated database (DATABASE_URL or
--url): --records episodic records are imported into tenant bench-feeds once (kept, reused),
then, interleaved repetition by repetition on the same ids:
1. hydrate --batch records: 0.3's `projection_records` (one jsonb, the embedding as a JSON
   array, parsed into floats) against `projection_records_v2` (rows, binary, the embedding a
   pgvector.Vector);
2. store --batch embeddings of --dims floats: one `store_embedding` call per record with the
   vector as text (0.3's projector) against one `store_embeddings` call with ext.vector[]
   in binary;
3. a full snapshot in pages of 1000: 0.3's `projection_snapshot` against
   `projection_snapshot_v2`.
The jsonb feeds were removed in 0.11; their side runs here as the one SELECT each of them ran
over the row feed (JSONB_RECORDS, JSONB_SNAPSHOT). Embedding itself is not included (it is
the same model either way). Ratios are the last lines.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from benchlib import create_logins
from pgvector import Vector
from psycopg.types.json import Jsonb

from memfabric import db
from memfabric.call import Cast, fabric_call, fabric_rows, register_vector

# 0.3's jsonb feeds (removed in 0.11): one jsonb array over the row feed, the embedding as a
# JSON array of numbers.
JSONB_ROWS = """SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r)
  || pg_catalog.jsonb_build_object('embedding', r.embedding::text::jsonb)
  ORDER BY r.tenant_id, r.memory_id), '[]') FROM {feed} r"""
JSONB_RECORDS = JSONB_ROWS.format(feed="fabric_api.projection_records_v2(%s::uuid[], %s, %s)")
JSONB_SNAPSHOT = JSONB_ROWS.format(
    feed="fabric_api.projection_snapshot_v2(%s, %s::uuid, %s, %s, %s)"
)

Conn = psycopg.Connection[Any]
TENANT, COMMITTER = "bench-feeds", "bench-feeds-010"
LOGINS = {
    "bench_feeds_committer": "fabric_committer",
    "bench_feeds_admin": "fabric_admin",
    "bench_feeds_projector": "fabric_projector",
}
MODEL, VERSION = "bench-feeds-model", "v1"


def setup(url: str, n: int) -> list[str]:
    with psycopg.connect(url, autocommit=True) as su:
        create_logins(su, LOGINS)
        fresh = not su.execute(
            "SELECT 1 FROM fabric.tenants WHERE tenant_id = %s", (TENANT,)
        ).fetchone()
    if fresh:
        with psycopg.connect(db.url_for(url, "bench_feeds_admin"), autocommit=True) as admin:
            fabric_call(admin, "fabric_api.create_tenant", TENANT)
            fabric_call(
                admin, "fabric_api.register_agent", COMMITTER, "bench_feeds_committer", {}, []
            )
            fabric_call(admin, "fabric_api.enable_agent", TENANT, COMMITTER, [])
    with psycopg.connect(url, autocommit=True) as su:
        su.execute("SELECT set_config('fabric.tenant_id', %s, false)", (TENANT,))
        have = su.execute(
            "SELECT count(*) FROM fabric.memory_records WHERE tenant_id = %s", (TENANT,)
        ).fetchone()
    missing = n - int(have[0] if have else 0)
    tag = uuid.uuid4().hex[:8]
    with psycopg.connect(db.url_for(url, "bench_feeds_committer"), autocommit=True) as committer:
        for start in range(0, max(missing, 0), 5000):
            batch = [
                {
                    "scope": {"tenant_id": TENANT, "subject_id": f"user-{i % 50}",
                              "visibility": "subject"},
                    "content": {"text": f"Customer note {tag}-{i}: invoices in EUR, ships to "
                                        "Rotterdam, prefers short answers."},
                    "provenance": {"formation_method": "import"},
                    "confidence": 0.9,
                    "validity_interval": {"valid_from": "2026-07-02T09:14:00Z"},
                    "retention_class": "durable",
                }
                for i in range(start, min(start + 5000, missing))
            ]  # fmt: skip
            fabric_call(committer, "fabric_api.import_records", TENANT, f"feeds-{tag}-{start}",
                        Jsonb(batch))  # fmt: skip
    with psycopg.connect(url, autocommit=True) as su:
        su.execute("SELECT set_config('fabric.tenant_id', %s, false)", (TENANT,))
        rows = su.execute(
            "SELECT memory_id::text FROM fabric.memory_records WHERE tenant_id = %s"
            " ORDER BY memory_id LIMIT %s",
            (TENANT, n),
        ).fetchall()
    return [r[0] for r in rows]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None)
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    url = args.url or db.database_url()
    ids = setup(url, args.records)
    conn = psycopg.connect(db.url_for(url, "bench_feeds_projector"), autocommit=True)
    register_vector(conn)
    su = psycopg.connect(url, autocommit=True)
    hashes = dict(
        su.execute(
            "SELECT memory_id::text, content_hash FROM fabric.memory_records"
            " WHERE memory_id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
    )
    rng = random.Random(7)
    batch = ids[: args.batch]
    vectors = [[rng.uniform(-1, 1) for _ in range(args.dims)] for _ in batch]
    model = (MODEL, VERSION)

    def store_old() -> None:
        for m, v in zip(batch, vectors, strict=True):
            fabric_call(conn, "fabric_api.store_embedding", m, *model,
                        Cast(str(v), "ext.vector"), hashes[m])  # fmt: skip

    def store_new() -> None:
        fabric_rows(conn, "fabric_api.store_embeddings", Cast(batch, "uuid[]"), *model,
                    [Vector(v) for v in vectors], [hashes[m] for m in batch],
                    binary=True)  # fmt: skip

    def hydrate_old() -> None:
        (rows,) = conn.execute(JSONB_RECORDS, (batch, *model)).fetchone() or ([],)
        for r in rows:
            if r["embedding"] is not None:
                [float(x) for x in r["embedding"]]

    def hydrate_new() -> None:
        rows = fabric_rows(conn, "fabric_api.projection_records_v2", Cast(batch, "uuid[]"),
                           *model, binary=True)  # fmt: skip
        for r in rows:
            if r["embedding"] is not None:
                r["embedding"].to_list()

    def snapshot(binary: bool) -> Callable[[], None]:
        def run() -> None:
            after: tuple[str | None, str | None] = (None, None)
            while True:
                if binary:
                    rows = fabric_rows(conn, "fabric_api.projection_snapshot_v2", after[0],
                                       Cast(after[1], "uuid"), 1000, *model,
                                       binary=True)  # fmt: skip
                else:
                    (rows,) = conn.execute(JSONB_SNAPSHOT,
                                           (*after, 1000, *model)).fetchone() or ([],)  # fmt: skip
                if not rows:
                    return
                after = (rows[-1]["tenant_id"], str(rows[-1]["memory_id"]))

        return run

    store_new()  # every record of the batch has an embedding before hydration is timed
    pairs = {
        f"store {args.batch} embeddings": (store_old, store_new),
        f"hydrate {args.batch} records": (hydrate_old, hydrate_new),
        "snapshot (all tenants)": (
            snapshot(False),
            snapshot(True),
        ),
    }
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pairs}
    for _ in range(args.reps):
        for name, (old, new) in pairs.items():
            times[name][0].append(timed(old))
            times[name][1].append(timed(new))
    load = os.getloadavg()
    print(f"records {len(ids)}, batch {args.batch}, dims {args.dims}, reps {args.reps}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    print(f"{'measure':<28} {'0.3 path (ms)':>14} {'rows (ms)':>10} {'old/new':>8}")
    for name, (old_t, new_t) in times.items():
        o, n = statistics.median(old_t) * 1000, statistics.median(new_t) * 1000
        print(f"{name:<28} {o:>14.1f} {n:>10.1f} {o / n:>7.2f}x")
    conn.close()
    su.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
