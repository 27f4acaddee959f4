-- fabric.erasure_receipts: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.erasure_receipts ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.erasure_receipts FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.erasure_receipts;
CREATE POLICY select_same_tenant ON fabric.erasure_receipts FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.erasure_receipts;
CREATE POLICY insert_same_tenant ON fabric.erasure_receipts FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.erasure_receipts;
CREATE POLICY update_same_tenant ON fabric.erasure_receipts FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
