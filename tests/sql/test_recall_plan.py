"""Recall's retrieval query on a realistic fixture: tenant and scope are index conditions,
and its explicit tenant/scope predicates are property-tested against a reference filter.

Fixtures are bulk-loaded by the superuser with session_replication_role = replica (no
triggers): they are data for the planner and the reference, not governed writes.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

# builds 150,000 records once per module (over 10 s)
pytestmark = pytest.mark.slow

TIERS = ["episodic", "semantic", "procedural", "profile"]
LIVE = ("raw", "consolidated", "reflected")

# Each search text holds three distinct words once ("wordN", "note", i), so its length
# (fabric._search_length: the lexemes' positions summed) is its number of lexemes, length():
# the fixture checks it, and a PL/pgSQL call per row was a sixth of its time.
BULK = """
INSERT INTO fabric.memory_records (tenant_id, memory_id, tier, visibility, subject_id,
  session_id, agent_id, content, content_hash, source_event_id, formed_by, formation_method,
  confidence, valid_from, valid_until, recorded_at, consolidation_state, retention_class,
  compliance_labels, search_tsv, search_length, erased_at, erasure_approval_id)
SELECT %(tenant)s::text, gen_random_uuid(),
       (ARRAY['episodic','semantic','procedural','profile'])[1 + i %% 4],
       v.vis, 'user-' || (i %% %(subjects)s), 'sess-' || (i %% 7), 'agt-' || (i %% 5),
       jsonb_build_object('text', 'word' || (i %% 500) || ' note ' || i),
       'sha256:' || encode(sha256(convert_to(%(tenant)s::text || i, 'UTF8')), 'hex'),
       'evt-' || i, 'os-agt-010', 'extraction', (i %% 100) / 100.0,
       now() - make_interval(days => i %% 400), NULL, now(), 'raw', 'durable', '{}',
       x.tsv, length(x.tsv), NULL, NULL
FROM generate_series(1, %(rows)s) i
CROSS JOIN LATERAL (SELECT to_tsvector('simple', 'word' || (i %% 500) || ' note ' || i) AS tsv) x
CROSS JOIN LATERAL (SELECT (ARRAY['subject','subject','subject','tenant','session','agent'])
                           [1 + (i / 4) %% 6] AS vis) v
"""


# The per-scope statistics the triggers would have appended, folded (a bulk load skips them).
# The lengths are the stored ones (BULK wrote fabric._search_length of each search text):
# computing them again here was 150,000 more PL/pgSQL calls, a sixth of the fixture's time.
STATS = """
INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
SELECT tenant_id, scope_key, '', count(*), sum(search_length)
  FROM fabric.memory_records GROUP BY tenant_id, scope_key
UNION ALL
SELECT m.tenant_id, m.scope_key, u.lexeme, count(*), 0
  FROM fabric.memory_records m CROSS JOIN LATERAL unnest(m.search_tsv) u
 GROUP BY m.tenant_id, m.scope_key, u.lexeme
"""


# memory_records' indexes that no constraint owns: (name, definition)
SECONDARY_INDEXES = """
SELECT c.relname, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'fabric.memory_records'::regclass
   AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
 ORDER BY 1
"""
ROW_RULES = """
SELECT pg_get_constraintdef(oid) FROM pg_constraint
 WHERE conrelid = 'fabric.memory_records'::regclass AND conname = 'memory_records_row_rules'
