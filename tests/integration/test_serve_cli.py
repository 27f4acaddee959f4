"""`memfabric serve` and the commands that talk to it, end to end: projection, semantic
recall through the broker, verify, drill (R-PROJ-1), rebuild, and PostgreSQL restarted
under the running projector."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import Fabric, drained, files_holding
from memfabric.broker import RemoteBroker, serving
from memfabric.constants import INDEXED_TIERS
from memfabric.embedding import E5_MODEL, MiniLMEmbedder
from memfabric.graph import GraphStore
from memfabric.projector import Projector
from memfabric.recall import recall
from memfabric.settings import usable_cpus
from memfabric.vectors import CollectionContract, EdgeVectorStore
from servers import PASSWORD, GraphServer, stop_process

# runs memfabric serve and restarts servers under it
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PG_CTL = ROOT / ".local" / "pg17" / "wrap" / "pg_ctl"


def serve_env(
    fabric: Fabric, graph_server: GraphServer, vector_dir: Path, shards: str = "inline"
) -> dict[str, str]:
    """The environment of `memfabric serve` on the test's fabric, with a socket of its own."""
    sock = Path(tempfile.mkdtemp(prefix="mf-", dir="/tmp")) / "s.sock"
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NEO4J_", "QDRANT_"))},
        "DATABASE_URL": fabric.url,
        "MEMFABRIC_PROJECTOR_URL": psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector"),
        "MEMFABRIC_COMMITTER_URL": psycopg.conninfo.make_conninfo(fabric.url, user="mf_committer"),
        "MEMFABRIC_SOCKET": str(sock),
        "MEMFABRIC_VECTOR_DIR": str(vector_dir),
        "GRAPH_BOLT_PORT": graph_server.env["GRAPH_BOLT_PORT"],
        "GRAPH_PASSWORD": PASSWORD,
        "MEMFABRIC_EDGE_SHARDS": shards,
    }


