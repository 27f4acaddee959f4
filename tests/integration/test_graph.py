"""The graph projection (memfabric.graph) against a real Bolt server: ArcadeDB, the session's
`graph_server` (tests/servers.py), started by scripts/graph.sh on free ports with its own
temporary root, so a developer's server on the default ports is never touched (and never
wiped)."""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import neo4j
import pytest

from memfabric.graph import GraphStore, graph_from_env
from servers import DATABASE, PASSWORD, GraphServer, graph_sh


@pytest.fixture
def store(graph_server: GraphServer) -> Iterator[GraphStore]:
    with GraphStore(graph_server.uri, "root", PASSWORD, DATABASE) as s:
        s.ensure_schema()
        s.wipe()
        yield s


@pytest.fixture
def raw(graph_server: GraphServer) -> Iterator[neo4j.Session]:
    """A plain driver session for checks the store does not offer."""
    with (
        neo4j.GraphDatabase.driver(graph_server.uri, auth=("root", PASSWORD)) as driver,
        driver.session(database=DATABASE) as session,
    ):
        yield session


def row(tenant: str, memory_id: str, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tenant_id": tenant,
        "memory_id": memory_id,
        "tier": "episodic",
        "consolidation_state": "raw",
        "visibility": "subject",
        "scope_key": "subject:user-8842",
        "content_hash": "sha256:" + hashlib.sha256(memory_id.encode()).hexdigest(),
        "formation_method": "extraction",
        "formed_by": "os-agt-003",
        "valid_from": "2026-01-01T00:00:00+00:00",
        "valid_until": None,
        "confidence": 0.8,
        "derived_from": [],
        "supersedes": None,
    }
    return base | overrides


def lineage_world(tenant: str) -> list[dict[str, Any]]:
    """e1, e2, e3 episodic; s1 <- e1, e2; s2 <- s1, e3; p1 <- s2 superseding s1's rival."""
    return [
        row(tenant, "e1"),
        row(tenant, "e2", formed_by="os-agt-004"),
        row(tenant, "e3", valid_until="2026-06-01T00:00:00+00:00"),
        row(
            tenant,
            "s1",
            tier="semantic",
            formation_method="consolidation",
            formed_by="os-agt-010",
            derived_from=["e1", "e2"],
            confidence=0.1 + 0.2,
        ),
        row(
            tenant,
            "s2",
            tier="semantic",
            consolidation_state="consolidated",
            formation_method="consolidation",
            formed_by="os-agt-010",
            derived_from=["s1", "e3"],
        ),
        row(
            tenant,
            "p1",
            tier="procedural",
            formation_method="distillation",
            formed_by="os-agt-010",
            derived_from=["s2"],
            supersedes="s1",
            confidence=None,
        ),
    ]


# -- schema --------------------------------------------------------------------------------


def test_schema_is_idempotent_and_enforced(store: GraphStore, raw: neo4j.Session) -> None:
    store.ensure_schema()
    store.ensure_schema()
    constraints = {r["name"]: r for r in raw.run("SHOW CONSTRAINTS").data()}
    assert set(constraints) >= {"memory_key", "agent_key"}
    assert constraints["memory_key"]["labelsOrTypes"] == ["Memory"]
    assert constraints["memory_key"]["properties"] == ["tenant_id", "memory_id"]
    assert constraints["agent_key"]["properties"] == ["tenant_id", "agent_id"]
    assert [r["name"] for r in raw.run("SHOW CONSTRAINTS").data()].count("memory_key") == 1

    raw.run("CREATE (:Memory {tenant_id: 'dup', memory_id: 'm'})").consume()
    with pytest.raises(neo4j.exceptions.ConstraintError):
        raw.run("CREATE (:Memory {tenant_id: 'dup', memory_id: 'm'})").consume()
    # The same memory id in another tenant is another node.
    raw.run("CREATE (:Memory {tenant_id: 'dup2', memory_id: 'm'})").consume()
    assert store.count_memories() == 2


# -- upsert --------------------------------------------------------------------------------


