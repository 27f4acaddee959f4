"""Memory that forms itself, the gaps closed (docs/consolidation.md): a local
MEMFABRIC_LLM_URL seeds the instance's model_uri, corroboration grows lineage and counts
toward the promotion threshold, contradiction flags are resolved through the API, and the
instance's schedule window defers scheduled runs — with a real PostgreSQL and the scripted
OpenAI-compatible endpoint (tests/scripted_llm.py) in place of a model."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from psycopg.types.json import Jsonb
from test_formation import T0, asserted, model, outcomes, said, say, workflow

from conftest import Fabric, episode
from memfabric import consolidate
from memfabric.consolidate import require_instance_endpoint
from memfabric.errors import FabricError, Misconfigured
from memfabric.llm import LLM, OpenAICompatible
from scripted_llm import scripted_llm

LOCAL = "http://127.0.0.1:8080/v1"
EUR_AGAIN = say("billing.currency", "EUR", "corroborates", target_key="billing.currency")


def sqlstate(fn: Any) -> str | None:
    try:
        fn()
    except FabricError as exc:
        return exc.sqlstate
    except Exception as exc:  # psycopg errors raised by plain SQL
        return getattr(exc, "sqlstate", None)
    return None


def world(fabric: Fabric) -> dict[str, Any]:
    """Row counts of everything these rules could write, and the instance's configuration."""
    tables = ("contradiction_flags", "memory_corroborations", "recommendations",
              "consolidation_outcomes", "approvals")  # fmt: skip
    with fabric.su() as su:
        config = su.execute("SELECT jsonb_agg(to_jsonb(c) ORDER BY business_instance_id)"
                            " FROM fabric.instance_config c").fetchone()[0]  # fmt: skip
        resolved = su.execute(
            "SELECT count(*) FROM fabric.contradiction_flags WHERE resolved_at IS NOT NULL"
        ).fetchone()[0]
    return {**fabric.counts(), **{t: fabric.count(t) for t in tables}, "config": config,
            "resolved": resolved}  # fmt: skip


def model_uri(fabric: Fabric) -> str | None:
    with fabric.su() as su:
        row = su.execute(
            "SELECT model_uri FROM fabric.instance_config"
            " WHERE tenant_id = 'acme' AND business_instance_id = ''"
        ).fetchone()
    return None if row is None else row[0]


# --- 1. MEMFABRIC_LLM_URL seeds the instance's model_uri -----------------------------------


def test_a_local_llm_url_seeds_the_instances_model_uri_when_it_names_none(
    fabric: Fabric,
) -> None:
    admin, reader = fabric.connect("mf_admin"), fabric.connect("mf_consolidator")
    llm = LLM(OpenAICompatible(LOCAL))
    assert consolidate.seed_instance_endpoint(admin, reader, "acme", llm) is True
    assert model_uri(fabric) == LOCAL
    (event,) = fabric.events("event_type = 'fabric.instance.configured'")
    assert event["payload"]["keys"] == ["model_uri"]
    require_instance_endpoint(reader, "acme", llm)
    # an instance that names a model keeps it: another URL seeds nothing and is refused
    other = LLM(OpenAICompatible("http://127.0.0.1:9999/v1"))
    assert consolidate.seed_instance_endpoint(admin, reader, "acme", other) is False
    assert model_uri(fabric) == LOCAL
    with pytest.raises(Misconfigured):
        require_instance_endpoint(reader, "acme", other)
    # no model, or an in-process one, seeds nothing
    assert consolidate.seed_instance_endpoint(admin, reader, "acme", None) is False


