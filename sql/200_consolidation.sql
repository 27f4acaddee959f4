-- Consolidation and reflection (R-CONS-1): os-agt-011 reads candidates (audited,
-- like a recall) and recommends; os-agt-010 commits after scope validation and, where
-- needed, approval (R-APPR-1). Recommending commits nothing.

-- ---------------------------------------------------------------------------------------
-- fabric._enter_consolidator: members of fabric_consolidator, registered as agents.
CREATE OR REPLACE FUNCTION fabric._enter_consolidator(p_tenant_id text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_agent text := fabric._enter_as('fabric_consolidator',
                                   'read consolidation candidates or recommend', 'os-agt-011');
BEGIN
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  PERFORM fabric._set_context('actor', v_agent);
  RETURN v_agent;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.start_workflow_run: a WF-OS-MEMORY-CONSOLIDATE run records the event that its
-- records cite as provenance.source_event_id.
CREATE OR REPLACE FUNCTION fabric_api.start_workflow_run(p_tenant_id text,
  p_workflow text DEFAULT 'WF-OS-MEMORY-CONSOLIDATE')
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_consolidator(p_tenant_id);
  IF p_workflow IS NULL OR p_workflow !~ '^[A-Za-z0-9_.:-]{1,100}$' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'workflow must be an identifier',
      'e.g. WF-OS-MEMORY-CONSOLIDATE');
  END IF;
  RETURN fabric._emit('memory.workflow.started', p_tenant_id, p_payload =>
    pg_catalog.jsonb_build_object('workflow', p_workflow));
END $$;
COMMENT ON FUNCTION fabric_api.start_workflow_run(text, text) IS
  'Record the start of a consolidation workflow run; returns its event id. Consolidator only. '
  'Example: SELECT fabric_api.start_workflow_run(''acme'');';

