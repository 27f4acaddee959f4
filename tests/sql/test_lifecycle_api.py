"""Governed lifecycle (R-APPR-1, R-SUPER-1): approvals, promotion and demotion, supersession and
contradictions, profile reconstruction, consolidation."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, episode, wait_until_blocked
from memfabric.consolidate import DeterministicConsolidator, run_consolidation

pytestmark = pytest.mark.rollback

MF005 = "MF005"


def fact(
    fabric: Fabric,
    run: uuid.UUID,
    key: str,
    value: str,
    sources: list[str],
    tier: str = "semantic",
    **overrides: Any,
) -> str:
    return fabric.form(
        run,
        tier=tier,
        content={"key": key, "value": value},
        derived_from=sources,
        **overrides,
    )


def approval(
    fabric: Fabric,
    memory_id: str,
    action: str,
    target: dict[str, Any],
    decision: str | None = "approved",
) -> str:
    a = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_approval(%s, %s, %s, 'needed')",
        memory_id,
        action,
        Jsonb(target),
    )["approval_id"]
    if decision:
        fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, %s, 'ok')", a, decision)
    return str(a)


def promote(
    fabric: Fabric,
    memory_id: str,
    tier: str,
    approval_id: str | None = None,
    supersedes: str | None = None,
) -> dict[str, Any]:
    return fabric.call(
        "mf_committer",
        "SELECT fabric_api.promote(%s, %s, %s, %s)",
        memory_id,
        tier,
        approval_id,
        supersedes,
    )


def sqlstate(fn: Any) -> str | None:
    with pytest.raises(psycopg.Error) as caught:
        fn()
    return caught.value.sqlstate


@pytest.fixture
def run(fabric: Fabric) -> uuid.UUID:
    return fabric.open_run()


@pytest.fixture
def corroborated(fabric: Fabric, run: uuid.UUID) -> str:
    """A semantic record with two episodic sources and confidence 0.9."""
    a, b = fabric.form(run, "ep a"), fabric.form(run, "ep b")
    return fact(fabric, run, "billing.entity", "Acme BV", [a, b])


# --- approvals ------------------------------------------------------------------------


@pytest.mark.clone
def test_promotion_into_relational_needs_a_decided_matching_unused_approval(
    fabric: Fabric, run: uuid.UUID, corroborated: str
) -> None:
    other = fact(fabric, run, "other.key", "x", [fabric.form(run)])
    assert sqlstate(lambda: promote(fabric, corroborated, "relational")) == MF005
    pending = approval(fabric, corroborated, "promote", {"tier": "relational"}, decision=None)
    assert sqlstate(lambda: promote(fabric, corroborated, "relational", pending)) == MF005
    denied = approval(fabric, corroborated, "promote", {"tier": "relational"}, "denied")
    assert sqlstate(lambda: promote(fabric, corroborated, "relational", denied)) == MF005
    wrong_record = approval(fabric, other, "promote", {"tier": "relational"})
    assert sqlstate(lambda: promote(fabric, corroborated, "relational", wrong_record)) == MF005
    wrong_action = approval(fabric, corroborated, "erase", {})
    assert sqlstate(lambda: promote(fabric, corroborated, "relational", wrong_action)) == MF005
    wrong_target = approval(fabric, corroborated, "promote", {"tier": "profile"})
    assert sqlstate(lambda: promote(fabric, corroborated, "relational", wrong_target)) == MF005
    expired = approval(fabric, corroborated, "promote", {"tier": "relational"})
    with fabric.su() as su:
        su.execute(
            "UPDATE fabric.approvals SET expires_at = requested_at + interval '1 microsecond'"
            " WHERE approval_id = %s",
            (expired,),
        )
    assert sqlstate(lambda: promote(fabric, corroborated, "relational", expired)) == MF005
    assert (
        fabric.count("memory_records", f"memory_id = '{corroborated}' AND tier = 'semantic'") == 1
    )
    good = approval(fabric, corroborated, "promote", {"tier": "relational"})
    assert promote(fabric, corroborated, "relational", good)["tier"] == "relational"
    assert sqlstate(lambda: promote(fabric, other, "relational", good)) == MF005  # reused


def test_only_policy_decides_and_a_decision_is_final(fabric: Fabric, corroborated: str) -> None:
    a = approval(fabric, corroborated, "promote", {"tier": "relational"}, decision=None)
    for login in ("mf_committer", "mf_agent_a", "mf_admin"):
        assert (
            sqlstate(
                lambda lg=login: fabric.call(  # type: ignore[misc]
                    lg, "SELECT fabric_api.decide_approval(%s, 'approved', 'x')", a
                )
            )
            == "42501"
        )
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'denied', 'no')", a)
    assert (
        sqlstate(
            lambda: fabric.call(
                "mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'x')", a
            )
        )
        == "55000"
    )
    assert (
        sqlstate(
            lambda: fabric.call(
                "mf_agent_a",
                "SELECT fabric_api.request_approval(%s, 'promote', '{}', 'x')",
                corroborated,
            )
        )
        == "42501"
    )


# --- promotion and demotion -------------------------------------------------------------


def test_promotion_keeps_identity_content_and_event_ids(fabric: Fabric, corroborated: str) -> None:
    before = fabric.events(f"memory_id = '{corroborated}'")[0]
    record = promote(fabric, corroborated, "profile")
    assert record["memory_id"] == corroborated and record["tier"] == "profile"
    assert record["content"] == {"key": "billing.entity", "value": "Acme BV"}
    (event,) = fabric.events(
        f"memory_id = '{corroborated}' AND event_type = 'memory.record.promoted'"
    )
    assert (event["correlation_id"], event["causation_id"]) == (
        before["correlation_id"],
        before["causation_id"],
    )
    assert event["payload"]["from_tier"] == "semantic" and event["payload"]["to_tier"] == "profile"


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("episodic", "semantic"),
        ("episodic", "profile"),
        ("semantic", "episodic"),
        ("profile", "semantic"),
        ("procedural", "profile"),
    ],
)
def test_illegal_promotion_edges_are_refused(
    fabric: Fabric, run: uuid.UUID, source: str, target: str
) -> None:
    ep = fabric.form(run)
    rid = ep if source == "episodic" else fact(fabric, run, "k", "v", [ep], tier=source)
    assert sqlstate(lambda: promote(fabric, rid, target)) == "MF002"
    assert fabric.count("memory_records", f"memory_id = '{rid}' AND tier = '{source}'") == 1


def test_every_legal_edge_promotes(fabric: Fabric, run: uuid.UUID) -> None:
    for tier, target in (("semantic", "profile"), ("semantic", "procedural")):
        a, b = fabric.form(run), fabric.form(run)
        rid = fact(fabric, run, f"k.{target}", "v", [a, b], tier=tier)
        assert promote(fabric, rid, target)["tier"] == target
    for tier in ("episodic", "semantic", "procedural", "profile"):
        ep = fabric.form(run)
        rid = ep if tier == "episodic" else fact(fabric, run, f"r.{tier}", "v", [ep], tier=tier)
        ok = approval(fabric, rid, "promote", {"tier": "relational"})
        assert promote(fabric, rid, "relational", ok)["tier"] == "relational"


def test_audit_class_records_are_never_promoted(fabric: Fabric, run: uuid.UUID) -> None:
    rid = fabric.form(run, retention_class="audit")
    ok = approval(fabric, rid, "promote", {"tier": "relational"})
    assert sqlstate(lambda: promote(fabric, rid, "relational", ok)) == "MF002"


def test_promotion_threshold_is_checked_on_the_source(fabric: Fabric, run: uuid.UUID) -> None:
    lone = fact(fabric, run, "k1", "v", [fabric.form(run)])
    assert sqlstate(lambda: promote(fabric, lone, "profile")) == "23514"
    low = fact(fabric, run, "k2", "v", [fabric.form(run), fabric.form(run)], confidence=0.5)
    assert sqlstate(lambda: promote(fabric, low, "profile")) == "23514"
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb({"min_corroborating_episodes": 1, "min_confidence": 0.4}),
    )
    assert promote(fabric, lone, "profile")["tier"] == "profile"
    assert promote(fabric, low, "profile")["tier"] == "profile"


def test_domain_pack_defaults_apply_until_the_instance_sets_its_own(
    fabric: Fabric, run: uuid.UUID
) -> None:
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.declare_pack_defaults('pack', %s)",
        Jsonb({"min_corroborating_episodes": 3}),
    )
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb({"domain_pack_id": "pack"}),
    )
    two = fact(fabric, run, "k", "v", [fabric.form(run), fabric.form(run)])
    assert sqlstate(lambda: promote(fabric, two, "profile")) == "23514"
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb({"min_corroborating_episodes": 2}),
    )
    assert promote(fabric, two, "profile")["tier"] == "profile"
    assert (
        sqlstate(
            lambda: fabric.call(
                "mf_agent_a", "SELECT fabric_api.configure_instance('acme', NULL, '{}')"
            )
        )
        == "42501"
    )
    assert (
        sqlstate(
            lambda: fabric.call(
                "mf_admin",
                "SELECT fabric_api.configure_instance('acme', NULL, '{\"bogus\": 1}')",
            )
        )
        == "22023"
    )


def test_promoting_into_a_live_key_needs_supersedes(
    fabric: Fabric, run: uuid.UUID, corroborated: str
) -> None:
    ep = fabric.form(run)
    declared = fact(
        fabric,
        run,
        "billing.entity",
        "Old BV",
        [ep],
        tier="profile",
        provenance={"source_event_id": "e1", "formation_method": "declaration"},
        validity_interval={"valid_from": "2026-06-01T00:00:00Z", "valid_until": None},
    )
    assert sqlstate(lambda: promote(fabric, corroborated, "profile")) == "23P01"
    # an extraction replacing a declaration needs an approval, as in fabric_api.supersede
    assert sqlstate(lambda: promote(fabric, corroborated, "profile", supersedes=declared)) == MF005
    ok = approval(fabric, corroborated, "promote", {"tier": "profile", "supersedes": declared})
    record = promote(fabric, corroborated, "profile", ok, supersedes=declared)
    assert record["tier"] == "profile" and record["supersedes"] == declared
    assert (
        fabric.count(
            "memory_records", f"memory_id = '{declared}' AND consolidation_state = 'superseded'"
        )
        == 1
    )


def test_demotion_returns_only_to_a_tier_held_before(fabric: Fabric, corroborated: str) -> None:
    promote(fabric, corroborated, "profile")
    assert (
        sqlstate(
            lambda: fabric.call(
                "mf_committer", "SELECT fabric_api.demote(%s, 'episodic')", corroborated
            )
        )
        == "MF002"
    )
    record = fabric.call("mf_committer", "SELECT fabric_api.demote(%s, 'semantic')", corroborated)
    assert record["tier"] == "semantic"
    types = [e["event_type"] for e in fabric.events(f"memory_id = '{corroborated}'")]
    assert types[-2:] == ["memory.record.promoted", "memory.record.demoted"]


@pytest.mark.clone
def test_no_tier_change_without_its_event_whoever_runs_it(
    fabric: Fabric, corroborated: str
) -> None:
    with fabric.owner() as owner:
        assert (
            sqlstate(
                lambda: owner.execute(
                    "UPDATE fabric.memory_records SET tier = 'profile' WHERE memory_id = %s",
                    (corroborated,),
                )
            )
            == "MF002"
        )
        owner.execute("SELECT set_config('fabric.action', 'promote', false)")
        assert (
            sqlstate(
                lambda: owner.execute(
                    "UPDATE fabric.memory_records SET tier = 'episodic' WHERE memory_id = %s",
                    (corroborated,),
                )
            )
            == "MF002"
        )
        owner.execute(
            "UPDATE fabric.memory_records SET tier = 'profile' WHERE memory_id = %s",
            (corroborated,),
        )
    assert (
        len(
            fabric.events(f"memory_id = '{corroborated}' AND event_type = 'memory.record.promoted'")
        )
        == 1
    )


# --- supersession and contradictions ---------------------------------------------------------


def successor(
    fabric: Fabric,
    run: uuid.UUID,
    key: str,
    value: str,
    sources: list[str],
    valid_from: str = "2026-09-01T00:00:00Z",
    **overrides: Any,
) -> str:
    env = episode(
        "x",
        tier=overrides.pop("tier", "semantic"),
        content={"key": key, "value": value},
        derived_from=sources,
        validity_interval={"valid_from": valid_from},
        **overrides,
    )
    result = fabric.propose("mf_agent_a", env, run)
    assert result["status"] == "validated", result
    return str(result["proposal_id"])


def supersede(fabric: Fabric, old: str, proposal: str, approval_id: str | None = None) -> Any:
    return fabric.call(
        "mf_committer",
        "SELECT fabric_api.supersede(%s, %s, %s)",
        old,
        proposal,
        approval_id,
    )


def test_contradicting_commit_fails_with_a_hint_and_no_values(
    fabric: Fabric, run: uuid.UUID, corroborated: str
) -> None:
    proposal = successor(fabric, run, "billing.entity", "Globex BV", [fabric.form(run)])
    with pytest.raises(psycopg.errors.ExclusionViolation) as caught:
        fabric.commit(proposal)
    diag = caught.value.diag
    assert "supersede" in (diag.message_hint or "")
    assert diag.message_detail is None and "Globex" not in str(caught.value)
    rejected = fabric.call("mf_committer", "SELECT fabric_api.commit_pending(10)")
    assert rejected == {"committed": 0, "rejected": 1, "retry": 0}


def test_supersession_closes_the_old_record_then_commits_the_successor(
    fabric: Fabric, run: uuid.UUID, corroborated: str
) -> None:
    proposal = successor(fabric, run, "billing.entity", "Globex BV", [fabric.form(run)])
    new = supersede(fabric, corroborated, proposal)
    assert new["supersedes"] == corroborated
    with fabric.su() as su:
        row = su.execute(
            "SELECT consolidation_state, valid_until FROM fabric.memory_records "
            "WHERE memory_id = %s",
            (corroborated,),
        ).fetchone()
    assert row is not None and row[0] == "superseded"
    assert row[1].isoformat().startswith("2026-09-01T00:00:00")
    assert (
        len(
            fabric.events(
                f"memory_id = '{corroborated}' AND event_type = 'memory.record.superseded'"
            )
        )
        == 1
    )
    assert fabric.count("memory_record_versions", f"memory_id = '{corroborated}'") == 1


@pytest.mark.parametrize(
    ("valid_from", "constraint"),
    [
        ("2026-07-02T09:14:00Z", "supersession_successor_starts_later"),
        ("2026-01-01T00:00:00Z", "supersession_successor_starts_later"),
        ("2099-01-01T00:00:00Z", "supersession_successor_not_in_future"),
    ],
)
def test_backdated_and_future_supersession_is_refused(
    fabric: Fabric, run: uuid.UUID, corroborated: str, valid_from: str, constraint: str
) -> None:
    proposal = successor(fabric, run, "billing.entity", "B", [fabric.form(run)], valid_from)
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        supersede(fabric, corroborated, proposal)
    assert caught.value.diag.constraint_name == constraint
    assert fabric.count("memory_records", "consolidation_state = 'superseded'") == 0


def test_supersession_stays_within_one_tier(
    fabric: Fabric, run: uuid.UUID, corroborated: str
) -> None:
    proposal = successor(fabric, run, "billing.entity", "B", [fabric.form(run)], tier="profile")
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        supersede(fabric, corroborated, proposal)
    assert caught.value.diag.constraint_name == "supersession_within_one_tier"


def test_procedural_versions_only_increase(fabric: Fabric, run: uuid.UUID) -> None:
    ep = fabric.form(run)
    old = fact(fabric, run, "skill.refund", "v1", [ep], tier="procedural", version="1.10.0")
    lower = successor(fabric, run, "skill.refund", "v2", [ep], tier="procedural", version="1.9.9")
    with pytest.raises(psycopg.errors.CheckViolation):
        supersede(fabric, old, lower)
    higher = successor(fabric, run, "skill.refund", "v2", [ep], tier="procedural", version="1.10.1")
    assert supersede(fabric, old, higher)["version"] == "1.10.1"


def test_extraction_cannot_supersede_a_declaration_without_approval(
    fabric: Fabric, run: uuid.UUID
) -> None:
    ep = fabric.form(run)
    declared = fact(
        fabric,
        run,
        "k",
        "said",
        [ep],
        provenance={"source_event_id": "e1", "formation_method": "declaration"},
    )
    proposal = successor(fabric, run, "k", "inferred", [ep])
    assert sqlstate(lambda: supersede(fabric, declared, proposal)) == MF005
    ok = approval(fabric, declared, "supersede", {"proposal_id": proposal})
    assert supersede(fabric, declared, proposal, ok)["supersedes"] == declared


def test_widening_visibility_needs_approval_narrowing_does_not(
    fabric: Fabric, run: uuid.UUID
) -> None:
    ep = fabric.form(run)
    narrow = fact(fabric, run, "k", "a", [ep])
    wide = successor(
        fabric, run, "k", "b", [ep], scope={"tenant_id": "acme", "visibility": "tenant"}
    )
    assert sqlstate(lambda: supersede(fabric, narrow, wide)) == MF005
    ok = approval(fabric, narrow, "supersede", {"proposal_id": wide})
    tenant_wide = supersede(fabric, narrow, wide, ok)["memory_id"]
    back = successor(fabric, run, "k", "c", [ep], "2026-10-01T00:00:00Z")
    assert supersede(fabric, tenant_wide, back)["scope"]["visibility"] == "subject"


@pytest.mark.clone
def test_two_concurrent_supersessions_exactly_one_wins(
    fabric: Fabric, run: uuid.UUID, corroborated: str
) -> None:
    first = successor(fabric, run, "billing.entity", "A", [fabric.form(run)])
    second = successor(fabric, run, "billing.entity", "B", [fabric.form(run)])
    holder = fabric.connect("mf_committer", autocommit=False)
    holder.execute("SELECT fabric_api.supersede(%s, %s)", (corroborated, first))
    rival_conn = fabric.session("mf_committer")  # the connection supersede() uses
    outcome: list[str] = []

    def rival() -> None:
        try:
            supersede(fabric, corroborated, second)
            outcome.append("won")
        except psycopg.Error as exc:
            outcome.append(exc.sqlstate or "?")

    thread = threading.Thread(target=rival)
    thread.start()
    wait_until_blocked(fabric, rival_conn)  # the rival is blocked on the row lock
    assert outcome == []
    holder.commit()
    thread.join(timeout=30)
    assert outcome == ["55000"]
    assert fabric.count("memory_records", f"supersedes = '{corroborated}'") == 1


# --- profile reconstruction ------------------------------------------------------------------


@pytest.mark.clone
def test_profile_at_reconstructs_past_profiles(fabric: Fabric, run: uuid.UUID) -> None:
    ep = fabric.form(run)
    old = fact(
        fabric,
        run,
        "tz",
        "Europe/Amsterdam",
        [ep],
        tier="profile",
        provenance={"source_event_id": "e", "formation_method": "declaration"},
        validity_interval={"valid_from": "2026-01-01T00:00:00Z"},
    )
    auditor = fabric.connect("mf_auditor")
    (known_before,) = auditor.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
    new = successor(
        fabric,
        run,
        "tz",
        "Asia/Tokyo",
        [ep],
        "2026-06-01T00:00:00Z",
        tier="profile",
        provenance={"source_event_id": "e2", "formation_method": "declaration"},
    )
    supersede(fabric, old, new)

    def profile(at: str, known: Any = "infinity") -> list[Any]:
        return [
            r[0]["value"]
            for r in auditor.execute(
                "SELECT content FROM fabric_audit.profile_at('acme', 'user-8842', %s, %s)",
                (at, known),
            ).fetchall()
        ]

    assert profile("2026-03-01T00:00:00Z") == ["Europe/Amsterdam"]
    assert profile("2026-07-01T00:00:00Z") == ["Asia/Tokyo"]
    assert profile("2026-07-01T00:00:00Z", known_before) == ["Europe/Amsterdam"]
    assert profile("2025-07-01T00:00:00Z") == []


# --- consolidation ----------------------------------------------------------------------------


@pytest.mark.clone  # runs of a tenant take turns: a session advisory lock
def test_consolidation_workflow_end_to_end_is_idempotent(fabric: Fabric, run: uuid.UUID) -> None:
    for i in range(3):
        fabric.form(run, content={"key": "invoice.currency", "value": "EUR", "n": i})
    fabric.form(run, content={"key": "invoice.currency", "value": "USD"})  # uncorroborated
    reader, committer = fabric.connect("mf_consolidator"), fabric.connect("mf_committer")
    first = run_consolidation(reader, committer, "acme", DeterministicConsolidator())
    assert (first.recommended, first.committed, first.rejected) == (1, 1, 0)
    with fabric.su() as su:
        row = su.execute(
            "SELECT tier, consolidation_state, formation_method, source_event_id, "
            "content FROM fabric.memory_records WHERE formation_method = "
            "'consolidation'"
        ).fetchone()
    assert row == (
        "semantic",
        "consolidated",
        "consolidation",
        first.workflow_event_id,
        {"key": "invoice.currency", "value": "EUR"},
    )
    assert len(fabric.events("event_type = 'memory.record.consolidated'")) == 1
    second = run_consolidation(reader, committer, "acme", DeterministicConsolidator())
    assert (second.recommended, second.committed) == (0, 0)
    assert fabric.count("memory_records", "formation_method = 'consolidation'") == 1
    read = fabric.events("event_type = 'memory.consolidation.candidates_read'")
    assert len(read) == 2 and "EUR" not in str(read)


@pytest.mark.clone  # runs of a tenant take turns: a session advisory lock
def test_consolidation_budget_defers_never_skips_validation(fabric: Fabric, run: uuid.UUID) -> None:
    for key in ("a", "b", "c"):
        for _ in range(2):
            fabric.form(run, content={"key": key, "value": 1})
    reader, committer = fabric.connect("mf_consolidator"), fabric.connect("mf_committer")
    summary = run_consolidation(reader, committer, "acme", budget=1)
    assert (summary.committed, summary.deferred) == (1, 2)
    summary = run_consolidation(reader, committer, "acme", budget=5)
    assert (summary.committed, summary.deferred) == (2, 0)


def test_recommendations_commit_nothing_and_are_validated_at_commit(
    fabric: Fabric, run: uuid.UUID
) -> None:
    a = fabric.form(run)
    other_session = fabric.open_run(session="sess-other")
    b = fabric.form(other_session, scope={"tenant_id": "acme", "visibility": "session"})
    reader = fabric.connect("mf_consolidator")
    wf = fabric.call("mf_consolidator", "SELECT fabric_api.start_workflow_run('acme')")
    before = fabric.count("memory_records")

    def recommend(kind: str, sources: list[str]) -> str:
        return str(
            reader.execute(
                "SELECT fabric_api.recommend(%s)",
                (
                    Jsonb(
                        {
                            "tenant_id": "acme",
                            "kind": kind,
                            "workflow_event_id": str(wf),
                            "sources": sources,
                            "proposal": {"content": {"key": "k", "value": 1}, "confidence": 0.9},
                        }
                    ),
                ),
            ).fetchone()[0][  # type: ignore[index]
                "recommendation_id"
            ]
        )

    spanning = recommend("consolidation", [a, b])
    thin = recommend("consolidation", [a])
    assert fabric.count("memory_records") == before
    for rid, reason in ((spanning, "scopes"), (thin, "at least 2")):
        result = fabric.call("mf_committer", "SELECT fabric_api.commit_recommendation(%s)", rid)
        assert result["status"] == "rejected" and reason in result["reason"]
    reflected = recommend("reflection", [a])
    result = fabric.call("mf_committer", "SELECT fabric_api.commit_recommendation(%s)", reflected)
    assert result["record"]["consolidation_state"] == "reflected"
    assert len(fabric.events("event_type = 'memory.reflection.completed'")) == 1
    assert (
        sqlstate(lambda: fabric.call("mf_agent_a", "SELECT fabric_api.recommend('{}')")) == "42501"
    )


def test_distillation_forms_a_procedural_skill(fabric: Fabric, run: uuid.UUID) -> None:
    sources = [fabric.form(run, f"trajectory {i}") for i in range(3)]
    wf = fabric.call("mf_consolidator", "SELECT fabric_api.start_workflow_run('acme')")
    rec = fabric.call(
        "mf_consolidator",
        "SELECT fabric_api.recommend(%s)",
        Jsonb(
            {
                "tenant_id": "acme",
                "kind": "distillation",
                "workflow_event_id": str(wf),
                "sources": sources,
                "proposal": {"content": {"key": "skill.x", "steps": ["a"]}, "confidence": 0.9},
            }
        ),
    )
    result = fabric.call(
        "mf_committer",
        "SELECT fabric_api.commit_recommendation(%s)",
        rec["recommendation_id"],
    )
    assert result["record"]["tier"] == "procedural"
    assert len(fabric.events("event_type = 'memory.skill.distilled'")) == 1
