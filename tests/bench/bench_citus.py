"""`make bench-citus`: what the three-node Citus cluster costs against one PostgreSQL, on the
same machine (same cores: this measures the distributed overhead, never a speed-up), and how
many worker nodes a tenant-scoped call touches (the goal: one).

Prints, never asserts (docs/benchmarks.md, docs/scale-out.md). Two fresh databases on the
cluster's coordinator instance, migrated the same way: `mf_bench_single`, a plain PostgreSQL
database (no `citus` extension: the same server binary, configuration and cores), and
`mf_bench_cluster`, joined to the workers like the cluster suite's (tests/citus). Each gets
the same tenants, logins and agents. Then, on each:

- governed propose+commit: `fabric_api.propose` as an agent login, then `fabric_api.commit`
  as the committer, each its own autocommit transaction; --writes pairs by one client, and
  the same spread over --clients threads (half on a tenant of each worker);
- recall: `fabric_api.recall` of the episodic tier in one run, ten records, --recalls calls
  by one client (p50, p95): filter-only (the top ten in recall's order), then text (a
  three-word question, BM25 over the records the writes formed);
- delegated calls (cluster only): the tenant-keyed propose, commit and recall, which Citus
  runs whole on the tenant's worker, against the calls the coordinator runs, --rounds
  alternated rounds (pairs/s, recall p50, server CPU per pair on the coordinator and on the
  workers, the delegated run's relay of its events into the outbox included);
  `--delegation-only` runs this and the nodes touched alone;
- nodes touched (cluster only): each call type once with `citus.log_remote_commands` on;
  Citus reports every command it sends to a worker ("issuing ...", "on server
  user@host:port connectionId: n"), so the distinct worker nodes and connections of a call
  are counted from Citus itself;
- server CPU per pair in the concurrent run, per instance (the postmaster and all its
  processes, from /proc: the nodes run on this machine), coordinator and workers apart: the
  capacity model of docs/scale-out.md;
- the cost of two-phase commit, side by side in the same run: the cluster measured a second
  time with the outbox's two-phase trigger disabled (`_050_two_phase`, revision
  0055_citus_two_phase), which is how every call committed before it (one-phase), and then
  --rounds rounds of propose+commit alternating the two;
- the projection horizon (`fabric._projection_horizon`): its latency on each database, where
  the cluster's asks the workers which prepared transactions are pending whenever
  pg_dist_transaction holds rows after the reader (right after the writes: until Citus's
  recovery clears them), against the snapshot's xmin alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "citus")]

import citus_cluster as cc  # noqa: E402  (the cluster suite's setup)
from conftest import MEMORY_TOOLS  # noqa: E402
from memfabric import db  # noqa: E402

SERVER = re.compile(r"on server (\S+)@([^:]+):(\d+) connectionId: (\d+)")


def episode(tenant: str, text: str) -> dict[str, Any]:
    return {
        "tier": "episodic",
        "scope": {"tenant_id": tenant, "visibility": "subject"},
        "content": {"text": text},
        "provenance": {
            "source_event_id": f"evt-bench-{uuid.uuid4()}",
            "correlation_id": "corr-bench",
            "causation_id": "evt-bench",
            "formation_method": "extraction",
        },
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        "retention_class": "durable",
    }


def _url(base: str, **params: Any) -> str:
    return make_conninfo("", **{**conninfo_to_dict(base), **params})


def prepare_single(base: str) -> cc.Cluster:
    """A plain database on the coordinator's instance: migrated, seeded like the cluster's."""
    admin = _url(base, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS mf_bench_single WITH (FORCE)")
        c.execute("CREATE DATABASE mf_bench_single")
    url = _url(base, dbname="mf_bench_single")
    db.migrate(url)
    coordinator, _ = cc._nodes(base)
    cc._logins(url, coordinator, [])
    made = cc.Cluster(url=url, workers=[], same=("t00", "t02"), apart=("t00", "t01"))
    cc._seed(made)
    return made


def prepare_cluster(base: str) -> cc.Cluster:
    cc.DATABASE = "mf_bench_cluster"
    coordinator, workers = cc._nodes(base)
    url = cc._fresh_database(base, coordinator, workers)
    db.migrate(url)
    cc._logins(url, coordinator, workers)
    made = cc.Cluster(url=url, workers=workers)
    cc._pick_tenants(made)
    cc._seed(made)
    return made


def open_run(c: cc.Cluster, tenant: str) -> str:
    with c.connect("mf_orchestrator") as conn:
        row = conn.execute(
            "SELECT fabric_api.open_run(%s, 'com-agt-003', 'user-8842', 'sess-1', %s, '1 hour')",
            (tenant, MEMORY_TOOLS),
        ).fetchone()
    assert row is not None
    return str(row[0])


def write_pairs(c: cc.Cluster, tenant: str, n: int, keyed: bool = False) -> float:
    """Seconds for n governed propose+commit pairs by one client; `keyed`: through the
    tenant-keyed calls, which the cluster delegates to the tenant's worker."""
    run = open_run(c, tenant)
    with c.connect("mf_agent_a") as agent, c.connect("mf_committer") as committer:
        start = time.perf_counter()
        for i in range(n):
            envelope = Jsonb(episode(tenant, f"bench note {i} {uuid.uuid4()}"))
            if keyed:
                row = agent.execute(
                    "SELECT fabric_api.propose(%s, %s, %s)", (tenant, envelope, run)
                ).fetchone()
            else:
                row = agent.execute("SELECT fabric_api.propose(%s, %s)", (envelope, run)).fetchone()
            assert row is not None and row[0]["status"] == "validated", row
            if keyed:
                committer.execute(
                    "SELECT fabric_api.commit(%s, %s)", (tenant, row[0]["proposal_id"])
                )
            else:
                committer.execute("SELECT fabric_api.commit(%s)", (row[0]["proposal_id"],))
        return time.perf_counter() - start


