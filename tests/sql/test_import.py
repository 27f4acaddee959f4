"""fabric_api.import_records: bulk import of episodic records (formation method import).

Each rule of propose + commit is tried on one element among valid ones: the element is
refused for its position with its reason (and the SQLSTATE propose would raise, or none for
a governance rejection) while the others are formed. The call's own failures (role, tenant,
size, shape, a reused import id) raise with a SQLSTATE and write nothing. The state after an
import equals the state after the same records proposed and committed one by one (records,
record events, history, search statistics; ids aside).
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, Fabric, episode, wait_until_blocked

pytestmark = pytest.mark.rollback

IMPORT = "SELECT fabric_api.import_records(%s, %s, %s)"
_ids = itertools.count(1)


def element(text: str = "asked for invoices in EUR", **overrides: Any) -> dict[str, Any]:
    """A valid import element for tenant acme: subject visibility, full scope."""
    el: dict[str, Any] = {
        "scope": {
            "tenant_id": "acme",
            "subject_id": "user-8842",
            "agent_id": "com-agt-003",
            "session_id": "sess-1f9c",
            "visibility": "subject",
        },
        "content": {"text": f"{text} #{next(_ids)}"},
        "provenance": {"correlation_id": "corr-crm", "formation_method": "import"},
        "confidence": 0.9,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None},
        "retention_class": "durable",
        "compliance_labels": ["pii"],
    }
    el.update(overrides)
    return el


def run_import(
    fabric: Fabric,
    records: Any,
    import_id: str | None = None,
    tenant: str = "acme",
    login: str = "mf_committer",
) -> dict[str, Any]:
    conn = fabric.connect(login)
    row = conn.execute(
        IMPORT, (tenant, import_id or f"imp-{uuid.uuid4().hex[:12]}", Jsonb(records))
    ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def counts(fabric: Fabric) -> dict[str, int]:
    return {**fabric.counts(), "search_stats": fabric.count("search_stats")}


def refused_call(fabric: Fabric, send: Callable[[], Any]) -> psycopg.Error:
    before = counts(fabric)
    with pytest.raises(psycopg.Error) as info:
        send()
    assert counts(fabric) == before, "a refused import wrote a row"
    return info.value


# --- forming ---------------------------------------------------------------------------


def test_an_import_forms_raw_episodic_records_caused_by_the_import_event(fabric: Fabric) -> None:
    before = counts(fabric)
    answer = run_import(fabric, [element(), element(), element()], import_id="crm-2026-07")
    assert answer["formed"] == 3 and answer["refused"] == 0 and answer["refusals"] == []
    assert answer["records"] == 3 and answer["replayed"] is False
    event_id = answer["event_id"]
    su = fabric.su()
    rows = su.execute(
        "SELECT tier, consolidation_state, formation_method, formed_by, source_event_id,"
        " proposal_id, run_id, subject_id, agent_id, session_id, scope_key"
        " FROM fabric.memory_records"
    ).fetchall()
    assert len(rows) == 3
    for row in rows:
        assert row[:5] == ("episodic", "raw", "import", "os-agt-010", event_id)
        assert row[5:] == (None, None, "user-8842", "com-agt-003", "sess-1f9c", "subject:user-8842")
    events = fabric.events("event_type = 'memory.import.completed'")
    assert len(events) == 1
    ev = events[0]
    assert ev["event_id"] == event_id and ev["tenant_id"] == "acme"
    assert ev["actor_agent_id"] == "os-agt-010"
    assert {k: ev["payload"][k] for k in ("import_id", "records", "formed", "refused")} == {
        "import_id": "crm-2026-07",
        "records": 3,
        "formed": 3,
        "refused": 0,
    }
    assert "user-8842" not in str(ev["payload"]) and "invoices" not in str(ev["payload"])
    formed = fabric.events("event_type = 'memory.record.formed'")
    assert len(formed) == 3
    assert all(e["payload"]["formation_method"] == "import" for e in formed)
    after = counts(fabric)
    assert after["memory_records"] - before["memory_records"] == 3
    assert after["events"] - before["events"] == 4
    assert after["proposals"] == before["proposals"]
    assert after["memory_record_versions"] == before["memory_record_versions"]
    assert after["search_stats"] > before["search_stats"]


def test_imported_records_are_recalled_by_their_scope(fabric: Fabric) -> None:
    run_import(fabric, [element("prefers the night shift")])
    run = fabric.open_run()
    answer = fabric.recall("mf_agent_a", {"run_id": str(run), "query": "night shift"})
    texts = [r["content"]["text"] for r in answer["records"]]
    assert any("night shift" in t for t in texts), answer


# --- per-element rules -------------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(el: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = el
        for p in parents:
            node = node[p]
        if value is _DELETE:
            node.pop(last, None)
        else:
            node[last] = value

    return apply


_DELETE = object()

# (case, mutation, SQLSTATE or None for a governance rejection, fragment of the reason)
RULES: list[tuple[str, Callable[[dict[str, Any]], None], str | None, str]] = [
    ("unknown key", _set("memory_id", str(uuid.uuid4())), "22023", "keys outside"),
    ("tier semantic", _set("tier", "semantic"), None, "only episodic"),
    ("tier working", _set("tier", "working"), None, "only episodic"),
    ("no scope", _set("scope", _DELETE), "22023", "scope must be an object"),
    ("scope extra key", _set("scope.region", "eu"), "22023", "scope must be an object"),
    ("visibility unknown", _set("scope.visibility", "world"), "22023", "scope.visibility"),
    ("visibility missing", _set("scope.visibility", _DELETE), "22023", "scope.visibility"),
    ("other tenant", _set("scope.tenant_id", "globex"), "42501", "not the tenant of the import"),
    ("subject id with a space", _set("scope.subject_id", "user 8842"), "22023", "subject_id"),
    ("subject id bidi", _set("scope.subject_id", "user\u202e8842"), "22023", "subject_id"),
    ("subject id a number", _set("scope.subject_id", 8842), "22023", "must be a string"),
    (
        "content entities malformed",
        _set("content.entities", "Acme GmbH"),
        "22023",
        "content.entities",
    ),
    ("subject visibility without subject", _set("scope.subject_id", None), None, "needs a subject"),
    (
        "session visibility without session",
        lambda el: el["scope"].update(visibility="session", session_id=None),
        None,
        "needs a session",
    ),
    (
        "agent visibility without agent",
        lambda el: el["scope"].update(visibility="agent", agent_id=None),
        None,
        "needs an agent",
    ),
    ("agent not enabled", _set("scope.agent_id", "glx-agt-001"), "42501", "not an agent enabled"),
    ("agent never registered", _set("scope.agent_id", "nobody-1"), "42501", "not an agent enabled"),
    (
        "agent profile visibility",
        lambda el: el["scope"].update(agent_id="com-agt-004", visibility="tenant"),
        None,
        "memory_profile.propose_scope.visibility",
    ),
    ("content missing", _set("content", _DELETE), "22023", "content must be a JSON object"),
    ("content a string", _set("content", "hello"), "22023", "content must be a JSON object"),
    ("content too large", _set("content", {"text": "x" * 70000}), "54000", "65536 bytes"),
    (
        "content too deep",
        _set("content", {"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
        "54000",
        "deeper than 32",
    ),
    ("content number not a double", _set("content", {"n": 9007199254740993}), "22003", ""),
    (
        "content_hash mismatch",
        _set("content_hash", "sha256:" + "0" * 64),
        "22023",
        "does not match the content",
    ),
    ("content_hash not a string", _set("content_hash", 7), "22023", "does not match the content"),
    ("provenance a list", _set("provenance", []), "22023", "provenance must be an object"),
    (
        "source_event_id given",
        _set("provenance.source_event_id", "evt-1"),
        "22023",
        "set by the import",
    ),
    (
        "formation extraction",
        _set("provenance.formation_method", "extraction"),
        "22023",
        "formation_method of an imported record is import",
    ),
    (
        "correlation id with a control",
        _set("provenance.correlation_id", "corr\n1"),
        "22023",
        "correlation_id",
    ),
    ("confidence missing", _set("confidence", _DELETE), "22023", "confidence is required"),
    ("confidence a string", _set("confidence", "0.9"), "22023", "confidence is required"),
    ("confidence above 1", _set("confidence", 1.5), None, "confidence must lie in [0, 1]"),
    ("confidence below 0", _set("confidence", -0.1), None, "confidence must lie in [0, 1]"),
    (
        "confidence not a double",
        lambda el: el.update(confidence=_Raw("0.90000000000000000001")),
        "22023",
        "double represents exactly",
    ),
    (
        "valid_from not RFC 3339",
        _set("validity_interval.valid_from", "yesterday"),
        "22007",
        "RFC 3339",
    ),
    (
        "valid_from without offset",
        _set("validity_interval.valid_from", "2026-07-02T09:14:00"),
        "22007",
        "RFC 3339",
    ),
    (
        "valid_from leap second",
        _set("validity_interval.valid_from", "2026-07-02T09:14:60Z"),
        "22007",
        "RFC 3339",
    ),
    (
        "valid_from year 1800",
        _set("validity_interval.valid_from", "1800-01-01T00:00:00Z"),
        "22007",
        "RFC 3339",
    ),
    (
        "valid_until year 10000 by offset",
        _set("validity_interval.valid_until", "9999-12-31T23:30:00-01:00"),
        "22007",
        "RFC 3339",
    ),
    (
        "valid_until before valid_from",
        _set("validity_interval.valid_until", "2026-07-01T00:00:00Z"),
        None,
        "valid_until must be after valid_from",
    ),
    ("validity extra key", _set("validity_interval.tz", "UTC"), "22023", "validity_interval"),
    ("retention ephemeral", _set("retention_class", "ephemeral"), None, "working tier"),
    ("retention unknown", _set("retention_class", "forever"), "22023", "retention_class"),
    ("labels not a list", _set("compliance_labels", "pii"), "22023", "compliance_labels"),
    ("label with a space", _set("compliance_labels", ["p ii"]), "22023", "compliance_labels"),
    ("label null", _set("compliance_labels", [None]), "22023", "compliance_labels"),
    ("65 labels", _set("compliance_labels", [f"l{i}" for i in range(65)]), "22023", "at most 64"),
    ("version not SemVer", _set("version", "v1"), None, "SemVer"),
    (
        "version component too big",
        _set("version", "1.2.99999999999"),
        "22023",
        "at most 2147483647",
    ),
    (
        "unknown business instance",
        _set("business_instance_id", "nl-ops"),
        "22023",
        "no configured instance",
    ),
    ("derived_from", _set("derived_from", [str(uuid.uuid4())]), None, "derived_from must be empty"),
    ("derived_from not a list", _set("derived_from", "x"), "22023", "derived_from"),
    ("supersedes", _set("supersedes", str(uuid.uuid4())), None, "supersedes"),
    (
        "element not an object",
        lambda el: el.update(_replace_with=[1, 2]),
        "22023",
        "must be a JSON object",
    ),
]


class _Raw:
    """A number sent exactly as written (JSON allows more digits than a double holds)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _encode(records: list[Any]) -> str:
    """JSON with _Raw numbers spliced in verbatim."""
    raws: dict[str, str] = {}

    def default(o: Any) -> Any:
        if isinstance(o, _Raw):
            key = f"__raw_{len(raws)}__"
            raws[key] = o.text
            return key
        raise TypeError

    text = json.dumps(records, default=default)
    for key, raw in raws.items():
        text = text.replace(f'"{key}"', raw)
    return text


