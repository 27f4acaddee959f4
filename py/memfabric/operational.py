"""Domain-owned operational stores: query indexes a domain pack keeps beside the fabric, never
memory (docs/operational-stores.md).

An operational collection is another collection in the same Qdrant, named
`ops_<pack>_<store>` (never `mem_*`), derived from a write-authoritative source the pack
owns (its own PostgreSQL schema) and rebuilt from it. This module holds what the fabric
guarantees about them:

- `point_id`: the one point identity, a UUIDv5 under `OPS_NS` of tenant, business instance
  ('' for a tenant-level record) and the domain key, joined by U+001F;
- `EdgeOperationalStore` (Qdrant Edge) and `ServerOperationalStore` (a Qdrant server): a
  collection with idempotent upserts on that id, the tenant (and business-instance) filter on
  every query (a query without it fails closed), readiness flags, and `rebuild()` from the
  declared source;
- `OpsBroker`: the per-login collection allowlist that stands in for credentials on Qdrant
  Edge; `collection_jwt`: the collection-scoped credential of a Qdrant server;
- `OperationalGraph`: an operational graph read only through allowlisted, parameterised
  queries with the tenant injected;
- `drill`: wipe and rebuild every declared store, proving identical answers.

Nothing here is reachable from recall: recall reads `fabric.memory_records` and the `mem_*`
collections only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib
import json
import os
import re
import shutil
import socket
import threading
import time
import unicodedata
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPS_NS = uuid.uuid5(uuid.NAMESPACE_URL, "https://synedrix.io/ns/operational-point-id/v1")
UNIT_SEPARATOR = "\x1f"

_PACK = re.compile(r"^[a-z][a-z0-9]*$")
_STORE = re.compile(r"^[a-z][a-z0-9_]*$")
_NAME = re.compile(r"^ops_([a-z][a-z0-9]*)_([a-z][a-z0-9_]*)$")

Component = str | int
Json = dict[str, Any]


class OperationalError(ValueError):
    """A name, key or declaration the operational-store rules refuse."""

    sqlstate = "22023"  # invalid_parameter_value: what the served broker answers with


class ScopeRequired(OperationalError):
    """A query or write without its tenant (or business instance): it fails closed."""


class CollectionNotAllowed(PermissionError):
    """The login holds no grant on this collection (or not for writing)."""

    sqlstate = "42501"  # insufficient_privilege


class NotReady(RuntimeError):
    """A read gated on a readiness flag that is not set (a rebuild has not finished)."""

    sqlstate = "55000"  # object_not_in_prerequisite_state


# --- identity ------------------------------------------------------------------------------


def point_component(value: Component) -> str:
    """One component of a point's name: NFC text, or an integer in decimal without leading
    zeros; a component holding U+001F is refused (it would be two components)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise OperationalError(f"a key component is text or an integer, not {value!r}")
    text = str(value) if isinstance(value, int) else unicodedata.normalize("NFC", value)
    if UNIT_SEPARATOR in text:
        raise OperationalError("a key component may not contain U+001F (the separator)")
    return text


def point_id(tenant_id: str, business_instance_id: str | None, key: Sequence[Component]) -> str:
    """The operational point id: uuid5(OPS_NS, tenant ␟ business instance ␟ key...), where a
    tenant-level record's business instance is ''. Never a memory_id."""
    if not isinstance(tenant_id, str) or not tenant_id:
        raise ScopeRequired("an operational point names its tenant")
    if not key:
        raise OperationalError("an operational point has a domain key")
    parts = [point_component(tenant_id), point_component(business_instance_id or "")]
    parts += [point_component(k) for k in key]
    return str(uuid.uuid5(OPS_NS, UNIT_SEPARATOR.join(parts)))


def collection_name(pack: str, store: str) -> str:
    """`ops_<pack>_<store>`: the pack id is lower-case letters and digits, the store name
    may hold underscores."""
    if not _PACK.match(pack) or not _STORE.match(store):
        raise OperationalError(
            f"an operational collection is ops_<pack>_<store> in lower case: {pack!r}, {store!r}"
        )
    return f"ops_{pack}_{store}"


