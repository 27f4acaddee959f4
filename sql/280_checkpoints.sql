-- LangGraph's checkpoints (schema `langgraph`, migration 0015_checkpoints) are not memory:
-- graph state of one service's threads, kept apart from the fabric. What the fabric checks
-- and does about them: every checkpoint names its service, tenant and subject, and a thread
-- never changes them; the scheduled decay deletes threads idle beyond the instance's
-- checkpoint_retention; a subject's erasure deletes the subject's threads, and any erasure
-- deletes the threads of the runs that recall served an erased record.

-- ---------------------------------------------------------------------------------------
-- fabric.tg_checkpoints__thread_metadata: a checkpoint's metadata carries `service` (the
-- prefix of its thread id, `<service>:<thread>`), `tenant_id` (a tenant of the fabric),
-- `subject_id` (an identifier, or null for a thread about no subject) and optionally
-- `business_instance_id`; all four are the same for every checkpoint of a thread. It may
-- name `fabric_run_id`, the fabric run the invocation served (a run of the thread's tenant;
-- it may change from one checkpoint to the next): an erasure of a record recall served to
-- that run deletes the thread.
CREATE OR REPLACE FUNCTION fabric.tg_checkpoints__thread_metadata()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_meta jsonb := NEW.metadata;
  v_first jsonb;
BEGIN
  IF pg_catalog.jsonb_typeof(v_meta -> 'service') IS DISTINCT FROM 'string'
     OR NOT pg_catalog.starts_with(NEW.thread_id, (v_meta ->> 'service') || ':') THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a checkpoint''s thread id must start with its service: <service>:<thread>',
      'write checkpoints through memfabric.langgraph.checkpointer(service=...)');
  END IF;
  IF pg_catalog.jsonb_typeof(v_meta -> 'tenant_id') IS DISTINCT FROM 'string'
     OR NOT EXISTS (SELECT 1 FROM fabric.tenants t WHERE t.tenant_id = v_meta ->> 'tenant_id') THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a checkpoint''s metadata must name the tenant of its thread (tenant_id)',
      'pass configurable.tenant_id when invoking the graph');
  END IF;
  IF NOT v_meta ? 'subject_id'
     OR pg_catalog.jsonb_typeof(v_meta -> 'subject_id') NOT IN ('string', 'null')
     OR pg_catalog.jsonb_typeof(v_meta -> 'business_instance_id') NOT IN ('string', 'null') THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a checkpoint''s metadata must name the subject of its thread (subject_id, '
      'null for none) and may name its business_instance_id',
      'pass configurable.subject_id when invoking the graph');
  END IF;
  PERFORM fabric._ident(v_meta ->> 'subject_id', 'subject_id'),
          fabric._ident(v_meta ->> 'business_instance_id', 'business_instance_id');
  IF pg_catalog.jsonb_typeof(v_meta -> 'fabric_run_id') IS DISTINCT FROM 'null'
     AND v_meta ? 'fabric_run_id'
     AND (pg_catalog.jsonb_typeof(v_meta -> 'fabric_run_id') <> 'string'
          OR (v_meta ->> 'fabric_run_id') !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
          OR fabric._tenant_of_run((v_meta ->> 'fabric_run_id')::uuid)
             IS DISTINCT FROM v_meta ->> 'tenant_id') THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a checkpoint''s fabric_run_id must be a run of the thread''s tenant (its UUID)',
      'pass configurable.fabric_run_id: the run the orchestrator opened for this invocation');
  END IF;
  -- fabric_workflow_event_id: the consolidation run whose audited candidate read the
  -- thread's graph state came from (an erasure of any record that read named deletes it).
  IF pg_catalog.jsonb_typeof(v_meta -> 'fabric_workflow_event_id') IS DISTINCT FROM 'null'
     AND v_meta ? 'fabric_workflow_event_id'
     AND (pg_catalog.jsonb_typeof(v_meta -> 'fabric_workflow_event_id') <> 'string'
          OR (v_meta ->> 'fabric_workflow_event_id') !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
          OR NOT EXISTS (SELECT 1 FROM fabric.events e
                         WHERE e.event_id = (v_meta ->> 'fabric_workflow_event_id')::uuid
                           AND e.tenant_id = v_meta ->> 'tenant_id'
                           AND e.event_type = 'memory.workflow.started')) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a checkpoint''s fabric_workflow_event_id must be a consolidation run of the thread''s tenant',
      'pass configurable.fabric_workflow_event_id: the run''s fabric_api.start_workflow_run id');
  END IF;
  IF TG_OP = 'UPDATE' THEN
    v_first := OLD.metadata || pg_catalog.jsonb_build_object('thread_id', OLD.thread_id);
    v_meta := v_meta || pg_catalog.jsonb_build_object('thread_id', NEW.thread_id);
  ELSE
    SELECT c.metadata INTO v_first FROM langgraph.checkpoints c
    WHERE c.thread_id = NEW.thread_id
    LIMIT 1;
  END IF;
  IF v_first IS NOT NULL AND (v_first -> 'thread_id' IS DISTINCT FROM v_meta -> 'thread_id'
                OR v_first -> 'tenant_id' IS DISTINCT FROM v_meta -> 'tenant_id'
                OR v_first -> 'subject_id' IS DISTINCT FROM v_meta -> 'subject_id'
                OR v_first -> 'business_instance_id' IS DISTINCT FROM v_meta -> 'business_instance_id') THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'a checkpoint thread belongs to one tenant, subject and business instance',
      'start a new thread for another tenant or subject');
  END IF;
  RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION fabric.tg_checkpoints__thread_metadata() FROM PUBLIC;
