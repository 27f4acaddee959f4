"""What the projections are fed never names a subject or a session in clear (docs/security.md,
"Identifiers in the projections"): the feed gives the subject's pseudonym (`subject_ref`, the
one of the audit trail) and the session's under the same key (`session_ref`), and the scope
key built from them; a vector recall's filter names the same scope keys, computed by the
database; a subject's key is made with its first record; once the subject is erased its key
is gone, so no pseudonym can be recomputed or linked to it."""

from __future__ import annotations

import json
import uuid
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from conftest import Fabric

SUBJECT, SESSION = "user-8842", "sess-1f9c"
FEED = "SELECT * FROM fabric_api.projection_records_v2(%s::uuid[])"


def feed(fabric: Fabric, ids: list[str]) -> dict[str, dict[str, Any]]:
    with fabric.connect("mf_projector").cursor(row_factory=dict_row) as cur:
        return {str(r["memory_id"]): r for r in cur.execute(FEED, (ids,)).fetchall()}


def key_of(fabric: Fabric, subject: str) -> tuple[str, bytes] | None:
    row = (
        fabric.su()
        .execute(
            "SELECT subject_ref, key FROM fabric.subject_keys"
            " WHERE tenant_id = 'acme' AND subject_id = %s",
            (subject,),
        )
        .fetchone()
    )
    return None if row is None else (row[0], bytes(row[1]))


def hmac(fabric: Fabric, key: bytes, kind: str, value: str) -> str:
    row = fabric.su().execute("SELECT fabric._pseudonym(%s, %s, %s)", (key, kind, value)).fetchone()
    assert row is not None
    return str(row[0])


def formed(fabric: Fabric, subject: str = SUBJECT) -> tuple[uuid.UUID, dict[str, str]]:
    """A run of `subject` in session SESSION, and one record of each visibility."""
    run = fabric.open_run(subject=subject, session=SESSION)
    ids = {
        vis: fabric.form(
            run, f"invoices go out in EUR ({vis})", scope={"tenant_id": "acme", "visibility": vis}
        )
        for vis in ("subject", "session", "agent", "tenant")
    }
    return run, ids


def erase_subject(fabric: Fabric, subject: str) -> None:
    approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', %s, 'art. 17')",
        subject,
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)


def text_of(rows: Any) -> str:
    return json.dumps(rows, default=str)


def test_the_feed_names_the_subject_and_session_only_by_pseudonyms(fabric: Fabric) -> None:
    _, ids = formed(fabric)
    rows = feed(fabric, list(ids.values()))
    assert SUBJECT not in text_of(rows) and SESSION not in text_of(rows)
    assert all("subject_id" not in r and "session_id" not in r for r in rows.values())
    key = key_of(fabric, SUBJECT)
    assert key is not None
    subject_ref, secret = key
    session_ref = hmac(fabric, secret, "session", SESSION)  # the audit trail's session_ref
    assert subject_ref.startswith("hmac:") and session_ref.startswith("hmac:")
    for r in rows.values():
        assert (r["subject_ref"], r["session_ref"]) == (subject_ref, session_ref)
    scope = {vis: (rows[i]["scope_id"], rows[i]["scope_key"]) for vis, i in ids.items()}
    assert scope == {
        "subject": (subject_ref, f"subject:{subject_ref}"),
        "session": (session_ref, f"session:{session_ref}"),
        "agent": ("com-agt-003", "agent:com-agt-003"),
        "tenant": ("acme", "tenant"),
    }


def test_a_vector_recall_filters_by_the_scope_keys_the_feed_gives(fabric: Fabric) -> None:
    run, ids = formed(fabric)
    agent = fabric.connect("mf_agent_a")
    resolved = agent.execute(
        "SELECT fabric_api.recall(%s)",
        (
            Jsonb(
                {"run_id": str(run), "mode": "semantic", "query": "currency", "tiers": ["episodic"]}
            ),
        ),
    ).fetchone()
    assert resolved is not None and resolved[0]["status"] == "resolved"
    keys = resolved[0]["filter"]["scope_keys"]
    assert {r["scope_key"] for r in feed(fabric, list(ids.values())).values()} <= set(keys)
    assert SUBJECT not in text_of(keys)
    # the session's records formed without a subject are held as they are, and named so
    assert f"session:{SESSION}" in keys


