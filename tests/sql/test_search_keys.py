"""fabric._search_keys, the expression of the index memory_records_search_keys, answers what
the function migration 0022 built the index with, for every input: an index built by either
stays valid. sql/140_search_text.sql replays it in plpgsql (its plan kept for the session)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback

MIGRATION = Path(__file__).parents[2] / "migrations" / "versions" / "0022_recall_latency.py"
CALL = "SELECT fabric._search_keys(%s, %s, %s), pg_temp.search_keys_0022(%s, %s, %s)"

EDGES: list[tuple[Any, Any, Any]] = [
    ("acme", ["tenant"], ["invoic", "eur"]),
    ("acme", ["subject:user-1", "tenant", "agent:a"], ["x"]),
    ("acme", [], ["x"]),
    ("acme", ["tenant"], []),
    ("acme", None, ["x"]),
    ("acme", ["tenant"], None),
    (None, ["tenant"], ["x"]),
    ("acme", [None], ["x"]),
    ("acme", ["tenant"], [None, "y"]),
    ("", [""], [""]),
    ("ünï", ["subject:ßü", "tenant"], ["日本", "x\x1fy"]),
]


def _with_0022_function(conn: psycopg.Connection[Any]) -> None:
    spec = importlib.util.spec_from_file_location("migration_0022", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.SEARCH_KEYS.replace("fabric._search_keys", "pg_temp.search_keys_0022")
    assert "pg_temp.search_keys_0022" in text
    conn.execute(text)


def _both(conn: psycopg.Connection[Any], args: tuple[Any, Any, Any]) -> tuple[Any, Any]:
    row = conn.execute(CALL, (*args, *args)).fetchone()
    assert row is not None
    return row[0], row[1]


def test_the_index_function_answers_what_migration_0022_built_the_index_with(
    fabric: Fabric,
) -> None:
    conn = fabric.su()
    _with_0022_function(conn)
    for args in EDGES:
        now, then = _both(conn, args)
        assert now == then, args
    # and the keys of every record a governed commit formed, as the index holds them
    run = fabric.open_run()
    for text in ("asked for invoices in EUR", "prefers the Rotterdam depot, not Antwerp"):
        proposal = fabric.propose("mf_agent_a", episode(text), run)
        fabric.commit(proposal["proposal_id"])
    (differ, compared) = conn.execute(
        "SELECT count(*) FILTER (WHERE a IS DISTINCT FROM b), count(*) FROM ("
        " SELECT fabric._search_keys(tenant_id, ARRAY[scope_key],"
        "   tsvector_to_array(search_tsv)) a, pg_temp.search_keys_0022(tenant_id,"
        "   ARRAY[scope_key], tsvector_to_array(search_tsv)) b"
        " FROM fabric.memory_records WHERE search_tsv IS NOT NULL) x"
    ).fetchone() or (None, None)
    assert (differ, compared) == (0, 2)


texts = st.text(st.characters(blacklist_categories=("Cs",), min_codepoint=1), max_size=12)


def test_both_functions_agree_on_any_input(fabric: Fabric) -> None:
    conn = fabric.su()
    _with_0022_function(conn)

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        tenant=st.none() | texts,
        keys=st.none() | st.lists(st.none() | texts, max_size=4),
        lexemes=st.none() | st.lists(st.none() | texts, max_size=6),
    )
    def agree(
        tenant: str | None, keys: list[str | None] | None, lexemes: list[str | None] | None
    ) -> None:
        now, then = _both(conn, (tenant, keys, lexemes))
        assert now == then

    agree()
