-- fabric.proposals: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.proposals', ARRAY['select', 'insert', 'update']);
