-- fabric.instance_config: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
-- Rows are also deleted: configure_instance replaces the row whole.
CALL fabric._tenant_policies('fabric.instance_config', ARRAY['select', 'insert', 'update', 'delete']);
