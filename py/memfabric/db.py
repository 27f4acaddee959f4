"""Where the database is, and how a schema reaches it: bootstrap, alembic, replay.

`migrate()` is the only path: a superuser bootstrap (roles that need a superuser,
extensions, database settings), `alembic upgrade` as the migration role, then the
idempotent objects of `sql/` and `rls/` replayed in name order in one transaction.

The schema ships inside the package (`memfabric/_schema/{sql,rls,migrations}`, links to the
repository's directories that a wheel holds as copies): `schema_dir()` finds it through
importlib.resources, so an installed wheel migrates a database without a checkout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memfabric.settings import DEFAULT_PGPORT, Settings

ROOT = Path(__file__).resolve().parents[2]  # the checkout (scripts/ of the local servers)
REPLAYED = ("sql", "rls")
MIGRATOR = "fabric_migrator"
# The extensions the fabric uses, all in schema ext; nothing else is required (managed
# services offer all four; docs/operations.md has the matrix). The local server also has
# plpython3u, which no function uses and migrate neither creates nor drops.
EXTENSIONS = ("vector", "btree_gist", "btree_gin", "pgcrypto")
DEFAULT_PORT = DEFAULT_PGPORT
# Database-level settings of the install (R-LOG-1): failing statements and the
# DETAIL/CONTEXT of errors (which can quote values) never reach the server log, and one
# stuck session cannot stall projection.
DATABASE_SETTINGS = (
    ("log_min_error_statement", "panic"),
    ("log_error_verbosity", "terse"),
    ("idle_in_transaction_session_timeout", "60s"),
)

# Server-wide settings the install needs (postgresql.conf or ALTER SYSTEM; scripts/db.sh sets
# them on the local server). The database-level ones above do not reach the postmaster: when a
# backend crashes, the postmaster logs "Failed process was running: <statement>" as a DETAIL
# under its own log_error_verbosity, and a statement holds memory content. `terse` drops it.
SERVER_LOG_SETTINGS = (
    ("log_error_verbosity", "terse"),
    ("log_min_error_statement", "panic"),
    ("log_statement", "none"),
    ("log_min_duration_statement", "-1"),
    ("log_min_duration_sample", "-1"),
    ("log_transaction_sample_rate", "0"),
    ("debug_print_parse", "off"),
    ("debug_print_rewritten", "off"),
    ("debug_print_plan", "off"),
)
# Which value the postmaster runs with: the session's, unless a database or role setting
# masks it; then the last applied line of the configuration files, else the built-in default.
_SERVER_VALUES_SQL = """
SELECT s.name,
       CASE WHEN s.source IN ('database', 'user', 'database user', 'client', 'session')
            THEN coalesce((SELECT f.setting FROM pg_catalog.pg_file_settings f
                           WHERE f.name = s.name AND f.applied AND f.error IS NULL
                           ORDER BY f.seqno DESC LIMIT 1), s.boot_val)
            ELSE s.setting END
FROM pg_catalog.pg_settings s WHERE s.name = ANY (%s)
"""

Progress = Callable[[str], None]

# On a Citus cluster the coordinator opens its connections to the workers as the current
# user, and inside a SECURITY DEFINER function (or under the migration's SET ROLE) that is
# the function's owner: the roles that own fabric objects log in between the nodes. The
# bootstrap makes them LOGIN there (attributes as the migrations create them); pg_hba admits
# them from the nodes only (docs/citus.md). On plain PostgreSQL they stay NOLOGIN.
CITUS_NODE_ROLES = (
    ("fabric_owner", ""),
    ("fabric_lookup", "BYPASSRLS"),
    ("fabric_retriever", "BYPASSRLS"),
)


def citus_installed(conn: psycopg.Connection[Any]) -> bool:
    """Whether this database is a Citus cluster's (the extension is installed)."""
    return (
        conn.execute("SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'").fetchone()
        is not None
    )


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


