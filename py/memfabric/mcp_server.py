"""The fabric as MCP tools: `memory_recall`, `memory_get` and `memory_propose`.

Every call is one governed call of the agent's own login: the database authorizes the tool
(three layers), resolves the scope and audits; this module only shapes arguments and
answers. The caller never names its tenant, agent or run: the login and the run are the
server's (stdio: given at start; HTTP: the bearer token's, resolved by the database).

The tools' input schemas are read from the database (`fabric_api.request_schema`), the one
source the validators are checked against. Errors become MCP tool errors carrying the
SQLSTATE, the message and the hint; nothing a caller sends stops the server.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import mcp_types as types
import psycopg
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.message import SessionMessage
from psycopg.conninfo import make_conninfo

from memfabric import errors
from memfabric.call import fabric_call
from memfabric.db import url_for
from memfabric.recall import recall

Json = dict[str, Any]
RECALL, GET, PROPOSE = "memory_recall", "memory_get", "memory_propose"
TOOLS = (RECALL, GET, PROPOSE)  # always all listed; authorization is per call

DESCRIPTIONS = {
    RECALL: (
        "Search long-term memory for records relevant to the current task and return them "
        "with their provenance, confidence and validity. Give a `query` in words; leave out "
        "`mode` to get the best retrieval available (hybrid when vector search is running, "
        "else full-text). You only ever see memories your run may read: the tenant, subject "
        "and session come from your run, and `scope` can only narrow them. An answer with "
        "status 'denied' says why (for example a tier outside your memory profile)."
    ),
    GET: (
        "Read specific memory records by their memory_id (1 to 100 ids, as returned by "
        "memory_recall). Read-only; records you may not read are simply absent from the answer."
    ),
    PROPOSE: (
        "Propose a new memory for durable storage. Send `content` (a JSON object, e.g. "
        '{"assertion": "prefers invoices in EUR"}; put a stable `key` in it for a fact that '
        "may later change), and optionally `tier` (episodic for what happened, the default; "
        "semantic for a fact, procedural for how to do something, profile for facts about "
        "the user), `visibility` (subject, the default: this user; session; agent; tenant), "
        "`confidence` in [0, 1] (default 0.8) and `derived_from` (the memory ids a fact was "
        "taken from). Who the user is, the tenant and the session come from your run. The "
        "answer says validated (a committer will store it), rejected (with the reason) or "
        "denied."
    ),
}


@dataclass(frozen=True)
class Caller:
    """Who calls: the agent's login, its run, and the MCP session (for provenance)."""

    login: str
    run_id: str
    session: str


def agent_conninfo(database_url: str, login: str, passfile: str | None = None) -> str:
    """The database of `database_url`, logged in as the agent itself: its password comes
    from the libpq sources (`passfile`, PGPASSFILE, ~/.pgpass), never from the URL."""
    conninfo = url_for(database_url, login)
    return make_conninfo(conninfo, passfile=passfile) if passfile else conninfo


def read_schemas(conn: psycopg.Connection[Any]) -> dict[str, Json]:
    return {
        name: fabric_call(conn, "fabric_api.request_schema", name) for name in ("recall", "propose")
    }


def tools(schemas: dict[str, Json]) -> list[types.Tool]:
    """The three tools, always all listed; whether a call is allowed is the database's."""
    recall_schema = copy.deepcopy(schemas["recall"])
    recall_schema["properties"].pop("run_id", None)
    recall_schema["required"] = [k for k in recall_schema.get("required", []) if k != "run_id"]
    recall_schema["description"] = (
        "fabric_api.recall's request without run_id and scope (the run and its scope are yours)"
    )
    props = schemas["recall"]["properties"]
    get_schema: Json = {
        "type": "object",
        "additionalProperties": False,
        "required": ["memory_ids"],
        "properties": {
            "memory_ids": props["filters"]["properties"]["memory_ids"],
            "correlation_id": props["correlation_id"],
        },
    }
    propose_schema = model_propose_schema(schemas["propose"])
    recall_schema["properties"].pop("scope", None)  # the run's scope; a request only narrows
    return [
        types.Tool(
            name=RECALL,
            description=DESCRIPTIONS[RECALL],
            input_schema=recall_schema,
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        ),
        types.Tool(
            name=GET,
            description=DESCRIPTIONS[GET],
            input_schema=get_schema,
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        ),
        types.Tool(
            name=PROPOSE,
            description=DESCRIPTIONS[PROPOSE],
            input_schema=propose_schema,
            annotations=types.ToolAnnotations(
                read_only_hint=False, destructive_hint=False, open_world_hint=False
            ),
        ),
    ]


