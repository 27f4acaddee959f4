"""A governed write on a Citus cluster commits on the tenant's worker and in the
coordinator's outbox together or not at all, and a projection never hydrates a record from a
worker that has not committed yet (docs/scale-out.md, "Commits across nodes").

The faults are real ones, made on the real cluster:

- the coordinator's own commit refused after the worker's side was done: a SERIALIZABLE
  caller whose transaction PostgreSQL cancels at its commit (a write skew with another
  transaction on a table of the coordinator), which happens after Citus has committed
  (one-phase) or prepared (two-phase) the worker's side;
- a worker whose `COMMIT PREPARED` does not return: the worker waits for a synchronous standby
  it does not have (`synchronous_standby_names` set on that node only, the call's own
  transaction exempt with `SET LOCAL synchronous_commit = local`, which Citus passes on), so
  the coordinator has committed and the worker's prepared transaction is pending for as long
  as the test holds it.

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb
from test_citus_fabric import episode, open_run
from test_citus_reach import reached

from citus_cluster import Cluster, cluster
from memfabric.call import fabric_rows

__all__ = ["cluster"]  # the session fixture, used by name

SERVER = re.compile(r"on server \S+@([^:]+):(\d+) connectionId: \d+")
PROBE = "mf-two-phase-probe"


def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def proposal(c: Cluster, tenant: str, text: str) -> str:
    run = open_run(c, tenant)
    with c.connect("mf_agent_a") as agent:
        row = agent.execute(
            "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(tenant, text)), run)
        ).fetchone()
    assert row is not None and row[0]["status"] == "validated", row
    return str(row[0]["proposal_id"])


def issued(
    c: Cluster, login: str, call: Callable[[psycopg.Connection[Any]], Any]
) -> tuple[list[tuple[str, tuple[str, int]]], Any]:
    """Every command Citus sent to a worker during `call` (autocommit: the call's commit
    included), with the worker, in order; and the call's result."""
    sent: list[tuple[str, tuple[str, int]]] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        m = SERVER.search(diag.message_detail or "")
        primary = diag.message_primary or ""
        if m and primary.startswith("issuing "):
            sent.append((primary.removeprefix("issuing "), (m[1], int(m[2]))))

    with c.connect(login) as conn:
        conn.add_notice_handler(note)
        conn.execute("SET client_min_messages = notice")
        conn.execute("SET citus.log_remote_commands = on")
        result = call(conn)
    return sent, result


def _state(c: Cluster, proposal_id: str) -> dict[str, Any]:
    """What the cluster holds of a proposal's commit: its status and record on the tenant's
    worker, and the events the commit wrote in the coordinator's outbox."""
    with c.connect() as su:
        status, memory_id = su.execute(
            "SELECT status, memory_id FROM fabric.proposals WHERE proposal_id = %s",
            (proposal_id,),
        ).fetchone() or (None, None)
        records = su.execute(
            "SELECT count(*) FROM fabric.memory_records m JOIN fabric.proposals p "
            "ON p.tenant_id = m.tenant_id AND p.memory_id = m.memory_id "
            "WHERE p.proposal_id = %s",
            (proposal_id,),
        ).fetchone()
        events = su.execute(
            "SELECT array_agg(event_type ORDER BY event_type) FROM fabric.events "
            "WHERE proposal_id = %s AND event_type <> 'memory.proposal.validated'",
            (proposal_id,),
        ).fetchone()
    assert records is not None and events is not None
    return {
        "status": status,
        "memory_id": memory_id,
        "records": records[0],
        "events": events[0] or [],
    }