@pytest.mark.parametrize(
    ("case", "mutate", "sqlstate", "fragment"), RULES, ids=[r[0] for r in RULES]
)
def test_an_element_breaking_a_rule_is_refused_alone(
    fabric: Fabric,
    case: str,
    mutate: Callable[[dict[str, Any]], None],
    sqlstate: str | None,
    fragment: str,
) -> None:
    bad = element()
    mutate(bad)
    bad_value: Any = bad.pop("_replace_with", bad)
    records = [element(), bad_value, element()]
    before = counts(fabric)
    conn = fabric.connect("mf_committer")
    row = conn.execute(
        IMPORT, ("acme", f"imp-{case.replace(' ', '-')}", _encode(records))
    ).fetchone()
    assert row is not None
    answer = row[0]
    assert answer["formed"] == 2 and answer["refused"] == 1, answer
    [refusal] = answer["refusals"]
    assert refusal["position"] == 1
    assert refusal["sqlstate"] == sqlstate, refusal
    assert fragment in refusal["reason"], refusal
    after = counts(fabric)
    assert after["memory_records"] - before["memory_records"] == 2
    assert after["events"] - before["events"] == 3  # two formed, one import event


def test_a_duplicate_within_one_import_is_refused_for_its_position(fabric: Fabric) -> None:
    first = element("same words")
    twin = copy.deepcopy(first)
    twin["confidence"] = 0.5  # same agent and content: the idempotency key of propose
    other_agent = copy.deepcopy(first)
    other_agent["scope"]["agent_id"] = None  # another agent (none): not a duplicate
    answer = run_import(fabric, [first, element(), twin, other_agent])
    assert answer["formed"] == 3 and answer["refused"] == 1
    assert answer["refusals"] == [
        {
            "position": 2,
            "sqlstate": "23505",
            "reason": "duplicate: element 0 of this import has the same content for the same agent",
        }
    ]


