-- Promotion and demotion (R-PROMO-1): the same record changes tier, keeping memory_id,
-- content and its correlation and causation ids; the event comes from the record trigger.

-- ---------------------------------------------------------------------------------------
-- fabric._threshold: an instance's threshold, else its domain pack's default, else the
-- fabric's default (R-PROMO-2: 2 episodes, confidence 0.8, 3 trajectories).
CREATE OR REPLACE FUNCTION fabric._threshold(p_tenant_id text, p_instance text, p_name text)
RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v double precision;
BEGIN
  -- plpgsql, one read per statement: Citus plans no statement of an SQL-language function
  -- that has parameters, nor a read of a distributed table inside a larger expression
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- on Citus a custom plan, pruned to the tenant's shard (the function's SET clause
    -- restores the setting when it returns)
    PERFORM pg_catalog.set_config('plan_cache_mode', 'force_custom_plan', true);
  END IF;
  SELECT (pg_catalog.to_jsonb(c) ->> p_name)::double precision INTO v
  FROM fabric.instance_config c
  WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = coalesce(p_instance, '');
  IF v IS NULL THEN
    SELECT (pg_catalog.to_jsonb(d) ->> p_name)::double precision INTO v
    FROM fabric.instance_config c JOIN fabric.domain_pack_defaults d USING (domain_pack_id)
    WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = coalesce(p_instance, '');
  END IF;
  RETURN coalesce(v, CASE p_name WHEN 'min_corroborating_episodes' THEN 2
                                 WHEN 'min_confidence' THEN 0.8
                                 WHEN 'min_successful_trajectories' THEN 3 END);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._episodic_ancestors: distinct episodic records in a record's lineage, counting
-- the episodes that corroborated it (or an ancestor) after it was formed.
CREATE OR REPLACE FUNCTION fabric._episodic_ancestors(p_tenant_id text, p_memory_id uuid)
RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_count integer;
BEGIN
  -- plpgsql and one statement: Citus plans no statement of an SQL-language function that
  -- has parameters, nor a read of a distributed table inside an expression; on Citus a
  -- custom plan, pruned to the tenant's shards (the SET clause restores the setting)
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM pg_catalog.set_config('plan_cache_mode', 'force_custom_plan', true);
  END IF;
  WITH RECURSIVE up(id, depth) AS (
    SELECT l.derived_from_id, 1 FROM fabric.memory_lineage l
    WHERE l.tenant_id = p_tenant_id AND l.memory_id = p_memory_id
    UNION
    SELECT l.derived_from_id, u.depth + 1 FROM fabric.memory_lineage l
    JOIN up u ON l.tenant_id = p_tenant_id AND l.memory_id = u.id WHERE u.depth < 64),
  supported(id) AS (
    SELECT up.id FROM up
    UNION
    SELECT c.episode_id FROM fabric.memory_corroborations c
    WHERE c.tenant_id = p_tenant_id
      AND (c.memory_id = p_memory_id OR c.memory_id IN (SELECT up.id FROM up)))
  SELECT pg_catalog.count(DISTINCT m.memory_id)::integer INTO v_count
  FROM supported s JOIN fabric.memory_records m ON m.tenant_id = p_tenant_id AND m.memory_id = s.id
  WHERE m.tier = 'episodic';
  RETURN v_count;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__tier_change: R-TIER-1, structurally. A tier changes only
-- along a promotion edge (never for audit-class records) or back to a tier the record held
-- before, and the record trigger emits its promoted/demoted event in the same transaction.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__tier_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_action text := fabric._setting('fabric.action');
BEGIN
  IF v_action = 'promote' THEN
    IF OLD.retention_class = 'audit' THEN
      PERFORM fabric._raise_rule('MF002', 'audit-class records are never promoted',
        'an audit record is an episode; derive a new record from it instead');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM fabric.promotion_edges e
                   WHERE e.from_tier = OLD.tier AND e.to_tier = NEW.tier) THEN
      PERFORM fabric._raise_rule('MF002',
        pg_catalog.format('illegal promotion %s -> %s', OLD.tier, NEW.tier),
        'legal: semantic->profile, semantic->procedural, any->relational (approved); '
        'episodic->semantic is a consolidation, not a promotion');
    END IF;
  ELSIF v_action = 'demote' THEN
    IF NOT EXISTS (SELECT 1 FROM fabric.memory_record_versions v
                   WHERE v.tenant_id = OLD.tenant_id AND v.memory_id = OLD.memory_id
                     AND v.tier = NEW.tier) THEN
      PERFORM fabric._raise_rule('MF002',
        pg_catalog.format('a demotion returns a record to a tier it held before; it never held %s', NEW.tier),
        'see fabric_audit.records_as_of for the record''s past tiers');
    END IF;
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _510_tier_change
  BEFORE UPDATE OF tier ON fabric.memory_records
  FOR EACH ROW WHEN (NEW.tier IS DISTINCT FROM OLD.tier)
  EXECUTE FUNCTION fabric.tg_memory_records__tier_change();