def test_seeding_the_model_uri_is_judged_by_the_air_gap_rule(fabric: Fabric) -> None:
    fabric.call("mf_admin", "SELECT fabric_api.configure_instance('acme', NULL, %s)",
                Jsonb({"deployment_mode": "air-gapped"}))  # fmt: skip
    admin, reader = fabric.connect("mf_admin"), fabric.connect("mf_consolidator")
    before = fabric.count("events", "event_type = 'fabric.instance.configured'")
    remote = LLM(OpenAICompatible("http://llm.example.com/v1"))
    assert (
        sqlstate(lambda: consolidate.seed_instance_endpoint(admin, reader, "acme", remote))
        == "23514"
    )
    assert model_uri(fabric) is None
    assert fabric.count("events", "event_type = 'fabric.instance.configured'") == before
    with pytest.raises(Misconfigured):
        require_instance_endpoint(reader, "acme", remote)
    # a seed needs the admin's authority: the consolidator cannot configure the instance
    assert (
        sqlstate(lambda: consolidate.seed_instance_endpoint(reader, reader, "acme", remote))
        == "42501"
    )


# --- 2. corroboration grows lineage and counts toward promotion -------------------------------


def corroborated(fabric: Fabric) -> tuple[str, str, str]:
    """An extracted assertion derived from one episode, then corroborated by a second
    through the workflow: (assertion, first episode, corroborating episode)."""
    run = fabric.open_run()
    first = said(fabric, run, "I want invoices in EUR.", T0)
    extracted = asserted(
        fabric, run, "semantic", "billing.currency", "EUR", "extraction", T0, [first]
    )  # fmt: skip
    again = said(fabric, run, "Yes, EUR for the invoices.", "2026-03-04T10:00:00Z")
    rules = [{"contains": "EUR for the invoices", "answer": {"assertions": [EUR_AGAIN]}}]
    with scripted_llm(rules) as double:
        fabric.call("mf_admin", "SELECT fabric_api.configure_instance('acme', NULL, %s)",
                    Jsonb({"model_uri": double.url}))  # fmt: skip
        summary = workflow(fabric, model(double.url))
    assert summary.corroborated == 1
    return extracted, first, again


def promote(fabric: Fabric, memory_id: str) -> Any:
    return fabric.call("mf_committer", "SELECT fabric_api.promote(%s, 'profile')", memory_id)


def test_corroboration_grows_lineage_without_rewriting_derived_from(fabric: Fabric) -> None:
    extracted, first, again = corroborated(fabric)
    with fabric.su() as su:
        links = su.execute(
            "SELECT memory_id::text, episode_id::text FROM fabric.memory_corroborations"
        ).fetchall()
        derived = su.execute(
            "SELECT derived_from_id::text FROM fabric.memory_lineage WHERE memory_id = %s",
            (extracted,),
        ).fetchall()
    assert links == [(extracted, again)]
    assert derived == [(first,)]  # derived_from stays as formed
    lineage = fabric.call(
        "mf_auditor",
        "SELECT jsonb_agg(jsonb_build_array(direction, memory_id) ORDER BY direction)"
        " FROM fabric_audit.lineage('acme', %s)",
        extracted,
    )
    assert ["ancestor", first] in lineage and ["corroborated_by", again] in lineage
    from_episode = fabric.call(
        "mf_auditor",
        "SELECT jsonb_agg(jsonb_build_array(direction, memory_id, derived_from_id))"
        " FROM fabric_audit.lineage('acme', %s)",
        again,
    )
    assert from_episode == [["corroborates", extracted, again]]
    (event,) = fabric.events("event_type = 'memory.record.corroborated'")
    assert event["payload"]["linked"] == [again]


def test_corroborations_count_toward_the_promotion_threshold(fabric: Fabric) -> None:
    run = fabric.open_run()
    first = said(fabric, run, "I want invoices in EUR.", T0)
    extracted = asserted(
        fabric, run, "semantic", "billing.currency", "EUR", "extraction", T0, [first]
    )  # fmt: skip
    # one episode behind it: below the default threshold of two
    assert sqlstate(lambda: promote(fabric, extracted)) == "23514"
    assert fabric.record(extracted)["tier"] == "semantic"
    again = said(fabric, run, "Yes, EUR for the invoices.", "2026-03-04T10:00:00Z")
    rules = [{"contains": "EUR for the invoices", "answer": {"assertions": [EUR_AGAIN]}}]
    with scripted_llm(rules) as double:
        workflow(fabric, model(double.url))
    assert fabric.count("memory_corroborations", f"episode_id = '{again}'") == 1
    promote(fabric, extracted)
    assert fabric.record(extracted)["tier"] == "profile"


