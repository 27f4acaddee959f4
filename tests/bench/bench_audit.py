"""`make bench-audit`: a one-month window over each fabric_audit relation of a tenant with
many events (ARGS="--events 1000000" for the full size).

Prints, never asserts. The tenant (--tenant, default `bench-audit-<events>`) gets --events
events spread evenly over the last 365 days and inserted in time order, as a live outbox
fills (mostly record formations, some recalls returning three memory ids, some tool
denials), one subject-erasure approval per 100 events, and a few records formed, recalled
and erased through the governed API so the per-record relations have rows. The events are
bulk-inserted by the superuser (the append-only outbox accepts INSERTs; what is measured is
reading them), then sealed by the real sealer, so chain positions are real. A rerun on the
same tenant only adds what is missing. Each relation is then queried as the auditor login
for the month that ended 30 days ago, --repeat times; the median is printed with the rows
it returned.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from benchlib import call, create_logins
from psycopg import sql
from psycopg.types.json import Jsonb

from memfabric import db

TENANT, AGENT, COMMITTER = "bench-audit", "bench-audit-agt-003", "bench-audit-agt-010"
SUBJECT = "user-bench-audit"
LOGINS = {
    "bench_audit_admin": "fabric_admin",
    "bench_audit_orchestrator": "fabric_orchestrator",
    "bench_audit_committer": "fabric_committer",
    "bench_audit_policy": "fabric_policy",
    "bench_audit_auditor": "fabric_auditor",
    "bench_audit_agent": None,
}
TOOLS = ["tool:memory-propose", "tool:memory-recall"]
PROFILE = {
    "propose_scope": {"tiers": ["episodic"], "visibility": ["subject"]},
    "recall_scope": {"tiers": ["episodic"], "visibility": ["subject"]},
}
POLICY = "bench-audit-agt-002"

BULK_EVENTS = """
INSERT INTO fabric.events (tenant_id, event_type, occurred_at, actor_agent_id, memory_id,
                           run_id, correlation_id, payload)
SELECT %(tenant)s,
       CASE WHEN i %% 20 = 0 THEN 'agent.tool.unauthorized'
            WHEN i %% 20 < 4 THEN 'memory.recall.served'
            ELSE 'memory.record.formed' END,
       now() - (1 - i::double precision / %(n)s) * interval '365 days',
       %(committer)s,
       CASE WHEN i %% 20 >= 4 THEN gen_random_uuid() END,
       gen_random_uuid(), 'corr-' || (i %% 1000),
       CASE WHEN i %% 20 = 0 THEN jsonb_build_object('tool', 'tool:memory-recall',
              'agent_id', %(agent)s::text, 'missing_layers', '["run"]'::jsonb)
            WHEN i %% 20 < 4 THEN jsonb_build_object('status', 'served',
              'agent_id', %(agent)s::text,
              'memory_ids', jsonb_build_array(gen_random_uuid(), gen_random_uuid(),
                                              gen_random_uuid()),
              'scope', jsonb_build_object('subject_ref', 'hmac:' || md5(i::text)))
            ELSE jsonb_build_object('tier', 'episodic', 'state', 'raw') END
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) i
"""
BULK_APPROVALS = """
INSERT INTO fabric.approvals (tenant_id, action, subject_ref, reason, status, requested_by,
                              requested_at, expires_at, decided_by, decided_at, decision_reason,
                              consumed_at)
SELECT %(tenant)s, 'erase_subject', 'hmac:' || md5('a' || i), 'bench', 'consumed',
       %(committer)s, at, at + interval '1 day', %(policy)s, at, 'ok', at
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) i,
     LATERAL (SELECT now() - (1 - i::double precision / %(n)s) * interval '365 days' AS at) t
