"""The projector over supervised child shards (R-PROJ-1): a shard child killed between an
upsert and the flush restarts, the flush raises `WritesLost`, the cursor stays where it was
(it never passes a point that may be lost) and the projector drains again from it; after
recovery Postgres's projectable records and the shards' points agree. Real MiniLM, real
shards in child processes, a real SIGKILL waited for with waitpid."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from conftest import Fabric
from memfabric import ops
from memfabric.embedding import MiniLMEmbedder
from memfabric.projector import Projector, recoverable
from memfabric.vectors import EdgeVectorStore, WritesLost
from memfabric.vectors.shards import ProcessShard

pytestmark = pytest.mark.slow  # real MiniLM, shards in child processes


def kill_all(store: EdgeVectorStore) -> None:
    """SIGKILL every shard child and reap it: each has exited when this returns."""
    for shard in store._shards.values():
        assert isinstance(shard, ProcessShard) and shard._child is not None
        os.kill(shard._child.pid, signal.SIGKILL)
        assert shard._child.wait() == -signal.SIGKILL


@pytest.fixture
def store(tmp_path: Path, minilm: MiniLMEmbedder) -> Iterator[EdgeVectorStore]:
    """An Edge store of shards in child processes, with the session model's collections."""
    store = EdgeVectorStore(tmp_path / "qdrant", shard_processes=True)
    try:
        store.ensure_collections(minilm.model, minilm.version, minilm.dims)
        yield store
    finally:
        store.close()


def test_a_shard_child_killed_before_the_flush_keeps_the_cursor_and_replays(
    fabric: Fabric, store: EdgeVectorStore, minilm: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    p = Projector(url, minilm, store, None, flush_seconds=3600.0)
    run = fabric.open_run()
    fabric.form(run, "Customer asked to be invoiced in euros")
    fabric.settle()
    with psycopg.connect(url, autocommit=True) as conn:
        assert p.drain(conn, "qdrant") > 0  # a full drain: flushed, cursor moved
        before = fabric.cursor()
        fabric.form(run, "The shipment to Rotterdam was delayed")
        fabric.form(run, "The customer prefers calls after 3 pm")
        fabric.settle()
        assert p.drain(conn, "qdrant", max_batches=1) > 0  # applied, not flushed
        assert fabric.cursor() == before
        kill_all(store)
        with pytest.raises(WritesLost) as lost:
            p.settle(conn, "qdrant", force=True)
        assert recoverable(lost.value)  # `run` backs off and drains again from the cursor
        assert fabric.cursor() == before  # never past a point that may be lost
        assert p.flush_due("qdrant") is None  # nothing read ahead of the cursor is kept
        # the next drain reads again from the cursor: both new records, re-applied
        assert p.drain(conn, "qdrant") > 0
        assert fabric.cursor() != before
    report = ops.verify(p)
    assert report["ok"], report
    assert report["qdrant"]["expected"] == report["qdrant"]["points"] == 3
    assert all(isinstance(s, ProcessShard) and s.restarts == 1 for s in store._shards.values())


def test_a_projector_flushing_every_batch_never_moves_the_cursor_past_a_lost_write(
    fabric: Fabric, store: EdgeVectorStore, minilm: MiniLMEmbedder
) -> None:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    p = Projector(url, minilm, store, None)  # flush_seconds 0: flush, then the cursor
    run = fabric.open_run()
    fabric.form(run, "Customer asked to be invoiced in euros")
    fabric.settle()
    before = fabric.cursor()
    # the children die before the batch: its upserts restart them (nothing was
    # unflushed, so nothing is lost and the batch goes through)
    kill_all(store)
    with psycopg.connect(url, autocommit=True) as conn:
        assert p.drain(conn, "qdrant") > 0
        assert fabric.cursor() != before
        before = fabric.cursor()
        fabric.form(run, "The shipment to Rotterdam was delayed")
        fabric.settle()
        # an upsert held unflushed when its child dies: written here by hand as the
        # projector would, then the batch's own flush must refuse to count it durable
        records = p.records(conn, [str(e["memory_id"]) for e in p.events(conn, "qdrant")])
        p.apply_vectors(conn, records, flush=False)
        kill_all(store)
        with pytest.raises(WritesLost):
            p.drain(conn, "qdrant")  # its flush raises: the cursor does not move
        assert fabric.cursor() == before
        assert p.drain(conn, "qdrant") > 0
        assert fabric.cursor() != before
    report = ops.verify(p)
    assert report["ok"], report
    assert report["qdrant"]["expected"] == report["qdrant"]["points"] == 2
