"""The lifecycle (R-LIFE-1), the record history (R-LIFE-2) and the outbox (R-LIFE-3).

Committed records move only forward along the lifecycle table; every move emits its event in the
same transaction with the record's correlation and causation ids, and writes the previous
values of the mutable columns into fabric.memory_record_versions. Transitions are driven
as the owner (superuser, SET ROLE fabric_owner) with an actor context, so the triggers are
the only thing that decides.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback

ACTOR = "os-agt-010"
CORRELATION, CAUSATION = "corr-9d4a", "evt-7b1f"  # conftest.episode()'s provenance
STATES = ["raw", "consolidated", "reflected", "superseded", "expired", "tombstoned"]
# R-LIFE-1, written out independently of fabric._legal_transition.
LEGAL = {
    "raw": {"consolidated", "reflected", "superseded", "expired", "tombstoned"},
    "consolidated": {"reflected", "superseded", "expired", "tombstoned"},
    "reflected": {"superseded", "expired", "tombstoned"},
    "superseded": {"tombstoned"},
    "expired": {"tombstoned"},
    "tombstoned": set(),
}
EVENT_OF = {
    "consolidated": "memory.record.consolidated",
    "reflected": "memory.reflection.completed",
    "superseded": "memory.record.superseded",
    "expired": "memory.record.expired",
    "tombstoned": "memory.record.forgotten",
}
PAIRS = [(a, b) for a, b in itertools.product(STATES, STATES) if a != b]
HISTORY_COLUMNS = {
    "tenant_id",
    "memory_id",
    "revision",
    "tier",
    "consolidation_state",
    "valid_until",
    "known_during",
    "ended_by",
}


# --- helpers ----------------------------------------------------------------------------


def history(fabric: Fabric, memory_id: str) -> list[dict[str, Any]]:
    """History rows with the range bounds spelled out, oldest first."""
    c = fabric.session()  # the superuser's session: reads only
    rows = c.execute(
        "SELECT to_jsonb(v) || jsonb_build_object('lower', lower(known_during),"
        " 'upper', upper(known_during), 'empty', isempty(known_during))"
        " FROM fabric.memory_record_versions v WHERE memory_id = %s ORDER BY revision",
        (memory_id,),
    ).fetchall()
    return [r[0] for r in rows]


def refused(conn: psycopg.Connection[Any], query: Any, params: Any, sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == sqlstate, info.value


def move(conn: psycopg.Connection[Any], memory_id: str, to: str, **columns: Any) -> None:
    """One lifecycle transition; tombstoning is an erasure under an approval."""
    if to == "tombstoned":
        approval = str(uuid.uuid4())
        conn.execute("SELECT set_config('fabric.approval_id', %s, false)", (approval,))
        conn.execute(
            "UPDATE fabric.memory_records SET content = NULL, subject_id = NULL,"
            " session_id = NULL, agent_id = NULL, consolidation_state = 'tombstoned',"
            " erased_at = now(), erasure_approval_id = %s WHERE memory_id = %s",
            (approval, memory_id),
        )
        return
    sets = ", ".join(["consolidation_state = %s", *(f"{c} = %s" for c in columns)])
    conn.execute(
        f"UPDATE fabric.memory_records SET {sets} WHERE memory_id = %s",  # noqa: S608
        (to, *columns.values(), memory_id),
    )


# --- the lifecycle table ------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
@pytest.mark.clone  # sets the approval context with set_config (the tombstoned moves)
def test_records_move_only_along_the_lifecycle_table(fabric: Fabric, src: str, dst: str) -> None:
    memory_id = fabric.form()
    conn = fabric.owner()
    if src != "raw":
        move(conn, memory_id, src)  # every state is one legal step from raw
    before, counts = fabric.record(memory_id), fabric.counts()
    assert before["consolidation_state"] == src
    if dst in LEGAL[src]:
        move(conn, memory_id, dst)
        assert fabric.record(memory_id)["consolidation_state"] == dst
        after = fabric.counts()
        assert after["memory_record_versions"] == counts["memory_record_versions"] + 1
        assert after["events"] == counts["events"] + 1
    else:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(
                "UPDATE fabric.memory_records SET consolidation_state = %s WHERE memory_id = %s",
                (dst, memory_id),
            )
        assert info.value.sqlstate == "MF002", info.value
        assert fabric.record(memory_id) == before
        assert fabric.counts() == counts


def test_the_lifecycle_table_matches_the_design(fabric: Fabric) -> None:
    with fabric.su() as c:
        legal = {
            (a, b)
            for a, b in PAIRS
            if c.execute("SELECT fabric._legal_transition(%s, %s)", (a, b)).fetchone()[0]  # type: ignore[index]
        }
    assert legal == {(a, b) for a, b in PAIRS if b in LEGAL[a]}


def test_an_unchanged_state_is_not_a_transition(fabric: Fabric) -> None:
    memory_id = fabric.form()
    before, counts = fabric.record(memory_id), fabric.counts()
    fabric.owner().execute(
        "UPDATE fabric.memory_records SET consolidation_state = 'raw' WHERE memory_id = %s",
        (memory_id,),
    )
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


@pytest.mark.parametrize("dst", ["consolidated", "expired", "tombstoned"])
@pytest.mark.clone  # sets the approval context with set_config
def test_changes_without_an_acting_agent_fail_closed(fabric: Fabric, dst: str) -> None:
    memory_id = fabric.form()
    before, counts = fabric.record(memory_id), fabric.counts()
    conn = fabric.owner(actor=None)
    with pytest.raises(psycopg.Error) as info:
        move(conn, memory_id, dst)
    assert info.value.sqlstate == "MF004", info.value
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


def test_records_are_formed_only_with_an_acting_agent(fabric: Fabric) -> None:
    memory_id = fabric.form()
    counts = fabric.counts()
    refused(
        fabric.owner(actor=None),
        "INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, content,"
        " content_hash, source_event_id, formed_by, formation_method, confidence, valid_from,"
        " retention_class) SELECT tenant_id, tier, visibility, subject_id, content,"
        " content_hash, source_event_id, formed_by, formation_method, confidence, valid_from,"
        " retention_class FROM fabric.memory_records WHERE memory_id = %s",
        (memory_id,),
        "MF004",
    )
    assert fabric.counts() == counts


# --- each transition emits exactly its event, in the same transaction ------------------------


@pytest.mark.parametrize("dst", list(EVENT_OF))
@pytest.mark.clone  # needs a transaction of its own
def test_each_transition_emits_its_event_in_the_same_transaction(fabric: Fabric, dst: str) -> None:
    memory_id = fabric.form()
    before, counts = fabric.record(memory_id), fabric.counts()
    conn = fabric.owner(autocommit=False)
    move(conn, memory_id, dst)
    events = conn.execute(
        "SELECT to_jsonb(e) FROM fabric.events e WHERE e.xid = pg_current_xact_id()"
    ).fetchall()
    assert [e[0]["event_type"] for e in events] == [EVENT_OF[dst]]
    event = events[0][0]
    assert event["memory_id"] == memory_id
    assert event["tenant_id"] == "acme"
    assert (event["correlation_id"], event["causation_id"]) == (CORRELATION, CAUSATION)
    assert event["actor_agent_id"] == ACTOR
    assert event["payload"]["from_state"] == "raw"
    assert event["payload"]["to_state"] == dst
    in_tx = conn.execute(
        "SELECT count(*) FROM fabric.memory_record_versions WHERE memory_id = %s", (memory_id,)
    ).fetchone()
    assert in_tx == (1,)
    conn.rollback()
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


@pytest.mark.clone  # sets fabric.action with set_config
def test_promotion_emits_its_event(fabric: Fabric) -> None:
    source = fabric.form()
    memory_id = fabric.form(text="prefers EUR", tier="semantic", derived_from=[source])
    conn = fabric.owner()
    conn.execute("SELECT set_config('fabric.action', 'promote', false)")
    conn.execute(
        "UPDATE fabric.memory_records SET tier = 'profile' WHERE memory_id = %s", (memory_id,)
    )
    assert fabric.record(memory_id)["tier"] == "profile"
    promoted = fabric.events(f"memory_id = '{memory_id}' AND event_type = 'memory.record.promoted'")
    assert len(promoted) == 1
    assert promoted[0]["payload"] == {"from_tier": "semantic", "to_tier": "profile", "state": "raw"}
    assert [(v["revision"], v["tier"]) for v in history(fabric, memory_id)] == [(1, "semantic")]


@pytest.mark.parametrize("action", [None, "commit", "supersede"])
@pytest.mark.clone  # sets fabric.action with set_config
def test_tier_changes_only_by_promotion_or_demotion(fabric: Fabric, action: str | None) -> None:
    source = fabric.form()
    memory_id = fabric.form(text="prefers EUR", tier="semantic", derived_from=[source])
    before, counts = fabric.record(memory_id), fabric.counts()
    conn = fabric.owner()
    if action is not None:
        conn.execute("SELECT set_config('fabric.action', %s, false)", (action,))
    refused(
        conn,
        "UPDATE fabric.memory_records SET tier = 'profile' WHERE memory_id = %s",
        (memory_id,),
        "MF002",
    )
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


# --- valid_until ------------------------------------------------------------------------------

CLOSED = {"valid_from": "2026-07-02T09:14:00Z", "valid_until": "2026-12-31T00:00:00Z"}


@pytest.mark.parametrize("dst", ["superseded", "expired"])
def test_valid_until_shrinks_when_the_record_ends(fabric: Fabric, dst: str) -> None:
    memory_id = fabric.form(validity_interval=CLOSED)
    move(fabric.owner(), memory_id, dst, valid_until="2026-10-01T00:00:00Z")
    after = fabric.record(memory_id)
    assert after["valid_until"].startswith("2026-10-01T00:00:00")
    assert [v["valid_until"][:10] for v in history(fabric, memory_id)] == ["2026-12-31"]


@pytest.mark.parametrize(
    ("setup", "change"),
    [
        (None, "valid_until = '2026-10-01T00:00:00Z'"),
        (None, "valid_until = '2026-10-01T00:00:00Z', consolidation_state = 'consolidated'"),
        (None, "valid_until = '2026-10-01T00:00:00Z', consolidation_state = 'reflected'"),
        (None, "valid_until = '2027-06-01T00:00:00Z', consolidation_state = 'superseded'"),
        (None, "valid_until = NULL, consolidation_state = 'expired'"),
        ("superseded", "valid_until = '2026-10-01T00:00:00Z'"),
        ("expired", "valid_until = '2026-10-01T00:00:00Z'"),
    ],
    ids=[
        "alone",
        "with-consolidated",
        "with-reflected",
        "grows",
        "reopens",
        "after-superseded",
        "after-expired",
    ],
)
def test_valid_until_only_shrinks_and_only_when_superseded_or_expired(
    fabric: Fabric, setup: str | None, change: str
) -> None:
    memory_id = fabric.form(validity_interval=CLOSED)
    conn = fabric.owner()
    if setup is not None:
        move(conn, memory_id, setup)
    before, counts = fabric.record(memory_id), fabric.counts()
    refused(
        conn,
        f"UPDATE fabric.memory_records SET {change} WHERE memory_id = %s",  # noqa: S608
        (memory_id,),
        "MF002",
    )
    assert fabric.record(memory_id) == before
    assert fabric.counts() == counts


# --- history ------------------------------------------------------------------------------


def walk(fabric: Fabric, text: str = "asked for invoices in EUR") -> str:
    """raw -> consolidated -> reflected -> superseded (valid_until shrinks) -> tombstoned,
    one transaction each."""
    memory_id = fabric.form(text=text, validity_interval=CLOSED)
    conn = fabric.owner()
    move(conn, memory_id, "consolidated")
    move(conn, memory_id, "reflected")
    move(conn, memory_id, "superseded", valid_until="2026-10-01T00:00:00Z")
    move(conn, memory_id, "tombstoned")
    return memory_id


@pytest.mark.clone  # sets the approval context with set_config
def test_every_change_keeps_the_previous_values(fabric: Fabric) -> None:
    memory_id = walk(fabric)
    rows = history(fabric, memory_id)
    assert [
        (v["revision"], v["consolidation_state"], v["valid_until"][:10], v["tier"]) for v in rows
    ] == [
        (1, "raw", "2026-12-31", "episodic"),
        (2, "consolidated", "2026-12-31", "episodic"),
        (3, "reflected", "2026-12-31", "episodic"),
        (4, "superseded", "2026-10-01", "episodic"),
    ]
    assert {v["ended_by"] for v in rows} == {ACTOR}
    assert fabric.record(memory_id)["revision"] == 5


@pytest.mark.clone  # sets the approval context with set_config
def test_history_ranges_tile_transaction_time(fabric: Fabric) -> None:
    memory_id = walk(fabric)
    rows = history(fabric, memory_id)
    current = fabric.record(memory_id)
    assert [v["revision"] for v in rows] == list(range(1, current["revision"]))
    assert not any(v["empty"] for v in rows)
    with fabric.su() as c:
        # Compare as timestamps, not as JSON text.
        tiles = c.execute(
            "SELECT bool_and(lower(v.known_during) < upper(v.known_during)),"
            "       bool_and(upper(v.known_during)"
            "                = coalesce(lower(n.known_during), m.known_since)),"
            "       min(lower(v.known_during)) = min(m.recorded_at)"
            " FROM fabric.memory_record_versions v"
            " JOIN fabric.memory_records m USING (tenant_id, memory_id)"
            " LEFT JOIN fabric.memory_record_versions n"
            "   ON n.tenant_id = v.tenant_id AND n.memory_id = v.memory_id"
            "  AND n.revision = v.revision + 1"
            " WHERE v.memory_id = %s",
            (memory_id,),
        ).fetchone()
    assert tiles == (True, True, True)


@pytest.mark.clone  # sets the approval context with set_config
def test_history_never_holds_content(fabric: Fabric) -> None:
    canary = f"canary-{uuid.uuid4()}"
    memory_id = walk(fabric, canary)
    with fabric.su() as c:
        columns = {
            r[0]
            for r in c.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = "
                "'fabric.memory_record_versions'::regclass AND attnum > 0 AND NOT attisdropped"
            )
        }
        dump = c.execute(
            "SELECT string_agg(to_jsonb(v)::text, ' ') FROM fabric.memory_record_versions v"
        ).fetchone()
    assert columns == HISTORY_COLUMNS
    assert dump is not None and memory_id in dump[0]
    assert canary not in dump[0]


# --- events: the envelope, never content -------------------------------------------------------

ENVELOPE = (
    "event_id",
    "event_type",
    "tenant_id",
    "correlation_id",
    "causation_id",
    "actor_agent_id",
    "memory_id",
    "occurred_at",
    "xid",
)


@pytest.mark.clone  # sets the approval context with set_config
def test_record_events_carry_the_envelope(fabric: Fabric) -> None:
    memory_id = walk(fabric)
    events = fabric.events(f"memory_id = '{memory_id}'")
    assert [e["event_type"] for e in events] == [
        "memory.record.formed",
        "memory.record.consolidated",
        "memory.reflection.completed",
        "memory.record.superseded",
        "memory.record.forgotten",
    ]
    for event in events:
        missing = [k for k in ENVELOPE if event.get(k) is None]
        assert not missing, (event["event_type"], missing)
        assert (event["correlation_id"], event["causation_id"]) == (CORRELATION, CAUSATION)
        assert event["tenant_id"] == "acme"
    assert len({e["xid"] for e in events}) == len(events)  # one transaction each


@pytest.mark.clone  # sets the approval context with set_config
def test_events_never_carry_content(fabric: Fabric) -> None:
    canary = f"canary-{uuid.uuid4()}"
    walk(fabric, canary)
    run = fabric.open_run()
    rejected = fabric.propose("mf_agent_a", episode(canary, tier="relational"), run)
    assert rejected["status"] == "rejected"
    with fabric.su() as c:
        rows = [r[0] for r in c.execute("SELECT to_jsonb(e)::text FROM fabric.events e")]
        in_proposals = c.execute(
            "SELECT count(*) FROM fabric.proposals WHERE content::text LIKE %s", (f"%{canary}%",)
        ).fetchone()
    # The canary really went through the write path (the walked record's proposal and the
    # rejected one; scrubbing proposals belongs to fabric_api.erase, not to this UPDATE).
    assert in_proposals == (2,)
    assert len(rows) >= 7
    assert [r for r in rows if canary in r] == []


# --- NOTIFY: one wake-up per statement, only for projected events -------------------------------


def listener(fabric: Fabric) -> psycopg.Connection[Any]:
    conn = fabric.connect("mf_committer")
    conn.execute("LISTEN fabric_events")
    return conn


def notifications(conn: psycopg.Connection[Any]) -> list[str]:
    """The wake-ups heard on fabric_events so far. The listener then notifies a marker of its
    own: a session hears its own NOTIFY, and notifications arrive in the order their
    transactions committed, so everything the test's statements notified comes before the
    marker, and a wake-up that never came costs no timeout."""
    marker = f"marker-{uuid.uuid4()}"
    conn.execute(sql.SQL("NOTIFY fabric_events, {}").format(sql.Literal(marker)))
    heard: list[str] = []
    for n in conn.notifies(timeout=30):
        if n.channel != "fabric_events":
            continue
        if n.payload == marker:
            return heard
        heard.append(n.payload)
    raise AssertionError("the listener never heard its own marker")


@pytest.mark.clone  # LISTENs for the commit's NOTIFY: needs a commit
def test_a_commit_wakes_the_projectors_once(fabric: Fabric) -> None:
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode(), run)
    conn = listener(fabric)
    fabric.commit(proposal["proposal_id"])
    assert notifications(conn) == [""]


@pytest.mark.clone  # LISTENs for the commit's NOTIFY: needs a commit
def test_one_statement_of_several_projected_events_wakes_once(fabric: Fabric) -> None:
    conn = listener(fabric)
    fabric.owner().execute(
        "INSERT INTO fabric.events (tenant_id, event_type, memory_id)"
        " SELECT 'acme', t, gen_random_uuid() FROM unnest(ARRAY["
        "'memory.record.formed', 'memory.record.consolidated', 'memory.record.expired']) t"
    )
    assert notifications(conn) == [""]


@pytest.mark.clone  # LISTENs for the commit's NOTIFY: needs a commit
def test_one_update_of_several_records_wakes_once(fabric: Fabric) -> None:
    ids = [fabric.form(text=f"fact {i}") for i in range(3)]
    conn = listener(fabric)
    fabric.owner().execute(
        "UPDATE fabric.memory_records SET consolidation_state = 'consolidated'"
        " WHERE memory_id = ANY (%s::uuid[])",
        (ids,),
    )
    assert len(fabric.events("event_type = 'memory.record.consolidated'")) == 3
    assert notifications(conn) == [""]


@pytest.mark.clone  # LISTENs for the commit's NOTIFY: needs a commit
def test_proposals_do_not_wake_the_projectors(fabric: Fabric) -> None:
    run = fabric.open_run()
    conn = listener(fabric)
    validated = fabric.propose("mf_agent_a", episode(), run)
    rejected = fabric.propose("mf_agent_a", episode(tier="relational"), run)
    assert (validated["status"], rejected["status"]) == ("validated", "rejected")
    assert len(fabric.events("event_type LIKE 'memory.proposal.%'")) == 2
    assert notifications(conn) == []
    fabric.commit(validated["proposal_id"])  # the listener does hear a projected event
    assert notifications(conn) == [""]


@pytest.mark.clone  # LISTENs for the commit's NOTIFY: needs a commit
def test_tool_refusals_do_not_wake_the_projectors(fabric: Fabric) -> None:
    run = fabric.open_run(tools=[])
    conn = listener(fabric)
    denied = fabric.propose("mf_agent_a", episode(), run)
    assert denied["status"] == "denied"
    assert len(fabric.events("event_type = 'agent.tool.unauthorized'")) == 1
    assert notifications(conn) == []
    fabric.form()
    assert notifications(conn) == [""]
