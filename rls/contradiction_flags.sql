-- fabric.contradiction_flags: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.contradiction_flags', ARRAY['select', 'insert', 'update']);
