"""The `memfabric` command line: database lifecycle, the demo and the workers.

Expected failures (a refusal by the database, a service not answering, a projection never
built) print one line on stderr and exit 1; `memfabric --debug …` shows the traceback.
Connection settings come from `Settings.from_env()`; each command's `--help` lists the
environment variables it reads.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from memfabric import db, errors
from memfabric.priority import Priority
from memfabric.settings import (
    COMMITTER_ENV,
    CONSOLIDATOR_ENV,
    DATABASE_ENV,
    DEFAULT_COMMITTER_LOGIN,
    DEFAULT_CONSOLIDATOR_LOGIN,
    DEFAULT_MAINTAINER_LOGIN,
    DEFAULT_MCP_GATEWAY_LOGIN,
    DEFAULT_TRACER_LOGIN,
    ENVIRONMENT,
    MAINTAINER_ENV,
    MCP_GATEWAY_ENV,
    MCP_STDIO_ENV,
    PROJECTION_ENV,
    RECALL_ENV,
    REDIS_ENV,
    TRACE_ENV,
    Settings,
)

if TYPE_CHECKING:
    from memfabric.operational import OpsGate


class FabricGroup(TyperGroup):
    """The root command: runs the subcommand and turns an expected failure into one line
    on stderr and exit status 1, unless --debug asks for the traceback."""

    def invoke(self, ctx: Any) -> Any:  # a click context (typer vendors click)
        try:
            return super().invoke(ctx)
        except (typer.TyperException, typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            line = errors.one_line(exc)
            if line is None or ctx.params.get("debug"):
                raise
            typer.echo(line, err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=FabricGroup,
    help="memfabric: a Postgres-native memory fabric control plane.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals hold connection URLs
)
db_app = typer.Typer(
    help="The database: local server lifecycle and migrations.", no_args_is_help=True
)
worker_app = typer.Typer(help="Background workers.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(worker_app, name="worker")
working_app = typer.Typer(
    help="The working tier (Redis): local server and tenant ACL users.", no_args_is_help=True
)
app.add_typer(working_app, name="working")
mcp_app = typer.Typer(
    help="The fabric as MCP tools (memory_recall, memory_get, memory_propose).",
    no_args_is_help=True,
)
app.add_typer(mcp_app, name="mcp")
vectors_app = typer.Typer(
    help="The vector collections: the embedded shards' HNSW index, superseded collections.",
    no_args_is_help=True,
)
app.add_typer(vectors_app, name="vectors")
entities_app = typer.Typer(
    help="Entities of the graph tier: same-as merges, proposed by the consolidator, decided "
    "by policy, then applied.",
    no_args_is_help=True,
)
app.add_typer(entities_app, name="entities")


@app.callback()
def main(
    debug: bool = typer.Option(
        False, "--debug", help="show the traceback of a failure instead of one line"
    ),
) -> None:
    """memfabric: a Postgres-native memory fabric control plane."""


def env_help(*names: str) -> str:
    """A command's epilog: the environment variables it reads, one per line."""
    return "Environment:\n\n" + "\n\n".join(f"{name}: {ENVIRONMENT[name]}" for name in names)


def _committer_login_option(help_text: str = "the committer's login") -> Any:
    return typer.Option(DEFAULT_COMMITTER_LOGIN, envvar="MEMFABRIC_COMMITTER_LOGIN", help=help_text)


def _metrics_port_option() -> Any:
    return typer.Option(
        None,
        envvar="MEMFABRIC_METRICS_PORT",
        callback=_environment_zero_is_off,
        help="serve /healthz and /metrics on 127.0.0.1 at this port (0 in the environment: off)",
    )


def _environment_zero_is_off(ctx: Any, param: Any, value: int | None) -> int | None:
    """MEMFABRIC_METRICS_PORT=0 means off, as Settings reads it; `--metrics-port 0` still
    picks a free port."""
    source = ctx.get_parameter_source(param.name)
    return None if value == 0 and getattr(source, "name", None) == "ENVIRONMENT" else value


