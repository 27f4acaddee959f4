-- fabric.memory_record_versions: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.memory_record_versions', ARRAY['select', 'insert', 'update']);
