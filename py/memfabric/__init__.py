"""memfabric: a Postgres-native memory fabric control plane.

The database is the control plane; this package is the thin layer around it: the SDK
(`Fabric`, `AsyncFabric`: one method per fabric function, grouped by role), the one call
primitive (`fabric_call`), the SQLSTATE -> exception map, the content hash, the workers and
the CLI. docs/python.md is the guide.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memfabric.aio import AsyncFabric
    from memfabric.call import Cast, fabric_call, fabric_rows
    from memfabric.envelope import Envelope, assertion, episode
    from memfabric.errors import FabricError
    from memfabric.hashing import content_hash
    from memfabric.memory import AsyncMemory, Memory
    from memfabric.results import Approval, Proposal, RecallAnswer, Receipt, Record, Run
    from memfabric.sdk import Fabric

# Loaded on first use: `import memfabric` stays light (the SDK pulls in pools and brokers),
# and a process that needs one submodule does not pay for psycopg (~0.4 s of CPU): the child
# that owns a vector shard imports only memfabric.vectors.shards.
_LAZY = {
    "FabricError": "memfabric.errors",
    "content_hash": "memfabric.hashing",
    "AsyncFabric": "memfabric.aio",
    "Cast": "memfabric.call",
    "fabric_call": "memfabric.call",
    "fabric_rows": "memfabric.call",
    "Envelope": "memfabric.envelope",
    "assertion": "memfabric.envelope",
    "episode": "memfabric.envelope",
    "Approval": "memfabric.results",
    "Proposal": "memfabric.results",
    "RecallAnswer": "memfabric.results",
    "Receipt": "memfabric.results",
    "Record": "memfabric.results",
    "Run": "memfabric.results",
    "Fabric": "memfabric.sdk",
    "Memory": "memfabric.memory",
    "AsyncMemory": "memfabric.memory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memfabric' has no attribute {name!r}")


__all__ = [
    "Approval",
    "AsyncFabric",
    "AsyncMemory",
    "Cast",
    "Envelope",
    "Fabric",
    "FabricError",
    "Memory",
    "Proposal",
    "RecallAnswer",
    "Receipt",
    "Record",
    "Run",
    "assertion",
    "content_hash",
    "episode",
    "fabric_call",
    "fabric_rows",
]
__version__ = "0.16.0"
