-- fabric.tenant_agent_tools: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.tenant_agent_tools ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.tenant_agent_tools FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.tenant_agent_tools;
CREATE POLICY select_same_tenant ON fabric.tenant_agent_tools FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.tenant_agent_tools;
CREATE POLICY insert_same_tenant ON fabric.tenant_agent_tools FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.tenant_agent_tools;
CREATE POLICY update_same_tenant ON fabric.tenant_agent_tools FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS delete_same_tenant ON fabric.tenant_agent_tools;
CREATE POLICY delete_same_tenant ON fabric.tenant_agent_tools FOR DELETE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
