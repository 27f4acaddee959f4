-- fabric.measurements: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.measurements', ARRAY['select', 'insert', 'delete']);
