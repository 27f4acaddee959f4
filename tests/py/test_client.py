"""The Python layer: one client call = one fabric_api call; SQLSTATEs become exceptions."""

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

from conftest import MEMORY_TOOLS, Fabric, episode
from memfabric import db as mfdb
from memfabric import errors
from memfabric.client import FabricClient
from memfabric.worker import run_committer

# FabricClient is deprecated (it warns on use) and kept working one release: its tests stay.
pytestmark = pytest.mark.filterwarnings("ignore:FabricClient is deprecated:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]


def client(fabric: Fabric, login: str) -> FabricClient:
    return FabricClient(mfdb.url_for(fabric.url, login), max_size=2)


def test_client_flow_forms_a_record(fabric: Fabric) -> None:
    with (
        client(fabric, "mf_orchestrator") as orch,
        client(fabric, "mf_agent_a") as agent,
        client(fabric, "mf_committer") as committer,
    ):
        run = orch.open_run("acme", "com-agt-003", "user-8842", "sess-1", MEMORY_TOOLS)
        proposal = agent.propose(episode(), run)
        assert proposal["status"] == "validated"
        record = committer.commit(proposal["proposal_id"])
        assert record["consolidation_state"] == "raw"
        assert uuid.UUID(record["memory_id"])
        assert orch.close_run(run)["closed_at"] is not None


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
    with client(fabric, "mf_agent_a") as agent, client(fabric, "mf_committer") as committer:
        with pytest.raises(expected) as caught:
            if call == "unknown_run":
                agent.propose(episode(), uuid.uuid4())
            elif call == "bad_envelope":
                agent.propose({"tier": 42}, run)
            elif call == "unknown_proposal":
                committer.commit(uuid.uuid4())
            elif call == "commit_twice":
                proposal = agent.propose(episode(), run)
                committer.commit(proposal["proposal_id"])
                committer.commit(proposal["proposal_id"])
            elif call == "non_double_number":
                agent.propose(episode(**{"content": {"n": 2**53 + 1}}), run)
            elif call == "too_large":
                agent.propose(episode(**{"content": {"blob": "x" * 70_000}}), run)
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


def test_client_recall_without_a_broker_is_served_text(
    fabric: Fabric, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.setenv("MEMFABRIC_SOCKET", str(tmp_path / "nobody.sock"))
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode("asked for invoices in EUR"), run)
    fabric.commit(proposal["proposal_id"])
    with client(fabric, "mf_agent_a") as agent:
        answer = agent.recall(
            {"run_id": str(run), "tiers": ["episodic"], "query": "which currency for invoices?"}
        )
    assert answer["mode_served"] == "text"
    assert len(answer["records"]) == 1