def start_serve(env: dict[str, str], *serve_args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "memfabric.cli", "serve", "--poll", "0.2", *serve_args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@contextmanager
def running_serve(
    fabric: Fabric,
    graph_server: GraphServer,
    vector_dir: Path,
    shards: str = "inline",
    serve_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> Iterator[dict[str, Any]]:
    """`memfabric serve` on the test's fabric, until it says how it runs: its env, process,
    socket, that line (`listening`) and every line before it (`startup`)."""
    with GraphStore(graph_server.uri, "root", PASSWORD, "graph") as graph:
        graph.wipe()  # each test's fabric starts empty
    env = {**serve_env(fabric, graph_server, vector_dir, shards), **(extra_env or {})}
    sock = Path(env["MEMFABRIC_SOCKET"])
    proc = start_serve(env, *serve_args)
    try:
        for _ in range(600):
            if serving(sock) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert serving(sock), proc.stdout.read() if proc.poll() is not None else "no socket"
        assert proc.stdout is not None
        startup = []
        while "[serve] listening" not in (line := proc.stdout.readline()):
            assert line, "serve ended before it said how it runs"
            startup.append(line)
        # listening: the line that says how serve runs (its embedding and shards)
        yield {"env": env, "proc": proc, "socket": sock, "listening": line, "startup": startup}
    finally:
        code = stop_process(proc)
    # SIGTERM (docker stop, systemd) takes serve's own way out: exit 0, socket file removed
    assert code == 0 and not sock.exists(), code


@pytest.fixture
def served(
    fabric: Fabric, graph_server: GraphServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    # indirect parametrization: where serve's shards live (inline unless a test says)
    shards = getattr(request, "param", "inline")
    with running_serve(fabric, graph_server, tmp_path / "qdrant", shards) as started:
        yield started


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memfabric.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def wait_verified(env: dict[str, str], memory_ids: set[str], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        out = cli(env, "verify")
        report = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
        points = report.get("qdrant", {}).get("expected", 0)
        if out.returncode == 0 and report.get("ok") and points >= len(memory_ids):
            return report
        if time.monotonic() > deadline:
            raise AssertionError(f"projection did not converge: {out.stdout}\n{out.stderr}")
        time.sleep(0.5)


@pytest.mark.parametrize("served", ["inline", "auto"], indirect=True)
def test_serve_projects_answers_recall_and_passes_the_drill(
    fabric: Fabric, served: dict[str, Any]
) -> None:
    env, line = served["env"], served["listening"]
    # `auto`, serve's default: child shards when serve may run on 2 CPUs or more
    children = env["MEMFABRIC_EDGE_SHARDS"] == "auto" and usable_cpus() >= 2
    assert ("shards in child processes" if children else "shards inline") in line
    assert f"embedding with {E5_MODEL}" in line  # a new deployment's embedder
    run = fabric.open_run()
    ids = {
        fabric.form(run, t)
        for t in ("invoices in euros please", "ship to Rotterdam", "the customer prefers email")
    }
    wait_verified(env, ids)

    recalled = cli(
        env,
        "recall",
        "--login",
        "mf_agent_a",
        "--run",
        str(run),
        "--query",
        "which currency for invoices",
        "--mode",
        "semantic",
        "--tier",
        "episodic",
        "--limit",
        "1",
    )
    assert recalled.returncode == 0, recalled.stderr
    answer = json.loads(recalled.stdout)
    assert answer["status"] == "served"
    assert answer["records"][0]["content"] == {"text": "invoices in euros please"}

    drilled = cli(env, "drill")
    assert drilled.returncode == 0, drilled.stdout + drilled.stderr
    assert json.loads(drilled.stdout.strip().splitlines()[-1])["identical"] is True
    rebuilt = cli(env, "rebuild", "all")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout.strip().splitlines()[-1])["rebuilt"] == {
        "qdrant": 3,
        "graph": 3,
    }
    auditor = fabric.connect("mf_auditor")
    deadline = time.monotonic() + 30
    while True:  # serve seals the audit trail continuously, as the committer
        chain = auditor.execute("SELECT fabric_audit.verify_event_chain()").fetchone()[0]  # type: ignore[index]
        if chain["unsealed"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert chain["ok"] and chain["unsealed"] == 0 and chain["events"] > 0, chain


def test_postgres_restarted_under_the_projector_loses_nothing(
    fabric: Fabric, served: dict[str, Any]
) -> None:
    env = served["env"]
    run = fabric.open_run()
    before = {fabric.form(run, "before the restart")}
    wait_verified(env, before)
    fabric.close()
    restart = subprocess.run(  # the server's output goes to its log, not to a pipe we wait on
        [
            str(PG_CTL),
            "restart",
            "-D",
            fabric.server.datadir,
            "-m",
            "fast",
            "-w",
            "-l",
            fabric.server.logfile,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert restart.returncode == 0
    run = fabric.open_run()
    after = fabric.form(run, "after the restart")
    report = wait_verified(env, before | {after})
    assert report["qdrant"]["points"] == 2
    auditor = fabric.connect("mf_auditor")
    deadline = time.monotonic() + 60
    while True:  # and so did its sealer: what was written across the restart gets sealed
        chain = auditor.execute("SELECT fabric_audit.verify_event_chain()").fetchone()[0]  # type: ignore[index]
        if chain["unsealed"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert chain["ok"] and chain["unsealed"] == 0 and chain["events"] > 0, chain
    assert served["proc"].poll() is None  # the serve process rode it out


def pg_ctl(fabric: Fabric, action: str, options: str = "") -> None:
    """`pg_ctl stop` or `pg_ctl start` of the test's server (start: with `options`, the
    server's own command line options, which `pg_ctl start` does not remember)."""
    more = ["-m", "fast"] if action == "stop" else ["-l", fabric.server.logfile, "-o", options]
    done = subprocess.run(  # the server's output goes to its log, not to a pipe we wait on
        [str(PG_CTL), action, "-D", fabric.server.datadir, "-w", *more],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, action


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """serve's output, line by line, read on a thread (so a wait for a line can time out)."""
    lines: queue.Queue[str] = queue.Queue()
    out = proc.stdout
    assert out is not None

    def read() -> None:
        with contextlib.suppress(ValueError, OSError):  # closed by stop_process
            for line in out:
                lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def line_with(lines: queue.Queue[str], text: str, timeout: float = 120) -> list[str]:
    """The lines up to the first that holds `text`."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            raise AssertionError(f"no line with {text!r} in {seen}") from None
        if text in seen[-1]:
            return seen


def test_serve_waits_for_postgresql_at_start_and_starts_once_it_answers(
    fabric: Fabric, graph_server: GraphServer, tmp_path: Path
) -> None:
    """PostgreSQL away while serve starts (a supervisor starting both at once, a restart):
    serve says so and tries again with backoff instead of exiting; a SIGTERM meanwhile ends
    it cleanly; once the server answers, it starts and serves."""
    with GraphStore(graph_server.uri, "root", PASSWORD, "graph") as graph:
        graph.wipe()
    env = serve_env(fabric, graph_server, tmp_path / "qdrant")
    fabric.close()
    opts = shlex.split((Path(fabric.server.datadir) / "postmaster.opts").read_text())[1:]
    pg_ctl(fabric, "stop")
    try:
        stopped = start_serve(env)
        try:
            lines = lines_of(stopped)
            line_with(lines, "[serve] waiting for PostgreSQL")
            line_with(lines, "[serve] waiting for PostgreSQL")  # and again
            assert stopped.poll() is None
        finally:
            code = stop_process(stopped)
        assert code == 0
        assert not Path(env["MEMFABRIC_SOCKET"]).exists()

        proc = start_serve(env)
        lines = lines_of(proc)
        waited = line_with(lines, "[serve] waiting for PostgreSQL")
        assert "not answering" in waited[-1], waited
    finally:
        pg_ctl(fabric, "start", shlex.join(opts))
    try:
        started = line_with(lines, "[serve] listening")
        assert not any("Traceback" in line for line in started), started
        run = fabric.open_run()
        wait_verified(env, {fabric.form(run, "after the wait")})
    finally:
        assert stop_process(proc) == 0


def shard_children(pid: int) -> list[int]:
    """The shard processes `memfabric serve` (pid) started, alive (not yet exited)."""
    return children_running(pid, b"_child_main")


def children_running(pid: int, marker: bytes) -> list[int]:
    """The children of `pid` whose command line holds `marker`, alive (not yet exited)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z" and marker in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def exited(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_an_index_build_under_way_ends_with_serve(
    fabric: Fabric, graph_server: GraphServer, tmp_path: Path
) -> None:
    """serve stopped (SIGTERM) while a vector index build runs: the build's child ends with
    serve and its copy (building/) is removed. The build, asked through the socket, is held
    in the middle (its child stopped, as a build of a large shard takes minutes)."""
    import threading

    vectors = tmp_path / "qdrant"
    with running_serve(fabric, graph_server, vectors) as served:
        proc = served["proc"]
        run = fabric.open_run()
        wait_verified(served["env"], {fabric.form(run, "invoices in euros please")})
        broker = RemoteBroker(served["socket"], timeout=120)
        told: list[str] = []

        def build() -> None:
            try:
                broker.run("build_index", tiers=["episodic"])
            except Exception as exc:  # serve's answer that it stopped, or none
                told.append(f"{type(exc).__name__}: {exc}")

        asking = threading.Thread(target=build)
        asking.start()
        deadline = time.monotonic() + 60
        while not (builds := children_running(proc.pid, b"optimize")):
            assert time.monotonic() < deadline, "no build started"
            time.sleep(0.01)
        (child,) = builds
        os.kill(child, signal.SIGSTOP)
        assert (vectors / "building").is_dir()
    # running_serve's exit: SIGTERM, exit 0 (asserted there)
    try:
        asking.join(timeout=60)
        assert exited(child)
        assert not (vectors / "building").exists()
    finally:
        if not exited(child):
            os.kill(child, signal.SIGKILL)


# `child` forced: that `auto` chooses child shards in serve on 2 CPUs or more is
# test_projector_settings's to show, so this test runs on a one-CPU machine too.
@pytest.mark.parametrize("served", ["child"], indirect=True)
def test_serve_restarts_a_killed_shard_child_and_recall_and_projection_go_on(
    fabric: Fabric, served: dict[str, Any]
) -> None:
    env, proc = served["env"], served["proc"]
    assert "shards in child processes" in served["listening"]
    run = fabric.open_run()
    ids = {fabric.form(run, "invoices in euros please"), fabric.form(run, "ship to Rotterdam")}
    wait_verified(env, ids)
    children = shard_children(proc.pid)
    assert len(children) == len(INDEXED_TIERS)  # one per indexed tier
    for child in children:
        os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not all(exited(c) for c in children):
        assert time.monotonic() < deadline, "the killed children did not exit"
        time.sleep(0.05)
    recalled = cli(
        env, "recall", "--login", "mf_agent_a", "--run", str(run), "--query",
        "which currency for invoices", "--mode", "semantic", "--tier", "episodic",
        "--limit", "1",
    )  # fmt: skip
    assert recalled.returncode == 0, recalled.stderr
    assert json.loads(recalled.stdout)["records"][0]["content"] == {
        "text": "invoices in euros please"
    }
    ids.add(fabric.form(run, "the customer prefers email"))
    report = wait_verified(env, ids)
    assert report["qdrant"]["points"] == 3
    restarted = shard_children(proc.pid)
    assert len(restarted) == len(INDEXED_TIERS) and not set(restarted) & set(children)
    assert proc.poll() is None


def projected_under_an_older_contract(
    fabric: Fabric, minilm: MiniLMEmbedder, vector_dir: Path
) -> tuple[str, set[str], dict[str, str]]:
    """Two records projected into `vector_dir` by a projector whose embedder's version is
    not this package's (an upgrade changed it): the run, the records, the aliases."""
    run = fabric.open_run()
    ids = {fabric.form(run, t) for t in ("invoices in euros please", "ship to Rotterdam")}
    old = copy.copy(minilm)
    old.version = "before-the-upgrade;text=v1"
    store = EdgeVectorStore(vector_dir)
    try:
        store.ensure_collections(old.model, old.version, old.dims)
        projector_url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
        assert drained(Projector(projector_url, old, store), ("qdrant",)) == len(ids)
        return str(run), ids, store.aliases()
    finally:
        store.close()


def test_a_changed_embedder_contract_is_rebuilt_at_start_until_a_rebuild_ends(
    fabric: Fabric, graph_server: GraphServer, minilm: MiniLMEmbedder, tmp_path: Path
) -> None:
    """Records projected under an older contract (an upgrade changed the embedder's
    version): serve binds new collections and fills them from PostgreSQL in the background.
    Stopped before that rebuild ends, serve says so, and the next start (the contract now
    unchanged) finds the rebuild's note and runs it again, to its end."""
    run, ids, before = projected_under_an_older_contract(fabric, minilm, tmp_path / "qdrant")
    # First start: its rebuild waits behind a lock on the records, and serve is stopped.
    blocker = fabric.connect(None, autocommit=False)
    blocker.execute("LOCK TABLE fabric.memory_records IN ACCESS EXCLUSIVE MODE")
    try:
        with running_serve(fabric, graph_server, tmp_path / "qdrant") as served:
            proc = served["proc"]
            said = "".join(served["startup"])
            assert "the embedder's contract changed" in said and before["mem_episodic"] in said
            assert "[rebuild] filling the new vector collections" in said, said
            proc.send_signal(signal.SIGTERM)
            while "[serve] stopping" not in (line := proc.stdout.readline()):
                assert line, "serve ended before it said it was stopping"
            blocker.rollback()  # the rebuild goes on, and stops after its first page
            rest = proc.stdout.read()
            assert "[rebuild] stopped before it ended: qdrant is incomplete" in rest, rest
            assert "[rebuild] done" not in rest, rest
            assert "[prune]" not in rest, rest  # the old collections stay until it ends
    finally:
        blocker.rollback()
        blocker.close()
    # Second start: the contract is the one bound, but the rebuild did not end: it runs again.
    with running_serve(fabric, graph_server, tmp_path / "qdrant") as served:
        proc, broker = served["proc"], RemoteBroker(served["socket"], timeout=60)
        said = "".join(served["startup"])
        assert "the embedder's contract changed" not in said, said
        assert "[rebuild] a rebuild of qdrant began at" in said, said
        lines = []
        while not (line := proc.stdout.readline()).startswith("[rebuild] done"):
            assert line and "[rebuild] failed" not in line, "".join(lines) + line
            lines.append(line)
        assert line.startswith(f"[rebuild] done: {len(ids)} records"), line
        assert f"[rebuild] qdrant: {len(ids)} of {len(ids)} records\n" in lines
        # the rebuild ended: the collections of the older contract are dropped
        assert pruned(proc) == set(before.values())
        assert {p.name for p in (tmp_path / "qdrant" / "shards").iterdir()}.isdisjoint(
            before.values()
        )
        report = broker.run("verify")
        assert report["unfinished_rebuilds"] == {}, report
        vectors = report["qdrant"]
        counted = (vectors["expected"], vectors["points"], vectors["missing"])
        assert counted == (len(ids), len(ids), []), vectors
        request = {"run_id": run, "mode": "semantic", "tiers": ["episodic"], "limit": 1,
                   "query": "which currency for invoices"}  # fmt: skip
        answer = recall(fabric.connect("mf_agent_a"), request, broker)
        assert [r["content"] for r in answer["records"]] == [{"text": "invoices in euros please"}]


def pruned(proc: subprocess.Popen[str], timeout: float = 60) -> set[str]:
    """The collections serve says it dropped after its rebuild (one line each, one per
    indexed tier); its output is read from here on by `lines_of`."""
    lines, dropped = lines_of(proc), set()
    while len(dropped) < len(INDEXED_TIERS):
        line = line_with(lines, "[prune] ", timeout)[-1]
        assert line.startswith("[prune] dropped "), line
        dropped.add(line.split()[2])
    return dropped


def test_an_upgrade_of_the_payload_version_leaves_no_raw_subject_id_on_disk(
    fabric: Fabric, graph_server: GraphServer, minilm: MiniLMEmbedder, tmp_path: Path
) -> None:
    """Collections of payload version 1 (subject and session ids in clear, as before the
    projections held pseudonyms), the embedder unchanged: serve says the payload version
    changed, fills the new collections from PostgreSQL, then drops the old ones, and the
    subject's and session's ids are in no file under the vector directory any more."""
    subject, session = "user-prune-5521", "sess-prune-0077"
    with fabric.su() as su:  # a deployment of before 0.14 upgraded: it keeps MiniLM
        su.execute("UPDATE fabric.deployment_settings SET embedder = 'minilm'")
    run = fabric.open_run(subject=subject, session=session)
    ids = {fabric.form(run, t) for t in ("invoices in euros please", "ship to Rotterdam")}
    vector_dir = tmp_path / "qdrant"
    v1 = {
        t: CollectionContract(f"mem_{t}", minilm.model, minilm.version, minilm.dims, payload=1)
        for t in INDEXED_TIERS
    }
    store = EdgeVectorStore(vector_dir)
    try:  # what a deployment of payload version 1 projected
        for contract in v1.values():
            store._open_or_create(contract)
        vector = minilm.embed(["invoices in euros please"])[0]
        rows = [
            (i, list(vector), {"tenant_id": "acme", "subject_id": subject, "session_id": session})
            for i in sorted(ids)
        ]
        store._upsert_raw(v1["episodic"].physical_name, rows)
        store._set_aliases({c.name: c.physical_name for c in v1.values()})
        store.flush()
    finally:
        store.close()
    assert files_holding(vector_dir, subject) and files_holding(vector_dir, session)
    with running_serve(fabric, graph_server, vector_dir) as served:
        proc = served["proc"]
        said = "".join(served["startup"])
        assert "[project] the vector payload version changed (1 -> 2) (" in said, said
        assert "embedder" not in said.split("[project]", 1)[1].split("\n", 1)[0], said
        while not (line := proc.stdout.readline()).startswith("[rebuild] done"):
            assert line and "[rebuild] failed" not in line, line
        assert line.startswith(f"[rebuild] done: {len(ids)} records"), line
        assert pruned(proc) == {c.physical_name for c in v1.values()}
        report = RemoteBroker(served["socket"], timeout=60).run("verify")["qdrant"]
        assert (report["expected"], report["points"], report["missing"]) == (len(ids), len(ids), [])
        assert files_holding(vector_dir, subject) == []
        assert files_holding(vector_dir, session) == []


def test_a_changed_embedder_contract_is_left_to_the_operator_when_told(
    fabric: Fabric, graph_server: GraphServer, minilm: MiniLMEmbedder, tmp_path: Path
) -> None:
    """--no-rebuild-on-contract-change: the new collections stay empty, serve says what to
    run."""
    _, ids, _ = projected_under_an_older_contract(fabric, minilm, tmp_path / "qdrant")
    args = ("--no-rebuild-on-contract-change",)
    with running_serve(fabric, graph_server, tmp_path / "qdrant", serve_args=args) as served:
        said = "".join(served["startup"])
        assert "the embedder's contract changed" in said
        assert "[rebuild] not started (--no-rebuild-on-contract-change): run" in said, said
        assert "`memfabric rebuild qdrant`" in said, said
        vectors = RemoteBroker(served["socket"], timeout=60).run("verify")["qdrant"]
        assert (vectors["expected"], vectors["points"]) == (len(ids), 0), vectors


@pytest.mark.parametrize("again", [False, True], ids=["stop", "stop-twice"])
def test_a_rebuild_asked_through_the_socket_ends_when_serve_stops(
    fabric: Fabric, graph_server: GraphServer, tmp_path: Path, again: bool
) -> None:
    """`memfabric rebuild` asked of serve, serve stopped meanwhile: the rebuild ends after
    its current page (the client is told), serve exits cleanly, and the rebuild's note
    stays for the next start. A second signal does not wait for the page: serve ends
    while the rebuild is still held up."""
    import threading

    run = fabric.open_run()
    for text in ("invoices in euros please", "ship to Rotterdam"):
        fabric.form(run, text)
    blocker = fabric.connect(None, autocommit=False)
    blocker.execute("LOCK TABLE fabric.memory_records IN ACCESS EXCLUSIVE MODE")
    told: list[str] = []
    try:
        with running_serve(fabric, graph_server, tmp_path / "qdrant") as served:
            proc, broker = served["proc"], RemoteBroker(served["socket"], timeout=60)

            def ask() -> None:
                try:
                    broker.run("rebuild", target="qdrant")
                except Exception as exc:  # serve's answer, or (stopped at once) none
                    told.append(f"{type(exc).__name__}: {exc}")

            asking = threading.Thread(target=ask)
            asking.start()
            waiting = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE %s"
            )
            for _ in range(300):  # until the rebuild waits behind the lock
                if fabric.session().execute(waiting, ("%projection_snapshot_v2%",)).fetchone()[0]:  # type: ignore[index]
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the rebuild never reached the records")
            proc.send_signal(signal.SIGTERM)
            while "[serve] stopping" not in (line := proc.stdout.readline()):
                assert line, "serve ended before it said it was stopping"
            if again:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=60) == 0  # the rebuild still waits on the lock
                blocker.rollback()
                asking.join(timeout=60)
                assert len(told) == 1 and "stopping" not in told[0], told  # no answer came
                return
            blocker.rollback()  # the rebuild goes on, and stops after its first page
            asking.join(timeout=60)
            assert proc.wait(timeout=60) == 0
    finally:
        blocker.rollback()
        blocker.close()
    assert len(told) == 1 and "memfabric serve is stopping" in told[0], told
    unfinished = "SELECT fabric_api.unfinished_projection_rebuild('qdrant')"
    assert fabric.call("mf_projector", unfinished) is not None


def test_serve_serves_the_operational_stores_to_each_login_as_far_as_its_allowlist(
    fabric: Fabric, graph_server: GraphServer, tmp_path: Path
) -> None:
    """Another process reaches the declared collection through serve only, as the login its
    own PostgreSQL connection proves: the writer writes, a login without a grant is refused
    (42501) and writes nothing."""
    from dataclasses import replace

    from memfabric.errors import NotAuthorized
    from memfabric.operational import OpsRow, RemoteOpsBroker

    grants = {"mf_workflow": {"ops_trd_regime_fingerprints": "rw"}}
    extra = {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "tests" / "integration")]),
        "MEMFABRIC_OPS_PACKS": "test_operational_broker:PACK",
        "MEMFABRIC_OPS_DIR": str(tmp_path / "ops"),
        "MEMFABRIC_OPS_GRANTS": json.dumps(grants),
    }
    with running_serve(fabric, graph_server, tmp_path / "qdrant", extra_env=extra) as served:
        said = "operational stores ops_trd_regime_fingerprints served to 1 allowlisted login"
        line_with(lines_of(served["proc"]), said, 30)
        row = OpsRow("acme", "bi-eu", ("v9",), [0, 1, 0, 0], {"label": "new"})
        with RemoteOpsBroker(served["socket"], fabric.connect("mf_workflow")) as writer:
            (written,) = writer.upsert("ops_trd_regime_fingerprints", [row])
        with RemoteOpsBroker(served["socket"], fabric.connect("mf_agent_a")) as stranger:
            with pytest.raises(NotAuthorized):
                stranger.upsert("ops_trd_regime_fingerprints", [replace(row, key=("v10",))])
            with pytest.raises(NotAuthorized):
                stranger.search("ops_trd_regime_fingerprints", "acme", "bi-eu", [0, 1, 0, 0])
        with RemoteOpsBroker(served["socket"], fabric.connect("mf_workflow")) as writer:
            hits = writer.search("ops_trd_regime_fingerprints", "acme", "bi-eu", [0, 1, 0, 0], 5)
    assert [h[0] for h in hits] == [written]  # the stranger's write never happened