-- ---------------------------------------------------------------------------------------
-- fabric._enter_record: committer context on a locked, live record of its tenant.
CREATE OR REPLACE FUNCTION fabric._enter_record(p_memory_id uuid, p_committer text)
RETURNS fabric.memory_records
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := fabric._tenant_of_known_record(p_memory_id);
  v fabric.memory_records;
BEGIN
  PERFORM fabric._committer_enabled_in(v_tenant, p_committer);
  PERFORM fabric._set_context('actor', p_committer);
  SELECT * INTO v FROM fabric.memory_records m
  WHERE m.tenant_id = v_tenant AND m.memory_id = p_memory_id FOR UPDATE;
  IF v.consolidation_state NOT IN ('raw', 'consolidated', 'reflected') THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      pg_catalog.format('the record is %s; only live records change tier or are superseded',
                        v.consolidation_state),
      'live means raw, consolidated or reflected');
  END IF;
  PERFORM fabric._set_context('correlation_id', v.correlation_id);
  PERFORM fabric._set_context('causation_id', v.causation_id);
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._close_for_successor: supersede a live record (state superseded, valid_until
-- shrunk to p_until when that is a shrink).
CREATE OR REPLACE FUNCTION fabric._close_for_successor(p_old fabric.memory_records, p_until timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- plpgsql, not sql: Citus plans no statement of an SQL function that has parameters
  UPDATE fabric.memory_records m
  SET consolidation_state = 'superseded',
      valid_until = CASE WHEN p_until > m.valid_from AND (m.valid_until IS NULL OR m.valid_until > p_until)
                         THEN p_until ELSE m.valid_until END
  WHERE m.tenant_id = p_old.tenant_id AND m.memory_id = p_old.memory_id;
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM fabric._flush_shard_events(p_old.tenant_id);  -- Citus: the shard triggers' events
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._contradiction: re-raise an EXCLUDE violation without its DETAIL (which carries
-- values) and with the fix.
CREATE OR REPLACE FUNCTION fabric._contradiction()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._raise_rule('exclusion_violation',
    'contradiction: a live record already asserts this key in this tier and scope '
    'for an overlapping validity interval',
    'resolve it by supersession: fabric_api.supersede(old_memory_id, proposal_id)',
    p_constraint => 'memory_records_one_live_assertion_per_key');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._change_tier: the one tier UPDATE, under the action the tier trigger checks; a
-- contradiction in the target tier is re-raised without values. A promotion that supersedes
-- names its predecessor in the same UPDATE (the one change of supersedes after formation).
DROP FUNCTION IF EXISTS fabric._change_tier(fabric.memory_records, text, text);  -- older signature
CREATE OR REPLACE FUNCTION fabric._change_tier(p_record fabric.memory_records, p_target_tier text,
                                               p_action text, p_supersedes uuid DEFAULT NULL)
RETURNS fabric.memory_records
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v fabric.memory_records;
BEGIN
  PERFORM fabric._set_context('action', p_action);
  BEGIN
    UPDATE fabric.memory_records m
    SET tier = p_target_tier, supersedes = coalesce(p_supersedes, m.supersedes)
    WHERE m.tenant_id = p_record.tenant_id AND m.memory_id = p_record.memory_id
    RETURNING * INTO v;
  EXCEPTION WHEN exclusion_violation THEN
    PERFORM fabric._contradiction();
  END;
  PERFORM fabric._set_context('action', NULL);
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM fabric._flush_shard_events(p_record.tenant_id);  -- Citus: the shard triggers' events
  END IF;
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._superseded_by_promotion: the live record a promotion names in p_supersedes,
-- locked; an error (never a silent no-op) when the promotion cannot supersede it.
CREATE OR REPLACE FUNCTION fabric._superseded_by_promotion(p_record fabric.memory_records,
                                                           p_supersedes uuid)
RETURNS fabric.memory_records
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_old fabric.memory_records;
BEGIN
  SELECT * INTO v_old FROM fabric.memory_records m
  WHERE m.tenant_id = p_record.tenant_id AND m.memory_id = p_supersedes FOR UPDATE;
  IF NOT FOUND OR p_supersedes = p_record.memory_id THEN
    PERFORM fabric._raise_rule('no_data_found',
      'p_supersedes names no other record of the promoted record''s tenant',
      'pass the memory_id of the live record in the target tier that this promotion replaces');
  END IF;
  IF v_old.consolidation_state NOT IN ('raw', 'consolidated', 'reflected') THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      pg_catalog.format('the record named in p_supersedes is %s; only live records are superseded',
                        v_old.consolidation_state),
      'live means raw, consolidated or reflected; promote without p_supersedes');
  END IF;
  IF p_record.supersedes IS NOT NULL THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'the promoted record already supersedes a record; a record names one predecessor',
      'supersede inside the target tier with fabric_api.supersede after promoting');
  END IF;
  RETURN v_old;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.promote: move the same record to another tier along a legal edge. With
