"""Child processes the package starts itself (the embedding process, shard processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import IO, Any


def end_child(child: subprocess.Popen[Any] | None, grace: float) -> None:
    """End a child that serves requests on its stdin: close stdin (it reads EOF and returns),
    wait up to `grace` seconds, then kill it; its stdout pipe is closed either way."""
    if child is None:
        return
    if child.stdin is not None:
        with contextlib.suppress(OSError):
            child.stdin.close()
    try:
        child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    if child.stdout is not None:
        child.stdout.close()


def serve_parent(loop: Callable[[IO[bytes], IO[bytes]], None]) -> None:
    """Run a child's request loop on frames from its stdin (`inp`) to its stdout (`out`),
    ending quietly when its parent goes.

    The child's life is its parent's to decide: it ends when the parent closes its stdin
    (EOF), so Ctrl-C at a terminal, which signals the whole process group, is left to the
    parent (SIGINT ignored here; the parent's clean-up then closes the child). A parent
    that died (SIGKILL, a crash) no longer reads the answers: the broken pipe ends the
    child without a traceback, since nobody is there to read one. Stray prints of a
    library go to stderr, never into the answers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        loop(sys.stdin.buffer, out)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone: no one waits for this answer
    finally:
        with contextlib.suppress(OSError):  # an answer still buffered for a gone parent
            out.close()
