"""The pipelined projector (Projector.run_pipelined, docs/projections.md): a reader ahead of
the cursor, the embedder on its own thread, a writer that moves the cursor only after its
batch is written; a failure replays from the cursor. Real Postgres, real MiniLM, Edge."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

from conftest import Fabric
from integration.test_projection import StoreWithFault, point_ids
from memfabric.embedding import Embedder, MiniLMEmbedder, ProcessEmbedder, text_of
from memfabric.projector import Projector
from memfabric.vectors import VectorStore


@pytest.fixture
def model(minilm: MiniLMEmbedder) -> MiniLMEmbedder:
    return minilm  # the session's model


def last_event(fabric: Fabric) -> tuple[str, str]:
    row = (
        fabric.su()
        .execute(
            "SELECT xid::text, event_id::text FROM fabric.events"
            " WHERE event_type = ANY (fabric._projected_event_types())"
            " ORDER BY xid DESC, event_id DESC LIMIT 1"
        )
        .fetchone()
    )
    assert row is not None
    return row[0], row[1]


def run_until(projector: Projector, done: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    projector.run_pipelined(
        ("qdrant",),
        poll_seconds=0.1,
        should_stop=lambda: done() or time.monotonic() > deadline,
    )


def test_the_pipeline_projects_in_small_batches_and_moves_the_cursor_last(
    fabric: Fabric, edge: VectorStore, model: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    run = fabric.open_run()
    ids = {fabric.form(run, f"pipelined record {i}") for i in range(12)}
    projector = Projector(url, model, edge, None, batch=5)  # several batches in flight
    run_until(projector, lambda: fabric.cursor() == last_event(fabric))
    assert point_ids(edge, "episodic") == ids
    assert fabric.cursor() == last_event(fabric)
    stored = fabric.count("memory_embeddings", f"model = '{model.model}'")
    assert stored == len(ids)


@contextlib.contextmanager
def running_pipelined(projector: Projector) -> Iterator[None]:
    """`projector.run_pipelined` over the qdrant projection on a thread, stopped (and
    joined) when the block ends."""
    stop = threading.Event()
    thread = threading.Thread(
        target=projector.run_pipelined,
        args=(("qdrant",),),
        kwargs={"poll_seconds": 0.1, "should_stop": stop.is_set},
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_records_formed_while_it_runs_are_projected(
    fabric: Fabric, edge: VectorStore, model: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    projector = Projector(url, model, edge, None, batch=3)
    with running_pipelined(projector):
        run = fabric.open_run()
        ids = {fabric.form(run, f"arrives while running {i}") for i in range(8)}
        deadline = time.monotonic() + 60
        while point_ids(edge, "episodic") != ids and time.monotonic() < deadline:
            threading.Event().wait(0.1)
        assert point_ids(edge, "episodic") == ids


def test_a_failed_write_leaves_the_cursor_and_a_new_run_replays(
    fabric: Fabric, edge: VectorStore, model: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    run = fabric.open_run()
    ids = {fabric.form(run, f"replayed record {i}") for i in range(6)}
    before = fabric.cursor()
    buggy = StoreWithFault(edge, TypeError("a bug in a backend"), once=False)
    with pytest.raises(TypeError, match="a bug in a backend"):
        run_until(Projector(url, model, buggy, None, batch=2), lambda: False, 30)  # type: ignore[arg-type]
    assert buggy.raised == 1  # not retried: a bug stops every stage
    assert fabric.cursor() == before and point_ids(edge, "episodic") == set()
    # the embeddings stored before the failure are reused, the batches replayed
    run_until(
        Projector(url, model, edge, None, batch=2), lambda: fabric.cursor() == last_event(fabric)
    )
    assert point_ids(edge, "episodic") == ids


def test_a_lost_store_is_retried_from_the_cursor(
    fabric: Fabric, edge: VectorStore, model: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    run = fabric.open_run()
    ids = {fabric.form(run, f"after the store came back {i}") for i in range(5)}
    flaky = StoreWithFault(edge, ConnectionResetError("the store went away"), once=True)
    projector = Projector(url, model, flaky, None, batch=2)  # type: ignore[arg-type]
    run_until(projector, lambda: fabric.cursor() == last_event(fabric))
    assert flaky.raised == 1
    assert point_ids(edge, "episodic") == ids


class SlowModel:
    """The session's model, slowed so that batches pile up behind it; records call sizes."""

    def __init__(self, model: Embedder) -> None:
        self.inner, self.model, self.version, self.dims = model, model.model, model.version, 384
        self.calls: list[int] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(len(texts))
        time.sleep(0.3)
        return self.inner.embed(texts)


CAUGHT_UP = """SELECT (SELECT (last_xid, last_event_id) FROM fabric.projection_cursors
  WHERE projection = 'qdrant') = (SELECT (xid, event_id) FROM fabric.events
  WHERE event_type = ANY (fabric._projected_event_types()) ORDER BY xid DESC, event_id DESC
  LIMIT 1)"""


