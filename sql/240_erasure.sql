-- Erasure (R-ERASE-1): an approved action that leaves a tombstone. Content and the subject,
-- session and agent ids are destroyed in the record, its proposal(s), the search text, the
-- stored embeddings and every derived table; the tombstone keeps memory_id, tier, tenant,
-- content_hash, provenance, derived_from, validity interval, approval and erasure time.
-- A data subject's erasure also withdraws the subject's uncommitted proposals.

-- ---------------------------------------------------------------------------------------
-- fabric_api.request_erasure: file an erasure approval for one record.
CREATE OR REPLACE FUNCTION fabric_api.request_erasure(p_memory_id uuid, p_reason text,
                                                      p_legal_erasure boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text := fabric._tenant_of_known_record(p_memory_id);
  v_id uuid;
BEGIN
  PERFORM fabric._committer_enabled_in(v_tenant, v_committer);
  PERFORM fabric._set_context('actor', v_committer);
  v_id := fabric._file_approval(v_tenant, 'erase', p_memory_id, NULL, '{}', p_reason);
  UPDATE fabric.approvals a SET legal_erasure = coalesce(p_legal_erasure, false)
  WHERE a.tenant_id = v_tenant AND a.approval_id = v_id;
  RETURN pg_catalog.jsonb_build_object('approval_id', v_id);
END $$;
COMMENT ON FUNCTION fabric_api.request_erasure(uuid, text, boolean) IS
  'Request the erasure of one record (policy decides). Committer only. Example: SELECT '
  'fabric_api.request_erasure(''<memory_id>'', ''right to erasure, ticket 4411'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.request_subject_erasure: one approval for all of a data subject's records
-- and proposals.
CREATE OR REPLACE FUNCTION fabric_api.request_subject_erasure(p_tenant_id text, p_subject_id text,
  p_reason text, p_legal_erasure boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_id uuid;
BEGIN
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._committer_enabled_in(p_tenant_id, v_committer);
  IF p_subject_id IS NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'subject_id is required',
      'e.g. user-8842');
  END IF;
  PERFORM fabric._ident(p_subject_id, 'subject_id');
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  PERFORM fabric._set_context('actor', v_committer);
  v_id := fabric._file_approval(p_tenant_id, 'erase_subject', NULL, p_subject_id, '{}', p_reason);
  UPDATE fabric.approvals a SET legal_erasure = coalesce(p_legal_erasure, false)
  WHERE a.tenant_id = p_tenant_id AND a.approval_id = v_id;
  RETURN pg_catalog.jsonb_build_object('approval_id', v_id);
END $$;
COMMENT ON FUNCTION fabric_api.request_subject_erasure(text, text, text, boolean) IS
  'Request the erasure of every record and proposal of a data subject. Committer only. '
  'Example: SELECT fabric_api.request_subject_erasure(''acme'', ''user-8842'', ''GDPR art. 17'');';

-- ---------------------------------------------------------------------------------------
-- fabric._tombstone: erase one locked record under the approval in context. p_erasing is
-- every record the same erasure tombstones (locked before the first one): a record derived
-- from this one is flagged for review only if it outlives the erasure, so the flags never
-- depend on the order in which the erasure reaches the records.
DROP FUNCTION IF EXISTS fabric._tombstone(fabric.memory_records, fabric.approvals, text);  -- older signature
CREATE OR REPLACE FUNCTION fabric._tombstone(p_record fabric.memory_records, p_approval fabric.approvals,
                                             p_committer text, p_erasing uuid[])
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_floor interval;
  v_embeddings integer;
  v_proposals integer;
  v_recommendations integer;
  v_flagged integer;
  v_closed integer := 0;
  v_flag record;
  v_destroyed jsonb;
BEGIN
  IF p_record.retention_class = 'regulated' AND NOT p_approval.legal_erasure THEN
    SELECT l.floor INTO v_floor FROM fabric._regulated_limits(p_record) l;
    IF v_floor IS NOT NULL AND p_record.recorded_at + v_floor > pg_catalog.now() THEN
      PERFORM fabric._refuse_approval('a regulated record is erased before its floor only under a legal erasure');
    END IF;
  END IF;
  UPDATE fabric.memory_records m
  SET content = NULL, subject_id = NULL, session_id = NULL, agent_id = NULL,
      consolidation_state = 'tombstoned', erased_at = pg_catalog.now(),
      erasure_approval_id = p_approval.approval_id
  WHERE m.tenant_id = p_record.tenant_id AND m.memory_id = p_record.memory_id;
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM fabric._flush_shard_events(p_record.tenant_id);  -- Citus: the shard triggers' events
  END IF;
  DELETE FROM fabric.memory_embeddings e
  WHERE e.tenant_id = p_record.tenant_id AND e.memory_id = p_record.memory_id;
  GET DIAGNOSTICS v_embeddings = ROW_COUNT;
  UPDATE fabric.proposals p
  SET content = NULL, subject_id = NULL, session_id = NULL, agent_id = NULL
  WHERE p.tenant_id = p_record.tenant_id AND p.proposal_id = p_record.proposal_id;
  GET DIAGNOSTICS v_proposals = ROW_COUNT;
  -- A recommendation citing the record (or forming it) holds the content os-agt-011 (or a
  -- model) drew from it: that copy goes too; the ids, kind and status stay.
  UPDATE fabric.recommendations r
  SET proposal = r.proposal - 'content'
  WHERE r.tenant_id = p_record.tenant_id
    AND (p_record.memory_id = ANY (r.sources) OR r.memory_id = p_record.memory_id)
    AND r.proposal ? 'content';
  GET DIAGNOSTICS v_recommendations = ROW_COUNT;
  -- Records derived from it, and assertions it corroborated (fabric.memory_corroborations:
  -- their support shrank the same way), are flagged for review.
  INSERT INTO fabric.review_flags (tenant_id, memory_id, tombstoned_source)
  SELECT l.tenant_id, l.memory_id, l.derived_from_id
  FROM (SELECT l.tenant_id, l.memory_id, l.derived_from_id FROM fabric.memory_lineage l
        WHERE l.tenant_id = p_record.tenant_id AND l.derived_from_id = p_record.memory_id
        UNION
        SELECT c.tenant_id, c.memory_id, c.episode_id FROM fabric.memory_corroborations c
        WHERE c.tenant_id = p_record.tenant_id AND c.episode_id = p_record.memory_id) l
  JOIN fabric.memory_records d ON d.tenant_id = l.tenant_id AND d.memory_id = l.memory_id
  WHERE d.consolidation_state <> 'tombstoned' AND l.memory_id <> ALL (p_erasing)
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS v_flagged = ROW_COUNT;
  -- An open flag asking about this record (raised when a source of it was erased before)
  -- is answered by this erasure: closed as 'erased', with its event, so no flag stays open
  -- on a tombstone whichever of a source and its derived record was erased first.
  FOR v_flag IN
    UPDATE fabric.review_flags f
    SET resolved_at = pg_catalog.now(), resolution = 'erased', resolved_by = p_committer,
        resolution_reason = 'the flagged record was erased'
    WHERE f.tenant_id = p_record.tenant_id AND f.memory_id = p_record.memory_id
      AND f.resolved_at IS NULL
    RETURNING f.flag_id, f.tombstoned_source
  LOOP
    v_closed := v_closed + 1;
    PERFORM fabric._emit('memory.review_flag.resolved', p_record.tenant_id, NULL, NULL,
      p_record.memory_id, NULL, pg_catalog.jsonb_build_object('flag_id', v_flag.flag_id,
        'tombstoned_source', v_flag.tombstoned_source, 'decision', 'erased',
        'approval_id', p_approval.approval_id));
  END LOOP;
  v_destroyed := pg_catalog.jsonb_build_object(
    'record', pg_catalog.jsonb_build_array('content', 'search_text', 'subject_id', 'session_id', 'agent_id'),
    'proposals', v_proposals, 'recommendations', v_recommendations, 'embeddings', v_embeddings,
    'flagged_for_review', v_flagged,
    'review_flags_closed', v_closed,
    'kept', pg_catalog.jsonb_build_array('memory_id', 'tier', 'tenant_id', 'content_hash',
      'provenance', 'derived_from', 'validity_interval', 'erasure_approval_id', 'erased_at'));
  INSERT INTO fabric.erasure_receipts (tenant_id, memory_id, approval_id, erased_by, destroyed)
  VALUES (p_record.tenant_id, p_record.memory_id, p_approval.approval_id, p_committer, v_destroyed);
  RETURN v_destroyed;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._subject_key_receipt: what a subject erasure states about the subject's key.
CREATE OR REPLACE FUNCTION fabric._subject_key_receipt()
RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.jsonb_build_object('subject_key', pg_catalog.jsonb_build_object(
    'destroyed', true,
    'unlinked', pg_catalog.jsonb_build_array('events', 'approvals'),
    'note', 'events and approvals name the subject only by pseudonyms under this key; without '
            'it they stay countable but can no longer be linked to the subject. Backups taken '
            'before the erasure still hold the key.'))
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.erase: execute an approved erasure (one record or one data subject). Returns
-- the tables to VACUUM so the old tuple versions leave the heap (the worker does it).
CREATE OR REPLACE FUNCTION fabric_api.erase(p_approval_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text := fabric._tenant_of_approval(p_approval_id);
  v_approval fabric.approvals;
  v_record fabric.memory_records;
  v_erased uuid[] := '{}';
  v_erasing uuid[];
  v_proposal record;
  v_proposals integer := 0;
  v_withdrawn integer := 0;
  v_subject text;
  v_shredded boolean := false;
  v_threads text[] := '{}';
  v_recalled jsonb;
  v_recalled_threads text[];
  v_receipt jsonb;
  v_receipts jsonb;
  -- a value, not now() in a CASE or COALESCE of an UPDATE: Citus pushes no such UPDATE down
  v_now timestamptz := pg_catalog.now();
BEGIN
  IF v_tenant IS NULL THEN
    PERFORM fabric._refuse_approval('no such approval');
  END IF;
  PERFORM fabric._committer_enabled_in(v_tenant, v_committer);
  PERFORM fabric._set_context('actor', v_committer);
  SELECT * INTO v_approval FROM fabric.approvals a
  WHERE a.tenant_id = v_tenant AND a.approval_id = p_approval_id;
  IF v_approval.action NOT IN ('erase', 'erase_subject') THEN
    PERFORM fabric._refuse_approval(pg_catalog.format('the approval is for %s, not erasure', v_approval.action));
  END IF;
  v_subject := fabric._subject_of_ref(v_tenant, v_approval.subject_ref);
  IF v_approval.action = 'erase_subject' AND v_subject IS NULL THEN
    PERFORM fabric._refuse_approval('the subject was already erased (its key is destroyed)');
  END IF;
  v_approval := fabric._consume_approval(v_tenant, p_approval_id, v_approval.action,
                                         v_approval.memory_id, v_subject);
  IF v_approval.action = 'erase_subject' THEN
    -- The subject's proposals first: uncommitted ones are withdrawn (terminal, with their
    -- event), so no drain ever tries to commit a scrubbed proposal; a committer holding one
    -- is waited for, and the record it formed is erased by the loop below.
    FOR v_proposal IN
      UPDATE fabric.proposals p
      SET content = NULL, subject_id = NULL, session_id = NULL, agent_id = NULL,
          status = CASE WHEN p.status = 'validated' THEN 'withdrawn' ELSE p.status END,
          decided_at = CASE WHEN p.status = 'validated' THEN v_now ELSE p.decided_at END
      WHERE p.tenant_id = v_tenant AND p.subject_id = v_subject
      RETURNING p.proposal_id, p.status, p.correlation_id, p.causation_id
    LOOP
      v_proposals := v_proposals + 1;
      CONTINUE WHEN v_proposal.status <> 'withdrawn';
      v_withdrawn := v_withdrawn + 1;
      PERFORM fabric._emit('memory.proposal.withdrawn', v_tenant, v_proposal.correlation_id,
        v_proposal.causation_id, NULL, v_proposal.proposal_id,
        pg_catalog.jsonb_build_object('approval_id', p_approval_id,
                                      'reason', 'the data subject was erased'));
    END LOOP;
  END IF;
  -- Every record of the erasure is locked and known before the first is tombstoned: what
  -- one tombstone flags for review must not depend on which record the loop reaches first.
  SELECT coalesce(pg_catalog.array_agg(t.memory_id ORDER BY t.memory_id), '{}') INTO v_erasing
  FROM (SELECT m.memory_id FROM fabric.memory_records m
        WHERE m.tenant_id = v_tenant AND m.consolidation_state <> 'tombstoned'
          AND ((v_approval.action = 'erase' AND m.memory_id = v_approval.memory_id)
               OR (v_approval.action = 'erase_subject' AND m.subject_id = v_subject))
        ORDER BY m.memory_id
        FOR UPDATE) t;
  FOR v_record IN
    SELECT * FROM fabric.memory_records m
    WHERE m.tenant_id = v_tenant AND m.memory_id = ANY (v_erasing)
    ORDER BY m.memory_id
  LOOP
    PERFORM fabric._set_context('correlation_id', v_record.correlation_id);
    PERFORM fabric._tombstone(v_record, v_approval, v_committer, v_erasing);
    v_erased := v_erased || v_record.memory_id;
  END LOOP;
  IF v_approval.action = 'erase_subject' THEN
    UPDATE fabric.runs r SET subject_id = NULL, session_id = NULL
    WHERE r.tenant_id = v_tenant AND r.subject_id = v_subject;
    UPDATE fabric.temporal_summaries s SET subject_id = NULL
    WHERE s.tenant_id = v_tenant AND s.subject_id = v_subject;
    -- An agent token whose run template names the subject could open new runs for the
    -- erased person and keeps the id: it is revoked and forgets the subject and session.
    UPDATE fabric.agent_tokens t
    SET subject_id = NULL, session_id = NULL,
        revoked_at = COALESCE(t.revoked_at, GREATEST(v_now, t.issued_at))
    WHERE t.tenant_id = v_tenant AND t.subject_id = v_subject;
    -- The subject's time series (measurements about the person) go whole.
    DELETE FROM fabric.measurements m WHERE m.tenant_id = v_tenant AND m.subject_id = v_subject;
    -- The subject's LangGraph checkpoint threads (graph state, not memory) go whole.
    v_threads := fabric._erase_checkpoints(v_tenant, v_subject);
    -- Crypto-shredding: without the key no event or approval can be linked to the subject.
    v_shredded := fabric._shred_subject_key(v_tenant, v_subject);
    v_receipt := fabric._subject_key_receipt();  -- a value, not a call per row (Citus)
    UPDATE fabric.erasure_receipts r
    SET destroyed = r.destroyed || v_receipt
    WHERE r.tenant_id = v_tenant AND r.approval_id = p_approval_id;
  END IF;
  -- The checkpoint threads of every run that recall served an erased record: their graph
  -- state may hold the record's content (a recall answer kept in a node's state), so they
  -- go whole, in this transaction (after the subject's own threads, so a thread is listed
  -- once, as the subject's), and each receipt lists its record's.
  SELECT coalesce(pg_catalog.jsonb_object_agg(g.memory_id::text, pg_catalog.jsonb_build_object(
           'runs', g.runs, 'threads', g.threads)), '{}')
    INTO v_recalled
  FROM (SELECT t.memory_id, pg_catalog.count(DISTINCT t.run_id) AS runs,
               coalesce(pg_catalog.jsonb_agg(DISTINCT t.thread_id ORDER BY t.thread_id)
                          FILTER (WHERE t.thread_id IS NOT NULL), '[]') AS threads
        FROM fabric._recalled_checkpoint_threads(v_tenant, v_erasing) t
        GROUP BY t.memory_id) g;
  -- The checkpoint threads of consolidation runs whose candidate read named an erased
  -- record (their reflect-and-revise state may hold its content) are listed with them.
  SELECT coalesce(pg_catalog.jsonb_object_agg(k.id, pg_catalog.jsonb_build_object(
           'runs', coalesce((v_recalled #>> ARRAY[k.id, 'runs'])::integer, 0),
           'threads', (SELECT coalesce(pg_catalog.jsonb_agg(DISTINCT u ORDER BY u), '[]')
                       FROM (SELECT pg_catalog.jsonb_array_elements_text(
                                      coalesce(v_recalled #> ARRAY[k.id, 'threads'], '[]')) u
                             UNION
                             SELECT t.thread_id FROM fabric._consolidation_checkpoint_threads(
                                      v_tenant, v_erasing) t
                             WHERE t.memory_id::text = k.id) us))), '{}')
    INTO v_recalled
  FROM (SELECT pg_catalog.jsonb_object_keys(v_recalled) AS id
        UNION SELECT t.memory_id::text FROM fabric._consolidation_checkpoint_threads(v_tenant, v_erasing) t) k;
  v_recalled_threads := ARRAY(
    SELECT DISTINCT x FROM pg_catalog.jsonb_each(v_recalled) e,
      LATERAL pg_catalog.jsonb_array_elements_text(e.value -> 'threads') x ORDER BY x);
  PERFORM fabric._delete_checkpoint_threads(v_recalled_threads);
  -- Each receipt: how many runs recall served the record, and the checkpoint threads the
  -- erasure deleted for it (its runs' threads, and for a subject the subject's threads).
  -- made first, by record, then written with immutable operators only (Citus calls no
  -- STABLE function with a column of the updated row)
  SELECT coalesce(pg_catalog.jsonb_object_agg(r.memory_id::text, pg_catalog.jsonb_build_object(
    'recalled_in_runs', coalesce((v_recalled #>> ARRAY[r.memory_id::text, 'runs'])::integer, 0),
    'checkpoint_threads', (SELECT coalesce(pg_catalog.jsonb_agg(DISTINCT u.thread_id ORDER BY u.thread_id), '[]')
      FROM (SELECT pg_catalog.jsonb_array_elements_text(
                     coalesce(v_recalled #> ARRAY[r.memory_id::text, 'threads'], '[]')) AS thread_id
            UNION SELECT pg_catalog.unnest(v_threads)) u))), '{}')
    INTO v_receipts
  FROM fabric.erasure_receipts r
  WHERE r.tenant_id = v_tenant AND r.approval_id = p_approval_id;
  UPDATE fabric.erasure_receipts r
  SET destroyed = r.destroyed || (v_receipts -> r.memory_id::text)
  WHERE r.tenant_id = v_tenant AND r.approval_id = p_approval_id;
  v_threads := ARRAY(SELECT DISTINCT t FROM pg_catalog.unnest(v_threads || v_recalled_threads) t
                     ORDER BY t);
  RETURN pg_catalog.jsonb_build_object('approval_id', p_approval_id, 'action', v_approval.action,
    'erased', pg_catalog.to_jsonb(v_erased), 'proposals_scrubbed', v_proposals,
    'proposals_withdrawn', v_withdrawn,
    'checkpoint_threads', pg_catalog.to_jsonb(v_threads),
    'subject_key', CASE WHEN v_approval.action = 'erase_subject' THEN
                     fabric._subject_key_receipt() -> 'subject_key' END,
    'vacuum', pg_catalog.jsonb_build_array('fabric.memory_records', 'fabric.proposals',
      'fabric.memory_embeddings', 'fabric.runs', 'fabric.agent_tokens',
      'fabric.temporal_summaries', 'fabric.measurements', 'fabric.subject_keys', 'langgraph.checkpoints', 'langgraph.checkpoint_blobs',
      'langgraph.checkpoint_writes'));
END $$;
COMMENT ON FUNCTION fabric_api.erase(uuid) IS
  'Execute an approved erasure, leaving tombstones (a subject''s uncommitted proposals are '
  'withdrawn; the checkpoint threads of the subject and of every run recall served an erased '
  'record are deleted and listed); then VACUUM the returned tables. Committer only. Example: SELECT fabric_api.erase(''<approval_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.store_embedding: the only way an embedding is written. A tombstoned or
-- content-less record refuses it, so a projector racing an erasure cannot resurrect it.
CREATE OR REPLACE FUNCTION fabric_api.store_embedding(p_memory_id uuid, p_model text,
  p_model_version text, p_embedding ext.vector, p_content_hash text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  -- a value: Citus allows only immutable functions in DO UPDATE SET on a distributed table
  v_now timestamptz := pg_catalog.now();
  v_tenant text;
  v fabric.memory_records;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_projector', 'store embeddings');
  v_tenant := fabric._tenant_of_known_record(p_memory_id);
  PERFORM fabric._set_context('tenant_id', v_tenant);
  SELECT * INTO v FROM fabric.memory_records m
  WHERE m.tenant_id = v_tenant AND m.memory_id = p_memory_id FOR SHARE;
  IF v.consolidation_state = 'tombstoned' OR v.content IS NULL THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'the record has no content (erased or expired); no embedding is stored',
      'drop the projection of this record instead');
  END IF;
  IF v.content_hash IS DISTINCT FROM p_content_hash THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'the embedding was computed from other content than the record holds',
      're-read the record and embed again');
  END IF;
  INSERT INTO fabric.memory_embeddings (tenant_id, memory_id, model, model_version, dims,
                                        embedding, content_hash)
  VALUES (v_tenant, p_memory_id, p_model, p_model_version, ext.vector_dims(p_embedding),
          p_embedding, p_content_hash)
  ON CONFLICT (tenant_id, memory_id, model, model_version)
  DO UPDATE SET embedding = EXCLUDED.embedding, dims = EXCLUDED.dims,
                content_hash = EXCLUDED.content_hash, created_at = v_now;
  RETURN true;
END $$;
COMMENT ON FUNCTION fabric_api.store_embedding(uuid, text, text, ext.vector, text) IS
  'Store a record''s embedding (refused for tombstoned or content-less records). Projector '
  'only. Example: SELECT fabric_api.store_embedding(''<memory_id>'', ''all-MiniLM-L6-v2'', ''v1'', ''[...]'', ''sha256:...'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.review_queue: records derived from tombstoned records, for os-agt-011.
CREATE OR REPLACE FUNCTION fabric_api.review_queue(p_tenant_id text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_consolidator(p_tenant_id);
  RETURN (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
            'flag_id', f.flag_id, 'memory_id', f.memory_id, 'tombstoned_source', f.tombstoned_source,
            'flagged_at', f.flagged_at) ORDER BY f.flagged_at, f.memory_id), '[]')
          FROM fabric.review_flags f WHERE f.tenant_id = p_tenant_id AND f.resolved_at IS NULL);
END $$;
COMMENT ON FUNCTION fabric_api.review_queue(text) IS
  'Open review flags: records derived from tombstoned records (not cascaded); resolve '
  'each with fabric_api.resolve_review_flag. Consolidator only. Example: SELECT fabric_api.review_queue(''acme'');';

-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_review_flag: which tenant a review flag belongs to (content-free lookup).
SET LOCAL ROLE fabric_lookup;
CREATE OR REPLACE FUNCTION fabric._tenant_of_review_flag(p_flag_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT f.tenant_id FROM fabric.review_flags f WHERE f.flag_id = p_flag_id);
END $$;
REVOKE ALL ON FUNCTION fabric._tenant_of_review_flag(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._tenant_of_review_flag(uuid) TO fabric_owner;
SET LOCAL ROLE fabric_owner;
GRANT SELECT (tenant_id, flag_id) ON fabric.review_flags TO fabric_lookup;

-- ---------------------------------------------------------------------------------------
-- fabric_api.resolve_review_flag: os-agt-011 judges a record derived from a tombstoned
-- one, once: keep it, or request its erasure (an erase approval that policy decides and
-- the committer executes). The resolution is recorded on the flag and in an event, and
-- the flag leaves the review queue.
CREATE OR REPLACE FUNCTION fabric_api.resolve_review_flag(p_flag_id uuid, p_decision text,
                                                          p_reason text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_agent text;
  v_flag fabric.review_flags;
  v_approval uuid;
BEGIN
  SELECT e.tenant, e.agent INTO v_tenant, v_agent
  FROM fabric._enter_flag_resolution('review', p_flag_id, p_decision,
    ARRAY['keep', 'request_erasure'],
    'keep the derived record, or request_erasure to file an erasure approval for it',
    p_reason, 'say why the derived record is kept or should be erased') e;
  SELECT * INTO v_flag FROM fabric.review_flags f
  WHERE f.tenant_id = v_tenant AND f.flag_id = p_flag_id;
  IF p_decision = 'request_erasure' THEN
    v_approval := fabric._file_approval(v_tenant, 'erase', v_flag.memory_id, NULL, '{}', p_reason);
  END IF;
  UPDATE fabric.review_flags f
  SET resolved_at = pg_catalog.now(), resolution = p_decision, resolved_by = v_agent,
      resolution_reason = p_reason
  WHERE f.tenant_id = v_tenant AND f.flag_id = p_flag_id;
  PERFORM fabric._emit('memory.review_flag.resolved', v_tenant, NULL, NULL, v_flag.memory_id, NULL,
    pg_catalog.jsonb_build_object('flag_id', p_flag_id, 'tombstoned_source', v_flag.tombstoned_source,
                                  'decision', p_decision, 'approval_id', v_approval));
  RETURN pg_catalog.jsonb_build_object('flag_id', p_flag_id, 'memory_id', v_flag.memory_id,
    'decision', p_decision, 'approval_id', v_approval);
END $$;
COMMENT ON FUNCTION fabric_api.resolve_review_flag(uuid, text, text) IS
  'Resolve a review flag once: keep the derived record or request its erasure (files an '
  'erase approval). Consolidator only. Example: SELECT fabric_api.resolve_review_flag('
  '''<flag_id>'', ''keep'', ''the summary holds nothing of the erased source'');';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.verify_tombstone: does a claimed content match the record's content hash?
CREATE OR REPLACE FUNCTION fabric_audit.verify_tombstone(p_memory_id uuid, p_claimed_content jsonb)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := fabric._tenant_of_known_record(p_memory_id);
BEGIN
  PERFORM fabric._require_role('fabric_auditor', 'verify tombstones');
  PERFORM fabric._enter_audit(v_tenant);
  RETURN (SELECT m.content_hash = fabric.content_hash(p_claimed_content)
          FROM fabric.memory_records m WHERE m.tenant_id = v_tenant AND m.memory_id = p_memory_id);
END $$;
COMMENT ON FUNCTION fabric_audit.verify_tombstone(uuid, jsonb) IS
  'Check a claim about what an erased record contained against its content hash. Auditors '
  'only. Example: SELECT fabric_audit.verify_tombstone(''<memory_id>'', ''{"text": "..."}'');';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.erasure_receipt: what was destroyed, when, under which approval.
CREATE OR REPLACE FUNCTION fabric_audit.erasure_receipt(p_memory_id uuid)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := fabric._tenant_of_known_record(p_memory_id);
BEGIN
  PERFORM fabric._require_role('fabric_auditor', 'read erasure receipts');
  PERFORM fabric._enter_audit(v_tenant);
  RETURN (SELECT pg_catalog.jsonb_build_object('memory_id', r.memory_id, 'tenant_id', r.tenant_id,
            'approval_id', r.approval_id, 'erased_at', r.erased_at, 'erased_by', r.erased_by,
            'destroyed', r.destroyed, 'approval', pg_catalog.jsonb_build_object(
              'action', a.action, 'reason', a.reason, 'requested_by', a.requested_by,
              'decided_by', a.decided_by, 'decided_at', a.decided_at, 'legal_erasure', a.legal_erasure))
          FROM fabric.erasure_receipts r
          JOIN fabric.approvals a ON a.tenant_id = r.tenant_id AND a.approval_id = r.approval_id
          WHERE r.tenant_id = v_tenant AND r.memory_id = p_memory_id);
END $$;
COMMENT ON FUNCTION fabric_audit.erasure_receipt(uuid) IS
  'The erasure receipt of a tombstone. Auditors only. '
  'Example: SELECT fabric_audit.erasure_receipt(''<memory_id>'');';
