"""Recall: deployment settings, derived search text, retrieval indexes, the retriever role.

fabric_retriever (NOLOGIN, BYPASSRLS, owns only the retrieval function) exists because
full-text `@@` is not leakproof: under RLS it could never be an index condition. The
retrieval function states tenant and scope predicates explicitly (R-TENANT-2).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

-- deployment_settings: one row per database; what each deployment chooses for itself.
CREATE TABLE fabric.deployment_settings (
  singleton             boolean PRIMARY KEY DEFAULT true,
  text_search_config    regconfig NOT NULL DEFAULT 'pg_catalog.simple',
  recall_default_limit  integer NOT NULL DEFAULT 8,
  recall_max_limit      integer NOT NULL DEFAULT 100,
  CONSTRAINT deployment_settings_is_one_row CHECK (singleton),
  CONSTRAINT deployment_settings_limits_are_sane
    CHECK (recall_default_limit BETWEEN 1 AND recall_max_limit AND recall_max_limit <= 1000)
);
INSERT INTO fabric.deployment_settings DEFAULT VALUES;

ALTER TABLE fabric.memory_records ADD COLUMN search_tsv tsvector;
-- Full-text retrieval keeps tenant and scope as index conditions (btree_gin).
CREATE INDEX memory_records_search ON fabric.memory_records
  USING gin (tenant_id, scope_key, search_tsv) WHERE search_tsv IS NOT NULL;
-- Backfill the derived text of records formed before this revision (triggers are off for
-- the backfill only: it changes no governed column and emits nothing).
ALTER TABLE fabric.memory_records DISABLE TRIGGER USER;
UPDATE fabric.memory_records
   SET search_tsv = jsonb_to_tsvector('pg_catalog.simple', content, '["string"]')
 WHERE content IS NOT NULL;
ALTER TABLE fabric.memory_records ENABLE TRIGGER USER;
CREATE INDEX events_recalls ON fabric.events (tenant_id, occurred_at)
  WHERE event_type IN ('memory.recall.served', 'memory.recall.denied');
"""


def upgrade() -> None:
    op.execute(
        """
        DO $$
        BEGIN
          IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'fabric_retriever') THEN
            CREATE ROLE fabric_retriever NOLOGIN BYPASSRLS;
          END IF;
        END $$
        """
    )
    op.execute("GRANT fabric_retriever TO CURRENT_USER WITH INHERIT FALSE, SET TRUE")
    op.execute(UPGRADE)
    op.execute("GRANT USAGE, CREATE ON SCHEMA fabric TO fabric_retriever")
    op.execute("RESET ROLE")
    op.execute("SET LOCAL ROLE fabric_retriever")
    op.execute(
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_retriever REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC"
    )
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP FUNCTION IF EXISTS fabric._recall_candidates CASCADE")
    op.execute("DROP INDEX IF EXISTS fabric.events_recalls")
    op.execute("DROP INDEX IF EXISTS fabric.memory_records_search")
    op.execute("ALTER TABLE fabric.memory_records DROP COLUMN IF EXISTS search_tsv")
    op.execute("DROP TABLE IF EXISTS fabric.deployment_settings")
    op.execute("REVOKE ALL ON SCHEMA fabric FROM fabric_retriever")
    op.execute("RESET ROLE")
    op.execute("SET LOCAL ROLE fabric_retriever")
    op.execute(
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_retriever GRANT EXECUTE ON FUNCTIONS TO PUBLIC"
    )
    op.execute("RESET ROLE")
