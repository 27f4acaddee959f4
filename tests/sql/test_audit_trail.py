"""The audit trail: subjects are named only by keyed pseudonyms that subject erasure
unlinks for good (crypto-shredding)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric, episode
from memfabric import db as mfdb
from memfabric.errors import FabricError
from memfabric.worker import erase

pytestmark = pytest.mark.rollback

ROOT = Path(__file__).resolve().parents[2]
PG_DUMP = ROOT / ".local" / "pg17" / "bin" / "pg_dump"
RECALLS = "event_type LIKE 'memory.recall.%'"


def sqlstate(fn: Any) -> str | None:
    with pytest.raises((psycopg.Error, FabricError)) as caught:
        fn()
    return caught.value.sqlstate


def dump(fabric: Fabric) -> str:
    return subprocess.run(
        [str(PG_DUMP), "--data-only", "-d", fabric.url], check=True, capture_output=True, text=True
    ).stdout


def subject_erasure(fabric: Fabric, subject: str) -> dict[str, Any]:
    approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', %s, 'art. 17')",
        subject,
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    return erase(fabric.connect("mf_committer"), str(approval))


def subject_events(fabric: Fabric, subject: str) -> list[tuple[Any, ...]]:
    return (
        fabric.session("mf_auditor")
        .execute(
            "SELECT event_type, run_id FROM fabric_audit.subject_events('acme', %s,"
            " now() - interval '1 hour', now() + interval '1 hour')",
            (subject,),
        )
        .fetchall()
    )


@pytest.fixture
def canary() -> str:
    return f"canary-{uuid.uuid4().hex}"


def test_recall_events_name_subject_and_session_only_by_pseudonyms(
    fabric: Fabric, canary: str
) -> None:
    session = f"{canary}-session"
    run = fabric.open_run(subject=canary, session=session)
    fabric.form(run, "remember")
    fabric.recall(
        "mf_agent_a",
        {"run_id": str(run), "tiers": ["episodic"], "scope": {"subject_id": canary}},
    )
    (event,) = fabric.events(RECALLS)
    scope = event["payload"]["scope"]
    assert canary not in str(event)
    assert set(scope) >= {"subject_ref", "session_ref"} and "subject_id" not in scope
    assert scope["subject_ref"].startswith("hmac:") and scope["session_ref"].startswith("hmac:")
    assert event["payload"]["request_hash"].startswith("hmac:")


def test_two_subjects_get_distinct_pseudonyms_and_one_subject_keeps_its_own(
    fabric: Fabric,
) -> None:
    refs = []
    for subject in ("user-a", "user-b", "user-a"):
        run = fabric.open_run(subject=subject)
        fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
        refs.append(fabric.events(f"{RECALLS} AND run_id = '{run}'")[0]["payload"]["scope"])
    assert refs[0]["subject_ref"] == refs[2]["subject_ref"] != refs[1]["subject_ref"]


def test_subject_keys_are_read_by_no_login(fabric: Fabric) -> None:
    fabric.recall("mf_agent_a", {"run_id": str(fabric.open_run()), "tiers": ["episodic"]})
    for login in ("mf_agent_a", "mf_committer", "mf_auditor", "mf_admin", "mf_projector"):
        assert (
            sqlstate(lambda lg=login: fabric.connect(lg).execute("TABLE fabric.subject_keys"))
            == "42501"
        )
    assert fabric.count("subject_keys") == 1


@pytest.mark.clone  # its SQL reads now() (one value in a transaction)
def test_auditor_finds_a_living_subjects_events_and_nobody_else_can(fabric: Fabric) -> None:
    run = fabric.open_run(subject="user-8842")
    other = fabric.open_run(subject="user-other")
    for r in (run, other):
        fabric.recall("mf_agent_a", {"run_id": str(r), "tiers": ["episodic"]})
    found = subject_events(fabric, "user-8842")
    assert ("memory.recall.served", run) in found
    assert all(r == run for _, r in found)
    assert subject_events(fabric, "nobody") == []
    for login in ("mf_agent_a", "mf_committer", "mf_admin"):
        assert (
            sqlstate(
                lambda lg=login: fabric.connect(lg).execute(
                    "SELECT * FROM fabric_audit.subject_events('acme', 'user-8842', now(), now())"
                )
            )
            == "42501"
        )


def test_approvals_store_the_subject_only_as_its_pseudonym(fabric: Fabric, canary: str) -> None:
    approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', %s, 'art. 17')",
        canary,
    )["approval_id"]
    with fabric.su() as su:
        row = su.execute(
            "SELECT to_jsonb(a)::text, a.subject_ref FROM fabric.approvals a"
            " WHERE approval_id = %s",
            (approval,),
        ).fetchone()
    assert row is not None and canary not in row[0] and row[1].startswith("hmac:")


@pytest.mark.clone  # its SQL reads now() (one value in a transaction)
def test_subject_erasure_shreds_the_key_and_the_canary_leaves_every_table(
    fabric: Fabric, canary: str
) -> None:
    session = f"{canary}-session"
    run = fabric.open_run(subject=canary, session=session)
    episode_id = fabric.form(run, "an episode")
    fabric.form(run, "derived", tier="semantic", derived_from=[episode_id], content={"a": "b"})
    fabric.propose("mf_agent_a", episode("validated, never committed"), run)
    fabric.propose("mf_agent_a", episode("rejected", confidence=5), run)
    for _ in range(2):
        fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic", "semantic"]})
    assert len(subject_events(fabric, canary)) > 2
    events_before = fabric.count("events", RECALLS)
    assert canary in dump(fabric)

    result = subject_erasure(fabric, canary)

    assert result["subject_key"]["destroyed"] is True
    assert "fabric.subject_keys" in result["vacuum"]
    data = dump(fabric)
    assert canary not in data  # records, proposals, runs, approvals, receipts, keys, events...
    assert fabric.count("events", RECALLS) == events_before
    assert subject_events(fabric, canary) == []
    receipt = fabric.call("mf_auditor", "SELECT fabric_audit.erasure_receipt(%s)", episode_id)
    assert receipt["destroyed"]["subject_key"]["destroyed"] is True
    assert "Backups taken before the erasure" in receipt["destroyed"]["subject_key"]["note"]


def test_erasing_a_subject_whose_key_is_already_destroyed_is_refused(fabric: Fabric) -> None:
    run = fabric.open_run(subject="user-twice")
    fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
    first = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', 'user-twice', 'art. 17')",
    )["approval_id"]
    second = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', 'user-twice', 'art. 17')",
    )["approval_id"]
    for a in (first, second):
        fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", a)
    erase(fabric.connect("mf_committer"), str(first))
    assert sqlstate(lambda: erase(fabric.connect("mf_committer"), str(second))) == "MF005"
    with fabric.su() as su:
        status = su.execute(
            "SELECT status FROM fabric.approvals WHERE approval_id = %s", (second,)
        ).fetchone()
    assert status == ("approved",)


def test_upgrading_rewrites_clear_subject_ids_into_pseudonyms(server: Any) -> None:
    """An install at 0007 holds clear subject ids in recall events and approvals; the
    upgrade keys them, so erasing the subject later unlinks the old trail too."""
    name = f"mf_pseudonym_upgrade_{uuid.uuid4().hex[:8]}"
    admin = psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname="postgres"
    )
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin, dbname=name)
    canary = f"canary-{uuid.uuid4().hex}"
    try:
        mfdb.bootstrap(url)
        mfdb.upgrade(url, "0007")
        with psycopg.connect(url, autocommit=True) as su:
            su.execute("INSERT INTO fabric.tenants (tenant_id) VALUES ('acme')")
            su.execute(
                "INSERT INTO fabric.approvals (tenant_id, action, subject_id, reason,"
                " requested_by, expires_at) VALUES ('acme', 'erase_subject', %s, 'art. 17',"
                " 'os-agt-010', now() + interval '1 day')",
                (canary,),
            )
            su.execute(
                "INSERT INTO fabric.events (tenant_id, event_type, payload) VALUES ('acme',"
                " 'memory.recall.served', jsonb_build_object('scope', jsonb_build_object("
                "'tenant_id', 'acme', 'subject_id', %s::text, 'session_id', %s::text),"
                " 'request_hash', 'sha256:00'))",
                (canary, f"{canary}-session"),
            )
        mfdb.upgrade(url)
        with psycopg.connect(url, autocommit=True) as su:
            (scope, request_hash) = su.execute(  # type: ignore[misc]
                "SELECT payload -> 'scope', payload ->> 'request_hash' FROM fabric.events"
            ).fetchone()
            (approval_ref,) = su.execute(  # type: ignore[misc]
                "SELECT subject_ref FROM fabric.approvals"
            ).fetchone()
            (key_ref,) = su.execute(  # type: ignore[misc]
                "SELECT subject_ref FROM fabric.subject_keys WHERE subject_id = %s", (canary,)
            ).fetchone()
            su.execute("DELETE FROM fabric.subject_keys")  # what erasure does, by hand
        assert scope["subject_ref"] == approval_ref == key_ref
        assert scope["session_ref"].startswith("hmac:") and request_hash.startswith("hmac:")
        assert canary not in dump_url(url)
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def dump_url(url: str) -> str:
    return subprocess.run(
        [str(PG_DUMP), "--data-only", "-d", url], check=True, capture_output=True, text=True
    ).stdout
