"""A worked example pack: the Trading pack's regime fingerprints, a domain table in its own
schema (`trd.regime_fingerprints`, write-authoritative) projected into the operational
collection `ops_trd_regime_fingerprints` on a real Qdrant Edge shard, rebuilt from that
table in the drill; and its regime graph on the real Bolt server, read only through the
allowlisted wrapper. Neither is reachable through recall."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import neo4j
import psycopg
import pytest

from conftest import Fabric
from memfabric.operational import (
    CollectionNotAllowed,
    EdgeOperationalStore,
    GraphQuery,
    OperationalError,
    OperationalGraph,
    OpsCollection,
    OpsRow,
    ScopeRequired,
    drill,
    point_id,
)
from servers import DATABASE, PASSWORD, GraphServer

pytestmark = pytest.mark.rollback

# The pack's own schema: the source of truth the collection is rebuilt from.
TRD_SCHEMA = """
CREATE SCHEMA trd;
CREATE TABLE trd.regime_fingerprints (
  tenant_id             text NOT NULL,
  business_instance_id  text NOT NULL,
  regime_version        text NOT NULL,
  label                 text NOT NULL,
  fingerprint           double precision[] NOT NULL,
  PRIMARY KEY (tenant_id, business_instance_id, regime_version)
);
INSERT INTO trd.regime_fingerprints VALUES
  ('acme', 'bi-eu', 'v1', 'calm', '{1,0,0,0}'),
  ('acme', 'bi-eu', 'v2', 'trending', '{0.8,0.2,0,0}'),
  ('acme', 'bi-us', 'v1', 'us calm', '{1,0,0,0}'),
  ('globex', 'bi-eu', 'v1', 'globex calm', '{1,0,0,0}');
"""


def regime_fingerprints(conn: psycopg.Connection[Any]) -> OpsCollection:
    """The pack's declaration of its one operational collection."""

    def read_source() -> list[OpsRow]:
        rows = conn.execute(
            "SELECT tenant_id, business_instance_id, regime_version, label, fingerprint "
            "FROM trd.regime_fingerprints ORDER BY 1, 2, 3"
        ).fetchall()
        return [OpsRow(t, bi, (v,), f, {"label": label}) for t, bi, v, label, f in rows]

    return OpsCollection(
        pack="trd",
        store="regime_fingerprints",
        domain_key=("regime_version",),
        source="trd.regime_fingerprints",
        read_source=read_source,
        model="trd-fingerprint",
        model_version="1",
        dims=4,
        readiness="scenario_vectors_ready:{regime_version}",
    )


@pytest.fixture
def pack(fabric: Fabric) -> psycopg.Connection[Any]:
    conn = fabric.su()
    conn.execute(TRD_SCHEMA)
    return conn


@pytest.fixture
def store(pack: psycopg.Connection[Any], tmp_path: Path) -> Iterator[EdgeOperationalStore]:
    with EdgeOperationalStore(tmp_path / "ops", regime_fingerprints(pack)) as s:
        s.rebuild()
        yield s


def test_the_collection_is_built_from_the_domain_table(store: EdgeOperationalStore) -> None:
    hits = store.search("acme", "bi-eu", [1, 0, 0, 0], ready="scenario_vectors_ready:v2")
    assert [(h[0], h[2]["label"]) for h in hits] == [
        (point_id("acme", "bi-eu", ["v1"]), "calm"),
        (point_id("acme", "bi-eu", ["v2"]), "trending"),
    ]
    assert store.count() == 4


def test_the_drill_wipes_and_rebuilds_from_the_domain_table_with_identical_answers(
    pack: psycopg.Connection[Any], store: EdgeOperationalStore
) -> None:
    (result,) = drill([store])
    assert result == {
        "collection": "ops_trd_regime_fingerprints",
        "source": "trd.regime_fingerprints",
        "points": 4,
        "flags": ["scenario_vectors_ready:v1", "scenario_vectors_ready:v2"],
        "probes": 4,
        "identical": True,
    }
    # the source changed (the domain schema is the truth): the rebuild follows it
    pack.execute("DELETE FROM trd.regime_fingerprints WHERE regime_version = 'v2'")
    store.rebuild()
    assert [h[2]["label"] for h in store.search("acme", "bi-eu", [1, 0, 0, 0])] == ["calm"]