def test_refusals_report_the_first_hundred_positions_and_count_all(fabric: Fabric) -> None:
    records = [element(confidence=2) if i % 2 else element() for i in range(300)]
    answer = run_import(fabric, records)
    assert answer["formed"] == 150 and answer["refused"] == 150
    assert [r["position"] for r in answer["refusals"]] == list(range(1, 201, 2))


def test_an_import_where_every_element_is_refused_still_records_its_event(fabric: Fabric) -> None:
    answer = run_import(fabric, [element(confidence=3)], import_id="all-bad")
    assert answer["formed"] == 0 and answer["refused"] == 1
    assert fabric.count("memory_records") == 0
    assert len(fabric.events("event_type = 'memory.import.completed'")) == 1


# --- the call's own failures --------------------------------------------------------------


def test_an_agent_cannot_import(fabric: Fabric) -> None:
    err = refused_call(fabric, lambda: run_import(fabric, [element()], login="mf_agent_a"))
    assert err.sqlstate == "42501"


@pytest.mark.parametrize("login", ["mf_admin", "mf_consolidator", "mf_auditor"])
def test_other_roles_cannot_import(fabric: Fabric, login: str) -> None:
    err = refused_call(fabric, lambda: run_import(fabric, [element()], login=login))
    assert err.sqlstate == "42501"


