-- fabric.shard_events: rows of the transaction's tenant only (fabric.tenant_id); unset shows nothing.
-- A shard's trigger stages an event here; the coordinator moves it into the outbox
-- (fabric._flush_shard_events) in the same transaction. Empty on plain PostgreSQL.
CALL fabric._tenant_policies('fabric.shard_events', ARRAY['select', 'insert', 'delete']);