def is_operational(name: str) -> bool:
    return _NAME.match(name) is not None


# --- declaration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OpsRow:
    """One record of the declared source: its scope, domain key, vector and payload."""

    tenant_id: str
    business_instance_id: str  # '' for a tenant-level record
    key: tuple[Component, ...]
    vector: Sequence[float]
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OpsCollection:
    """A pack's declaration of one operational collection: its domain key, the
    write-authoritative source it is rebuilt from (named in `source`, read by
    `read_source`), its embedding contract, whether its records belong to a business
    instance (then the instance is a mandatory filter too) and its readiness flag (a
    template over the domain key, e.g. 'scenario_vectors_ready:{regime_version}')."""

    pack: str
    store: str
    domain_key: tuple[str, ...]
    source: str
    read_source: Callable[[], Iterable[OpsRow]]
    model: str
    model_version: str
    dims: int
    instance_owned: bool = True
    readiness: str | None = None

    @property
    def name(self) -> str:
        return collection_name(self.pack, self.store)

    def flag_of(self, key: Sequence[Component]) -> str | None:
        if self.readiness is None:
            return None
        return self.readiness.format(**dict(zip(self.domain_key, key, strict=True)))


def _check_scope(c: OpsCollection, tenant_id: str | None, business_instance_id: str | None) -> str:
    if not tenant_id:
        raise ScopeRequired(f"{c.name}: every query and write names its tenant_id")
    if c.instance_owned and business_instance_id is None:
        raise ScopeRequired(
            f"{c.name}: the records belong to business instances; name business_instance_id "
            "('' for a tenant-level record)"
        )
    return business_instance_id or ""


# --- the stores ----------------------------------------------------------------------------

Hit = tuple[str, float, Json]


class OperationalStore(ABC):
    """What both backends share: scoped, idempotent writes, scoped reads, readiness flags
    (in `<flags_dir>/<name>.flags.json`, beside the data they describe) and the rebuild."""

    def __init__(self, collection: OpsCollection, flags_dir: str | Path) -> None:
        self.collection = collection
        Path(flags_dir).mkdir(parents=True, exist_ok=True)
        self._flags_file = Path(flags_dir) / f"{collection.name}.flags.json"

    # the backend's part (EdgeOperationalStore, ServerOperationalStore)
    @abstractmethod
    def _write(self, points: list[tuple[str, list[float], Json]]) -> None:
        """Upsert the points (id, vector, payload) into the backend."""

    @abstractmethod
    def _nearest(self, vector: list[float], scope: Json, limit: int) -> list[Hit]:
        """The nearest points inside the scope filter."""

    @abstractmethod
    def count(self) -> int:
        """How many points the collection holds."""

    @abstractmethod
    def wipe(self) -> None:
        """Remove every point (the rebuild refills from the source)."""

    @abstractmethod
    def close(self) -> None:
        """Release the backend."""

    def __enter__(self) -> OperationalStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # readiness flags
    def flags(self) -> set[str]:
        if not self._flags_file.exists():
            return set()
        return set(json.loads(self._flags_file.read_text()))

    def _write_flags(self, flags: set[str]) -> None:
        tmp = self._flags_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(flags)))
        tmp.replace(self._flags_file)

    def set_ready(self, flag: str) -> None:
        self._write_flags(self.flags() | {flag})

    def clear_ready(self, flags: Iterable[str]) -> None:
        self._write_flags(self.flags() - set(flags))

    # writes and reads
    def upsert(self, rows: Iterable[OpsRow]) -> list[str]:
        """Idempotent: a row's point id comes from its scope and domain key only."""
        points: list[tuple[str, list[float], Json]] = []
        c = self.collection
        for row in rows:
            instance = _check_scope(c, row.tenant_id, row.business_instance_id)
            if len(row.key) != len(c.domain_key):
                raise OperationalError(f"{c.name}: the domain key is {c.domain_key}")
            payload = {
                **row.payload,
                **dict(zip(c.domain_key, row.key, strict=True)),
                "tenant_id": row.tenant_id,
                "business_instance_id": instance,
            }
            points.append((point_id(row.tenant_id, instance, row.key), list(row.vector), payload))
        if points:
            self._write(points)
        return [p[0] for p in points]

    def search(
        self,
        tenant_id: str | None,
        business_instance_id: str | None,
        vector: Sequence[float],
        limit: int = 10,
        *,
        ready: str | None = None,
    ) -> list[Hit]:
        """The nearest points of this tenant (and business instance): (id, score, payload),
        best first, ties by id. `ready` gates the read on a readiness flag."""
        instance = _check_scope(self.collection, tenant_id, business_instance_id)
        if ready is not None and ready not in self.flags():
            raise NotReady(f"{self.collection.name}: {ready} is not set (rebuild in progress?)")
        scope: Json = {"tenant_id": tenant_id}
        if self.collection.instance_owned:
            scope["business_instance_id"] = instance
        hits = self._nearest(list(vector), scope, limit)
        return sorted(hits, key=lambda h: (-h[1], h[0]))

    def rebuild(self) -> Json:
        """Clear the readiness flags of the source's versions, wipe, re-upsert every row of
        the declared source, then set each flag again once all of its points are written.
        Never reads memory_records."""
        rows = list(self.collection.read_source())
        affected = {f for f in (self.collection.flag_of(r.key) for r in rows) if f}
        self.clear_ready(affected | self.flags())
        self.wipe()
        self.upsert(rows)
        self._flush()
        for flag in sorted(affected):
            self.set_ready(flag)
        return {
            "collection": self.collection.name,
            "source": self.collection.source,
            "points": self.count(),
            "flags": sorted(affected),
        }

    def _flush(self) -> None:  # noqa: B027 - a no-op unless the backend buffers (Edge does)
        """Make the written points durable (a server acknowledges them durable already)."""


