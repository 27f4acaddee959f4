-- fabric.instance_config: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.instance_config ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.instance_config FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.instance_config;
CREATE POLICY select_same_tenant ON fabric.instance_config FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.instance_config;
CREATE POLICY insert_same_tenant ON fabric.instance_config FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.instance_config;
CREATE POLICY update_same_tenant ON fabric.instance_config FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
-- configure_instance replaces the row whole.
DROP POLICY IF EXISTS delete_same_tenant ON fabric.instance_config;
CREATE POLICY delete_same_tenant ON fabric.instance_config FOR DELETE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
