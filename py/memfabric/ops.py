"""Operations on the projections: rebuild, drill, verify.

Projections are disposable (R-PROJ-1): `rebuild` wipes one and rebuilds it from
Postgres alone, reusing stored embeddings; `drill` proves it by running a fixed probe set
(exact vector search with ties broken by memory_id, and graph reads), wiping, rebuilding and
running the probes again; `verify` compares counts and payload hashes with Postgres.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from memfabric.call import fabric_count
from memfabric.constants import INDEXED_TIERS
from memfabric.graph import GraphStore
from memfabric.projector import Projector, projectable, vector_payload
from memfabric.vectors import CollectionContract, VectorStore

if TYPE_CHECKING:
    from memfabric.operational import OperationalStore

Json = dict[str, Any]
Progress = Callable[[int, int], None]  # (done, total)


def _all_records(projector: Projector) -> list[Json]:
    with psycopg.connect(projector.conninfo, autocommit=True) as conn:
        return [r for page in projector.snapshot(conn) for r in page]


def rebuild(projector: Projector, target: str, progress: Progress = lambda _d, _t: None) -> Json:
    """Wipe and rebuild `qdrant`, `graph` or `all` from Postgres."""
    with psycopg.connect(projector.conninfo, autocommit=True) as conn:
        total = len([r for page in projector.snapshot(conn) for r in page])
    done: dict[str, int] = {}
    for projection in ("qdrant", "graph") if target == "all" else (target,):
        counted = _Counter(total, progress)
        done[projection] = projector.rebuild(projection, on_page=counted.step)
    return {"rebuilt": done, "records": total}


def prune(store: VectorStore, *, drop: bool = False) -> Json:
    """The vector collections no alias points at (`VectorStore.superseded`), dropped if
    `drop`: {"dropped": drop, "collections": [{"collection": physical name, its contract}]}."""
    found = store.drop_superseded() if drop else store.superseded()
    listed = [{"collection": name, **describe(c)} for name, c in sorted(found.items())]
    return {"dropped": drop, "collections": listed}


def describe(contract: CollectionContract) -> Json:
    """A contract as `prune` reports it, its payload version always named."""
    return {**contract.to_dict(), "payload": contract.payload}


class _Counter:
    def __init__(self, total: int, progress: Progress) -> None:
        self.done, self.total, self.progress = 0, total, progress

    def step(self, n: int) -> None:
        self.done += n
        self.progress(self.done, self.total)


def _probe_vectors(projector: Projector) -> list[tuple[str, list[float]]]:
    """Fixed probes: the embeddings of fixed texts (deterministic model)."""
    texts = ["billing entity", "invoice currency preference", "customer asked", "refund skill"]
    return list(zip(texts, projector.embedder.embed(texts), strict=True))


def probes(projector: Projector) -> Json:
    """Run the probe set against the current projections; a canonical, comparable answer."""
    records = _all_records(projector)
    out: Json = {"semantic": {}, "graph": {}}
    if projector.store is not None:
        from datetime import UTC, datetime

        from memfabric.vectors import RecallFilter

        tenants = sorted({r["tenant_id"] for r in records})
        for tenant in tenants:
            keys = sorted(
                {r["scope_key"] for r in records if r["tenant_id"] == tenant and r["scope_key"]}
            )
            if not keys:
                continue
            flt = RecallFilter(tenant_id=tenant, scope_keys=keys, valid_at=datetime.now(UTC))
            for text, vector in _probe_vectors(projector):
                hits = projector.store.search(list(INDEXED_TIERS), vector, flt, 10, exact=True)
                out["semantic"][f"{tenant}|{text}"] = [(i, round(s, 5)) for i, s in hits]
    if projector.graph is not None:
        graph: GraphStore = projector.graph
        for tenant in sorted({r["tenant_id"] for r in records}):
            export = graph.export(tenant)
            out["graph"][tenant] = hashlib.sha256(export.as_json().encode()).hexdigest()
            # the graph holds no names of people: a person node with one is a leak
            out["graph"][f"{tenant}|named_persons"] = sum(
                1
                for label, _, props in export.nodes
                if label == "Entity" and props.get("entity_type") == "person" and "name" in props
            )
            derived = sorted(
                r["memory_id"] for r in records if r["tenant_id"] == tenant and r["derived_from"]
            )
            for memory_id in derived[:5]:
                out["graph"][f"{tenant}|lineage|{memory_id}"] = graph.lineage(tenant, memory_id, 5)
    return out


def never_built(projector: Projector, records: list[Json]) -> list[str]:
    """The projections that hold nothing while Postgres holds records for them: never built
    (or wiped since). A drill on them would compare nothing with something."""
    unbuilt = []
    store = projector.store
    if (
        store is not None
        and any(projectable(r) for r in records)
        and not any(store.count(tier) for tier in INDEXED_TIERS)
    ):
        unbuilt.append("qdrant")
    if projector.graph is not None and records and not projector.graph.count_memories():
        unbuilt.append("graph")
    return unbuilt


def drill_declared(projector: Projector, progress: Progress = lambda _d, _t: None) -> Json:
    """The full-store drill: the fabric's projections and every operational store the
    deployment declares (MEMFABRIC_OPS_PACKS), each rebuilt from its own source."""
    from memfabric import operational

    stores = operational.open_declared()
    try:
        return drill(projector, progress, operational=stores)
    finally:
        for store in stores:
            store.close()


def drill(
    projector: Projector,
    progress: Progress = lambda _d, _t: None,
    operational: Sequence[OperationalStore] = (),
) -> Json:
    """Probes, wipe, rebuild, probes again; `identical` is the verdict (R-PROJ-1), and it
    fails too when the graph held a person node with a name (`named_persons`). Projections
    that were never built are named in `never_built` and left untouched. Each operational
    store is wiped and rebuilt from its declared source in the same drill (`operational`,
    one result each); any difference there fails the verdict too."""
    records = _all_records(projector)
    unbuilt = never_built(projector, records)
    if unbuilt:
        return {
            "identical": False,
            "never_built": unbuilt,
            "records": len(records),
            "differences": [],
            "rebuilt": {},
            "probes": 0,
        }
    before = probes(projector)
    rebuilt = rebuild(
        projector,
        "all"
        if projector.graph and projector.store
        else ("qdrant" if projector.store else "graph"),
        progress,
    )
    after = probes(projector)
    diffs = [
        k
        for k in sorted(set(before["semantic"]) | set(after["semantic"]))
        if before["semantic"].get(k) != after["semantic"].get(k)
    ]
    diffs += [
        k
        for k in sorted(set(before["graph"]) | set(after["graph"]))
        if before["graph"].get(k) != after["graph"].get(k)
    ]
    named = sum(v for k, v in before["graph"].items() if k.endswith("|named_persons"))
    from memfabric import operational as operational_stores

    stores = operational_stores.drill(operational)
    return {
        "identical": not diffs and not named and all(s["identical"] for s in stores),
        "operational": stores,
        "named_persons": named,
        "records": len(records),
        "differences": diffs,
        "rebuilt": rebuilt["rebuilt"],
        "probes": len(before["semantic"]) + len(before["graph"]),
    }


def _payload_hash(payload: Json) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def verify(projector: Projector) -> Json:
    """Counts and payload hashes, Postgres against each projection: drift and orphans."""
    records = _all_records(projector)
    report: Json = {"records": len(records)}
    if projector.store is not None:
        expected = {
            r["memory_id"]: (r["tier"], vector_payload(r).to_payload())
            for r in records
            if projectable(r)
        }
        seen: dict[str, tuple[str, Json]] = {}
        for tier in INDEXED_TIERS:
            for memory_id, payload in projector.store.scroll(tier):
                seen[memory_id] = (tier, payload)

        def drifted(memory_id: str) -> bool:
            tier, want = expected[memory_id]
            got_tier, got = seen[memory_id]
            same = _payload_hash(want) == _payload_hash({k: got.get(k) for k in want})
            return tier != got_tier or not same

        report["qdrant"] = {
            "expected": len(expected),
            "points": len(seen),
            "missing": sorted(set(expected) - set(seen)),
            "orphans": sorted(set(seen) - set(expected)),
            "drift": sorted(m for m in set(expected) & set(seen) if drifted(m)),
        }
    if projector.graph is not None:
        by_tenant: dict[str, int] = {}
        for r in records:
            by_tenant[r["tenant_id"]] = by_tenant.get(r["tenant_id"], 0) + 1
        report["graph"] = {
            t: {"expected": n, "nodes": projector.graph.count_memories(t)}
            for t, n in sorted(by_tenant.items())
        }
        report["graph_drift"] = sorted(
            t for t, v in report["graph"].items() if v["expected"] != v["nodes"]
        )
    # a rebuild that began and did not end: what it wiped may not all be back
    report["unfinished_rebuilds"] = {
        p: began.isoformat() for p, began in sorted(projector.unfinished_rebuilds().items())
    }
    qdrant = report.get("qdrant", {})
    report["ok"] = (
        not any(qdrant.get(k) for k in ("missing", "orphans", "drift"))
        and not report.get("graph_drift")
        and not report["unfinished_rebuilds"]
    )
    return report


def projection_lag(projector: Projector) -> int:
    """Outbox events the slower projection has not applied yet (capped at 10000)."""
    with psycopg.connect(projector.conninfo, autocommit=True) as conn:
        return max(
            fabric_count(conn, "fabric_api.projection_events_v2", p, 10000)
            for p in ("qdrant", "graph")
        )