# -- every write call commits two-phase -----------------------------------------------------


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_propose_and_commit_prepare_the_tenants_worker_before_the_coordinator_commits(
    cluster: Cluster, pair: str
) -> None:
    """Citus's own account (`citus.log_remote_commands`): the worker's side of propose and of
    commit is prepared, then committed with COMMIT PREPARED, on the tenant's worker alone. On
    a one-phase commit the worker gets a plain COMMIT instead. A recall, which writes no data
    there, is not made two-phase."""
    for tenant in getattr(cluster, pair):
        home = cluster.placement[tenant]
        run = open_run(cluster, tenant)
        sent, proposed = issued(
            cluster,
            "mf_agent_a",
            lambda conn, t=tenant, r=run: conn.execute(
                "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(t, "two-phase")), r)
            ).fetchone()[0],
        )
        assert proposed["status"] == "validated"
        sent_commit, committed = issued(
            cluster,
            "mf_committer",
            lambda conn, p=proposed: conn.execute(
                "SELECT fabric_api.commit(%s)", (p["proposal_id"],)
            ).fetchone()[0],
        )
        assert committed["memory_id"]
        for commands in (sent, sent_commit):
            assert {node for _, node in commands} == {home}
            texts = [text.rstrip(";") for text, _ in commands]
            prepared = [i for i, t in enumerate(texts) if t.startswith("PREPARE TRANSACTION")]
            finished = [i for i, t in enumerate(texts) if t.startswith("COMMIT PREPARED")]
            assert "COMMIT" not in texts, commands  # no one-phase commit of the worker
            assert prepared and len(finished) == len(prepared), commands
            assert max(prepared) < min(finished), commands
        # a recall writes its event and no data on the worker (it locks the tenant's
        # enablement row): it is left to Citus, which commits it one-phase
        sent_recall, answer = issued(
            cluster,
            "mf_agent_a",
            lambda conn, r=run: conn.execute(
                "SELECT fabric_api.recall(%s)",
                (Jsonb({"run_id": str(r), "tiers": ["episodic"], "limit": 10}),),
            ).fetchone()[0],
        )
        assert answer["status"] == "served"
        assert {node for _, node in sent_recall} == {home}
        assert not [t for t, _ in sent_recall if t.startswith(("PREPARE", "COMMIT PREPARED"))]


# -- a coordinator that fails after the worker's side: neither side stays --------------------


def test_a_coordinator_commit_refused_after_the_workers_side_keeps_neither(
    cluster: Cluster,
) -> None:
    """The caller runs commit inside a SERIALIZABLE transaction that PostgreSQL cancels at its
    commit (40001, a write skew with another transaction on a table of the coordinator): that
    check comes after Citus has finished the worker's side. One-phase, the worker had already
    committed the record, and the outbox lost the record's events; two-phase, the worker's
    prepared transaction is rolled back with the coordinator's."""
    tenant = cluster.apart[0]
    proposal_id = proposal(cluster, tenant, "refused at the coordinator's commit")
    with cluster.connect() as su:
        su.execute("DROP TABLE IF EXISTS public.mf_two_phase_skew")
        su.execute("CREATE TABLE public.mf_two_phase_skew (k text PRIMARY KEY, v integer)")
        su.execute("INSERT INTO public.mf_two_phase_skew VALUES ('x', 0), ('y', 0)")
        su.execute("GRANT SELECT, UPDATE ON public.mf_two_phase_skew TO mf_committer")
    try:
        caller = cluster.connect("mf_committer", autocommit=False)
        other = cluster.connect("mf_committer", autocommit=False)
        with caller, other:
            caller.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            other.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            caller.execute("SELECT v FROM public.mf_two_phase_skew WHERE k = 'x'")
            caller.execute("UPDATE public.mf_two_phase_skew SET v = v + 1 WHERE k = 'y'")
            row = caller.execute("SELECT fabric_api.commit(%s)", (proposal_id,)).fetchone()
            assert row is not None and row[0]["memory_id"]
            other.execute("SELECT v FROM public.mf_two_phase_skew WHERE k = 'y'")
            other.execute("UPDATE public.mf_two_phase_skew SET v = v + 1 WHERE k = 'x'")
            other.commit()  # first to commit: the caller is the pivot, cancelled at its commit
            with pytest.raises(psycopg.errors.SerializationFailure):
                caller.commit()
            caller.rollback()  # the server has finished the abort (and the workers') by now
    finally:
        with cluster.connect() as su:
            su.execute("DROP TABLE IF EXISTS public.mf_two_phase_skew")
    state = _state(cluster, proposal_id)
    assert state == {"status": "validated", "memory_id": None, "records": 0, "events": []}
    # and the proposal commits normally afterwards: nothing was left half-done
    with cluster.connect("mf_committer") as committer:
        row = committer.execute("SELECT fabric_api.commit(%s)", (proposal_id,)).fetchone()
    assert row is not None and row[0]["memory_id"]
    state = _state(cluster, proposal_id)
    assert state["status"] == "committed" and state["records"] == 1
    assert "memory.record.formed" in state["events"]


