"""Graph recall at 100,000 records: how long a recall through the graph takes, with 1-hop and
2-hop expansion, end to end (`memfabric.recall.recall`, mode graph: the database's
resolution, the walk of the graph projection, the database's re-check of the candidates).

Prints, never asserts (docs/benchmarks.md, "Graph recall"). A fresh database (BENCH_GRAPH_DB,
default memfabric_bench_graph, dropped at the end unless --keep) on the server of
DATABASE_URL or the local one; --subjects subjects of --per-subject records each (default
100 x 1,000), formed through the governed write path (propose_many + commit_pending), each
record declaring 1-3 entities from its subject's pool (12 people, 6 organizations, 6 places:
so every entity links about a hundred records, the hard case for a walk). The tenant's
records are projected into the graph of the environment (NEO4J_URI, or the local Bolt server
of `make graph-up`; only this tenant's nodes are wiped and written). Then --questions
questions, each as the agent of a random subject naming one of its entities, are asked with
expand {"hops": 1} and {"hops": 2}, interleaved; the walk alone is timed too.
--keep keeps the database and the tenant's graph; --reuse measures them again without
forming or projecting anything (new runs, the same entity pools).
"""

from __future__ import annotations

import argparse
import os
import random
import time
import uuid
from datetime import UTC, datetime

from bench_projection import call, connect
from bench_write import machine
from benchlib import create_logins
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb
from quality.metrics import percentile

from memfabric import db
from memfabric.embedding import MiniLMEmbedder
from memfabric.graph import GraphStore
from memfabric.projector import Projector
from memfabric.recall import find_graph, recall

DBNAME = os.environ.get("BENCH_GRAPH_DB", "memfabric_bench_graph")
TENANT, AGENT, COMMITTER = "benchg", "benchg-agt-001", "benchg-agt-010"
TOOLS = ["tool:memory-propose", "tool:memory-recall"]
SCOPE = {"tiers": ["episodic"], "visibility": ["subject"]}
GROUPS = ("committer", "orchestrator", "admin", "projector")
LOGINS = {"benchg_agent": None, **{f"benchg_{g}": f"fabric_{g}" for g in GROUPS}}
OPEN_RUN = "SELECT fabric_api.open_run(%s, %s, %s, %s, %s, '12 hours'::interval)"
FIRST = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Gus", "Hana", "Ivo", "Jade", "Kofi",
         "Lena", "Milo", "Nia", "Omar", "Pia", "Quinn", "Rosa", "Sami", "Tove"]  # fmt: skip
ORGS = ["Bluefin Labs", "Crestline Bank", "Orbit Logistics", "Nimbus Software", "Summit Air",
        "Atlas Insurance", "Kestrel Robotics", "Juniper Analytics", "Lumen Studio"]  # fmt: skip
PLACES = ["Lisbon", "Denver", "Montreal", "Austin", "Seattle", "Toronto", "Oslo", "Kyoto"]
VERBS = ["met", "called", "emailed", "visited", "argued with", "had lunch with"]


def pools(rng: random.Random, s: int) -> list[tuple[str, str]]:
    people = [("person", f"{n} {s:03d}-{k}") for k, n in enumerate(rng.sample(FIRST, 12))]
    orgs = [("organization", f"{o} {s:03d}") for o in rng.sample(ORGS, 6)]
    places = [("location", p) for p in rng.sample(PLACES, 6)]
    return people + orgs + places


def envelope(rng: random.Random, pool: list[tuple[str, str]], n: int) -> dict[str, object]:
    ents = rng.sample(pool, rng.randint(1, 3))
    text = f"{rng.choice(VERBS)} " + " and ".join(name for _, name in ents) + f" (note {n})"
    return {
        "tier": "episodic",
        "scope": {"tenant_id": TENANT, "visibility": "subject"},
        "content": {"text": text, "entities": [{"type": t, "name": m} for t, m in ents]},
        "provenance": {
            "source_event_id": f"evt-{n}",
            "correlation_id": f"corr-{n % 97}",
            "formation_method": "extraction",
        },
        "confidence": 0.9,
    }


def open_runs(url: str, subjects: int, rng: random.Random) -> tuple[dict[str, uuid.UUID], dict]:
    """A run per subject and the subject's entity pool, drawn from `rng`: `load` draws its
    records from the same `rng` after them, and a database kept by --keep gets the same runs
    (opened again) and pools from a fresh `random.Random(seed)`."""
    runs, entity_pools = {}, {}
    with connect(url, "benchg_orchestrator") as orch:
        for s in range(subjects):
            subject = f"subject-{s:03d}"
            runs[subject] = call(orch, OPEN_RUN, TENANT, AGENT, subject, f"sess-{s}", TOOLS)
            entity_pools[subject] = pools(rng, s)
    return runs, entity_pools


def load(url: str, subjects: int, per: int, seed: int) -> tuple[dict[str, uuid.UUID], dict]:
    rng = random.Random(seed)
    runs, entity_pools = open_runs(url, subjects, rng)
    n = 0
    with connect(url, "benchg_agent") as agent, connect(url, "benchg_committer") as committer:
        for subject, run in runs.items():
            for k in range(0, per, 500):
                batch = [
                    envelope(rng, entity_pools[subject], n + i) for i in range(min(500, per - k))
                ]
                n += len(batch)
                answers = call(agent, "SELECT fabric_api.propose_many(%s, %s)", Jsonb(batch), run)
                assert all(a["status"] == "validated" for a in answers), answers[:1]
                done = call(committer, "SELECT fabric_api.commit_pending(%s)", len(batch))
                assert done["committed"] == len(batch), done
    return runs, entity_pools


