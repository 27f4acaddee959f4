"""Child shards under supervision (`ProcessShard`, `EdgeVectorStore(shard_processes=True)`):
a shard child killed with SIGKILL is restarted on its directory by the next operation, which
is asked again; writes it held unflushed make the next `flush()` raise `WritesLost` once; a
child that cannot come back is given up after bounded restarts with an error naming the
shard's directory. Real shards, real children; a kill is waited for with waitpid."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import POINT_T0, point_payload
from memfabric.settings import usable_cpus
from memfabric.vectors import (
    ContractMismatch,
    EdgeVectorStore,
    RecallFilter,
    ShardUnavailable,
    VectorPoint,
    VectorStoreError,
    WritesLost,
    store_from_env,
)
from memfabric.vectors.shards import ProcessShard

MODEL = "all-MiniLM-L6-v2"
DIMS = 8
T0 = POINT_T0  # where point_payload's validity starts
SHM = Path("/dev/shm")  # noqa: S108 - tmpfs: a shard's creation fsyncs a few hundred times


@pytest.fixture
def where(tmp_path: Path) -> Iterator[Path]:
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="mf-sup-", dir=SHM))
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path


@pytest.fixture
def store(where: Path) -> Iterator[EdgeVectorStore]:
    s = EdgeVectorStore(where / "edge", shard_processes=True)
    s.ensure_collections(MODEL, "1", DIMS)
    yield s
    s.close()


def points(tier: str, n: int, rng: np.random.Generator) -> list[VectorPoint]:
    out = []
    for _ in range(n):
        payload = point_payload(tier=tier, visibility="tenant", subject=None, session=None)
        x = rng.normal(size=DIMS)
        out.append(VectorPoint(payload, (x / np.linalg.norm(x)).tolist()))
    return out


def flt() -> RecallFilter:
    return RecallFilter(tenant_id="acme", scope_keys=["tenant"], valid_at=T0)


def shard_of(store: EdgeVectorStore, tier: str) -> ProcessShard:
    shard = store._shards[store._contract(tier).physical_name]
    assert isinstance(shard, ProcessShard)
    return shard


def kill(shard: ProcessShard) -> int:
    """SIGKILL the shard's child and reap it (waitpid: it has exited when this returns)."""
    child = shard._child
    assert child is not None and child.poll() is None
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    return child.pid


def ids(store: EdgeVectorStore, tier: str) -> set[str]:
    return {pid for pid, _ in store.scroll(tier)}


def test_an_idle_child_killed_is_restarted_and_answers_the_same(
    store: EdgeVectorStore,
) -> None:
    rng = np.random.default_rng(7)
    for tier in ("episodic", "semantic"):
        store.upsert(tier, points(tier, 200, rng))
    store.flush()
    query = points("semantic", 1, rng)[0].vector
    before = store.search(["episodic", "semantic"], query, flt(), 20, exact=True)
    assert len(before) == 20
    semantic, episodic = shard_of(store, "semantic"), shard_of(store, "episodic")
    dead = kill(semantic)
    # the next search notices, restarts the child on the same directory and asks again
    assert store.search(["episodic", "semantic"], query, flt(), 20, exact=True) == before
    assert semantic.restarts == 1 and semantic.pid not in (None, dead)
    assert episodic.restarts == 0
    # both children killed at once (a search asks both before reading either answer)
    kill(semantic)
    kill(episodic)
    assert store.search(["episodic", "semantic"], query, flt(), 20, exact=True) == before
    assert (semantic.restarts, episodic.restarts) == (2, 1)
    # nothing was unflushed when they died: the next flush has nothing to report
    store.flush()
    assert store.count("semantic") == 200 and store.count("episodic") == 200


def test_a_child_killed_holding_unflushed_writes_makes_the_next_flush_raise_once(
    store: EdgeVectorStore,
) -> None:
    rng = np.random.default_rng(8)
    flushed = points("semantic", 50, rng)
    store.upsert("semantic", flushed)
    store.flush()
    unflushed = points("semantic", 50, rng)
    store.upsert("semantic", unflushed)
    shard = shard_of(store, "semantic")
    kill(shard)
    # a write after the death restarts the child and is applied to the restarted shard
    later = points("semantic", 10, rng)
    store.upsert("semantic", later)
    assert shard.restarts == 1
    with pytest.raises(WritesLost, match=re.escape(shard.directory)):
        store.flush()
    # reported once: what was written since the restart is durable after this flush
    store.flush()
    held = ids(store, "semantic")
    assert {p.payload.memory_id for p in flushed + later} <= held
    # re-applying (as the projector does from its cursor) brings back whatever was lost
    store.upsert("semantic", unflushed)
    store.flush()
    assert ids(store, "semantic") == {p.payload.memory_id for p in flushed + unflushed + later}