def test_a_coordinator_killed_after_the_workers_side_keeps_neither(cluster: Cluster) -> None:
    """The coordinator's backend is terminated inside its commit, after Citus has finished
    the worker's side: the commit writes a projected event, so it notifies, and a probe
    holds the coordinator's notify lock (waiting for a standby at its own commit), which a
    commit takes after Citus's pre-commit step and before the commit record. One-phase, the
    worker had committed the record; two-phase, its prepared transaction is rolled back (by
    the dying backend, or by Citus's recovery, which finds no commit record of it)."""
    tenant = cluster.apart[1]
    proposal_id = proposal(cluster, tenant, "killed inside the coordinator's commit")
    info = conninfo_to_dict(cluster.url)
    coordinator = (str(info["host"]), int(info["port"]))
    failed: list[BaseException] = []
    caller = cluster.connect("mf_committer")
    caller.execute("SET synchronous_commit = local")  # its own commit would not wait anyway
    row = caller.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = row[0]

    def commit() -> None:
        try:
            caller.execute("SELECT fabric_api.commit(%s)", (proposal_id,))
        except BaseException as exc:  # the terminated connection: expected
            failed.append(exc)

    def waits_for_the_lock() -> bool:
        with cluster.connect() as su:
            row = su.execute(
                "SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity WHERE pid = %s",
                (pid,),
            ).fetchone()
        return row is not None and row[0] == "Lock:object"

    with commits_held(cluster, coordinator):
        thread = threading.Thread(target=commit, daemon=True)
        thread.start()
        _until(lambda: waits_for_the_lock() or not thread.is_alive(), "the commit to wait")
        assert thread.is_alive(), failed
        with cluster.connect() as su:
            su.execute("SELECT pg_terminate_backend(%s::integer)", (pid,))
        thread.join(60)
    assert failed and isinstance(failed[0], psycopg.OperationalError), failed
    caller.close()

    def gone() -> bool:
        with cluster.connect() as su:
            row = su.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
            return row.fetchone() == (0,)

    _until(gone, "the terminated backend to end")
    with cluster.connect() as su:
        su.execute("SELECT recover_prepared_transactions()")
    state = _state(cluster, proposal_id)
    assert state == {"status": "validated", "memory_id": None, "records": 0, "events": []}


# -- a pending COMMIT PREPARED holds the projection's horizon --------------------------------


@contextmanager
def commits_held(c: Cluster, node: tuple[str, int]) -> Iterator[None]:
    """Every commit on `node` that waits for a synchronous standby waits until the block
    ends (the node has none: `synchronous_standby_names` names one that never comes). A
    transaction that sets `synchronous_commit = local` passes; Citus's `COMMIT PREPARED`, sent
    on its own outside the transaction, waits. A probe commit proves the wait is in force
    (the checkpointer applies the setting a moment after the reload); it notifies, so while
    it waits no other transaction that notifies can end its commit on the node either."""
    host, port = node
    probes: list[threading.Thread] = []

    def probe() -> None:
        with psycopg.connect(
            c.url, host=host, port=port, autocommit=False, application_name=PROBE
        ) as conn:
            # a commit waits only for what it wrote to the WAL: a transactional message
            conn.execute("SELECT pg_logical_emit_message(true, 'memfabric-probe', '')")
            # waiting at its commit, the probe holds the lock that serializes the commits
            # of transactions that notify (on the coordinator: every write of the outbox)
            conn.execute("NOTIFY memfabric_two_phase_probe")
            conn.commit()

    def probe_waits() -> bool:
        with c.worker(host, port) as w:
            waiting = w.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event = 'SyncRep'",
                (PROBE,),
            ).fetchone()
        if waiting and waiting[0]:
            return True
        if not any(p.is_alive() for p in probes):
            probes.append(threading.Thread(target=probe, daemon=True))
            probes[-1].start()
        return False

    with c.worker(host, port) as w:
        w.execute("ALTER SYSTEM SET synchronous_standby_names = 'memfabric_test_no_standby'")
        w.execute("SELECT pg_reload_conf()")
    try:
        _until(probe_waits, "commits to wait on the held node")
        yield
    finally:
        with c.worker(host, port) as w:
            w.execute("ALTER SYSTEM RESET synchronous_standby_names")
            w.execute("SELECT pg_reload_conf()")
        for p in probes:
            p.join(60)
        assert not any(p.is_alive() for p in probes)


