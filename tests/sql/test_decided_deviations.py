"""The decided deviations of docs/concepts.md ("Decided deviations"), each held by the
database: a demotion only into a tier the record held before (a refusal writes nothing);
`valid_at` chooses among live records, so an expired record stays out of recall even for an
instant inside its validity interval while the auditor still sees it; no promotion names
another tenant."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from conftest import Fabric, episode
from memfabric.worker import run_decay_once

pytestmark = pytest.mark.rollback


def corroborated_semantic(fabric: Fabric) -> str:
    run = fabric.open_run()
    a, b = fabric.form(run, "ep a"), fabric.form(run, "ep b")
    return fabric.form(
        run, "s", tier="semantic", content={"key": "k", "value": "v"}, derived_from=[a, b]
    )


def promoted_to_profile(fabric: Fabric) -> str:
    s = corroborated_semantic(fabric)
    fabric.call("mf_committer", "SELECT fabric_api.promote(%s, 'profile', NULL, NULL)", s)
    return s


def test_a_demotion_into_a_tier_the_record_never_held_is_refused_and_writes_nothing(
    fabric: Fabric,
) -> None:
    memory_id = promoted_to_profile(fabric)
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as caught:
        fabric.call("mf_committer", "SELECT fabric_api.demote(%s, 'procedural')", memory_id)
    assert caught.value.sqlstate == "MF002"
    assert "held before" in (caught.value.diag.message_primary or "")
    assert fabric.counts() == before
    assert fabric.record(memory_id)["tier"] == "profile"


def test_a_demotion_back_to_a_tier_held_before_needs_no_approval_and_is_logged(
    fabric: Fabric,
) -> None:
    memory_id = promoted_to_profile(fabric)
    fabric.call("mf_committer", "SELECT fabric_api.demote(%s, 'semantic')", memory_id)
    assert fabric.record(memory_id)["tier"] == "semantic"
    demoted = fabric.events(f"event_type = 'memory.record.demoted' AND memory_id = '{memory_id}'")
    assert len(demoted) == 1


def recalled(fabric: Fabric, run: Any, valid_at: str) -> list[str]:
    answer = fabric.recall(
        "mf_agent_a",
        {"run_id": str(run), "tiers": ["episodic"], "filters": {"valid_at": valid_at}},
    )
    return [r["memory_id"] for r in answer["records"]]


def test_an_expired_record_is_not_recalled_inside_its_validity_but_the_auditor_sees_it(
    fabric: Fabric,
) -> None:
    run = fabric.open_run()
    window = {"valid_from": "2026-01-01T00:00:00Z", "valid_until": "2026-02-01T00:00:00Z"}
    memory_id = str(
        fabric.commit(
            fabric.propose("mf_agent_a", episode("ended fact", validity_interval=window), run)[
                "proposal_id"
            ]
        )["memory_id"]
    )
    inside = "2026-01-15T00:00:00Z"
    assert recalled(fabric, run, inside) == [memory_id]  # live: served at an inside instant
    run_decay_once(fabric.connect("mf_committer"), "2026-03-01T00:00:00Z")  # type: ignore[arg-type]
    assert fabric.record(memory_id)["consolidation_state"] == "expired"
    assert recalled(fabric, run, inside) == []  # expired: not live, not recalled
    with fabric.acting("mf_auditor") as auditor:
        rows = auditor.execute(
            "SELECT memory_id::text, consolidation_state "
            "FROM fabric_audit.records_as_of('acme', %s)",
            (inside,),
        ).fetchall()
    assert (memory_id, "expired") in rows


def test_no_promotion_or_demotion_names_another_tenant(fabric: Fabric) -> None:
    """There is no cross-tenant path: the tier-changing functions take no tenant, and a
    promotion that would supersede another tenant's record is refused (P0002)."""
    names = (
        fabric.su()
        .execute(
            "SELECT p.proname, p.proargnames FROM pg_proc p "
            "WHERE p.pronamespace = 'fabric_api'::regnamespace "
            "AND p.proname IN ('promote', 'demote')"
        )
        .fetchall()
    )
    assert {n for n, _ in names} == {"promote", "demote"}
    assert not [a for _, args in names for a in args or [] if "tenant" in a]
    memory_id = corroborated_semantic(fabric)
    run_g = fabric.open_run("glx-agt-001", tenant="globex")
    foreign = fabric.form(run_g, "globex ep", login="mf_agent_g", scope={
        "tenant_id": "globex", "visibility": "subject"})  # fmt: skip
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as caught:
        fabric.call(
            "mf_committer",
            "SELECT fabric_api.promote(%s, 'profile', NULL, %s)",
            memory_id,
            foreign,
        )
    assert caught.value.sqlstate in {"P0002", "42501"}
    assert fabric.counts() == before