def test_upsert_shape_and_idempotence(store: GraphStore) -> None:
    rows = lineage_world("acme")
    assert store.upsert_memories(rows) == len(rows)
    first = store.export("acme")
    assert store.upsert_memories(rows) == len(rows)
    assert store.export("acme") == first
    assert store.export("acme").as_json() == first.as_json()

    nodes = {(label, key): props for label, key, props in first.nodes}
    assert set(nodes) == {
        ("Agent", "acme:os-agt-003"),
        ("Agent", "acme:os-agt-004"),
        ("Agent", "acme:os-agt-010"),
        *{("Memory", f"acme:{m}") for m in ("e1", "e2", "e3", "s1", "s2", "p1")},
    }
    s1 = nodes[("Memory", "acme:s1")]
    assert s1["confidence"] == 0.1 + 0.2  # full double precision
    assert s1["tier"] == "semantic"
    assert s1["formed_by"] == "os-agt-010"
    assert "valid_until" not in s1  # None is no property
    assert "confidence" not in nodes[("Memory", "acme:p1")]
    assert nodes[("Memory", "acme:e3")]["valid_until"] == "2026-06-01T00:00:00+00:00"
    assert nodes[("Agent", "acme:os-agt-010")] == {"agent_id": "os-agt-010", "tenant_id": "acme"}

    assert first.edges == sorted(
        [
            ("DERIVED_FROM", "acme:p1", "acme:s2"),
            ("DERIVED_FROM", "acme:s1", "acme:e1"),
            ("DERIVED_FROM", "acme:s1", "acme:e2"),
            ("DERIVED_FROM", "acme:s2", "acme:e3"),
            ("DERIVED_FROM", "acme:s2", "acme:s1"),
            ("FORMED", "acme:os-agt-003", "acme:e1"),
            ("FORMED", "acme:os-agt-003", "acme:e3"),
            ("FORMED", "acme:os-agt-004", "acme:e2"),
            ("FORMED", "acme:os-agt-010", "acme:p1"),
            ("FORMED", "acme:os-agt-010", "acme:s1"),
            ("FORMED", "acme:os-agt-010", "acme:s2"),
            ("SUPERSEDES", "acme:p1", "acme:s1"),
        ]
    )


def test_changed_properties_replace_old_ones(store: GraphStore) -> None:
    store.upsert_memories([row("acme", "m1", valid_until="2027-01-01T00:00:00+00:00")])
    store.upsert_memories([row("acme", "m1", consolidation_state="expired", confidence=None)])
    (_, _, props) = next(n for n in store.export("acme").nodes if n[0] == "Memory")
    assert props["consolidation_state"] == "expired"
    assert "confidence" not in props
    assert "valid_until" not in props


def test_derived_from_edges_regardless_of_batch_order(graph_server: GraphServer) -> None:
    rows = lineage_world("acme")
    exports = []
    orders = [rows, rows[::-1], random.Random(7).sample(rows, len(rows))]
    for order, batch_size in zip(orders, (500, 1, 2), strict=True):
        with GraphStore(graph_server.uri, "root", PASSWORD, DATABASE, batch_size=batch_size) as s:
            s.ensure_schema()
            s.wipe()
            s.upsert_memories(order)
            exports.append(s.export("acme"))
    assert exports[0] == exports[1] == exports[2]


def test_child_before_parent_leaves_a_bare_parent_until_it_arrives(store: GraphStore) -> None:
    store.upsert_memories([row("acme", "child", derived_from=["parent"], supersedes="old")])
    nodes = {key: props for label, key, props in store.export("acme").nodes if label == "Memory"}
    assert nodes["acme:parent"] == {"memory_id": "parent", "tenant_id": "acme"}
    assert nodes["acme:old"] == {"memory_id": "old", "tenant_id": "acme"}
    store.upsert_memories([row("acme", "parent")])
    after = store.export("acme")
    assert ("DERIVED_FROM", "acme:child", "acme:parent") in after.edges
    assert ("SUPERSEDES", "acme:child", "acme:old") in after.edges
    assert store.count_memories("acme") == 3