class EdgeOperationalStore(OperationalStore):
    """One operational collection on Qdrant Edge, in `<root>/<name>`, its flags and its
    contract (source, model, model version, dims) beside it. Only this process may open it
    (Qdrant Edge's rule). Opened with another contract than the one it was built with, it
    starts empty with its flags cleared (`contract_changed`): points embedded by another
    model are never searched; the next rebuild fills it from the source."""

    def __init__(self, root: str | Path, collection: OpsCollection) -> None:
        super().__init__(collection, root)
        self.directory = Path(root) / collection.name
        self._contract_file = Path(root) / f"{collection.name}.contract.json"
        self._shard: Any = None
        self.contract_changed = False
        contract = self._contract()
        if self.directory.exists() and self._stored_contract() != contract:
            self.contract_changed = True
            self.clear_ready(self.flags())
            shutil.rmtree(self.directory)
        self._open()
        self._contract_file.write_text(json.dumps(contract, sort_keys=True))

    def _contract(self) -> Json:
        c = self.collection
        return {
            "source": c.source,
            "model": c.model,
            "model_version": c.model_version,
            "dims": c.dims,
            "domain_key": list(c.domain_key),
        }

    def _stored_contract(self) -> Json | None:
        if not self._contract_file.exists():
            return None
        stored: Json = json.loads(self._contract_file.read_text())
        return stored

    def _open(self) -> None:
        import qdrant_edge as qe

        config = qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=self.collection.dims, distance=qe.Distance.Cosine)
        )
        if self.directory.exists():
            self._shard = qe.EdgeShard.load(str(self.directory), config)
        else:
            self.directory.mkdir()
            self._shard = qe.EdgeShard.create(str(self.directory), config)
            self._shard.update(
                qe.UpdateOperation.create_field_index(
                    "tenant_id", qe.KeywordIndexParams(is_tenant=True)
                )
            )
            self._shard.update(
                qe.UpdateOperation.create_field_index(
                    "business_instance_id", qe.PayloadSchemaType.Keyword
                )
            )

    def close(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None

    def _write(self, points: list[tuple[str, list[float], Json]]) -> None:
        import qdrant_edge as qe

        self._shard.update(
            qe.UpdateOperation.upsert_points([qe.Point(i, v, p) for i, v, p in points])
        )

    def _nearest(self, vector: list[float], scope: Json, limit: int) -> list[Hit]:
        import qdrant_edge as qe

        must: list[Any] = [qe.FieldCondition(k, match=qe.MatchValue(v)) for k, v in scope.items()]
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(vector),
            filter=qe.Filter(must=must),
            with_payload=True,
            with_vector=False,
            params=qe.SearchParams(exact=True),
        )
        return [
            (str(p.id), float(p.score), dict(p.payload or {})) for p in self._shard.query(request)
        ]

    def count(self) -> int:
        import qdrant_edge as qe

        return int(self._shard.count(qe.CountRequest(exact=True)))

    def wipe(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self._open()

    def _flush(self) -> None:
        self._shard.flush()


class ServerOperationalStore(OperationalStore):
    """One operational collection on a Qdrant server through `qdrant-client`, reached with
    the caller's own credential: a collection-scoped JWT (`collection_jwt`) as `api_key`.
    Everything a writer does (upsert, the rebuild's wipe, which deletes the points rather
    than the collection) needs only `rw` on this collection; `ensure()` (creating the
    collection and its payload indexes) is the operator's, with the server's key."""

    def __init__(
        self,
        collection: OpsCollection,
        flags_dir: str | Path,
        *,
        url: str | None = None,
        api_key: str | None = None,
        location: str | None = None,
        client: Any = None,
    ) -> None:
        super().__init__(collection, flags_dir)
        if client is None:
            from qdrant_client import QdrantClient

            client = QdrantClient(url=url, api_key=api_key, location=location)
        self.client = client
        self._local = location is not None

    def ensure(self) -> None:
        from qdrant_client.http import models as m

        name = self.collection.name
        if not self.client.collection_exists(name):
            self.client.create_collection(
                name,
                vectors_config=m.VectorParams(
                    size=self.collection.dims, distance=m.Distance.COSINE
                ),
                metadata={
                    "memfabric_ops": {
                        "source": self.collection.source,
                        "model": self.collection.model,
                        "model_version": self.collection.model_version,
                        "dims": self.collection.dims,
                    }
                },
            )
            if not self._local:  # local mode has no payload indexes
                self.client.create_payload_index(
                    name,
                    "tenant_id",
                    field_schema=m.KeywordIndexParams(
                        type=m.KeywordIndexType.KEYWORD, is_tenant=True
                    ),
                    wait=True,
                )
                self.client.create_payload_index(
                    name,
                    "business_instance_id",
                    field_schema=m.PayloadSchemaType.KEYWORD,
                    wait=True,
                )

    def close(self) -> None:
        self.client.close()

    def _write(self, points: list[tuple[str, list[float], Json]]) -> None:
        from qdrant_client.http import models as m

        self.client.upsert(
            self.collection.name,
            points=[m.PointStruct(id=i, vector=v, payload=p) for i, v, p in points],
            wait=True,
        )

    def _nearest(self, vector: list[float], scope: Json, limit: int) -> list[Hit]:
        from qdrant_client.http import models as m

        flt = m.Filter(
            must=[m.FieldCondition(key=k, match=m.MatchValue(value=v)) for k, v in scope.items()]
        )
        response = self.client.query_points(
            self.collection.name,
            query=vector,
            query_filter=flt,
            # exact search on a server; local mode is exact anyway (and warns about params)
            search_params=None if self._local else m.SearchParams(exact=True),
            limit=limit,
            with_payload=True,
            with_vectors=False,
        )
        return [(str(p.id), float(p.score), dict(p.payload or {})) for p in response.points]

    def count(self) -> int:
        return int(self.client.count(self.collection.name, exact=True).count)

    def wipe(self) -> None:
        from qdrant_client.http import models as m

        self.client.delete(
            self.collection.name,
            points_selector=m.FilterSelector(filter=m.Filter(must=[])),
            wait=True,
        )


# --- authorization -------------------------------------------------------------------------


def _check_grants(login: str, grants: Mapping[str, str]) -> None:
    for name, access in grants.items():
        if access not in ("r", "rw"):
            raise OperationalError(f"{login}: access to {name} is 'r' or 'rw', not {access!r}")
    ops = [n for n in grants if is_operational(n)]
    if ops and len(ops) != len(grants):
        raise OperationalError(
            f"{login}: a credential never spans an operational and a mem_* (or other) "
            f"collection: {sorted(grants)}"
        )


class OpsBroker:
    """Qdrant Edge has no credentials: the broker holds the stores and serves each login only
    the collections its allowlist names ('r' to read, 'rw' to write)."""

    def __init__(
        self,
        stores: Iterable[OperationalStore],
        allowlist: Mapping[str, Mapping[str, str]],
    ) -> None:
        self._stores = {s.collection.name: s for s in stores}
        for login, grants in allowlist.items():
            _check_grants(login, grants)
            unknown = set(grants) - set(self._stores)
            if unknown:
                raise OperationalError(f"{login}: no such operational collection {sorted(unknown)}")
        self._allow = {login: dict(grants) for login, grants in allowlist.items()}

    def _store(self, login: str, name: str, write: bool) -> OperationalStore:
        access = self._allow.get(login, {}).get(name)
        if access is None or (write and access != "rw"):
            raise CollectionNotAllowed(f"{login} may not {'write' if write else 'read'} {name}")
        return self._stores[name]

    def search(
        self,
        login: str,
        name: str,
        tenant_id: str | None,
        business_instance_id: str | None,
        vector: Sequence[float],
        limit: int = 10,
        *,
        ready: str | None = None,
    ) -> list[tuple[str, float, Json]]:
        store = self._store(login, name, write=False)
        return store.search(tenant_id, business_instance_id, vector, limit, ready=ready)

    def upsert(self, login: str, name: str, rows: Iterable[OpsRow]) -> list[str]:
        return self._store(login, name, write=True).upsert(rows)

    def logins(self) -> list[str]:
        """The logins the allowlist names."""
        return sorted(self._allow)

    def grants(self, login: str) -> dict[str, str]:
        """The collections `login` may reach and how ('r' or 'rw')."""
        return dict(self._allow.get(login, {}))


# --- the served broker ---------------------------------------------------------------------
# `memfabric serve` owns the Qdrant Edge shards, so the operational stores are reached through
# its socket (memfabric.broker), like the vector broker. A connection first says who it is
# with a broker ticket: the client takes one on its own PostgreSQL connection
# (fabric_api.issue_broker_ticket names session_user) and serve redeems it on its own
# (fabric_api.redeem_broker_ticket), so the login is the one PostgreSQL authenticated. Every
# request after that is served as that login, through its allowlist; a refusal answers a
# SQLSTATE (`code`) that the client maps to memfabric.errors, and reads or writes nothing.


def _row_of(data: Mapping[str, Any]) -> OpsRow:
    if not isinstance(data, Mapping) or set(data) - {
        "tenant_id",
        "business_instance_id",
        "key",
        "vector",
        "payload",
    }:
        raise OperationalError("a row is {tenant_id, business_instance_id, key, vector, payload?}")
    try:
        return OpsRow(
            data.get("tenant_id"),  # type: ignore[arg-type] # checked by upsert (ScopeRequired)
            data.get("business_instance_id"),  # type: ignore[arg-type]
            tuple(data.get("key") or ()),
            _vector(data.get("vector")),
            dict(data.get("payload") or {}),
        )
    except (TypeError, ValueError) as exc:
        raise OperationalError(f"a malformed row: {exc}") from None


def _vector(value: Any) -> list[float]:
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in value
    ):
        raise OperationalError("a vector is a list of numbers")
    return [float(x) for x in value]


