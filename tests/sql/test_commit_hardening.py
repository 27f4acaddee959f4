"""The commit pipeline under attack: an erased subject never stalls a drain, every API that
returns a record returns what a fresh read returns, tenant enablement binds committers, and
review flags are resolved once by the consolidator."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, Fabric, episode
from memfabric import db as mfdb
from memfabric.errors import FabricError
from memfabric.worker import erase, run_committer, run_decay_once

pytestmark = pytest.mark.rollback

ROOT = Path(__file__).resolve().parents[2]


def sqlstate(fn: Any) -> str | None:
    with pytest.raises((psycopg.Error, FabricError)) as caught:
        fn()
    return caught.value.sqlstate


def fresh(fabric: Fabric, memory_id: str) -> dict[str, Any]:
    """The record as a fresh read (the envelope recall serves) returns it."""
    with fabric.su() as su:
        row = su.execute(
            "SELECT fabric._record_json(m) FROM fabric.memory_records m WHERE memory_id = %s",
            (memory_id,),
        ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def status(fabric: Fabric, proposal_id: str) -> tuple[Any, ...]:
    with fabric.su() as su:
        row = su.execute(
            "SELECT status, reason, content IS NULL FROM fabric.proposals WHERE proposal_id = %s",
            (proposal_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def erase_subject(fabric: Fabric, tenant: str, subject: str) -> dict[str, Any]:
    a = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure(%s, %s, 'art. 17')",
        tenant,
        subject,
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", a)
    return erase(fabric.connect("mf_committer"), str(a))


def glx(text: str, **kw: Any) -> dict[str, Any]:
    return episode(text, scope={"tenant_id": "globex", "visibility": "subject"}, **kw)


# --- 1. an erased subject never stalls the commit pipeline ----------------------------------


def test_subject_erasure_withdraws_uncommitted_proposals_and_the_drain_goes_on(
    fabric: Fabric,
) -> None:
    other = fabric.open_run()  # tenant acme
    waiting = fabric.proposed(other, "acme's proposal")
    erased_run = fabric.open_run("glx-agt-001", "globex", subject="user-s")
    doomed = fabric.propose("mf_agent_g", glx("about user-s"), erased_run)["proposal_id"]
    assert status(fabric, doomed) == ("validated", None, False)
    result = erase_subject(fabric, "globex", "user-s")
    assert result["proposals_withdrawn"] == 1
    assert status(fabric, doomed) == ("withdrawn", None, True)
    (event,) = fabric.events(
        f"proposal_id = '{doomed}' AND event_type = 'memory.proposal.withdrawn'"
    )
    assert (
        event["tenant_id"] == "globex" and event["payload"]["approval_id"] == result["approval_id"]
    )
    drained = fabric.call("mf_committer", "SELECT fabric_api.commit_pending(100)")
    assert drained == {"committed": 1, "rejected": 0, "retry": 0}
    assert status(fabric, waiting)[0] == "committed"
    assert sqlstate(lambda: fabric.commit(doomed)) == "55000"


@pytest.mark.clone
def test_the_commit_worker_survives_an_erased_subject(fabric: Fabric) -> None:
    waiting = fabric.proposed(fabric.open_run(), "acme's proposal")
    erased_run = fabric.open_run("glx-agt-001", "globex", subject="user-s")
    fabric.propose("mf_agent_g", glx("about user-s"), erased_run)
    erase_subject(fabric, "globex", "user-s")
    env = {
        **os.environ,
        "DATABASE_URL": fabric.url,
        "MEMFABRIC_COMMITTER_URL": mfdb.url_for(fabric.url, "mf_committer"),
    }
    worked = subprocess.run(
        [sys.executable, "-m", "memfabric.cli", "worker", "commit", "--once"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert worked.returncode == 0, worked.stderr
    assert "1 committed" in worked.stdout
    assert status(fabric, waiting)[0] == "committed"


def test_a_proposal_that_breaks_a_rule_at_commit_is_rejected_alone(fabric: Fabric) -> None:
    good = fabric.proposed(fabric.open_run(), "fine")
    run_g = fabric.open_run("glx-agt-001", "globex")
    bad = fabric.propose("mf_agent_g", glx("scrubbed underneath"), run_g)["proposal_id"]
    with fabric.su() as su:  # the state an erasure left before withdrawal existed
        su.execute("UPDATE fabric.proposals SET content = NULL WHERE proposal_id = %s", (bad,))
    assert sqlstate(lambda: fabric.commit(bad)) == "23502"
    drained = fabric.call("mf_committer", "SELECT fabric_api.commit_pending(100)")
    assert drained == {"committed": 1, "rejected": 1, "retry": 0}
    assert status(fabric, good)[0] == "committed"
    assert status(fabric, bad)[:2] == ("rejected", "refused at commit (23502)")
    (event,) = fabric.events(f"proposal_id = '{bad}' AND event_type = 'memory.proposal.rejected'")
    assert event["payload"]["sqlstate"] == "23502" and event["actor_agent_id"] == "os-agt-010"


@pytest.mark.clone
def test_a_transient_failure_leaves_the_proposal_validated_for_the_next_drain(
    fabric: Fabric,
) -> None:
    good = fabric.proposed(fabric.open_run(), "fine")
    run_g = fabric.open_run("glx-agt-001", "globex")
    later = fabric.propose("mf_agent_g", glx("waits for a lock"), run_g)["proposal_id"]
    holder = fabric.connect(None, autocommit=False)
    holder.execute("SELECT 1 FROM fabric.tenants WHERE tenant_id = 'globex' FOR UPDATE")
    committer = fabric.connect("mf_committer")
    committer.execute("SET lock_timeout = '200ms'")
    drained = committer.execute("SELECT fabric_api.commit_pending(100)").fetchone()
    assert drained is not None and drained[0] == {"committed": 1, "rejected": 0, "retry": 1}
    assert status(fabric, good)[0] == "committed"
    assert status(fabric, later) == ("validated", None, False)
    holder.rollback()
    again = committer.execute("SELECT fabric_api.commit_pending(100)").fetchone()
    assert again is not None and again[0] == {"committed": 1, "rejected": 0, "retry": 0}


@pytest.mark.clone
def test_a_timed_out_drain_stops_and_keeps_what_it_committed(fabric: Fabric) -> None:
    good = fabric.proposed(fabric.open_run(), "fine")
    run_g = fabric.open_run("glx-agt-001", "globex")
    later = fabric.propose("mf_agent_g", glx("waits for a lock"), run_g)["proposal_id"]
    holder = fabric.connect(None, autocommit=False)
    holder.execute("SELECT 1 FROM fabric.tenants WHERE tenant_id = 'globex' FOR UPDATE")
    committer = fabric.connect("mf_committer")
    committer.execute("SET statement_timeout = '1s'")
    drained = committer.execute("SELECT fabric_api.commit_pending(100)").fetchone()
    holder.rollback()
    assert drained is not None and drained[0] == {"committed": 1, "rejected": 0, "retry": 1}
    assert status(fabric, good)[0] == "committed"
    assert status(fabric, later) == ("validated", None, False)


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("22023", "rejected"),
        ("22P02", "rejected"),
        ("23502", "rejected"),
        ("23P01", "rejected"),
        ("MF001", "rejected"),
        ("MF005", "rejected"),
        ("P0001", "rejected"),
        ("40001", "retry"),
        ("40P01", "retry"),
        ("55P03", "retry"),
        ("57014", "retry"),
        ("53100", "retry"),
        ("53200", "retry"),
        ("42501", None),
        ("55000", None),
        ("P0002", None),
        ("XX000", None),
    ],
)
def test_a_commit_failure_is_rejected_retried_or_a_fault_by_its_sqlstate(
    fabric: Fabric, state: str, kind: str | None
) -> None:
    row = fabric.session().execute("SELECT fabric._commit_failure_kind(%s)", (state,)).fetchone()
    assert row == (kind,)


@pytest.mark.clone
def test_the_commit_worker_reports_a_refused_drain_and_keeps_running(fabric: Fabric) -> None:
    waiting = fabric.proposed(fabric.open_run(), "acme's proposal")
    su = fabric.su()
    su.execute(
        "REVOKE EXECUTE ON FUNCTION fabric_api.commit_pending(integer) FROM fabric_committer"
    )
    lines: list[str] = []
    stop = threading.Event()
    worker = threading.Thread(
        target=run_committer,
        args=(mfdb.url_for(fabric.url, "mf_committer"),),
        kwargs={"poll_seconds": 0.05, "progress": lines.append, "should_stop": stop.is_set},
    )
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while not any("42501" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any("drain refused" in line and "42501" in line for line in lines), lines
        assert worker.is_alive()
        su.execute(
            "GRANT EXECUTE ON FUNCTION fabric_api.commit_pending(integer) TO fabric_committer"
        )
        while status(fabric, waiting)[0] != "committed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(fabric, waiting)[0] == "committed"
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()


# --- 2. every API that returns a record returns what a fresh read returns -------------------


@pytest.fixture
def run(fabric: Fabric) -> uuid.UUID:
    return fabric.open_run()


def semantic(fabric: Fabric, run: uuid.UUID, key: str, sources: list[str], **kw: Any) -> str:
    return fabric.proposed(
        run,
        "s",
        tier="semantic",
        content={"key": key, "value": "v"},
        derived_from=sources,
        **kw,
    )


def test_commit_returns_the_record_with_its_lineage(fabric: Fabric, run: uuid.UUID) -> None:
    a, b = fabric.form(run, "a"), fabric.form(run, "b")
    record = fabric.commit(semantic(fabric, run, "billing.entity", [a, b]))
    assert sorted(record["derived_from"]) == sorted([a, b])
    assert record == fresh(fabric, record["memory_id"])


def test_supersede_returns_what_a_fresh_read_returns(fabric: Fabric, run: uuid.UUID) -> None:
    a = fabric.form(run, "a")
    old = fabric.commit(semantic(fabric, run, "billing.entity", [a]))
    newer = semantic(
        fabric, run, "billing.entity", [a], validity_interval={"valid_from": "2026-09-01T00:00:00Z"}
    )
    record = fabric.call(
        "mf_committer", "SELECT fabric_api.supersede(%s, %s)", old["memory_id"], newer
    )
    assert record["derived_from"] == [a] and record["supersedes"] == old["memory_id"]
    assert record == fresh(fabric, record["memory_id"])


def test_promote_and_demote_return_what_a_fresh_read_returns(
    fabric: Fabric, run: uuid.UUID
) -> None:
    a, b = fabric.form(run, "a"), fabric.form(run, "b")
    memory_id = str(fabric.commit(semantic(fabric, run, "pref.lang", [a, b]))["memory_id"])
    promoted = fabric.call("mf_committer", "SELECT fabric_api.promote(%s, 'profile')", memory_id)
    assert promoted["tier"] == "profile" and len(promoted["derived_from"]) == 2
    assert promoted == fresh(fabric, memory_id)
    demoted = fabric.call("mf_committer", "SELECT fabric_api.demote(%s, 'semantic')", memory_id)
    assert demoted["tier"] == "semantic"
    assert demoted == fresh(fabric, memory_id)


def recommend(
    fabric: Fabric, tenant: str, kind: str, sources: list[str], proposal: dict[str, Any]
) -> str:
    wf = fabric.call("mf_consolidator", "SELECT fabric_api.start_workflow_run(%s)", tenant)
    return str(
        fabric.call(
            "mf_consolidator",
            "SELECT fabric_api.recommend(%s)",
            Jsonb(
                {
                    "tenant_id": tenant,
                    "kind": kind,
                    "workflow_event_id": str(wf),
                    "sources": sources,
                    "proposal": proposal,
                }
            ),
        )["recommendation_id"]
    )


def test_commit_recommendation_returns_what_a_fresh_read_returns(
    fabric: Fabric, run: uuid.UUID
) -> None:
    a, b = fabric.form(run, "a"), fabric.form(run, "b")
    rec = recommend(
        fabric,
        "acme",
        "consolidation",
        [a, b],
        {"content": {"key": "k", "value": 1}, "confidence": 0.9},
    )
    result = fabric.call("mf_committer", "SELECT fabric_api.commit_recommendation(%s)", rec)
    assert sorted(result["record"]["derived_from"]) == sorted([a, b])
    assert result["record"] == fresh(fabric, result["record"]["memory_id"])
    memory_id = str(fabric.commit(semantic(fabric, run, "pref.tz", [a, b]))["memory_id"])
    promotion = recommend(fabric, "acme", "promotion", [memory_id], {"target_tier": "profile"})
    promoted = fabric.call("mf_committer", "SELECT fabric_api.commit_recommendation(%s)", promotion)
    assert promoted["tier"] == "profile" and promoted == fresh(fabric, memory_id)


# --- 5. tenant enablement binds committers --------------------------------------------------


def world(fabric: Fabric) -> dict[str, Any]:
    """A digest of everything a committer action could write."""
    with fabric.su() as su:
        return {
            t: su.execute(
                f"SELECT count(*), md5(coalesce(string_agg(to_jsonb(x)::text, '' "  # noqa: S608
                f"ORDER BY to_jsonb(x)::text), '')) FROM fabric.{t} x"
            ).fetchone()
            for t in (
                "proposals",
                "memory_records",
                "memory_lineage",
                "approvals",
                "recommendations",
                "events",
                "review_flags",
                "erasure_receipts",
                "temporal_summaries",
                "runs",
            )
        }


@pytest.fixture
def initech(fabric: Fabric) -> uuid.UUID:
    """Tenant initech, where os-agt-010 (mf_committer) is not enabled and os-agt-010b
    (mf_committer2) is, with no tools; returns a run of com-agt-003 there."""
    admin = fabric.connect("mf_admin")
    admin.execute("SELECT fabric_api.create_tenant('initech')")
    admin.execute("SELECT fabric_api.enable_agent('initech', 'com-agt-003', %s)", (MEMORY_TOOLS,))
    admin.execute("SELECT fabric_api.enable_agent('initech', 'os-agt-010b', '{}')")
    return fabric.open_run(tenant="initech")


def ini(text: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("scope", {"tenant_id": "initech", "visibility": "subject"})
    return episode(text, **kw)


def ini_form(fabric: Fabric, run: uuid.UUID, text: str, **kw: Any) -> str:
    proposal = fabric.propose("mf_agent_a", ini(text, **kw), run)["proposal_id"]
    return str(fabric.commit(proposal, "mf_committer2")["memory_id"])


def refused(fabric: Fabric, sql: str, *args: Any) -> None:
    """mf_committer is refused with 42501 and a hint, and nothing is written."""
    before = world(fabric)
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
        fabric.call("mf_committer", sql, *args)
    assert "enable" in (caught.value.diag.message_hint or "")
    assert world(fabric) == before


def test_commit_in_a_tenant_the_committer_is_not_enabled_in_is_refused(
    fabric: Fabric, initech: uuid.UUID
) -> None:
    proposal = fabric.propose("mf_agent_a", ini("x"), initech)["proposal_id"]
    refused(fabric, "SELECT fabric_api.commit(%s)", proposal)
    assert fabric.commit(proposal, "mf_committer2")["scope"]["tenant_id"] == "initech"


def test_commit_pending_skips_tenants_the_committer_is_not_enabled_in(
    fabric: Fabric, initech: uuid.UUID
) -> None:
    foreign = fabric.propose("mf_agent_a", ini("x"), initech)["proposal_id"]
    own = fabric.proposed(fabric.open_run(), "acme")
    drained = fabric.call("mf_committer", "SELECT fabric_api.commit_pending(100)")
    assert drained == {"committed": 1, "rejected": 0, "retry": 0}
    assert status(fabric, own)[0] == "committed"
    assert status(fabric, foreign)[0] == "validated"
    drained = fabric.call("mf_committer2", "SELECT fabric_api.commit_pending(100)")
    assert drained["committed"] == 1 and status(fabric, foreign)[0] == "committed"


def test_record_actions_in_a_foreign_tenant_are_refused(fabric: Fabric, initech: uuid.UUID) -> None:
    a, b = ini_form(fabric, initech, "a"), ini_form(fabric, initech, "b")
    fact = ini_form(
        fabric, initech, "f", tier="semantic", content={"key": "k", "value": 1}, derived_from=[a, b]
    )
    newer = fabric.propose(
        "mf_agent_a",
        ini(
            "n",
            tier="semantic",
            content={"key": "k", "value": 2},
            derived_from=[a],
            validity_interval={"valid_from": "2026-09-01T00:00:00Z"},
        ),
        initech,
    )["proposal_id"]
    refused(fabric, "SELECT fabric_api.promote(%s, 'profile')", fact)
    refused(fabric, "SELECT fabric_api.supersede(%s, %s)", fact, newer)
    refused(
        fabric,
        "SELECT fabric_api.request_approval(%s, 'promote', '{\"tier\": \"relational\"}', 'x')",
        fact,
    )
    refused(fabric, "SELECT fabric_api.request_erasure(%s, 'gdpr')", a)
    refused(fabric, "SELECT fabric_api.request_subject_erasure('initech', 'user-8842', 'gdpr')")
    fabric.call("mf_committer2", "SELECT fabric_api.promote(%s, 'profile')", fact)
    refused(fabric, "SELECT fabric_api.demote(%s, 'semantic')", fact)
    approval = fabric.call("mf_committer2", "SELECT fabric_api.request_erasure(%s, 'gdpr')", a)[
        "approval_id"
    ]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    refused(fabric, "SELECT fabric_api.erase(%s)", approval)
    rec = recommend(
        fabric,
        "initech",
        "consolidation",
        [a, b],
        {"content": {"key": "c", "value": 1}, "confidence": 0.9},
    )
    refused(fabric, "SELECT fabric_api.commit_recommendation(%s)", rec)
    # the committer enabled with no tools does what the other was refused
    assert (
        fabric.call("mf_committer2", "SELECT fabric_api.commit_recommendation(%s)", rec)["status"]
        == "committed"
    )
    assert fabric.call("mf_committer2", "SELECT fabric_api.erase(%s)", approval)["erased"] == [a]


def test_decay_skips_tenants_the_committer_is_not_enabled_in(
    fabric: Fabric, initech: uuid.UUID
) -> None:
    short = {"valid_from": "2026-07-02T09:14:00Z", "valid_until": "2026-07-03T09:14:00Z"}
    memory_id = ini_form(fabric, initech, "short-lived", validity_interval=short)
    before = world(fabric)
    run_decay_once(fabric.connect("mf_committer"))
    assert world(fabric)["memory_records"] == before["memory_records"]
    run_decay_once(fabric.connect("mf_committer2"))
    assert fresh(fabric, memory_id)["consolidation_state"] == "expired"


# --- 14. review flags are resolved once, by the consolidator --------------------------------


@pytest.fixture
def flag(fabric: Fabric, run: uuid.UUID) -> dict[str, Any]:
    """An open review flag: a semantic record derived from an erased episode."""
    source = fabric.form(run, "source")
    fabric.form(run, "derived", tier="semantic", content={"assertion": "d"}, derived_from=[source])
    a = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", source)[
        "approval_id"
    ]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", a)
    erase(fabric.connect("mf_committer"), str(a))
    (queued,) = fabric.call("mf_consolidator", "SELECT fabric_api.review_queue('acme')")
    return queued  # type: ignore[no-any-return]


def resolve(fabric: Fabric, flag_id: str, decision: str, login: str = "mf_consolidator") -> Any:
    return fabric.call(
        login,
        "SELECT fabric_api.resolve_review_flag(%s, %s, 'checked by hand')",
        flag_id,
        decision,
    )


def test_keeping_a_flagged_record_resolves_the_flag_once_with_an_event(
    fabric: Fabric, flag: dict[str, Any]
) -> None:
    result = resolve(fabric, flag["flag_id"], "keep")
    assert result == {
        "flag_id": flag["flag_id"],
        "memory_id": flag["memory_id"],
        "decision": "keep",
        "approval_id": None,
    }
    assert fabric.call("mf_consolidator", "SELECT fabric_api.review_queue('acme')") == []
    (event,) = fabric.events("event_type = 'memory.review_flag.resolved'")
    assert event["actor_agent_id"] == "os-agt-011" and event["memory_id"] == flag["memory_id"]
    assert event["payload"]["decision"] == "keep"
    assert fresh(fabric, flag["memory_id"])["consolidation_state"] == "raw"
    before = world(fabric)
    assert sqlstate(lambda: resolve(fabric, flag["flag_id"], "request_erasure")) == "55000"
    assert world(fabric) == before


def test_requesting_erasure_of_a_flagged_record_files_an_erase_approval(
    fabric: Fabric, flag: dict[str, Any]
) -> None:
    result = resolve(fabric, flag["flag_id"], "request_erasure")
    assert fabric.call("mf_consolidator", "SELECT fabric_api.review_queue('acme')") == []
    with fabric.su() as su:
        row = su.execute(
            "SELECT action, memory_id::text, status, requested_by FROM fabric.approvals "
            "WHERE approval_id = %s",
            (result["approval_id"],),
        ).fetchone()
    assert row == ("erase", flag["memory_id"], "pending", "os-agt-011")
    fabric.call(
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')",
        result["approval_id"],
    )
    erase(fabric.connect("mf_committer"), result["approval_id"])
    assert fresh(fabric, flag["memory_id"])["consolidation_state"] == "tombstoned"


@pytest.mark.parametrize(
    ("login", "decision", "expected"),
    [
        ("mf_committer", "keep", "42501"),
        ("mf_agent_a", "keep", "42501"),
        ("mf_consolidator", "maybe", "22023"),
        ("mf_consolidator", None, "22023"),
    ],
)
def test_resolving_a_review_flag_is_refused_without_writing(
    fabric: Fabric, flag: dict[str, Any], login: str, decision: str | None, expected: str
) -> None:
    before = world(fabric)
    assert sqlstate(lambda: resolve(fabric, flag["flag_id"], decision, login)) == expected  # type: ignore[arg-type]
    assert world(fabric) == before
    assert [
        q["flag_id"]
        for q in fabric.call("mf_consolidator", "SELECT fabric_api.review_queue('acme')")
    ] == [flag["flag_id"]]


def test_an_unknown_review_flag_is_not_found(fabric: Fabric) -> None:
    assert sqlstate(lambda: resolve(fabric, str(uuid.uuid4()), "keep")) == "P0002"


FLAG_REFUSALS = [
    (
        "contradiction", "maybe", "x", "22023", "decision must be keep or supersede",
        "keep the standing record, or supersede once it has been superseded by who may"
        " retire it",
    ),
    (
        "contradiction", "keep", " ", "22023", "a resolution needs a reason of 1-1000 characters",
        "say why the standing record is kept or was superseded",
    ),
    (
        "contradiction", "keep", "x", "P0002", "unknown contradiction flag",
        "flag ids come from fabric_api.contradiction_queue",
    ),
    (
        "review", None, "x", "22023", "decision must be keep or request_erasure",
        "keep the derived record, or request_erasure to file an erasure approval for it",
    ),
    (
        "review", "keep", "x" * 1001, "22023", "a resolution needs a reason of 1-1000 characters",
        "say why the derived record is kept or should be erased",
    ),
    (
        "review", "keep", "x", "P0002", "unknown review flag",
        "flag ids come from fabric_api.review_queue",
    ),
]  # fmt: skip


RESOLVERS = {
    "contradiction": "SELECT fabric_api.resolve_contradiction_flag(%s, %s, %s)",
    "review": "SELECT fabric_api.resolve_review_flag(%s, %s, %s)",
}


def flag_refusal(
    fabric: Fabric, kind: str, flag_id: str, decision: str | None, reason: str
) -> tuple[str, str, str]:
    """The SQLSTATE, message and hint of a refused resolution, which wrote nothing."""
    before = world(fabric)
    with pytest.raises(psycopg.Error) as caught:
        fabric.connect("mf_consolidator").execute(RESOLVERS[kind], (flag_id, decision, reason))
    assert world(fabric) == before
    diag = caught.value.diag
    return (str(caught.value.sqlstate), str(diag.message_primary), str(diag.message_hint))


@pytest.mark.parametrize(("kind", "decision", "reason", "state", "message", "hint"), FLAG_REFUSALS)
def test_each_flag_resolver_names_the_rule_its_refusal_breaks(
    fabric: Fabric,
    kind: str,
    decision: str | None,
    reason: str,
    state: str,
    message: str,
    hint: str,
) -> None:
    """Both resolvers share one prologue (decision, reason, a known flag), each with its
    own words: the refusal's message and hint say which flag and what to do."""
    refusal = flag_refusal(fabric, kind, str(uuid.uuid4()), decision, reason)
    assert refusal == (state, message, hint)


def test_a_resolved_review_flag_says_a_resolution_is_final(
    fabric: Fabric, flag: dict[str, Any]
) -> None:
    resolve(fabric, flag["flag_id"], "keep")
    assert flag_refusal(fabric, "review", flag["flag_id"], "keep", "again") == (
        "55000",
        "the review flag is already resolved",
        "a resolution is final; fabric_api.review_queue lists the open flags",
    )