def test_tenant_isolation(store: GraphStore, raw: neo4j.Session) -> None:
    store.upsert_memories(lineage_world("acme") + lineage_world("globex"))
    store.upsert_memories([row("globex", "g-only", derived_from=["e1"])])
    assert store.count_memories("acme") == 6
    assert store.count_memories("globex") == 7
    assert store.count_memories() == 13
    # Same agent id in both tenants: two Agent nodes.
    agents = raw.run("MATCH (a:Agent {agent_id: 'os-agt-010'}) RETURN a.tenant_id AS t").data()
    assert sorted(r["t"] for r in agents) == ["acme", "globex"]
    crossing = raw.run(
        "MATCH (a)-[r]->(b) WHERE a.tenant_id <> b.tenant_id RETURN count(r) AS n"
    ).single(strict=True)
    assert crossing["n"] == 0

    acme, globex = store.export("acme"), store.export("globex")
    assert all(key.startswith("acme:") for _, key, _ in acme.nodes)
    assert all(props["tenant_id"] == "acme" for _, _, props in acme.nodes)
    assert all(k.startswith("acme:") for _, a, b in acme.edges for k in (a, b))
    assert len(globex.edges) == len(acme.edges) + 2  # g-only: FORMED + DERIVED_FROM
    assert "g-only" not in store.lineage("acme", "s2", 5)
    # Forgetting in one tenant leaves the other tenant's node with the same id alone.
    store.forget("acme", ["s1"])
    g_s1 = next(p for _, k, p in store.export("globex").nodes if k == "globex:s1")
    assert g_s1["tier"] == "semantic"
    # Wiping one tenant leaves the other whole.
    store.wipe("acme")
    assert store.count_memories("acme") == 0
    assert store.export("globex") == globex


# -- erasure -------------------------------------------------------------------------------


def test_forget_keeps_edges_and_hash_and_clears_the_rest(store: GraphStore) -> None:
    rows = lineage_world("acme")
    store.upsert_memories(rows)
    before = store.export("acme")
    assert store.forget("acme", ["s1", "s1"]) == 1
    after = store.export("acme")
    assert after.edges == before.edges  # FORMED, DERIVED_FROM and SUPERSEDES all kept
    s1 = next(p for _, k, p in after.nodes if k == "acme:s1")
    s1_hash = next(r["content_hash"] for r in rows if r["memory_id"] == "s1")
    assert s1 == {
        "tenant_id": "acme",
        "memory_id": "s1",
        "content_hash": s1_hash,
        "consolidation_state": "tombstoned",
    }
    # Every other node unchanged.
    assert [n for n in after.nodes if n[1] != "acme:s1"] == [
        n for n in before.nodes if n[1] != "acme:s1"
    ]
    # A replayed upsert (at-least-once delivery) does not resurrect the erased properties.
    store.upsert_memories(rows)
    assert store.export("acme") == after
    # Lineage still walks through the tombstone.
    assert store.lineage("acme", "p1", 10) == ["s2", "e3", "s1", "e1", "e2"]


def test_forget_before_first_projection_converges(store: GraphStore) -> None:
    rows = lineage_world("acme")
    store.upsert_memories(rows)
    store.forget("acme", ["s1"])
    expected = store.export("acme")

    store.wipe()
    store.forget("acme", ["s1"])  # the erasure event is projected first
    store.upsert_memories(rows)  # then the (stale) memory rows
    assert store.export("acme") == expected


def test_tombstoned_row_projects_as_tombstone(store: GraphStore) -> None:
    erased = row(
        "acme",
        "m1",
        consolidation_state="tombstoned",
        scope_key=None,
        formed_by=None,
        derived_from=["m0"],
    )
    store.upsert_memories([erased])
    nodes = {k: p for label, k, p in store.export("acme").nodes if label == "Memory"}
    assert nodes["acme:m1"] == {
        "tenant_id": "acme",
        "memory_id": "m1",
        "content_hash": erased["content_hash"],
        "consolidation_state": "tombstoned",
    }
    assert store.export("acme").edges == [("DERIVED_FROM", "acme:m1", "acme:m0")]


