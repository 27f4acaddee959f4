"""Wiring of the long-lived parts from the environment and the database's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from memfabric.call import fabric_call
from memfabric.embedding import Embedder, ProcessEmbedder, embedder_from_settings
from memfabric.graph import GraphStore, graph_from_env
from memfabric.projector import Projector
from memfabric.settings import Settings
from memfabric.vectors import CollectionContract, VectorStore, store_from_env


def projector_conninfo(login: str | None = None) -> str:
    """MEMFABRIC_PROJECTOR_URL, or the database as `login` (MEMFABRIC_PROJECTOR_LOGIN)."""
    return Settings.from_env().conninfo("projector", login)


def deployment_embedder(
    conninfo: str | psycopg.Connection[Any], *, child: bool = False
) -> Embedder:
    """The embedder the database names (one per deployment); never re-validated here.
    Read over a new connection, or over the caller's (an agent may read it)."""
    if isinstance(conninfo, psycopg.Connection):
        found = fabric_call(conninfo, "fabric_api.deployment_embedder")
    else:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            found = fabric_call(conn, "fabric_api.deployment_embedder")
    return embedder_for(found, child=child)


def embedder_for(found: dict[str, Any] | None, *, child: bool = False) -> Embedder:
    """The embedder of the settings `fabric_api.deployment_embedder` answered (in a child
    process at lower priority if `child`: a ProcessEmbedder, same vectors)."""
    settings: dict[str, Any] = found if found is not None else {"embedder": "e5"}
    kind: str = settings["embedder"]  # one of the kinds the database's CHECK admits
    kwargs: dict[str, Any] = {}
    if kind == "http":
        kwargs = {
            "base_url": settings["url"],
            "model": settings["model"],
            "dims": Settings.from_env().embedder_dims,
        }
    return ProcessEmbedder(kind, **kwargs) if child else embedder_from_settings(kind, **kwargs)


def open_projector(
    conninfo: str,
    *,
    vectors: bool = True,
    graph: bool = True,
    vector_dir: str | None = None,
    embed_in_child: bool = False,
    serving: bool = False,
    **kwargs: Any,
) -> Projector:
    """A projector over the stores the environment names (Edge in `vector_dir` unless
    QDRANT_URL, its shards where MEMFABRIC_EDGE_SHARDS says for `memfabric serve` if
    `serving`; the local Bolt server unless NEO4J_URI); its embedder in a child process
    if `embed_in_child` (`close_projector` ends it). When binding the embedder moved the
    collection aliases, `contract_change` says so (and `progress`, if given, is told)."""
    from memfabric.broker import default_vector_dir

    embedder = deployment_embedder(conninfo, child=embed_in_child)
    store: VectorStore | None = None
    graph_store: GraphStore | None = None
    warning = None
    try:
        if vectors:
            store = store_from_env(vector_dir or default_vector_dir(), serving=serving)
            before = store.aliases()
            store.ensure_collections(embedder.model, embedder.version, embedder.dims)
            warning = contract_change(before, store.aliases(), store.collections())
            if warning is not None and kwargs.get("progress") is not None:
                kwargs["progress"](warning)
        if graph:
            graph_store = graph_from_env()
            graph_store.ensure_schema()
        return Projector(conninfo, embedder, store, graph_store, contract_change=warning, **kwargs)
    except BaseException:
        # a store that cannot be set up must not leave the other one (or itself) open
        for opened in (graph_store, store):
            if opened is not None:
                opened.close()
        raise


def contract_change(
    before: dict[str, str],
    after: dict[str, str],
    contracts: Mapping[str, CollectionContract],
) -> str | None:
    """What to tell the operator when binding the embedder moved the collection aliases:
    what changed (the embedder's model, version or dims, e.g. an upgrade that changed the
    text rule; or the vector payload version, an upgrade that changed what a point holds),
    read from `contracts` (physical name -> contract, `VectorStore.collections()`), and
    that the collections searched now hold only what is projected from here on."""
    moved = sorted(n for n, physical in after.items() if before.get(n) not in (None, physical))
    if not moved:
        return None
    old, new = before[moved[0]], after[moved[0]]
    return (
        f"{_what_changed(contracts.get(old), contracts.get(new))} "
        f"({old} -> {new}): {', '.join(moved)} now search new collections, which hold only "
        "the records projected from now on until `memfabric rebuild qdrant` embeds every "
        "record again (`memfabric serve` runs it at start unless "
        "--no-rebuild-on-contract-change); the old collections are never read again: "
        "`memfabric vectors prune --yes` drops them (on the embedded shards serve does, "
        "once its rebuild has ended)"
    )


def _what_changed(old: CollectionContract | None, new: CollectionContract | None) -> str:
    if old is None or new is None:
        return "the collection contract changed"
    embedder = (old.model, old.model_version, old.dims) != (new.model, new.model_version, new.dims)
    payload = old.payload != new.payload
    versions = f"{old.payload} -> {new.payload}"
    if embedder and payload:
        return f"the embedder's contract and the vector payload version ({versions}) changed"
    if payload:
        return f"the vector payload version changed ({versions})"
    return "the embedder's contract changed"


def close_projector(projector: Projector) -> None:
    if isinstance(projector.embedder, ProcessEmbedder):
        projector.embedder.close()
    if projector.store is not None:
        projector.store.close()
    if projector.graph is not None:
        projector.graph.close()
