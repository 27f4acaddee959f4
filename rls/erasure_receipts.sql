-- fabric.erasure_receipts: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
CALL fabric._tenant_policies('fabric.erasure_receipts', ARRAY['select', 'insert', 'update']);
