"""Vector projection of the indexed tiers: one Qdrant collection per tier, two backends.

Postgres is write-authoritative; these collections are a disposable projection (R-PROJ-1,
docs/projections.md). Every point is one memory record: id = `memory_id`, the record's
embedding, and the payload fields a recall filter reads (docs/projections.md; the subject
and session only as the database's pseudonyms, `subject_ref` and `session_ref`) plus
`scope_key` and integer epoch microseconds for the validity bounds (`valid_from_ts`,
`valid_until_ts`, open end = `OPEN_ENDED_TS`), so a recall's validity test is two integer
range conditions in one flat conjunction on either backend, microsecond-exact (see
OPEN_ENDED_TS for the limit).

Collections are versioned by their contract (logical name, model, model version, dims,
Cosine, payload version): `mem_semantic__<model>_<version>_<dims>d_<hash>` is the physical
collection and the logical name `mem_semantic` an alias to it (a Qdrant alias on a server,
the manifest of the data directory on Edge). A new model, version, dimension or payload
version is a new physical collection and an alias cutover, never a change in place; the
old collection is never read again and stays until `VectorStore.drop_superseded()` drops
it (`memfabric vectors prune`; `memfabric serve` does it once its rebuild into the new
contract has ended).

Recall filters are always pushed into the vector query (tenant, scope keys, live states,
validity at an instant, minimum confidence, excluded labels); results go back to Postgres
as `(memory_id, score)` pairs, scores as f32 (Qdrant's type), ties broken by `memory_id` so
exact search is reproducible across a wipe and rebuild.

Backends:

- `EdgeVectorStore(path)`: Qdrant Edge (`qdrant-edge-py`), Qdrant's engine in process, one
  shard directory per physical collection. One process only may open a data directory
  (Qdrant's rule for an EdgeShard); the store takes an exclusive `flock` on
  `<path>/.lock` and a second opener fails at once with `VectorStoreLocked`. In the
  embedded deployment `memfabric serve` is that process. A shard gets its HNSW index only
  from `EdgeVectorStore.build_index()`: a child process optimizes a copy (the engine holds
  the interpreter lock while it builds), which is swapped in with the writes it missed
  replayed; until then, and for points written since, search is exhaustive.
- `QdrantServerStore(url=…)`: a Qdrant server through `qdrant-client` (production), or its
  local mode (`location=":memory:"` / `path=`), which is brute force and only for tests.

Modules: `model` (contracts, payloads, points), `filters` (the recall filter and its two
translations), `store` (the `VectorStore` interface and the shared logic), `edge` and
`server` (the backends). Import the names from `memfabric.vectors`.
"""

from __future__ import annotations

import os

from memfabric.constants import INDEXED_TIERS, LIVE_STATES, RETENTION_CLASSES, STATES, VISIBILITIES
from memfabric.vectors.edge import EdgeVectorStore
from memfabric.vectors.filters import Condition, FilterSpec, MatchCond, RangeCond, RecallFilter
from memfabric.vectors.model import (
    DISTANCE,
    MUTABLE_FIELDS,
    OPEN_ENDED_TS,
    PAYLOAD_INDEXES,
    PAYLOAD_VERSION,
    CollectionContract,
    ContractMismatch,
    MemoryPayload,
    NotBound,
    ShardFailure,
    ShardUnavailable,
    VectorLike,
    VectorPoint,
    VectorStoreError,
    VectorStoreLocked,
    WritesLost,
    collection_name,
    epoch_us,
    rfc3339,
    scope_key,
)
from memfabric.vectors.server import QdrantServerStore
from memfabric.vectors.store import VectorStore

__all__ = [
    "DISTANCE",
    "INDEXED_TIERS",
    "LIVE_STATES",
    "MUTABLE_FIELDS",
    "OPEN_ENDED_TS",
    "PAYLOAD_INDEXES",
    "PAYLOAD_VERSION",
    "RETENTION_CLASSES",
    "STATES",
    "VISIBILITIES",
    "CollectionContract",
    "Condition",
    "ContractMismatch",
    "EdgeVectorStore",
    "FilterSpec",
    "MatchCond",
    "MemoryPayload",
    "NotBound",
    "QdrantServerStore",
    "RangeCond",
    "RecallFilter",
    "ShardFailure",
    "ShardUnavailable",
    "VectorLike",
    "VectorPoint",
    "VectorStore",
    "VectorStoreError",
    "VectorStoreLocked",
    "WritesLost",
    "collection_name",
    "epoch_us",
    "rfc3339",
    "scope_key",
    "store_from_env",
]


def store_from_env(data_dir: str | os.PathLike[str], *, serving: bool = False) -> VectorStore:
    """QDRANT_URL (and QDRANT_API_KEY) set: a Qdrant server; otherwise Edge in `data_dir`,
    its shards in child processes as MEMFABRIC_EDGE_SHARDS says (`serving`: the store of
    `memfabric serve`, where `auto` means child on a machine with 2 CPUs or more)."""
    from memfabric.settings import Settings

    settings = Settings.from_env()
    if settings.qdrant_url:
        return QdrantServerStore(settings.qdrant_url, api_key=settings.qdrant_api_key)
    return EdgeVectorStore(data_dir, shard_processes=settings.shard_processes(serving=serving))
