"""No memory content in the server log when a backend crashes.

The postmaster reports a crashed backend with "Failed process was running: <statement>",
a DETAIL logged under the server's own log_error_verbosity: the database-level `terse` that
bootstrap sets does not reach it. The install sets the content-safe settings cluster-wide
(scripts/db.sh, tests/conftest.py), and `memfabric db migrate` warns when a server lacks them.

A crash restarts every backend of the server, so these tests run on a server of their own.
The first crash, with only the database-level settings, shows that the canary does reach the
log then: its absence after the fix means something.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from pytest_postgresql import factories

from conftest import MEMORY_TOOLS, PG_CTL, PROFILE_WIDE, ROOT, episode
from memfabric import db as mfdb

crash_proc = factories.postgresql_proc(
    executable=str(PG_CTL),
    port=None,
    # synchronous_commit stays on: a crash restart loses commits whose WAL was not flushed
    postgres_options="-c fsync=off",
)

LOGINS = {
    "cr_admin": "fabric_admin",
    "cr_orchestrator": "fabric_orchestrator",
    "cr_agent": None,
}
DBNAME = "mf_crash"


class CrashServer:
    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.warnings: list[str] = []
        self.risks: list[str] = []

    def url(self, user: str | None = None, dbname: str = DBNAME) -> str:
        return psycopg.conninfo.make_conninfo(
            host=self.proc.host, port=self.proc.port, user=user or self.proc.user, dbname=dbname
        )

    def log(self) -> str:
        return Path(self.proc.logfile).read_text(encoding="utf-8", errors="replace")


@pytest.fixture(scope="module")
def crash_server(crash_proc: Any) -> Iterator[CrashServer]:
    """A server of its own with PostgreSQL's default logging, and a migrated fabric."""
    server = CrashServer(crash_proc)
    with psycopg.connect(server.url(dbname="postgres"), autocommit=True) as c:
        for login in LOGINS:
            c.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))
    mfdb.migrate(server.url(), warn=server.warnings.append)
    with psycopg.connect(server.url(), autocommit=True) as c:
        server.risks = mfdb.server_log_risks(c)
        for login, group in LOGINS.items():
            if group:
                c.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(login))
                )
    with psycopg.connect(server.url("cr_admin"), autocommit=True) as admin:
        admin.execute("SELECT fabric_api.create_tenant('acme')")
        admin.execute(
            "SELECT fabric_api.register_agent('com-agt-003', 'cr_agent', %s, %s)",
            (Jsonb(PROFILE_WIDE), MEMORY_TOOLS),
        )
        admin.execute("SELECT fabric_api.enable_agent('acme', 'com-agt-003', %s)", (MEMORY_TOOLS,))
    yield server


def open_run(server: CrashServer) -> uuid.UUID:
    with psycopg.connect(server.url("cr_orchestrator"), autocommit=True) as c:
        row = c.execute(
            "SELECT fabric_api.open_run('acme', 'com-agt-003', 'user-8842', 'sess-1f9c', %s)",
            (MEMORY_TOOLS,),
        ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def wait_until_up(server: CrashServer, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(server.url(), connect_timeout=2) as c:
                c.execute("SELECT 1")
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def crash_mid_propose(server: CrashServer, canary: str) -> None:
    """The agent proposes with literal SQL whose statement holds the canary and sleeps in the
    same statement; its backend is killed with SIGKILL while it sleeps."""
    run = open_run(server)
    statement = sql.SQL("SELECT fabric_api.propose({}::jsonb, {}::uuid), pg_catalog.pg_sleep(60)")
    literal = statement.format(sql.Literal(Jsonb(episode(canary))), sql.Literal(str(run)))
    agent = psycopg.connect(server.url("cr_agent"), autocommit=True)
    pid = agent.info.backend_pid
    failure: list[BaseException] = []

    def propose() -> None:
        try:
            agent.execute(literal)
        except psycopg.OperationalError as exc:
            failure.append(exc)

    worker = threading.Thread(target=propose)
    worker.start()
    with psycopg.connect(server.url(), autocommit=True) as su:
        deadline = time.monotonic() + 30
        while not su.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'PgSleep'", (pid,)
        ).fetchone():
            assert time.monotonic() < deadline, "the propose never reached its sleep"
            time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    worker.join(30)
    agent.close()
    assert failure, "the killed backend's statement should have failed"
    wait_until_up(server)
    deadline = time.monotonic() + 10
    while f"(PID {pid}) was terminated by signal 9" not in server.log():
        assert time.monotonic() < deadline, "the crash never reached the server log"
        time.sleep(0.1)


def test_migrate_warns_with_the_exact_settings_when_the_server_would_log_statements(
    crash_server: CrashServer,
) -> None:
    assert len(crash_server.warnings) == 1
    warning = crash_server.warnings[0]
    assert "log_error_verbosity = 'terse'" in warning
    assert "log_min_error_statement = 'panic'" in warning
    assert "ALTER SYSTEM" in warning
    assert crash_server.risks == [
        "log_error_verbosity = 'terse'",
        "log_min_error_statement = 'panic'",
    ]


def test_a_crash_mid_propose_logs_no_content_once_the_server_settings_are_set(
    crash_server: CrashServer,
) -> None:
    # 1. the reported leak, reproduced: the database says terse, the postmaster does not
    with psycopg.connect(crash_server.url(), autocommit=True) as su:
        assert su.execute("SHOW log_error_verbosity").fetchone() == ("terse",)
    before = "CANARY-" + uuid.uuid4().hex
    crash_mid_propose(crash_server, before)
    assert before in crash_server.log()

    # 2. the fix: the same settings cluster-wide, as the local and the test servers have them
    with psycopg.connect(crash_server.url(dbname="postgres"), autocommit=True) as su:
        mfdb.apply_server_log_settings(su)
    warnings: list[str] = []
    deadline = time.monotonic() + 10
    while True:  # the reload reaches the postmaster asynchronously
        warnings.clear()
        mfdb.bootstrap(crash_server.url(), warn=warnings.append)
        if not warnings or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert warnings == []
    after = "CANARY-" + uuid.uuid4().hex
    crash_mid_propose(crash_server, after)
    assert after not in crash_server.log()


def test_the_local_server_script_sets_every_server_setting() -> None:
    script = (ROOT / "scripts" / "db.sh").read_text()
    for name, value in mfdb.SERVER_LOG_SETTINGS:
        assert f'"{name}={value}"' in script
