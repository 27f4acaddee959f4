"""The `memfabric` command line: database lifecycle, the demo and the workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import typer

from memfabric import db

app = typer.Typer(
    help="memfabric: a Postgres-native memory fabric control plane.",
    no_args_is_help=True,
    add_completion=False,
)
db_app = typer.Typer(
    help="The database: local server lifecycle and migrations.", no_args_is_help=True
)
worker_app = typer.Typer(help="Background workers.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(worker_app, name="worker")


def _db_script(*args: str) -> None:
    if os.environ.get("DATABASE_URL") and args[0] in ("up", "down"):
        typer.echo("DATABASE_URL is set: the local server is not used")
        return
    code = subprocess.call([str(db.ROOT / "scripts" / "db.sh"), *args])
    if code:
        raise typer.Exit(code)


@db_app.command("up")
def db_up() -> None:
    """Install PostgreSQL 17 if needed and start the local server (127.0.0.1:$PGPORT)."""
    _db_script("up")


@db_app.command("down")
def db_down() -> None:
    """Stop the local server."""
    _db_script("down")


@db_app.command("status")
def db_status() -> None:
    """Say whether the local server is running."""
    _db_script("status")


@db_app.command("migrate")
def db_migrate() -> None:
    """Bootstrap (superuser), alembic upgrade head (migration role), replay sql/ and rls/."""
    url = db.database_url()
    db.migrate(
        url,
        progress=lambda line: typer.echo(f"[migrate] {line}"),
        warn=lambda line: typer.echo(f"[migrate] WARNING: {line}", err=True),
    )
    typer.echo("[migrate] at head")


@app.command()
def demo() -> None:
    """A narrated scenario: tenant, agents with their own logins, a run, proposals, commits."""
    from memfabric.demo import run_demo

    sys.exit(run_demo(db.database_url()))


@worker_app.command("commit")
def worker_commit(
    login: str = typer.Option(
        os.environ.get("MEMFABRIC_COMMITTER_LOGIN", "os_agt_010"),
        help="the committer's login (a member of fabric_committer, registered as an agent)",
    ),
    once: bool = typer.Option(False, help="drain what is validated now, then exit"),
    batch: int = typer.Option(100, min=1, max=10000, help="proposals per transaction"),
    poll: float = typer.Option(1.0, min=0.05, help="seconds between polls when idle"),
) -> None:
    """Commit validated proposals as they arrive (safe to run several at once)."""
    from memfabric.worker import run_committer

    conninfo = _committer_conninfo(login)
    committed, rejected = run_committer(
        conninfo,
        batch=batch,
        once=once,
        poll_seconds=poll,
        progress=lambda line: typer.echo(f"[commit] {line}"),
    )
    typer.echo(f"[commit] done: {committed} committed, {rejected} rejected at commit")


@worker_app.command("consolidate")
def worker_consolidate(
    tenant: list[str] = typer.Option(..., help="tenant(s) to consolidate"),
    consolidator_login: str = typer.Option(
        os.environ.get("MEMFABRIC_CONSOLIDATOR_LOGIN", "os_agt_011"),
        help="the consolidator's login (member of fabric_consolidator, registered as an agent)",
    ),
    committer_login: str = typer.Option(
        os.environ.get("MEMFABRIC_COMMITTER_LOGIN", "os_agt_010"), help="the committer's login"
    ),
    once: bool = typer.Option(False, help="run the workflow once, then exit"),
    interval: float = typer.Option(300.0, min=1.0, help="seconds between scheduled runs"),
    budget: int | None = typer.Option(
        None, min=0, help="recommendations per run; the rest is deferred"
    ),
) -> None:
    """Run WF-OS-MEMORY-CONSOLIDATE on a schedule: candidates, consolidator, validation, commit."""
    import time

    import psycopg

    from memfabric.consolidate import run_consolidation

    url = db.database_url()
    while True:
        with (
            psycopg.connect(db.url_for(url, consolidator_login), autocommit=True) as reader,
            psycopg.connect(db.url_for(url, committer_login), autocommit=True) as committer,
        ):
            for name in tenant:
                run_consolidation(
                    reader,
                    committer,
                    name,
                    budget=budget,
                    progress=lambda line: typer.echo(f"[consolidate] {line}"),
                )
        if once:
            return
        time.sleep(interval)


def _committer_conninfo(login: str) -> str:
    return os.environ.get("MEMFABRIC_COMMITTER_URL") or db.url_for(db.database_url(), login)


COMMITTER_LOGIN = os.environ.get("MEMFABRIC_COMMITTER_LOGIN", "os_agt_010")
# The maintenance login (member of fabric_maintainer): VACUUM after erasure and decay only.
MAINTAINER_LOGIN = os.environ.get("MEMFABRIC_MAINTAINER_LOGIN", "memfabric_maintainer")
MAINTAINER_HELP = (
    "the maintenance login that VACUUMs what erasure/decay rewrote (member of "
    "fabric_maintainer; env MEMFABRIC_MAINTAINER_LOGIN, or MEMFABRIC_MAINTAINER_URL)"
)


def _maintainer_conninfo(login: str) -> str:
    return os.environ.get("MEMFABRIC_MAINTAINER_URL") or db.url_for(db.database_url(), login)


@app.command()
def decay(
    now: str | None = typer.Option(None, help="run as of this RFC 3339 time (default: now)"),
    login: str = typer.Option(COMMITTER_LOGIN, help="the committer's login"),
    maintainer_login: str = typer.Option(MAINTAINER_LOGIN, help=MAINTAINER_HELP),
) -> None:
    """Run decay once: interval expiry, operational window closure, regulated ceilings."""
    import psycopg

    from memfabric.worker import run_decay_once

    with (
        psycopg.connect(_committer_conninfo(login), autocommit=True) as conn,
        psycopg.connect(_maintainer_conninfo(maintainer_login), autocommit=True) as maintainer,
    ):
        typer.echo(f"[decay] {run_decay_once(conn, now, maintainer=maintainer)}")


@worker_app.command("decay")
def worker_decay(
    login: str = typer.Option(COMMITTER_LOGIN, help="the committer's login"),
    maintainer_login: str = typer.Option(MAINTAINER_LOGIN, help=MAINTAINER_HELP),
    interval: float = typer.Option(3600.0, min=1.0, help="seconds between scheduled passes"),
) -> None:
    """Run decay on a schedule (never opportunistically: recall never mutates anything)."""
    import time

    import psycopg

    from memfabric.worker import run_decay_once

    while True:
        with (
            psycopg.connect(_committer_conninfo(login), autocommit=True) as conn,
            psycopg.connect(_maintainer_conninfo(maintainer_login), autocommit=True) as maint,
        ):
            typer.echo(f"[decay] {run_decay_once(conn, maintainer=maint)}")
        time.sleep(interval)


@app.command("erase")
def erase_command(
    approval_id: str = typer.Argument(..., help="an approved erase or erase_subject approval"),
    login: str = typer.Option(COMMITTER_LOGIN, help="the committer's login"),
    maintainer_login: str = typer.Option(MAINTAINER_LOGIN, help=MAINTAINER_HELP),
) -> None:
    """Execute an approved erasure as the committer, leave tombstones, then VACUUM the
    touched tables as the maintenance login."""
    import psycopg

    from memfabric.worker import erase

    with (
        psycopg.connect(_committer_conninfo(login), autocommit=True) as conn,
        psycopg.connect(_maintainer_conninfo(maintainer_login), autocommit=True) as maintainer,
    ):
        typer.echo(f"[erase] {erase(conn, approval_id, maintainer=maintainer)}")


def _operate(op: str, **kwargs: Any) -> dict[str, Any]:
    """Run rebuild/drill/verify in `memfabric serve` when it runs (it owns the Edge
    shards), else here over the stores the environment names."""
    from memfabric import ops
    from memfabric.broker import RemoteBroker, default_socket, serving
    from memfabric.runtime import close_projector, open_projector, projector_conninfo

    if not os.environ.get("QDRANT_URL") and serving(default_socket()):
        typer.echo(f"[{op}] asking memfabric serve ({default_socket()})")
        return RemoteBroker(default_socket()).run(op, **kwargs)
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
            return ops.drill(projector, progress)
    finally:
        close_projector(projector)


@app.command()
def rebuild(target: str = typer.Argument("all", help="qdrant, graph or all")) -> None:
    """Wipe a projection and rebuild it from Postgres alone (stored embeddings are reused)."""
    if target not in ("qdrant", "graph", "all"):
        raise typer.BadParameter("target is qdrant, graph or all")
    typer.echo(json.dumps(_operate("rebuild", target=target)))


@app.command()
def drill() -> None:
    """Probe, wipe, rebuild, probe again: fails unless both answers are identical."""
    result = _operate("drill")
    typer.echo(json.dumps(result))
    if not result["identical"]:
        raise typer.Exit(1)


@app.command()
def verify() -> None:
    """Compare counts and payload hashes between Postgres and each projection."""
    result = _operate("verify")
    typer.echo(json.dumps(result))
    if not result["ok"]:
        raise typer.Exit(1)


@worker_app.command("trace")
def worker_trace(
    login: str = typer.Option(
        os.environ.get("MEMFABRIC_TRACER_LOGIN", "memfabric_tracer"),
        help="the tracer's login (a member of fabric_tracer)",
    ),
    once: bool = typer.Option(False, help="export what is in the outbox now, then exit"),
    poll: float = typer.Option(1.0, min=0.05, help="seconds between polls when idle"),
    metrics_port: int | None = typer.Option(
        None, help="serve /healthz and /metrics on 127.0.0.1 (env MEMFABRIC_METRICS_PORT)"
    ),
) -> None:
    """Export every recall and tool denial in the outbox as an OpenTelemetry span (OTLP/HTTP)."""
    import psycopg

    from memfabric.tracing import SpanMaker, tracer_conninfo

    maker = SpanMaker(tracer_conninfo(login), progress=lambda line: typer.echo(f"[trace] {line}"))
    _start_metrics(metrics_port, maker)
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


def _start_metrics(port_option: int | None, maker: Any = None, projector: Any = None) -> None:
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
    server = serve_metrics(port, gauges)
    typer.echo(f"[metrics] http://127.0.0.1:{server.server_address[1]}/metrics")


@app.command()
def serve(
    poll: float = typer.Option(1.0, min=0.05, help="seconds between polls when idle"),
    metrics_port: int | None = typer.Option(
        None, help="serve /healthz and /metrics on 127.0.0.1 (env MEMFABRIC_METRICS_PORT)"
    ),
) -> None:
    """Own the vector shards, run the projector and answer vector queries on a unix socket;
    with OTEL_EXPORTER_OTLP_ENDPOINT set, also export every recall as a span."""
    import threading

    from memfabric import ops
    from memfabric.broker import LocalBroker, default_socket, serve_socket
    from memfabric.runtime import close_projector, open_projector, projector_conninfo

    lock = threading.Lock()
    projector = open_projector(
        projector_conninfo(), guard=lock, progress=lambda line: typer.echo(f"[project] {line}")
    )
    assert projector.store is not None
    broker = LocalBroker(
        projector.store,
        projector.embedder,
        {
            "rebuild": lambda target="all": ops.rebuild(projector, target),
            "drill": lambda: ops.drill(projector),
            "verify": lambda: ops.verify(projector),
        },
    )
    server = serve_socket(broker, default_socket(), lock)
    typer.echo(f"[serve] listening on {default_socket()}; projecting to qdrant and graph")
    maker = None
    stop = threading.Event()
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        from memfabric.tracing import SpanMaker, tracer_conninfo

        maker = SpanMaker(tracer_conninfo(), progress=lambda line: typer.echo(f"[trace] {line}"))
        threading.Thread(
            target=maker.run, kwargs={"poll_seconds": poll, "should_stop": stop.is_set}, daemon=True
        ).start()
        typer.echo(f"[serve] exporting recall spans to {maker.endpoint}")
    _start_metrics(metrics_port, maker, projector)
    try:
        projector.run(poll_seconds=poll)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if maker is not None:
            maker.shutdown()
        server.shutdown()
        default_socket().unlink(missing_ok=True)
        close_projector(projector)


@app.command("recall")
def recall_command(
    login: str = typer.Option(..., help="the agent's login"),
    run_id: str = typer.Option(..., "--run", help="the agent's open run"),
    query: str | None = typer.Option(None, help="what to recall"),
    mode: str = typer.Option("text", help="text, semantic or hybrid"),
    tier: list[str] | None = typer.Option(None, help="tiers to recall (repeatable)"),
    limit: int = typer.Option(8, min=1),
) -> None:
    """Recall as an agent (its own login), through the vector broker for semantic modes."""
    import psycopg

    from memfabric.broker import RemoteBroker, default_socket
    from memfabric.recall import recall

    request: dict[str, Any] = {"run_id": run_id, "mode": mode, "limit": limit}
    if query:
        request["query"] = query
    if tier:
        request["tiers"] = tier
    broker = None
    if mode != "text":
        if os.environ.get("QDRANT_URL"):
            from memfabric.broker import LocalBroker
            from memfabric.runtime import open_projector, projector_conninfo

            p = open_projector(projector_conninfo(), graph=False)
            assert p.store is not None
            broker = LocalBroker(p.store, p.embedder, {})
        else:
            broker = RemoteBroker(default_socket())  # type: ignore[assignment]
    with psycopg.connect(db.url_for(db.database_url(), login), autocommit=True) as conn:
        typer.echo(json.dumps(recall(conn, request, broker), indent=2, default=str))


if __name__ == "__main__":
    app()