def test_corroboration_links_are_append_only_and_checked(fabric: Fabric) -> None:
    extracted, first, _ = corroborated(fabric)
    before = world(fabric)
    with fabric.su() as su:
        for statement in (
            "UPDATE fabric.memory_corroborations SET corroborated_at = now()",
            "DELETE FROM fabric.memory_corroborations",
            "TRUNCATE fabric.memory_corroborations",
        ):
            with su.transaction(force_rollback=True):
                assert sqlstate(lambda s=statement: su.execute(s)) == "MF001"  # type: ignore[misc]
        rid = su.execute("SELECT recommendation_id FROM fabric.recommendations").fetchone()[0]
        # an assertion is not an episode; a record does not corroborate itself
        for episode_id in (extracted,):
            with su.transaction(force_rollback=True):
                assert sqlstate(lambda e=episode_id: su.execute(  # type: ignore[misc]
                    "INSERT INTO fabric.memory_corroborations"
                    " (tenant_id, memory_id, episode_id, recommendation_id)"
                    " VALUES ('acme', %s, %s, %s)", (first, e, rid))) == "23514"  # fmt: skip
    assert world(fabric) == before


def test_an_episode_already_in_derived_from_is_not_linked_again(fabric: Fabric) -> None:
    run = fabric.open_run()
    first = said(fabric, run, "I want invoices in EUR.", T0)
    extracted = asserted(
        fabric, run, "semantic", "billing.currency", "EUR", "extraction", T0, [first]
    )  # fmt: skip
    wf = fabric.call("mf_consolidator", "SELECT fabric_api.start_workflow_run('acme')")
    rec = fabric.call("mf_consolidator", "SELECT fabric_api.recommend(%s)", Jsonb({
        "tenant_id": "acme", "kind": "corroboration", "workflow_event_id": str(wf),
        "sources": [first], "proposal": {"corroborates": extracted}}))  # fmt: skip
    result = fabric.call(
        "mf_committer", "SELECT fabric_api.commit_recommendation(%s)", rec["recommendation_id"]
    )
    assert (result["status"], result["linked"], result["episodes"]) == ("corroborated", [], 1)
    assert fabric.count("memory_corroborations") == 0


def test_erasing_a_corroborating_episode_flags_the_assertion_for_review(fabric: Fabric) -> None:
    extracted, _, again = corroborated(fabric)
    approval = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", again)[
        "approval_id"
    ]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)
    assert fabric.record(again)["consolidation_state"] == "tombstoned"
    queue = fabric.call("mf_consolidator", "SELECT fabric_api.review_queue('acme')")
    assert [(q["memory_id"], q["tombstoned_source"]) for q in queue] == [(extracted, again)]
    assert fabric.count("memory_corroborations", f"episode_id = '{again}'") == 1  # ids only


# --- 3. contradiction flags are resolved through the API -------------------------------------


def flagged(fabric: Fabric) -> dict[str, Any]:
    """A declaration contradicted by an episode: the open flag."""
    run = fabric.open_run()
    asserted(fabric, run, "profile", "home.city", "Berlin", "declaration", T0)
    said(fabric, run, "I moved to Lisbon last month.", "2026-03-01T08:00:00Z")
    rules = [{"contains": "moved to Lisbon", "answer": {"assertions": [
        say("home.city", "Lisbon", "updates", target_key="home.city", tier="profile",
            valid_from="2026-02-01T00:00:00Z")]}}]  # fmt: skip
    with scripted_llm(rules) as double:
        assert workflow(fabric, model(double.url)).flagged == 1
    (flag,) = fabric.call("mf_consolidator", "SELECT fabric_api.contradiction_queue('acme')")
    return flag  # type: ignore[no-any-return]


