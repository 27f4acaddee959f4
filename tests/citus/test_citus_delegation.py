"""Calls delegated to the worker that holds their tenant (docs/citus.md, "Delegated calls").

The tenant-keyed calls and open_run are distributed functions on their tenant argument: a
top-level call is one command, sent by the coordinator to the tenant's worker, which runs
the whole call there in one local transaction (counted from Citus itself, with
`citus.log_remote_commands`). Its events wait in the tenant's `fabric.shard_events` until
`fabric_api.relay_events` moves them into the coordinator's outbox, each once, in the order
they were made. A delegated call that names the wrong tenant finds nothing of the other one;
one inside a transaction block runs on the coordinator instead, with the same rules.

Skipped unless MEMFABRIC_CITUS_URL names a coordinator (tests/citus/citus_cluster.py)."""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from test_citus_calls import counts
from test_citus_fabric import MEMORY_TOOLS, episode, form_on, open_run, relay

from citus_cluster import Cluster, cluster

__all__ = ["cluster"]  # the session fixture, used by name

SERVER = re.compile(r"on server \S+@([^:]+):(\d+) connectionId: \d+")


def issued(
    c: Cluster, login: str, query: str, *args: Any
) -> tuple[list[tuple[tuple[str, int], str]], Any]:
    """Every command Citus sent to a worker while `query` ran as `login` (the node and the
    command), and the query's one value."""
    commands: list[tuple[tuple[str, int], str]] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        m = SERVER.search(diag.message_detail or "")
        primary = diag.message_primary or ""
        if m and primary.startswith("issuing "):
            commands.append(((m[1], int(m[2])), primary.removeprefix("issuing ")))

    with c.connect(login) as conn:
        conn.add_notice_handler(note)
        conn.execute("SET client_min_messages = notice")
        conn.execute("SET citus.log_remote_commands = on")
        row = conn.execute(query, args).fetchone()  # type: ignore[call-overload]
    assert row is not None
    return commands, row[0]


def staged(c: Cluster, tenant: str) -> list[str]:
    return [
        r[0]
        for r in c.rows(
            "SELECT event_type FROM fabric.shard_events WHERE tenant_id = %s "
            "ORDER BY staged_at, event_id",
            tenant,
        )
    ]


def outbox(c: Cluster, tenant: str, since: str) -> list[tuple[str, str]]:
    """The tenant's events of the outbox written after `since` (an xid8), in outbox order."""
    return [
        (r[0], str(r[1]))
        for r in c.rows(
            "SELECT event_type, event_id FROM fabric.events WHERE tenant_id = %s "
            "AND xid >= %s::xid8 ORDER BY xid, event_id",
            tenant,
            since,
        )
    ]


def horizon(c: Cluster) -> str:
    return str(c.row("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")[0])


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_each_tenant_keyed_call_is_one_command_run_on_the_tenants_worker(
    cluster: Cluster, pair: str
) -> None:
    for tenant in getattr(cluster, pair):
        home = cluster.placement[tenant]
        relay(cluster)
        since = horizon(cluster)

        def one(
            login: str, call: str, args: str, *values: Any, home: Any = home, tenant: str = tenant
        ) -> Any:
            commands, value = issued(cluster, login, f"SELECT fabric_api.{call}({args})", *values)
            assert [node for node, _ in commands] == [home], commands
            assert commands[0][1].startswith(f"SELECT fabric_api.{call}('{tenant}'::text")
            return value

        run = one(
            "mf_orchestrator",
            "open_run",
            "%s, %s, %s, %s, %s, %s::interval",
            tenant,
            "com-agt-003",
            "user-8842",
            "sess-d",
            MEMORY_TOOLS,
            "1 hour",
        )
        proposed = one(
            "mf_agent_a",
            "propose",
            "%s, %s, %s",
            tenant,
            Jsonb(episode(tenant, f"delegated {pair} {uuid.uuid4()}")),
            run,
        )
        assert proposed["status"] == "validated"
        batch = one(
            "mf_agent_a",
            "propose_many",
            "%s, %s, %s",
            tenant,
            Jsonb([episode(tenant, f"delegated batch {uuid.uuid4()}")]),
            run,
        )
        assert batch[0]["status"] == "validated"
        record = one("mf_committer", "commit", "%s, %s", tenant, proposed["proposal_id"])
        answer = one(
            "mf_agent_a",
            "recall",
            "%s, %s",
            tenant,
            Jsonb({"run_id": str(run), "tiers": ["episodic"], "limit": 50}),
        )
        assert answer["status"] == "served"
        assert record["memory_id"] in [r["memory_id"] for r in answer["records"]]
        closed = one("mf_orchestrator", "close_run", "%s, %s", tenant, run)
        assert closed["closed_at"] is not None
        made = [
            "fabric.run.opened",
            "memory.proposal.validated",
            "memory.proposal.validated",
            "memory.record.formed",
            "memory.recall.served",
            "fabric.run.closed",
        ]
        # written on the worker, in the calls' own transactions; none on the coordinator yet
        assert staged(cluster, tenant) == made
        assert outbox(cluster, tenant, since) == []
        assert relay(cluster) == len(made)
        assert [t for t, _ in outbox(cluster, tenant, since)] == made
        assert staged(cluster, tenant) == []
        assert relay(cluster) == 0  # each moved once
        # the relay noted the run and the proposals: a call by id alone finds them at once
        assert cluster.row(
            "SELECT count(*) FROM fabric.tenant_directory WHERE tenant_id = %s AND id = ANY (%s)",
            tenant,
            [str(run), proposed["proposal_id"], batch[0]["proposal_id"]],
        ) == (3,)


