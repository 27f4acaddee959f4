"""Variants of an envelope or import element for the reader tests (test_propose_reader,
test_import_reader): a path in the document and the value put there, or DROP to remove it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

DROP = object()


def mutate(
    doc: dict[str, Any],
    path: tuple[str, ...],
    value: Any,
    resolve: Callable[[Any], Any] = lambda v: v,
) -> dict[str, Any]:
    """A deep copy of `doc` with `value` (passed through `resolve`) at `path`; missing or
    non-object parents become objects."""
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if value is DROP:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = resolve(copy.deepcopy(value))
    return out


def deep(levels: int) -> dict[str, Any]:
    """Content nested `levels` objects deep."""
    content: dict[str, Any] = {"leaf": 1}
    for _ in range(levels):
        content = {"d": content}
    return content
