-- fabric.subject_keys: rows of the transaction's tenant only (fabric.tenant_id); unset shows
-- nothing. Keys are written on first use and deleted at subject erasure, never updated.
ALTER TABLE fabric.subject_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE fabric.subject_keys FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS select_same_tenant ON fabric.subject_keys;
CREATE POLICY select_same_tenant ON fabric.subject_keys FOR SELECT
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS insert_same_tenant ON fabric.subject_keys;
CREATE POLICY insert_same_tenant ON fabric.subject_keys FOR INSERT
  WITH CHECK (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
DROP POLICY IF EXISTS delete_same_tenant ON fabric.subject_keys;
CREATE POLICY delete_same_tenant ON fabric.subject_keys FOR DELETE
  USING (tenant_id = pg_catalog.current_setting('fabric.tenant_id', true));
