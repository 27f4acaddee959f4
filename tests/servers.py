"""The servers the suite shares for its whole session (tests/conftest.py starts them): the
Bolt graph server, ArcadeDB, started by scripts/graph.sh on free ports with its own
temporary root, so a developer's server on the default ports is never touched (and never
wiped). Tests isolate themselves by wiping the graph (or their tenant), not by restarts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRAPH_SH = ROOT / "scripts" / "graph.sh"
PASSWORD = "test-graph-pw"
DATABASE = "graph"


@dataclass(frozen=True)
class GraphServer:
    uri: str
    env: dict[str, str]
    root: Path

    def pid(self) -> int:
        return int((self.root / "arcadedb.pid").read_text().strip())


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def stop_process(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, grace: float = 30) -> int:
    """Stop a child a test started: `sig`, up to `grace` seconds to exit (a loaded machine
    starts and stops Python slowly), then SIGKILL; its output pipe is closed either way.
    Returns its exit code (negative: the signal that ended it)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout:
        proc.stdout.close()
    return proc.returncode


def graph_sh(
    env: dict[str, str], *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GRAPH_SH), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def start_graph_server(root: Path) -> Iterator[GraphServer]:
    """Start the graph server under `root`, yield it, stop it."""
    bolt, http = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEO4J_")}
    env |= {
        "GRAPH_ROOT": str(root / "server"),
        "GRAPH_LOG": str(root / "arcadedb.log"),
        "GRAPH_BOLT_PORT": str(bolt),
        "GRAPH_HTTP_PORT": str(http),
        "GRAPH_PASSWORD": PASSWORD,
        # A server that lives for one test session: the client compiler only (no C2 compiling
        # in the background on two busy cores) and the serial collector. It starts in ~60% of
        # the time and CPU, and test_graph.py ran in 32 s instead of 47 s side by side.
        "GRAPH_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }
    started = time.monotonic()
    try:
        up = graph_sh(env, "up")
    except BaseException:  # interrupted while it starts (SIGTERM): the JVM may be up already
        graph_sh(env, "down", timeout=60)
        raise
    if up.returncode != 0:
        graph_sh(env, "down")
        pytest.fail(f"graph.sh up failed:\n{up.stdout}\n{up.stderr}")
    print(f"\n[graph] test server up in {time.monotonic() - started:.1f} s: {up.stdout.strip()}")
    server = GraphServer(uri=f"bolt://127.0.0.1:{bolt}", env=env, root=root / "server")
    try:
        yield server
    finally:
        down = graph_sh(env, "down", timeout=60)
        assert down.returncode == 0, down.stderr
