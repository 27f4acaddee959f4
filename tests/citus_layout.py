"""Where each fabric table lives on a Citus cluster: the lists of migration 0049 and of the
later revisions that place a table (0050: fabric.shard_events; 0052: fabric.broker_tickets;
0054: fabric.tenant_directory; 0055: fabric.two_phase_anchor),
merged in revision order, for tests/sql/test_citus_layout.py and tests/citus."""

from __future__ import annotations

import importlib.util
from types import ModuleType, SimpleNamespace

from conftest import ROOT

REVISIONS = (
    "0049_citus.py",
    "0050_citus_shard_events.py",
    "0052_broker_tickets.py",
    "0054_citus_tenant_directory.py",
    "0055_citus_two_phase.py",
)
LISTS = ("TENANT_TABLES", "REFERENCE_TABLES", "COORDINATOR_TABLES", "LOCAL_TABLES")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "migrations" / "versions" / name)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_modules = [_load(name) for name in REVISIONS]
layout = SimpleNamespace(
    **{lst: tuple(t for m in _modules for t in getattr(m, lst)) for lst in LISTS}
)