def server_log_risks(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """The server-wide settings (not the database's) that would let statement text or quoted
    values reach the server log, as `name = 'safe value'` lines; empty when all are safe.
    Needs a superuser (or pg_read_all_settings) to see the configuration files."""
    names = [name for name, _ in SERVER_LOG_SETTINGS]
    server = {str(n): str(v) for n, v in conn.execute(_SERVER_VALUES_SQL, (names,)).fetchall()}
    return [
        f"{name} = '{safe}'"
        for name, safe in SERVER_LOG_SETTINGS
        if name in server and server[name].strip().lower() not in (safe, _ALIASES.get(safe))
    ]


_ALIASES = {"off": "false", "0": "0.0", "-1": "-1ms"}


def apply_server_log_settings(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """ALTER SYSTEM the content-safe logging settings and reload (superuser, autocommit)."""
    for name, value in SERVER_LOG_SETTINGS:
        conn.execute(
            sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
        )
    conn.execute("SELECT pg_catalog.pg_reload_conf()")


def bootstrap(url: str, progress: Progress = _quiet, warn: Progress = _quiet) -> None:
    """What only a superuser can do, idempotently: the migration role, the extensions,
    the database-level settings that keep content out of the server log. Without a
    superuser (a managed service), it checks that this was done already and warns."""
    with psycopg.connect(url, autocommit=True) as conn:
        dbname = conn.info.dbname
        is_super = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = is_super.fetchone()
        if not row or not row[0]:
            missing = bootstrap_missing(conn)
            if missing:
                raise SystemExit(
                    "bootstrap needs a superuser connection (DATABASE_URL) to create "
                    + ", ".join(missing)
                    + "; run `memfabric db migrate` once as a superuser, or create them as "
                    "the provider's administrator (docs/operations.md, PostgreSQL "
                    "compatibility)"
                )
            warn(
                "warning: not a superuser: bootstrap skipped (the migration role and the "
                "extensions exist); the database's log settings were not checked"
            )
            return
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
            )
        for setting, value in DATABASE_SETTINGS:
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(dbname), sql.Identifier(setting), sql.Literal(value)
                )
            )
        if citus_installed(conn):
            _citus_node_roles(conn)
            _citus_database_settings(conn, dbname)
            progress(
                "bootstrap: Citus cluster: the owner roles log in between the nodes, "
                "SET LOCAL reaches the workers"
            )
        progress(f"bootstrap: extensions {', '.join(EXTENSIONS)} (schema ext)")
        risks = server_log_risks(conn)
        if risks:
            warn(
                "the server's own settings can write statement text (memory content) to its "
                "log, e.g. when a backend crashes; database settings do not cover that. Set "
                "cluster-wide (postgresql.conf, or ALTER SYSTEM then SELECT pg_reload_conf()): "
                + ", ".join(risks)
            )


def _citus_node_roles(conn: psycopg.Connection[Any]) -> None:
    """The owner roles as LOGIN, and the migration role a member of each (ADMIN, SET; no
    INHERIT), on the coordinator and on every worker: a role that existed before this
    database joined the cluster is not one Citus propagates from here, so each node gets
    the same idempotent script. (Citus's deparser also drops an explicit SET TRUE.)"""
    script = [
        "SET citus.enable_create_role_propagation TO off",
        "SET citus.enable_alter_role_propagation TO off",
        "SET citus.enable_ddl_propagation TO off",
    ]
    for role, attrs in CITUS_NODE_ROLES:
        script.append(
            sql.SQL(
                "DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = {name})"
                " THEN ALTER ROLE {role} LOGIN; ELSE CREATE ROLE {role} LOGIN {attrs}; END IF;"
                " END $$"
            )
            .format(name=sql.Literal(role), role=sql.Identifier(role), attrs=sql.SQL(attrs))
            .as_string(conn)
        )
        script.append(
            sql.SQL("GRANT {} TO {} WITH ADMIN OPTION, INHERIT FALSE")
            .format(sql.Identifier(role), sql.Identifier(MIGRATOR))
            .as_string(conn)
        )
    script += [
        "RESET citus.enable_create_role_propagation",
        "RESET citus.enable_alter_role_propagation",
        "RESET citus.enable_ddl_propagation",
    ]
    text = "; ".join(script)
    conn.execute(text.encode())  # a fixed script: roles and attributes are constants here
    failed = conn.execute(
        "SELECT nodename, nodeport, result FROM run_command_on_workers(%s) WHERE NOT success",
        (text,),
    ).fetchall()
    if failed:
        raise SystemExit(f"bootstrap on the Citus workers failed: {failed}")
    # A role that existed before this database (roles are per node, Citus's metadata is per
    # database) is not one Citus knows it has on the workers: it would create or alter it
    # there when the migration distributes an object the role owns, as the migration role,
    # which may not (ALTER ROLE ... NOSUPERUSER needs a superuser). The superuser makes Citus
    # take each such role over now: a function it owns, distributed, then dropped.
    unknown = conn.execute(
        "SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.rolname LIKE 'fabric\\_%' "
        "AND NOT EXISTS (SELECT FROM pg_dist_object o WHERE o.classid = "
        "'pg_catalog.pg_authid'::regclass AND o.objid = r.oid) ORDER BY 1"
    ).fetchall()
    probe = sql.SQL("ext.memfabric_role_probe()")
    for (role,) in unknown:
        with conn.transaction():
            conn.execute(
                sql.SQL("CREATE FUNCTION {} RETURNS int LANGUAGE sql AS 'SELECT 1'").format(probe)
            )
            conn.execute(
                sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(probe, sql.Identifier(role))
            )
            conn.execute("SELECT create_distributed_function('ext.memfabric_role_probe()')")
            conn.execute(sql.SQL("DROP FUNCTION {}").format(probe))