def _row_data(row: OpsRow) -> Json:
    return {
        "tenant_id": row.tenant_id,
        "business_instance_id": row.business_instance_id,
        "key": list(row.key),
        "vector": [float(x) for x in row.vector],
        "payload": dict(row.payload),
    }


class BrokerRefusal(Exception):
    """A request the served broker refuses, with the SQLSTATE it answers."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class OpsGate:
    """The served side: an `OpsBroker` behind serve's socket. `hello` establishes a socket
    connection's login from a broker ticket (`redeem` asks PostgreSQL); `answer` serves one
    request as that login. One lock serializes the stores (a drill in serve takes it too)."""

    OPS = frozenset({"ops_hello", "ops_search", "ops_upsert", "ops_collections"})

    def __init__(
        self,
        stores: Sequence[OperationalStore],
        allowlist: Mapping[str, Mapping[str, str]],
        redeem: Callable[[str], str],
    ) -> None:
        self.stores = list(stores)
        self.broker = OpsBroker(self.stores, allowlist)
        self._redeem = redeem
        self.lock = threading.Lock()

    def hello(self, ticket: Any) -> str:
        if not isinstance(ticket, str):
            raise BrokerRefusal("42501", "a connection names its broker ticket first")
        return self._redeem(ticket)

    def answer(self, login: str | None, request: Mapping[str, Any]) -> Json:
        """One request (op ops_search, ops_upsert or ops_collections) served as `login`, the
        connection's authenticated login; a request naming another login is refused."""
        if login is None:
            raise BrokerRefusal(
                "42501", "the connection is not authenticated: send ops_hello with a broker ticket"
            )
        claimed = request.get("login")
        if claimed is not None and claimed != login:
            raise BrokerRefusal(
                "42501", f"the connection is authenticated as {login}, not {claimed}"
            )
        op = request["op"]
        if op == "ops_collections":
            return {"collections": self.broker.grants(login)}
        name = request.get("collection")
        if not isinstance(name, str) or not is_operational(name):
            raise CollectionNotAllowed(f"{login} may reach operational collections only")
        with self.lock:
            if op == "ops_search":
                self.broker._store(login, name, write=False)  # the grant before the request's
                limit = request.get("limit", 10)
                if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
                    raise OperationalError("limit is an integer from 1 to 1000")
                hits = self.broker.search(
                    login,
                    name,
                    request.get("tenant_id"),
                    request.get("business_instance_id"),
                    _vector(request.get("vector")),
                    limit,
                    ready=request.get("ready"),
                )
                return {"hits": [[i, score, payload] for i, score, payload in hits]}
            self.broker._store(login, name, write=True)  # the grant before the rows' rules
            rows = [_row_of(r) for r in request.get("rows") or ()]
            return {"ids": self.broker.upsert(login, name, rows)}


