"""Supersession has one meaning on every path, retention never grows without an approval, and
approval targets are checked when they are requested.

Supersession: the old record closes at the successor's valid_from and the successor names it
in `supersedes`, whether through fabric_api.supersede or fabric_api.promote(..., p_supersedes);
a call that cannot supersede is an error, never a silent success. Retention: classes are
ordered by when they end for the instance (ephemeral < operational < regulated < durable); a
derived record takes the earliest-ending class of its sources unless an approval says
otherwise; audit records never decay and are never superseded.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric

pytestmark = pytest.mark.rollback

OLD_FROM = "2026-06-01T00:00:00Z"
NEW_FROM = "2026-07-02T09:14:00Z"  # episode()'s default valid_from


def refusal(fn: Any) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        fn()
    return caught.value


def approval(fabric: Fabric, memory_id: str, action: str, target: dict[str, Any]) -> str:
    a = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_approval(%s, %s, %s, 'needed')",
        memory_id,
        action,
        Jsonb(target),
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", a)
    return str(a)


def promote(
    fabric: Fabric,
    memory_id: str,
    tier: str,
    supersedes: str | None = None,
    approval_id: str | None = None,
) -> dict[str, Any]:
    return fabric.call(
        "mf_committer",
        "SELECT fabric_api.promote(%s, %s, %s, %s)",
        memory_id,
        tier,
        approval_id,
        supersedes,
    )


def supersede(fabric: Fabric, old: str, proposal: str, approval_id: str | None = None) -> Any:
    return fabric.call(
        "mf_committer",
        "SELECT fabric_api.supersede(%s, %s, %s)",
        old,
        proposal,
        approval_id,
    )


def as_of(fabric: Fabric, valid_at: str) -> list[str]:
    rows = (
        fabric.session("mf_auditor")
        .execute(
            "SELECT memory_id::text FROM fabric_audit.records_as_of('acme', %s) "
            "WHERE tier = 'profile'",
            (valid_at,),
        )
        .fetchall()
    )
    return [r[0] for r in rows]


@pytest.fixture
def run(fabric: Fabric) -> uuid.UUID:
    return fabric.open_run()


def semantic(fabric: Fabric, run: uuid.UUID, content: dict[str, Any], **overrides: Any) -> str:
    """A semantic record corroborated by two episodes (promotable to profile)."""
    a, b = fabric.form(run, "ep a"), fabric.form(run, "ep b")
    return fabric.form(run, tier="semantic", content=content, derived_from=[a, b], **overrides)


def old_profile(fabric: Fabric, run: uuid.UUID, content: dict[str, Any], **overrides: Any) -> str:
    return fabric.form(
        run,
        tier="profile",
        content=content,
        derived_from=[fabric.form(run, "ep old")],
        validity_interval={"valid_from": OLD_FROM, "valid_until": None},
        **overrides,
    )


# --- supersession through promotion ----------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [{"text": "no assertion key"}, {"key": "billing.entity", "value": "X"}],
    ids=["without-key", "with-key"],
)
@pytest.mark.clone
def test_promote_with_supersedes_closes_the_old_at_the_successors_valid_from(
    fabric: Fabric, run: uuid.UUID, content: dict[str, Any]
) -> None:
    old = old_profile(fabric, run, {**content, "value": "old"})
    new = semantic(fabric, run, {**content, "value": "new"})
    auditor = fabric.connect("mf_auditor")
    (before,) = auditor.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
    record = promote(fabric, new, "profile", supersedes=old)
    assert record["supersedes"] == old and record["tier"] == "profile"
    assert fabric.record(new)["supersedes"] == old
    closed = fabric.record(old)
    assert closed["consolidation_state"] == "superseded"
    assert closed["valid_until"].startswith("2026-07-02T09:14:00")
    assert as_of(fabric, "2026-06-15T00:00:00Z") == [old]
    assert as_of(fabric, "2026-08-01T00:00:00Z") == [new]  # one fact, not both

    def known_supersedes(known_at: Any) -> list[tuple[Any, ...]]:
        return auditor.execute(
            "SELECT tier, supersedes::text FROM fabric_audit.records_as_of('acme', %s, %s) "
            "WHERE memory_id = %s",
            ("2026-08-01T00:00:00Z", known_at, new),
        ).fetchall()

    assert known_supersedes("infinity") == [("profile", old)]
    assert known_supersedes(before) == [("semantic", None)]  # not yet known to replace it
    edges = (
        fabric.session("mf_auditor")
        .execute(
            "SELECT direction, memory_id::text FROM fabric_audit.lineage('acme', %s) "
            "WHERE direction LIKE 'supersed%%'",
            (new,),
        )
        .fetchall()
    )
    assert edges == [("supersedes", old)]
    assert (
        len(fabric.events(f"memory_id = '{old}' AND event_type = 'memory.record.superseded'")) == 1
    )


def test_supersede_shows_the_edge_in_lineage_both_ways(fabric: Fabric, run: uuid.UUID) -> None:
    old = old_profile(fabric, run, {"key": "k", "value": "a"})
    proposal = fabric.proposed(
        run,
        "x",
        tier="profile",
        content={"key": "k", "value": "b"},
        derived_from=[fabric.form(run)],
    )
    new = supersede(fabric, old, proposal)["memory_id"]
    auditor = fabric.connect("mf_auditor")
    down = auditor.execute(
        "SELECT direction, memory_id::text, derived_from_id::text "
        "FROM fabric_audit.lineage('acme', %s) WHERE direction LIKE 'supersed%%'",
        (old,),
    ).fetchall()
    assert down == [("superseded_by", new, old)]


def test_a_promotion_that_cannot_supersede_is_an_error_that_changes_nothing(
    fabric: Fabric, run: uuid.UUID
) -> None:
    new = semantic(fabric, run, {"text": "new"})
    in_other_tier = fabric.form(run, "episode")
    later = fabric.form(
        run,
        tier="profile",
        content={"text": "later"},
        derived_from=[in_other_tier],
        validity_interval={"valid_from": "2026-08-01T00:00:00Z", "valid_until": None},
    )
    dead = old_profile(fabric, run, {"text": "dead"})
    replacement = fabric.proposed(
        run,
        "x",
        tier="profile",
        content={"text": "r"},
        derived_from=[in_other_tier],
    )
    supersede(fabric, dead, replacement)
    cases = [
        (str(uuid.uuid4()), "P0002"),
        (in_other_tier, "23514"),
        (later, "23514"),  # the successor must start after the record it supersedes
        (dead, "55000"),  # already superseded
    ]
    for target, code in cases:
        err = refusal(lambda t=target: promote(fabric, new, "profile", supersedes=t))  # type: ignore[misc]
        assert err.sqlstate == code, (target, err)
        assert err.diag.message_hint
    assert fabric.record(new)["tier"] == "semantic" and fabric.record(new)["supersedes"] is None
    assert fabric.record(later)["consolidation_state"] == "raw"


def test_a_promotion_into_a_live_key_still_needs_supersedes(fabric: Fabric, run: uuid.UUID) -> None:
    old = old_profile(fabric, run, {"key": "k", "value": "a"})
    new = semantic(fabric, run, {"key": "k", "value": "b"})
    assert refusal(lambda: promote(fabric, new, "profile")).sqlstate == "23P01"
    assert fabric.record(old)["consolidation_state"] == "raw"


def test_promoted_supersession_follows_the_authority_rule(fabric: Fabric, run: uuid.UUID) -> None:
    declared = old_profile(
        fabric,
        run,
        {"text": "said"},
        provenance={"source_event_id": "e1", "formation_method": "declaration"},
    )
    new = semantic(fabric, run, {"text": "inferred"})
    assert refusal(lambda: promote(fabric, new, "profile", supersedes=declared)).sqlstate == "MF005"
    assert fabric.record(declared)["consolidation_state"] == "raw"
    ok = approval(fabric, new, "promote", {"tier": "profile", "supersedes": declared})
    assert promote(fabric, new, "profile", declared, ok)["supersedes"] == declared


# --- approval targets -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "target", "expected"),
    [
        ("promote", {"proposal_id": str(uuid.uuid4())}, "tier"),
        ("promote", {}, "tier"),
        ("promote", {"tier": "canary-tier"}, "tier"),
        ("promote", {"tier": "profile", "supersedes": "canary-uuid"}, "supersedes"),
        ("supersede", {"tier": "profile"}, "proposal_id"),
        ("supersede", {}, "proposal_id"),
        ("supersede", {"proposal_id": "canary-id"}, "proposal_id"),
        (
            "supersede",
            {"proposal_id": str(uuid.uuid4()), "retention_class": "forever"},
            "retention_class",
        ),
        ("erase", {"tier": "profile"}, "{}"),
    ],
)
def test_request_approval_checks_the_target_against_the_action(
    fabric: Fabric, run: uuid.UUID, action: str, target: dict[str, Any], expected: str
) -> None:
    rid = fabric.form(run)
    before = fabric.count("approvals")
    err = refusal(
        lambda: fabric.call(
            "mf_committer",
            "SELECT fabric_api.request_approval(%s, %s, %s, 'x')",
            rid,
            action,
            Jsonb(target),
        )
    )
    assert err.sqlstate == "22023"
    assert expected in (err.diag.message_hint or "")
    assert "canary" not in str(err)  # client values are never echoed
    assert fabric.count("approvals") == before


def request(fabric: Fabric, memory_id: str, action: str, target: dict[str, Any]) -> Any:
    return fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_approval(%s, %s, %s, 'x')",
        memory_id,
        action,
        Jsonb(target),
    )


def refused_writing_nothing(fabric: Fabric, fn: Any, sqlstate: str) -> psycopg.Error:
    before = {**fabric.counts(), "approvals": fabric.count("approvals")}
    err = refusal(fn)
    assert err.sqlstate == sqlstate, (err.sqlstate, str(err))
    assert err.diag.message_hint
    assert {**fabric.counts(), "approvals": fabric.count("approvals")} == before
    return err


def globex_record(fabric: Fabric) -> str:
    return fabric.form(
        fabric.open_run(agent_id="glx-agt-001", tenant="globex"),
        login="mf_agent_g",
        scope={"tenant_id": "globex", "visibility": "subject"},
    )


def globex_proposal(fabric: Fabric) -> str:
    return fabric.proposed(
        fabric.open_run(agent_id="glx-agt-001", tenant="globex"),
        login="mf_agent_g",
        scope={"tenant_id": "globex", "visibility": "subject"},
    )


@pytest.mark.parametrize("names", ["a-random-id", "another-tenants-record", "the-record-itself"])
def test_a_promote_target_supersedes_only_another_record_of_the_tenant(
    fabric: Fabric, run: uuid.UUID, names: str
) -> None:
    new = semantic(fabric, run, {"text": "new"})
    supersedes = {
        "a-random-id": lambda: str(uuid.uuid4()),
        "another-tenants-record": lambda: globex_record(fabric),
        "the-record-itself": lambda: new,
    }[names]()
    target = {"tier": "profile", "supersedes": supersedes}
    refused_writing_nothing(fabric, lambda: request(fabric, new, "promote", target), "P0002")


def test_a_promote_target_supersedes_only_a_live_record(fabric: Fabric, run: uuid.UUID) -> None:
    old = old_profile(fabric, run, {"text": "old"})
    supersede(fabric, old, fabric.proposed(run, "x", tier="profile", derived_from=[]))
    assert fabric.record(old)["consolidation_state"] == "superseded"
    new = semantic(fabric, run, {"text": "new"})
    target = {"tier": "profile", "supersedes": old}
    refused_writing_nothing(fabric, lambda: request(fabric, new, "promote", target), "55000")


@pytest.mark.parametrize("names", ["a-random-id", "another-tenants-proposal"])
def test_a_supersede_target_names_a_proposal_of_the_tenant(
    fabric: Fabric, run: uuid.UUID, names: str
) -> None:
    old = fabric.form(run, "old")
    proposal = str(uuid.uuid4()) if names == "a-random-id" else globex_proposal(fabric)
    target = {"proposal_id": proposal}
    refused_writing_nothing(fabric, lambda: request(fabric, old, "supersede", target), "P0002")


def test_a_supersede_target_names_a_validated_proposal(fabric: Fabric, run: uuid.UUID) -> None:
    old = fabric.form(run, "old")
    committed = fabric.proposed(run, "x")
    fabric.commit(committed)
    target = {"proposal_id": committed}
    refused_writing_nothing(fabric, lambda: request(fabric, old, "supersede", target), "55000")


def test_a_target_that_died_after_the_request_is_refused_when_used(
    fabric: Fabric, run: uuid.UUID
) -> None:
    """Checked again when the approval is used: the successor was committed meanwhile."""
    old = fabric.form(run, "old", validity_interval={"valid_from": OLD_FROM, "valid_until": None})
    proposal = fabric.proposed(run, "x")
    ok = approval(fabric, old, "supersede", {"proposal_id": proposal})
    fabric.commit(proposal)
    refused_writing_nothing(fabric, lambda: supersede(fabric, old, proposal, ok), "55000")
    assert fabric.count("approvals", f"approval_id = '{ok}' AND status = 'approved'") == 1


def test_live_targets_of_the_tenant_are_accepted(fabric: Fabric, run: uuid.UUID) -> None:
    old = old_profile(fabric, run, {"text": "old"})
    new = semantic(fabric, run, {"text": "new"})
    assert request(fabric, new, "promote", {"tier": "profile", "supersedes": old})["approval_id"]
    proposal = fabric.proposed(run, "x", tier="profile", derived_from=[])
    assert request(fabric, old, "supersede", {"proposal_id": proposal})["approval_id"]


# --- retention never grows without an approval -------------------------------------------------


def test_supersede_refuses_a_longer_retention_without_approval(
    fabric: Fabric, run: uuid.UUID
) -> None:
    old = fabric.form(
        run,
        "old",
        retention_class="operational",
        validity_interval={"valid_from": OLD_FROM, "valid_until": None},
    )
    longer = fabric.proposed(run, "x", retention_class="durable")
    assert refusal(lambda: supersede(fabric, old, longer)).sqlstate == "MF005"
    assert fabric.record(old)["consolidation_state"] == "raw"
    assert fabric.count("memory_records", f"supersedes = '{old}'") == 0
    same = fabric.proposed(run, "x", retention_class="operational")
    assert supersede(fabric, old, same)["retention_class"] == "operational"


def test_supersede_of_a_regulated_label_record_into_a_longer_class_needs_approval(
    fabric: Fabric, run: uuid.UUID
) -> None:
    old = fabric.form(
        run,
        "old",
        retention_class="regulated",
        compliance_labels=["phi"],
        validity_interval={"valid_from": OLD_FROM, "valid_until": None},
    )
    longer = fabric.proposed(run, "x", retention_class="durable", compliance_labels=["phi"])
    assert refusal(lambda: supersede(fabric, old, longer)).sqlstate == "MF005"
    assert fabric.record(old)["consolidation_state"] == "raw"
    ok = approval(fabric, old, "supersede", {"proposal_id": longer, "retention_class": "durable"})
    assert supersede(fabric, old, longer, ok)["retention_class"] == "durable"


def test_audit_records_are_never_superseded(fabric: Fabric, run: uuid.UUID) -> None:
    old = fabric.form(
        run,
        "audit",
        retention_class="audit",
        validity_interval={"valid_from": OLD_FROM, "valid_until": None},
    )
    successor = fabric.proposed(run, "x", retention_class="audit")
    err = refusal(lambda: supersede(fabric, old, successor))
    assert err.sqlstate == "MF002" and err.diag.message_hint
    assert fabric.record(old)["consolidation_state"] == "raw"
    assert fabric.count("proposals", f"proposal_id = '{successor}' AND status = 'validated'") == 1


@pytest.mark.clone
def test_audit_records_never_decay_whoever_tries(fabric: Fabric, run: uuid.UUID) -> None:
    rid = fabric.form(
        run,
        "audit",
        retention_class="audit",
        validity_interval={
            "valid_from": "2026-01-01T00:00:00Z",
            "valid_until": "2026-02-01T00:00:00Z",
        },
    )
    done = fabric.call("mf_committer", "SELECT fabric_api.run_decay()")
    assert done["expired"] == 0
    assert fabric.record(rid)["consolidation_state"] == "raw"
    with fabric.owner() as owner:
        for state in ("expired", "superseded"):
            with pytest.raises(psycopg.Error) as caught:
                owner.execute(
                    "UPDATE fabric.memory_records SET consolidation_state = %s "
                    "WHERE memory_id = %s",
                    (state, rid),
                )
            assert caught.value.sqlstate == "MF002"
    assert fabric.record(rid)["consolidation_state"] == "raw"


def recommend(fabric: Fabric, sources: list[str], proposal: dict[str, Any]) -> str:
    wf = fabric.call("mf_consolidator", "SELECT fabric_api.start_workflow_run('acme')")
    rec = fabric.call(
        "mf_consolidator",
        "SELECT fabric_api.recommend(%s)",
        Jsonb(
            {
                "tenant_id": "acme",
                "kind": "consolidation",
                "workflow_event_id": str(wf),
                "sources": sources,
                "proposal": {"content": {"key": "k", "value": 1}, "confidence": 0.9, **proposal},
            }
        ),
    )
    return str(rec["recommendation_id"])


def commit_recommendation(fabric: Fabric, rid: str) -> dict[str, Any]:
    return fabric.call("mf_committer", "SELECT fabric_api.commit_recommendation(%s)", rid)


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        (["operational", "durable"], "operational"),
        (["durable", "regulated"], "regulated"),
        (["regulated", "operational"], "operational"),
        (["audit", "durable"], "durable"),
        (["audit", "audit"], "durable"),
    ],
)
def test_consolidation_takes_the_earliest_ending_class_of_its_sources(
    fabric: Fabric, run: uuid.UUID, classes: list[str], expected: str
) -> None:
    sources = [
        fabric.form(run, f"ep {i}", retention_class=c, compliance_labels=["phi"])
        for i, c in enumerate(classes)
    ]
    result = commit_recommendation(fabric, recommend(fabric, sources, {}))
    assert result["status"] == "committed", result
    assert result["record"]["retention_class"] == expected
    assert fabric.record(result["record"]["memory_id"])["retention_class"] == expected


def test_consolidation_never_lengthens_retention_on_request(fabric: Fabric, run: uuid.UUID) -> None:
    sources = [fabric.form(run, f"ep {i}", retention_class="operational") for i in range(2)]
    before = fabric.count("memory_records")
    longer = commit_recommendation(
        fabric, recommend(fabric, sources, {"retention_class": "durable"})
    )
    assert longer["status"] == "rejected" and "retention" in longer["reason"]
    assert fabric.count("memory_records") == before
    shorter = commit_recommendation(
        fabric, recommend(fabric, sources, {"retention_class": "operational"})
    )
    assert shorter["record"]["retention_class"] == "operational"


def test_operational_window_longer_than_the_ceiling_orders_by_effective_end(
    fabric: Fabric, run: uuid.UUID
) -> None:
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb(
            {
                "operational_window": "3650 days",
                "regulated_retention": {"default": {"floor": "1 day", "ceiling": "30 days"}},
            }
        ),
    )
    sources = [
        fabric.form(run, "a", retention_class="operational"),
        fabric.form(run, "b", retention_class="regulated", compliance_labels=["phi"]),
    ]
    result = commit_recommendation(fabric, recommend(fabric, sources, {}))
    assert result["record"]["retention_class"] == "regulated"


def test_a_promotion_that_supersedes_never_lengthens_retention_without_approval(
    fabric: Fabric, run: uuid.UUID
) -> None:
    old = old_profile(fabric, run, {"text": "old"}, retention_class="operational")
    new = semantic(fabric, run, {"text": "new"})  # durable
    assert refusal(lambda: promote(fabric, new, "profile", supersedes=old)).sqlstate == "MF005"
    assert fabric.record(old)["consolidation_state"] == "raw"
    assert fabric.record(new)["tier"] == "semantic"
    ok = approval(fabric, new, "promote", {"tier": "profile", "supersedes": old})
    assert promote(fabric, new, "profile", old, ok)["retention_class"] == "durable"
