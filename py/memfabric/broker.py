"""The vector broker: the one process that holds Qdrant access. Agents never query Qdrant;
they ask the database to resolve their recall, the broker searches with exactly that
filter, and the database re-checks and hydrates the candidates (memfabric.recall).

Embedded mode: `memfabric serve` owns the Qdrant Edge shards (one process per shard
directory), runs the projector, and answers the other commands over a unix socket with
JSON lines. With QDRANT_URL the broker is in-process over qdrant-client.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import psycopg

from memfabric.constants import INDEXED_TIERS
from memfabric.embedding import Embedder, embed_query
from memfabric.operational import BrokerRefusal, OpsGate
from memfabric.settings import Settings
from memfabric.vectors import RecallFilter, VectorStore, store_from_env

Json = dict[str, Any]

# Operations the serve process runs without its lock: an index build blocks its caller for
# minutes but works on a copy, taking the store's own mutex only to copy and to swap.
UNLOCKED_OPS: frozenset[str] = frozenset({"build_index", "index_status"})


def default_socket() -> Path:
    from memfabric.settings import Settings

    return Settings.from_env().socket


def default_vector_dir() -> Path:
    from memfabric.settings import Settings

    return Settings.from_env().vector_dir


def recall_filter(resolved: Json) -> RecallFilter:
    """The database's resolved filter (fabric_api.recall, status 'resolved') as a vector
    filter: nothing is added, nothing is dropped."""
    return RecallFilter(
        tenant_id=resolved["tenant_id"],
        scope_keys=list(resolved["scope_keys"]),
        valid_at=datetime.fromisoformat(resolved["valid_at"]),
        min_confidence=float(resolved["min_confidence"]),
        excluded_labels=list(resolved["excluded_labels"]),
    )


class Broker(Protocol):
    def search(
        self, resolved: Json, query: str, limit: int, exact: bool = False
    ) -> list[tuple[str, float]]: ...

    def run(self, op: str, **kwargs: Any) -> Json: ...


@dataclass
class LocalBroker:
    """A broker in this process: the store, the embedder, and the operations it may run."""

    store: VectorStore
    embedder: Embedder
    ops: dict[str, Callable[..., Json]]

    def search(
        self, resolved: Json, query: str, limit: int, exact: bool = False
    ) -> list[tuple[str, float]]:
        # Only tiers with a collection: the database serves the others lexically.
        tiers = [t for t in resolved["tiers"] if t in INDEXED_TIERS]
        if not resolved["scope_keys"] or not tiers:
            return []
        return self.search_vector(resolved, self.embed_query(query), limit, exact)

    def embed_query(self, query: str) -> list[float]:
        """The query's vector, computed without the filter: memfabric.recall starts it
        while the database resolves the scope (nothing is searched before that). An
        embedder with query and passage prefixes (e5) embeds it as a query."""
        return embed_query(self.embedder, query)

    def search_vector(
        self, resolved: Json, vector: list[float], limit: int, exact: bool = False
    ) -> list[tuple[str, float]]:
        """`search` with the query already embedded (by `embed_query`)."""
        tiers = [t for t in resolved["tiers"] if t in INDEXED_TIERS]
        if not resolved["scope_keys"] or not tiers:
            return []
        return self.store.search(tiers, vector, recall_filter(resolved), limit, exact=exact)

    def run(self, op: str, **kwargs: Any) -> Json:
        if op not in self.ops:
            raise ValueError(f"unknown operation {op!r}; known: {', '.join(sorted(self.ops))}")
        return self.ops[op](**kwargs)


class _Handler(socketserver.StreamRequestHandler):
    broker: LocalBroker
    lock: threading.Lock
    ops: OpsGate | None

    def handle(self) -> None:
        login: str | None = None  # established by ops_hello (a broker ticket), per connection
        for line in self.rfile:
            try:
                request = json.loads(line)
                if request["op"] in OpsGate.OPS:
                    if self.ops is None:
                        raise BrokerRefusal(
                            "55000", "this memfabric serve holds no operational stores"
                        )
                    if request["op"] == "ops_hello":
                        login = None  # a refused hello leaves the connection unauthenticated
                        login = self.ops.hello(request.get("ticket"))
                        answer: Json = {"ok": True, "login": login}
                    else:
                        answer = {"ok": True, **self.ops.answer(login, request)}
                elif request["op"] == "search":
                    # Not under the serve lock: the query is embedded while the projector
                    # works, and the store serializes its own shard access (an Edge store
                    # holds its mutex per read or write, never while embedding). A client
                    # that had the query embedded first (op embed) sends the vector.
                    if "vector" in request:
                        hits = self.broker.search_vector(
                            request["resolved"],
                            [float(x) for x in request["vector"]],
                            int(request["limit"]),
                            bool(request.get("exact")),
                        )
                    else:
                        hits = self.broker.search(
                            request["resolved"],
                            request["query"],
                            int(request["limit"]),
                            bool(request.get("exact")),
                        )
                    answer = {"ok": True, "hits": hits}
                elif request["op"] == "embed":
                    # The query alone, no filter and no search: recall asks for it while
                    # the database resolves the scope (not under the serve lock either).
                    answer = {"ok": True, "vector": self.broker.embed_query(request["query"])}
                elif request["op"] in UNLOCKED_OPS:
                    result = self.broker.run(request["op"], **request.get("args", {}))
                    answer = {"ok": True, "result": result}
                else:
                    with self.lock:  # rebuild, drill, verify: the projector waits
                        result = self.broker.run(request["op"], **request.get("args", {}))
                    answer = {"ok": True, "result": result}
            except Exception as exc:
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                code = getattr(exc, "sqlstate", None)
                if isinstance(code, str):  # a refusal with its SQLSTATE (the operational stores)
                    answer["code"] = code
            self.wfile.write(json.dumps(answer, default=str).encode() + b"\n")
            self.wfile.flush()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve_socket(
    broker: LocalBroker, path: Path, lock: threading.Lock, ops: OpsGate | None = None
) -> _Server:
    """Listen on `path` (replacing a stale socket file); returns the started server. With
    `ops`, the operational stores are served too, each connection as the login its broker
    ticket names (memfabric.operational.OpsGate)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(path))
            raise RuntimeError(f"another memfabric serve is listening on {path}")
        except ConnectionRefusedError:
            path.unlink()
    handler = type("Handler", (_Handler,), {"broker": broker, "lock": lock, "ops": ops})
    server = _Server(str(path), handler)
    os.chmod(path, 0o600)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class RemoteBroker:
    """The client side: talks to `memfabric serve` over its unix socket."""

    def __init__(self, path: Path, timeout: float = 600.0) -> None:
        self.path = path
        self.timeout = timeout

    def _ask(self, request: Json) -> Json:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(self.timeout)
            conn.connect(str(self.path))
            conn.sendall(json.dumps(request, default=str).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        answer: Json = json.loads(data)
        if not answer.get("ok"):
            raise RuntimeError(f"memfabric serve refused: {answer.get('error')}")
        return answer

    def search(
        self, resolved: Json, query: str, limit: int, exact: bool = False
    ) -> list[tuple[str, float]]:
        hits = self._ask(
            {"op": "search", "resolved": resolved, "query": query, "limit": limit, "exact": exact}
        )["hits"]
        return [(str(h[0]), float(h[1])) for h in hits]

    def embed_query(self, query: str) -> list[float]:
        """The query's vector, embedded by the serve process (op embed)."""
        return [float(x) for x in self._ask({"op": "embed", "query": query})["vector"]]

    def search_vector(
        self, resolved: Json, vector: list[float], limit: int, exact: bool = False
    ) -> list[tuple[str, float]]:
        """`search` with the query already embedded (by `embed_query`)."""
        hits = self._ask(
            {"op": "search", "resolved": resolved, "vector": vector, "limit": limit,
             "exact": exact}
        )["hits"]  # fmt: skip
        return [(str(h[0]), float(h[1])) for h in hits]

    def run(self, op: str, **kwargs: Any) -> Json:
        result: Json = self._ask({"op": op, "args": kwargs})["result"]
        return result


def serving(path: Path) -> bool:
    """Is a `memfabric serve` answering on this socket?"""
    try:
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(2)
            probe.connect(str(path))
        return True
    except OSError:
        return False


_qdrant_brokers: dict[str, LocalBroker] = {}


def find_broker(conn: psycopg.Connection[Any]) -> Broker | None:
    """The vector broker this environment reaches, or None: an in-process broker over
    QDRANT_URL (built once per process, with the embedder the database names, read over
    `conn`), else a `memfabric serve` answering on its socket."""
    from memfabric.runtime import deployment_embedder

    return locate_broker(lambda: deployment_embedder(conn))


def locate_broker(embedder_of_deployment: Callable[[], Embedder]) -> Broker | None:
    """`find_broker`, with the deployment's embedder read by the caller when needed."""
    settings = Settings.from_env()
    url = settings.qdrant_url
    if url:
        if url not in _qdrant_brokers:
            embedder = embedder_of_deployment()
            store = store_from_env(default_vector_dir())
            store.ensure_collections(embedder.model, embedder.version, embedder.dims)
            _qdrant_brokers[url] = LocalBroker(store, embedder, {})
        return _qdrant_brokers[url]
    path = settings.socket
    return RemoteBroker(path) if serving(path) else None


def hits_as_candidates(hits: Sequence[tuple[str, float]]) -> list[Json]:
    return [{"memory_id": memory_id, "score": score} for memory_id, score in hits]


# -- the broker on demand: one per state directory, shared by its users ---------------------
# A process that uses a broker it may have started holds a shared lock on `broker.users` in
# the run directory for as long as it uses it; whoever starts the broker holds `broker.start`
# exclusively while it checks and starts. A broker started with `--while-users` takes both
# exclusively once a second (never waiting): when it gets them, nobody uses it any more, so
# it stops, holding them until it has exited (a user that comes meanwhile starts a new one).
USERS_LOCK = "broker.users"
START_LOCK = "broker.start"


def use_broker(run_dir: Path) -> int:
    """Become a user of the broker of `run_dir`: an open descriptor holding the shared lock
    (close it to stop being one; the kernel closes it when the process ends)."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / USERS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def starting_broker(run_dir: Path) -> int:
    """The start lock of `run_dir`, held (waits for a broker that is stopping to end)."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / START_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def users_gone(run_dir: Path) -> tuple[int, int] | None:
    """Both locks of `run_dir`, held, if no process uses the broker and none is starting
    one; else None (nothing held)."""
    import fcntl

    start = os.open(run_dir / START_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(start, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(start)
        return None
    users = os.open(run_dir / USERS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(users)
        os.close(start)
        return None
    return start, users
