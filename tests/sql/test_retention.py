"""Retention, decay, erasure (R-RET-1, R-ERASE-1): scheduled forgetting that leaves tombstones, and
instance configuration validated by the database."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, episode, wait_until_blocked
from memfabric.errors import FabricError
from memfabric.worker import erase, run_decay_once

pytestmark = pytest.mark.rollback

ROOT = Path(__file__).resolve().parents[2]
PG_DUMP = ROOT / ".local" / "pg17" / "bin" / "pg_dump"


def configure(fabric: Fabric, config: dict[str, Any]) -> dict[str, Any]:
    return fabric.call(
        "mf_admin",
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        Jsonb(config),
    )


def decay(fabric: Fabric, now: str | None = None) -> dict[str, Any]:
    return run_decay_once(fabric.connect("mf_committer"), now)  # type: ignore[return-value]


def approved_erasure(fabric: Fabric, memory_id: str, legal: bool = False) -> str:
    a = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_erasure(%s, 'gdpr', %s)",
        memory_id,
        legal,
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", a)
    return str(a)


def state(fabric: Fabric, memory_id: str) -> tuple[Any, ...]:
    with fabric.su() as su:
        row = su.execute(
            "SELECT consolidation_state, content IS NOT NULL, content_hash, "
            "subject_id FROM fabric.memory_records WHERE memory_id = %s",
            (memory_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def sqlstate(fn: Any) -> str | None:
    with pytest.raises((psycopg.Error, FabricError)) as caught:
        fn()
    return caught.value.sqlstate


@pytest.fixture
def run(fabric: Fabric) -> uuid.UUID:
    return fabric.open_run()


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "constraint"),
    [
        (
            {"deployment_mode": "air-gapped", "model_uri": "https://api.openai.com/v1"},
            "instance_config_air_gapped_is_local",
        ),
        (
            {"deployment_mode": "air-gapped", "embedding_uri": "http://gpu-box.example.com:8000"},
            "instance_config_air_gapped_is_local",
        ),
        (
            {"checkpoint_retention": "1 day", "approval_timeout": "2 days"},
            "instance_config_checkpoint_outlives_approvals",
        ),
        (
            {"checkpoint_retention": "3 days", "approval_timeouts": {"erase": "3 days"}},
            "instance_config_checkpoint_outlives_approvals",
        ),
        (
            {"regulated_retention": {"eu": {"floor": "7 years", "ceiling": "1 year"}}},
            "instance_config_regulated_ceiling_above_floor",
        ),
    ],
)
def test_configuration_rules_are_refused_at_configuration_time(
    fabric: Fabric, config: dict[str, Any], constraint: str
) -> None:
    before = fabric.session().execute("SELECT to_jsonb(c) FROM fabric.instance_config c").fetchall()
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        configure(fabric, config)
    assert caught.value.diag.constraint_name == constraint
    after = fabric.session().execute("SELECT to_jsonb(c) FROM fabric.instance_config c").fetchall()
    assert after == before


@pytest.mark.parametrize(
    "config",
    [
        {
            "deployment_mode": "air-gapped",
            "model_uri": "http://127.0.0.1:8000/v1",
            "embedding_uri": "http://localhost:8080",
        },
        {"deployment_mode": "air-gapped", "embedding_uri": "unix:///run/tei.sock"},
        {"deployment_mode": "air-gapped", "model_uri": "http://[::1]:8000"},
        {
            "deployment_mode": "air-gapped",
            "model_uri": "http://gpu-1.lan:8000",
            "local_hosts": ["gpu-1.lan"],
        },
        {"deployment_mode": "saas", "model_uri": "https://api.example.com"},
        {"checkpoint_retention": "3 days", "approval_timeouts": {"erase": "2 days"}},
        {"regulated_retention": {"eu": {"floor": "1 year", "ceiling": "7 years"}}},
    ],
)
def test_valid_configurations_are_accepted(fabric: Fabric, config: dict[str, Any]) -> None:
    assert configure(fabric, config)["tenant_id"] == "acme"


def test_malformed_configuration_is_an_error(fabric: Fabric) -> None:
    for bad in (
        {"regulated_retention": {"eu": {"floor": "soon"}}},
        {"approval_timeouts": {"dance": "1 day"}},
        {"operational_window": "banana"},
        {"deployment_mode": "moon"},
    ):
        assert sqlstate(lambda b=bad: configure(fabric, b)) in ("22023", "23514")  # type: ignore[misc]


# --- decay --------------------------------------------------------------------------------------


def test_interval_expiry_happens_exactly_at_valid_until(fabric: Fabric, run: uuid.UUID) -> None:
    rid = fabric.form(
        run,
        validity_interval={
            "valid_from": "2026-01-01T00:00:00Z",
            "valid_until": "2026-02-01T00:00:00Z",
        },
    )
    assert decay(fabric, "2026-01-31T23:59:59.999999Z")["expired"] == 0
    assert state(fabric, rid)[0] == "raw"
    assert decay(fabric, "2026-02-01T00:00:00Z")["expired"] == 1
    assert state(fabric, rid)[:2] == ("expired", True)  # readable for audit
    assert decay(fabric, "2026-02-01T00:00:00Z")["expired"] == 0  # idempotent
    assert len(fabric.events(f"memory_id = '{rid}' AND event_type = 'memory.record.expired'")) == 1


def test_decay_refuses_a_future_time(fabric: Fabric) -> None:
    assert sqlstate(lambda: decay(fabric, "2999-01-01T00:00:00Z")) == "22023"


@pytest.mark.clone
def test_operational_window_closure_summarises_what_it_removes(
    fabric: Fabric, run: uuid.UUID
) -> None:
    configure(fabric, {"operational_window": "1 millisecond"})
    ops = [fabric.form(run, f"op {i}", retention_class="operational") for i in range(3)]
    other = fabric.open_run(subject="user-1")
    ops.append(fabric.form(other, "op other", retention_class="operational"))
    durable = fabric.form(run, "durable")
    audit = fabric.form(run, "audit", retention_class="audit")
    time.sleep(0.05)
    result = decay(fabric)
    assert result["windows_closed"] == 4
    for rid in ops:
        assert state(fabric, rid)[:2] == ("expired", False)
    assert state(fabric, durable)[:2] == ("raw", True)
    assert state(fabric, audit)[:2] == ("raw", True)
    with fabric.su() as su:
        rows = su.execute(
            "SELECT day::text, tier, subject_id, retention_class, records "
            "FROM fabric.temporal_summaries ORDER BY subject_id"
        ).fetchall()
    assert rows == [
        ("2026-07-02", "episodic", "user-1", "operational", 1),
        ("2026-07-02", "episodic", "user-8842", "operational", 3),
    ]
    assert decay(fabric)["windows_closed"] == 0


@pytest.mark.clone
def test_window_closure_of_an_already_expired_record_removes_its_content(
    fabric: Fabric, run: uuid.UUID
) -> None:
    rid = fabric.form(
        run,
        retention_class="operational",
        validity_interval={
            "valid_from": "2026-01-01T00:00:00Z",
            "valid_until": "2026-02-01T00:00:00Z",
        },
    )
    decay(fabric, "2026-03-01T00:00:00Z")
    assert state(fabric, rid)[:2] == ("expired", True)
    configure(fabric, {"operational_window": "1 millisecond"})
    time.sleep(0.02)
    assert decay(fabric)["windows_closed"] == 1
    assert state(fabric, rid)[:2] == ("expired", False)
    types = [e["event_type"] for e in fabric.events(f"memory_id = '{rid}'")]
    assert types == ["memory.record.formed", "memory.record.expired", "memory.record.expired"]


@pytest.mark.clone
def test_regulated_ceiling_raises_an_erasure_request_never_erases(
    fabric: Fabric, run: uuid.UUID
) -> None:
    configure(
        fabric,
        {"regulated_retention": {"default": {"floor": "0 seconds", "ceiling": "1 millisecond"}}},
    )
    rid = fabric.form(run, retention_class="regulated")
    time.sleep(0.02)
    assert decay(fabric)["erasure_requests"] == 1
    assert decay(fabric)["erasure_requests"] == 0
    assert state(fabric, rid)[:2] == ("raw", True)
    with fabric.su() as su:
        row = su.execute(
            "SELECT action, status FROM fabric.approvals WHERE memory_id = %s", (rid,)
        ).fetchone()
    assert row == ("erase", "pending")


def test_regulated_floor_blocks_erasure_unless_legal(fabric: Fabric, run: uuid.UUID) -> None:
    configure(fabric, {"regulated_retention": {"jp": {"floor": "10 years", "ceiling": "20 years"}}})
    rid = fabric.form(run, retention_class="regulated", compliance_labels=["jurisdiction:jp"])
    conn = fabric.connect("mf_committer")
    assert sqlstate(lambda: erase(conn, approved_erasure(fabric, rid))) == "MF005"
    assert state(fabric, rid)[0] == "raw"
    erase(conn, approved_erasure(fabric, rid, legal=True))
    assert state(fabric, rid)[0] == "tombstoned"


@pytest.mark.clone
def test_concurrent_decay_runs_expire_each_record_once(fabric: Fabric, run: uuid.UUID) -> None:
    ids = [
        fabric.form(
            run,
            f"r{i}",
            validity_interval={
                "valid_from": "2026-01-01T00:00:00Z",
                "valid_until": "2026-02-01T00:00:00Z",
            },
        )
        for i in range(40)
    ]
    results: list[dict[str, Any]] = []
    logins = ["mf_committer", "mf_committer2"]

    def work(login: str) -> None:
        with psycopg.connect(
            psycopg.conninfo.make_conninfo(fabric.url, user=login), autocommit=True
        ) as conn:
            results.append(run_decay_once(conn, "2026-03-01T00:00:00Z", batch=5))  # type: ignore[arg-type]

    threads = [threading.Thread(target=work, args=(lg,)) for lg in logins]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r["expired"] for r in results) == 40
    assert fabric.count("memory_records", "consolidation_state = 'expired'") == 40
    assert len(fabric.events("event_type = 'memory.record.expired'")) == len(ids)


def test_recall_never_decays_anything(fabric: Fabric, run: uuid.UUID) -> None:
    rid = fabric.form(
        run,
        validity_interval={
            "valid_from": "2026-01-01T00:00:00Z",
            "valid_until": "2026-02-01T00:00:00Z",
        },
    )
    fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
    assert state(fabric, rid)[0] == "raw"


# --- erasure ----------------------------------------------------------------------------------


@pytest.mark.clone
def test_erasure_needs_a_decided_unused_erase_approval(fabric: Fabric, run: uuid.UUID) -> None:
    rid, other = fabric.form(run), fabric.form(run)
    conn = fabric.connect("mf_committer")
    pending = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'x')", rid)[
        "approval_id"
    ]
    assert sqlstate(lambda: erase(conn, pending)) == "MF005"
    denied = fabric.call("mf_committer", "SELECT fabric_api.request_erasure(%s, 'x')", rid)[
        "approval_id"
    ]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'denied', 'no')", denied)
    assert sqlstate(lambda: erase(conn, denied)) == "MF005"
    expired = approved_erasure(fabric, rid)
    with fabric.su() as su:
        su.execute(
            "UPDATE fabric.approvals SET expires_at = requested_at + interval '1 microsecond'"
            " WHERE approval_id = %s",
            (expired,),
        )
    assert sqlstate(lambda: erase(conn, expired)) == "MF005"
    promote = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_approval(%s, 'promote', '{\"tier\": \"relational\"}', 'x')",
        rid,
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", promote)
    assert sqlstate(lambda: erase(conn, promote)) == "MF005"
    assert sqlstate(lambda: erase(conn, str(uuid.uuid4()))) == "MF005"
    assert state(fabric, rid)[0] == "raw"
    good = approved_erasure(fabric, rid)
    assert erase(conn, good)["erased"] == [rid]
    assert sqlstate(lambda: erase(conn, good)) == "MF005"  # reused
    assert state(fabric, other)[0] == "raw"
    assert (
        sqlstate(lambda: fabric.call("mf_agent_a", "SELECT fabric_api.erase(%s)", good)) == "42501"
    )


def test_tombstone_keeps_exactly_the_spec_list(fabric: Fabric, run: uuid.UUID) -> None:
    source = fabric.form(run, "source")
    derived = fabric.form(
        run,
        "derived",
        tier="semantic",
        derived_from=[source],
        content={"assertion": "derived"},
    )
    erase(fabric.connect("mf_committer"), approved_erasure(fabric, source))
    with fabric.su() as su:
        row = su.execute(
            "SELECT tier, tenant_id, content, content_hash, source_event_id, correlation_id, "
            "valid_from, subject_id, session_id, agent_id, scope_key, search_tsv, "
            "erasure_approval_id IS NOT NULL, erased_at IS NOT NULL, consolidation_state "
            "FROM fabric.memory_records WHERE memory_id = %s",
            (source,),
        ).fetchone()
        proposal = su.execute(
            "SELECT content, subject_id FROM fabric.proposals WHERE memory_id = %s", (source,)
        ).fetchone()
    assert row is not None
    assert row[0] == "episodic" and row[1] == "acme" and row[3].startswith("sha256:")
    assert row[4].startswith("evt-7b21-") and row[5] == "corr-9d4a" and row[6] is not None
    assert row[2] is None and row[7:12] == (None, None, None, None, None)
    assert row[12:] == (True, True, "tombstoned")
    assert proposal == (None, None)
    assert fabric.count("memory_lineage", f"derived_from_id = '{source}'") == 1
    assert state(fabric, derived)[:2] == ("raw", True)  # not cascaded
    queue = fabric.call("mf_consolidator", "SELECT fabric_api.review_queue('acme')")
    assert [(q["memory_id"], q["tombstoned_source"]) for q in queue] == [(derived, source)]
    (event,) = fabric.events(f"memory_id = '{source}' AND event_type = 'memory.record.forgotten'")
    assert event["payload"]["approval_id"]
    auditor = fabric.connect("mf_auditor")
    receipt = auditor.execute("SELECT fabric_audit.erasure_receipt(%s)", (source,)).fetchone()
    assert receipt is not None and receipt[0]["destroyed"]["proposals"] == 1
    assert auditor.execute(
        "SELECT fabric_audit.verify_tombstone(%s, %s)", (source, Jsonb({"text": "source"}))
    ).fetchone() == (True,)
    assert auditor.execute(
        "SELECT fabric_audit.verify_tombstone(%s, %s)", (source, Jsonb({"text": "something else"}))
    ).fetchone() == (False,)


def test_subject_erasure_covers_every_tier_and_uncommitted_proposals(
    fabric: Fabric, run: uuid.UUID
) -> None:
    ep = fabric.form(run, "ep")
    sem = fabric.form(run, "sem", tier="semantic", derived_from=[ep], content={"a": "sem"})
    validated = fabric.propose("mf_agent_a", episode("not yet committed"), run)
    rejected = fabric.propose("mf_agent_a", episode("bad", confidence=5), run)
    other_run = fabric.open_run(subject="user-other")
    keep = fabric.form(other_run, "someone else")
    a = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'art. 17')",
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", a)
    result = erase(fabric.connect("mf_committer"), a)
    assert sorted(result["erased"]) == sorted([ep, sem])  # type: ignore[type-var]
    assert state(fabric, keep)[:2] == ("raw", True)
    with fabric.su() as su:
        left = su.execute(
            "SELECT count(*) FROM fabric.proposals WHERE subject_id = 'user-8842' "
            "OR (proposal_id = ANY(%s) AND content IS NOT NULL)",
            ([validated["proposal_id"], rejected["proposal_id"]],),
        ).fetchone()
        runs = su.execute(
            "SELECT count(*) FROM fabric.runs WHERE subject_id = 'user-8842'"
        ).fetchone()
    assert left == (0,) and runs == (0,)


@pytest.mark.clone
def test_erase_racing_a_recall_never_tears_a_result(fabric: Fabric, run: uuid.UUID) -> None:
    rid = fabric.form(run, "racing")
    approval_id = approved_erasure(fabric, rid)
    eraser = fabric.connect("mf_committer", autocommit=False)
    eraser.execute("SELECT fabric_api.erase(%s)", (approval_id,))
    during = fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
    assert [(r["memory_id"], r["content"]) for r in during["records"]] == [
        (rid, {"text": "racing"})
    ]
    eraser.commit()
    after = fabric.recall("mf_agent_a", {"run_id": str(run), "tiers": ["episodic"]})
    assert after["records"] == []


@pytest.mark.clone
def test_erase_racing_an_embedding_write_cannot_resurrect_a_vector(
    fabric: Fabric, run: uuid.UUID
) -> None:
    rid = fabric.form(run, "vector me")
    with fabric.su() as su:
        (content_hash,) = su.execute(
            "SELECT content_hash FROM fabric.memory_records WHERE memory_id = %s", (rid,)
        ).fetchone()  # type: ignore[misc]
    projector = fabric.connect("mf_projector")
    store = "SELECT fabric_api.store_embedding(%s, 'm', 'v1', '[1,0,0]', %s)"
    projector.execute(store, (rid, content_hash))
    eraser = fabric.connect("mf_committer", autocommit=False)
    eraser.execute("SELECT fabric_api.erase(%s)", (approved_erasure(fabric, rid),))
    outcome: list[str] = []
    writer = fabric.connect("mf_projector")

    def write() -> None:
        try:
            writer.execute(store, (rid, content_hash))
            outcome.append("stored")
        except psycopg.Error as exc:
            outcome.append(exc.sqlstate or "?")

    thread = threading.Thread(target=write)
    thread.start()
    wait_until_blocked(fabric, writer)
    assert outcome == []  # blocked behind the erasure's row lock
    eraser.commit()
    thread.join(timeout=30)
    assert outcome == ["55000"]
    assert fabric.count("memory_embeddings") == 0


@pytest.mark.clone
def test_forgetting_forgets_everywhere_in_postgres(fabric: Fabric, run: uuid.UUID) -> None:
    canary = f"canary{uuid.uuid4().hex}"
    rid = fabric.form(run, canary)
    child = fabric.form(run, "child", tier="semantic", derived_from=[rid], content={"c": 1})
    with fabric.su() as su:
        (content_hash,) = su.execute(
            "SELECT content_hash FROM fabric.memory_records WHERE memory_id = %s", (rid,)
        ).fetchone()  # type: ignore[misc]
    fabric.session("mf_projector").execute(
        "SELECT fabric_api.store_embedding(%s, 'm', 'v1', '[0.5,0.5]', %s)", (rid, content_hash)
    )
    answer = fabric.recall(
        "mf_agent_a", {"run_id": str(run), "tiers": ["episodic"], "query": canary}
    )
    assert [r["memory_id"] for r in answer["records"]] == [rid]
    with fabric.owner() as owner:
        owner.execute(
            "UPDATE fabric.memory_records SET consolidation_state = 'consolidated' "
            "WHERE memory_id = %s",
            (rid,),
        )  # a history row too

    def dump() -> str:
        return subprocess.run(
            [str(PG_DUMP), "--data-only", "-d", fabric.url],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    assert canary in dump()
    erase(fabric.connect("mf_committer"), approved_erasure(fabric, rid))
    data = dump()
    assert canary not in data
    assert content_hash in data and rid in data and child in data
    assert canary not in Path(fabric.server.logfile).read_text(errors="replace")
    with fabric.su() as su:
        raw = su.execute(
            "SELECT count(*) FROM fabric.memory_records m WHERE m::text LIKE %s", (f"%{canary}%",)
        ).fetchone()
    assert raw == (0,)
    assert fabric.session("mf_auditor").execute(
        "SELECT fabric_audit.verify_tombstone(%s, %s)", (rid, Jsonb({"text": canary}))
    ).fetchone() == (True,)


# --- the deployment embedder and air-gapped instances --------------------------------------


def deploy(fabric: Fabric, settings: dict[str, Any]) -> dict[str, Any]:
    return fabric.call(
        "mf_admin",
        "SELECT fabric_api.configure_deployment(%s)",
        Jsonb(settings),
    )


def test_a_remote_embedder_is_refused_while_an_instance_is_air_gapped(fabric: Fabric) -> None:
    remote = {
        "embedder": "http",
        "embedder_url": "http://gpu.example.com:8080",
        "embedder_model": "bge-small",
    }
    deploy(fabric, remote)  # no air-gapped instance yet
    with pytest.raises(psycopg.errors.CheckViolation) as caught:  # the instance side refuses
        configure(fabric, {"deployment_mode": "air-gapped"})
    assert caught.value.diag.constraint_name == "instance_config_air_gapped_is_local"
    deploy(fabric, {"embedder_url": "http://127.0.0.1:8080"})
    configure(fabric, {"deployment_mode": "air-gapped"})
    with pytest.raises(psycopg.errors.CheckViolation) as caught:  # the deployment side refuses
        deploy(fabric, remote)
    assert caught.value.diag.constraint_name == "instance_config_air_gapped_is_local"
    with fabric.su() as su:
        row = su.execute("SELECT embedder_url FROM fabric.deployment_settings").fetchone()
    assert row == ("http://127.0.0.1:8080",)  # nothing half-written
    configure(fabric, {"local_hosts": ["gpu.example.com"]})
    assert deploy(fabric, remote)["embedder_url"] == "http://gpu.example.com:8080"


@pytest.mark.clone
def test_the_static_embedder_is_a_known_deployment_embedder(fabric: Fabric) -> None:
    from memfabric.embedding import StaticMiniLMEmbedder
    from memfabric.runtime import deployment_embedder

    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        deploy(fabric, {"embedder": "fasttext"})
    assert caught.value.diag.constraint_name == "deployment_settings_embedder_is_known"
    # a new deployment's embedder (migration 0056), left as it was by the refusal
    assert fabric.call(None, "SELECT fabric_api.deployment_embedder()")["embedder"] == "e5"
    assert deploy(fabric, {"embedder": "minilm-static"})["embedder"] == "minilm-static"
    with fabric.su() as su:
        embedder = deployment_embedder(su)
    assert isinstance(embedder, StaticMiniLMEmbedder)
    assert embedder.model == "memfabric/minilm-static"  # another model: another collection


@pytest.mark.clone
def test_e5_is_a_known_deployment_embedder_with_its_own_contract(fabric: Fabric) -> None:
    from memfabric.embedding import MINILM_MODEL, E5Embedder
    from memfabric.runtime import deployment_embedder

    assert deploy(fabric, {"embedder": "e5"})["embedder"] == "e5"
    with fabric.su() as su:
        embedder = deployment_embedder(su)
    assert isinstance(embedder, E5Embedder)
    assert embedder.model == "intfloat/multilingual-e5-small" != MINILM_MODEL


def test_deployment_settings_are_validated(fabric: Fabric) -> None:
    assert sqlstate(lambda: deploy(fabric, {"embedder": "http"})) == "23514"  # needs url+model
    assert sqlstate(lambda: deploy(fabric, {"recall_max_limit": 5000})) == "23514"
    assert sqlstate(lambda: deploy(fabric, {"bogus": 1})) == "22023"
    assert (
        sqlstate(lambda: fabric.call("mf_agent_a", "SELECT fabric_api.configure_deployment('{}')"))
        == "42501"
    )
    assert deploy(fabric, {"recall_default_limit": 5})["recall_default_limit"] == 5


@pytest.mark.parametrize("order", ["episode_sorts_first", "derived_sorts_first"])
def test_subject_erasure_leaves_no_review_flag_on_what_it_erased(
    fabric: Fabric, run: uuid.UUID, order: str
) -> None:
    # The erasure walks the subject's records in memory_id order. Memory ids are made from a
    # sequence for this test (rolled back with it) so both orders of an episode and the
    # semantic record derived from it are tried, not left to gen_random_uuid.
    step = 1 if order == "episode_sorts_first" else -1
    with fabric.su() as su:
        su.execute(
            f"CREATE SEQUENCE public.flag_order_ids INCREMENT {step} MINVALUE 1 MAXVALUE 999"
            " START 500"
        )
        su.execute("GRANT USAGE ON SEQUENCE public.flag_order_ids TO fabric_owner")
        su.execute(
            "ALTER TABLE fabric.memory_records ALTER COLUMN memory_id SET DEFAULT "
            "format('00000000-0000-4000-8000-%s', lpad(nextval('public.flag_order_ids')::text,"
            " 12, '0'))::uuid"
        )
    ep = fabric.form(run, "ep")
    sem = fabric.form(run, "sem", tier="semantic", derived_from=[ep], content={"a": "sem"})
    assert (ep < sem) == (order == "episode_sorts_first")
    a = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'art. 17')",
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", a)
    result = erase(fabric.connect("mf_committer"), a)
    assert sorted(result["erased"]) == sorted([ep, sem])  # type: ignore[type-var]
    # No flag asks about a record the same erasure tombstoned, in either order, and the
    # receipts and the audit relation agree (docs/audit.md, Q11: review_flags_open = 0).
    assert fabric.count("review_flags") == 0
    flagged = (
        fabric.session(None)
        .execute(
            "SELECT memory_id::text, (destroyed ->> 'flagged_for_review')::int"
            " FROM fabric.erasure_receipts ORDER BY memory_id"
        )
        .fetchall()
    )
    assert flagged == sorted([(ep, 0), (sem, 0)])
    rows = (
        fabric.session("mf_auditor")
        .execute(
            "SELECT memory_id::text, flags_raised, flags_open"
            " FROM fabric_audit.erasures('acme', '-infinity', 'infinity') ORDER BY memory_id"
        )
        .fetchall()
    )
    assert rows == sorted([(ep, 0, 0), (sem, 0, 0)])


@pytest.mark.parametrize("first", ["source", "derived"])
def test_erasing_a_flagged_record_closes_its_flag_whichever_is_erased_first(
    fabric: Fabric, run: uuid.UUID, first: str
) -> None:
    ep = fabric.form(run, "ep")
    sem = fabric.form(run, "sem", tier="semantic", derived_from=[ep], content={"a": "sem"})
    for memory_id in [ep, sem] if first == "source" else [sem, ep]:
        erase(fabric.connect("mf_committer"), approved_erasure(fabric, memory_id))
    # Erasing the episode first flags the semantic record; its own erasure then answers the
    # flag. Either way no flag is left open on a tombstone.
    assert fabric.count("review_flags", "resolved_at IS NULL") == 0
    rows = (
        fabric.session("mf_auditor")
        .execute(
            "SELECT memory_id::text, flags_raised, flags_open, flags_erased"
            " FROM fabric_audit.erasures('acme', '-infinity', 'infinity') ORDER BY memory_id"
        )
        .fetchall()
    )
    raised = 1 if first == "source" else 0
    assert rows == sorted([(ep, raised, 0, raised), (sem, 0, 0, 0)])
    closed = (
        fabric.session(None)
        .execute(
            "SELECT (destroyed ->> 'review_flags_closed')::int FROM fabric.erasure_receipts"
            " WHERE memory_id = %s",
            (sem,),
        )
        .fetchone()
    )
    assert closed == (raised,)
    resolved = fabric.events("event_type = 'memory.review_flag.resolved'")
    assert [(e["memory_id"], e["payload"]["decision"]) for e in resolved] == (
        [(sem, "erased")] if first == "source" else []
    )
