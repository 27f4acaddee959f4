"""The committer worker: drains validated proposals through `fabric_api.commit_pending`.

Sealing the audit trail (`fabric_api.seal_events`) has one owner, the sealer `memfabric
serve` runs beside the projector (`run_sealer`): events come from recalls, decay, erasure and
administration as well as from commits, and commit workers scale out, so the one long-running
service seals them all. The database serializes sealers anyway (a transaction advisory lock),
so a second one would not corrupt the chain, only poll for nothing.

Each batch is one transaction of the database function (FOR UPDATE SKIP LOCKED, tenant by
tenant), so any number of workers may run at once. Idle, it polls; on a lost connection it
reconnects with capped, jittered backoff and drains again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from memfabric.call import Cast, fabric_call, relay_events
from memfabric.errors import FabricError, NotAuthorized, connection_lost, mapped, paused_line

Progress = Callable[[str], None]


def drain_once(
    conn: psycopg.Connection[tuple[object, ...]], batch: int = 100
) -> tuple[int, int, int]:
    """Commit validated proposals until none is left (or only transient failures remain);
    returns (committed, rejected, retry)."""
    committed = rejected = retry = 0
    while True:
        result: dict[str, int] = fabric_call(conn, "fabric_api.commit_pending", batch)
        committed += result["committed"]
        rejected += result["rejected"]
        retry += result.get("retry", 0)
        if result["committed"] + result["rejected"] < batch:
            return committed, rejected, retry


def _delay(backoff: float) -> float:
    return min(backoff, 30.0) * (0.5 + random.random())  # noqa: S311 - jitter only


def seal_once(conn: psycopg.Connection[tuple[object, ...]], batch: int = 10000) -> int:
    """Seal every event below the horizon into the tenants' hash chains; returns how many."""
    total = 0
    relay_events(conn)  # a Citus cluster's delegated calls' events, into the outbox
    while True:
        result: dict[str, int] = fabric_call(conn, "fabric_api.seal_events", batch)
        sealed = result["sealed"]
        total += sealed
        if sealed < batch:
            return total


def sealing_lag(conninfo: str) -> dict[str, float]:
    """How far sealing is behind (`fabric_api.sealing_lag`, as the committer): events not
    sealed yet (`unsealed`) and the age of the oldest in seconds (`oldest_unsealed_seconds`,
    0 when none). Read at each metrics scrape."""
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        lag: dict[str, Any] = fabric_call(conn, "fabric_api.sealing_lag")
    return {k: float(lag[k]) for k in ("unsealed", "oldest_unsealed_seconds")}


def sealing_gauges(conninfo: str) -> dict[str, tuple[str, str, Callable[[], float]]]:
    """The sealing metrics `memfabric serve` exposes (memfabric.metrics), read as the
    sealer's login at each scrape."""
    return {
        "memfabric_events_unsealed": (
            "gauge",
            "outbox events not sealed into their tenant's chain yet (alterable undetected)",
            lambda: sealing_lag(conninfo)["unsealed"],
        ),
        "memfabric_oldest_unsealed_event_age_seconds": (
            "gauge",
            "age of the oldest event not sealed yet, in seconds (0 when none)",
            lambda: sealing_lag(conninfo)["oldest_unsealed_seconds"],
        ),
    }


def run_sealer(
    conninfo: str,
    *,
    poll_seconds: float = 1.0,
    progress: Progress = print,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Seal continuously: the one sealer of a deployment, which `memfabric serve` runs beside
    the projector (the commit worker does not seal). It never stops on the database: a lost
    connection or a restart (whose 57P01 arrives as a FabricError), a refused login or a
    refused call is reported with the login and why, and retried with capped, jittered
    backoff; the backoff resets only once a seal succeeds, so a refusal repeated after every
    reconnect does not spin. Sealing goes on from the chains' heads, so nothing is lost."""
    backoff = 0.5
    while not should_stop():
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                while not should_stop():
                    seal_once(conn)
                    backoff = 0.5
                    _sleep(poll_seconds, should_stop)
        except (psycopg.Error, FabricError) as exc:
            delay = _delay(backoff)
            progress(f"sealing paused ({paused_line(exc, conninfo)}); retrying in {delay:.1f}s")
            _sleep(delay, should_stop)
            backoff *= 2


def _sleep(seconds: float, should_stop: Callable[[], bool]) -> None:
    """Sleep, waking early when the loop is asked to stop (serve's stop, SIGTERM)."""
    deadline = time.monotonic() + seconds
    while not should_stop() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.2))


def run_committer(
    conninfo: str,
    *,
    batch: int = 100,
    once: bool = False,
    poll_seconds: float = 1.0,
    progress: Progress = print,
    should_stop: Callable[[], bool] = lambda: False,
) -> tuple[int, int]:
    """Run until stopped (or one drain with once=True); returns the totals (committed,
    rejected). A drain the database refuses is reported and retried with backoff: the
    worker never exits on it unless once=True."""
    totals = [0, 0]
    backoff = 0.5
    while not should_stop():
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                while not should_stop():
                    try:
                        committed, rejected, retry = drain_once(conn, batch)
                    except FabricError as exc:
                        if once or connection_lost(exc):
                            raise  # a lost connection reconnects (below)
                        delay = _delay(backoff)
                        why = paused_line(exc, conninfo)
                        progress(f"drain refused ({why}); retrying in {delay:.1f}s")
                        _sleep(delay, should_stop)
                        backoff *= 2
                        continue
                    backoff = 0.5
                    totals[0] += committed
                    totals[1] += rejected
                    if committed or rejected or retry:
                        progress(
                            f"committed {committed}, rejected at commit {rejected}, "
                            f"left for retry {retry}"
                        )
                    if once:
                        return totals[0], totals[1]
                    _sleep(poll_seconds, should_stop)
        except (psycopg.Error, FabricError) as exc:
            if once or not connection_lost(exc):
                raise
            delay = _delay(backoff)
            progress(f"commit paused ({paused_line(exc, conninfo)}); retrying in {delay:.1f}s")
            _sleep(delay, should_stop)
            backoff *= 2
    return totals[0], totals[1]


