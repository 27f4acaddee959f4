"""A background worker's CPU placement: what `memfabric worker consolidate --priority` and
`--cpus` set.

A model decoding in process takes a core for seconds at a time. Beside a busy database that
core is one the hot path (an agent's propose and recall) would have used. Two levers, each
measured by `make bench-consolidation` (docs/benchmarks.md):

- `--cpus` pins the worker (every thread, the model's included) to the CPUs named. The
  scheduler then places the database's and the agents' wakeups on the other cores, when
  they are free. On two cores, the worker pinned to one at nice 10, the hot path's p95
  stayed within 10% of its idle p95 in every run on an otherwise quiet host (5 of 5), and in
  4 of 7 while other work shared the cores (then another process held the free core).
- `--priority idle` runs the worker under Linux's `SCHED_IDLE`. It was meant to let a waking
  backend preempt the worker at once; measured on a 6.x kernel (EEVDF scheduler) it does not:
  the kernel counts a core running only idle-policy work as free, wakes the hot path's
  backends there, and they wait for the worker's slice (the hot path's p95 doubled, as with
  `nice 10`; a bare busy loop under `SCHED_IDLE` did the same). It still yields cores to
  normal work under sustained load; on a saturated host an idle-priority worker forms
  nothing until load drops.
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


class PlacementUnavailable(ValueError):
    """A CPU list that is malformed or names CPUs this process may not run on."""


def parse_cpus(spec: str) -> set[int]:
    """A Linux CPU list (`1`, `2-3`, `0,2-3`) as the set of CPUs it names."""
    cpus: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise PlacementUnavailable(
                f"{spec!r} is not a CPU list: write CPUs as 1, 2-3 or 0,2-3 (Linux's cpulist form)"
            )
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise PlacementUnavailable(f"{part!r} is an empty range: write the lower CPU first")
        cpus.update(range(first, last + 1))
    return cpus


def pin(spec: str) -> set[int]:
    """Pin every thread of this process to the CPUs `spec` names; threads started later
    inherit them. Returns the CPUs. Call it before loading a model, as `apply`."""
    if not hasattr(os, "sched_setaffinity"):
        raise PlacementUnavailable("pinning to CPUs needs Linux's sched_setaffinity")
    cpus = parse_cpus(spec)
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        outside = ",".join(str(c) for c in sorted(cpus - allowed))
        mine = ",".join(str(c) for c in sorted(allowed))
        raise PlacementUnavailable(
            f"CPU {outside} is not one this process may run on (it may run on {mine})"
        )
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    return cpus
