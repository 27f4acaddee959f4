-- fabric.tenant_agent_tools: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.tenant_agent_tools', ARRAY['select', 'insert', 'update', 'delete']);
