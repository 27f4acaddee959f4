-- The governed record: normalisation, immutability with its two carve-outs, the lifecycle
-- table, the history of mutable columns and the events, all from triggers, so no client --
-- not even the owner's own UPDATE -- changes a record without them.

-- ---------------------------------------------------------------------------------------
-- fabric._legal_transition: R-LIFE-1; committed records move only forward.
CREATE OR REPLACE FUNCTION fabric._legal_transition(p_from text, p_to text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN CASE p_from
    WHEN 'raw' THEN p_to IN ('consolidated', 'reflected', 'superseded', 'expired', 'tombstoned')
    WHEN 'consolidated' THEN p_to IN ('reflected', 'superseded', 'expired', 'tombstoned')
    WHEN 'reflected' THEN p_to IN ('superseded', 'expired', 'tombstoned')
    WHEN 'superseded' THEN p_to = 'tombstoned'
    WHEN 'expired' THEN p_to = 'tombstoned'
    ELSE false
  END;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._require_actor: lifecycle changes fail closed without the governance context.
CREATE OR REPLACE FUNCTION fabric._require_actor()
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  -- what fabric._setting('fabric.actor') answers, as a simple expression: this runs for
  -- every record formed or changed
  v_actor text := nullif(pg_catalog.current_setting('fabric.actor', true), '');
BEGIN
  IF v_actor IS NULL THEN
    PERFORM fabric._raise_rule('MF004',
      'memory records change only inside a governed action',
      'use the fabric_api functions; they set the acting agent (fabric.actor)');
  END IF;
  RETURN v_actor;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._refuse_formation: the refusal of a rule a record meets when it is formed, one
-- text for every path that checks it -- the row triggers, the bulk statement triggers
-- (`Rules as sets on the bulk paths`, below), fabric._commit_set and, on Citus,
-- fabric._require_episodic_source -- so the same input is refused alike on each: the
-- state at formation ('state'), its content ('content'), the database's stamps on a bulk
-- statement's rows ('stamps'), lineage written after the formation ('lineage'), a semantic
-- record without an episodic source ('episode'). Called on the refusal path only.
CREATE OR REPLACE FUNCTION fabric._refuse_formation(p_rule text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  CASE p_rule
    WHEN 'state' THEN
      PERFORM fabric._raise_rule('MF002',
        'a memory record is formed raw, consolidated or reflected',
        'later states are reached by governed transitions, never at formation');
    WHEN 'content' THEN
      PERFORM fabric._raise_rule('not_null_violation',
        'a memory record is formed with content',
        'content is removed only by erasure or retention-window closure');
    WHEN 'stamps' THEN
      PERFORM fabric._raise_rule('MF002',
        'a bulk statement formed a record without the database''s derived values',
        'form records through fabric_api functions');
    WHEN 'lineage' THEN
      PERFORM fabric._raise_rule('MF001',
        'derived_from is fixed when a record is formed',
        'lineage rows are written only in the transaction that forms the record');
    WHEN 'episode' THEN
      PERFORM fabric._raise_rule('check_violation',
        'semantic record needs at least one episodic source',
        'pass derived_from with the episodes it was extracted from',
        p_constraint => 'memory_records_semantic_needs_episode');
  END CASE;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._formed_content_hash: the content hash a formed record holds, computed by the
-- database; a hash the writer gave must be that one.
CREATE OR REPLACE FUNCTION fabric._formed_content_hash(p_content jsonb, p_given text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_hash text := fabric.content_hash(p_content);
BEGIN
  IF p_given IS NOT NULL AND p_given <> v_hash THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'content_hash does not match the content',
      'omit content_hash and let the database compute it (RFC 8785, SHA-256)');
  END IF;
  RETURN v_hash;
END $$;

-- ---------------------------------------------------------------------------------------
-- Rules as sets on the bulk paths. The set-based statements of fabric_api.import_records
-- and fabric._commit_set (commit_many, commit_pending) derive a formed record's hash and
-- search text in the INSERT itself, and their rows meet the per-row rules of the records
-- and the lineage as one query per statement (the _200_bulk_* statement triggers, and the
-- episodic-ancestor rule in fabric._commit_set) instead of one trigger call per row. Such a
-- statement sets fabric.bulk_rows to 'on' just before it and clears it after. Any session can
-- set that setting, so it never skips a rule alone: the gate below, once per statement,
-- keeps it only when the statement runs directly in one of those functions as the call
-- stack shows (its innermost caller, and at most the API function that called it: what a
-- statement's own text says cannot reach past its frame). Anything else -- a direct write
-- by the owner with the setting made by hand, an API function called with it set, a call
-- from another function, messages in another language -- clears it, and every row meets
-- the row triggers as before. On a Citus cluster the setting stays on the coordinator
-- (set_config, not fabric._set_local): the shards' row triggers always run.
CREATE OR REPLACE FUNCTION fabric.tg_bulk_rows__gate()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_stack text;
  v text;
BEGIN
  IF pg_catalog.current_setting('fabric.bulk_rows', true) IS DISTINCT FROM 'on' THEN
    RETURN NULL;
  END IF;
  GET DIAGNOSTICS v_stack = PG_CONTEXT;
  IF v_stack !~ ('\nPL/pgSQL function (fabric_api\.import_records\(text,text,jsonb\)'
                 '|fabric\._commit_set\(text,uuid\[\],text\)) line [0-9]+ at SQL statement'
                 '(\nSQL statement "SELECT fabric\._commit_set\(v_tenant, v_ids, v_committer\)"'
                 '\nPL/pgSQL function fabric_api\.(commit_many\(uuid\[\]\)'
                 '|commit_pending\(integer\)) line [0-9]+ at PERFORM)?$') THEN
    v := pg_catalog.set_config('fabric.bulk_rows', '', true);
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER _010_bulk_gate
  BEFORE INSERT ON fabric.memory_records
  FOR EACH STATEMENT WHEN (pg_catalog.current_setting('fabric.bulk_rows', true) = 'on')
  EXECUTE FUNCTION fabric.tg_bulk_rows__gate();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__bulk_formed: what _100_normalise checks of each row, for the
-- rows of a bulk statement at once (the statement derived the hash, the search text and its
-- length; the defaults stamp the times, the revision and the state): the acting agent, the
-- state at formation, the content, the database's stamps. The same refusals.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__bulk_formed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_actor text := fabric._require_actor();
  v_broken text;
BEGIN
  SELECT CASE
           WHEN n.consolidation_state NOT IN ('raw', 'consolidated', 'reflected') THEN 'state'
           WHEN n.content IS NULL THEN 'content'
           ELSE 'stamps' END
    INTO v_broken
    FROM formed_rows n
   WHERE n.consolidation_state NOT IN ('raw', 'consolidated', 'reflected')
      OR n.content IS NULL OR n.search_length IS NULL
      OR n.recorded_at <> pg_catalog.now() OR n.known_since <> pg_catalog.now()
      OR n.revision <> 1 OR n.erased_at IS NOT NULL OR n.erasure_approval_id IS NOT NULL
   ORDER BY 1 DESC LIMIT 1;
  IF v_broken IS NOT NULL THEN
    PERFORM fabric._refuse_formation(v_broken);
  END IF;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS _200_bulk_formed ON fabric.memory_records;
CREATE TRIGGER _200_bulk_formed
  AFTER INSERT ON fabric.memory_records
  REFERENCING NEW TABLE AS formed_rows
  FOR EACH STATEMENT
  WHEN (pg_catalog.current_setting('fabric.bulk_rows', true) = 'on')
  EXECUTE FUNCTION fabric.tg_memory_records__bulk_formed();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__normalise: a record is born raw (or consolidated/reflected by
-- a workflow), stamped with the transaction time, its hash and its search text (and the
-- search text's length, for BM25) computed by the database. One trigger does all of a formation's per-row work (the search text's
-- UPDATE rule is _150_search_text, sql/140_search_text.sql).
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__normalise()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_actor text;
BEGIN
  v_actor := fabric._require_actor();   -- an expression, not a statement: runs for every row
  IF NEW.consolidation_state NOT IN ('raw', 'consolidated', 'reflected') THEN
    PERFORM fabric._refuse_formation('state');
  END IF;
  IF NEW.content IS NULL THEN
    PERFORM fabric._refuse_formation('content');
  END IF;
  NEW.content_hash := fabric._formed_content_hash(NEW.content, NEW.content_hash);
  NEW.search_tsv := fabric._search_text(NEW.content);
  NEW.search_length := fabric._search_length(NEW.search_tsv);
  NEW.recorded_at := pg_catalog.now();
  NEW.known_since := pg_catalog.now();
  NEW.revision := 1;
  NEW.erased_at := NULL;
  NEW.erasure_approval_id := NULL;
  RETURN NEW;
END $$;

-- (the rows of a bulk statement meet it as a set: _200_bulk_formed, above)
DROP TRIGGER IF EXISTS _100_normalise ON fabric.memory_records;
CREATE TRIGGER _100_normalise
  BEFORE INSERT ON fabric.memory_records
  FOR EACH ROW WHEN (pg_catalog.current_setting('fabric.bulk_rows', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION fabric.tg_memory_records__normalise();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__immutable_envelope: content, scope and provenance never change
-- after commit, with exactly two carve-outs, both inside a lifecycle transition:
-- erasure (tombstoned, under an approval) and operational window closure (expired).
-- supersedes is set once after formation only by a promotion that supersedes.
-- revision and known_since are the history's clock: only _500_lifecycle advances them.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__immutable_envelope()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_changed text[];
  v_to_tombstone boolean := NEW.consolidation_state = 'tombstoned'
                            AND OLD.consolidation_state <> 'tombstoned';
  v_window_closure boolean := NEW.consolidation_state = 'expired'
                              AND OLD.consolidation_state IN ('raw', 'consolidated', 'reflected',
                                                              'expired')
                              AND OLD.retention_class = 'operational';
BEGIN
  SELECT pg_catalog.array_agg(o.key ORDER BY o.key) INTO v_changed
  FROM pg_catalog.jsonb_each(pg_catalog.to_jsonb(OLD)) o
  WHERE o.key IN ('tenant_id', 'memory_id', 'visibility', 'business_instance_id',
                  'content_hash', 'source_event_id', 'correlation_id', 'causation_id',
                  'formed_by', 'formation_method', 'confidence', 'valid_from', 'recorded_at',
                  'supersedes', 'retention_class', 'compliance_labels', 'version',
                  'proposal_id', 'run_id', 'revision', 'known_since')
    AND o.value IS DISTINCT FROM (pg_catalog.to_jsonb(NEW) -> o.key)
    -- a promotion that supersedes names its predecessor once, in its tier change
    AND NOT (o.key = 'supersedes' AND OLD.supersedes IS NULL AND NEW.tier <> OLD.tier
             AND fabric._setting('fabric.action') IS NOT DISTINCT FROM 'promote');
  IF v_changed IS NOT NULL THEN
    PERFORM fabric._raise_rule('MF001',
      pg_catalog.format('committed memory records are immutable: %s cannot change',
                        pg_catalog.array_to_string(v_changed, ', ')),
      'a changed fact is a new record that supersedes this one');
  END IF;

  IF NEW.content IS DISTINCT FROM OLD.content
     AND NOT (NEW.content IS NULL AND (v_to_tombstone OR v_window_closure)) THEN
    PERFORM fabric._raise_rule('MF001',
      'committed memory records are immutable: content cannot change',
      'content is only removed by erasure (tombstoned, approved) or by closing an '
      'operational retention window (expired)');
  END IF;

  IF (NEW.subject_id IS DISTINCT FROM OLD.subject_id
      OR NEW.session_id IS DISTINCT FROM OLD.session_id
      OR NEW.agent_id IS DISTINCT FROM OLD.agent_id)
     AND NOT (v_to_tombstone AND NEW.subject_id IS NULL AND NEW.session_id IS NULL
              AND NEW.agent_id IS NULL) THEN
    PERFORM fabric._raise_rule('MF001',
      'committed memory records are immutable: scope cannot change',
      'scope ids are only destroyed by erasure; a wider scope is a supersession');
  END IF;

  IF (NEW.erased_at IS DISTINCT FROM OLD.erased_at
      OR NEW.erasure_approval_id IS DISTINCT FROM OLD.erasure_approval_id)
     AND NOT v_to_tombstone THEN
    PERFORM fabric._raise_rule('MF001',
      'erasure stamps are set once, by the transition to tombstoned',
      'erase through fabric_api.erase under an approval');
  END IF;

  IF v_to_tombstone AND (NEW.content IS NOT NULL OR NEW.subject_id IS NOT NULL
                         OR NEW.session_id IS NOT NULL OR NEW.agent_id IS NOT NULL
                         OR NEW.erasure_approval_id IS DISTINCT FROM
                            fabric._setting('fabric.approval_id')::uuid) THEN
    PERFORM fabric._raise_rule('MF002',
      'a tombstone destroys the content and names the approval in force',
      'set content and scope ids to NULL and erasure_approval_id to fabric.approval_id');
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _200_immutable_envelope
  BEFORE UPDATE ON fabric.memory_records
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_memory_records__immutable_envelope();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__no_delete: nothing is deleted; forgetting leaves a tombstone.
-- Statement-level: there is no DELETE policy, so a row trigger would never see a row and
-- the DELETE would silently remove nothing instead of being refused.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__no_delete()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._raise_rule('MF001',
    pg_catalog.format('%s on %s is refused: memory is never deleted', TG_OP, TG_TABLE_NAME),
    'forgetting is an approved erasure that leaves a tombstone');
END $$;

CREATE OR REPLACE TRIGGER _300_no_delete
  BEFORE DELETE ON fabric.memory_records
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__no_delete();
CREATE OR REPLACE TRIGGER _300_no_truncate
  BEFORE TRUNCATE ON fabric.memory_records
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__no_delete();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__lifecycle: R-LIFE-1's table; valid_until only shrinks and
-- only when the record is superseded or expires; tier changes only by promotion/demotion.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__lifecycle()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_action text := fabric._setting('fabric.action');
BEGIN
  IF (NEW.consolidation_state, NEW.tier, NEW.valid_until, NEW.content, NEW.subject_id,
      NEW.session_id, NEW.agent_id)
     IS NOT DISTINCT FROM
     (OLD.consolidation_state, OLD.tier, OLD.valid_until, OLD.content, OLD.subject_id,
      OLD.session_id, OLD.agent_id) THEN
    RETURN NEW;                      -- nothing governed changed; no new revision
  END IF;
  PERFORM fabric._require_actor();

  IF NEW.consolidation_state <> OLD.consolidation_state
     AND NOT fabric._legal_transition(OLD.consolidation_state, NEW.consolidation_state) THEN
    PERFORM fabric._raise_rule('MF002',
      pg_catalog.format('illegal lifecycle transition %s -> %s',
                        OLD.consolidation_state, NEW.consolidation_state),
      'records move only forward: raw -> consolidated -> reflected -> '
      'superseded/expired -> tombstoned');
  END IF;

  IF NEW.tier <> OLD.tier AND v_action IS DISTINCT FROM 'promote'
     AND v_action IS DISTINCT FROM 'demote' THEN
    PERFORM fabric._raise_rule('MF002',
      'a record changes tier only by promotion or demotion',
      'use fabric_api.promote or fabric_api.demote');
  END IF;

  IF NEW.valid_until IS DISTINCT FROM OLD.valid_until AND (
       NEW.valid_until IS NULL
       OR (OLD.valid_until IS NOT NULL AND NEW.valid_until >= OLD.valid_until)
       OR NEW.consolidation_state NOT IN ('superseded', 'expired')
       OR NEW.consolidation_state = OLD.consolidation_state) THEN
    PERFORM fabric._raise_rule('MF002',
      'valid_until only shrinks, and only when the record is superseded or expires',
      'close a record by superseding it or by retention-window closure');
  END IF;

  NEW.revision := OLD.revision + 1;
  NEW.known_since := pg_catalog.now();
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _500_lifecycle
  BEFORE UPDATE ON fabric.memory_records
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_memory_records__lifecycle();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__history: the previous values of the mutable columns (never
-- content) with the transaction-time range during which the fabric knew them: one row per
-- new revision, written for all the rows of a statement at once.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__history()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_actor text;
  v_old jsonb;
  v_new jsonb;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: this runs on the tenant's shard, where a statement on another distributed
    -- table cannot read the transition tables; they are read here first (docs/citus.md).
    v_old := (SELECT pg_catalog.jsonb_agg(o) FROM old_rows o);
    v_new := (SELECT pg_catalog.jsonb_agg(n) FROM new_rows n);
    IF EXISTS (SELECT 1
                 FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_old) o
                 JOIN pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_new) n
                   ON n.tenant_id = o.tenant_id AND n.memory_id = o.memory_id
                WHERE n.revision <> o.revision) THEN
      v_actor := fabric._require_actor();
      INSERT INTO fabric.memory_record_versions
        (tenant_id, memory_id, revision, tier, consolidation_state, valid_until, known_during,
         ended_by)
      SELECT o.tenant_id, o.memory_id, o.revision, o.tier, o.consolidation_state,
             o.valid_until, pg_catalog.tstzrange(o.known_since, pg_catalog.now(), '[)'), v_actor
        FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_old) o
        JOIN pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_new) n
          ON n.tenant_id = o.tenant_id AND n.memory_id = o.memory_id
       WHERE n.revision <> o.revision;
    END IF;
    RETURN NULL;
  END IF;
  IF EXISTS (SELECT 1 FROM old_rows o
               JOIN new_rows n ON n.tenant_id = o.tenant_id AND n.memory_id = o.memory_id
              WHERE n.revision <> o.revision) THEN
    v_actor := fabric._require_actor();
    INSERT INTO fabric.memory_record_versions
      (tenant_id, memory_id, revision, tier, consolidation_state, valid_until, known_during,
       ended_by)
    SELECT o.tenant_id, o.memory_id, o.revision, o.tier, o.consolidation_state, o.valid_until,
           pg_catalog.tstzrange(o.known_since, pg_catalog.now(), '[)'), v_actor
      FROM old_rows o
      JOIN new_rows n ON n.tenant_id = o.tenant_id AND n.memory_id = o.memory_id
     WHERE n.revision <> o.revision
     ORDER BY o.memory_id;
  END IF;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS _800_history ON fabric.memory_records;
CREATE TRIGGER _800_history
  AFTER UPDATE ON fabric.memory_records
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__history();

-- ---------------------------------------------------------------------------------------
-- fabric._formed_event_type, fabric._formed_payload: the event a formed record emits, and
-- its payload: the one derivation of tg_memory_records__emit_formed, whose two paths (the
-- outbox, or on Citus the tenant's shard) differ only in where they write. They take the
-- columns they read, not the row (a whole row passed on is copied with its content and
-- embedding). SQL functions with an SQL-standard body (RETURN expression): the planner
-- inlines them into the statement that writes a batch's events (the PL/pgSQL function they
-- replace cost about 3 µs a record).
CREATE OR REPLACE FUNCTION fabric._formed_event_type(p_tier text, p_state text,
                                                     p_formation_method text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
         WHEN p_tier = 'procedural' AND p_formation_method = 'consolidation'
           THEN 'memory.skill.distilled'
         WHEN p_state = 'raw' THEN 'memory.record.formed'
         WHEN p_state = 'consolidated' THEN 'memory.record.consolidated'
         WHEN p_state = 'reflected' THEN 'memory.reflection.completed'
       END;
CREATE OR REPLACE FUNCTION fabric._formed_payload(p_tier text, p_visibility text,
  p_state text, p_formation_method text, p_content_hash text, p_retention_class text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE   -- jsonb_build_object is stable: an immutable one is not inlined
RETURN pg_catalog.jsonb_build_object('tier', p_tier, 'visibility', p_visibility,
         'state', p_state, 'formation_method', p_formation_method,
         'content_hash', p_content_hash, 'retention_class', p_retention_class);
DROP FUNCTION IF EXISTS fabric._formation_event(text, text, text, text, text, text);
                                               -- now _formed_event_type and _formed_payload

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__emit_formed: every formation emits its memory.* event in the
-- same transaction, with the record's own correlation and causation ids -- one INSERT per
-- statement for all the records it formed (so one wake-up of the projectors, too).
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__emit_formed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_actor text := fabric._setting('fabric.actor');
  v_run_id uuid := fabric._setting('fabric.run_id')::uuid;
  v_formed jsonb;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: this runs on the tenant's shard, which cannot reach the coordinator's outbox:
    -- the events wait in the colocated fabric.shard_events, and the API function that
    -- formed the records moves them into fabric.events (fabric._flush_shard_events).
    v_formed := (SELECT pg_catalog.jsonb_agg(n) FROM formed_rows n);
    INSERT INTO fabric.shard_events (event_id, tenant_id, event_type, correlation_id,
                                     causation_id, actor_agent_id, run_id, memory_id,
                                     proposal_id, payload)
    SELECT fabric._event_id(), n.tenant_id,
           fabric._formed_event_type(n.tier, n.consolidation_state, n.formation_method),
           n.correlation_id, n.causation_id, v_actor, v_run_id, n.memory_id, n.proposal_id,
           fabric._formed_payload(n.tier, n.visibility, n.consolidation_state,
                                  n.formation_method, n.content_hash, n.retention_class)
      FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_formed) n;
    RETURN NULL;
  END IF;
  -- the columns and payload fabric._emit writes, for every formed row at once
  INSERT INTO fabric.events (event_id, tenant_id, event_type, correlation_id, causation_id,
                             actor_agent_id, run_id, memory_id, proposal_id, payload)
  SELECT fabric._event_id(), n.tenant_id,
         fabric._formed_event_type(n.tier, n.consolidation_state, n.formation_method),
         n.correlation_id, n.causation_id, v_actor, v_run_id, n.memory_id, n.proposal_id,
         fabric._formed_payload(n.tier, n.visibility, n.consolidation_state,
                                n.formation_method, n.content_hash, n.retention_class)
    FROM formed_rows n;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS _900_emit_formed ON fabric.memory_records;
CREATE TRIGGER _900_emit_formed
  AFTER INSERT ON fabric.memory_records
  REFERENCING NEW TABLE AS formed_rows
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__emit_formed();

-- ---------------------------------------------------------------------------------------
-- fabric._transition_events: the events one changed record emits, in the order they are
-- written (ord): its state change, the closing of an expired record's retention window
-- (p_content_removed: its content became NULL), its promotion or demotion (p_tier_event:
-- which of the two the action is). The one derivation of tg_memory_records__emit, whose
-- two paths (the outbox, or on Citus the tenant's shard) differ only in where they write.
-- It takes the columns it reads, not the rows (a whole row passed on is copied with its
-- content and embedding); plpgsql, as a SQL function with a SET clause is never inlined
-- and one call per changed row would cost ten times as much.
CREATE OR REPLACE FUNCTION fabric._transition_events(p_old_state text, p_new_state text,
  p_old_tier text, p_new_tier text, p_valid_until timestamptz, p_content_removed boolean,
  p_approval_id uuid, p_tier_event text)
RETURNS TABLE (ord integer, event_type text, payload jsonb)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_new_state <> p_old_state THEN
    ord := 1;
    event_type := CASE p_new_state
                    WHEN 'consolidated' THEN 'memory.record.consolidated'
                    WHEN 'reflected' THEN 'memory.reflection.completed'
                    WHEN 'superseded' THEN 'memory.record.superseded'
                    WHEN 'expired' THEN 'memory.record.expired'
                    WHEN 'tombstoned' THEN 'memory.record.forgotten'
                  END;
    payload := pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('tier', p_new_tier,
      'from_state', p_old_state, 'to_state', p_new_state, 'valid_until', p_valid_until,
      'content_removed', p_content_removed, 'approval_id', p_approval_id));
    IF event_type IS NOT NULL THEN
      RETURN NEXT;
    END IF;
  ELSIF p_content_removed THEN
    -- an expired record's retention window closed
    ord := 2;
    event_type := 'memory.record.expired';
    payload := pg_catalog.jsonb_build_object('tier', p_new_tier, 'from_state', p_old_state,
      'to_state', p_new_state, 'content_removed', true);
    RETURN NEXT;
  END IF;
  IF p_new_tier <> p_old_tier AND p_tier_event IS NOT NULL THEN
    ord := 3;
    event_type := p_tier_event;
    payload := pg_catalog.jsonb_build_object('from_tier', p_old_tier, 'to_tier', p_new_tier,
      'state', p_new_state);
    RETURN NEXT;
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__emit: every transition emits its memory.* event in the same
-- transaction, with the record's own correlation and causation ids: a state change, the
-- closing of an expired record's retention window, a promotion or demotion -- one events
-- INSERT per statement for all the rows it changed.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__emit()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_actor text := fabric._setting('fabric.actor');
  v_run_id uuid := fabric._setting('fabric.run_id')::uuid;
  v_tier_event text := CASE fabric._setting('fabric.action')
                         WHEN 'promote' THEN 'memory.record.promoted'
                         ELSE 'memory.record.demoted'
                       END;
  v_old jsonb;
  v_new jsonb;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: on the tenant's shard, as tg_memory_records__emit_formed (the transition
    -- tables read here first, the events staged for the coordinator's outbox)
    v_old := (SELECT pg_catalog.jsonb_agg(o) FROM old_rows o);
    v_new := (SELECT pg_catalog.jsonb_agg(n) FROM new_rows n);
    INSERT INTO fabric.shard_events (event_id, tenant_id, event_type, correlation_id,
                                     causation_id, actor_agent_id, run_id, memory_id,
                                     proposal_id, payload)
    SELECT fabric._event_id(), n.tenant_id, e.event_type, n.correlation_id,
           n.causation_id, v_actor, v_run_id, n.memory_id, NULL, e.payload
      FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_old) o
      JOIN pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_new) n
        ON n.tenant_id = o.tenant_id AND n.memory_id = o.memory_id
      CROSS JOIN LATERAL fabric._transition_events(o.consolidation_state,
        n.consolidation_state, o.tier, n.tier, n.valid_until,
        n.content IS NULL AND o.content IS NOT NULL, n.erasure_approval_id, v_tier_event) e
     ORDER BY n.memory_id, e.ord;
    RETURN NULL;
  END IF;
  -- the columns and payloads fabric._emit writes, per changed row in the helper's order
  INSERT INTO fabric.events (event_id, tenant_id, event_type, correlation_id, causation_id,
                             actor_agent_id, run_id, memory_id, proposal_id, payload)
  SELECT fabric._event_id(), n.tenant_id, e.event_type, n.correlation_id,
         n.causation_id, v_actor, v_run_id, n.memory_id, NULL, e.payload
    FROM old_rows o
    JOIN new_rows n ON n.tenant_id = o.tenant_id AND n.memory_id = o.memory_id
    CROSS JOIN LATERAL fabric._transition_events(o.consolidation_state,
      n.consolidation_state, o.tier, n.tier, n.valid_until,
      n.content IS NULL AND o.content IS NOT NULL, n.erasure_approval_id, v_tier_event) e
   ORDER BY n.memory_id, e.ord;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS _900_emit ON fabric.memory_records;
CREATE TRIGGER _900_emit
  AFTER UPDATE ON fabric.memory_records
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__emit();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__semantic_needs_episode: a semantic record has at least one
-- episodic ancestor through derived_from; checked at commit, after the lineage rows exist.
-- A deferred trigger fires outside the API function that caused it, as the login, so it is
-- a definer (the owner) and reads under the record's own tenant.
-- On Citus it fires on the tenant's worker when the coordinator commits there, where no
-- query may reach another node: the walk runs one single-shard statement at a time
-- (fabric._require_episodic_source), each on the tenant's colocated shards of that worker.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__semantic_needs_episode()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._set_local('fabric.tenant_id', NEW.tenant_id);
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM fabric._require_episodic_source(NEW.tenant_id, NEW.memory_id);
    RETURN NULL;
  END IF;
  -- The common case first: a parent that is itself an episode (one index probe per
  -- parent); the walk through derived_from only when none is.
  IF EXISTS (SELECT 1 FROM fabric.memory_lineage l
             WHERE l.tenant_id = NEW.tenant_id AND l.memory_id = NEW.memory_id
               AND (SELECT m.tier FROM fabric.memory_records m
                    WHERE m.tenant_id = l.tenant_id AND m.memory_id = l.derived_from_id)
                   = 'episodic') THEN
    RETURN NULL;
  END IF;
  IF NOT fabric._has_episodic_ancestor(NEW.tenant_id, NEW.memory_id) THEN
    PERFORM fabric._refuse_formation('episode');
  END IF;
  RETURN NULL;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._has_episodic_ancestor: transitively through derived_from, within one tenant.
CREATE OR REPLACE FUNCTION fabric._has_episodic_ancestor(p_tenant_id text, p_memory_id uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (WITH RECURSIVE ancestors(memory_id, depth) AS (
    SELECT l.derived_from_id, 1 FROM fabric.memory_lineage l
    WHERE l.tenant_id = p_tenant_id AND l.memory_id = p_memory_id
    UNION
    SELECT l.derived_from_id, a.depth + 1 FROM fabric.memory_lineage l
    JOIN ancestors a ON l.tenant_id = p_tenant_id AND l.memory_id = a.memory_id
    WHERE a.depth < 64
  )
  SELECT EXISTS (SELECT 1 FROM ancestors a JOIN fabric.memory_records m
                 ON m.tenant_id = p_tenant_id AND m.memory_id = a.memory_id
                 WHERE m.tier = 'episodic'));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._ids_have_episodic_ancestor: the same rule for a proposal's derived_from list.
-- (Its generic plan, one primary-key probe per id, is kept: a custom plan was made again for
-- every semantic proposal.)
CREATE OR REPLACE FUNCTION fabric._ids_have_episodic_ancestor(p_tenant_id text, p_ids uuid[])
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: the walk one single-shard statement at a time (the recursive read below,
    -- called from a query on a shard, would be a distributed query nested in it)
    RETURN fabric._ids_reach_an_episode(p_tenant_id, p_ids);
  END IF;
  RETURN (SELECT EXISTS (SELECT 1 FROM fabric.memory_records m
                 WHERE m.tenant_id = p_tenant_id AND m.memory_id = ANY (p_ids)
                   AND (m.tier = 'episodic'
                        OR fabric._has_episodic_ancestor(p_tenant_id, m.memory_id))));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._ids_reach_an_episode: fabric._ids_have_episodic_ancestor on a Citus cluster. The
-- same rule (an id is an episode, or one of its ancestors within 64 generations is),
-- walked one generation per statement, each statement on one table of the tenant: Citus
-- plans none of them as a query that leaves the tenant's shard, so the walk runs on the
-- coordinator (an API call) and inside a trigger on the tenant's worker alike.
CREATE OR REPLACE FUNCTION fabric._ids_reach_an_episode(p_tenant_id text, p_ids uuid[])
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
  v_generation uuid[] := p_ids;
  v_seen uuid[] := pg_catalog.array_remove(p_ids, NULL);
BEGIN
  FOR v_depth IN 0 .. 64 LOOP
    EXIT WHEN coalesce(pg_catalog.cardinality(v_generation), 0) = 0;
    PERFORM 1 FROM fabric.memory_records m
    WHERE m.tenant_id = p_tenant_id AND m.memory_id = ANY (v_generation) AND m.tier = 'episodic'
    LIMIT 1;
    IF FOUND THEN
      RETURN true;
    END IF;
    SELECT pg_catalog.array_agg(DISTINCT l.derived_from_id) INTO v_generation
    FROM fabric.memory_lineage l
    WHERE l.tenant_id = p_tenant_id AND l.memory_id = ANY (v_generation)
      AND l.derived_from_id <> ALL (v_seen);
    v_seen := v_seen || v_generation;
  END LOOP;
  RETURN false;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._require_episodic_source: the semantic-needs-episode rule for one formed record,
-- raised as the deferred trigger raises it. On a Citus cluster the API functions that form
-- a semantic record call it before they return (SET CONSTRAINTS does not reach the
-- workers, and a refusal at the workers' commit reaches the client only as "could not
-- commit transaction", without the rule's SQLSTATE); the shard's deferred trigger calls
-- it again at commit.
CREATE OR REPLACE FUNCTION fabric._require_episodic_source(p_tenant_id text, p_memory_id uuid)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
  v_parents uuid[];
BEGIN
  SELECT pg_catalog.array_agg(l.derived_from_id) INTO v_parents
  FROM fabric.memory_lineage l
  WHERE l.tenant_id = p_tenant_id AND l.memory_id = p_memory_id;
  IF NOT fabric._ids_reach_an_episode(p_tenant_id, v_parents) THEN
    PERFORM fabric._refuse_formation('episode');
  END IF;
END $$;

DROP TRIGGER IF EXISTS _950_semantic_needs_episode ON fabric.memory_records;
-- (the records of a bulk statement meet it as a set in fabric._commit_set:
-- fabric._semantic_without_episode)
CREATE CONSTRAINT TRIGGER _950_semantic_needs_episode
  AFTER INSERT ON fabric.memory_records
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.tier = 'semantic'
                     AND pg_catalog.current_setting('fabric.bulk_rows', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION fabric.tg_memory_records__semantic_needs_episode();

-- ---------------------------------------------------------------------------------------
-- fabric._semantic_without_episode: of these records of a tenant, whether a semantic one
-- has no episodic ancestor (the rule of _950_semantic_needs_episode for a set: a parent that
-- is an episode first, the walk through derived_from only for a record without one).
CREATE OR REPLACE FUNCTION fabric._semantic_without_episode(p_tenant_id text,
                                                            p_memory_ids uuid[])
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN EXISTS (
    SELECT 1 FROM fabric.memory_records m
    WHERE m.tenant_id = p_tenant_id AND m.memory_id = ANY (p_memory_ids)
      AND m.tier = 'semantic'
      AND NOT EXISTS (SELECT 1 FROM fabric.memory_lineage l
                      JOIN fabric.memory_records p ON p.tenant_id = l.tenant_id
                                                  AND p.memory_id = l.derived_from_id
                      WHERE l.tenant_id = m.tenant_id AND l.memory_id = m.memory_id
                        AND p.tier = 'episodic')
      AND NOT fabric._has_episodic_ancestor(m.tenant_id, m.memory_id));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_lineage__append_only: derived_from is part of the immutable envelope;
-- its rows are written only in the transaction that forms the record, and never changed
-- (UPDATE and DELETE refused per statement, so RLS hiding every row cannot silence them).
CREATE OR REPLACE FUNCTION fabric.tg_memory_lineage__append_only()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF NOT EXISTS (SELECT 1 FROM fabric.memory_records m
                   WHERE m.tenant_id = NEW.tenant_id AND m.memory_id = NEW.memory_id
                     AND m.recorded_at = pg_catalog.now()) THEN
      PERFORM fabric._refuse_formation('lineage');
    END IF;
    RETURN NEW;
  END IF;
  PERFORM fabric._raise_rule('MF001',
    pg_catalog.format('%s on memory_lineage is refused: lineage is append-only', TG_OP),
    'lineage survives supersession and erasure');
END $$;

CREATE OR REPLACE TRIGGER _200_append_only
  BEFORE UPDATE OR DELETE ON fabric.memory_lineage
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_lineage__append_only();
DROP TRIGGER IF EXISTS _200_fixed_at_formation ON fabric.memory_lineage;
CREATE TRIGGER _200_fixed_at_formation
  BEFORE INSERT ON fabric.memory_lineage
  FOR EACH ROW WHEN (pg_catalog.current_setting('fabric.bulk_rows', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION fabric.tg_memory_lineage__append_only();
CREATE OR REPLACE TRIGGER _010_bulk_gate
  BEFORE INSERT ON fabric.memory_lineage
  FOR EACH STATEMENT WHEN (pg_catalog.current_setting('fabric.bulk_rows', true) = 'on')
  EXECUTE FUNCTION fabric.tg_bulk_rows__gate();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_lineage__bulk_fixed_at_formation: _200_fixed_at_formation for the rows
-- of a bulk statement, one query: each names a record formed in this transaction.
CREATE OR REPLACE FUNCTION fabric.tg_memory_lineage__bulk_fixed_at_formation()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM new_lineage l
             WHERE NOT EXISTS (SELECT 1 FROM fabric.memory_records m
                               WHERE m.tenant_id = l.tenant_id AND m.memory_id = l.memory_id
                                 AND m.recorded_at = pg_catalog.now())) THEN
    PERFORM fabric._refuse_formation('lineage');
  END IF;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS _200_bulk_fixed_at_formation ON fabric.memory_lineage;
CREATE TRIGGER _200_bulk_fixed_at_formation
  AFTER INSERT ON fabric.memory_lineage
  REFERENCING NEW TABLE AS new_lineage
  FOR EACH STATEMENT
  WHEN (pg_catalog.current_setting('fabric.bulk_rows', true) = 'on')
  EXECUTE FUNCTION fabric.tg_memory_lineage__bulk_fixed_at_formation();
CREATE OR REPLACE TRIGGER _200_append_only_truncate
  BEFORE TRUNCATE ON fabric.memory_lineage
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_lineage__append_only();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_record_versions__append_only: history is never rewritten (refused per
-- statement: there is no DELETE policy, so a row trigger would never fire for DELETE).
CREATE OR REPLACE TRIGGER _200_append_only
  BEFORE UPDATE OR DELETE ON fabric.memory_record_versions
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__append_only();
CREATE OR REPLACE TRIGGER _200_append_only_truncate
  BEFORE TRUNCATE ON fabric.memory_record_versions
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__append_only();