@pytest.mark.parametrize("pair", ["same", "apart"])
def test_a_delegated_call_naming_another_tenant_finds_nothing_and_writes_nothing(
    cluster: Cluster, pair: str
) -> None:
    """Routed to the named tenant's worker and looked up in that tenant only: a run or a
    proposal of another tenant is refused as unknown there, whether the two tenants share
    a worker or not."""
    first, second = getattr(cluster, pair)
    run = open_run(cluster, first)
    with cluster.connect("mf_agent_a") as agent:
        proposal = agent.execute(
            "SELECT fabric_api.propose(%s, %s, %s)",
            (first, Jsonb(episode(first, f"kept {uuid.uuid4()}")), run),
        ).fetchone()[0]["proposal_id"]  # type: ignore[index]
    relay(cluster)
    before = {t: counts(cluster, t) for t in (first, second)}
    refusals = [
        (
            "mf_agent_a",
            "SELECT fabric_api.propose(%s, %s, %s)",
            (second, Jsonb(episode(second, "stray")), run),
            "42501",
        ),
        (
            "mf_agent_a",
            "SELECT fabric_api.recall(%s, %s)",
            (second, Jsonb({"run_id": str(run), "tiers": ["episodic"]})),
            "42501",
        ),
        ("mf_committer", "SELECT fabric_api.commit(%s, %s)", (second, proposal), "P0002"),
        ("mf_orchestrator", "SELECT fabric_api.close_run(%s, %s)", (second, run), "P0002"),
    ]
    for login, query, args, sqlstate in refusals:
        with cluster.connect(login) as conn, pytest.raises(psycopg.Error) as info:
            conn.execute(query, args)
        assert info.value.sqlstate == sqlstate, (query, info.value)
    assert {t: counts(cluster, t) for t in (first, second)} == before
    # in its own tenant the proposal is still there to commit
    with cluster.connect("mf_committer") as committer:
        row = committer.execute("SELECT fabric_api.commit(%s, %s)", (first, proposal)).fetchone()
    assert row is not None and row[0]["memory_id"]
    relay(cluster)


def test_a_refused_delegated_call_leaves_nothing_on_the_worker(cluster: Cluster) -> None:
    first, _ = cluster.apart
    before = counts(cluster, first)
    with cluster.connect("mf_committer") as conn, pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT fabric_api.commit(%s, %s)", (first, uuid.uuid4()))
    assert info.value.sqlstate == "P0002"
    with cluster.connect("mf_orchestrator") as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(
            "SELECT fabric_api.open_run(%s, 'com-agt-003', 'user-8842', 's', %s, '9 days')",
            (first, MEMORY_TOOLS),
        )
    assert info.value.sqlstate == "22023"
    assert counts(cluster, first) == before


