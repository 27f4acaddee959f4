-- Approvals (R-APPR-1): the committer requests, policy (os-agt-002) decides, the committer
-- consumes one approval once, for the record (or subject) and action it names.

-- ---------------------------------------------------------------------------------------
-- fabric._actor_id: the registered agent behind session_user, else the login itself.
CREATE OR REPLACE FUNCTION fabric._actor_id()
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT coalesce(fabric._caller_agent_id(), session_user::text));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._refuse_approval: the one error of approvals (MF005), never with values.
CREATE OR REPLACE FUNCTION fabric._refuse_approval(p_why text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._raise_rule('MF005', 'approval refused: ' || p_why,
    'request an approval for this record and action with fabric_api.request_approval; '
    'os-agt-002 decides it; each approval is used once, before it expires');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._consume_approval: check and use an approval inside the acting transaction.
CREATE OR REPLACE FUNCTION fabric._consume_approval(p_tenant_id text, p_approval_id uuid,
  p_action text, p_memory_id uuid, p_subject_id text, p_target jsonb DEFAULT '{}')
RETURNS fabric.approvals
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v fabric.approvals;
BEGIN
  IF p_approval_id IS NULL THEN
    PERFORM fabric._refuse_approval(pg_catalog.format('%s needs an approval', p_action));
  END IF;
  SELECT * INTO v FROM fabric.approvals a
  WHERE a.tenant_id = p_tenant_id AND a.approval_id = p_approval_id FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM fabric._refuse_approval('no such approval in this tenant');
  ELSIF v.status = 'consumed' THEN
    PERFORM fabric._refuse_approval('the approval was already used');
  ELSIF v.status = 'denied' THEN
    PERFORM fabric._refuse_approval('the approval was denied');
  ELSIF v.status = 'pending' THEN
    PERFORM fabric._refuse_approval('the approval has not been decided');
  ELSIF v.expires_at <= pg_catalog.now() THEN
    PERFORM fabric._refuse_approval('the approval has expired');
  ELSIF v.action <> p_action THEN
    PERFORM fabric._refuse_approval(pg_catalog.format('the approval is for %s, not %s',
                                                      v.action, p_action));
  ELSIF v.memory_id IS DISTINCT FROM p_memory_id
        OR v.subject_ref IS DISTINCT FROM (fabric._subject_key(p_tenant_id, p_subject_id)).subject_ref THEN
    PERFORM fabric._refuse_approval('the approval is for another record or subject');
  ELSIF NOT (v.target <@ coalesce(p_target, '{}')) THEN
    PERFORM fabric._refuse_approval('the approval is for another target');
  END IF;
  -- what the target names is checked again now: it may have changed since the request
  PERFORM fabric._check_approval_target_live(p_tenant_id, v.action, v.memory_id, v.target);
  UPDATE fabric.approvals a SET status = 'consumed', consumed_at = pg_catalog.now()
  WHERE a.tenant_id = p_tenant_id AND a.approval_id = p_approval_id
  RETURNING * INTO v;
  PERFORM fabric._set_context('approval_id', p_approval_id::text);
  PERFORM fabric._emit('memory.approval.consumed', p_tenant_id, NULL, NULL, p_memory_id, NULL,
    pg_catalog.jsonb_build_object('approval_id', p_approval_id, 'action', p_action));
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._file_approval: insert a pending approval request and its event. A data subject
-- is stored as its pseudonym, so the approval outlives the subject's erasure unlinked.
CREATE OR REPLACE FUNCTION fabric._file_approval(p_tenant_id text, p_action text,
  p_memory_id uuid, p_subject_id text, p_target jsonb, p_reason text)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_id uuid := pg_catalog.gen_random_uuid();
BEGIN
  IF p_reason IS NULL OR pg_catalog.btrim(p_reason) = '' OR pg_catalog.length(p_reason) > 1000 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'an approval request needs a reason of 1-1000 characters',
      'say why the action is needed; the policy agent reads it');
  END IF;
  IF p_target IS NULL OR pg_catalog.jsonb_typeof(p_target) <> 'object' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'an approval target must be a JSON object',
      'e.g. {"tier": "relational"}');
  END IF;
  INSERT INTO fabric.approvals (tenant_id, approval_id, action, memory_id, subject_ref, target,
                                reason, requested_by, expires_at)
  VALUES (p_tenant_id, v_id, p_action, p_memory_id,
          (fabric._subject_key(p_tenant_id, p_subject_id)).subject_ref, p_target, p_reason,
          fabric._actor_id(), pg_catalog.now() + fabric._approval_timeout(p_tenant_id, p_action));
  PERFORM fabric._emit('memory.approval.requested', p_tenant_id, NULL, NULL, p_memory_id, NULL,
    pg_catalog.jsonb_build_object('approval_id', v_id, 'action', p_action, 'target', p_target));
  RETURN v_id;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._check_approval_target: the target names what the approval is for, in the shape
