"""Each record's search length stored: memory_records.search_length is the length BM25
reads (fabric._search_length of its search text, 0 when it has none), written by the
same triggers that write the search text, so lexical recall no longer unnests every
candidate's whole search text to count it.

The column is added nullable (no rewrite) with a bridge trigger that gives the length to
records formed meanwhile by workers still running the old triggers; it is backfilled
tenant by tenant in primary-key ranges of 10,000 records, each batch its own short
transaction (triggers are off inside it only: it changes no governed column and emits
nothing; the lock that switching them off takes is released at the batch's commit);
then made NOT NULL through a validated CHECK, so the final ALTER does not scan the table
under its exclusive lock. The triggers that write the length from then on are created
by the replay of sql/ that follows every upgrade, which also drops the bridge.

Revision ID: 0021_search_length
Revises: 0020_projection_feeds
Create Date: 2026-12-01
"""

from alembic import op

revision = "0021_search_length"
down_revision = "0020_projection_feeds"
branch_labels = None
depends_on = None

ADD = r"""
SET LOCAL ROLE fabric_owner;
ALTER TABLE fabric.memory_records ADD COLUMN IF NOT EXISTS search_length integer;
-- The bridge: until the replay of sql/ installs the triggers that write the length, a
-- record formed or changed by code still running the old ones gets it here (the replay
-- drops the bridge in the transaction that replaces them).
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__search_length_0021()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF TG_OP = 'INSERT' OR NEW.search_tsv IS DISTINCT FROM OLD.search_tsv
     OR NEW.search_length IS NULL THEN
    -- fabric._search_length written out: an alembic-only upgrade from an old revision
    -- has not replayed sql/, so this revision may not call functions that sql/ defines
    NEW.search_length := (SELECT coalesce(pg_catalog.sum(coalesce(pg_catalog.array_length(u.positions, 1), 1)), 0)
                      FROM pg_catalog.unnest(NEW.search_tsv) u);
  END IF;
  RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER _999_search_length_0021
  BEFORE INSERT OR UPDATE ON fabric.memory_records
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_memory_records__search_length_0021();
"""

# One DO block run outside a transaction block, so it may COMMIT between batches.
BACKFILL = r"""
DO $$
DECLARE
  v_tenants text[];
  v_tenant text;
  v_last uuid;
  v_upto uuid;
BEGIN
  SET LOCAL ROLE fabric_owner;
  v_tenants := ARRAY(SELECT t.tenant_id::text FROM fabric.tenants t ORDER BY t.tenant_id);
  COMMIT;
  FOREACH v_tenant IN ARRAY v_tenants LOOP
    -- memory_id ranges of the primary key, the nil uuid below every generated one
    v_last := '00000000-0000-0000-0000-000000000000';
    LOOP
      SET LOCAL ROLE fabric_owner;
      PERFORM pg_catalog.set_config('fabric.tenant_id', v_tenant, true);
      v_upto := (SELECT m.memory_id FROM fabric.memory_records m
                  WHERE m.tenant_id = v_tenant AND m.memory_id > v_last
                  ORDER BY m.memory_id OFFSET 9999 LIMIT 1);
      ALTER TABLE fabric.memory_records DISABLE TRIGGER USER;
      IF v_upto IS NOT NULL THEN
        UPDATE fabric.memory_records m
           SET search_length = (SELECT coalesce(pg_catalog.sum(coalesce(pg_catalog.array_length(u.positions, 1), 1)), 0)
                                  FROM pg_catalog.unnest(m.search_tsv) u)
         WHERE m.tenant_id = v_tenant AND m.memory_id > v_last AND m.memory_id <= v_upto
           AND m.search_length IS NULL;
      ELSE                         -- the last batch, and a record with the nil uuid, if any
        UPDATE fabric.memory_records m
           SET search_length = (SELECT coalesce(pg_catalog.sum(coalesce(pg_catalog.array_length(u.positions, 1), 1)), 0)
                                  FROM pg_catalog.unnest(m.search_tsv) u)
         WHERE m.tenant_id = v_tenant
           AND (m.memory_id > v_last OR m.memory_id = '00000000-0000-0000-0000-000000000000')
           AND m.search_length IS NULL;
      END IF;
      ALTER TABLE fabric.memory_records ENABLE TRIGGER USER;
      COMMIT;
      EXIT WHEN v_upto IS NULL;
      v_last := v_upto;
    END LOOP;
  END LOOP;
END $$
"""

NOT_NULL = r"""
SET LOCAL ROLE fabric_owner;
ALTER TABLE fabric.memory_records
  ADD CONSTRAINT memory_records_search_length_known CHECK (search_length IS NOT NULL) NOT VALID;
ALTER TABLE fabric.memory_records VALIDATE CONSTRAINT memory_records_search_length_known;
ALTER TABLE fabric.memory_records ALTER COLUMN search_length SET NOT NULL;
ALTER TABLE fabric.memory_records DROP CONSTRAINT memory_records_search_length_known;
"""


def upgrade() -> None:
    op.execute(ADD)
    op.execute("RESET ROLE")
    with op.get_context().autocommit_block():
        op.execute(BACKFILL)
    op.execute(NOT_NULL)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP TRIGGER IF EXISTS _999_search_length_0021 ON fabric.memory_records")
    op.execute("DROP FUNCTION IF EXISTS fabric.tg_memory_records__search_length_0021()")
    op.execute("ALTER TABLE fabric.memory_records DROP COLUMN IF EXISTS search_length")
    op.execute("RESET ROLE")