def test_a_committer_not_enabled_in_the_tenant_cannot_import(fabric: Fabric) -> None:
    fabric.session("mf_admin").execute("SELECT fabric_api.create_tenant('initech')")
    el = element()
    el["scope"] = {**el["scope"], "tenant_id": "initech", "agent_id": None}
    err = refused_call(fabric, lambda: run_import(fabric, [el], tenant="initech"))
    assert err.sqlstate == "42501"
    assert "not enabled in this tenant" in str(err)


def test_an_unknown_tenant_is_refused(fabric: Fabric) -> None:
    err = refused_call(fabric, lambda: run_import(fabric, [element()], tenant="nowhere"))
    assert err.sqlstate == "P0002"


def test_more_than_ten_thousand_records_are_refused(fabric: Fabric) -> None:
    records = [{"content": {}}] * 10001
    err = refused_call(fabric, lambda: run_import(fabric, records))
    assert err.sqlstate == "54000"
    assert err.diag.message_hint and "batches" in err.diag.message_hint


@pytest.mark.parametrize("records", [{"content": {}}, [], "[]", 7, None], ids=repr)
def test_records_that_are_not_a_non_empty_array_are_refused(fabric: Fabric, records: Any) -> None:
    def send() -> Any:
        conn = fabric.connect("mf_committer")
        value = None if records is None else Jsonb(records)
        return conn.execute(IMPORT, ("acme", "imp-shape", value)).fetchone()

    err = refused_call(fabric, send)
    assert err.sqlstate == "22023"


@pytest.mark.parametrize("import_id", ["", "has space", "x" * 201, None], ids=repr)
def test_a_malformed_import_id_is_refused(fabric: Fabric, import_id: Any) -> None:
    def send() -> Any:
        conn = fabric.connect("mf_committer")
        return conn.execute(IMPORT, ("acme", import_id, Jsonb([element()]))).fetchone()

    err = refused_call(fabric, send)
    assert err.sqlstate == "22023"
    assert "has space" not in str(err)


# --- idempotency ----------------------------------------------------------------------


def test_the_same_import_again_answers_the_first_result_and_writes_nothing(fabric: Fabric) -> None:
    records = [element(), element(confidence=5), element()]
    first = run_import(fabric, records, import_id="crm-1")
    before = counts(fabric)
    again = run_import(fabric, records, import_id="crm-1")
    assert counts(fabric) == before
    assert again == {**first, "replayed": True}


