"""Superseded vector collections: an alias cutover (a new embedder, a new payload version)
leaves the old physical collections behind, never read again but still holding what was
projected into them. `VectorStore.drop_superseded()` and `memfabric vectors prune` drop
them, and never a collection an alias points at.

The upgrade-like cutover: collections of payload version 1 (the subject and session ids in
clear), then the same embedder under payload version 2 (pseudonyms only). Real stores: Qdrant
Edge and qdrant-client's local mode, both on disk.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from conftest import files_holding, point_payload
from memfabric.constants import INDEXED_TIERS
from memfabric.runtime import contract_change
from memfabric.vectors import (
    CollectionContract,
    EdgeVectorStore,
    QdrantServerStore,
    VectorPoint,
    VectorStore,
)

MODEL, VERSION, DIMS = "all-MiniLM-L6-v2", "1", 8
RAW_SUBJECT = "user-raw-8842-in-clear"  # what a version-1 payload held in clear
RAW_SESSION = "sess-raw-77-in-clear"
PSEUDONYM = "hmac:" + "5e" * 16


def open_store(kind: str, where: Path) -> VectorStore:
    if kind == "edge":
        return EdgeVectorStore(where)
    return QdrantServerStore(path=where)


@pytest.fixture(params=["edge", "qdrant-client-local"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def v1_contracts() -> dict[str, CollectionContract]:
    return {
        t: CollectionContract(f"mem_{t}", MODEL, VERSION, DIMS, payload=1) for t in INDEXED_TIERS
    }


def project_under_payload_v1(store: VectorStore) -> dict[str, str]:
    """What a deployment of payload version 1 left on disk: its collections aliased, a point
    in each whose payload names the subject and session in clear. The aliases."""
    contracts = v1_contracts()
    for contract in contracts.values():
        store._open_or_create(contract)
        vector = np.ones(DIMS) / np.sqrt(DIMS)
        payload = {
            "memory_id": "0b0e9d4a-52f4-4a57-9d51-4f7ae7a1c001",
            "tenant_id": "acme",
            "tier": contract.tier,
            "visibility": "subject",
            "scope_key": f"subject:{RAW_SUBJECT}",
            "subject_id": RAW_SUBJECT,
            "session_id": RAW_SESSION,
        }
        store._upsert_raw(contract.physical_name, [(payload["memory_id"], list(vector), payload)])
    store._set_aliases({c.name: c.physical_name for c in contracts.values()})
    store.flush()
    return store.aliases()


def upgraded(kind: str, where: Path) -> tuple[VectorStore, dict[str, str], dict[str, str]]:
    """The upgrade: payload version 1 projected, the store closed, opened again by the new
    version, which binds payload version 2 (the cutover) and projects a record with
    pseudonyms only. (the store, the aliases before, after)."""
    old = open_store(kind, where)
    try:
        before = project_under_payload_v1(old)
    finally:
        old.close()
    store = open_store(kind, where)
    store.ensure_collections(MODEL, VERSION, DIMS)
    payload = point_payload("semantic", subject=PSEUDONYM, session=PSEUDONYM)
    store.upsert("semantic", [VectorPoint(payload, np.ones(DIMS) / np.sqrt(DIMS))])
    store.flush()
    return store, before, store.aliases()


def test_prune_drops_the_superseded_collections_and_the_raw_ids_with_them(
    kind: str, tmp_path: Path
) -> None:
    where = tmp_path / "vectors"
    store, before, after = upgraded(kind, where)
    try:
        assert set(before.values()).isdisjoint(after.values())  # the cutover happened
        assert files_holding(where, RAW_SUBJECT), "the version-1 points are on disk"
        assert set(store.superseded()) == set(before.values())
        assert store.collections().keys() >= set(before.values())  # listing dropped nothing
        dropped = store.drop_superseded()
        assert set(dropped) == set(before.values())
        assert all(c.payload == 1 for c in dropped.values())
        assert store.superseded() == {}
        assert set(store.collections()) == set(after.values())
        assert store.aliases() == after and store.count("semantic") == 1
    finally:
        store.close()
    assert files_holding(where, RAW_SUBJECT) == []
    assert files_holding(where, RAW_SESSION) == []
    if kind == "edge":
        shards = {p.name for p in (where / "shards").iterdir()}
        assert shards == set(after.values())
        manifest = json.loads((where / "manifest.json").read_text())
        assert set(manifest["collections"]) == set(after.values())
    again = open_store(kind, where)  # what a fresh process finds
    try:
        assert set(again.collections()) == set(after.values())
        assert again.count("semantic") == 1
    finally:
        again.close()


def test_prune_never_drops_an_aliased_or_bound_collection(kind: str, tmp_path: Path) -> None:
    """A collection built beside the live one (not yet cut over) is bound, so kept by the
    store that builds it; the live one is aliased, so kept by every store."""
    where = tmp_path / "vectors"
    store = open_store(kind, where)
    try:
        live = store.ensure_collections(MODEL, VERSION, DIMS)
        beside = store.ensure_collections(MODEL, "2", DIMS, activate=False)
        assert store.superseded() == {}
        assert store.drop_superseded() == {}
        every = {c.physical_name for c in (*live.values(), *beside.values())}
        assert set(store.collections()) == every
    finally:
        store.close()
    fresh = open_store(kind, where)  # not bound: only the aliases count
    try:
        dropped = fresh.drop_superseded()
        assert set(dropped) == {c.physical_name for c in beside.values()}
        assert set(fresh.collections()) == {c.physical_name for c in live.values()}
        assert fresh.aliases() == {c.name: c.physical_name for c in live.values()}
    finally:
        fresh.close()


def test_prune_on_a_server_keeps_other_aliases_and_other_collections(tmp_path: Path) -> None:
    """On a Qdrant server any alias keeps its collection, and a collection that is not the
    fabric's (no contract) is never touched."""
    from qdrant_client.http import models as m

    store = QdrantServerStore(path=tmp_path / "vectors")
    try:
        project_under_payload_v1(store)
        kept = v1_contracts()["semantic"].physical_name
        store.ensure_collections(MODEL, VERSION, DIMS)
        store.client.update_collection_aliases(
            [
                m.CreateAliasOperation(
                    create_alias=m.CreateAlias(collection_name=kept, alias_name="pinned")
                )
            ]
        )
        store.client.create_collection(
            "mem_other__not_ours", vectors_config=m.VectorParams(size=4, distance=m.Distance.DOT)
        )
        dropped = store.drop_superseded()
        assert kept not in dropped and len(dropped) == len(INDEXED_TIERS) - 1
        assert store.client.collection_exists(kept)
        assert store.client.collection_exists("mem_other__not_ours")
    finally:
        store.close()


