"""The LangGraph binding: `SynedrixMemoryStore`, LangGraph's `BaseStore` over the fabric,
and `checkpointer`, LangGraph's Postgres checkpointer kept apart from memory.

The store reads memory for one agent login and one open run; every read is one
`fabric_api.recall`, so authorization, scope resolution and the audit stay in the database.
It never writes: `put` and `delete` refuse and name the governed path. docs/langgraph.md
explains namespaces, items and the checkpointer."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from typing import Any, Literal

import psycopg
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.postgres.base import (  # the pinned package's prune, see _governed
    PRUNE_BLOBS_SQL,
    PRUNE_CHECKPOINTS_SQL,
    PRUNE_STRATEGIES,
    PRUNE_SUBGRAPH_CALLS_SQL,
    PRUNE_WRITES_SQL,
    _aexecute,
    _execute,
    _keep_latest,
    _refuse_delta_threads,
)
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from memfabric.call import fabric_call
from memfabric.constants import DEFAULT_RETENTION_CLASS
from memfabric.errors import InvalidEnvelope
from memfabric.recall import recall

Json = dict[str, Any]
CHECKPOINT_SCHEMA = "langgraph"
TENANT_SCOPE = "tenant"  # the scope_id of tenant-visible records
FILTER_KEYS = frozenset({"min_confidence", "valid_at", "compliance_labels_excluded"})
_ID_OF = {"session": "session_id", "agent": "agent_id", "subject": "subject_id"}


def _check_page(limit: int, offset: int) -> None:
    """A page is `limit` items after `offset`, both whole numbers from 0: a negative offset
    would slice from the end of the answer (22023, before anything is read or audited)."""
    for name, value in (("limit", limit), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidEnvelope(
                f"{name} must be a whole number of at least 0",
                sqlstate="22023",
                hint="limit is how many items, offset how many to skip: limit=10, offset=20",
            )


# A namespace names the tenant first, then the tier, then the id its visibility implies.
NAMESPACE = ("tenant_id", "tier", "scope_id")


class GovernedWriteRefused(PermissionError):
    """The store never writes durable memory: it is proposed inside a run and committed by
    the committer, and erased only through an approved erasure."""

    def __init__(self, operation: str) -> None:
        super().__init__(
            f"SynedrixMemoryStore refuses {operation}: durable memory is written only through "
            "the governed path -- propose inside the run (store.propose(...) or "
            "fabric_api.propose) for the committer to commit; removal is "
            "fabric_api.request_erasure followed by an approved erasure"
        )


class SynedrixMemoryStore(BaseStore):
    """LangGraph's store for one agent login (the connection's) and one open run.

    Namespaces are `(tenant_id, tier, scope_id)`; `scope_id` is the subject, agent or session
    id of the record's visibility, or `"tenant"`. The run's own ids, when given, tell which
    visibility a `scope_id` names; otherwise they are learned from the first answer, and an
    unknown `scope_id` is read as a subject id (the database refuses it unless it is the run's
    subject)."""

    supports_ttl = False

    def __init__(
        self,
        conn: psycopg.Connection[Any] | ConnectionPool[Any],
        *,
        run_id: uuid.UUID | str,
        subject_id: str | None = None,
        session_id: str | None = None,
        agent_id: str | None = None,
        broker: Any = None,
    ) -> None:
        self.conn = conn
        self.run_id = str(uuid.UUID(str(run_id)))
        self.broker = broker
        self._run: Json = {"subject_id": subject_id, "session_id": session_id}
        if agent_id is not None:
            self._run["agent_id"] = agent_id

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conninfo: str,
        *,
        run_id: uuid.UUID | str,
        subject_id: str | None = None,
        session_id: str | None = None,
        agent_id: str | None = None,
    ) -> Iterator[SynedrixMemoryStore]:
        """A store on its own connection (the agent's login), closed on exit."""
        with psycopg.connect(conninfo, autocommit=True) as conn:
            yield cls(
                conn, run_id=run_id, subject_id=subject_id, session_id=session_id,
                agent_id=agent_id,
            )  # fmt: skip

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if isinstance(self.conn, ConnectionPool):
            with self.conn.connection() as conn:
                yield conn
        else:
            yield self.conn

    # -- reading ---------------------------------------------------------------------------

    def _recall(self, request: Json) -> Json:
        with self._connection() as conn:
            # the run's tenant once a recall has shown it: the tenant-keyed call after that
            answer = recall(
                conn,
                {"run_id": self.run_id, **request},
                broker=self.broker,
                tenant_id=self._run.get("tenant_id"),
            )
        applied = answer.get("scope_applied") or {}
        for key in ("tenant_id", "subject_id", "session_id", "agent_id"):
            if applied.get(key) is not None:
                self._run[key] = applied[key]
        return answer

    def _scope(self, namespace: Sequence[str]) -> tuple[Json, Json] | None:
        """The recall scope and tiers a namespace (or prefix) names; None when no record can
        live there (deeper than three segments)."""
        if len(namespace) > 3:
            return None
        scope: Json = {}
        request: Json = {}
        if len(namespace) >= 1:
            scope["tenant_id"] = namespace[0]
        if len(namespace) >= 2:
            request["tiers"] = [namespace[1]]
        if len(namespace) == 3:
            scope_id = namespace[2]
            if scope_id == TENANT_SCOPE:
                scope["visibility"] = "tenant"
            else:
                level = next(
                    (lv for lv in ("session", "agent") if self._run.get(_ID_OF[lv]) == scope_id),
                    "subject",
                )
                scope |= {"visibility": level, _ID_OF[level]: scope_id}
        if scope:
            request["scope"] = scope
        return request, scope

    @staticmethod
    def _namespace(record: Json) -> tuple[str, str, str]:
        s = record["scope"]
        vis = s["visibility"]
        scope_id = TENANT_SCOPE if vis == "tenant" else s.get(_ID_OF.get(vis, ""))
        return (s["tenant_id"], record["tier"], str(scope_id))

    @classmethod
    def _item(cls, record: Json, *, scored: bool) -> Item:
        value = {k: v for k, v in record.items() if k not in ("score", "retrieval")}
        at = datetime.fromisoformat(record["recorded_at"])
        args: Json = {
            "namespace": cls._namespace(record),
            "key": str(record["memory_id"]),
            "value": value,
            "created_at": at,
            "updated_at": at,
        }
        if scored:
            return SearchItem(**args, score=record.get("score"))
        return Item(**args)

    @staticmethod
    def _filters(filter: dict[str, Any] | None) -> Json:
        if not filter:
            return {}
        unknown = sorted(set(filter) - FILTER_KEYS)
        if unknown:
            raise ValueError(
                f"unknown search filter keys {unknown}: SynedrixMemoryStore filters are the "
                f"recall filters {sorted(FILTER_KEYS)}"
            )
        return dict(filter)

    def _get(self, op: GetOp) -> Item | None:
        if len(op.namespace) != 3:
            return None
        try:
            memory_id = str(uuid.UUID(op.key))
        except ValueError:
            return None  # never a memory id
        request, _ = self._scope(op.namespace) or ({}, {})
        answer = self._recall({**request, "filters": {"memory_ids": [memory_id]}, "limit": 1})
        for record in answer["records"]:
            item = self._item(record, scored=False)
            if item.namespace == tuple(op.namespace):
                return item
        return None

    def _search(self, op: SearchOp) -> list[SearchItem]:
        resolved = self._scope(op.namespace_prefix)
        if resolved is None:
            return []
        request, _ = resolved
        request["filters"] = self._filters(op.filter)
        if not request["filters"]:
            del request["filters"]
        if op.query is not None:
            request["query"] = op.query
        request["limit"] = op.limit + op.offset
        answer = self._recall(request)
        records = answer["records"][op.offset :]
        return [self._item(r, scored=True) for r in records]  # type: ignore[misc]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        answer = self._recall({"limit": 1})
        applied = answer.get("scope_applied") or {}
        if answer["status"] == "denied" or not applied:
            return []
        scope_ids = [
            TENANT_SCOPE if vis == "tenant" else applied.get(_ID_OF[vis])
            for vis in applied.get("visibility", [])
        ]
        found = {
            (applied["tenant_id"], tier, sid)
            for tier in answer.get("tiers_served") or []
            for sid in scope_ids
            if sid is not None
        }
        namespaces = {
            ns[: op.max_depth] if op.max_depth is not None else ns
            for ns in found
            if all(_matches(ns, c) for c in op.match_conditions or ())
        }
        return sorted(namespaces)[op.offset : op.offset + op.limit]

    # -- BaseStore -------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:  # refuse before reading anything
            if isinstance(op, PutOp):
                raise GovernedWriteRefused("delete" if op.value is None else "put")
            if isinstance(op, (SearchOp, ListNamespacesOp)):
                _check_page(op.limit, op.offset)
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise TypeError(f"unknown store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # -- the governed write ----------------------------------------------------------------

    def propose(
        self,
        namespace: tuple[str, str, str],
        value: dict[str, Any],
        *,
        source_event_id: str,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        formation_method: str = "extraction",
        confidence: float = 0.8,
        valid_from: str | None = None,
        valid_until: str | None = None,
        retention_class: str = DEFAULT_RETENTION_CLASS,
        compliance_labels: Sequence[str] = (),
    ) -> Json:
        """Propose `value` as the content of a record in `namespace`, inside the run, for the
        committer to commit. `source_event_id` is the event that caused the memory: the
        store never mints provenance."""
        if len(namespace) != 3:
            raise ValueError("propose needs a full namespace (tenant_id, tier, scope_id)")
        if not isinstance(source_event_id, str) or not source_event_id:
            raise ValueError("source_event_id is required: the event that caused the memory")
        _, scope = self._scope(namespace) or ({}, {})
        provenance: Json = {"source_event_id": source_event_id}
        provenance |= {"formation_method": formation_method}
        if correlation_id is not None:
            provenance["correlation_id"] = correlation_id
        if causation_id is not None:
            provenance["causation_id"] = causation_id
        envelope: Json = {
            "tier": namespace[1],
            "scope": scope,
            "content": dict(value),
            "provenance": provenance,
            "confidence": confidence,
            "validity_interval": {
                "valid_from": valid_from or datetime.now().astimezone().isoformat(),
                "valid_until": valid_until,
            },
            "retention_class": retention_class,
        }
        if compliance_labels:
            envelope["compliance_labels"] = list(compliance_labels)
        with self._connection() as conn:
            answer: Json = fabric_call(conn, "fabric_api.propose", envelope, self.run_id)
        return answer


def _matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(p in ("*", n) for p, n in zip(path, part, strict=True))


# -- the checkpointer ----------------------------------------------------------------------


def checkpoint_conninfo(conninfo: str) -> str:
    """The conninfo of a checkpointer connection: the checkpointer's tables are in their own
    schema, which it finds on its search path."""
    return psycopg.conninfo.make_conninfo(conninfo, options=f"-c search_path={CHECKPOINT_SCHEMA}")


class _ServiceThreads:
    """Each service's threads live under its own thread-id prefix `<service>:` in the one
    checkpoint schema, the service being its login. The prefix is added on the way in and
    removed on the way out; row-level security confines a login to its prefix, and a
    trigger checks that every checkpoint's metadata names the service, tenant and subject."""

    service: str
    defaults: Json

    def _bind(self, service: str, defaults: Json) -> None:
        if not service or ":" in service or len(service) > 63:
            raise ValueError("service must be 1-63 characters without ':'")
        self.service = service
        self.defaults = defaults

    def _in(self, thread_id: str) -> str:
        return f"{self.service}:{thread_id}"

    def _out(self, thread_id: str) -> str:
        return thread_id.removeprefix(f"{self.service}:")

    def _config_in(self, config: Any) -> Any:
        conf = dict(config.get("configurable") or {})
        if "thread_id" in conf:
            conf["thread_id"] = self._in(str(conf["thread_id"]))
        return {**config, "configurable": conf}

    def _config_out(self, config: Any) -> Any:
        if config is None:
            return None
        conf = dict(config.get("configurable") or {})
        if "thread_id" in conf:
            conf["thread_id"] = self._out(str(conf["thread_id"]))
        return {**config, "configurable": conf}

    def _tuple_out(self, tup: Any) -> Any:
        if tup is None:
            return None
        return tup._replace(
            config=self._config_out(tup.config), parent_config=self._config_out(tup.parent_config)
        )

    def _mine(self, tup: Any) -> bool:
        return str(tup.config["configurable"]["thread_id"]).startswith(f"{self.service}:")

    def _metadata(self, config: Any, metadata: Any) -> Any:
        """The thread's service, tenant, subject and business instance, and the fabric run
        the invocation serves: from the invocation (`configurable`) first, then the
        checkpointer's defaults."""
        conf = config.get("configurable") or {}
        meta = dict(metadata)
        for key in ("tenant_id", "subject_id", "business_instance_id", "fabric_run_id",
                    "fabric_workflow_event_id"):  # fmt: skip
            if key not in meta and conf.get(key, self.defaults.get(key)) is not None:
                meta[key] = conf.get(key, self.defaults.get(key))
        meta.setdefault("subject_id", None)
        for key in ("fabric_run_id", "fabric_workflow_event_id"):
            if meta.get(key) is not None:
                meta[key] = str(meta[key])
        meta["service"] = self.service
        if not isinstance(meta.get("tenant_id"), str):
            raise ValueError(
                "a checkpoint thread belongs to a tenant: invoke the graph with "
                "configurable.tenant_id (and subject_id), or give the checkpointer defaults"
            )
        return meta


# A service holds no DELETE (nor table-level UPDATE) on the checkpoint tables: either would
# let its login LOCK them and stall every LangGraph service. LangGraph's deletes go through
# fabric_api functions that take the same arguments and reach only the login's own threads.
_DELETE_THREADS = "SELECT fabric_api.delete_checkpoint_threads(%s)"
_GOVERNED: dict[str, str | None] = {
    PRUNE_SUBGRAPH_CALLS_SQL[0]: "SELECT fabric_api.delete_checkpoint_namespaces(%s, %s)",
    PRUNE_SUBGRAPH_CALLS_SQL[1]: None,  # the call above deletes all three tables' rows
    PRUNE_SUBGRAPH_CALLS_SQL[2]: None,
    PRUNE_WRITES_SQL: "SELECT fabric_api.delete_checkpoint_writes(%s, %s, %s)",
    PRUNE_CHECKPOINTS_SQL: (
        "SELECT channel, version FROM fabric_api.delete_unkept_checkpoints(%s, %s, %s)"
    ),
    PRUNE_BLOBS_SQL: "SELECT fabric_api.delete_checkpoint_blobs(%s, %s, %s, %s)",
}


def _governed(statements: Any) -> Any:
    """LangGraph's keep_latest prune of one thread (a generator of statements, each sent
    its rows back), with every DELETE replaced by its fabric_api function."""
    reply: Any = None
    while True:
        try:
            statement, params, fetch = statements.send(reply)
        except StopIteration:
            return
        governed = _GOVERNED.get(statement, statement)
        if governed is None:
            reply = []
            continue
        reply = yield governed, params, fetch


def _prune_threads(thread_ids: Sequence[str], strategy: str) -> list[str]:
    if isinstance(thread_ids, str):
        raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
    if strategy not in PRUNE_STRATEGIES:
        raise ValueError(f"Unknown prune strategy: {strategy!r}")
    return [str(t) for t in thread_ids]


class ServiceCheckpointer(_ServiceThreads, PostgresSaver):
    """LangGraph's PostgresSaver, confined to one service's threads."""

    def list(self, config: Any, **kwargs: Any) -> Iterator[Any]:
        inner = None if config is None else self._config_in(config)
        for tup in super().list(inner, **kwargs):
            if self._mine(tup):
                yield self._tuple_out(tup)

    def get_tuple(self, config: Any) -> Any:
        return self._tuple_out(super().get_tuple(self._config_in(config)))

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        inner = self._config_in(config)
        meta = self._metadata(config, metadata)
        # One transaction: a checkpoint the database refuses leaves none of its blobs.
        with self.lock, self.conn.transaction():  # type: ignore[union-attr]
            saved = super().put(inner, checkpoint, meta, new_versions)
        return self._config_out(saved)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        super().put_writes(self._config_in(config), writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        with self._cursor() as cur:
            cur.execute(_DELETE_THREADS, ([self._in(str(thread_id))],))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """PostgresSaver.prune, its deletes through fabric_api (`_governed`)."""
        threads = [self._in(t) for t in _prune_threads(thread_ids, strategy)]
        if not threads:
            return
        if strategy == "delete":
            with self._cursor() as cur:
                cur.execute(_DELETE_THREADS, (threads,))
            return
        with self._cursor() as cur:
            _execute(cur, _refuse_delta_threads(threads))
        for thread_id in threads:
            with self._cursor() as cur, cur.connection.transaction():
                _execute(cur, _governed(_keep_latest(thread_id)))

    def get_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Any:
        return super().get_delta_channel_history(config=self._config_in(config), channels=channels)


class AsyncServiceCheckpointer(_ServiceThreads, AsyncPostgresSaver):
    """LangGraph's AsyncPostgresSaver, confined to one service's threads."""

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[Any]:
        inner = None if config is None else self._config_in(config)
        async for tup in super().alist(inner, **kwargs):
            if self._mine(tup):
                yield self._tuple_out(tup)

    async def aget_tuple(self, config: Any) -> Any:
        return self._tuple_out(await super().aget_tuple(self._config_in(config)))

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        inner = self._config_in(config)
        meta = self._metadata(config, metadata)
        # One transaction: a checkpoint the database refuses leaves none of its blobs.
        async with self.lock, self.conn.transaction():  # type: ignore[union-attr]
            saved = await super().aput(inner, checkpoint, meta, new_versions)
        return self._config_out(saved)

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        await super().aput_writes(self._config_in(config), writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        async with self._cursor() as cur:
            await cur.execute(_DELETE_THREADS, ([self._in(str(thread_id))],))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """AsyncPostgresSaver.aprune, its deletes through fabric_api (`_governed`)."""
        threads = [self._in(t) for t in _prune_threads(thread_ids, strategy)]
        if not threads:
            return
        if strategy == "delete":
            async with self._cursor() as cur:
                await cur.execute(_DELETE_THREADS, (threads,))
            return
        async with self._cursor() as cur:
            await _aexecute(cur, _refuse_delta_threads(threads))
        for thread_id in threads:
            async with self._cursor() as cur, cur.connection.transaction():
                await _aexecute(cur, _governed(_keep_latest(thread_id)))

    async def aget_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Any:
        return await super().aget_delta_channel_history(
            config=self._config_in(config), channels=channels
        )


class _TaskLock:
    """An asyncio lock its holding task may take again (the saver's own lock is not)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[Any] | None = None
        self._depth = 0

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if self._owner is not task:
            await self._lock.acquire()
            self._owner = task
        self._depth += 1

    async def __aexit__(self, *_: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()


def _checkpoint_kwargs() -> Json:
    return {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


@contextmanager
def checkpointer(
    conninfo: str,
    *,
    service: str | None = None,
    tenant_id: str | None = None,
    subject_id: str | None = None,
    fabric_run_id: str | None = None,
) -> Iterator[ServiceCheckpointer]:
    """LangGraph's Postgres checkpointer on the fabric's database, in the `langgraph` schema
    the migrations created (never `setup()`), confined to the service's threads. The service
    is the login (it needs the `fabric_checkpointer` role); row-level security lets a login
    read and write only threads `<login>:...`, so `service`, if given, must be the login.
    Each thread's tenant and subject come from the invocation's `configurable` (`tenant_id`,
    `subject_id`, `business_instance_id`), else from the defaults given here; so does
    `fabric_run_id`, the fabric run the invocation serves, which lets an erasure of a record
    recalled in that run delete the thread."""
    with psycopg.connect(checkpoint_conninfo(conninfo), **_checkpoint_kwargs()) as conn:
        saver = ServiceCheckpointer(conn)
        saver.supports_pipeline = False  # a refused put rolls back; no pipeline to abort
        saver.lock = threading.RLock()  # type: ignore[assignment]  # put holds it around super().put
        saver._bind(
            service or conn.info.user,
            {"tenant_id": tenant_id, "subject_id": subject_id, "fabric_run_id": fabric_run_id},
        )
        yield saver


@asynccontextmanager
async def async_checkpointer(
    conninfo: str,
    *,
    service: str | None = None,
    tenant_id: str | None = None,
    subject_id: str | None = None,
    fabric_run_id: str | None = None,
) -> AsyncIterator[AsyncServiceCheckpointer]:
    """`checkpointer` for async graphs."""
    conn = await psycopg.AsyncConnection.connect(
        checkpoint_conninfo(conninfo), **_checkpoint_kwargs()
    )
    async with conn:
        saver = AsyncServiceCheckpointer(conn)
        saver.supports_pipeline = False  # a refused put rolls back; no pipeline to abort
        saver.lock = _TaskLock()  # type: ignore[assignment]  # aput holds it around super().aput
        saver._bind(
            service or conn.info.user,
            {"tenant_id": tenant_id, "subject_id": subject_id, "fabric_run_id": fabric_run_id},
        )
        yield saver


# -- memory tools for existing agents, in LangMem's shape --------------------------------------
# `create_manage_memory_tool` and `create_search_memory_tool` answer the calls an agent built
# with LangMem makes (manage_memory: create/update/delete; search_memory: query), through
# `memfabric.Memory`: every write is a proposal the committer decides, an update is a
# supersession and a delete an erasure request. The user is the run's subject, read from the
# graph's config (`configurable.user_id`, or LangGraph's `langgraph_user_id`), never from the
# model's arguments.


def _user_of(config: Any, default: str | None) -> str:
    configurable = (config or {}).get("configurable") or {}
    user = configurable.get("user_id") or configurable.get("langgraph_user_id") or default
    if not user:
        raise ValueError(
            "the memory tools need the user: pass config={'configurable': {'user_id': ...}} "
            "to the graph (or user_id= when creating the tool)"
        )
    return str(user)


def create_manage_memory_tool(
    memory: Any,
    *,
    user_id: str | None = None,
    name: str = "manage_memory",
    instructions: str = "Proactively call this tool when you learn something worth remembering "
    "about the user: a preference, a fact, a decision. Update a memory that is no longer "
    "true; delete one the user asks you to forget.",
) -> Any:
    """LangMem's manage-memory tool over a `memfabric.Memory`: `create` proposes the content
    as a raw episode of the user, `update` supersedes memory `id`, `delete` requests its
    erasure. Usable by `create_react_agent` as is."""

    def manage_memory(
        config: RunnableConfig,
        content: str | None = None,
        action: Literal["create", "update", "delete"] = "create",
        id: str | None = None,
    ) -> str:
        user = _user_of(config, user_id)
        if action == "create":
            if not content:
                raise ValueError("content is required to create a memory")
            added = memory.add(content, user_id=user)["results"]
            return f"created memory {added[0]['id']}" if added else "nothing to remember"
        if not id:
            raise ValueError(f"id is required to {action} a memory")
        if action == "update":
            if not content:
                raise ValueError("content is required to update a memory")
            updated = memory.update(id, content, user_id=user)
            return f"updated memory {id}: now {updated['id']}"
        deleted = memory.delete(id)
        return f"memory {id}: erasure {deleted['status']}"

    return StructuredTool.from_function(
        manage_memory,
        name=name,
        description=f"Create, update, or delete a memory of the user. {instructions}",
    )


def create_search_memory_tool(
    memory: Any,
    *,
    user_id: str | None = None,
    name: str = "search_memory",
) -> Any:
    """LangMem's search-memory tool over a `memfabric.Memory`: the user's memories that
    match `query`, best first (hybrid when a vector broker answers, else text)."""

    def search_memory(config: RunnableConfig, query: str, limit: int = 10) -> list[Json]:
        user = _user_of(config, user_id)
        found = memory.search(query, user_id=user, limit=limit)["results"]
        return [{"id": m["id"], "memory": m["memory"], "score": m["score"]} for m in found]

    return StructuredTool.from_function(
        search_memory,
        name=name,
        description="Search the user's long-term memory for facts, preferences and past "
        "events relevant to the conversation.",
    )
