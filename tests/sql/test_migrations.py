"""Migrations (docs/architecture.md, The shape): a fresh install and an upgraded one dump to
the same schema, a downgrade to base and a new migrate give the same schema again,
migrate is idempotent, and roles, being cluster-wide, survive a downgrade.

Each install is its own database on the session's server, named uniquely and dropped at
the end; dumps are `pg_dump --schema-only` with owners and privileges kept.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.script import ScriptDirectory
from psycopg import sql

from memfabric import db as mfdb

# every test here migrates databases of its own from nothing or from a release (~15 s together)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PG_DUMP = ROOT / ".local" / "pg17" / "bin" / "pg_dump"
FABRIC_ROLES = {
    "fabric_owner",
    "fabric_lookup",
    "fabric_admin",
    "fabric_orchestrator",
    "fabric_agent",
    "fabric_committer",
    "fabric_consolidator",
    "fabric_policy",
    "fabric_auditor",
    "fabric_projector",
    "fabric_migrator",
}
FABRIC_SCHEMAS = {"fabric", "fabric_api", "fabric_audit"}


# --- helpers ----------------------------------------------------------------------------


def conninfo(server: Any, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname=dbname
    )


def create_database(server: Any, dbname: str) -> str:
    with psycopg.connect(conninfo(server, "postgres"), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return conninfo(server, dbname)


def drop_database(server: Any, dbname: str) -> None:
    with psycopg.connect(conninfo(server, "postgres"), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def dump(server: Any, dbname: str) -> list[str]:
    """The schema with owners and grants; without comments, blank lines and the random
    \\restrict keys that pg_dump 17.6+ writes."""
    out = subprocess.run(
        [
            str(PG_DUMP),
            "--schema-only",
            "-h",
            str(server.host),
            "-p",
            str(server.port),
            "-U",
            str(server.user),
            "-d",
            dbname,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        line
        for line in out.splitlines()
        if line.strip()
        and not line.startswith("--")
        and not line.startswith(("\\restrict", "\\unrestrict"))
    ]


def same_schema(expected: list[str], actual: list[str], what: str) -> None:
    diff = "\n".join(list(difflib.unified_diff(expected, actual, "fresh", what, lineterm=""))[:200])
    assert actual == expected, f"{what} differs from a fresh install:\n{diff}"


def revisions(url: str) -> list[str]:
    """Every alembic revision, base first."""
    script = ScriptDirectory.from_config(mfdb._alembic_config(url))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def fabric_roles(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as c:
        return {
            r[0] for r in c.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'fabric\\_%'")
        }


def fabric_schemas(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as c:
        return {
            r[0] for r in c.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'fabric%'")
        }


# The first release that shipped the schema (commit ac78d82: migrations 0001-0002 and the
# sql/ and rls/ of that day), kept as a committed archive so the upgrade test needs no git
# history. Regenerate: git archive --format=tar ac78d82 migrations sql rls | gzip -n -9.
FIRST_RELEASE = ROOT / "tests" / "fixtures" / "release-ac78d82.tar.gz"


def install_release(url: str, archive: Path) -> None:
    """migrate() as that release did it: its migrations, then its sql/ and rls/ replayed."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(tmp, filter="data")
        from alembic import command

        cfg = mfdb._alembic_config(mfdb.migrator_url(url))
        cfg.set_main_option("script_location", str(Path(tmp) / "migrations"))
        mfdb.bootstrap(url)
        command.upgrade(cfg, "head")
        files = [f for d in ("sql", "rls") for f in sorted((Path(tmp) / d).glob("*.sql"))]
        with psycopg.connect(mfdb.migrator_url(url)) as conn:
            for path in files:
                conn.execute("SET LOCAL ROLE fabric_owner")
                conn.execute(path.read_text())  # type: ignore[arg-type]


