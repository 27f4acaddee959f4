"""An interrupted run cleans up what it started. `pytest -n 2`, as `make test` runs it, on
two small modules whose tests start the session's servers (a PostgreSQL server on each
worker, the graph server, Redis) and then wait; SIGTERM to the controller once all are up.
The run ends, and no server, no worker and no temporary directory of it is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import conftest
from conftest import ROOT

# `-p conftest` loads the suite's conftest.py as a plugin; its PostgreSQL fixture is named in
# each module too, or the plugin pytest-postgresql registers under the same name would win.
REPORT = '''
import json
import os
import time
from pathlib import Path

from conftest import postgresql_proc  # noqa: F401 - the suite's server, not the plugin's


def report(name, tmp_path_factory, **pids):
    """What this worker started, for the test that interrupts the run."""
    data = {"pids": {"worker": os.getpid(), **pids},
            "basetemp": str(tmp_path_factory.getbasetemp())}
    path = Path(os.environ["INTERRUPTED_RUN_REPORTS"]) / f"{name}.json"
    path.with_suffix(".tmp").write_text(json.dumps(data))
    path.with_suffix(".tmp").rename(path)


def postmaster(fabric):
    row = fabric.session(None).execute("SELECT current_setting('data_directory')").fetchone()
    return int((Path(row[0]) / "postmaster.pid").read_text().split()[0])
'''

DATABASE_MODULE = (
    REPORT
    + """

def test_a_database(fabric, tmp_path_factory):
    report("database", tmp_path_factory, postgres=postmaster(fabric))
    time.sleep(900)
"""
)

GRAPH_MODULE = (
    REPORT
    + """
from test_working_tier import redis_server  # noqa: F401 - the session's Redis


def test_a_database_the_graph_server_and_redis(fabric, graph_server, redis_server,
                                               tmp_path_factory):
    redis = int((Path(redis_server.env["REDIS_DIR"]) / "redis.pid").read_text())
    report("graph", tmp_path_factory, postgres=postmaster(fabric), graph=graph_server.pid(),
           redis=redis)
    time.sleep(900)
"""
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for_reports(
    proc: subprocess.Popen[bytes], reports: Path, out: Path, expected: int
) -> list[Any]:
    deadline = time.monotonic() + 600
    while len(found := sorted(reports.glob("*.json"))) < expected:
        assert proc.poll() is None, out.read_text()[-4000:]
        assert time.monotonic() < deadline, "the servers did not come up: " + out.read_text()
        time.sleep(0.5)
    return [json.loads(path.read_text()) for path in found]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 0], ids=["xdist", "one-process"])
def test_sigterm_stops_every_server_and_worker_and_removes_the_temporary_directory(
    tmp_path: Path, workers: int
) -> None:
    """Two workers: each starts its own PostgreSQL server. One process (TEST_WORKERS=0):
    one module, whose test holds the servers while the run is stopped."""
    run, reports, temproot = tmp_path / "run", tmp_path / "reports", tmp_path / "temproot"
    for path in (run, reports, temproot):
        path.mkdir()
    (run / "test_graph.py").write_text(GRAPH_MODULE)
    if workers:
        (run / "test_database.py").write_text(DATABASE_MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env |= {
        "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("tests", "tests/integration", "py")),
        "INTERRUPTED_RUN_REPORTS": str(reports),
        "PYTEST_DEBUG_TEMPROOT": str(temproot),
    }
    args = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-p", "conftest"]
    out = tmp_path / "output.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *args, "-q", "-n", str(workers), str(run)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            started = _wait_for_reports(proc, reports, out, 2 if workers else 1)
            pids = {
                f"{r['pids']['worker']}:{name}": pid
                for r in started
                for name, pid in r["pids"].items()
            }
            assert all(map(_alive, pids.values())), pids
            assert len({r["pids"]["postgres"] for r in started}) == len(started)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = out.read_text()
    left = {name: pid for name, pid in pids.items() if _alive(pid)}
    for pid in left.values():  # a failed cleanup is this test's to finish
        os.kill(pid, signal.SIGKILL)
    assert code != 0, output
    assert left == {}, output[-4000:]
    # a worker's basetemp lies in the controller's
    sessions = {Path(r["basetemp"]).parent if workers else Path(r["basetemp"]) for r in started}
    assert len(sessions) == 1
    assert not any(path.exists() for path in sessions), sorted(temproot.rglob("*"))[:20]


# A command run in process (CliRunner) installs its own SIGTERM handler; the run's handler
# must be back for the next test, or stopping the run would leave its servers behind. The
# suite's hook (conftest.pytest_runtest_protocol) is driven here around a test body that
# does what memfabric's long-running commands do: under pytest-xdist the next test of this
# module may run on the other worker, so "the next test" is checked within this one.
def test_a_command_run_in_process_leaves_the_runs_signal_handlers_in_place() -> None:
    assert signal.getsignal(signal.SIGTERM) is conftest._on_sigterm
    sigint = signal.getsignal(signal.SIGINT)
    around = conftest.pytest_runtest_protocol(None, None)  # type: ignore[arg-type]
    next(around)  # the hook, up to the test
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as memfabric's long-running commands do
    signal.signal(signal.SIGINT, signal.SIG_IGN if sigint is not signal.SIG_IGN else signal.SIG_DFL)
    with pytest.raises(StopIteration):
        around.send(None)  # the test is over: the hook puts the run's handlers back
    assert signal.getsignal(signal.SIGTERM) is conftest._on_sigterm
    assert signal.getsignal(signal.SIGINT) is sigint
