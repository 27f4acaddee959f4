"""`pip install memfabric` is enough to migrate a database: the wheel carries sql/, rls/ and
migrations/ as package data, and `memfabric db migrate` run from a fresh venv, outside the
checkout, brings an empty database to head.

The wheel is built from a copy of the sources (a stale build/ directory of the checkout
cannot leak into it) without build isolation (the dev venv's setuptools; no index needed).
The fresh venv gets the wheel alone (--no-deps); a .pth file appends the dev venv's
site-packages after its own for the third-party dependencies, so `memfabric` itself, and
every schema file, can only come from the wheel: the test checks both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.script import ScriptDirectory
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "LICENSE", "py", "sql", "rls", "migrations")
# Variables of the developer's shell that would redirect the CLI under test.
FOREIGN = ("DATABASE_URL", "PGPORT", "MEMFABRIC_", "PYTHON")

pytestmark = pytest.mark.slow


def _conninfo(server: Any, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname=dbname
    )


def _run(*args: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False, **kwargs
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name,
                src / name,
                symlinks=True,  # py/memfabric/_schema holds relative links to sql/, rls/, ...
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
            )
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    built = _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        dist,
        src,
    )
    assert built.returncode == 0, built.stderr
    (found,) = dist.glob("memfabric-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel; the dependencies come from the dev venv."""
    home = tmp_path_factory.mktemp("venv") / "v"
    made = _run(sys.executable, "-m", "venv", "--without-pip", home)
    assert made.returncode == 0, made.stderr
    python = home / "bin" / "python"
    purelib = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    )
    installed = _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--quiet",
        "--no-deps",
        "--no-index",
        wheel,
    )
    assert installed.returncode == 0, installed.stderr
    # After the venv's own site-packages: the wheel's memfabric wins over any other.
    (purelib / "zz_dev_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return home


@pytest.fixture
def empty_database(server: Any) -> Iterator[str]:
    name = f"mf_wheel_{os.getpid()}"
    admin = _conninfo(server, "postgres")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield _conninfo(server, name)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _schema_files(names: list[str]) -> set[str]:
    prefix = "memfabric/_schema/"
    return {n[len(prefix) :] for n in names if n.startswith(prefix) and "__pycache__" not in n}


def test_the_wheel_carries_the_whole_schema(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        shipped = _schema_files(z.namelist())
    expected = {
        str(p.relative_to(ROOT))
        for pattern in ("sql/*.sql", "rls/*.sql", "migrations/*.py", "migrations/versions/*.py")
        for p in ROOT.glob(pattern)
    }
    assert expected <= shipped, sorted(expected - shipped)
    assert len(expected) > 40


def test_memfabric_db_migrate_from_the_wheel_reaches_head(
    venv: Path, empty_database: str, tmp_path: Path
) -> None:
    python = venv / "bin" / "python"
    where = _run(
        python,
        "-c",
        "import memfabric.db as d; print(d.__file__); print(d.schema_dir('migrations'))",
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)},
    )
    assert where.returncode == 0, where.stderr
    module, migrations = where.stdout.split()
    assert Path(module).is_relative_to(venv), module  # not the checkout's py/
    assert Path(migrations).is_relative_to(venv), migrations
    assert not Path(migrations).is_symlink()

    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env["DATABASE_URL"] = empty_database
    migrated = _run(venv / "bin" / "memfabric", "db", "migrate", cwd=tmp_path, env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert "[migrate] at head" in migrated.stdout

    head = ScriptDirectory(str(ROOT / "migrations")).get_current_head()
    with psycopg.connect(empty_database, autocommit=True) as c:
        versions = c.execute("SELECT version_num FROM fabric_migrations.alembic_version")
        revision = [r[0] for r in versions]
        functions = c.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'fabric_api'"
        ).fetchone()
        extensions = {r[0] for r in c.execute("SELECT extname FROM pg_extension")}
    assert revision == [head]
    assert functions is not None and functions[0] > 20  # the replay of sql/ ran
    assert extensions == {"plpgsql", "vector", "btree_gist", "btree_gin", "pgcrypto"}


def test_installed_from_the_wheel_local_state_is_the_users_not_the_packages(
    venv: Path, tmp_path: Path
) -> None:
    """Outside a checkout the default socket, Edge shards and local Redis live in the user's
    state directory ($XDG_STATE_HOME/memfabric), never beside the installed package."""
    set_here = {"MEMFABRIC_SOCKET", "MEMFABRIC_VECTOR_DIR", "REDIS_DIR"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN) and k not in set_here}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    shown = _run(
        venv / "bin" / "python",
        "-c",
        "from memfabric.settings import Settings as S; s = S.from_env();"
        " print(s.socket); print(s.vector_dir); print(s.redis_dir)",
        cwd=tmp_path,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    socket, vectors, redis = (Path(p) for p in shown.stdout.split())
    state = tmp_path / "state" / "memfabric"
    assert socket == state / "run" / "memfabric.sock"
    assert (vectors, redis) == (state / "qdrant", state / "redis")


@pytest.mark.parametrize(
    ("command", "instead"),
    [
        (("db", "status"), "DATABASE_URL"),
        (("db", "up"), "DATABASE_URL"),
        (("db", "down"), "DATABASE_URL"),
        (("working", "up"), "REDIS_URL"),
        (("working", "down"), "REDIS_URL"),
    ],
)
def test_from_the_wheel_the_local_server_commands_say_what_to_run_instead(
    venv: Path, tmp_path: Path, command: tuple[str, ...], instead: str
) -> None:
    """The local servers are the checkout's (scripts/db.sh, scripts/redis.sh): installed
    from the wheel, their commands say in one line what to use instead, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith((*FOREIGN, "REDIS_"))}
    ran = _run(venv / "bin" / "memfabric", *command, cwd=tmp_path, env=env)
    assert ran.returncode == 1, (ran.stdout, ran.stderr)
    assert "Traceback" not in ran.stderr
    (line,) = ran.stderr.strip().splitlines()
    assert line.startswith(f"error: `memfabric {' '.join(command)}` manages the local server")
    assert f"hint: point {instead}" in line or f"hint: set {instead}" in line, line
