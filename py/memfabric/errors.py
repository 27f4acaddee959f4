"""SQLSTATE -> exception map. The database decides; Python only names the outcome.

Never parse message text: the SQLSTATE is the interface (docs/errors.md). `one_line`
renders an expected failure (a refusal by the database, a service not answering, a setting
missing) as the single line the CLI prints.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    from memfabric.settings import Settings


class FabricError(Exception):
    """A refusal by the fabric, carrying the server's SQLSTATE, message and hint."""

    sqlstate: str | None = None

    def __init__(self, message: str, *, sqlstate: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate or type(self).sqlstate
        self.hint = hint


class NotAuthorized(FabricError):
    """42501: unknown or foreign run, missing group role, cross-tenant or widened scope."""


class InvalidEnvelope(FabricError):
    """22xxx: the request is malformed (types, keys, timestamps, numbers, sizes)."""


class NotFound(FabricError):
    """P0002 / 42704: an unknown tenant, agent, run or proposal."""


class RuleViolation(FabricError):
    """23xxx: a constraint of the fabric (lineage, formation rules, R-TOOL-2)."""


class ImmutableRecord(RuleViolation):
    """MF001: committed records, lineage and the outbox are never rewritten."""


class IllegalTransition(RuleViolation):
    """MF002: a lifecycle move that the lifecycle table does not allow (R-LIFE-1)."""


class AppendOnly(RuleViolation):
    """MF003: the events outbox and the record history are append-only."""


class MissingGovernanceContext(RuleViolation):
    """MF004: a record change outside a governed action (no acting agent)."""


class ApprovalRefused(RuleViolation):
    """MF005: a missing, pending, denied, expired, reused or mismatched approval."""


class WrongState(FabricError):
    """55000: e.g. committing a proposal that is not validated (already committed)."""


class LimitExceeded(InvalidEnvelope):
    """54000: content too large or too deep."""


class Unsupported(FabricError):
    """0A000: the database cannot hold the fabric (e.g. not UTF8)."""


class RetryableConflict(FabricError):
    """40001: a concurrent transaction got there first and is not visible yet; retrying the
    same call is safe (e.g. two identical proposals at the same instant)."""


_BY_SQLSTATE: dict[str, type[FabricError]] = {
    "42501": NotAuthorized,
    "P0002": NotFound,
    "42704": NotFound,
    "55000": WrongState,
    "54000": LimitExceeded,
    "54001": LimitExceeded,  # JSON nested deeper than the server's stack (PostgreSQL's input)
    "0A000": Unsupported,
    "40001": RetryableConflict,
    "MF001": ImmutableRecord,
    "MF002": IllegalTransition,
    "MF003": AppendOnly,
    "MF004": MissingGovernanceContext,
    "MF005": ApprovalRefused,
}
_BY_CLASS: dict[str, type[FabricError]] = {"22": InvalidEnvelope, "23": RuleViolation}


def from_sqlstate(sqlstate: str | None) -> type[FabricError]:
    """The exception class for a SQLSTATE (exact code first, then its class)."""
    if not sqlstate:
        return FabricError
    return _BY_SQLSTATE.get(sqlstate) or _BY_CLASS.get(sqlstate[:2]) or FabricError


def translate(exc: psycopg.Error) -> FabricError:
    diag = exc.diag
    cls = from_sqlstate(exc.sqlstate)
    return cls(diag.message_primary or str(exc), sqlstate=exc.sqlstate, hint=diag.message_hint)


@contextmanager
def mapped() -> Iterator[None]:
    """Re-raise database errors of the fabric as FabricError subclasses."""
    try:
        yield
    except psycopg.DatabaseError as exc:
        if exc.sqlstate is None:
            raise
        raise translate(exc) from exc


# SQLSTATE classes of a database that is going away or under strain: connection exception,
# transaction rollback, insufficient resources, operator intervention (a shutdown, a restart,
# a cancel), system error. A long-running loop reconnects and goes on from its cursor.
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})


def connection_lost(exc: BaseException) -> bool:
    """Did the database go away (or refuse for a moment) rather than refuse the call? True for
    libpq's own failures (no SQLSTATE: a connection that failed or was lost) and for the
    SQLSTATE classes above, whether raised as psycopg's error or as the FabricError that
    `mapped` made of it (a restart's 57P01 arrives as either)."""
    if not isinstance(exc, FabricError | psycopg.Error):
        return False
    if exc.sqlstate is None:
        return isinstance(exc, psycopg.OperationalError)
    return exc.sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES


