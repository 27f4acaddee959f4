-- fabric.step_touches: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.step_touches', ARRAY['select', 'insert']);
