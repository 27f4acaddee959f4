-- fabric.entities: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.entities', ARRAY['select', 'insert', 'update', 'delete']);