# On Citus, the governance context (fabric._set_local) is made of SET LOCAL statements,
# which the coordinator sends to every worker its transaction reaches with this setting.
CITUS_DATABASE_SETTINGS = (("citus.propagate_set_commands", "local"),)


def _citus_database_settings(conn: psycopg.Connection[Any], dbname: str) -> None:
    """The database's settings that the fabric needs on Citus (Citus sets them on every node),
    and on the workers the migration role's privileges on the database, and fabric_owner's
    CREATE: Citus creates the fabric's schemas there as their owner."""
    grant = (
        sql.SQL(
            "SET citus.enable_ddl_propagation TO off; "
            "GRANT CONNECT, CREATE ON DATABASE {} TO {}, fabric_owner"
        )
        .format(sql.Identifier(dbname), sql.Identifier(MIGRATOR))
        .as_string(conn)
    )
    failed = conn.execute(
        "SELECT nodename, nodeport, result FROM run_command_on_workers(%s) WHERE NOT success",
        (grant,),
    ).fetchall()
    if failed:
        raise SystemExit(f"bootstrap on the Citus workers failed: {failed}")
    for setting, value in CITUS_DATABASE_SETTINGS:
        statement = (
            sql.SQL("ALTER DATABASE {} SET {} = {}")
            .format(sql.Identifier(dbname), sql.Identifier(setting), sql.Literal(value))
            .as_string(conn)
        )
        conn.execute(statement.encode())  # Citus sends ALTER DATABASE ... SET to the workers


def schema_dir(name: str) -> Path:
    """A directory of the schema shipped in the package: `sql`, `rls` or `migrations`."""
    path = resources.files("memfabric").joinpath("_schema", name)
    if not isinstance(path, Path) or not path.is_dir():
        from memfabric.errors import Misconfigured

        raise Misconfigured(
            f"the package holds no schema directory {name}",
            hint="reinstall memfabric from a wheel or a checkout (pip install memfabric)",
        )
    return path


def bootstrap_missing(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """What the bootstrap makes that this database lacks: the migration role and its
    privileges on the database, and each extension missing from schema ext."""
    missing = []
    if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (MIGRATOR,)).fetchone():
        missing.append(f"the role {MIGRATOR}")
    elif conn.execute(
        "SELECT has_database_privilege(%(r)s, current_database(), 'CONNECT')"
        " AND has_database_privilege(%(r)s, current_database(), 'CREATE')",
        {"r": MIGRATOR},
    ).fetchone() != (True,):
        missing.append(f"CONNECT and CREATE on this database for {MIGRATOR}")
    present = {
        str(name)
        for (name,) in conn.execute(
            "SELECT e.extname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE n.nspname = 'ext'"
        )
    }
    missing += [f"the extension {ext}" for ext in EXTENSIONS if ext not in present]
    return missing


def _alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()  # no alembic.ini: everything it would say is set here
    cfg.set_main_option("script_location", str(schema_dir("migrations")))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, target: str = "head") -> None:
    from alembic import command

    command.upgrade(_alembic_config(migrator_url(url)), target)


def downgrade(url: str, target: str = "base") -> None:
    from alembic import command

    command.downgrade(_alembic_config(migrator_url(url)), target)


