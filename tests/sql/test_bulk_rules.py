"""Rules as sets on the bulk paths (sql/050_records.sql, "Rules as sets on the bulk paths").

`import_records` and `commit_many` (through fabric._commit_set) derive a formed record's
hash and search text in their INSERT and meet the record and lineage row rules as one query
per statement, with `fabric.bulk_rows` on. The setting alone never skips a rule: the gate
keeps it only for those functions' own statements, so a direct write with it set by hand,
or an API call made with it set, meets every row trigger. The property: the same inputs
through the set-based rules and through the row triggers (the same call made from another
function, which the gate sends to the row triggers) are accepted and refused alike, with the
same SQLSTATE, and leave the same state.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb
from test_import import element  # a valid import element of tenant acme

from conftest import Fabric, episode

TRIGGERS = (
    "fabric.tg_memory_records__normalise",
    "fabric.tg_memory_records__bulk_formed",
    "fabric.tg_memory_lineage__append_only",
    "fabric.tg_memory_lineage__bulk_fixed_at_formation",
    "fabric.tg_memory_records__semantic_needs_episode",
    "fabric._semantic_without_episode",
    "fabric._records_entities",
)
# The same call made from a function of the caller's: the gate sees another frame around
# the statement, so every row meets the row triggers.
VIA_ROW_RULES = """
CREATE FUNCTION pg_temp.via_row_rules(p_sql text, p_arg jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
  EXECUTE p_sql INTO r USING p_arg;
  RETURN r;
END $$"""


def calls(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Calls of the rules' functions in this transaction (track_functions = all); the
    connection reads as the superuser from now on, in the call's tenant."""
    conn.execute("RESET SESSION AUTHORIZATION")
    conn.execute("SELECT set_config('fabric.tenant_id', 'acme', true)")
    rows = conn.execute(
        "SELECT f, coalesce(pg_stat_get_xact_function_calls(f::regproc), 0)"
        " FROM unnest(%s::text[]) f",
        (list(TRIGGERS),),
    ).fetchall()
    return {r[0].split(".", 1)[1]: int(r[1]) for r in rows}


@contextmanager
def tracked(fabric: Fabric, login: str) -> Iterator[psycopg.Connection[Any]]:
    """A transaction as `login` counting function calls, rolled back."""
    conn = fabric.connect(None, autocommit=False)
    conn.execute("SET track_functions = 'all'")
    conn.execute(f"SET SESSION AUTHORIZATION {login}")
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


def one(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


# --- the bulk statements meet the rules as sets ----------------------------------------


@pytest.mark.clone
def test_an_import_meets_the_record_rules_once_per_statement(fabric: Fabric) -> None:
    with tracked(fabric, "mf_committer") as conn:
        answer = one(
            conn,
            "SELECT fabric_api.import_records('acme', %s, %s)",
            f"imp-{uuid.uuid4().hex[:8]}",
            Jsonb([element() for _ in range(5)]),
        )
        assert answer["formed"] == 5
        n = calls(conn)
        assert n["tg_memory_records__normalise"] == 0
        assert n["tg_memory_records__bulk_formed"] == 1
        assert n["_records_entities"] == 1  # the mentions, extracted once a statement
        hashes = conn.execute(
            "SELECT count(*) FILTER (WHERE content_hash = fabric.content_hash(content)"
            " AND search_tsv = fabric._search_text(content)"
            " AND search_length = fabric._search_length(search_tsv)), count(*)"
            " FROM fabric.memory_records WHERE source_event_id = %s",
            (str(answer["event_id"]),),
        ).fetchone()
        assert hashes == (5, 5)


@pytest.mark.clone
def test_commit_many_meets_the_record_and_lineage_rules_once_per_statement(
    fabric: Fabric,
) -> None:
    base = fabric.form(text="the episode")
    run = fabric.open_run()
    batch = [episode(f"e{i}") for i in range(3)]
    batch += [episode(f"s{i}", tier="semantic", derived_from=[base]) for i in range(3)]
    answers = fabric.call("mf_agent_a", "SELECT fabric_api.propose_many(%s, %s)", Jsonb(batch), run)
    ids = [a["proposal_id"] for a in answers]
    with tracked(fabric, "mf_committer") as conn:
        records = one(conn, "SELECT fabric_api.commit_many(%s::uuid[])", ids)
        assert len(records) == 6
        n = calls(conn)
        assert n["tg_memory_records__normalise"] == 0
        assert n["tg_memory_lineage__append_only"] == 0
        assert n["tg_memory_records__semantic_needs_episode"] == 0
        assert n["tg_memory_records__bulk_formed"] == 1
        assert n["tg_memory_lineage__bulk_fixed_at_formation"] == 1
        assert n["_semantic_without_episode"] == 1


# --- the setting alone skips nothing -----------------------------------------------------


def _owner_insert(conn: psycopg.Connection[Any], content_hash: str | None) -> None:
    conn.execute(
        "INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, content,"
        " content_hash, source_event_id, formed_by, formation_method, confidence, valid_from,"
        " retention_class) VALUES ('acme', 'episodic', 'subject', 'user-8842',"
        " '{\"text\": \"by hand\"}', %s, 'evt-hand', 'os-agt-010', 'import', 0.5, now(),"
        " 'durable')",
        (content_hash,),
    )


@pytest.mark.clone
@pytest.mark.parametrize("where", ["statement", "function"])
def test_a_direct_write_with_the_setting_made_by_hand_meets_the_row_rules(
    fabric: Fabric, where: str
) -> None:
    conn = fabric.owner()
    conn.execute("SET fabric.bulk_rows = 'on'")
    before = fabric.counts()
    wrong = "sha256:" + "0" * 64
    with pytest.raises(psycopg.Error) as info:
        if where == "statement":
            _owner_insert(conn, wrong)
        else:  # from a function of the owner's, as a bulk function would
            conn.execute(
                "DO $$ BEGIN PERFORM set_config('fabric.bulk_rows', 'on', true);"
                " INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id,"
                " content, content_hash, source_event_id, formed_by, formation_method,"
                " confidence, valid_from, retention_class) VALUES ('acme', 'episodic',"
                " 'subject', 'user-8842', '{\"text\": \"by hand\"}', 'sha256:"
                + "0" * 64
                + "', 'evt-hand', 'os-agt-010', 'import', 0.5, now(), 'durable'); END $$"
            )
    assert info.value.sqlstate == "22023", info.value
    assert fabric.counts() == before

    # Without a hash the row trigger derives every value, as for any direct write.
    _owner_insert(conn, None)
    row = conn.execute(
        "SELECT content_hash = fabric.content_hash(content),"
        " search_tsv = fabric._search_text(content), revision FROM fabric.memory_records"
        " WHERE source_event_id = 'evt-hand'"
    ).fetchone()
    assert row == (True, True, 1)


@pytest.mark.clone
def test_lineage_written_by_hand_with_the_setting_meets_the_row_rule(fabric: Fabric) -> None:
    episode_id = fabric.form(text="an old episode")
    other = fabric.form(text="another old episode")
    conn = fabric.owner()
    conn.execute("SET fabric.bulk_rows = 'on'")
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            "INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)"
            " VALUES ('acme', %s, %s)",
            (other, episode_id),
        )
    assert info.value.sqlstate == "MF001", info.value
    assert fabric.counts() == before


@pytest.mark.clone
def test_a_single_commit_made_with_the_setting_on_meets_the_row_rules(fabric: Fabric) -> None:
    proposal = fabric.proposed(text="committed one by one")
    with tracked(fabric, "mf_committer") as conn:
        conn.execute("SET LOCAL fabric.bulk_rows = 'on'")
        record = one(conn, "SELECT fabric_api.commit(%s)", proposal)
        n = calls(conn)
        assert n["tg_memory_records__normalise"] == 1
        assert n["tg_memory_records__bulk_formed"] == 0
        row = conn.execute(
            "SELECT search_tsv IS NOT NULL, content_hash = fabric.content_hash(content)"
            " FROM fabric.memory_records WHERE memory_id = %s",
            (record["memory_id"],),
        ).fetchone()
        assert row == (True, True)


# --- the property: set-based rules and row triggers agree --------------------------------

IMPORT_KINDS = [
    "valid", "valid", "valid", "tenant_visibility", "other_tenant", "unknown_agent",
    "not_object", "extra_key", "content_not_object", "bad_confidence", "backwards",
    "duplicate", "hash_given", "hash_wrong", "mention", "declared_entity", "no_subject",
]  # fmt: skip


def _import_element(kind: str, tag: str, i: int, first: dict[str, Any]) -> Any:
    el = element(f"{tag} {i}")
    if kind == "tenant_visibility":
        el["scope"] = {"tenant_id": "acme", "visibility": "tenant"}
    elif kind == "other_tenant":
        el["scope"] = {**el["scope"], "tenant_id": "globex"}
    elif kind == "unknown_agent":
        el["scope"] = {**el["scope"], "agent_id": "nobody-007"}
    elif kind == "not_object":
        return "an element"
    elif kind == "extra_key":
        el["memory_id"] = str(uuid.uuid4())
    elif kind == "content_not_object":
        el["content"] = ["a", "list"]
    elif kind == "bad_confidence":
        el["confidence"] = 1.5
    elif kind == "backwards":
        el["validity_interval"] = {
            "valid_from": "2026-07-02T09:14:00Z",
            "valid_until": "2026-07-01T00:00:00Z",
        }
    elif kind == "duplicate":
        return {**first}
    elif kind == "hash_given":
        el["content_hash"] = "HASH"  # replaced by the content's hash below
    elif kind == "hash_wrong":
        el["content_hash"] = "sha256:" + "0" * 64
    elif kind == "mention":
        el["content"] = {"text": f"asked @Dana{tag} about {i}", "n": i}
    elif kind == "declared_entity":
        el["content"] = {
            "text": f"met {tag} {i}",
            "entities": [{"type": "organization", "name": f"Acme {tag}", "id": f"crm:{i}"}],
        }
    elif kind == "no_subject":
        el["scope"] = {"tenant_id": "acme", "agent_id": "com-agt-003", "visibility": "agent"}
    return el


COMMIT_KINDS = [
    "episodic", "episodic", "semantic", "semantic_via_semantic", "keyed", "keyed",
    "missing_parent",
]  # fmt: skip

STATE = {
    "records": """SELECT m.tier, m.visibility, m.subject_id, m.agent_id, m.session_id,
        m.scope_key, m.content, m.content_hash, m.source_event_id, m.correlation_id,
        m.causation_id, m.formed_by, m.formation_method, m.confidence, m.valid_from,
        m.valid_until, m.consolidation_state, m.retention_class, m.compliance_labels,
        m.version, m.revision, m.search_tsv::text, m.search_length, m.assertion_key,
        m.recorded_at = now(), m.known_since = now(), m.erased_at, m.proposal_id IS NULL
        FROM fabric.memory_records m WHERE m.recorded_at = now()""",
    "events": """SELECT e.event_type, e.correlation_id, e.causation_id, e.actor_agent_id,
        e.actor_login, e.payload - 'event_id', m.content
        FROM fabric.events e LEFT JOIN fabric.memory_records m ON m.memory_id = e.memory_id
        WHERE e.occurred_at = now()""",
    "lineage": """SELECT m.content, p.content FROM fabric.memory_lineage l
        JOIN fabric.memory_records m ON m.memory_id = l.memory_id
        JOIN fabric.memory_records p ON p.memory_id = l.derived_from_id
        WHERE m.recorded_at = now()""",
    "history": """SELECT v.revision, v.tier, v.consolidation_state
        FROM fabric.memory_record_versions v JOIN fabric.memory_records m
        ON m.memory_id = v.memory_id WHERE m.recorded_at = now()""",
    "statistics": """SELECT scope_key, lexeme, sum(docs), sum(length) FROM fabric.search_stats
        WHERE tenant_id = 'acme' GROUP BY 1, 2""",
    "mentions": """SELECT m.content, e.entity_type, e.entity_key, e.name, mm.source
        FROM fabric.memory_mentions mm JOIN fabric.memory_records m ON m.memory_id = mm.memory_id
        JOIN fabric.entities e ON e.entity_id = mm.entity_id WHERE m.recorded_at = now()""",
    "entities": """SELECT entity_type, entity_key, name, external_id, subject_id
        FROM fabric.entities WHERE tenant_id = 'acme'""",
    "proposals": """SELECT status, reason, committed_by, memory_id IS NULL
        FROM fabric.proposals WHERE decided_at = now()""",
}


def _outcome(
    fabric: Fabric, login: str, query: str, arg: Any, row_rules: bool
) -> tuple[Any, dict[str, list[str]]]:
    """The answer (or SQLSTATE) and the state a call leaves, in a transaction rolled back;
    with row_rules, the call is made from a function of the caller's."""
    conn = fabric.connect(None, autocommit=False)
    try:
        conn.execute(f"SET SESSION AUTHORIZATION {login}")
        if row_rules:
            conn.execute(VIA_ROW_RULES)
        conn.execute("SAVEPOINT call")
        try:
            if row_rules:
                answer = one(conn, "SELECT pg_temp.via_row_rules(%s, %s)", query, Jsonb(arg))
            else:
                answer = one(conn, query.replace("$1", "%s"), Jsonb(arg))
        except psycopg.Error as exc:
            conn.execute("ROLLBACK TO SAVEPOINT call")
            answer = {"sqlstate": exc.sqlstate, "message": exc.diag.message_primary}
        conn.execute("RESET SESSION AUTHORIZATION")
        conn.execute("SELECT set_config('fabric.tenant_id', 'acme', true)")
        state = {name: sorted(map(repr, conn.execute(q).fetchall())) for name, q in STATE.items()}
        return answer, state
    finally:
        conn.rollback()
        conn.close()


def _same(fabric: Fabric, login: str, query: str, arg: Any, clean: Callable[[Any], Any]) -> None:
    bulk = _outcome(fabric, login, query, arg, row_rules=False)
    rows = _outcome(fabric, login, query, arg, row_rules=True)
    assert clean(bulk[0]) == clean(rows[0])
    assert bulk[1] == rows[1]


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@pytest.mark.clone
@given(kinds=st.lists(st.sampled_from(IMPORT_KINDS), min_size=1, max_size=10))
@example(kinds=IMPORT_KINDS)
@example(kinds=["valid", "hash_wrong"])
def test_an_import_is_judged_alike_by_the_set_based_rules_and_the_row_triggers(
    fabric: Fabric, kinds: list[str]
) -> None:
    tag = uuid.uuid4().hex[:8]
    first = element(f"{tag} first")
    elements = [_import_element(k, tag, i, first) for i, k in enumerate(kinds)]
    if "duplicate" in kinds:
        elements.insert(0, first)
    for el in elements:
        if isinstance(el, dict) and el.get("content_hash") == "HASH":
            el["content_hash"] = one(
                fabric.session(None), "SELECT fabric.content_hash(%s)", Jsonb(el["content"])
            )
    query = f"SELECT fabric_api.import_records('acme', 'imp-{tag}', $1)"

    def clean(answer: Any) -> Any:
        return {k: v for k, v in answer.items() if k != "event_id"}

    _same(fabric, "mf_committer", query, elements, clean)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@pytest.mark.clone
@given(kinds=st.lists(st.sampled_from(COMMIT_KINDS), min_size=1, max_size=8))
@example(kinds=["episodic", "semantic", "semantic_via_semantic"])
@example(kinds=["episodic", "missing_parent"])
@example(kinds=["keyed", "semantic", "keyed"])
def test_commit_many_is_judged_alike_by_the_set_based_rules_and_the_row_triggers(
    fabric: Fabric, kinds: list[str]
) -> None:
    tag = uuid.uuid4().hex[:8]
    base = fabric.form(text=f"the episode {tag}")
    semantic = fabric.form(text=f"a fact {tag}", tier="semantic", derived_from=[base])
    run = fabric.open_run()
    batch = []
    for i, kind in enumerate(kinds):
        if kind == "episodic":
            batch.append(episode(f"{tag} e{i} @Dana{i}"))
        elif kind == "semantic":
            batch.append(episode(f"{tag} s{i}", tier="semantic", derived_from=[base]))
        elif kind in ("semantic_via_semantic", "missing_parent"):
            batch.append(episode(f"{tag} ss{i}", tier="semantic", derived_from=[semantic]))
        else:  # one live assertion per key: a second one in the batch contradicts the first
            env = episode(tier="semantic", derived_from=[base])
            env["content"] = {"key": f"plan-{tag}", "text": f"plan {i}"}
            batch.append(env)
    answers = fabric.call("mf_agent_a", "SELECT fabric_api.propose_many(%s, %s)", Jsonb(batch), run)
    ids = [a["proposal_id"] for a in answers if a["status"] == "validated"]
    lost = [a["proposal_id"] for a, k in zip(answers, kinds, strict=True) if k == "missing_parent"]
    if lost:  # its parent gone from under it (a superuser with triggers off): no lineage row
        su = fabric.su()
        su.execute("SET session_replication_role = replica")
        su.execute(
            "UPDATE fabric.proposals SET derived_from = ARRAY[gen_random_uuid()]"
            " WHERE proposal_id = ANY(%s::uuid[])",
            (lost,),
        )
    query = "SELECT fabric_api.commit_many(ARRAY(SELECT jsonb_array_elements_text($1))::uuid[])"

    def clean(answer: Any) -> Any:
        if isinstance(answer, dict):
            return answer
        return sorted(
            repr({k: v for k, v in r.items() if k not in ("memory_id", "recorded_at")})
            for r in answer
        )

    _same(fabric, "mf_committer", query, ids, clean)
