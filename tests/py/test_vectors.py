"""The vector projection: the same behaviour on Qdrant Edge and on qdrant-client (local mode).

Every test runs on both backends. Edge shards live on /dev/shm when it exists: creating a
shard and its payload indexes fsyncs a few hundred times, about 10 s per store on this
machine's disk against about 1 s on tmpfs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import POINT_T0, lent
from conftest import point_payload as rec
from memfabric import vectors as v
from memfabric.vectors import (
    EdgeVectorStore,
    MemoryPayload,
    QdrantServerStore,
    RecallFilter,
    VectorPoint,
    VectorStore,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = "all-MiniLM-L6-v2"
T0 = POINT_T0  # where point_payload's validity starts
T1 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
US = timedelta(microseconds=1)
HASH = "sha256:" + "ab" * 32
SHM = Path("/dev/shm")  # noqa: S108 (tmpfs: see the module docstring)


def unit(rng: np.random.Generator, dims: int = 8) -> np.ndarray[Any, np.dtype[np.float64]]:
    x = rng.normal(size=dims)
    return x / np.linalg.norm(x)


def flt(
    tenant: str = "acme",
    keys: Sequence[str] = ("subject:user-8842", "tenant"),
    at: datetime = T1,
    **kw: Any,
) -> RecallFilter:
    return RecallFilter(tenant_id=tenant, scope_keys=keys, valid_at=at, **kw)


@dataclass
class Backend:
    """Where a test's store lives, so it can be closed and opened again."""

    kind: str
    location: Path

    def open(self) -> VectorStore:
        if self.kind.startswith("edge"):
            # edge-child: each shard owned by a child process (MEMFABRIC_EDGE_SHARDS=child)
            return EdgeVectorStore(self.location, shard_processes=self.kind == "edge-child")
        return QdrantServerStore(path=self.location)