# What the model gives of an envelope; the rest (tenant, formation method, source event)
# is the run's and the server's.
MODEL_FIELDS = ("content", "tier", "visibility", "confidence", "derived_from", "source_event_id")
MODEL_CONFIDENCE = 0.8


def model_propose_schema(envelope: Json) -> Json:
    """The propose tool's input: the envelope's fields a model knows, each with the
    database's own schema (the one `fabric_api.request_schema('propose')` publishes)."""
    props = envelope["properties"]
    scope = props["scope"]["properties"]
    provenance = props["provenance"]["properties"]
    tiers = [t for t in props["tier"]["enum"] if t != "relational"]  # never an agent's
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["content"],
        "properties": {
            "content": props["content"],
            "tier": {**props["tier"], "enum": tiers, "default": "episodic"},
            "visibility": {**scope["visibility"], "default": "subject"},
            "confidence": {**props["confidence"], "default": MODEL_CONFIDENCE},
            "derived_from": props["derived_from"],
            "source_event_id": {
                **provenance["source_event_id"],
                "description": "the event that caused this memory, if you know its id; "
                "omitted: this request is recorded as the source",
            },
        },
    }


def model_envelope(args: Json, tenant_id: str, source_event_id: str) -> Json:
    """The envelope of a model's propose arguments: scope from the run's tenant, formation
    by extraction (an agent's inference never outranks a declaration), the MCP request as
    the source event unless the model names one. Unknown fields are left for the database
    to refuse."""
    envelope: Json = {
        "tier": args.get("tier", "episodic"),
        "scope": {"tenant_id": tenant_id, "visibility": args.get("visibility", "subject")},
        "content": args.get("content"),
        "provenance": {
            "source_event_id": args.get("source_event_id") or source_event_id,
            "formation_method": "extraction",
        },
        "confidence": args.get("confidence", MODEL_CONFIDENCE),
    }
    if "derived_from" in args:
        envelope["derived_from"] = args["derived_from"]
    envelope.update({k: v for k, v in args.items() if k not in MODEL_FIELDS})
    return envelope


def _result(answer: Json, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(answer, default=str))],
        structured_content=answer,
        is_error=error,
    )


def tool_error(sqlstate: str | None, message: str, hint: str | None = None) -> types.CallToolResult:
    """An MCP tool error: what the database said (SQLSTATE, message, hint), or what failed."""
    return _result({"sqlstate": sqlstate, "message": message, "hint": hint}, error=True)


def _answer(conn: psycopg.Connection[Any], caller: Caller, name: str, args: Json, rid: str) -> Json:
    if name == RECALL:
        request = {**args, "run_id": caller.run_id}  # the run is the caller's, never chosen
        request.setdefault("correlation_id", str(uuid.uuid4()))
        return recall(conn, request)
    if name == GET:
        ids = args.get("memory_ids")
        request = {
            "run_id": caller.run_id,
            "correlation_id": args.get("correlation_id") or str(uuid.uuid4()),
            "filters": {"memory_ids": ids},
        }
        if isinstance(ids, list) and ids:
            request["limit"] = len(ids)
        return recall(conn, request)
    source = f"mcp:{caller.session}:{rid}"
    if "scope" not in args and "provenance" not in args:  # the model's fields (the schema's)
        tenant = fabric_call(conn, "fabric_api.working_key", caller.run_id)["tenant_id"]
        envelope = model_envelope(args, tenant, source)
        answer: Json = fabric_call(conn, "fabric_api.propose", tenant, envelope, caller.run_id)
        return answer
    # a full envelope, as clients written before 0.12 send it: still governed the same way
    envelope = copy.deepcopy(args)
    provenance = envelope.get("provenance")
    if isinstance(provenance, dict) and provenance.get("source_event_id") is None:
        # Provenance is never invented: without the caller's event, the MCP request is it.
        provenance["source_event_id"] = source
    answered: Json = fabric_call(conn, "fabric_api.propose", envelope, caller.run_id)
    return answered


