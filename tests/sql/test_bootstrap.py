"""Bootstrap without a superuser (a managed service): migrate goes on with a warning when
the migration role and the four extensions exist already, and stops before writing anything,
naming what is missing, when they do not. The required extensions are the four the fabric
uses; plpython3u is not one of them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric
from memfabric import db as mfdb


def test_the_required_extensions_are_the_four_the_fabric_uses(fabric: Fabric) -> None:
    assert set(mfdb.EXTENSIONS) == {"vector", "btree_gist", "btree_gin", "pgcrypto"}
    installed = {r[0] for r in fabric.session().execute("SELECT extname FROM pg_extension")}
    assert "plpython3u" not in installed
    languages = fabric.session().execute(
        "SELECT DISTINCT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname LIKE 'fabric%'"
    )
    assert {r[0] for r in languages} <= {"sql", "plpgsql", "c", "internal"}


@pytest.fixture
def empty(server: Any) -> Iterator[str]:
    name = f"mf_boot_{os.getpid()}"
    admin = psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname="postgres"
    )
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(drop)
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield psycopg.conninfo.make_conninfo(admin, dbname=name)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(drop)


def test_without_a_superuser_an_unbootstrapped_database_is_refused(empty: str) -> None:
    with pytest.raises(SystemExit) as refused:
        mfdb.migrate(psycopg.conninfo.make_conninfo(empty, user="mf_admin"))
    message = str(refused.value)
    for ext in mfdb.EXTENSIONS:
        assert f"the extension {ext}" in message
    assert "superuser" in message and "docs/operations.md" in message
    with psycopg.connect(empty, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pg_extension").fetchone() == (1,)  # plpgsql
        schemas = c.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'fabric%'")
        assert schemas.fetchone() == (0,)


def test_without_a_superuser_a_bootstrapped_database_migrates_with_warnings(
    fabric: Fabric,
) -> None:
    as_admin = psycopg.conninfo.make_conninfo(fabric.url, user="mf_admin")
    # a clone does not copy the database's grants: the bootstrap is not complete here
    with pytest.raises(SystemExit, match="CONNECT and CREATE on this database for fabric_migrator"):
        mfdb.migrate(as_admin)
    fabric.session().execute(
        sql.SQL("GRANT CONNECT, CREATE ON DATABASE {} TO fabric_migrator").format(
            sql.Identifier(fabric.dbname)
        )
    )
    warnings: list[str] = []
    mfdb.migrate(as_admin, warn=warnings.append)
    assert any("bootstrap skipped" in w for w in warnings), warnings
    assert any("DDL guard" in w for w in warnings), warnings
    assert mfdb.require_known_revision(fabric.connect("mf_committer"))