def package_revisions() -> tuple[str, frozenset[str]]:
    """The head revision of the migrations this package ships, and every revision it knows."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(schema_dir("migrations")))
    (head,) = script.get_heads()  # one line of history: the release re-chains branches
    return head, frozenset(r.revision for r in script.walk_revisions())


UNDEFINED_FUNCTION = psycopg.errors.UndefinedFunction.sqlstate  # 42883

MIGRATE_HINT = (
    "run `memfabric db migrate` with this package to upgrade the database, then start again"
)


def require_known_revision(conn: psycopg.Connection[Any]) -> str:
    """The database's schema revision, if it is this package's head; else SchemaMismatch
    naming both revisions. Works for every service login (fabric_api.schema_revision())."""
    from memfabric.call import fabric_call
    from memfabric.errors import FabricError, SchemaMismatch

    head, known = package_revisions()
    revision: str | None
    try:
        with conn.transaction():
            revision = fabric_call(conn, "fabric_api.schema_revision")
    except FabricError as exc:
        if exc.sqlstate != UNDEFINED_FUNCTION:
            raise
        revision = None  # a fabric migrated before the revision was readable: older than head
    if revision == head:
        return head
    if revision is None or revision in known:
        raise SchemaMismatch(
            f"the database's schema is at revision {revision or 'unknown (older)'}, this "
            f"memfabric needs {head}",
            database=revision,
            package=head,
            hint=MIGRATE_HINT,
        )
    raise SchemaMismatch(
        f"the database's schema is at revision {revision}, which this memfabric (head "
        f"{head}) does not know",
        database=revision,
        package=head,
        hint="a newer memfabric migrated it: run that version (pip install -U memfabric), "
        "or point DATABASE_URL at a database of this one",
    )


def replay_files() -> list[Path]:
    return [f for d in REPLAYED for f in sorted(schema_dir(d).glob("*.sql"))]


def replay(url: str, progress: Progress = _quiet) -> None:
    """Replay sql/ then rls/ in one transaction as fabric_owner (idempotent objects).

    On a Citus cluster, one transaction per file, one statement at a time: Citus opens its
    connections to the workers per role, so an object a file creates as fabric_lookup is not
    visible to the fabric_owner connection of the same transaction before it commits, and it
    re-sends a statement's own text to the workers, which must then hold one command."""
    files = replay_files()
    with psycopg.connect(migrator_url(url)) as conn:
        if not citus_installed(conn):
            for path in files:
                conn.execute("SET LOCAL ROLE fabric_owner")
                conn.execute(path.read_text())
            conn.execute("RESET ROLE")
        else:
            conn.commit()
            for path in files:
                with conn.transaction():
                    for setting in CITUS_REPLAY_SETTINGS:
                        conn.execute(setting)
                    conn.execute("SET LOCAL ROLE fabric_owner")
                    for statement in split_statements(path.read_text()):
                        conn.execute(statement.encode())  # the package's own schema files
                    conn.execute("RESET ROLE")
    progress(f"replayed {len(files)} files from sql/ and rls/")


# The replay's settings on Citus: the fabric's triggers run on the shards (Citus calls them
# unsafe: they may read other shards, which the fabric's do only within the same tenant,
# colocated); every new function is created on every node at once; one connection per
# node and role, so what a statement created is visible to the next.
CITUS_REPLAY_SETTINGS = (
    "SET LOCAL citus.propagate_set_commands TO none",  # the replay's SET LOCAL ROLE stays here
    "SET LOCAL citus.enable_unsafe_triggers TO on",
    "SET LOCAL citus.create_object_propagation TO immediate",
    "SET LOCAL citus.multi_shard_modify_mode TO 'sequential'",
)


def split_statements(text: str) -> list[str]:
    """The SQL statements of a script, split at the semicolons outside quotes, dollar-quoted
    bodies, quoted identifiers and comments (what psql does). Empty statements are dropped."""
    out: list[str] = []
    start = i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "-" and text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "/" and text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c in "'\"":
            escapes = c == "'" and i > 0 and text[i - 1] in "eE" and not _ident_char(text, i - 2)
            i += 1
            while i < n:
                if escapes and text[i] == "\\":
                    i += 2
                elif text[i] == c:
                    if text.startswith(c * 2, i):
                        i += 2
                    else:
                        break
                else:
                    i += 1
            i += 1
        elif c == "$" and not _ident_char(text, i - 1):
            m = _DOLLAR_TAG.match(text, i)
            if m:
                end = text.find(m.group(0), m.end())
                i = n if end < 0 else end + len(m.group(0))
            else:
                i += 1
        elif c == ";":
            statement = text[start:i].strip()
            if _has_code(statement):
                out.append(statement)
            start = i = i + 1
        else:
            i += 1
    statement = text[start:].strip()
    if _has_code(statement):
        out.append(statement)
    return out


