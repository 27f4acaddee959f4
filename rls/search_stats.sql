-- fabric.search_stats: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
-- Rows are deleted, never updated: compaction folds deltas (deletes them, inserts their sums).
CALL fabric._tenant_policies('fabric.search_stats', ARRAY['select', 'insert', 'delete']);
