-- Projection feed: the projector (fabric_projector) reads the outbox after its cursor and
-- below the snapshot's xmin -- so a slow transaction's events are never skipped -- and
-- hydrates committed state from Postgres. Qdrant and Neo4j are rebuilt from here alone.
--
-- The feeds return rows (projection_events_v2, projection_records_v2,
-- projection_snapshot_v2): a page is streamed row by row, never built into one jsonb value
-- (which has a size limit of its own), and an embedding travels as an ext.vector (binary
-- with pgvector's client adapter).

-- 0.3's jsonb builder of one record, replaced by fabric._projection_rows.
DROP FUNCTION IF EXISTS fabric._record_projection(fabric.memory_records, text, text);
-- 0.3's jsonb feeds: deprecated in 0.4 for the row feeds above, removed in 0.11.
DROP FUNCTION IF EXISTS fabric_api.projection_events(text, integer);
DROP FUNCTION IF EXISTS fabric_api.projection_records(uuid[], text, text);
DROP FUNCTION IF EXISTS fabric_api.projection_snapshot(text, uuid, integer, text, text);

-- 0.11's feeds returned the subject and session ids in clear (subject_id, session_id), and
-- 0.12's no correlation id: a return type cannot be replaced, so the three go (once) and are
-- made again below.
DO $$
BEGIN
  IF pg_catalog.pg_get_function_result(pg_catalog.to_regprocedure(
       'fabric._projection_rows(text, uuid[], uuid, integer, text, text)')) LIKE '%subject_id text%'
     -- 0.12's had no correlation_id (the graph writes each record's on its node and edges)
     OR pg_catalog.pg_get_function_result(pg_catalog.to_regprocedure(
       'fabric._projection_rows(text, uuid[], uuid, integer, text, text)')) NOT LIKE '%correlation_id text%' THEN
    DROP FUNCTION fabric._projection_rows(text, uuid[], uuid, integer, text, text);
    DROP FUNCTION IF EXISTS fabric_api.projection_records_v2(uuid[], text, text);
    DROP FUNCTION IF EXISTS fabric_api.projection_snapshot_v2(text, uuid, integer, text, text);
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._projection_rows: records of one tenant as the projections see them (the vector
-- payload, lineage, content for embedding, and the stored embedding of the deployment's
-- model), in memory_id order: the records named in p_memory_ids, or (p_memory_ids NULL)
-- those after p_after_memory, at most p_limit. The caller has set the tenant context.
-- The subject and session are pseudonyms (subject_ref, session_ref: sql/045_pseudonyms.sql),
-- and so is the scope key built from them: no subject or session id leaves in clear.
-- plpgsql, not SQL: Citus plans no statement of an SQL-language function with parameters
-- (it has SET search_path, so a single node never inlined it either).
CREATE OR REPLACE FUNCTION fabric._projection_rows(p_tenant text, p_memory_ids uuid[],
  p_after_memory uuid, p_limit integer, p_model text, p_model_version text)