def test_recall_never_serves_an_operational_point(
    fabric: Fabric, store: EdgeOperationalStore
) -> None:
    run = fabric.open_run()
    episode = fabric.form(run, "a calm regime episode")
    ids = [h[0] for h in store.search("acme", "bi-eu", [1, 0, 0, 0])]
    answer = fabric.recall(
        "mf_agent_a",
        {
            "run_id": str(run),
            "tiers": ["episodic"],
            "mode": "semantic",
            "query": "calm regime",
            "candidates": [{"memory_id": i, "score": 0.9} for i in [*ids, episode]],
        },
    )
    # the memory is served, the operational points a broker might pass are not
    assert answer["status"] == "served"
    assert [r["memory_id"] for r in answer["records"]] == [episode]


# --- the regime graph: read only through the allowlisted wrapper ----------------------------

REGIMES_AFTER = GraphQuery(
    "MATCH (a:TrdRegime {tenant_id: $tenant_id, business_instance_id: $business_instance_id, "
    "regime_version: $version})-[:TRD_FOLLOWED_BY]->(b:TrdRegime) "
    "WHERE b.tenant_id = $tenant_id AND b.business_instance_id = $business_instance_id "
    "RETURN b.regime_version AS version ORDER BY version",
    params=("version",),
    instance_owned=True,
)


@pytest.fixture
def regime_graph(graph_server: GraphServer) -> Iterator[Any]:
    """The pack's writer workflow projects its regime graph (tenant-namespaced nodes)."""
    with neo4j.GraphDatabase.driver(graph_server.uri, auth=("root", PASSWORD)) as driver:
        with driver.session(database=DATABASE) as s:
            s.run(
                "UNWIND $rows AS r "
                "CREATE (a:TrdRegime {ops_id: r.a_id, tenant_id: r.t, business_instance_id: r.bi, "
                "regime_version: r.a, marker: $marker}) "
                "CREATE (b:TrdRegime {ops_id: r.b_id, tenant_id: r.t, business_instance_id: r.bi, "
                "regime_version: r.b, marker: $marker}) "
                "CREATE (a)-[:TRD_FOLLOWED_BY]->(b)",
                rows=[
                    {
                        "t": t,
                        "bi": bi,
                        "a": a,
                        "b": b,
                        "a_id": point_id(t, bi, [a]),
                        "b_id": point_id(t, bi, [b]),
                    }
                    for t, bi, a, b in (
                        ("acme", "bi-eu", "v1", "v2"),
                        ("globex", "bi-eu", "v1", "v9"),
                    )
                ],
                marker=MARKER,
            ).consume()
        yield driver
        with driver.session(database=DATABASE) as s:
            s.run("MATCH (n:TrdRegime {marker: $m}) DETACH DELETE n", m=MARKER).consume()


MARKER = str(uuid.uuid4())


def test_an_operational_graph_is_read_for_the_authenticated_tenant_only(regime_graph: Any) -> None:
    queries = {"regimes_after": REGIMES_AFTER}
    acme = OperationalGraph(regime_graph, DATABASE, queries, "acme", "bi-eu")
    assert acme.read("regimes_after", version="v1") == [{"version": "v2"}]
    globex = OperationalGraph(regime_graph, DATABASE, queries, "globex", "bi-eu")
    assert globex.read("regimes_after", version="v1") == [{"version": "v9"}]
    other = OperationalGraph(regime_graph, DATABASE, queries, "acme", "bi-us")
    assert other.read("regimes_after", version="v1") == []


def test_only_allowlisted_queries_with_their_parameters_run(regime_graph: Any) -> None:
    acme = OperationalGraph(
        regime_graph, DATABASE, {"regimes_after": REGIMES_AFTER}, "acme", "bi-eu"
    )
    with pytest.raises(CollectionNotAllowed):
        acme.read("MATCH (n) RETURN n")
    with pytest.raises(OperationalError):  # the tenant is injected, never passed
        acme.read("regimes_after", version="v1", tenant_id="globex")
    with pytest.raises(OperationalError):
        acme.read("regimes_after")
    no_instance = OperationalGraph(regime_graph, DATABASE, {"regimes_after": REGIMES_AFTER}, "acme")
    with pytest.raises(ScopeRequired):
        no_instance.read("regimes_after", version="v1")
