-- fabric.mcp_tokens: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.mcp_tokens ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.mcp_tokens FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.mcp_tokens;
CREATE POLICY select_same_tenant ON fabric.mcp_tokens FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.mcp_tokens;
CREATE POLICY insert_same_tenant ON fabric.mcp_tokens FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.mcp_tokens;
CREATE POLICY update_same_tenant ON fabric.mcp_tokens FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
