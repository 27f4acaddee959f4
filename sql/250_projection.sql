-- Projection feed: the projector (fabric_projector) reads the outbox after its cursor and
-- below the snapshot's xmin -- so a slow transaction's events are never skipped -- and
-- hydrates committed state from Postgres. Qdrant and Neo4j are rebuilt from here alone.

-- ---------------------------------------------------------------------------------------
-- fabric._record_projection: one record as the projections see it (the vector payload,
-- lineage, content for embedding, and the stored embedding of the deployment's model).
CREATE OR REPLACE FUNCTION fabric._record_projection(p_record fabric.memory_records,
  p_model text DEFAULT NULL, p_model_version text DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.jsonb_build_object(
    'memory_id', p_record.memory_id, 'tenant_id', p_record.tenant_id, 'tier', p_record.tier,
    'visibility', p_record.visibility, 'scope_type', p_record.visibility,
    'scope_id', CASE p_record.visibility WHEN 'session' THEN p_record.session_id
                  WHEN 'agent' THEN p_record.agent_id WHEN 'subject' THEN p_record.subject_id
                  ELSE p_record.tenant_id END,
    'scope_key', p_record.scope_key, 'subject_id', p_record.subject_id,
    'agent_id', p_record.agent_id, 'session_id', p_record.session_id,
    'content_hash', p_record.content_hash, 'confidence', p_record.confidence,
    'valid_from', p_record.valid_from, 'valid_until', p_record.valid_until,
    'consolidation_state', p_record.consolidation_state,
    'retention_class', p_record.retention_class,
    'compliance_labels', pg_catalog.to_jsonb(p_record.compliance_labels),
    'version', p_record.version, 'formation_method', p_record.formation_method,
    'formed_by', p_record.formed_by, 'supersedes', p_record.supersedes,
    'recorded_at', p_record.recorded_at,
    'derived_from', coalesce((SELECT pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id)
                              FROM fabric.memory_lineage l
                              WHERE l.tenant_id = p_record.tenant_id
                                AND l.memory_id = p_record.memory_id), '[]'),
    'content', p_record.content,
    'embedding', (SELECT e.embedding::text::jsonb FROM fabric.memory_embeddings e
                  WHERE e.tenant_id = p_record.tenant_id AND e.memory_id = p_record.memory_id
                    AND e.model = p_model AND e.model_version = p_model_version
                    AND e.content_hash = p_record.content_hash))
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_events: the next outbox events a projection has not applied.
CREATE OR REPLACE FUNCTION fabric_api.projection_events(p_projection text, p_limit integer DEFAULT 500)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_cursor fabric.projection_cursors;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read the projection feed');
  SELECT * INTO v_cursor FROM fabric.projection_cursors c
  WHERE c.projection = p_projection AND c.projection <> 'trace';
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'projection must be qdrant or graph', HINT = 'one cursor per projection';
  END IF;
  RETURN (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
            'xid', e.xid::text, 'event_id', e.event_id, 'event_type', e.event_type,
            'tenant_id', e.tenant_id, 'memory_id', e.memory_id, 'occurred_at', e.occurred_at)
            ORDER BY e.xid, e.event_id), '[]')
          FROM (SELECT * FROM fabric.events e
                WHERE (e.xid, e.event_id) > (v_cursor.last_xid, v_cursor.last_event_id)
                  AND e.xid < pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())
                  AND e.event_type = ANY (fabric._projected_event_types())
                ORDER BY e.xid, e.event_id
                LIMIT greatest(1, least(coalesce(p_limit, 500), 10000))) e);
END $$;
COMMENT ON FUNCTION fabric_api.projection_events(text, integer) IS
  'Outbox events after the projection''s cursor, below the snapshot xmin. Projector only. '
  'Example: SELECT fabric_api.projection_events(''qdrant'', 500);';

-- ---------------------------------------------------------------------------------------
-- fabric_api.set_projection_cursor: advance (or, for a rebuild, rewind) a cursor.
CREATE OR REPLACE FUNCTION fabric_api.set_projection_cursor(p_projection text, p_xid xid8,
  p_event_id uuid, p_rewind boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v fabric.projection_cursors;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'move projection cursors');
  UPDATE fabric.projection_cursors c
  SET last_xid = p_xid, last_event_id = p_event_id, updated_at = pg_catalog.now()
  WHERE c.projection = p_projection AND c.projection <> 'trace'  -- the tracer's own cursor
    AND (p_rewind OR (c.last_xid, c.last_event_id) < (p_xid, p_event_id))
  RETURNING * INTO v;
  IF NOT FOUND THEN
    SELECT * INTO v FROM fabric.projection_cursors c WHERE c.projection = p_projection;
  END IF;
  RETURN pg_catalog.jsonb_build_object('projection', p_projection, 'xid', v.last_xid::text,
                                       'event_id', v.last_event_id);
END $$;
COMMENT ON FUNCTION fabric_api.set_projection_cursor(text, xid8, uuid, boolean) IS
  'Advance a projection cursor (never backwards unless p_rewind). Projector only. '
  'Example: SELECT fabric_api.set_projection_cursor(''qdrant'', ''1234'', ''<event_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_horizon: the xid below which every transaction has finished; a
