"""Lexical recall reads the postings of the resolved scopes only: memory_records_search_keys,
a GIN index over one 64-bit key per (tenant, scope key, lexeme) of each record's search
text (fabric._search_keys), replaces memory_records_search, whose tenant and scope-key
columns were keys of their own (btree_gin): every lexical lookup read the posting list of
the whole tenant and intersected it with the lexemes', so its cost grew with the tenant.
A hash collision can only add a candidate; recall's query keeps the tenant, scope-key and
search-text predicates, which drop it (docs/benchmarks.md, "Recall latency at 100,000").

The function is created here with the text sql/140_search_text.sql replays (an alembic-only
upgrade from an older revision has not replayed sql/, and the index needs it now).

Revision ID: 0022_recall_latency
Revises: 0021_search_length
Create Date: 2026-12-01
"""

from alembic import op

revision = "0022_recall_latency"
down_revision = "0021_search_length"
branch_labels = None
depends_on = None

SEARCH_KEYS = r"""
CREATE OR REPLACE FUNCTION fabric._search_keys(p_tenant_id text, p_scope_keys text[],
                                               p_lexemes text[])
RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT ARRAY(SELECT pg_catalog.hashtextextended(
                        p_tenant_id || E'\x1f' || k.key || E'\x1f' || l.lexeme, 0)
                 FROM pg_catalog.unnest(p_scope_keys) AS k(key),
                      pg_catalog.unnest(p_lexemes) AS l(lexeme))
$$;
"""


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(SEARCH_KEYS)
    op.execute(
        "CREATE INDEX memory_records_search_keys ON fabric.memory_records USING gin "
        "(fabric._search_keys(tenant_id, ARRAY[scope_key], "
        "pg_catalog.tsvector_to_array(search_tsv))) WHERE search_tsv IS NOT NULL"
    )
    op.execute("DROP INDEX fabric.memory_records_search")
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(
        "CREATE INDEX memory_records_search ON fabric.memory_records "
        "USING gin (tenant_id, scope_key, search_tsv) WHERE search_tsv IS NOT NULL"
    )
    op.execute("DROP INDEX fabric.memory_records_search_keys")
    op.execute("DROP FUNCTION fabric._search_keys(text, text[], text[])")
    op.execute("RESET ROLE")