# --------------------------------------------------------------------------------------
# memfabric vectors prune


def cli_env(root: Path, socket: Path | None = None) -> dict[str, str | None]:
    return {
        "MEMFABRIC_VECTOR_DIR": str(root / "vectors"),
        "MEMFABRIC_SOCKET": str(socket or root / "no.sock"),
        "QDRANT_URL": None,
    }


def prune(env: dict[str, str | None], *args: str) -> Result:
    from memfabric.cli import app

    return CliRunner().invoke(app, ["vectors", "prune", *args], env=env)


@pytest.fixture
def upgraded_edge(tmp_path: Path) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    store, before, after = upgraded("edge", tmp_path / "vectors")
    store.close()
    yield before, after


def test_cli_lists_by_default_and_drops_with_yes(
    tmp_path: Path, upgraded_edge: tuple[dict[str, str], dict[str, str]]
) -> None:
    before, after = upgraded_edge
    listed = prune(cli_env(tmp_path))
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    for physical in before.values():
        assert (
            f"[prune] would drop {physical} ({physical.split('__')[0]}: {MODEL} {VERSION},"
            f" {DIMS} dims, payload version 1)" in lines
        )
    assert lines[-1] == "[prune] nothing dropped: run again with --yes to drop them"
    assert files_holding(tmp_path / "vectors", RAW_SUBJECT)  # the listing dropped nothing

    dropped = prune(cli_env(tmp_path), "--yes")
    assert dropped.exit_code == 0, dropped.output
    assert sorted(dropped.stdout.splitlines()) == sorted(
        f"[prune] dropped {p} ({p.split('__')[0]}: {MODEL} {VERSION}, {DIMS} dims, payload"
        " version 1)"
        for p in before.values()
    )
    assert files_holding(tmp_path / "vectors", RAW_SUBJECT) == []
    nothing = prune(cli_env(tmp_path), "--yes")
    assert nothing.exit_code == 0, nothing.output
    assert nothing.stdout == "[prune] no superseded collections: every collection is aliased\n"
    store = EdgeVectorStore(tmp_path / "vectors")
    try:
        assert store.aliases() == after and set(store.collections()) == set(after.values())
    finally:
        store.close()


