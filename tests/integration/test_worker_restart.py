"""The long-running loops ride out a PostgreSQL restart under steady writes: the sealer, the
commit worker and a scheduled worker (a consolidation and a decay pass) each lose their connection,
report why, reconnect with backoff and go on from where they were; nothing stays unsealed.

The server is restarted with `pg_ctl restart -m fast` (what an operator or a failover
does): the backends are told to end (57P01, which `fabric_call` hands on as a FabricError)
and, for a few seconds, every connection is refused."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import PG_CTL, Fabric, episode
from memfabric.call import fabric_call
from memfabric.consolidate import run_consolidation
from memfabric.worker import run_committer, run_every, run_sealer

# the loops connect by URL; the restart takes about two seconds, under the `slow` mark's 5 s
pytestmark = pytest.mark.clone


def restart(fabric: Fabric) -> None:
    fabric.close()
    done = subprocess.run(  # the server's output goes to its log, not to a pipe we wait on
        [str(PG_CTL), "restart", "-D", fabric.server.datadir, "-m", "fast", "-w",
         "-l", fabric.server.logfile],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0


@contextmanager
def looping(
    target: Callable[..., Any], *args: Any, **kwargs: Any
) -> Iterator[tuple[threading.Thread, list[str], list[BaseException]]]:
    """`target` on a thread until the block ends: its progress lines and what ended it."""
    stop = threading.Event()
    lines: list[str] = []
    ended: list[BaseException] = []

    def body() -> None:
        try:
            target(*args, progress=lines.append, should_stop=stop.is_set, **kwargs)
        except BaseException as exc:  # what would end the thread in serve
            ended.append(exc)
            raise

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        yield thread, lines, ended
    finally:
        stop.set()
        thread.join(30)


def writing(fabric: Fabric, stop: threading.Event, written: list[int]) -> None:
    """Steady writes as an agent: proposals (and their events), one after the other; a
    write the restart refuses is simply made again."""
    conninfo = psycopg.conninfo.make_conninfo(fabric.url, user="mf_agent_a")
    orchestrator = psycopg.conninfo.make_conninfo(fabric.url, user="mf_orchestrator")
    while not stop.is_set():
        try:
            with (
                psycopg.connect(orchestrator, autocommit=True) as o,
                psycopg.connect(conninfo, autocommit=True) as agent,
            ):
                run = fabric_call(
                    o, "fabric_api.open_run", "acme", "com-agt-003", "user-8842", "sess-1f9c",
                    ["tool:memory-propose", "tool:memory-recall"],
                )  # fmt: skip
                while not stop.is_set():
                    agent.execute(
                        "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode("steady")), run)
                    )
                    written[0] += 1
                    time.sleep(0.01)
        except Exception:
            time.sleep(0.1)


def chain(fabric: Fabric) -> dict[str, Any]:
    row = fabric.session("mf_auditor").execute("SELECT fabric_audit.verify_event_chain()")
    return row.fetchone()[0]  # type: ignore[index,no-any-return]


def test_sealing_commits_and_scheduled_work_resume_after_a_restart_under_writes(
    fabric: Fabric,
) -> None:
    committer = psycopg.conninfo.make_conninfo(fabric.url, user="mf_committer")
    consolidator = psycopg.conninfo.make_conninfo(fabric.url, user="mf_consolidator")
    stop_writing = threading.Event()
    written = [0]
    passes = [0]

    def scheduled() -> None:  # a pass of `worker consolidate` (its step), then of decay
        with (
            psycopg.connect(consolidator, autocommit=True) as reader,
            psycopg.connect(committer, autocommit=True) as conn,
        ):
            run_consolidation(reader, conn, "acme")
            fabric_call(conn, "fabric_api.run_decay")
        passes[0] += 1

    writer = threading.Thread(target=writing, args=(fabric, stop_writing, written), daemon=True)
    with (
        looping(run_sealer, committer, poll_seconds=0.05) as (sealer, sealed_lines, sealer_end),
        looping(run_committer, committer, poll_seconds=0.05) as (commit, commit_lines, commit_end),
        looping(run_every, scheduled, name="consolidation", interval=0.05, conninfo=committer) as (
            decay,
            decay_lines,
            decay_end,
        ),
    ):
        writer.start()
        deadline = time.monotonic() + 30
        while chain(fabric)["events"] < 50:  # sealing under way, under writes
            assert time.monotonic() < deadline, "sealing never started"
            time.sleep(0.1)
        restart(fabric)
        before = written[0]
        deadline = time.monotonic() + 30
        while written[0] < before + 50:  # writes go on after the restart
            assert time.monotonic() < deadline, "the writer never wrote again"
            time.sleep(0.1)
        passes_after = passes[0]
        stop_writing.set()
        writer.join(30)
        events = fabric.count("events")  # (a decay pass may add more later)
        deadline = time.monotonic() + 60
        while (result := chain(fabric))["unsealed"] or fabric.count(
            "proposals", "status = 'validated'"
        ):
            assert time.monotonic() < deadline, (result, sealed_lines[-3:], sealer_end)
            time.sleep(0.2)
        while passes[0] <= passes_after:
            assert time.monotonic() < deadline, (decay_lines[-3:], decay_end)
            time.sleep(0.1)
        for thread in (sealer, commit, decay):
            assert thread.is_alive()
    assert (sealer_end, commit_end, decay_end) == ([], [], [])
    assert result["ok"] and result["events"] >= events
    assert fabric.count("memory_records") >= written[0]  # a write cut off may have landed
    # each loop said why it paused, naming its login (never "no sqlstate")
    logins = {'login "mf_committer"', 'login "mf_consolidator"'}  # the pass has both
    for lines, named in ((sealed_lines, logins - {'login "mf_consolidator"'}),
                         (commit_lines, logins - {'login "mf_consolidator"'}),
                         (decay_lines, logins)):  # fmt: skip
        paused = [line for line in lines if "paused" in line]
        assert paused and all(any(n in line for n in named) for line in paused), lines
        assert not any("no sqlstate" in line for line in lines)