def test_in_a_transaction_block_the_call_runs_on_the_coordinator_with_the_same_rules(
    cluster: Cluster,
) -> None:
    """Citus delegates a top-level call only; inside BEGIN ... COMMIT the same function runs
    on the coordinator, statement by statement on the tenant's worker, and its events are
    in the outbox at commit, as for the calls the coordinator always runs."""
    first, second = cluster.apart
    since = horizon(cluster)
    with cluster.connect("mf_orchestrator") as conn, conn.transaction():
        run = conn.execute(
            "SELECT fabric_api.open_run(%s, 'com-agt-003', 'user-8842', 's', %s, '1 hour')",
            (first, MEMORY_TOOLS),
        ).fetchone()[0]  # type: ignore[index]
    with cluster.connect("mf_agent_a") as agent:
        agent.execute("SET citus.log_remote_commands = on")
        commands: list[str] = []
        agent.add_notice_handler(lambda d: commands.append(d.message_primary or ""))
        with agent.transaction():
            proposed = agent.execute(
                "SELECT fabric_api.propose(%s, %s, %s)",
                (first, Jsonb(episode(first, f"in a block {uuid.uuid4()}")), run),
            ).fetchone()[0]  # type: ignore[index]
            with pytest.raises(psycopg.Error) as info, agent.transaction():
                agent.execute(
                    "SELECT fabric_api.propose(%s, %s, %s)",
                    (second, Jsonb(episode(second, "stray")), run),
                )
            assert info.value.sqlstate == "42501"
    assert proposed["status"] == "validated"
    assert not any(c.startswith("issuing SELECT fabric_api.propose") for c in commands)
    assert staged(cluster, first) == []
    assert [t for t, _ in outbox(cluster, first, since)] == [
        "fabric.run.opened",
        "memory.proposal.validated",
    ]


def test_relays_and_delegated_writers_race_and_every_event_arrives_once_in_order(
    cluster: Cluster,
) -> None:
    """Writers in two tenants on different workers propose and commit through delegated
    calls while two relays run in a loop: every acknowledged call's events are in the
    outbox once, none is left staged, and a record's proposal precedes its formation."""
    first, second = cluster.apart
    since = horizon(cluster)
    stop = threading.Event()
    errors: list[BaseException] = []
    formed: dict[str, list[str]] = {first: [], second: []}

    def writer(tenant: str) -> None:
        try:
            run = open_run(cluster, tenant)
            with cluster.connect("mf_agent_a") as agent, cluster.connect("mf_committer") as cm:
                for n in range(10):
                    text = f"race {tenant} {n} {uuid.uuid4()}"
                    formed[tenant].append(form_on(agent, cm, tenant, text, run, keyed=True))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    def relayer() -> None:
        try:
            with cluster.connect("mf_projector") as conn:
                while not stop.is_set():
                    conn.execute("SELECT fabric_api.relay_events()")
        except BaseException as exc:
            errors.append(exc)

    relays = [threading.Thread(target=relayer) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(t,)) for t in (first, second)]
    for t in [*relays, *writers]:
        t.start()
    for w in writers:
        w.join(180)
    stop.set()
    for r in relays:
        r.join(60)
    assert errors == []
    relay(cluster)
    for tenant in (first, second):
        assert staged(cluster, tenant) == []
        events = outbox(cluster, tenant, since)
        assert len({e for _, e in events}) == len(events)  # none twice
        rows = cluster.rows(
            "SELECT e.event_type, coalesce(e.memory_id, m.memory_id)::text "
            "FROM fabric.events e LEFT JOIN fabric.memory_records m "
            "ON m.tenant_id = e.tenant_id AND m.proposal_id = e.proposal_id "
            "WHERE e.tenant_id = %s AND e.xid >= %s::xid8 ORDER BY e.xid, e.event_id",
            tenant,
            since,
        )
        order = [(t, m) for t, m in rows if m in formed[tenant]]
        for memory_id in formed[tenant]:
            mine = [t for t, m in order if m == memory_id]
            assert mine == ["memory.proposal.validated", "memory.record.formed"], mine


def test_registering_an_agent_makes_its_login_an_agent_on_every_worker(
    cluster: Cluster,
) -> None:
    """A delegated call runs on the worker as its caller's login, with that node's role
    memberships: register_agent grants fabric_agent there too; a login a worker does not
    have is refused, and nothing is registered."""
    everywhere = f"mf_deleg_{uuid.uuid4().hex[:8]}"
    coordinator_only = f"mf_deleg_{uuid.uuid4().hex[:8]}"
    create = (
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {}) "
        "THEN CREATE ROLE {} LOGIN; END IF; END $$"
    )
    with cluster.connect() as su:
        for login in (everywhere, coordinator_only):
            su.execute(sql.SQL(create).format(sql.Literal(login), sql.Identifier(login)))
    for host, port in cluster.workers:
        with cluster.worker(host, port) as w:
            w.execute(sql.SQL(create).format(sql.Literal(everywhere), sql.Identifier(everywhere)))
            w.execute("SET citus.enable_ddl_propagation TO off")
            w.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(coordinator_only)))
    agent_id = f"deleg-{uuid.uuid4().hex[:8]}"
    with cluster.connect("mf_admin") as admin:
        admin.execute(
            "SELECT fabric_api.register_agent(%s, %s, '{}', %s)",
            (agent_id, everywhere, ["tool:memory-recall"]),
        )
        with pytest.raises(psycopg.Error) as info:
            admin.execute(
                "SELECT fabric_api.register_agent(%s, %s, '{}', %s)",
                (f"{agent_id}-x", coordinator_only, ["tool:memory-recall"]),
            )
    assert info.value.sqlstate == "42501" and info.value.diag.message_hint
    for host, port in cluster.workers:
        with cluster.worker(host, port) as w:
            row = w.execute("SELECT pg_has_role(%s, 'fabric_agent', 'MEMBER')", (everywhere,))
            assert row.fetchone() == (True,)
    assert cluster.row(
        "SELECT count(*) FROM fabric.agents WHERE login IN (%s, %s)", everywhere, coordinator_only
    ) == (1,)
    assert cluster.row("SELECT pg_has_role(%s, 'fabric_agent', 'MEMBER')", coordinator_only) == (
        False,
    )


