-- langgraph.checkpoint*: each service login sees and writes only its own threads, those
-- whose id starts with `<login>:` (memfabric.langgraph.checkpointer names them so). Not
-- forced: the owner's erasure and retention reach every service's threads.
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['checkpoints', 'checkpoint_blobs', 'checkpoint_writes'] LOOP
    EXECUTE pg_catalog.format('ALTER TABLE langgraph.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE pg_catalog.format('DROP POLICY IF EXISTS own_service_threads ON langgraph.%I', t);
    EXECUTE pg_catalog.format(
      'CREATE POLICY own_service_threads ON langgraph.%I TO fabric_checkpointer'
      ' USING (pg_catalog.starts_with(thread_id, current_user || '':''))'
      ' WITH CHECK (pg_catalog.starts_with(thread_id, current_user || '':''))', t);
  END LOOP;
END $$;
