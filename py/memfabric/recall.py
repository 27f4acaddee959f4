"""Recall from Python: text recall is one database call; semantic and hybrid recall are the
database's resolution, a broker search with exactly that filter, and the database's re-check,
fusion and hydration of the candidates (it never trusts the projection).

A request without `mode` is served `hybrid` when a vector broker is reachable (the
`memfabric serve` socket or QDRANT_URL) and has a query with words, otherwise `text`; the
answer's `mode_served` says which.

The query is embedded while the database resolves the scope (a worker thread asks the
broker in this process, or `memfabric serve`, for the vector alone): the embedding needs no
filter, the search waits for it, and nothing is searched before the scope is resolved. A
`memfabric serve` that cannot embed alone (older than this client) is asked to search with
the query, as before.

Graph recall (mode `graph`, or `expand` in semantic and hybrid recall) walks the graph
projection from where the database says it starts (the query's entities, else the subject,
as entity ids) and sends what it reaches back as `graph_candidates`, which the database
re-checks like vector candidates and fuses with the other lists. Without a reachable graph
server, mode `graph` fails (`Unreachable`) and `expand` is served without the graph
(`mode_served` says which)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from memfabric.broker import (
    Broker,
    LocalBroker,
    RemoteBroker,
    find_broker,
    hits_as_candidates,
    locate_broker,
)
from memfabric.call import afabric_call, fabric_call
from memfabric.constants import RECALL_MAX_CANDIDATES
from memfabric.embedding import has_words
from memfabric.errors import Unreachable
from memfabric.graph import GraphStore
from memfabric.settings import Settings
from memfabric.timeparse import parse_time
from memfabric.tracing import client_span

Json = dict[str, Any]
CANDIDATE_FACTOR = 4  # vector candidates fetched per record asked for
# and never fewer: the database re-checks them all and fuses the first 50 (or `limit`, when
# larger: fabric._fusion_depth) that pass; the rest stand in for records that changed since
# they were projected
MIN_CANDIDATES = 50
# Query embeddings started before the scope is resolved (one at a time per recall; the
# model itself runs its own threads and releases the interpreter while it computes).
_EMBEDDING = ThreadPoolExecutor(max_workers=2, thread_name_prefix="memfabric-recall-embed")


def _recall(conn: psycopg.Connection[Any], request: Json, tenant_id: str | None = None) -> Json:
    """One `fabric_api.recall` call; with the run's tenant, the tenant-keyed one (which a
    Citus cluster runs whole on the tenant's worker)."""
    answer: Json = (
        fabric_call(conn, "fabric_api.recall", request)
        if tenant_id is None
        else fabric_call(conn, "fabric_api.recall", tenant_id, request)
    )
    return answer


def time_filtered(request: Json, now: datetime | None = None) -> tuple[Json, Json | None]:
    """The request narrowed to the valid time its question names, and what was read.

    A question that names a window ending before `now` ("in May 2024", "3 months ago",
    "before March 2024"; memfabric.timeparse) is asked with `filters.valid_at` set to the
    window's last instant: only records valid then are candidates, so what was said after
    it drops out (a turn of a conversation is valid from when it was said). It only adds a
    filter the database enforces, so no scope is ever widened; a request that sets its own
    `valid_at`, reads by id, or names no window ending in the past is left as it is. The
    second value says what was read (`said`, `since`, `until`, `valid_at`), else None."""
    query, filters = request.get("query"), request.get("filters")
    if not has_words(query) or (filters is not None and not isinstance(filters, dict)):
        return request, None
    if filters and ("valid_at" in filters or "memory_ids" in filters):
        return request, None
    now = now or datetime.now(UTC)
    window = parse_time(query, now)
    if window is None or window.until is None or window.until > now:
        return request, None
    valid_at = (window.until - timedelta(microseconds=1)).isoformat()
    read: Json = {
        "said": window.said,
        "since": window.since.isoformat() if window.since else None,
        "until": window.until.isoformat(),
        "valid_at": valid_at,
    }
    return {**request, "filters": {**(filters or {}), "valid_at": valid_at}}, read


def recall(
    conn: psycopg.Connection[Any],
    request: Json,
    broker: Broker | None = None,
    *,
    exact: bool = False,
    graph: GraphStore | None = None,
    temporal: bool = False,
    now: datetime | None = None,
    tenant_id: str | None = None,
) -> Json:
    """`conn` is the agent's own connection (its login is its identity); `tenant_id`, the
    run's tenant, makes each database call the tenant-keyed one. With broker=None
    the broker is found from the environment when one is needed, and with graph=None the
    graph server (NEO4J_URI, else the local Bolt server) when a graph walk is asked for.
    With `temporal`, a question that names a time in the past is narrowed to it
    (`time_filtered`, relative to `now`, default the current time) and the answer says so
    in `time_filter`. With an OpenTelemetry tracer provider configured, the call is a
    client span and the request carries its traceparent, so the span made from the outbox
    joins the same trace."""
    read = None
    if temporal:
        request, read = time_filtered(request, now)
    with client_span(request) as traced:
        answer = _recall_modes(conn, traced, broker, exact=exact, graph=graph, tenant_id=tenant_id)
    if read is not None:
        answer["time_filter"] = read
    return answer


