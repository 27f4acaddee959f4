"""The `memfabric` CLI: expected failures in one line (the database's SQLSTATE and hint, or
what is unreachable and how to start it), the traceback only with --debug, the environment
variables each command reads in its --help, one Settings for every connection knob, drill
on projections that were never built, and the ports `make help` prints."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import make_conninfo
from typer.main import get_command
from typer.testing import CliRunner, Result

from conftest import Fabric, episode
from memfabric import check
from memfabric import db as mfdb
from memfabric.cli import app
from memfabric.graph import GraphStore
from memfabric.settings import Settings
from servers import PASSWORD, GraphServer

ROOT = Path(__file__).resolve().parents[2]
MEMFABRIC = ROOT / ".venv" / "bin" / "memfabric"
# Variables of the developer's shell that would redirect the CLI under test.
FOREIGN = ("DATABASE_URL", "PGPORT", "MEMFABRIC_", "QDRANT_", "NEO4J_", "GRAPH_")


def closed_port() -> int:
    """A local TCP port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**env: str) -> dict[str, str | None]:
    """The test's variables, every foreign one unset (None unsets it in CliRunner)."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith(FOREIGN)}
    return {**unset, "COLUMNS": "200", **env}


def invoke(env: dict[str, str | None], *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def one_line_error(result: Result, *fragments: str) -> str:
    """The command failed with exactly one line on stderr, no traceback, no exception
    escaping the CLI; returns the line."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_serve(tmp_path: Path) -> dict[str, str]:
    """No `memfabric serve` answers (a socket path nobody listens on); shards in tmp."""
    return {
        "MEMFABRIC_SOCKET": str(tmp_path / "none.sock"),
        "MEMFABRIC_VECTOR_DIR": str(tmp_path / "qdrant"),
    }


# -- the database down, a wrong login, an unknown run ------------------------------------------


def test_database_down_names_the_server_and_how_to_start_it() -> None:
    port = closed_port()
    env = clean_env(DATABASE_URL=f"postgresql://postgres:s3cret@127.0.0.1:{port}/memfabric")
    for args in (("worker", "commit", "--once"), ("db", "migrate"), ("decay",)):
        line = one_line_error(
            invoke(env, *args), f"PostgreSQL at 127.0.0.1:{port} is not answering", "db up"
        )
        assert "s3cret" not in line


def test_local_server_down_follows_pgport() -> None:
    port = closed_port()
    result = invoke(clean_env(PGPORT=str(port)), "worker", "commit", "--once")
    one_line_error(result, f"127.0.0.1:{port} is not answering", "memfabric db up")


def test_login_that_does_not_exist(fabric: Fabric) -> None:
    result = invoke(
        clean_env(DATABASE_URL=fabric.url), "worker", "commit", "--once", "--login", "mf_nobody"
    )
    one_line_error(result, 'refused login "mf_nobody"', "hint: the login must exist")


def test_login_that_is_not_a_committer_gets_the_database_refusal(fabric: Fabric) -> None:
    result = invoke(
        clean_env(DATABASE_URL=fabric.url, MEMFABRIC_COMMITTER_LOGIN="mf_agent_a"),
        "worker",
        "commit",
        "--once",
    )
    one_line_error(result, "error: permission denied for function commit_pending (42501)")


def test_unknown_run(fabric: Fabric) -> None:
    result = invoke(
        clean_env(DATABASE_URL=fabric.url),
        "recall",
        "--login",
        "mf_agent_a",
        "--run",
        str(uuid.uuid4()),
        "--query",
        "invoices",
    )
    one_line_error(result, "(42501)", "— hint: ")


def test_database_without_the_fabric_says_to_migrate(fabric: Fabric) -> None:
    bare = make_conninfo(fabric.url, dbname="postgres")  # the cluster's own database
    env = clean_env(DATABASE_URL=bare, MEMFABRIC_COMMITTER_LOGIN="mf_committer")
    one_line_error(invoke(env, "worker", "commit", "--once"), "(3F000)", "memfabric db migrate")


# -- the projector's login, memfabric serve, the graph server ------------------------------------


def test_projector_login_missing(fabric: Fabric, no_serve: dict[str, str]) -> None:
    env = clean_env(
        DATABASE_URL=fabric.url, MEMFABRIC_PROJECTOR_LOGIN="mf_no_projector", **no_serve
    )
    for command in ("verify", "drill", "rebuild"):
        one_line_error(
            invoke(env, command),
            'refused login "mf_no_projector" (from MEMFABRIC_PROJECTOR_LOGIN)',
            "MEMFABRIC_PROJECTOR_URL",
        )


