-- fabric.memory_corroborations: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.memory_corroborations', ARRAY['select', 'insert']);
