"""`make serve` right after `make demo`: the demo leaves the logins serve runs as, so the
sealer seals at once; and a login the server refuses is named in the sealer's pause line
with the server's reason (libpq reports no SQLSTATE for it), never as "no sqlstate"."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric
from memfabric.demo import run_demo
from memfabric.settings import Settings
from memfabric.worker import run_sealer

pytestmark = pytest.mark.clone  # the demo and the sealer connect by URL


@pytest.fixture
def serve_login(fabric: Fabric, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The committer login serve would seal as, named by the settings and not created yet
    (roles are cluster-wide: a fresh name per test, dropped afterwards)."""
    login = f"mf_seal_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("DATABASE_URL", fabric.url)
    monkeypatch.setenv("MEMFABRIC_COMMITTER_LOGIN", login)
    monkeypatch.delenv("MEMFABRIC_COMMITTER_URL", raising=False)
    yield login
    with psycopg.connect(fabric.url, autocommit=True) as su:
        su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login)))


def one_pass(conninfo: str) -> list[str]:
    """One pass of serve's sealer (or its first pause): its progress lines."""
    lines: list[str] = []
    ticks = itertools.count()
    run_sealer(
        conninfo,
        poll_seconds=0.01,
        progress=lines.append,
        should_stop=lambda: bool(lines) or next(ticks) >= 2,
    )
    return lines


def test_a_refused_login_is_named_in_the_sealers_line(fabric: Fabric, serve_login: str) -> None:
    (line,) = one_pass(Settings.from_env().conninfo("committer"))
    assert line.startswith(f'sealing paused (login "{serve_login}": PostgreSQL at ')
    assert f'refused login "{serve_login}" (from MEMFABRIC_COMMITTER_LOGIN)' in line
    assert "does not exist" in line  # the server's reason, as it gave it
    assert "no sqlstate" not in line


def test_serve_seals_right_after_the_demo(fabric: Fabric, serve_login: str) -> None:
    assert run_demo(fabric.url) == 0
    fabric.settle()
    assert one_pass(Settings.from_env().conninfo("committer")) == []  # no pause: it sealed
    chain = fabric.session("mf_auditor").execute("SELECT fabric_audit.verify_event_chain()")
    result = chain.fetchone()[0]  # type: ignore[index]
    assert result["ok"] and result["unsealed"] == 0
    assert result["events"] == fabric.count("events") > 0