-- p_supersedes it also supersedes that live record of the target tier, exactly as
-- fabric_api.supersede does: the old record closes at the promoted record's valid_from and
-- the promoted record names it in supersedes. A key already live in the target tier is a
-- contradiction unless p_supersedes names that record.
CREATE OR REPLACE FUNCTION fabric_api.promote(p_memory_id uuid, p_target_tier text,
  p_approval_id uuid DEFAULT NULL, p_supersedes uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v fabric.memory_records := fabric._enter_record(p_memory_id, v_committer);
  v_edge fabric.promotion_edges;
  v_old fabric.memory_records;
  v_sup_approval boolean := false;
  v_need integer;
  v_min_conf double precision;
BEGIN
  SELECT * INTO v_edge FROM fabric.promotion_edges e
  WHERE e.from_tier = v.tier AND e.to_tier = p_target_tier;
  IF v_edge.threshold = 'corroboration' THEN
    v_need := fabric._threshold(v.tenant_id, v.business_instance_id, 'min_corroborating_episodes');
    v_min_conf := fabric._threshold(v.tenant_id, v.business_instance_id, 'min_confidence');
    IF fabric._episodic_ancestors(v.tenant_id, v.memory_id) < v_need OR v.confidence < v_min_conf THEN
      PERFORM fabric._raise_rule('check_violation',
        pg_catalog.format('promotion threshold not met: needs %s corroborating episodes '
                          'and confidence >= %s', v_need, v_min_conf),
        'thresholds are instance configuration (fabric_api.configure_instance)',
        p_constraint => 'promotion_threshold_corroboration');
    END IF;
  END IF;
  IF p_supersedes IS NOT NULL THEN
    v_old := fabric._superseded_by_promotion(v, p_supersedes);
    v_sup_approval := fabric._supersession_needs_approval(v_old, p_target_tier, v.valid_from,
      v.version, v.formation_method, v.visibility, v.retention_class, v.compliance_labels,
      v.business_instance_id);
  END IF;
  IF v_edge.needs_approval OR v_sup_approval OR p_approval_id IS NOT NULL THEN
    PERFORM fabric._consume_approval(v.tenant_id, p_approval_id, 'promote', v.memory_id, NULL,
      pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('tier', p_target_tier,
                                                                 'supersedes', p_supersedes)));
  END IF;
  IF p_supersedes IS NOT NULL THEN
    PERFORM fabric._close_for_successor(v_old, v.valid_from);
  END IF;
  PERFORM fabric._change_tier(v, p_target_tier, 'promote', p_supersedes);
  RETURN fabric._record_json_now(v.tenant_id, v.memory_id);
END $$;
COMMENT ON FUNCTION fabric_api.promote(uuid, text, uuid, uuid) IS
  'Promote a record to another tier (same memory_id, content and ids). Committer only. '
  'Example: SELECT fabric_api.promote(''<memory_id>'', ''profile'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.demote: return a record to a tier it held before; always legal, always logged.
CREATE OR REPLACE FUNCTION fabric_api.demote(p_memory_id uuid, p_target_tier text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v fabric.memory_records := fabric._enter_record(p_memory_id, v_committer);
BEGIN
  PERFORM fabric._change_tier(v, p_target_tier, 'demote');
  RETURN fabric._record_json_now(v.tenant_id, v.memory_id);
END $$;
COMMENT ON FUNCTION fabric_api.demote(uuid, text) IS
  'Return a record to a tier it held before. Committer only. '
  'Example: SELECT fabric_api.demote(''<memory_id>'', ''semantic'');';
