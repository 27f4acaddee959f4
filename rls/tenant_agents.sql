-- fabric.tenant_agents: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.tenant_agents ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.tenant_agents FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.tenant_agents;
CREATE POLICY select_same_tenant ON fabric.tenant_agents FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.tenant_agents;
CREATE POLICY insert_same_tenant ON fabric.tenant_agents FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.tenant_agents;
CREATE POLICY update_same_tenant ON fabric.tenant_agents FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