DROP TRIGGER IF EXISTS _100_thread_metadata ON langgraph.checkpoints;
CREATE TRIGGER _100_thread_metadata BEFORE INSERT OR UPDATE ON langgraph.checkpoints
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_checkpoints__thread_metadata();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_checkpoints__thread_exists: a thread's blobs and pending writes belong to a
-- checkpoint of that thread by the end of their transaction, so nothing of a thread whose
-- checkpoint was refused (or never written) stays behind, out of reach of retention and
-- erasure. (The checkpointer writes a checkpoint and its blobs in one transaction.)
CREATE OR REPLACE FUNCTION fabric.tg_checkpoints__thread_exists()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM langgraph.checkpoints c WHERE c.thread_id = NEW.thread_id) THEN
    PERFORM fabric._raise_rule('foreign_key_violation',
      'checkpoint blobs and writes belong to a thread that has a checkpoint',
      'write the checkpoint in the same transaction (memfabric.langgraph.checkpointer does)');
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION fabric.tg_checkpoints__thread_exists() FROM PUBLIC;
DROP TRIGGER IF EXISTS _100_thread_exists ON langgraph.checkpoint_blobs;
CREATE CONSTRAINT TRIGGER _100_thread_exists AFTER INSERT OR UPDATE ON langgraph.checkpoint_blobs
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_checkpoints__thread_exists();
DROP TRIGGER IF EXISTS _100_thread_exists ON langgraph.checkpoint_writes;
CREATE CONSTRAINT TRIGGER _100_thread_exists AFTER INSERT OR UPDATE ON langgraph.checkpoint_writes
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_checkpoints__thread_exists();

