-- fabric.consolidation_outcomes: rows of the transaction's tenant only (fabric.tenant_id); unset
-- shows nothing. Append-only: no update or delete policy (and a trigger refuses both).
CALL fabric._tenant_policies('fabric.consolidation_outcomes', ARRAY['select', 'insert']);