-- ---------------------------------------------------------------------------------------
-- fabric._workflow_event: the run's start event must exist in this tenant.
CREATE OR REPLACE FUNCTION fabric._require_workflow_event(p_tenant_id text, p_event_id uuid)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM fabric.events e WHERE e.event_id = p_event_id
                 AND e.tenant_id = p_tenant_id AND e.event_type = 'memory.workflow.started') THEN
    PERFORM fabric._raise_rule('foreign_key_violation',
      'no workflow run with this event id in this tenant',
      'start the run with fabric_api.start_workflow_run');
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.consolidation_candidates: live episodic records of a tenant (optionally one
-- subject; optionally only those recorded after a cursor, in (recorded_at, memory_id)
-- order), a memory read audited like a recall (ids, never content, in the event), with the
-- live assertions of the tenant (their ids audited too: a formation decides against them),
-- the instance's thresholds and its consolidation budget.
DROP FUNCTION IF EXISTS fabric_api.consolidation_candidates(text, uuid, text, integer);  -- older signature
CREATE OR REPLACE FUNCTION fabric_api.consolidation_candidates(p_tenant_id text,
  p_workflow_event_id uuid, p_subject_id text DEFAULT NULL, p_limit integer DEFAULT 1000,
  p_after_recorded_at timestamptz DEFAULT NULL, p_after_memory_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_rows jsonb;
  v_live jsonb;
  v_budget integer;
  v_thresholds jsonb;
BEGIN
  PERFORM fabric._enter_consolidator(p_tenant_id);
  PERFORM fabric._require_workflow_event(p_tenant_id, p_workflow_event_id);
  IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'limit must be between 1 and 10000',
      'the default is 1000');
  END IF;
  IF (p_after_recorded_at IS NULL) <> (p_after_memory_id IS NULL) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a candidate cursor is a recorded_at and a memory_id, both or neither',
      'pass what fabric_api.consolidation_cursor answers');
  END IF;
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
           'memory_id', m.memory_id, 'tier', m.tier, 'scope_key', m.scope_key,
           'visibility', m.visibility, 'subject_id', m.subject_id, 'key', m.assertion_key,
           'content', m.content, 'content_hash', m.content_hash, 'confidence', m.confidence,
           'valid_from', m.valid_from, 'recorded_at', m.recorded_at,
           'business_instance_id', m.business_instance_id)
           ORDER BY m.recorded_at, m.memory_id), '[]')
  INTO v_rows
  FROM (SELECT * FROM fabric.memory_records m
        WHERE m.tenant_id = p_tenant_id AND m.tier = 'episodic'
          AND m.consolidation_state IN ('raw', 'consolidated', 'reflected')
          AND m.content IS NOT NULL
          AND (p_subject_id IS NULL OR m.subject_id = p_subject_id)
          AND (p_after_recorded_at IS NULL
               OR (m.recorded_at, m.memory_id) > (p_after_recorded_at, p_after_memory_id))
        ORDER BY m.recorded_at, m.memory_id LIMIT p_limit) m;
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
           'memory_id', m.memory_id, 'tier', m.tier, 'scope_key', m.scope_key,
           'subject_id', m.subject_id, 'key', m.assertion_key, 'content', m.content,
           'content_hash', m.content_hash, 'confidence', m.confidence,
           'formation_method', m.formation_method, 'valid_from', m.valid_from)
           ORDER BY m.scope_key, m.assertion_key, m.tier), '[]')
  INTO v_live
  FROM fabric.memory_records m
  WHERE m.tenant_id = p_tenant_id AND m.assertion_key IS NOT NULL
    AND m.tier IN ('semantic', 'profile', 'procedural')
    AND m.consolidation_state IN ('raw', 'consolidated', 'reflected')
    AND m.content IS NOT NULL
    AND (p_subject_id IS NULL OR m.subject_id = p_subject_id OR m.subject_id IS NULL);
  PERFORM fabric._emit('memory.consolidation.candidates_read', p_tenant_id,
    p_workflow_event_id::text, p_workflow_event_id::text, NULL, NULL,
    pg_catalog.jsonb_build_object(
      'memory_ids', (SELECT coalesce(pg_catalog.jsonb_agg(r -> 'memory_id'), '[]')
                     FROM pg_catalog.jsonb_array_elements(v_rows) r),
      'assertion_ids', (SELECT coalesce(pg_catalog.jsonb_agg(r -> 'memory_id'), '[]')
                        FROM pg_catalog.jsonb_array_elements(v_live) r)));
  -- each read a statement of its own (on Citus a read of a distributed table inside the
  -- answer's expression would be pushed to the shard with the helpers it calls)
  SELECT c.consolidation_budget INTO v_budget FROM fabric.instance_config c
  WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = '';
  v_thresholds := pg_catalog.jsonb_build_object(
    'min_corroborating_episodes', fabric._threshold(p_tenant_id, NULL, 'min_corroborating_episodes'),
    'min_confidence', fabric._threshold(p_tenant_id, NULL, 'min_confidence'),
    'min_successful_trajectories', fabric._threshold(p_tenant_id, NULL, 'min_successful_trajectories'));
  RETURN pg_catalog.jsonb_build_object(
    'candidates', v_rows,
    'live_assertions', v_live,
    'budget', v_budget,
    'thresholds', v_thresholds);
END $$;
COMMENT ON FUNCTION fabric_api.consolidation_candidates(text, uuid, text, integer, timestamptz, uuid) IS
  'Live episodic records to consolidate, after an optional cursor, with the live assertions '
  'they are judged against (an audited memory read). Consolidator only. '
  'Example: SELECT fabric_api.consolidation_candidates(''acme'', ''<workflow_event_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.recommend: file a consolidation, reflection, promotion or distillation
-- recommendation naming its sources. Commits nothing.
CREATE OR REPLACE FUNCTION fabric_api.recommend(p_recommendation jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := p_recommendation ->> 'tenant_id';
  v_agent text;
  v_kind text := p_recommendation ->> 'kind';
  v_workflow uuid;
  v_sources uuid[];
  v_proposal jsonb := coalesce(p_recommendation -> 'proposal', '{}');
  v_id uuid := pg_catalog.gen_random_uuid();
BEGIN
  IF p_recommendation IS NULL OR pg_catalog.jsonb_typeof(p_recommendation) <> 'object'
     OR v_tenant IS NULL OR v_kind IS NULL
     OR v_kind NOT IN ('consolidation', 'reflection', 'promotion', 'distillation', 'corroboration')
     OR pg_catalog.jsonb_typeof(p_recommendation -> 'sources') IS DISTINCT FROM 'array'
     OR (p_recommendation ->> 'workflow_event_id') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
     OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_recommendation -> 'sources') s
                WHERE pg_catalog.jsonb_typeof(s) <> 'string'
                   OR (s #>> '{}') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$')
     OR pg_catalog.jsonb_typeof(v_proposal) <> 'object' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a recommendation is {"tenant_id", "kind", "workflow_event_id", "sources": [memory ids], "proposal": {...}}',
      'kind is consolidation, reflection, promotion, distillation or corroboration');
  END IF;
  v_agent := fabric._enter_consolidator(v_tenant);
  v_workflow := (p_recommendation ->> 'workflow_event_id')::uuid;
  PERFORM fabric._require_workflow_event(v_tenant, v_workflow);
  SELECT pg_catalog.array_agg(DISTINCT (s #>> '{}')::uuid) INTO v_sources
  FROM pg_catalog.jsonb_array_elements(p_recommendation -> 'sources') s;
  IF v_sources IS NULL OR EXISTS (SELECT 1 FROM pg_catalog.unnest(v_sources) s
      WHERE NOT EXISTS (SELECT 1 FROM fabric.memory_records m
                        WHERE m.tenant_id = v_tenant AND m.memory_id = s)) THEN
    PERFORM fabric._raise_rule('foreign_key_violation',
      'a recommendation names at least one source, all records of its tenant',
      'sources come from fabric_api.consolidation_candidates');
  END IF;
  INSERT INTO fabric.recommendations (tenant_id, recommendation_id, kind, workflow_event_id,
                                      sources, proposal, recommended_by)
  VALUES (v_tenant, v_id, v_kind, v_workflow, v_sources, v_proposal, v_agent);
  PERFORM fabric._emit('memory.recommendation.filed', v_tenant, v_workflow::text, v_workflow::text,
    NULL, NULL, pg_catalog.jsonb_build_object('recommendation_id', v_id, 'kind', v_kind,
                                              'sources', pg_catalog.to_jsonb(v_sources)));
  RETURN pg_catalog.jsonb_build_object('recommendation_id', v_id, 'status', 'pending');
END $$;
COMMENT ON FUNCTION fabric_api.recommend(jsonb) IS
  'File a recommendation (commits nothing). Consolidator only. Example: SELECT fabric_api.recommend('
  '''{"tenant_id":"acme","kind":"consolidation","workflow_event_id":"<id>","sources":["<m1>","<m2>"],'
  '"proposal":{"content":{"key":"billing.entity","value":"Acme BV"},"confidence":0.9}}'');';

-- ---------------------------------------------------------------------------------------
-- fabric._reject_recommendation: a governance refusal of a recommendation, with its reason.
CREATE OR REPLACE FUNCTION fabric._reject_recommendation(p_rec fabric.recommendations, p_reason text)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  UPDATE fabric.recommendations r SET status = 'rejected', reason = p_reason,
         decided_at = pg_catalog.now()
  WHERE r.tenant_id = p_rec.tenant_id AND r.recommendation_id = p_rec.recommendation_id;
  PERFORM fabric._emit('memory.recommendation.rejected', p_rec.tenant_id,
    p_rec.workflow_event_id::text, p_rec.workflow_event_id::text, NULL, NULL,
    pg_catalog.jsonb_build_object('recommendation_id', p_rec.recommendation_id, 'reason', p_reason));
  RETURN pg_catalog.jsonb_build_object('recommendation_id', p_rec.recommendation_id,
                                       'status', 'rejected', 'reason', p_reason);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._flag_contradiction: episodes contradict a live assertion that an inference may not
-- retire (a declaration, or a successor that would need an approval): nothing is retired;
-- both sides (the standing record and the recommendation with its assertion and episodes)
-- are filed for review and the recommendation ends `flagged`.
CREATE OR REPLACE FUNCTION fabric._flag_contradiction(p_rec fabric.recommendations,
                                                      p_standing uuid, p_reason text)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_flag uuid := pg_catalog.gen_random_uuid();
BEGIN
  UPDATE fabric.recommendations r SET status = 'flagged', reason = p_reason,
         decided_at = pg_catalog.now(), memory_id = p_standing
  WHERE r.tenant_id = p_rec.tenant_id AND r.recommendation_id = p_rec.recommendation_id;
  INSERT INTO fabric.contradiction_flags (tenant_id, flag_id, memory_id, recommendation_id)
  VALUES (p_rec.tenant_id, v_flag, p_standing, p_rec.recommendation_id);
  PERFORM fabric._emit('memory.contradiction.flagged', p_rec.tenant_id,
    p_rec.workflow_event_id::text, p_rec.workflow_event_id::text, p_standing, NULL,
    pg_catalog.jsonb_build_object('flag_id', v_flag, 'recommendation_id', p_rec.recommendation_id,
                                  'sources', pg_catalog.to_jsonb(p_rec.sources)));
  RETURN pg_catalog.jsonb_build_object('recommendation_id', p_rec.recommendation_id,
    'status', 'flagged', 'flag_id', v_flag, 'memory_id', p_standing, 'reason', p_reason);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._commit_promotion_recommendation: the policy gate of a recommended promotion. One
-- that needs an approval files it (once) and waits: the recommendation stays pending with
-- its approval_id, and a later run (after any restart) commits it once policy approved, or
-- rejects it once policy denied or the approval expired.
CREATE OR REPLACE FUNCTION fabric._commit_promotion_recommendation(p_rec fabric.recommendations,
                                                                   p_approval_id uuid)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_approval uuid := coalesce(p_approval_id, p_rec.approval_id);
  v_status text;
  v_expires timestamptz;
  v_result jsonb;
  v_target jsonb;
  v_promoted uuid;
BEGIN
  BEGIN
    v_result := fabric_api.promote(p_rec.sources[1], p_rec.proposal ->> 'target_tier', v_approval,
                                   (p_rec.proposal ->> 'supersedes')::uuid);
  EXCEPTION WHEN SQLSTATE 'MF005' THEN
    IF v_approval IS NULL THEN
      v_target := pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
        'tier', p_rec.proposal ->> 'target_tier', 'supersedes', p_rec.proposal ->> 'supersedes'));
      PERFORM fabric._check_approval_target('promote', v_target);
      PERFORM fabric._check_approval_target_live(p_rec.tenant_id, 'promote', p_rec.sources[1], v_target);
      v_approval := fabric._file_approval(p_rec.tenant_id, 'promote', p_rec.sources[1], NULL,
        v_target, 'recommended by consolidation run ' || p_rec.workflow_event_id::text);
      UPDATE fabric.recommendations r SET approval_id = v_approval
      WHERE r.tenant_id = p_rec.tenant_id AND r.recommendation_id = p_rec.recommendation_id;
      RETURN pg_catalog.jsonb_build_object('recommendation_id', p_rec.recommendation_id,
        'status', 'awaiting_approval', 'approval_id', v_approval);
    END IF;
    SELECT a.status, a.expires_at INTO v_status, v_expires FROM fabric.approvals a
    WHERE a.tenant_id = p_rec.tenant_id AND a.approval_id = v_approval;
    IF v_status = 'pending' AND v_expires > pg_catalog.now() THEN
      RETURN pg_catalog.jsonb_build_object('recommendation_id', p_rec.recommendation_id,
        'status', 'awaiting_approval', 'approval_id', v_approval);
    END IF;
    RETURN fabric._reject_recommendation(p_rec, pg_catalog.format(
      'the promotion''s approval was %s', CASE WHEN v_status = 'pending' THEN 'not decided before it expired'
                                               ELSE coalesce(v_status, 'not found') END));
  END;
  -- the promoted record as a value: Citus 14 crashes deparsing an UPDATE that sets a column
  -- from an element of a row parameter's array (p_rec.sources[1])
  v_promoted := p_rec.sources[1];
  UPDATE fabric.recommendations r SET status = 'committed', decided_at = pg_catalog.now(),
         memory_id = v_promoted, approval_id = v_approval
  WHERE r.tenant_id = p_rec.tenant_id AND r.recommendation_id = p_rec.recommendation_id;
  RETURN v_result;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.commit_recommendation: the committer forms the recommended record (or runs
-- the recommended promotion, or records a corroboration) after scope validation and, where
-- needed, approval. A recommendation that supersedes a live assertion closes it at the
-- successor's valid_from (the time the episodes say the change happened); one that may not
-- retire it (authority: an inference never retires a declaration) is flagged for review.
CREATE OR REPLACE FUNCTION fabric_api.commit_recommendation(p_recommendation_id uuid,
                                                            p_approval_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text := fabric._tenant_of_recommendation(p_recommendation_id);
  v_rec fabric.recommendations;
  v_src fabric.memory_records;
  v_old fabric.memory_records;
  v_scopes integer;
  v_live integer;
  v_tier text;
  v_state text;
  v_method text;
  v_need integer;
  v_content jsonb;
  v_confidence double precision;
  v_record fabric.memory_records;
  v_labels text[];
  v_retention text;
  v_asked text;
  v_valid_from timestamptz := pg_catalog.now();
  v_target uuid;
  v_needs_approval boolean;
  v_linked uuid[];
  v_source uuid;
BEGIN
  IF v_tenant IS NULL THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown recommendation',
      'recommendation ids come from fabric_api.recommend');
  END IF;
  PERFORM fabric._committer_enabled_in(v_tenant, v_committer);
  PERFORM fabric._set_context('actor', v_committer);
  SELECT * INTO v_rec FROM fabric.recommendations r
  WHERE r.tenant_id = v_tenant AND r.recommendation_id = p_recommendation_id FOR UPDATE;
  IF v_rec.status <> 'pending' THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      pg_catalog.format('the recommendation is %s; it is decided once', v_rec.status),
      'file a new recommendation');
  END IF;
  PERFORM fabric._set_context('correlation_id', v_rec.workflow_event_id::text);

  IF v_rec.kind = 'promotion' THEN
    RETURN fabric._commit_promotion_recommendation(v_rec, p_approval_id);
  END IF;

  -- Scope validation (os-agt-012): live sources sharing one scope.
  SELECT pg_catalog.count(DISTINCT m.scope_key),
         pg_catalog.count(*) FILTER (WHERE m.consolidation_state IN ('raw', 'consolidated', 'reflected')
                                      AND m.content IS NOT NULL)
  INTO v_scopes, v_live
  FROM fabric.memory_records m
  WHERE m.tenant_id = v_tenant AND m.memory_id = ANY (v_rec.sources);
  IF v_live <> pg_catalog.cardinality(v_rec.sources) THEN
    RETURN fabric._reject_recommendation(v_rec, 'every source must be a live record with content');
  END IF;
  IF v_scopes <> 1 THEN
    RETURN fabric._reject_recommendation(v_rec, 'sources span several scopes; a formed record keeps one scope');
  END IF;
  SELECT * INTO v_src FROM fabric.memory_records m
  WHERE m.tenant_id = v_tenant AND m.memory_id = v_rec.sources[1];

  -- The record a corroboration supports, or a successor supersedes: a live assertion of
  -- the sources' scope, in this tenant.
  v_target := CASE WHEN (v_rec.proposal ->> 'supersedes') ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   THEN (v_rec.proposal ->> 'supersedes')::uuid
                   WHEN (v_rec.proposal ->> 'corroborates') ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   THEN (v_rec.proposal ->> 'corroborates')::uuid END;
  IF v_target IS NULL AND (v_rec.kind = 'corroboration' OR v_rec.proposal ? 'supersedes'
                           OR v_rec.proposal ? 'corroborates') THEN
    RETURN fabric._reject_recommendation(v_rec,
      'supersedes and corroborates name a live assertion by its memory id');
  END IF;
  IF v_target IS NOT NULL THEN
    SELECT * INTO v_old FROM fabric.memory_records m
    WHERE m.tenant_id = v_tenant AND m.memory_id = v_target FOR UPDATE;
    IF NOT FOUND OR v_old.consolidation_state NOT IN ('raw', 'consolidated', 'reflected')
       OR v_old.assertion_key IS NULL OR v_old.scope_key IS DISTINCT FROM v_src.scope_key THEN
      RETURN fabric._reject_recommendation(v_rec,
        'the named assertion must be a live assertion of this tenant in the sources'' scope');
    END IF;
  END IF;

  IF v_rec.kind = 'corroboration' THEN
    IF EXISTS (SELECT 1 FROM fabric.memory_records m
               WHERE m.tenant_id = v_tenant AND m.memory_id = ANY (v_rec.sources)
                 AND m.tier <> 'episodic') THEN
      RETURN fabric._reject_recommendation(v_rec, 'a corroboration cites episodic records only');
    END IF;
    -- Lineage grows, derived_from stays as formed: each episode not yet behind the
    -- assertion (formed from it, or an earlier corroboration) is linked once.
    WITH linked AS (
      INSERT INTO fabric.memory_corroborations (tenant_id, memory_id, episode_id, recommendation_id)
      SELECT v_tenant, v_old.memory_id, s, p_recommendation_id
      FROM pg_catalog.unnest(v_rec.sources) s
      WHERE NOT EXISTS (SELECT 1 FROM fabric.memory_lineage l
                        WHERE l.tenant_id = v_tenant AND l.memory_id = v_old.memory_id
                          AND l.derived_from_id = s)
      ON CONFLICT DO NOTHING
      RETURNING episode_id)
    SELECT pg_catalog.array_agg(episode_id ORDER BY episode_id) INTO v_linked FROM linked;
    UPDATE fabric.recommendations r SET status = 'committed', decided_at = pg_catalog.now(),
           memory_id = v_old.memory_id
    WHERE r.tenant_id = v_tenant AND r.recommendation_id = p_recommendation_id;
    PERFORM fabric._emit('memory.record.corroborated', v_tenant, v_rec.workflow_event_id::text,
      v_rec.workflow_event_id::text, v_old.memory_id, NULL,
      pg_catalog.jsonb_build_object('recommendation_id', p_recommendation_id,
                                    'sources', pg_catalog.to_jsonb(v_rec.sources),
                                    'linked', pg_catalog.to_jsonb(coalesce(v_linked, '{}'))));
    RETURN pg_catalog.jsonb_build_object('recommendation_id', p_recommendation_id,
      'status', 'corroborated', 'memory_id', v_old.memory_id,
      'linked', pg_catalog.to_jsonb(coalesce(v_linked, '{}')),
      'episodes', fabric._episodic_ancestors(v_tenant, v_old.memory_id));
  END IF;

  v_tier := CASE v_rec.kind WHEN 'distillation' THEN 'procedural'
                            ELSE coalesce(v_rec.proposal ->> 'tier', 'semantic') END;
  v_state := CASE v_rec.kind WHEN 'consolidation' THEN 'consolidated'
                             WHEN 'reflection' THEN 'reflected' ELSE 'raw' END;
  v_method := CASE v_rec.kind WHEN 'reflection' THEN 'reflection' ELSE 'consolidation' END;
  v_need := CASE v_rec.kind
              WHEN 'consolidation' THEN fabric._threshold(v_tenant, v_src.business_instance_id, 'min_corroborating_episodes')
              WHEN 'distillation' THEN fabric._threshold(v_tenant, v_src.business_instance_id, 'min_successful_trajectories')
              ELSE 1 END;
  IF pg_catalog.cardinality(v_rec.sources) < v_need THEN
    RETURN fabric._reject_recommendation(v_rec, pg_catalog.format(
      'a %s needs at least %s sources (instance threshold)', v_rec.kind, v_need));
  END IF;
  IF v_tier NOT IN ('semantic', 'procedural', 'profile') THEN
    RETURN fabric._reject_recommendation(v_rec, 'consolidation forms semantic, procedural or profile records');
  END IF;
  v_content := v_rec.proposal -> 'content';
  v_confidence := CASE WHEN pg_catalog.jsonb_typeof(v_rec.proposal -> 'confidence') = 'number'
                            AND fabric._is_double((v_rec.proposal -> 'confidence')::numeric)
                       THEN (v_rec.proposal -> 'confidence')::numeric::double precision END;
  IF v_content IS NULL OR pg_catalog.jsonb_typeof(v_content) <> 'object'
     OR v_confidence IS NULL OR v_confidence NOT BETWEEN 0 AND 1 THEN
    RETURN fabric._reject_recommendation(v_rec, 'the proposal needs an object content and a confidence in [0, 1]');
  END IF;
  IF v_rec.proposal ? 'valid_from' THEN
    BEGIN
      v_valid_from := fabric._envelope_timestamp(v_rec.proposal -> 'valid_from', 'valid_from');
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow THEN
      RETURN fabric._reject_recommendation(v_rec,
        'valid_from must be an RFC 3339 timestamp with an offset');
    END;
    IF v_valid_from IS NULL OR v_valid_from > pg_catalog.now() THEN
      RETURN fabric._reject_recommendation(v_rec,
        'valid_from is when the episodes say the fact became true: not null, not in the future');
    END IF;
  END IF;

  -- Retention never grows: the formed record takes the earliest-ending class of its sources
  -- (audit counts as durable); a recommendation may ask for a shorter one, never a longer.
  v_labels := ARRAY(SELECT DISTINCT l FROM fabric.memory_records m, pg_catalog.unnest(m.compliance_labels) l
                    WHERE m.tenant_id = v_tenant AND m.memory_id = ANY (v_rec.sources) ORDER BY l);
  SELECT CASE m.retention_class WHEN 'audit' THEN 'durable' ELSE m.retention_class END
  INTO v_retention
  FROM fabric.memory_records m
  WHERE m.tenant_id = v_tenant AND m.memory_id = ANY (v_rec.sources)
  ORDER BY fabric._retention_end(v_tenant, m.business_instance_id, m.retention_class,
                                 m.compliance_labels), m.memory_id
  LIMIT 1;
  v_asked := v_rec.proposal ->> 'retention_class';
  IF v_asked IS NOT NULL THEN
    IF v_asked NOT IN ('operational', 'regulated', 'durable') THEN
      RETURN fabric._reject_recommendation(v_rec,
        'a formed record''s retention_class is operational, regulated or durable');
    END IF;
    IF fabric._outlives(v_tenant, v_src.business_instance_id, v_asked, v_labels, v_retention, v_labels) THEN
      RETURN fabric._reject_recommendation(v_rec,
        'a formed record never outlives its shortest-lived source (retention_class); '
        'a longer retention is a supersession under approval');
    END IF;
    v_retention := v_asked;
  END IF;

  -- Supersession (authority-aware): the successor stays in the old record's tier and key;
  -- one that would need an approval (a declaration retired by an inference, a wider scope,
  -- a longer retention) retires nothing and is flagged for review with both sides.
  IF v_old.memory_id IS NOT NULL THEN
    IF v_old.tier <> v_tier OR v_old.assertion_key IS DISTINCT FROM (v_content ->> 'key') THEN
      RETURN fabric._reject_recommendation(v_rec,
        'a successor asserts the same key in the same tier as the record it supersedes');
    END IF;
    BEGIN
      v_needs_approval := fabric._supersession_needs_approval(v_old, v_tier, v_valid_from,
        coalesce(v_rec.proposal ->> 'version', '1.0.0'), v_method, v_src.visibility, v_retention,
        v_labels, v_src.business_instance_id);
    EXCEPTION WHEN check_violation OR SQLSTATE 'MF002' THEN
      RETURN fabric._reject_recommendation(v_rec, 'supersession refused: ' || SQLERRM);
    END;
    IF v_needs_approval THEN
      RETURN fabric._flag_contradiction(v_rec, v_old.memory_id,
        CASE WHEN v_old.formation_method = 'declaration'
             THEN 'contradicts a declaration, which an inference never retires; flagged for review'
             ELSE 'contradicts a record it may not retire without an approval; flagged for review' END);
    END IF;
    PERFORM fabric._close_for_successor(v_old, v_valid_from);
  END IF;

  BEGIN
    INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, agent_id,
      session_id, business_instance_id, content, source_event_id, correlation_id, causation_id,
      formed_by, formation_method, confidence, valid_from, consolidation_state, retention_class,
      compliance_labels, version, supersedes)
    SELECT v_tenant, v_tier, v_src.visibility, v_src.subject_id, v_src.agent_id, v_src.session_id,
           v_src.business_instance_id, v_content, v_rec.workflow_event_id::text,
           v_rec.workflow_event_id::text, v_rec.workflow_event_id::text, v_committer, v_method,
           v_confidence, v_valid_from, v_state, v_retention, v_labels,
           coalesce(v_rec.proposal ->> 'version', '1.0.0'), v_old.memory_id
    RETURNING * INTO v_record;
    IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
      -- Citus: an INSERT ... SELECT of values becomes a COPY into the shard, which
      -- row-level security refuses (one INSERT ... VALUES per source); and SET CONSTRAINTS
      -- does not reach the shard's deferred rule, which is checked here as it checks it
      FOREACH v_source IN ARRAY v_rec.sources LOOP
        INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)
        VALUES (v_tenant, v_record.memory_id, v_source);
      END LOOP;
      IF v_record.tier = 'semantic' THEN
        PERFORM fabric._require_episodic_source(v_tenant, v_record.memory_id);
      END IF;
    ELSE
      INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)
      SELECT v_tenant, v_record.memory_id, s FROM pg_catalog.unnest(v_rec.sources) s;
      SET CONSTRAINTS fabric._950_semantic_needs_episode IMMEDIATE;
      SET CONSTRAINTS fabric._950_semantic_needs_episode DEFERRED;
    END IF;
  EXCEPTION WHEN exclusion_violation THEN
    RETURN fabric._reject_recommendation(v_rec,
      'contradiction: the key is already live in this tier and scope; supersede it instead');
  END;
  UPDATE fabric.recommendations r SET status = 'committed', decided_at = pg_catalog.now(),
         memory_id = v_record.memory_id
  WHERE r.tenant_id = v_tenant AND r.recommendation_id = p_recommendation_id;
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM fabric._flush_shard_events(v_tenant);  -- Citus: the shard triggers' events
  END IF;
  RETURN pg_catalog.jsonb_build_object('recommendation_id', p_recommendation_id,
    'status', 'committed', 'record', fabric._record_json_now(v_tenant, v_record.memory_id));
END $$;
COMMENT ON FUNCTION fabric_api.commit_recommendation(uuid, uuid) IS
  'Commit a recommendation: form the consolidated/reflected/distilled record (superseding the '
  'live assertion it names, or flagging a contradiction it may not retire), record a '
  'corroboration, or run the promotion (filing its approval and waiting for it when needed). '
  'Committer only. Example: SELECT fabric_api.commit_recommendation(''<id>'');';
