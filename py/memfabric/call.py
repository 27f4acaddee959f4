"""One way to call the database: `fabric_call(conn, "fabric_api.propose", envelope, run_id)`.

Every door of the fabric is a function in `fabric_api` or `fabric_audit`; this module is the
one place Python calls them. The function name is checked against those two schemas and
quoted as identifiers (never pasted into the statement); the arguments travel as bound
parameters; a refusal arrives as a `memfabric.errors.FabricError` subclass chosen by its
SQLSTATE.

How arguments are adapted (psycopg's defaults, plus one rule):

- a `dict` becomes `jsonb` (every fabric function that takes an object takes jsonb);
- a `list` or `tuple` stays a PostgreSQL array (`text[]` tools, `uuid[]` ids): a jsonb
  *array* is passed explicitly as `psycopg.types.json.Jsonb([...])`;
- `datetime.timedelta` is an interval, `datetime` a timestamptz, `uuid.UUID` a uuid;
- `Cast(value, "xid8")` adds an explicit cast where a bare value is ambiguous (a string
  meant as `xid8` or `ext.vector`); an unannotated `str` is typed by the server from the
  function's parameter.

Keyword arguments use PostgreSQL's named notation (`p_batch => 100`), so a caller can leave
earlier defaulted parameters at their defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector.psycopg.vector import register_vector_info
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types import TypeInfo
from psycopg.types.json import Jsonb

from memfabric.errors import mapped

SCHEMAS = ("fabric_api", "fabric_audit")
_NAME = re.compile(r"^(fabric_api|fabric_audit)\.([a-z][a-z0-9_]*)$")
_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?(\[\])?$")
_PARAMETER = re.compile(r"^p_[a-z0-9_]+$")


@dataclass(frozen=True)
class Cast:
    """A value with the SQL type it is cast to (`Cast("42", "xid8")` -> `%s::xid8`)."""

    value: Any
    type_name: str

    def __post_init__(self) -> None:
        if not _TYPE.fullmatch(self.type_name):
            raise ValueError("a cast names a type: [schema.]name, optionally with []")


def function_identifier(name: str) -> sql.Composable:
    """`schema.function` as quoted identifiers, for a function of fabric_api or fabric_audit."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise ValueError(
            "fabric_call calls a function of fabric_api or fabric_audit by its qualified name "
            '(e.g. "fabric_api.propose")'
        )
    return sql.Identifier(match.group(1), match.group(2))


def _adapt(value: Any) -> Any:
    if isinstance(value, Mapping):
        return Jsonb(dict(value))
    if isinstance(value, tuple):
        return list(value)
    return value


def _argument(value: Any) -> tuple[sql.Composable, Any]:
    if isinstance(value, Cast):
        base, _, array = value.type_name.partition("[")
        type_sql: sql.Composable = sql.Identifier(*base.split("."))
        if array:
            type_sql = sql.Composed([type_sql, sql.SQL("[]")])
        return sql.SQL("{}::{}").format(sql.Placeholder(), type_sql), _adapt(value.value)
    return sql.Placeholder(), _adapt(value)


def statement(
    name: str, args: tuple[Any, ...], named: Mapping[str, Any]
) -> tuple[sql.Composed, list[Any]]:
    """`schema.function(%s, ..., p_x => %s)` and its parameters."""
    parts: list[sql.Composable] = []
    params: list[Any] = []
    for value in args:
        part, param = _argument(value)
        parts.append(part)
        params.append(param)
    for key, value in named.items():
        if not _PARAMETER.fullmatch(key):
            raise ValueError("named arguments are the function's parameters (p_...)")
        part, param = _argument(value)
        parts.append(sql.SQL("{} => {}").format(sql.Identifier(key), part))
        params.append(param)
    call = sql.SQL("{}({})").format(function_identifier(name), sql.SQL(", ").join(parts))
    return call, params


def fabric_call(conn: psycopg.Connection[Any], name: str, /, *args: Any, **named: Any) -> Any:
    """Call one fabric function on `conn` (its login is the identity) and return its value:
    jsonb as Python dicts and lists, uuid as `uuid.UUID`, void as None."""
    call, params = statement(name, args, named)
    with mapped(), conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(sql.SQL("SELECT {}").format(call), params).fetchone()
    return None if row is None else row[0]


def fabric_rows(
    conn: psycopg.Connection[Any], name: str, /, *args: Any, binary: bool = False, **named: Any
) -> list[dict[str, Any]]:
    """The same call for the functions that return a table (`fabric_audit.lineage`, ...):
    its rows as dicts keyed by column (`binary=True`: in PostgreSQL's binary format, e.g.
    `ext.vector` columns after `register_vector`)."""
    call, params = statement(name, args, named)
    with mapped(), conn.cursor(row_factory=dict_row, binary=binary) as cur:
        return cur.execute(sql.SQL("SELECT * FROM {}").format(call), params).fetchall()


def fabric_count(conn: psycopg.Connection[Any], name: str, /, *args: Any, **named: Any) -> int:
    """How many rows a table function returns, counted in the database (a metric's read:
    the rows themselves never cross the wire)."""
    call, params = statement(name, args, named)
    with mapped(), conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(sql.SQL("SELECT count(*) FROM {}").format(call), params).fetchone()
    return 0 if row is None else int(row[0])


def relay_events(conn: psycopg.Connection[Any]) -> int:
    """Move into the outbox the events that calls delegated to a Citus cluster's workers left
    on the tenants' shards (`fabric_api.relay_events`); how many. The feeds' consumers call
    it before they read; 0 at once on plain PostgreSQL."""
    return int(fabric_call(conn, "fabric_api.relay_events") or 0)


def register_vector(conn: psycopg.Connection[Any]) -> None:
    """pgvector's adapter for the fabric's `ext.vector` on `conn` (once per connection):
    embeddings travel as binary vectors (`pgvector.Vector` in and out; a Python list of
    floats is not a vector until wrapped), never as text or jsonb."""
    if conn.adapters.types.get("vector") is None:
        register_vector_info(conn, TypeInfo.fetch(conn, "ext.vector"))


async def aregister_vector(conn: psycopg.AsyncConnection[Any]) -> None:
    """`register_vector` on an async connection."""
    if conn.adapters.types.get("vector") is None:
        register_vector_info(conn, await TypeInfo.fetch(conn, "ext.vector"))


async def afabric_call(
    conn: psycopg.AsyncConnection[Any], name: str, /, *args: Any, **named: Any
) -> Any:
    """`fabric_call` on an async connection."""
    call, params = statement(name, args, named)
    with mapped():
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(sql.SQL("SELECT {}").format(call), params)
            row = await cur.fetchone()
    return None if row is None else row[0]


async def afabric_rows(
    conn: psycopg.AsyncConnection[Any],
    name: str,
    /,
    *args: Any,
    binary: bool = False,
    **named: Any,
) -> list[dict[str, Any]]:
    """`fabric_rows` on an async connection."""
    call, params = statement(name, args, named)
    with mapped():
        async with conn.cursor(row_factory=dict_row, binary=binary) as cur:
            await cur.execute(sql.SQL("SELECT * FROM {}").format(call), params)
            return await cur.fetchall()
