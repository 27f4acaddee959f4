"""Where the database is, and how a schema reaches it: bootstrap, alembic, replay.

`migrate()` is the only path: a superuser bootstrap (roles that need a superuser,
extensions, database settings), `alembic upgrade` as the migration role, then the
idempotent objects of `sql/` and `rls/` replayed in name order in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memfabric.settings import DEFAULT_PGPORT, Settings

ROOT = Path(__file__).resolve().parents[2]
SQL_DIRS = (ROOT / "sql", ROOT / "rls")
MIGRATOR = "fabric_migrator"
EXTENSIONS = ("vector", "plpython3u", "btree_gist", "btree_gin", "pgcrypto")
DEFAULT_PORT = DEFAULT_PGPORT
# Database-level settings of the install (DESIGN.md §7, Logs): failing statements and the
# DETAIL/CONTEXT of errors (which can quote values) never reach the server log, and one
# stuck session cannot stall projection.
DATABASE_SETTINGS = (
    ("log_min_error_statement", "panic"),
    ("log_error_verbosity", "terse"),
    ("idle_in_transaction_session_timeout", "60s"),
)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def database_url() -> str:
    """DATABASE_URL, or the embedded local server (127.0.0.1, PGPORT or 54329)."""
    return Settings.from_env().database_url


def url_for(url: str, user: str) -> str:
    """The same server and database, logged in as another role (trust or .pgpass)."""
    params = conninfo_to_dict(url)
    params.pop("password", None)
    return make_conninfo("", **{**params, "user": user})


def migrator_url(url: str) -> str:
    return Settings.from_env().migrator_url or url_for(url, MIGRATOR)


def bootstrap(url: str, progress: Progress = _quiet) -> None:
    """What only a superuser can do, idempotently: the migration role, the extensions,
    the database-level settings that keep content out of the server log."""
    with psycopg.connect(url, autocommit=True) as conn:
        dbname = conn.info.dbname
        is_super = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = is_super.fetchone()
        if not row or not row[0]:
            raise SystemExit(
                "bootstrap needs a superuser connection (DATABASE_URL); ask your DBA to run "
                "`memfabric db migrate` once as superuser, later upgrades can use "
                "MEMFABRIC_MIGRATOR_URL"
            )
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (MIGRATOR,)).fetchone()
        if not exists:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN CREATEROLE BYPASSRLS").format(
                    sql.Identifier(MIGRATOR)
                )
            )
            progress(f"created migration role {MIGRATOR}")
        conn.execute(
            sql.SQL("GRANT CONNECT, CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(dbname), sql.Identifier(MIGRATOR)
            )
        )
        conn.execute("CREATE SCHEMA IF NOT EXISTS ext")
        conn.execute("REVOKE CREATE ON SCHEMA ext FROM PUBLIC")
        conn.execute("GRANT USAGE ON SCHEMA ext TO PUBLIC")
        for ext in EXTENSIONS:
            conn.execute(
                sql.SQL("CREATE EXTENSION IF NOT EXISTS {} SCHEMA ext").format(sql.Identifier(ext))
                if ext != "plpython3u"
                else sql.SQL("CREATE EXTENSION IF NOT EXISTS plpython3u")
            )
        for setting, value in DATABASE_SETTINGS:
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(dbname), sql.Identifier(setting), sql.Literal(value)
                )
            )
        progress(f"bootstrap: extensions {', '.join(EXTENSIONS)} (schema ext)")


def _alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, target: str = "head") -> None:
    from alembic import command

    command.upgrade(_alembic_config(migrator_url(url)), target)


def downgrade(url: str, target: str = "base") -> None:
    from alembic import command

    command.downgrade(_alembic_config(migrator_url(url)), target)


def replay_files() -> list[Path]:
    return [f for d in SQL_DIRS for f in sorted(d.glob("*.sql"))]


def replay(url: str, progress: Progress = _quiet) -> None:
    """Replay sql/ then rls/ in one transaction as fabric_owner (idempotent objects)."""
    with psycopg.connect(migrator_url(url)) as conn:
        for path in replay_files():
            conn.execute("SET LOCAL ROLE fabric_owner")
            conn.execute(path.read_text())
        conn.execute("RESET ROLE")
    progress(f"replayed {len(replay_files())} files from sql/ and rls/")


def migrate(url: str | None = None, progress: Progress = _quiet) -> None:
    """Bootstrap, upgrade to head, replay: the one way a schema reaches a database."""
    url = url or database_url()
    bootstrap(url, progress)
    upgrade(url)
    progress("alembic: upgraded to head")
    replay(url, progress)
