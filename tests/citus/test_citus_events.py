"""Event delivery on a Citus cluster (docs/scale-out.md): the outbox `fabric.events` is a
table of the coordinator, written by the calls the coordinator runs and by the relay of the
delegated calls' events (fabric_api.relay_events, which the consumers run before they read),
so every event enters it in a coordinator transaction and one (xid8, event_id) cursor below
the coordinator's snapshot xmin is exact. Writers on tenants held by two different workers,
through both kinds of call, the projector restarted mid-stream (stopped, then its connection
killed), the tracer polling without LISTEN: every event delivered, none skipped, none
applied twice.

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from test_citus_fabric import form_on, open_run, relay

from citus_cluster import Cluster, cluster
from memfabric.projector import Projector
from memfabric.tracing import SpanMaker

__all__ = ["cluster"]  # the session fixture, used by name

WRITERS_PER_TENANT = 2
RECORDS_PER_WRITER = 12


class CountingProjector(Projector):
    """The real projector, counting each record it applies (per memory_id)."""

    applied: Counter[str]

    def apply(
        self,
        projection: str,
        conn: psycopg.Connection[Any],
        records: Sequence[dict[str, Any]],
        embedded: Sequence[list[float]] | None = None,
        *,
        flush: bool = True,
    ) -> None:
        super().apply(projection, conn, records, embedded, flush=flush)
        self.applied.update(r["memory_id"] for r in records)


def _writer(
    c: Cluster, tenant: str, formed: list[str], errors: list[BaseException], keyed: bool = False
) -> None:
    """Propose, commit and recall RECORDS_PER_WRITER times in `tenant`, on connections of
    its own (one per identity); the acknowledged memory ids go to `formed`. `keyed`: through
    the tenant-keyed calls, delegated to the tenant's worker (their events reach the outbox
    through the relay the consumers run), else through the calls the coordinator runs."""
    try:
        run = open_run(c, tenant)
        with c.connect("mf_agent_a") as agent, c.connect("mf_committer") as committer:
            for n in range(RECORDS_PER_WRITER):
                text = f"delivery {tenant} {n} {uuid.uuid4()}"
                formed.append(form_on(agent, committer, tenant, text, run, keyed))
                request = Jsonb({"run_id": str(run), "tiers": ["episodic"]})
                if keyed:
                    agent.execute("SELECT fabric_api.recall(%s, %s)", (tenant, request))
                else:
                    agent.execute("SELECT fabric_api.recall(%s)", (request,))
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class _Running:
    """A projector's `run` loop on a thread of its own, stopped cooperatively."""

    def __init__(self, projector: Projector) -> None:
        self.stop = threading.Event()
        self.failed: list[BaseException] = []

        def loop() -> None:
            try:
                projector.run(("qdrant",), poll_seconds=0.2, should_stop=self.stop.is_set)
            except BaseException as exc:
                self.failed.append(exc)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive() and not self.failed, self.failed


def _cursor(c: Cluster, projection: str) -> tuple[str, str]:
    row = c.row(
        "SELECT last_xid::text, last_event_id::text FROM fabric.projection_cursors "
        "WHERE projection = %s",
        projection,
    )
    return row[0], row[1]


def _kill(c: Cluster, login: str) -> int:
    """Terminate every backend of `login` on the coordinator; how many."""
    rows = c.rows(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s "
        "AND pid <> pg_backend_pid()",
        login,
    )
    return len(rows)


