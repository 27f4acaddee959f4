"""Test fixtures: a real PostgreSQL 17 (pytest-postgresql through the unshare wrapper), a
template database migrated once per session, and a fresh clone of it per test.

The template holds a small world: tenants acme and globex, an admin, an orchestrator, a
committer registered as os-agt-010, and agents with their own logins. Logins are
cluster-wide, so they are created once per session.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from pytest_postgresql import factories

from memfabric import db as mfdb
from memfabric.call import Cast, fabric_call
from memfabric.errors import FabricError

ROOT = Path(__file__).resolve().parents[1]
PG_CTL = ROOT / ".local" / "pg17" / "wrap" / "pg_ctl"
TEMPLATE = "mf_template"

postgresql_proc = factories.postgresql_proc(
    executable=str(PG_CTL),
    port=None,
    postgres_options="-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
    "-c max_connections=200 -c log_min_messages=warning",
)

PROFILE_WIDE = {
    "propose_scope": {
        "tiers": ["episodic", "semantic", "procedural", "profile", "relational"],
        "visibility": ["session", "agent", "subject", "tenant"],
    },
    "recall_scope": {
        "tiers": ["episodic", "semantic", "procedural", "profile"],
        "visibility": ["session", "agent", "subject", "tenant"],
    },
}
PROFILE_EPISODIC_ONLY = {"propose_scope": {"tiers": ["episodic"], "visibility": ["subject"]}}
PROFILE_RECALL_SEMANTIC = {
    "recall_scope": {"tiers": ["semantic", "profile"], "visibility": ["subject", "tenant"]},
}
MEMORY_TOOLS = ["tool:memory-propose", "tool:memory-recall"]

# login -> (agent_id, group roles, memory profile, tools_allowed, tenants enabled)
LOGINS: dict[str, tuple[str | None, list[str], dict[str, Any], list[str], list[str]]] = {
    "mf_admin": (None, ["fabric_admin"], {}, [], []),
    "mf_orchestrator": (None, ["fabric_orchestrator"], {}, [], []),
    "mf_committer": ("os-agt-010", ["fabric_committer"], {}, [], ["acme", "globex"]),
    "mf_committer2": ("os-agt-010b", ["fabric_committer"], {}, [], ["acme", "globex"]),
    "mf_auditor": (None, ["fabric_auditor"], {}, [], []),
    "mf_policy": ("os-agt-002", ["fabric_policy"], {}, [], []),
    "mf_projector": (None, ["fabric_projector"], {}, [], []),
    "mf_maintainer": (None, ["fabric_maintainer"], {}, [], []),
    "mf_tracer": (None, ["fabric_tracer"], {}, [], []),
    "mf_service": (None, ["fabric_checkpointer"], {}, [], []),
    "mf_service_b": (None, ["fabric_checkpointer"], {}, [], []),
    "mf_gateway": (None, ["fabric_mcp_gateway"], {}, [], []),
    "mf_consolidator": ("os-agt-011", ["fabric_consolidator"], {}, [], []),
    "mf_agent_a": ("com-agt-003", [], PROFILE_WIDE, MEMORY_TOOLS, ["acme"]),
    "mf_agent_b": ("com-agt-004", [], PROFILE_EPISODIC_ONLY, MEMORY_TOOLS, ["acme", "globex"]),
    "mf_agent_g": ("glx-agt-001", [], PROFILE_WIDE, MEMORY_TOOLS, ["globex"]),
    "mf_agent_notools": ("com-agt-009", [], PROFILE_WIDE, [], ["acme"]),
    "mf_agent_r": ("com-agt-005", [], PROFILE_RECALL_SEMANTIC, MEMORY_TOOLS, ["acme"]),
    "mf_stranger": (None, [], {}, [], []),
}


def _admin_conninfo(proc: Any, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(
        host=proc.host, port=proc.port, user=proc.user, dbname=dbname
    )


@pytest.fixture(scope="session")
def server(postgresql_proc: Any) -> Any:
    """The running server; creates the session's logins once and sets the content-safe
    logging settings cluster-wide, as scripts/db.sh does for the local server."""
    with psycopg.connect(_admin_conninfo(postgresql_proc, "postgres"), autocommit=True) as c:
        mfdb.apply_server_log_settings(c)
        for login in LOGINS:
            if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone():
                c.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
    return postgresql_proc


@pytest.fixture(scope="session")
def template(server: Any) -> str:
    """A database migrated to head and seeded with the test world; cloned per test."""
    with psycopg.connect(_admin_conninfo(server, "postgres"), autocommit=True) as c:
        c.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE))
        )
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    url = _admin_conninfo(server, TEMPLATE)
    mfdb.migrate(url)
    with psycopg.connect(url, autocommit=True) as c:
        for login, (_, groups, *_rest) in LOGINS.items():
            for group in groups:
                c.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(login))
                )
        admin = psycopg.connect(
            psycopg.conninfo.make_conninfo(url, user="mf_admin"), autocommit=True
        )
        with admin:
            for tenant in ("acme", "globex"):
                admin.execute("SELECT fabric_api.create_tenant(%s)", (tenant,))
            for login, (agent_id, _g, profile, tools, tenants) in LOGINS.items():
                if agent_id is None:
                    continue
                admin.execute(
                    "SELECT fabric_api.register_agent(%s, %s, %s, %s)",
                    (agent_id, login, Jsonb(profile), tools),
                )
                for tenant in tenants:
                    admin.execute(
                        "SELECT fabric_api.enable_agent(%s, %s, %s)", (tenant, agent_id, tools)
                    )
    return TEMPLATE


_counter = itertools.count()


def call(conn: psycopg.Connection[Any], name: str, *args: Any) -> Any:
    """`fabric_call`, handing back the server's own error: the rule tests assert on its
    diagnostics (constraint name, hint), which the mapped exception does not carry."""
    try:
        return fabric_call(conn, name, *args)
    except FabricError as exc:
        if isinstance(exc.__cause__, psycopg.Error):
            raise exc.__cause__ from None
        raise


@dataclass
class Fabric:
    """One test's database, with a connection per identity."""

    server: Any
    dbname: str
    _conns: list[psycopg.Connection[Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return _admin_conninfo(self.server, self.dbname)

    def connect(self, login: str | None = None, autocommit: bool = True) -> psycopg.Connection[Any]:
        conninfo = (
            self.url if login is None else psycopg.conninfo.make_conninfo(self.url, user=login)
        )
        conn = psycopg.connect(conninfo, autocommit=autocommit)
        self._conns.append(conn)
        return conn

    def su(self) -> psycopg.Connection[Any]:
        return self.connect(None)

    def count(self, table: str, where: str = "true") -> int:
        """Rows in a fabric table, all tenants, read by the superuser (bypasses RLS)."""
        with psycopg.connect(self.url, autocommit=True) as c:
            q = sql.SQL("SELECT count(*) FROM fabric.{} WHERE ").format(sql.Identifier(table))
            row = c.execute(q + sql.SQL(where)).fetchone()  # type: ignore[operator]
            assert row is not None
            return int(row[0])

    def counts(self) -> dict[str, int]:
        return {
            t: self.count(t)
            for t in (
                "proposals",
                "memory_records",
                "memory_lineage",
                "memory_record_versions",
                "events",
                "runs",
            )
        }

    def open_run(
        self,
        agent_id: str = "com-agt-003",
        tenant: str = "acme",
        subject: str | None = "user-8842",
        session: str | None = "sess-1f9c",
        tools: list[str] | None = None,
        ttl: str = "1 hour",
    ) -> uuid.UUID:
        tools = MEMORY_TOOLS if tools is None else tools
        return call(  # type: ignore[no-any-return]
            self.connect("mf_orchestrator"),
            "fabric_api.open_run",
            *(tenant, agent_id, subject, session, tools, Cast(ttl, "interval")),
        )

    def propose(self, login: str, envelope: Any, run_id: uuid.UUID) -> dict[str, Any]:
        # Jsonb, not the dict rule: the hostile-envelope tests propose non-objects too.
        return call(  # type: ignore[no-any-return]
            self.connect(login), "fabric_api.propose", Jsonb(envelope), run_id
        )

    def commit(self, proposal_id: Any, login: str = "mf_committer") -> dict[str, Any]:
        return call(self.connect(login), "fabric_api.commit", proposal_id)  # type: ignore[no-any-return]

    def recall(self, login: str, request: dict[str, Any]) -> dict[str, Any]:
        return call(self.connect(login), "fabric_api.recall", Jsonb(request))  # type: ignore[no-any-return]

    def events(self, where: str = "true") -> list[dict[str, Any]]:
        with psycopg.connect(self.url, autocommit=True) as c:
            q = sql.SQL(
                "SELECT to_jsonb(e) FROM fabric.events e WHERE {} ORDER BY xid, occurred_at"
            )
            return [r[0] for r in c.execute(q.format(sql.SQL(where))).fetchall()]  # type: ignore[arg-type]

    def close(self) -> None:
        for conn in self._conns:
            conn.close()


@pytest.fixture
def fabric(server: Any, template: str) -> Iterator[Fabric]:
    """A fresh clone of the template database for one test."""
    name = f"mf_test_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(_admin_conninfo(server, "postgres"), autocommit=True) as c:
        c.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
        # ALTER DATABASE settings live in pg_db_role_setting and are not copied by
        # CREATE DATABASE ... TEMPLATE: re-apply what bootstrap sets (R-LOG-1).
        for setting, value in mfdb.DATABASE_SETTINGS:
            c.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                )
            )
    f = Fabric(server, name)
    yield f
    f.close()
    with psycopg.connect(_admin_conninfo(server, "postgres"), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


_source_events = itertools.count(1)


def episode(text: str = "asked for invoices in EUR", **overrides: Any) -> dict[str, Any]:
    """A valid episodic envelope for tenant acme, subject visibility. Each call has its own
    source event (evt-7b21-<n>): propose is idempotent on source event and content, so two
    calls are two proposals."""
    env: dict[str, Any] = {
        "tier": "episodic",
        "scope": {"tenant_id": "acme", "visibility": "subject"},
        "content": {"text": text},
        "provenance": {
            "source_event_id": f"evt-7b21-{next(_source_events)}",
            "correlation_id": "corr-9d4a",
            "causation_id": "evt-7b1f",
            "formation_method": "extraction",
        },
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        "retention_class": "durable",
    }
    for key, value in overrides.items():
        env[key] = value
    return env


@pytest.fixture
def db_conn(fabric: Fabric) -> psycopg.Connection[Any]:
    """A superuser connection to a fresh migrated database."""
    return fabric.su()


# The content-hash tests name their fixture `db`.
@pytest.fixture
def db(fabric: Fabric) -> psycopg.Connection[Any]:
    return fabric.su()


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
