"""The projection feeds as rows (0.4): projection_events_v2, projection_records_v2,
projection_snapshot_v2 and store_embeddings (docs/projections.md). Events come in
(xid, event_id) order, a smaller page being the start of a larger one; the outbox is read
below the snapshot xmin; records and snapshot pages come in (tenant_id, memory_id) order;
only projectors read or write; embeddings travel as binary ext.vector values through
pgvector's adapter; a page streams row by row. The jsonb feeds of 0.3 are gone (0.11)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest
from pgvector import Vector
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from conftest import Fabric, episode
from memfabric.aio import AsyncFabric
from memfabric.call import register_vector
from memfabric.sdk import Fabric as SdkFabric

MODEL, VERSION = "test-model", "v1"
PROPOSE_MANY = "SELECT fabric_api.propose_many(%s, %s)"
COMMIT_MANY = "SELECT fabric_api.commit_many(%s)"


def form_many(
    fabric: Fabric, login: str, run: uuid.UUID, texts: list[str], tenant: str
) -> list[str]:
    envelopes = [episode(t, scope={"tenant_id": tenant, "visibility": "subject"}) for t in texts]
    row = fabric.connect(login).execute(PROPOSE_MANY, (Jsonb(envelopes), run)).fetchone()
    assert row is not None
    ids = [a["proposal_id"] for a in row[0]]
    assert all(a["status"] == "validated" for a in row[0]), row[0]
    committed = fabric.connect("mf_committer").execute(COMMIT_MANY, (ids,)).fetchone()
    assert committed is not None
    return [str(r["memory_id"]) for r in committed[0]]


def populate(fabric: Fabric) -> list[str]:
    """Records in two tenants, half of them with a stored embedding."""
    acme = form_many(
        fabric, "mf_agent_a", fabric.open_run(), [f"acme {i}" for i in range(40)], "acme"
    )
    globex_run = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    globex = form_many(
        fabric, "mf_agent_g", globex_run, [f"globex {i}" for i in range(25)], "globex"
    )
    ids = acme + globex
    projector = fabric.connect("mf_projector")
    register_vector(projector)
    hashes = dict(
        fabric.su()
        .execute("SELECT memory_id::text, content_hash FROM fabric.memory_records")
        .fetchall()
    )
    half = ids[::2]
    vectors = [Vector([float(i), 0.5, -1.25]) for i in range(len(half))]
    rows = projector.execute(
        "SELECT * FROM fabric_api.store_embeddings(%s::uuid[], %s, %s, %s, %s)",
        (half, MODEL, VERSION, vectors, [hashes[i] for i in half]),
    ).fetchall()
    assert len(rows) == len(half) and all(stored for _, stored in rows)
    # every event written here below the horizon (a transaction of the server, such as the
    # clone pool's next CREATE DATABASE, may hold it back a moment): the tests compare what
    # the feeds serve with what was written
    fabric.settle()
    return ids


def plain(value: Any) -> Any:
    """A row value in plain Python (ids as text, vectors as lists)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value
    if isinstance(value, Vector):
        return value.to_list()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def rows(conn: psycopg.Connection[Any], query: str, *args: Any) -> list[dict[str, Any]]:
    register_vector(conn)
    with conn.cursor(row_factory=dict_row, binary=True) as cur:
        return [{k: plain(v) for k, v in r.items()} for r in cur.execute(query, args).fetchall()]


