"""The temporal tier: time-series measurements in a tenant-first, partitioned table
(fabric.measurements), written by producers, read by agents through an authorized, audited
call aggregated by window, kept by retention class; decay's window-closure summaries are one
more producer's series."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import PROFILE_WIDE, Fabric
from memfabric.worker import erase, run_decay_once

pytestmark = pytest.mark.rollback

TOOLS = ["tool:memory-propose", "tool:memory-recall", "tool:temporal-read"]
DAY = {"from": "2026-08-16T00:00:00Z", "until": "2026-08-17T00:00:00Z"}


def record(fabric: Fabric, points: Any, tenant: str = "acme", login: str = "mf_workflow") -> Any:
    return fabric.call(
        login, "SELECT fabric_api.record_measurements(%s, %s)", tenant, Jsonb(points)
    )


def read(fabric: Fabric, request: dict[str, Any], login: str = "mf_agent_a") -> dict[str, Any]:
    return fabric.call(login, "SELECT fabric_api.read_measurements(%s)", Jsonb(request))  # type: ignore[no-any-return]


def point(at: str, value: float, **extra: Any) -> dict[str, Any]:
    return {"series": "trading.fill_latency_ms", "at": at, "value": value, **extra}


@pytest.fixture
def reader(fabric: Fabric) -> uuid.UUID:
    """com-agt-003 allowed tool:temporal-read in all three layers; its run for user-8842."""
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.register_agent('com-agt-003', 'mf_agent_a', %s, %s)",
        Jsonb(PROFILE_WIDE),
        TOOLS,
    )
    fabric.call("mf_admin", "SELECT fabric_api.enable_agent('acme', 'com-agt-003', %s)", TOOLS)
    return fabric.open_run(tools=TOOLS)


@pytest.fixture
def series(fabric: Fabric) -> None:
    record(
        fabric,
        [
            point("2026-08-16T10:05:00Z", 10),
            point("2026-08-16T10:35:00Z", 20),
            point("2026-08-16T11:10:00Z", 40),
            point("2026-08-16T11:20:00Z", 60, subject_id="user-8842"),
            point("2026-08-16T11:30:00Z", 1000, subject_id="user-9999"),  # another subject's
            point("2026-08-16T11:40:00Z", 5000, business_instance_id="bi-eu"),  # another instance
            point("2026-08-17T00:00:00Z", 7),  # outside [from, until)
        ],
    )
    enable_in_globex(fabric)
    record(fabric, [point("2026-08-16T10:06:00Z", 999)], tenant="globex")


def enable_in_globex(fabric: Fabric) -> None:
    """The acme producer (wf-billing-001) enabled in globex as well."""
    fabric.call("mf_admin", "SELECT fabric_api.enable_agent('globex', 'wf-billing-001', '{}')")


@pytest.mark.parametrize(
    ("aggregate", "values"),
    [
        ("avg", [15.0, 50.0]),
        ("min", [10.0, 40.0]),
        ("max", [20.0, 60.0]),
        ("sum", [30.0, 100.0]),
        ("count", [2.0, 2.0]),
        ("first", [10.0, 40.0]),
        ("last", [20.0, 60.0]),
    ],
)
def test_an_agent_reads_its_tenant_and_subject_aggregated_by_window(
    fabric: Fabric, reader: uuid.UUID, series: None, aggregate: str, values: list[float]
) -> None:
    answer = read(
        fabric,
        {
            "run_id": str(reader),
            "series": "trading.fill_latency_ms",
            "window": "1 hour",
            "aggregate": aggregate,
            **DAY,
        },
    )
    assert answer["status"] == "served"
    points = answer["points"]
    assert [p["window_start"] for p in points] == [
        "2026-08-16T10:00:00+00:00",
        "2026-08-16T11:00:00+00:00",
    ]
    assert [p["value"] for p in points] == values
    assert [p["samples"] for p in points] == [2, 2]


def test_a_business_instance_is_read_only_when_named(
    fabric: Fabric, reader: uuid.UUID, series: None
) -> None:
    answer = read(
        fabric,
        {
            "run_id": str(reader),
            "series": "trading.fill_latency_ms",
            "window": "1 day",
            "aggregate": "sum",
            "business_instance_id": "bi-eu",
            **DAY,
        },
    )
    assert [p["value"] for p in answer["points"]] == [5000.0]


def test_every_read_is_audited_without_values(
    fabric: Fabric, reader: uuid.UUID, series: None
) -> None:
    read(
        fabric,
        {"run_id": str(reader), "series": "trading.fill_latency_ms", "window": "1 hour", **DAY},
    )
    (event,) = fabric.events("event_type = 'memory.temporal.read'")
    payload = event["payload"]
    assert payload["agent_id"] == "com-agt-003" and payload["windows_served"] == 2
    assert payload["series"] == "trading.fill_latency_ms" and "points" not in payload
    assert event["tenant_id"] == "acme"


def test_a_read_without_the_tool_is_denied_and_reads_nothing(fabric: Fabric, series: None) -> None:
    run = fabric.open_run()  # memory tools only
    before = len(fabric.events("event_type = 'memory.temporal.read'"))
    answer = read(
        fabric, {"run_id": str(run), "series": "trading.fill_latency_ms", "window": "1 hour", **DAY}
    )
    assert answer["status"] == "denied" and answer["points"] == []
    assert "tool:temporal-read" in answer["reason"]
    assert len(fabric.events("event_type = 'memory.temporal.read'")) == before
    (denial,) = fabric.events("event_type = 'agent.tool.unauthorized'")
    assert denial["payload"]["tool"] == "tool:temporal-read"


@pytest.mark.parametrize(
    "change",
    [
        {"window": "1 fortnight"},
        {"window": "0 hours"},
        {"aggregate": "median"},
        {"from": "2026-08-17T00:00:00Z"},  # until not after from
        {"window": "1 second", "until": "2026-09-16T00:00:00Z"},  # too many windows
        {"series": 7},
        {"values": True},
    ],
    ids=["window-unit", "window-zero", "aggregate", "empty-range", "too-many", "series", "key"],
)
def test_a_malformed_read_is_refused_and_writes_nothing(
    fabric: Fabric, reader: uuid.UUID, change: dict[str, Any]
) -> None:
    request = {"run_id": str(reader), "series": "trading.fill_latency_ms", "window": "1 hour"}
    before = fabric.counts()
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        read(fabric, {**request, **DAY, **change})
    assert fabric.counts() == before


@pytest.mark.parametrize(
    ("points", "sqlstate"),
    [
        (
            [point("2026-08-16T10:00:00Z", 1), {"series": "x.y", "at": "yesterday", "value": 1}],
            "22023",
        ),
        (
            [
                point("2026-08-16T10:00:00Z", 1),
                {"series": "x.y", "at": "2026-08-16T10:00Z", "value": "1"},
            ],
            "22023",
        ),
        ([point("2026-08-16T10:00:00Z", 1, colour="red")], "22023"),
        ([{"series": "NoDots", "at": "2026-08-16T10:00:00Z", "value": 1}], "23514"),
        ([point("2026-08-16T10:00:00Z", 1, retention_class="forever")], "23514"),
        ([], "22023"),
    ],
    ids=["at", "value", "key", "series-name", "retention", "empty"],
)
def test_a_bad_point_refuses_the_whole_write(
    fabric: Fabric, points: list[Any], sqlstate: str
) -> None:
    with pytest.raises(psycopg.Error) as caught:
        record(fabric, points)
    assert caught.value.sqlstate == sqlstate
    assert fabric.count("measurements") == 0


def test_only_an_enabled_producer_writes_a_tenants_series(fabric: Fabric) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        record(fabric, [point("2026-08-16T10:00:00Z", 1)], tenant="globex")  # not enabled there
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        record(fabric, [point("2026-08-16T10:00:00Z", 1)], login="mf_agent_a")  # not a producer
    assert fabric.count("measurements") == 0


def test_the_table_is_tenant_first_partitioned_and_row_level_secured(fabric: Fabric) -> None:
    row = (
        fabric.session(None)
        .execute(
            "SELECT c.relkind::text, c.relforcerowsecurity, "
            "(SELECT attname FROM pg_attribute WHERE attrelid = c.oid AND attnum = 1) "
            "FROM pg_class c WHERE c.oid = 'fabric.measurements'::regclass"
        )
        .fetchone()
    )
    assert row == ("p", True, "tenant_id")


def test_retention_keeps_durable_points_and_drops_operational_ones_after_the_window(
    fabric: Fabric,
) -> None:
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb({"operational_window": "30 days"}),
    )
    record(
        fabric,
        [
            point("2026-08-01T00:00:00Z", 1),
            point("2026-08-20T00:00:00Z", 2),
            point("2026-08-01T00:00:00Z", 3, retention_class="durable"),
        ],
    )
    enable_in_globex(fabric)
    record(fabric, [point("2026-08-01T00:00:00Z", 9)], tenant="globex")
    removed = fabric.call(
        "mf_committer", "SELECT fabric_api.run_temporal_retention('2026-09-05T00:00:00Z')"
    )
    assert removed == 1  # acme's 08-01 operational point; globex keeps its 90-day default
    kept = (
        fabric.session(None)
        .execute("SELECT value FROM fabric.measurements ORDER BY value")
        .fetchall()
    )
    assert [v for (v,) in kept] == [2.0, 3.0, 9.0]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.call("mf_agent_a", "SELECT fabric_api.run_temporal_retention()")


def test_decay_summaries_are_a_series_agents_read(fabric: Fabric, reader: uuid.UUID) -> None:
    with fabric.su() as su:
        su.execute(
            "INSERT INTO fabric.temporal_summaries "
            "(tenant_id, day, tier, subject_id, retention_class, records) VALUES "
            "('acme', '2026-08-16', 'episodic', 'user-8842', 'operational', 3), "
            "('acme', '2026-08-16', 'episodic', 'user-9999', 'operational', 5), "
            "('globex', '2026-08-16', 'episodic', NULL, 'operational', 7)"
        )
    answer = read(
        fabric,
        {
            "run_id": str(reader),
            "series": "memory.episodic.window_closed",
            "window": "1 day",
            "aggregate": "sum",
            **DAY,
        },
    )
    assert [(p["window_start"], p["value"]) for p in answer["points"]] == [
        ("2026-08-16T00:00:00+00:00", 3.0)
    ]


@pytest.mark.clone  # erasure reads now() (one value in a transaction)
def test_a_subject_erasure_removes_the_subjects_series(fabric: Fabric, series: None) -> None:
    fabric.form(fabric.open_run(subject="user-9999"), "an episode of the subject")
    approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', 'user-9999', 'art. 17')",
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    result = erase(fabric.connect("mf_committer"), str(approval))
    assert fabric.count("measurements", "subject_id = 'user-9999'") == 0
    assert fabric.count("measurements", "subject_id = 'user-8842'") == 1  # another subject's
    assert "fabric.measurements" in result["vacuum"]


# The months below are in the past of the database's migrate (which made the partitions of
# its own month and the three after): their points first land in the default partition.
def placed(fabric: Fabric) -> list[tuple[str, float]]:
    """(partition, value) of every point, by value."""
    rows = fabric.session(None).execute(
        "SELECT tableoid::regclass::text, value FROM fabric.measurements ORDER BY value"
    )
    return [(str(t), float(v)) for t, v in rows.fetchall()]


def partitions(fabric: Fabric) -> dict[str, int]:
    """Each monthly partition of fabric.measurements and its relfilenode (a TRUNCATE gives a
    partition a new one; row deletes do not)."""
    rows = fabric.session(None).execute(
        "SELECT c.relname, c.relfilenode FROM pg_inherits i JOIN pg_class c"
        " ON c.oid = i.inhrelid WHERE i.inhparent = 'fabric.measurements'::regclass"
        " AND c.relname <> 'measurements_default'"
    )
    return {str(name): int(node) for name, node in rows.fetchall()}


def test_points_are_placed_in_their_months_partition_and_the_default_stays_empty(
    fabric: Fabric,
) -> None:
    this = datetime.now(UTC)
    ahead = datetime(this.year + (this.month + 2) // 12, (this.month + 2) % 12 + 1, 1)
    assert f"measurements_{this:%Y_%m}" in partitions(fabric)  # made ahead by migrate
    record(fabric, [point(f"{this:%Y-%m}-02T00:00:00Z", 1)])
    assert placed(fabric) == [(f"fabric.measurements_{this:%Y_%m}", 1.0)]
    enable_in_globex(fabric)
    durable = {"retention_class": "durable"}
    record(fabric, [point("2026-06-15T00:00:00Z", 2, **durable),
                    point("2026-07-31T23:59:59.5Z", 3, **durable)])  # fmt: skip
    record(fabric, [point("2026-07-01T00:00:00Z", 4, **durable)], tenant="globex")
    assert fabric.count("measurements_default") == 3  # a backfill: no partition yet
    # the decay worker's retention pass makes the partitions and moves the strays in
    assert fabric.call("mf_committer", "SELECT fabric_api.run_temporal_retention()") == 0
    assert fabric.count("measurements_default") == 0
    assert placed(fabric) == [
        (f"fabric.measurements_{this:%Y_%m}", 1.0),
        ("fabric.measurements_2026_06", 2.0),
        ("fabric.measurements_2026_07", 3.0),
        ("fabric.measurements_2026_07", 4.0),
    ]
    moved = fabric.session(None).execute(
        "SELECT tenant_id, at, producer, retention_class FROM fabric.measurements WHERE value = 3"
    )
    assert moved.fetchone() == (  # every column kept by the move
        "acme",
        datetime(2026, 7, 31, 23, 59, 59, 500000, tzinfo=UTC),
        "wf-billing-001",
        "durable",
    )
    owned = fabric.session(None).execute(
        "SELECT bool_and(has_table_privilege('fabric_maintainer', relid, 'MAINTAIN')),"
        " bool_and(pg_get_userbyid(c.relowner) = 'fabric_owner')"
        " FROM pg_partition_tree('fabric.measurements') t JOIN pg_class c ON c.oid = t.relid"
    )
    assert owned.fetchone() == (True, True)  # the maintenance login may VACUUM them all
    assert f"measurements_{ahead:%Y_%m}" in partitions(fabric)  # three months ahead


@pytest.mark.clone  # a TRUNCATE in the transaction that made the table keeps its relfilenode
def test_retention_empties_whole_months_past_retention_and_deletes_rows_otherwise(
    fabric: Fabric,
) -> None:
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb({"operational_window": "30 days"}),
    )
    enable_in_globex(fabric)  # globex keeps the 90-day default
    record(
        fabric,
        [
            point("2026-06-15T00:00:00Z", 1),  # June: every point due on 10-05 ...
            point("2026-07-10T00:00:00Z", 2),  # July: due, beside a durable point
            point("2026-07-20T00:00:00Z", 3, retention_class="durable"),
            point("2026-08-20T00:00:00Z", 4),  # August: due
            point("2026-09-01T00:00:00Z", 5),  # September: due, beside one that is not
            point("2026-09-20T00:00:00Z", 6),
        ],
    )
    record(fabric, [point("2026-06-20T00:00:00Z", 7)], tenant="globex")  # ... globex's too
    fabric.call("mf_committer", "SELECT fabric_api.run_temporal_retention('2026-06-01')")
    before = partitions(fabric)
    assert fabric.count("measurements_default") == 0
    removed = fabric.call(
        "mf_committer", "SELECT fabric_api.run_temporal_retention('2026-10-05T00:00:00Z')"
    )
    assert removed == 5  # 1 and 7 (June), 4 (August) by month; 2 and 5 row by row
    assert placed(fabric) == [
        ("fabric.measurements_2026_07", 3.0),
        ("fabric.measurements_2026_09", 6.0),
    ]
    after = partitions(fabric)
    emptied = {m for m in before if after[m] != before[m]}
    assert emptied == {"measurements_2026_06", "measurements_2026_08"}


@pytest.mark.clone  # two sessions
def test_retention_does_not_wait_for_a_reader_of_a_due_month(fabric: Fabric) -> None:
    record(fabric, [point("2026-05-01T00:00:00Z", 1), point("2026-05-02T00:00:00Z", 2)])
    fabric.call("mf_committer", "SELECT fabric_api.run_temporal_retention('2026-05-01')")
    before = partitions(fabric)["measurements_2026_05"]
    reader = fabric.connect(None, autocommit=False)
    reader.execute("SELECT count(*) FROM fabric.measurements_2026_05").fetchone()  # holds it
    try:
        committer = fabric.connect("mf_committer")
        # waiting for the reader would be cancelled (57014), failing the test, not hanging it
        committer.execute("SET statement_timeout = '5s'")
        removed = committer.execute(
            "SELECT fabric_api.run_temporal_retention('2026-10-05T00:00:00Z')"
        ).fetchone()
    finally:
        reader.rollback()
    assert removed == (2,)  # row by row: the month was not emptied under its reader
    assert partitions(fabric)["measurements_2026_05"] == before
    assert placed(fabric) == []


@pytest.mark.clone  # two sessions
def test_two_retention_passes_make_a_months_partition_once(fabric: Fabric) -> None:
    record(fabric, [point("2026-04-01T00:00:00Z", 1, retention_class="durable")])
    first = fabric.connect("mf_committer", autocommit=False)
    first.execute("SELECT fabric_api.run_temporal_retention()").fetchone()  # not committed yet
    second = fabric.connect("mf_committer")
    answers: list[Any] = []
    racer = threading.Thread(
        target=lambda: answers.append(
            second.execute("SELECT fabric_api.run_temporal_retention()").fetchone()
        )
    )
    racer.start()
    racer.join(1.0)
    assert racer.is_alive()  # it waits for the first pass's partitions
    first.commit()
    racer.join(30)
    assert answers == [(0,)]  # and finds the month made, its point moved
    assert placed(fabric) == [("fabric.measurements_2026_04", 1.0)]


def test_retention_leaves_a_month_of_a_tenant_the_committer_may_not_prune(
    fabric: Fabric,
) -> None:
    fabric.call("mf_admin", "SELECT fabric_api.create_tenant('initech')")
    fabric.call("mf_admin", "SELECT fabric_api.enable_agent('initech', 'wf-billing-001', '{}')")
    record(fabric, [point("2026-03-01T00:00:00Z", 1)])
    record(fabric, [point("2026-03-02T00:00:00Z", 2)], tenant="initech")
    removed = fabric.call(
        "mf_committer", "SELECT fabric_api.run_temporal_retention('2026-10-05T00:00:00Z')"
    )
    assert removed == 1  # acme's point, row by row: initech is not the committer's to prune
    assert placed(fabric) == [("fabric.measurements_2026_03", 2.0)]


def test_the_decay_worker_runs_retention_and_keeps_the_partitions(fabric: Fabric) -> None:
    record(fabric, [point("2026-05-01T00:00:00Z", 1), point("2026-05-02T00:00:00Z", 2,
                    retention_class="durable")])  # fmt: skip
    result = run_decay_once(fabric.connect("mf_committer"))  # type: ignore[arg-type]
    assert result["measurements_removed"] == 1  # past the 90-day default window
    assert placed(fabric) == [("fabric.measurements_2026_05", 2.0)]
    assert fabric.count("measurements_default") == 0


REFUSED_THROUGH_THE_MARK = [
    "CREATE TABLE fabric.measurements_2031_01 (LIKE fabric.measurements)",
    "CREATE TABLE fabric.spare PARTITION OF fabric.measurements"
    " FOR VALUES FROM ('2031-01-01Z') TO ('2031-02-01Z')",
    "CREATE TABLE fabric.events_2031_01 PARTITION OF fabric.events"
    " FOR VALUES FROM ('2031-01-01Z') TO ('2031-02-01Z')",
    # a month's name over other bounds: the month's own partition could not be made after it
    "CREATE TABLE fabric.measurements_2031_01 PARTITION OF fabric.measurements"
    " FOR VALUES FROM ('2031-01-01Z') TO ('2031-06-01Z')",
    "CREATE TABLE fabric.measurements_2031_01 PARTITION OF fabric.measurements"
    " FOR VALUES FROM ('2030-12-31Z') TO ('2031-02-01Z')",
]


@pytest.mark.clone  # the test makes a function of its own
def test_the_ddl_guard_lets_only_measurement_partitions_through_the_mark(fabric: Fabric) -> None:
    """A committer inside an owner's definer function, the transaction marked as
    fabric.ensure_measurement_partitions marks it: only a measurement partition passes."""
    with fabric.su() as su:
        su.execute(
            "CREATE FUNCTION public.mf_test_owner_ddl(p_ddl text) RETURNS void"
            " LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$"
            " BEGIN PERFORM set_config('fabric.partition_maintenance', 'measurements', true);"
            " EXECUTE p_ddl; END $$"
        )
        su.execute("ALTER FUNCTION public.mf_test_owner_ddl(text) OWNER TO fabric_owner")
        su.execute("GRANT EXECUTE ON FUNCTION public.mf_test_owner_ddl(text) TO mf_committer")
    call = "SELECT public.mf_test_owner_ddl(%s)"
    for ddl in REFUSED_THROUGH_THE_MARK:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="migration role"):
            fabric.call("mf_committer", call, ddl)
    made = "SELECT count(*) FROM pg_class WHERE relname IN ('spare', 'events_2031_01')"
    assert fabric.call(None, made) == 0
    fabric.call(
        "mf_committer",
        call,
        "CREATE TABLE fabric.measurements_2031_01 PARTITION OF fabric.measurements"
        " FOR VALUES FROM ('2031-01-01Z') TO ('2031-02-01Z')",
    )
    assert fabric.call(None, "SELECT to_regclass('fabric.measurements_2031_01')::text")


@pytest.mark.clone  # the session's time zone
def test_partitions_are_made_whatever_the_callers_time_zone(fabric: Fabric) -> None:
    """The guard compares the partition's bounds with its month's as text, in the session's
    time zone on both sides: a committer far from UTC still gets its months made."""
    with fabric.connect("mf_committer") as committer:
        committer.execute("SET TimeZone = 'Pacific/Kiritimati'")  # UTC+14
        committer.execute("SELECT fabric_api.run_temporal_retention('2032-11-30T23:00:00Z')")
    made = fabric.call(
        None,
        "SELECT array_agg(relname::text ORDER BY relname) FROM pg_class"
        " WHERE relname ~ '^measurements_203[23]_[0-9]{2}$'",
    )
    assert made[:4] == ["measurements_2032_11", "measurements_2032_12", "measurements_2033_01",
                        "measurements_2033_02"]  # fmt: skip