RETURNS TABLE (memory_id uuid, tenant_id text, tier text, visibility text, scope_type text,
  scope_id text, scope_key text, subject_ref text, agent_id text, session_ref text,
  content_hash text, confidence double precision, valid_from timestamptz,
  valid_until timestamptz, consolidation_state text, retention_class text,
  compliance_labels text[], version text, formation_method text, formed_by text,
  supersedes uuid, recorded_at timestamptz, derived_from uuid[], content jsonb,
  embedding ext.vector, correlation_id text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN QUERY  -- each column cast to the result's type: plpgsql does not coerce domains
  SELECT m.memory_id, m.tenant_id::text, m.tier::text, m.visibility::text, m.visibility::text,
         (CASE m.visibility WHEN 'session' THEN p.session_ref WHEN 'agent' THEN m.agent_id
                            WHEN 'subject' THEN k.subject_ref ELSE m.tenant_id END)::text,
         (CASE WHEN m.scope_key IS NOT NULL  -- NULL once erased, as in the record
               THEN fabric._projection_scope_key(m.visibility, m.agent_id, k.subject_ref,
                                                 p.session_ref) END)::text,
         k.subject_ref::text, m.agent_id::text, p.session_ref::text, m.content_hash::text,
         m.confidence::double precision, m.valid_from, m.valid_until,
         m.consolidation_state::text, m.retention_class::text, m.compliance_labels::text[],
         m.version::text, m.formation_method::text, m.formed_by::text, m.supersedes,
         m.recorded_at,
         coalesce((SELECT pg_catalog.array_agg(l.derived_from_id ORDER BY l.derived_from_id)
                   FROM fabric.memory_lineage l
                   WHERE l.tenant_id = m.tenant_id AND l.memory_id = m.memory_id), '{}')::uuid[],
         m.content,
         -- (no model: no read at all; on Citus a subquery whose condition folds to false
         -- loses its join on the tenant and is refused as a complex join)
         (CASE WHEN p_model IS NOT NULL THEN
           (SELECT e.embedding FROM fabric.memory_embeddings e
            WHERE e.tenant_id = m.tenant_id AND e.memory_id = m.memory_id
              AND e.model = p_model AND e.model_version = p_model_version
              AND e.content_hash = m.content_hash) END)::ext.vector,
         m.correlation_id::text
  FROM fabric.memory_records m
  LEFT JOIN fabric.subject_keys k ON k.tenant_id = m.tenant_id AND k.subject_id = m.subject_id
  CROSS JOIN LATERAL (SELECT fabric._projection_session_ref(k.key, m.subject_id, m.session_id)
                        AS session_ref) p
  WHERE m.tenant_id = p_tenant
    AND (p_memory_ids IS NULL OR m.memory_id = ANY (p_memory_ids))
    AND (p_after_memory IS NULL OR m.memory_id > p_after_memory)
  ORDER BY m.memory_id
  LIMIT p_limit;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._projection_cursor: a projection's cursor (not the tracer's). OUT parameters, not
-- the table's row type, so the function does not pin the table (migrations drop it).
CREATE OR REPLACE FUNCTION fabric._projection_cursor(p_projection text, OUT last_xid xid8,
  OUT last_event_id uuid)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  SELECT c.last_xid, c.last_event_id INTO last_xid, last_event_id
  FROM fabric.projection_cursors c
  WHERE c.projection = p_projection AND c.projection <> 'trace';
  IF NOT FOUND THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'projection must be qdrant or graph',
      'one cursor per projection');
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._move_cursor: move a feed's cursor forward (or, p_rewind, anywhere) and return it
-- as it is now; a cursor already past (p_xid, p_event_id) stays where it is. The one place
-- the projection and trace cursors move.
CREATE OR REPLACE FUNCTION fabric._move_cursor(p_projection text, p_xid xid8, p_event_id uuid,
  p_rewind boolean DEFAULT false, OUT last_xid xid8, OUT last_event_id uuid)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  UPDATE fabric.projection_cursors c
  SET last_xid = p_xid, last_event_id = p_event_id, updated_at = pg_catalog.now(),
      -- a rewind is how a rebuild ends (fabric_api.begin_projection_rebuild)
      rebuild_started_at = CASE WHEN p_rewind THEN NULL ELSE c.rebuild_started_at END
  WHERE c.projection = p_projection
    AND (p_rewind OR (c.last_xid, c.last_event_id) < (p_xid, p_event_id))
  RETURNING c.last_xid, c.last_event_id INTO last_xid, last_event_id;
  IF NOT FOUND THEN
    SELECT c.last_xid, c.last_event_id INTO last_xid, last_event_id
    FROM fabric.projection_cursors c WHERE c.projection = p_projection;
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._set_cursor: the one body of the cursor setters (fabric_api.set_projection_cursor,
-- fabric_api.set_trace_cursor), which differ only in who may call them and which cursors
-- they move: moves the feed's cursor (fabric._move_cursor; p_move false only reads it) and
-- answers where it stands, {"xid", "event_id"}. The trace cursor moves only forward, to an
-- event the trace feed serves: a traced event below the snapshot's xmin. A position past
-- every event (xid 18446744073709551615) would stop tracing for good, so anything else is
-- refused (22023) and the cursor stays where it was.
CREATE OR REPLACE FUNCTION fabric._set_cursor(p_projection text, p_xid xid8, p_event_id uuid,
  p_rewind boolean, p_move boolean)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v record;