def caught_up(conn: psycopg.Connection[Any]) -> Any:
    """Has the qdrant cursor reached the last projected event? Over one connection: the
    stages ask every 0.1 s."""
    return lambda: conn.execute(CAUGHT_UP).fetchone() == (True,)


def stored_vectors(fabric: Fabric, model: MiniLMEmbedder) -> dict[str, tuple[str, list[float]]]:
    """memory_id -> (the text embedded, the stored embedding)."""
    rows = (
        fabric.su()
        .execute(
            "SELECT e.memory_id::text, r.content, e.embedding::text"
            " FROM fabric.memory_embeddings e JOIN fabric.memory_records r USING (memory_id)"
            " WHERE e.model = %s",
            (model.model,),
        )
        .fetchall()
    )
    return {m: (text_of(c), [float(x) for x in v.strip("[]").split(",")]) for m, c, v in rows}


def test_batches_read_while_the_model_works_are_embedded_together_each_its_own(
    fabric: Fabric, edge: VectorStore, model: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    run = fabric.open_run()
    ids = {fabric.form(run, f"coalesced record number {i} of twelve") for i in range(12)}
    slow = SlowModel(model)
    run_until(Projector(url, slow, edge, None, batch=2), caught_up(fabric.su()))
    assert point_ids(edge, "episodic") == ids
    assert max(slow.calls) > 2  # several batches of 2 in one call
    assert sum(slow.calls) == len(ids)  # each record embedded once
    stored = stored_vectors(fabric, model)
    assert set(stored) == ids
    texts = [text for text, _ in stored.values()]
    for (_, got), want in zip(stored.values(), model.embed(texts), strict=True):
        assert max(abs(x - y) for x, y in zip(got, want, strict=True)) <= 1e-6  # its own vector


@pytest.mark.slow  # starts the embedder child twice (each loads the model): 16 s at load 5-7
def test_the_embedder_in_a_child_process_survives_the_childs_death(
    fabric: Fabric, edge: VectorStore, model: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    run = fabric.open_run()
    ids = {fabric.form(run, f"embedded next door {i}") for i in range(6)}
    child = ProcessEmbedder("minilm")
    try:
        child.start()
        pid = child.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the first batch finds it dead: back off, retry
        run_until(Projector(url, child, edge, None, batch=2), caught_up(fabric.su()))
        assert child.pid not in (None, pid)
    finally:
        child.close()
    assert point_ids(edge, "episodic") == ids
    stored = stored_vectors(fabric, model)
    texts = [text for text, _ in stored.values()]
    for (_, got), want in zip(stored.values(), model.embed(texts), strict=True):
        assert got == pytest.approx(want, abs=1e-6)


class FlushCounting:
    """Wraps a store, counting its flushes."""

    def __init__(self, inner: VectorStore) -> None:
        self.inner, self.flushes = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def flush(self) -> None:
        self.flushes += 1
        self.inner.flush()


class CursorWatching(Projector):
    """Notes, at each move of the cursor, how many flushes the store had made."""

    moves: list[int]

    def move_cursor(self, conn: psycopg.Connection[Any], projection: str, last: Any) -> None:
        assert isinstance(self.store, FlushCounting)
        self.moves.append(self.store.flushes)
        super().move_cursor(conn, projection, last)


def test_with_a_flush_cadence_points_are_searchable_first_and_the_cursor_waits_for_a_flush(
    fabric: Fabric, edge: VectorStore, model: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    run = fabric.open_run()
    ids = {fabric.form(run, f"cadenced record {i}") for i in range(9)}
    before, store = fabric.cursor(), FlushCounting(edge)
    projector = CursorWatching(url, model, store, None, batch=3, flush_seconds=3600.0)  # type: ignore[arg-type]
    projector.moves = []
    with running_pipelined(projector):
        deadline = time.monotonic() + 60
        while point_ids(edge, "episodic") != ids and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert point_ids(edge, "episodic") == ids  # searchable: every batch upserted
        assert fabric.cursor() == before and store.flushes == 0  # not due: nothing durable
    # asked to stop: one flush for all the batches, then the cursor to the last event
    assert store.flushes == 1 and projector.moves == [1]
    assert fabric.cursor() == last_event(fabric)


def test_with_a_short_flush_cadence_the_cursor_follows_while_it_runs(
    fabric: Fabric, edge: VectorStore, model: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    store = FlushCounting(edge)
    projector = CursorWatching(url, model, store, None, batch=2, flush_seconds=0.2)  # type: ignore[arg-type]
    projector.moves = []
    run = fabric.open_run()
    ids = {fabric.form(run, f"followed record {i}") for i in range(5)}
    with running_pipelined(projector):
        deadline = time.monotonic() + 60
        while fabric.cursor() != last_event(fabric) and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert fabric.cursor() == last_event(fabric)  # moved while running, not at the stop
        assert point_ids(edge, "episodic") == ids
    # every move of the cursor came after a flush it had not seen before
    assert projector.moves and projector.moves == sorted(set(projector.moves))
    assert projector.moves[0] >= 1