def run_every(
    step: Callable[[], object],
    *,
    name: str,
    interval: float,
    conninfo: str | None = None,
    once: bool = False,
    progress: Progress = print,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """A scheduled worker's loop (consolidation, decay): `step` every `interval` seconds, each
    on connections of its own. A database failure (a lost connection, a restart, a refused
    login or call) is reported with the login and why and the step is tried again with
    capped, jittered backoff, never ending the worker; with `once` it is raised."""
    backoff = 0.5
    while not should_stop():
        try:
            step()
        except (psycopg.Error, FabricError) as exc:
            if once:
                raise
            delay = _delay(backoff)
            progress(f"{name} paused ({paused_line(exc, conninfo)}); retrying in {delay:.1f}s")
            _sleep(delay, should_stop)
            backoff *= 2
            continue
        backoff = 0.5
        if once:
            return
        _sleep(interval, should_stop)


# What erasure and operational window closure rewrite; fabric_maintainer holds MAINTAIN on
# exactly these (the committer holds none: MAINTAIN also allows LOCK TABLE).
ERASURE_VACUUM = (
    "fabric.memory_records",
    "fabric.proposals",
    "fabric.memory_embeddings",
    "fabric.runs",
    "fabric.agent_tokens",
    "fabric.temporal_summaries",
    "fabric.measurements",
    "fabric.subject_keys",
    "langgraph.checkpoints",
    "langgraph.checkpoint_blobs",
    "langgraph.checkpoint_writes",
)
DECAY_VACUUM = ("fabric.memory_records",)


def vacuum(maintainer: psycopg.Connection[tuple[object, ...]], tables: list[str]) -> list[str]:
    """VACUUM `tables` as the maintenance login (autocommit), so the old tuple versions that
    still hold erased content leave the heap. PostgreSQL only warns and skips a table the
    login may not vacuum; here that is an error."""
    with mapped():
        row = maintainer.execute(
            "SELECT CASE WHEN has_schema_privilege('fabric', 'USAGE') THEN ("
            " SELECT bool_and(has_table_privilege(p.relid, 'MAINTAIN'))"
            " FROM unnest(%s::text[]) t, LATERAL (SELECT t::regclass AS relid"
            " UNION SELECT relid FROM pg_partition_tree(t::regclass)) p) ELSE false END",
            (tables,),
        ).fetchone()
    if not row or not row[0]:
        raise NotAuthorized(
            "the maintenance login may not VACUUM the tables erasure rewrote",
            sqlstate="42501",
            hint="grant fabric_maintainer to the login named by MEMFABRIC_MAINTAINER_LOGIN",
        )
    for table in tables:
        schema, name = table.split(".")
        maintainer.execute(
            sql.SQL("VACUUM {}.{}").format(sql.Identifier(schema), sql.Identifier(name))
        )
    return tables


def run_decay_once(
    conn: psycopg.Connection[tuple[object, ...]],
    now: str | None = None,
    batch: int = 1000,
    maintainer: psycopg.Connection[tuple[object, ...]] | None = None,
) -> dict[str, object]:
    """One decay pass at `now` (default: the database's now); loops while batches are full,
    then the temporal tier's retention (its monthly partitions made ahead, whole past months
    emptied, due points deleted: `measurements_removed`). With a maintenance connection,
    VACUUMs the records when a window closure removed content."""
    totals: dict[str, int] = {
        "expired": 0,
        "windows_closed": 0,
        "erasure_requests": 0,
        "checkpoint_threads_deleted": 0,
    }
    while True:
        at = {} if now is None else {"p_now": Cast(now, "timestamptz")}
        result: dict[str, int] = fabric_call(conn, "fabric_api.run_decay", p_batch=batch, **at)
        for key in totals:
            totals[key] += int(result[key])
        if max(int(result[k]) for k in totals) < batch:
            break
    answer: dict[str, object] = {**totals, "at": result["at"]}
    answer["measurements_removed"] = fabric_call(
        conn, "fabric_api.run_temporal_retention", p_now=Cast(result["at"], "timestamptz")
    )
    if maintainer is not None:
        closed = totals["windows_closed"] > 0
        answer["vacuumed"] = vacuum(maintainer, list(DECAY_VACUUM)) if closed else []
    return answer


def erase(
    conn: psycopg.Connection[tuple[object, ...]],
    approval_id: str,
    maintainer: psycopg.Connection[tuple[object, ...]] | None = None,
) -> dict[str, object]:
    """Execute an approved erasure as the committer (`conn`), then VACUUM what it touched
    through `maintainer` (the maintenance login, autocommit) so the old tuple versions, which
    still hold the content, leave the heap. Without `maintainer` nothing is vacuumed."""
    result: dict[str, object] = fabric_call(conn, "fabric_api.erase", approval_id)
    if maintainer is not None:
        result["vacuumed"] = vacuum(maintainer, [str(t) for t in result["vacuum"]])  # type: ignore[attr-defined]
    return result
