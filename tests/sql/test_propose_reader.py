"""fabric._judge_envelopes: the set-based judge of propose_many agrees with
fabric._judge_envelope, the judge of propose, on every envelope it reads.

fabric._judge_envelopes answers a proposal row for each envelope of the common, valid shape
and no row for any other (propose_many judges those one by one). For a corpus of envelopes
(valid variants and each kind of break, alone and in pairs, in runs with and without a
session, for agents with a wide and a narrow profile) every row it answers equals, column by
column, the row fabric._judge_envelope answers for that envelope, the fresh proposal id aside
(content hash and request hash included); and the valid variants are all read by it (the fast
path is taken, so the comparison is not vacuous).
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

import variants
from conftest import Fabric, episode
from variants import DROP, deep


def base(semantic_of: str | None = None) -> dict[str, Any]:
    env = episode(content={"text": "asked for invoices in EUR", "turn": 3})
    env["provenance"]["source_event_id"] = "evt-7b21"  # the same envelope every call
    if semantic_of:
        env["tier"] = "semantic"
        env["derived_from"] = [semantic_of]
    return env


# (path, value): the value at the path replaced (DROP removes the key). "$E" and "$S" stand
# for an episodic record and a semantic record derived from it; "$X" for an unknown id.
PLAIN: list[tuple[tuple[str, ...], Any]] = [
    (("validity_interval",), DROP),
    (("validity_interval",), {}),
    (("validity_interval", "valid_from"), DROP),
    (("validity_interval", "valid_from"), None),
    (("validity_interval", "valid_until"), "2026-08-01T00:00:00+02:00"),
    (("validity_interval", "valid_from"), "2026-07-02T09:14:00.123456Z"),
    (("validity_interval", "valid_from"), "2026-07-02T09:14:00.100-03:30"),
    (("confidence",), 1),
    (("confidence",), 0),
    (("confidence",), 1.0),
    (("confidence",), 0.5),
    (("confidence",), 0.12345678901234),
    (("version",), "2.3.4"),
    (("version",), None),
    (("retention_class",), "audit"),
    (("retention_class",), "operational"),
    (("retention_class",), "regulated"),
    (("retention_class",), None),
    (("retention_class",), DROP),
    (("compliance_labels",), []),
    (("compliance_labels",), None),
    (("compliance_labels",), ["gdpr:art-9", "a/b@c+d=e"]),
    (("scope", "visibility"), "tenant"),
    (("scope", "visibility"), "agent"),
    (("scope", "visibility"), "session"),
    (("scope", "subject_id"), "user-8842"),
    (("scope", "subject_id"), None),
    (("scope", "session_id"), "sess-1f9c"),
    (("scope", "agent_id"), "com-agt-003"),
    (("provenance", "formation_method"), "declaration"),
    (("provenance", "formation_method"), "import"),
    (("provenance", "correlation_id"), DROP),
    (("provenance", "causation_id"), None),
    (("tier",), "procedural"),
    (("tier",), "profile"),
    (("derived_from",), []),
    (("derived_from",), None),
    (("derived_from",), ["$E"]),
    (("derived_from",), ["$E", "$S"]),
    (("supersedes",), None),
    (("content_hash",), None),
    (("business_instance_id",), "inst-1"),
    (("business_instance_id",), None),
    (("content",), {"a": [1, 2.5, -3, {"b": None}], "ü": "ß"}),
    (("content",), {"k": {}}),
]

# Envelopes judged one by one: breaking a rule, or valid in a shape the fast test leaves out.
SLOW: list[tuple[tuple[str, ...], Any]] = [
    (("tier",), "semantic"),  # no derived_from: rejected
    (("tier",), "relational"),
    (("tier",), "working"),
    (("tier",), None),
    (("tier",), 5),
    (("derived_from",), ["$S"]),  # a semantic parent: the ancestor walk decides
    (("derived_from",), ["$X"]),
    (("derived_from",), ["$E", "$X"]),
    (("derived_from",), ["not-a-uuid"]),
    (("derived_from",), ["$E", "$E", "$S"]),  # a source named twice
    (("content",), {}),  # content that says nothing
    (("derived_from",), "$E"),
    (("derived_from",), [5]),
    (("supersedes",), "7f1f5c7e-0000-4000-8000-000000000001"),
    (("supersedes",), 5),
    (("content_hash",), "sha256:00"),
    (("business_instance_id",), "nowhere"),
    (("business_instance_id",), "inst 1"),
    (("validity_interval",), None),
    (("validity_interval",), []),
    (("validity_interval", "extra"), 1),
    (("validity_interval", "valid_until"), "2026-07-01T00:00:00Z"),
    (("validity_interval", "valid_from"), "1900-01-01T00:30:00+01:00"),
    (("validity_interval", "valid_from"), "2026-02-30T00:00:00Z"),
    (("validity_interval", "valid_from"), "2026-07-02t09:14:00z"),
    (("validity_interval", "valid_from"), "2026-07-02 09:14:00Z"),
    (("validity_interval", "valid_from"), "2026-07-02T24:00:00Z"),
    (("validity_interval", "valid_from"), "2026-07-02T09:14:00.1234567890Z"),
    (("validity_interval", "valid_from"), "now"),
    (("validity_interval", "valid_from"), 5),
    (("confidence",), 1.5),
    (("confidence",), 0.123456789012345),
    (("confidence",), -0.1),
    (("confidence",), "0.9"),
    (("confidence",), None),
    (("confidence",), DROP),
    (("version",), "1.0.0-rc.1"),
    (("version",), "01.0.0"),
    (("version",), "99999999999.0.0"),
    (("version",), 5),
    (("version",), "1.0"),
    (("retention_class",), "ephemeral"),
    (("retention_class",), "bogus"),
    (("retention_class",), 3),
    (("compliance_labels",), ["a b"]),
    (("compliance_labels",), ["x"] * 65),
    (("compliance_labels",), [1]),
    (("compliance_labels",), [None]),
    (("compliance_labels",), ["Ünï"]),
    (("compliance_labels",), "pii"),
    (("scope", "visibility"), "world"),
    (("scope", "visibility"), None),
    (("scope", "subject_id"), "user-1"),
    (("scope", "subject_id"), ""),
    (("scope", "subject_id"), "user 8842"),
    (("scope", "subject_id"), 8842),
    (("scope", "session_id"), "sess-2"),
    (("scope", "agent_id"), "com-agt-004"),
    (("scope", "agent_id"), "a\u200bb"),
    (("scope", "tenant_id"), "globex"),
    (("scope", "tenant_id"), None),
    (("scope", "tenant_id"), DROP),
    (("scope", "extra"), "x"),
    (("scope",), DROP),
    (("scope",), "acme"),
    (("provenance",), None),
    (("provenance",), DROP),
    (("provenance",), {}),
    (("provenance", "formation_method"), "consolidation"),
    (("provenance", "formation_method"), None),
    (("provenance", "source_event_id"), None),
    (("provenance", "source_event_id"), "evt ü"),
    (("provenance", "source_event_id"), "e" * 201),
    (("provenance", "correlation_id"), ["x"]),
    (("provenance", "extra"), "x"),
    (("content",), {"n": 12345678901234567}),
    (("content",), {"n": 0.1234567890123456789}),
    (("content",), {"n": 1e300}),
    (("content",), "text"),
    (("content",), DROP),
    (("content",), {"t": "x" * 70000}),
    (("extra",), 1),
    (("memory_id",), "7f1f5c7e-0000-4000-8000-000000000001"),
]

# A semantic envelope judged one by one: without an episode among its parents (rejected, or
# the walk decides), or with audit retention (rejected).
SEMANTIC_SLOW: list[tuple[tuple[str, ...], Any]] = [
    (("derived_from",), None),
    (("derived_from",), []),
    (("derived_from",), DROP),
    (("derived_from",), ["$S"]),
    (("retention_class",), "audit"),
]


def resolve(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, list):
        return [resolve(v, ids) for v in value]
    return value


def mutate(env: dict[str, Any], path: tuple[str, ...], value: Any, ids: dict[str, str]) -> Any:
    return variants.mutate(env, path, value, lambda v: resolve(v, ids))


def corpus(ids: dict[str, str]) -> tuple[list[Any], list[Any]]:
    """(plain envelopes, all envelopes): single mutations of an episode and of a semantic
    envelope, pairs, and a few odd ones."""
    semantic = base(ids["$E"])
    plain = [base(), semantic]
    plain += [mutate(base(), p, v, ids) for p, v in PLAIN]
    plain += [
        mutate(semantic, p, v, ids)
        for p, v in PLAIN
        if p[0] != "derived_from" and v != "audit"  # audit retention: episodes only
    ]
    rng = random.Random(13)
    mutations = PLAIN + SLOW + SEMANTIC_SLOW
    pairs = [
        mutate(mutate(rng.choice([base(), semantic]), *rng.choice(mutations), ids),
               *rng.choice(mutations), ids)
        for _ in range(200)
    ]  # fmt: skip
    odd = [None, [], "x", 5, {}, mutate(base(), ("content",), deep(31), ids)]
    odd += [mutate(base(), ("content",), deep(40), ids)]
    broken = [mutate(base(), p, v, ids) for p, v in SLOW]
    broken += [mutate(semantic, p, v, ids) for p, v in SLOW + SEMANTIC_SLOW]
    return plain, plain + broken + pairs + odd


def world(fabric: Fabric) -> dict[str, str]:
    """An episodic record ($E), a semantic record derived from it ($S), an unknown id ($X),
    and the business instance inst-1 of acme."""
    fabric.call("mf_admin", "SELECT fabric_api.configure_instance('acme', 'inst-1', '{}')")
    run = fabric.open_run()
    e = fabric.form(run, "the episode")
    s = fabric.form(run, "the fact", tier="semantic", derived_from=[e])
    return {"$E": e, "$S": s, "$X": str(uuid.uuid4())}


COLUMNS = """tenant_id, run_id, proposed_by, status, reason, tier, visibility, subject_id,
  agent_id, session_id, business_instance_id, content, content_hash, source_event_id,
  correlation_id, causation_id, formation_method, derived_from, supersedes, confidence,
  valid_from, valid_until, retention_class, compliance_labels, version, proposed_at,
  decided_at, committed_by, memory_id, request_hash, from_tier"""
RUN = "(SELECT r FROM fabric.runs r WHERE r.run_id = %(run)s)"
AGENT = "(SELECT a FROM fabric.agents a WHERE a.agent_id = %(agent)s)"


def batch(conn: psycopg.Connection[Any], envs: list[Any], run: Any, agent: str) -> dict[int, Any]:
    rows = conn.execute(
        f"SELECT j.o_position, (j.o_row).proposal_id IS NOT NULL, {COLUMNS}"  # noqa: S608
        f" FROM fabric._judge_envelopes(%(envs)s::jsonb, {RUN}, {AGENT}) j,"
        " LATERAL (SELECT (j.o_row).*) r ORDER BY j.o_position",
        {"envs": json.dumps(envs), "run": run, "agent": agent},
    ).fetchall()
    assert all(r[1] for r in rows)
    return {r[0]: tuple(r[2:]) for r in rows}


def one(conn: psycopg.Connection[Any], env: Any, run: Any, agent: str) -> Any:
    conn.execute("SAVEPOINT one")
    try:
        row = conn.execute(
            f"SELECT {COLUMNS} FROM fabric._judge_envelope({RUN}, {AGENT}, %(env)s::jsonb)"  # noqa: S608
            " AS r",
            {"env": json.dumps(env), "run": run, "agent": agent},
        ).fetchone()
    except psycopg.Error as exc:
        conn.execute("ROLLBACK TO SAVEPOINT one")
        return exc.sqlstate
    conn.execute("RELEASE SAVEPOINT one")
    return tuple(row) if row else None


# (login, agent id, subject, session): the wide agent with and without the run's session
# and subject, and an agent whose profile allows only episodic records of subject visibility.
RUNS = [
    ("mf_agent_a", "com-agt-003", "user-8842", "sess-1f9c"),
    ("mf_agent_a", "com-agt-003", None, None),
    ("mf_agent_b", "com-agt-004", "user-8842", "sess-1f9c"),
]


@pytest.mark.parametrize("login, agent, subject, session", RUNS)
def test_set_based_judge_equals_the_judge_of_propose(
    fabric: Fabric, login: str, agent: str, subject: str | None, session: str | None
) -> None:
    ids = world(fabric)
    plain, envelopes = corpus(ids)
    run = fabric.open_run(agent_id=agent, subject=subject, session=session)
    with fabric.owner(autocommit=False) as conn:  # one transaction: one now()
        got = batch(conn, envelopes, run, agent)
        for position, row in got.items():
            want = one(conn, envelopes[position - 1], run, agent)
            assert row == want, (position, envelopes[position - 1])
            assert row[3] == "validated"
        if login == "mf_agent_a" and subject is not None:
            # every valid variant is read set-based: the comparison is not vacuous
            assert set(range(1, len(plain) + 1)) <= set(got)
            assert len(got) < len(envelopes)
        else:
            assert got  # some are read set-based in the narrow runs too


def test_the_slow_variants_are_left_to_the_judge_of_propose(fabric: Fabric) -> None:
    ids = world(fabric)
    run = fabric.open_run()
    semantic = base(ids["$E"])
    envelopes = [mutate(base(), p, v, ids) for p, v in SLOW if v != ["$S"]]
    envelopes += [mutate(semantic, p, v, ids) for p, v in SEMANTIC_SLOW]
    with fabric.owner(autocommit=False) as conn:
        assert batch(conn, envelopes, run, "com-agt-003") == {}


def test_propose_many_takes_the_set_based_path(fabric: Fabric) -> None:
    ids = world(fabric)
    run = fabric.open_run()
    envelopes = [base(), base(ids["$E"]), mutate(base(), ("confidence",), 1.5, ids)]
    envelopes[1]["provenance"]["source_event_id"] = "evt-2"
    envelopes[2]["provenance"]["source_event_id"] = "evt-3"
    # track_functions is the superuser's to set: for the agent's sessions in this database
    fabric.session(None).execute(
        sql.SQL("ALTER ROLE mf_agent_a IN DATABASE {} SET track_functions = 'all'").format(
            sql.Identifier(fabric.dbname)
        )
    )
    with fabric.connect("mf_agent_a", autocommit=False) as conn:
        judge = "fabric._judge_envelope(fabric.runs, fabric.agents, jsonb)"
        oid = fabric.call(None, "SELECT %s::regprocedure::oid", judge)
        calls = "SELECT coalesce(pg_stat_get_xact_function_calls(%s), 0)"
        before = conn.execute(calls, (oid,)).fetchone()
        answers = conn.execute(
            "SELECT fabric_api.propose_many(%s::jsonb, %s)", (json.dumps(envelopes), run)
        ).fetchone()
        after = conn.execute(calls, (oid,)).fetchone()
        assert answers is not None and before is not None and after is not None
        assert [a["status"] for a in answers[0]] == ["validated", "validated", "rejected"]
        assert after[0] == before[0] + 1  # only the rejected one was judged one by one
