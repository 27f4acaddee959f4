-- Procedures replayed as they were: an agent replaying a run needs the version of a
-- procedure that was current at the time the run happened, not today's. Recall serves only
-- live records; this door serves one procedure's supersession chain at a valid time,
-- within the same run, tool authorization and recall scope, and is audited as a recall.

-- ---------------------------------------------------------------------------------------
-- fabric_api.recall_procedure_as_of: the version of the procedure p_request.memory_id
-- belongs to (any version of its supersession chain) whose validity interval contains
-- p_request.valid_at. Superseded and expired versions are served while their content is
-- kept; a tombstoned (erased) version never. Answers like recall: status, records (none or
-- one), scope_applied; one memory.recall.served or memory.recall.denied event.
CREATE OR REPLACE FUNCTION fabric_api.recall_procedure_as_of(p_request jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_checked text;
  v_run fabric.runs;
  v_profile jsonb;
  v_missing text[];
  v_resolved jsonb;
  v_reason text;
  v_keys text[];
  v_memory_id uuid;
  v_valid_at timestamptz;
  v_scope_request jsonb;
  v_records jsonb;
  v_served constant jsonb := '{"mode_served": "as_of", "tiers_served_lexically": []}';
  v_chain uuid[];
  v_id uuid;
  v_next uuid;
  v_record fabric.memory_records;
  v_derived jsonb;
BEGIN
  v_checked := fabric._reset_context();
  IF pg_catalog.jsonb_typeof(p_request) IS DISTINCT FROM 'object'
     OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_request) k
                WHERE k NOT IN ('run_id', 'memory_id', 'valid_at', 'scope', 'correlation_id',
                                'causation_id', 'traceparent')) THEN
    PERFORM fabric._bad_envelope(
      'a procedure request is an object of run_id, memory_id, valid_at and optionally scope, '
      'correlation_id, causation_id, traceparent',
      'example: {"run_id": "<run_id>", "memory_id": "<any version>", "valid_at": "2026-08-16T10:00:00Z"}');
  END IF;
  IF pg_catalog.jsonb_typeof(p_request -> 'run_id') IS DISTINCT FROM 'string'
     OR (p_request ->> 'run_id') !~* '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$' THEN
    PERFORM fabric._bad_envelope('run_id must be the UUID of your open run',
                                 'the orchestrator opens a run with fabric_api.open_run');
  END IF;
  IF pg_catalog.jsonb_typeof(p_request -> 'memory_id') IS DISTINCT FROM 'string'
     OR (p_request ->> 'memory_id') !~* '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$' THEN
    PERFORM fabric._bad_envelope('memory_id must be the UUID of a version of the procedure',
                                 'any version of the supersession chain names the procedure');
  END IF;
  IF NOT p_request ? 'valid_at' THEN
    PERFORM fabric._bad_envelope('valid_at is required',
                                 'the time whose current version the replay needs');
  END IF;
  IF p_request ? 'correlation_id' THEN
    v_checked := fabric._envelope_text(p_request -> 'correlation_id', 'correlation_id');
  END IF;
  IF p_request ? 'causation_id' THEN
    v_checked := fabric._envelope_text(p_request -> 'causation_id', 'causation_id');
  END IF;
  v_valid_at := fabric._envelope_timestamp(p_request -> 'valid_at', 'valid_at');
  v_memory_id := (p_request ->> 'memory_id')::uuid;

  v_run := fabric._enter_run((p_request ->> 'run_id')::uuid);
  SELECT a.memory_profile INTO v_profile FROM fabric.agents a WHERE a.agent_id = v_run.agent_id;

  -- 1. Tool authorization, three layers: this is a recall.
  v_missing := fabric._tool_denial(v_run, 'tool:memory-recall');
  IF pg_catalog.cardinality(v_missing) > 0 THEN
    v_reason := 'tool:memory-recall is not authorized: missing from '
                || pg_catalog.array_to_string(v_missing, ', ');
    PERFORM fabric._emit('agent.tool.unauthorized', v_run.tenant_id, p_payload =>
      pg_catalog.jsonb_build_object('tool', 'tool:memory-recall', 'agent_id', v_run.agent_id,
                                    'missing_layers', v_missing));
    RETURN fabric._recall_answer(v_run, p_request, 'denied', v_reason, NULL, '[]', false, v_served);
  END IF;

  -- 2. Scope before retrieval (os-agt-012), for the procedural tier only.
  v_scope_request := pg_catalog.jsonb_build_object('tiers', '["procedural"]'::jsonb)
                     || CASE WHEN p_request ? 'scope'
                             THEN pg_catalog.jsonb_build_object('scope', p_request -> 'scope')
                             ELSE '{}' END;
  v_resolved := fabric.resolve_recall_scope(v_profile, v_run, v_scope_request);
  v_reason := v_resolved ->> 'denied_reason';
  IF v_reason IS NULL AND pg_catalog.jsonb_array_length(v_resolved -> 'tiers') = 0 THEN
    v_reason := 'tier procedural is outside the agent''s memory_profile.recall_scope.tiers';
  END IF;
  IF v_reason IS NOT NULL THEN
    RETURN fabric._recall_answer(v_run, p_request, 'denied', v_reason, v_resolved, '[]', false,
                                 v_served);
  END IF;
  v_keys := JSON_QUERY(v_resolved -> 'scope_keys', '$' RETURNING text[]);

  -- 3. The chain, both ways along supersedes, inside the run's tenant; every version is
  -- checked against the resolved scope, so a version the agent may not read is never
  -- served, and a chain the agent cannot see answers nothing.
  -- (the chain is a line: a record is superseded at most once; its ancestors are found by
  -- primary key, its descendants by memory_records_by_supersedes)
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus plans no recursive CTE over a distributed table here, and a helper called in a
    -- query on a shard gets the shard's row: the chain is walked one version per statement,
    -- and each version read by itself into a row of the table.
    SELECT m.memory_id, m.supersedes INTO v_id, v_next FROM fabric.memory_records m
     WHERE m.tenant_id = v_run.tenant_id AND m.memory_id = v_memory_id
       AND m.tier = 'procedural' AND m.scope_key = ANY (v_keys);
    v_chain := CASE WHEN v_id IS NULL THEN '{}' ELSE ARRAY[v_id] END;
    WHILE v_next IS NOT NULL AND v_id IS NOT NULL LOOP   -- older versions
      SELECT m.memory_id, m.supersedes INTO v_id, v_next FROM fabric.memory_records m
       WHERE m.tenant_id = v_run.tenant_id AND m.memory_id = v_next AND m.tier = 'procedural';
      EXIT WHEN v_id IS NULL OR v_id = ANY (v_chain);
      v_chain := v_chain || v_id;
    END LOOP;
    v_id := CASE WHEN pg_catalog.cardinality(v_chain) > 0 THEN v_memory_id END;
    WHILE v_id IS NOT NULL LOOP   -- newer versions
      v_next := v_id;
      v_id := NULL;
      SELECT m.memory_id INTO v_id FROM fabric.memory_records m
       WHERE m.tenant_id = v_run.tenant_id AND m.supersedes = v_next AND m.tier = 'procedural'
       LIMIT 1;
      EXIT WHEN v_id IS NULL OR v_id = ANY (v_chain);
      v_chain := v_chain || v_id;
    END LOOP;
    v_records := '[]';
    FOR v_record IN
      SELECT m.* FROM fabric.memory_records m
       WHERE m.tenant_id = v_run.tenant_id AND m.memory_id = ANY (v_chain)
         AND m.scope_key = ANY (v_keys)
         AND m.consolidation_state <> 'tombstoned'
         AND m.content IS NOT NULL
         AND m.valid_from <= v_valid_at
         AND (m.valid_until IS NULL OR m.valid_until > v_valid_at)
    LOOP
      SELECT coalesce(pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id), '[]')
        INTO v_derived
        FROM fabric.memory_lineage l
       WHERE l.tenant_id = v_run.tenant_id AND l.memory_id = v_record.memory_id;
      v_records := v_records || pg_catalog.jsonb_build_array(fabric._record_envelope(v_record, v_derived));
    END LOOP;
    RETURN fabric._recall_answer(v_run, p_request, 'served', NULL, v_resolved, v_records, false,
                                 v_served);
  END IF;
  WITH RECURSIVE start AS (
    SELECT m.memory_id, m.supersedes FROM fabric.memory_records m
     WHERE m.tenant_id = v_run.tenant_id AND m.memory_id = v_memory_id
       AND m.tier = 'procedural' AND m.scope_key = ANY (v_keys)
  ), older(memory_id, supersedes) AS (
    SELECT s.memory_id, s.supersedes FROM start s
    UNION
    SELECT m.memory_id, m.supersedes FROM older o
      JOIN fabric.memory_records m ON m.tenant_id = v_run.tenant_id AND m.memory_id = o.supersedes
     WHERE m.tier = 'procedural'
  ), newer(memory_id) AS (
    SELECT s.memory_id FROM start s
    UNION
    SELECT m.memory_id FROM newer n
      JOIN fabric.memory_records m ON m.tenant_id = v_run.tenant_id AND m.supersedes = n.memory_id
     WHERE m.tier = 'procedural'
  ), chain(memory_id) AS (
    SELECT o.memory_id FROM older o UNION SELECT n.memory_id FROM newer n
  )
  SELECT coalesce(pg_catalog.jsonb_agg(fabric._record_envelope(m, d.derived_from)), '[]')
    INTO v_records
    FROM chain c
    JOIN fabric.memory_records m ON m.tenant_id = v_run.tenant_id AND m.memory_id = c.memory_id
    CROSS JOIN LATERAL (
      SELECT coalesce(pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id),
                      '[]') AS derived_from
        FROM fabric.memory_lineage l
       WHERE l.tenant_id = m.tenant_id AND l.memory_id = m.memory_id) d
   WHERE m.scope_key = ANY (v_keys)
     AND m.consolidation_state <> 'tombstoned'
     AND m.content IS NOT NULL
     AND m.valid_from <= v_valid_at
     AND (m.valid_until IS NULL OR m.valid_until > v_valid_at);

  RETURN fabric._recall_answer(v_run, p_request, 'served', NULL, v_resolved, v_records, false,
                               v_served);
END $$;
COMMENT ON FUNCTION fabric_api.recall_procedure_as_of(jsonb) IS
  'The version of a procedure current at valid_at, to replay a run against it (docs/sql.md, '
  'Procedures as they were): inside your open run, recall-authorized, scoped, audited. Example: '
  'SELECT fabric_api.recall_procedure_as_of(''{"run_id": "<run_id>", "memory_id": "<any version>", '
  '"valid_at": "2026-08-16T10:00:00Z"}'');';
