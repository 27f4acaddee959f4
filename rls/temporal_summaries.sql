-- fabric.temporal_summaries: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.temporal_summaries ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.temporal_summaries FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.temporal_summaries;
CREATE POLICY select_same_tenant ON fabric.temporal_summaries FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.temporal_summaries;
CREATE POLICY insert_same_tenant ON fabric.temporal_summaries FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.temporal_summaries;
CREATE POLICY update_same_tenant ON fabric.temporal_summaries FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