def _require_known_schema(conninfo: str) -> None:
    """Refuse to start a worker or `serve` on a schema revision this package does not know
    (one line naming both revisions; an older one says to migrate)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        db.require_known_revision(conn)


def _stop_on_sigterm(stopping: Any = None) -> None:
    """SIGTERM (`docker stop`, systemd, `kill`) stops a long-running command the way Ctrl-C
    does, through its own clean-up: the projector flushes and moves its cursor, the socket
    file is removed.
    Without this, SIGTERM ended the process where it stood, and a command started with
    SIGINT ignored (a background job of a shell without job control) could not be stopped
    gracefully at all. With `stopping` (a threading.Event), either signal sets it instead,
    and nothing is raised: every loop of the command watches it and ends the way it does
    when asked (an exception raised wherever the signal lands, inside a database or graph
    driver's write, can escape the driver's own clean-up as another error); a second one
    raises, for an operator who will not wait. A line says so, from a thread: a signal
    handler must not write to a stream the interrupted code may be writing to."""
    import signal
    import threading

    def interrupt(_signum: int, _frame: object) -> None:
        if stopping is None or stopping.is_set():
            raise KeyboardInterrupt  # a second signal: stop where it stands
        stopping.set()

    if stopping is not None:

        def say() -> None:
            stopping.wait()
            typer.echo("[serve] stopping")

        threading.Thread(target=say, name="memfabric-stopping", daemon=True).start()

    signal.signal(signal.SIGTERM, interrupt)
    if stopping is not None and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt)


def _local_script(name: str, command: str, instead: str) -> Path:
    """The checkout's scripts/<name>, which manages a local server; an installed package
    does not carry it (the server it would install lives in the checkout), so without it
    one line says what to run instead."""
    script = db.ROOT / "scripts" / name
    if not script.is_file():
        raise errors.OperationalFailure(
            f"`memfabric {command}` manages the local server of a memfabric checkout "
            f"(scripts/{name}), which this installation does not have",
            hint=instead,
        )
    return script


_DB_INSTEAD = (
    "point DATABASE_URL at your PostgreSQL 17 server (with pgvector) and run `memfabric db "
    "migrate`; or run `memfabric db up` from a checkout of memfabric"
)
_REDIS_INSTEAD = (
    "set REDIS_URL to your Redis server (6.2 or later) and give each tenant its user with "
    "`memfabric working grant-tenant TENANT`; or run `memfabric working up` from a checkout"
)


def _db_script(*args: str) -> None:
    if Settings.from_env().database_url_set and args[0] in ("up", "down"):
        typer.echo("DATABASE_URL is set: the local server is not used")
        return
    code = subprocess.call([str(_local_script("db.sh", f"db {args[0]}", _DB_INSTEAD)), *args])
    if code:
        raise typer.Exit(code)


@db_app.command("up", epilog=env_help(*DATABASE_ENV))
def db_up() -> None:
    """Install PostgreSQL 17 if needed and start the local server (127.0.0.1:$PGPORT)."""
    _db_script("up")


@db_app.command("down", epilog=env_help(*DATABASE_ENV))
def db_down() -> None:
    """Stop the local server."""
    _db_script("down")


@db_app.command("status", epilog=env_help("PGPORT"))
def db_status() -> None:
    """Say whether the local server is running."""
    _db_script("status")


@db_app.command("migrate", epilog=env_help(*DATABASE_ENV, "MEMFABRIC_MIGRATOR_URL"))
def db_migrate() -> None:
    """Bootstrap (superuser), alembic upgrade head (migration role), replay sql/ and rls/."""
    url = Settings.from_env().database_url
    db.migrate(
        url,
        progress=lambda line: typer.echo(f"[migrate] {line}"),
        warn=lambda line: typer.echo(f"[migrate] WARNING: {line}", err=True),
    )
    typer.echo("[migrate] at head")


@db_app.command("reindex-text", epilog=env_help(*DATABASE_ENV, "MEMFABRIC_MIGRATOR_URL"))
def db_reindex_text() -> None:
    """Rebuild search text and statistics after text_search_config changed (migration role)."""
    typer.echo(f"[reindex-text] {json.dumps(db.reindex_text(Settings.from_env().database_url))}")


@app.command(epilog=env_help(*DATABASE_ENV, "MEMFABRIC_LLM_URL", "MEMFABRIC_LLM_MODEL"))
def demo(
    formation: bool = typer.Option(
        False,
        help="the formation scene instead: a conversation formed into memory by the model "
        "MEMFABRIC_LLM_URL or MEMFABRIC_LLM_MODEL names (smollm2: the test model), at "
        "temperature 0",
    ),
) -> None:
    """A narrated scenario: tenant, agents with their own logins, a run, proposals, commits."""
    from memfabric.demo import run_demo, run_formation_scene

    url = Settings.from_env().database_url
    if formation:
        from memfabric.llm import from_env

        llm = from_env()
        if llm is None:
            raise errors.Misconfigured(
                "the formation scene needs a model",
                hint="MEMFABRIC_LLM_MODEL=smollm2 (the test model) or MEMFABRIC_LLM_URL",
            )
        run_formation_scene(url, llm)
        sys.exit(0)
    sys.exit(run_demo(url))


@worker_app.command("commit", epilog=env_help(*COMMITTER_ENV))
def worker_commit(
    login: str = _committer_login_option(
        "the committer's login (a member of fabric_committer, registered as an agent)"
    ),
    once: bool = typer.Option(False, help="drain what is validated now, then exit"),
    batch: int = typer.Option(100, min=1, max=10000, help="proposals per transaction"),
    poll: float = typer.Option(1.0, min=0.05, help="seconds between polls when idle"),
) -> None:
    """Commit validated proposals as they arrive (safe to run several at once)."""
    from memfabric.worker import run_committer

    conninfo = Settings.from_env().conninfo("committer", login)
    _require_known_schema(conninfo)
    committed, rejected = run_committer(
        conninfo,
        batch=batch,
        once=once,
        poll_seconds=poll,
        progress=lambda line: typer.echo(f"[commit] {line}"),
    )
    typer.echo(f"[commit] done: {committed} committed, {rejected} rejected at commit")


@worker_app.command(
    "consolidate",
    epilog=env_help(
        *COMMITTER_ENV,
        "MEMFABRIC_CONSOLIDATOR_LOGIN",
        "MEMFABRIC_CONSOLIDATOR_URL",
        "MEMFABRIC_LLM_URL",
        "MEMFABRIC_LLM_MODEL",
        "MEMFABRIC_WORKER_PRIORITY",
        "MEMFABRIC_WORKER_CPUS",
    ),
)
def worker_consolidate(
    tenant: list[str] = typer.Option(..., help="tenant(s) to consolidate"),
    consolidator_login: str = typer.Option(
        DEFAULT_CONSOLIDATOR_LOGIN,
        envvar="MEMFABRIC_CONSOLIDATOR_LOGIN",
        help="the consolidator's login (member of fabric_consolidator, registered as an agent)",
    ),
    committer_login: str = _committer_login_option(),
    once: bool = typer.Option(False, help="run the workflow once, then exit"),
    interval: float = typer.Option(300.0, min=1.0, help="seconds between scheduled runs"),
    budget: int | None = typer.Option(
        None,
        min=0,
        help="recommendations (or, with a model, episodes) per run; the rest is deferred "
        "(default: the instance's consolidation_budget)",
    ),
    subject: str | None = typer.Option(
        None, help="only this subject's episodes (on demand, e.g. at the end of a run)"
    ),
    checkpoint_login: str | None = typer.Option(
        None,
        help="with a model: checkpoint the reflect-and-revise graph as this login (member of "
        "fabric_checkpointer), so an interrupted item resumes where it stopped",
    ),
    priority: Priority = typer.Option(
        Priority.normal,
        envvar="MEMFABRIC_WORKER_PRIORITY",
        case_sensitive=False,
        help="idle: run only on cores that would otherwise idle (Linux SCHED_IDLE), so an "
        "in-process model never delays the hot path; on a saturated host it then forms nothing "
        "until load drops (measured: it does not keep the hot path's latency on a 6.x "
        "kernel; --cpus did better)",
    ),
    cpus: str | None = typer.Option(
        None,
        envvar="MEMFABRIC_WORKER_CPUS",
        help="pin the worker, its model's threads included, to these CPUs (Linux cpulist: "
        "1, 2-3, 0,2-3) and leave the others to the database and the agents",
    ),
) -> None:
    """Run WF-OS-MEMORY-CONSOLIDATE on a schedule: candidates, consolidator (deterministic, or
    reflect-and-revise with the model MEMFABRIC_LLM_URL or MEMFABRIC_LLM_MODEL names),
    validation, policy gate, commit, Outcome Envelope."""
    import psycopg

    from memfabric.priority import PlacementUnavailable, PriorityUnavailable, apply, pin

    try:
        apply(priority)  # before the model loads: its threads inherit the policy
    except PriorityUnavailable as exc:
        raise typer.BadParameter(str(exc), param_hint="--priority") from exc
    if cpus is not None:
        try:
            pin(cpus)  # before the model loads, likewise
        except PlacementUnavailable as exc:
            raise typer.BadParameter(str(exc), param_hint="--cpus") from exc

    from memfabric.consolidate import (
        ModelConsolidator,
        require_instance_endpoint,
        run_consolidation,
        seed_instance_endpoint,
    )
    from memfabric.llm import from_env
    from memfabric.worker import run_every

    settings = Settings.from_env()
    reader_conninfo = settings.conninfo("consolidator", consolidator_login)
    committer_conninfo = settings.conninfo("committer", committer_login)
    _require_known_schema(reader_conninfo)
    llm = from_env()
    with psycopg.connect(reader_conninfo, autocommit=True) as reader:
        if llm is not None and not settings.database_url_set:
            # a local deployment: the URL seeds the instance's model_uri where it names
            # none, as the local server's administrator (the database judges the URI)
            with psycopg.connect(settings.database_url, autocommit=True) as admin:
                for name in tenant:
                    seed_instance_endpoint(admin, reader, name, llm)
        for name in tenant:
            require_instance_endpoint(reader, name, llm)
    stack = contextlib.ExitStack()
    saver = None
    if llm is not None and checkpoint_login:
        from memfabric.db import url_for
        from memfabric.langgraph import checkpointer

        saver = stack.enter_context(checkpointer(url_for(settings.database_url, checkpoint_login)))
    consolidator = ModelConsolidator(llm, saver) if llm is not None else None

    def step() -> None:
        with (
            psycopg.connect(reader_conninfo, autocommit=True) as reader,
            psycopg.connect(committer_conninfo, autocommit=True) as committer,
        ):
            for name in tenant:
                run_consolidation(
                    reader,
                    committer,
                    name,
                    consolidator,
                    budget=budget,
                    subject_id=subject,
                    progress=lambda line: typer.echo(f"[consolidate] {line}"),
                )

    with stack:
        run_every(
            step,
            name="consolidation",
            interval=interval,
            conninfo=reader_conninfo,
            once=once,
            progress=lambda line: typer.echo(f"[consolidate] {line}"),
        )


MAINTAINER_HELP = (
    "the maintenance login that VACUUMs what erasure/decay rewrote (member of fabric_maintainer)"
)


def _maintainer_login_option() -> Any:
    return typer.Option(
        DEFAULT_MAINTAINER_LOGIN, envvar="MEMFABRIC_MAINTAINER_LOGIN", help=MAINTAINER_HELP
    )


@app.command(epilog=env_help(*MAINTAINER_ENV))
def decay(
    now: str | None = typer.Option(None, help="run as of this RFC 3339 time (default: now)"),
    login: str = _committer_login_option(),
    maintainer_login: str = _maintainer_login_option(),
) -> None:
    """Run decay once: interval expiry, operational window closure, regulated ceilings."""
    import psycopg

    from memfabric.worker import run_decay_once

    settings = Settings.from_env()
    with (
        psycopg.connect(settings.conninfo("committer", login), autocommit=True) as conn,
        psycopg.connect(
            settings.conninfo("maintainer", maintainer_login), autocommit=True
        ) as maintainer,
    ):
        typer.echo(f"[decay] {run_decay_once(conn, now, maintainer=maintainer)}")


@worker_app.command("decay", epilog=env_help(*MAINTAINER_ENV))
def worker_decay(
    login: str = _committer_login_option(),
    maintainer_login: str = _maintainer_login_option(),
    interval: float = typer.Option(3600.0, min=1.0, help="seconds between scheduled passes"),
) -> None:
    """Run decay on a schedule (never opportunistically: recall never mutates anything)."""
    import psycopg

    from memfabric.worker import run_decay_once, run_every

    settings = Settings.from_env()
    conninfo = settings.conninfo("committer", login)
    maintainer_conninfo = settings.conninfo("maintainer", maintainer_login)
    _require_known_schema(conninfo)

    def step() -> None:
        with (
            psycopg.connect(conninfo, autocommit=True) as conn,
            psycopg.connect(maintainer_conninfo, autocommit=True) as maint,
        ):
            typer.echo(f"[decay] {run_decay_once(conn, maintainer=maint)}")

    run_every(
        step,
        name="decay",
        interval=interval,
        conninfo=conninfo,
        progress=lambda line: typer.echo(f"[decay] {line}"),
    )


@app.command("erase", epilog=env_help(*MAINTAINER_ENV, *REDIS_ENV))
def erase_command(
    approval_id: str = typer.Argument(..., help="an approved erase or erase_subject approval"),
    login: str = _committer_login_option(),
    maintainer_login: str = _maintainer_login_option(),
) -> None:
    """Execute an approved erasure as the committer, leave tombstones, then VACUUM the
    touched tables as the maintenance login."""
    import psycopg

    from memfabric.worker import erase

    settings = Settings.from_env()
    with (
        psycopg.connect(settings.conninfo("committer", login), autocommit=True) as conn,
        psycopg.connect(
            settings.conninfo("maintainer", maintainer_login), autocommit=True
        ) as maintainer,
    ):
        scope = _working_scope(conn, approval_id)
        typer.echo(f"[erase] {erase(conn, approval_id, maintainer=maintainer)}")
        if scope is not None:
            _erase_working(conn, approval_id, scope)


def _working_scope(conn: Any, approval_id: str) -> dict[str, Any] | None:
    """The working-tier scope of a subject erasure, when a working tier is configured."""
    from memfabric import working

    if working.default_url() is None:
        return None
    return working.erasure_scope(conn, approval_id)


def _erase_working(conn: Any, approval_id: str, scope: dict[str, Any]) -> None:
    """Delete the erased subject's working keys; a down Redis fails the command in one line
    (the database erasure stands; the keys expire with their TTL)."""
    from memfabric import working

    url = working.default_url()
    assert url is not None
    try:
        answer = working.erase_subject(
            working.connect(url),
            scope["tenant_id"],
            scope["subject_key"],
            scope.get("legacy_subject_key"),
        )
    except working.WorkingTierUnavailable as exc:
        typer.echo(f"error: {exc}; the subject's working keys expire within their TTL", err=True)
        raise typer.Exit(1) from None
    event = working.record_erasure(conn, approval_id, answer)
    typer.echo(f"[erase] working tier: {answer} (receipt event {event})")


def _redis_script(*args: str) -> None:
    if Settings.from_env().redis_url and args[0] in ("up", "down"):
        typer.echo("REDIS_URL is set: the local server is not used")
        return
    script = _local_script("redis.sh", f"working {args[0]}", _REDIS_INSTEAD)
    raise typer.Exit(subprocess.call([str(script), *args]))


@working_app.command("up", epilog=env_help(*REDIS_ENV))
def working_up() -> None:
    """Start the local Redis server (unless REDIS_URL is set)."""
    _redis_script("up")


@working_app.command("down", epilog=env_help(*REDIS_ENV))
def working_down() -> None:
    """Stop the local Redis server."""
    _redis_script("down")


@working_app.command("grant-tenant", epilog=env_help(*DATABASE_ENV, *REDIS_ENV))
def working_grant_tenant(
    tenant: str = typer.Argument(..., help="the tenant whose workers get a Redis ACL user"),
) -> None:
    """Create (or reset) the tenant's Redis user, limited to keys mf:{tenant}:*, and print
    its URL with the new password once; the server keeps only a hash of it."""
    from memfabric import working

    url = working.default_url()
    if url is None:
        typer.echo("error: no working tier: set REDIS_URL or run `memfabric working up`", err=True)
        raise typer.Exit(1)
    import psycopg

    from memfabric.errors import FabricError

    try:
        with psycopg.connect(Settings.from_env().database_url, autocommit=True) as conn:
            working.check_uri(conn, tenant, url)

        password = working.grant_tenant(working.connect(url), tenant)
    except (working.WorkingTierUnavailable, FabricError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(working.tenant_url(url, tenant, password))


@working_app.command("cap-ttl", epilog=env_help(*REDIS_ENV))
def working_cap_ttl(
    longest: int = typer.Option(
        24 * 3600, min=1, help="the longest TTL a working key may keep, in seconds"
    ),
) -> None:
    """Cut every working key's TTL back to at most LONGEST seconds, as the admin (run it on
    a schedule): a tenant's Redis user can only write keys with a TTL, but no Redis ACL can
    bound how long it is."""
    from memfabric import working

    url = working.default_url()
    if url is None:
        typer.echo("error: no working tier: set REDIS_URL or run `memfabric working up`", err=True)
        raise typer.Exit(1)
    try:
        answer = working.cap_ttls(working.connect(url), longest)
    except working.WorkingTierUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"[working] {json.dumps(answer)}")


def _operate(op: str, **kwargs: Any) -> dict[str, Any]:
    """Run rebuild/drill/verify in `memfabric serve` when it runs (it owns the Edge
    shards), else here over the stores the environment names."""
    from memfabric import ops
    from memfabric.broker import RemoteBroker, serving
    from memfabric.runtime import close_projector, open_projector, projector_conninfo

    settings = Settings.from_env()
    if not settings.qdrant_url and serving(settings.socket):
        typer.echo(f"[{op}] asking memfabric serve ({settings.socket})")
        return RemoteBroker(settings.socket).run(op, **kwargs)
    projector = open_projector(projector_conninfo())
    try:
        if op == "verify":
            return ops.verify(projector)
        from rich.progress import Progress

        with Progress() as bar:
            task = bar.add_task(op, total=None)
            progress = lambda done, total: bar.update(task, completed=done, total=total)  # noqa: E731
            if op == "rebuild":
                return ops.rebuild(projector, kwargs["target"], progress)
            return ops.drill_declared(projector, progress)
    finally:
        close_projector(projector)


@app.command(epilog=env_help(*PROJECTION_ENV))
def rebuild(target: str = typer.Argument("all", help="qdrant, graph or all")) -> None:
    """Wipe a projection and rebuild it from Postgres alone (stored embeddings are reused)."""
    if target not in ("qdrant", "graph", "all"):
        raise typer.BadParameter("target is qdrant, graph or all")
    typer.echo(json.dumps(_operate("rebuild", target=target)))


@app.command(
    epilog=env_help(
        *PROJECTION_ENV,
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "MEMORY_API_KEY",
    )
)
def check(
    drill: bool = typer.Option(
        False, help="also run the projection drill (probes, wipes, rebuilds, probes again)"
    ),
    seal_max_age: float = typer.Option(
        300.0, min=0.0, help="seconds the oldest unsealed event may wait before sealing fails"
    ),
) -> None:
    """Run the binding checklist (docs/checklist.md) against this deployment: one line per
    item, pass / fail / deviation / not applicable, with its evidence; exits 1 on any fail.
    Reads the database as DATABASE_URL's role (a superuser sees every tenant)."""
    import psycopg

    from memfabric import check as checklist

    settings = Settings.from_env()
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        results = checklist.run(
            conn, drill=(lambda: _operate("drill")) if drill else None, seal_max_age=seal_max_age
        )
    for result in results:
        typer.echo(result.line())
    failed = [r for r in results if r.status == checklist.FAIL]
    counts = {s: sum(r.status == s for r in results) for s in checklist.STATUSES}
    typer.echo(f"checked {len(results)} items: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if failed:
        raise typer.Exit(1)


@app.command(epilog=env_help(*PROJECTION_ENV))
def drill() -> None:
    """Probe, wipe, rebuild, probe again: fails unless both answers are identical."""
    result = _operate("drill")
    if result.get("never_built"):
        names = " and ".join(result["never_built"])
        raise errors.NotBuilt(
            f"the {names} projection{'s were' if len(result['never_built']) > 1 else ' was'} "
            f"never built ({result['records']} records in PostgreSQL, none projected): "
            "there is nothing to drill",
            hint="build them with `memfabric rebuild all` (or run `memfabric serve`, which "
            "projects continuously), then drill",
        )
    typer.echo(json.dumps(result))
    if not result["identical"]:
        raise typer.Exit(1)


@app.command(epilog=env_help(*PROJECTION_ENV))
def verify() -> None:
    """Compare counts and payload hashes between Postgres and each projection."""
    result = _operate("verify")
    typer.echo(json.dumps(result))
    if not result["ok"]:
        raise typer.Exit(1)


@worker_app.command("trace", epilog=env_help(*TRACE_ENV))
def worker_trace(
    login: str = typer.Option(
        DEFAULT_TRACER_LOGIN,
        envvar="MEMFABRIC_TRACER_LOGIN",
        help="the tracer's login (a member of fabric_tracer)",
    ),
    once: bool = typer.Option(False, help="export what is in the outbox now, then exit"),
    poll: float = typer.Option(1.0, min=0.05, help="seconds between polls when idle"),
    metrics_port: int | None = _metrics_port_option(),
    console: bool = typer.Option(
        False, help="print the spans on standard output instead of exporting them (OTLP)"
    ),
) -> None:
    """Export every recall and tool denial in the outbox as an OpenTelemetry span (OTLP/HTTP)."""
    import psycopg

    from memfabric.tracing import SpanMaker, tracer_conninfo

    _require_known_schema(tracer_conninfo(login))
    maker = SpanMaker(
        tracer_conninfo(login),
        progress=lambda line: typer.echo(f"[trace] {line}"),
        console=console,
    )
    _start_metrics(metrics_port, maker)
    _stop_on_sigterm()
    try:
        if once:
            with psycopg.connect(maker.conninfo, autocommit=True) as conn:
                typer.echo(f"[trace] done: {maker.drain(conn)} events traced")
        else:
            maker.run(poll_seconds=poll)
    except KeyboardInterrupt:
        pass
    finally:
        maker.shutdown()


def _start_metrics(
    port_option: int | None, maker: Any = None, projector: Any = None, sealer: str | None = None
) -> None:
    from memfabric.metrics import metrics_port, serve_metrics

    port = metrics_port(port_option)
    if port is None:
        return
    gauges: dict[str, Any] = {}
    if maker is not None:
        gauges["memfabric_events_traced_total"] = (
            "counter",
            "events exported as spans",
            lambda: maker.traced,
        )
        gauges["memfabric_trace_errors_total"] = (
            "counter",
            "failed trace exports",
            lambda: maker.errors,
        )
        gauges["memfabric_trace_lag"] = ("gauge", "traced events not yet exported", maker.lag)
    if projector is not None:
        from memfabric import ops

        gauges["memfabric_projection_lag"] = (
            "gauge",
            "outbox events not yet projected",
            lambda: ops.projection_lag(projector),
        )
    if sealer is not None:  # the sealer's login reads how far sealing is behind
        from memfabric.worker import sealing_gauges

        gauges.update(sealing_gauges(sealer))
    families = [maker.recalls.exposition] if maker is not None else []
    server = serve_metrics(port, gauges, families)
    typer.echo(f"[metrics] http://127.0.0.1:{server.server_address[1]}/metrics")


@app.command(epilog=env_help(*PROJECTION_ENV, *COMMITTER_ENV[2:], *TRACE_ENV[2:]))
def serve(
    poll: float = typer.Option(1.0, min=0.05, help="seconds between polls when idle"),
    metrics_port: int | None = _metrics_port_option(),
    rebuild_on_contract_change: bool = typer.Option(
        True,
        help="when the collection contract changed (the embedder's model, version or text "
        "rule, or the vector payload version: an upgrade or a new embedder setting), rebuild "
        "qdrant at start, in the background, then drop the collections no alias points at "
        "any more; so too a projection whose last rebuild did not end",
    ),
    graph: bool = typer.Option(
        True, help="project to the graph server too (--no-graph: the vector broker alone)"
    ),
    while_users: Path | None = typer.Option(
        None,
        help="run only while some process uses this broker (holds the shared lock in this "
        "run directory, as memfabric.Memory does): the broker started on demand",
    ),
) -> None:
    """Own the vector shards, run the projector and answer vector queries on a unix socket;
    seal the audit trail as the committer (MEMFABRIC_COMMITTER_URL or _LOGIN); with
    OTEL_EXPORTER_OTLP_ENDPOINT set, also export every recall as a span. When the collection
    contract changed since the last start (the embedder, or the vector payload version), the
    new vector collections are filled from PostgreSQL in the background (as `memfabric
    rebuild qdrant` would; the projector waits, recall is served meanwhile from what is
    already in them); so is a projection whose last rebuild began and did not end. Once that
    rebuild has ended, the embedded collections no alias points at are dropped (on a Qdrant
    server they stay until `memfabric vectors prune --yes`: a process of the older version
    may still be using them)."""
    import threading

    from memfabric import ops
    from memfabric.broker import LocalBroker, serve_socket, serving
    from memfabric.runtime import (
        close_projector,
        deployment_embedder,
        open_projector,
        projector_conninfo,
    )
    from memfabric.vectors import EdgeVectorStore

    socket = Settings.from_env().socket
    if serving(socket):
        raise errors.OperationalFailure(
            f"memfabric serve is already running on {socket}",
            hint="use that one, or give a second one its own MEMFABRIC_SOCKET and "
            "MEMFABRIC_VECTOR_DIR",
        )
    lock = threading.Lock()
    settings = Settings.from_env()
    in_child = settings.projector_embed == "child"
    # from here on SIGTERM and Ctrl-C set `stop`, which every loop of serve watches (before
    # the socket exists: a stop at any moment after leaves no socket file and no
    # half-written batch)
    stop = threading.Event()  # serve is stopping: every loop and rebuild of it watches this
    _stop_on_sigterm(stop)

    def start() -> tuple[Any, Any, dict[str, Any]]:
        """The schema check, the projector, the query embedder and the rebuilds left
        unfinished: everything of the start that reads the database."""
        _require_known_schema(projector_conninfo())
        projector = open_projector(
            projector_conninfo(),
            embed_in_child=in_child,
            serving=True,
            guard=lock,
            graph=graph,
            progress=lambda line: typer.echo(f"[project] {line}"),
            flush_seconds=settings.projector_flush_ms / 1000,
        )
        try:
            assert projector.store is not None
            # Queries embed here, never behind a projector batch in the child.
            query_embedder = (
                deployment_embedder(projector_conninfo()) if in_child else projector.embedder
            )
            return projector, query_embedder, projector.unfinished_rebuilds()
        except BaseException:
            close_projector(projector)
            raise

    started = _when_the_database_answers(start, stop)
    if started is None:  # stopped while waiting for the database
        return
    projector, query_embedder, unfinished = started
    if stop.is_set():  # stopped while starting
        close_projector(projector)
        return
    vectors = projector.store
    assert vectors is not None  # serve opens the vector store (start)
    # The declared operational stores (Qdrant Edge): this process owns their shards and
    # serves each login its allowlist (MEMFABRIC_OPS_GRANTS) over the socket.
    try:
        gate = _ops_gate(projector_conninfo())
    except BaseException:
        close_projector(projector)
        raise

    def drill() -> dict[str, Any]:
        if gate is None:
            return ops.drill_declared(projector, _until(stop))
        with gate.lock:
            return ops.drill(projector, _until(stop), operational=gate.stores)

    broker = LocalBroker(
        vectors,
        query_embedder,
        {
            # asked through the socket, they too end after their current page on a stop
            "rebuild": lambda target="all": ops.rebuild(projector, target, _until(stop)),
            "drill": drill,
            "verify": lambda: ops.verify(projector),
            "build_index": lambda tiers=None: _edge_store(projector.store).build_index(tiers),
            "index_status": lambda: _edge_store(projector.store).index_status(),
            "prune": lambda drop=False: ops.prune(vectors, drop=drop),
        },
    )
    server, rebuilding, maker = None, None, None
    try:
        server = serve_socket(broker, socket, lock, gate)
        targets = ["qdrant"] if projector.contract_change is not None else []
        for projection, began in sorted(unfinished.items()):
            typer.echo(
                f"[rebuild] a rebuild of {projection} began at {began:%Y-%m-%d %H:%M:%S %Z} and did"
                " not end: the projection may be incomplete"
            )
            targets += [] if projection in targets else [projection]
        if targets:
            if rebuild_on_contract_change:
                rebuilding = _rebuild_in_background(projector, lock, targets, stop)
            else:
                typer.echo(
                    "[rebuild] not started (--no-rebuild-on-contract-change): run"
                    f" `memfabric rebuild {targets[0] if len(targets) == 1 else 'all'}`"
                )
        from memfabric.worker import run_sealer

        sealer = Settings.from_env().conninfo("committer")
        threading.Thread(
            target=run_sealer,
            args=(sealer,),
            kwargs={
                "poll_seconds": poll,
                "progress": lambda line: typer.echo(f"[seal] {line}"),
                "should_stop": stop.is_set,
            },
            name="memfabric-sealer",
            daemon=True,
        ).start()
        where = "in a child process" if in_child else "inline"
        shards = ""
        if isinstance(projector.store, EdgeVectorStore):
            shards = ", shards " + (
                "in child processes" if projector.store.shard_processes else "inline"
            )
        typer.echo(
            f"[serve] listening on {socket}; projecting to qdrant{' and graph' if graph else ''}"
            f" ({settings.projector_pipeline}, embedding with {projector.embedder.model}"
            f" {where}{shards})"
        )
        if gate is not None:
            typer.echo(
                f"[serve] operational stores {', '.join(s.collection.name for s in gate.stores)}"
                f" served to {len(gate.broker.logins())} allowlisted login(s)"
            )
        if settings.otlp_endpoint or settings.otlp_traces_endpoint:
            from memfabric.tracing import SpanMaker, tracer_conninfo

            maker = SpanMaker(
                tracer_conninfo(), progress=lambda line: typer.echo(f"[trace] {line}")
            )
            threading.Thread(
                target=maker.run,
                kwargs={"poll_seconds": poll, "should_stop": stop.is_set},
                daemon=True,
            ).start()
            typer.echo(f"[serve] exporting recall spans to {maker.endpoint}")
        _start_metrics(metrics_port, maker, projector, sealer)
        _start_index_builder(projector.store, settings, stop)
        if while_users is not None:
            _stop_without_users(while_users, stop)
        run = (
            projector.run_pipelined if settings.projector_pipeline == "pipelined" else projector.run
        )
        run(
            poll_seconds=poll,
            should_stop=stop.is_set,
            projections=("qdrant", "graph") if graph else ("qdrant",),
        )
    except KeyboardInterrupt:  # a SIGINT whose handler was not ours
        pass
    finally:
        stop.set()
        if rebuilding is not None:
            rebuilding.join(timeout=30)  # it stops after the page it is writing
        if maker is not None:
            maker.shutdown()
        if server is not None:
            server.shutdown()
        socket.unlink(missing_ok=True)
        close_projector(projector)
        for store in gate.stores if gate is not None else ():
            store.close()


def _ops_gate(conninfo: str) -> OpsGate | None:
    """The operational stores serve holds and the allowlist it serves them by, or None
    when the deployment declares none (MEMFABRIC_OPS_PACKS)."""
    from memfabric import operational

    stores = operational.open_declared()
    if not stores:
        return None
    try:
        return operational.OpsGate(
            stores, operational.allowlist(), operational.redeem_with(conninfo)
        )
    except BaseException:
        for store in stores:
            store.close()
        raise


def _stop_without_users(run_dir: Path, stop: Any) -> None:
    """Set `stop` once no process uses this broker (memfabric.broker.users_gone); the locks
    stay held until the process ends, so no user finds a broker that is going away."""
    import threading

    from memfabric.broker import users_gone

    def watch() -> None:
        while not stop.wait(1.0):
            if users_gone(run_dir) is not None:
                typer.echo("[serve] no user left: stopping")
                stop.set()
                return

    threading.Thread(target=watch, name="memfabric-users", daemon=True).start()


def _when_the_database_answers(start: Any, stop: Any) -> Any:
    """`start()` once PostgreSQL answers: while it is away (down, restarting, the
    connection lost mid-start) a line says so and it is tried again, after 0.5 s, doubling
    to 15 s, jittered; None if `stop` is set meanwhile. A refusal (a login, a password, the
    schema revision) is raised at once: waiting would not fix it."""
    import random

    delay = 0.5
    while True:
        try:
            return start()
        except Exception as exc:
            if not errors.database_unavailable(exc):
                raise
            line = errors.one_line(exc) or f"error: {type(exc).__name__}"
            typer.echo(
                f"[serve] waiting for PostgreSQL: {line.removeprefix('error: ')};"
                f" trying again in {delay:g} s",
                err=True,
            )
        if stop.wait(delay * random.uniform(0.8, 1.2)):  # noqa: S311 - jitter, not a secret
            return None
        delay = min(delay * 2, 15.0)


class _Stopping(Exception):
    """`memfabric serve` is stopping: a rebuild it runs ends after its current page."""


def _until(stop: Any) -> Any:
    """A rebuild's progress callback that ends it (after the page it has written) once
    `stop` is set: its note stays, and the next start of serve runs it again."""

    def progress(done: int, total: int) -> None:
        if stop.is_set():
            raise _Stopping(
                f"memfabric serve is stopping: the rebuild ended after {done:,} of {total:,}"
                " records; the next start of serve runs it again"
            )

    return progress


def _rebuild_in_background(projector: Any, lock: Any, targets: list[str], stop: Any) -> Any:
    """`memfabric rebuild` of each target, run by serve itself on a thread under its lock
    (the projector waits; searches go on), with a line at start, every tenth and at the end.
    When `stop` is set it ends after the page it is writing: the rebuild's note stays, and
    the next start runs it again."""
    import threading
    import time

    from memfabric import ops

    halt = _until(stop)

    def work() -> None:
        for target in targets:
            started, told = time.monotonic(), [-1]

            def progress(
                done: int, total: int, target: str = target, told: list[int] = told
            ) -> None:
                halt(done, total)
                tenth = done * 10 // max(total, 1)
                if tenth > told[0]:
                    told[0] = tenth
                    typer.echo(f"[rebuild] {target}: {done:,} of {total:,} records")

            what = "the new vector collections" if target == "qdrant" else "the graph"
            typer.echo(f"[rebuild] filling {what} from PostgreSQL")
            try:
                with lock:
                    result = ops.rebuild(projector, target, progress)
            except _Stopping:
                typer.echo(
                    f"[rebuild] stopped before it ended: {target} is incomplete until the"
                    " next start of serve, which rebuilds it again"
                )
                return
            except Exception as exc:  # serving goes on; the operator can run it again
                typer.echo(
                    f"[rebuild] failed: {type(exc).__name__}: {exc}; run `memfabric rebuild"
                    f" {target}` (the next start of serve runs it again)"
                )
                return
            typer.echo(
                f"[rebuild] done: {result['rebuilt'][target]:,} records in"
                f" {time.monotonic() - started:.0f} s"
            )
            if target in ("qdrant", "all"):
                _prune_after_rebuild(projector.store)

    thread = threading.Thread(target=work, name="memfabric-rebuild", daemon=True)
    thread.start()
    return thread


def _prune_after_rebuild(store: Any) -> None:
    """Once serve's rebuild has filled the collections the aliases point at, drop the
    embedded collections no alias points at: never read again (serve is the only process
    that opens the shards), they still hold what was projected into them under an older
    contract (erased records, raw subject ids before payload version 2). On a Qdrant server
    a process of the older version may still be bound to them: they are only listed there.
    A failure is told and left to `memfabric vectors prune --yes`."""
    from memfabric import ops
    from memfabric.vectors import EdgeVectorStore

    embedded = isinstance(store, EdgeVectorStore)
    try:
        found = ops.prune(store, drop=embedded)
    except Exception as exc:  # serving goes on
        typer.echo(
            f"[prune] failed: {type(exc).__name__}: {exc}; run `memfabric vectors prune --yes`"
        )
        return
    for line in _prune_lines(found):
        typer.echo(f"[prune] {line}")
    if found["collections"] and not embedded:
        typer.echo(
            "[prune] left on the Qdrant server: run `memfabric vectors prune --yes` once no"
            " process of an older version uses them"
        )


def _prune_lines(found: dict[str, Any]) -> list[str]:
    """One line per collection `ops.prune` found."""
    verb = "dropped" if found["dropped"] else "would drop"
    return [
        f"{verb} {c['collection']} ({c['name']}: {c['model']} {c['model_version']},"
        f" {c['dims']} dims, payload version {c['payload']})"
        for c in found["collections"]
    ]


VECTORS_ENV = ("MEMFABRIC_SOCKET", "MEMFABRIC_VECTOR_DIR", "QDRANT_URL")


def _edge_store(store: Any) -> Any:
    from memfabric.vectors import EdgeVectorStore

    if not isinstance(store, EdgeVectorStore):
        raise errors.OperationalFailure(
            "the vectors are on a Qdrant server (QDRANT_URL), which builds its indexes itself",
            hint="index builds are for the embedded shards (QDRANT_URL unset)",
        )
    return store


def _start_index_builder(store: Any, settings: Settings, stop: Any) -> None:
    """Every MEMFABRIC_VECTOR_INDEX_SECONDS, build the index of the embedded shards holding
    MEMFABRIC_VECTOR_INDEX_AFTER vectors outside one (0: never; a child process does the
    work on a copy, so recall and projection go on)."""
    import threading

    from memfabric.vectors import EdgeVectorStore

    after = settings.vector_index_after
    if after == 0 or not isinstance(store, EdgeVectorStore):
        return

    def loop() -> None:
        while not stop.wait(settings.vector_index_seconds):
            try:
                for tier, r in store.build_index_when_due(after).items():
                    typer.echo(f"[index] {tier}: {json.dumps(r)}")
            except Exception as exc:  # the next check tries again; serving goes on
                if stop.is_set():  # serve is stopping: closing the store ended the build
                    return
                typer.echo(f"[index] build failed: {type(exc).__name__}: {exc}")

    threading.Thread(target=loop, name="index-builder", daemon=True).start()
    typer.echo(
        f"[serve] building vector indexes once {after} vectors are outside one "
        f"(checked every {settings.vector_index_seconds} s)"
    )


def _vector_op(op: str, **kwargs: Any) -> dict[str, Any]:
    """build_index/index_status in `memfabric serve` when it runs (it owns the shards),
    else on the embedded shards here."""
    from memfabric.broker import RemoteBroker, serving
    from memfabric.vectors import EdgeVectorStore

    settings = Settings.from_env()
    if settings.qdrant_url:
        _edge_store(None)
    if serving(settings.socket):
        typer.echo(f"[{op}] asking memfabric serve ({settings.socket})", err=True)
        return RemoteBroker(settings.socket, timeout=24 * 3600.0).run(op, **kwargs)
    with EdgeVectorStore(settings.vector_dir) as store:
        result: dict[str, Any] = getattr(store, op)(**kwargs)
        return result


@vectors_app.command("build-index", epilog=env_help(*VECTORS_ENV))
def vectors_build_index(
    tier: list[str] = typer.Option(None, "--tier", help="only this tier (repeatable)"),
) -> None:
    """Build the HNSW index of the embedded vector shards now (a child process optimizes a
    copy, which is swapped in; searches and writes go on meanwhile)."""
    typer.echo(json.dumps(_vector_op("build_index", tiers=tier or None)))


@vectors_app.command("status", epilog=env_help(*VECTORS_ENV))
def vectors_status() -> None:
    """Per tier: points, vectors in an HNSW index (the others are searched exhaustively),
    segments, and whether a build is running."""
    typer.echo(json.dumps(_vector_op("index_status")))


@vectors_app.command("prune", epilog=env_help(*VECTORS_ENV, "QDRANT_API_KEY"))
def vectors_prune(
    yes: bool = typer.Option(False, "--yes", help="drop them (without it: only list them)"),
) -> None:
    """List the vector collections no alias points at, and with --yes drop them: those an
    alias cutover left behind (an upgrade, a new embedder), never read again, which still
    hold what was projected into them, erased records and (before payload version 2) raw
    subject and session ids included. Dropped for good: a projection is rebuilt from
    PostgreSQL, never restored. The embedded shards are pruned by `memfabric serve` when it
    runs (it owns them); a Qdrant server (QDRANT_URL) directly."""
    from memfabric import ops
    from memfabric.broker import RemoteBroker, serving
    from memfabric.vectors import VectorStoreLocked, store_from_env

    settings = Settings.from_env()
    if not settings.qdrant_url and serving(settings.socket):
        typer.echo(f"[prune] asking memfabric serve ({settings.socket})")
        found = RemoteBroker(settings.socket, timeout=600.0).run("prune", drop=yes)
    else:
        if not settings.qdrant_url and not (settings.vector_dir / "manifest.json").exists():
            typer.echo(f"[prune] no embedded vector collections in {settings.vector_dir}")
            return
        try:
            store = store_from_env(settings.vector_dir)
        except VectorStoreLocked as exc:
            # serve is not running (else it was asked): another process holds the shards
            raise errors.OperationalFailure(
                f"nothing pruned: {exc}",
                hint="while `memfabric serve` runs, this command asks it; any other process"
                " holding the shards (a `memfabric rebuild` without serve) must end first",
            ) from None
        try:
            found = ops.prune(store, drop=yes)
        finally:
            store.close()
    for line in _prune_lines(found):
        typer.echo(f"[prune] {line}")
    if not found["collections"]:
        typer.echo("[prune] no superseded collections: every collection is aliased")
    elif not yes:
        typer.echo("[prune] nothing dropped: run again with --yes to drop them")


@app.command("import", epilog=env_help(*COMMITTER_ENV))
def import_command(
    file: Path = typer.Argument(
        ..., exists=True, dir_okay=False, readable=True, help="JSON lines, one envelope each"
    ),
    tenant: str = typer.Option(..., help="the tenant the records are imported into"),
    import_id: str | None = typer.Option(
        None, "--import-id", help="the import's id (default: derived from the file's bytes)"
    ),
    batch: int = typer.Option(1000, min=1, max=10000, help="records per call (transaction)"),
    jobs: int = typer.Option(1, min=1, max=16, help="batches in flight (one connection each)"),
    login: str = _committer_login_option(
        "the committer's login (a member of fabric_committer, enabled in the tenant)"
    ),
) -> None:
    """Import episodic records from a JSON-lines file (docs/import.md), batch by batch.
    Exits 2 if any line was refused (the first refusals are listed), 1 on an error."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from memfabric.importer import ImportSummary, default_import_id, import_file

    iid = import_id or default_import_id(file)
    size = file.stat().st_size
    counts = TextColumn("{task.fields[n]}")
    columns = (TextColumn("[import]"), BarColumn(), DownloadColumn(), counts)
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("import", total=size, n="")

        def progress(done: int, s: ImportSummary) -> None:
            bar.update(task, completed=done, n=f"{s.formed} formed, {s.refused} refused")

        summary = import_file(
            Settings.from_env().conninfo("committer", login),
            tenant,
            file,
            iid,
            batch,
            progress,
            jobs=jobs,
        )
    before = (
        f"; {summary.replayed} {'batch' if summary.replayed == 1 else 'batches'} imported "
        f"before ({summary.formed_before} formed then, nothing written again)"
        if summary.replayed
        else ""
    )
    typer.echo(
        f"[import] {iid}: {summary.records} records in {summary.batches} batches: "
        f"{summary.formed} formed, {summary.refused} refused{before}"
    )
    for r in summary.refusals[:20]:
        typer.echo(f"[import] line {r.line}: refused ({r.sqlstate or 'rule'}): {r.reason}")
    if summary.refused > 20:
        typer.echo(f"[import] ... {summary.refused - 20} more refusals")
    if summary.refused:
        raise typer.Exit(2)


@app.command("recall", epilog=env_help(*RECALL_ENV))
def recall_command(
    login: str = typer.Option(..., help="the agent's login"),
    run_id: str = typer.Option(..., "--run", help="the agent's open run"),
    query: str | None = typer.Option(None, help="what to recall"),
    mode: str | None = typer.Option(
        None, help="text, semantic or hybrid (default: hybrid when a vector broker is reachable)"
    ),
    tier: list[str] | None = typer.Option(None, help="tiers to recall (repeatable)"),
    limit: int = typer.Option(8, min=1),
) -> None:
    """Recall as an agent (its own login), through the vector broker (`memfabric serve` or
    QDRANT_URL) for semantic and hybrid recall."""
    import psycopg

    from memfabric.recall import recall

    request: dict[str, Any] = {"run_id": run_id, "limit": limit}
    if mode:
        request["mode"] = mode
    if query:
        request["query"] = query
    if tier:
        request["tiers"] = tier
    with psycopg.connect(db.url_for(Settings.from_env().database_url, login), autocommit=True) as c:
        typer.echo(json.dumps(recall(c, request), indent=2, default=str))


def _consolidator_login_option() -> Any:
    return typer.Option(
        DEFAULT_CONSOLIDATOR_LOGIN,
        envvar="MEMFABRIC_CONSOLIDATOR_LOGIN",
        help="the consolidator's login (a member of fabric_consolidator)",
    )


def _policy_login_option() -> Any:
    return typer.Option(..., help="the policy login (a member of fabric_policy, os-agt-002)")


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


@entities_app.command("merge-propose", epilog=env_help(*CONSOLIDATOR_ENV))
def entities_merge_propose(
    entity_id: str = typer.Argument(..., help="the entity that is the same as another"),
    into_entity_id: str = typer.Argument(..., help="the entity it is the same as (it stays)"),
    tenant: str = typer.Option(..., help="the tenant of both entities"),
    reason: str = typer.Option(..., help="why they are one (policy reads it)"),
    login: str = _consolidator_login_option(),
) -> None:
    """Propose that ENTITY_ID is the same as INTO_ENTITY_ID, as the consolidator
    (fabric_api.propose_entity_merge): a pending merge_entities approval, nothing merged
    until policy approves it (`entities merge-decide`) and it is applied (`entities
    merge-apply`)."""
    import psycopg

    from memfabric.call import Cast, fabric_call

    conninfo = Settings.from_env().conninfo("consolidator", login)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        _echo_json(
            fabric_call(
                conn,
                "fabric_api.propose_entity_merge",
                tenant,
                Cast(entity_id, "uuid"),
                Cast(into_entity_id, "uuid"),
                reason,
            )
        )


@entities_app.command("merges", epilog=env_help(*DATABASE_ENV))
def entities_merges(
    tenant: str = typer.Option(..., help="the tenant whose merge proposals are listed"),
    status: str = typer.Option(
        "pending", help="pending, approved, denied, consumed (applied) or all"
    ),
    login: str = _policy_login_option(),
) -> None:
    """List a tenant's same-as merge proposals, newest first, with both entities' type and
    name and the reason, as policy (fabric_api.entity_merge_proposals): what
    `entities merge-decide` decides. JSON lines, one proposal each."""
    import psycopg

    from memfabric.call import fabric_rows

    with psycopg.connect(db.url_for(Settings.from_env().database_url, login), autocommit=True) as c:
        rows = fabric_rows(
            c, "fabric_api.entity_merge_proposals", tenant, None if status == "all" else status
        )
    for row in rows:
        typer.echo(json.dumps(row, default=str))


@entities_app.command("merge-decide", epilog=env_help(*DATABASE_ENV))
def entities_merge_decide(
    approval_id: str = typer.Argument(..., help="the merge proposal's approval id"),
    decision: str = typer.Argument(..., help="approved or denied"),
    reason: str = typer.Option(..., help="why (kept with the decision)"),
    login: str = _policy_login_option(),
) -> None:
    """Approve or deny a merge proposal, as policy (fabric_api.decide_entity_merge: a
    decision is final; an approval that is no merge proposal is refused, 55000)."""
    import psycopg

    from memfabric.call import Cast, fabric_call

    with psycopg.connect(db.url_for(Settings.from_env().database_url, login), autocommit=True) as c:
        _echo_json(
            fabric_call(
                c, "fabric_api.decide_entity_merge", Cast(approval_id, "uuid"), decision, reason
            )
        )


@entities_app.command("merge-apply", epilog=env_help(*CONSOLIDATOR_ENV))
def entities_merge_apply(
    approval_id: str = typer.Argument(..., help="an approved merge proposal"),
    login: str = _consolidator_login_option(),
) -> None:
    """Apply an approved merge once, as the consolidator (fabric_api.merge_entities): the
    merged entity stays with its mentions, its records mention the other too, and the graph
    gets a SAME_AS edge."""
    import psycopg

    from memfabric.call import Cast, fabric_call

    conninfo = Settings.from_env().conninfo("consolidator", login)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        _echo_json(fabric_call(conn, "fabric_api.merge_entities", Cast(approval_id, "uuid")))


_PASSFILE_HELP = (
    "a libpq password file holding the logins' passwords (else PGPASSFILE or ~/.pgpass)"
)


@mcp_app.command("stdio", epilog=env_help(*MCP_STDIO_ENV))
def mcp_stdio(
    login: str | None = typer.Option(
        None, envvar="MEMFABRIC_AGENT_LOGIN", help="the agent's PostgreSQL login (not its agent id)"
    ),
    run_id: str | None = typer.Option(
        None, "--run", envvar="MEMFABRIC_RUN_ID", help="the agent's open run"
    ),
    token: str | None = typer.Option(
        None,
        envvar="MEMFABRIC_AGENT_TOKEN",
        help="an agent token (fabric_api.issue_agent_token): runs are opened and renewed from "
        "its template by the gateway's login, so no run id is configured",
    ),
    gateway_login: str = typer.Option(
        DEFAULT_MCP_GATEWAY_LOGIN,
        envvar="MEMFABRIC_MCP_GATEWAY_LOGIN",
        help="with --token: the gateway's own login, a member of fabric_mcp_gateway",
    ),
    passfile: str | None = typer.Option(None, envvar="MEMFABRIC_MCP_PASSFILE", help=_PASSFILE_HELP),
) -> None:
    """Serve one agent over stdin/stdout: connects to DATABASE_URL's server and database as
    LOGIN itself (its password from the libpq sources) and calls the fabric inside RUN; or,
    with --token, as the login of the token's agent, in runs the gateway's login opens and
    renews from the token's template."""
    from memfabric.mcp_server import serve_stdio, serve_stdio_token

    url = Settings.from_env().database_url
    if token is not None:
        serve_stdio_token(url, token, gateway_login, passfile)
        return
    if login is None or run_id is None:
        raise typer.BadParameter("give --login and --run, or --token (MEMFABRIC_AGENT_TOKEN)")
    serve_stdio(url, login, run_id, passfile)


@mcp_app.command("http", epilog=env_help(*MCP_GATEWAY_ENV))
def mcp_http(
    host: str = typer.Option("127.0.0.1", help="the address to listen on"),
    port: int = typer.Option(8765, help="the port to listen on"),
    gateway_login: str = typer.Option(
        DEFAULT_MCP_GATEWAY_LOGIN,
        envvar="MEMFABRIC_MCP_GATEWAY_LOGIN",
        help="the gateway's own login, a member of fabric_mcp_gateway",
    ),
    passfile: str | None = typer.Option(None, envvar="MEMFABRIC_MCP_PASSFILE", help=_PASSFILE_HELP),
) -> None:
    """Serve agents over streamable HTTP at /mcp: each bearer token (from
    fabric_api.issue_mcp_token) stands for one agent login and one run; the gateway connects
    as that login, so the database's rules apply unchanged."""
    from memfabric.mcp_server import Gateway, serve_http

    gateway = Gateway(Settings.from_env().database_url, gateway_login, passfile)
    typer.echo(f"[mcp] streamable HTTP on http://{host}:{port}/mcp", err=True)
    serve_http(gateway, host, port)


if __name__ == "__main__":
    app()
