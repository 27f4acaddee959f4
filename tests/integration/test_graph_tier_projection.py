"""The graph tier projected: agent lineage links as INFLUENCED edges, entities and MENTIONS
edges from PostgreSQL rows, a correlation id on every node and edge written, persons held
without names (a subject's only by its pseudonym), subject erasure removing the person's
nodes and edges, and a rebuild from PostgreSQL giving the same graph."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import Fabric, call, drained, episode
from memfabric.embedding import MiniLMEmbedder
from memfabric.graph import GraphStore
from memfabric.projector import Projector
from servers import DATABASE, PASSWORD, GraphServer


@pytest.fixture
def graph(graph_server: GraphServer) -> Iterator[GraphStore]:
    with GraphStore(graph_server.uri, "root", PASSWORD, DATABASE) as g:
        g.ensure_schema()
        g.wipe()
        yield g


@pytest.fixture
def projector(fabric: Fabric, graph: GraphStore, minilm: MiniLMEmbedder) -> Projector:
    url = psycopg.conninfo.make_conninfo(fabric.url, user="mf_projector")
    return Projector(url, minilm, None, graph)


def drain(fabric: Fabric, projector: Projector) -> int:
    fabric.settle()
    return drained(projector, ("graph",))


def mentioning(text: str, *declared: dict[str, str]) -> dict[str, Any]:
    return episode(content={"text": text, "entities": list(declared)})


ACME = {"type": "organization", "name": "Acme GmbH"}
BERLIN = {"type": "location", "name": "Berlin"}
DANA = {"type": "person", "name": "Dana Scully"}


def relationships(graph: GraphStore, tenant: str) -> list[tuple[str, str | None]]:
    """(type, correlation_id) of every relationship between the tenant's nodes."""
    with graph._driver.session(database=graph.database) as session:
        return sorted(
            (r["type"], r["correlation_id"])
            for label in ("Agent", "Memory")
            for r in session.run(
                f"MATCH (a:{label} {{tenant_id: $t}})-[r]->() "
                "RETURN type(r) AS type, r.correlation_id AS correlation_id",
                t=tenant,
            )
        )


