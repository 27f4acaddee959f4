-- fabric.review_flags: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.review_flags ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.review_flags FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.review_flags;
CREATE POLICY select_same_tenant ON fabric.review_flags FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.review_flags;
CREATE POLICY insert_same_tenant ON fabric.review_flags FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.review_flags;
CREATE POLICY update_same_tenant ON fabric.review_flags FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