def _commit_prepared_waits(c: Cluster, node: tuple[str, int]) -> bool:
    with c.worker(*node) as w:
        row = w.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COMMIT PREPARED %%' "
            "AND wait_event = 'SyncRep'"
        ).fetchone()
    return bool(row and row[0])


def _feed(c: Cluster, after_xid: int) -> tuple[int, list[dict[str, Any]], set[str]]:
    """What a projection reads now, from just after `after_xid`: its horizon, the events, and
    which of the events' records hydrate. In a transaction that commits without waiting for
    a standby, so that the reads pass a held node (the feed writes nothing there)."""
    with c.connect("mf_projector", autocommit=False) as p:
        p.execute("SET LOCAL synchronous_commit = local")
        row = p.execute("SELECT fabric_api.projection_horizon()::text").fetchone()
        assert row is not None
        events = fabric_rows(
            p, "fabric_api.projection_events_v2", "qdrant", 10000, str(after_xid), None
        )
        ids = [str(e["memory_id"]) for e in events if e["memory_id"] is not None]
        rows = fabric_rows(p, "fabric_api.projection_records_v2", ids, "none", "none")
        hydrated = {str(r["memory_id"]) for r in rows}
        p.commit()
    return int(row[0]), events, hydrated


def test_a_projection_never_hydrates_a_record_its_worker_has_not_committed(
    cluster: Cluster,
) -> None:
    """One transaction commits a proposal of a tenant on each worker (Citus commits it
    two-phase, before this change too). The first tenant's worker holds its COMMIT PREPARED:
    the coordinator has committed, the events are below its snapshot's xmin, and that worker
    still shows the records' previous state (none). The projection's horizon stays before
    the transaction until the worker commits; then the events are read and both records
    hydrate."""
    held, free = cluster.apart
    held_node = cluster.placement[held]
    first = proposal(cluster, held, "held by its worker")
    second = proposal(cluster, free, "on the other worker")
    answers: dict[str, str] = {}
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            with cluster.connect("mf_committer", autocommit=False) as conn:
                conn.execute("SET LOCAL synchronous_commit = local")
                for pid in (first, second):
                    row = conn.execute("SELECT fabric_api.commit(%s)", (pid,)).fetchone()
                    assert row is not None
                    answers[pid] = str(row[0]["memory_id"])
                conn.commit()  # returns once the held worker's COMMIT PREPARED does
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)

    with commits_held(cluster, held_node):
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        _until(
            lambda: _commit_prepared_waits(cluster, held_node) or bool(failed),
            "the held worker's COMMIT PREPARED",
        )
        assert not failed, failed
        with cluster.connect() as su:
            row = su.execute(
                "SELECT max(xid)::text FROM fabric.events WHERE proposal_id = %s", (first,)
            ).fetchone()
        assert row is not None and row[0] is not None
        xid = int(row[0])  # the transaction's, committed on the coordinator
        horizon, events, hydrated = _feed(cluster, xid - 1)
        read = {str(e["memory_id"]) for e in events if e["memory_id"] is not None}
        # never an event whose record its worker does not show yet
        assert read <= hydrated, (read - hydrated, events)
        assert horizon <= xid
        assert not read & {answers[first], answers[second]}
    thread.join(60)
    assert not thread.is_alive() and not failed, failed
    horizon, events, hydrated = _feed(cluster, xid - 1)
    read = {str(e["memory_id"]) for e in events if e["memory_id"] is not None}
    assert horizon > xid
    assert {answers[first], answers[second]} <= read <= hydrated