def relay(c: cc.Cluster) -> int:
    """The relay of the delegated calls' events into the outbox (fabric_api.relay_events)."""
    with c.connect("mf_admin") as conn:
        row = conn.execute("SELECT fabric_api.relay_events()").fetchone()
    return int(row[0]) if row else 0


def concurrent_pairs(c: cc.Cluster, clients: int, n: int, keyed: bool = False) -> float:
    """Pairs per second with `clients` threads, alternating the two tenants `apart`."""
    per = max(1, n // clients)
    tenants = [c.apart[i % 2] for i in range(clients)]
    threads = [threading.Thread(target=write_pairs, args=(c, t, per, keyed)) for t in tenants]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return per * clients / (time.perf_counter() - start)


def recall_latencies(
    c: cc.Cluster, tenant: str, n: int, query: str | None = None, keyed: bool = False
) -> list[float]:
    run = open_run(c, tenant)
    asked = {} if query is None else {"query": query}
    request = Jsonb({"run_id": run, "tiers": ["episodic"], "limit": 10, **asked})
    statement = "SELECT fabric_api.recall(%s, %s)" if keyed else "SELECT fabric_api.recall(%s)"
    args = (tenant, request) if keyed else (request,)
    out = []
    with c.connect("mf_agent_a") as agent:
        for _ in range(n):
            start = time.perf_counter()
            agent.execute(statement, args).fetchone()
            out.append((time.perf_counter() - start) * 1000)
    return out


def delegation_rounds(c: cc.Cluster, args: argparse.Namespace) -> dict[str, list[float]]:
    """On the cluster, the calls the coordinator runs and the delegated ones alternately,
    --rounds times: pairs/s by one client and by --clients threads, recall p50, and server
    CPU per pair of the concurrent run on the coordinator and on the workers (the delegated
    run's includes relaying its events into the outbox, made inside the measured window)."""
    tenant = c.apart[0]
    n = max(10, args.writes // 2)
    out: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for mode, keyed in (("coordinator", False), ("delegated", True)):
            out.setdefault(f"{mode}", []).append(n / write_pairs(c, tenant, n, keyed))
            relay(c)
            before = [node_cpu(u) for u in nodes_of(c)]
            out.setdefault(f"{mode}_conc", []).append(concurrent_pairs(c, args.clients, n, keyed))
            relay(c)
            after = [node_cpu(u) for u in nodes_of(c)]
            pairs = max(1, n // args.clients) * args.clients
            cpu = [
                (b1 - b0) * 1000 / pairs if b0 is not None and b1 is not None else float("nan")
                for b0, b1 in zip(before, after, strict=True)
            ]
            out.setdefault(f"{mode}_cpu_coordinator", []).append(cpu[0])
            out.setdefault(f"{mode}_cpu_workers", []).append(sum(cpu[1:]))
            lat = recall_latencies(c, tenant, n, keyed=keyed)
            out.setdefault(f"{mode}_recall", []).append(statistics.median(lat))
            relay(c)
    return out


def print_delegation(rounds: dict[str, list[float]], args: argparse.Namespace) -> None:
    print(
        f"\ndelegated calls against the calls the coordinator runs, on the cluster, "
        f"{args.rounds} alternated rounds of {max(10, args.writes // 2)} pairs and recalls "
        "(each round; median; delegated/coordinator per round, median):"
    )
    for key, label in (
        ("", "pairs/s, 1 client"),
        ("_conc", f"pairs/s, {args.clients} clients"),
        ("_recall", "recall p50 ms"),
        ("_cpu_coordinator", "coordinator CPU ms/pair"),
        ("_cpu_workers", "workers CPU ms/pair"),
    ):
        co, de = rounds[f"coordinator{key}"], rounds[f"delegated{key}"]
        print(
            f"  {label:24} coordinator {' '.join(f'{x:.1f}' for x in co)} "
            f"(median {statistics.median(co):.1f}); delegated "
            f"{' '.join(f'{x:.1f}' for x in de)} (median {statistics.median(de):.1f}); "
            f"ratio {statistics.median(b / a for a, b in zip(co, de, strict=True)):.2f}"
        )


@contextmanager
def remote_commands(conn: psycopg.Connection[Any]) -> Iterator[list[tuple[str, int, int]]]:
    """The (host, port, connection id) of every command Citus sends to a worker while the
    block runs on `conn`."""
    seen: list[tuple[str, int, int]] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        m = SERVER.search(diag.message_detail or "")
        if m and (diag.message_primary or "").startswith("issuing"):
            seen.append((m[2], int(m[3]), int(m[4])))

    conn.add_notice_handler(note)
    conn.execute("SET client_min_messages = notice")
    conn.execute("SET citus.log_remote_commands = on")
    try:
        yield seen
    finally:
        conn.execute("RESET citus.log_remote_commands")
        conn.remove_notice_handler(note)


def nodes_touched(c: cc.Cluster, tenant: str) -> dict[str, tuple[int, int, int]]:
    """Per call type: (worker nodes, connections, commands) Citus sent it to."""
    out: dict[str, tuple[int, int, int]] = {}

    def probe(name: str, login: str, call: Callable[[psycopg.Connection[Any]], Any]) -> Any:
        with c.connect(login) as conn, remote_commands(conn) as seen:
            result = call(conn)
        out[name] = (len({(h, p) for h, p, _ in seen}), len(set(seen)), len(seen))
        return result

    run = probe(
        "open_run (orchestrator)",
        "mf_orchestrator",
        lambda conn: conn.execute(
            "SELECT fabric_api.open_run(%s, 'com-agt-003', 'user-8842', 'sess-1', %s, '1 hour')",
            (tenant, MEMORY_TOOLS),
        ).fetchone()[0],
    )
    relay(c)  # the delegated open_run's event and directory note, as `memfabric serve` would
    proposal = probe(
        "propose (agent)",
        "mf_agent_a",
        lambda conn: conn.execute(
            "SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(tenant, "touch count")), run)
        ).fetchone()[0]["proposal_id"],
    )
    probe(
        "commit (committer)",
        "mf_committer",
        lambda conn: conn.execute("SELECT fabric_api.commit(%s)", (proposal,)).fetchone(),
    )
    probe(
        "recall (agent)",
        "mf_agent_a",
        lambda conn: conn.execute(
            "SELECT fabric_api.recall(%s)",
            (Jsonb({"run_id": str(run), "tiers": ["episodic"], "limit": 10}),),
        ).fetchone(),
    )
    keyed = probe(
        "propose, delegated",
        "mf_agent_a",
        lambda conn: conn.execute(
            "SELECT fabric_api.propose(%s, %s, %s)",
            (tenant, Jsonb(episode(tenant, "touch count, delegated")), run),
        ).fetchone()[0]["proposal_id"],
    )
    probe(
        "commit, delegated",
        "mf_committer",
        lambda conn: conn.execute("SELECT fabric_api.commit(%s, %s)", (tenant, keyed)).fetchone(),
    )
    probe(
        "recall, delegated",
        "mf_agent_a",
        lambda conn: conn.execute(
            "SELECT fabric_api.recall(%s, %s)",
            (tenant, Jsonb({"run_id": str(run), "tiers": ["episodic"], "limit": 10})),
        ).fetchone(),
    )
    return out


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()


def node_cpu(url: str) -> float | None:
    """CPU seconds the PostgreSQL instance at `url` has used so far: its postmaster and every
    child, live (utime + stime) or reaped (the postmaster's cutime + cstime). None when the
    instance is not on this machine."""
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
        ).fetchone()
    tick = os.sysconf("SC_CLK_TCK")
    try:
        assert row is not None
        postmaster = int(_stat(int(row[0]))[1])  # the checkpointer's parent
        total = sum(int(x) for x in _stat(postmaster)[11:15])
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    fields = _stat(int(entry))
                    if int(fields[1]) == postmaster:
                        total += int(fields[11]) + int(fields[12])
    except (OSError, AssertionError):
        return None
    return total / tick


def nodes_of(c: cc.Cluster) -> list[str]:
    """The URL of each instance the database lives on: the coordinator, then the workers."""
    return [c.url, *(_url(c.url, host=h, port=p) for h, p in c.workers)]


@contextmanager
def one_phase(c: cc.Cluster) -> Iterator[None]:
    """The cluster as it committed before revision 0055_citus_two_phase: the outbox's
    two-phase trigger disabled (a superuser's DDL), so a call that writes one worker commits
    one-phase."""
    with psycopg.connect(c.url, autocommit=True) as su:
        su.execute("ALTER TABLE fabric.events DISABLE TRIGGER _050_two_phase")
    try:
        yield
    finally:
        with psycopg.connect(c.url, autocommit=True) as su:
            su.execute("ALTER TABLE fabric.events ENABLE TRIGGER _050_two_phase")


def horizon_latencies(c: cc.Cluster, n: int, after: str) -> list[float]:
    """Milliseconds of `fabric._projection_horizon(after)` (as the superuser: the function is
    the feeds' own), n calls."""
    out = []
    with psycopg.connect(c.url, autocommit=True) as su:
        for _ in range(n):
            start = time.perf_counter()
            su.execute("SELECT fabric._projection_horizon(%s::xid8)", (after,)).fetchone()
            out.append((time.perf_counter() - start) * 1000)
    return out


def phase_rounds(c: cc.Cluster, args: argparse.Namespace) -> dict[str, list[float]]:
    """Propose+commit pairs per second on the cluster, one-phase and two-phase alternately,
    --rounds times each (a shared machine's load moves between two runs made one after the
    other; alternating rounds spread it over both): one client, then --clients threads."""
    tenant = c.apart[0]
    n = max(10, args.writes // 2)
    keys = ("1p", "2p", "1p_conc", "2p_conc", "1p_recall", "2p_recall")
    out: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(args.rounds):
        with one_phase(c):
            out["1p"].append(n / write_pairs(c, tenant, n))
            out["1p_conc"].append(concurrent_pairs(c, args.clients, n))
            out["1p_recall"].append(statistics.median(recall_latencies(c, tenant, n)))
        out["2p"].append(n / write_pairs(c, tenant, n))
        out["2p_conc"].append(concurrent_pairs(c, args.clients, n))
        out["2p_recall"].append(statistics.median(recall_latencies(c, tenant, n)))
    return out


def measure(c: cc.Cluster, args: argparse.Namespace) -> dict[str, float]:
    tenant = c.apart[0]
    write_pairs(c, tenant, 10)  # warm-up: plans, connections, caches
    serial = args.writes / write_pairs(c, tenant, args.writes)
    before = [node_cpu(u) for u in nodes_of(c)]
    concurrent = concurrent_pairs(c, args.clients, args.writes)
    after = [node_cpu(u) for u in nodes_of(c)]
    pairs = max(1, args.writes // args.clients) * args.clients
    # CPU ms per pair on each instance during the concurrent run (coordinator first)
    cpu = [
        (b1 - b0) * 1000 / pairs if b0 is not None and b1 is not None else float("nan")
        for b0, b1 in zip(before, after, strict=True)
    ]
    recall_latencies(c, tenant, 10)
    lat = sorted(recall_latencies(c, tenant, args.recalls))
    recall_latencies(c, tenant, 10, "bench note invoice")
    text = sorted(recall_latencies(c, tenant, args.recalls, "bench note invoice"))
    # right after the writes: every transaction of the last minute is a row of
    # pg_dist_transaction after a reader at 0 (on the cluster: the workers are asked)
    horizon = sorted(horizon_latencies(c, args.recalls, "0"))
    with psycopg.connect(c.url, autocommit=True) as su:
        row = su.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert row is not None
    # a reader past every transaction: no row after it, the snapshot alone
    idle = sorted(horizon_latencies(c, args.recalls, row[0]))
    return {
        "pairs_per_s": serial,
        "pairs_per_s_concurrent": concurrent,
        "recall_p50_ms": statistics.median(lat),
        "recall_p95_ms": lat[int(0.95 * (len(lat) - 1))],
        "text_p50_ms": statistics.median(text),
        "text_p95_ms": text[int(0.95 * (len(text) - 1))],
        "coordinator_cpu_ms": cpu[0],
        "workers_cpu_ms": sum(cpu[1:]),
        "horizon_p50_ms": statistics.median(horizon),
        "horizon_p95_ms": horizon[int(0.95 * (len(horizon) - 1))],
        "horizon_idle_p50_ms": statistics.median(idle),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="the Citus coordinator (scripts/citus.sh url)")
    parser.add_argument("--writes", type=int, default=200, help="propose+commit pairs per run")
    parser.add_argument("--clients", type=int, default=4, help="threads of the concurrent run")
    parser.add_argument("--recalls", type=int, default=200, help="recalls per run")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternated one-/two-phase rounds on the cluster"
    )
    parser.add_argument(
        "--delegation-only",
        action="store_true",
        help="only the delegated calls against the coordinator's, and the nodes a call touches",
    )
    args = parser.parse_args()
    if args.delegation_only:
        print("preparing mf_bench_cluster (Citus) ...")
        cluster = prepare_cluster(args.url)
        write_pairs(cluster, cluster.apart[0], 10, keyed=True)  # warm-up
        print_delegation(delegation_rounds(cluster, args), args)
        print_nodes(cluster)
        drop(args.url, [(cluster.url, True)])
        return
    print("preparing mf_bench_single (plain PostgreSQL) and mf_bench_cluster (Citus) ...")
    single, cluster = prepare_single(args.url), prepare_cluster(args.url)
    results = {"single node": measure(single, args)}
    with one_phase(cluster):  # before: measured first, on the same (smaller) tables
        results["cluster 1-phase"] = measure(cluster, args)
    results["3-node cluster"] = measure(cluster, args)
    print(
        f"\n{'':16} {'pairs/s (1 client)':>19} {f'pairs/s ({args.clients} clients)':>20} "
        f"{'recall p50 ms':>14} {'recall p95 ms':>14}"
    )
    for name, r in results.items():
        print(
            f"{name:16} {r['pairs_per_s']:>19.1f} {r['pairs_per_s_concurrent']:>20.1f} "
            f"{r['recall_p50_ms']:>14.1f} {r['recall_p95_ms']:>14.1f}"
        )
    s, k = results["single node"], results["3-node cluster"]
    print(
        f"{'cluster/single':16} {k['pairs_per_s'] / s['pairs_per_s']:>19.2f} "
        f"{k['pairs_per_s_concurrent'] / s['pairs_per_s_concurrent']:>20.2f} "
        f"{k['recall_p50_ms'] / s['recall_p50_ms']:>14.2f} "
        f"{k['recall_p95_ms'] / s['recall_p95_ms']:>14.2f}"
    )
    o = results["cluster 1-phase"]
    print(
        f"{'2-phase/1-phase':16} {k['pairs_per_s'] / o['pairs_per_s']:>19.2f} "
        f"{k['pairs_per_s_concurrent'] / o['pairs_per_s_concurrent']:>20.2f} "
        f"{k['recall_p50_ms'] / o['recall_p50_ms']:>14.2f} "
        f"{k['recall_p95_ms'] / o['recall_p95_ms']:>14.2f}"
    )
    print(f"\n{'':16} {'text recall p50 ms':>19} {'text recall p95 ms':>20}")
    for name, r in results.items():
        print(f"{name:16} {r['text_p50_ms']:>19.1f} {r['text_p95_ms']:>20.1f}")
    print(
        f"{'cluster/single':16} {k['text_p50_ms'] / s['text_p50_ms']:>19.2f} "
        f"{k['text_p95_ms'] / s['text_p95_ms']:>20.2f}"
    )
    print(
        "\nserver CPU per propose+commit pair in the concurrent run (all processes of each "
        "instance, from /proc):"
    )
    for name, r in results.items():
        print(
            f"  {name:16} coordinator {r['coordinator_cpu_ms']:.1f} ms, "
            f"workers {r['workers_cpu_ms']:.1f} ms"
        )
    print(
        "\nthe projection horizon, ms (p50 / p95 right after the writes; p50 of a reader past "
        "every transaction):"
    )
    for name, r in results.items():
        print(
            f"  {name:16} {r['horizon_p50_ms']:.2f} / {r['horizon_p95_ms']:.2f}, "
            f"idle {r['horizon_idle_p50_ms']:.2f}"
        )
    rounds = phase_rounds(cluster, args)
    print(
        f"\ntwo-phase against one-phase on the cluster, {args.rounds} alternated rounds "
        f"of {max(10, args.writes // 2)} pairs and recalls (pairs/s or recall p50 ms, each "
        "round; median):"
    )
    for key, label in (
        ("1p", "1 client"),
        ("1p_conc", f"{args.clients} clients"),
        ("1p_recall", "recall p50 ms"),
    ):
        one, two = rounds[key], rounds[key.replace("1p", "2p")]
        print(
            f"  {label:13} one-phase {' '.join(f'{x:.1f}' for x in one)} "
            f"(median {statistics.median(one):.1f}); two-phase "
            f"{' '.join(f'{x:.1f}' for x in two)} (median {statistics.median(two):.1f}); "
            # each round's two runs are neighbours in time: their ratio cancels the load
            f"two/one per round, median "
            f"{statistics.median(b / a for a, b in zip(one, two, strict=True)):.2f}"
        )
    print_delegation(delegation_rounds(cluster, args), args)
    print_nodes(cluster)
    drop(args.url, [(single.url, False), (cluster.url, True)])


def print_nodes(cluster: cc.Cluster) -> None:
    print("\nworker nodes a tenant-scoped call touches (counted by citus.log_remote_commands):")
    for name, (nodes, conns, commands) in nodes_touched(cluster, cluster.apart[0]).items():
        print(f"  {name:26} {nodes} node(s), {conns} connection(s), {commands} command(s)")


def drop(base: str, databases: list[tuple[str, bool]]) -> None:
    """Drop the bench's databases: on the coordinator, and on the workers for a cluster's."""
    coordinator, workers = cc._nodes(base)
    for url, on_workers in databases:
        name = sql.Identifier(conninfo_to_dict(url)["dbname"])
        for host, port in [coordinator, *(workers if on_workers else [])]:
            admin = _url(url, host=host, port=port, dbname="postgres")
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


if __name__ == "__main__":
    main()