def test_cli_refuses_while_another_process_owns_the_shards(
    tmp_path: Path, upgraded_edge: tuple[dict[str, str], dict[str, str]]
) -> None:
    before, _ = upgraded_edge
    owner = EdgeVectorStore(tmp_path / "vectors")  # as a `memfabric rebuild` without serve
    try:
        refused = prune(cli_env(tmp_path), "--yes")
        assert refused.exit_code == 1
        assert refused.stderr.startswith("error: nothing pruned: "), refused.output
        assert "is open in another process (pid " in refused.stderr
        assert "hint: while `memfabric serve` runs, this command asks it" in refused.stderr
        assert len(refused.stderr.splitlines()) == 1
        assert set(owner.collections()) >= set(before.values())  # nothing dropped
    finally:
        owner.close()
    assert files_holding(tmp_path / "vectors", RAW_SUBJECT)


def test_cli_goes_through_serve_when_it_runs(
    tmp_path: Path, upgraded_edge: tuple[dict[str, str], dict[str, str]]
) -> None:
    """serve owns the shards: the command asks it (under serve's lock, as rebuild does), and
    the collections serve is bound to stay."""
    from memfabric import ops
    from memfabric.broker import LocalBroker, serve_socket

    before, after = upgraded_edge
    store = EdgeVectorStore(tmp_path / "vectors")
    store.ensure_collections(MODEL, VERSION, DIMS)
    ops_: dict[str, Any] = {"prune": lambda drop=False: ops.prune(store, drop=drop)}
    socket = tmp_path / "serve.sock"
    server = serve_socket(LocalBroker(store, None, ops_), socket, threading.Lock())  # type: ignore[arg-type]
    try:
        dropped = prune(cli_env(tmp_path, socket), "--yes")
        assert dropped.exit_code == 0, dropped.output
        lines = dropped.stdout.splitlines()
        assert lines[0] == f"[prune] asking memfabric serve ({socket})"
        assert {line.split()[2] for line in lines[1:]} == set(before.values())
        assert set(store.collections()) == set(after.values())
        assert store.count("semantic") == 1
    finally:
        server.shutdown()
        server.server_close()
        store.close()
    assert files_holding(tmp_path / "vectors", RAW_SUBJECT) == []


# --------------------------------------------------------------------------------------
# what serve says when the aliases moved


def test_a_changed_payload_version_is_told_as_such(tmp_path: Path) -> None:
    where = tmp_path / "vectors"
    store, before, after = upgraded("edge", where)
    try:
        told = contract_change(before, after, store.collections())
    finally:
        store.close()
    assert told is not None
    assert told.startswith(
        f"the vector payload version changed (1 -> 2) ({before['mem_episodic']} ->"
        f" {after['mem_episodic']}): "
    ), told
    assert "embedder" not in told
    assert "`memfabric vectors prune --yes`" in told


def test_a_changed_embedder_and_payload_version_are_both_told(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "vectors")
    try:
        before = project_under_payload_v1(store)
        store.ensure_collections(MODEL, "2", DIMS)
        told = contract_change(before, store.aliases(), store.collections())
    finally:
        store.close()
    assert told is not None
    assert told.startswith(
        "the embedder's contract and the vector payload version (1 -> 2) changed"
    ), told
