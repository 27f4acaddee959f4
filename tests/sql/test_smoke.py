import pytest

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback


def test_propose_and_commit_an_episode(fabric: Fabric) -> None:
    run = fabric.open_run()
    result = fabric.propose("mf_agent_a", episode(), run)
    assert result["status"] == "validated", result
    record = fabric.commit(result["proposal_id"])
    assert record["consolidation_state"] == "raw"
    assert record["scope"]["subject_id"] == "user-8842"
    assert record["provenance"]["formed_by"] == "os-agt-010"