def test_an_import_id_reused_with_other_records_is_refused(fabric: Fabric) -> None:
    run_import(fabric, [element()], import_id="crm-2")
    err = refused_call(fabric, lambda: run_import(fabric, [element()], import_id="crm-2"))
    assert err.sqlstate == "23505"
    assert err.diag.message_hint and "new import id" in err.diag.message_hint


def test_an_import_id_is_per_tenant(fabric: Fabric) -> None:
    run_import(fabric, [element()], import_id="crm-3")
    el = element()
    el["scope"] = {**el["scope"], "tenant_id": "globex", "agent_id": "glx-agt-001"}
    answer = run_import(fabric, [el], import_id="crm-3", tenant="globex")
    assert answer["formed"] == 1 and answer["replayed"] is False


# --- the same state as one by one -----------------------------------------------------

RECORD_COLUMNS = (
    "tier, visibility, subject_id, agent_id, session_id, scope_key, business_instance_id,"
    " content, content_hash, correlation_id, causation_id, formed_by, formation_method,"
    " confidence, valid_from, valid_until, consolidation_state, supersedes, retention_class,"
    " compliance_labels, version, revision, search_tsv::text, assertion_key"
)


def _records(su: psycopg.Connection[Any], ids: list[Any]) -> list[tuple[Any, ...]]:
    q = sql.SQL("SELECT {} FROM fabric.memory_records WHERE memory_id = ANY(%s)").format(
        sql.SQL(RECORD_COLUMNS)
    )
    return su.execute(q, (ids,)).fetchall()


def _formed_events(su: psycopg.Connection[Any], ids: list[Any]) -> list[tuple[Any, ...]]:
    q = (
        "SELECT e.event_type, e.correlation_id, e.causation_id, e.actor_agent_id, e.payload,"
        " m.content::text FROM fabric.events e JOIN fabric.memory_records m"
        " ON m.memory_id = e.memory_id WHERE e.memory_id = ANY(%s) ORDER BY m.content::text"
    )
    return su.execute(q, (ids,)).fetchall()


def _stats(su: psycopg.Connection[Any]) -> dict[tuple[str, str], tuple[int, int]]:
    rows = su.execute(
        "SELECT scope_key, lexeme, sum(docs)::bigint, sum(length)::bigint FROM fabric.search_stats"
        " WHERE tenant_id = 'acme' GROUP BY 1, 2"
    ).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def _diff(after: dict[Any, tuple[int, int]], before: dict[Any, tuple[int, int]]) -> dict[Any, Any]:
    keys = set(after) | set(before)
    out = {}
    for k in keys:
        a, b = after.get(k, (0, 0)), before.get(k, (0, 0))
        if a != b:
            out[k] = (a[0] - b[0], a[1] - b[1])
    return out


SCOPES = st.sampled_from(
    [
        ("subject", "user-8842", "com-agt-003", "sess-1f9c"),
        ("subject", "user-8842", None, None),
        ("session", "user-8842", None, "sess-1f9c"),
        ("session", None, "com-agt-003", "sess-2"),
        ("agent", "user-1", "com-agt-003", None),
        ("tenant", None, None, None),
        ("tenant", "user-8842", "com-agt-003", "sess-1f9c"),
    ]
)
ELEMENTS = st.fixed_dictionaries(
    {
        "scope": SCOPES,
        "words": st.lists(
            st.sampled_from(["invoice", "EUR", "night", "shift", "call", "prefers"]),
            min_size=0,
            max_size=5,
        ),
        "n": st.one_of(st.none(), st.integers(-(2**40), 2**40), st.sampled_from([0.5, 1e-3, 2.25])),
        "confidence": st.sampled_from([0, 0.25, 0.9, 1]),
        "retention": st.sampled_from(["durable", "operational", "audit", "regulated"]),
        "labels": st.lists(st.sampled_from(["pii", "gdpr", "finance"]), max_size=3),
        "until": st.sampled_from([None, "2027-01-01T00:00:00Z"]),
        "version": st.sampled_from([None, "1.0.0", "2.1.0-rc.1"]),
        "correlation": st.sampled_from([None, "corr-a"]),
    }
)