def login_of(exc: BaseException, conninfo: str | None = None) -> str:
    """The login a failed call or connection ran as: the failed connection's own (psycopg's,
    or that of the error `mapped` translated), else the one `conninfo` names, else libpq's
    default (the OS user)."""
    for error in (exc, exc.__cause__):
        pgconn = getattr(error, "pgconn", None)
        if pgconn is not None and pgconn.user:
            return bytes(pgconn.user).decode(errors="replace")
    user = psycopg.conninfo.conninfo_to_dict(conninfo).get("user") if conninfo else None
    if user:
        return str(user)
    import getpass

    return getpass.getuser()


def paused_line(exc: BaseException, conninfo: str | None = None) -> str:
    """Why a long-running loop paused, for its progress line: the login it ran as, then the
    refusal (message and SQLSTATE) or, for a connection refused or lost (libpq gives no
    SQLSTATE), who was refused and the server's reason, or that the server is not answering."""
    line = one_line(exc) or f"error: {type(exc).__name__}: {_flat(str(exc))}"
    return f'login "{login_of(exc, conninfo)}": {line.removeprefix("error: ")}'


# -- failures outside the database's rules ----------------------------------------------------


class OperationalFailure(RuntimeError):
    """An expected failure that is not a refusal by the fabric: a service not answering, a
    projection never built, a setting missing. It carries what happened and how to fix it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class Unreachable(OperationalFailure):
    """A service the command needs (PostgreSQL, memfabric serve, the graph, Qdrant) is not
    answering."""


class NotBuilt(OperationalFailure):
    """A projection holds nothing while PostgreSQL holds records for it."""


class Misconfigured(OperationalFailure):
    """A setting is missing or malformed."""


class SchemaMismatch(OperationalFailure):
    """The database's schema revision is not the head this package ships: older (migrate
    it) or unknown to this package (a newer memfabric migrated it). Workers and
    `memfabric serve` refuse to start on it."""

    def __init__(self, message: str, *, database: str | None, package: str, hint: str) -> None:
        super().__init__(message, hint=hint)
        self.database_revision = database
        self.package_head = package


DB_UP_HINT = (
    "start the local server with `memfabric db up` (or `make db-up`), "
    "or point DATABASE_URL at a running PostgreSQL 17"
)
GRAPH_UP_HINT = (
    "start the local graph server with `make graph-up` (port GRAPH_BOLT_PORT), "
    "or set NEO4J_URI, NEO4J_USER and NEO4J_PASSWORD for a Neo4j 5 server"
)


def one_line(exc: BaseException) -> str | None:
    """The one line the CLI prints for an expected failure; None for anything else (a bug,
    whose traceback must stay visible).

    `error: <message> (<SQLSTATE>) — hint: <hint>` for a refusal by the database (its
    diagnostics, never its message text parsed); `error: <what> — hint: <how>` otherwise.
    """
    if isinstance(exc, FabricError):
        return _line(str(exc), exc.sqlstate, exc.hint or _HINTS.get(exc.sqlstate or ""))
    if isinstance(exc, OperationalFailure):
        return _line(str(exc), None, exc.hint)
    if isinstance(exc, psycopg.Error):
        if exc.sqlstate:
            diag = exc.diag
            message = diag.message_primary or type(exc).__name__
            return _line(message, exc.sqlstate, diag.message_hint or _HINTS.get(exc.sqlstate))
        if isinstance(exc, psycopg.OperationalError):
            return _connection_failure(exc)
        return None
    if isinstance(exc, ModuleNotFoundError):
        return _missing_extra(exc)
    return _graph_or_qdrant(exc)


# The optional dependencies (pyproject's extras), by the top-level module a command imports.
_EXTRAS = {
    "mcp": "mcp",
    "mcp_types": "mcp",
    "uvicorn": "mcp",
    "starlette": "mcp",
    "redis": "redis",
    "langgraph": "langgraph",
    "opentelemetry": "otel",
}


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    """An optional dependency that is not installed: which extra installs it. Any other
    missing module is a broken install, whose traceback stays visible."""
    module = (exc.name or "").split(".")[0]
    extra = _EXTRAS.get(module)
    if extra is None:
        return None
    return _line(
        f"this command needs the Python package {module!r}, which is not installed",
        None,
        f"pip install 'memfabric[{extra}]'",
    )


# Hints for SQLSTATEs the server raises without one (never chosen by message text).
_HINTS = {
    "3F000": "the fabric's schemas are missing here: run `memfabric db migrate` on this database",
}


def _settings() -> Settings | None:
    """The settings, or None when they are malformed themselves (never fail while failing)."""
    from memfabric.settings import Settings

    try:
        return Settings.from_env()
    except OperationalFailure:
        return None


def _line(message: str, sqlstate: str | None, hint: str | None) -> str:
    text = f"error: {_flat(message)}"
    if sqlstate:
        text += f" ({sqlstate})"
    if hint:
        text += f" — hint: {_flat(hint)}"
    return text


def _flat(text: str) -> str:
    """Whitespace (libpq's multi-line messages) folded into one line."""
    return " ".join(text.split())


def _connection_failure(exc: psycopg.OperationalError) -> str:
    """A connection that failed or was lost: libpq gives no SQLSTATE, so the server is
    probed to tell "not answering" from "answering but refusing this login"."""
    pgconn = exc.pgconn
    if pgconn is None:
        return _line(f"PostgreSQL connection failed: {exc}", None, DB_UP_HINT)
    host = (pgconn.host or b"").decode() or "localhost"
    port = (pgconn.port or b"").decode() or "5432"
    user = (pgconn.user or b"").decode()
    dbname = (pgconn.db or b"").decode()
    where = f"{host}:{port}" if not host.startswith("/") else f"{host}/.s.PGSQL.{port}"
    if not _answers(host, port):
        return _line(f"PostgreSQL at {where} is not answering", None, DB_UP_HINT)
    settings = _settings()
    variable = settings.login_variable(user) if settings else None
    named = f" (from {variable})" if variable else ""
    reason = (pgconn.error_message or b"").decode(errors="replace") or str(exc)
    fix = (
        f"set {variable} to one that does, or a full URL in {variable[: -len('LOGIN')]}URL"
        if variable
        else "pass one that does (--login), or check DATABASE_URL"
    )
    return _line(
        f'PostgreSQL at {where} refused login "{user}"{named} to database "{dbname}": {reason}',
        None,
        f"the login must exist and be allowed to connect: {fix}",
    )


def database_unavailable(exc: BaseException) -> bool:
    """Is `exc` PostgreSQL being away (not answering, restarting, shutting down, the
    connection lost) rather than refusing this caller? A server that answers but refuses
    the connection (a login, a password, a database that does not exist) is not away:
    waiting will not fix it."""
    if not isinstance(exc, FabricError | psycopg.Error):
        return False
    if exc.sqlstate is not None:  # connection exceptions, operator intervention
        return exc.sqlstate[:2] in ("08", "57")
    if not isinstance(exc, psycopg.OperationalError):
        return False
    pgconn = exc.pgconn
    if pgconn is None:
        return True
    host = (pgconn.host or b"").decode() or "localhost"
    return not _answers(host, (pgconn.port or b"").decode() or "5432")


def _answers(host: str, port: str) -> bool:
    """Does anything accept connections at the server's address?"""
    try:
        if host.startswith("/"):
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(2)
                probe.connect(f"{host}/.s.PGSQL.{port}")
        else:
            socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except (OSError, ValueError):
        return False


def _graph_or_qdrant(exc: BaseException) -> str | None:
    settings = _settings()
    try:
        from neo4j import exceptions as graph_errors
    except ImportError:  # pragma: no cover - neo4j is a dependency
        graph_errors = None  # type: ignore[assignment]
    if graph_errors is not None:
        if isinstance(exc, graph_errors.ServiceUnavailable):
            uri = settings.graph_uri if settings else "NEO4J_URI"
            return _line(f"the graph server at {uri} is not answering", None, GRAPH_UP_HINT)
        if isinstance(exc, graph_errors.AuthError):
            uri = settings.graph_uri if settings else "NEO4J_URI"
            return _line(
                f"the graph server at {uri} refused the login",
                None,
                "set NEO4J_USER and NEO4J_PASSWORD (or GRAPH_PASSWORD for the local server)",
            )
    try:
        from qdrant_client.http.exceptions import ResponseHandlingException
    except ImportError:  # pragma: no cover - qdrant-client is a dependency
        return None
    if isinstance(exc, ResponseHandlingException):
        url = settings.qdrant_url if settings else "QDRANT_URL"
        return _line(
            f"the Qdrant server at {url} is not answering",
            None,
            "start it, or unset QDRANT_URL to use the embedded shards of `memfabric serve`",
        )
    return None
