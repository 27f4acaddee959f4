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


def _citus_before_distribution(connection) -> None:  # type: ignore[no-untyped-def]
    """On a Citus coordinator whose fabric is not distributed yet (a fresh install, or one
    from before 0049), the revisions up to the distribution step build the fabric on the
    coordinator alone, as on plain PostgreSQL: DDL is not propagated. 0049 distributes the
    tables, and Citus then creates each table's shards, its schema, owner, functions and
    types on the workers; every later DDL is propagated again (0049 turns it back on)."""
    citus = connection.execute(
        text("SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'")
    ).first()
    if citus is None:
        connection.commit()  # alembic starts from no transaction (autocommit blocks)
        return
    distributed = connection.execute(
        text(
            "SELECT 1 FROM pg_catalog.pg_dist_partition p JOIN pg_catalog.pg_class c "
            "ON c.oid = p.logicalrelid WHERE c.relnamespace::regnamespace::text = 'fabric'"
        )
    ).first()
    if distributed is None:
        connection.execute(text("SET citus.enable_ddl_propagation TO off"))
    connection.commit()


def run_migrations_online() -> None:
    conninfo = _conninfo()
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(conninfo))
    with engine.connect() as connection:
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {VERSION_SCHEMA}"))
        connection.commit()
        _citus_before_distribution(connection)
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
