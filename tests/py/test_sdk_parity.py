"""The sync SDK (`memfabric.sdk`) and the async one (`memfabric.aio`) are one API: every role
has the same methods, with the same parameters and defaults, each calling the same fabric
functions; so an addition to one that is missing from the other fails here (the check a
generated sync client would make by construction)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

from memfabric import aio, sdk

CALLED = re.compile(r'"((?:fabric_api|fabric_audit)\.[a-z_0-9]+)"')


def public_methods(cls: type[Any]) -> dict[str, Any]:
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def parameters(fn: Any) -> list[tuple[str, str, Any]]:
    return [(p.name, str(p.kind), p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("role", sorted(sdk.ROLES))
def test_each_role_has_the_same_methods_sync_and_async(role: str) -> None:
    sync, asyn = public_methods(sdk.ROLES[role]), public_methods(aio.ROLES[role])
    assert sorted(sync) == sorted(asyn)
    for name in sync:
        assert parameters(sync[name]) == parameters(asyn[name]), name
        called = set(CALLED.findall(inspect.getsource(sync[name])))
        assert called == set(CALLED.findall(inspect.getsource(asyn[name]))), name


def test_the_async_methods_are_coroutines() -> None:
    for role in aio.ROLES.values():
        for name, fn in public_methods(role).items():
            assert inspect.iscoroutinefunction(fn), f"{role.__name__}.{name}"
