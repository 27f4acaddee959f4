"""docs/python.md runs as written: its python blocks, in order, in one namespace, against a
freshly migrated database (the doc's CONNINFO replaced by that database's owner URL)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from memfabric import db as mfdb

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "python.md"
PLACEHOLDER = '"postgresql://postgres@localhost:5432/memfabric"'
DATABASE = "mf_python_docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text())


def logins() -> list[str]:
    return sorted(set(re.findall(r'"(doc_[a-z]+)"', DOC.read_text())))


def test_the_doc_names_its_database_once_and_every_role() -> None:
    code = "\n".join(blocks())
    assert code.count(PLACEHOLDER) == 1
    for role in ("admin", "orchestrator", "agent", "committer", "policy", "consolidator"):
        assert f"fabric.{role}(" in code, role
    assert "fabric.auditor(" in code and "AsyncFabric" in code


def test_python_doc_runs_on_a_fresh_database(server: Any) -> None:
    owner = psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname="postgres"
    )
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    url = psycopg.conninfo.make_conninfo(owner, dbname=DATABASE)
    try:
        mfdb.migrate(url)
        namespace: dict[str, Any] = {"__name__": "python_md"}
        for number, code in enumerate(blocks()):
            code = code.replace(PLACEHOLDER, repr(url))
            exec(compile(code, f"docs/python.md block {number}", "exec"), namespace)  # noqa: S102
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE consolidation_state = 'tombstoned'), "
                "count(*) FILTER (WHERE consolidation_state = 'superseded') "
                "FROM fabric.memory_records WHERE tenant_id = 'initech'"
            ).fetchone()
        assert row == (1, 1)
    finally:
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
            )
            for login in logins():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login)))