-- of its action, checked when it is requested (22023, the expected keys in the hint):
-- promote {"tier", "supersedes"?}; supersede {"proposal_id", "retention_class"?}; erase {}.
CREATE OR REPLACE FUNCTION fabric._check_approval_target(p_action text, p_target jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  c_uuid constant text := '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$';
  v_ok boolean;
BEGIN
  v_ok := p_target IS NOT NULL AND pg_catalog.jsonb_typeof(p_target) = 'object';
  IF v_ok AND p_action = 'promote' THEN
    v_ok := NOT EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_target) k
                        WHERE k NOT IN ('tier', 'supersedes'))
      AND pg_catalog.jsonb_typeof(p_target -> 'tier') = 'string'
      AND EXISTS (SELECT 1 FROM fabric.promotion_edges e WHERE e.to_tier = p_target ->> 'tier')
      AND (NOT p_target ? 'supersedes'
           OR (pg_catalog.jsonb_typeof(p_target -> 'supersedes') = 'string'
               AND (p_target ->> 'supersedes') ~ c_uuid));
  ELSIF v_ok AND p_action = 'supersede' THEN
    v_ok := NOT EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_target) k
                        WHERE k NOT IN ('proposal_id', 'retention_class'))
      AND pg_catalog.jsonb_typeof(p_target -> 'proposal_id') = 'string'
      AND (p_target ->> 'proposal_id') ~ c_uuid
      AND (NOT p_target ? 'retention_class'
           OR (pg_catalog.jsonb_typeof(p_target -> 'retention_class') = 'string'
               AND (p_target ->> 'retention_class') IN ('operational', 'regulated', 'durable', 'audit')));
  ELSIF v_ok THEN
    v_ok := p_target = '{}'::jsonb;
  END IF;
  IF NOT coalesce(v_ok, false) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      pg_catalog.format('the approval target does not fit the action %s', p_action),
      CASE p_action
        WHEN 'promote' THEN 'promote expects {"tier": <target tier: profile, procedural or '
                            'relational>, "supersedes": <memory_id, optional>}'
        WHEN 'supersede' THEN 'supersede expects {"proposal_id": <the successor proposal id>, '
                              '"retention_class": <operational, regulated, durable or audit, optional>}'
        ELSE 'erase expects {} (the record is the approval''s memory_id)' END);
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._check_approval_target_live: what a target names exists in the approval's tenant and
-- is still live, checked when the approval is requested and again when it is used: promote's
-- "supersedes" a live record (raw, consolidated or reflected) other than the promoted one;
-- supersede's "proposal_id" a validated proposal. Unknown or of another tenant: P0002; no
-- longer live: 55000. Runs with the tenant context set (row-level security).
CREATE OR REPLACE FUNCTION fabric._check_approval_target_live(p_tenant_id text, p_action text,
  p_memory_id uuid, p_target jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_state text;
BEGIN
  IF p_action = 'promote' AND p_target ? 'supersedes' THEN
    SELECT m.consolidation_state INTO v_state FROM fabric.memory_records m
    WHERE m.tenant_id = p_tenant_id AND m.memory_id = (p_target ->> 'supersedes')::uuid
      AND m.memory_id <> p_memory_id;
    IF NOT FOUND THEN
      PERFORM fabric._raise_rule('no_data_found',
        'the approval target''s supersedes names no other record of the record''s tenant',
        'name the memory_id of the live record in the target tier that the promotion replaces');
    ELSIF v_state NOT IN ('raw', 'consolidated', 'reflected') THEN
      PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
        pg_catalog.format('the record named by the approval target''s supersedes is %s; only live '
                          'records are superseded', v_state),
        'live means raw, consolidated or reflected; request the approval without supersedes');
    END IF;
  ELSIF p_action = 'supersede' THEN
    SELECT p.status INTO v_state FROM fabric.proposals p
    WHERE p.tenant_id = p_tenant_id AND p.proposal_id = (p_target ->> 'proposal_id')::uuid;
    IF NOT FOUND THEN
      PERFORM fabric._raise_rule('no_data_found',
        'the approval target''s proposal_id names no proposal of the record''s tenant',
        'a successor is a validated proposal of the same tenant: propose it first');
    ELSIF v_state <> 'validated' THEN
      PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
        pg_catalog.format('the successor proposal named by the approval target is %s; only '
                          'validated proposals commit', v_state),
        'propose the successor again and request an approval for the new proposal');
    END IF;
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.request_approval: the committer asks policy for a promotion or supersession.
CREATE OR REPLACE FUNCTION fabric_api.request_approval(p_memory_id uuid, p_action text,
  p_target jsonb DEFAULT '{}', p_reason text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text := fabric._tenant_of_known_record(p_memory_id);
BEGIN
  PERFORM fabric._committer_enabled_in(v_tenant, v_committer);
  IF p_action IS NULL OR p_action NOT IN ('promote', 'supersede', 'erase') THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'action must be promote, supersede or erase',
      'a data subject''s erasure is fabric_api.request_subject_erasure');
  END IF;
  PERFORM fabric._check_approval_target(p_action, coalesce(p_target, '{}'));
  PERFORM fabric._set_context('tenant_id', v_tenant);
  PERFORM fabric._check_approval_target_live(v_tenant, p_action, p_memory_id, coalesce(p_target, '{}'));
  PERFORM fabric._set_context('actor', v_committer);
  RETURN pg_catalog.jsonb_build_object('approval_id',
    fabric._file_approval(v_tenant, p_action, p_memory_id, NULL, coalesce(p_target, '{}'), p_reason));
