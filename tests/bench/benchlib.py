"""What every bench shares with the others and needs nothing heavy for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql


def create_logins(su: psycopg.Connection[Any], logins: Mapping[str, str | None]) -> None:
    """Each login (cluster-wide, so only when missing) and its group role, if it has one."""
    for login, group in logins.items():
        if not su.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone():
            su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        if group:
            su.execute(sql.SQL("GRANT {} TO {}").format(*map(sql.Identifier, (group, login))))