# -- wipe / rebuild ------------------------------------------------------------------------


def test_wipe_then_reupsert_gives_an_identical_export(store: GraphStore) -> None:
    rows = lineage_world("acme") + lineage_world("globex")
    store.upsert_memories(rows)
    store.forget("acme", ["e2"])
    erased = {"e2"}
    before = {t: store.export(t) for t in ("acme", "globex")}
    deleted = store.wipe()
    assert deleted == 12 + 3 * 2  # memories + per-tenant agents
    assert store.count_memories() == 0
    assert store.export("acme").nodes == [] and store.export("acme").edges == []
    # The rebuild replays Postgres's current state: the erased record comes as a tombstone.
    rebuilt = [
        r
        if not (r["tenant_id"] == "acme" and r["memory_id"] in erased)
        else r | {"consolidation_state": "tombstoned"}
        for r in rows
    ]
    store.upsert_memories(rebuilt)
    assert {t: store.export(t) for t in ("acme", "globex")} == before


# -- hostile input -------------------------------------------------------------------------


def test_parameters_with_quotes_backslashes_and_unicode_survive(
    store: GraphStore, raw: neo4j.Session
) -> None:
    tenant = "t'en\"ant\\ ü"
    nasty = [
        "it's",
        'say "hi"',
        "back\\slash\\",
        "\\'",
        "'}) MATCH (n) DETACH DELETE n //",
        "` backtick`",
        "$param",
        "ünïcødé — 漢字 😀 \u200b",
        "line\nbreak\ttab\r",
        "x" * 100_000,
    ]
    store.upsert_memories([row("victim", "v1")])
    rows = [
        row(
            tenant,
            f"m-{i}-{value[:20]}",
            scope_key=value,
            formed_by=value[:200],  # an index key: Neo4j refuses keys over ~8 KB
            formation_method=value,
            derived_from=[f"m-{(i + 1) % len(nasty)}-{nasty[(i + 1) % len(nasty)][:20]}"],
        )
        for i, value in enumerate(nasty)
    ]
    store.upsert_memories(rows)
    export = store.export(tenant)
    by_key = {k: p for label, k, p in export.nodes if label == "Memory"}
    for r in rows:
        props = by_key[f"{tenant}:{r['memory_id']}"]
        assert props["scope_key"] == r["scope_key"]
        assert props["formed_by"] == r["formed_by"]
        assert props["formation_method"] == r["formation_method"]
        assert props["tenant_id"] == tenant
    assert len(export.edges) == 2 * len(nasty)
    assert sorted(a for label, a, _ in export.nodes if label == "Agent") == sorted(
        f"{tenant}:{v[:200]}" for v in nasty
    )
    assert store.count_memories("victim") == 1
    assert store.forget(tenant, [rows[4]["memory_id"]]) == 1
    assert store.count_memories() == 1 + len(nasty)
    assert len(store.lineage(tenant, rows[0]["memory_id"], 100)) == len(nasty) - 1
    assert raw.run("MATCH (n) RETURN count(n) AS n").single(strict=True)["n"] == (
        1 + 1 + 2 * len(nasty)  # victim + its agent, tenant's memories + agents
    )


def test_invalid_rows_write_nothing(store: GraphStore) -> None:
    good = row("acme", "ok")
    missing = row("acme", "bad")
    del missing["content_hash"]
    with pytest.raises(ValueError, match="missing keys"):
        store.upsert_memories([good, missing])
    with pytest.raises(ValueError, match="tenant_id"):
        store.upsert_memories([good, row("", "x")])
    with pytest.raises(ValueError, match="derived_from"):
        store.upsert_memories([good, row("acme", "x", derived_from="e1")])
    with pytest.raises(ValueError, match="confidence"):
        store.upsert_memories([good, row("acme", "x", confidence="high")])
    with pytest.raises(ValueError, match="depth"):
        store.lineage("acme", "ok", -1)
    assert store.count_memories() == 0