-- rebuild reads state after it and rewinds its cursor to just below it.
CREATE OR REPLACE FUNCTION fabric_api.projection_horizon()
RETURNS xid8
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()) $$;
COMMENT ON FUNCTION fabric_api.projection_horizon() IS
  'The current snapshot xmin (for rebuilds). Projector only. Example: SELECT fabric_api.projection_horizon();';

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_records: the current state of some records, tenant by tenant.
CREATE OR REPLACE FUNCTION fabric_api.projection_records(p_memory_ids uuid[],
  p_model text DEFAULT NULL, p_model_version text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_out jsonb := '[]';
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT DISTINCT fabric._tenant_of_record(i) t FROM pg_catalog.unnest(p_memory_ids) i
                  WHERE fabric._tenant_of_record(i) IS NOT NULL ORDER BY 1 LOOP
    PERFORM pg_catalog.set_config('fabric.tenant_id', v_tenant, true);
    v_out := v_out || coalesce((SELECT pg_catalog.jsonb_agg(fabric._record_projection(m, p_model, p_model_version)
                                                            ORDER BY m.memory_id)
                                FROM fabric.memory_records m
                                WHERE m.tenant_id = v_tenant AND m.memory_id = ANY (p_memory_ids)), '[]');
  END LOOP;
  PERFORM pg_catalog.set_config('fabric.tenant_id', '', true);
  RETURN v_out;
END $$;
COMMENT ON FUNCTION fabric_api.projection_records(uuid[], text, text) IS
  'Current projection payloads (with content and stored embedding) of records. Projector only. '
  'Example: SELECT fabric_api.projection_records(ARRAY[''<memory_id>''::uuid], ''all-MiniLM-L6-v2'', ''v1'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_snapshot: every record, paged by (tenant_id, memory_id), for rebuilds.
CREATE OR REPLACE FUNCTION fabric_api.projection_snapshot(p_after_tenant text, p_after_memory uuid,
  p_limit integer DEFAULT 1000, p_model text DEFAULT NULL, p_model_version text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_out jsonb := '[]';
  v_left integer := greatest(1, least(coalesce(p_limit, 1000), 10000));
  v_page jsonb;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT t FROM fabric._tenants_with_records() t
                  WHERE p_after_tenant IS NULL OR t >= p_after_tenant ORDER BY t LOOP
    PERFORM pg_catalog.set_config('fabric.tenant_id', v_tenant, true);
    SELECT coalesce(pg_catalog.jsonb_agg(fabric._record_projection(m, p_model, p_model_version)
                                         ORDER BY m.memory_id), '[]')
    INTO v_page
    FROM (SELECT * FROM fabric.memory_records m
          WHERE m.tenant_id = v_tenant
            AND (p_after_tenant IS NULL OR v_tenant > p_after_tenant OR m.memory_id > p_after_memory)
          ORDER BY m.memory_id LIMIT v_left) m;
    v_out := v_out || v_page;
    v_left := v_left - pg_catalog.jsonb_array_length(v_page);
    EXIT WHEN v_left <= 0;
  END LOOP;
  PERFORM pg_catalog.set_config('fabric.tenant_id', '', true);
  RETURN v_out;
END $$;
COMMENT ON FUNCTION fabric_api.projection_snapshot(text, uuid, integer, text, text) IS
  'All records after (tenant, memory_id), one page, for rebuilds. Projector only. '
  'Example: SELECT fabric_api.projection_snapshot(NULL, NULL, 1000);';

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
  'The deployment''s embedder (minilm or an OpenAI-compatible http endpoint). '
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
                                'recall_lexical_bound', 'embedder', 'embedder_url',
                                'embedder_model')) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'deployment settings are text_search_config, recall_default_limit, '
                'recall_max_limit, recall_lexical_bound, embedder, embedder_url, embedder_model',
      HINT = 'e.g. {"embedder": "http", "embedder_url": "http://127.0.0.1:8080", "embedder_model": "bge-small"}';
  END IF;
  SELECT * INTO v FROM fabric.deployment_settings FOR UPDATE;
  BEGIN
    v := pg_catalog.jsonb_populate_record(v, p_settings);
  EXCEPTION WHEN data_exception OR undefined_object THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'a deployment setting has the wrong type', HINT = 'limits are integers';
  END;
  UPDATE fabric.deployment_settings d
  SET text_search_config = v.text_search_config, recall_default_limit = v.recall_default_limit,
      recall_max_limit = v.recall_max_limit, recall_lexical_bound = v.recall_lexical_bound,
      embedder = v.embedder,
      embedder_url = v.embedder_url, embedder_model = v.embedder_model
  WHERE d.singleton;
  RETURN pg_catalog.to_jsonb(v) - 'singleton';
END $$;
COMMENT ON FUNCTION fabric_api.configure_deployment(jsonb) IS
  'Set deployment-wide settings (embedder, text search config, recall limits). Admin only. '
  'Example: SELECT fabric_api.configure_deployment(''{"recall_max_limit": 200}'');';