_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")


def _ident_char(text: str, i: int) -> bool:
    return i >= 0 and (text[i].isalnum() or text[i] in "_$")


def _has_code(statement: str) -> bool:
    """Whether a piece of script holds more than comments and blanks."""
    return bool(split_comments(statement).strip())


def split_comments(statement: str) -> str:
    return re.sub(r"--[^\n]*", "", statement)


def analyze_new_tables(url: str, progress: Progress = _quiet) -> list[str]:
    """ANALYZE the fabric's tables that have never been analyzed (a fresh database, or
    tables a migration just created). Without statistics the planner guesses their size,
    and a plan made from the guess stays in a session's cache until autovacuum's first
    ANALYZE invalidates it: on a fresh database the set-based batch writes ran at a third
    of their speed (docs/benchmarks.md, "Governed writes")."""
    with psycopg.connect(migrator_url(url), autocommit=True) as conn:
        conn.execute("SET ROLE fabric_owner")
        tables = conn.execute(
            "SELECT schemaname, relname FROM pg_catalog.pg_stat_user_tables "
            "WHERE schemaname = 'fabric' AND last_analyze IS NULL "
            "AND last_autoanalyze IS NULL ORDER BY 1, 2"
        ).fetchall()
        for schema, table in tables:
            conn.execute(
                sql.SQL("ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
            )
        conn.execute("RESET ROLE")
    if tables:
        progress(f"analyzed {len(tables)} tables without statistics")
    return [f"{schema}.{table}" for schema, table in tables]


# The event triggers of the DDL guard (sql/270_ddl_guard.sql): only a superuser creates them.
DDL_GUARD = (
    ("fabric_ddl_guard", "ddl_command_end"),
    ("fabric_ddl_guard_drop", "sql_drop"),
)
DDL_GUARD_FUNCTION = "fabric.tg_ddl__migration_role_only()"


def install_ddl_guard(url: str, progress: Progress = _quiet, warn: Progress = _quiet) -> bool:
    """Refuse DDL on the fabric schemas to every session but the migration role's (and
    superusers'). Needs a superuser, or a managed service's administrator that may create
    event triggers (Amazon RDS's rds_superuser); without one it warns and returns False."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            with conn.transaction():  # both triggers, or the ones there before
                for name, event in DDL_GUARD:
                    conn.execute(
                        sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(name))
                    )
                    conn.execute(
                        sql.SQL("CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION {}").format(
                            sql.Identifier(name), sql.SQL(event), sql.SQL(DDL_GUARD_FUNCTION)
                        )
                    )
        except psycopg.errors.InsufficientPrivilege:
            warn(
                "the DDL guard (event triggers refusing schema changes to the fabric "
                "by any login but fabric_migrator) was not installed: it needs a superuser; "
                "run `memfabric db migrate` once with a superuser DATABASE_URL"
            )
            return False
    progress("ddl guard: schema changes to the fabric are refused to all but fabric_migrator")
    return True


def reindex_text(url: str | None = None) -> dict[str, Any]:
    """Re-derive every record's search text with the deployment's text search configuration
    and rebuild the search statistics, as the migration role (search text is immutable to
    everyone else, and may only become what the content derives)."""
    with psycopg.connect(migrator_url(url or database_url())) as conn:
        conn.execute("SET LOCAL ROLE fabric_owner")
        row = conn.execute("SELECT fabric.reindex_search_text()").fetchone()
    assert row is not None
    result: dict[str, Any] = row[0]
    return result


def migrate(url: str | None = None, progress: Progress = _quiet, warn: Progress = _quiet) -> None:
    """Bootstrap, upgrade to head, replay, guard: the one way a schema reaches a database."""
    url = url or database_url()
    bootstrap(url, progress, warn)
    upgrade(url)
    progress("alembic: upgraded to head")
    replay(url, progress)
    analyze_new_tables(url, progress)
    install_ddl_guard(url, progress, warn)
