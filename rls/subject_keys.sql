-- fabric.subject_keys: rows of the transaction's tenant only (fabric.tenant_id); unset shows
-- nothing. Keys are written on first use and deleted at subject erasure, never updated.
CALL fabric._tenant_policies('fabric.subject_keys', ARRAY['select', 'insert', 'delete']);