def test_events_of_two_workers_are_delivered_once_across_projector_restarts(
    cluster: Cluster, minilm: Any, edge: Any
) -> None:
    first, second = cluster.apart
    assert cluster.placement[first] != cluster.placement[second]
    url = psycopg.conninfo.make_conninfo(cluster.url, user="mf_projector")
    start = _cursor(cluster, "qdrant")
    formed: list[str] = []
    errors: list[BaseException] = []
    writers = [  # in each tenant one writer through the coordinator, one delegated
        threading.Thread(target=_writer, args=(cluster, tenant, formed, errors, n % 2 == 1))
        for tenant in (first, second)
        for n in range(WRITERS_PER_TENANT)
    ]
    for w in writers:
        w.start()
    applied: Counter[str] = Counter()

    def projector() -> CountingProjector:
        p = CountingProjector(url, minilm, edge, batch=8)
        p.applied = applied
        return p

    def ours() -> int:
        return sum(1 for m in formed if m in applied)

    # the first life: stopped once it has applied some of the writers' records
    life = _Running(projector())
    _until(lambda: ours() >= 6 or errors or life.failed, 60, "the first projector to apply")
    life.halt()
    stopped_at = _cursor(cluster, "qdrant")
    assert stopped_at != start
    # the second life starts from the stored cursor; its connection is killed mid-stream
    life = _Running(projector())
    total = WRITERS_PER_TENANT * 2 * RECORDS_PER_WRITER
    _until(lambda: ours() >= total // 2 or errors or life.failed, 60, "the second projector")
    assert _kill(cluster, "mf_projector") >= 1
    for w in writers:
        w.join(120)
    assert errors == []
    assert len(formed) == total
    _until(lambda: ours() == total or life.failed, 60, "every record applied after the kill")
    life.halt()
    tenants = {first: 0, second: 0}
    with cluster.connect() as su:
        for tenant, n in su.execute(
            "SELECT tenant_id, count(*) FROM fabric.memory_records "
            "WHERE memory_id = ANY (%s::uuid[]) GROUP BY 1",
            (formed,),
        ):
            tenants[tenant] = n
    assert tenants == {first: total // 2, second: total // 2}
    # none skipped: every acknowledged record is a point of the projection
    points = {pid for pid, _ in edge.scroll("episodic")}
    assert set(formed) <= points
    # none applied twice, but for the one batch the kill may have caught between its apply
    # and its cursor move (at-least-once: a kill re-applies from the stored cursor)
    twice = {m: n for m in formed if (n := applied[m]) != 1}
    assert len(twice) <= 8 and set(twice.values()) <= {2}, twice


def test_the_tracer_delivers_by_polling_alone(cluster: Cluster) -> None:
    """The tracer never LISTENs: what it delivers it found by polling the coordinator's
    outbox. Every recall event of the writers on both workers, exactly once, across a
    restart from its stored cursor."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    first, second = cluster.apart
    url = psycopg.conninfo.make_conninfo(cluster.url, user="mf_tracer")
    exporter = InMemorySpanExporter()
    with cluster.connect() as su:
        row = su.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert row is not None
    since = row[0]
    formed: list[str] = []
    errors: list[BaseException] = []
    writers = [  # one through the coordinator, one delegated to its tenant's worker
        threading.Thread(target=_writer, args=(cluster, t, formed, errors, t == second))
        for t in (first, second)
    ]
    for w in writers:
        w.start()

    def trace_for(seconds: float) -> None:
        tracer = SpanMaker(url, exporter=exporter, endpoint="http://127.0.0.1:4318/v1/traces")
        stop = threading.Event()
        t = threading.Thread(
            target=tracer.run, kwargs={"poll_seconds": 0.2, "should_stop": stop.is_set}
        )
        t.start()
        time.sleep(seconds)
        stop.set()
        t.join(30)
        assert not t.is_alive()

    trace_for(1.5)
    for w in writers:
        w.join(120)
    assert errors == []
    relay(cluster)  # what the delegated writer staged since the tracer stopped
    with cluster.connect() as su:
        expected = {
            str(r[0])
            for r in su.execute(
                "SELECT event_id FROM fabric.events WHERE event_type = 'memory.recall.served' "
                "AND tenant_id = ANY (%s) AND xid >= %s::xid8",
                ([first, second], since),
            )
        }
    assert len(expected) == len(writers) * RECORDS_PER_WRITER

    def delivered() -> Counter[str]:
        return Counter(
            str(s.attributes["memfabric.event_id"])
            for s in exporter.get_finished_spans()
            if s.attributes is not None
        )

    deadline = time.monotonic() + 60
    while not expected <= set(delivered()):
        assert time.monotonic() < deadline, "the tracer did not deliver every recall event"
        trace_for(0.5)
    assert {e: n for e, n in delivered().items() if e in expected and n != 1} == {}