async def arecall(
    conn: psycopg.AsyncConnection[Any],
    request: Json,
    broker: Broker | None = None,
    *,
    exact: bool = False,
    graph: GraphStore | None = None,
    temporal: bool = False,
    now: datetime | None = None,
    tenant_id: str | None = None,
) -> Json:
    """`recall` on an async connection (the broker's search and the graph walk run in a
    worker thread)."""
    read = None
    if temporal:
        request, read = time_filtered(request, now)
    answer = await _arecall(conn, request, broker, exact=exact, graph=graph, tenant_id=tenant_id)
    if read is not None:
        answer["time_filter"] = read
    return answer


async def _arecall(
    conn: psycopg.AsyncConnection[Any],
    request: Json,
    broker: Broker | None,
    *,
    exact: bool,
    graph: GraphStore | None,
    tenant_id: str | None = None,
) -> Json:
    with client_span(request) as traced:
        plan = _plan(traced, exact)
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as done:
                answer: Json = done.value
                return answer
            error = None
            if isinstance(step, _Database):
                keyed = () if tenant_id is None else (tenant_id,)
                reply = await afabric_call(conn, "fabric_api.recall", *keyed, step.request)
            elif isinstance(step, _FindBroker):
                reply = broker or await _afind_broker(conn)
            elif isinstance(step, _FindGraph):
                reply = graph or await asyncio.to_thread(find_graph)
            elif isinstance(step, _Embed):
                reply = step.start()
            else:
                try:
                    reply = await asyncio.to_thread(step.run)
                except (OSError, RuntimeError) as exc:
                    error = exc


def no_broker() -> Unreachable:
    """Semantic or hybrid recall asked for, and neither a broker socket nor QDRANT_URL."""
    return Unreachable(
        f"memfabric serve is not running (no broker on {Settings.from_env().socket}) and "
        "QDRANT_URL is "
        "not set: semantic and hybrid recall need a vector broker",
        hint="start `memfabric serve`, set QDRANT_URL, or omit mode to be served text",
    )


def no_graph() -> Unreachable:
    """Graph recall asked for, and no graph server answers."""
    return Unreachable(
        "no graph server answers (NEO4J_URI, or the local Bolt server of `make graph-up`): "
        "graph recall needs one",
        hint="start the graph server, set NEO4J_URI, or ask for semantic or hybrid recall",
    )


_GRAPH: list[GraphStore] = []  # the process's graph store, once one answered


def find_graph() -> GraphStore | None:
    """The graph store of the environment (`graph_from_env`) if its server answers, else
    None. One store per process, kept once it answered and dropped when it stops."""
    from neo4j.exceptions import Neo4jError, ServiceUnavailable

    from memfabric.errors import Misconfigured
    from memfabric.graph import graph_from_env

    store = _GRAPH[0] if _GRAPH else None
    try:
        if store is None:
            store = graph_from_env()
        store.verify()
    except (ServiceUnavailable, Neo4jError, OSError, Misconfigured, ValueError):
        if store is not None:
            store.close()
        _GRAPH.clear()
        return None
    if not _GRAPH:
        _GRAPH.append(store)
    return store


async def _afind_broker(conn: psycopg.AsyncConnection[Any]) -> Broker | None:
    from memfabric.runtime import embedder_for

    settings = None
    if Settings.from_env().qdrant_url:
        settings = await afabric_call(conn, "fabric_api.deployment_embedder")
    return locate_broker(lambda: embedder_for(settings))


# -- the modes, free of I/O: the plan yields what it needs, a driver (sync or async) answers ---


@dataclass(frozen=True)
class _Database:
    request: Json  # one fabric_api.recall call


@dataclass(frozen=True)
class _FindBroker:
    pass


@dataclass(frozen=True)
class _Embed:
    broker: LocalBroker | RemoteBroker
    query: str

    def start(self) -> Future[list[float]]:
        """The query's embedding, started now in a worker thread (not waited for)."""
        return _EMBEDDING.submit(self.broker.embed_query, self.query)


