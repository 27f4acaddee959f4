"""The vector projection's flush cadence (`Projector.flush_seconds`, R-PROJ-1): points are
searchable once upserted, the cursor moves only right after a flush, and a crash between
the upsert and the flush replays from the cursor (a real process killed before it flushes).
And the loop's wake-up: an event a NOTIFY announced but the horizon held back is read soon
after the holder ends, not a poll interval later."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import Fabric
from memfabric import ops
from memfabric.constants import INDEXED_TIERS
from memfabric.embedding import MiniLMEmbedder
from memfabric.projector import Projector
from memfabric.vectors import EdgeVectorStore, RecallFilter, VectorStore

pytestmark = pytest.mark.slow  # real MiniLM, Edge on disk, a child process


def searchable(p: Projector, conn: psycopg.Connection[Any], ids: list[str]) -> set[str]:
    """The ids of `ids` an exact search of their scopes returns (as recall would ask)."""
    assert p.store is not None
    records = p.records(conn, ids)
    found: set[str] = set()
    for tenant in {r["tenant_id"] for r in records}:
        keys = sorted({r["scope_key"] for r in records if r["tenant_id"] == tenant})
        flt = RecallFilter(tenant_id=tenant, scope_keys=keys, valid_at=datetime.now(UTC))
        for r in records:
            vector = p.embedder.embed([r["content"]["text"]])[0]
            hits = p.store.search(list(INDEXED_TIERS), vector, flt, 10, exact=True)
            found |= {i for i, _ in hits} & set(ids)
    return found


class Reading(Projector):
    """A Projector noting the memory ids of each batch it reads, and when a read of the
    feed that began at `began` found nothing."""

    read: list[list[str]]
    empty: list[float]

    def records(self, conn: psycopg.Connection[Any], ids: Any) -> list[dict[str, Any]]:
        self.read.append(sorted(ids))
        return super().records(conn, ids)

    def events(self, conn: psycopg.Connection[Any], projection: str, after: Any = None) -> Any:
        began = time.monotonic()
        out = super().events(conn, projection, after)
        if not out:
            self.empty.append(began)
        return out


def open_store(path: Path, emb: Any) -> EdgeVectorStore:
    store = EdgeVectorStore(path)
    store.ensure_collections(emb.model, emb.version, emb.dims)
    return store


def projector(fabric: Fabric, store: VectorStore, minilm: MiniLMEmbedder, **kw: Any) -> Reading:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    p = Reading(url, minilm, store, None, **kw)
    p.read, p.empty = [], []
    return p


def test_points_are_searchable_before_the_flush_and_the_cursor_waits_for_it(
    fabric: Fabric, tmp_path: Path, minilm: MiniLMEmbedder
) -> None:
    store = open_store(tmp_path / "qdrant", minilm)
    try:
        p = projector(fabric, store, minilm, flush_seconds=3600.0)
        run = fabric.open_run()
        first = [fabric.form(run, "Customer asked to be invoiced in euros")]
        fabric.settle()
        before = fabric.cursor()
        with psycopg.connect(p.conninfo, autocommit=True) as conn:
            assert p.drain(conn, "qdrant", max_batches=1) > 0
            assert searchable(p, conn, first) == set(first)  # visible, not yet flushed
            assert fabric.cursor() == before  # the cursor waits for the flush
            second = [fabric.form(run, "The shipment to Rotterdam was delayed")]
            fabric.settle()
            # read past what is applied but unflushed: only the new events, not the first again
            assert p.drain(conn, "qdrant", max_batches=1) > 0
            assert p.read[-1] == second
            assert searchable(p, conn, first + second) == set(first + second)
            assert fabric.cursor() == before
            assert p.flush_due("qdrant") is not None
            p.settle(conn, "qdrant")  # not due yet: nothing moves
            assert fabric.cursor() == before
            p.settle(conn, "qdrant", force=True)
            assert p.flush_due("qdrant") is None
            after = fabric.cursor()
            assert after != before
            # everything applied is behind the cursor now: a projector flushing every batch
            # finds nothing left to apply
            assert projector(fabric, store, minilm).drain(conn, "qdrant") == 0
        assert ops.verify(p)["ok"]
    finally:
        store.close()


def test_an_interrupt_flushes_and_moves_the_cursor_before_it_ends_the_loop(
    fabric: Fabric, tmp_path: Path, minilm: MiniLMEmbedder
) -> None:
    """Ctrl-C, or SIGTERM under `memfabric serve` (both a KeyboardInterrupt in the loop),
    with batches applied but not yet flushed: the loop flushes and moves the cursor to the
    last event applied before the interrupt ends it, so the next start re-applies nothing."""
    store = open_store(tmp_path / "qdrant", minilm)
    try:
        run = fabric.open_run()
        ids = [fabric.form(run, f"interrupted record {i}") for i in range(3)]
        fabric.settle()
        before = fabric.cursor()
        p = projector(fabric, store, minilm, flush_seconds=3600.0)

        def interrupt_once_applied() -> bool:
            if p.flush_due("qdrant") is not None:  # applied, not flushed: the signal now
                raise KeyboardInterrupt
            return False

        with pytest.raises(KeyboardInterrupt):
            p.run(["qdrant"], poll_seconds=0.1, should_stop=interrupt_once_applied)
        assert sorted(id for batch in p.read for id in batch) == sorted(ids)
        assert fabric.cursor() != before and p.flush_due("qdrant") is None
        with psycopg.connect(p.conninfo, autocommit=True) as conn:
            assert projector(fabric, store, minilm).drain(conn, "qdrant") == 0
    finally:
        store.close()


def test_a_full_drain_ends_flushed_with_the_cursor_at_its_last_event(
    fabric: Fabric, tmp_path: Path, minilm: MiniLMEmbedder
) -> None:
    store = open_store(tmp_path / "qdrant", minilm)
    try:
        p = projector(fabric, store, minilm, flush_seconds=3600.0, batch=1)
        run = fabric.open_run()
        ids = [fabric.form(run, f"note {i} about the renewal call") for i in range(3)]
        fabric.settle()
        with psycopg.connect(p.conninfo, autocommit=True) as conn:
            assert p.drain(conn, "qdrant") >= 3  # one event a batch, one flush at the end
            assert p.flush_due("qdrant") is None
            assert searchable(p, conn, ids) == set(ids)
            assert projector(fabric, store, minilm).drain(conn, "qdrant") == 0
        assert ops.drill(p)["identical"]
    finally:
        store.close()


CRASH = textwrap.dedent(
    """
    import os, sys, psycopg
    from memfabric.embedding import MiniLMEmbedder
    from memfabric.projector import Projector
    from memfabric.vectors import EdgeVectorStore

    url, path = sys.argv[1], sys.argv[2]
    emb = MiniLMEmbedder()
    store = EdgeVectorStore(path)
    store.ensure_collections(emb.model, emb.version, emb.dims)
    p = Projector(url, emb, store, None, flush_seconds=3600.0)
    with psycopg.connect(url, autocommit=True) as conn:
        n = p.drain(conn, "qdrant", max_batches=1)
        searched = sum(store.count(t) for t in ("episodic", "semantic"))
    print(n, searched, flush=True)
    os._exit(0)  # killed between the upsert and the flush: no flush, no close
    """
)


def test_a_crash_between_upsert_and_flush_replays_from_the_cursor(
    fabric: Fabric, tmp_path: Path, minilm: MiniLMEmbedder
) -> None:
    run = fabric.open_run()
    ids = [fabric.form(run, t) for t in ("User prefers short answers", "Call on Thursday")]
    fabric.settle()
    before = fabric.cursor()
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    path = tmp_path / "qdrant"
    out = subprocess.run(
        [sys.executable, "-c", CRASH, url, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    applied, counted = (int(x) for x in out.stdout.split())
    assert applied > 0 and counted >= len(ids)  # the child had them searchable
    assert fabric.cursor() == before  # and never moved the cursor past them
    store = open_store(path, minilm)  # whatever reached the disk before the crash
    try:
        p = projector(fabric, store, minilm)
        with psycopg.connect(p.conninfo, autocommit=True) as conn:
            assert p.drain(conn, "qdrant") == applied  # the same events, applied again
            assert searchable(p, conn, ids) == set(ids)
        assert fabric.cursor() != before
        assert ops.verify(p)["ok"]
        assert ops.drill(p)["identical"]
    finally:
        store.close()


def test_an_event_held_by_the_horizon_is_read_soon_after_the_holder_ends(
    fabric: Fabric, tmp_path: Path, minilm: MiniLMEmbedder
) -> None:
    store = open_store(tmp_path / "qdrant", minilm)
    run = fabric.open_run()
    fabric.settle()
    p = projector(fabric, store, minilm)
    stop = threading.Event()
    kwargs = {"poll_seconds": 120.0, "should_stop": stop.is_set}
    thread = threading.Thread(target=p.run, args=(("qdrant",),), kwargs=kwargs)
    # an older transaction with an xid that writes no event: its end sends no NOTIFY
    holder = fabric.connect(None, autocommit=False)
    holder.execute("SELECT pg_current_xact_id()")
    thread.start()
    try:
        # its first read (nothing yet) comes after its LISTEN: a NOTIFY sent before that
        # would be lost, and nothing would look again before the 120 s poll
        deadline = time.monotonic() + 60
        while not p.empty and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p.empty
        rid = fabric.form(run, "held back by an older transaction")  # committed, NOTIFY sent
        formed = time.monotonic()
        deadline = formed + 60
        while not any(t > formed for t in p.empty) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the projector, woken, has found it not yet readable
        assert any(t > formed for t in p.empty)
        holder.rollback()
        ended = time.monotonic()
        while rid not in {i for i, _ in store.scroll("episodic")}:
            # a poll interval is 120 s: only the loop's look-again after a NOTIFY finds it
            assert time.monotonic() - ended < 30, "not read until the next poll"
            time.sleep(0.05)
    finally:
        stop.set()
        holder.rollback()
        fabric.su().execute("NOTIFY fabric_events")  # wakes the loop to see the stop
        thread.join(timeout=30)
        store.close()