def redeem_with(conninfo: str) -> Callable[[str], str]:
    """A ticket redeemer over a new connection each time (serve's projector login): the
    login the ticket names, or the database's refusal as a `BrokerRefusal`."""
    import psycopg

    def redeem(ticket: str) -> str:
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT fabric_api.redeem_broker_ticket(%s)", (ticket,)
                ).fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate is None:
                raise
            raise BrokerRefusal(exc.sqlstate, exc.diag.message_primary or str(exc)) from None
        assert row is not None
        return str(row[0])

    return redeem


class RemoteOpsBroker:
    """The client side: the operational stores of a `memfabric serve`, over its socket, as
    the login of `conn` (the caller's own PostgreSQL connection, which takes the ticket).
    Refusals raise the memfabric.errors class of their SQLSTATE (42501 `NotAuthorized`)."""

    def __init__(self, path: str | Path, conn: Any, timeout: float = 60.0) -> None:
        with conn.transaction():  # committed before serve looks for it
            row = conn.execute("SELECT fabric_api.issue_broker_ticket()").fetchone()
        self._socket = socket.socket(socket.AF_UNIX)
        self._socket.settimeout(timeout)
        self._socket.connect(str(path))
        self._reader = self._socket.makefile("rb")
        try:
            self.login: str = self.ask({"op": "ops_hello", "ticket": row[0]})["login"]
        except BaseException:
            self.close()
            raise

    def ask(self, request: Json) -> Json:
        """One request and its answer; a refusal raises (memfabric.errors)."""
        from memfabric import errors

        self._socket.sendall(json.dumps(request, default=str).encode() + b"\n")
        line = self._reader.readline()
        if not line:
            raise ConnectionError("memfabric serve closed the connection")
        answer: Json = json.loads(line)
        if not answer.get("ok"):
            code = answer.get("code")
            raise errors.from_sqlstate(code)(str(answer.get("error")), sqlstate=code)
        return answer

    def collections(self) -> dict[str, str]:
        """The collections this login may reach, with its access ('r' or 'rw')."""
        granted: dict[str, str] = self.ask({"op": "ops_collections"})["collections"]
        return granted

    def search(
        self,
        name: str,
        tenant_id: str | None,
        business_instance_id: str | None,
        vector: Sequence[float],
        limit: int = 10,
        *,
        ready: str | None = None,
    ) -> list[Hit]:
        answer = self.ask(
            {
                "op": "ops_search",
                "collection": name,
                "tenant_id": tenant_id,
                "business_instance_id": business_instance_id,
                "vector": [float(x) for x in vector],
                "limit": limit,
                "ready": ready,
            }
        )
        return [(str(i), float(score), dict(payload)) for i, score, payload in answer["hits"]]

    def upsert(self, name: str, rows: Iterable[OpsRow]) -> list[str]:
        answer = self.ask(
            {"op": "ops_upsert", "collection": name, "rows": [_row_data(r) for r in rows]}
        )
        return [str(i) for i in answer["ids"]]

    def close(self) -> None:
        self._reader.close()
        self._socket.close()

    def __enter__(self) -> RemoteOpsBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def allowlist(env: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """The per-login collection allowlist serve enforces on Qdrant Edge:
    MEMFABRIC_OPS_GRANTS, a JSON object {login: {collection: "r" | "rw"}} or the path of a
    file holding one; none means no login reaches any operational collection."""
    env = os.environ if env is None else env
    text = env.get("MEMFABRIC_OPS_GRANTS", "").strip()
    if not text:
        return {}
    if not text.startswith("{"):
        text = Path(text).read_text()
    grants = json.loads(text)
    if not isinstance(grants, dict) or not all(isinstance(g, dict) for g in grants.values()):
        raise OperationalError('MEMFABRIC_OPS_GRANTS is {"<login>": {"<collection>": "r"|"rw"}}')
    return {str(login): {str(c): str(a) for c, a in g.items()} for login, g in grants.items()}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def collection_jwt(
    api_key: str, grants: Mapping[str, str], ttl_s: int = 3600, now: float | None = None
) -> str:
    """A collection-scoped credential for a Qdrant server (its JWT RBAC, signed HS256 with
    the server's API key): `{"exp": ..., "access": [{"collection": c, "access": "r"|"rw"}]}`.
    The declared writer workflow gets 'rw' on its collection, readers 'r'; one token never
    spans an operational and a mem_* collection."""
    if not grants:
        raise OperationalError("a credential names at least one collection")
    _check_grants("credential", grants)
    claims = {
        "exp": int((time.time() if now is None else now) + ttl_s),
        "access": [{"collection": c, "access": a} for c, a in sorted(grants.items())],
    }
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(api_key.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64(signature)}"


# --- operational graphs --------------------------------------------------------------------


@dataclass(frozen=True)
class GraphQuery:
    """An allowlisted read of an operational graph: Cypher that matches only the pack's
    labels and filters on `$tenant_id` (and `$business_instance_id`), and the names of the
    parameters a caller may pass."""

    cypher: str
    params: tuple[str, ...] = ()
    instance_owned: bool = False

    def __post_init__(self) -> None:
        if "$tenant_id" not in self.cypher:
            raise OperationalError("an operational graph query filters on $tenant_id")
        if self.instance_owned and "$business_instance_id" not in self.cypher:
            raise OperationalError("an instance-owned graph query filters on $business_instance_id")
        if {"tenant_id", "business_instance_id"} & set(self.params):
            raise OperationalError("the scope is injected, never a caller's parameter")
        if re.search(r"\b(CREATE|MERGE|DELETE|DETACH|SET|REMOVE|CALL|LOAD)\b", self.cypher, re.I):
            raise OperationalError("an operational graph query only reads")


class OperationalGraph:
    """The only way an agent reaches an operational graph: a named query of the allowlist,
    with the authenticated tenant (and business instance) injected as parameters and the
    caller's values passed as parameters, never spliced into the text."""

    def __init__(
        self,
        driver: Any,
        database: str | None,
        queries: Mapping[str, GraphQuery],
        tenant_id: str,
        business_instance_id: str | None = None,
    ) -> None:
        if not tenant_id:
            raise ScopeRequired("an operational graph is read for an authenticated tenant")
        self._driver, self._database = driver, database
        self._queries = dict(queries)
        self._scope = {"tenant_id": tenant_id, "business_instance_id": business_instance_id}

    def read(self, name: str, **params: Any) -> list[Json]:
        query = self._queries.get(name)
        if query is None:
            raise CollectionNotAllowed(f"{name!r} is not an allowlisted operational graph query")
        if set(params) != set(query.params):
            raise OperationalError(f"{name} takes exactly {sorted(query.params)}")
        if query.instance_owned and self._scope["business_instance_id"] is None:
            raise ScopeRequired(f"{name}: the graph belongs to business instances")
        values = {**params, **self._scope}
        with self._driver.session(database=self._database) as session:
            rows: list[Json] = session.execute_read(
                lambda tx: [r.data() for r in tx.run(query.cypher, values)]
            )
        return rows


# --- the drill -----------------------------------------------------------------------------


def _probe(store: OperationalStore, rows: Sequence[OpsRow]) -> list[Any]:
    answers = []
    for row in rows:
        hits = store.search(row.tenant_id, row.business_instance_id, row.vector, 5)
        answers.append([(h[0], round(h[1], 6), sorted(h[2].items())) for h in hits])
    return answers


def declared(env: Mapping[str, str] | None = None) -> list[OpsCollection]:
    """The collections the deployment's packs declare: MEMFABRIC_OPS_PACKS names
    `module:attribute` entries (comma-separated), each a list of `OpsCollection` or a
    callable returning one."""
    env = os.environ if env is None else env
    collections: list[OpsCollection] = []
    for entry in filter(None, (e.strip() for e in env.get("MEMFABRIC_OPS_PACKS", "").split(","))):
        module, _, attribute = entry.partition(":")
        if not module or not attribute:
            raise OperationalError(
                f"MEMFABRIC_OPS_PACKS entries are module:attribute, not {entry!r}"
            )
        found = getattr(importlib.import_module(module), attribute)
        for c in found() if callable(found) else found:
            if not isinstance(c, OpsCollection):
                raise OperationalError(f"{entry} declares {c!r}, not an OpsCollection")
            collections.append(c)
    names = [c.name for c in collections]
    if len(set(names)) != len(names):
        raise OperationalError(f"an operational collection is declared twice: {sorted(names)}")
    return collections


def ops_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the Qdrant Edge operational collections live: MEMFABRIC_OPS_DIR, else beside
    the fabric's vector directory (`<vector dir>-ops`), never inside it."""
    env = os.environ if env is None else env
    if env.get("MEMFABRIC_OPS_DIR"):
        return Path(env["MEMFABRIC_OPS_DIR"])
    from memfabric.settings import Settings

    vectors = Settings.from_env().vector_dir
    return vectors.with_name(vectors.name + "-ops")


def open_declared(env: Mapping[str, str] | None = None) -> list[EdgeOperationalStore]:
    """Every declared collection opened on Qdrant Edge under `ops_dir()`."""
    stores: list[EdgeOperationalStore] = []
    try:
        for c in declared(env):
            stores.append(EdgeOperationalStore(ops_dir(env), c))
    except BaseException:
        for s in stores:
            s.close()
        raise
    return stores


def drill(stores: Iterable[OperationalStore]) -> list[Json]:
    """For each store: answer a probe per source row, wipe, rebuild from the declared source,
    answer again; `identical` is whether every answer is the same."""
    results = []
    for store in stores:
        rows = list(store.collection.read_source())
        before = _probe(store, rows)
        rebuilt = store.rebuild()
        after = _probe(store, rows)
        results.append({**rebuilt, "probes": len(rows), "identical": before == after})
    return results
