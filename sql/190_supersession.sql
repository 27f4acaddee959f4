-- Supersession (R-SUPER-1): contradictions are resolved by a successor that closes the old
-- record, never by deletion. First close the old record, then commit the successor.

-- ---------------------------------------------------------------------------------------
-- fabric._semver_cmp: SemVer precedence of MAJOR.MINOR.PATCH, compared numerically.
CREATE OR REPLACE FUNCTION fabric._semver_cmp(p_a text, p_b text)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE WHEN a < b THEN -1 WHEN a > b THEN 1
              WHEN pa IS NULL AND pb IS NOT NULL THEN 1        -- a release outranks a pre-release
              WHEN pa IS NOT NULL AND pb IS NULL THEN -1
              WHEN pa < pb THEN -1 WHEN pa > pb THEN 1 ELSE 0 END
  FROM (SELECT pg_catalog.string_to_array(pg_catalog.split_part(pg_catalog.split_part(p_a, '+', 1), '-', 1), '.')::numeric[] AS a,
               pg_catalog.string_to_array(pg_catalog.split_part(pg_catalog.split_part(p_b, '+', 1), '-', 1), '.')::numeric[] AS b,
               nullif(pg_catalog.substring(pg_catalog.split_part(p_a, '+', 1), '-(.*)$'), '') AS pa,
               nullif(pg_catalog.substring(pg_catalog.split_part(p_b, '+', 1), '-(.*)$'), '') AS pb) v
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._visibility_rank: how wide a visibility is (session and agent are the narrowest).
CREATE OR REPLACE FUNCTION fabric._visibility_rank(p_visibility text)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT CASE p_visibility WHEN 'session' THEN 1 WHEN 'agent' THEN 1
                               WHEN 'subject' THEN 2 WHEN 'tenant' THEN 3 END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._supersession_rule, once a copy of fabric._raise_rule, is gone: a broken
-- supersession rule is raised by fabric._raise_rule('check_violation', ...,
-- p_constraint => <the rule>).
DROP FUNCTION IF EXISTS fabric._supersession_rule(text, text, text);

-- ---------------------------------------------------------------------------------------
-- fabric._supersession_needs_approval: the one meaning of supersession, for every path
-- (fabric_api.supersede, fabric_api.promote with p_supersedes). Raises the broken rule;
-- returns whether the supersession needs an approval: a declaration replaced by an
-- extraction or reflection, a wider visibility, or a retention that ends later than the
-- superseded record's (a successor never outlives what it replaces without one).
CREATE OR REPLACE FUNCTION fabric._supersession_needs_approval(p_old fabric.memory_records,
  p_tier text, p_valid_from timestamptz, p_version text, p_method text, p_visibility text,
  p_retention text, p_labels text[], p_instance text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_old.retention_class = 'audit' THEN
    PERFORM fabric._raise_rule('MF002', 'audit-class records are never superseded',
      'an audit record is append-only evidence; record the new fact as a new record');
  END IF;
  IF p_tier <> p_old.tier THEN
    PERFORM fabric._raise_rule('check_violation',
      'supersession stays within one tier',
      'a tier change is a promotion (fabric_api.promote); a promotion supersedes only a '
      'record of its target tier',
      p_constraint => 'supersession_within_one_tier');
  END IF;
  IF p_valid_from <= p_old.valid_from THEN
    PERFORM fabric._raise_rule('check_violation',
      'the successor''s valid_from must be after the superseded record''s',
      'a backdated successor would rewrite the past; use the time the new fact became true',
      p_constraint => 'supersession_successor_starts_later');
  END IF;
  IF p_valid_from > pg_catalog.now() THEN
    PERFORM fabric._raise_rule('check_violation',
      'the successor''s valid_from is in the future',
      'propose a future fact when it becomes true',
      p_constraint => 'supersession_successor_not_in_future');
  END IF;
  IF p_old.tier = 'procedural' AND fabric._semver_cmp(p_version, p_old.version) <= 0 THEN
    PERFORM fabric._raise_rule('check_violation',
      'a procedure is superseded only by a numerically greater version',
      'bump MAJOR.MINOR.PATCH of the successor',
      p_constraint => 'supersession_procedural_version_increases');
  END IF;
  RETURN (p_old.formation_method = 'declaration' AND p_method IN ('extraction', 'reflection'))
      OR fabric._visibility_rank(p_visibility) > fabric._visibility_rank(p_old.visibility)
      OR fabric._outlives(p_old.tenant_id, p_instance, p_retention, p_labels,
                          CASE p_old.retention_class WHEN 'audit' THEN 'durable'
                                                     ELSE p_old.retention_class END,
                          p_old.compliance_labels);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.supersede: close p_old_memory_id and commit the validated proposal as its
-- successor (supersedes = old), in one transaction.
CREATE OR REPLACE FUNCTION fabric_api.supersede(p_old_memory_id uuid, p_proposal_id uuid,
                                                p_approval_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_old fabric.memory_records := fabric._enter_record(p_old_memory_id, v_committer);
  v_new fabric.proposals;
  v_needs_approval boolean;
BEGIN
  SELECT * INTO v_new FROM fabric.proposals p
  WHERE p.tenant_id = v_old.tenant_id AND p.proposal_id = p_proposal_id FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM fabric._raise_rule('no_data_found', 'no proposal with this id in the record''s tenant',
      'a successor is a validated proposal of the same tenant');
  END IF;
  IF v_new.status <> 'validated' THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      pg_catalog.format('the successor proposal is %s; only validated proposals commit', v_new.status),
      'propose the successor first');
  END IF;
  v_needs_approval := fabric._supersession_needs_approval(v_old, v_new.tier, v_new.valid_from,
    v_new.version, v_new.formation_method, v_new.visibility, v_new.retention_class,
    v_new.compliance_labels, v_new.business_instance_id);
  IF v_needs_approval OR p_approval_id IS NOT NULL THEN
    PERFORM fabric._consume_approval(v_old.tenant_id, p_approval_id, 'supersede', v_old.memory_id,
      NULL, pg_catalog.jsonb_build_object('proposal_id', p_proposal_id,
                                          'retention_class', v_new.retention_class));
  END IF;
  PERFORM fabric._close_for_successor(v_old, v_new.valid_from);
  BEGIN
    RETURN fabric._record_json_now(v_old.tenant_id,
      (fabric._commit_locked(v_new, v_committer, v_old.memory_id)).memory_id);
  EXCEPTION WHEN exclusion_violation THEN
    PERFORM fabric._contradiction();
  END;
END $$;
COMMENT ON FUNCTION fabric_api.supersede(uuid, uuid, uuid) IS
  'Supersede a live record by a validated proposal (closes the old, commits the successor). '
  'Committer only. Example: SELECT fabric_api.supersede(''<old_memory_id>'', ''<proposal_id>'');';
