"""The graph tier's sources: agent lineage links (written by domain workflows only, every
reference inside the tenant, append-only, evented), entities deduplicated per tenant with
the records that mention them, and what erasure removes of them."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, call, episode

pytestmark = pytest.mark.rollback


def formed(fabric: Fabric, tenant: str = "acme", text: str = "e", **overrides: Any) -> str:
    if tenant == "acme":
        return fabric.form(text=text, **overrides)
    run = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    env = episode(text, **overrides)
    env["scope"] = {**env["scope"], "tenant_id": "globex"}
    return fabric.form(run, login="mf_agent_g", envelope=env)


def formed_event(fabric: Fabric, memory_id: str) -> str:
    (event,) = fabric.events(f"memory_id = '{memory_id}' AND event_type = 'memory.record.formed'")
    return str(event["event_id"])


def link(fabric: Fabric, *args: Any, login: str = "mf_workflow") -> dict[str, Any]:
    with fabric.acting(login) as conn:
        return call(conn, "fabric_api.record_agent_link", *args)  # type: ignore[no-any-return]


def written(fabric: Fabric) -> tuple[int, int]:
    return fabric.count("agent_lineage_links"), fabric.count("events")


def refused(fabric: Fabric, *args: Any, login: str = "mf_workflow") -> str:
    before = written(fabric)
    with pytest.raises(psycopg.Error) as info:
        link(fabric, *args, login=login)
    assert written(fabric) == before  # a refusal writes nothing
    return str(info.value.sqlstate)


@pytest.fixture
def world(fabric: Fabric) -> dict[str, str]:
    outcome = formed(fabric, text="invoice 4711 was paid")
    foreign = formed(fabric, "globex", text="globex outcome")
    return {
        "outcome": outcome,
        "event": formed_event(fabric, outcome),
        "foreign": foreign,
        "foreign_event": formed_event(fabric, foreign),
    }


# -- agent lineage links -------------------------------------------------------------------


def test_a_workflow_records_a_link_once_with_its_event(
    fabric: Fabric, world: dict[str, str]
) -> None:
    args = ("acme", "com-agt-003", world["outcome"], "contributed", world["event"], "corr-7f2a")
    first = link(fabric, *args)
    assert first["recorded"] is True
    again = link(fabric, *args)
    assert again == {"link_id": first["link_id"], "recorded": False}
    assert fabric.count("agent_lineage_links") == 1
    (event,) = fabric.events("event_type = 'memory.agent_link.recorded'")
    assert event["memory_id"] == world["outcome"]
    assert event["correlation_id"] == "corr-7f2a"
    assert event["causation_id"] == world["event"]
    assert event["actor_agent_id"] == "wf-billing-001"
    assert event["payload"] == {
        "link_id": first["link_id"],
        "agent_id": "com-agt-003",
        "kind": "contributed",
        "source_event_id": world["event"],
    }


@pytest.mark.parametrize("login", ["mf_agent_a", "mf_committer", "mf_orchestrator", "mf_admin"])
def test_only_a_domain_workflow_records_links(
    fabric: Fabric, world: dict[str, str], login: str
) -> None:
    args = ("acme", "com-agt-003", world["outcome"], "caused", world["event"], "corr-1")
    assert refused(fabric, *args, login=login) == "42501"


def test_a_workflow_not_enabled_in_the_tenant_is_refused(
    fabric: Fabric, world: dict[str, str]
) -> None:
    args = ("globex", "glx-agt-001", world["foreign"], "caused", world["foreign_event"], "c-1")
    assert refused(fabric, *args) == "42501"


@pytest.mark.parametrize(
    ("change", "sqlstate"),
    [
        ({"agent": "no-such-agent"}, "P0002"),
        ({"agent": "glx-agt-001"}, "42501"),  # registered, enabled in globex only
        ({"outcome": str(uuid.uuid4())}, "P0002"),
        ({"outcome": "foreign"}, "42501"),
        ({"event": str(uuid.uuid4())}, "P0002"),
        ({"event": "foreign_event"}, "42501"),
        ({"tenant": "nowhere"}, "P0002"),
        ({"kind": "blamed"}, "22023"),
        ({"kind": None}, "22023"),
        ({"correlation": "has space"}, "22023"),
        ({"correlation": None}, "22023"),
    ],
)
def test_a_link_outside_its_tenant_or_malformed_is_refused(
    fabric: Fabric, world: dict[str, str], change: dict[str, Any], sqlstate: str
) -> None:
    outcome = change.get("outcome", world["outcome"])
    event = change.get("event", world["event"])
    args = (
        change.get("tenant", "acme"),
        change.get("agent", "com-agt-003"),
        world.get(outcome, outcome),
        change.get("kind", "caused"),
        world.get(event, event),
        change.get("correlation", "corr-1"),
    )
    assert refused(fabric, *args) == sqlstate


def test_an_erased_outcome_is_refused(fabric: Fabric, world: dict[str, str]) -> None:
    erase(fabric, world["outcome"])
    args = ("acme", "com-agt-003", world["outcome"], "caused", world["event"], "corr-1")
    assert refused(fabric, *args) == "55000"


def test_links_are_append_only(fabric: Fabric, world: dict[str, str]) -> None:
    link(fabric, "acme", "com-agt-003", world["outcome"], "caused", world["event"], "corr-1")
    # the owner's row-level security has no UPDATE or DELETE policy: nothing to change
    assert fabric.owner().execute("DELETE FROM fabric.agent_lineage_links").rowcount == 0
    # and whoever bypasses it (the migration role, a superuser) meets the trigger
    owner = fabric.su()
    for statement in (
        "UPDATE fabric.agent_lineage_links SET link_kind = 'contributed'",
        "DELETE FROM fabric.agent_lineage_links",
        "TRUNCATE fabric.agent_lineage_links",
    ):
        with pytest.raises(psycopg.Error) as info:
            owner.execute(statement)
        assert info.value.sqlstate == "MF003", statement
    assert fabric.count("agent_lineage_links", "link_kind = 'caused'") == 1


def test_links_show_only_in_their_tenant(fabric: Fabric, world: dict[str, str]) -> None:
    link(fabric, "acme", "com-agt-003", world["outcome"], "caused", world["event"], "corr-1")
    for tenant, seen in (("acme", 1), ("globex", 0)):
        row = fabric.owner(tenant).execute("SELECT count(*) FROM fabric.agent_lineage_links")
        assert row.fetchone() == (seen,)


def test_an_auditor_reads_the_links_and_the_projector_its_feed(
    fabric: Fabric, world: dict[str, str]
) -> None:
    made = link(fabric, "acme", "com-agt-003", world["outcome"], "caused", world["event"], "c-1")
    with fabric.acting("mf_auditor") as conn:
        rows = conn.execute(
            "SELECT link_id::text, agent_id, outcome_id::text FROM fabric_audit.agent_links('acme')"
        ).fetchall()
    assert rows == [(made["link_id"], "com-agt-003", world["outcome"])]
    with fabric.acting("mf_projector") as conn:
        rows = conn.execute(
            "SELECT link_id::text, correlation_id FROM fabric_api.projection_agent_links(%s)",
            ([uuid.UUID(world["outcome"]), uuid.UUID(world["foreign"])],),
        ).fetchall()
    assert rows == [(made["link_id"], "c-1")]


# -- entities --------------------------------------------------------------------------------


def entities(fabric: Fabric, tenant: str = "acme") -> list[tuple[str, str, str]]:
    rows = (
        fabric.session(None)
        .execute(
            "SELECT entity_type, entity_key, name FROM fabric.entities WHERE tenant_id = %s"
            " ORDER BY 1, 2",
            (tenant,),
        )
        .fetchall()
    )
    return [tuple(r) for r in rows]  # type: ignore[misc]


def mentions(fabric: Fabric, memory_id: str) -> list[tuple[str, str, str]]:
    rows = (
        fabric.session(None)
        .execute(
            "SELECT e.entity_type, e.entity_key, x.source FROM fabric.memory_mentions x"
            " JOIN fabric.entities e USING (tenant_id, entity_id) WHERE x.memory_id = %s"
            " ORDER BY 1, 2",
            (memory_id,),
        )
        .fetchall()
    )
    return [tuple(r) for r in rows]  # type: ignore[misc]


DECLARED = [
    {"type": "organization", "name": "Acme  GmbH"},
    {"type": "location", "name": "Berlin", "id": "geo:2950159"},
]


def with_entities(text: str, declared: Any) -> dict[str, Any]:
    return {"text": text, "entities": declared}


def test_the_extractor_links_declared_entities_mentions_and_the_subject(fabric: Fabric) -> None:
    m = fabric.form(envelope=episode(content=with_entities("ask @Dana about it", DECLARED)))
    assert mentions(fabric, m) == [
        ("location", "id:geo:2950159", "declared"),
        ("organization", "name:acme gmbh", "declared"),
        ("person", "name:@dana", "mention"),
        ("person", "subject:user-8842", "subject"),
    ]
    # A second record naming the same entities finds them: one row per (type, key).
    other = [{"type": "organization", "name": "ACME GmbH "}]
    m2 = fabric.form(envelope=episode(content=with_entities("mail a@b.example, @dana", other)))
    assert [k for _, k, _ in mentions(fabric, m2)] == [
        "name:acme gmbh",
        "name:@dana",
        "subject:user-8842",
    ]
    assert len(entities(fabric)) == 4


def test_an_entity_named_several_ways_in_one_record_is_mentioned_once(fabric: Fabric) -> None:
    """Declared, @-mentioned twice and in two records of one import (the set-based path) and
    one commit (the row path): one mention a record and entity, with the first source the
    extractor ranks; new records' mentions are inserted without a conflict clause, so a second
    row for the same record and entity would raise unique_violation here."""
    content = with_entities("@Dana, then @dana again", [{"type": "person", "name": "@Dana"}])
    single = fabric.form(envelope=episode(content=content))
    scope = {"tenant_id": "acme", "subject_id": "user-8842", "agent_id": "com-agt-003",
             "session_id": "sess-1f9c", "visibility": "subject"}  # fmt: skip
    answer = fabric.call(
        "mf_committer", "SELECT fabric_api.import_records(%s, %s, %s)", "acme", "imp-twice",
        Jsonb([
            {"scope": scope, "content": {**content, "n": n}, "confidence": 0.9}
            for n in (1, 2)
        ]),
    )  # fmt: skip
    assert answer["formed"] == 2, answer
    imported = [
        str(m)
        for (m,) in fabric.session(None).execute(
            "SELECT memory_id FROM fabric.memory_records WHERE formation_method = 'import'"
        )
    ]
    for memory_id in (single, *imported):
        assert mentions(fabric, memory_id) == [
            ("person", "name:@dana", "declared"),
            ("person", "subject:user-8842", "subject"),
        ], memory_id


@pytest.mark.parametrize(
    "declared",
    [
        {"type": "person", "name": "x"},
        [{"type": "planet", "name": "Mars"}],
        [{"type": "person"}],
        [{"type": "person", "name": "   "}],
        [{"type": "person", "name": "x" * 201}],
        [{"type": "person", "name": "x", "id": 7}],
        [{"type": "person", "name": "x", "id": "has space"}],
        [{"type": "person", "name": "x", "email": "x@y"}],
        [{"type": "object", "name": "x"}] * 51,
    ],
)
def test_malformed_entities_are_refused_at_propose(fabric: Fabric, declared: Any) -> None:
    run = fabric.open_run()
    before = fabric.counts(), fabric.count("entities")
    with pytest.raises(psycopg.Error) as info:
        fabric.propose("mf_agent_a", episode(content=with_entities("t", declared)), run)
    assert info.value.sqlstate == "22023"
    assert (fabric.counts(), fabric.count("entities")) == before


def test_erasing_a_record_removes_its_mentions_and_entities_no_one_mentions(
    fabric: Fabric,
) -> None:
    kept = fabric.form(envelope=episode(content=with_entities("kept", DECLARED[:1])))
    gone = fabric.form(envelope=episode(content=with_entities("@eve", DECLARED)))
    erase(fabric, gone)
    assert mentions(fabric, gone) == []
    assert [k for _, k, _ in entities(fabric)] == ["name:acme gmbh", "subject:user-8842"]
    assert len(mentions(fabric, kept)) == 2


def test_a_subject_erasure_removes_the_subjects_person_and_its_mentions(fabric: Fabric) -> None:
    tenant_wide = episode(content=with_entities("@eve", DECLARED[:1]))
    fabric.form(envelope=tenant_wide)
    other_run = fabric.open_run(subject="user-9999")
    other = fabric.form(other_run, envelope=episode(content=with_entities("x", DECLARED[:1])))
    with fabric.acting("mf_committer") as conn:
        approval = call(
            conn, "fabric_api.request_subject_erasure", "acme", "user-8842", "GDPR art. 17", False
        )["approval_id"]
    approve_and_erase(fabric, approval)
    keys = [k for _, k, _ in entities(fabric)]
    assert "subject:user-8842" not in keys and "name:@eve" not in keys
    assert keys == ["name:acme gmbh", "subject:user-9999"]
    assert fabric.count("memory_mentions", "source = 'subject'") == 1
    assert len(mentions(fabric, other)) == 2


def erase(fabric: Fabric, memory_id: str) -> None:
    with fabric.acting("mf_committer") as conn:
        approval = call(conn, "fabric_api.request_erasure", memory_id, "asked", False)[
            "approval_id"
        ]
    approve_and_erase(fabric, approval)


def approve_and_erase(fabric: Fabric, approval: str) -> None:
    with fabric.acting("mf_policy") as conn:
        call(conn, "fabric_api.decide_approval", approval, "approved", "ok")
    with fabric.acting("mf_committer") as conn:
        call(conn, "fabric_api.erase", approval)


# -- reasoning steps ---------------------------------------------------------------------------


def step(fabric: Fabric, *args: Any, login: str = "mf_workflow") -> dict[str, Any]:
    with fabric.acting(login) as conn:
        return call(conn, "fabric_api.record_step", *args)  # type: ignore[no-any-return]


def step_refused(fabric: Fabric, *args: Any, login: str = "mf_workflow") -> str:
    before = fabric.count("reasoning_steps"), fabric.count("step_touches"), fabric.count("events")
    with pytest.raises(psycopg.Error) as info:
        step(fabric, *args, login=login)
    after = fabric.count("reasoning_steps"), fabric.count("step_touches"), fabric.count("events")
    assert after == before  # a refusal writes nothing
    return str(info.value.sqlstate)


def entity_of(fabric: Fabric, key: str, tenant: str = "acme") -> uuid.UUID:
    row = (
        fabric.session(None)
        .execute(
            "SELECT entity_id FROM fabric.entities WHERE tenant_id = %s AND entity_key = %s",
            (tenant, key),
        )
        .fetchone()
    )
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_a_step_records_what_it_touched_and_the_auditor_sees_what_followed(
    fabric: Fabric, world: dict[str, str]
) -> None:
    run = fabric.open_run()
    fabric.form(run, envelope=episode(content=with_entities("x", DECLARED[:1])))
    acme = entity_of(fabric, "name:acme gmbh")
    made = step(fabric, run, "corr-7f2a", [acme, acme], None)
    link(fabric, "acme", "com-agt-003", world["outcome"], "caused", world["event"], "corr-7f2a")
    (event,) = fabric.events("event_type = 'memory.reasoning_step.recorded'")
    assert (event["correlation_id"], event["actor_agent_id"]) == ("corr-7f2a", "wf-billing-001")
    assert fabric.count("step_touches") == 1
    with fabric.acting("mf_auditor") as conn:
        rows = conn.execute(
            "SELECT step_id::text, agent_id, run_id, outcome_ids"
            " FROM fabric_audit.entity_touches('acme', %s)",
            (acme,),
        ).fetchall()
    assert rows == [(made["step_id"], "com-agt-003", run, [uuid.UUID(world["outcome"])])]


def test_step_refusals_write_nothing(fabric: Fabric, world: dict[str, str]) -> None:
    run = fabric.open_run()
    subject = entity_of(fabric, "subject:user-8842")
    glx_run = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    glx_entity = entity_of(fabric, "subject:user-8842", "globex")
    assert step_refused(fabric, run, "c-1", [subject], login="mf_agent_a") == "42501"
    assert step_refused(fabric, uuid.uuid4(), "c-1", [subject]) == "P0002"
    assert step_refused(fabric, run, "c-1", [glx_entity]) == "P0002"  # another tenant's
    assert step_refused(fabric, run, "c-1", [uuid.uuid4()]) == "P0002"
    assert step_refused(fabric, run, "c-1", []) == "22023"
    assert step_refused(fabric, run, "has space", [subject]) == "22023"
    assert step_refused(fabric, glx_run, "c-1", [glx_entity]) == "42501"  # not enabled there
    step(fabric, run, "c-1", [subject], None)
    with pytest.raises(psycopg.Error) as info:
        fabric.su().execute("DELETE FROM fabric.reasoning_steps")
    assert info.value.sqlstate == "MF003"
