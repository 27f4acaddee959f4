"""Formation rules (R-PROP-1..4) and the line between errors and rejections.

Inside an authorized run, a governance violation is an answer: status 'rejected' with a
reason, a proposal row that says so, one memory.proposal.rejected event and no record.
A structural problem is an error with a stable SQLSTATE that writes nothing at all.
The owner's raw INSERTs meet the same rules as constraints.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.types.json import Jsonb

from conftest import Fabric, episode
from memfabric.hashing import content_hash

pytestmark = pytest.mark.rollback

# --- helpers ------------------------------------------------------------------------------


def semantic(derived_from: list[str] | None = None, **overrides: Any) -> dict[str, Any]:
    env = episode("prefers invoices in EUR", tier="semantic", **overrides)
    if derived_from is not None:
        env["derived_from"] = derived_from
    return env


def assert_rejected(
    fabric: Fabric,
    envelope: dict[str, Any],
    reason_mentions: str,
    *,
    login: str = "mf_agent_a",
    run: uuid.UUID | None = None,
) -> dict[str, Any]:
    """A governance rejection: one rejected proposal, one event, no record."""
    run = fabric.open_run() if run is None else run
    before = fabric.counts()
    result = fabric.propose(login, envelope, run)
    after = fabric.counts()
    assert result["status"] == "rejected", result
    assert isinstance(result["reason"], str) and reason_mentions in result["reason"], result
    assert after["proposals"] == before["proposals"] + 1
    assert after["events"] == before["events"] + 1
    assert after["memory_records"] == before["memory_records"]
    assert after["memory_lineage"] == before["memory_lineage"]
    row = (
        fabric.session()
        .execute(
            "SELECT status, reason FROM fabric.proposals WHERE proposal_id = %s",
            (result["proposal_id"],),
        )
        .fetchone()
    )
    assert row == ("rejected", result["reason"])
    events = fabric.events(f"proposal_id = '{result['proposal_id']}'")
    assert [e["event_type"] for e in events] == ["memory.proposal.rejected"]
    assert events[0]["payload"]["reason"] == result["reason"]
    # a rejected proposal never commits
    with pytest.raises(errors.ObjectNotInPrerequisiteState):
        fabric.commit(result["proposal_id"])
    assert fabric.count("memory_records") == before["memory_records"]
    return result


def assert_structural_error(
    fabric: Fabric, envelope: Any, sqlstate: str, *, raw: bool = False
) -> psycopg.Error:
    """An error with this SQLSTATE, and nothing written anywhere.

    raw=True sends `envelope` as JSON text (or SQL NULL for None) instead of through Jsonb.
    """
    run = fabric.open_run()
    before = fabric.counts()
    conn = fabric.connect("mf_agent_a")
    with pytest.raises(psycopg.Error) as info:
        if raw:
            conn.execute("SELECT fabric_api.propose(%s::jsonb, %s)", (envelope, run))
        else:
            conn.execute("SELECT fabric_api.propose(%s, %s)", (Jsonb(envelope), run))
    assert info.value.sqlstate == sqlstate, (info.value.sqlstate, info.value.diag.message_primary)
    assert fabric.counts() == before
    return info.value


def nest(depth: int) -> dict[str, Any]:
    """A content object whose nesting depth (fabric._jsonb_depth) is exactly `depth`."""
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = {"n": value}
    return {"n": value}


# --- governance rejections ----------------------------------------------------------------


def test_a_proposal_without_source_event_id_is_rejected(fabric: Fabric) -> None:
    env = episode()
    del env["provenance"]["source_event_id"]
    assert_rejected(fabric, env, "source_event_id")


@pytest.mark.parametrize("method", ["consolidation", "reflection"])
def test_agents_do_not_propose_consolidation_or_reflection(fabric: Fabric, method: str) -> None:
    env = episode()
    env["provenance"]["formation_method"] = method
    assert_rejected(fabric, env, "extraction, declaration or import")


def test_agents_never_propose_into_the_relational_tier(fabric: Fabric) -> None:
    # com-agt-003's propose_scope lists relational: the rule holds regardless
    assert_rejected(fabric, episode(tier="relational"), "relational")


@pytest.mark.parametrize(
    "supersedes", [str(uuid.uuid4()), "not-a-uuid"], ids=["a-uuid", "not-a-uuid"]
)
def test_agents_never_propose_with_supersedes(fabric: Fabric, supersedes: str) -> None:
    assert_rejected(fabric, episode(supersedes=supersedes), "supersedes")


def test_a_tier_outside_propose_scope_is_rejected(fabric: Fabric) -> None:
    run = fabric.open_run(agent_id="com-agt-004")  # propose_scope: episodic / subject
    episode_id = fabric.form(envelope=episode())
    assert_rejected(
        fabric, semantic([episode_id]), "propose_scope.tiers", login="mf_agent_b", run=run
    )


def test_a_visibility_outside_propose_scope_is_rejected(fabric: Fabric) -> None:
    run = fabric.open_run(agent_id="com-agt-004")
    env = episode(scope={"tenant_id": "acme", "visibility": "tenant"})
    assert_rejected(fabric, env, "propose_scope.visibility", login="mf_agent_b", run=run)


def test_session_visibility_needs_a_session_in_the_run(fabric: Fabric) -> None:
    run = fabric.open_run(session=None)
    env = episode(scope={"tenant_id": "acme", "visibility": "session"})
    assert_rejected(fabric, env, "session", run=run)


def test_subject_visibility_needs_a_subject_in_the_run(fabric: Fabric) -> None:
    run = fabric.open_run(subject=None)
    assert_rejected(fabric, episode(), "subject", run=run)


def test_ephemeral_retention_is_rejected(fabric: Fabric) -> None:
    assert_rejected(fabric, episode(retention_class="ephemeral"), "ephemeral")


@pytest.mark.parametrize("tier", ["semantic", "procedural", "profile"])
def test_audit_retention_only_on_episodic(fabric: Fabric, tier: str) -> None:
    episode_id = fabric.form(envelope=episode())
    env = episode(tier=tier, retention_class="audit", derived_from=[episode_id])
    assert_rejected(fabric, env, "audit")


def test_audit_retention_on_episodic_is_accepted(fabric: Fabric) -> None:
    record_id = fabric.form(envelope=episode(retention_class="audit"))
    assert (
        fabric.count("memory_records", f"memory_id = '{record_id}' AND retention_class = 'audit'")
        == 1
    )


@pytest.mark.parametrize("confidence", [1.5, -0.1, 1e300, -1e-9])
def test_confidence_outside_the_unit_interval_is_rejected(
    fabric: Fabric, confidence: float
) -> None:
    assert_rejected(fabric, episode(confidence=confidence), "confidence")


@pytest.mark.parametrize("confidence", [0, 1, 0.0, 1.0])
def test_confidence_at_the_bounds_is_accepted(fabric: Fabric, confidence: float) -> None:
    fabric.form(envelope=episode(confidence=confidence))


@pytest.mark.parametrize(
    "valid_until", ["2026-07-02T09:14:00Z", "2026-07-02T10:14:00+01:00", "2026-07-01T00:00:00Z"]
)
def test_valid_until_must_be_after_valid_from(fabric: Fabric, valid_until: str) -> None:
    env = episode(
        validity_interval={"valid_from": "2026-07-02T09:14:00Z", "valid_until": valid_until}
    )
    assert_rejected(fabric, env, "valid_until")


@pytest.mark.parametrize("version", ["1.0", "v1.0.0", "01.0.0", "1.0.0.0", "1.0.0-", "latest"])
def test_a_non_semver_version_is_rejected(fabric: Fabric, version: str) -> None:
    assert_rejected(fabric, episode(tier="procedural", version=version), "SemVer")


def test_a_semver_version_with_prerelease_and_build_is_accepted(fabric: Fabric) -> None:
    fabric.form(envelope=episode(tier="procedural", version="10.2.3-rc.1+build.5"))


def test_semantic_without_derived_from_is_rejected(fabric: Fabric) -> None:
    assert_rejected(fabric, semantic(), "episodic source")


def test_semantic_derived_only_from_non_episodic_records_is_rejected(fabric: Fabric) -> None:
    procedural_id = fabric.form(envelope=episode("how to file an invoice", tier="procedural"))
    assert_rejected(fabric, semantic([procedural_id]), "episodic source")


def test_semantic_derived_from_an_episode_is_accepted(fabric: Fabric) -> None:
    episode_id = fabric.form(envelope=episode())
    record_id = fabric.form(envelope=semantic([episode_id]))
    lineage = fabric.count(
        "memory_lineage", f"memory_id = '{record_id}' AND derived_from_id = '{episode_id}'"
    )
    assert lineage == 1


def test_semantic_derived_transitively_from_an_episode_is_accepted(fabric: Fabric) -> None:
    episode_id = fabric.form(envelope=episode())
    first = fabric.form(envelope=semantic([episode_id]))
    second = fabric.form(envelope=semantic([first], content={"text": "bills in EUR"}))
    assert fabric.count("memory_records", f"memory_id = '{second}' AND tier = 'semantic'") == 1


# --- structural errors: nothing written ---------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [None, "null", "[]", "[{}]", '"episodic"', "1", "true"],
    ids=["sql-null", "json-null", "array", "array-of-object", "string", "number", "bool"],
)
def test_a_non_object_envelope_is_an_error(fabric: Fabric, text: str | None) -> None:
    assert_structural_error(fabric, text, "22023", raw=True)


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    env = episode()
    target = env
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return env


def _without(*path: str) -> dict[str, Any]:
    env = episode()
    target = env
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return env


@pytest.mark.parametrize(
    "envelope",
    [
        pytest.param(_with(("memory_id",), str(uuid.uuid4())), id="top-memory_id"),
        pytest.param(_with(("consolidation_state",), "raw"), id="top-consolidation_state"),
        pytest.param(_with(("Tier",), "episodic"), id="top-case-variant"),
        pytest.param(_with(("scope", "org_id"), "acme"), id="scope-extra"),
        pytest.param(_with(("provenance", "formed_by"), "os-agt-010"), id="provenance-formed_by"),
        pytest.param(
            _with(("validity_interval", "recorded_at"), "2026-07-02T09:14:00Z"), id="validity-extra"
        ),
    ],
)
def test_unknown_keys_are_an_error(fabric: Fabric, envelope: dict[str, Any]) -> None:
    assert_structural_error(fabric, envelope, "22023")


@pytest.mark.parametrize(
    "envelope",
    [
        pytest.param(_with(("tier",), 1), id="tier-number"),
        pytest.param(_with(("tier",), ["episodic"]), id="tier-array"),
        pytest.param(_without("tier"), id="tier-missing"),
        pytest.param(_with(("scope",), "acme"), id="scope-string"),
        pytest.param(_without("scope"), id="scope-missing"),
        pytest.param(_with(("scope", "tenant_id"), 7), id="tenant-number"),
        pytest.param(_with(("scope", "tenant_id"), None), id="tenant-null"),
        pytest.param(_with(("scope", "subject_id"), {"id": "user-8842"}), id="subject-object"),
        pytest.param(_with(("scope", "subject_id"), "user 8842"), id="subject-space"),
        pytest.param(_with(("scope", "visibility"), True), id="visibility-bool"),
        pytest.param(_with(("content",), "asked for invoices"), id="content-string"),
        pytest.param(_with(("content",), ["asked"]), id="content-array"),
        pytest.param(_without("content"), id="content-missing"),
        pytest.param(_with(("content_hash",), 42), id="content_hash-number"),
        pytest.param(_with(("provenance",), []), id="provenance-array"),
        pytest.param(_without("provenance"), id="provenance-missing"),
        pytest.param(_with(("provenance", "source_event_id"), 7), id="source-number"),
        pytest.param(_with(("provenance", "formation_method"), None), id="method-null"),
        pytest.param(_with(("derived_from",), str(uuid.uuid4())), id="derived-string"),
        pytest.param(_with(("derived_from",), ["mem-123"]), id="derived-not-uuid"),
        pytest.param(_with(("derived_from",), [7]), id="derived-number"),
        pytest.param(_with(("derived_from",), [str(uuid.uuid4())] * 257), id="derived-too-many"),
        pytest.param(_with(("confidence",), "0.9"), id="confidence-string"),
        pytest.param(_with(("confidence",), None), id="confidence-null"),
        pytest.param(_without("confidence"), id="confidence-missing"),
        pytest.param(_with(("validity_interval",), "2026-07-02"), id="validity-string"),
        pytest.param(_with(("validity_interval",), None), id="validity-null"),
        pytest.param(_with(("retention_class",), 3), id="retention-number"),
        pytest.param(_with(("compliance_labels",), "pii"), id="labels-string"),
        pytest.param(_with(("compliance_labels",), [1]), id="labels-number"),
        pytest.param(_with(("compliance_labels",), [None]), id="labels-null-item"),
        pytest.param(_with(("compliance_labels",), ["pii"] * 65), id="labels-too-many"),
        pytest.param(_with(("version",), 1), id="version-number"),
        pytest.param(_with(("supersedes",), 5), id="supersedes-number"),
        pytest.param(_with(("supersedes",), [str(uuid.uuid4())]), id="supersedes-array"),
        pytest.param(_with(("business_instance_id",), {"id": "x"}), id="instance-object"),
    ],
)
def test_wrong_types_are_an_error(fabric: Fabric, envelope: dict[str, Any]) -> None:
    assert_structural_error(fabric, envelope, "22023")


@pytest.mark.parametrize(
    "envelope",
    [
        pytest.param(_with(("tier",), "working"), id="tier-working"),
        pytest.param(_with(("tier",), "graph"), id="tier-graph"),
        pytest.param(_with(("tier",), "Episodic"), id="tier-case"),
        pytest.param(_with(("scope", "visibility"), "global"), id="visibility-global"),
        pytest.param(_with(("scope", "visibility"), "platform"), id="visibility-platform"),
        pytest.param(_with(("retention_class",), "forever"), id="retention-forever"),
        pytest.param(_with(("provenance", "formation_method"), "guess"), id="method-guess"),
        pytest.param(
            _with(("provenance", "formation_method"), "distillation"), id="method-distillation"
        ),
    ],
)
def test_unknown_enumerations_are_an_error(fabric: Fabric, envelope: dict[str, Any]) -> None:
    assert_structural_error(fabric, envelope, "22023")


@pytest.mark.parametrize(
    "timestamp",
    [
        "2026-07-02T09:14:00",
        "2026-07-02",
        "now",
        "yesterday",
        "infinity",
        "-infinity",
        "2026-02-30T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-07-02T25:00:00Z",
        "2026-07-02T09:14:00+25:00",
        "2026-07-02T09:14:00 UTC",
        "02/07/2026 09:14:00Z",
        "",
    ],
)
@pytest.mark.parametrize("field", ["valid_from", "valid_until"])
def test_a_bad_timestamp_is_an_error(fabric: Fabric, field: str, timestamp: str) -> None:
    validity = {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None, field: timestamp}
    assert_structural_error(fabric, episode(validity_interval=validity), "22007")


def test_a_timestamp_that_is_not_a_string_is_an_error(fabric: Fabric) -> None:
    validity = {"valid_from": 1782980040, "valid_until": None}
    assert_structural_error(fabric, episode(validity_interval=validity), "22007")


def test_derived_from_an_unknown_id_is_an_error(fabric: Fabric) -> None:
    fabric.form(envelope=episode())
    assert_structural_error(fabric, semantic([str(uuid.uuid4())]), "23503")


def test_derived_from_another_tenants_record_is_an_error(fabric: Fabric) -> None:
    globex_env = episode(scope={"tenant_id": "globex", "visibility": "subject"})
    globex_run = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    globex_id = fabric.form(globex_run, login="mf_agent_g", envelope=globex_env)
    assert (
        fabric.count("memory_records", f"memory_id = '{globex_id}' AND tenant_id = 'globex'") == 1
    )
    acme_episode = fabric.form(envelope=episode())
    assert_structural_error(fabric, semantic([acme_episode, globex_id]), "23503")


def test_a_content_hash_that_differs_is_an_error(fabric: Fabric) -> None:
    env = episode()
    env["content_hash"] = content_hash({"text": "something else"})
    assert_structural_error(fabric, env, "22023")


@pytest.mark.parametrize("supplied", ["sha256:" + "0" * 64, "", "SHA256:x", "md5:abc"])
def test_a_malformed_content_hash_is_an_error(fabric: Fabric, supplied: str) -> None:
    assert_structural_error(fabric, episode(content_hash=supplied), "22023")


def test_a_matching_content_hash_is_accepted(fabric: Fabric) -> None:
    env = episode()
    env["content_hash"] = content_hash(env["content"])
    run = fabric.open_run()
    result = fabric.propose("mf_agent_a", env, run)
    assert result["status"] == "validated"
    assert fabric.commit(result["proposal_id"])["content_hash"] == env["content_hash"]


def test_content_over_64_kib_is_an_error(fabric: Fabric) -> None:
    big = {"text": "x" * 65536}
    assert len(json.dumps(big).encode()) > 65536
    assert_structural_error(fabric, episode(content=big), "54000")


def test_content_just_under_64_kib_is_accepted(fabric: Fabric) -> None:
    content = {"text": "x" * (65536 - len('{"text": ""}'))}
    assert len(json.dumps(content).encode()) == 65536
    fabric.form(envelope=episode(content=content))


def test_content_nested_deeper_than_32_is_an_error(fabric: Fabric) -> None:
    depth = (
        fabric.session().execute("SELECT fabric._jsonb_depth(%s)", (Jsonb(nest(33)),)).fetchone()
    )
    assert depth == (33,)
    assert_structural_error(fabric, episode(content=nest(33)), "54000")


def test_content_nested_32_deep_is_accepted(fabric: Fabric) -> None:
    fabric.form(envelope=episode(content=nest(32)))


@pytest.mark.parametrize(
    "number",
    [
        "9007199254740993",
        "-9007199254740993",
        "0.1234567890123456789012",
        "1e400",
        "1e-400",
        "1152921504606846976",
    ],
)
def test_a_number_that_is_not_an_ieee_double_is_an_error(fabric: Fabric, number: str) -> None:
    text = json.dumps(episode(content={"text": "n", "n": 0})).replace('"n": 0', f'"n": {number}')
    assert number in text
    assert_structural_error(fabric, text, "22003", raw=True)


# --- the owner's raw INSERTs meet the same rules ------------------------------------------

RAW_INSERT = """
INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, content,
  source_event_id, formed_by, formation_method, confidence, valid_from, retention_class)
