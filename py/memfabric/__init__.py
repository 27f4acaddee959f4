"""memfabric: a Postgres-native memory fabric control plane.

The database is the control plane; this package is the thin layer around it: connection
helpers, a client whose methods are single calls of the `fabric_api` SQL functions, the
SQLSTATE -> exception map, the content hash, the workers and the CLI.
"""

from memfabric.errors import FabricError
from memfabric.hashing import content_hash

__all__ = ["FabricError", "content_hash"]
__version__ = "0.1.0"