def embedder(url: str) -> tuple[str, str]:
    """The deployment's embedder and the column's default."""
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT s.embedder, pg_get_expr(d.adbin, d.adrelid) FROM fabric.deployment_settings s,"
            " pg_attrdef d JOIN pg_attribute a ON (a.attrelid, a.attnum) = (d.adrelid, d.adnum)"
            " WHERE d.adrelid = 'fabric.deployment_settings'::regclass AND a.attname = 'embedder'"
        ).fetchone()
    assert row is not None
    return row[0], row[1]


# --- the installs -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def installs(server: Any) -> Iterator[dict[str, Any]]:
    """fresh: migrate on an empty database (then again, then downgrade and migrate);
    stepwise: every revision in turn, then the replay."""
    tag = f"{os.getpid()}"
    names = {k: f"mf_mig_{tag}_{k}" for k in ("fresh", "stepwise")}
    facts: dict[str, Any] = {}
    try:
        url = create_database(server, names["fresh"])
        mfdb.migrate(url)
        facts["fresh"] = dump(server, names["fresh"])
        with psycopg.connect(url) as conn:
            facts["fresh_tables_analyzed"] = conn.execute(
                "SELECT relname, last_analyze IS NOT NULL FROM pg_stat_user_tables "
                "WHERE schemaname = 'fabric' ORDER BY 1"
            ).fetchall()
        facts["fresh_embedder"] = embedder(url)
        mfdb.migrate(url)
        facts["fresh_twice"] = dump(server, names["fresh"])
        roles_before = fabric_roles(url)
        mfdb.downgrade(url, "base")
        facts["roles_before_downgrade"] = roles_before
        facts["roles_after_downgrade"] = fabric_roles(url)
        facts["schemas_after_downgrade"] = fabric_schemas(url)
        mfdb.migrate(url)
        facts["fresh_after_downgrade"] = dump(server, names["fresh"])

        url = create_database(server, names["stepwise"])
        mfdb.bootstrap(url)
        steps = revisions(url)
        facts["revisions"] = steps
        for revision in steps:
            mfdb.upgrade(url, revision)
        # sql/ and rls/ are written against head: they cannot replay at an older revision.
        mfdb.replay(url)
        mfdb.upgrade(url, "head")
        mfdb.replay(url)
        mfdb.install_ddl_guard(url)
        facts["stepwise"] = dump(server, names["stepwise"])
        facts["stepwise_embedder"] = embedder(url)
        yield facts
    finally:
        for name in names.values():
            drop_database(server, name)


@pytest.fixture(scope="module")
def released(server: Any) -> Iterator[list[str]]:
    """The first release installed with its own migrate, then migrated to this tree."""
    name = f"mf_mig_{os.getpid()}_released"
    try:
        url = create_database(server, name)
        install_release(url, FIRST_RELEASE)
        mfdb.migrate(url)
        yield dump(server, name)
    finally:
        drop_database(server, name)


# --- the rules ------------------------------------------------------------------------------


def test_a_fresh_install_has_the_fabric(installs: dict[str, Any]) -> None:
    fresh = "\n".join(installs["fresh"])
    for needle in (
        "CREATE TABLE fabric.memory_records",
        "CREATE FUNCTION fabric_api.propose",
        "ALTER TABLE ONLY fabric.memory_records FORCE ROW LEVEL SECURITY",
        "OWNER TO fabric_owner",
        "GRANT ALL ON FUNCTION fabric_api.propose(",
    ):
        assert needle in fresh, needle
    assert len(installs["revisions"]) >= 2


def test_an_upgraded_install_dumps_like_a_fresh_one(installs: dict[str, Any]) -> None:
    same_schema(installs["fresh"], installs["stepwise"], "revision-by-revision upgrade")


def test_an_install_of_the_first_release_upgrades_to_a_fresh_schema(
    installs: dict[str, Any], released: list[str]
) -> None:
    same_schema(installs["fresh"], released, "first release, then migrate")


def test_a_fresh_install_has_statistics_for_every_table(installs: dict[str, Any]) -> None:
    """migrate ANALYZEs the tables it created: a plan made on a guessed size would stay in
    every session's cache until autovacuum's first ANALYZE."""
    analyzed = installs["fresh_tables_analyzed"]
    assert len(analyzed) > 20, analyzed
    assert [name for name, done in analyzed if not done] == []


