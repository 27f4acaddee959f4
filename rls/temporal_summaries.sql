-- fabric.temporal_summaries: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.temporal_summaries', ARRAY['select', 'insert', 'update']);