# -- propose_many notes its proposals --------------------------------------------------------


def test_propose_many_notes_its_proposals_so_committing_one_reaches_only_its_worker(
    cluster: Cluster,
) -> None:
    tenant = cluster.apart[1]
    home = {cluster.placement[tenant]}
    run = open_run(cluster, tenant)
    with cluster.connect("mf_agent_a") as agent:
        row = agent.execute(
            "SELECT fabric_api.propose_many(%s, %s)",
            (Jsonb([episode(tenant, f"many {i}") for i in range(3)]), run),
        ).fetchone()
    assert row is not None and [a["status"] for a in row[0]] == ["validated"] * 3
    ids = [a["proposal_id"] for a in row[0]]
    with cluster.connect() as su:
        noted = su.execute(
            "SELECT id::text, kind, tenant_id FROM fabric.tenant_directory WHERE id = ANY (%s)",
            (ids,),
        ).fetchall()
    assert sorted(noted) == sorted((str(i), "proposal", tenant) for i in ids)
    for pid in ids:
        nodes, committed = reached(
            cluster,
            "mf_committer",
            lambda conn, p=pid: conn.execute("SELECT fabric_api.commit(%s)", (p,)).fetchone()[0],
        )
        assert committed["memory_id"] and nodes == home


# -- a COMMIT PREPARED that fails: recovery finishes it, the horizon waits for it ----------


@contextmanager
def recovery_paused(c: Cluster) -> Iterator[None]:
    """Citus's maintenance daemon does not recover prepared transactions while the block
    runs (`citus.recover_2pc_interval = -1` on the coordinator); the test recovers them
    itself (`recover_prepared_transactions()`)."""
    with c.connect() as su:
        su.execute("ALTER SYSTEM SET citus.recover_2pc_interval = -1")
        su.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with c.connect() as su:
            su.execute("ALTER SYSTEM RESET citus.recover_2pc_interval")
            su.execute("SELECT pg_reload_conf()")


def test_a_failed_commit_prepared_is_recovered_and_the_projection_waits_for_it(
    cluster: Cluster,
) -> None:
    """The worker's connection is cut between its PREPARE and its COMMIT PREPARED (the
    coordinator's commit held at its notify lock meanwhile, as above): the coordinator
    commits, Citus's COMMIT PREPARED fails with a warning and the call returns its answer.
    The worker's prepared transaction stays pending, its writer long gone: the feed's horizon
    stays before it and serves none of its events until recovery commits it; then the events
    are served and the record hydrates."""
    tenant = cluster.apart[0]
    node = cluster.placement[tenant]
    proposal_id = proposal(cluster, tenant, "its COMMIT PREPARED fails")
    info = conninfo_to_dict(cluster.url)
    coordinator = (str(info["host"]), int(info["port"]))
    answers: list[Any] = []
    warnings: list[str] = []
    caller = cluster.connect("mf_committer")
    caller.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
    caller.execute("SET synchronous_commit = local")
    row = caller.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = row[0]

    def commit() -> None:
        try:
            got = caller.execute("SELECT fabric_api.commit(%s)", (proposal_id,)).fetchone()
            answers.append(got[0] if got else None)
        except BaseException as exc:  # reported below
            answers.append(exc)

    def waits_for_the_lock() -> bool:
        with cluster.connect() as su:
            row = su.execute(
                "SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity WHERE pid = %s",
                (pid,),
            ).fetchone()
        return row is not None and row[0] == "Lock:object"

    def prepared_connection() -> list[int]:
        with cluster.worker(*node) as w:
            return [
                r[0]
                for r in w.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE 'PREPARE TRANSACTION %%'"
                ).fetchall()
            ]

    with recovery_paused(cluster):
        with commits_held(cluster, coordinator):
            thread = threading.Thread(target=commit, daemon=True)
            thread.start()
            _until(lambda: waits_for_the_lock() or not thread.is_alive(), "the commit to wait")
            assert thread.is_alive(), answers
            prepared = prepared_connection()
            assert len(prepared) == 1, prepared  # the worker's side is prepared
            with cluster.worker(*node) as w:
                w.execute("SELECT pg_terminate_backend(%s::integer)", (prepared[0],))
            _until(lambda: not prepared_connection(), "the worker's connection to end")
        thread.join(60)
        assert not thread.is_alive()
        caller.close()
        assert answers and isinstance(answers[0], dict) and answers[0]["memory_id"], answers
        assert any(w.startswith("failed to commit transaction") for w in warnings), warnings
        memory_id = str(answers[0]["memory_id"])
        with cluster.worker(*node) as w:
            pending = w.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
            ).fetchone()
        assert pending == (1,)
        with cluster.connect() as su:
            row = su.execute(
                "SELECT max(xid)::text FROM fabric.events WHERE proposal_id = %s", (proposal_id,)
            ).fetchone()
        assert row is not None and row[0] is not None
        xid = int(row[0])
        horizon, events, hydrated = _feed(cluster, xid - 1)
        read = {str(e["memory_id"]) for e in events if e["memory_id"] is not None}
        assert horizon <= xid and memory_id not in read and read <= hydrated
        with cluster.connect() as su:
            su.execute("SELECT recover_prepared_transactions()")
    horizon, events, hydrated = _feed(cluster, xid - 1)
    read = {str(e["memory_id"]) for e in events if e["memory_id"] is not None}
    assert horizon > xid and memory_id in read and read <= hydrated
    state = _state(cluster, proposal_id)
    assert state["status"] == "committed" and state["records"] == 1
    assert "memory.record.formed" in state["events"]