def build(url: str, args: argparse.Namespace, graph: GraphStore) -> tuple[dict, dict]:
    """A new database: the logins, agents and tenant, the records formed, and the tenant
    projected into the graph; returns `load`'s runs and entity pools."""
    db.migrate(url)
    with connect(url) as su:
        create_logins(su, LOGINS)
    with connect(url, "benchg_admin") as admin:
        register = "SELECT fabric_api.register_agent(%s, %s, %s, %s)"
        call(admin, register, AGENT, "benchg_agent", Jsonb({"propose_scope": SCOPE,
             "recall_scope": SCOPE}), TOOLS)  # fmt: skip
        call(admin, register, COMMITTER, "benchg_committer", Jsonb({}), [])
        call(admin, "SELECT fabric_api.create_tenant(%s)", TENANT)
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", TENANT, AGENT, TOOLS)
        call(admin, "SELECT fabric_api.enable_agent(%s, %s, %s)", TENANT, COMMITTER, [])
    t = time.perf_counter()
    runs, entity_pools = load(url, args.subjects, args.per_subject, args.seed)
    total = args.subjects * args.per_subject
    print(f"formed {total} records in {time.perf_counter() - t:.0f} s", flush=True)
    with connect(url) as su:
        mentions = call(su, "SELECT count(*) FROM fabric.memory_mentions")
        entities = call(su, "SELECT count(*) FROM fabric.entities")
    print(f"{entities} entities, {mentions} mentions", flush=True)
    graph.ensure_schema()
    graph.wipe(TENANT)
    projector = Projector(db.url_for(url, "benchg_projector"), MiniLMEmbedder(), None, graph)
    t = time.perf_counter()
    with connect(db.url_for(url, "benchg_projector")) as conn:
        for rows in projector.snapshot(conn):
            projector.apply_graph(conn, [r for r in rows if r["tenant_id"] == TENANT])
    print(f"projected into the graph in {time.perf_counter() - t:.0f} s", flush=True)
    return runs, entity_pools


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--subjects", type=int, default=100)
    ap.add_argument("--per-subject", type=int, default=1000)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="measure a database kept by --keep")
    args = ap.parse_args()
    graph = find_graph()
    if graph is None:
        raise SystemExit("no graph server answers: `make graph-up`, or set NEO4J_URI")
    server = db.database_url()
    url = make_conninfo(server, dbname=DBNAME)
    if not args.reuse:
        with connect(server) as su:
            name = sql.Identifier(DBNAME)
            su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            su.execute(sql.SQL("CREATE DATABASE {}").format(name))
    try:
        if args.reuse:
            db.migrate(url)  # this checkout's SQL
            graph.ensure_schema()  # and its graph schema
            runs, entity_pools = open_runs(url, args.subjects, random.Random(args.seed))
        else:
            runs, entity_pools = build(url, args, graph)
        total = args.subjects * args.per_subject
        with connect(url) as su:
            mentions = call(su, "SELECT count(*) FROM fabric.memory_mentions")
            entities = call(su, "SELECT count(*) FROM fabric.entities")
        rng = random.Random(args.seed + 1)
        took: dict[int, list[float]] = {1: [], 2: []}
        walked: dict[int, list[float]] = {1: [], 2: []}
        found: dict[int, list[int]] = {1: [], 2: []}
        timed_walk = graph.walk

        def walk(*a: object, **k: object) -> list[tuple[str, float]]:
            t0 = time.perf_counter()
            out = timed_walk(*a, **k)  # type: ignore[arg-type]
            walked[current[0]].append(time.perf_counter() - t0)
            return out

        current = [1]
        graph.walk = walk  # type: ignore[method-assign]
        with connect(url, "benchg_agent") as agent:
            for i in range(args.questions + 10):
                subject = rng.choice(list(runs))
                _, name = rng.choice(entity_pools[subject])
                query = f"What do we know about {name}?"
                for hops in (1, 2) if i % 2 == 0 else (2, 1):
                    current[0] = hops
                    request = {"run_id": str(runs[subject]), "mode": "graph", "query": query,
                               "expand": {"hops": hops}, "limit": 10}  # fmt: skip
                    t0 = time.perf_counter()
                    answer = recall(agent, request, graph=graph)
                    dt = time.perf_counter() - t0
                    if i < 10:  # warm-up
                        walked[hops].pop()
                        continue
                    took[hops].append(dt)
                    found[hops].append(len(answer["records"]))
        cpu, pg = machine(url)
        loadavg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {cpu}; {pg}; load average {loadavg}")
        print(f"{total} records, {args.subjects} subjects, {entities} entities, {mentions}"
              f" mentions; {args.questions} questions each way\n")  # fmt: skip
        print("| expand | recall p50 | recall p95 | walk p50 | walk p95 | records returned |")
        print("|---|---|---|---|---|---|")
        for hops in (1, 2):
            ms = [x * 1e3 for x in took[hops]]
            ws = [x * 1e3 for x in walked[hops]]
            print(f"| {hops} hop{'s' if hops > 1 else ''} | {percentile(ms, 50):.1f} ms |"
                  f" {percentile(ms, 95):.1f} ms | {percentile(ws, 50):.1f} ms |"
                  f" {percentile(ws, 95):.1f} ms |"
                  f" {sum(found[hops]) / len(found[hops]):.1f} |")  # fmt: skip
    finally:
        if not args.keep:
            graph.wipe(TENANT)
            with connect(server) as su:
                su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(DBNAME)))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
