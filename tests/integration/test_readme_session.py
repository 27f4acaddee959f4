"""The psql session of docs/sql.md runs as written, on a freshly migrated database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric, episode
from memfabric import db as mfdb

ROOT = Path(__file__).resolve().parents[2]
PSQL = ROOT / ".local" / "pg17" / "bin" / "psql"
SESSION = ROOT / "docs" / "session.sql"
ROLES = ("readme_admin", "readme_orchestrator", "readme_committer", "readme_agent")


def test_sql_doc_shows_the_session_file_verbatim() -> None:
    page = (ROOT / "docs" / "sql.md").read_text()
    body = "\n".join(SESSION.read_text().splitlines()[3:])
    assert body in page


def test_readme_session_runs_on_a_fresh_database(server: Any) -> None:
    admin = psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname="postgres"
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS mf_readme WITH (FORCE)")
        conn.execute("CREATE DATABASE mf_readme")
        for role in ROLES:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    url = psycopg.conninfo.make_conninfo(admin, dbname="mf_readme")
    try:
        mfdb.migrate(url)
        out = subprocess.run(
            [str(PSQL), "-X", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(SESSION)],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        assert '"status": "rejected"' in out.stdout
        assert '"consolidation_state": "raw"' in out.stdout
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*), min(formed_by) FROM fabric.memory_records"
            ).fetchone()
        assert row == (1, "readme-os-agt-010")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS mf_readme WITH (FORCE)")
            for role in ROLES:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


DEMO_ROLES = (
    "mf_demo_admin",
    "mf_demo_orchestrator",
    "mf_demo_committer",
    "mf_demo_policy",
    "mf_demo_auditor",
    "mf_demo_agent",
)
OWN_TENANTS = ("acme-demo", "acme-readme")
OWN_AGENTS = ("demo-agt-003", "demo-os-agt-010", "readme-agt-003", "readme-os-agt-010")
EVERYTHING_ELSE = {
    table: f"SELECT count(*), md5(coalesce(string_agg(to_jsonb(x)::text, '' "  # noqa: S608
    f"ORDER BY to_jsonb(x)::text), '')) FROM fabric.{table} x WHERE {where}"
    for table, where in {
        "tenants": "tenant_id <> ALL (%(tenants)s)",
        "agents": "agent_id <> ALL (%(agents)s)",
        "tenant_agents": "tenant_id <> ALL (%(tenants)s)",
        "tenant_agent_tools": "tenant_id <> ALL (%(tenants)s)",
        "runs": "tenant_id <> ALL (%(tenants)s)",
        "proposals": "tenant_id <> ALL (%(tenants)s)",
        "memory_records": "tenant_id <> ALL (%(tenants)s)",
        "memory_lineage": "tenant_id <> ALL (%(tenants)s)",
        "approvals": "tenant_id <> ALL (%(tenants)s)",
        "instance_config": "tenant_id <> ALL (%(tenants)s)",
        "events": "tenant_id <> ALL (%(tenants)s) AND NOT (tenant_id = 'platform' "
        "AND payload->>'agent_id' = ANY (%(agents)s))",
    }.items()
}


def everything_else(url: str) -> dict[str, Any]:
    params = {"tenants": list(OWN_TENANTS), "agents": list(OWN_AGENTS)}
    with psycopg.connect(url) as conn:
        return {t: conn.execute(q, params).fetchone() for t, q in EVERYTHING_ELSE.items()}  # type: ignore[arg-type]


@pytest.mark.slow
def test_demo_and_session_run_twice_on_a_shared_database_and_touch_nothing_else(
    fabric: Fabric,
) -> None:
    """The template's tenants acme and globex stand for a database in use: their agents
    (com-agt-003, os-agt-010, …) are registered and a proposal waits in each."""
    waiting = [
        fabric.propose("mf_agent_b", episode("waiting in acme"), fabric.open_run("com-agt-004")),
        fabric.propose(
            "mf_agent_b",
            episode("waiting in globex", scope={"tenant_id": "globex", "visibility": "subject"}),
            fabric.open_run("com-agt-004", "globex"),
        ),
    ]
    assert [w["status"] for w in waiting] == ["validated", "validated"]
    before = everything_else(fabric.url)
    env = {**os.environ, "DATABASE_URL": fabric.url}
    try:
        for attempt in range(2):
            demo = subprocess.run(
                [sys.executable, "-m", "memfabric.cli", "demo"],
                env=env,
                capture_output=True,
                text=True,
                cwd=ROOT,
                check=False,
            )
            assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
            assert '"derived_from": [\n' in demo.stdout and '"derived_from": []' not in demo.stdout
            for audited in ("lineage: ", "erasure receipt: destroyed [", "recall audit: "):
                assert audited in demo.stdout, demo.stdout[-3000:]  # step 11, the auditor
            session = subprocess.run(
                [str(PSQL), "-X", "-v", "ON_ERROR_STOP=1", "-d", fabric.url, "-f", str(SESSION)],
                capture_output=True,
                text=True,
                check=False,
                cwd=ROOT,
            )
            assert session.returncode == 0, session.stderr
            if attempt == 0:
                assert '"consolidation_state": "raw"' in session.stdout
            else:  # the same event and content again: propose answers the first proposal
                assert "committed by an earlier run of this file" in session.stdout
                assert '"consolidation_state": "raw"' not in session.stdout
        assert everything_else(fabric.url) == before
        with psycopg.connect(fabric.url) as conn:
            formed = conn.execute(
                "SELECT tenant_id, formed_by, count(*) FROM fabric.memory_records "
                "WHERE formation_method <> 'consolidation' GROUP BY 1, 2 ORDER BY 1"
            ).fetchall()
        assert [(t, f) for t, f, _ in formed] == [
            ("acme-demo", "demo-os-agt-010"),
            ("acme-readme", "readme-os-agt-010"),
        ]
        assert formed[1][2] == 1
    finally:
        with psycopg.connect(fabric.url, autocommit=True) as conn:
            for role in (*ROLES, *DEMO_ROLES):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