# -- lineage -------------------------------------------------------------------------------


def test_lineage(store: GraphStore) -> None:
    store.upsert_memories(lineage_world("acme"))
    assert store.lineage("acme", "p1", 0) == []
    assert store.lineage("acme", "p1", 1) == ["s2"]
    assert store.lineage("acme", "p1", 2) == ["s2", "e3", "s1"]
    assert store.lineage("acme", "p1", 3) == ["s2", "e3", "s1", "e1", "e2"]
    assert store.lineage("acme", "p1", 50) == ["s2", "e3", "s1", "e1", "e2"]
    assert store.lineage("acme", "e1", 5) == []
    assert store.lineage("acme", "unknown", 5) == []
    assert store.lineage("globex", "p1", 5) == []


def mention(memory_id: str, entity_id: str, entity_type: str = "location") -> dict[str, Any]:
    return {
        "tenant_id": "acme",
        "memory_id": memory_id,
        "entity_id": entity_id,
        "entity_type": entity_type,
        "name": entity_id.title(),
        "subject_ref": None,
        "source": "declared",
        "correlation_id": "corr-1",
        "valid_from": "2026-01-01T00:00:00+00:00",
        "valid_until": None,
    }


def test_a_walk_through_a_hub_reads_the_callers_scope_and_finds_the_same(
    store: GraphStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entity most of whose records are outside the caller's scope (a city the whole
    tenant mentions) is walked from the scope's records instead of its own edges, with the
    same pairs: the walk's answer is the one reading the edges gives."""
    from memfabric import graph

    scope = "subject:user-8842"
    rows = [row("acme", f"in{i}", scope_key=scope) for i in range(4)]
    rows += [row("acme", f"out{i:02d}", scope_key="subject:user-9999") for i in range(30)]
    store.upsert_memories(rows)
    store.upsert_mentions(
        [mention("in0", "dana", "person"), mention("in3", "dana", "person")]
        + [mention(m, "lisbon") for m in ("in0", "in1", "in2")]
        + [mention(f"out{i:02d}", "lisbon") for i in range(30)]
    )
    ran: list[str] = []
    run = neo4j.ManagedTransaction.run

    def spy(self: neo4j.ManagedTransaction, query: Any, *args: Any, **kwargs: Any) -> Any:
        ran.append(str(query))
        return run(self, query, *args, **kwargs)

    monkeypatch.setattr(neo4j.ManagedTransaction, "run", spy)

    def walk() -> list[tuple[str, float]]:
        return store.walk("acme", ["dana"], 2, [scope], ["episodic"])

    # Lisbon's 33 edges against a scope of 4 records, each worth 2 edges: the scope is read
    monkeypatch.setattr(graph, "SCOPE_WALK_EDGES", 10)
    monkeypatch.setattr(graph, "SCOPE_READ_COST", 2)
    from_scope = walk()
    assert ran.count(graph._WALK_SCOPE_MENTIONING) == 1  # hop 2 (Dana's two edges: hop 1)
    assert ran.count(graph._WALK_MENTIONING) == 1
    ran.clear()
    monkeypatch.setattr(graph, "SCOPE_WALK_EDGES", 10**9)  # the edges are always read
    from_edges = walk()
    assert graph._WALK_SCOPE_MENTIONING not in ran
    assert [m for m, _ in from_scope] == [m for m, _ in from_edges] == ["in0", "in3", "in1", "in2"]
    assert from_scope == from_edges


