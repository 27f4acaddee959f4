"""fabric_call: the one primitive every Python caller uses to reach a fabric function."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, Fabric, episode
from memfabric import errors
from memfabric.call import Cast, fabric_call, fabric_count, fabric_rows

pytestmark = pytest.mark.rollback


@pytest.mark.parametrize(
    "name",
    [
        "propose",  # unqualified
        "fabric.tg_records__emit",  # private schema
        "pg_catalog.now",
        "fabric_api.propose(); DROP TABLE fabric.events; --",
        'fabric_api."propose"',
        "FABRIC_API.PROPOSE",
    ],
)
def test_only_functions_of_the_two_api_schemas_are_callable(fabric: Fabric, name: str) -> None:
    before = fabric.counts()
    with pytest.raises(ValueError, match="fabric_api or fabric_audit"):
        fabric_call(fabric.su(), name, Jsonb({}), uuid.uuid4())
    assert fabric.counts() == before


def test_named_arguments_are_parameters_only(fabric: Fabric) -> None:
    with pytest.raises(ValueError, match="parameters"):
        fabric_call(fabric.connect("mf_committer"), "fabric_api.commit_pending", limit=1)


def test_casts_name_a_type_only() -> None:
    with pytest.raises(ValueError, match="type"):
        Cast("1", "xid8); DROP TABLE x; --")


def test_dict_is_jsonb_list_is_array_timedelta_is_interval(fabric: Fabric) -> None:
    orch = fabric.connect("mf_orchestrator")
    run = fabric_call(
        orch,
        "fabric_api.open_run",
        "acme",
        "com-agt-003",
        "user-8842",
        "sess-1",
        MEMORY_TOOLS,
        timedelta(minutes=5),
    )
    assert isinstance(run, uuid.UUID)
    proposal = fabric_call(fabric.connect("mf_agent_a"), "fabric_api.propose", episode(), run)
    assert proposal["status"] == "validated"
    ttl = fabric.session().execute("SELECT expires_at - opened_at FROM fabric.runs").fetchone()
    assert ttl is not None and ttl[0] == timedelta(minutes=5)


def test_named_notation_keeps_earlier_defaults(fabric: Fabric) -> None:
    result = fabric_call(fabric.connect("mf_committer"), "fabric_api.run_decay", p_batch=10)
    assert {"expired", "windows_closed", "erasure_requests"} <= result.keys()


def test_explicit_cast(fabric: Fabric) -> None:
    answer = fabric_call(
        fabric.connect("mf_projector"),
        "fabric_api.set_projection_cursor",
        "graph",
        Cast("1", "xid8"),
        uuid.UUID(int=0),
        True,
    )
    assert answer is not None


def test_refusals_arrive_mapped_by_sqlstate(fabric: Fabric) -> None:
    before = fabric.counts()
    with pytest.raises(errors.NotAuthorized) as caught:
        fabric_call(fabric.connect("mf_agent_a"), "fabric_api.propose", episode(), uuid.uuid4())
    assert caught.value.sqlstate == "42501"
    assert fabric.counts() == before


def test_table_functions_answer_rows(fabric: Fabric) -> None:
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode(), run)
    record = fabric.commit(proposal["proposal_id"])
    rows = fabric_rows(
        fabric.connect("mf_auditor"), "fabric_audit.records_as_of", "acme", datetime.now(UTC)
    )
    assert [r["memory_id"] for r in rows] == [uuid.UUID(record["memory_id"])]
    assert rows[0]["tier"] == "episodic"


def test_table_functions_count_in_the_database(fabric: Fabric) -> None:
    run = fabric.open_run()
    for text in ("one", "two"):
        fabric.form(run, text)
    auditor = fabric.connect("mf_auditor")
    args = ("fabric_audit.records_as_of", "acme", datetime.now(UTC))
    assert fabric_count(auditor, *args) == len(fabric_rows(auditor, *args)) == 2
    with pytest.raises(errors.NotAuthorized):
        fabric_count(fabric.connect("mf_agent_a"), *args)