@dataclass(frozen=True)
class _Search:
    broker: Broker
    flt: Json
    query: str
    limit: int
    exact: bool
    vector: Future[list[float]] | None = None  # the embedding started before resolution

    def run(self) -> list[tuple[str, float]]:
        if self.vector is not None and isinstance(self.broker, LocalBroker | RemoteBroker):
            try:
                # An embedding error surfaces here, where the search's own would have.
                vector = self.vector.result()
            except (OSError, RuntimeError):
                if not isinstance(self.broker, RemoteBroker):
                    raise
                # an older serve (no embed operation): it embeds the query when searching
                return self.broker.search(self.flt, self.query, self.limit, exact=self.exact)
            return self.broker.search_vector(self.flt, vector, self.limit, exact=self.exact)
        return self.broker.search(self.flt, self.query, self.limit, exact=self.exact)


@dataclass(frozen=True)
class _FindGraph:
    pass


@dataclass(frozen=True)
class _Walk:
    graph: GraphStore
    resolved: Json  # the database's resolution: its filter and where the walk starts

    def run(self) -> list[tuple[str, float]]:
        """The walk; a lost graph server is a ConnectionError (an OSError), as a lost
        broker is."""
        from neo4j.exceptions import ServiceUnavailable, SessionExpired

        flt, start = self.resolved["filter"], self.resolved["graph"]
        if not start["seeds"] or not flt["scope_keys"] or not start["tiers"]:
            return []
        try:
            return self.graph.walk(
                flt["tenant_id"],
                start["seeds"],
                int(start["hops"]),
                flt["scope_keys"],
                start["tiers"],
                RECALL_MAX_CANDIDATES,
                start.get("via", ["MENTIONS"]),
            )
        except (ServiceUnavailable, SessionExpired) as exc:
            raise ConnectionError(f"graph server: {exc}") from exc


_Step = _Database | _FindBroker | _FindGraph | _Embed | _Search | _Walk


def _plan(request: Json, exact: bool) -> Generator[_Step, Any, Any]:
    defaulted = "mode" not in request and "candidates" not in request
    broker: Broker | None = None
    if defaulted:
        if not has_words(request.get("query")):
            return (yield _Database(request))
        broker = yield _FindBroker()
        if broker is None:
            return (yield _Database(request))
        request = {**request, "mode": "hybrid"}
    if request.get("mode", "text") == "text" or "candidates" in request:
        return (yield _Database(request))
    if "graph_candidates" in request:
        return (yield _Database(request))
    if request["mode"] == "graph":
        graph = yield _FindGraph()
        if graph is None:
            raise no_graph()
        start: Json = yield _Database(request)
        if start["status"] != "resolved":
            return start  # malformed or denied, and audited as such
        try:
            walked = yield _Walk(graph, start)
        except (OSError, RuntimeError) as exc:
            raise no_graph() from exc
        return (yield _Database({**request, "graph_candidates": hits_as_candidates(walked)}))
    if broker is None:
        broker = yield _FindBroker()
    if broker is None:
        raise no_broker()
    vector: Future[list[float]] | None = None
    if isinstance(broker, LocalBroker | RemoteBroker) and isinstance(request.get("query"), str):
        vector = yield _Embed(broker, request["query"])  # overlaps the resolution below
    resolved: Json = yield _Database(request)
    if resolved["status"] != "resolved":
        return resolved  # malformed or denied, and audited as such
    flt = resolved["filter"]
    hits: list[tuple[str, float]] = []
    if flt["tiers"] and flt["scope_keys"]:
        limit = min(
            RECALL_MAX_CANDIDATES, max(MIN_CANDIDATES, int(flt["limit"]) * CANDIDATE_FACTOR)
        )
        try:
            hits = yield _Search(broker, flt, request["query"], limit, exact, vector)
        except (OSError, RuntimeError):
            if not defaulted:
                raise
            # The broker went away between finding it and asking it: serve text instead.
            return (yield _Database({k: v for k, v in request.items() if k != "mode"}))
    final = {**request, "candidates": hits_as_candidates(hits)}
    if "expand" in request:
        graph = yield _FindGraph()
        if graph is not None:  # else served without the graph: mode_served says so
            # the graph server going away meanwhile: served without it
            with contextlib.suppress(OSError, RuntimeError):
                final["graph_candidates"] = hits_as_candidates((yield _Walk(graph, resolved)))
    return (yield _Database(final))


def _recall_modes(
    conn: psycopg.Connection[Any],
    request: Json,
    broker: Broker | None = None,
    *,
    exact: bool = False,
    graph: GraphStore | None = None,
    tenant_id: str | None = None,
) -> Json:
    plan = _plan(request, exact)
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = plan.throw(error) if error is not None else plan.send(reply)
        except StopIteration as done:
            answer: Json = done.value
            return answer
        error = None
        if isinstance(step, _Database):
            reply = _recall(conn, step.request, tenant_id)
        elif isinstance(step, _FindBroker):
            reply = broker or find_broker(conn)
        elif isinstance(step, _FindGraph):
            reply = graph or find_graph()
        elif isinstance(step, _Embed):
            reply = step.start()
        else:
            try:
                reply = step.run()
            except (OSError, RuntimeError) as exc:
                error = exc
