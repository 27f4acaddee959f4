-- fabric.tenant_agents: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.tenant_agents', ARRAY['select', 'insert', 'update']);