def call(
    conn: psycopg.Connection[Any], caller: Caller, name: str, args: Any, request_id: Any
) -> types.CallToolResult:
    """One tool call on the agent's connection; every failure is a tool error."""
    if name not in (RECALL, GET, PROPOSE):
        return tool_error(None, f"unknown tool; the tools are {RECALL}, {GET}, {PROPOSE}")
    if not isinstance(args, dict):
        return tool_error(None, "the arguments must be a JSON object")
    try:
        answer = _answer(conn, caller, name, args, str(request_id))
    except errors.FabricError as exc:
        return tool_error(exc.sqlstate, str(exc), exc.hint)
    except psycopg.Error as exc:
        diag = exc.diag
        return tool_error(
            exc.sqlstate, diag.message_primary or type(exc).__name__, diag.message_hint
        )
    except ValueError as exc:  # e.g. semantic recall without a vector broker
        return tool_error(None, str(exc))
    return _result(answer, error=answer.get("status") == "denied")


# -- the server -----------------------------------------------------------------------------

Resolver = Callable[[ServerRequestContext[Any, Any]], Caller]
Connector = Callable[[Caller], Any]  # a context manager yielding the agent's connection


def build_server(
    schemas: dict[str, Json], caller_of: Resolver, connection_of: Connector
) -> Server[Any]:
    listed = tools(schemas)

    async def on_list_tools(  # the SDK's handler signature; one page lists every tool
        ctx: ServerRequestContext[Any, Any],  # noqa: ARG001
        params: types.PaginatedRequestParams | None,  # noqa: ARG001
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def on_call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        def run() -> types.CallToolResult:
            try:
                caller = caller_of(ctx)
                with connection_of(caller) as conn:
                    return call(conn, caller, params.name, params.arguments or {}, ctx.request_id)
            except errors.FabricError as exc:
                return tool_error(exc.sqlstate, str(exc), exc.hint)
            except psycopg.Error as exc:
                return tool_error(
                    exc.sqlstate,
                    "the database refused the connection or call",
                    errors.one_line(exc),
                )

        result: types.CallToolResult = await anyio.to_thread.run_sync(run)
        return result

    return Server(
        "memfabric",
        instructions="Long-term memory of this agent, governed by the memory fabric: recall "
        "before you answer, propose what is worth remembering.",
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


# -- stdio: one agent process -----------------------------------------------------------------


class _OneConnection:
    """The stdio server's single connection as the agent, reopened if it broke."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.conn: psycopg.Connection[Any] | None = None

    @contextmanager
    def __call__(self, _caller: Caller) -> Iterator[psycopg.Connection[Any]]:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(self.conninfo, autocommit=True)
        yield self.conn


def serve_stdio(database_url: str, login: str, run_id: str, passfile: str | None = None) -> None:
    """Serve one agent over stdin/stdout, connected as `login` inside run `run_id`."""
    from mcp.server.stdio import stdio_server

    connection = _OneConnection(agent_conninfo(database_url, login, passfile))
    with connection(Caller(login, run_id, "")) as conn:
        schemas = read_schemas(conn)
    caller = Caller(login, run_id, str(uuid.uuid4()))  # this process is the session
    server = build_server(schemas, lambda _ctx: caller, connection)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(_Answering(read, write), write, server.create_initialization_options())

    anyio.run(main)


class TokenRuns:
    """The runs of one agent token: opened by the gateway's own login from the token's
    template (`fabric_api.open_token_run`), renewed before they expire (a fifth of the run's
    length, at most a minute, before its end). The agent never opens its own runs."""

    def __init__(self, gateway_conninfo: str, token: str) -> None:
        self.gateway = _OneConnection(gateway_conninfo)
        self.token = token
        self.session = str(uuid.uuid4())  # this process is the MCP session
        self.caller: Caller | None = None
        self.renew_at = 0.0
        self.lock = threading.Lock()

    def current(self, _ctx: Any = None) -> Caller:
        """The open run's caller; a new run when the current one is about to expire (a
        revoked or expired token is the database's refusal, answered as a tool error)."""
        with self.lock:
            if self.caller is None or time.monotonic() >= self.renew_at:
                with self.gateway(Caller("", "", "")) as conn:
                    run: Json = fabric_call(conn, "fabric_api.open_token_run", self.token)
                expires = datetime.fromisoformat(str(run["expires_at"]))
                left = (expires - datetime.now(UTC)).total_seconds()
                self.renew_at = time.monotonic() + left - min(left / 5, 60.0)
                self.caller = Caller(str(run["login"]), str(run["run_id"]), self.session)
            return self.caller


def serve_stdio_token(
    database_url: str, token: str, gateway_login: str, passfile: str | None = None
) -> None:
    """Serve one agent over stdin/stdout from an agent token: the gateway's login opens and
    renews the agent's runs from the token's template; the calls are the agent's own login's
    (the one the template names)."""
    from mcp.server.stdio import stdio_server

    runs = TokenRuns(agent_conninfo(database_url, gateway_login, passfile), token)
    first = runs.current()
    connection = _OneConnection(agent_conninfo(database_url, first.login, passfile))
    with connection(first) as conn:
        schemas = read_schemas(conn)
    server = build_server(schemas, runs.current, connection)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(_Answering(read, write), write, server.create_initialization_options())

    anyio.run(main)


class _Answering:
    """The stdio server's read stream, answering each line that is not a JSON-RPC message
    with the JSON-RPC error (-32700 for text that is not JSON, -32600 for JSON that is not
    a message; id null, as JSON-RPC says when the id cannot be read) and serving on. The
    SDK hands such a line over as an exception, which its server drops without an answer,
    leaving a client waiting for a reply that never comes."""

    def __init__(self, inner: Any, write: Any) -> None:
        self._inner = inner
        self._write = write

    @property
    def last_context(self) -> Any:  # the sender's context, read by the SDK when present
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                return item  # type: ignore[no-any-return]
            if not _blank_line(item):  # an empty line between messages is no message
                await self._write.send(SessionMessage(unreadable_line_error(item)))

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Answering:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> _Answering:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None


def _blank_line(exc: Exception) -> bool:
    import pydantic

    return isinstance(exc, pydantic.ValidationError) and all(
        isinstance(e.get("input"), str) and not e["input"].strip() for e in exc.errors()
    )


def unreadable_line_error(exc: Exception) -> types.JSONRPCError:
    """The JSON-RPC error answering a line the transport could not read as a message."""
    import pydantic

    not_json = isinstance(exc, pydantic.ValidationError) and any(
        e.get("type") == "json_invalid" for e in exc.errors()
    )
    if not_json:
        error = types.ErrorData(code=types.PARSE_ERROR, message="Parse error: the line is not JSON")
    else:
        error = types.ErrorData(
            code=types.INVALID_REQUEST,
            message="Invalid Request: the line is not a JSON-RPC 2.0 message",
        )
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=error)


# -- streamable HTTP: a gateway for many agents ---------------------------------------------


class Gateway:
    """Resolves bearer tokens with the gateway's own login (fabric_mcp_gateway) and connects
    as the token's agent login, with the password file it was given."""

    def __init__(self, database_url: str, gateway_login: str, passfile: str | None) -> None:
        self.database_url = database_url
        self.passfile = passfile
        self.gateway_conninfo = agent_conninfo(database_url, gateway_login, passfile)

    def resolve(self, token: str) -> Json:
        with psycopg.connect(self.gateway_conninfo, autocommit=True) as conn:
            answer: Json = fabric_call(conn, "fabric_api.resolve_mcp_token", token)
        return answer

    def schemas(self) -> dict[str, Json]:
        with psycopg.connect(self.gateway_conninfo, autocommit=True) as conn:
            return read_schemas(conn)

    @contextmanager
    def connect(self, caller: Caller) -> Iterator[psycopg.Connection[Any]]:
        conninfo = agent_conninfo(self.database_url, caller.login, self.passfile)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            yield conn


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for key, value in headers:
        if key.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def http_app(gateway: Gateway, host: str) -> Any:
    """The ASGI app: every HTTP request must carry a live token (else 401); the resolved
    caller rides on the request to the tool handler."""
    from starlette.responses import JSONResponse

    def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
        request = ctx.request
        if request is None:  # every HTTP message carries its request
            raise errors.NotAuthorized("no HTTP request carries this call", sqlstate="42501")
        resolved: Json = request.scope["state"]["memfabric_caller"]
        session = request.headers.get("mcp-session-id") or resolved["run_id"]
        return Caller(resolved["login"], resolved["run_id"], session)

    server = build_server(gateway.schemas(), caller_of, gateway.connect)
    inner = server.streamable_http_app(host=host)
    owners = _SessionOwners()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        token = _bearer(scope.get("headers", []))
        try:
            if token is None:
                raise errors.NotAuthorized(
                    "a bearer token is required",
                    sqlstate="42501",
                    hint="send Authorization: Bearer <token from fabric_api.issue_mcp_token>",
                )
            resolved = await anyio.to_thread.run_sync(gateway.resolve, token)
        except errors.FabricError as exc:
            response = JSONResponse(
                {"sqlstate": exc.sqlstate, "message": str(exc), "hint": exc.hint},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
            await response(scope, receive, send)
            return
        except psycopg.Error as exc:  # the database is not answering: not the caller's fault
            response = JSONResponse(
                {
                    "sqlstate": exc.sqlstate,
                    "message": "the gateway cannot reach the fabric",
                    "hint": errors.one_line(exc),
                },
                status_code=503,
            )
            await response(scope, receive, send)
            return
        # A session is its opening token's: another token (even of the same run) is refused
        # here with a reason, and the SDK, told who the token is, refuses it too.
        digest = hashlib.sha256(token.encode()).hexdigest()
        session = _header(scope.get("headers", []), b"mcp-session-id")
        if session is not None and not owners.may_use(session, digest):
            response = JSONResponse(
                {
                    "sqlstate": "42501",
                    "message": "this MCP session was opened with another token",
                    "hint": "a session belongs to the token that opened it: open a session "
                    "of your own (send initialize without Mcp-Session-Id)",
                },
                status_code=403,
            )
            await response(scope, receive, send)
            return
        scope["user"] = _token_user(digest)
        scope.setdefault("state", {})["memfabric_caller"] = resolved

        async def send_noting_the_session(message: Any) -> None:
            if message["type"] == "http.response.start":
                opened = _header(message.get("headers", []), b"mcp-session-id")
                if session is None and opened is not None:
                    owners.opened(opened, digest)
                elif session is not None and scope["method"] == "DELETE":
                    owners.ended(session)
            await send(message)

        await inner(scope, receive, send_noting_the_session)

    return app


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _token_user(digest: str) -> Any:
    """The token as the SDK's authenticated user (the SDK binds each session to the user
    that opened it): its digest, never the token."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(AccessToken(token=digest, client_id=digest, scopes=[]))


class _SessionOwners:
    """Which token (its SHA-256) opened each MCP session, for the newest `limit` sessions
    (the SDK's own binding holds for older ones, answering 404 instead of a reason)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._limit = limit

    def opened(self, session: str, digest: str) -> None:
        self._owners[session] = digest
        while len(self._owners) > self._limit:
            self._owners.popitem(last=False)

    def ended(self, session: str) -> None:
        self._owners.pop(session, None)

    def may_use(self, session: str, digest: str) -> bool:
        owner = self._owners.get(session)
        return owner is None or hmac.compare_digest(owner, digest)


def serve_http(gateway: Gateway, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(http_app(gateway, host), host=host, port=port, log_level="warning")