END $$;
COMMENT ON FUNCTION fabric_api.request_approval(uuid, text, jsonb, text) IS
  'Request a policy approval for one record and action; the target has the action''s shape '
  '(promote {"tier", "supersedes"?}, supersede {"proposal_id", "retention_class"?}, erase {}). '
  'Committer only. Example: SELECT '
  'fabric_api.request_approval(''<memory_id>'', ''promote'', ''{"tier": "relational"}'', ''billing master data'');';

-- ---------------------------------------------------------------------------------------
-- fabric._approval_for_update: the approval a decision or its application works on, locked
-- until the transaction ends, with its tenant and the caller as the actor set first; an
-- unknown id is P0002, with p_hint saying where such ids come from. The one lookup of
-- fabric_api.decide_approval and fabric_api.merge_entities.
CREATE OR REPLACE FUNCTION fabric._approval_for_update(p_approval_id uuid, p_hint text)
RETURNS fabric.approvals
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := fabric._tenant_of_approval(p_approval_id);
  v fabric.approvals;
BEGIN
  IF v_tenant IS NULL THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown approval', p_hint);
  END IF;
  PERFORM fabric._set_context('tenant_id', v_tenant);
  PERFORM fabric._set_context('actor', fabric._actor_id());
  SELECT * INTO v FROM fabric.approvals a
  WHERE a.tenant_id = v_tenant AND a.approval_id = p_approval_id FOR UPDATE;
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.decide_approval: os-agt-002 approves or denies a pending, unexpired request.
CREATE OR REPLACE FUNCTION fabric_api.decide_approval(p_approval_id uuid, p_decision text,
                                                      p_reason text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v fabric.approvals;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_policy', 'decide approvals');
  IF p_decision IS NULL OR p_decision NOT IN ('approved', 'denied') THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'decision must be approved or denied',
      'e.g. fabric_api.decide_approval(id, ''approved'', ''ok'')');
  END IF;
  v := fabric._approval_for_update(p_approval_id,
    'approval ids come from fabric_api.request_approval');
  v_tenant := v.tenant_id;
  IF v.status <> 'pending' THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      pg_catalog.format('the approval is already %s', v.status),
      'a decision is final; request a new approval');
  END IF;
  IF v.expires_at <= pg_catalog.now() THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'the approval request has expired',
      'request a new approval');
  END IF;
  UPDATE fabric.approvals a SET status = p_decision, decided_by = fabric._actor_id(),
         decided_at = pg_catalog.now(), decision_reason = p_reason
  WHERE a.tenant_id = v_tenant AND a.approval_id = p_approval_id;
  PERFORM fabric._emit('memory.approval.decided', v_tenant, NULL, NULL, v.memory_id, NULL,
    pg_catalog.jsonb_build_object('approval_id', p_approval_id, 'action', v.action,
                                  'decision', p_decision));
  RETURN pg_catalog.jsonb_build_object('approval_id', p_approval_id, 'status', p_decision);
END $$;
COMMENT ON FUNCTION fabric_api.decide_approval(uuid, text, text) IS
  'Approve or deny a pending approval. Policy (os-agt-002) only. Example: SELECT '
  'fabric_api.decide_approval(''<approval_id>'', ''approved'', ''within policy'');';