def resolve(fabric: Fabric, flag_id: str, decision: str | None, login: str = "mf_consolidator",
            reason: str | None = "the customer confirmed it") -> Any:  # fmt: skip
    return fabric.call(
        login, "SELECT fabric_api.resolve_contradiction_flag(%s, %s, %s)", flag_id, decision,
        reason,
    )  # fmt: skip


def test_keeping_the_standing_record_resolves_a_contradiction_flag_once_with_an_event(
    fabric: Fabric,
) -> None:
    flag = flagged(fabric)
    result = resolve(fabric, flag["flag_id"], "keep")
    assert result == {"flag_id": flag["flag_id"], "memory_id": flag["memory_id"],
                      "decision": "keep", "successor": None}  # fmt: skip
    assert fabric.call("mf_consolidator", "SELECT fabric_api.contradiction_queue('acme')") == []
    (event,) = fabric.events("event_type = 'memory.contradiction.resolved'")
    assert event["actor_agent_id"] == "os-agt-011" and event["memory_id"] == flag["memory_id"]
    assert event["payload"]["decision"] == "keep"
    with fabric.su() as su:
        row = su.execute(
            "SELECT resolution, resolved_by, resolution_reason FROM fabric.contradiction_flags"
        ).fetchone()
    assert row == ("keep", "os-agt-011", "the customer confirmed it")
    assert fabric.record(flag["memory_id"])["consolidation_state"] == "raw"
    before = world(fabric)
    assert sqlstate(lambda: resolve(fabric, flag["flag_id"], "keep")) == "55000"
    assert world(fabric) == before


@pytest.mark.parametrize(
    ("login", "decision", "reason", "expected"),
    [
        ("mf_committer", "keep", "x", "42501"),
        ("mf_agent_a", "keep", "x", "42501"),
        ("mf_consolidator", "maybe", "x", "22023"),
        ("mf_consolidator", None, "x", "22023"),
        ("mf_consolidator", "keep", " ", "22023"),
        # the standing declaration is still live: a resolution retires nothing
        ("mf_consolidator", "supersede", "x", "55000"),
    ],
)
def test_resolving_a_contradiction_flag_is_refused_without_writing(
    fabric: Fabric, login: str, decision: str | None, reason: str, expected: str
) -> None:
    flag = flagged(fabric)
    before = world(fabric)
    assert sqlstate(lambda: resolve(fabric, flag["flag_id"], decision, login, reason)) == expected
    assert world(fabric) == before
    assert fabric.record(flag["memory_id"])["consolidation_state"] == "raw"
    queue = fabric.call("mf_consolidator", "SELECT fabric_api.contradiction_queue('acme')")
    assert [q["flag_id"] for q in queue] == [flag["flag_id"]]


def test_a_flag_is_resolved_as_supersede_once_the_declaration_was_superseded(
    fabric: Fabric,
) -> None:
    flag = flagged(fabric)
    run = fabric.open_run()
    env = episode(
        "x",
        tier="profile",
        content={"key": "home.city", "value": "Lisbon"},
        validity_interval={"valid_from": "2026-03-01T08:00:00Z", "valid_until": None},
    )
    env["provenance"]["formation_method"] = "declaration"
    proposal = fabric.proposed(run, envelope=env)
    successor = fabric.call(
        "mf_committer", "SELECT fabric_api.supersede(%s, %s)", flag["memory_id"], proposal
    )["memory_id"]
    result = resolve(fabric, flag["flag_id"], "supersede")
    assert (result["decision"], result["successor"]) == ("supersede", successor)
    (event,) = fabric.events("event_type = 'memory.contradiction.resolved'")
    assert event["payload"]["successor"] == successor
    before = world(fabric)  # resolved once; keep is refused now that nothing live stands
    assert sqlstate(lambda: resolve(fabric, flag["flag_id"], "keep")) == "55000"
    assert world(fabric) == before