def test_semantic_recall_without_serve(fabric: Fabric, no_serve: dict[str, str]) -> None:
    run = fabric.open_run()
    result = invoke(
        clean_env(DATABASE_URL=fabric.url, **no_serve),
        "recall",
        "--login",
        "mf_agent_a",
        "--run",
        str(run),
        "--query",
        "invoices",
        "--mode",
        "semantic",
    )
    one_line_error(result, "memfabric serve is not running", no_serve["MEMFABRIC_SOCKET"])


def test_second_serve_on_the_same_socket(no_serve: dict[str, str]) -> None:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(no_serve["MEMFABRIC_SOCKET"])
        listener.listen()
        one_line_error(
            invoke(clean_env(**no_serve), "serve"),
            "memfabric serve is already running",
            "MEMFABRIC_SOCKET",
        )


def test_graph_server_down(fabric: Fabric, no_serve: dict[str, str]) -> None:
    port = closed_port()
    env = clean_env(
        DATABASE_URL=fabric.url,
        MEMFABRIC_PROJECTOR_LOGIN="mf_projector",
        GRAPH_BOLT_PORT=str(port),
        **no_serve,
    )
    one_line_error(
        invoke(env, "verify"),
        f"the graph server at bolt://127.0.0.1:{port} is not answering",
        "make graph-up",
    )


def test_neo4j_uri_without_password_is_a_setting_error(
    fabric: Fabric, no_serve: dict[str, str]
) -> None:
    env = clean_env(
        DATABASE_URL=fabric.url,
        MEMFABRIC_PROJECTOR_LOGIN="mf_projector",
        NEO4J_URI=f"bolt://127.0.0.1:{closed_port()}",
        **no_serve,
    )
    one_line_error(invoke(env, "verify"), "NEO4J_PASSWORD is not", "hint: set NEO4J_PASSWORD")


def test_malformed_port_is_a_setting_error() -> None:
    one_line_error(
        invoke(clean_env(PGPORT="54x"), "worker", "commit", "--once"), "PGPORT is not an integer"
    )


# -- --debug and the installed entry point --------------------------------------------------------