def _make(spec: dict[str, Any], tag: str, i: int) -> dict[str, Any]:
    visibility, subject, agent, session = spec["scope"]
    content: dict[str, Any] = {"text": " ".join([*spec["words"], tag, str(i)])}
    if spec["n"] is not None:
        content["n"] = spec["n"]
    el: dict[str, Any] = {
        "scope": {
            "tenant_id": "acme",
            "subject_id": subject,
            "agent_id": agent,
            "session_id": session,
            "visibility": visibility,
        },
        "content": content,
        "provenance": {"correlation_id": spec["correlation"], "formation_method": "import"},
        "confidence": spec["confidence"],
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": spec["until"]},
        "retention_class": spec["retention"],
        "compliance_labels": spec["labels"],
    }
    if spec["version"]:
        el["version"] = spec["version"]
    return el


def _one_by_one(
    conns: dict[str, psycopg.Connection[Any]], elements: list[dict[str, Any]], source_event: str
) -> list[Any]:
    """The same records proposed by the scope's agent (com-agt-003) in a run of their
    subject and session, and committed; returns the memory ids."""
    orchestrator, agent, committer = (
        conns[login] for login in ("mf_orchestrator", "mf_agent_a", "mf_committer")
    )
    runs: dict[tuple[Any, Any], Any] = {}
    ids = []
    for el in elements:
        scope = el["scope"]
        key = (scope["subject_id"], scope["session_id"])
        if key not in runs:
            runs[key] = one(
                orchestrator,
                "SELECT fabric_api.open_run('acme', 'com-agt-003', %s, %s, %s, '1 hour')",
                key[0],
                key[1],
                MEMORY_TOOLS,
            )
        env = {**copy.deepcopy(el), "tier": "episodic"}
        env["provenance"] = {**env["provenance"], "source_event_id": source_event}
        answer = one(agent, "SELECT fabric_api.propose(%s, %s)", Jsonb(env), runs[key])
        assert answer["status"] == "validated", answer
        record = one(committer, "SELECT fabric_api.commit(%s)", answer["proposal_id"])
        ids.append(record["memory_id"])
    return ids


