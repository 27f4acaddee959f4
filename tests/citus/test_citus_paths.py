"""On a Citus cluster, the paths that are not a tenant's fabric_api call: the auditor's
relations (fabric_audit.*, definer functions that run on the coordinator and read the
tenant's shards), the LangGraph checkpointer's tables (plain tables of the coordinator,
row-level security by login), and the DDL guard (the coordinator's event triggers) against
a login that was wrongly granted fabric_owner.

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from test_citus_fabric import form

from citus_cluster import Cluster, cluster

__all__ = ["cluster"]  # the session fixture, used by name

WINDOW = ("2000-01-01", "2100-01-01")


# -- the auditor's relations -----------------------------------------------------------------


def _audit(c: Cluster, query: str, *args: Any) -> list[Any]:
    with c.connect("mf_auditor") as auditor:
        return auditor.execute(query, args).fetchall()  # type: ignore[arg-type]


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_the_auditor_reads_one_tenant_at_a_time(cluster: Cluster, pair: str) -> None:
    first, second = getattr(cluster, pair)
    mine = form(cluster, first, f"audited {pair} note of {first}")
    theirs = form(cluster, second, f"audited {pair} note of {second}")
    events = _audit(
        cluster,
        "SELECT tenant_memory FROM (SELECT memory_id::text AS tenant_memory "
        "FROM fabric_audit.events(%s, %s, %s)) e WHERE tenant_memory IS NOT NULL",
        first,
        *WINDOW,
    )
    seen = {r[0] for r in events}
    assert mine in seen and theirs not in seen
    mine_history = _audit(
        cluster, "SELECT consolidation_state FROM fabric_audit.record_history(%s, %s)", first, mine
    )
    assert mine_history == [("raw",)]
    # another tenant's record named under this tenant: nothing, on its worker or another
    assert _audit(cluster, "SELECT * FROM fabric_audit.record_history(%s, %s)", first, theirs) == []
    assert _audit(cluster, "SELECT * FROM fabric_audit.lineage(%s, %s)", first, theirs) == []


def test_the_auditor_reads_no_fabric_table_directly(cluster: Cluster) -> None:
    with (
        cluster.connect("mf_auditor") as auditor,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        auditor.execute("SELECT count(*) FROM fabric.memory_records")


def test_an_audit_call_without_the_auditor_role_is_refused(cluster: Cluster) -> None:
    first, _ = cluster.apart
    with (
        cluster.connect("mf_agent_a") as agent,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        agent.execute("SELECT * FROM fabric_audit.events(%s, %s, %s)", (first, *WINDOW))


# -- the LangGraph checkpointer's tables -----------------------------------------------------


def test_the_checkpoint_tables_are_plain_tables_of_the_coordinator(cluster: Cluster) -> None:
    with cluster.connect() as su:
        distributed = su.execute(
            "SELECT logicalrelid::regclass::text FROM pg_dist_partition "
            "WHERE logicalrelid::regclass::text LIKE 'langgraph.%'"
        ).fetchall()
        tables = su.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'langgraph'::regnamespace "
            "AND relkind IN ('r', 'p') AND relrowsecurity"
        ).fetchone()
    assert distributed == []
    assert tables is not None and tables[0] >= 3


def _metadata(c: Cluster, service: str) -> Jsonb:
    return Jsonb({"service": service, "tenant_id": c.apart[0], "subject_id": "user-8842"})


def _checkpoint(c: Cluster, login: str, thread: str) -> None:
    with c.connect(login, autocommit=False) as conn:
        conn.execute(
            "INSERT INTO langgraph.checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
            "checkpoint, metadata) VALUES (%s, '', %s, '{}', %s)",
            (thread, str(uuid.uuid4()), _metadata(c, login)),
        )
        conn.commit()


def test_a_checkpoint_service_sees_its_own_threads_only(cluster: Cluster) -> None:
    mine, theirs = f"mf_service:{uuid.uuid4()}", f"mf_service_b:{uuid.uuid4()}"
    _checkpoint(cluster, "mf_service", mine)
    _checkpoint(cluster, "mf_service_b", theirs)
    with cluster.connect("mf_service") as service:
        threads = {r[0] for r in service.execute("SELECT thread_id FROM langgraph.checkpoints")}
    assert mine in threads and theirs not in threads
    with (
        cluster.connect("mf_service", autocommit=False) as service,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        service.execute(
            "INSERT INTO langgraph.checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
            "checkpoint, metadata) VALUES (%s, '', %s, '{}', %s)",
            (f"mf_service_b:{uuid.uuid4()}", str(uuid.uuid4()), _metadata(cluster, "mf_service_b")),
        )


def test_an_agent_reads_no_checkpoint(cluster: Cluster) -> None:
    with (
        cluster.connect("mf_agent_a") as agent,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        agent.execute("SELECT count(*) FROM langgraph.checkpoints")


# -- the DDL guard ---------------------------------------------------------------------------

# Each probe reads a table (%(rel)s): fabric.memory_records on the coordinator, and each of
# its shards on the workers.
POLICIES = (
    "SELECT array_agg(polname ORDER BY polname) FROM pg_policy WHERE polrelid = %(rel)s::regclass"
)
TRIGGERS = (
    "SELECT array_agg(tgname ORDER BY tgname) FROM pg_trigger "
    "WHERE tgrelid = %(rel)s::regclass AND NOT tgisinternal"
)
GRANTS = "SELECT has_table_privilege('mf_agent_a', %(rel)s::regclass, 'SELECT')"

# (statement, probe) — classes of the single-node guard's tests, on a distributed table
GUARDED = {
    "grant select on a distributed table": (
        "GRANT SELECT ON fabric.memory_records TO mf_agent_a",
        GRANTS,
    ),
    "drop a policy of a distributed table": (
        "DROP POLICY select_same_tenant ON fabric.memory_records",
        POLICIES,
    ),
    "create a policy on a distributed table": (
        "CREATE POLICY open ON fabric.memory_records FOR SELECT USING (true)",
        POLICIES,
    ),
    "drop a trigger of a distributed table": (
        "DROP TRIGGER _900_emit ON fabric.memory_records",
        TRIGGERS,
    ),
    "disable the triggers of a distributed table": (
        "ALTER TABLE fabric.memory_records DISABLE TRIGGER USER",
        "SELECT array_agg(tgenabled ORDER BY tgname) FROM pg_trigger "
        "WHERE tgrelid = %(rel)s::regclass AND NOT tgisinternal",
    ),
    "a rule on the outbox": (
        "CREATE RULE swallow AS ON INSERT TO fabric.events DO INSTEAD NOTHING",
        "SELECT count(*) FROM pg_rewrite WHERE ev_class = 'fabric.events'::regclass "
        "AND %(rel)s::text IS NOT NULL",
    ),
}


@pytest.fixture
def leaked_owner(cluster: Cluster) -> Iterator[str]:
    """A login that was (wrongly) granted fabric_owner, on every node (Citus propagates the
    role and the grant from the coordinator); dropped afterwards."""
    login = f"mf_leak_{uuid.uuid4().hex[:8]}"
    with cluster.connect() as su:
        su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        su.execute(sql.SQL("GRANT fabric_owner TO {}").format(sql.Identifier(login)))
    yield login
    with cluster.connect() as su:
        su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login)))


def _probe_every_node(c: Cluster, probe: str) -> list[Any]:
    """The probe of fabric.memory_records on the coordinator, then of each of its shards on
    the workers."""
    with c.connect() as su:
        found = [su.execute(probe, {"rel": "fabric.memory_records"}).fetchone()]  # type: ignore[arg-type]
    if "%(rel)s::regclass" not in probe:  # a probe of a coordinator's table (the outbox)
        return found
    for host, port in c.workers:
        with c.worker(host, port) as w:
            w.execute("SET citus.override_table_visibility TO off")
            shards = w.execute(
                "SELECT c.oid::regclass::text FROM pg_class c "
                "WHERE c.relnamespace = 'fabric'::regnamespace "
                "AND c.relname ~ '^memory_records_[0-9]+$' ORDER BY c.relname"
            ).fetchall()
            assert shards
            found += [w.execute(probe, {"rel": r[0]}).fetchone() for r in shards]  # type: ignore[arg-type]
    return found


@pytest.mark.parametrize("set_role", [False, True], ids=["inherited", "set-role"])
@pytest.mark.parametrize("case", list(GUARDED))
def test_the_guard_refuses_a_leaked_owner_on_the_cluster(
    cluster: Cluster, leaked_owner: str, case: str, set_role: bool
) -> None:
    statement, probe = GUARDED[case]
    before = _probe_every_node(cluster, probe)
    with cluster.connect(leaked_owner) as conn:
        # Citus refuses trigger DDL on a distributed table unless this is on: the leaked
        # owner turns it on, so what refuses is the guard
        conn.execute("SET citus.enable_unsafe_triggers TO on")
        if set_role:
            conn.execute("SET ROLE fabric_owner")
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
            conn.execute(statement)  # type: ignore[arg-type]
    assert "migration role" in str(info.value)
    assert _probe_every_node(cluster, probe) == before


def test_a_worker_refuses_ddl_on_a_distributed_table_sent_to_it_directly(
    cluster: Cluster, leaked_owner: str
) -> None:
    host, port = cluster.workers[0]
    with cluster.worker(host, port) as su:
        before = su.execute(POLICIES, {"rel": "fabric.memory_records"}).fetchone()
    with (
        psycopg.connect(
            cluster.url, host=host, port=port, user=leaked_owner, autocommit=True
        ) as conn,
        pytest.raises(psycopg.errors.Error),
    ):
        conn.execute("DROP POLICY select_same_tenant ON fabric.memory_records")
    with cluster.worker(host, port) as su:
        assert su.execute(POLICIES, {"rel": "fabric.memory_records"}).fetchone() == before