def run_installed(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    return subprocess.run(
        [str(MEMFABRIC), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_installed_command_prints_one_line_and_debug_prints_the_traceback() -> None:
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/memfabric"
    quiet = run_installed("worker", "commit", "--once", DATABASE_URL=url)
    assert quiet.returncode == 1
    assert quiet.stdout == ""
    assert len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    assert quiet.stderr.startswith("error: PostgreSQL at 127.0.0.1:")
    assert "Traceback" not in quiet.stderr

    loud = run_installed("--debug", "worker", "commit", "--once", DATABASE_URL=url)
    assert loud.returncode != 0
    assert "Traceback" in loud.stderr
    assert "OperationalError" in loud.stderr


def test_serve_refused_by_an_answering_database_fails_at_once(
    fabric: Fabric, no_serve: dict[str, str]
) -> None:
    """serve waits for a PostgreSQL that is away (test_serve_cli), never for one that
    answers and refuses it: a login that does not exist is one line and exit 1."""
    refused = run_installed(
        "serve", DATABASE_URL=fabric.url, MEMFABRIC_PROJECTOR_LOGIN="mf_no_projector", **no_serve
    )
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("error: PostgreSQL at"), refused.stderr
    assert 'refused login "mf_no_projector"' in refused.stderr
    assert "waiting" not in refused.stderr and "Traceback" not in refused.stderr


def test_debug_keeps_the_traceback_in_process() -> None:
    env = clean_env(DATABASE_URL=f"postgresql://postgres@127.0.0.1:{closed_port()}/x")
    result = invoke(env, "--debug", "worker", "commit", "--once")
    assert result.exit_code == 1
    assert type(result.exception).__name__ == "OperationalError"  # not swallowed


@pytest.mark.parametrize(
    ("command", "missing", "extra"),
    [
        (("mcp", "stdio", "--login", "x", "--run", str(uuid.uuid4())), "mcp", "mcp"),
        (("mcp", "http"), "mcp", "mcp"),
        (("working", "grant-tenant", "acme"), "redis", "redis"),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(
    command: tuple[str, ...], missing: str, extra: str
) -> None:
    """An installation without an optional dependency (here hidden from the interpreter as
    Python hides an absent one) names the extra to install, in one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env["REDIS_URL"] = f"redis://127.0.0.1:{closed_port()}/0"
    hide = f"import sys; sys.modules[{missing!r}] = None; from memfabric.cli import app; app()"
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", hide, *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: this command needs the Python package {missing!r}, which is not installed"
        f" — hint: pip install 'memfabric[{extra}]'"
    ]


# -- drill on projections that were never built --------------------------------------------------


@pytest.fixture
def projection_env(
    fabric: Fabric,
    graph_server: GraphServer,
    no_serve: dict[str, str],
) -> Iterator[dict[str, str | None]]:
    with GraphStore(graph_server.uri, "root", PASSWORD, "graph") as graph:
        graph.wipe()  # the graph server is shared by the module; this fabric starts empty
    yield clean_env(
        DATABASE_URL=fabric.url,
        MEMFABRIC_PROJECTOR_LOGIN="mf_projector",
        GRAPH_BOLT_PORT=graph_server.env["GRAPH_BOLT_PORT"],
        GRAPH_PASSWORD=PASSWORD,
        **no_serve,
    )


@pytest.mark.slow
def test_drill_on_never_built_projections_says_how_to_build_them(
    fabric: Fabric, projection_env: dict[str, str | None]
) -> None:
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode("invoices in euros please"), run)
    fabric.commit(proposal["proposal_id"])

    line = one_line_error(
        invoke(projection_env, "drill"),
        "the qdrant and graph projections were never built (1 records in PostgreSQL",
        "memfabric rebuild all",
        "memfabric serve",
    )
    assert "differences" not in line

    rebuilt = invoke(projection_env, "rebuild", "all")
    assert rebuilt.exit_code == 0, rebuilt.output
    drilled = invoke(projection_env, "drill")
    assert drilled.exit_code == 0, drilled.output
    assert '"identical": true' in drilled.stdout


def _drill_line(result: Result) -> str:
    (line,) = [x for x in result.stdout.splitlines() if " projection-rebuild-drill " in x]
    return line


@pytest.mark.slow
def test_check_drill_passes_sound_projections_and_fails_a_corrupted_one(
    fabric: Fabric, projection_env: dict[str, str | None], graph_server: GraphServer
) -> None:
    """`memfabric check --drill` runs the drill: its item passes on projections built from
    Postgres and fails when one was changed behind the projector's back (an extra node)."""
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode("invoices in euros please"), run)
    fabric.commit(proposal["proposal_id"])
    assert invoke(projection_env, "rebuild", "all").exit_code == 0
    unasked = _drill_line(invoke(projection_env, "check"))
    assert f" {check.FAIL} " in unasked and "--drill" in unasked
    sound = _drill_line(invoke(projection_env, "check", "--drill"))
    assert f" {check.PASS} " in sound and "(1 records)" in sound, sound
    with GraphStore(graph_server.uri, "root", PASSWORD, "graph") as graph:
        with graph._driver.session(database=graph.database) as session:
            session.run(
                "CREATE (:Memory {tenant_id: 'acme', memory_id: $id})", id=str(uuid.uuid4())
            ).consume()
    broken = invoke(projection_env, "check", "--drill")
    assert broken.exit_code == 1
    line = _drill_line(broken)
    assert f" {check.FAIL} " in line and "answers differ after wipe and rebuild" in line, line


def test_projector_login_without_the_projector_role(
    projection_env: dict[str, str | None],
) -> None:
    env = {**projection_env, "MEMFABRIC_PROJECTOR_LOGIN": "mf_agent_a"}
    one_line_error(
        invoke(env, "verify"), "permission denied for function projection_snapshot_v2 (42501)"
    )


def test_drill_on_an_empty_fabric_has_nothing_to_build(
    projection_env: dict[str, str | None],
) -> None:
    drilled = invoke(projection_env, "drill")
    assert drilled.exit_code == 0, drilled.output
    assert '"identical": true' in drilled.stdout


# -- --help names the environment ---------------------------------------------------------------

DATABASE = {"DATABASE_URL", "PGPORT"}
COMMITTER = DATABASE | {"MEMFABRIC_COMMITTER_LOGIN", "MEMFABRIC_COMMITTER_URL"}
PROJECTION = DATABASE | {
    "MEMFABRIC_PROJECTOR_LOGIN",
    "MEMFABRIC_PROJECTOR_URL",
    "MEMFABRIC_SOCKET",
    "MEMFABRIC_VECTOR_DIR",
    "QDRANT_URL",
    "QDRANT_API_KEY",
    "NEO4J_URI",
    "NEO4J_USER",
    "NEO4J_PASSWORD",
    "NEO4J_DATABASE",
    "GRAPH_BOLT_PORT",
    "GRAPH_PASSWORD",
}
MAINTAINER = COMMITTER | {"MEMFABRIC_MAINTAINER_LOGIN", "MEMFABRIC_MAINTAINER_URL"}
REDIS = {"REDIS_URL", "REDIS_DIR", "REDIS_PORT"}
TRACE = DATABASE | {
    "MEMFABRIC_TRACER_LOGIN",
    "MEMFABRIC_TRACER_URL",
    "MEMFABRIC_METRICS_PORT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
}
READS: dict[tuple[str, ...], set[str]] = {
    ("db", "up"): DATABASE,
    ("db", "down"): DATABASE,
    ("db", "status"): {"PGPORT"},
    ("db", "migrate"): DATABASE | {"MEMFABRIC_MIGRATOR_URL"},
    ("demo",): DATABASE,
    ("worker", "commit"): COMMITTER,
    ("worker", "consolidate"): COMMITTER
    | {"MEMFABRIC_CONSOLIDATOR_LOGIN", "MEMFABRIC_CONSOLIDATOR_URL", "MEMFABRIC_WORKER_PRIORITY"},
    ("worker", "decay"): MAINTAINER,
    ("decay",): MAINTAINER,
    ("erase",): MAINTAINER | REDIS,
    ("db", "reindex-text"): DATABASE | {"MEMFABRIC_MIGRATOR_URL"},
    ("worker", "trace"): TRACE,
    ("working", "up"): REDIS,
    ("working", "down"): REDIS,
    ("working", "grant-tenant"): DATABASE | REDIS,
    ("working", "cap-ttl"): REDIS,
    ("import",): COMMITTER,
    ("entities", "merge-propose"): DATABASE
    | {"MEMFABRIC_CONSOLIDATOR_LOGIN", "MEMFABRIC_CONSOLIDATOR_URL"},
    ("entities", "merges"): DATABASE,
    ("entities", "merge-decide"): DATABASE,
    ("entities", "merge-apply"): DATABASE
    | {"MEMFABRIC_CONSOLIDATOR_LOGIN", "MEMFABRIC_CONSOLIDATOR_URL"},
    ("rebuild",): PROJECTION,
    ("vectors", "build-index"): {"MEMFABRIC_SOCKET", "MEMFABRIC_VECTOR_DIR", "QDRANT_URL"},
    ("vectors", "status"): {"MEMFABRIC_SOCKET", "MEMFABRIC_VECTOR_DIR", "QDRANT_URL"},
    ("vectors", "prune"): {
        "MEMFABRIC_SOCKET",
        "MEMFABRIC_VECTOR_DIR",
        "QDRANT_URL",
        "QDRANT_API_KEY",
    },
    ("drill",): PROJECTION,
    ("verify",): PROJECTION,
    ("check",): PROJECTION
    | {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "MEMORY_API_KEY"},
    ("serve",): PROJECTION | COMMITTER | TRACE,
    ("recall",): DATABASE
    | {"MEMFABRIC_SOCKET", "QDRANT_URL", "MEMFABRIC_PROJECTOR_LOGIN", "MEMFABRIC_PROJECTOR_URL"},
    ("mcp", "stdio"): DATABASE
    | {"MEMFABRIC_SOCKET", "QDRANT_URL", "MEMFABRIC_AGENT_LOGIN", "MEMFABRIC_RUN_ID"}
    | {"MEMFABRIC_MCP_PASSFILE"},
    ("mcp", "http"): DATABASE
    | {"MEMFABRIC_SOCKET", "QDRANT_URL", "MEMFABRIC_MCP_GATEWAY_LOGIN", "MEMFABRIC_MCP_PASSFILE"},
}


def commands(group: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


def test_every_command_is_listed_here() -> None:
    assert set(commands(get_command(app))) == set(READS)


@pytest.mark.parametrize("path", sorted(READS), ids=" ".join)
def test_help_names_the_environment_variables_the_command_reads(path: tuple[str, ...]) -> None:
    result = invoke(clean_env(), *path, "--help")
    assert result.exit_code == 0, result.output
    assert "Environment:" in result.stdout
    for name in READS[path]:
        assert f"{name}:" in result.stdout, (name, result.stdout)
    command: Any = get_command(app)
    for part in path:
        command = command.commands[part]
    assert command.help, f"{' '.join(path)} has no docstring"


def test_login_options_read_their_environment_variable() -> None:
    result = invoke(clean_env(), "worker", "consolidate", "--help")
    assert "env var: MEMFABRIC_CONSOLIDATOR_LOGIN" in result.stdout
    assert "env var: MEMFABRIC_COMMITTER_LOGIN" in result.stdout
    result = invoke(clean_env(), "mcp", "stdio", "--help")
    assert "env var: MEMFABRIC_AGENT_LOGIN" in result.stdout
    assert "env var: MEMFABRIC_RUN_ID" in result.stdout


@pytest.mark.parametrize("path", [("serve",), ("worker", "trace")], ids=" ".join)
@pytest.mark.parametrize(
    ("args", "env", "port"),
    [
        ((), {}, None),
        ((), {"MEMFABRIC_METRICS_PORT": "9464"}, 9464),
        ((), {"MEMFABRIC_METRICS_PORT": "0"}, None),  # as Settings reads it: off
        (("--metrics-port", "0"), {}, 0),  # a free port
        (("--metrics-port", "9000"), {"MEMFABRIC_METRICS_PORT": "9464"}, 9000),
    ],
)
def test_metrics_port_option_reads_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
    path: tuple[str, ...],
    args: tuple[str, ...],
    env: dict[str, str],
    port: int | None,
) -> None:
    result = invoke(clean_env(), *path, "--help")
    assert "env var: MEMFABRIC_METRICS_PORT" in result.stdout, result.stdout
    monkeypatch.delenv("MEMFABRIC_METRICS_PORT", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    command: Any = get_command(app)
    for part in path:
        command = command.commands[part]
    with command.make_context(path[-1], list(args)) as ctx:
        assert ctx.params["metrics_port"] == port


# -- one Settings for every connection knob -------------------------------------------------------


def test_settings_defaults() -> None:
    s = Settings.from_env({})
    assert s.database_url == "postgresql://postgres@127.0.0.1:54329/memfabric"
    assert not s.database_url_set
    assert (s.committer_login, s.consolidator_login, s.projector_login) == (
        "os_agt_010",
        "os_agt_011",
        "memfabric_projector",
    )
    assert s.graph_uri == "bolt://127.0.0.1:57687"
    assert (s.qdrant_url, s.neo4j_uri, s.migrator_url) == (None, None, None)
    assert s.socket == ROOT / ".local" / "run" / "memfabric.sock"
    with pytest.raises(AttributeError):
        s.pgport = 1  # type: ignore[misc]  # frozen


def test_settings_overrides_and_empty_values() -> None:
    s = Settings.from_env(
        {
            "PGPORT": "6000",
            "MEMFABRIC_COMMITTER_LOGIN": "",  # empty counts as unset
            "MEMFABRIC_CONSOLIDATOR_URL": "postgresql://c@db/x",
            "MEMFABRIC_PROJECTOR_LOGIN": "proj",
            "GRAPH_BOLT_PORT": "7001",
        }
    )
    assert s.database_url == "postgresql://postgres@127.0.0.1:6000/memfabric"
    assert s.committer_login == "os_agt_010"
    assert s.conninfo("consolidator") == "postgresql://c@db/x"  # the URL wins over the login
    assert s.conninfo("projector") == mfdb.url_for(s.database_url, "proj")
    assert s.conninfo("committer", "other") == mfdb.url_for(s.database_url, "other")
    assert s.graph_uri == "bolt://127.0.0.1:7001"
    assert s.login_variable("proj") == "MEMFABRIC_PROJECTOR_LOGIN"
    assert s.login_variable("mf_agent_a") is None


def test_consolidate_honours_the_url_overrides(fabric: Fabric) -> None:
    """DATABASE_URL points nowhere: only the two `_URL` overrides can reach the fabric."""
    with fabric.connect("mf_admin") as admin:
        admin.execute("SELECT fabric_api.enable_agent('acme', 'os-agt-011', '{}'::text[])")
    env = clean_env(
        DATABASE_URL=f"postgresql://postgres@127.0.0.1:{closed_port()}/memfabric",
        MEMFABRIC_CONSOLIDATOR_URL=mfdb.url_for(fabric.url, "mf_consolidator"),
        MEMFABRIC_COMMITTER_URL=mfdb.url_for(fabric.url, "mf_committer"),
    )
    result = invoke(env, "worker", "consolidate", "--tenant", "acme", "--once")
    assert result.exit_code == 0, result.output
    assert "[consolidate] acme: 0 candidates" in result.stdout


def _consolidator_env(fabric: Fabric) -> dict[str, str]:
    """The environment of a consolidation worker of acme started from the CLI (its agent
    enabled there): this process's, without foreign settings, and the worker's URLs."""
    with fabric.connect("mf_admin") as admin:
        admin.execute("SELECT fabric_api.enable_agent('acme', 'os-agt-011', '{}'::text[])")
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env |= {
        "MEMFABRIC_CONSOLIDATOR_URL": mfdb.url_for(fabric.url, "mf_consolidator"),
        "MEMFABRIC_COMMITTER_URL": mfdb.url_for(fabric.url, "mf_committer"),
        "DATABASE_URL": fabric.url,
    }
    return env


@contextmanager
def _consolidating(options: list[str], env: dict[str, str]) -> Iterator[int]:
    """`memfabric worker consolidate --tenant acme` with `options`, in its own process: its
    pid once its first run has finished (its connections are open); stopped after."""
    argv = [str(MEMFABRIC), "worker", "consolidate", "--tenant", "acme", "--interval", "60"]
    proc = subprocess.Popen([*argv, *options], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "[consolidate] acme" in line, line
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _policies(pid: int) -> set[int]:
    """The scheduling policy of every thread of a process."""
    return {os.sched_getscheduler(int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir()}


@pytest.mark.parametrize("how", ["option", "environment"])
def test_consolidate_at_idle_priority_runs_every_thread_under_sched_idle(
    fabric: Fabric, how: str
) -> None:
    """The worker process itself, as started from the CLI, with its connections open: each of
    its threads is SCHED_IDLE (a default worker's are not)."""
    env = _consolidator_env(fabric)
    for priority in ("normal", "idle"):
        run_env, options = dict(env), ["--priority", priority]
        if how == "environment":
            options, run_env["MEMFABRIC_WORKER_PRIORITY"] = [], priority
        with _consolidating(options, run_env) as pid:
            policies = _policies(pid)
        expected = {os.SCHED_IDLE} if priority == "idle" else {os.SCHED_OTHER}
        assert policies == expected, (priority, policies)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_consolidate_pinned_runs_every_thread_on_the_cpus_named(fabric: Fabric, how: str) -> None:
    """The worker process as started from the CLI, with its connections open: each of its
    threads may run on the CPU named and no other (an unpinned worker's on all of ours; on a
    one-CPU host both are that CPU, and the test still checks the option is applied)."""
    env = _consolidator_env(fabric)
    ours = os.sched_getaffinity(0)
    last = max(ours)
    for cpus in (None, str(last)):
        run_env, options = dict(env), []
        if cpus is not None and how == "option":
            options = ["--cpus", cpus]
        elif cpus is not None:
            run_env["MEMFABRIC_WORKER_CPUS"] = cpus
        with _consolidating(options, run_env) as pid:
            placements = [
                os.sched_getaffinity(int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()
            ]
        expected = ours if cpus is None else {last}
        assert placements and all(p == expected for p in placements), (cpus, placements)


@pytest.mark.parametrize(
    ("cpus", "says"),
    [
        ("1-", "not a CPU list"),
        ("a", "not a CPU list"),
        ("3-1", "empty range"),
        ("4096", "not one this process may run on"),
    ],
)
def test_consolidate_refuses_a_bad_cpu_list_before_it_starts(cpus: str, says: str) -> None:
    result = invoke(clean_env(), "worker", "consolidate", "--tenant", "acme", "--cpus", cpus)
    assert result.exit_code == 2, result.output
    assert "--cpus" in result.output and says in result.output, result.output


def test_consolidate_refuses_an_unknown_priority() -> None:
    result = invoke(clean_env(), "worker", "consolidate", "--tenant", "acme", "--priority", "low")
    assert result.exit_code == 2
    assert "--priority" in result.output


# -- make help -----------------------------------------------------------------------------------


def test_make_help_prints_the_ports_in_use() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env = {**base, "PGPORT": "61234", "GRAPH_BOLT_PORT": "61235", "GRAPH_HTTP_PORT": "61236"}
    out = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    for port in ("127.0.0.1:61234", "127.0.0.1:61235", "127.0.0.1:61236"):
        assert port in out, out
    defaults = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, env=base, capture_output=True, text=True, check=True
    ).stdout
    for port in ("127.0.0.1:54329", "127.0.0.1:57687", "127.0.0.1:52480"):
        assert port in defaults, defaults