def test_links_and_mentions_are_projected_with_correlation_and_rebuilt_alike(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    run = fabric.open_run()
    first = fabric.form(run, envelope=mentioning("met @dana at Acme", ACME, DANA))
    second = fabric.form(run, envelope=mentioning("Acme moved to Berlin", ACME, BERLIN))
    (event,) = fabric.events(f"memory_id = '{second}' AND event_type = 'memory.record.formed'")
    with fabric.acting("mf_workflow") as conn:
        made = call(
            conn,
            "fabric_api.record_agent_link",
            *("acme", "com-agt-003", second, "caused", event["event_id"], "corr-7f2a"),
        )
    assert drain(fabric, projector) > 0
    export = graph.export("acme")
    entities = [props for label, _, props in export.nodes if label == "Entity"]
    by_type = sorted((p["entity_type"], p.get("name")) for p in entities)
    # declared Acme once (deduplicated), Berlin, and three persons without names: the
    # declared Dana, the @dana handle and the subject
    assert by_type == [
        ("location", "Berlin"),
        ("organization", "Acme GmbH"),
        ("person", None),
        ("person", None),
        ("person", None),
    ]
    subject_refs = [p["subject_ref"] for p in entities if p.get("subject_ref")]
    assert len(subject_refs) == 1 and subject_refs[0].startswith("hmac:")
    text = export.as_json()
    for clear in ("user-8842", "Dana", "dana", "sess-1f9c"):
        assert clear not in text
    edges = [(t, src, dst) for t, src, dst in export.edges if t in ("INFLUENCED", "MENTIONS")]
    assert ("INFLUENCED", "acme:com-agt-003", f"acme:{second}") in edges
    assert sum(1 for t, src, _ in edges if t == "MENTIONS" and src == f"acme:{first}") == 4
    assert sum(1 for t, src, _ in edges if t == "MENTIONS" and src == f"acme:{second}") == 3
    # every node and edge written carries the correlation id of what it projects
    memories = [props for label, _, props in export.nodes if label == "Memory"]
    assert {m["correlation_id"] for m in memories} == {"corr-9d4a"}
    assert set(relationships(graph, "acme")) == {
        ("FORMED", "corr-9d4a"),
        ("MENTIONS", "corr-9d4a"),
        ("INFLUENCED", "corr-7f2a"),
    }
    with graph._driver.session(database=graph.database) as session:
        (influenced,) = session.run(
            "MATCH (:Agent)-[i:INFLUENCED]->(:Memory) RETURN properties(i) AS p"
        ).data()
    assert influenced["p"]["link_id"] == made["link_id"]
    assert influenced["p"]["source_event_id"] == str(event["event_id"])
    assert influenced["p"]["kind"] == "caused"

    before = export.as_json()
    assert projector.rebuild("graph") == 2
    assert graph.export("acme").as_json() == before


def test_subject_erasure_removes_the_persons_nodes_and_mentions(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    run = fabric.open_run()
    fabric.form(run, envelope=mentioning("asked @eve about Berlin", BERLIN))
    other_run = fabric.open_run(subject="user-9999")
    kept = fabric.form(other_run, envelope=mentioning("Acme invoices", ACME))
    drain(fabric, projector)
    persons = [p for label, _, p in graph.export("acme").nodes if p.get("entity_type") == "person"]
    assert len(persons) == 3  # @eve, user-8842, user-9999

    with fabric.acting("mf_committer") as conn:
        approval = call(
            conn, "fabric_api.request_subject_erasure", "acme", "user-8842", "GDPR art. 17", False
        )["approval_id"]
    with fabric.acting("mf_policy") as conn:
        call(conn, "fabric_api.decide_approval", approval, "approved", "ok")
    with fabric.acting("mf_committer") as conn:
        call(conn, "fabric_api.erase", approval)
    drain(fabric, projector)

    export = graph.export("acme")
    entities = [p for label, _, p in export.nodes if label == "Entity"]
    # the subject's person, @eve and Berlin were named only by the erased record
    assert sorted(p["entity_type"] for p in entities) == ["organization", "person"]
    assert [src for t, src, _ in export.edges if t == "MENTIONS"] == [f"acme:{kept}"] * 2
    after = export.as_json()
    projector.rebuild("graph")
    assert graph.export("acme").as_json() == after  # the drill's comparison


DANA_ = {"type": "person", "name": "Dana Scully"}
INITECH = {"type": "organization", "name": "Initech"}
LISBON = {"type": "location", "name": "Lisbon"}


def test_graph_recall_walks_two_hops_and_the_database_rechecks(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    from memfabric.recall import recall

    run = fabric.open_run()
    works = fabric.form(run, envelope=mentioning("Dana Scully works for Initech", DANA_, INITECH))
    based = fabric.form(run, envelope=mentioning("Initech is based in Lisbon", INITECH, LISBON))
    fabric.form(run, envelope=mentioning("Lisbon has trams", LISBON))  # three hops away
    other = fabric.open_run(subject="user-9999")
    fabric.form(other, envelope=mentioning("Initech is hiring", INITECH))  # out of scope
    gone = fabric.form(run, envelope=mentioning("Initech owes us", INITECH))
    approval = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", gone)
    fabric.call(
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')",
        approval["approval_id"],
    )
    fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval["approval_id"])
    drain(fabric, projector)

    request = {"run_id": str(run), "query": "Where is Dana Scully's employer based?"}
    with fabric.connect("mf_agent_a") as conn:
        answer = recall(conn, request | {"mode": "graph"}, graph=graph)
        assert answer["mode_served"] == "graph"
        assert [r["memory_id"] for r in answer["records"]] == [works, based]
        one_hop = recall(conn, request | {"mode": "graph", "expand": {"hops": 1}}, graph=graph)
        assert [r["memory_id"] for r in one_hop["records"]] == [works]


def test_expand_via_follows_the_edge_kinds_it_names(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    from memfabric.recall import recall

    run = fabric.open_run()
    signed = fabric.form(run, envelope=mentioning("Dana Scully signed the order", DANA_))
    report = fabric.form(run, text="Quarterly numbers are up")  # no entity in common
    with fabric.acting("mf_workflow") as conn:
        for outcome in (signed, report):
            (event,) = fabric.events(
                f"memory_id = '{outcome}' AND event_type = 'memory.record.formed'"
            )
            call(
                conn,
                "fabric_api.record_agent_link",
                *("acme", "com-agt-003", outcome, "caused", event["event_id"], "corr-via"),
            )
    drain(fabric, projector)

    request = {"run_id": str(run), "query": "What did Dana Scully sign?", "mode": "graph"}
    with fabric.connect("mf_agent_a") as conn:
        plain = recall(conn, request | {"expand": {"hops": 2}}, graph=graph)
        assert [r["memory_id"] for r in plain["records"]] == [signed]
        # the agent that caused the signed order also caused the report: one hop more
        influenced = {"hops": 2, "via": ["MENTIONS", "INFLUENCED"]}
        answer = recall(conn, request | {"expand": influenced}, graph=graph)
        assert [r["memory_id"] for r in answer["records"]] == [signed, report]
        one_hop = recall(conn, request | {"expand": influenced | {"hops": 1}}, graph=graph)
        assert [r["memory_id"] for r in one_hop["records"]] == [signed]
    # each of these recalls is a step of the run that touched Dana, projected as one
    drain(fabric, projector)
    export = graph.export("acme")
    steps = [key for label, key, _ in export.nodes if label == "Step"]
    assert len(steps) == 3
    touched = {dst for t, _, dst in export.edges if t == "TOUCHED"}
    assert len(touched) == 1


def test_graph_recall_without_a_graph_server_is_unreachable(
    fabric: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfabric import recall as recall_module
    from memfabric.errors import Unreachable

    monkeypatch.setenv("NEO4J_URI", "bolt://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("NEO4J_PASSWORD", "x")
    monkeypatch.setattr(recall_module, "_GRAPH", [])
    run = fabric.open_run()
    with fabric.connect("mf_agent_a") as conn, pytest.raises(Unreachable):
        recall_module.recall(conn, {"run_id": str(run), "query": "Dana", "mode": "graph"})


def test_a_reasoning_step_is_projected_with_its_touches_and_rebuilt_alike(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    run = fabric.open_run()
    fabric.form(run, envelope=mentioning("Acme called", ACME))
    (acme,) = fabric.session(None).execute(
        "SELECT entity_id FROM fabric.entities WHERE entity_key = 'name:acme gmbh'"
    ).fetchone() or (None,)
    with fabric.acting("mf_workflow") as conn:
        made = call(conn, "fabric_api.record_step", run, "corr-step-1", [acme], None)
    drain(fabric, projector)
    export = graph.export("acme")
    steps = [(key, props) for label, key, props in export.nodes if label == "Step"]
    assert steps == [
        (
            f"acme:{made['step_id']}",
            {
                "correlation_id": "corr-step-1",
                "recorded_at": steps[0][1]["recorded_at"],
                "run_id": str(run),
                "step_id": made["step_id"],
                "tenant_id": "acme",
            },
        )
    ]
    assert ("TOOK", "acme:com-agt-003", f"acme:{made['step_id']}") in export.edges
    assert ("TOUCHED", f"acme:{made['step_id']}", f"acme:{acme}") in export.edges
    assert ("TOUCHED", "corr-step-1") in relationships(graph, "acme") + [
        (t, c) for t, c in step_relationships(graph)
    ]
    before = export.as_json()
    projector.rebuild("graph")
    assert graph.export("acme").as_json() == before


def step_relationships(graph: GraphStore) -> list[tuple[str, str | None]]:
    with graph._driver.session(database=graph.database) as session:
        return [
            (r["type"], r["correlation_id"])
            for r in session.run(
                "MATCH (s:Step)-[r]->() RETURN type(r) AS type, r.correlation_id AS correlation_id"
            )
        ]


def test_the_drill_finds_a_leftover_person_and_a_named_one(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    from memfabric import ops

    run = fabric.open_run()
    fabric.form(run, envelope=mentioning("@eve called about Acme", ACME))
    drain(fabric, projector)
    assert ops.drill(projector)["identical"]
    # a subject erased in PostgreSQL whose graph was not brought up to date: its person
    # nodes are still there, and the drill says so
    with fabric.acting("mf_committer") as conn:
        approval = call(
            conn, "fabric_api.request_subject_erasure", "acme", "user-8842", "GDPR art. 17", False
        )["approval_id"]
    with fabric.acting("mf_policy") as conn:
        call(conn, "fabric_api.decide_approval", approval, "approved", "ok")
    with fabric.acting("mf_committer") as conn:
        call(conn, "fabric_api.erase", approval)
    stale = ops.drill(projector)
    assert not stale["identical"] and "acme" in stale["differences"]
    assert ops.drill(projector)["identical"]  # the rebuild put it right
    # a person node with a name (an older projector's) fails the drill
    fabric.form(fabric.open_run(subject="user-9999"), envelope=mentioning("@zed", ACME))
    drain(fabric, projector)
    with graph._driver.session(database=graph.database) as session:
        session.run(
            "MATCH (e:Entity {tenant_id: 'acme', entity_type: 'person'}) SET e.name = 'Zed'"
        ).consume()
    named = ops.drill(projector)
    assert named["named_persons"] > 0 and not named["identical"]


def test_an_applied_entity_merge_reaches_the_graph(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    run = fabric.open_run()
    acme_ag = {"type": "organization", "name": "Acme AG"}
    old = fabric.form(run, envelope=mentioning("Acme AG called", acme_ag))
    fabric.form(run, envelope=mentioning("Acme GmbH called", ACME))
    drain(fabric, projector)
    ids = dict(
        fabric.session(None)
        .execute("SELECT entity_key, entity_id::text FROM fabric.entities WHERE tenant_id = 'acme'")
        .fetchall()
    )
    ag, gmbh = ids["name:acme ag"], ids["name:acme gmbh"]

    def mentioning_records(entity: str) -> int:
        return sum(
            1
            for t, _, dst in graph.export("acme").edges
            if t == "MENTIONS" and dst == f"acme:{entity}"
        )

    assert mentioning_records(gmbh) == 1
    proposed = fabric.call(
        "mf_consolidator",
        "SELECT fabric_api.propose_entity_merge('acme', %s, %s, 'renamed')",
        ag,
        gmbh,
    )
    fabric.call(
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')",
        proposed["approval_id"],
    )
    fabric.call("mf_consolidator", "SELECT fabric_api.merge_entities(%s)", proposed["approval_id"])
    drain(fabric, projector)
    assert mentioning_records(gmbh) == 2
    assert mentioning_records(ag) == 1  # the history stays
    (event,) = fabric.events("event_type = 'memory.entity.merged'")
    assert str(event["memory_id"]) == old


def merge(fabric: Fabric, entity: str, into: str) -> str:
    """Propose, approve and apply a same-as merge of two entities of tenant acme; returns
    the approval id."""
    proposed = fabric.call(
        "mf_consolidator",
        "SELECT fabric_api.propose_entity_merge('acme', %s, %s, 'renamed')",
        entity,
        into,
    )
    fabric.call(
        "mf_policy",
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')",
        proposed["approval_id"],
    )
    fabric.call("mf_consolidator", "SELECT fabric_api.merge_entities(%s)", proposed["approval_id"])
    return str(proposed["approval_id"])


def entity_ids(fabric: Fabric) -> dict[str, str]:
    return dict(
        fabric.session(None)
        .execute("SELECT entity_key, entity_id::text FROM fabric.entities WHERE tenant_id = 'acme'")
        .fetchall()
    )


def same_as(graph: GraphStore) -> list[tuple[str, str, str | None]]:
    """(from entity, into entity, correlation_id) of every SAME_AS edge."""
    with graph._driver.session(database=graph.database) as session:
        return sorted(
            (r["src"], r["dst"], r["correlation_id"])
            for r in session.run(
                "MATCH (e:Entity)-[s:SAME_AS]->(c:Entity) "
                "RETURN e.entity_id AS src, c.entity_id AS dst, s.correlation_id AS correlation_id"
            )
        )


ACME_AG = {"type": "organization", "name": "Acme AG"}


def test_a_merge_is_a_same_as_edge_rebuilt_alike_and_erased_with_its_entity(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    run = fabric.open_run()
    old = fabric.form(run, envelope=mentioning("Acme AG called", ACME_AG))
    fabric.form(run, envelope=mentioning("Acme GmbH called", ACME))
    dana = fabric.form(run, envelope=mentioning("Dana Scully called", DANA))
    drain(fabric, projector)
    ids = entity_ids(fabric)
    ag, gmbh = ids["name:acme ag"], ids["name:acme gmbh"]
    approval = merge(fabric, ag, gmbh)
    # a person's merge: two persons, no names, a subject's by its pseudonym
    person = merge(fabric, ids["name:dana scully"], ids["subject:user-8842"])
    drain(fabric, projector)
    assert same_as(graph) == sorted(
        [
            (ag, gmbh, f"merge:{approval}"),
            (ids["name:dana scully"], ids["subject:user-8842"], f"merge:{person}"),
        ]
    )
    export = graph.export("acme")
    assert ("SAME_AS", f"acme:{ag}", f"acme:{gmbh}") in export.edges
    nodes = {key: props for label, key, props in export.nodes if label == "Entity"}
    assert nodes[f"acme:{ag}"]["name"] == "Acme AG"
    assert "name" not in nodes[f"acme:{ids['name:dana scully']}"]
    assert nodes[f"acme:{ids['subject:user-8842']}"]["subject_ref"].startswith("hmac:")
    assert "Dana" not in export.as_json()
    # the merges' events carry the correlation id their edges do
    assert {e["correlation_id"] for e in fabric.events("event_type = 'memory.entity.merged'")} == {
        f"merge:{approval}",
        f"merge:{person}",
    }
    # wipe + rebuild: the same graph, the same correlation ids (the drill compares)
    before = export.as_json()
    projector.rebuild("graph")
    assert graph.export("acme").as_json() == before
    assert same_as(graph) == sorted(
        [
            (ag, gmbh, f"merge:{approval}"),
            (ids["name:dana scully"], ids["subject:user-8842"], f"merge:{person}"),
        ]
    )
    # erasing the only record that names Acme AG removes the entity, and its SAME_AS edge
    for erased in (old, dana):
        request = fabric.call(
            "mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", erased
        )
        fabric.call(
            "mf_policy",
            "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')",
            request["approval_id"],
        )
        fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", request["approval_id"])
    drain(fabric, projector)
    assert same_as(graph) == []
    after = graph.export("acme").as_json()
    projector.rebuild("graph")
    assert graph.export("acme").as_json() == after


BERLIN_ = {"type": "location", "name": "Berlin"}


def test_graph_recall_counts_merged_entities_as_one(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    from memfabric.recall import recall

    run = fabric.open_run()
    first = fabric.form(
        run, envelope=mentioning("Dana Scully, Acme AG, Berlin", DANA_, ACME_AG, BERLIN_)
    )
    ag_only = fabric.form(run, envelope=mentioning("Acme AG called", ACME_AG))
    gmbh_only = fabric.form(run, envelope=mentioning("Acme GmbH called", ACME))
    berlin = fabric.form(run, envelope=mentioning("Berlin is cold", BERLIN_))
    ids = entity_ids(fabric)
    merge(fabric, ids["name:acme ag"], ids["name:acme gmbh"])
    drain(fabric, projector)
    request = {"run_id": str(run), "query": "Dana Scully", "mode": "graph", "limit": 10}
    with fabric.connect("mf_agent_a") as conn:
        answer = recall(conn, request | {"expand": {"hops": 2}}, graph=graph)
    found = [r["memory_id"] for r in answer["records"]]
    # Acme AG and Acme GmbH are one entity linking three records (1 / (1 + ln 3) each), so
    # the record reached through Berlin (two records: 1 / (1 + ln 2)) ranks before both;
    # counted twice, the Acme AG record would rank first
    assert found[:2] == [first, berlin]
    assert sorted(found[2:]) == sorted([ag_only, gmbh_only])


def test_a_merge_no_record_mentions_is_projected_from_its_event_alone(
    fabric: Fabric, projector: Projector, graph: GraphStore
) -> None:
    """Two subjects' persons made by their runs, before any record: the merge's one event has
    no memory id, and the projector still writes the SAME_AS edge (and the rebuild too)."""
    fabric.open_run()
    fabric.open_run(subject="user-9999")
    ids = entity_ids(fabric)
    approval = merge(fabric, ids["subject:user-9999"], ids["subject:user-8842"])
    (event,) = fabric.events("event_type = 'memory.entity.merged'")
    assert event["memory_id"] is None
    drain(fabric, projector)
    assert same_as(graph) == [
        (ids["subject:user-9999"], ids["subject:user-8842"], f"merge:{approval}")
    ]
    refs = [p.get("subject_ref") for label, _, p in graph.export("acme").nodes if label == "Entity"]
    assert len(refs) == 2 and all(r and r.startswith("hmac:") for r in refs)
    before = graph.export("acme").as_json()
    projector.rebuild("graph")
    assert graph.export("acme").as_json() == before