def test_an_unknown_contradiction_flag_is_not_found(fabric: Fabric) -> None:
    assert sqlstate(lambda: resolve(fabric, str(uuid.uuid4()), "keep")) == "P0002"


# --- 4. the instance's schedule window --------------------------------------------------------


def window(fabric: Fabric, start: dt.time | None, end: dt.time | None) -> Any:
    return fabric.call(
        "mf_admin", "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb({"consolidation_window_start": start and start.isoformat(),
               "consolidation_window_end": end and end.isoformat()}),
    )  # fmt: skip


def test_a_scheduled_run_outside_the_instances_window_is_deferred_whole(fabric: Fabric) -> None:
    run = fabric.open_run()
    for n in range(2):
        said(fabric, run, f"invoices in EUR ({n})", T0)
    with fabric.su() as su:
        (now,) = su.execute("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::time").fetchone()
    base = dt.datetime.combine(dt.date(2026, 1, 1), now)
    closed = ((base + dt.timedelta(hours=2)).time(), (base + dt.timedelta(hours=3)).time())
    window(fabric, *closed)
    before = world(fabric)
    summary = workflow(fabric)
    assert summary.outside_window and summary.workflow_event_id == ""
    assert world(fabric) == before  # nothing read, nothing written
    assert fabric.count("events", "event_type = 'memory.workflow.started'") == 0
    # a run for one subject is on demand, not scheduled: it runs
    assert not workflow(fabric, subject_id="user-8842").outside_window
    # open (a window spanning midnight counts too): the scheduled run goes ahead
    opened = ((base - dt.timedelta(hours=1)).time(), (base + dt.timedelta(hours=1)).time())
    window(fabric, *opened)
    assert not workflow(fabric).outside_window
    assert len(outcomes(fabric)) == 2


@pytest.mark.parametrize(
    "bounds", [(dt.time(22), None), (None, dt.time(6)), (dt.time(22), dt.time(22))]
)
def test_a_consolidation_window_is_whole_and_not_empty(
    fabric: Fabric, bounds: tuple[dt.time | None, dt.time | None]
) -> None:
    before = world(fabric)
    assert sqlstate(lambda: window(fabric, *bounds)) == "23514"
    assert world(fabric) == before


# --- 6. reflect and revise checkpointed by the fabric's checkpointer ---------------------------


def threads(fabric: Fabric) -> list[tuple[str, str | None, str | None]]:
    with fabric.su() as su:
        rows = su.execute(
            "SELECT DISTINCT thread_id, metadata ->> 'subject_id',"
            " metadata ->> 'fabric_workflow_event_id' FROM langgraph.checkpoints ORDER BY 1"
        ).fetchall()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def stages(double: Any) -> list[str]:
    return [r["response_format"]["json_schema"]["name"] for r in double.requests]


def interrupted(fabric: Fabric, saver: Any, double: Any) -> tuple[str, Any]:
    """An episode whose critique answer is unusable: the run ends there (deferred) and the
    item's thread keeps what generate produced. Returns (episode, the run's summary)."""
    run = fabric.open_run()
    spoken = said(fabric, run, "Please send my invoices in EUR.", T0)
    double.script([
        {"stage": "generate", "contains": "invoices in EUR", "answer": {"assertions": [
            say("billing.currency", "EUR")]}},
        {"stage": "critique", "raw": "not json", "repeat": True},
    ])  # fmt: skip
    summary = workflow(fabric, consolidate.ModelConsolidator(
        LLM(OpenAICompatible(double.url, "scripted-oracle"), retries=0), saver))  # fmt: skip
    assert (summary.unusable, summary.deferred, summary.committed) == (1, 1, 0)
    assert stages(double) == ["generate", "critique"]
    return spoken, summary


