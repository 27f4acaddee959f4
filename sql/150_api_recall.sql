-- Recall: an authorized tool call whose scope is resolved (os-agt-012) and pushed into the
-- store query before retrieval. Every recall -- served, partial or denied -- leaves exactly
-- one audit event with identifiers, never content.

-- ---------------------------------------------------------------------------------------
-- fabric.resolve_recall_scope: the os-agt-012 path. Intersects the request with the run
-- and with memory_profile.recall_scope; returns the resolved scope, the scope keys to
-- push down, the tiers served and denied, and a reason when the request must be denied.
CREATE OR REPLACE FUNCTION fabric.resolve_recall_scope(p_profile jsonb, p_run fabric.runs,
                                                       p_request jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_scope jsonb := coalesce(p_request -> 'scope', '{}');
  v_profile_tiers text[] := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                              coalesce(p_profile #> '{recall_scope,tiers}', '[]')));
  v_profile_vis text[] := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                            coalesce(p_profile #> '{recall_scope,visibility}', '[]')));
  v_tiers text[];
  v_vis text[];
  v_served_vis text[] := '{}';
  v_keys text[] := '{}';
  v_level text;
  v_reason text;
BEGIN
  v_tiers := CASE WHEN p_request ? 'tiers'
                  THEN ARRAY(SELECT DISTINCT pg_catalog.jsonb_array_elements_text(p_request -> 'tiers'))
                  ELSE v_profile_tiers END;
  v_vis := CASE
    WHEN pg_catalog.jsonb_typeof(v_scope -> 'visibility') = 'string' THEN ARRAY[v_scope ->> 'visibility']
    WHEN pg_catalog.jsonb_typeof(v_scope -> 'visibility') = 'array'
      THEN ARRAY(SELECT DISTINCT pg_catalog.jsonb_array_elements_text(v_scope -> 'visibility'))
    ELSE v_profile_vis END;

  v_reason := CASE
    WHEN v_scope ->> 'tenant_id' IS DISTINCT FROM p_run.tenant_id AND v_scope ? 'tenant_id' THEN
      'scope.tenant_id is not the tenant of the run: there is no cross-tenant recall'
    WHEN v_scope ? 'subject_id' AND v_scope ->> 'subject_id' IS DISTINCT FROM p_run.subject_id THEN
      'scope.subject_id is not the subject of the run: a request can only narrow the run''s scope'
    WHEN v_scope ? 'session_id' AND v_scope ->> 'session_id' IS DISTINCT FROM p_run.session_id THEN
      'scope.session_id is not the session of the run: a request can only narrow the run''s scope'
    WHEN v_scope ? 'agent_id' AND v_scope ->> 'agent_id' IS DISTINCT FROM p_run.agent_id THEN
      'scope.agent_id is not the calling agent'
    WHEN p_request ? 'requesting_agent' AND p_request ->> 'requesting_agent' IS DISTINCT FROM p_run.agent_id THEN
      'requesting_agent is not the calling agent'
    WHEN EXISTS (SELECT 1 FROM pg_catalog.unnest(v_vis) x WHERE NOT x = ANY (v_profile_vis)) THEN
      'visibility ' || (SELECT pg_catalog.string_agg(x, ', ' ORDER BY x) FROM pg_catalog.unnest(v_vis) x
                        WHERE NOT x = ANY (v_profile_vis))
      || ' is outside the agent''s memory_profile.recall_scope.visibility'
  END;

  FOREACH v_level IN ARRAY v_vis LOOP
    CONTINUE WHEN v_level = 'session' AND p_run.session_id IS NULL;
    CONTINUE WHEN v_level = 'subject' AND p_run.subject_id IS NULL;
    v_served_vis := v_served_vis || v_level;
    v_keys := v_keys || CASE v_level
      WHEN 'session' THEN 'session:' || p_run.session_id
      WHEN 'agent' THEN 'agent:' || p_run.agent_id
      WHEN 'subject' THEN 'subject:' || p_run.subject_id
      WHEN 'tenant' THEN 'tenant' END;
  END LOOP;

  RETURN pg_catalog.jsonb_build_object(
    'scope_applied', pg_catalog.jsonb_build_object(
      'tenant_id', p_run.tenant_id, 'subject_id', p_run.subject_id,
      'session_id', p_run.session_id, 'agent_id', p_run.agent_id,
      'visibility', pg_catalog.to_jsonb(ARRAY(SELECT x FROM pg_catalog.unnest(v_served_vis) x ORDER BY x))),
    'scope_keys', pg_catalog.to_jsonb(v_keys),
    'tiers_requested', pg_catalog.to_jsonb(ARRAY(SELECT x FROM pg_catalog.unnest(v_tiers) x ORDER BY x)),
    'tiers', pg_catalog.to_jsonb(ARRAY(SELECT x FROM pg_catalog.unnest(v_tiers) x
                                       WHERE x = ANY (v_profile_tiers) ORDER BY x)),
    'tiers_denied', pg_catalog.to_jsonb(ARRAY(SELECT x FROM pg_catalog.unnest(v_tiers) x
                                              WHERE NOT x = ANY (v_profile_tiers) ORDER BY x)),
    'denied_reason', v_reason);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_candidates: the one retrieval query. Owned by fabric_retriever (BYPASSRLS,
-- owns nothing else) so full-text matching can use its GIN index; tenant, scope keys,
-- tiers, validity, confidence and label exclusions are explicit predicates of the query,
-- never applied after fetching. One statement, one snapshot: retrieval and hydration agree.
SET LOCAL ROLE fabric_retriever;
CREATE OR REPLACE FUNCTION fabric._recall_candidates(
  p_tenant_id text,
  p_scope_keys text[],
  p_tiers text[],
  p_valid_at timestamptz,
  p_min_confidence double precision,
  p_excluded_labels text[],
  p_query text,
  p_candidate_ids uuid[],
  p_candidate_scores double precision[],
  p_limit integer
)
RETURNS TABLE (memory_id uuid, score double precision, record jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
  v_tsq tsquery := CASE WHEN p_query IS NOT NULL AND p_candidate_ids IS NULL
                        THEN pg_catalog.websearch_to_tsquery(fabric._text_search_config(), p_query) END;
BEGIN
  IF p_tenant_id IS NULL OR p_scope_keys IS NULL OR p_tiers IS NULL THEN
    RETURN;                                   -- an unresolved scope matches nothing
  END IF;
  RETURN QUERY
    SELECT m.memory_id,
           CASE WHEN p_candidate_ids IS NOT NULL THEN c.score
                WHEN v_tsq IS NOT NULL THEN pg_catalog.ts_rank(m.search_tsv, v_tsq)::double precision
           END AS score,
           fabric._record_json(m)
    FROM fabric.memory_records m
    LEFT JOIN (SELECT u.id, pg_catalog.max(u.score) AS score
               FROM unnest(p_candidate_ids, p_candidate_scores) AS u(id, score)  -- ROWS FROM form
               GROUP BY u.id) c ON c.id = m.memory_id
    WHERE m.tenant_id = p_tenant_id
      AND m.scope_key = ANY (p_scope_keys)
      AND m.tier = ANY (p_tiers)
      AND m.consolidation_state IN ('raw', 'consolidated', 'reflected')
      AND m.content IS NOT NULL
      AND m.valid_from <= p_valid_at
      AND (m.valid_until IS NULL OR m.valid_until > p_valid_at)
      AND m.confidence >= p_min_confidence
      AND NOT (m.compliance_labels && p_excluded_labels)
      AND (v_tsq IS NULL OR m.search_tsv @@ v_tsq)
      AND (p_candidate_ids IS NULL OR m.memory_id = ANY (p_candidate_ids))
    ORDER BY 2 DESC NULLS LAST, m.confidence DESC, m.valid_from DESC, m.recorded_at DESC,
             m.memory_id
    LIMIT p_limit;
END $$;
REVOKE ALL ON FUNCTION fabric._recall_candidates(text, text[], text[], timestamptz,
  double precision, text[], text, uuid[], double precision[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._recall_candidates(text, text[], text[], timestamptz,
  double precision, text[], text, uuid[], double precision[], integer) TO fabric_owner;
SET LOCAL ROLE fabric_owner;
GRANT SELECT ON fabric.memory_records, fabric.memory_lineage, fabric.deployment_settings
  TO fabric_retriever;
GRANT EXECUTE ON FUNCTION fabric._record_json(fabric.memory_records),
  fabric._text_search_config() TO fabric_retriever;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_answer: the response and its one audit event (identifiers, never content).
CREATE OR REPLACE FUNCTION fabric._recall_answer(
  p_tenant_id text, p_request jsonb, p_status text, p_reason text, p_resolved jsonb,
  p_records jsonb, p_truncated boolean)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_ids jsonb := coalesce((SELECT pg_catalog.jsonb_agg(r -> 'memory_id')
                           FROM pg_catalog.jsonb_array_elements(p_records) r), '[]');
BEGIN
  PERFORM fabric._emit(
    CASE WHEN p_status = 'denied' THEN 'memory.recall.denied' ELSE 'memory.recall.served' END,
    p_tenant_id,
    CASE WHEN pg_catalog.jsonb_typeof(p_request -> 'correlation_id') = 'string'
         THEN pg_catalog.left(p_request ->> 'correlation_id', 200) END,
    CASE WHEN pg_catalog.jsonb_typeof(p_request -> 'causation_id') = 'string'
         THEN pg_catalog.left(p_request ->> 'causation_id', 200) END,
    NULL, NULL,
    pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
      'status', p_status, 'reason', p_reason,
      'agent_id', fabric._setting('fabric.actor'),
      'tiers_requested', p_resolved -> 'tiers_requested',
      'tiers_served', CASE WHEN p_status <> 'denied' THEN p_resolved -> 'tiers' END,
      'tiers_denied', p_resolved -> 'tiers_denied',
      'scope', p_resolved -> 'scope_applied',
      'request_hash', 'sha256:' || pg_catalog.encode(pg_catalog.sha256(
                        pg_catalog.convert_to(p_request::text, 'UTF8')), 'hex'),
      'memory_ids', v_ids,
      'truncated', p_truncated, 'traceparent', p_request -> 'traceparent',
      'duration_ms', pg_catalog.round(EXTRACT(epoch FROM
        pg_catalog.clock_timestamp() - pg_catalog.statement_timestamp()) * 1000, 3))));
  RETURN pg_catalog.jsonb_build_object(
    'correlation_id', p_request -> 'correlation_id',
    'status', p_status,
    'reason', p_reason,
    'records', p_records,
    'truncated', p_truncated,
    'scope_applied', p_resolved -> 'scope_applied',
    'tiers_denied', coalesce(p_resolved -> 'tiers_denied', '[]'));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_request_problem: NULL if the request is well formed, else why (22023).
CREATE OR REPLACE FUNCTION fabric._recall_request_problem(p_request jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE
    WHEN p_request IS NULL OR pg_catalog.jsonb_typeof(p_request) <> 'object' THEN
      'the recall request must be a JSON object'
    WHEN EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_request) k
                 WHERE k NOT IN ('run_id', 'correlation_id', 'causation_id', 'requesting_agent',
                                 'tiers', 'scope', 'query', 'filters', 'limit', 'allow_partial',
                                 'candidates', 'mode', 'traceparent')) THEN
      'the recall request has keys outside spec section 6.2 (plus run_id, allow_partial, mode, candidates, traceparent)'
    WHEN fabric._traceparent_problem(p_request -> 'traceparent') IS NOT NULL THEN
      fabric._traceparent_problem(p_request -> 'traceparent')
    WHEN p_request ? 'mode' AND (p_request ->> 'mode') NOT IN ('text', 'semantic', 'hybrid') THEN
      'mode must be text, semantic or hybrid'
    WHEN (p_request ->> 'mode') IN ('semantic', 'hybrid') AND pg_catalog.jsonb_typeof(p_request -> 'query') IS DISTINCT FROM 'string' THEN
      'semantic and hybrid recall need a query'
    WHEN pg_catalog.jsonb_typeof(p_request -> 'run_id') IS DISTINCT FROM 'string'
      OR (p_request ->> 'run_id') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
      'run_id is required and must be the UUID of your open run'
    WHEN p_request ? 'tiers' AND (pg_catalog.jsonb_typeof(p_request -> 'tiers') <> 'array'
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request -> 'tiers') t
                 WHERE pg_catalog.jsonb_typeof(t) <> 'string'
                    OR (t #>> '{}') NOT IN ('episodic', 'semantic', 'procedural', 'profile', 'relational'))) THEN
      'tiers must be an array of episodic, semantic, procedural, profile, relational'
    WHEN p_request ? 'scope' AND (pg_catalog.jsonb_typeof(p_request -> 'scope') <> 'object'
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_each(p_request -> 'scope') e
                 WHERE e.key NOT IN ('tenant_id', 'subject_id', 'session_id', 'agent_id', 'visibility')
                    OR (e.key <> 'visibility' AND pg_catalog.jsonb_typeof(e.value) NOT IN ('string', 'null')))
      OR (pg_catalog.jsonb_typeof(p_request #> '{scope,visibility}') = 'string'
          AND (p_request #>> '{scope,visibility}') NOT IN ('session', 'agent', 'subject', 'tenant'))
      OR (pg_catalog.jsonb_typeof(p_request #> '{scope,visibility}') = 'array'
          AND EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request #> '{scope,visibility}') v
                      WHERE pg_catalog.jsonb_typeof(v) <> 'string'
                         OR (v #>> '{}') NOT IN ('session', 'agent', 'subject', 'tenant')))
      OR pg_catalog.jsonb_typeof(p_request #> '{scope,visibility}') NOT IN ('string', 'array', 'null')) THEN
      'scope must be an object of tenant_id, subject_id, session_id, agent_id (strings) and visibility'
    WHEN p_request ? 'query' AND pg_catalog.jsonb_typeof(p_request -> 'query') NOT IN ('string', 'null') THEN
      'query must be a string'
    WHEN pg_catalog.length(p_request ->> 'query') > 1000 THEN
      'query must be at most 1000 characters'
    WHEN p_request ? 'requesting_agent' AND pg_catalog.jsonb_typeof(p_request -> 'requesting_agent') <> 'string' THEN
      'requesting_agent must be a string'
    WHEN p_request ? 'allow_partial' AND pg_catalog.jsonb_typeof(p_request -> 'allow_partial') <> 'boolean' THEN
      'allow_partial must be a boolean'
    WHEN p_request ? 'limit' AND (pg_catalog.jsonb_typeof(p_request -> 'limit') <> 'number'
      OR (p_request -> 'limit')::numeric <> pg_catalog.trunc((p_request -> 'limit')::numeric)
      OR (p_request -> 'limit')::numeric < 1) THEN
      'limit must be a positive integer'
    WHEN p_request ? 'filters' AND (pg_catalog.jsonb_typeof(p_request -> 'filters') <> 'object'
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_request -> 'filters') k
                 WHERE k NOT IN ('min_confidence', 'valid_at', 'compliance_labels_excluded'))) THEN
      'filters must be an object of min_confidence, valid_at, compliance_labels_excluded'
    WHEN p_request #> '{filters,min_confidence}' IS NOT NULL
      AND (pg_catalog.jsonb_typeof(p_request #> '{filters,min_confidence}') <> 'number'
           OR (p_request #> '{filters,min_confidence}')::numeric NOT BETWEEN 0 AND 1) THEN
      'filters.min_confidence must be a number in [0, 1]'
    WHEN p_request #> '{filters,compliance_labels_excluded}' IS NOT NULL
      AND (pg_catalog.jsonb_typeof(p_request #> '{filters,compliance_labels_excluded}') <> 'array'
           OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request #> '{filters,compliance_labels_excluded}') x
                      WHERE pg_catalog.jsonb_typeof(x) <> 'string')) THEN
      'filters.compliance_labels_excluded must be an array of strings'
    WHEN p_request ? 'candidates' AND (pg_catalog.jsonb_typeof(p_request -> 'candidates') <> 'array'
      OR pg_catalog.jsonb_array_length(p_request -> 'candidates') > 1000
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request -> 'candidates') c
                 WHERE pg_catalog.jsonb_typeof(c) <> 'object'
                    OR pg_catalog.jsonb_typeof(c -> 'memory_id') IS DISTINCT FROM 'string'
                    OR (c ->> 'memory_id') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                    OR pg_catalog.jsonb_typeof(c -> 'score') IS DISTINCT FROM 'number')) THEN
      'candidates must be an array of at most 1000 {"memory_id": uuid, "score": number}'
  END
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.recall: spec section 6 -- authorize the tool, resolve scope, push filters
-- into the query, answer with provenance and validity, audit.
CREATE OR REPLACE FUNCTION fabric_api.recall(p_request jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_problem text := fabric._recall_request_problem(p_request);
  v_run fabric.runs;
  v_profile jsonb;
  v_missing text[];
  v_resolved jsonb;
  v_reason text;
  v_status text;
  v_settings fabric.deployment_settings;
  v_limit integer;
  v_valid_at timestamptz;
  v_records jsonb;
  v_count integer;
  v_keys text[];
  v_tiers text[];
  v_min_conf double precision;
  v_excluded text[];
  v_mode text;
  v_ids uuid[];
  v_scores double precision[];
BEGIN
  PERFORM fabric._reset_context();
  IF v_problem IS NOT NULL THEN
    PERFORM fabric._bad_envelope(v_problem, 'see spec section 6.2; run_id names your open run');
  END IF;
  v_run := fabric._enter_run((p_request ->> 'run_id')::uuid);
  SELECT a.memory_profile INTO v_profile FROM fabric.agents a WHERE a.agent_id = v_run.agent_id;
  SELECT * INTO v_settings FROM fabric.deployment_settings;
  v_limit := coalesce((p_request ->> 'limit')::numeric::integer, v_settings.recall_default_limit);
  IF (p_request ->> 'limit')::numeric > v_settings.recall_max_limit THEN
    PERFORM fabric._bad_envelope(pg_catalog.format('limit must be at most %s', v_settings.recall_max_limit),
                                 'the deployment''s recall_max_limit caps every recall');
  END IF;
  v_valid_at := coalesce(fabric._envelope_timestamp(p_request #> '{filters,valid_at}', 'filters.valid_at'),
                         pg_catalog.now());

  -- 1. Tool authorization, three layers.
  v_missing := fabric._tool_denial(v_run, 'tool:memory-recall');
  IF pg_catalog.cardinality(v_missing) > 0 THEN
    v_reason := 'tool:memory-recall is not authorized: missing from '
                || pg_catalog.array_to_string(v_missing, ', ');
    PERFORM fabric._emit('agent.tool.unauthorized', v_run.tenant_id, p_payload =>
      pg_catalog.jsonb_build_object('tool', 'tool:memory-recall', 'agent_id', v_run.agent_id,
                                    'missing_layers', v_missing));
    RETURN fabric._recall_answer(v_run.tenant_id, p_request, 'denied', v_reason, NULL, '[]', false);
  END IF;

  -- 2. Scope before retrieval (os-agt-012).
  v_resolved := fabric.resolve_recall_scope(v_profile, v_run, p_request);
  v_reason := v_resolved ->> 'denied_reason';
  IF v_reason IS NULL AND pg_catalog.jsonb_array_length(v_resolved -> 'tiers_denied') > 0
     AND NOT coalesce((p_request ->> 'allow_partial')::boolean, false) THEN
    v_reason := 'tier ' || (SELECT pg_catalog.string_agg(t, ', ') FROM
                 pg_catalog.jsonb_array_elements_text(v_resolved -> 'tiers_denied') t)
                || ' is outside the agent''s memory_profile.recall_scope.tiers'
                || ' (set allow_partial to be served the other tiers)';
  END IF;
  IF v_reason IS NULL AND pg_catalog.jsonb_array_length(v_resolved -> 'tiers') = 0 THEN
    v_reason := 'no requested tier is readable under the agent''s memory_profile.recall_scope';
  END IF;
  IF v_reason IS NOT NULL THEN
    RETURN fabric._recall_answer(v_run.tenant_id, p_request, 'denied', v_reason, v_resolved, '[]', false);
  END IF;
  v_status := CASE WHEN pg_catalog.jsonb_array_length(v_resolved -> 'tiers_denied') > 0
                   THEN 'partial' ELSE 'served' END;

  -- 3-5. Retrieval with every filter in the query; one more row than asked tells truncation.
  v_keys := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(v_resolved -> 'scope_keys'));
  v_tiers := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(v_resolved -> 'tiers'));
  v_min_conf := coalesce((p_request #>> '{filters,min_confidence}')::double precision, 0);
  v_excluded := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                  coalesce(p_request #> '{filters,compliance_labels_excluded}', '[]')));
  v_mode := coalesce(p_request ->> 'mode', 'text');

  -- Semantic and hybrid recall come in two steps: first the broker learns the resolved
  -- filter (nothing is retrieved, nothing audited but a denial), then it returns the
  -- vector store's candidates, which are re-checked here against every rule.
  IF v_mode <> 'text' AND NOT p_request ? 'candidates' THEN
    RETURN pg_catalog.jsonb_build_object('correlation_id', p_request -> 'correlation_id',
      'status', 'resolved', 'tiers_denied', v_resolved -> 'tiers_denied',
      'scope_applied', v_resolved -> 'scope_applied',
      'filter', pg_catalog.jsonb_build_object('tenant_id', v_run.tenant_id,
        'scope_keys', v_resolved -> 'scope_keys', 'tiers', v_resolved -> 'tiers',
        'valid_at', v_valid_at, 'min_confidence', v_min_conf,
        'excluded_labels', pg_catalog.to_jsonb(v_excluded), 'limit', v_limit));
  END IF;
  IF p_request ? 'candidates' THEN
    v_ids := ARRAY(SELECT (x ->> 'memory_id')::uuid
                   FROM pg_catalog.jsonb_array_elements(p_request -> 'candidates') x);
    v_scores := ARRAY(SELECT (x ->> 'score')::double precision
                      FROM pg_catalog.jsonb_array_elements(p_request -> 'candidates') x);
  END IF;

  IF v_mode = 'hybrid' THEN
    -- Reciprocal rank fusion of the vector candidates and the full-text matches, both
    -- retrieved by the one retrieval query, in one statement (one snapshot).
    SELECT coalesce(pg_catalog.jsonb_agg(f.record || pg_catalog.jsonb_build_object('score', f.score)
                                         ORDER BY f.score DESC, f.memory_id)
                      FILTER (WHERE f.rank <= v_limit), '[]'),
           pg_catalog.count(*)
    INTO v_records, v_count
    FROM (SELECT u.memory_id, u.record, u.score,
                 pg_catalog.row_number() OVER (ORDER BY u.score DESC, u.memory_id) AS rank
          FROM (SELECT coalesce(a.memory_id, b.memory_id) AS memory_id,
                       coalesce(a.record, b.record) AS record,
                       coalesce(1.0 / (60 + a.ord), 0) + coalesce(1.0 / (60 + b.ord), 0) AS score
                FROM fabric._recall_candidates(v_run.tenant_id, v_keys, v_tiers, v_valid_at,
                       v_min_conf, v_excluded, NULL, v_ids, v_scores, 1000)
                       WITH ORDINALITY AS a(memory_id, score, record, ord)
                FULL JOIN fabric._recall_candidates(v_run.tenant_id, v_keys, v_tiers, v_valid_at,
                       v_min_conf, v_excluded, p_request ->> 'query', NULL, NULL, 1000)
                       WITH ORDINALITY AS b(memory_id, score, record, ord) USING (memory_id)) u) f;
  ELSE
    SELECT coalesce(pg_catalog.jsonb_agg(r.record || pg_catalog.jsonb_build_object('score', r.score)
                                         ORDER BY r.ord) FILTER (WHERE r.ord <= v_limit), '[]'),
           pg_catalog.count(*)
    INTO v_records, v_count
    FROM fabric._recall_candidates(v_run.tenant_id, v_keys, v_tiers, v_valid_at, v_min_conf,
           v_excluded, p_request ->> 'query', v_ids, v_scores, v_limit + 1)
           WITH ORDINALITY AS r(memory_id, score, record, ord);
  END IF;

  RETURN fabric._recall_answer(v_run.tenant_id, p_request, v_status, NULL, v_resolved, v_records,
                               v_count > v_limit);
END $$;
COMMENT ON FUNCTION fabric_api.recall(jsonb) IS
  'Recall memory inside your open run (spec section 6): authorized, scope-first, filters pushed '
  'down, audited. Example: SELECT fabric_api.recall(''{"run_id": "<run_id>", "tiers": ["semantic"], '
  '"query": "billing entity", "filters": {"min_confidence": 0.7}, "limit": 8}'');';
