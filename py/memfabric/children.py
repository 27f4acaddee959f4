"""Child processes the package starts itself (the embedding process, shard processes)."""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any


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