def test_an_interrupted_item_resumes_at_the_node_that_stopped_it(fabric: Fabric) -> None:
    from memfabric.langgraph import checkpointer

    service = psycopg_conninfo(fabric, "mf_service")
    with checkpointer(service) as saver, scripted_llm([]) as double:
        spoken, first = interrupted(fabric, saver, double)
        assert threads(fabric) == [
            (f"mf_service:consolidate:{spoken}", "user-8842", first.workflow_event_id)
        ]
        # the next run resumes: generate is not asked again; the item completes and its
        # thread is deleted
        double.script([])
        double.requests.clear()
        summary = workflow(fabric, consolidate.ModelConsolidator(
            LLM(OpenAICompatible(double.url, "scripted-oracle")), saver))  # fmt: skip
        assert stages(double) == ["critique", "revise"]
        assert summary.committed == 1
        assert threads(fabric) == []


@pytest.mark.parametrize("subject", [False, True])
def test_erasing_what_an_interrupted_item_read_deletes_its_thread(
    fabric: Fabric, subject: bool
) -> None:
    from memfabric.langgraph import checkpointer

    service = psycopg_conninfo(fabric, "mf_service")
    with checkpointer(service) as saver, scripted_llm([]) as double:
        spoken, _ = interrupted(fabric, saver, double)
    (thread,) = threads(fabric)
    if subject:
        approval = fabric.call(
            "mf_committer",
            "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'art. 17')",
        )["approval_id"]
    else:
        approval = fabric.call(
            "mf_committer", "SELECT fabric_api.request_erasure(%s, 'gdpr')", spoken
        )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    receipt = fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)
    assert receipt["checkpoint_threads"] == [thread[0]]
    assert threads(fabric) == []


def psycopg_conninfo(fabric: Fabric, login: str) -> str:
    import psycopg

    return psycopg.conninfo.make_conninfo(fabric.url, user=login)


def test_a_checkpoint_naming_an_unknown_consolidation_run_is_refused(fabric: Fabric) -> None:
    from memfabric.formation import ReflectAndRevise
    from memfabric.langgraph import checkpointer

    run = fabric.open_run()
    spoken = said(fabric, run, "Please send my invoices in EUR.", T0)
    text = {"text": "Please send my invoices in EUR."}
    episode_ = {"memory_id": spoken, "subject_id": "user-8842", "scope_key": "s",
                "content": text, "valid_from": T0}  # fmt: skip
    before = world(fabric)
    with checkpointer(psycopg_conninfo(fabric, "mf_service")) as saver, scripted_llm([]) as double:
        graph = ReflectAndRevise(LLM(OpenAICompatible(double.url)), saver)
        invented = str(uuid.uuid4())
        assert sqlstate(lambda: graph.run(episode_, [], tenant_id="acme",
                                          workflow_event_id=invented)) == "22023"  # fmt: skip
    assert threads(fabric) == []
    assert world(fabric) == before


@pytest.mark.parametrize(
    ("start", "end", "at", "inside"),
    [
        ("09:00", "17:00", "2026-12-04T08:59:59Z", False),
        ("09:00", "17:00", "2026-12-04T09:00:00Z", True),  # start inclusive
        ("09:00", "17:00", "2026-12-04T17:00:00Z", False),  # end exclusive
        ("22:00", "06:00", "2026-12-04T23:30:00Z", True),  # spans midnight
        ("22:00", "06:00", "2026-12-05T05:59:00Z", True),
        ("22:00", "06:00", "2026-12-05T12:00:00Z", False),
        ("22:00", "06:00", "2026-12-05T00:30:00+02:00", True),  # 22:30 UTC
        (None, None, "2026-12-05T12:00:00Z", True),  # no window: always
    ],
)
def test_the_consolidation_window_is_judged_in_utc(
    fabric: Fabric, start: str | None, end: str | None, at: str, inside: bool
) -> None:
    with fabric.su() as su:
        row = su.execute(
            "SELECT fabric._in_consolidation_window(%s::time, %s::time, %s::timestamptz)",
            (start, end, at),
        ).fetchone()
    assert row == (inside,)
