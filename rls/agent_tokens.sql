-- fabric.agent_tokens: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.agent_tokens', ARRAY['select', 'insert', 'update']);
