-- fabric.memory_embeddings: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
ALTER TABLE fabric.memory_embeddings ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.memory_embeddings FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.memory_embeddings;
CREATE POLICY select_same_tenant ON fabric.memory_embeddings FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.memory_embeddings;
CREATE POLICY insert_same_tenant ON fabric.memory_embeddings FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS update_same_tenant ON fabric.memory_embeddings;
CREATE POLICY update_same_tenant ON fabric.memory_embeddings FOR UPDATE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true))
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
-- erasure and re-embedding remove vectors.
DROP POLICY IF EXISTS delete_same_tenant ON fabric.memory_embeddings;
CREATE POLICY delete_same_tenant ON fabric.memory_embeddings FOR DELETE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