@pytest.fixture(params=["edge", "edge-child", "qdrant-client-local"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param.startswith("edge") and SHM.is_dir() and os.access(SHM, os.W_OK):
        where = Path(tempfile.mkdtemp(prefix="mf-edge-", dir=SHM))
        yield Backend(request.param, where)
        shutil.rmtree(where, ignore_errors=True)
    else:
        kind = request.param if request.param.startswith("edge") else "local"
        yield Backend(kind, tmp_path / "q")


def _where(kind: str, tmp: Path) -> Path:
    if kind.startswith("edge") and SHM.is_dir() and os.access(SHM, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="mf-edge-", dir=SHM))
    return tmp


@pytest.fixture(scope="module")
def shm_dirs() -> Iterator[list[Path]]:
    """Directories the module's shared stores made on /dev/shm, removed at its end (pytest
    removes its own temporary directories)."""
    made: list[Path] = []
    yield made
    for where in made:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def store(
    request: pytest.FixtureRequest,
    backend: Backend,
    shm_dirs: list[Path],
    kept_stores: dict[Any, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VectorStore]:
    """An empty store bound to the 8-dimension contract. Creating one costs 1-2 s on Edge
    (a shard and its payload indexes per tier, and with shard processes a child each), so
    the tests share one per backend, emptied after each test (`conftest.lent`: replaced when
    a test changed its contracts); a test that takes `backend` itself closes and reopens its
    store and gets one of its own."""
    if "backend" in inspect.signature(request.function).parameters:
        s = backend.open()
        s.ensure_collections(MODEL, "1", 8)
        yield s
        s.close()
        return

    def make() -> VectorStore:
        where = _where(backend.kind, tmp_path_factory.mktemp("kept") / "q")
        if where.parent == SHM:
            shm_dirs.append(where)
        made = Backend(backend.kind, where).open()
        made.ensure_collections(MODEL, "1", 8)
        return made

    with lent(kept_stores, backend.kind, make) as s:
        yield s


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(8842)


def put(
    store: VectorStore, rng: np.random.Generator, payloads: Sequence[MemoryPayload]
) -> dict[str, Any]:
    """Upsert each payload with a random unit vector; returns memory_id -> vector."""
    vecs = {p.memory_id: unit(rng) for p in payloads}
    by_tier: dict[str, list[VectorPoint]] = {}
    for p in payloads:
        by_tier.setdefault(p.tier, []).append(VectorPoint(p, vecs[p.memory_id]))
    for tier, points in by_tier.items():
        store.upsert(tier, points)
    return vecs


def ids(hits: Sequence[tuple[str, float]]) -> set[str]:
    return {h[0] for h in hits}


def everything(
    store: VectorStore, rfilter: RecallFilter, tiers: Sequence[str] = ("semantic",)
) -> set[str]:
    return ids(store.search(tiers, [1.0] * 8, rfilter, 1000, exact=True))


# --------------------------------------------------------------------------------------
# search and filters


def test_search_returns_memory_ids_best_first(store: VectorStore, rng: np.random.Generator) -> None:
    payloads = [rec() for _ in range(20)]
    vecs = put(store, rng, payloads)
    target = payloads[7].memory_id
    hits = store.search(["semantic"], vecs[target], flt(), 5, exact=True)
    assert len(hits) == 5
    assert hits[0][0] == target and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert all(isinstance(i, str) and isinstance(s, float) for i, s in hits)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert ids(hits) <= set(vecs)
    approx = store.search(["semantic"], vecs[target], flt(), 5)
    assert approx[0][0] == target


def test_other_tenants_points_are_never_returned(
    store: VectorStore, rng: np.random.Generator
) -> None:
    acme = [rec(tenant="acme") for _ in range(10)] + [rec(tenant="acme", visibility="tenant")]
    globex = [rec(tenant="globex") for _ in range(10)] + [rec(tenant="globex", visibility="tenant")]
    vecs = put(store, rng, acme)
    # same vectors, same scope keys, other tenant: only tenant_id tells them apart
    store.upsert(
        "semantic", [VectorPoint(g, vecs[a.memory_id]) for a, g in zip(acme, globex, strict=True)]
    )
    for p in acme:
        hits = store.search(["semantic"], vecs[p.memory_id], flt("acme"), 100, exact=True)
        assert ids(hits) == {a.memory_id for a in acme}
    assert everything(store, flt("globex")) == {g.memory_id for g in globex}
    assert everything(store, flt("initech")) == set()


def test_scope_keys_select_subject_agent_session_or_tenant(
    store: VectorStore, rng: np.random.Generator
) -> None:
    mine = [rec(subject="user-8842") for _ in range(3)]
    theirs = [rec(subject="user-9999") for _ in range(3)]
    shared = [rec(visibility="tenant", subject=None) for _ in range(3)]
    agent = [rec(visibility="agent", agent="com-agt-003")]
    session = [rec(visibility="session", session="sess-1")]
    put(store, rng, mine + theirs + shared + agent + session)
    ms = {p.memory_id for p in mine}
    assert everything(store, flt(keys=["subject:user-8842"])) == ms
    assert everything(store, flt(keys=["subject:user-8842", "tenant"])) == ms | {
        p.memory_id for p in shared
    }
    assert everything(store, flt(keys=["tenant"])) == {p.memory_id for p in shared}
    assert everything(store, flt(keys=["agent:com-agt-003"])) == {agent[0].memory_id}
    assert everything(store, flt(keys=["session:sess-1"])) == {session[0].memory_id}
    assert everything(store, flt(keys=["subject:user-0000"])) == set()
    scope = {pid: p["scope_key"] for pid, p in store.scroll("semantic")}
    assert scope[theirs[0].memory_id] == "subject:user-9999"
    assert scope[shared[0].memory_id] == "tenant"


def test_each_search_of_several_tiers_uses_its_own_filter_in_every_tier(
    store: VectorStore, rng: np.random.Generator
) -> None:
    # Edge builds a search's engine filter once for all its tiers' shards: the next
    # search, with another filter, must not be served the previous one in any tier.
    a = [rec(tier=t, subject="user-8842") for t in ("semantic", "episodic")]
    b = [rec(tier=t, subject="user-9999") for t in ("semantic", "episodic")]
    put(store, rng, a + b)
    tiers = ("semantic", "episodic")
    for keys, want in (("subject:user-8842", a), ("subject:user-9999", b), ("tenant", [])):
        assert everything(store, flt(keys=[keys]), tiers) == {p.memory_id for p in want}
    again = flt(keys=["subject:user-8842"])
    assert everything(store, again, tiers) == everything(store, again, tiers) == ids_of(a)


def ids_of(payloads: Sequence[MemoryPayload]) -> set[str]:
    return {p.memory_id for p in payloads}


def test_validity_start_is_inclusive_end_exclusive_open_end_is_forever(
    store: VectorStore, rng: np.random.Generator
) -> None:
    closed = rec(valid_from=T0, valid_until=T1)
    open_ended = rec(valid_from=T0)
    put(store, rng, [closed, open_ended])
    both = {closed.memory_id, open_ended.memory_id}
    assert everything(store, flt(at=T0 - US)) == set()
    assert everything(store, flt(at=T0)) == both
    assert everything(store, flt(at=T1 - US)) == both
    assert everything(store, flt(at=T1)) == {open_ended.memory_id}
    far = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert everything(store, flt(at=far)) == {open_ended.memory_id}
    # the same instant written with another offset is the same instant
    plus2 = T1.astimezone(timezone(timedelta(hours=2)))
    assert everything(store, flt(at=plus2)) == {open_ended.memory_id}
    assert everything(store, flt(at=plus2 - US)) == both


def test_min_confidence_is_inclusive(store: VectorStore, rng: np.random.Generator) -> None:
    low, mid, high = rec(confidence=0.5), rec(confidence=0.8), rec(confidence=0.95)
    put(store, rng, [low, mid, high])
    assert everything(store, flt(min_confidence=0.8)) == {mid.memory_id, high.memory_id}
    assert everything(store, flt(min_confidence=0.0)) == {
        low.memory_id,
        mid.memory_id,
        high.memory_id,
    }
    assert everything(store, flt(min_confidence=1.0)) == set()


def test_excluded_labels_drop_a_point_carrying_any_of_them(
    store: VectorStore, rng: np.random.Generator
) -> None:
    plain, pii, phi, other = rec(), rec(labels=["pii"]), rec(labels=["phi", "x"]), rec(labels=["x"])
    put(store, rng, [plain, pii, phi, other])
    assert everything(store, flt(excluded_labels=["pii", "phi"])) == {
        plain.memory_id,
        other.memory_id,
    }
    assert len(everything(store, flt())) == 4


def test_only_live_states_are_searchable(store: VectorStore, rng: np.random.Generator) -> None:
    live = [rec(state=s) for s in ("raw", "consolidated", "reflected")]
    dead = [rec(state=s) for s in ("superseded", "expired")]
    put(store, rng, live + dead)
    assert everything(store, flt()) == {p.memory_id for p in live}
    assert everything(store, flt(states=["consolidated"])) == {live[1].memory_id}
    with pytest.raises(ValueError, match="subset"):
        flt(states=["superseded"])
    with pytest.raises(ValueError, match="tombstoned"):
        store.upsert("semantic", [VectorPoint(rec(state="tombstoned"), unit(rng))])
    assert store.count("semantic") == 5


def test_search_merges_tiers_and_refuses_unindexed_ones(
    store: VectorStore, rng: np.random.Generator
) -> None:
    sem = [rec(tier="semantic") for _ in range(4)]
    epi = [rec(tier="episodic") for _ in range(4)]
    prof = [rec(tier="profile") for _ in range(4)]
    vecs = put(store, rng, sem + epi + prof)
    q = vecs[epi[2].memory_id]
    hits = store.search(["semantic", "episodic"], q, flt(), 100, exact=True)
    assert ids(hits) == {p.memory_id for p in sem + epi}
    assert hits[0][0] == epi[2].memory_id
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    with pytest.raises(ValueError, match="no vector collection"):
        store.search(["relational"], q, flt(), 5)
    with pytest.raises(ValueError, match="not semantic"):
        store.upsert("semantic", [VectorPoint(epi[0], q)])


# --------------------------------------------------------------------------------------
# writes


def test_delete_removes_points_and_ignores_unknown_ids(
    store: VectorStore, rng: np.random.Generator
) -> None:
    payloads = [rec() for _ in range(5)]
    put(store, rng, payloads)
    gone = [payloads[0].memory_id, payloads[3].memory_id.upper()]
    store.delete("semantic", [*gone, str(uuid.uuid4())])
    assert store.count("semantic") == 3
    assert everything(store, flt()) == {p.memory_id for p in payloads} - {
        payloads[0].memory_id,
        payloads[3].memory_id,
    }


def test_delete_many_removes_each_tiers_points_and_only_those(
    store: VectorStore, rng: np.random.Generator
) -> None:
    sem = [rec() for _ in range(4)]
    epi = [rec(tier="episodic") for _ in range(4)]
    put(store, rng, sem)
    put(store, rng, epi)
    store.delete_many(
        {
            "semantic": [sem[0].memory_id, epi[1].memory_id, str(uuid.uuid4())],
            "episodic": [epi[2].memory_id.upper(), sem[3].memory_id],
            "procedural": [sem[1].memory_id],  # holds nothing
        }
    )
    assert {i for i, _ in store.scroll("semantic")} == {p.memory_id for p in sem[1:]}
    assert {i for i, _ in store.scroll("episodic")} == {p.memory_id for p in epi if p is not epi[2]}
    store.delete_many({})  # nothing asked: nothing done


def test_set_payload_superseded_makes_a_point_unsearchable(
    store: VectorStore, rng: np.random.Generator
) -> None:
    a, b = rec(), rec()
    put(store, rng, [a, b])
    store.set_payload(
        "semantic", [a.memory_id, str(uuid.uuid4())], {"consolidation_state": "superseded"}
    )
    assert everything(store, flt()) == {b.memory_id}
    assert store.count("semantic") == 2
    payload = dict(store.scroll("semantic"))[a.memory_id]
    assert payload["consolidation_state"] == "superseded"


def test_set_payload_valid_until_moves_the_exclusive_end(
    store: VectorStore, rng: np.random.Generator
) -> None:
    a = rec()
    put(store, rng, [a])
    end = T0 + timedelta(days=1)
    store.set_payload("semantic", [a.memory_id], {"valid_until": end, "confidence": 0.4})
    assert everything(store, flt(at=end - US)) == {a.memory_id}
    assert everything(store, flt(at=end)) == set()
    assert everything(store, flt(at=end - US, min_confidence=0.5)) == set()
    payload = dict(store.scroll("semantic"))[a.memory_id]
    assert payload["valid_until"] == "2025-03-02T12:00:00.000000Z"
    assert payload["valid_until_ts"] == v.epoch_us(end)


def test_set_payload_refuses_immutable_fields(store: VectorStore, rng: np.random.Generator) -> None:
    a = rec()
    put(store, rng, [a])
    for change in ({"tenant_id": "globex"}, {"scope_key": "tenant"}, {"content_hash": HASH}):
        with pytest.raises(ValueError, match="set_payload may change only"):
            store.set_payload("semantic", [a.memory_id], change)
    with pytest.raises(ValueError, match="tombstoned"):
        store.set_payload("semantic", [a.memory_id], {"consolidation_state": "tombstoned"})
    assert dict(store.scroll("semantic"))[a.memory_id]["tenant_id"] == "acme"


def test_vectors_must_match_the_contract(store: VectorStore, rng: np.random.Generator) -> None:
    with pytest.raises(ValueError, match="dimensions"):
        store.upsert("semantic", [VectorPoint(rec(), unit(rng, 9))])
    with pytest.raises(ValueError, match="non-zero"):
        store.upsert("semantic", [VectorPoint(rec(), [0.0] * 8)])
    with pytest.raises(ValueError, match="dimensions"):
        store.search(["semantic"], [1.0] * 7, flt(), 3)
    with pytest.raises(ValueError, match="non-zero"):
        store.search(["semantic"], [float("nan")] * 8, flt(), 3)
    assert store.count("semantic") == 0


# --------------------------------------------------------------------------------------
# determinism, wipe, count/scroll


def test_exact_search_breaks_ties_by_memory_id(
    store: VectorStore, rng: np.random.Generator
) -> None:
    same = unit(rng)
    tied = [rec(tier=random.Random(i).choice(["semantic", "episodic"])) for i in range(12)]
    others = [rec() for _ in range(10)]
    put(store, rng, others)
    order = list(tied)
    random.Random(1).shuffle(order)
    for p in order:  # one at a time, shuffled: insertion order must not matter
        store.upsert(p.tier, [VectorPoint(p, same)])
    expected = sorted(p.memory_id for p in tied)
    sem = sorted(p.memory_id for p in tied if p.tier == "semantic")
    # qdrant-client's local mode renormalizes its stored f32 vectors in place on the first
    # query after an upsert, which moves their scores by an ulp; one query settles them.
    # (Edge, like a server, scores identical vectors identically from the start.)
    store.search(["semantic", "episodic"], same, flt(), 1, exact=True)
    for _ in range(3):
        hits = store.search(["semantic", "episodic"], same, flt(), 5, exact=True)
        assert [h[0] for h in hits] == expected[:5]
        assert len({h[1] for h in hits}) == 1
        one = store.search(["semantic"], same, flt(), 3, exact=True)
        assert [h[0] for h in one] == sem[:3]


def test_wipe_and_reupsert_gives_identical_exact_results(
    store: VectorStore, rng: np.random.Generator
) -> None:
    payloads = [
        rec(tier=t, tenant=ten, subject=f"user-{i % 4}", confidence=0.5 + (i % 5) / 10)
        for i, (t, ten) in enumerate(
            (t, ten)
            for t in ("semantic", "episodic")
            for ten in ("acme", "globex")
            for _ in range(60)
        )
    ]
    vecs = put(store, rng, payloads)
    queries = [unit(rng) for _ in range(5)]
    filters = [
        flt("acme", keys=["subject:user-1", "subject:user-2"]),
        flt("globex", keys=["subject:user-0"], min_confidence=0.7),
    ]

    def run() -> list[list[tuple[str, float]]]:
        return [
            store.search(["semantic", "episodic"], q, f, 10, exact=True)
            for q in queries
            for f in filters
        ]

    before = run()
    aliases = store.aliases()
    store.wipe()
    assert store.aliases() == aliases
    assert all(store.count(t) == 0 for t in v.INDEXED_TIERS)
    assert all(h == [] for h in run())
    for p in reversed(payloads):
        store.upsert(p.tier, [VectorPoint(p, vecs[p.memory_id])])
    assert run() == before
    assert any(len(h) == 10 for h in before)


def test_count_and_scroll_see_every_point_with_its_payload(
    store: VectorStore, rng: np.random.Generator
) -> None:
    payloads = [rec(tier="procedural", confidence=(i % 100) / 100) for i in range(700)]
    put(store, rng, payloads)
    assert store.count("procedural") == 700
    assert store.count("semantic") == 0
    seen = dict(store.scroll("procedural"))
    assert len(seen) == 700
    for p in payloads[:50]:
        assert seen[p.memory_id] == p.to_payload()


# --------------------------------------------------------------------------------------
# contracts, aliases, reopening


@pytest.mark.slow
def test_contract_change_is_a_new_collection_and_the_old_stays(
    store: VectorStore, rng: np.random.Generator
) -> None:
    old = store.contracts()["semantic"]
    a = rec()
    vec8 = unit(rng)
    store.upsert("semantic", [VectorPoint(a, vec8)])

    new = store.ensure_collections(MODEL, "1", 16)["semantic"]
    assert new.physical_name != old.physical_name and new.name == old.name == "mem_semantic"
    assert store.aliases()["mem_semantic"] == new.physical_name
    assert store.count("semantic") == 0
    assert {old.physical_name, new.physical_name} <= set(store.collections())
    assert store.collections()[old.physical_name] == old
    with pytest.raises(ValueError, match="dimensions"):
        store.upsert("semantic", [VectorPoint(a, vec8)])
    store.upsert("semantic", [VectorPoint(a, unit(rng, 16))])

    other_version = store.ensure_collections(MODEL, "2", 8)["semantic"]
    assert other_version.physical_name not in {old.physical_name, new.physical_name}

    back = store.ensure_collections(MODEL, "1", 8)["semantic"]
    assert back == old
    assert store.aliases()["mem_semantic"] == old.physical_name
    assert store.count("semantic") == 1
    hits = store.search(["semantic"], vec8, flt(), 1, exact=True)
    assert hits[0][0] == a.memory_id


@pytest.mark.slow  # two collections built beside each other: 5-6 s with shard processes
def test_build_a_version_beside_the_live_one_then_cut_over(
    backend: Backend, store: VectorStore, rng: np.random.Generator
) -> None:
    live = store.aliases()
    built = store.ensure_collections(MODEL, "2", 8, activate=False)
    assert store.aliases() == live
    assert store.contracts() == built
    a = rec()
    put(store, rng, [a])
    store.flush()
    store.cutover()
    assert store.aliases() == {c.name: c.physical_name for c in built.values()}
    store.close()
    again = backend.open()  # a fresh process binds to what the aliases point at
    try:
        assert again.contracts() == built
        assert again.count("semantic") == 1
    finally:
        again.close()


def test_reopening_keeps_points_and_contracts(
    backend: Backend, store: VectorStore, rng: np.random.Generator
) -> None:
    payloads = [rec() for _ in range(30)]
    vecs = put(store, rng, payloads)
    q = vecs[payloads[3].memory_id]
    before = store.search(["semantic"], q, flt(), 10, exact=True)
    contracts = store.contracts()
    store.flush()
    store.close()
    again = backend.open()
    try:
        assert again.contracts() == contracts
        assert again.count("semantic") == 30
        after = again.search(["semantic"], q, flt(), 10, exact=True)
        assert [h[0] for h in after] == [h[0] for h in before]
        if backend.kind.startswith("edge"):
            assert after == before
        else:  # local mode reloads its vectors at another precision: scores move by an ulp
            assert [h[1] for h in after] == pytest.approx([h[1] for h in before], abs=1e-6)
    finally:
        again.close()


def test_a_store_without_a_contract_refuses_to_guess(backend: Backend) -> None:
    s = backend.open()
    try:
        assert s.contracts() == {}
        with pytest.raises(v.NotBound):
            s.count("semantic")
        with pytest.raises(v.NotBound):
            s.search(["semantic"], [1.0] * 8, flt(), 3)
        with pytest.raises(v.NotBound):
            s.cutover()
    finally:
        s.close()


def test_384_dimensions(backend: Backend, rng: np.random.Generator) -> None:
    s = backend.open()
    try:
        s.ensure_collections(MODEL, "1", 384)
        payloads = [rec(tier="episodic") for _ in range(64)]
        vecs = {p.memory_id: unit(rng, 384) for p in payloads}
        s.upsert("episodic", [VectorPoint(p, vecs[p.memory_id]) for p in payloads])
        for p in payloads[:5]:
            hits = s.search(["episodic"], vecs[p.memory_id], flt(), 3, exact=True)
            assert hits[0][0] == p.memory_id
            assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
            assert hits[1][1] < 0.5  # random 384-d unit vectors are nearly orthogonal
    finally:
        s.close()


# --------------------------------------------------------------------------------------
# Edge only: one process per data directory


def test_edge_second_opener_fails_fast(tmp_path: Path) -> None:
    where = tmp_path / "edge"
    first = EdgeVectorStore(where)
    try:
        with pytest.raises(v.VectorStoreLocked, match=f"pid {os.getpid()}"):
            EdgeVectorStore(where)
        code = (
            "import sys; from memfabric.vectors import EdgeVectorStore, VectorStoreLocked\n"
            "try:\n    EdgeVectorStore(sys.argv[1])\n"
            "except VectorStoreLocked as e:\n    print(e); sys.exit(3)\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT / "py")}
        proc = subprocess.run(
            [sys.executable, "-c", code, str(where)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert proc.returncode == 3, proc.stderr
        assert "open in another process" in proc.stdout
    finally:
        first.close()
    EdgeVectorStore(where).close()  # released on close


def test_edge_flush_syncs_the_written_shards_and_they_survive_a_reopen(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    where = tmp_path / "edge"
    store = EdgeVectorStore(where)
    store.ensure_collections(MODEL, "1", 8)
    physical = {tier: store._bindings()[tier].physical_name for tier in v.INDEXED_TIERS}
    assert store._dirty == set()
    kept, gone = rec(tier="episodic"), rec(tier="episodic")
    put(store, rng, [kept, gone])
    # deleting points a shard does not hold (the projector deletes from every other tier)
    # leaves that shard clean; a real delete dirties its shard
    store.delete("semantic", [kept.memory_id, gone.memory_id])
    store.delete("episodic", [gone.memory_id.upper()])
    assert store._dirty == {physical["episodic"]}
    store.flush()
    assert store._dirty == set()
    store.close()
    reopened = EdgeVectorStore(where)
    try:
        reopened.ensure_collections(MODEL, "1", 8)
        assert reopened.count("episodic") == 1 and reopened.count("semantic") == 0
        assert everything(reopened, flt(), tiers=["episodic"]) == {kept.memory_id}
    finally:
        reopened.close()


# --------------------------------------------------------------------------------------
# no backend: filter, payload, factory


def test_recall_filter_always_carries_tenant_and_scope() -> None:
    f = flt(min_confidence=0.6, excluded_labels=["pii"])
    qf = f.to_filter()
    must_keys = [c.key for c in qf.must or []]  # type: ignore[union-attr]
    assert must_keys == [
        "tenant_id",
        "scope_key",
        "consolidation_state",
        "valid_from_ts",
        "valid_until_ts",
        "confidence",
    ]
    assert [c.key for c in qf.must_not or []] == ["compliance_labels"]  # type: ignore[union-attr]
    ef = f.to_edge_filter()
    assert [c.key for c in ef.must or []] == must_keys  # type: ignore[union-attr]
    for bad in (
        {"tenant_id": "", "scope_keys": ["tenant"]},
        {"tenant_id": "acme", "scope_keys": []},
        {"tenant_id": "acme", "scope_keys": [""]},
        {"tenant_id": "acme", "scope_keys": ["tenant"], "min_confidence": 1.5},
    ):
        with pytest.raises(ValueError):
            RecallFilter(valid_at=T1, **bad)
    with pytest.raises(ValueError, match="timezone-aware"):
        RecallFilter("acme", ["tenant"], datetime(2025, 1, 1))
    with pytest.raises(TypeError):
        RecallFilter("acme", "tenant", T1)


def test_payload_has_the_guide_fields_and_postgres_scope_keys() -> None:
    row = {
        "memory_id": uuid.UUID("6f1c2a9e-0000-4000-8000-000000000001"),
        "tenant_id": "acme",
        "tier": "episodic",
        "visibility": "session",
        "subject_ref": "hmac:01",
        "agent_id": "com-agt-003",
        "session_ref": "hmac:02",
        "content_hash": HASH,
        "confidence": 0.75,
        "valid_from": T0,
        "valid_until": None,
        "consolidation_state": "raw",
        "retention_class": "audit",
        "compliance_labels": ["pii"],
        "version": "1.2.0",
    }
    p = MemoryPayload.from_row(row).to_payload()
    guide = {
        "memory_id", "tenant_id", "tier", "visibility", "scope_type", "scope_id", "subject_ref",
        "agent_id", "session_ref", "content_hash", "confidence", "valid_from", "valid_until",
        "consolidation_state", "retention_class", "compliance_labels", "version",
    }  # fmt: skip
    assert guide <= set(p)
    assert p["memory_id"] == "6f1c2a9e-0000-4000-8000-000000000001"
    assert (p["scope_type"], p["scope_id"], p["scope_key"]) == (
        "session",
        "hmac:02",
        "session:hmac:02",
    )
    assert p["valid_from"] == "2025-03-01T12:00:00.000000Z"
    assert p["valid_until"] is None and p["valid_until_ts"] == v.OPEN_ENDED_TS
    assert p["valid_from_ts"] == 1740830400 * 10**6
    assert rec(visibility="tenant").to_payload()["scope_id"] == "acme"
    assert rec(visibility="tenant").scope_key == "tenant"
    with pytest.raises(ValueError, match="needs its subject_ref"):
        rec(subject=None)
    with pytest.raises(ValueError, match="valid_until must be after"):
        rec(valid_until=T0)


def test_contract_names_are_versioned() -> None:
    c = v.CollectionContract("mem_semantic", MODEL, "1", 384)
    assert c.physical_name.startswith("mem_semantic__all-minilm-l6-v2_1_384d_")
    assert c.physical_name != v.CollectionContract("mem_semantic", MODEL, "1.0", 384).physical_name
    assert v.CollectionContract.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="Cosine"):
        v.CollectionContract("mem_semantic", MODEL, "1", 384, distance="Dot")
    with pytest.raises(ValueError, match="not a fabric tier"):
        v.CollectionContract("mem_relational", MODEL, "1", 384)


def test_the_payload_version_is_part_of_the_contract() -> None:
    """Payloads naming subjects by pseudonym (version 2) live in other collections than
    those of version 1 (ids in clear), whose recorded contracts keep their names."""
    legacy = {"name": "mem_semantic", "model": MODEL, "model_version": "1", "dims": 384,
              "distance": "Cosine"}  # fmt: skip
    old = v.CollectionContract.from_dict(legacy)
    assert old.payload == 1 and old.to_dict() == legacy
    canonical = json.dumps(legacy, sort_keys=True, separators=(",", ":")).encode()
    assert old.fingerprint == hashlib.sha256(canonical).hexdigest()[:10]  # the name it had
    new = v.CollectionContract("mem_semantic", MODEL, "1", 384)
    assert new.payload == v.PAYLOAD_VERSION == 2
    assert new.physical_name != old.physical_name
    assert v.CollectionContract.from_dict(new.to_dict()) == new
    assert {"subject_ref", "session_ref"} <= {name for name, _ in v.PAYLOAD_INDEXES}
    assert not {"subject_id", "session_id"} & {name for name, _ in v.PAYLOAD_INDEXES}
    with pytest.raises(ValueError, match="payload version"):
        v.CollectionContract("mem_semantic", MODEL, "1", 384, payload=3)


def test_store_from_env_picks_the_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("QDRANT_URL", raising=False)
    s = v.store_from_env(tmp_path / "edge")
    try:
        assert isinstance(s, EdgeVectorStore) and isinstance(s, VectorStore)
    finally:
        s.close()
    seen: list[tuple[Any, ...]] = []

    class FakeServerStore:  # no server here: record what the factory asks for
        def __init__(self, url: str, api_key: str | None = None) -> None:
            seen.append((url, api_key))

    monkeypatch.setattr(v, "QdrantServerStore", FakeServerStore)
    monkeypatch.setenv("QDRANT_URL", "http://qdrant.internal:6333")
    monkeypatch.setenv("QDRANT_API_KEY", "k")
    assert isinstance(v.store_from_env(tmp_path / "unused"), FakeServerStore)
    assert seen == [("http://qdrant.internal:6333", "k")]
    assert not (tmp_path / "unused").exists()