def test_migrate_is_idempotent(installs: dict[str, Any]) -> None:
    same_schema(installs["fresh"], installs["fresh_twice"], "second migrate")


def test_downgrade_to_base_then_migrate_restores_the_schema(installs: dict[str, Any]) -> None:
    assert installs["schemas_after_downgrade"] == {"fabric_migrations"}  # alembic's own
    same_schema(installs["fresh"], installs["fresh_after_downgrade"], "downgrade, then migrate")


def test_roles_survive_a_downgrade(installs: dict[str, Any]) -> None:
    assert installs["roles_before_downgrade"] >= FABRIC_ROLES
    assert installs["roles_after_downgrade"] == installs["roles_before_downgrade"]


# --- 0021: the stored search length, backfilled ---------------------------------------------

# Records of a database before 0021 (the column is absent): the superuser's bulk shortcut,
# enough of them for the backfill to take two batches of 10,000.
BEFORE_0021 = """
INSERT INTO fabric.memory_records (tenant_id, memory_id, tier, visibility, subject_id,
  content, content_hash, source_event_id, formed_by, formation_method, confidence,
  valid_from, consolidation_state, retention_class, search_tsv)
SELECT 'globex', gen_random_uuid(), 'episodic', 'subject', 'user-' || (i % 7),
       jsonb_build_object('text', repeat('word' || (i % 13) || ' ', 1 + i % 5) || 'note ' || i),
       'sha256:' || encode(sha256(convert_to('globex' || i, 'UTF8')), 'hex'), 'evt-' || i,
       'os-agt-010', 'extraction', 0.5, now(), 'raw', 'durable',
       fabric._search_text(jsonb_build_object('text',
         repeat('word' || (i % 13) || ' ', 1 + i % 5) || 'note ' || i))
FROM generate_series(1, 12000) i
"""


def on_minilm(fabric: Any) -> None:
    """The clone's deployment on MiniLM, as every deployment was before 0.14: a downgrade
    below 0046 refuses one on e5 (the template is a new database, so e5 since 0056)."""
    with fabric.su() as su:
        su.execute("UPDATE fabric.deployment_settings SET embedder = 'minilm'")


def bridge(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgname = '_999_search_length_0021'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_0021_backfills_every_records_search_length(fabric: Any) -> None:
    run = fabric.open_run()
    formed = [fabric.form(run, t) for t in ("the invoices in EUR", "parcel parcel parcel")]
    mfdb.bootstrap(fabric.url)  # a clone lacks the migration role's grant on the database
    on_minilm(fabric)
    mfdb.downgrade(fabric.url, "0020_projection_feeds")
    with fabric.su() as su:
        assert not su.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = 'fabric.memory_records'::regclass"
            " AND attname = 'search_length' AND NOT attisdropped"
        ).fetchone()
        su.execute("SET session_replication_role = replica")
        su.execute(BEFORE_0021)
        su.execute("UPDATE fabric.memory_records SET search_tsv = NULL WHERE memory_id = %s",
                   (formed[1],))  # fmt: skip
    mfdb.upgrade(fabric.url)
    assert bridge(fabric.url) == 1  # until the replay, the length is written by the bridge
    mfdb.migrate(fabric.url)
    assert bridge(fabric.url) == 0
    with fabric.su() as su:
        total, wrong = su.execute(
            "SELECT count(*), count(*) FILTER (WHERE search_length IS DISTINCT FROM"
            " fabric._search_length(search_tsv)) FROM fabric.memory_records"
        ).fetchone()  # type: ignore[misc]
        not_null, constraints = su.execute(
            "SELECT a.attnotnull, (SELECT count(*) FROM pg_constraint c"
            "  WHERE c.conrelid = a.attrelid AND c.conname LIKE '%search_length%')"
            " FROM pg_attribute a WHERE a.attrelid = 'fabric.memory_records'::regclass"
            " AND a.attname = 'search_length'"
        ).fetchone()  # type: ignore[misc]
        lengths = dict(
            su.execute(
                "SELECT memory_id::text, search_length FROM fabric.memory_records"
                " WHERE memory_id = ANY(%s)",
                (formed,),
            ).fetchall()
        )
    assert total == 12002 and wrong == 0
    assert not_null and constraints == 0
    assert lengths == {formed[0]: 2, formed[1]: 0}


