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
  PERFORM fabric._emit('memory.consolidation.completed', p_tenant_id,
    p_workflow_event_id::text, p_workflow_event_id::text, NULL, NULL,
    pg_catalog.jsonb_build_object('workflow_event_id', p_workflow_event_id,
      'counts', coalesce(p_envelope -> 'counts', '{}')));
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
-- fabric_api.consolidation_settings: what a consolidation worker checks before it starts:
-- the instance's model endpoint (where the air-gap rule holds), its deployment mode and
-- its consolidation budget.
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
                   'consolidation_budget', c.consolidation_budget)
          FROM fabric.instance_config c
          WHERE c.tenant_id = p_tenant_id
            AND c.business_instance_id = coalesce(p_business_instance_id, ''));
END $$;
