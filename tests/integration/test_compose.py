"""compose.yaml and the database image, checked without Docker (no engine runs here): the
services and what they run, pinned images, healthchecks, volumes, the order of start, the
secrets documented, the database image's extensions and content-safe logging; and the SQL
the deployment runs (the migration role's first-start script, provision.sql) run for real
against the test server."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql

import memfabric
from conftest import Fabric
from memfabric import db as mfdb

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
PG_DOCKERFILE = ROOT / "docker" / "postgres" / "Dockerfile"
APP_DOCKERFILE = ROOT / "docker" / "memfabric" / "Dockerfile"
INITDB = ROOT / "docker" / "postgres" / "initdb" / "10-fabric-migrator.sh"
PROVISION = ROOT / "docker" / "provision.sql"
ENV_EXAMPLE = ROOT / "docs" / "compose.env.example"
OPERATIONS = ROOT / "docs" / "operations.md"
PSQL = ROOT / ".local" / "pg17" / "bin" / "psql"

STORES = {"postgres", "qdrant", "neo4j", "redis"}
ONE_SHOT = {"migrate", "provision"}
MEMFABRIC = {"serve", "committer", "decay", "trace"}
PROVISIONED_LOGINS = {
    "os_agt_010": "fabric_committer",
    "os_agt_011": "fabric_consolidator",
    "memfabric_projector": "fabric_projector",
    "memfabric_maintainer": "fabric_maintainer",
    "memfabric_tracer": "fabric_tracer",
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]  # type: ignore[no-any-return]


def test_the_services_are_the_deployment(compose: dict[str, Any]) -> None:
    assert set(services(compose)) == STORES | ONE_SHOT | MEMFABRIC


def test_images_are_pinned_and_the_stores_are_the_supported_ones(compose: dict[str, Any]) -> None:
    s = services(compose)
    for name, service in s.items():
        image = service.get("image", "")
        assert ":" in image and not image.endswith(":latest"), (name, image)
    assert s["postgres"]["build"] == "docker/postgres"
    assert s["postgres"]["image"].endswith(":17")
    assert re.fullmatch(r"neo4j:5\.\d+.*", s["neo4j"]["image"]), s["neo4j"]["image"]
    assert s["qdrant"]["image"].startswith("qdrant/qdrant:v1.")
    assert s["redis"]["image"].startswith("redis:7")
    for name in MEMFABRIC | {"migrate"}:
        assert s[name]["build"]["dockerfile"] == "docker/memfabric/Dockerfile", name
        # the image is tagged with the version it installs (bumped with it)
        assert s[name]["image"] == f"memfabric:{memfabric.__version__}", name
    dockerfile = (ROOT / "docker" / "memfabric" / "Dockerfile").read_text()
    assert f"-t memfabric:{memfabric.__version__} ." in dockerfile


def test_long_running_services_have_healthchecks_and_restart(compose: dict[str, Any]) -> None:
    s = services(compose)
    for name in STORES | {"serve"}:
        check = s[name].get("healthcheck", {})
        assert check.get("test") and check["test"][0] in ("CMD", "CMD-SHELL"), name
    for name in STORES | MEMFABRIC:
        assert s[name]["restart"] == "unless-stopped", name
    for name in ONE_SHOT:
        assert s[name]["restart"] == "no", name


def test_state_lives_in_named_volumes_and_redis_keeps_nothing(compose: dict[str, Any]) -> None:
    s = services(compose)
    declared = set(compose["volumes"])
    used = {
        v.split(":")[0]
        for service in s.values()
        for v in service.get("volumes", [])
        if not v.startswith(("./", "/"))
    }
    assert used == declared
    mounts = {name: [v.split(":")[1] for v in s[name].get("volumes", [])] for name in STORES}
    assert mounts["postgres"] == ["/var/lib/postgresql/data"]
    assert mounts["qdrant"] == ["/qdrant/storage"]
    assert mounts["neo4j"] == ["/data"]
    assert mounts["redis"] == []
    assert s["redis"]["command"][3:5] == ["--save", ""]


def test_services_start_in_order(compose: dict[str, Any]) -> None:
    s = services(compose)
    assert s["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert s["provision"]["depends_on"] == {
        "migrate": {"condition": "service_completed_successfully"}
    }
    for name in MEMFABRIC:
        after = s[name]["depends_on"]
        assert after["provision"] == {"condition": "service_completed_successfully"}, name
        for store in STORES - {"postgres"}:
            assert after[store] == {"condition": "service_healthy"}, (name, store)
    assert s["migrate"]["command"] == ["db", "migrate"]
    assert s["serve"]["command"][0] == "serve"
    assert s["committer"]["command"] == ["worker", "commit"]
    assert s["decay"]["command"] == ["worker", "decay"]


def test_every_memfabric_variable_is_one_it_reads(compose: dict[str, Any]) -> None:
    env = services(compose)["serve"]["environment"]
    documented = OPERATIONS.read_text()
    for name in env:
        assert f"`{name}`" in documented, name


def test_only_migrate_holds_the_superuser_and_migration_passwords(compose: dict[str, Any]) -> None:
    s = services(compose)
    migrate = s["migrate"]["environment"]
    assert "${POSTGRES_PASSWORD:?}" in migrate["DATABASE_URL"]
    assert "${MEMFABRIC_MIGRATOR_PASSWORD:?}" in migrate["MEMFABRIC_MIGRATOR_URL"]
    for name in MEMFABRIC:
        values = " ".join(str(v) for v in s[name]["environment"].values())
        assert "POSTGRES_PASSWORD" not in values and "MIGRATOR" not in values, name
        for identity in ("COMMITTER", "CONSOLIDATOR", "PROJECTOR", "MAINTAINER", "TRACER"):
            assert f"MEMFABRIC_{identity}_URL" in s[name]["environment"], (name, identity)


def test_every_secret_is_in_the_example_env_file() -> None:
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)[:?}-]", COMPOSE.read_text()))
    example = {
        line.split("=")[0]
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert referenced == example


def test_the_database_image_has_the_extensions_and_the_safe_log_settings() -> None:
    dockerfile = PG_DOCKERFILE.read_text()
    assert re.search(r"^FROM postgres:17\b", dockerfile, re.M)
    assert "postgresql-17-pgvector" in dockerfile  # vector; the other three are contrib
    assert set(mfdb.EXTENSIONS) == {"vector", "btree_gist", "btree_gin", "pgcrypto"}
    settings = dict(re.findall(r'"-c", "([a-z_]+)=([^"]*)"', dockerfile))
    assert settings == dict(mfdb.SERVER_LOG_SETTINGS)
    assert "COPY initdb/ /docker-entrypoint-initdb.d/" in dockerfile


def test_the_app_image_installs_the_wheel() -> None:
    dockerfile = APP_DOCKERFILE.read_text()
    for copied in ("py", "sql", "rls", "migrations"):
        assert f"COPY {copied} ./{copied}" in dockerfile, copied
    assert "pip wheel --no-deps" in dockerfile
    assert 'ENTRYPOINT ["memfabric"]' in dockerfile


@pytest.fixture
def fresh(server: Any) -> Iterator[Fabric]:
    """A newly migrated database with no agents (the test world registers os-agt-010)."""
    name = f"mf_compose_{os.getpid()}"
    admin = psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname="postgres"
    )
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(drop)
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    f = Fabric(server, name)
    mfdb.migrate(f.url)
    yield f
    f.close()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(drop)


def _psql(fabric: Fabric, *args: str, env: dict[str, str] | None = None) -> str:
    server = fabric.server
    done = subprocess.run(
        [
            str(PSQL),
            "-X",
            f"--host={server.host}",
            f"--port={server.port}",
            f"--username={server.user}",
            f"--dbname={fabric.dbname}",
            "--set=ON_ERROR_STOP=1",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_first_start_script_runs(fabric: Fabric) -> None:
    """On the test server fabric_migrator exists already: the script must leave it alone."""
    server = fabric.server
    done = subprocess.run(
        ["sh", str(INITDB)],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "PATH": f"{PSQL.parent}:{os.environ['PATH']}",
            "PGHOST": str(server.host),
            "PGPORT": str(server.port),
            "POSTGRES_USER": str(server.user),
            "POSTGRES_DB": fabric.dbname,
            "MEMFABRIC_MIGRATOR_PASSWORD": "not-used",
        },
    )
    assert done.returncode == 0, done.stderr


def test_provision_makes_each_service_login_a_member_of_its_role(fresh: Fabric) -> None:
    fabric = fresh
    passwords = [f"--set={p}_password=pw-{p}" for p in ("committer", "consolidator")]
    passwords += [f"--set={p}_password=pw-{p}" for p in ("projector", "maintainer", "tracer")]
    for _ in range(2):  # idempotent
        _psql(fabric, *passwords, f"--file={PROVISION}")
    su = fabric.su()
    for login, group in PROVISIONED_LOGINS.items():
        row = su.execute(
            "SELECT pg_has_role(%s, %s, 'MEMBER'), rolcanlogin, rolpassword IS NOT NULL "
            "FROM pg_authid WHERE rolname = %s",
            (login, group, login),
        ).fetchone()
        assert row == (True, True, True), login
    agents = dict(
        su.execute(
            "SELECT agent_id, login::text FROM fabric.agents WHERE login = ANY (%s)",
            (["os_agt_010", "os_agt_011"],),
        ).fetchall()
    )
    assert agents == {"os-agt-010": "os_agt_010", "os-agt-011": "os_agt_011"}
    with psycopg.connect(psycopg.conninfo.make_conninfo(fabric.url, user="os_agt_010")) as c:
        assert mfdb.require_known_revision(c)