BEGIN
  IF NOT p_move THEN
    SELECT c.last_xid, c.last_event_id INTO v FROM fabric.projection_cursors c
    WHERE c.projection = p_projection;
  ELSE
    IF p_projection = 'trace'
       AND (p_xid IS NULL OR p_event_id IS NULL
            OR p_xid >= pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())
            OR NOT EXISTS (SELECT 1 FROM fabric.events e
                           WHERE e.xid = p_xid AND e.event_id = p_event_id
                             AND e.event_type = ANY (fabric._traced_event_types()))) THEN
      PERFORM fabric._raise_rule('invalid_parameter_value',
        'the trace cursor moves only to an event the trace feed served',
        'pass the xid and event_id of the last event of fabric_api.trace_events you exported');
    END IF;
    SELECT * INTO v FROM fabric._move_cursor(p_projection, p_xid, p_event_id, p_rewind);
  END IF;
  RETURN pg_catalog.jsonb_build_object('xid', v.last_xid::text, 'event_id', v.last_event_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._projection_horizon: the xid below which a projection reads the outbox and may
-- hydrate what it read, for a reader at p_after (its cursor or read-ahead position).
--
-- On one node: the snapshot's xmin. Every transaction below it has ended, so no event can
-- appear there later and the state it wrote is visible.
--
-- On a Citus cluster the second half no longer follows: a transaction that wrote a worker
-- and the outbox commits two-phase (fabric.tg_events__two_phase), and Citus ends it on the
-- coordinator before it sends the workers' COMMIT PREPARED, so for that round trip (or, if
-- COMMIT PREPARED fails, until Citus's recovery commits the prepared transaction,
-- citus.recover_2pc_interval) its events are below the xmin while the worker still shows
-- the previous state of its rows. So there the horizon also stops at the oldest
-- transaction, at or after p_after (and among p_xids, when given: the transactions whose
-- events the reader is about to read), that still has a prepared transaction pending:
-- pg_dist_transaction holds one row per prepared transaction, written by the coordinator's
-- own transaction (the row's xmin), until recovery finds it finished; the nodes'
-- pg_prepared_xacts say which are still pending. The workers are asked only when such rows
-- exist (one query per worker named by one, in parallel, on connections of their own); a
-- worker that does not answer, or is disabled, holds the horizon at its oldest row (fail
-- closed).
CREATE OR REPLACE FUNCTION fabric._projection_horizon(p_after xid8, p_xids xid8[] DEFAULT NULL)
RETURNS xid8
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_snapshot pg_snapshot := pg_catalog.pg_current_snapshot();
  v_xmin xid8 := pg_catalog.pg_snapshot_xmin(v_snapshot);
  v_next numeric;
  v_gids text[];
  v_groups integer[];
  v_xids xid8[];
  v_local integer;
  v_names text[];
  v_ports integer[];
  v_pending text[];
  v_unanswered integer[] := '{}';
  v_answer record;
  v_held xid8;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local' THEN
    RETURN v_xmin;
  END IF;
  -- Each row's writer: the 32-bit xmin of the row made a full xid, the latest one below the
  -- snapshot's xmax with those low bits (a visible row's writer is at most 2^31 behind).
  v_next := pg_catalog.pg_snapshot_xmax(v_snapshot)::text::numeric;
  SELECT pg_catalog.array_agg(c.gid), pg_catalog.array_agg(c.groupid), pg_catalog.array_agg(c.xid)
  INTO v_gids, v_groups, v_xids
  FROM (SELECT t.gid, t.groupid,
               (v_next - (((v_next - t.xmin::text::numeric) % 4294967296) + 4294967296)
                         % 4294967296)::text::xid8 AS xid
        FROM pg_catalog.pg_dist_transaction t) c
  WHERE c.xid >= coalesce(p_after, '0'::xid8) AND c.xid < v_xmin
    AND (p_xids IS NULL OR c.xid = ANY (p_xids));
  IF v_gids IS NULL THEN
    RETURN v_xmin;
  END IF;
  -- This node's own prepared transactions (a transaction that reached it over a connection
  -- of its own), then the workers'.
  SELECT l.groupid INTO v_local FROM pg_catalog.pg_dist_local_group l;
  SELECT pg_catalog.array_agg(x.gid) INTO v_pending
  FROM pg_catalog.pg_prepared_xacts x WHERE x.database = pg_catalog.current_database();
  v_pending := coalesce(v_pending, '{}');
  SELECT pg_catalog.array_agg(n.nodename ORDER BY n.groupid),
         pg_catalog.array_agg(n.nodeport ORDER BY n.groupid)
  INTO v_names, v_ports
  FROM pg_catalog.pg_dist_node n
  WHERE n.groupid = ANY (v_groups) AND n.groupid <> v_local
    AND n.noderole = 'primary' AND n.isactive;
  -- a group with no active node to ask (a disabled worker) cannot say either
  v_unanswered := ARRAY(
    SELECT DISTINCT g.groupid FROM pg_catalog.unnest(v_groups) AS g(groupid)
    WHERE g.groupid <> v_local
      AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_node n
                      WHERE n.groupid = g.groupid AND n.noderole = 'primary' AND n.isactive));
  IF v_names IS NOT NULL THEN
    FOR v_answer IN
      SELECT w.node_name, w.node_port, w.success, w.result
      FROM pg_catalog.master_run_on_worker(v_names, v_ports,
             pg_catalog.array_fill('SELECT coalesce(pg_catalog.string_agg(x.gid, '' ''), '''') '
                                   'FROM pg_catalog.pg_prepared_xacts x '
                                   'WHERE x.database = pg_catalog.current_database()'::text,
                                   ARRAY[pg_catalog.cardinality(v_names)]),
             true) w
    LOOP
      IF v_answer.success THEN
        v_pending := v_pending || pg_catalog.string_to_array(v_answer.result, ' ');
      ELSE
        v_unanswered := v_unanswered || ARRAY(
          SELECT n.groupid FROM pg_catalog.pg_dist_node n
          WHERE n.nodename = v_answer.node_name AND n.nodeport = v_answer.node_port);
      END IF;
    END LOOP;
  END IF;
  SELECT pg_catalog.min(c.xid) INTO v_held
  FROM ROWS FROM (pg_catalog.unnest(v_gids), pg_catalog.unnest(v_groups),
                  pg_catalog.unnest(v_xids)) AS c(gid, groupid, xid)
  WHERE c.gid = ANY (v_pending) OR c.groupid = ANY (v_unanswered);
  RETURN least(v_xmin, v_held);  -- least() passes over a NULL
END $$;
REVOKE ALL ON FUNCTION fabric._projection_horizon(xid8, xid8[]) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_events_v2: the next outbox events a projection has not applied,
-- one row each, in (xid, event_id) order. A pipelined projector reads ahead of its cursor
-- (p_after_xid, p_after_event_id: the last event it has read but not yet applied); the
-- cursor itself moves only when a batch is applied, so a crash replays from there.
DROP FUNCTION IF EXISTS fabric_api.projection_events_v2(text, integer);  -- before read-ahead
CREATE OR REPLACE FUNCTION fabric_api.projection_events_v2(p_projection text,
  p_limit integer DEFAULT 500, p_after_xid xid8 DEFAULT NULL, p_after_event_id uuid DEFAULT NULL)
RETURNS TABLE (xid xid8, event_id uuid, event_type text, tenant_id text, memory_id uuid,
  occurred_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_xid xid8;
  v_event uuid;
  v_horizon xid8;
  v_xids xid8[];
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read the projection feed');
  SELECT c.last_xid, c.last_event_id INTO v_xid, v_event
  FROM fabric._projection_cursor(p_projection) c;
  IF p_after_xid IS NOT NULL AND (p_after_xid, coalesce(p_after_event_id,
       '00000000-0000-0000-0000-000000000000'::uuid)) > (v_xid, v_event) THEN
    v_xid := p_after_xid;  -- read ahead of the cursor
    v_event := coalesce(p_after_event_id, '00000000-0000-0000-0000-000000000000'::uuid);
  END IF;
  v_horizon := pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot());
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- on a cluster also before a transaction whose workers have not committed yet
    -- (fabric._projection_horizon), among those of the events this read would serve: no
    -- event to serve, no worker asked
    SELECT pg_catalog.array_agg(DISTINCT b.xid) INTO v_xids
    FROM (SELECT e.xid FROM fabric.events e
          WHERE (e.xid, e.event_id) > (v_xid, v_event) AND e.xid < v_horizon
            AND e.event_type = ANY (fabric._projected_event_types())
          ORDER BY e.xid, e.event_id
          LIMIT greatest(1, least(coalesce(p_limit, 500), 10000))) b;
    IF v_xids IS NULL THEN
      RETURN;
    END IF;
    v_horizon := least(v_horizon, fabric._projection_horizon(v_xid, v_xids));
  END IF;
  RETURN QUERY
    SELECT e.xid, e.event_id, e.event_type, e.tenant_id::text, e.memory_id, e.occurred_at
    FROM fabric.events e
    WHERE (e.xid, e.event_id) > (v_xid, v_event)
      AND e.xid < v_horizon
      AND e.event_type = ANY (fabric._projected_event_types())
    ORDER BY e.xid, e.event_id
    LIMIT greatest(1, least(coalesce(p_limit, 500), 10000));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.set_projection_cursor: advance (or, for a rebuild, rewind) a cursor.
CREATE OR REPLACE FUNCTION fabric_api.set_projection_cursor(p_projection text, p_xid xid8,
  p_event_id uuid, p_rewind boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'move projection cursors');
  -- the tracer's own cursor is read, never moved from here
  RETURN pg_catalog.jsonb_build_object('projection', p_projection)
    || fabric._set_cursor(p_projection, p_xid, p_event_id, p_rewind,
                          p_projection IS DISTINCT FROM 'trace');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.begin_projection_rebuild: note that a rebuild of the projection begins, before
-- it wipes anything. The rewind of the cursor that ends the rebuild clears the note; a note
-- left behind (a crash, a stopped `memfabric serve`) says the projection may be incomplete,
-- and `memfabric serve` rebuilds it again at start. The cursor itself does not move: a
-- projector running meanwhile goes on from where it was.
CREATE OR REPLACE FUNCTION fabric_api.begin_projection_rebuild(p_projection text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_started timestamptz;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'begin a projection rebuild');
  PERFORM fabric._projection_cursor(p_projection);  -- qdrant or graph, else 22023
  -- a value, not clock_timestamp() in the UPDATE: Citus refuses volatile functions in an
  -- UPDATE of a distributed (here: reference) table
  v_started := pg_catalog.clock_timestamp();
  UPDATE fabric.projection_cursors c SET rebuild_started_at = v_started
  WHERE c.projection = p_projection;
  RETURN pg_catalog.jsonb_build_object('projection', p_projection,
                                       'rebuild_started_at', v_started);
END $$;

-- fabric_api.unfinished_projection_rebuild: when a rebuild of the projection began that has
-- not ended, or NULL.
CREATE OR REPLACE FUNCTION fabric_api.unfinished_projection_rebuild(p_projection text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_started timestamptz;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read projection rebuilds');
  PERFORM fabric._projection_cursor(p_projection);  -- qdrant or graph, else 22023
  SELECT c.rebuild_started_at INTO v_started
  FROM fabric.projection_cursors c WHERE c.projection = p_projection;
  RETURN v_started;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_horizon: the xid below which every transaction has finished (on a
-- cluster: on every node, fabric._projection_horizon); a rebuild reads state after it and
-- rewinds its cursor to just below it.
CREATE OR REPLACE FUNCTION fabric_api.projection_horizon()
RETURNS xid8
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN fabric._projection_horizon('0');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_records_v2: the current state of some records, one row each,
-- tenant by tenant, then by memory_id.
CREATE OR REPLACE FUNCTION fabric_api.projection_records_v2(p_memory_ids uuid[],
  p_model text DEFAULT NULL, p_model_version text DEFAULT NULL)
RETURNS TABLE (memory_id uuid, tenant_id text, tier text, visibility text, scope_type text,
  scope_id text, scope_key text, subject_ref text, agent_id text, session_ref text,
  content_hash text, confidence double precision, valid_from timestamptz,
  valid_until timestamptz, consolidation_state text, retention_class text,
  compliance_labels text[], version text, formation_method text, formed_by text,
  supersedes uuid, recorded_at timestamptz, derived_from uuid[], content jsonb,
  embedding ext.vector, correlation_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT DISTINCT fabric._tenant_of_record(i) t FROM pg_catalog.unnest(p_memory_ids) i
                  WHERE fabric._tenant_of_record(i) IS NOT NULL ORDER BY 1 LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);
    RETURN QUERY SELECT * FROM fabric._projection_rows(v_tenant, coalesce(p_memory_ids, '{}'),
                                                       NULL, NULL, p_model, p_model_version);
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_snapshot_v2: every record, paged by (tenant_id, memory_id), one row
-- each, for rebuilds: the page after (p_after_tenant, p_after_memory), at most p_limit.
CREATE OR REPLACE FUNCTION fabric_api.projection_snapshot_v2(p_after_tenant text,
  p_after_memory uuid, p_limit integer DEFAULT 1000, p_model text DEFAULT NULL,
  p_model_version text DEFAULT NULL)
RETURNS TABLE (memory_id uuid, tenant_id text, tier text, visibility text, scope_type text,
  scope_id text, scope_key text, subject_ref text, agent_id text, session_ref text,
  content_hash text, confidence double precision, valid_from timestamptz,
  valid_until timestamptz, consolidation_state text, retention_class text,
  compliance_labels text[], version text, formation_method text, formed_by text,
  supersedes uuid, recorded_at timestamptz, derived_from uuid[], content jsonb,
  embedding ext.vector, correlation_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_left integer := greatest(1, least(coalesce(p_limit, 1000), 10000));
  v_rows integer;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT t FROM fabric._tenants_with_records() t
                  WHERE p_after_tenant IS NULL OR t >= p_after_tenant ORDER BY t LOOP
    CONTINUE WHEN v_tenant = p_after_tenant AND p_after_memory IS NULL;  -- as in 0.3
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);
    RETURN QUERY SELECT * FROM fabric._projection_rows(v_tenant, NULL,
      CASE WHEN p_after_tenant IS NOT NULL AND v_tenant = p_after_tenant THEN p_after_memory END,
      v_left, p_model, p_model_version);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_left := v_left - v_rows;
    EXIT WHEN v_left <= 0;
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._store_embeddings_rows: store_embeddings for one tenant on a Citus cluster, one
-- record at a time (lock the live record, then INSERT ... VALUES ... ON CONFLICT), in input
-- order. The caller has set the tenant context.
CREATE OR REPLACE FUNCTION fabric._store_embeddings_rows(p_tenant text, p_memory_ids uuid[],
  p_model text, p_model_version text, p_embeddings ext.vector[], p_content_hashes text[],
  p_now timestamptz)
RETURNS TABLE (memory_id uuid, stored boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_in record;
  v_hash text;
  v_live boolean;
BEGIN
  FOR v_in IN
    SELECT u.id, u.embedding, u.content_hash
    FROM ROWS FROM (pg_catalog.unnest(p_memory_ids), pg_catalog.unnest(p_embeddings),
                    pg_catalog.unnest(p_content_hashes)) WITH ORDINALITY AS u(id, embedding, content_hash, ord)
    ORDER BY u.ord
  LOOP
    -- locked, so an erasure racing this call waits or has already won; a record of
    -- another tenant is answered in that tenant's turn (no lookup function here: Citus
    -- refuses a read as another role of shards this transaction has written)
    SELECT m.content_hash, m.consolidation_state <> 'tombstoned' AND m.content IS NOT NULL
      INTO v_hash, v_live
    FROM fabric.memory_records m
    WHERE m.tenant_id = p_tenant AND m.memory_id = v_in.id
    FOR SHARE;
    CONTINUE WHEN NOT FOUND;
    IF v_live AND v_hash = v_in.content_hash THEN
      INSERT INTO fabric.memory_embeddings AS e (tenant_id, memory_id, model, model_version,
                                                 dims, embedding, content_hash)
      VALUES (p_tenant, v_in.id, p_model, p_model_version, ext.vector_dims(v_in.embedding),
              v_in.embedding, v_in.content_hash)
      ON CONFLICT ON CONSTRAINT memory_embeddings_pkey
      DO UPDATE SET embedding = EXCLUDED.embedding, dims = EXCLUDED.dims,
                    content_hash = EXCLUDED.content_hash, created_at = p_now;
      memory_id := v_in.id; stored := true;
    ELSE
      memory_id := v_in.id; stored := false;
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;
REVOKE ALL ON FUNCTION fabric._store_embeddings_rows(text, uuid[], text, text, ext.vector[],
  text[], timestamptz) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric_api.store_embeddings: store_embedding for a batch, embeddings as ext.vector[] (binary
-- with pgvector's client adapter). The same rules: projector only, an unknown record fails
-- the call (P0002) and stores nothing; a tombstoned or content-less record, or one whose
-- content hash differs from the one embedded, stores nothing and answers stored = false
-- (store_embedding raises 55000 for it). One row per input, tenant by tenant, in input order.
CREATE OR REPLACE FUNCTION fabric_api.store_embeddings(p_memory_ids uuid[], p_model text,
  p_model_version text, p_embeddings ext.vector[], p_content_hashes text[])
RETURNS TABLE (memory_id uuid, stored boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_tenant text;
  -- a value, not now() in DO UPDATE SET: Citus takes only immutable functions there
  v_now timestamptz := pg_catalog.now();
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_projector', 'store embeddings');
  IF p_memory_ids IS NULL OR p_embeddings IS NULL OR p_content_hashes IS NULL
     OR p_model IS NULL OR p_model_version IS NULL
     OR pg_catalog.cardinality(p_embeddings) <> pg_catalog.cardinality(p_memory_ids)
     OR pg_catalog.cardinality(p_content_hashes) <> pg_catalog.cardinality(p_memory_ids)
     OR (SELECT count(DISTINCT i) <> pg_catalog.cardinality(p_memory_ids)
         FROM pg_catalog.unnest(p_memory_ids) i) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'store_embeddings takes distinct memory ids with one embedding and one content hash each',
      'three arrays of the same length, no memory id twice, a model and its version');
  END IF;
  IF pg_catalog.cardinality(p_memory_ids) > 10000 THEN
    PERFORM fabric._raise_rule('program_limit_exceeded',
      'store_embeddings takes at most 10000 embeddings', 'split the batch');
  END IF;
  PERFORM fabric._tenant_of_known_record(i) FROM pg_catalog.unnest(p_memory_ids) i;
  FOR v_tenant IN SELECT DISTINCT fabric._tenant_of_record(i) t FROM pg_catalog.unnest(p_memory_ids) i
                  ORDER BY 1 LOOP
    PERFORM fabric._set_context('tenant_id', v_tenant);
    IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
      -- On a Citus cluster one row at a time: the INSERT ... SELECT below joins the input
      -- (values of this node) to a shard, so Citus would stream it into the shard as a COPY,
      -- which the vector type does not survive. Same rules, same answer.
      RETURN QUERY SELECT * FROM fabric._store_embeddings_rows(v_tenant, p_memory_ids,
        p_model, p_model_version, p_embeddings, p_content_hashes, v_now);
      CONTINUE;
    END IF;
    RETURN QUERY
      WITH input AS (
        SELECT u.id, u.embedding, u.content_hash, u.ord
        FROM ROWS FROM (pg_catalog.unnest(p_memory_ids), pg_catalog.unnest(p_embeddings),
                        pg_catalog.unnest(p_content_hashes))
             WITH ORDINALITY AS u(id, embedding, content_hash, ord)
        WHERE fabric._tenant_of_record(u.id) = v_tenant),
      live AS (  -- locked, so an erasure racing this call waits or has already won
        SELECT m.memory_id AS id, m.content_hash FROM fabric.memory_records m
        WHERE m.tenant_id = v_tenant AND m.memory_id IN (SELECT i.id FROM input i)
          AND m.consolidation_state <> 'tombstoned' AND m.content IS NOT NULL
        ORDER BY m.memory_id FOR SHARE),
      written AS (
        INSERT INTO fabric.memory_embeddings AS e (tenant_id, memory_id, model, model_version,
                                                   dims, embedding, content_hash)
        SELECT v_tenant, i.id, p_model, p_model_version, ext.vector_dims(i.embedding),
               i.embedding, i.content_hash
        FROM input i JOIN live l ON l.id = i.id AND l.content_hash = i.content_hash
        ON CONFLICT ON CONSTRAINT memory_embeddings_pkey
        DO UPDATE SET embedding = EXCLUDED.embedding, dims = EXCLUDED.dims,
                      content_hash = EXCLUDED.content_hash, created_at = v_now
        RETURNING e.memory_id AS id)
      SELECT i.id, EXISTS (SELECT 1 FROM written w WHERE w.id = i.id)
      FROM input i ORDER BY i.ord;
  END LOOP;
  PERFORM fabric._set_context('tenant_id', '');
END $$;

COMMENT ON FUNCTION fabric_api.projection_events_v2(text, integer, xid8, uuid) IS
  'Outbox events after the projection''s cursor (and after p_after_xid/p_after_event_id, to '
  'read ahead), below the snapshot xmin, one row each in (xid, event_id) order. Projector only. '
  'Example: SELECT * FROM fabric_api.projection_events_v2(''qdrant'', 500);';
COMMENT ON FUNCTION fabric_api.set_projection_cursor(text, xid8, uuid, boolean) IS
  'Advance a projection cursor (never backwards unless p_rewind). Projector only. '
  'Example: SELECT fabric_api.set_projection_cursor(''qdrant'', ''1234'', ''<event_id>'');';
COMMENT ON FUNCTION fabric_api.begin_projection_rebuild(text) IS
  'Note that a rebuild of a projection begins (before its wipe); the rewind that ends it '
  '(set_projection_cursor with p_rewind) clears the note. Projector only. '
  'Example: SELECT fabric_api.begin_projection_rebuild(''qdrant'');';
COMMENT ON FUNCTION fabric_api.unfinished_projection_rebuild(text) IS
  'When a rebuild of a projection began that has not ended (NULL: none). Projector only. '
  'Example: SELECT fabric_api.unfinished_projection_rebuild(''qdrant'');';
COMMENT ON FUNCTION fabric_api.projection_horizon() IS
  'The current snapshot xmin (for rebuilds). Projector only. Example: SELECT fabric_api.projection_horizon();';
COMMENT ON FUNCTION fabric_api.projection_records_v2(uuid[], text, text) IS
  'Current projection payloads (with content and stored embedding as ext.vector) of records, '
  'one row each, by tenant then memory_id. Projector only. '
  'Example: SELECT * FROM fabric_api.projection_records_v2(ARRAY[''<memory_id>''::uuid], ''all-MiniLM-L6-v2'', ''v1'');';
COMMENT ON FUNCTION fabric_api.projection_snapshot_v2(text, uuid, integer, text, text) IS
  'All records after (tenant, memory_id), one page, one row each, for rebuilds. Projector only. '
  'Example: SELECT * FROM fabric_api.projection_snapshot_v2(NULL, NULL, 1000);';
COMMENT ON FUNCTION fabric_api.store_embeddings(uuid[], text, text, ext.vector[], text[]) IS
  'Store a batch of embeddings (ext.vector[]); a tombstoned, content-less or re-hashed record '
  'answers stored = false. Projector only. Example: SELECT * FROM fabric_api.store_embeddings('
  'ARRAY[''<memory_id>''::uuid], ''all-MiniLM-L6-v2'', ''v1'', ARRAY[''[...]''::ext.vector], ARRAY[''sha256:...'']);';

-- ---------------------------------------------------------------------------------------
-- fabric_api.deployment_embedder: the deployment's embedder settings (read by Python,
-- never re-validated there).
CREATE OR REPLACE FUNCTION fabric_api.deployment_embedder()
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.jsonb_build_object('embedder', s.embedder, 'url', s.embedder_url,
                                           'model', s.embedder_model)
      FROM fabric.deployment_settings s $$;
COMMENT ON FUNCTION fabric_api.deployment_embedder() IS
  'The deployment''s embedder (minilm, minilm-static, e5 or an OpenAI-compatible http endpoint). '
  'Example: SELECT fabric_api.deployment_embedder();';

-- ---------------------------------------------------------------------------------------
-- fabric_api.configure_deployment: the deployment-wide settings (embedder, text search,
-- recall limits). Changing the embedder means new collections and a cutover (rebuild).
CREATE OR REPLACE FUNCTION fabric_api.configure_deployment(p_settings jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v fabric.deployment_settings;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_admin', 'configure the deployment');
  IF p_settings IS NULL OR pg_catalog.jsonb_typeof(p_settings) <> 'object'
     OR p_settings ? 'singleton'
     OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_settings) k
                WHERE k NOT IN ('text_search_config', 'recall_default_limit', 'recall_max_limit',
                                'recall_lexical_bound', 'recall_lexical_top', 'embedder',
                                'embedder_url', 'embedder_model')) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'deployment settings are text_search_config, recall_default_limit, '
      'recall_max_limit, recall_lexical_bound, recall_lexical_top, embedder, embedder_url, '
      'embedder_model',
      'e.g. {"embedder": "http", "embedder_url": "http://127.0.0.1:8080", "embedder_model": "bge-small"}');
  END IF;
  SELECT * INTO v FROM fabric.deployment_settings FOR UPDATE;
  BEGIN
    v := pg_catalog.jsonb_populate_record(v, p_settings);
  EXCEPTION WHEN data_exception OR undefined_object THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a deployment setting has the wrong type', 'limits are integers');
  END;
  UPDATE fabric.deployment_settings d
  SET text_search_config = v.text_search_config, recall_default_limit = v.recall_default_limit,
      recall_max_limit = v.recall_max_limit, recall_lexical_bound = v.recall_lexical_bound,
      recall_lexical_top = v.recall_lexical_top, embedder = v.embedder,
      embedder_url = v.embedder_url, embedder_model = v.embedder_model
  WHERE d.singleton;
  RETURN pg_catalog.to_jsonb(v) - 'singleton';
END $$;
COMMENT ON FUNCTION fabric_api.configure_deployment(jsonb) IS
  'Set deployment-wide settings (embedder, text search config, recall limits). Admin only. '
  'Example: SELECT fabric_api.configure_deployment(''{"recall_max_limit": 200}'');';