"""
RELATIONS = {
    "events": "fabric_audit.events(%(t)s, %(from)s, %(to)s)",
    "recall_history": "fabric_audit.recall_history(%(t)s, %(from)s, %(to)s)",
    "recalled_records": "fabric_audit.recalled_records(%(t)s, %(from)s, %(to)s)",
    "tool_denials": "fabric_audit.tool_denials(%(t)s, %(from)s, %(to)s)",
    "approvals": "fabric_audit.approvals(%(t)s, %(from)s, %(to)s)",
    "erasures": "fabric_audit.erasures(%(t)s, %(from)s, %(to)s)",
    "record_history": "fabric_audit.record_history(%(t)s, %(memory_id)s)",
}


def setup(url: str, tenant: str) -> None:
    """Logins, tenant and agents (idempotent)."""
    with psycopg.connect(url, autocommit=True) as su:
        create_logins(su, LOGINS)
    with psycopg.connect(db.url_for(url, "bench_audit_admin"), autocommit=True) as admin:
        call(admin, "SELECT fabric_api.create_tenant(%s)", tenant)
        register = "SELECT fabric_api.register_agent(%s, %s, %s, %s)"
        call(admin, register, AGENT, "bench_audit_agent", Jsonb(PROFILE), TOOLS)
        call(admin, register, COMMITTER, "bench_audit_committer", Jsonb({}), [])
        call(admin, register, POLICY, "bench_audit_policy", Jsonb({}), [])
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", tenant, AGENT, TOOLS)
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", tenant, COMMITTER, [])


def governed_records(url: str, tenant: str) -> str:
    """A record formed, recalled and erased through the API; returns its memory id."""
    with psycopg.connect(db.url_for(url, "bench_audit_orchestrator"), autocommit=True) as orch:
        run = call(
            orch,
            "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, '1 hour'::interval)",
            tenant,
            AGENT,
            SUBJECT,
            "sess-bench-audit",
            TOOLS,
        )
    envelope = {
        "tier": "episodic",
        "scope": {"tenant_id": tenant, "visibility": "subject"},
        "content": {"text": f"bench audit {time.time_ns()}"},
        "provenance": {
            "source_event_id": f"evt-bench-audit-{time.time_ns()}",
            "formation_method": "extraction",
        },
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        "retention_class": "durable",
    }
    agent = psycopg.connect(db.url_for(url, "bench_audit_agent"), autocommit=True)
    committer = psycopg.connect(db.url_for(url, "bench_audit_committer"), autocommit=True)
    policy = psycopg.connect(db.url_for(url, "bench_audit_policy"), autocommit=True)
    with agent, committer, policy:
        proposal = call(agent, "SELECT fabric_api.propose(%s, %s)", Jsonb(envelope), run)
        memory_id = str(
            call(committer, "SELECT fabric_api.commit(%s)", proposal["proposal_id"])["memory_id"]
        )
        call(agent, "SELECT fabric_api.recall(%s)", Jsonb({"run_id": str(run)}))
        approval = call(committer, "SELECT fabric_api.request_erasure(%s, 'bench')", memory_id)[
            "approval_id"
        ]
        call(policy, "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
        call(committer, "SELECT fabric_api.erase(%s)", approval)
    return memory_id


def fill(url: str, tenant: str, target: int) -> None:
    """Bring the tenant to `target` events (and one approval per 100), then seal them."""
    with psycopg.connect(url, autocommit=True) as su:
        have = call(su, "SELECT count(*) FROM fabric.events WHERE tenant_id = %s", tenant)
        step = 100_000
        for start in range(have, target, step):
            stop = min(start + step, target) - 1
            params = {"tenant": tenant, "n": target, "start": start, "stop": stop,
                      "committer": COMMITTER, "agent": AGENT, "policy": POLICY}  # fmt: skip
            t0 = time.perf_counter()
            su.execute(BULK_EVENTS, params)
            su.execute(
                BULK_APPROVALS,
                {**params, "n": max(target // 100, 1), "start": start // 100, "stop": stop // 100},
            )
            print(f"  inserted events {start:>9,}..{stop:>9,} in {time.perf_counter() - t0:.1f} s")
        su.execute("ANALYZE fabric.events, fabric.approvals, fabric.event_seals")
    with psycopg.connect(db.url_for(url, "bench_audit_committer"), autocommit=True) as committer:
        t0, sealed = time.perf_counter(), 0
        while (n := call(committer, "SELECT fabric_api.seal_events(50000)")["sealed"]) > 0:
            sealed += n
        if sealed:
            print(f"  sealed {sealed:,} events in {time.perf_counter() - t0:.1f} s")


def measure(url: str, tenant: str, memory_id: str, repeat: int) -> None:
    with psycopg.connect(db.url_for(url, "bench_audit_auditor"), autocommit=True) as auditor:
        bounds = auditor.execute(
            "SELECT now() - interval '60 days', now() - interval '30 days'"
        ).fetchone()
        assert bounds is not None
        params = {"t": tenant, "from": bounds[0], "to": bounds[1], "memory_id": memory_id}
        print(f"one-month window [{bounds[0]:%Y-%m-%d}, {bounds[1]:%Y-%m-%d}), median of {repeat}:")
        for name, relation in RELATIONS.items():
            query = sql.SQL("SELECT count(*) FROM ") + sql.SQL(relation)  # type: ignore[arg-type]
            times, rows = [], 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                row = auditor.execute(query, params).fetchone()
                assert row is not None
                rows = row[0]
                times.append(time.perf_counter() - t0)
            print(f"  {name:<18} {statistics.median(times) * 1000:>9.1f} ms  {rows:>9,} rows")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events of the tenant")
    parser.add_argument("--repeat", type=int, default=5, help="runs per relation")
    parser.add_argument("--tenant", help=f"default {TENANT}-<events>; a new name starts empty")
    args = parser.parse_args()
    url = db.database_url()
    tenant = args.tenant or f"{TENANT}-{args.events}"
    setup(url, tenant)
    fill(url, tenant, args.events)
    memory_id = governed_records(url, tenant)
    with psycopg.connect(url, autocommit=True) as su:
        total = call(su, "SELECT count(*) FROM fabric.events WHERE tenant_id = %s", tenant)
    print(f"tenant {tenant}: {total:,} events")
    measure(url, tenant, memory_id, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
