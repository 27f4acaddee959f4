-- fabric.approvals: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.approvals', ARRAY['select', 'insert', 'update']);
