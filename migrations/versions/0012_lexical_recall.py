"""Lexical recall that answers questions: per-scope search statistics for BM25 ranking,
and `english` as the default text search configuration (search text is rebuilt with it).

fabric.search_stats holds append-only deltas keyed by (tenant_id, scope_key, lexeme): a
record that gains search text adds +1 document (and its length) to its scope and +1 to
each of its lexemes; one that loses it (erasure, window closure) adds the opposite.
Nothing is ever updated in place, so two commits in one scope never wait for each other;
compaction folds a scope's deltas into one row per lexeme. The row with lexeme '' holds
the scope's document count and total length (a tsvector lexeme is never empty).

Revision ID: 0012_lexical_recall
Revises: 0011_audit_trail
Create Date: 2026-12-01
"""

from alembic import op

revision = "0012_lexical_recall"
down_revision = "0011_audit_trail"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

CREATE TABLE fabric.search_stats (
  tenant_id  text NOT NULL,
  scope_key  text NOT NULL,
  lexeme     text NOT NULL,
  docs       bigint NOT NULL,
  length     bigint NOT NULL DEFAULT 0
);
CREATE INDEX search_stats_lookup ON fabric.search_stats (tenant_id, scope_key, lexeme)
  INCLUDE (docs, length);

ALTER TABLE fabric.deployment_settings
  ALTER COLUMN text_search_config SET DEFAULT 'pg_catalog.english',
  -- Lexical candidates: query lexemes are taken rarest first while their summed document
  -- frequency stays within this bound (the rarest always); 0 means no bound.
  ADD COLUMN recall_lexical_bound integer NOT NULL DEFAULT 5000,
  ADD CONSTRAINT deployment_settings_lexical_bound_is_sane
    CHECK (recall_lexical_bound BETWEEN 0 AND 10000000);
UPDATE fabric.deployment_settings SET text_search_config = 'pg_catalog.english'
 WHERE text_search_config = 'pg_catalog.simple'::regconfig;

-- Rebuild the derived search text with the new configuration and count it, tenant by
-- tenant (row level security shows one tenant at a time). Triggers are off for the
-- backfill only: it changes no governed column and emits nothing.
ALTER TABLE fabric.memory_records DISABLE TRIGGER USER;
DO $$
DECLARE
  v_tenant text;
  v_config regconfig := (SELECT s.text_search_config FROM fabric.deployment_settings s);
BEGIN
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t LOOP
    PERFORM pg_catalog.set_config('fabric.tenant_id', v_tenant, true);
    UPDATE fabric.memory_records m
       SET search_tsv = pg_catalog.jsonb_to_tsvector(v_config, m.content, '["string"]')
     WHERE m.tenant_id = v_tenant AND m.content IS NOT NULL;
    INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
    SELECT m.tenant_id, m.scope_key, '', pg_catalog.count(*),
           pg_catalog.sum((SELECT pg_catalog.sum(coalesce(pg_catalog.array_length(u.positions, 1), 1))
                           FROM pg_catalog.unnest(m.search_tsv) u))
      FROM fabric.memory_records m
     WHERE m.tenant_id = v_tenant AND m.search_tsv IS NOT NULL AND m.scope_key IS NOT NULL
     GROUP BY m.tenant_id, m.scope_key;
    INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
    SELECT m.tenant_id, m.scope_key, u.lexeme, pg_catalog.count(*), 0
      FROM fabric.memory_records m CROSS JOIN LATERAL pg_catalog.unnest(m.search_tsv) u
     WHERE m.tenant_id = v_tenant AND m.search_tsv IS NOT NULL AND m.scope_key IS NOT NULL
     GROUP BY m.tenant_id, m.scope_key, u.lexeme;
  END LOOP;
  PERFORM pg_catalog.set_config('fabric.tenant_id', '', true);
END $$;
ALTER TABLE fabric.memory_records ENABLE TRIGGER USER;
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP TABLE IF EXISTS fabric.search_stats;
ALTER TABLE fabric.deployment_settings DROP COLUMN IF EXISTS recall_lexical_bound;
ALTER TABLE fabric.deployment_settings
  ALTER COLUMN text_search_config SET DEFAULT 'pg_catalog.simple';
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