def test_0029_gives_every_subject_with_records_a_key_and_notes_both_rebuilds(fabric: Any) -> None:
    """Records formed before subjects got keys with their runs: 0029 makes the missing keys
    (so the records are projected under pseudonyms) and notes both projections as
    rebuilding, which `memfabric serve` then runs (the old projections hold ids in clear)."""
    memory_id = fabric.form(fabric.open_run(subject="user-7070"), "invoices in EUR")
    mfdb.bootstrap(fabric.url)  # a clone lacks the migration role's grant on the database
    on_minilm(fabric)
    mfdb.downgrade(fabric.url, "0026_projection_rebuild")
    with fabric.su() as su:
        su.execute("DELETE FROM fabric.subject_keys")  # as a subject that never recalled
        su.execute("UPDATE fabric.projection_cursors SET rebuild_started_at = NULL")
    mfdb.upgrade(fabric.url)
    with fabric.su() as su:
        keys = su.execute("SELECT subject_id, subject_ref, key FROM fabric.subject_keys").fetchall()
        assert [k[0] for k in keys] == ["user-7070"]
        (ref,) = su.execute(  # type: ignore[misc]
            "SELECT fabric._pseudonym(%s, 'subject', 'user-7070')", (keys[0][2],)
        ).fetchone()
        notes = dict(
            su.execute(
                "SELECT projection, rebuild_started_at IS NOT NULL FROM fabric.projection_cursors"
                " WHERE projection IN ('qdrant', 'graph')"
            ).fetchall()
        )
    assert keys[0][1] == ref
    assert notes == {"qdrant": True, "graph": True}
    mfdb.migrate(fabric.url)
    projector = fabric.connect("mf_projector")
    row = projector.execute(
        "SELECT scope_key FROM fabric_api.projection_records_v2(%s::uuid[])", ([memory_id],)
    ).fetchone()
    assert row == (f"subject:{ref}",)


# --- 0056: e5 for a new deployment; one in use keeps its embedder -------------------------


def test_0056_a_new_database_starts_with_e5(installs: dict[str, Any]) -> None:
    """Migrated from nothing, at once or revision by revision: e5, the column's default."""
    assert installs["fresh_embedder"] == ("e5", "'e5'::text")
    assert installs["stepwise_embedder"] == ("e5", "'e5'::text")


def test_0056_a_deployment_in_use_keeps_minilm_explicitly(fabric: Any) -> None:
    """A database with tenants and events at 0055, on 0.13's default (minilm), keeps minilm
    through the upgrade (its vectors and collections are MiniLM's: a change of model is the
    operator's, with a rebuild); only the column's default moves to e5. Downgraded, the
    default is minilm again and the setting is left as it is."""
    fabric.form(fabric.open_run(), "embedded under MiniLM")
    mfdb.bootstrap(fabric.url)  # a clone lacks the migration role's grant on the database
    mfdb.downgrade(fabric.url, "0055_citus_two_phase")
    assert embedder(fabric.url) == ("e5", "'minilm'::text")  # the template was new: e5
    with fabric.su() as su:
        su.execute("UPDATE fabric.deployment_settings SET embedder = 'minilm'")
    mfdb.upgrade(fabric.url)
    assert embedder(fabric.url) == ("minilm", "'e5'::text")
    with fabric.su() as su:
        (found,) = su.execute("SELECT fabric_api.deployment_embedder()").fetchone()  # type: ignore[misc]
    assert found["embedder"] == "minilm"
