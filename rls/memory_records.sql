-- fabric.memory_records: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.memory_records', ARRAY['select', 'insert', 'update']);
