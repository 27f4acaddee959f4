"""The committer worker: drains validated proposals through `fabric_api.commit_pending`
and seals the audit trail (`fabric_api.seal_events`) after each drain.

Each batch is one transaction of the database function (FOR UPDATE SKIP LOCKED, tenant by
tenant), so any number of workers may run at once. Idle, it polls; on a lost connection it
reconnects with capped, jittered backoff and drains again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from memfabric.errors import mapped

Progress = Callable[[str], None]


def drain_once(conn: psycopg.Connection[tuple[object, ...]], batch: int = 100) -> tuple[int, int]:
    """Commit validated proposals until none is left; returns (committed, rejected)."""
    committed = rejected = 0
    while True:
        with mapped():
            row = conn.execute("SELECT fabric_api.commit_pending(%s)", (batch,)).fetchone()
        assert row is not None
        result: dict[str, int] = row[0]  # type: ignore[assignment]
        committed += result["committed"]
        rejected += result["rejected"]
        if result["committed"] + result["rejected"] < batch:
            return committed, rejected


def seal_once(conn: psycopg.Connection[tuple[object, ...]], batch: int = 10000) -> int:
    """Seal every event below the horizon into the tenants' hash chains; returns how many."""
    total = 0
    while True:
        with mapped():
            row = conn.execute("SELECT fabric_api.seal_events(%s)", (batch,)).fetchone()
        assert row is not None
        result: dict[str, int] = row[0]  # type: ignore[assignment]
        sealed = result["sealed"]
        total += sealed
        if sealed < batch:
            return total


def run_sealer(
    conninfo: str,
    *,
    poll_seconds: float = 1.0,
    progress: Progress = print,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Seal continuously (memfabric serve runs this beside the projector); reconnects with
    capped, jittered backoff."""
    backoff = 0.5
    while not should_stop():
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                backoff = 0.5
                while not should_stop():
                    seal_once(conn)
                    time.sleep(poll_seconds)
        except psycopg.Error as exc:
            delay = min(backoff, 30.0) * (0.5 + random.random())  # noqa: S311 - jitter only
            progress(f"sealing paused ({exc.sqlstate or 'no sqlstate'}); retrying in {delay:.1f}s")
            time.sleep(delay)
            backoff *= 2


def run_committer(
    conninfo: str,
    *,
    batch: int = 100,
    once: bool = False,
    poll_seconds: float = 1.0,
    progress: Progress = print,
    should_stop: Callable[[], bool] = lambda: False,
) -> tuple[int, int]:
    """Run until stopped (or one drain with once=True); returns the totals."""
    totals = [0, 0]
    backoff = 0.5
    while not should_stop():
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                backoff = 0.5
                while not should_stop():
                    committed, rejected = drain_once(conn, batch)
                    seal_once(conn)
                    totals[0] += committed
                    totals[1] += rejected
                    if committed or rejected:
                        progress(f"committed {committed}, rejected at commit {rejected}")
                    if once:
                        return totals[0], totals[1]
                    time.sleep(poll_seconds)
        except psycopg.OperationalError as exc:
            if once:
                raise
            delay = min(backoff, 30.0) * (0.5 + random.random())  # noqa: S311 - jitter only
            progress(f"connection lost ({exc.sqlstate or 'no sqlstate'}); retrying in {delay:.1f}s")
            time.sleep(delay)
            backoff *= 2
    return totals[0], totals[1]


def run_decay_once(
    conn: psycopg.Connection[tuple[object, ...]], now: str | None = None, batch: int = 1000
) -> dict[str, object]:
    """One decay pass at `now` (default: the database's now); loops while batches are full."""
    totals: dict[str, int] = {"expired": 0, "windows_closed": 0, "erasure_requests": 0}
    while True:
        with mapped():
            row = conn.execute(
                "SELECT fabric_api.run_decay(coalesce(%s::timestamptz, now()), %s)", (now, batch)
            ).fetchone()
        assert row is not None
        result: dict[str, int] = row[0]  # type: ignore[assignment]
        for key in totals:
            totals[key] += int(result[key])
        if max(int(result[k]) for k in totals) < batch:
            return {**totals, "at": result["at"]}


def erase(conn: psycopg.Connection[tuple[object, ...]], approval_id: str) -> dict[str, object]:
    """Execute an approved erasure, then VACUUM what it touched so the old tuple versions
    (which still hold the content) leave the heap. `conn` must be in autocommit mode."""
    with mapped():
        row = conn.execute("SELECT fabric_api.erase(%s)", (approval_id,)).fetchone()
    assert row is not None
    result: dict[str, object] = row[0]  # type: ignore[assignment]
    for table in result["vacuum"]:  # type: ignore[attr-defined]
        schema, name = str(table).split(".")
        conn.execute(sql.SQL("VACUUM {}.{}").format(sql.Identifier(schema), sql.Identifier(name)))
    return result
