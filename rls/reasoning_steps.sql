-- fabric.reasoning_steps: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.reasoning_steps', ARRAY['select', 'insert']);
