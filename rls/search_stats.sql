-- fabric.search_stats: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.search_stats ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.search_stats FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.search_stats;
CREATE POLICY select_same_tenant ON fabric.search_stats FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.search_stats;
CREATE POLICY insert_same_tenant ON fabric.search_stats FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
-- compaction folds deltas: it deletes them and inserts their sums.
DROP POLICY IF EXISTS delete_same_tenant ON fabric.search_stats;
CREATE POLICY delete_same_tenant ON fabric.search_stats FOR DELETE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
