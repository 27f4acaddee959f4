"""Workers and `memfabric serve` refuse to start against a schema revision they do not know:
one line naming the database's revision and the package's head; an older database says to
run `memfabric db migrate`. The revision reaches the service logins through
fabric_api.schema_revision() (alembic's table belongs to the migration role); agents may
read it, a login of no fabric role may not."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest
from alembic.script import ScriptDirectory
from typer.testing import CliRunner, Result

from conftest import Fabric
from memfabric import db as mfdb
from memfabric.cli import app
from memfabric.errors import SchemaMismatch

ROOT = Path(__file__).resolve().parents[2]
HEAD = ScriptDirectory(str(ROOT / "migrations")).get_current_head()
FOREIGN = ("DATABASE_URL", "PGPORT", "MEMFABRIC_", "QDRANT_", "NEO4J_", "GRAPH_", "OTEL_")
SERVICE_LOGINS = ("mf_committer", "mf_consolidator", "mf_projector", "mf_tracer", "mf_agent_a")
UNKNOWN = "0099_from_a_newer_memfabric"
OLDER = "0013_working_tier"


def stamp(fabric: Fabric, revision: str) -> None:
    """What a database migrated by another package looks like: its alembic revision."""
    stamped = "UPDATE fabric_migrations.alembic_version SET version_num = %s"
    fabric.session().execute(stamped, (revision,))


def invoke(fabric: Fabric, tmp_path: Path, *args: str) -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(FOREIGN)}
    env |= {
        "DATABASE_URL": fabric.url,
        "MEMFABRIC_COMMITTER_LOGIN": "mf_committer",
        "MEMFABRIC_CONSOLIDATOR_LOGIN": "mf_consolidator",
        "MEMFABRIC_PROJECTOR_LOGIN": "mf_projector",
        "MEMFABRIC_TRACER_LOGIN": "mf_tracer",
        "MEMFABRIC_SOCKET": str(tmp_path / "serve.sock"),
        "MEMFABRIC_VECTOR_DIR": str(tmp_path / "qdrant"),
        "COLUMNS": "200",
    }
    return CliRunner().invoke(app, list(args), env=env)


def one_line(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


STARTS = (
    ("worker", "commit", "--once"),
    ("worker", "consolidate", "--tenant", "acme", "--once"),
    ("worker", "decay"),
    ("worker", "trace", "--once"),
    ("serve",),
)


def test_the_package_head_is_the_repositorys(fabric: Fabric) -> None:
    head, known = mfdb.package_revisions()
    assert head == HEAD
    assert OLDER in known and UNKNOWN not in known


@pytest.mark.parametrize("login", SERVICE_LOGINS)
def test_every_service_login_reads_the_revision_at_head(fabric: Fabric, login: str) -> None:
    assert mfdb.require_known_revision(fabric.connect(login)) == HEAD


def test_a_login_of_no_fabric_role_cannot_read_it(fabric: Fabric) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.session("mf_stranger").execute("SELECT fabric_api.schema_revision()")


def test_an_older_revision_names_both_and_says_to_migrate(fabric: Fabric) -> None:
    stamp(fabric, OLDER)
    with pytest.raises(SchemaMismatch) as caught:
        mfdb.require_known_revision(fabric.connect("mf_committer"))
    assert (caught.value.database_revision, caught.value.package_head) == (OLDER, HEAD)
    assert OLDER in str(caught.value) and HEAD in str(caught.value)
    assert caught.value.hint is not None and "memfabric db migrate" in caught.value.hint


def test_an_unknown_revision_names_both_and_does_not_say_migrate(fabric: Fabric) -> None:
    stamp(fabric, UNKNOWN)
    with pytest.raises(SchemaMismatch) as caught:
        mfdb.require_known_revision(fabric.connect("mf_projector"))
    assert UNKNOWN in str(caught.value) and HEAD in str(caught.value)
    assert caught.value.hint is not None and "db migrate" not in caught.value.hint


def test_a_fabric_older_than_the_revision_function_says_to_migrate(fabric: Fabric) -> None:
    fabric.session().execute("DROP FUNCTION fabric_api.schema_revision()")
    conn = fabric.connect("mf_committer", autocommit=False)
    with pytest.raises(SchemaMismatch) as caught:
        mfdb.require_known_revision(conn)
    assert caught.value.database_revision is None and HEAD in str(caught.value)
    assert caught.value.hint is not None and "memfabric db migrate" in caught.value.hint
    conn.execute("SELECT 1")  # the caller's transaction is still usable


@pytest.mark.parametrize("args", STARTS, ids=" ".join)
def test_workers_and_serve_refuse_an_older_schema(
    fabric: Fabric, tmp_path: Path, args: tuple[str, ...]
) -> None:
    stamp(fabric, OLDER)
    line = one_line(invoke(fabric, tmp_path, *args))
    assert line.startswith("error: ") and OLDER in line and HEAD in line, line
    assert "hint: run `memfabric db migrate`" in line, line


@pytest.mark.parametrize("args", STARTS, ids=" ".join)
def test_workers_and_serve_refuse_an_unknown_schema(
    fabric: Fabric, tmp_path: Path, args: tuple[str, ...]
) -> None:
    stamp(fabric, UNKNOWN)
    line = one_line(invoke(fabric, tmp_path, *args))
    assert UNKNOWN in line and HEAD in line, line
    assert "does not know" in line and "pip install -U memfabric" in line, line


def test_a_worker_starts_at_head(fabric: Fabric, tmp_path: Path) -> None:
    result = invoke(fabric, tmp_path, "worker", "commit", "--once")
    assert result.exit_code == 0, result.output
    assert "[commit] done" in result.stdout
