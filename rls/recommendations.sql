-- fabric.recommendations: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.recommendations', ARRAY['select', 'insert', 'update']);
