-- Formation (docs/consolidation.md): each WF-OS-MEMORY-CONSOLIDATE run persists its Outcome
-- Envelope (append-only, identifiers and counts, never content), which also carries the
-- candidate cursor the next run starts after; recommendations waiting for a policy approval
-- are resumed by a later run; contradictions an inference may not retire wait for review.

-- ---------------------------------------------------------------------------------------
-- fabric.tg_consolidation_outcomes__append_only: an Outcome Envelope is evidence of what a
-- run did; it is never rewritten (refused per statement, so RLS cannot silence it).
CREATE OR REPLACE FUNCTION fabric.tg_consolidation_outcomes__append_only()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._raise_rule('MF001',
    pg_catalog.format('%s on consolidation_outcomes is refused: outcome envelopes are append-only', TG_OP),
    'a run records its envelope once; the next run records its own');
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER _200_append_only
  BEFORE UPDATE OR DELETE ON fabric.consolidation_outcomes
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_consolidation_outcomes__append_only();
CREATE OR REPLACE TRIGGER _200_append_only_truncate
  BEFORE TRUNCATE ON fabric.consolidation_outcomes
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_consolidation_outcomes__append_only();

-- ---------------------------------------------------------------------------------------
-- fabric_api.record_consolidation_outcome: the consolidator persists a run's Outcome
-- Envelope once, with the cursor of the last candidate the run finished (NULL: none).
CREATE OR REPLACE FUNCTION fabric_api.record_consolidation_outcome(p_tenant_id text,
  p_workflow_event_id uuid, p_envelope jsonb, p_through_recorded_at timestamptz DEFAULT NULL,
  p_through_memory_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_agent text := fabric._enter_consolidator(p_tenant_id);
  v_calls jsonb;
BEGIN
  PERFORM fabric._require_workflow_event(p_tenant_id, p_workflow_event_id);
  IF p_envelope IS NULL OR pg_catalog.jsonb_typeof(p_envelope) <> 'object'
     OR pg_catalog.octet_length(p_envelope::text) > 1048576 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'an outcome envelope is a JSON object of at most 1 MiB',
      'identifiers and counts, never content');
  END IF;
  IF (p_through_recorded_at IS NULL) <> (p_through_memory_id IS NULL) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a candidate cursor is a recorded_at and a memory_id, both or neither',
      'the last candidate the run finished');
  END IF;
  IF EXISTS (SELECT 1 FROM fabric.consolidation_outcomes o
             WHERE o.tenant_id = p_tenant_id AND o.workflow_event_id = p_workflow_event_id) THEN
    PERFORM fabric._raise_rule('unique_violation',
      'this run''s outcome envelope is already recorded',
      'each run records its envelope once; start a new run with fabric_api.start_workflow_run');
  END IF;
  INSERT INTO fabric.consolidation_outcomes (tenant_id, workflow_event_id, recorded_by,
    through_recorded_at, through_memory_id, envelope)
  VALUES (p_tenant_id, p_workflow_event_id, v_agent, p_through_recorded_at, p_through_memory_id,
          p_envelope);
  -- The event carries the run's model calls for the trace feed (one span each): only
  -- metadata of the expected shape (model, prompt hash, tokens, latency), never content.
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
           'stage', CASE WHEN c ->> 'stage' ~ '^[a-z_]{1,40}$' THEN c ->> 'stage' END,
           'backend', CASE WHEN c ->> 'backend' ~ '^[A-Za-z0-9_.:-]{1,100}$' THEN c ->> 'backend' END,
           'model', CASE WHEN c ->> 'model' ~ '^[A-Za-z0-9_./:@+-]{1,200}$' THEN c ->> 'model' END,
           'prompt_sha256', CASE WHEN c ->> 'prompt_sha256' ~ '^sha256:[0-9a-f]{64}$'
                                 THEN c ->> 'prompt_sha256' END,
           'prompt_tokens', CASE WHEN pg_catalog.jsonb_typeof(c -> 'prompt_tokens') = 'number'
                                 THEN c -> 'prompt_tokens' END,
           'completion_tokens', CASE WHEN pg_catalog.jsonb_typeof(c -> 'completion_tokens') = 'number'
                                     THEN c -> 'completion_tokens' END,
           'latency_ms', CASE WHEN pg_catalog.jsonb_typeof(c -> 'latency_ms') = 'number'
                              THEN c -> 'latency_ms' END,
           'attempts', CASE WHEN pg_catalog.jsonb_typeof(c -> 'attempts') = 'number'
                            THEN c -> 'attempts' END,
           'outcome', CASE WHEN c ->> 'outcome' IN ('ok', 'invalid', 'error') THEN c ->> 'outcome' END,
           'started_at', CASE WHEN c ->> 'started_at'
                                   ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)$'
                              THEN c ->> 'started_at' END)) ORDER BY n), '[]')
  INTO v_calls
  FROM pg_catalog.jsonb_array_elements(CASE WHEN pg_catalog.jsonb_typeof(p_envelope #> '{cost,per_call}') = 'array'
                                            THEN p_envelope #> '{cost,per_call}' ELSE '[]' END)
       WITH ORDINALITY AS x(c, n)
  WHERE n <= 1000 AND pg_catalog.jsonb_typeof(c) = 'object';
  PERFORM fabric._emit('memory.consolidation.completed', p_tenant_id,
    p_workflow_event_id::text, p_workflow_event_id::text, NULL, NULL,
    pg_catalog.jsonb_build_object('workflow_event_id', p_workflow_event_id,
      'counts', coalesce(p_envelope -> 'counts', '{}'),
      'duration_ms', CASE WHEN pg_catalog.jsonb_typeof(p_envelope -> 'duration_ms') = 'number'
                          THEN p_envelope -> 'duration_ms' END,
      'model_calls', v_calls));
  RETURN pg_catalog.jsonb_build_object('workflow_event_id', p_workflow_event_id,
                                       'status', 'recorded');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.consolidation_cursor: where the tenant's last run that kept a cursor stopped;
-- the next run reads the candidates after it.
CREATE OR REPLACE FUNCTION fabric_api.consolidation_cursor(p_tenant_id text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_last fabric.consolidation_outcomes;
BEGIN
  PERFORM fabric._enter_consolidator(p_tenant_id);
  SELECT * INTO v_last FROM fabric.consolidation_outcomes o
  WHERE o.tenant_id = p_tenant_id AND o.through_memory_id IS NOT NULL
  ORDER BY o.through_recorded_at DESC, o.through_memory_id DESC LIMIT 1;
  -- unusable_runs: the runs since then that ended at the next episode without a usable
  -- answer (a model that never answers it would otherwise hold the tenant back for good)
  RETURN pg_catalog.jsonb_build_object(
    'recorded_at', v_last.through_recorded_at, 'memory_id', v_last.through_memory_id,
    'unusable_runs', (SELECT pg_catalog.count(*) FROM fabric.consolidation_outcomes o
                      WHERE o.tenant_id = p_tenant_id AND o.through_memory_id IS NULL
                        AND o.recorded_at > coalesce(v_last.recorded_at, '-infinity')
                        AND CASE WHEN pg_catalog.jsonb_typeof(o.envelope #> '{counts,unusable}') = 'number'
                                 THEN (o.envelope #> '{counts,unusable}')::numeric > 0
                                 ELSE false END));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.awaiting_recommendations: the tenant's recommendations that wait for a policy
-- approval (a run resumes them: commits once approved, rejects once denied or expired).
CREATE OR REPLACE FUNCTION fabric_api.awaiting_recommendations(p_tenant_id text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
BEGIN
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._committer_enabled_in(p_tenant_id, v_committer);
  RETURN (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                   'recommendation_id', r.recommendation_id, 'approval_id', r.approval_id,
                   'workflow_event_id', r.workflow_event_id)
                   ORDER BY r.recommended_at, r.recommendation_id), '[]')
          FROM fabric.recommendations r
          WHERE r.tenant_id = p_tenant_id AND r.status = 'pending' AND r.approval_id IS NOT NULL);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.contradiction_queue: open contradiction flags of a tenant for os-agt-011 to
-- review: the standing record and the recommendation (assertion and episodes) against it.
CREATE OR REPLACE FUNCTION fabric_api.contradiction_queue(p_tenant_id text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_consolidator(p_tenant_id);
  RETURN (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                   'flag_id', f.flag_id, 'memory_id', f.memory_id,
                   'recommendation_id', f.recommendation_id, 'sources', pg_catalog.to_jsonb(r.sources),
                   'proposal', r.proposal, 'flagged_at', f.flagged_at)
                   ORDER BY f.flagged_at, f.flag_id), '[]')
          FROM fabric.contradiction_flags f
          JOIN fabric.recommendations r
            ON r.tenant_id = f.tenant_id AND r.recommendation_id = f.recommendation_id
          WHERE f.tenant_id = p_tenant_id AND f.resolved_at IS NULL);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_audit.consolidation_outcomes: the Outcome Envelopes of a tenant's runs since a time.
CREATE OR REPLACE FUNCTION fabric_audit.consolidation_outcomes(p_tenant_id text,
  p_since timestamptz DEFAULT '-infinity')
RETURNS TABLE (workflow_event_id uuid, recorded_by text, recorded_at timestamptz,
               envelope jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT o.workflow_event_id, o.recorded_by::text, o.recorded_at, o.envelope
    FROM fabric.consolidation_outcomes o
    WHERE o.tenant_id = p_tenant_id AND o.recorded_at >= p_since
    ORDER BY o.recorded_at, o.workflow_event_id;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.consolidation_settings: what a consolidation worker checks before it starts
-- and before each scheduled run: the instance's model endpoint (where the air-gap rule
-- holds), its deployment mode, its consolidation budget and its schedule window, judged
-- by the database's clock (in_window).
CREATE OR REPLACE FUNCTION fabric_api.consolidation_settings(p_tenant_id text,
  p_business_instance_id text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_consolidator(p_tenant_id);
  RETURN (SELECT pg_catalog.jsonb_build_object('model_uri', c.model_uri,
                   'deployment_mode', c.deployment_mode,
                   'consolidation_budget', c.consolidation_budget,
                   'window', CASE WHEN c.consolidation_window_start IS NOT NULL THEN
                     pg_catalog.jsonb_build_object('start', c.consolidation_window_start,
                                                   'end', c.consolidation_window_end) END,
                   'in_window', fabric._in_consolidation_window(c.consolidation_window_start,
                     c.consolidation_window_end, pg_catalog.clock_timestamp()))
          FROM fabric.instance_config c
          WHERE c.tenant_id = p_tenant_id
            AND c.business_instance_id = coalesce(p_business_instance_id, ''));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_corroborations__rules: a corroboration link is evidence, like
-- derived_from: never rewritten (refused per statement, so RLS cannot silence it), and it
-- links an episodic record to a live assertion of the same scope, nothing else.
CREATE OR REPLACE FUNCTION fabric.tg_memory_corroborations__rules()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF TG_OP <> 'INSERT' THEN
    PERFORM fabric._raise_rule('MF001',
      pg_catalog.format('%s on memory_corroborations is refused: corroborations are append-only', TG_OP),
      'a corroboration is evidence; a record that lost its support is reviewed, not rewritten');
    RETURN NULL;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM fabric.memory_records e
                 JOIN fabric.memory_records a
                   ON a.tenant_id = e.tenant_id AND a.memory_id = NEW.memory_id
                 WHERE e.tenant_id = NEW.tenant_id AND e.memory_id = NEW.episode_id
                   AND e.tier = 'episodic' AND e.content IS NOT NULL
                   AND a.tier IN ('semantic', 'profile', 'procedural')
                   AND a.assertion_key IS NOT NULL
                   AND a.consolidation_state IN ('raw', 'consolidated', 'reflected')
                   AND a.scope_key = e.scope_key) THEN
    PERFORM fabric._raise_rule('check_violation',
      'a corroboration links a live episodic record to a live assertion of its scope',
      'corroborations are committed by fabric_api.commit_recommendation',
      p_constraint => 'memory_corroborations_episode_supports_assertion');
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _200_rules
  BEFORE INSERT ON fabric.memory_corroborations
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_memory_corroborations__rules();
CREATE OR REPLACE TRIGGER _200_append_only
  BEFORE UPDATE OR DELETE ON fabric.memory_corroborations
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_corroborations__rules();
CREATE OR REPLACE TRIGGER _200_append_only_truncate
  BEFORE TRUNCATE ON fabric.memory_corroborations
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_corroborations__rules();

-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_contradiction_flag: which tenant a contradiction flag belongs to
-- (content-free lookup).
SET LOCAL ROLE fabric_lookup;
CREATE OR REPLACE FUNCTION fabric._tenant_of_contradiction_flag(p_flag_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- plpgsql: Citus plans no statement of an SQL function with parameters
  RETURN (SELECT f.tenant_id FROM fabric.contradiction_flags f WHERE f.flag_id = p_flag_id);
END $$;
REVOKE ALL ON FUNCTION fabric._tenant_of_contradiction_flag(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._tenant_of_contradiction_flag(uuid) TO fabric_owner;
SET LOCAL ROLE fabric_owner;
GRANT SELECT (tenant_id, flag_id) ON fabric.contradiction_flags TO fabric_lookup;

-- ---------------------------------------------------------------------------------------
-- fabric._enter_flag_resolution: the one prologue of the flag resolvers (p_kind
-- 'contradiction': fabric_api.resolve_contradiction_flag; 'review':
-- fabric_api.resolve_review_flag). Consolidators only (42501); the decision one of
-- p_decisions and a reason of 1-1000 characters (22023, with the resolver's hints); the
-- flag known (P0002) and still open (55000, locked until the transaction ends); the
-- consolidator enabled in the flag's tenant (fabric._enter_consolidator), which becomes the
-- transaction's tenant. Returns the tenant and the consolidator's agent; refusals write
-- nothing.
CREATE OR REPLACE FUNCTION fabric._enter_flag_resolution(p_kind text, p_flag_id uuid,
  p_decision text, p_decisions text[], p_decision_hint text, p_reason text,
  p_reason_hint text, OUT tenant text, OUT agent text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_resolved_at timestamptz;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_consolidator', 'resolve ' || p_kind || ' flags');
  IF p_decision IS NULL OR NOT p_decision = ANY (p_decisions) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'decision must be ' || pg_catalog.array_to_string(p_decisions, ' or '), p_decision_hint);
  END IF;
  IF p_reason IS NULL OR pg_catalog.btrim(p_reason) = '' OR pg_catalog.length(p_reason) > 1000 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a resolution needs a reason of 1-1000 characters', p_reason_hint);
  END IF;
  tenant := CASE p_kind
                 WHEN 'contradiction' THEN fabric._tenant_of_contradiction_flag(p_flag_id)
                 WHEN 'review' THEN fabric._tenant_of_review_flag(p_flag_id)
               END;
  IF tenant IS NULL THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown ' || p_kind || ' flag',
      'flag ids come from fabric_api.' || p_kind || '_queue');
  END IF;
  agent := fabric._enter_consolidator(tenant);
  IF p_kind = 'contradiction' THEN
    SELECT f.resolved_at INTO v_resolved_at FROM fabric.contradiction_flags f
    WHERE f.tenant_id = tenant AND f.flag_id = p_flag_id FOR UPDATE;
  ELSE
    SELECT f.resolved_at INTO v_resolved_at FROM fabric.review_flags f
    WHERE f.tenant_id = tenant AND f.flag_id = p_flag_id FOR UPDATE;
  END IF;
  IF v_resolved_at IS NOT NULL THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'the ' || p_kind || ' flag is already resolved',
      'a resolution is final; fabric_api.' || p_kind || '_queue lists the open flags');
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.resolve_contradiction_flag: os-agt-011 judges a contradiction it flagged, once.
-- 'keep': the standing record is right and stays live (it must still be live).
-- 'supersede': the contradicting assertion was right, and the standing record has since
-- been superseded by whoever may retire it (fabric_api.supersede, under approval when it
-- needs one); the resolution retires nothing itself, so it is refused while the standing
-- record is still live. The resolution is recorded on the flag and in an event, and the
-- flag leaves the queue.
CREATE OR REPLACE FUNCTION fabric_api.resolve_contradiction_flag(p_flag_id uuid,
  p_decision text, p_reason text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_agent text;
  v_flag fabric.contradiction_flags;
  v_state text;
  v_successor uuid;
BEGIN
  SELECT e.tenant, e.agent INTO v_tenant, v_agent
  FROM fabric._enter_flag_resolution('contradiction', p_flag_id, p_decision,
    ARRAY['keep', 'supersede'],
    'keep the standing record, or supersede once it has been superseded by who may retire it',
    p_reason, 'say why the standing record is kept or was superseded') e;
  SELECT * INTO v_flag FROM fabric.contradiction_flags f
  WHERE f.tenant_id = v_tenant AND f.flag_id = p_flag_id;
  SELECT m.consolidation_state INTO v_state FROM fabric.memory_records m
  WHERE m.tenant_id = v_tenant AND m.memory_id = v_flag.memory_id;
  SELECT m.memory_id INTO v_successor FROM fabric.memory_records m
  WHERE m.tenant_id = v_tenant AND m.supersedes = v_flag.memory_id
  ORDER BY m.recorded_at DESC, m.memory_id LIMIT 1;
  IF p_decision = 'keep' AND v_state NOT IN ('raw', 'consolidated', 'reflected') THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      pg_catalog.format('the standing record is %s; there is nothing live to keep', v_state),
      'resolve it as supersede when it was superseded');
  END IF;
  IF p_decision = 'supersede' AND (v_state <> 'superseded' OR v_successor IS NULL) THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'the standing record is not superseded; resolving a flag retires nothing',
      'an inference never retires a declaration: its owner supersedes it (fabric_api.supersede, '
      'under approval), then resolve the flag as supersede');
  END IF;
  PERFORM fabric._set_context('actor', v_agent);
  UPDATE fabric.contradiction_flags f
  SET resolved_at = pg_catalog.now(), resolution = p_decision, resolved_by = v_agent,
      resolution_reason = p_reason
  WHERE f.tenant_id = v_tenant AND f.flag_id = p_flag_id;
  PERFORM fabric._emit('memory.contradiction.resolved', v_tenant, NULL, NULL, v_flag.memory_id, NULL,
    pg_catalog.jsonb_build_object('flag_id', p_flag_id, 'recommendation_id', v_flag.recommendation_id,
                                  'decision', p_decision,
                                  'successor', CASE WHEN p_decision = 'supersede' THEN v_successor END));
  RETURN pg_catalog.jsonb_build_object('flag_id', p_flag_id, 'memory_id', v_flag.memory_id,
    'decision', p_decision, 'successor', CASE WHEN p_decision = 'supersede' THEN v_successor END);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._in_consolidation_window: whether p_at falls in the instance's consolidation
-- window (UTC time of day, start inclusive, end exclusive; a window ending before it
-- starts spans midnight). No window: always.
CREATE OR REPLACE FUNCTION fabric._in_consolidation_window(p_start time, p_end time,
                                                           p_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE
    WHEN p_start IS NULL OR p_end IS NULL THEN true
    WHEN p_start < p_end THEN (p_at AT TIME ZONE 'UTC')::time >= p_start
                              AND (p_at AT TIME ZONE 'UTC')::time < p_end
    ELSE (p_at AT TIME ZONE 'UTC')::time >= p_start OR (p_at AT TIME ZONE 'UTC')::time < p_end
  END
$$;