# -- a worker that does not answer holds the feed back ---------------------------------------


@contextmanager
def refusing_connections(c: Cluster, node: tuple[str, int]) -> Iterator[None]:
    """The worker refuses every new connection to the fabric's database (`datallowconn`
    off, which binds superusers too) while the block runs; connections already open,
    Citus's cached ones included, go on."""
    with c.worker(*node) as w:
        w.execute(
            "UPDATE pg_catalog.pg_database SET datallowconn = false "
            "WHERE datname = current_database()"
        )
        try:
            yield
        finally:
            w.execute(
                "UPDATE pg_catalog.pg_database SET datallowconn = true "
                "WHERE datname = current_database()"
            )


def test_a_worker_that_does_not_answer_holds_the_projection_back(cluster: Cluster) -> None:
    """A commit on a tenant's worker, done two-phase (its prepared transaction committed at
    once, its row in pg_dist_transaction kept until recovery, paused here): while that worker
    refuses new connections, the horizon cannot learn whether the transaction is still
    pending there, so it stays before it (fail closed) and the feed serves none of its
    events; once the worker answers again, they are served and the record hydrates."""
    tenant = cluster.apart[0]
    node = cluster.placement[tenant]
    proposal_id = proposal(cluster, tenant, "its worker goes quiet")
    with recovery_paused(cluster):
        with cluster.connect("mf_committer") as committer:
            row = committer.execute("SELECT fabric_api.commit(%s)", (proposal_id,)).fetchone()
        assert row is not None
        memory_id = str(row[0]["memory_id"])
        with cluster.connect() as su:
            got = su.execute(
                "SELECT max(xid)::text FROM fabric.events WHERE proposal_id = %s", (proposal_id,)
            ).fetchone()
        assert got is not None and got[0] is not None
        xid = int(got[0])
        horizon, events, _ = _feed(cluster, xid - 1)
        assert horizon > xid and memory_id in {str(e["memory_id"]) for e in events}
        with refusing_connections(cluster, node):
            horizon, events, _ = _feed(cluster, xid - 1)
            assert horizon <= xid, horizon
            assert memory_id not in {str(e["memory_id"]) for e in events}
        horizon, events, hydrated = _feed(cluster, xid - 1)
        read = {str(e["memory_id"]) for e in events if e["memory_id"] is not None}
        assert horizon > xid and memory_id in read and read <= hydrated
