"""The first client, kept for existing callers; new code uses `memfabric.Fabric` (every
function of the fabric, grouped by role, with typed answers: docs/python.md).

Each method is one `fabric_call`; identity is the login: one client (one pool) per identity.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from memfabric.call import Cast, fabric_call

Json = dict[str, Any]


class FabricClient:
    """A connection pool for one identity and part of the SQL API as methods (deprecated:
    use `memfabric.Fabric`, which covers every function and answers typed results)."""

    def __init__(self, conninfo: str, *, min_size: int = 1, max_size: int = 4) -> None:
        warnings.warn(
            "FabricClient is deprecated: use memfabric.Fabric (docs/python.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        self.pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = ConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True, "row_factory": tuple_row},
            open=True,
        )

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> FabricClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, function: str, *args: Any) -> Any:
        with self.pool.connection() as conn:
            return fabric_call(conn, f"fabric_api.{function}", *args)

    # administration (fabric_admin)
    def create_tenant(self, tenant_id: str) -> Json:
        return self._call("create_tenant", tenant_id)  # type: ignore[no-any-return]

    def register_agent(
        self, agent_id: str, login: str, memory_profile: Json, tools_allowed: Sequence[str]
    ) -> Json:
        return self._call(  # type: ignore[no-any-return]
            "register_agent", agent_id, login, Jsonb(memory_profile), list(tools_allowed)
        )

    def enable_agent(self, tenant_id: str, agent_id: str, tools: Sequence[str]) -> Json:
        return self._call("enable_agent", tenant_id, agent_id, list(tools))  # type: ignore[no-any-return]

    # orchestrator (fabric_orchestrator)
    def open_run(
        self,
        tenant_id: str,
        agent_id: str,
        subject_id: str | None,
        session_id: str | None,
        active_tool_set: Sequence[str],
        ttl: str = "1 hour",
    ) -> uuid.UUID:
        tools = list(active_tool_set)
        return self._call(  # type: ignore[no-any-return]
            "open_run", tenant_id, agent_id, subject_id, session_id, tools, Cast(ttl, "interval")
        )

    def close_run(self, run_id: uuid.UUID) -> Json:
        return self._call("close_run", run_id)  # type: ignore[no-any-return]

    # agents (fabric_agent)
    def propose(self, envelope: Json, run_id: uuid.UUID) -> Json:
        return self._call("propose", Jsonb(envelope), run_id)  # type: ignore[no-any-return]

    # committer (fabric_committer)
    def commit(self, proposal_id: uuid.UUID | str) -> Json:
        return self._call("commit", proposal_id)  # type: ignore[no-any-return]

    def commit_pending(self, limit: int = 100) -> Json:
        return self._call("commit_pending", limit)  # type: ignore[no-any-return]

    def promote(
        self,
        memory_id: uuid.UUID | str,
        target_tier: str,
        approval_id: uuid.UUID | str | None = None,
        supersedes: uuid.UUID | str | None = None,
    ) -> Json:
        return self._call("promote", memory_id, target_tier, approval_id, supersedes)  # type: ignore[no-any-return]

    def demote(self, memory_id: uuid.UUID | str, target_tier: str) -> Json:
        return self._call("demote", memory_id, target_tier)  # type: ignore[no-any-return]

    def supersede(
        self,
        old_memory_id: uuid.UUID | str,
        proposal_id: uuid.UUID | str,
        approval_id: uuid.UUID | str | None = None,
    ) -> Json:
        return self._call("supersede", old_memory_id, proposal_id, approval_id)  # type: ignore[no-any-return]

    def request_approval(
        self, memory_id: uuid.UUID | str, action: str, target: Json, reason: str
    ) -> Json:
        return self._call("request_approval", memory_id, action, Jsonb(target), reason)  # type: ignore[no-any-return]

    def request_erasure(self, memory_id: uuid.UUID | str, reason: str, legal: bool = False) -> Json:
        return self._call("request_erasure", memory_id, reason, legal)  # type: ignore[no-any-return]

    def run_decay(self) -> Json:
        return self._call("run_decay")  # type: ignore[no-any-return]

    # policy (fabric_policy)
    def decide_approval(self, approval_id: uuid.UUID | str, decision: str, reason: str) -> Json:
        return self._call("decide_approval", approval_id, decision, reason)  # type: ignore[no-any-return]

    # agents: recall (without a mode: hybrid when a vector broker is reachable, else text)
    def recall(self, request: Json) -> Json:
        from memfabric.recall import recall

        with self.pool.connection() as conn:
            return recall(conn, request)
