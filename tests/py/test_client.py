"""The Python layer: one SDK call = one fabric_api call; SQLSTATEs become exceptions; the
workers and the CLI against DATABASE_URL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import Fabric, episode
from memfabric import db as mfdb
from memfabric import errors
from memfabric.sdk import Fabric as SdkFabric
from memfabric.worker import run_committer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("call", "expected", "sqlstate"),
    [
        ("unknown_run", errors.NotAuthorized, "42501"),
        ("bad_envelope", errors.InvalidEnvelope, "22023"),
        ("unknown_proposal", errors.NotFound, "P0002"),
        ("commit_twice", errors.WrongState, "55000"),
        ("non_double_number", errors.InvalidEnvelope, "22003"),
        ("too_large", errors.LimitExceeded, "54000"),
    ],
)
def test_sqlstates_map_to_exceptions(
    fabric: Fabric, call: str, expected: type[errors.FabricError], sqlstate: str
) -> None:
    run = fabric.open_run()
    with SdkFabric(fabric.url, max_size=2) as mf:
        agent = mf.agent("mf_agent_a", run, tenant_id="acme")
        committer = mf.committer("mf_committer")
        with pytest.raises(expected) as caught:
            if call == "unknown_run":
                mf.agent("mf_agent_a", uuid.uuid4(), tenant_id="acme").propose(episode())
            elif call == "bad_envelope":
                agent.propose({"tier": 42})
            elif call == "unknown_proposal":
                committer.commit(uuid.uuid4())
            elif call == "commit_twice":
                proposal = agent.propose(episode())
                assert proposal.proposal_id is not None
                committer.commit(proposal.proposal_id)
                committer.commit(proposal.proposal_id)
            elif call == "non_double_number":
                agent.propose(episode(**{"content": {"n": 2**53 + 1}}))
            elif call == "too_large":
                agent.propose(episode(**{"content": {"blob": "x" * 70_000}}))
    assert caught.value.sqlstate == sqlstate
    assert isinstance(caught.value, errors.FabricError)


def test_unknown_sqlstate_falls_back_to_class_then_base() -> None:
    assert errors.from_sqlstate("23505") is errors.RuleViolation
    assert errors.from_sqlstate("MF001") is errors.ImmutableRecord
    assert errors.from_sqlstate("XX000") is errors.FabricError
    assert errors.from_sqlstate(None) is errors.FabricError


def _validated(fabric: Fabric, count: int) -> list[Any]:
    run = fabric.open_run()
    conn = fabric.connect("mf_agent_a")
    ids = []
    for i in range(count):
        row = conn.execute(
            "SELECT fabric_api.propose(%s, %s)",
            (psycopg.types.json.Jsonb(episode(f"episode {i}")), run),
        ).fetchone()
        assert row is not None and row[0]["status"] == "validated"
        ids.append(row[0]["proposal_id"])
    return ids


def test_two_workers_drain_each_proposal_exactly_once(fabric: Fabric) -> None:
    ids = _validated(fabric, 60)
    results: list[tuple[int, int]] = []
    urls = [mfdb.url_for(fabric.url, "mf_committer"), mfdb.url_for(fabric.url, "mf_committer2")]

    def work(url: str) -> None:
        results.append(run_committer(url, batch=7, once=True, progress=lambda _: None))

    threads = [threading.Thread(target=work, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c for c, _ in results) == 60
    assert fabric.count("memory_records") == 60
    assert fabric.count("proposals", "status = 'committed'") == 60
    formed = fabric.events("event_type = 'memory.record.formed'")
    assert len(formed) == 60
    assert sorted(e["proposal_id"] for e in formed) == sorted(ids)


@pytest.mark.slow
def test_cli_migrate_and_worker_run_against_database_url(fabric: Fabric) -> None:
    ids = _validated(fabric, 3)
    env = {
        **os.environ,
        "DATABASE_URL": fabric.url,
        "MEMFABRIC_COMMITTER_URL": mfdb.url_for(fabric.url, "mf_committer"),
    }
    cli = [sys.executable, "-m", "memfabric.cli"]
    migrated = subprocess.run(
        [*cli, "db", "migrate"], env=env, capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert migrated.returncode == 0, migrated.stderr
    assert "at head" in migrated.stdout
    worked = subprocess.run(
        [*cli, "worker", "commit", "--once"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert worked.returncode == 0, worked.stderr
    assert "3 committed" in worked.stdout
    assert fabric.count("proposals", "status = 'committed'") == len(ids)


def test_recall_without_a_broker_is_served_text(
    fabric: Fabric, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.setenv("MEMFABRIC_SOCKET", str(tmp_path / "nobody.sock"))
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode("asked for invoices in EUR"), run)
    fabric.commit(proposal["proposal_id"])
    with SdkFabric(fabric.url, max_size=1) as mf:
        answer = mf.agent("mf_agent_a", run, tenant_id="acme").recall_request(
            {"tiers": ["episodic"], "query": "which currency for invoices?"}
        )
    assert answer.mode_served == "text"
    assert len(answer.records) == 1
