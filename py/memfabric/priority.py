"""A background worker's CPU priority: what `memfabric worker consolidate --priority` sets.

A model decoding in process takes a core for seconds at a time. Beside a busy database that
core is one the hot path (an agent's propose and recall) would have used, and `nice` only
lowers the worker's share when both want the same core: the kernel still lets it run for its
slice before a waking backend gets the core back. Linux's `SCHED_IDLE` policy runs a thread
only when a core would otherwise idle, and a waking normal thread preempts it at once. The
cost is plain: on a saturated host an idle-priority worker forms nothing until load drops
(the consolidation runs' lag says so), which is what a background formation worker should do.
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from pathlib import Path


class Priority(StrEnum):
    normal = "normal"  # as started (a service manager's `nice`, for instance, still applies)
    idle = "idle"  # SCHED_IDLE on Linux: only cores that would otherwise idle


class PriorityUnavailable(RuntimeError):
    """The platform cannot run a process at idle priority."""


def _threads() -> list[int]:
    """Every thread of this process (a library may have started some already)."""
    tasks = Path("/proc/self/task")
    return [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]


def apply(priority: Priority) -> str:
    """Set this process's priority; threads started later inherit it. Returns what was set.

    Call it before loading a model: its thread pool then starts at the same policy."""
    if priority is Priority.normal:
        return "normal"
    if not sys.platform.startswith("linux") or not hasattr(os, "SCHED_IDLE"):
        raise PriorityUnavailable(
            "idle priority needs Linux's SCHED_IDLE; run the worker under `nice -n 19` instead"
        )
    for tid in _threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    return "idle (SCHED_IDLE)"
