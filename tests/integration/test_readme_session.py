"""The README's psql session runs as written, on a freshly migrated database."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from memfabric import db as mfdb

ROOT = Path(__file__).resolve().parents[2]
PSQL = ROOT / ".local" / "pg17" / "bin" / "psql"
SESSION = ROOT / "docs" / "session.sql"
ROLES = ("readme_admin", "readme_orchestrator", "readme_committer", "readme_agent")


def test_readme_shows_the_session_file_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    body = "\n".join(SESSION.read_text().splitlines()[3:])
    assert body in readme


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
        assert row == (1, "os-agt-010")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS mf_readme WITH (FORCE)")
            for role in ROLES:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