def test_a_session_without_a_subject_is_projected_as_it_is(fabric: Fabric) -> None:
    run = fabric.open_run(subject=None, session=SESSION)
    memory_id = fabric.form(
        run, "a note of the session", scope={"tenant_id": "acme", "visibility": "session"}
    )
    row = feed(fabric, [memory_id])[memory_id]
    assert (row["subject_ref"], row["session_ref"], row["scope_key"]) == (
        None,
        SESSION,
        f"session:{SESSION}",
    )


def test_a_subjects_key_is_made_when_a_run_names_it(fabric: Fabric) -> None:
    assert key_of(fabric, "user-5150") is None
    _, ids = formed(fabric, "user-5150")
    key = key_of(fabric, "user-5150")
    assert key is not None
    assert feed(fabric, [ids["subject"]])[ids["subject"]]["subject_ref"] == key[0]


def test_a_subjects_key_is_made_with_its_first_record_when_no_run_named_it(
    fabric: Fabric,
) -> None:
    """An import forms records of subjects no run has named: their keys come with them."""
    assert key_of(fabric, "user-6160") is None
    element = {
        "scope": {"tenant_id": "acme", "subject_id": "user-6160", "visibility": "subject"},
        "content": {"text": "asked for invoices in EUR"},
        "provenance": {"correlation_id": "corr-crm", "formation_method": "import"},
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        "retention_class": "durable",
    }
    answer = fabric.call(
        "mf_committer",
        "SELECT fabric_api.import_records('acme', 'imp-5', %s)",
        Jsonb([element, {**element, "content": {"text": "and in USD later"}}]),
    )
    assert answer["formed"] == 2, answer
    ids = [
        str(i)
        for (i,) in fabric.su().execute(
            "SELECT memory_id FROM fabric.memory_records WHERE subject_id = 'user-6160'"
        )
    ]
    assert len(ids) == 2
    key = key_of(fabric, "user-6160")
    assert key is not None
    assert {r["subject_ref"] for r in feed(fabric, ids).values()} == {key[0]}


def test_a_subject_without_a_key_is_fed_without_a_scope_key(fabric: Fabric) -> None:
    """Fail closed: a live record whose subject has no key (it lost a race with its
    subject's erasure) is fed with no pseudonym and no scope key, never with the id."""
    _, ids = formed(fabric)
    fabric.su().execute(
        "DELETE FROM fabric.subject_keys WHERE tenant_id = 'acme' AND subject_id = %s", (SUBJECT,)
    )
    rows = feed(fabric, list(ids.values()))
    assert SUBJECT not in text_of(rows) and SESSION not in text_of(rows)
    for vis in ("subject", "session"):
        r = rows[ids[vis]]
        assert (r["subject_ref"], r["session_ref"], r["scope_id"], r["scope_key"]) == (None,) * 4


def test_after_subject_erasure_no_pseudonym_can_be_linked_or_recomputed(fabric: Fabric) -> None:
    _, ids = formed(fabric)
    before = feed(fabric, list(ids.values()))
    subject_ref = before[ids["subject"]]["subject_ref"]
    erase_subject(fabric, SUBJECT)
    assert key_of(fabric, SUBJECT) is None  # the key is destroyed: nothing recomputes it
    su = fabric.su()
    assert su.execute(
        "SELECT count(*) FROM fabric.subject_keys WHERE subject_ref = %s", (subject_ref,)
    ).fetchone() == (0,)
    assert su.execute("SELECT fabric._subject_of_ref('acme', %s)", (subject_ref,)).fetchone() == (
        None,
    )
    after = feed(fabric, list(ids.values()))
    assert SUBJECT not in text_of(after) and subject_ref not in text_of(after)
    for vis in ("subject", "session"):
        r = after[ids[vis]]
        assert r["consolidation_state"] == "tombstoned"
        assert (r["subject_ref"], r["session_ref"], r["scope_key"]) == (None, None, None)
