-- The working tier (Redis) meets the durable tiers here and nowhere else: the hand-off that
-- proposes episodes from working items, the promoted event their commit emits, the scope a
-- subject erasure clears in Redis, and the air-gapped check of the Redis URI.

-- ---------------------------------------------------------------------------------------
-- fabric._working_subject_key: the unkeyed digest that named a subject in working-tier keys
-- by 0.11 and earlier (s- + 32 hex of SHA-256 of tenant:subject). Nothing writes it any more; a
-- subject erasure still deletes keys under it, which expire by their TTL anyway. Anyone
-- can compute it from a guessed subject id, so it is handed to the erasing committer and
-- never stored: no receipt holds it.
CREATE OR REPLACE FUNCTION fabric._working_subject_key(p_tenant_id text, p_subject_id text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT 's-' || pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
    pg_catalog.convert_to(p_tenant_id || ':' || p_subject_id, 'UTF8')), 'hex'), 32)
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._working_key: the key segment that names a subject in working-tier keys: w- and
-- 32 hex of the subject's keyed pseudonym (HMAC under the subject's key, kind 'working'),
-- 'anon' for no subject. Only the database holds the key, so only it names the segment;
-- a subject erasure destroys the key, and then no key or receipt links to the subject.
-- Makes the subject's key on first use (in the tenant of the context).
CREATE OR REPLACE FUNCTION fabric._working_key(p_tenant_id text, p_subject_id text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_subject_id IS NULL THEN
    RETURN 'anon';
  END IF;
  RETURN 'w-' || pg_catalog.left(pg_catalog.substr(fabric._pseudonym(
    (fabric._subject_key(p_tenant_id, p_subject_id)).key, 'working', p_subject_id), 6), 32);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.working_key: the working-tier key segment of the calling agent's open run
-- (memfabric.working.run_ref reads it once per run and names every key of the run with it).
CREATE OR REPLACE FUNCTION fabric_api.working_key(p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_run fabric.runs;
BEGIN
  PERFORM fabric._reset_context();
  v_run := fabric._enter_run(p_run_id);
  RETURN pg_catalog.jsonb_build_object('tenant_id', v_run.tenant_id, 'run_id', v_run.run_id,
    'subject_key', fabric._working_key(v_run.tenant_id, v_run.subject_id));
END $$;
COMMENT ON FUNCTION fabric_api.working_key(uuid) IS
  'The working-tier key segment of your open run: {"tenant_id","run_id","subject_key"} '
  '(w- and 32 hex, keyed by the subject''s key; anon without a subject). Agents only. '
  'Example: SELECT fabric_api.working_key(''<run_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.handoff: the only path from working memory to durable memory. Each working
-- item becomes one proposed raw episode whose provenance is the item's own event id, with
-- the item's correlation and causation ids; the proposal is marked from_tier working, so
-- its commit emits memory.record.promoted. Every rule of propose applies: it enters as
-- propose does (fabric._propose_entry) and files each item as propose files an envelope.
CREATE OR REPLACE FUNCTION fabric_api.handoff(p_items jsonb, p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_entry record := fabric._propose_entry(p_run_id, 0);
  v_run fabric.runs := v_entry.run;
  v_denied integer := 0;
  v_item jsonb;
  v_envelope jsonb;
  v_answer jsonb;
  v_answers jsonb := '[]';
BEGIN
  IF p_items IS NULL OR pg_catalog.jsonb_typeof(p_items) <> 'array'
     OR pg_catalog.jsonb_array_length(p_items) NOT BETWEEN 1 AND 100 THEN
    PERFORM fabric._bad_envelope('handoff items must be an array of 1-100 working items',
      'hand off a run''s working items in batches of at most 100');
  END IF;
  FOR v_item IN SELECT x FROM pg_catalog.jsonb_array_elements(p_items) x LOOP
    IF pg_catalog.jsonb_typeof(v_item) <> 'object'
       OR (v_item - ARRAY['event_id', 'correlation_id', 'causation_id', 'content', 'visibility',
                          'confidence', 'occurred_at', 'retention_class']) <> '{}'::jsonb THEN
      PERFORM fabric._bad_envelope('a working item has keys outside the hand-off item',
        'allowed: event_id, correlation_id, causation_id, content, visibility, confidence, '
        'occurred_at, retention_class; tier and formation method are fixed (episodic, extraction)');
    END IF;
    IF fabric._envelope_text(v_item -> 'event_id', 'event_id') IS NULL THEN
      PERFORM fabric._bad_envelope('a working item needs its event_id',
        'the event id of the turn or observation becomes provenance.source_event_id');
    END IF;
    -- Idempotent: an item this agent already handed off (and that still stands) answers
    -- its first proposal, so a run resumed after Redis was lost never forms it twice.
    SELECT pg_catalog.jsonb_build_object('proposal_id', p.proposal_id, 'status', p.status,
                                         'reason', p.reason, 'replayed', true)
    INTO v_answer
    FROM fabric.proposals p
    WHERE p.tenant_id = v_run.tenant_id AND p.proposed_by = v_run.agent_id
      AND p.from_tier = 'working' AND p.source_event_id = (v_item ->> 'event_id')
      AND p.status IN ('validated', 'committed')
    ORDER BY p.proposed_at LIMIT 1;
    IF v_answer IS NOT NULL THEN
      v_answers := v_answers || pg_catalog.jsonb_build_array(
        v_answer || pg_catalog.jsonb_build_object('event_id', v_item -> 'event_id'));
      CONTINUE;
    END IF;
    -- A rejected hand-off does not count: it gives up the item's idempotency key, so the
    -- same item handed off again (its cause fixed: the agent's profile, the run) is judged
    -- and filed anew instead of answering the old rejection. A withdrawn one keeps its key:
    -- its subject was erased, and a replayed item does not re-form erased memory.
    UPDATE fabric.proposals p SET request_hash = NULL
    WHERE p.tenant_id = v_run.tenant_id AND p.proposed_by = v_run.agent_id
      AND p.source_event_id = (v_item ->> 'event_id') AND p.request_hash IS NOT NULL
      AND p.from_tier = 'working' AND p.status = 'rejected';
    v_envelope := pg_catalog.jsonb_build_object(
      'tier', 'episodic',
      'scope', pg_catalog.jsonb_build_object('tenant_id', v_run.tenant_id,
        'visibility', coalesce(v_item -> 'visibility',
                               pg_catalog.to_jsonb(CASE WHEN v_run.session_id IS NULL
                                                        THEN 'subject' ELSE 'session' END))),
      'content', v_item -> 'content',
      'provenance', pg_catalog.jsonb_build_object('source_event_id', v_item -> 'event_id',
        'correlation_id', v_item -> 'correlation_id', 'causation_id', v_item -> 'causation_id',
        'formation_method', 'extraction'),
      'confidence', coalesce(v_item -> 'confidence', '1'::jsonb),
      'validity_interval', pg_catalog.jsonb_build_object('valid_from', v_item -> 'occurred_at'))
      || CASE WHEN v_item ? 'retention_class'
              THEN pg_catalog.jsonb_build_object('retention_class', v_item -> 'retention_class')
              ELSE '{}'::jsonb END;
    -- Without the propose tool each item is denied (one event each, written below).
    IF v_entry.denial IS NOT NULL THEN
      v_denied := v_denied + 1;
      v_answer := v_entry.denial;
    ELSE
      v_answer := fabric._file_proposal(v_run, v_entry.agent, v_envelope);
    END IF;
    IF v_answer ->> 'proposal_id' IS NOT NULL THEN
      UPDATE fabric.proposals p SET from_tier = 'working'
      WHERE p.tenant_id = v_run.tenant_id AND p.proposal_id = (v_answer ->> 'proposal_id')::uuid;
    END IF;
    v_answers := v_answers || pg_catalog.jsonb_build_array(
      v_answer || pg_catalog.jsonb_build_object('event_id', v_item -> 'event_id'));
  END LOOP;
  IF v_denied > 0 THEN
    PERFORM fabric._propose_denial(v_run, v_denied);
  END IF;
  RETURN v_answers;
END $$;
COMMENT ON FUNCTION fabric_api.handoff(jsonb, uuid) IS
  'Hand working items off to durable memory: one proposed raw episode per item (provenance = '
  'the item''s event ids, formation extraction); its commit emits memory.record.promoted from '
  'working. Answers one propose answer (+ event_id) per item; an item the agent already handed '
  'off (validated, committed or withdrawn) answers that proposal ("replayed": true), a rejected '
  'one is judged again. Agents only. Example: SELECT '
  'fabric_api.handoff(''[{"event_id":"evt-1","correlation_id":"corr-1","content":{"text":"..."}}]'', '
  '''<run_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric.tg_proposals__from_tier_guard: only the hand-off marks a proposal, once, before it
-- commits; nobody (not even the owner outside handoff) marks or unmarks one later.
CREATE OR REPLACE FUNCTION fabric.tg_proposals__from_tier_guard()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF OLD.from_tier IS NOT NULL OR OLD.status NOT IN ('validated', 'rejected')
     OR pg_catalog.current_setting('fabric.tenant_id', true) IS DISTINCT FROM OLD.tenant_id THEN
    PERFORM fabric._raise_rule('MF002',
      'a proposal''s from_tier is set once, by the hand-off, before it commits',
      'hand working items off with fabric_api.handoff(items, run_id)');
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _210_from_tier_guard
  BEFORE UPDATE OF from_tier ON fabric.proposals
  FOR EACH ROW WHEN (NEW.from_tier IS DISTINCT FROM OLD.from_tier)
  EXECUTE FUNCTION fabric.tg_proposals__from_tier_guard();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_proposals__emit_handoff: R-TIER-1 for the working -> episodic crossing. The
-- commit of a handed-off proposal emits memory.record.promoted in its own transaction, with
-- the record's (= the working item's) correlation and causation ids unchanged.
CREATE OR REPLACE FUNCTION fabric.tg_proposals__emit_handoff()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: on the tenant's shard, staged for the coordinator's outbox (as the records'
    -- events; fabric._flush_shard_events)
    INSERT INTO fabric.shard_events (event_id, tenant_id, event_type, correlation_id,
                                     causation_id, actor_agent_id, run_id, memory_id,
                                     proposal_id, payload)
    VALUES (fabric._event_id(), NEW.tenant_id, 'memory.record.promoted',
            NEW.correlation_id, NEW.causation_id, fabric._setting('fabric.actor'),
            fabric._setting('fabric.run_id')::uuid, NEW.memory_id, NEW.proposal_id,
            pg_catalog.jsonb_build_object('from_tier', 'working', 'to_tier', NEW.tier,
              'state', 'raw', 'source_event_id', NEW.source_event_id));
    RETURN NULL;
  END IF;
  PERFORM fabric._emit('memory.record.promoted', NEW.tenant_id, NEW.correlation_id,
    NEW.causation_id, NEW.memory_id, NEW.proposal_id,
    pg_catalog.jsonb_build_object('from_tier', 'working', 'to_tier', NEW.tier, 'state', 'raw',
                                  'source_event_id', NEW.source_event_id));
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER _910_emit_handoff
  AFTER UPDATE OF status ON fabric.proposals
  FOR EACH ROW WHEN (NEW.status = 'committed' AND OLD.status <> 'committed'
                     AND NEW.from_tier = 'working')
  EXECUTE FUNCTION fabric.tg_proposals__emit_handoff();

-- ---------------------------------------------------------------------------------------
-- fabric_api.working_erasure_scope: what a subject erasure clears in the working tier — the
-- tenant, the subject's keyed segment and the unkeyed segment of keys written by 0.11 or earlier,
-- never the subject id. Read before fabric_api.erase destroys the key. Committer only; NULL
-- for an approval that is not a subject erasure.
CREATE OR REPLACE FUNCTION fabric_api.working_erasure_scope(p_approval_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text := fabric._tenant_of_approval(p_approval_id);
  v_subject text;
  v_ref text;
BEGIN
  IF v_tenant IS NULL THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown approval',
      'approval ids come from fabric_api.request_subject_erasure');
  END IF;
  PERFORM fabric._committer_enabled_in(v_tenant, v_committer);
  -- the approval's pseudonym first, then its subject: a helper that reads a table is never
  -- called inside a query of another (on Citus, a distributed query inside one on a shard)
  SELECT a.subject_ref INTO v_ref FROM fabric.approvals a
  WHERE a.tenant_id = v_tenant AND a.approval_id = p_approval_id AND a.action = 'erase_subject';
  v_subject := fabric._subject_of_ref(v_tenant, v_ref);
  IF v_subject IS NULL THEN
    RETURN NULL;
  END IF;
  RETURN pg_catalog.jsonb_build_object('tenant_id', v_tenant,
    'subject_key', fabric._working_key(v_tenant, v_subject),
    'legacy_subject_key', fabric._working_subject_key(v_tenant, v_subject));
END $$;
COMMENT ON FUNCTION fabric_api.working_erasure_scope(uuid) IS
  'The working-tier scope of a subject erasure: {"tenant_id","subject_key","legacy_subject_key"} '
  '(keyed and 0.11-era key segments, never the subject id), NULL for other approvals; read it '
  'before fabric_api.erase. Committer only. Example: SELECT '
  'fabric_api.working_erasure_scope(''<approval_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.check_working_uri: the air-gapped rule for the Redis URI of a tenant's working
-- tier, decided by the same host test as the model and embedding URIs (23514). A question
-- it cannot answer is refused, never allowed: no tenant or an empty one, or a URI without a
-- host (22023); a tenant that does not exist (P0002).
CREATE OR REPLACE FUNCTION fabric_api.check_working_uri(p_tenant_id text, p_uri text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._reset_context();
  IF p_tenant_id IS NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'check_working_uri needs the tenant whose working tier uses the URI',
      'e.g. fabric_api.check_working_uri(''acme'', ''redis://127.0.0.1:6379/0'')');
  END IF;
  PERFORM fabric._ident(p_tenant_id, 'tenant_id');
  PERFORM fabric._require_tenant(p_tenant_id);
  IF fabric._uri_host(p_uri) IS NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'the working-tier URI must name a host or a unix socket',
      'e.g. redis://127.0.0.1:6379/0, rediss://cache.internal:6380/0 or unix:///run/redis.sock');
  END IF;
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  IF EXISTS (SELECT 1 FROM fabric.instance_config c
             WHERE c.tenant_id = p_tenant_id AND c.deployment_mode = 'air-gapped'
               AND NOT fabric._host_is_local(fabric._uri_host(p_uri), c.local_hosts)) THEN
    PERFORM fabric._raise_rule('check_violation',
      'an air-gapped instance cannot use a working-tier (Redis) URI whose host is not local',
      'use a loopback or unix-socket Redis, or add the host to the instance''s local_hosts',
      p_constraint => 'instance_config_air_gapped_is_local');
  END IF;
END $$;
COMMENT ON FUNCTION fabric_api.check_working_uri(text, text) IS
  'Refuse (23514) a Redis URI whose host is not local to an air-gapped instance of the tenant. '
  'Example: SELECT fabric_api.check_working_uri(''acme'', ''redis://127.0.0.1:6379/0'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.record_working_erasure: the working tier's part of a subject erasure's receipt,
-- kept in the audit outbox (memory.working.erased): how many keys, which patterns (keyed
-- segments only, w-: their key is destroyed), never a key's content. An unkeyed s- pattern
-- is refused: anyone could confirm a guessed subject id against it, forever. Only after the
-- erasure ran (a consumed erase_subject approval).
CREATE OR REPLACE FUNCTION fabric_api.record_working_erasure(p_approval_id uuid,
                                                             p_keys_deleted integer,
                                                             p_patterns text[])
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text := fabric._tenant_of_approval(p_approval_id);
BEGIN
  IF v_tenant IS NULL THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown approval',
      'approval ids come from fabric_api.request_subject_erasure');
  END IF;
  PERFORM fabric._committer_enabled_in(v_tenant, v_committer);
  PERFORM fabric._set_context('actor', v_committer);
  IF NOT EXISTS (SELECT 1 FROM fabric.approvals a
                 WHERE a.tenant_id = v_tenant AND a.approval_id = p_approval_id
                   AND a.action = 'erase_subject' AND a.status = 'consumed') THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'a working-tier erasure is recorded only for an executed subject erasure',
      'run fabric_api.erase(approval_id) first');
  END IF;
  IF p_keys_deleted IS NULL OR p_keys_deleted < 0 OR p_patterns IS NULL
     OR pg_catalog.cardinality(p_patterns) NOT BETWEEN 1 AND 16
     OR EXISTS (SELECT 1 FROM pg_catalog.unnest(p_patterns) p
                WHERE p IS NULL OR p !~ ('^mf:' || v_tenant || ':w-[0-9a-f]{32}:\*$')) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a working-tier erasure names a key count and 1-16 keyed subject patterns of the tenant',
      'patterns look like mf:<tenant>:w-<32 hex>:*, from working_erasure_scope''s subject_key; '
      'an unkeyed (s-) pattern is never recorded');
  END IF;
  RETURN fabric._emit('memory.working.erased', v_tenant, p_payload =>
    pg_catalog.jsonb_build_object('approval_id', p_approval_id, 'keys_deleted', p_keys_deleted,
                                  'patterns', pg_catalog.to_jsonb(p_patterns)));
END $$;
COMMENT ON FUNCTION fabric_api.record_working_erasure(uuid, integer, text[]) IS
  'Record the working-tier part of an executed subject erasure (key count and patterns, no '
  'content) as a memory.working.erased event; answers its event id. Committer only. Example: '
  'SELECT fabric_api.record_working_erasure(''<approval_id>'', 3, ARRAY[''mf:acme:w-<hex>:*'']);';