@pytest.mark.parametrize(
    ("login", "call"),
    [
        ("mf_consolidator", "review_queue(%s)"),
        ("mf_consolidator", "contradiction_queue(%s)"),
        ("mf_consolidator", "consolidation_settings(%s)"),
        ("mf_consolidator", "consolidation_cursor(%s)"),
        ("mf_committer", "awaiting_recommendations(%s)"),
    ],
)
def test_a_tenants_queues_and_settings_are_read_on_its_worker_alone(
    cluster: Cluster, login: str, call: str
) -> None:
    """The consolidator's and the committer's reads by tenant are delegated too: one command
    to the tenant's worker, the same answer as the same call run on the coordinator (inside
    a transaction block, where Citus does not delegate)."""
    for tenant in cluster.apart:
        commands, delegated = issued(cluster, login, f"SELECT fabric_api.{call}", tenant)
        assert [node for node, _ in commands] == [cluster.placement[tenant]], commands
        with cluster.connect(login) as conn, conn.transaction():
            row = conn.execute(f"SELECT fabric_api.{call}", (tenant,)).fetchone()
        assert row is not None and row[0] == delegated


def test_a_relay_killed_inside_its_commit_moves_nothing_and_the_next_moves_all_once(
    cluster: Cluster,
) -> None:
    """The relay commits two-phase: its backend terminated inside its commit (after Citus
    prepared the worker's side: held at the coordinator's notify lock by a probe, as in
    test_citus_two_phase.py), the staged events stay staged and none is in the outbox; the
    next relay moves each once."""
    from test_citus_two_phase import _until, commits_held

    tenant = cluster.apart[1]
    run = open_run(cluster, tenant)  # its event relayed: what follows stages the rest
    since = horizon(cluster)
    with cluster.connect("mf_agent_a") as agent, cluster.connect("mf_committer") as cm:
        form_on(agent, cm, tenant, f"relayed after a kill {uuid.uuid4()}", run, keyed=True)
    made = staged(cluster, tenant)
    assert "memory.record.formed" in made  # a projected event: the relay's commit notifies
    info = psycopg.conninfo.conninfo_to_dict(cluster.url)
    coordinator = (str(info["host"]), int(info["port"]))
    relayer = cluster.connect("mf_projector")
    relayer.execute("SET synchronous_commit = local")
    row = relayer.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = row[0]
    failed: list[BaseException] = []

    def run_relay() -> None:
        try:
            relayer.execute("SELECT fabric_api.relay_events()")
        except BaseException as exc:  # the terminated connection: expected
            failed.append(exc)

    def waits() -> bool:
        got = cluster.row(
            "SELECT coalesce(wait_event_type || ':' || wait_event, '') FROM pg_stat_activity "
            "WHERE pid = %s",
            pid,
        )
        return got[0] == "Lock:object"

    with commits_held(cluster, coordinator):
        thread = threading.Thread(target=run_relay, daemon=True)
        thread.start()
        _until(lambda: waits() or not thread.is_alive(), "the relay to wait in its commit")
        assert thread.is_alive(), failed
        cluster.rows("SELECT pg_terminate_backend(%s::integer)", pid)
        thread.join(60)
    assert failed and isinstance(failed[0], psycopg.OperationalError), failed
    relayer.close()
    _until(
        lambda: cluster.row("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid) == (0,),
        "the terminated backend to end",
    )
    cluster.rows("SELECT recover_prepared_transactions()")
    assert staged(cluster, tenant) == made
    assert outbox(cluster, tenant, since) == []
    assert relay(cluster) == len(made)
    assert [t for t, _ in outbox(cluster, tenant, since)] == made
    assert staged(cluster, tenant) == []


def test_a_relay_of_reads_alone_is_committed_two_phase_too(cluster: Cluster) -> None:
    """A recall's audit event is a read's, which a call on the coordinator commits one-phase;
    moved by the relay it leaves a worker's table, so the relay prepares the worker first
    (Citus's own account): one-phase, a coordinator failing after the worker's commit would
    lose the event."""
    tenant = cluster.apart[0]
    run = open_run(cluster, tenant)  # relayed: only the recall's event is staged below
    with cluster.connect("mf_agent_a") as agent:
        agent.execute(
            "SELECT fabric_api.recall(%s, %s)",
            (tenant, Jsonb({"run_id": str(run), "tiers": ["episodic"]})),
        )
    assert staged(cluster, tenant) == ["memory.recall.served"]
    commands, moved = issued(cluster, "mf_projector", "SELECT fabric_api.relay_events()")
    assert moved == 1
    sent = [command for _, command in commands]
    assert any(c.startswith("PREPARE TRANSACTION") for c in sent), sent
    assert any(c.startswith("COMMIT PREPARED") for c in sent), sent


def test_the_other_calls_by_tenant_are_one_command_on_its_worker(cluster: Cluster) -> None:
    """The admin's, the orchestrator's, the workflow's and the committer's calls that take
    the tenant first run whole on its worker too (their events through the relay)."""
    for tenant in cluster.apart:
        home = [cluster.placement[tenant]]
        relay(cluster)
        since = horizon(cluster)
        calls: list[tuple[str, str, tuple[Any, ...]]] = [
            ("mf_admin", "enable_agent(%s, 'com-agt-003', %s)", (tenant, MEMORY_TOOLS)),
            (
                "mf_orchestrator",
                "issue_agent_token(%s, 'com-agt-003', 'user-8842', 'sess-d', %s, '1 hour')",
                (tenant, MEMORY_TOOLS),
            ),
            (
                "mf_workflow",
                "record_measurements(%s, %s)",
                (
                    tenant,
                    Jsonb([{"series": "deleg.ms", "at": "2026-08-20T10:00:00Z", "value": 1}]),
                ),
            ),
            (
                "mf_committer",
                "request_subject_erasure(%s, %s, 'GDPR art. 17', false)",
                (tenant, f"user-deleg-{uuid.uuid4().hex[:8]}"),
            ),
        ]
        answers = []
        for login, call, args in calls:
            commands, answer = issued(cluster, login, f"SELECT fabric_api.{call}", *args)
            assert [node for node, _ in commands] == home, (call, commands)
            answers.append(answer)
        token = answers[1]["token_id"]
        revoke = "SELECT fabric_api.revoke_agent_token(%s, %s)"
        commands, _ = issued(cluster, "mf_orchestrator", revoke, tenant, token)
        assert [node for node, _ in commands] == home
        made = staged(cluster, tenant)  # written on the worker, none on the coordinator yet
        assert made and outbox(cluster, tenant, since) == []
        assert relay(cluster) == len(made)
        assert [t for t, _ in outbox(cluster, tenant, since)] == made
        assert staged(cluster, tenant) == []


def test_a_delegated_propose_the_run_does_not_authorize_is_denied_and_audited(
    cluster: Cluster,
) -> None:
    """The tool check of a delegated propose is the plain call's: a run whose active tools
    lack tool:memory-propose is denied, nothing is proposed, and the denial's audit event is
    staged on the worker (fabric._append_events) and relayed like any other."""
    tenant = cluster.apart[1]
    with cluster.connect("mf_orchestrator") as conn:
        run = conn.execute(
            "SELECT fabric_api.open_run(%s, 'com-agt-003', 'user-8842', 's', %s, '1 hour')",
            (tenant, ["tool:memory-recall"]),
        ).fetchone()[0]  # type: ignore[index]
    relay(cluster)
    since = horizon(cluster)
    proposals = counts(cluster, tenant)["proposals"]
    commands, answer = issued(
        cluster,
        "mf_agent_a",
        "SELECT fabric_api.propose(%s, %s, %s)",
        tenant,
        Jsonb(episode(tenant, "not authorized here")),
        run,
    )
    assert [node for node, _ in commands] == [cluster.placement[tenant]]
    assert answer["status"] == "denied" and answer["proposal_id"] is None
    assert counts(cluster, tenant)["proposals"] == proposals
    assert staged(cluster, tenant) == ["agent.tool.unauthorized"]
    assert relay(cluster) == 1
    assert [t for t, _ in outbox(cluster, tenant, since)] == ["agent.tool.unauthorized"]
