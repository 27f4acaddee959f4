"""Test fixtures: a real PostgreSQL 17 (pytest-postgresql through the unshare wrapper), a
template database migrated once per session, and a fresh clone of it per test.

The template holds a small world: tenants acme and globex, an admin, an orchestrator, a
committer registered as os-agt-010, and agents with their own logins. Logins are
cluster-wide, so they are created once per session.

What keeps it fast (docs/development.md, "Running the tests"):
- the session's temporary directory (the server's data directory, Edge shards, the graph
  server's root) is on tmpfs when /dev/shm is writable: a clone costs ~25 ms there;
- clones are prepared ahead by a background thread (`ClonePool`), with the superuser's
  session and the helpers' shared backend already connected, and dropped behind;
- the `Fabric` helpers (open_run, propose, commit, recall, call) call as their login on one
  backend (`Fabric.acting`: SET SESSION AUTHORIZATION), so a test pays the first call of a
  fabric function once, not once per login; `Fabric.session(login)` is one connection per
  login, `Fabric.connect` a new one, for tests that change a connection's state or need
  several backends;
- under pytest-xdist (`make test`: two workers) each worker has its own server, template
  and pool (`pytest_xdist_make_scheduler` keeps a module on one worker).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import select
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from pytest_postgresql import factories

from memfabric import db as mfdb
from memfabric.call import Cast, fabric_call
from memfabric.embedding import MiniLMEmbedder
from memfabric.errors import FabricError
from servers import GraphServer, start_graph_server

ROOT = Path(__file__).resolve().parents[1]


def _use_tmpfs() -> None:
    """Put the session's temporary root on tmpfs (pytest's own PYTEST_DEBUG_TEMPROOT) unless
    the caller chose one (the variable, or --basetemp, which wins over it)."""
    shm = Path("/dev/shm")  # noqa: S108 - pytest makes its own private, numbered dirs there
    if "PYTEST_DEBUG_TEMPROOT" not in os.environ and shm.is_dir() and os.access(shm, os.W_OK):
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(shm)


_use_tmpfs()


# -- an interrupted run cleans up what it started ------------------------------------------
# SIGTERM (`make test` stopped, a CI job cancelled) would end Python at once: no finalizer
# runs, and the servers the session started (PostgreSQL, the graph JVM, Redis: none is a
# child of this process) and its temporary directory (hundreds of MB on tmpfs) outlive it.
# So SIGTERM becomes KeyboardInterrupt, as Ctrl-C: pytest ends the session and every
# fixture's finalizer runs. Under pytest-xdist the controller passes the signal on to its
# workers and waits for them; a worker ends its process once its session is torn down. The
# session's temporary directory goes last.
_SIGTERM_GRACE = 180.0  # seconds the controller waits for its workers' teardown


@dataclass
class _Interruption:
    role: str = "single"  # "single", "controller" (pytest-xdist) or "worker"
    signalled: bool = False
    workers: list[int] = field(default_factory=list)


_INTERRUPTION = _Interruption()


def _live_children(pid: int) -> list[int]:
    """The direct children of `pid` that have not exited (Linux /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if int(ppid) == pid and state not in ("Z", "X"):
            children.append(int(stat.parent.name))
    return children


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _on_sigterm(signum: int, frame: Any) -> None:
    if _INTERRUPTION.signalled:
        return  # one interruption: a second SIGTERM must not cut the cleanup short
    _INTERRUPTION.signalled = True
    if _INTERRUPTION.role == "controller":
        _INTERRUPTION.workers = _live_children(os.getpid())
        for pid in _INTERRUPTION.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        _INTERRUPTION.role = "worker"
    elif getattr(config.option, "dist", "no") != "no" and getattr(
        config.option, "numprocesses", None
    ):
        _INTERRUPTION.role = "controller"
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """A test that runs a command in process may leave that command's own SIGTERM and SIGINT
    handlers behind (memfabric's long-running commands install them): the run's come back."""
    sigint = signal.getsignal(signal.SIGINT)
    try:
        return (yield)
    finally:
        if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
            signal.signal(signal.SIGTERM, _on_sigterm)
        if signal.getsignal(signal.SIGINT) is not sigint:
            signal.signal(signal.SIGINT, sigint)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """An interrupted controller waits for its workers to tear their sessions down before
    pytest-xdist ends them (it kills a worker that does not exit within seconds)."""
    if _INTERRUPTION.signalled and _INTERRUPTION.role == "controller":
        deadline = time.monotonic() + _SIGTERM_GRACE
        while any(map(_alive, _INTERRUPTION.workers)) and time.monotonic() < deadline:
            time.sleep(0.1)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if not _INTERRUPTION.signalled:
        return
    if _INTERRUPTION.role == "worker":
        # torn down: end here, so the controller need not wait for its own teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
    basetemp = getattr(getattr(config, "_tmp_path_factory", None), "_basetemp", None)
    if basetemp is not None:
        shutil.rmtree(basetemp, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`make test` runs two workers) each worker has its own PostgreSQL
    server, template and clone pool (the session fixtures below), so the cluster-wide logins,
    ALTER SYSTEM and the server restarts of some tests never meet a second worker. A module
    runs on one worker (its module fixtures are built once), and the modules that use the
    graph server share one worker, so one graph server is started, as without xdist."""
    from xdist.scheduler import LoadScopeScheduling

    uses_graph: dict[str, bool] = {}
    slow_module: dict[str, bool] = {}
    given: dict[str, set[str]] = {}  # a module's property tests (hypothesis)

    def source(module: str) -> str:
        path = config.rootpath / module
        return path.read_text() if path.is_file() else ""

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        sorted_by_weight = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module not in uses_graph:
                uses_graph[module] = "graph_server" in source(module)
            return "graph" if uses_graph[module] else module

        def _weight(self, nodeids: dict[str, bool]) -> int:
            """A unit's expected time, roughly: its tests, ten times over for a module marked
            slow as a whole (each of its tests takes seconds), and a property test (hypothesis
            runs its body 100-200 times: 1-2.5 s) as twenty."""
            weight = 0
            for nodeid in nodeids:
                module = nodeid.split("::", 1)[0]
                if module not in slow_module:
                    text = source(module)
                    slow_module[module] = "\npytestmark = pytest.mark.slow" in text
                    given[module] = {
                        name
                        for block in re.split(r"\n\s*\n", text)
                        if "@given(" in block
                        for name in re.findall(r"^def (\w+)", block, re.M)
                    }
                name = nodeid.split("::", 1)[-1].split("[", 1)[0]
                weight += 10 if slow_module[module] else 20 if name in given[module] else 1
            return weight

        def _assign_work_unit(self, node: Any) -> None:
            # The longest units first, so that neither worker ends the run alone on one of
            # them (xdist orders the units by their number of tests).
            if not self.sorted_by_weight:
                self.sorted_by_weight = True
                for scope, _ in sorted(self.workqueue.items(), key=lambda u: self._weight(u[1])):
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


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
    "mf_policy": (None, ["fabric_policy"], {}, [], []),
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
    "mf_workflow": ("wf-billing-001", ["fabric_workflow"], {}, [], ["acme"]),
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


# The connections the pool opens with each clone it prepares, so a test does not wait for
# their backends to start (only connected, nothing run on them): the superuser's
# `Fabric.session(None)` and the backend the helpers share (`Fabric.acting`).
SHARED = "shared"
SESSION_LOGINS: tuple[str | None, ...] = (None, SHARED)

Sessions = dict[str | None, psycopg.Connection[Any]]


class ClonePool:
    """Clones of the template prepared ahead by one background thread, and used clones
    dropped behind it: a test waits for a clone only when the pool has none ready. Each
    clone comes with its `SESSION_LOGINS` connected (`take`)."""

    def __init__(self, server: Any, template: str, ready: int = 2) -> None:
        self.server = server
        self.template = template
        self.size = ready
        self._ready: queue.Queue[tuple[str, Sessions]] = queue.Queue()
        self._cond = threading.Condition()
        self._drops: list[str] = []
        self._wanted = ready
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="clone-pool", daemon=True)
        self._thread.start()

    @staticmethod
    def _clone(c: psycopg.Connection[Any], template: str, name: str) -> None:
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

    def _connect(self, name: str) -> Sessions:
        sessions: Sessions = {}
        try:
            for login in SESSION_LOGINS:
                conninfo = _admin_conninfo(self.server, name)
                if login not in (None, SHARED):
                    conninfo = psycopg.conninfo.make_conninfo(conninfo, user=login)
                sessions[login] = psycopg.connect(conninfo, autocommit=True)
        except BaseException:
            for conn in sessions.values():
                conn.close()
            raise
        return sessions

    @staticmethod
    def _drop(c: psycopg.Connection[Any], name: str) -> None:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def _work(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while True:
                with self._cond:
                    while not (self._stopping or self._drops or self._wanted > 0):
                        self._cond.wait()
                    if self._stopping:
                        return
                    drop = self._drops.pop() if self._drops else None
                    if drop is None:
                        self._wanted -= 1
                name = drop or f"mf_test_{os.getpid()}_{next(_counter)}"
                # A test may restart the server (test_serve_cli): reconnect and do it again.
                deadline, retry = time.monotonic() + 120, False
                sessions: Sessions = {}
                while True:
                    try:
                        if conn is None or conn.closed or conn.broken:
                            conn = psycopg.connect(
                                _admin_conninfo(self.server, "postgres"), autocommit=True
                            )
                        if drop is not None or retry:
                            self._drop(conn, name)
                        if drop is None:
                            self._clone(conn, self.template, name)
                            sessions = self._connect(name)
                        break
                    except psycopg.OperationalError:
                        if conn is not None:
                            conn.close()
                            conn = None
                        if time.monotonic() > deadline:
                            raise
                        retry = True
                        time.sleep(0.2)
                if drop is None:
                    self._ready.put((name, sessions))
        except BaseException as exc:  # handed to every test that waits for a clone
            self._error = exc
            self._ready.put(("", {}))
        finally:
            if conn is not None:
                conn.close()

    def take(self) -> tuple[str, Sessions]:
        """A fresh clone and its `SESSION_LOGINS` connections; the pool starts preparing the
        next one. A connection the server has written to while it waited (the server
        restarted under it and said goodbye) is closed and left out: `Fabric.session`
        connects that login again."""
        with self._cond:
            self._wanted += 1
            self._cond.notify()
        name, sessions = self._ready.get()
        if not name:
            self._ready.put(("", {}))  # for the next test too
            raise RuntimeError("the clone pool failed") from self._error
        for login, conn in list(sessions.items()):
            if select.select([conn.fileno()], [], [], 0)[0]:
                conn.close()
                del sessions[login]
        return name, sessions

    def give_back(self, name: str) -> None:
        """Drop a used clone in the background."""
        with self._cond:
            self._drops.append(name)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(60)
        leftover = list(self._drops)
        while not self._ready.empty():
            name, sessions = self._ready.get_nowait()
            for conn in sessions.values():
                conn.close()
            leftover.append(name)
        with psycopg.connect(_admin_conninfo(self.server, "postgres"), autocommit=True) as c:
            for name in filter(None, leftover):
                self._drop(c, name)


@pytest.fixture(scope="session")
def clones(server: Any, template: str) -> Iterator[ClonePool]:
    pool = ClonePool(server, template)
    yield pool
    pool.close()


class NeedsClone(BaseException):
    """A test marked `rollback` did something a rolled-back transaction on the shared database
    cannot stand for: it needs a clone of its own (drop the marker, or mark it `clone`). A
    BaseException, so that `pytest.raises(Exception)` cannot swallow it."""


# What a statement run on a `TxConn` may not do: change the backend's session state (it is
# shared by every login and every test of the worker), end or split the test's transaction,
# or read what one transaction cannot show as autocommit calls would (snapshots, xids,
# statistics, the other backends).
_TX_REFUSED_COMMAND = re.compile(
    r"\s*(SET|RESET|BEGIN|START|COMMIT|END|ROLLBACK|ABORT|SAVEPOINT|RELEASE|PREPARE|"
    r"LISTEN|UNLISTEN|NOTIFY|DISCARD|VACUUM|CHECKPOINT|ALTER\s+SYSTEM|CREATE\s+DATABASE|"
    r"DROP\s+DATABASE)\b",
    re.IGNORECASE,
)
_TX_REFUSED_ANYWHERE = re.compile(
    r"set_config|advisory|pg_stat|pg_current_snapshot|pg_snapshot|xact_id|txid|xmin|"
    r"pg_backend_pid|pg_terminate_backend|pg_cancel_backend|pg_notify|now\(\)|"
    r"transaction_timestamp|current_timestamp|statement_timestamp",
    re.IGNORECASE,
)


def _tx_refused(text: str) -> bool:
    return bool(_TX_REFUSED_ANYWHERE.search(text)) or any(
        _TX_REFUSED_COMMAND.match(part) for part in text.split(";")
    )


def _query_text(query: Any) -> str:
    if isinstance(query, sql.Composable):
        return query.as_string(None)
    return query.decode() if isinstance(query, bytes) else str(query)


@dataclass(frozen=True)
class _Identity:
    """What one `TxConn` stands for: its login (None: the superuser) and, for `owner()`, a
    role and the session settings of the governance context."""

    login: str | None
    role: str | None = None
    settings: tuple[tuple[str, str], ...] = ()


class TxBackend:
    """The worker's shared database for the tests marked `rollback`: a clone of the template
    made once, and one superuser backend on it. A test runs in one transaction that is rolled
    back at its end, so it pays neither a clone nor a new backend, and the functions that
    backend has compiled stay compiled for the next test.

    Each statement a test runs (on any `TxConn`) behaves as the autocommit call it stands for:
    `RESET ALL` and `SET SESSION AUTHORIZATION` (plus the role and settings of `owner()`)
    before, a savepoint around it (an error rolls back that statement only), and the deferred
    constraint triggers fired at its end (`SET CONSTRAINTS ALL IMMEDIATE`, as COMMIT would),
    then deferred again (`tx_backend` checks every deferrable constraint is initially
    deferred, so `ALL DEFERRED` restores the start state). Local settings of one call
    (`fabric.tenant_id`) do not reach the next: `RESET ALL`."""

    def __init__(self, server: Any, template: str, dbname: str) -> None:
        self.server = server
        self.template = template
        self.dbname = dbname
        self.conn: psycopg.Connection[Any] | None = None
        self.lock = threading.Lock()
        self.owner: Fabric | None = None

    def begin(self, fabric: Fabric) -> None:
        for attempt in (1, 2):  # a test may have restarted the server (test_serve_cli)
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    # The database's idle-in-transaction timeout would end this session's
                    # transaction while a test waits (a child starting on a loaded machine)
                    # and take every later test of the worker with it. A startup option is
                    # what the per-statement RESET ALL restores, so it holds.
                    self.conn = psycopg.connect(
                        _admin_conninfo(self.server, self.dbname),
                        autocommit=True,
                        options="-c idle_in_transaction_session_timeout=0",
                    )
                self.conn.execute("BEGIN")
                break
            except psycopg.OperationalError:
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        self.owner = fabric

    def end(self) -> None:
        self.owner = None
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            return
        status = conn.info.transaction_status
        conn.execute("ROLLBACK")
        if status == psycopg.pq.TransactionStatus.IDLE:
            # the test's transaction ended under it: what came after was committed into the
            # shared database, so it is made again for the next test
            self.rebuild()
            raise AssertionError("a rollback test committed into the shared database")
        held = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
        ).fetchone()
        assert held == (0,), "a rollback test left a session-level advisory lock behind"

    def rebuild(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        _make_database(self.server, self.template, self.dbname)

    def run(self, fabric: Fabric, who: _Identity, statement: Any, text: str) -> Any:
        """Run `statement(conn)` as `who`, as one autocommit call would, for the test that
        owns `fabric` (a connection kept past its test, e.g. by a thread, cannot reach into
        the next test's transaction)."""
        if _tx_refused(text):
            raise NeedsClone(f"a rollback test cannot run this on the shared backend: {text!r}")
        if not self.lock.acquire(blocking=False):
            raise NeedsClone("a rollback test has one backend: two threads cannot share it")
        try:
            conn = self.conn
            if conn is None or self.owner is not fabric:
                raise NeedsClone("a rollback test's connection is used after the test's end")
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
                raise AssertionError("the test's transaction has ended: nothing may run now")
            before: list[sql.Composable] = [sql.SQL("RESET ALL")]
            if who.login is None:
                before.append(sql.SQL("RESET SESSION AUTHORIZATION"))
            else:
                before.append(
                    sql.SQL("SET SESSION AUTHORIZATION {}").format(sql.Identifier(who.login))
                )
            if who.role is not None:
                before.append(sql.SQL("SET ROLE {}").format(sql.Identifier(who.role)))
            for name, value in who.settings:
                before.append(
                    sql.SQL("SELECT pg_catalog.set_config({}, {}, false)").format(
                        sql.Literal(name), sql.Literal(value)
                    )
                )
            before.append(sql.SQL("SAVEPOINT mf_call"))
            conn.execute(sql.SQL("; ").join(before))
            try:
                result = statement(conn)
                conn.execute(
                    "SET CONSTRAINTS ALL IMMEDIATE; SET CONSTRAINTS ALL DEFERRED; "
                    "RELEASE SAVEPOINT mf_call"
                )
            except psycopg.Error:
                if not conn.broken:
                    conn.execute("ROLLBACK TO SAVEPOINT mf_call; RELEASE SAVEPOINT mf_call")
                raise
            return result
        finally:
            self.lock.release()


class TxCursor:
    """A cursor of a `TxConn`: each execute is one call (`TxBackend.run`)."""

    def __init__(self, conn: TxConn, kwargs: dict[str, Any]) -> None:
        self._conn = conn
        self._kwargs = kwargs
        self._cur: Any = None

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> TxCursor:
        def statement(conn: psycopg.Connection[Any]) -> Any:
            cur = conn.cursor(**self._kwargs)
            cur.execute(query, params, **kwargs)
            return cur

        self._cur = self._conn._run(statement, query)
        return self

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        def statement(conn: psycopg.Connection[Any]) -> Any:
            cur = conn.cursor(**self._kwargs)
            cur.executemany(query, params_seq, **kwargs)
            return cur

        self._cur = self._conn._run(statement, query)

    def __getattr__(self, name: str) -> Any:
        if name == "connection":
            raise NeedsClone("a rollback test's cursor does not hand out the shared backend")
        if self._cur is None:
            raise AttributeError(name)
        return getattr(self._cur, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur)

    def __enter__(self) -> TxCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass


class TxConn:
    """What `Fabric.connect`, `session`, `su` and `owner` hand a test marked `rollback`: a
    login's autocommit connection, played on the worker's one shared backend inside the
    test's transaction (`TxBackend`). It runs statements (`execute`, `cursor`); anything
    that would change the backend's state or needs a backend of its own raises `NeedsClone`.
    """

    def __init__(self, backend: TxBackend, fabric: Fabric, who: _Identity) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_fabric", fabric)
        object.__setattr__(self, "_who", who)
        object.__setattr__(self, "closed", False)

    def _run(self, statement: Any, query: Any) -> Any:
        return self._backend.run(self._fabric, self._who, statement, _query_text(query))

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        return self._run(lambda conn: conn.execute(query, params, **kwargs), query)

    def cursor(self, **kwargs: Any) -> TxCursor:
        if kwargs.get("name") is not None:
            raise NeedsClone("a server-side cursor lives in a transaction of its own")
        return TxCursor(self, kwargs)

    @property
    def autocommit(self) -> bool:
        return True

    @property
    def broken(self) -> bool:
        return False

    @property
    def adapters(self) -> Any:
        assert self._backend.conn is not None
        return self._backend.conn.adapters

    def commit(self) -> None:  # an autocommit connection's commit does nothing
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        object.__setattr__(self, "closed", True)

    def __enter__(self) -> TxConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        raise NeedsClone(f"a rollback test's connection has no {name!r}: it needs a clone")

    def __setattr__(self, name: str, value: Any) -> None:
        raise NeedsClone(f"a rollback test cannot set {name!r} on the shared backend")


@dataclass
class Fabric:
    """One test's database, with a connection per identity.

    `connect(login)` opens a new connection each time: the test owns it and may change its
    state (SET ROLE, set_config, an open transaction). `session(login)` is one connection
    per login, which nobody may change: it only calls. The helpers below call as a login on
    one backend they share (`acting`).
    """

    server: Any
    dbname: str
    _conns: list[psycopg.Connection[Any]] = field(default_factory=list)
    _sessions: dict[str | None, psycopg.Connection[Any]] = field(default_factory=dict)
    _shared: psycopg.Connection[Any] | None = None
    _shared_as: str | None = None
    _shared_lock: threading.Lock = field(default_factory=threading.Lock)
    # a test marked `rollback`: its transaction on the worker's shared database (TxBackend)
    _tx: TxBackend | None = None

    @property
    def url(self) -> str:
        if self._tx is not None:
            raise NeedsClone("a rollback test has no database URL: another process needs a clone")
        return _admin_conninfo(self.server, self.dbname)

    def _tx_conn(self, login: str | None, role: str | None = None, **settings: str) -> Any:
        assert self._tx is not None
        return TxConn(self._tx, self, _Identity(login, role, tuple(settings.items())))

    def connect(self, login: str | None = None, autocommit: bool = True) -> psycopg.Connection[Any]:
        """A new connection as `login` (the superuser when None), closed after the test."""
        if self._tx is not None:
            if not autocommit:
                raise NeedsClone("a rollback test has no transaction of its own to give")
            return self._tx_conn(login)  # type: ignore[no-any-return]
        conninfo = (
            self.url if login is None else psycopg.conninfo.make_conninfo(self.url, user=login)
        )
        conn = psycopg.connect(conninfo, autocommit=autocommit)
        self._conns.append(conn)
        return conn

    def su(self) -> psycopg.Connection[Any]:
        """A new superuser connection."""
        return self.connect(None)

    def cursor(self, projection: str = "qdrant") -> tuple[str, str]:
        """Where a projection's cursor stands: (last_xid, last_event_id) as text."""
        row = (
            self.session(None)
            .execute(
                "SELECT last_xid::text, last_event_id::text FROM fabric.projection_cursors"
                " WHERE projection = %s",
                (projection,),
            )
            .fetchone()
        )
        assert row is not None
        return row[0], row[1]

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every transaction begun before now has ended (`settle`)."""
        if self._tx is not None:
            raise NeedsClone("the outbox of a rollback test is never committed")
        settle(self.session(None), timeout)

    def session(self, login: str | None = None) -> psycopg.Connection[Any]:
        """The test's shared autocommit connection as `login`: calls only, never SET ROLE,
        set_config or an open transaction (take `connect` for those)."""
        if self._tx is not None:
            return self._tx_conn(login)  # type: ignore[no-any-return]
        conn = self._sessions.get(login)
        if conn is None or conn.closed or conn.broken:
            conn = self._sessions[login] = self.connect(login)
        return conn

    @contextmanager
    def acting(self, login: str | None) -> Iterator[psycopg.Connection[Any]]:
        """The connection a helper calls on as `login`: one superuser backend for all logins,
        switched with SET SESSION AUTHORIZATION (session_user and current_user are the login,
        as on the login's own connection), so a test starts one backend, not one per login,
        and pays the first call of each fabric function once (docs/development.md, "Running
        the tests"). Autocommit and calls only, so no transaction spans two logins. The
        login's own `session(login)` is used instead when the test has taken it (a race test
        watches that backend: "the connection fabric.commit uses"), while another thread
        calls on the shared one, and for the superuser (None)."""
        if self._tx is not None:
            yield self._tx_conn(login)
            return
        if login is None or login in self._sessions:
            yield self.session(login)
            return
        if not self._shared_lock.acquire(blocking=False):
            yield self.session(login)
            return
        try:
            conn = self._shared
            if conn is None or conn.closed or conn.broken:
                conn = self._shared = self.connect(None)
                self._shared_as = None
            if self._shared_as != login:
                self._shared_as = None
                conn.execute(sql.SQL("SET SESSION AUTHORIZATION {}").format(sql.Identifier(login)))
                self._shared_as = login
            yield conn
        finally:
            self._shared_lock.release()

    def call(self, login: str | None, query: str, *args: Any) -> Any:
        """The one value `query` returns, run as `login` (`acting`)."""
        with self.acting(login) as conn:
            row = conn.execute(query, args).fetchone()  # type: ignore[arg-type]
        assert row is not None
        return row[0]

    def count(self, table: str, where: str = "true") -> int:
        """Rows in a fabric table, all tenants, read by the superuser (bypasses RLS)."""
        q = sql.SQL("SELECT count(*) FROM fabric.{} WHERE ").format(sql.Identifier(table))
        row = self.session(None).execute(q + sql.SQL(where)).fetchone()  # type: ignore[operator]
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
        with self.acting("mf_orchestrator") as conn:
            return call(  # type: ignore[no-any-return]
                conn,
                "fabric_api.open_run",
                *(tenant, agent_id, subject, session, tools, Cast(ttl, "interval")),
            )

    def propose(self, login: str, envelope: Any, run_id: uuid.UUID) -> dict[str, Any]:
        # Jsonb, not the dict rule: the hostile-envelope tests propose non-objects too.
        with self.acting(login) as conn:
            return call(conn, "fabric_api.propose", Jsonb(envelope), run_id)  # type: ignore[no-any-return]

    def commit(self, proposal_id: Any, login: str = "mf_committer") -> dict[str, Any]:
        with self.acting(login) as conn:
            return call(conn, "fabric_api.commit", proposal_id)  # type: ignore[no-any-return]

    def recall(self, login: str, request: dict[str, Any]) -> dict[str, Any]:
        with self.acting(login) as conn:
            return call(conn, "fabric_api.recall", Jsonb(request))  # type: ignore[no-any-return]

    def proposed(
        self,
        run: uuid.UUID | None = None,
        text: str | None = None,
        login: str = "mf_agent_a",
        *,
        envelope: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> str:
        """Propose `envelope`, or else an `episode(text or "e", **overrides)`, as `login` in
        `run` (a new `open_run()` when None); its proposal_id, validated."""
        if envelope is None:
            envelope = episode("e" if text is None else text, **overrides)
        elif text is not None or overrides:
            raise TypeError("an envelope, or an episode's text and overrides: not both")
        result = self.propose(login, envelope, self.open_run() if run is None else run)
        assert result["status"] == "validated", result
        return str(result["proposal_id"])

    def form(
        self,
        run: uuid.UUID | None = None,
        text: str | None = None,
        login: str = "mf_agent_a",
        committer: str = "mf_committer",
        *,
        envelope: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> str:
        """Propose as `proposed` does (`envelope`, or an episode; in `run`, or a new one)
        and commit it as `committer`; the new memory_id."""
        proposal = self.proposed(run, text, login, envelope=envelope, **overrides)
        return str(self.commit(proposal, committer)["memory_id"])

    def record(self, memory_id: Any) -> dict[str, Any]:
        """A memory record's whole row (`to_jsonb`), read by the superuser (bypasses RLS)."""
        row = (
            self.session(None)
            .execute(
                "SELECT to_jsonb(m) FROM fabric.memory_records m WHERE memory_id = %s",
                (memory_id,),
            )
            .fetchone()
        )
        assert row is not None, memory_id
        return row[0]  # type: ignore[no-any-return]

    def owner(
        self,
        tenant: str | None = "acme",
        actor: str | None = "os-agt-010",
        autocommit: bool = True,
        login: str | None = None,
    ) -> psycopg.Connection[Any]:
        """A new connection of the superuser (or of `login`, which must hold fabric_owner)
        acting as fabric_owner (the table owner: not superuser, not BYPASSRLS, so RLS and
        the triggers apply), with the governance context `fabric.tenant_id` /
        `fabric.actor` set for the session unless None."""
        if self._tx is not None:
            if not autocommit:
                raise NeedsClone("a rollback test has no transaction of its own to give")
            settings = {"fabric.tenant_id": tenant, "fabric.actor": actor}
            return self._tx_conn(  # type: ignore[no-any-return]
                login, "fabric_owner", **{k: v for k, v in settings.items() if v is not None}
            )
        conn = self.connect(login, autocommit=autocommit)
        conn.execute("SET ROLE fabric_owner")
        if tenant is not None:
            conn.execute("SELECT set_config('fabric.tenant_id', %s, false)", (tenant,))
        if actor is not None:
            conn.execute("SELECT set_config('fabric.actor', %s, false)", (actor,))
        if not autocommit:
            conn.commit()
        return conn

    def events(self, where: str = "true") -> list[dict[str, Any]]:
        # Events of one transaction tie on xid and occurred_at (now()) and have no order
        # among themselves (their ids are time-ordered only to the millisecond); the heap's
        # order (ctid) keeps a listing stable, usually in the order they were written (not
        # always: an insert may reuse space freed in an earlier page), so a test that needs
        # one transaction's events compares them as a set.
        q = sql.SQL(
            "SELECT to_jsonb(e) FROM fabric.events e WHERE {} ORDER BY xid, occurred_at, e.ctid"
        )
        if self._tx is not None:
            # One transaction: every event has its xid and its occurred_at (now()). Each call
            # runs in a savepoint of its own, whose subtransaction id (the row's xmin) grows
            # from call to call: the order of the calls, as separate transactions give it.
            q = sql.SQL(
                "SELECT to_jsonb(e) FROM fabric.events e WHERE {}"
                " ORDER BY xid, occurred_at, e.xmin::text::bigint"
            )
            rows = self._tx.run(
                self,
                _Identity(None),
                lambda conn: conn.execute(q.format(sql.SQL(where))).fetchall(),  # type: ignore[arg-type]
                "",
            )
            return [r[0] for r in rows]
        rows = self.session(None).execute(q.format(sql.SQL(where))).fetchall()  # type: ignore[arg-type]
        return [r[0] for r in rows]

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        if self._tx is not None:
            self._tx.end()


def backend_pid(conn_or_pid: psycopg.Connection[Any] | int) -> int:
    return conn_or_pid if isinstance(conn_or_pid, int) else conn_or_pid.info.backend_pid


def wait_until_blocked(
    observer: psycopg.Connection[Any] | Fabric,
    conn_or_pid: psycopg.Connection[Any] | int,
    timeout: float = 30.0,
) -> None:
    """Return once the backend waits on a heavyweight lock (pg_locks: not granted), so a race
    test knows its rival is queued behind the lock under test, without sleeping blind."""
    conn = observer.session(None) if isinstance(observer, Fabric) else observer
    pid = backend_pid(conn_or_pid)
    deadline = time.monotonic() + timeout
    while not conn.execute(
        "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
    ).fetchone():
        assert time.monotonic() < deadline, f"backend {pid} never waited on a lock"
        time.sleep(0.005)


def _make_database(server: Any, template: str, name: str) -> None:
    """(Re)create `name` as a clone of the template, with bootstrap's database settings."""
    with psycopg.connect(_admin_conninfo(server, "postgres"), autocommit=True) as c:
        ClonePool._drop(c, name)
        ClonePool._clone(c, template, name)


@pytest.fixture(scope="session")
def tx_backend(server: Any, template: str) -> Iterator[TxBackend]:
    """The worker's shared database for the tests marked `rollback` (made on first use)."""
    name = f"mf_rollback_{os.getpid()}"
    _make_database(server, template, name)
    backend = TxBackend(server, template, name)
    with psycopg.connect(_admin_conninfo(server, name), autocommit=True) as c:
        # `SET CONSTRAINTS ALL DEFERRED` after each call restores the start state only while
        # every deferrable constraint is initially deferred.
        row = c.execute(
            "SELECT count(*) FROM pg_constraint WHERE condeferrable AND NOT condeferred"
        ).fetchone()
        assert row == (0,), "a DEFERRABLE INITIALLY IMMEDIATE constraint: see TxBackend"
    yield backend
    if backend.conn is not None:
        backend.conn.close()
    with psycopg.connect(_admin_conninfo(server, "postgres"), autocommit=True) as c:
        ClonePool._drop(c, name)


def _rollback_wanted(node: pytest.Item) -> bool:
    """`@pytest.mark.rollback` (on the test, its class or `pytestmark` of its module) unless
    the test itself is marked `clone`. MEMFABRIC_TEST_ISOLATION=clone gives every test a clone
    (the comparison run) but those marked `rollback(always=True)`, which are about the
    transaction itself; =rollback tries every test not marked `clone` in a transaction
    (to find the tests of a module that can opt in)."""
    marker = node.get_closest_marker("rollback")
    if marker is not None and marker.kwargs.get("always"):
        return True
    forced = os.environ.get("MEMFABRIC_TEST_ISOLATION")  # docs/development.md
    if forced == "clone":
        return False
    if forced == "rollback":
        return node.get_closest_marker("clone") is None
    return node.get_closest_marker("rollback") is not None and (
        node.get_closest_marker("clone") is None
    )


@pytest.fixture
def fabric(request: pytest.FixtureRequest) -> Iterator[Fabric]:
    """A fresh clone of the template database for one test; for a test marked `rollback`,
    one transaction on the worker's shared database, rolled back at its end (`TxBackend`)."""
    if _rollback_wanted(request.node):
        backend: TxBackend = request.getfixturevalue("tx_backend")
        f = Fabric(backend.server, backend.dbname, _tx=backend)
        backend.begin(f)
        try:
            yield f
        finally:
            f.close()
        return
    with cloned(request.getfixturevalue("clones")) as f:
        yield f


@contextmanager
def cloned(clones: ClonePool) -> Iterator[Fabric]:
    """A clone from the pool as a `Fabric`, given back at the end: per test (`fabric`), or
    for the tests of a module that share a server process started on one database (its
    tests then read back only what their own run wrote)."""
    name, sessions = clones.take()
    shared = sessions.pop(SHARED, None)
    conns = [*sessions.values(), *([shared] if shared else [])]
    f = Fabric(clones.server, name, conns, sessions, shared)
    try:
        yield f
    finally:
        f.close()
        clones.give_back(f.dbname)


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


def emptied(store: Any, contracts: Any, aliases: Any) -> bool:
    """Delete every point of a vector store that a module's tests share (creating one costs
    1-2 s on Edge: a shard and its payload indexes per tier, a child process each with
    shard processes) after a test. False when the test changed what the store is bound to
    (its contracts or aliases) or it does not come back empty: the caller then replaces it."""
    from memfabric.vectors import INDEXED_TIERS

    if store.contracts() != contracts or store.aliases() != aliases:
        return False
    store.delete_many({tier: [pid for pid, _ in store.scroll(tier)] for tier in INDEXED_TIERS})
    return all(store.count(tier) == 0 for tier in INDEXED_TIERS)


POINT_T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)  # the store tests' first instant


def point_payload(
    tier: str = "semantic",
    tenant: str = "acme",
    visibility: str = "subject",
    subject: str | None = "user-8842",
    agent: str | None = "com-agt-003",
    session: str | None = "sess-1",
    state: str = "raw",
    confidence: float = 0.9,
    valid_from: datetime = POINT_T0,
    valid_until: datetime | None = None,
    labels: Sequence[str] = (),
    memory_id: str | None = None,
) -> Any:
    """A vector point's payload for the store tests (a record of tenant acme by default)."""
    from memfabric.vectors import MemoryPayload

    return MemoryPayload(
        memory_id=memory_id or str(uuid.uuid4()),
        tenant_id=tenant,
        tier=tier,
        visibility=visibility,
        subject_ref=subject,
        agent_id=agent,
        session_ref=session,
        content_hash="sha256:" + "ab" * 32,
        confidence=confidence,
        valid_from=valid_from,
        valid_until=valid_until,
        consolidation_state=state,
        retention_class="durable",
        compliance_labels=tuple(labels),
    )


def settle(conn: psycopg.Connection[Any], timeout: float = 30.0) -> None:
    """Wait on autocommit `conn` until every transaction begun before now has ended. The
    outbox is read below the cluster's snapshot xmin, which any transaction of the server
    holds back (the clone pool's CREATE or DROP DATABASE in the background, another
    connection of the test): a test that reads the outbox once, right after its writes,
    settles first (a projector would simply read again)."""
    xmax = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())").fetchone()
    assert xmax is not None
    deadline = time.monotonic() + timeout
    while not conn.execute(
        "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %s", (xmax[0],)
    ).fetchone()[0]:  # type: ignore[index]
        assert time.monotonic() < deadline, "a transaction older than the test stays open"
        time.sleep(0.01)


def drained(projector: Any, projections: Sequence[str], *, settled: bool = True) -> int:
    """Each of `projections` drained once by `projector` on a connection of its own, after
    the test's writes are below the horizon (`settle`; `settled=False` for a test that holds
    a transaction open on purpose); the events applied."""
    with psycopg.connect(projector.conninfo, autocommit=True) as conn:
        if settled:
            settle(conn)
        return sum(projector.drain(conn, p) for p in projections)


@pytest.fixture(scope="module")
def kept_stores() -> Iterator[dict[Any, Any]]:
    """Vector stores the tests of a module share (`lent`), closed at the module's end."""
    stores: dict[Any, Any] = {}
    yield stores
    for store in stores.values():
        store.close()


def files_holding(root: Path, text: str) -> list[Path]:
    """The files under `root` whose bytes hold `text` (UTF-8). Only the data of a file is
    read, never its holes: a vector shard preallocates sparse files of gigabytes."""
    needle = text.encode()
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            fd, at = f.fileno(), 0
            while True:
                try:
                    start = os.lseek(fd, at, os.SEEK_DATA)
                except OSError:  # ENXIO: no data after `at`
                    break
                end = os.lseek(fd, start, os.SEEK_HOLE)
                if needle in os.pread(fd, end - start, start):
                    found.append(path)
                    break
                at = end
    return found


@contextmanager
def lent(kept: dict[Any, Any], key: Any, make: Any) -> Iterator[Any]:
    """The store `kept[key]` (made by `make()` and bound to its contracts on first use) for
    one test, emptied after it (`emptied`), or closed and forgotten when it cannot be."""
    store = kept.get(key)
    if store is None:
        store = kept[key] = make()
    contracts, aliases = store.contracts(), store.aliases()
    clean = False
    try:
        yield store
        clean = emptied(store, contracts, aliases)
    finally:
        if not clean:
            del kept[key]
            store.close()


@pytest.fixture
def edge(
    minilm: MiniLMEmbedder, kept_stores: dict[Any, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """An empty Edge store with the session model's collections: a module's tests share one,
    emptied after each test (creating one with its payload indexes is 1-2 s; `lent`)."""
    from memfabric.vectors import EdgeVectorStore

    def make() -> Any:
        store = EdgeVectorStore(tmp_path_factory.mktemp("kept") / "qdrant")
        store.ensure_collections(minilm.model, minilm.version, minilm.dims)
        return store

    with lent(kept_stores, "edge", make) as store:
        yield store


@pytest.fixture(scope="session")
def graph_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GraphServer]:
    """One Bolt graph server for the session; a test that uses it wipes what it reads."""
    yield from start_graph_server(tmp_path_factory.mktemp("arcadedb"))


@pytest.fixture(scope="session")
def minilm() -> MiniLMEmbedder:
    """The embedding model, loaded and warmed up once for the session."""
    embedder = MiniLMEmbedder()
    embedder.load()
    embedder.embed(["warm up"])
    return embedder