"""


@pytest.fixture(scope="module")
def big(server: Any, template: str) -> Iterator[str]:
    """100,000 records in tenant 'big' and 50 tenants of 1,000 records each."""
    admin = psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname="postgres"
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS mf_big WITH (FORCE)")
        conn.execute(f"CREATE DATABASE mf_big TEMPLATE {template} STRATEGY FILE_COPY")
    url = psycopg.conninfo.make_conninfo(admin, dbname="mf_big")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        tenants = ["big"] + [f"t{n:02d}" for n in range(50)]
        conn.execute("INSERT INTO fabric.tenants (tenant_id) SELECT unnest(%s::text[])", (tenants,))
        # A bulk load, as a restore does it: the secondary indexes built after the rows and
        # the row-rules CHECK put back unvalidated (the same rows loaded under it before
        # 0.10.0; this module tests plans, and neither changes one). A third of the fixture's time.
        indexes = conn.execute(SECONDARY_INDEXES).fetchall()
        for name, _ in indexes:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier("fabric", name)))
        (check,) = conn.execute(ROW_RULES).fetchone()  # type: ignore[misc]
        conn.execute("ALTER TABLE fabric.memory_records DROP CONSTRAINT memory_records_row_rules")
        conn.execute(BULK, {"tenant": "big", "rows": 100_000, "subjects": 2000})
        for tenant in tenants[1:]:
            conn.execute(BULK, {"tenant": tenant, "rows": 1000, "subjects": 50})
        conn.execute(
            sql.SQL(
                "ALTER TABLE fabric.memory_records ADD CONSTRAINT memory_records_row_rules {} "
                "NOT VALID"
            ).format(sql.SQL(check))
        )
        conn.execute("SET maintenance_work_mem = '256MB'")
        for _, definition in indexes:
            conn.execute(sql.SQL(definition))
        conn.execute(STATS)
        conn.execute("VACUUM ANALYZE fabric.memory_records")
        wrong = conn.execute(
            "SELECT count(*) FROM fabric.memory_records WHERE tenant_id = 't00'"
            " AND search_length <> fabric._search_length(search_tsv)"
        ).fetchone()
        assert wrong == (0,), "BULK's search lengths are not fabric._search_length's"
    yield url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS mf_big WITH (FORCE)")


def auto_explain(conn: Any, analyze: bool = False) -> None:
    """From now on the session sends the plan of every statement it runs, nested ones too,
    as a JSON notice ("duration: ..." then the plan); with `analyze`, the actual rows."""
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_format = 'json'",
        "SET auto_explain.log_level = 'notice'",
        f"SET auto_explain.log_analyze = {'on' if analyze else 'off'}",
    ):
        conn.execute(setting)


def plan_of(
    url: str,
    query: str | None,
    relation: str = "memory_records",
    analyze: bool = False,
    limit: int = 9,
    before: tuple[str, int] | None = None,
    ids: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The executed plans of the retrieval's statements on `relation`, through auto_explain
    (with `analyze`, each node's actual rows and loops); with `before`, a call for that
    (tenant, limit) is made first in the same session."""
    plans: list[dict[str, Any]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(
            lambda d: (
                plans.append(json.loads(d.message_primary.split("\n", 1)[1]))
                if d.message_primary
                and d.message_primary.startswith("duration:")
                and relation in d.message_primary
                else None
            )
        )
        auto_explain(conn, analyze)
        calls = ([(*before, None)] if before else []) + [("big", limit, ids)]
        for tenant, k, cand in calls:
            scores = None if cand is None else [1.0 - n / 100 for n in range(len(cand))]
            conn.execute(
                "SELECT * FROM fabric._recall_candidates(%s, ARRAY['subject:user-42', "
                "'tenant', 'agent:agt-3'], ARRAY['semantic', 'episodic'], now(), 0.2, "
                "ARRAY['pci'], %s, %s::uuid[], %s::float8[], %s)",
                (tenant, query, cand, scores, k),
            )
    return plans


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def record_scans(explained: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's nodes that read memory_records (its heap, or an index of it)."""
    return [
        n
        for n in nodes(explained["Plan"])
        if n.get("Relation Name") == "memory_records" or "memory_records" in n.get("Index Name", "")
    ]


def big_ids(
    url: str, scope_keys: list[str], limit: int, tiers: list[str] | None = None
) -> list[str]:
    """The first `limit` ids (by memory_id) of tenant 'big' under these scope keys (and tiers)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return [
            str(i)
            for (i,) in conn.execute(
                "SELECT memory_id FROM fabric.memory_records WHERE tenant_id = 'big' "
                "AND scope_key = ANY (%s) AND (%s::text[] IS NULL OR tier = ANY (%s)) "
                "ORDER BY memory_id LIMIT %s",
                (scope_keys, tiers, tiers, limit),
            )
        ]


QUESTION = "what did word42 say in the note about word7?"


@pytest.mark.parametrize("query", [None, "word42", QUESTION])
def test_tenant_and_scope_are_index_conditions_not_filters(big: str, query: str | None) -> None:
    (explained,) = plan_of(big, query)
    scans = record_scans(explained)
    assert scans, explained
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], explained
    conds = " ".join(n.get("Index Cond", "") + n.get("Recheck Cond", "") for n in scans)
    assert "tenant_id" in conds, explained
    assert "scope_key" in conds, explained
    for node in scans:
        assert "tenant_id" not in node.get("Filter", ""), explained


@pytest.mark.parametrize("query", ["word42", QUESTION])
def test_lexical_candidates_come_from_the_postings_of_the_resolved_scopes(
    big: str, query: str
) -> None:
    """memory_records_search_keys holds one key per (tenant, scope key, lexeme): the lookup
    reads the postings of the matched lexemes in the three resolved scope keys, never the
    tenant's whole posting list (tenant 'big' holds 100,000 records). The rows the index
    returns are the scope's records holding a matched lexeme, and only the k winners are
    read whole (by row address)."""
    (explained,) = plan_of(big, query, analyze=True)
    found = [
        n for n in nodes(explained["Plan"]) if n.get("Index Name") == "memory_records_search_keys"
    ]
    assert found, explained
    assert "_search_keys" in found[0]["Index Cond"], explained
    with psycopg.connect(big, autocommit=True) as conn:
        (holding,) = conn.execute(
            "SELECT count(*) FROM fabric.memory_records WHERE tenant_id = 'big' "
            "AND scope_key IN ('subject:user-42', 'tenant', 'agent:agt-3') "
            "AND search_tsv @@ to_tsquery('simple', 'word42 | word7 | note | say | about')"
        ).fetchone()
    assert 0 < found[0]["Actual Rows"] <= holding, (holding, explained)
    whole = [n for n in nodes(explained["Plan"]) if n["Node Type"] == "Tid Scan"]
    assert whole and sum(n["Actual Rows"] * n["Actual Loops"] for n in whole) <= 9, explained


def test_lexical_postings_are_read_through_their_index_alone(big: str) -> None:
    """The postings' scan uses memory_records_search_keys and no other index: a generic plan
    cannot know how few the postings are, and once ANDed them with a scan of the scope's
    entries in memory_records_topk (9,500 entries read for 69 postings at 1,000,000
    records). Every rule is still checked on each posting (the answers are compared with a
    reference selection below)."""
    *_, explained = plan_of(big, "word42", analyze=True, before=("t01", 9))
    indexes = {n["Index Name"] for n in nodes(explained["Plan"]) if n.get("Index Name")}
    assert indexes == {"memory_records_search_keys"}, explained
    assert not [n for n in nodes(explained["Plan"]) if n["Node Type"] == "BitmapAnd"], explained


def test_postings_read_beside_a_walk_go_through_their_index_alone(big: str) -> None:
    """'note' is held by every record. In the tenant-visible and agent keys (thousands of
    records each) walking them in recall's order (memory_records_topk) reads fewer records
    than the postings, so that statement walks them; in subject:user-42 (a few dozen records)
    it reads the postings. That postings branch, like the lexical statement's, uses
    memory_records_search_keys and nothing is ANDed with it: once the generic plan ANDed it
    with a scan of the scope's entries (memory_records_scope, 950 entries for 10 postings in
    a 10,000-record tenant)."""
    plans = plan_of(big, "note", analyze=True)
    walked = [p for p in plans if "v_walk_keys" in p.get("Query Text", "")]
    assert len(walked) == 1, plans
    plan = walked[0]["Plan"]
    assert [n for n in nodes(plan) if n.get("Index Name") == "memory_records_topk"], plan
    indexes = {n["Index Name"] for n in nodes(plan) if n.get("Index Name")}
    assert indexes == {"memory_records_search_keys", "memory_records_topk"}, plan
    assert not [n for n in nodes(plan) if n["Node Type"] == "BitmapAnd"], plan
    with psycopg.connect(big, autocommit=True) as conn:
        (subject,) = conn.execute(
            "SELECT count(*) FROM fabric.memory_records WHERE tenant_id = 'big' "
            "AND scope_key = 'subject:user-42'"
        ).fetchone()
    postings = [n for n in nodes(plan) if n.get("Index Name") == "memory_records_search_keys"]
    assert postings and 0 < postings[0]["Actual Rows"] <= subject, (subject, plan)


def rows_read(node: dict[str, Any]) -> float:
    """The rows a scan node looked at: those it returned and those it filtered out."""
    return (
        node["Actual Rows"]
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
    ) * node["Actual Loops"]


@pytest.mark.parametrize("limit", [1, 9, 50])
def test_filter_only_recall_reads_rows_bounded_by_k_not_by_the_scope(big: str, limit: int) -> None:
    """The resolved scope holds ~10,000 live records of tenant 'big' (its tenant-visible ones
    above all); a filter-only recall reads at most a few times k rows per scope key and tier
    (3 keys x 2 tiers here), plus the k winners read whole."""
    with psycopg.connect(big, autocommit=True) as conn:
        (scope,) = conn.execute(
            "SELECT count(*) FROM fabric.memory_records WHERE tenant_id = 'big' "
            "AND scope_key IN ('subject:user-42', 'tenant', 'agent:agt-3') "
            "AND tier IN ('semantic', 'episodic')"
        ).fetchone()
    assert scope > 8_000
    (explained,) = plan_of(big, None, analyze=True, limit=limit)
    scans = record_scans(explained)
    assert scans and not [n for n in scans if n["Node Type"] == "Seq Scan"], explained
    assert explained["Plan"]["Actual Rows"] == limit, explained
    read = sum(rows_read(n) for n in scans)
    assert read <= 2 * limit * 3 * 2 + limit, (read, explained)


def test_filter_only_recall_is_one_generic_plan_bounded_by_k_whatever_the_values(
    big: str,
) -> None:
    """The filter-only statement is planned once per session without the values (a generic
    plan: the tenant shows as a parameter, never as 'big'). Made for a call in a 1,000-record
    tenant with k = 1, the same plan serves tenant 'big' (100,000 records) with k = 50 and
    still reads rows bounded by k: its bound does not rest on knowing the tenant or k."""
    plans = plan_of(big, None, analyze=True, limit=50, before=("t03", 1))
    assert len(plans) == 2, plans
    explained = plans[-1]
    scans = record_scans(explained)
    conds = " ".join(n.get("Index Cond", "") for n in scans)
    assert "$1" in conds and "'big'" not in conds, explained
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], explained
    assert explained["Plan"]["Actual Rows"] == 50, explained
    read = sum(rows_read(n) for n in scans)
    assert read <= 2 * 50 * 3 * 2 + 50, (read, explained)


def test_the_recheck_by_ids_reads_the_candidates_through_the_primary_key(big: str) -> None:
    """The by-ids statement (the vector store's candidates re-checked) runs on a generic
    plan, made once per session: its ids are a parameter of the plan, and still the index
    condition of memory_records_pkey (no NULL alternative keeps them out of it), so the rows
    read are the candidates found, whatever the size of the scope."""
    ids = big_ids(big, ["subject:user-42", "tenant", "agent:agt-3", "subject:user-7"], 40)
    (explained,) = plan_of(big, None, analyze=True, limit=9, ids=ids)
    scans = record_scans(explained)
    assert [n.get("Index Name") for n in scans] == ["memory_records_pkey"], explained
    cond = scans[0]["Index Cond"]
    # a generic plan: the ids are a parameter ($n), not the constants of a custom plan
    assert "tenant_id" in cond and "memory_id = ANY ($" in cond, explained
    assert rows_read(scans[0]) <= len(ids), explained


def test_the_recheck_by_ids_reads_the_candidate_list_once(big: str) -> None:
    """Each candidate's score is found without reading the candidate list again for every
    record found, so the by-ids statement's work grows with the number of candidates, not
    with its square (a join with the list ran on the generic plan, which cannot know how
    many candidates come, as a nested loop over the whole list: 1,000 graph candidates took
    0.25 s)."""
    ids = big_ids(big, ["subject:user-42", "tenant", "agent:agt-3"], 400, ["semantic", "episodic"])
    (explained,) = plan_of(big, None, analyze=True, limit=9, ids=ids)
    assert explained["Plan"]["Actual Rows"] == 9, explained
    work = sum(
        n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
        + n.get("Rows Removed by Join Filter", 0)
        + n.get("Rows Removed by Filter", 0)
        for n in nodes(explained["Plan"])
    )
    assert work <= 5 * len(ids), (work, explained)


def test_statistics_are_read_by_tenant_and_scope_through_their_index(big: str) -> None:
    plans = plan_of(big, QUESTION, relation="search_stats")
    # document frequencies, then count and length (and frequencies per scope key when a
    # lexeme is common enough for the per-lexeme bound to walk it)
    assert len(plans) in (2, 3), plans
    for explained in plans:
        scans = [
            n
            for n in nodes(explained["Plan"])
            if n.get("Relation Name") == "search_stats" or "search_stats" in n.get("Index Name", "")
        ]
        assert scans and not [n for n in scans if n["Node Type"] == "Seq Scan"], explained
        conds = " ".join(n.get("Index Cond", "") + n.get("Recheck Cond", "") for n in scans)
        assert "tenant_id" in conds and "scope_key" in conds, explained


def test_a_question_ranks_records_holding_its_rarer_term_first(big: str) -> None:
    """word7 and word42 are equally rare; note is in every record: holding both rare
    terms beats holding one, and the common term alone never outranks a rare one."""
    with psycopg.connect(big, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT record #>> '{content,text}' FROM fabric._recall_candidates('big', "
            "ARRAY['subject:user-42', 'subject:user-7', 'tenant'], ARRAY['semantic', "
            "'episodic', 'procedural', 'profile'], now(), 0, '{}', %s, NULL, NULL, 20)",
            (QUESTION,),
        ).fetchall()
    words = [set(r[0].split()[:1]) for r in rows]
    assert words and all(w & {"word42", "word7"} for w in words), rows


def test_neighbours_are_read_by_short_ordered_scans_of_the_conversation_index(big: str) -> None:
    """fabric._recall_neighbours (a recall's `neighbours`) on its generic plan: each side of a
    hit is an ordered scan of memory_records_conversation from the hit, stopping after
    `turns` records that pass every rule or at the hour's edge; the hits are read by id. The
    rows read follow the hits and what lies within the hour of each in its scope key and
    tier, not the size of the scope (the 'tenant' key holds thousands of records)."""
    keys = ["subject:user-42", "tenant", "agent:agt-3"]
    hits = big_ids(big, ["tenant"], 3, ["semantic"])
    plans: list[dict[str, Any]] = []
    with psycopg.connect(big, autocommit=True) as conn:
        (scope,) = conn.execute(
            "SELECT count(*) FROM fabric.memory_records WHERE tenant_id = 'big'"
            " AND scope_key = ANY (%s) AND tier IN ('semantic', 'episodic')",
            (keys,),
        ).fetchone()  # type: ignore[misc]
        # what the scans may read: the records of each hit's key and tier within its hour
        (near,) = conn.execute(
            "SELECT count(*) FROM fabric.memory_records h JOIN fabric.memory_records m"
            " ON m.tenant_id = h.tenant_id AND m.scope_key = h.scope_key AND m.tier = h.tier"
            " AND m.valid_from BETWEEN h.valid_from - interval '1 hour'"
            " AND h.valid_from + interval '1 hour'"
            " WHERE h.tenant_id = 'big' AND h.memory_id = ANY (%s::uuid[])",
            (hits,),
        ).fetchone()  # type: ignore[misc]
        conn.add_notice_handler(
            lambda d: (
                plans.append(json.loads(d.message_primary.split("\n", 1)[1]))
                if d.message_primary
                and d.message_primary.startswith("duration:")
                and "memory_records" in d.message_primary
                else None
            )
        )
        auto_explain(conn, analyze=True)
        found = conn.execute(
            "SELECT * FROM fabric._recall_neighbours('big', %s, ARRAY['semantic', 'episodic'],"
            " now(), 0, ARRAY['pci'], %s::uuid[], %s::uuid[], 2)",
            (keys, hits, hits),
        ).fetchall()
    assert scope > 8_000 and len(plans) == 1, plans
    scans = record_scans(plans[0])
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], plans
    sides = [n for n in scans if n.get("Index Name") == "memory_records_conversation"]
    assert len(sides) == 2, plans  # before and after, each an ordered scan from the hit
    conds = " ".join(n.get("Index Cond", "") for n in sides)
    assert "$1" in conds and "'big'" not in conds, plans  # a generic plan
    read = sum(rows_read(n) for n in scans)
    assert read <= near + len(hits), (read, near, plans)
    assert len(found) <= 2 * 2 * len(hits)


# ----------------------------------------------------------------------------------------
# Property: the retrieval function returns exactly what a reference filter selects.


@pytest.fixture(scope="module")
def mixed(server: Any, template: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    admin = psycopg.conninfo.make_conninfo(
        host=server.host, port=server.port, user=server.user, dbname="postgres"
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS mf_mixed WITH (FORCE)")
        conn.execute(f"CREATE DATABASE mf_mixed TEMPLATE {template} STRATEGY FILE_COPY")
    url = psycopg.conninfo.make_conninfo(admin, dbname="mf_mixed")
    rng = random.Random(7)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = []
    for _ in range(600):
        state = rng.choice([*LIVE, *LIVE, "superseded", "expired", "tombstoned"])
        vis = rng.choice(["session", "agent", "subject", "tenant"])
        start = base + dt.timedelta(days=rng.randrange(0, 300))
        rows.append(
            {
                "tenant_id": rng.choice(["acme", "globex"]),
                "memory_id": str(uuid.uuid4()),
                "tier": rng.choice(TIERS),
                "visibility": vis,
                "subject_id": None if state == "tombstoned" else rng.choice(["u1", "u2", "u3"]),
                "session_id": None if state == "tombstoned" else rng.choice(["s1", "s2"]),
                "agent_id": None if state == "tombstoned" else rng.choice(["a1", "a2"]),
                "content": None
                if state == "tombstoned" or (state == "expired" and rng.random() < 0.5)
                else {"t": "x"},
                "confidence": rng.choice([0.1, 0.5, 0.5, 0.8, 0.95]),
                "valid_from": start,
                "valid_until": None
                if rng.random() < 0.5
                else start + dt.timedelta(days=rng.randrange(1, 90)),
                "state": state,
                "labels": rng.sample(["pii", "pci", "phi"], rng.randrange(0, 3)),
            }
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO fabric.memory_records (tenant_id, memory_id, tier, visibility, "
                "subject_id, session_id, agent_id, content, content_hash, source_event_id, "
                "formed_by, formation_method, confidence, valid_from, valid_until, "
                "consolidation_state, retention_class, compliance_labels, erased_at, "
                "erasure_approval_id, search_length) VALUES (%(tenant_id)s, %(memory_id)s, "
                "%(tier)s, "
                "%(visibility)s, %(subject_id)s, %(session_id)s, %(agent_id)s, %(content)s, "
                "'sha256:' || repeat('0', 64), 'evt', 'os-agt-010', 'extraction', "
                "%(confidence)s, %(valid_from)s, %(valid_until)s, %(state)s, 'operational', "
                "%(labels)s, CASE WHEN %(state)s = 'tombstoned' THEN now() END, "
                "CASE WHEN %(state)s = 'tombstoned' THEN gen_random_uuid() END, 0)",
                [
                    {
                        **r,
                        "content": psycopg.types.json.Jsonb(r["content"]) if r["content"] else None,
                    }
                    for r in rows
                ],
            )
        recorded = dict(
            conn.execute(
                "SELECT memory_id::text, recorded_at FROM fabric.memory_records"
            ).fetchall()
        )
    for r in rows:
        r["recorded_at"] = recorded[r["memory_id"]]
        r["scope_key"] = (
            None
            if r["state"] == "tombstoned"
            else {
                "session": f"session:{r['session_id']}",
                "agent": f"agent:{r['agent_id']}",
                "subject": f"subject:{r['subject_id']}",
                "tenant": "tenant",
            }[r["visibility"]]
        )
    yield url, rows
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS mf_mixed WITH (FORCE)")


KEYS = [
    "session:s1",
    "session:s2",
    "agent:a1",
    "agent:a2",
    "subject:u1",
    "subject:u2",
    "subject:u3",
    "tenant",
]


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    tenant=st.sampled_from(["acme", "globex"]),
    keys=st.lists(st.sampled_from(KEYS), unique=True, max_size=4),
    tiers=st.lists(st.sampled_from(TIERS), unique=True, min_size=1),
    day=st.integers(0, 400),
    min_confidence=st.sampled_from([0.0, 0.5, 0.8]),
    excluded=st.lists(st.sampled_from(["pii", "pci", "phi"]), unique=True, max_size=2),
    limit=st.integers(1, 40),
)
def test_retrieval_returns_exactly_the_reference_selection(
    mixed: tuple[str, list[dict[str, Any]]],
    tenant: str,
    keys: list[str],
    tiers: list[str],
    day: int,
    min_confidence: float,
    excluded: list[str],
    limit: int,
) -> None:
    url, rows = mixed
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=day, hours=12)
    expected = sorted(
        (
            r
            for r in rows
            if r["tenant_id"] == tenant
            and r["scope_key"] in keys
            and r["tier"] in tiers
            and r["state"] in LIVE
            and r["content"] is not None
            and r["valid_from"] <= at
            and (r["valid_until"] is None or r["valid_until"] > at)
            and r["confidence"] >= min_confidence
            and not set(r["labels"]) & set(excluded)
        ),
        key=lambda r: (
            -r["confidence"],
            -r["valid_from"].timestamp(),
            -r["recorded_at"].timestamp(),
            uuid.UUID(r["memory_id"]),
        ),
    )[:limit]
    with psycopg.connect(url, autocommit=True) as conn:
        got = conn.execute(
            "SELECT memory_id::text FROM fabric._recall_candidates(%s, %s, %s, %s, %s, %s, "
            "NULL, NULL, NULL, %s)",
            (tenant, keys, tiers, at, min_confidence, excluded, limit),
        ).fetchall()
    assert [g[0] for g in got] == [r["memory_id"] for r in expected]


def test_a_scope_key_or_tier_named_twice_returns_each_record_once(
    mixed: tuple[str, list[dict[str, Any]]],
) -> None:
    url, _ = mixed
    query = (
        "SELECT memory_id::text FROM fabric._recall_candidates('acme', %s, %s, now(), 0, "
        "'{}', NULL, NULL, NULL, 1000)"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        once = conn.execute(query, (["subject:u1", "tenant"], ["semantic", "episodic"])).fetchall()
        twice = conn.execute(
            query, (["subject:u1", "tenant", "subject:u1"], ["semantic", "episodic", "semantic"])
        ).fetchall()
    assert once and twice == once
