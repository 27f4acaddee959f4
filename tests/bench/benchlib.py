"""What every bench shares with the others and needs nothing heavy for."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql


def call(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    """The one value `query` returns (its first column); a query that returns no row is an
    error, not None."""
    row = conn.execute(query, args).fetchone()
    assert row is not None, query
    return row[0]


def create_logins(su: psycopg.Connection[Any], logins: Mapping[str, str | None]) -> None:
    """Each login (cluster-wide, so only when missing) and its group role, if it has one."""
    for login, group in logins.items():
        if not su.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone():
            su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        if group:
            su.execute(sql.SQL("GRANT {} TO {}").format(*map(sql.Identifier, (group, login))))


def server_cpu_ms(conn: Any) -> float | None:
    """CPU time the connection's server process has used, in ms (nanoseconds from
    /proc/<pid>/schedstat: a call's own CPU, which moves much less than its wall time on a
    shared machine), or None when the server is not on this machine."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat", encoding="ascii") as f:
            return int(f.read().split()[0]) / 1e6
    except (OSError, ValueError, IndexError):
        return None


def backend_cpu(conns: Sequence[psycopg.Connection[Any]]) -> float | None:
    """Seconds of CPU the connections' server processes have used (None when the server is
    not on this machine). Moves much less than wall time on a shared machine."""
    total = 0.0
    for conn in conns:
        try:
            with open(f"/proc/{conn.info.backend_pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


# The subject keys of records loaded with triggers off (session_replication_role = replica),
# as open_run or the formation trigger would have made them: the projection feeds name a
# subject only by its pseudonym, and a record of a subject without a key is not projected.
SUBJECT_KEYS = """INSERT INTO fabric.subject_keys (tenant_id, subject_id, subject_ref, key)
SELECT d.tenant_id, d.subject_id, fabric._pseudonym(d.key, 'subject', d.subject_id), d.key
  FROM (SELECT s.tenant_id, s.subject_id, ext.gen_random_bytes(32) AS key
          FROM (SELECT DISTINCT m.tenant_id, m.subject_id::text AS subject_id
                  FROM fabric.memory_records m WHERE m.subject_id IS NOT NULL) s) d
ON CONFLICT (tenant_id, subject_id) DO NOTHING"""