def test_a_child_killed_before_the_flush_itself_is_reported_by_that_flush(
    store: EdgeVectorStore,
) -> None:
    rng = np.random.default_rng(9)
    store.upsert("episodic", points("episodic", 20, rng))
    kill(shard_of(store, "episodic"))
    with pytest.raises(WritesLost, match="died holding writes not yet flushed"):
        store.flush()
    store.flush()  # once


def test_a_shard_that_cannot_come_back_is_given_up_with_its_directory_named(
    store: EdgeVectorStore,
) -> None:
    rng = np.random.default_rng(10)
    store.upsert("semantic", points("semantic", 20, rng))
    store.upsert("episodic", points("episodic", 20, rng))
    store.flush()
    shard = shard_of(store, "semantic")
    shard.restart_backoff = 0.01
    shard.restart_window = 600.0  # every try within the window, however slow the machine
    directory = Path(shard.directory)
    config = directory / "edge_config.json"
    good = config.read_bytes()
    kill(shard)
    config.write_text("not a config")  # every restart fails to open the shard
    began = time.monotonic()
    with pytest.raises(ShardUnavailable, match=f"{directory}.*5 times in 600 s") as caught:
        store.search(["semantic"], points("semantic", 1, rng)[0].vector, flt(), 5)
    assert "Failed to deserialize" in str(caught.value)  # the last failure, said
    assert shard.pid is None and shard.restarts == 0
    assert len(shard._deaths) == shard.max_restarts
    # bounded: five tries with backoff 0, 0.01, 0.02, 0.04, 0.08 s and the children's starts
    assert time.monotonic() - began < 60
    # given up for now: the next operation starts no process at all
    with pytest.raises(ShardUnavailable):
        store.count("semantic")
    assert shard.pid is None and len(shard._deaths) == shard.max_restarts
    # the other tier's shard serves on
    assert store.count("episodic") == 20
    # once the deaths are older than the window, the shard is tried again
    config.write_bytes(good)
    shard.restart_window = 0.0
    assert store.count("semantic") == 20
    assert shard.restarts == 1


def test_closing_the_store_ends_every_child_a_dead_one_included(store: EdgeVectorStore) -> None:
    children = {p: s._child for p, s in store._shards.items() if isinstance(s, ProcessShard)}
    assert len(children) == 4
    kill(shard_of(store, "semantic"))
    store.close()
    assert all(c is not None and c.poll() is not None for c in children.values())


def test_the_children_open_their_shards_at_once_and_one_that_cannot_fails_the_open(
    where: Path,
) -> None:
    """ensure_collections starts every tier's child before it waits for any (they start in
    the time of about two, not four); a shard its child cannot open fails the whole open
    naming its directory, and the children that did open are ended by close()."""
    s = EdgeVectorStore(where / "edge", shard_processes=True)
    s.ensure_collections(MODEL, "1", DIMS)
    s.close()
    broken = next((where / "edge" / "shards").iterdir())
    (broken / "edge_config.json").write_text("{not json")
    s = EdgeVectorStore(where / "edge", shard_processes=True)
    with pytest.raises(VectorStoreError, match=re.escape(str(broken))):
        s.ensure_collections(MODEL, "1", DIMS)
    opened = [x._child for x in s._shards.values() if isinstance(x, ProcessShard)]
    assert len(opened) == 3 and all(c is not None and c.poll() is None for c in opened)
    s.close()
    assert all(c is not None and c.poll() is not None for c in opened)


