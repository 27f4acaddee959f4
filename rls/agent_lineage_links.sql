-- fabric.agent_lineage_links: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.agent_lineage_links', ARRAY['select', 'insert']);
