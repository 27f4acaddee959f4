"""Which failures the projector outlives (memfabric.projector.recoverable: back off, drain
again from the cursor) and which surface: a lost connection is retried, a wrong path or
permission and a bug are not."""

from __future__ import annotations

import errno

import psycopg
import pytest

from memfabric.projector import recoverable


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        ConnectionResetError(errno.ECONNRESET, "reset"),
        BrokenPipeError(errno.EPIPE, "broken pipe"),
        TimeoutError("timed out"),
        OSError(errno.ENOSPC, "no space left on device"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_lost_connection_or_a_passing_condition_is_retried(exc: BaseException) -> None:
    assert recoverable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(errno.ENOENT, "no such file", "/srv/memfabric/qdrant"),
        PermissionError(errno.EACCES, "permission denied", "/run/memfabric.sock"),
        IsADirectoryError(errno.EISDIR, "is a directory"),
        NotADirectoryError(errno.ENOTDIR, "not a directory"),
        ValueError("a bug"),
        KeyError("a bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_wrong_path_a_permission_or_a_bug_surfaces(exc: BaseException) -> None:
    assert not recoverable(exc)