def one(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(specs=st.lists(ELEMENTS, min_size=1, max_size=12))
@pytest.mark.clone
def test_an_import_leaves_the_state_one_by_one_propose_and_commit_leaves(
    fabric: Fabric, specs: list[dict[str, Any]]
) -> None:
    logins = ("mf_orchestrator", "mf_agent_a", "mf_committer")
    conns = {login: psycopg.connect(fabric.url, user=login, autocommit=True) for login in logins}
    su = psycopg.connect(fabric.url, autocommit=True)
    try:
        _check_one_by_one(fabric, su, conns, specs)
    finally:
        for c in [su, *conns.values()]:
            c.close()


def _check_one_by_one(
    fabric: Fabric,
    su: psycopg.Connection[Any],
    conns: dict[str, psycopg.Connection[Any]],
    specs: list[dict[str, Any]],
) -> None:
    tag = str(uuid.uuid4().int)[-10:]
    elements = [_make(s, tag, i) for i, s in enumerate(specs)]
    versions0 = fabric.count("memory_record_versions")

    stats0 = _stats(su)
    answer = one(conns["mf_committer"], IMPORT, "acme", f"prop-{tag}", Jsonb(elements))
    assert answer["formed"] == len(elements), answer
    stats1 = _stats(su)
    imported = [
        r[0]
        for r in su.execute(
            "SELECT memory_id FROM fabric.memory_records WHERE source_event_id = %s",
            (answer["event_id"],),
        ).fetchall()
    ]

    # The same envelopes again, one by one, in new content (a fresh tag): ids aside.
    tag2 = str(uuid.uuid4().int)[-10:]
    again = [_make(s, tag2, i) for i, s in enumerate(specs)]
    single = _one_by_one(conns, again, f"evt-one-{tag2}")
    stats2 = _stats(su)

    def strip(rows: list[Any], t: str) -> list[str]:
        return sorted(repr(r).replace(t, "TAG") for r in rows)

    def records(ids: list[Any], t: str) -> list[str]:
        """The hash differs only through the tag; the search text is compared as its set of
        lexemes and positions (its text form orders lexemes, the tag among them)."""
        rows = _records(su, ids)
        return sorted(
            repr((*r[:8], *r[9:22], sorted(r[22].replace(t, "TAG").split(" ")), r[23])).replace(
                t, "TAG"
            )
            for r in rows
        )

    assert records(imported, tag) == records(single, tag2)

    def events(ids: list[Any]) -> list[tuple[Any, ...]]:
        return [
            (*e[:4], {k: v for k, v in e[4].items() if k != "content_hash"}, e[5])
            for e in _formed_events(su, ids)
        ]

    assert strip(events(imported), tag) == strip(events(single), tag2)
    assert fabric.count("memory_record_versions") == versions0
    d_import = {(k[0], k[1].replace(tag, "T")): v for k, v in _diff(stats1, stats0).items()}
    d_single = {(k[0], k[1].replace(tag2, "T")): v for k, v in _diff(stats2, stats1).items()}
    assert d_import == d_single


def test_labels_and_numbers_off_the_fast_path_are_read_as_propose_reads_them(
    fabric: Fabric,
) -> None:
    labels = ["NULL", "données", "a,b", "x{y}", 'q"t']
    el = element(compliance_labels=labels, confidence=0.30000000000000004)
    el["content"] = {"text": "numbers", "n": [0.30000000000000004, 123456789012345, -0.001]}
    answer = run_import(fabric, [el])
    assert answer["formed"] == 1, answer
    row = (
        fabric.session()
        .execute("SELECT compliance_labels, confidence, content FROM fabric.memory_records")
        .fetchone()
    )
    assert row is not None
    assert row[0] == labels
    assert row[1] == 0.30000000000000004
    assert row[2]["n"] == [0.30000000000000004, 123456789012345, -0.001]


@pytest.mark.clone
def test_two_concurrent_imports_with_one_id_form_the_records_once(fabric: Fabric) -> None:
    records = [element(), element()]
    first = fabric.connect("mf_committer", autocommit=False)
    answer = one(first, IMPORT, "acme", "crm-race", Jsonb(records))
    result: dict[str, Any] = {}
    conn = fabric.connect("mf_committer")

    def second() -> None:
        result["answer"] = one(conn, IMPORT, "acme", "crm-race", Jsonb(records))

    thread = threading.Thread(target=second)
    thread.start()
    wait_until_blocked(fabric, conn)
    assert thread.is_alive(), "the second import did not wait for the first"
    first.commit()
    thread.join(timeout=30)
    assert result["answer"] == {**answer, "replayed": True}
    assert fabric.count("memory_records") == 2
    assert fabric.count("events", "event_type = 'memory.import.completed'") == 1


def test_records_proposals_and_their_events_have_time_ordered_ids(fabric: Fabric) -> None:
    """A new record's id (the column's default, whichever path forms it), a proposal's id and
    every event the writes emit are UUID version 7 (docs/import.md, "Ids"): the first 48 bits
    are Unix milliseconds, so a batch's index entries land beside each other instead of on
    random leaves of indexes as large as the table."""
    # (the import's own event has an id derived from its import id: docs/import.md)
    events = "SELECT event_id FROM fabric.events WHERE event_type <> 'memory.import.completed'"
    queries = (
        ("record", "SELECT memory_id FROM fabric.memory_records"),
        ("proposal", "SELECT proposal_id FROM fabric.proposals"),
        ("event", events),
    )
    su = fabric.su()
    # the ids the database held before (the seed's: made when it was, maybe minutes ago)
    before = {value for _, query in queries for (value,) in su.execute(query).fetchall()}
    started = su.execute("SELECT pg_catalog.clock_timestamp()").fetchone()
    assert started is not None
    run_import(fabric, [element(), element()])
    run = fabric.open_run()
    proposal = fabric.proposed(run, "asked for invoices in EUR")
    fabric.commit(proposal)
    batch = fabric.call(
        "mf_agent_a", "SELECT fabric_api.propose_many(%s, %s)",
        Jsonb([episode("one"), episode("two")]), run,
    )  # fmt: skip
    assert [a["status"] for a in batch] == ["validated", "validated"], batch
    ids = [
        (what, value)
        for what, query in queries
        for (value,) in su.execute(query).fetchall()
        if value not in before
    ]
    ended = su.execute("SELECT pg_catalog.clock_timestamp()").fetchone()
    assert ended is not None
    assert {what for what, _ in ids} == {"record", "proposal", "event"}
    for what, value in ids:
        assert isinstance(value, uuid.UUID) and value.version == 7, (what, value)
        at = (value.int >> 80) / 1000  # made between the start and the end of the writes
        assert started[0].timestamp() - 1 <= at <= ended[0].timestamp() + 1, (what, value)
