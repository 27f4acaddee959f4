"""Alembic environment: runs as the migration role; objects are owned by fabric_owner.

The URL comes from the `sqlalchemy.url` main option set by memfabric.db.migrate, or from
MEMFABRIC_MIGRATOR_URL. The version table lives in schema fabric_migrations, which the
migration role owns, so the fabric schemas hold nothing but the fabric.
"""

from __future__ import annotations

import os

import psycopg
from alembic import context
from sqlalchemy import create_engine, text

VERSION_SCHEMA = "fabric_migrations"


def _conninfo() -> str:
    """A libpq URL or key=value string (memfabric.db passes the migration role's)."""
    conninfo = context.config.get_main_option("sqlalchemy.url") or os.environ.get(
        "MEMFABRIC_MIGRATOR_URL", ""
    )
    if not conninfo:
        raise SystemExit("no database: set MEMFABRIC_MIGRATOR_URL or use `memfabric db migrate`")
    return conninfo


def run_migrations_online() -> None:
    conninfo = _conninfo()
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(conninfo))
    with engine.connect() as connection:
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {VERSION_SCHEMA}"))
        connection.commit()
        context.configure(
            connection=connection,
            version_table_schema=VERSION_SCHEMA,
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported: the fabric migrates live databases")
run_migrations_online()