@pytest.mark.parametrize("children", [True, False], ids=["child", "inline"])
def test_a_collection_recorded_with_another_contract_is_refused_and_never_opened(
    where: Path, children: bool
) -> None:
    """A collection whose manifest entry holds another contract than its name promises (a
    manifest edited or from another build) fails the open with ContractMismatch, on the path
    that opens the children at once as on the one that opens a shard at a time, and no shard
    of that collection is opened."""
    s = EdgeVectorStore(where / "edge", shard_processes=children)
    s.ensure_collections(MODEL, "1", DIMS)
    s.close()
    manifest_path = where / "edge" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    physical = sorted(manifest["collections"])[0]
    manifest["collections"][physical]["contract"]["model_version"] = "2"
    manifest_path.write_text(json.dumps(manifest))
    s = EdgeVectorStore(where / "edge", shard_processes=children)
    try:
        with pytest.raises(ContractMismatch, match=re.escape(physical)):
            s.ensure_collections(MODEL, "1", DIMS)
        assert physical not in s._shards
    finally:
        s.close()


def test_store_from_env_keeps_the_shards_inline_outside_serve(
    monkeypatch: pytest.MonkeyPatch, where: Path
) -> None:
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.delenv("MEMFABRIC_EDGE_SHARDS", raising=False)  # auto
    library = store_from_env(where / "a")
    assert isinstance(library, EdgeVectorStore) and library.shard_processes is False
    library.close()
    served = store_from_env(where / "b", serving=True)
    assert isinstance(served, EdgeVectorStore)
    assert served.shard_processes is (usable_cpus() >= 2)
    served.close()
    monkeypatch.setenv("MEMFABRIC_EDGE_SHARDS", "child")
    forced = store_from_env(where / "c")
    assert isinstance(forced, EdgeVectorStore) and forced.shard_processes is True
    forced.close()


def test_a_delete_across_tiers_restarts_a_dead_child_and_deletes(
    store: EdgeVectorStore,
) -> None:
    rng = np.random.default_rng(11)
    sem, epi = points("semantic", 10, rng), points("episodic", 10, rng)
    store.upsert("semantic", sem)
    store.upsert("episodic", epi)
    store.flush()
    kill(shard_of(store, "episodic"))  # its `held` is asked with the others', then restarted
    store.delete_many(
        {"semantic": [sem[0].payload.memory_id], "episodic": [epi[0].payload.memory_id]}
    )
    store.flush()  # nothing was unflushed when it died
    assert ids(store, "semantic") == {p.payload.memory_id for p in sem[1:]}
    assert ids(store, "episodic") == {p.payload.memory_id for p in epi[1:]}
    assert shard_of(store, "episodic").restarts == 1


# --- the children end with their parent, quietly ------------------------------------------------


def test_ctrl_c_at_the_terminal_is_left_to_the_parent(
    where: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """SIGINT reaches every process of the terminal's group: the shard child goes on
    serving (the parent's clean-up ends it), and prints nothing."""
    shard = ProcessShard(str(where / "s"), DIMS, None, create=True)
    try:
        assert shard.pid is not None
        os.kill(shard.pid, signal.SIGINT)
        time.sleep(0.5)  # a child that handled it would be dead, with its traceback, by now
        assert shard.count() == 0
        assert shard.restarts == 0
    finally:
        shard.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_child_whose_parent_died_ends_without_a_traceback(where: Path, tmp_path: Path) -> None:
    """The parent (`memfabric serve`) killed while its child works on a request: the child's
    answer meets a closed pipe, and the child ends without a word (its stderr is the
    parent's, a terminal or a journal)."""
    here = Path(__file__).resolve().parent
    owner_script = f"""
import os, sys
sys.path[:0] = [{str(here.parent)!r}]
from memfabric.vectors.shards import ProcessShard
shard = ProcessShard({str(where / "s")!r}, {DIMS}, None, create=True)
print(shard.pid, flush=True)
sys.stdin.readline()
shard.start_query([1.0] * {DIMS}, None, 1, True)  # asked, never read: the parent dies
os._exit(0)
"""
    stderr = tmp_path / "stderr"
    with open(stderr, "wb") as err:
        owner = subprocess.Popen(
            [sys.executable, "-c", owner_script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert owner.stdout is not None and owner.stdin is not None
    child = int(owner.stdout.readline())
    try:
        os.kill(child, signal.SIGSTOP)  # the child is busy: it answers once the parent is gone
        owner.stdin.write("go\n")
        owner.stdin.flush()
        assert owner.wait(timeout=30) == 0
        os.kill(child, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child}").exists():
            assert time.monotonic() < deadline, "the orphaned child did not end"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        owner.kill()
        owner.communicate()
    assert "Traceback" not in stderr.read_text(), stderr.read_text()
