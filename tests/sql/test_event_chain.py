"""The audit trail against schema changes and forged actors: prevention for every login but
the migration role (no one else becomes the owner; a DDL guard refuses schema changes), and
detection against the migration role and superusers (the sealed hash chain per tenant)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric, episode
from memfabric import db as mfdb
from memfabric.metrics import render
from memfabric.worker import run_committer, run_sealer, sealing_gauges, sealing_lag

MIGRATOR = "fabric_migrator"


def seal(fabric: Fabric) -> dict[str, Any]:
    row = fabric.session("mf_committer").execute("SELECT fabric_api.seal_events()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def verify(fabric: Fabric, tenant: str | None = None) -> dict[str, Any]:
    row = (
        fabric.session("mf_auditor")
        .execute("SELECT fabric_audit.verify_event_chain(%s)", (tenant,))
        .fetchone()
    )
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def activity(fabric: Fabric) -> str:
    """Events in both tenants; returns a memory id of acme."""
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode("sealed"), run)
    memory_id = str(fabric.commit(proposal["proposal_id"])["memory_id"])
    fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
    glx = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    fabric.propose(
        "mf_agent_g", episode("other", scope={"tenant_id": "globex", "visibility": "subject"}), glx
    )
    return memory_id


def sealed_event(fabric: Fabric, tenant: str = "acme") -> str:
    with fabric.su() as su:
        row = su.execute(
            "SELECT event_id FROM fabric.event_seals WHERE tenant_id = %s ORDER BY seq"
            " OFFSET 1 LIMIT 1",
            (tenant,),
        ).fetchone()
    assert row is not None
    return str(row[0])


def tampering_superuser(fabric: Fabric) -> psycopg.Connection[Any]:
    """A superuser with every ordinary trigger off."""
    su = fabric.su()
    su.execute("SET session_replication_role = replica")
    return su


def current_partition(fabric: Fabric) -> str:
    with fabric.su() as su:
        row = su.execute(
            "SELECT tableoid::regclass::text FROM fabric.events ORDER BY occurred_at DESC LIMIT 1"
        ).fetchone()
    assert row is not None
    return str(row[0])


# --- sealing and verifying ----------------------------------------------------------------


def test_sealing_links_every_event_of_every_tenant(fabric: Fabric) -> None:
    activity(fabric)
    # Sealing stops at the snapshot xmin, which the clone pool's CREATE DATABASE in the
    # background may hold back for a moment: settle first, as a sealer would simply run again.
    fabric.settle()
    total = fabric.count("events")
    first = seal(fabric)
    assert first["sealed"] == total and first["busy"] is False
    assert seal(fabric)["sealed"] == 0
    assert verify(fabric) == {"ok": True, "events": total, "unsealed": 0, "first_break": None}
    acme = verify(fabric, "acme")
    assert acme["ok"] and acme["events"] == fabric.count("events", "tenant_id = 'acme'")
    with fabric.su() as su:
        gaps = su.execute(
            "SELECT tenant_id FROM fabric.event_seals GROUP BY tenant_id"
            " HAVING max(seq) <> count(*)"
        ).fetchall()
    assert gaps == []


def test_sealing_stops_below_an_open_transaction_and_never_waits_for_it(fabric: Fabric) -> None:
    activity(fabric)
    run = fabric.open_run()
    writer = fabric.connect("mf_agent_a", autocommit=False)
    writer.execute("SELECT fabric_api.propose(%s, %s)", (psycopg.types.json.Jsonb(episode()), run))
    fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})  # committed later xid
    before = fabric.count("events")  # the writer's events are not visible yet
    sealed = seal(fabric)["sealed"]
    assert sealed < before
    assert verify(fabric)["unsealed"] == before - sealed
    writer.commit()
    fabric.settle()  # as above
    seal(fabric)
    result = verify(fabric)
    assert result["ok"] and result["unsealed"] == 0 and result["events"] == fabric.count("events")


def test_only_the_committer_seals_and_only_the_auditor_verifies(fabric: Fabric) -> None:
    for login in ("mf_agent_a", "mf_auditor", "mf_admin"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            fabric.connect(login).execute("SELECT fabric_api.seal_events()")
    for login in ("mf_agent_a", "mf_committer", "mf_admin"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            fabric.connect(login).execute("SELECT fabric_audit.verify_event_chain()")
    assert fabric.count("event_seals") == 0


def test_seals_are_append_only(fabric: Fabric) -> None:
    activity(fabric)
    seal(fabric)
    owner = fabric.owner(None, actor=None, login=MIGRATOR)
    for statement in (
        "UPDATE fabric.event_seals SET link = repeat('0', 64)",
        "DELETE FROM fabric.event_seals",
        "TRUNCATE fabric.event_seals",
    ):
        with pytest.raises(psycopg.Error) as info:
            owner.execute(statement)
        assert info.value.sqlstate == "MF003"
    assert verify(fabric)["ok"]


# --- detection: what prevention cannot stop -------------------------------------------------


def test_verify_reports_a_superuser_deleting_a_sealed_event_with_triggers_off(
    fabric: Fabric,
) -> None:
    activity(fabric)
    seal(fabric)
    victim = sealed_event(fabric)
    tampering_superuser(fabric).execute("DELETE FROM fabric.events WHERE event_id = %s", (victim,))
    result = verify(fabric)
    assert result["ok"] is False
    assert result["first_break"]["event_id"] == victim
    assert result["first_break"]["tenant_id"] == "acme"
    assert "missing" in result["first_break"]["problem"]
    assert verify(fabric, "globex")["ok"]


def test_verify_reports_an_altered_sealed_event(fabric: Fabric) -> None:
    activity(fabric)
    seal(fabric)
    victim = sealed_event(fabric)
    tampering_superuser(fabric).execute(
        "UPDATE fabric.events SET actor_agent_id = 'os-agt-010' WHERE event_id = %s", (victim,)
    )
    result = verify(fabric, "acme")
    assert result["ok"] is False and result["first_break"]["event_id"] == victim
    assert "altered" in result["first_break"]["problem"]


def test_verify_reports_an_event_inserted_among_sealed_ones(fabric: Fabric) -> None:
    activity(fabric)
    seal(fabric)
    forged = str(uuid.uuid4())
    with fabric.su() as su:
        su.execute(
            "INSERT INTO fabric.events (event_id, tenant_id, event_type, actor_agent_id, xid)"
            " VALUES (%s, 'acme', 'memory.record.superseded', 'os-agt-010', '3'::xid8)",
            (forged,),
        )
    result = verify(fabric)
    assert result["ok"] is False and result["first_break"]["event_id"] == forged
    assert "inserted" in result["first_break"]["problem"]


@pytest.mark.parametrize("how", ["DROP TABLE {}", "ALTER TABLE fabric.events DETACH PARTITION {}"])
def test_verify_reports_a_dropped_or_detached_partition(fabric: Fabric, how: str) -> None:
    activity(fabric)
    seal(fabric)
    partition = current_partition(fabric)
    with fabric.su() as su:
        su.execute(sql.SQL(how).format(sql.SQL(partition)))  # type: ignore[arg-type]
    result = verify(fabric)
    assert result["ok"] is False and "missing" in result["first_break"]["problem"]


# --- prevention: every login but the migration role -------------------------------------------


def non_migration_logins(fabric: Fabric) -> list[str]:
    with fabric.su() as su:
        rows = su.execute(
            "SELECT rolname FROM pg_roles WHERE rolcanlogin AND NOT rolsuper"
            " AND rolname <> %s ORDER BY 1",
            (MIGRATOR,),
        ).fetchall()
    return [r[0] for r in rows]


def test_no_login_but_the_migration_role_can_become_the_owner(fabric: Fabric) -> None:
    logins = non_migration_logins(fabric)
    assert "mf_committer" in logins and "mf_agent_a" in logins
    with fabric.su() as su:
        owners = su.execute(
            "SELECT r FROM unnest(%s::text[]) r WHERE pg_has_role(r, 'fabric_owner', 'MEMBER')",
            (logins,),
        ).fetchall()
        migrator = su.execute("SELECT pg_has_role(%s, 'fabric_owner', 'SET')", (MIGRATOR,))
        assert migrator.fetchone() == (True,)
    assert owners == []


FIVE_STATEMENTS = [
    "ALTER TABLE fabric.events DISABLE TRIGGER ALL",
    "ALTER TABLE fabric.events DETACH PARTITION {partition}",
    "DROP TABLE {partition}",
    "UPDATE fabric.memory_records SET consolidation_state = 'superseded'"
    " WHERE memory_id = '{memory_id}'",
    "SET ROLE fabric_owner",
]


@pytest.mark.parametrize("statement", FIVE_STATEMENTS)
def test_every_non_migration_login_is_refused(fabric: Fabric, statement: str) -> None:
    memory_id = activity(fabric)
    seal(fabric)
    partition = current_partition(fabric)
    text = statement.format(partition=partition, memory_id=memory_id)
    for login in non_migration_logins(fabric):
        conn = fabric.connect(login)
        conn.execute("SELECT set_config('fabric.actor', 'os-agt-010', false)")
        conn.execute("SELECT set_config('fabric.tenant_id', 'acme', false)")
        with pytest.raises(psycopg.Error) as info:
            conn.execute(text)
        assert info.value.sqlstate == "42501", (login, info.value)
    assert current_partition(fabric) == partition
    with fabric.su() as su:
        state = su.execute(
            "SELECT consolidation_state FROM fabric.memory_records WHERE memory_id = %s",
            (memory_id,),
        ).fetchone()
        disabled = su.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'fabric.events'::regclass"
            " AND tgenabled = 'D'"
        ).fetchone()
    assert state == ("raw",) and disabled == (0,)
    assert verify(fabric)["ok"]


@pytest.fixture
def leaked_owner(fabric: Fabric) -> Iterator[str]:
    """A login that was (wrongly) granted fabric_owner; dropped afterwards (roles are
    cluster-wide)."""
    login = f"mf_leak_{uuid.uuid4().hex[:8]}"
    with fabric.su() as su:
        su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        su.execute(sql.SQL("GRANT fabric_owner TO {}").format(sql.Identifier(login)))
    yield login
    with psycopg.connect(fabric.url, autocommit=True) as su:
        su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login)))


@pytest.mark.parametrize("statement", FIVE_STATEMENTS[:3])
def test_the_ddl_guard_refuses_schema_changes_even_to_a_login_holding_the_owner(
    fabric: Fabric, leaked_owner: str, statement: str
) -> None:
    activity(fabric)
    partition = current_partition(fabric)
    conn = fabric.owner(None, actor=None, autocommit=False, login=leaked_owner)
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
        conn.execute(statement.format(partition=partition))
    assert "migration role" in str(info.value)
    conn.rollback()
    assert current_partition(fabric) == partition


def test_the_ddl_guard_leaves_other_schemas_and_the_migration_role_alone(fabric: Fabric) -> None:
    with fabric.su() as su:
        su.execute("CREATE SCHEMA scratch AUTHORIZATION mf_stranger")
    stranger = fabric.connect("mf_stranger")
    stranger.execute("CREATE TABLE scratch.t (x int)")
    stranger.execute("DROP TABLE scratch.t")
    migrator = fabric.owner(None, actor=None, login=MIGRATOR)
    migrator.execute("CREATE TABLE fabric.guard_probe (x int)")
    migrator.execute("DROP TABLE fabric.guard_probe")


def test_migrate_without_a_superuser_warns_that_the_ddl_guard_is_not_installed(
    fabric: Fabric,
) -> None:
    said: list[str] = []
    url = mfdb.url_for(fabric.url, MIGRATOR)
    assert mfdb.install_ddl_guard(url, warn=said.append) is False
    assert len(said) == 1 and said[0].startswith("the DDL guard") and "superuser" in said[0]


# --- sealing is continuous ------------------------------------------------------------------


def test_one_sealer_seals_and_the_commit_worker_leaves_it_to_serve(fabric: Fabric) -> None:
    """Exactly one process seals: the sealer that `memfabric serve` runs (run_sealer). The
    commit worker only commits (it scales out, and events come from recalls, decay and
    erasure as well as from commits), so after its drain every event is still unsealed."""
    activity(fabric)  # leaves globex's proposal validated, for the worker
    conninfo = psycopg.conninfo.make_conninfo(fabric.url, user="mf_committer")
    assert run_committer(conninfo, once=True, progress=lambda _line: None) == (1, 0)
    before = verify(fabric)
    assert before["ok"] and before["events"] == 0
    assert before["unsealed"] == fabric.count("events") > 0
    ticks = itertools.count()  # one pass: the outer and the inner loop each check once
    run_sealer(conninfo, poll_seconds=0.01, should_stop=lambda: next(ticks) >= 2)
    result = verify(fabric)
    assert result["ok"] and result["unsealed"] == 0 and result["events"] == fabric.count("events")


# --- the head: derived from the append-only seals, held by the auditor ----------------------


def head(fabric: Fabric, tenant: str = "acme") -> dict[str, Any]:
    row = (
        fabric.session("mf_auditor")
        .execute("SELECT fabric_audit.chain_head(%s)", (tenant,))
        .fetchone()
    )
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def verify_against(fabric: Fabric, tenant: str, held: Any) -> dict[str, Any]:
    row = (
        fabric.session("mf_auditor")
        .execute(
            "SELECT fabric_audit.verify_event_chain(%s, %s)",
            (tenant, psycopg.types.json.Jsonb(held)),
        )
        .fetchone()
    )
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_the_head_is_the_last_seal_and_no_cursor_can_be_moved_back(fabric: Fabric) -> None:
    """How far sealing has gone is read from the append-only seals: there is no cursor row
    for an owner's member or the migration role to update or truncate."""
    assert head(fabric) == {
        "tenant_id": "acme", "seq": 0, "events": 0, "event_id": None, "occurred_at": None,
        "link": None, "sealed_at": None,
    }  # fmt: skip
    activity(fabric)
    fabric.settle()
    seal(fabric)
    held = head(fabric)
    with fabric.su() as su:
        last = su.execute(
            "SELECT seq, event_id::text, link FROM fabric.event_seals WHERE tenant_id = 'acme'"
            " ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        cursor = su.execute("SELECT to_regclass('fabric.event_seal_cursor')").fetchone()
    assert (held["seq"], held["event_id"], held["link"]) == last
    assert held["events"] == held["seq"] == verify(fabric, "acme")["events"]
    assert cursor == (None,)
    assert seal(fabric)["sealed"] == 0  # sealing resumes from the seals themselves


def test_a_truncated_tail_passes_alone_and_fails_against_the_held_head(fabric: Fabric) -> None:
    """A superuser with triggers off deletes the last seals and their events: the chain
    that is left recomputes, so only the head the auditor kept shows the loss."""
    activity(fabric)
    fabric.settle()
    seal(fabric)
    held = head(fabric)
    assert held["seq"] >= 3
    assert verify_against(fabric, "acme", held) == {
        "ok": True, "events": held["seq"], "unsealed": 0, "first_break": None,
    }  # fmt: skip
    tamper = tampering_superuser(fabric)
    tamper.execute(
        "WITH gone AS (DELETE FROM fabric.event_seals WHERE tenant_id = 'acme' AND seq > %s"
        " RETURNING event_id) DELETE FROM fabric.events WHERE event_id IN (SELECT * FROM gone)",
        (held["seq"] - 2,),
    )
    alone = verify(fabric, "acme")
    assert alone["ok"] and alone["events"] == held["seq"] - 2  # what the head is for
    result = verify_against(fabric, "acme", held)
    assert result["ok"] is False
    assert result["first_break"] == {
        "tenant_id": "acme", "seq": held["seq"], "event_id": held["event_id"],
        "chain_seq": held["seq"] - 2,
        "problem": "the chain ends before the head you hold: sealed events were removed from"
        " its end (truncated)",
    }  # fmt: skip
    # every seal gone, too
    tamper.execute(
        "WITH gone AS (DELETE FROM fabric.event_seals WHERE tenant_id = 'acme'"
        " RETURNING event_id) DELETE FROM fabric.events WHERE event_id IN (SELECT * FROM gone)"
    )
    assert verify_against(fabric, "acme", held)["first_break"]["chain_seq"] == 0
    assert verify_against(fabric, "globex", head(fabric, "globex"))["ok"]


def test_a_rewritten_tail_fails_against_the_held_head(fabric: Fabric) -> None:
    """A superuser alters the last sealed event and recomputes its link: the chain
    recomputes, the held head does not match it any more."""
    activity(fabric)
    fabric.settle()
    seal(fabric)
    held = head(fabric)
    tamper = tampering_superuser(fabric)
    tamper.execute(
        "UPDATE fabric.events SET actor_agent_id = 'os-agt-010' WHERE event_id = %s",
        (held["event_id"],),
    )
    tamper.execute(
        "UPDATE fabric.event_seals s SET link = fabric._event_link(p.link, e)"
        " FROM fabric.event_seals p, fabric.events e"
        " WHERE s.tenant_id = 'acme' AND s.seq = %s AND p.tenant_id = 'acme'"
        " AND p.seq = s.seq - 1 AND e.event_id = s.event_id",
        (held["seq"],),
    )
    assert verify(fabric, "acme")["ok"]
    result = verify_against(fabric, "acme", held)
    assert result["ok"] is False and "rewritten" in result["first_break"]["problem"]


@pytest.mark.parametrize(
    "held",
    [None, [], {"seq": "3"}, {"seq": -1}, {"seq": 2}, {"seq": 2, "link": "x"},
     {"tenant_id": "globex", "seq": 0}],
)  # fmt: skip
def test_an_expected_head_must_be_a_head_of_that_tenant(fabric: Fabric, held: Any) -> None:
    with pytest.raises(psycopg.Error) as info:
        verify_against(fabric, "acme", held)
    assert info.value.sqlstate == "22023"


def test_only_the_auditor_reads_a_head_of_a_known_tenant(fabric: Fabric) -> None:
    for login in ("mf_agent_a", "mf_committer", "mf_admin"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            fabric.connect(login).execute("SELECT fabric_audit.chain_head('acme')")
    with pytest.raises(psycopg.Error) as info:
        head(fabric, "no-such-tenant")
    assert info.value.sqlstate == "P0002"


def test_one_sealer_at_a_time_the_other_returns_busy(fabric: Fabric) -> None:
    activity(fabric)
    first = fabric.connect("mf_committer", autocommit=False)
    row = first.execute("SELECT fabric_api.seal_events()").fetchone()
    assert row is not None and row[0]["busy"] is False
    assert seal(fabric) == {"sealed": 0, "busy": True}  # while the first is not committed
    first.rollback()
    assert seal(fabric)["busy"] is False


def test_the_sealing_lag_is_a_metric_until_sealing_catches_up(fabric: Fabric) -> None:
    """`memfabric serve`'s sealing metrics: the events not sealed yet and the age of the
    oldest, read as the sealer's login; both 0 once sealed. Only the committer reads them."""
    activity(fabric)
    fabric.settle()
    conninfo = psycopg.conninfo.make_conninfo(fabric.url, user="mf_committer")
    lag = sealing_lag(conninfo)
    assert lag["unsealed"] == fabric.count("events") > 0 and lag["oldest_unsealed_seconds"] > 0
    text = render(sealing_gauges(conninfo))
    assert f"memfabric_events_unsealed {fabric.count('events')}\n" in text
    assert "memfabric_metric_read_errors 0" in text
    seal(fabric)
    assert sealing_lag(conninfo) == {"unsealed": 0, "oldest_unsealed_seconds": 0}
    assert "memfabric_oldest_unsealed_event_age_seconds 0\n" in render(sealing_gauges(conninfo))
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.connect("mf_agent_a").execute("SELECT fabric_api.sealing_lag()")


@pytest.mark.clone
def test_a_pass_links_each_tenants_events_in_order_with_one_statement(fabric: Fabric) -> None:
    """A pass over interleaved tenants writes the links the auditor recomputes one event at a
    time (fabric._event_link), in (xid, event_id) order per tenant, with one INSERT: the
    chain link once per event, each tenant's head read once."""
    seal(fabric)
    for _ in range(3):
        activity(fabric)
    su = fabric.connect(None, autocommit=False)
    su.execute("SET track_functions = 'all'")
    su.execute("SET SESSION AUTHORIZATION mf_committer")
    answer = su.execute("SELECT fabric_api.seal_events()").fetchone()
    assert answer is not None
    su.execute("RESET SESSION AUTHORIZATION")
    sealed = answer[0]["sealed"]
    assert sealed > 6 and answer[0]["tenants"] == 2
    n = dict(
        su.execute(
            "SELECT f, pg_stat_get_xact_function_calls(f::regproc) FROM unnest(ARRAY"
            "['fabric._chain_link', 'fabric._chain_head', 'fabric._event_link']) f"
        ).fetchall()
    )
    assert n == {"fabric._chain_link": sealed, "fabric._chain_head": 2, "fabric._event_link": None}
    wrong = su.execute(
        """SELECT count(*) FROM (
             SELECT s.tenant_id, s.seq, s.link, s.xid, s.event_id,
                    fabric._event_link(lag(s.link) OVER w, e) AS recomputed,
                    lag(s.seq) OVER w AS prev_seq,
                    lag(ROW(s.xid, s.event_id)) OVER w < ROW(s.xid, s.event_id) AS in_order
             FROM fabric.event_seals s JOIN fabric.events e ON e.event_id = s.event_id
             WINDOW w AS (PARTITION BY s.tenant_id ORDER BY s.seq)) c
           WHERE c.recomputed <> c.link OR c.prev_seq <> c.seq - 1 OR NOT c.in_order"""
    ).fetchone()
    assert wrong == (0,)
    su.commit()
    assert verify(fabric)["ok"]
