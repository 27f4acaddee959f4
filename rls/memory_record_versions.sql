-- fabric.memory_record_versions: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.memory_record_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.memory_record_versions FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.memory_record_versions;
CREATE POLICY select_same_tenant ON fabric.memory_record_versions FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.memory_record_versions;
CREATE POLICY insert_same_tenant ON fabric.memory_record_versions FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.memory_record_versions;
CREATE POLICY update_same_tenant ON fabric.memory_record_versions FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
