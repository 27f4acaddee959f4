-- fabric.memory_embeddings: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
-- Rows are also deleted: erasure and re-embedding remove vectors.
CALL fabric._tenant_policies('fabric.memory_embeddings', ARRAY['select', 'insert', 'update', 'delete']);