-- ---------------------------------------------------------------------------------------
-- fabric._delete_checkpoint_threads: a thread's checkpoints, blobs and pending writes.
CREATE OR REPLACE FUNCTION fabric._delete_checkpoint_threads(p_threads text[])
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
  DELETE FROM langgraph.checkpoint_writes w WHERE w.thread_id = ANY (p_threads);
  DELETE FROM langgraph.checkpoint_blobs b WHERE b.thread_id = ANY (p_threads);
  DELETE FROM langgraph.checkpoints c WHERE c.thread_id = ANY (p_threads);
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._expire_checkpoints: the decay's part. A thread whose newest checkpoint is older
-- than its instance's checkpoint_retention (which exceeds the longest approval timeout, so
-- a graph waiting for an approval can still be resumed) is deleted whole. Returns how many.
CREATE OR REPLACE FUNCTION fabric._expire_checkpoints(p_tenant_id text, p_now timestamptz,
                                                      p_batch integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_threads text[];
BEGIN
  SELECT coalesce(pg_catalog.array_agg(t.thread_id), '{}') INTO v_threads
  FROM (SELECT c.thread_id FROM langgraph.checkpoints c
        WHERE c.metadata ->> 'tenant_id' = p_tenant_id
        GROUP BY c.thread_id, c.metadata ->> 'business_instance_id'
        HAVING pg_catalog.max((c.checkpoint ->> 'ts')::timestamptz)
               + (fabric._instance_config(p_tenant_id, c.metadata ->> 'business_instance_id')).checkpoint_retention
               <= p_now
        ORDER BY c.thread_id LIMIT p_batch) t;
  PERFORM fabric._delete_checkpoint_threads(v_threads);
  RETURN pg_catalog.cardinality(v_threads);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._erase_checkpoints: a subject erasure's part: the subject's threads, deleted;
-- their ids for the receipt (thread ids are chosen by services and never hold content).
CREATE OR REPLACE FUNCTION fabric._erase_checkpoints(p_tenant_id text, p_subject_id text)
RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_threads text[];
BEGIN
  SELECT coalesce(pg_catalog.array_agg(DISTINCT c.thread_id ORDER BY c.thread_id), '{}')
    INTO v_threads
  FROM langgraph.checkpoints c
  WHERE c.metadata ->> 'tenant_id' = p_tenant_id AND c.metadata ->> 'subject_id' = p_subject_id;
  PERFORM fabric._delete_checkpoint_threads(v_threads);
  RETURN v_threads;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._recalled_checkpoint_threads: for each of the records, every run that recall
-- served it to (the recall events name the run and the memory ids returned) and the
-- checkpoint threads that name such a run (thread_id NULL for a run without one). The graph
-- state of those threads may hold what the run was served, so an erasure deletes them.
CREATE OR REPLACE FUNCTION fabric._recalled_checkpoint_threads(p_tenant_id text,
                                                              p_memory_ids uuid[])
RETURNS TABLE (memory_id uuid, run_id uuid, thread_id text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT DISTINCT s.memory_id, s.run_id, c.thread_id
  FROM (SELECT DISTINCT x.id::uuid AS memory_id, e.run_id
        FROM fabric.events e
        CROSS JOIN LATERAL pg_catalog.jsonb_array_elements_text(e.payload -> 'memory_ids') x(id)
        WHERE e.tenant_id = p_tenant_id AND e.event_type = 'memory.recall.served'
          AND e.run_id IS NOT NULL
          AND pg_catalog.jsonb_typeof(e.payload -> 'memory_ids') = 'array'
          AND e.payload -> 'memory_ids' ?| p_memory_ids::text[]
          AND x.id = ANY (p_memory_ids::text[])) s
  LEFT JOIN langgraph.checkpoints c
    ON c.metadata ->> 'tenant_id' = p_tenant_id
   AND c.metadata ->> 'fabric_run_id' = s.run_id::text
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._consolidation_checkpoint_threads: the checkpoint threads of consolidation runs
-- whose audited candidate read named any of the records (as an episode or as a live
-- assertion): their graph state may hold its content, so an erasure deletes them.
CREATE OR REPLACE FUNCTION fabric._consolidation_checkpoint_threads(p_tenant_id text,
                                                                   p_memory_ids uuid[])
RETURNS TABLE (memory_id uuid, thread_id text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  -- driven by the (few) threads that name a consolidation run, then that run's reads
  SELECT DISTINCT x.id::uuid, c.thread_id
  FROM langgraph.checkpoints c
  JOIN fabric.events e
    ON e.tenant_id = p_tenant_id AND e.event_type = 'memory.consolidation.candidates_read'
   AND e.correlation_id = c.metadata ->> 'fabric_workflow_event_id'
  CROSS JOIN LATERAL (SELECT i FROM pg_catalog.jsonb_array_elements_text(
                        CASE WHEN pg_catalog.jsonb_typeof(e.payload -> 'memory_ids') = 'array'
                             THEN e.payload -> 'memory_ids' ELSE '[]' END) i
                      UNION
                      SELECT i FROM pg_catalog.jsonb_array_elements_text(
                        CASE WHEN pg_catalog.jsonb_typeof(e.payload -> 'assertion_ids') = 'array'
                             THEN e.payload -> 'assertion_ids' ELSE '[]' END) i) x(id)
  WHERE c.metadata ->> 'tenant_id' = p_tenant_id AND c.metadata ? 'fabric_workflow_event_id'
    AND x.id = ANY (p_memory_ids::text[])
$$;

-- ---------------------------------------------------------------------------------------
-- The deletes of a service's checkpointer. A table-level UPDATE or DELETE privilege also
-- allows LOCK TABLE in any mode (ACCESS EXCLUSIVE: every LangGraph service stalls), so a
-- service holds neither: it updates the columns LangGraph's upserts and prune set (column
-- privileges do not allow LOCK) and deletes through these functions, which reach only the
-- threads of the calling login (`<login>:...`, as row-level security does for its reads).
-- Each takes the arguments of the DELETE it stands for in the pinned
-- langgraph-checkpoint-postgres (memfabric.langgraph sends its statements here).

-- fabric._require_own_checkpoint_threads: every thread named is the calling login's.
CREATE OR REPLACE FUNCTION fabric._require_own_checkpoint_threads(p_threads text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_threads IS NULL OR EXISTS (
       SELECT 1 FROM pg_catalog.unnest(p_threads) t(thread_id)
       WHERE t.thread_id IS NULL
          OR NOT pg_catalog.starts_with(t.thread_id, session_user::text || ':')) THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'a service deletes only its own checkpoint threads (<login>:...)',
      'delete through memfabric.langgraph.checkpointer, as the login whose threads they are');
  END IF;
END $$;

-- fabric_api.delete_checkpoint_threads: whole threads (delete_thread, prune "delete").
CREATE OR REPLACE FUNCTION fabric_api.delete_checkpoint_threads(p_threads text[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._require_own_checkpoint_threads(p_threads);
  PERFORM fabric._delete_checkpoint_threads(p_threads);
  RETURN pg_catalog.cardinality(p_threads);
END $$;

-- fabric_api.delete_checkpoint_namespaces: a thread's subgraph-call namespaces, whole.
CREATE OR REPLACE FUNCTION fabric_api.delete_checkpoint_namespaces(p_thread_id text,
                                                                   p_namespaces text[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._require_own_checkpoint_threads(ARRAY[p_thread_id]);
  DELETE FROM langgraph.checkpoints c
  WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = ANY (p_namespaces);
  DELETE FROM langgraph.checkpoint_writes w
  WHERE w.thread_id = p_thread_id AND w.checkpoint_ns = ANY (p_namespaces);
  DELETE FROM langgraph.checkpoint_blobs b
  WHERE b.thread_id = p_thread_id AND b.checkpoint_ns = ANY (p_namespaces);
END $$;

-- fabric_api.delete_checkpoint_writes: the pending writes of the given checkpoints.
CREATE OR REPLACE FUNCTION fabric_api.delete_checkpoint_writes(p_thread_id text,
                                                               p_checkpoint_ns text,
                                                               p_checkpoint_ids text[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._require_own_checkpoint_threads(ARRAY[p_thread_id]);
  DELETE FROM langgraph.checkpoint_writes w
  WHERE w.thread_id = p_thread_id AND w.checkpoint_ns = p_checkpoint_ns
    AND w.checkpoint_id = ANY (p_checkpoint_ids);
END $$;

-- fabric_api.delete_unkept_checkpoints: a namespace's checkpoints but the kept ones; the
-- channel versions the deleted ones used (for the blobs no kept checkpoint uses).
CREATE OR REPLACE FUNCTION fabric_api.delete_unkept_checkpoints(p_thread_id text,
                                                                p_checkpoint_ns text,
                                                                p_keep text[])
RETURNS TABLE (channel text, version text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._require_own_checkpoint_threads(ARRAY[p_thread_id]);
  RETURN QUERY
  WITH deleted AS (
    DELETE FROM langgraph.checkpoints c
    WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = p_checkpoint_ns
      AND c.checkpoint_id <> ALL (p_keep)
    RETURNING c.checkpoint -> 'channel_versions' AS versions
  )
  SELECT DISTINCT v.key, v.value
  FROM deleted d
  CROSS JOIN LATERAL pg_catalog.jsonb_each_text(d.versions) AS v;
END $$;

-- fabric_api.delete_checkpoint_blobs: a channel's blobs of the given versions.
CREATE OR REPLACE FUNCTION fabric_api.delete_checkpoint_blobs(p_thread_id text,
                                                              p_checkpoint_ns text,
                                                              p_channel text,
                                                              p_versions text[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._require_own_checkpoint_threads(ARRAY[p_thread_id]);
  DELETE FROM langgraph.checkpoint_blobs b
  WHERE b.thread_id = p_thread_id AND b.checkpoint_ns = p_checkpoint_ns
    AND b.channel = p_channel AND b.version = ANY (p_versions);
END $$;

-- ---------------------------------------------------------------------------------------
-- Services read and write their checkpoints; the tables are fabric_owner's. No table-level
-- UPDATE or DELETE (either allows LOCK TABLE ... ACCESS EXCLUSIVE): UPDATE on the columns
-- LangGraph's upserts and prune set, deletes through the functions above.
REVOKE ALL ON ALL TABLES IN SCHEMA langgraph FROM PUBLIC;
REVOKE ALL ON SCHEMA langgraph FROM PUBLIC;
GRANT USAGE ON SCHEMA langgraph TO fabric_checkpointer;
REVOKE UPDATE, DELETE ON langgraph.checkpoints, langgraph.checkpoint_blobs,
  langgraph.checkpoint_writes FROM fabric_checkpointer;
GRANT SELECT, INSERT ON langgraph.checkpoints, langgraph.checkpoint_blobs,
  langgraph.checkpoint_writes TO fabric_checkpointer;
GRANT UPDATE (checkpoint, metadata, parent_checkpoint_id) ON langgraph.checkpoints
  TO fabric_checkpointer;
GRANT UPDATE (channel, type, blob) ON langgraph.checkpoint_writes TO fabric_checkpointer;
GRANT SELECT ON langgraph.checkpoint_migrations TO fabric_checkpointer;
REVOKE ALL ON FUNCTION fabric._require_own_checkpoint_threads(text[]) FROM PUBLIC;
-- (USAGE on fabric_api: sql/900_grants.sql, after the other roles', so that a fresh install
-- and an upgraded one list them in the same order.)
GRANT EXECUTE ON FUNCTION
  fabric_api.delete_checkpoint_threads(text[]),
  fabric_api.delete_checkpoint_namespaces(text, text[]),
  fabric_api.delete_checkpoint_writes(text, text, text[]),
  fabric_api.delete_unkept_checkpoints(text, text, text[]),
  fabric_api.delete_checkpoint_blobs(text, text, text, text[])
  TO fabric_checkpointer;
-- An erasure's VACUUM reaches the deleted threads' old tuple versions.
GRANT USAGE ON SCHEMA langgraph TO fabric_maintainer;
GRANT MAINTAIN ON langgraph.checkpoints, langgraph.checkpoint_blobs, langgraph.checkpoint_writes
  TO fabric_maintainer;