VALUES (%(tenant)s, %(tier)s, %(visibility)s, %(subject)s, %(content)s, 'evt-raw-1',
  'os-agt-010', 'extraction', 0.9, '2026-07-02T09:14:00Z', %(retention)s)
"""


def raw(
    tenant: str = "acme",
    tier: str = "episodic",
    visibility: str = "subject",
    subject: str | None = "user-8842",
    retention: str = "durable",
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "tier": tier,
        "visibility": visibility,
        "subject": subject,
        "content": Jsonb({"text": "raw"}),
        "retention": retention,
    }


@pytest.mark.clone
def test_owner_raw_episode_insert_is_possible(fabric: Fabric) -> None:
    """The control for the refusals below: the same INSERT, valid, goes in."""
    fabric.owner().execute(RAW_INSERT, raw())
    assert fabric.count("memory_records", "source_event_id = 'evt-raw-1'") == 1


@pytest.mark.clone
def test_owner_raw_semantic_without_lineage_fails_at_commit(fabric: Fabric) -> None:
    conn = fabric.owner(autocommit=False)
    conn.execute(RAW_INSERT, raw(tier="semantic"))  # deferred: the INSERT itself passes
    with pytest.raises(errors.CheckViolation) as info:
        conn.commit()
    assert info.value.diag.constraint_name == "memory_records_semantic_needs_episode"
    assert fabric.count("memory_records") == 0
    assert fabric.count("events", "event_type = 'memory.record.formed'") == 0


def _raw_semantic_of(conn: psycopg.Connection[Any], parent: str) -> None:
    """A semantic record formed by hand with one lineage row to parent (not committed)."""
    row = conn.execute(RAW_INSERT + " RETURNING memory_id", raw(tier="semantic")).fetchone()
    assert row is not None
    conn.execute(
        "INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)"
        " VALUES ('acme', %s, %s)",
        (row[0], parent),
    )


@pytest.mark.clone
def test_owner_raw_semantic_of_a_non_episode_fails_at_commit(fabric: Fabric) -> None:
    """A parent that is not an episode (and has none) does not pass the direct-parent test
    of the deferred check, nor its walk."""
    procedural = fabric.form(envelope=episode("how to file an invoice", tier="procedural"))
    before = fabric.count("memory_records")
    conn = fabric.owner(autocommit=False)
    _raw_semantic_of(conn, procedural)
    with pytest.raises(errors.CheckViolation) as info:
        conn.commit()
    assert info.value.diag.constraint_name == "memory_records_semantic_needs_episode"
    assert fabric.count("memory_records") == before
    assert fabric.count("memory_lineage") == 0


@pytest.mark.clone
def test_owner_raw_semantic_of_a_semantic_with_an_episode_commits(fabric: Fabric) -> None:
    """The walk: a semantic parent whose own parent is an episode."""
    run = fabric.open_run()
    first = fabric.form(run, "the episode")
    fact = fabric.form(run, "the fact", tier="semantic", derived_from=[first])
    conn = fabric.owner(autocommit=False)
    _raw_semantic_of(conn, fact)
    conn.commit()
    assert fabric.count("memory_records", "tier = 'semantic'") == 2


def test_a_commit_whose_source_left_the_episodic_tier_is_refused_by_the_rule(
    fabric: Fabric,
) -> None:
    """The rule through the API: a semantic proposal validated with one episode as its
    source, which is promoted into relational (under an approval) before the commit. Both
    commit paths raise the rule's SQLSTATE and name it, writing nothing (on Citus the API
    checks the rule itself before it returns: tests/citus)."""
    run = fabric.open_run()
    source = fabric.form(run, "the episode")
    proposal = fabric.proposed(run, envelope=semantic([source]))
    approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_approval(%s, 'promote', %s, 'x')",
        source,
        Jsonb({"tier": "relational"}),
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    fabric.call(
        "mf_committer", "SELECT fabric_api.promote(%s, 'relational', %s, NULL)", source, approval
    )
    before = fabric.counts()
    for call in (
        "SELECT fabric_api.commit(%s)",
        "SELECT fabric_api.commit_many(ARRAY[%s]::uuid[])",
    ):
        with pytest.raises(errors.CheckViolation) as info:
            fabric.call("mf_committer", call, proposal)
        assert info.value.diag.constraint_name == "memory_records_semantic_needs_episode"
        assert fabric.counts() == before
    assert fabric.count("proposals", f"proposal_id = '{proposal}' AND status = 'validated'") == 1


@pytest.mark.clone
def test_owner_raw_subject_visibility_without_subject_is_refused(fabric: Fabric) -> None:
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner().execute(RAW_INSERT, raw(subject=None))
    assert info.value.diag.constraint_name == "memory_records_visibility_has_its_id"
    assert fabric.count("memory_records") == 0


@pytest.mark.clone
def test_owner_raw_insert_into_tenant_platform_is_refused(fabric: Fabric) -> None:
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner(tenant="platform").execute(RAW_INSERT, raw(tenant="platform"))
    assert info.value.diag.constraint_name == "tenant_id_is_not_platform"
    assert fabric.count("memory_records") == 0


def test_tenant_platform_cannot_be_created(fabric: Fabric) -> None:
    with pytest.raises(errors.InvalidParameterValue):
        fabric.session("mf_admin").execute("SELECT fabric_api.create_tenant('platform')")
    assert fabric.count("tenants", "tenant_id = 'platform'") == 0


@pytest.mark.clone
def test_owner_raw_audit_retention_on_semantic_is_refused(fabric: Fabric) -> None:
    with pytest.raises(errors.CheckViolation) as info:
        fabric.owner().execute(RAW_INSERT, raw(tier="semantic", retention="audit"))
    assert info.value.diag.constraint_name == "memory_records_audit_retention_only_on_episodic"
    assert fabric.count("memory_records") == 0


@pytest.mark.parametrize(
    "isolation",
    [
        pytest.param("rollback", marks=pytest.mark.rollback(always=True)),
        pytest.param("clone", marks=pytest.mark.clone),
    ],
)
def test_owner_raw_semantic_without_lineage_fails_on_an_autocommit_connection(
    fabric: Fabric, isolation: str
) -> None:
    """The deferred rule fires at the implicit commit of an autocommit statement: the INSERT
    itself raises. (Run both ways: in a test marked rollback, `TxBackend` fires the deferred
    triggers at the end of each call, as COMMIT would.)"""
    assert (fabric._tx is not None) == (isolation == "rollback")
    conn = fabric.owner()
    with pytest.raises(errors.CheckViolation) as info:
        conn.execute(RAW_INSERT, raw(tier="semantic"))
    assert info.value.diag.constraint_name == "memory_records_semantic_needs_episode"
    assert fabric.count("memory_records") == 0
    conn.execute(RAW_INSERT, raw())  # the connection goes on: the episode commits
    assert fabric.count("memory_records") == 1