def one(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


# --- what the feeds serve ----------------------------------------------------------------------


def test_events_rows_page_in_order_and_are_the_outbox_below_xmin(fabric: Fabric) -> None:
    populate(fabric)
    conn = fabric.connect("mf_projector")
    pages = {
        limit: conn.cursor(row_factory=dict_row)
        .execute("SELECT * FROM fabric_api.projection_events_v2('qdrant', %s)", (limit,))
        .fetchall()
        for limit in (1, 7, 10000)
    }
    assert len(pages[1]) == 1 and len(pages[7]) == 7 and len(pages[10000]) > 7
    assert pages[1] == pages[7][:1] and pages[7] == pages[10000][:7]
    keys = [(int(str(r["xid"])), r["event_id"]) for r in pages[10000]]
    assert keys == sorted(keys)
    # and independently: the projected events of the outbox, in (xid, event_id) order
    everything = conn.execute(
        "SELECT event_id FROM fabric_api.projection_events_v2('graph', 10000)"
    ).fetchall()
    expected = (
        fabric.su()
        .execute(
            "SELECT event_id FROM fabric.events"
            " WHERE event_type = ANY (fabric._projected_event_types()) ORDER BY xid, event_id"
        )
        .fetchall()
    )
    assert everything == expected and len(expected) >= 65


def test_events_rows_follow_the_cursor_and_stop_below_a_running_transaction(
    fabric: Fabric,
) -> None:
    populate(fabric)
    conn = fabric.connect("mf_projector")
    first = conn.execute(
        "SELECT xid::text, event_id FROM fabric_api.projection_events_v2('qdrant', 10)"
    ).fetchall()
    conn.execute(
        "SELECT fabric_api.set_projection_cursor('qdrant', %s::xid8, %s)",
        (first[-1][0], first[-1][1]),
    )
    after = conn.execute(
        "SELECT event_id FROM fabric_api.projection_events_v2('qdrant', 10)"
    ).fetchall()
    assert after and not {e for (e,) in after} & {e for _, e in first}
    # a transaction that is still open holds the horizon: nothing after it is served
    blocker = fabric.connect("mf_committer", autocommit=False)
    blocker.execute("SELECT pg_current_xact_id()")
    run = fabric.open_run()
    form_many(fabric, "mf_agent_a", run, ["after the blocker"], "acme")
    blocked = conn.execute(
        "SELECT count(*) FROM fabric_api.projection_events_v2('qdrant', 10000)"
    ).fetchone()
    blocker.rollback()
    fabric.settle()  # and no other transaction of the server holds it
    freed = conn.execute(
        "SELECT count(*) FROM fabric_api.projection_events_v2('qdrant', 10000)"
    ).fetchone()
    assert blocked is not None and freed is not None and freed[0] > blocked[0]


def test_records_rows_are_the_asked_records_with_their_embeddings(fabric: Fabric) -> None:
    ids = populate(fabric)
    conn = fabric.connect("mf_projector")
    asked = [*ids[::3], str(uuid.uuid4())]  # an unknown id is skipped, as before
    as_rows = rows(
        conn,
        "SELECT * FROM fabric_api.projection_records_v2(%s::uuid[], %s, %s)",
        asked,
        MODEL,
        VERSION,
    )
    assert {r["memory_id"] for r in as_rows} == set(ids[::3])
    assert [(r["tenant_id"], r["memory_id"]) for r in as_rows] == sorted(
        (r["tenant_id"], r["memory_id"]) for r in as_rows
    )
    stored = dict(
        fabric.su()
        .execute("SELECT memory_id::text, embedding::text FROM fabric.memory_embeddings")
        .fetchall()
    )
    for r in as_rows:  # the embedding is the stored vector, or None
        expected = stored.get(r["memory_id"])
        assert (r["embedding"] is None) == (expected is None)
        if expected is not None:
            assert r["embedding"] == [float(x) for x in expected.strip("[]").split(",")]
    # another model's embeddings are not this model's
    other = rows(
        conn, "SELECT * FROM fabric_api.projection_records_v2(%s::uuid[], 'other', 'v1')", ids
    )
    assert len(other) == len(ids) and all(r["embedding"] is None for r in other)


def test_snapshot_rows_page_through_every_record_in_order(fabric: Fabric) -> None:
    populate(fabric)
    conn = fabric.connect("mf_projector")
    expected = [
        (t, str(m))
        for t, m in fabric.su()
        .execute("SELECT tenant_id, memory_id FROM fabric.memory_records ORDER BY 1, 2")
        .fetchall()
    ]
    for page in (1, 9, 10000):
        after: tuple[str | None, str | None] = (None, None)
        seen: list[tuple[str, str]] = []
        while True:
            as_rows = rows(
                conn,
                "SELECT * FROM fabric_api.projection_snapshot_v2(%s, %s::uuid, %s, %s, %s)",
                *after,
                page,
                MODEL,
                VERSION,
            )
            if not as_rows:
                break
            assert len(as_rows) <= page
            seen += [(r["tenant_id"], r["memory_id"]) for r in as_rows]
            after = seen[-1]
        assert seen == expected


def test_a_snapshot_page_streams_row_by_row(fabric: Fabric) -> None:
    """A server-side cursor over the feed: rows arrive in small fetches, never as one value
    (the jsonb feed built the whole page into one jsonb, which has a size limit)."""
    ids = populate(fabric)
    conn = fabric.connect("mf_projector", autocommit=False)
    register_vector(conn)
    fetched: list[int] = []
    with conn.cursor("snapshot", row_factory=dict_row, binary=True) as cur:
        cur.itersize = 8
        cur.execute(
            "SELECT * FROM fabric_api.projection_snapshot_v2(NULL, NULL, 10000, %s, %s)",
            (MODEL, VERSION),
        )
        while batch := cur.fetchmany(8):
            fetched.append(len(batch))
            assert all(isinstance(r["embedding"], Vector | None) for r in batch)
    conn.rollback()
    assert sum(fetched) == len(ids) and max(fetched) == 8 and len(fetched) >= len(ids) // 8
    # single-row mode: psycopg's stream() hands over each row as the server sends it
    with fabric.connect("mf_projector").cursor() as cur:
        streamed = sum(
            1 for _ in cur.stream("SELECT * FROM fabric_api.projection_events_v2('graph', 10000)")
        )
    assert streamed >= len(ids)


# --- who may read and write --------------------------------------------------------------------

V2_READS = (
    "SELECT * FROM fabric_api.projection_events_v2('qdrant', 10)",
    "SELECT * FROM fabric_api.projection_records_v2(ARRAY[]::uuid[])",
    "SELECT * FROM fabric_api.projection_snapshot_v2(NULL, NULL, 10)",
)


@pytest.mark.parametrize("login", ["mf_agent_a", "mf_committer", "mf_tracer", "mf_stranger"])
def test_only_projectors_use_the_row_feeds(fabric: Fabric, login: str) -> None:
    ids = populate(fabric)
    before = fabric.counts() | {"embeddings": fabric.count("memory_embeddings")}
    conn = fabric.connect(login)
    for query in V2_READS:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute(query).fetchall()
        assert refused.value.sqlstate == "42501"
    register_vector(conn)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(
            "SELECT * FROM fabric_api.store_embeddings(%s::uuid[], 'm', 'v1', %s, %s)",
            ([ids[1]], [Vector([1.0, 2.0])], ["sha256:x"]),
        )
    assert fabric.counts() | {"embeddings": fabric.count("memory_embeddings")} == before


def test_the_trace_cursor_is_not_a_projection(fabric: Fabric) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        fabric.connect("mf_projector").execute(
            "SELECT * FROM fabric_api.projection_events_v2('trace', 10)"
        )


def test_store_embeddings_keeps_store_embeddings_rules(fabric: Fabric) -> None:
    ids = populate(fabric)
    conn = fabric.connect("mf_projector")
    register_vector(conn)
    hashes = dict(
        fabric.su()
        .execute("SELECT memory_id::text, content_hash FROM fabric.memory_records")
        .fetchall()
    )
    fresh = ids[1:6:2]  # odd positions have no embedding yet
    store = "SELECT * FROM fabric_api.store_embeddings(%s::uuid[], %s, %s, %s, %s)"
    before = fabric.count("memory_embeddings")
    bad: list[tuple[Any, ...]] = [
        (fresh, MODEL, VERSION, [Vector([1.0])], [hashes[i] for i in fresh]),  # lengths differ
        ([fresh[0], fresh[0]], MODEL, VERSION, [Vector([1.0])] * 2, [hashes[fresh[0]]] * 2),
        (fresh, None, VERSION, [Vector([1.0])] * 3, [hashes[i] for i in fresh]),  # no model
    ]
    for args in bad:
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(store, args)
    # an unknown record fails the whole call: the known ones are not stored either
    with pytest.raises(psycopg.errors.NoDataFound):
        conn.execute(
            store,
            (
                [fresh[0], str(uuid.uuid4())],
                MODEL,
                VERSION,
                [Vector([1.0])] * 2,
                [hashes[fresh[0]], "x"],
            ),
        )
    assert fabric.count("memory_embeddings") == before
    # content that is not the record's: that one is refused (stored = false), the rest stored
    answer = conn.execute(
        store,
        (
            fresh,
            MODEL,
            VERSION,
            [Vector([0.25, 0.5])] * 3,
            [hashes[fresh[0]], "sha256:other", hashes[fresh[2]]],
        ),
    ).fetchall()
    assert [(str(m), s) for m, s in answer] == [
        (fresh[0], True),
        (fresh[1], False),
        (fresh[2], True),
    ]
    assert fabric.count("memory_embeddings") == before + 2
    assert fabric.count("memory_embeddings", f"memory_id = '{fresh[1]}'") == 0
    # the single call refuses the same record with 55000
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        conn.execute(
            "SELECT fabric_api.store_embedding(%s, %s, %s, %s, 'sha256:other')",
            (fresh[1], MODEL, VERSION, Vector([0.25, 0.5])),
        )
    stored = one(
        fabric.su(),
        "SELECT embedding::text FROM fabric.memory_embeddings WHERE memory_id = %s",
        fresh[0],
    )
    assert stored == "[0.25,0.5]"


def test_the_jsonb_feeds_of_0_3_are_gone(fabric: Fabric) -> None:
    """Deprecated in 0.4 for the row feeds and removed in 0.11 (docs/operations.md, "Changing
    the SQL API"): only the row feeds are left."""
    names = {
        name
        for (name,) in fabric.su()
        .execute(
            "SELECT p.proname FROM pg_proc p"
            " WHERE p.pronamespace = 'fabric_api'::regnamespace AND p.proname LIKE 'projection_%'"
        )
        .fetchall()
    }
    assert names >= {"projection_events_v2", "projection_records_v2", "projection_snapshot_v2"}
    assert not names & {"projection_events", "projection_records", "projection_snapshot"}


# --- the SDK --------------------------------------------------------------------------------------


def test_the_sdk_reads_rows_and_stores_binary_vectors(fabric: Fabric) -> None:
    ids = populate(fabric)
    hashes = dict(
        fabric.su()
        .execute("SELECT memory_id::text, content_hash FROM fabric.memory_records")
        .fetchall()
    )
    with SdkFabric(fabric.url, max_size=1) as mf:
        projector = mf.projector("mf_projector")
        events = projector.projection_events_v2("graph", 5)
        assert len(events) == 5 and isinstance(events[0]["event_id"], uuid.UUID)
        records = {
            str(r["memory_id"]): r for r in projector.projection_records_v2(ids[:2], MODEL, VERSION)
        }
        assert sorted(records) == sorted(ids[:2])  # in memory_id order, not the order asked
        assert isinstance(records[ids[0]]["embedding"], Vector)  # even positions have one
        assert records[ids[1]]["embedding"] is None
        page = projector.projection_snapshot_v2(limit=3, model=MODEL, model_version=VERSION)
        assert len(page) == 3
        answer = projector.store_embeddings(
            [ids[1]], MODEL, VERSION, [[0.5, 1.5]], [hashes[ids[1]]]
        )
        assert [(str(r["memory_id"]), r["stored"]) for r in answer] == [(ids[1], True)]
        assert projector.store_embedding(ids[3], MODEL, VERSION, [1.0, 2.0], hashes[ids[3]])

    async def flow() -> tuple[int, list[bool]]:
        async with AsyncFabric(fabric.url, max_size=1) as amf:
            projector = amf.projector("mf_projector")
            events = await projector.projection_events_v2("graph", 4)
            await projector.projection_records_v2(ids[:1], MODEL, VERSION)
            await projector.projection_snapshot_v2(limit=2)
            answer = await projector.store_embeddings(
                [ids[5]], MODEL, VERSION, [[2.0, 1.0]], [hashes[ids[5]]]
            )
            assert await projector.store_embedding(ids[7], MODEL, VERSION, [3.0], hashes[ids[7]])
            return len(events), [r["stored"] for r in answer]

    assert asyncio.run(flow()) == (4, [True])
    assert (
        one(
            fabric.su(),
            "SELECT embedding::text FROM fabric.memory_embeddings WHERE memory_id = %s",
            ids[1],
        )
        == "[0.5,1.5]"
    )


def test_events_rows_read_ahead_of_the_cursor_but_never_behind_it(fabric: Fabric) -> None:
    populate(fabric)
    conn = fabric.connect("mf_projector")
    feed = (
        "SELECT xid::text, event_id"
        " FROM fabric_api.projection_events_v2('qdrant', 10000, %s::xid8, %s)"
    )
    everything = conn.execute(feed, (None, None)).fetchall()
    ahead = conn.execute(feed, everything[9]).fetchall()
    assert ahead == everything[10:]  # after the 10th event read, the cursor unmoved
    assert one(fabric.su(), "SELECT last_xid::text FROM fabric.projection_cursors"
               " WHERE projection = 'qdrant'") == "0"  # fmt: skip
    conn.execute("SELECT fabric_api.set_projection_cursor('qdrant', %s::xid8, %s)", everything[19])
    assert conn.execute(feed, everything[9]).fetchall() == everything[20:]  # the cursor wins
    assert conn.execute(feed, everything[29]).fetchall() == everything[30:]


def test_store_embeddings_takes_at_most_10000(fabric: Fabric) -> None:
    conn = fabric.connect("mf_projector")
    register_vector(conn)
    ids = [str(uuid.uuid4()) for _ in range(10001)]
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        conn.execute(
            "SELECT * FROM fabric_api.store_embeddings(%s::uuid[], 'm', 'v1', %s, %s)",
            (ids, [Vector([1.0])] * len(ids), ["sha256:x"] * len(ids)),
        )
    assert fabric.count("memory_embeddings") == 0


def rebuild_notes(fabric: Fabric) -> dict[str, Any]:
    rows = fabric.session().execute(
        "SELECT projection, rebuild_started_at FROM fabric.projection_cursors ORDER BY 1"
    )
    return dict(rows.fetchall())  # type: ignore[arg-type]


def test_a_rebuild_is_noted_until_the_rewind_that_ends_it(fabric: Fabric) -> None:
    conn = fabric.connect("mf_projector")
    call = "SELECT fabric_api.unfinished_projection_rebuild(%s)"
    assert conn.execute(call, ("qdrant",)).fetchone() == (None,)
    began = conn.execute("SELECT fabric_api.begin_projection_rebuild('qdrant')").fetchone()[0]  # type: ignore[index]
    assert began["projection"] == "qdrant"
    noted = conn.execute(call, ("qdrant",)).fetchone()[0]  # type: ignore[index]
    assert noted == datetime.fromisoformat(began["rebuild_started_at"])
    assert rebuild_notes(fabric)["graph"] is None  # one projection's note only
    cursor = (
        fabric.session()
        .execute(
            "SELECT last_xid::text, last_event_id FROM fabric.projection_cursors"
            " WHERE projection = 'qdrant'"
        )
        .fetchone()
    )
    # a cursor moved forward does not end a rebuild (a projector running meanwhile)
    conn.execute(
        "SELECT fabric_api.set_projection_cursor('qdrant', '1'::xid8, %s)", (uuid.uuid4(),)
    )
    assert conn.execute(call, ("qdrant",)).fetchone() == (noted,)
    # the rewind below the snapshot ends it
    conn.execute("SELECT fabric_api.set_projection_cursor('qdrant', %s::xid8, %s, true)", cursor)
    assert conn.execute(call, ("qdrant",)).fetchone() == (None,)


@pytest.mark.parametrize("login", ["mf_agent_a", "mf_committer", "mf_tracer", "mf_auditor"])
def test_only_projectors_note_a_rebuild(fabric: Fabric, login: str) -> None:
    conn = fabric.connect(login)
    for query in (
        "SELECT fabric_api.begin_projection_rebuild('qdrant')",
        "SELECT fabric_api.unfinished_projection_rebuild('qdrant')",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute(query)
        assert refused.value.sqlstate == "42501"
    assert set(rebuild_notes(fabric).values()) == {None}


@pytest.mark.parametrize("projection", ["trace", "vectors", None])
def test_a_rebuild_note_names_a_projection(fabric: Fabric, projection: str | None) -> None:
    conn = fabric.connect("mf_projector")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute("SELECT fabric_api.begin_projection_rebuild(%s)", (projection,))
    assert refused.value.sqlstate == "22023"
    assert set(rebuild_notes(fabric).values()) == {None}


@pytest.mark.parametrize(
    ("xid", "rewind"), [("18446744073709551615", False), ("1", True)], ids=["ahead", "rewind"]
)
def test_a_projector_reads_the_trace_cursor_and_never_moves_it(
    fabric: Fabric, xid: str, rewind: bool
) -> None:
    """The tracer's cursor is moved only by the tracer (set_trace_cursor, to a served
    event): set_projection_cursor answers where it stands and leaves it there."""
    before = fabric.cursor("trace")
    answer = (
        fabric.connect("mf_projector")
        .execute(
            "SELECT fabric_api.set_projection_cursor('trace', %s::xid8, %s, %s)",
            (xid, uuid.uuid4(), rewind),
        )
        .fetchone()
    )
    assert answer is not None
    assert answer[0] == {"projection": "trace", "xid": before[0], "event_id": before[1]}
    assert fabric.cursor("trace") == before