# -- volume --------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_thousand_node_batch_upsert(
    store: GraphStore, graph_server: GraphServer, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 2_000

    def bulk(tenant: str) -> list[dict[str, Any]]:
        rng = random.Random(42)
        rows = []
        for i in range(n):
            parents = sorted({f"mem-{rng.randrange(i)}" for _ in range(2)}) if i >= 10 else []
            rows.append(
                row(
                    tenant,
                    f"mem-{i}",
                    tier="semantic" if parents else "episodic",
                    formed_by=f"os-agt-{i % 7:03d}",
                    derived_from=parents,
                    confidence=rng.random(),
                )
            )
        return rows

    def timed(rows: list[dict[str, Any]]) -> float:
        started = time.perf_counter()
        store.upsert_memories(rows)
        return time.perf_counter() - started

    rows = bulk("bulk")
    edges = sum(len(r["derived_from"]) for r in rows)
    cold = timed(rows)  # a fresh JVM: the first big write pays for JIT compilation
    again = timed(rows)  # the same rows: every MERGE matches
    warm = timed(bulk("bulk2"))  # new nodes and edges, warm JVM

    for tenant in ("bulk", "bulk2"):
        assert store.count_memories(tenant) == n
        export = store.export(tenant)
        assert len(export.nodes) == n + 7
        assert len(export.edges) == n + edges  # FORMED per memory + DERIVED_FROM
    assert store.export("bulk").edges == [
        (t, a.replace("bulk2:", "bulk:"), b.replace("bulk2:", "bulk:"))
        for t, a, b in store.export("bulk2").edges
    ]
    rss_kb = next(
        int(line.split()[1])
        for line in Path(f"/proc/{graph_server.pid()}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    with capsys.disabled():
        print(
            f"\n[graph] upsert of {n} memories (+ {edges} DERIVED_FROM, {n} FORMED edges) in "
            f"batches of {store.batch_size}: first {n / cold:.0f} rows/s ({cold:.2f} s), "
            f"idempotent re-run {n / again:.0f} rows/s, new tenant with a warm JVM "
            f"{n / warm:.0f} rows/s; server RSS {rss_kb // 1024} MB"
        )


# -- configuration and the script ----------------------------------------------------------


def test_graph_from_env_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NEO4J_URI", "NEO4J_USER", "NEO4J_PASSWORD", "NEO4J_DATABASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GRAPH_BOLT_PORT", raising=False)
    with graph_from_env() as local:
        assert (local.uri, local.database) == ("bolt://127.0.0.1:57687", "graph")
    monkeypatch.setenv("NEO4J_URI", "bolt://neo4j.example:7687")
    with pytest.raises(RuntimeError, match="NEO4J_PASSWORD"):
        graph_from_env()
    monkeypatch.setenv("NEO4J_PASSWORD", "secret")
    with graph_from_env() as remote:
        assert (remote.uri, remote.database) == ("bolt://neo4j.example:7687", "neo4j")
    monkeypatch.setenv("NEO4J_DATABASE", "memories")
    with graph_from_env() as remote:
        assert remote.database == "memories"


def test_script_status_url_and_neo4j_uri(graph_server: GraphServer) -> None:
    status = graph_sh(graph_server.env, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.startswith("[graph] running")
    again = graph_sh(graph_server.env, "up")  # idempotent
    assert again.returncode == 0 and "already running" in again.stdout
    url = graph_sh(graph_server.env, "url")
    assert url.stdout.strip() == graph_server.uri
    external = graph_server.env | {"NEO4J_URI": "bolt://neo4j.example:7687"}
    for cmd in ("up", "down"):
        out = graph_sh(external, cmd)
        assert out.returncode == 0 and "NEO4J_URI is set" in out.stdout
    assert graph_sh(external, "url").stdout.strip() == "bolt://neo4j.example:7687"
    assert graph_sh(graph_server.env, "status").returncode == 0  # still ours, still up
    other = graph_server.env | {"GRAPH_ROOT": str(graph_server.root.parent / "nothing")}
    assert graph_sh(other, "status").returncode == 3


def test_a_store_refuses_a_bad_batch_size_or_retry_time() -> None:
    # validated before the driver is made: no server is needed to be refused
    with pytest.raises(ValueError, match="batch_size"):
        GraphStore("bolt://127.0.0.1:1", "root", "x", batch_size=0)
    with pytest.raises(ValueError, match="retry_seconds"):
        GraphStore("bolt://127.0.0.1:1", "root", "x", retry_seconds=-1)
