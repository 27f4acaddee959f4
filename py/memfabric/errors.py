"""SQLSTATE -> exception map. The database decides; Python only names the outcome.

Never parse message text: the SQLSTATE is the interface (docs/errors.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


class FabricError(Exception):
    """A refusal by the fabric, carrying the server's SQLSTATE, message and hint."""

    sqlstate: str | None = None

    def __init__(self, message: str, *, sqlstate: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate or type(self).sqlstate
        self.hint = hint


class NotAuthorized(FabricError):
    """42501: unknown or foreign run, missing group role, cross-tenant or widened scope."""


class InvalidEnvelope(FabricError):
    """22xxx: the request is malformed (types, keys, timestamps, numbers, sizes)."""


class NotFound(FabricError):
    """P0002 / 42704: an unknown tenant, agent, run or proposal."""


class RuleViolation(FabricError):
    """23xxx: a constraint of the fabric (lineage, formation rules, invariant 11)."""


class ImmutableRecord(RuleViolation):
    """MF001: committed records, lineage and the outbox are never rewritten."""


class IllegalTransition(RuleViolation):
    """MF002: a lifecycle move that DESIGN.md §6's table does not allow."""


class AppendOnly(RuleViolation):
    """MF003: the events outbox and the record history are append-only."""


class MissingGovernanceContext(RuleViolation):
    """MF004: a record change outside a governed action (no acting agent)."""


class ApprovalRefused(RuleViolation):
    """MF005: a missing, pending, denied, expired, reused or mismatched approval."""


class WrongState(FabricError):
    """55000: e.g. committing a proposal that is not validated (already committed)."""


class LimitExceeded(InvalidEnvelope):
    """54000: content too large or too deep."""


class Unsupported(FabricError):
    """0A000: the database cannot hold the fabric (e.g. not UTF8)."""


_BY_SQLSTATE: dict[str, type[FabricError]] = {
    "42501": NotAuthorized,
    "P0002": NotFound,
    "42704": NotFound,
    "55000": WrongState,
    "54000": LimitExceeded,
    "0A000": Unsupported,
    "MF001": ImmutableRecord,
    "MF002": IllegalTransition,
    "MF003": AppendOnly,
    "MF004": MissingGovernanceContext,
    "MF005": ApprovalRefused,
}
_BY_CLASS: dict[str, type[FabricError]] = {"22": InvalidEnvelope, "23": RuleViolation}


def from_sqlstate(sqlstate: str | None) -> type[FabricError]:
    """The exception class for a SQLSTATE (exact code first, then its class)."""
    if not sqlstate:
        return FabricError
    return _BY_SQLSTATE.get(sqlstate) or _BY_CLASS.get(sqlstate[:2]) or FabricError


def translate(exc: psycopg.Error) -> FabricError:
    diag = exc.diag
    cls = from_sqlstate(exc.sqlstate)
    return cls(diag.message_primary or str(exc), sqlstate=exc.sqlstate, hint=diag.message_hint)


@contextmanager
def mapped() -> Iterator[None]:
    """Re-raise database errors of the fabric as FabricError subclasses."""
    try:
        yield
    except psycopg.DatabaseError as exc:
        if exc.sqlstate is None:
            raise
        raise translate(exc) from exc
