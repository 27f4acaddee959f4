"""A same-as merge of entities is a reviewed proposal, never silent: the consolidator
proposes, policy decides, the consolidator applies an approved merge once; the merged entity
stays (with its mentions: the history) and its records mention the other one too."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback

ACME = {"type": "organization", "name": "Acme GmbH"}
ACME_AG = {"type": "organization", "name": "Acme AG"}
BERLIN = {"type": "location", "name": "Berlin"}


def entity(fabric: Fabric, key: str) -> str:
    row = (
        fabric.session(None)
        .execute("SELECT entity_id::text FROM fabric.entities WHERE entity_key = %s", (key,))
        .fetchone()
    )
    assert row is not None
    return str(row[0])


def mentioned(fabric: Fabric, entity_id: str) -> list[str]:
    rows = fabric.session(None).execute(
        "SELECT memory_id::text FROM fabric.memory_mentions WHERE entity_id = %s ORDER BY 1",
        (entity_id,),
    )
    return [r[0] for r in rows]


@pytest.fixture
def world(fabric: Fabric) -> dict[str, Any]:
    run = fabric.open_run()
    old = fabric.form(run, envelope=episode(content={"text": "Acme AG", "entities": [ACME_AG]}))
    new = fabric.form(run, envelope=episode(content={"text": "Acme GmbH", "entities": [ACME]}))
    fabric.form(run, envelope=episode(content={"text": "Berlin", "entities": [BERLIN]}))
    return {
        "run": run,
        "old": old,
        "new": new,
        "ag": entity(fabric, "name:acme ag"),
        "gmbh": entity(fabric, "name:acme gmbh"),
        "berlin": entity(fabric, "name:berlin"),
    }


def propose(fabric: Fabric, frm: str, into: str, login: str = "mf_consolidator") -> Any:
    return fabric.call(
        login,
        "SELECT fabric_api.propose_entity_merge('acme', %s, %s, 'renamed in 2024')",
        frm,
        into,
    )


def test_an_approved_merge_resolves_the_mentions_and_keeps_the_history(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    proposed = propose(fabric, world["ag"], world["gmbh"])
    assert proposed["status"] == "pending"
    # nothing merged before review
    assert mentioned(fabric, world["gmbh"]) == [world["new"]]
    with pytest.raises(psycopg.Error) as info:
        fabric.call(
            "mf_consolidator", "SELECT fabric_api.merge_entities(%s)", proposed["approval_id"]
        )
    assert info.value.sqlstate == "55000"
    fabric.call(
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'same company')",
        proposed["approval_id"],
    )
    merged = fabric.call(
        "mf_consolidator", "SELECT fabric_api.merge_entities(%s)", proposed["approval_id"]
    )
    assert merged["mentions"] == 1
    assert mentioned(fabric, world["gmbh"]) == sorted([world["old"], world["new"]])
    assert mentioned(fabric, world["ag"]) == [world["old"]]  # the history stays
    row = (
        fabric.session(None)
        .execute(
            "SELECT merged_into::text FROM fabric.entities WHERE entity_id = %s", (world["ag"],)
        )
        .fetchone()
    )
    assert row == (world["gmbh"],)
    # a later record naming the merged entity mentions the one it was merged into
    later = fabric.form(
        world["run"], envelope=episode(content={"text": "Acme AG again", "entities": [ACME_AG]})
    )
    assert later in mentioned(fabric, world["gmbh"])
    assert later not in mentioned(fabric, world["ag"])
    # applied once
    with pytest.raises(psycopg.Error) as info:
        fabric.call(
            "mf_consolidator", "SELECT fabric_api.merge_entities(%s)", proposed["approval_id"]
        )
    assert info.value.sqlstate == "55000"


def test_merge_refusals_write_nothing(fabric: Fabric, world: dict[str, Any]) -> None:
    def refused(frm: str, into: str, login: str = "mf_consolidator") -> str | None:
        before = (fabric.count("approvals"), fabric.count("events"))
        with pytest.raises(psycopg.Error) as info:
            propose(fabric, frm, into, login)
        assert (fabric.count("approvals"), fabric.count("events")) == before
        return info.value.sqlstate

    assert refused(world["ag"], world["ag"]) == "22023"
    assert refused(world["ag"], world["berlin"]) == "22023"  # an organization is no place
    assert refused(world["ag"], "00000000-0000-4000-8000-000000000000") == "P0002"
    assert refused(world["ag"], world["gmbh"], login="mf_agent_a") == "42501"


def test_a_graph_recall_naming_a_merged_entity_starts_at_the_one_it_was_merged_into(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    proposed = propose(fabric, world["ag"], world["gmbh"])
    fabric.call(
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')",
        proposed["approval_id"],
    )
    fabric.call("mf_consolidator", "SELECT fabric_api.merge_entities(%s)", proposed["approval_id"])
    request = {"run_id": str(world["run"]), "query": "Acme AG", "mode": "graph"}
    assert fabric.recall("mf_agent_a", request)["graph"]["seeds"] == [world["gmbh"]]


def test_applying_what_is_no_approved_merge_writes_nothing(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    proposed = propose(fabric, world["ag"], world["gmbh"])
    fabric.call(
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'denied', 'no')",
        proposed["approval_id"],
    )
    for approval, state in ((proposed["approval_id"], "55000"), (str(world["ag"]), "P0002")):
        before = (fabric.count("events"), fabric.count("memory_mentions"))
        with pytest.raises(psycopg.Error) as info:
            fabric.call("mf_consolidator", "SELECT fabric_api.merge_entities(%s)", approval)
        assert info.value.sqlstate == state
        assert (fabric.count("events"), fabric.count("memory_mentions")) == before


def test_an_entity_merged_into_one_that_erasure_removes_forgets_it(fabric: Fabric) -> None:
    """Erasing a subject removes its person entity; an entity merged into that one stays
    (another subject's record mentions it) and forgets where it was merged (no dangling
    reference, no refused erasure)."""
    fabric.open_run()  # makes user-8842's person entity
    other = fabric.open_run(subject="user-9999")
    max_ = {"type": "person", "name": "Max Mustermann"}
    fabric.form(other, envelope=episode(content={"text": "Max called", "entities": [max_]}))
    row = (
        fabric.session(None)
        .execute(
            "SELECT entity_id::text FROM fabric.entities"
            " WHERE tenant_id = 'acme' AND subject_id = 'user-8842'"
        )
        .fetchone()
    )
    assert row is not None
    person = str(row[0])
    merging = entity(fabric, "name:max mustermann")
    proposed = propose(fabric, merging, person)
    fabric.call(
        "mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'same')",
        proposed["approval_id"],
    )  # fmt: skip
    fabric.call("mf_consolidator", "SELECT fabric_api.merge_entities(%s)", proposed["approval_id"])
    approval = fabric.call(
        "mf_committer", "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'art. 17')"
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)
    rows = fabric.session(None).execute(
        "SELECT entity_id::text, merged_into FROM fabric.entities WHERE entity_id IN (%s, %s)",
        (person, merging),
    )
    assert dict(rows.fetchall()) == {merging: None}


def test_policy_decides_merges_with_decide_entity_merge_and_nothing_else(
    fabric: Fabric, world: dict[str, Any]
) -> None:
    proposed = propose(fabric, world["ag"], world["gmbh"])
    (row,) = fabric.call(
        "mf_policy", "SELECT jsonb_agg(p) FROM fabric_api.entity_merge_proposals('acme') p"
    )
    assert row["approval_id"] == proposed["approval_id"]
    assert (row["entity_name"], row["into_entity_name"]) == ("Acme AG", "Acme GmbH")
    erasure = fabric.call(
        "mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", world["old"]
    )["approval_id"]

    def refused(login: str, query: str, *args: Any) -> str | None:
        before = (fabric.count("approvals", "status = 'pending'"), fabric.count("events"))
        with pytest.raises(psycopg.Error) as info:
            fabric.call(login, query, *args)
        assert (fabric.count("approvals", "status = 'pending'"), fabric.count("events")) == before
        return info.value.sqlstate

    decide = "SELECT fabric_api.decide_entity_merge(%s, 'approved', 'ok')"
    assert refused("mf_policy", decide, erasure) == "55000"  # an erasure is no merge
    assert refused("mf_consolidator", decide, proposed["approval_id"]) == "42501"
    assert refused("mf_policy", decide, world["ag"]) == "P0002"
    listing = "SELECT count(*) FROM fabric_api.entity_merge_proposals(%s, %s)"
    assert refused("mf_consolidator", listing, "acme", "pending") == "42501"
    assert refused("mf_policy", listing, "acme", "maybe") == "22023"
    assert refused("mf_policy", listing, "nowhere", "pending") == "P0002"
    decided = fabric.call("mf_policy", decide, proposed["approval_id"])
    assert decided["status"] == "approved"
