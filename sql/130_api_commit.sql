-- Commit: only members of fabric_committer (os-agt-010) turn validated proposals into
-- records. Two committers racing on one proposal produce exactly one record.

-- ---------------------------------------------------------------------------------------
-- fabric._record_envelope: a committed record as its envelope (docs/concepts.md), given its
-- lineage (the ids it derives from, a JSON array in id order). A simple expression, with no
-- statement of the executor: recall reads the lineage of all its winners in its one
-- statement and builds each envelope here.
CREATE OR REPLACE FUNCTION fabric._record_envelope(p_record fabric.memory_records,
                                                   p_derived_from jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.jsonb_build_object(
    'memory_id', p_record.memory_id,
    'tier', p_record.tier,
    'scope', pg_catalog.jsonb_build_object('tenant_id', p_record.tenant_id,
      'subject_id', p_record.subject_id, 'agent_id', p_record.agent_id,
      'session_id', p_record.session_id, 'visibility', p_record.visibility),
    'content', p_record.content,
    'content_hash', p_record.content_hash,
    'provenance', pg_catalog.jsonb_build_object('source_event_id', p_record.source_event_id,
      'correlation_id', p_record.correlation_id, 'causation_id', p_record.causation_id,
      'formed_by', p_record.formed_by, 'formation_method', p_record.formation_method),
    'derived_from', p_derived_from,
    'confidence', p_record.confidence,
    'validity_interval', pg_catalog.jsonb_build_object('valid_from', p_record.valid_from,
                                                       'valid_until', p_record.valid_until),
    'recorded_at', p_record.recorded_at,
    'consolidation_state', p_record.consolidation_state,
    'supersedes', p_record.supersedes,
    'retention_class', p_record.retention_class,
    'compliance_labels', pg_catalog.to_jsonb(p_record.compliance_labels),
    'version', p_record.version,
    'business_instance_id', p_record.business_instance_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._record_json: a committed record as its envelope (docs/concepts.md), its lineage
-- read here (one statement).
CREATE OR REPLACE FUNCTION fabric._record_json(p_record fabric.memory_records)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_derived jsonb;
BEGIN
  -- The lineage is read first, so the envelope is a simple expression (evaluated without a
  -- statement of the executor).
  SELECT coalesce(pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id), '[]')
    INTO v_derived
    FROM fabric.memory_lineage l
   WHERE l.tenant_id = p_record.tenant_id AND l.memory_id = p_record.memory_id;
  RETURN fabric._record_envelope(p_record, v_derived);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._enter_committer: the committer's agent id, the context reset.
CREATE OR REPLACE FUNCTION fabric._enter_committer()
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN fabric._enter_as('fabric_committer', 'commit memory', 'os-agt-010');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._committer_enabled_in: tenant enablement binds committers too. Enters the tenant
-- (fabric.tenant_id) and says whether the committer's agent is enabled there (an
-- enablement with no tools suffices). With p_refuse, a committer that is not is refused
-- (42501); every committer action calls this before it writes anything in a tenant.
CREATE OR REPLACE FUNCTION fabric._committer_enabled_in(p_tenant_id text, p_committer text,
                                                        p_refuse boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v text;
BEGIN
  -- fabric._set_context('tenant_id', ...) as a simple expression: this runs once per commit
  v := fabric._set_local('fabric.tenant_id', coalesce(p_tenant_id, ''));
  IF EXISTS (SELECT 1 FROM fabric.tenant_agents e
             WHERE e.tenant_id = p_tenant_id AND e.agent_id = p_committer) THEN
    RETURN true;
  END IF;
  IF p_refuse THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the committer is not enabled in this tenant; a committer acts only in '
      'tenants where its agent is enabled',
      'an admin enables the committer agent in the tenant: '
      'fabric_api.enable_agent(tenant_id, committer_agent_id, ''{}'')');
  END IF;
  RETURN false;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._record_json_now: the record as a fresh read returns it, for an API that has just
-- written it. VOLATILE, so it sees every write of the transaction so far (lineage rows,
-- the successor's supersedes, triggers' changes), even those of the calling expression,
-- which a STABLE function called in the same statement would not.
CREATE OR REPLACE FUNCTION fabric._record_json_now(p_tenant_id text, p_memory_id uuid)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v fabric.memory_records;
BEGIN
  -- the row read first, then made JSON here (on Citus a shard's row is of the shard's type)
  SELECT * INTO v FROM fabric.memory_records m
  WHERE m.tenant_id = p_tenant_id AND m.memory_id = p_memory_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  RETURN fabric._record_json(v);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._commit_locked: form the record of a proposal already locked FOR UPDATE.
DROP FUNCTION IF EXISTS fabric._commit_locked(fabric.proposals, text);   -- older signature
CREATE OR REPLACE FUNCTION fabric._commit_locked(p_proposal fabric.proposals, p_committer text,
                                                 p_supersedes uuid DEFAULT NULL)
RETURNS fabric.memory_records
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_record fabric.memory_records;
  v text;
  v_source uuid;
BEGIN
  -- the context of fabric._set_context, set by simple expressions, not a statement (a
  -- single commit runs this once per transaction: every statement is paid per pair)
  v := fabric._set_local('fabric.actor', coalesce(p_committer, ''));
  v := fabric._set_local('fabric.run_id', coalesce(p_proposal.run_id::text, ''));
  v := fabric._set_local('fabric.correlation_id', coalesce(p_proposal.correlation_id, ''));
  v := fabric._set_local('fabric.causation_id', coalesce(p_proposal.causation_id, ''));
  INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, agent_id,
    session_id, business_instance_id, content, content_hash, source_event_id, correlation_id,
    causation_id, formed_by, formation_method, confidence, valid_from, valid_until,
    retention_class, compliance_labels, version, proposal_id, run_id, supersedes)
  VALUES (p_proposal.tenant_id, p_proposal.tier, p_proposal.visibility, p_proposal.subject_id,
    p_proposal.agent_id, p_proposal.session_id, p_proposal.business_instance_id,
    p_proposal.content, p_proposal.content_hash, p_proposal.source_event_id,
    p_proposal.correlation_id, p_proposal.causation_id, p_committer,
    p_proposal.formation_method, p_proposal.confidence, p_proposal.valid_from,
    p_proposal.valid_until, p_proposal.retention_class, p_proposal.compliance_labels,
    p_proposal.version, p_proposal.proposal_id, p_proposal.run_id, p_supersedes)
  RETURNING * INTO v_record;
  IF pg_catalog.cardinality(p_proposal.derived_from) > 0
     AND pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: an INSERT ... SELECT of values becomes a COPY into the shard, which row-level
    -- security refuses; one INSERT ... VALUES per source
    FOREACH v_source IN ARRAY p_proposal.derived_from LOOP
      INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)
      VALUES (v_record.tenant_id, v_record.memory_id, v_source);
    END LOOP;
  ELSIF pg_catalog.cardinality(p_proposal.derived_from) > 0 THEN
    INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)
    SELECT v_record.tenant_id, v_record.memory_id, d
      FROM pg_catalog.unnest(p_proposal.derived_from) d;
  END IF;
  UPDATE fabric.proposals p
  SET status = 'committed', decided_at = pg_catalog.now(), committed_by = p_committer,
      memory_id = v_record.memory_id
  WHERE p.tenant_id = p_proposal.tenant_id AND p.proposal_id = p_proposal.proposal_id;
  -- The deferred rule fires now, so a batch can reject this proposal alone. It is queued
  -- only for a semantic record (the trigger's WHEN), so only a semantic record fires it.
  -- On Citus the trigger is the shard's, which SET CONSTRAINTS does not reach: the rule is
  -- checked here as the trigger checks it (and again by the trigger at commit).
  IF v_record.tier = 'semantic'
     AND pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM fabric._require_episodic_source(v_record.tenant_id, v_record.memory_id);
  ELSIF v_record.tier = 'semantic' THEN
    SET CONSTRAINTS fabric._950_semantic_needs_episode IMMEDIATE;
    SET CONSTRAINTS fabric._950_semantic_needs_episode DEFERRED;
  END IF;
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM fabric._flush_shard_events(v_record.tenant_id);  -- Citus: the shard triggers' events
  END IF;
  RETURN v_record;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._lock_to_commit: the committer's entry to proposals (commit, commit_many). What
-- commit refuses, id by id in order, before anything is written: the tenants (one
-- lookup), the committer's enablement (once per tenant), each tenant's proposals locked
-- FOR UPDATE (in id order) and read by one statement; then the first id that cannot commit
-- raises (unknown P0002, committer not enabled 42501, not validated or listed twice 55000).
-- Returns the tenant of each id, in order; the proposals stay locked. (Generic plans, one
-- primary-key probe per id, kept for the session: a custom plan of the locking read was
-- made again on every commit.)
CREATE OR REPLACE FUNCTION fabric._lock_to_commit(p_proposal_ids uuid[], p_committer text)
RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_tenants text[];
  v_tenant text;
  v_status text;
  v_status_of jsonb := '{}';
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- on Citus custom plans: a generic one of a read by id (no tenant yet) or of the
    -- locking read cannot be planned or pruned (the SET clause restores the setting)
    PERFORM pg_catalog.set_config('plan_cache_mode', 'force_custom_plan', true);
  END IF;
  SELECT pg_catalog.array_agg(fabric._tenant_of_proposal(u.proposal_id) ORDER BY u.ord)
  INTO v_tenants FROM pg_catalog.unnest(p_proposal_ids) WITH ORDINALITY AS u(proposal_id, ord);
  FOR v_tenant IN SELECT DISTINCT t FROM pg_catalog.unnest(v_tenants) t WHERE t IS NOT NULL LOOP
    IF fabric._committer_enabled_in(v_tenant, p_committer, false) THEN
      SELECT v_status_of || coalesce(pg_catalog.jsonb_object_agg(p.proposal_id, p.status), '{}')
      INTO v_status_of
      FROM (SELECT p0.proposal_id, p0.status FROM fabric.proposals p0
            WHERE p0.tenant_id = v_tenant AND p0.proposal_id = ANY (p_proposal_ids)
            ORDER BY p0.proposal_id FOR UPDATE) p;
    END IF;
  END LOOP;
  FOR i IN 1 .. pg_catalog.cardinality(p_proposal_ids) LOOP
    IF v_tenants[i] IS NULL THEN
      PERFORM fabric._raise_rule('no_data_found', 'unknown proposal',
                                 'proposal ids come from fabric_api.propose');
    END IF;
    IF NOT v_status_of ? p_proposal_ids[i]::text THEN
      PERFORM fabric._committer_enabled_in(v_tenants[i], p_committer);   -- raises 42501
    END IF;
    v_status := CASE WHEN p_proposal_ids[i] = ANY (p_proposal_ids[1:i - 1]) THEN 'committed'
                     ELSE v_status_of ->> p_proposal_ids[i]::text END;
    IF v_status <> 'validated' THEN
      PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
        pg_catalog.format('the proposal is %s; only validated proposals commit', v_status),
        'a proposal commits once; rejected proposals never do');
    END IF;
  END LOOP;
  RETURN v_tenants;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.commit: commit one validated proposal; returns the record (its envelope).
-- One id: what fabric._lock_to_commit refuses for a list, in its order and with its
-- SQLSTATEs (unknown P0002, committer not enabled 42501, not validated 55000), read and
-- locked by one statement. The contradiction of a live assertion (23P01, re-raised without
-- values) can only come from a record the exclusion constraint covers (a key in its
-- content, a tier of assertions), so only such a commit runs in a subtransaction. The
-- envelope is built from the row the INSERT returned (every BEFORE trigger's value, the
-- generated columns; nothing after it changes the record in this call) and the lineage
-- written, which a fresh statement of this VOLATILE function sees.
CREATE OR REPLACE FUNCTION fabric_api.commit(p_proposal_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text := fabric._tenant_of_proposal(p_proposal_id);
  v_enabled boolean;
  v_proposal fabric.proposals;
  v_record fabric.memory_records;
BEGIN
  IF v_tenant IS NULL THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown proposal',
                               'proposal ids come from fabric_api.propose');
  END IF;
  v_enabled := fabric._committer_enabled_in(v_tenant, v_committer);   -- raises 42501
  SELECT * INTO v_proposal FROM fabric.proposals p
  WHERE p.tenant_id = v_tenant AND p.proposal_id = p_proposal_id
  FOR UPDATE;
  IF v_proposal.status IS DISTINCT FROM 'validated' THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      pg_catalog.format('the proposal is %s; only validated proposals commit', v_proposal.status),
      'a proposal commits once; rejected proposals never do');
  END IF;
  IF v_proposal.tier IN ('semantic', 'profile', 'procedural')
     AND (v_proposal.content ->> 'key') IS NOT NULL THEN
    BEGIN
      v_record := fabric._commit_locked(v_proposal, v_committer);
    EXCEPTION WHEN exclusion_violation THEN
      PERFORM fabric._contradiction();
    END;
  ELSE
    v_record := fabric._commit_locked(v_proposal, v_committer);
  END IF;
  RETURN fabric._record_json(v_record);
END $$;
COMMENT ON FUNCTION fabric_api.commit(uuid) IS
  'Commit a validated proposal into a raw record; returns the record envelope. Committer only. '
  'Example: SELECT fabric_api.commit(''<proposal_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric._commit_failure_kind: what a drain does with a proposal whose commit failed.
-- 'rejected': the proposal itself breaks a rule (data exception 22, integrity 23, the
-- fabric's MFxxx, a plain RAISE P0001) and never will commit; 'retry': a transient
-- condition (serialization failure, deadlock, lock not available, cancel or timeout,
-- insufficient resources 53) that the next drain retries; NULL: a fault of the fabric or
-- the server, not of the proposal, which aborts the drain.
CREATE OR REPLACE FUNCTION fabric._commit_failure_kind(p_sqlstate text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE WHEN pg_catalog.left(p_sqlstate, 2) IN ('22', '23', 'MF') OR p_sqlstate = 'P0001'
              THEN 'rejected'
              WHEN p_sqlstate IN ('40001', '40P01', '55P03', '57014')
                OR pg_catalog.left(p_sqlstate, 2) = '53'
              THEN 'retry' END
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._commit_set: form the records of validated proposals of one tenant, already
-- locked FOR UPDATE, set-based: per run (the events take their run from the context), one
-- INSERT of the records, one of their lineage and one UPDATE of the proposals, every
-- record trigger firing as for a single commit; then the deferred semantic rule is
-- checked, so the caller can refuse this set alone. Raises as the first failing row does.
CREATE OR REPLACE FUNCTION fabric._commit_set(p_tenant_id text, p_proposal_ids uuid[],
                                              p_committer text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_run uuid;
  v_proposals uuid[];
  v_records uuid[];
  v_citus boolean := coalesce(pg_catalog.current_setting('citus.propagate_set_commands', true), '') = 'local';
  v_memory uuid;
  v_sources uuid[];
  v_source uuid;
  v_tier text;
  v_semantic uuid[] := '{}';
  v_formed uuid[] := '{}';
  v_bulk boolean := pg_catalog.current_setting('citus.propagate_set_commands', true)
                    IS DISTINCT FROM 'local';
  v text;
  -- read here, not per row: on Citus the INSERT below runs on the tenant's shard, where a
  -- function it calls may not read the settings (a reference table)
  v_config regconfig := fabric._text_search_config();
BEGIN
  PERFORM fabric._set_context('actor', p_committer);
  FOR v_run IN
    SELECT p.run_id
    FROM pg_catalog.unnest(p_proposal_ids) WITH ORDINALITY AS u(proposal_id, ord)
    JOIN fabric.proposals p ON p.tenant_id = p_tenant_id AND p.proposal_id = u.proposal_id
    GROUP BY p.run_id ORDER BY pg_catalog.min(u.ord)
  LOOP
    PERFORM fabric._set_context('run_id', v_run::text);
    -- A bulk statement (fabric.tg_bulk_rows__gate, sql/050_records.sql): the hash and the
    -- search text derived here, the row rules met as a set.
    IF v_bulk THEN   -- (not on Citus: the shards' row triggers run there, docs/citus.md)
      v := pg_catalog.set_config('fabric.bulk_rows', 'on', true);
    END IF;
    WITH formed AS (
      INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, agent_id,
        session_id, business_instance_id, content, content_hash, source_event_id,
        correlation_id, causation_id, formed_by, formation_method, confidence, valid_from,
        valid_until, retention_class, compliance_labels, version, proposal_id, run_id,
        search_tsv, search_length)
      SELECT p.tenant_id, p.tier, p.visibility, p.subject_id, p.agent_id, p.session_id,
        p.business_instance_id, p.content,
        fabric._formed_content_hash(p.content, p.content_hash), p.source_event_id,
        p.correlation_id, p.causation_id, p_committer, p.formation_method, p.confidence,
        p.valid_from, p.valid_until, p.retention_class, p.compliance_labels, p.version,
        p.proposal_id, p.run_id, x.tsv, fabric._search_length(x.tsv)
      FROM pg_catalog.unnest(p_proposal_ids) WITH ORDINALITY AS u(proposal_id, ord)
      JOIN fabric.proposals p ON p.tenant_id = p_tenant_id AND p.proposal_id = u.proposal_id
      CROSS JOIN LATERAL (SELECT fabric._search_text_in(v_config, p.content) AS tsv OFFSET 0) x
      WHERE p.run_id = v_run
      ORDER BY u.ord
      RETURNING memory_records.proposal_id, memory_records.memory_id
    )
    SELECT pg_catalog.array_agg(f.proposal_id), pg_catalog.array_agg(f.memory_id)
    INTO v_proposals, v_records FROM formed f;
    IF v_citus THEN
      -- Citus: an INSERT ... SELECT that is not a query of the tenant's shards becomes a
      -- COPY into the shard, which row-level security refuses; the pairs are read first,
      -- then one INSERT ... VALUES each (a semantic record's rule checked with its lineage)
      FOR v_memory, v_sources, v_tier IN
        SELECT f.memory_id, p.derived_from, p.tier
        FROM ROWS FROM (pg_catalog.unnest(v_proposals), pg_catalog.unnest(v_records)) WITH ORDINALITY AS f(proposal_id, memory_id, ord)
        JOIN fabric.proposals p ON p.tenant_id = p_tenant_id AND p.proposal_id = f.proposal_id
        ORDER BY f.ord
      LOOP
        FOREACH v_source IN ARRAY coalesce(v_sources, '{}') LOOP
          INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)
          VALUES (p_tenant_id, v_memory, v_source);
        END LOOP;
        IF v_tier = 'semantic' THEN
          v_semantic := v_semantic || v_memory;
        END IF;
      END LOOP;
    ELSE
      -- the gate kept the setting only for the statement of this function
      v_bulk := v_bulk AND pg_catalog.current_setting('fabric.bulk_rows', true) = 'on';
      IF v_bulk THEN
        v := pg_catalog.set_config('fabric.bulk_rows', 'on', true);
      END IF;
      INSERT INTO fabric.memory_lineage (tenant_id, memory_id, derived_from_id)
      SELECT p_tenant_id, f.memory_id, d
      FROM ROWS FROM (pg_catalog.unnest(v_proposals), pg_catalog.unnest(v_records)) WITH ORDINALITY AS f(proposal_id, memory_id, ord)
      JOIN fabric.proposals p ON p.tenant_id = p_tenant_id AND p.proposal_id = f.proposal_id
      CROSS JOIN LATERAL pg_catalog.unnest(p.derived_from) d
      ORDER BY f.ord;
      v := pg_catalog.set_config('fabric.bulk_rows', '', true);
    END IF;
    v_formed := v_formed || v_records;
    UPDATE fabric.proposals p
    SET status = 'committed', decided_at = pg_catalog.now(), committed_by = p_committer,
        memory_id = f.memory_id
    FROM ROWS FROM (pg_catalog.unnest(v_proposals), pg_catalog.unnest(v_records)) AS f(proposal_id, memory_id)
    WHERE p.tenant_id = p_tenant_id AND p.proposal_id = f.proposal_id;
  END LOOP;
  IF v_citus THEN
    -- Citus: the semantic rule as the shard's deferred trigger checks it (SET CONSTRAINTS
    -- does not reach the workers), then the shard triggers' events
    FOREACH v_memory IN ARRAY v_semantic LOOP
      PERFORM fabric._require_episodic_source(p_tenant_id, v_memory);
    END LOOP;
    PERFORM fabric._flush_shard_events(p_tenant_id);
  ELSE
    -- the rule every semantic record meets, for the records of the bulk statements at once;
    -- a record the gate sent to the row triggers queued the deferred check, fired here
    IF v_bulk AND fabric._semantic_without_episode(p_tenant_id, v_formed) THEN
      PERFORM fabric._refuse_formation('episode');
    END IF;
    SET CONSTRAINTS fabric._950_semantic_needs_episode IMMEDIATE;
    SET CONSTRAINTS fabric._950_semantic_needs_episode DEFERRED;
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.commit_many: commit validated proposals set-based, all or none; returns the
-- records (their envelopes, as a fresh read returns them) in the order of the ids.
CREATE OR REPLACE FUNCTION fabric_api.commit_many(p_proposal_ids uuid[])
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_count integer := pg_catalog.cardinality(p_proposal_ids);
  v_tenants text[];
  v_tenant text;
  v_ids uuid[];
  v_records jsonb[];
  v_citus boolean := coalesce(pg_catalog.current_setting('citus.propagate_set_commands', true), '') = 'local';
  v_ord bigint;
  v_memory uuid;
BEGIN
  IF p_proposal_ids IS NULL OR pg_catalog.array_ndims(p_proposal_ids) > 1 THEN
    PERFORM fabric._bad_envelope('proposal ids must be a one-dimensional array',
                                 'proposal ids come from fabric_api.propose or propose_many');
  END IF;
  IF v_count > 1000 THEN
    PERFORM fabric._raise_rule('program_limit_exceeded',
      'a commit_many call takes at most 1000 proposal ids', 'split the batch');
  END IF;
  IF v_count = 0 THEN
    RETURN '[]'::jsonb;
  END IF;
  -- What commit would refuse, id by id in order, before anything is written.
  v_tenants := fabric._lock_to_commit(p_proposal_ids, v_committer);
  -- The records, tenant by tenant, set-based.
  v_records := pg_catalog.array_fill(NULL::jsonb, ARRAY[v_count]);
  FOR v_tenant IN SELECT t.tenant_id FROM pg_catalog.unnest(v_tenants) WITH ORDINALITY AS t(tenant_id, ord)
                  GROUP BY t.tenant_id ORDER BY pg_catalog.min(t.ord) LOOP
    PERFORM fabric._committer_enabled_in(v_tenant, v_committer);
    SELECT pg_catalog.array_agg(u.proposal_id ORDER BY u.ord) INTO v_ids
    FROM ROWS FROM (pg_catalog.unnest(p_proposal_ids), pg_catalog.unnest(v_tenants)) WITH ORDINALITY AS u(proposal_id, tenant_id, ord)
    WHERE u.tenant_id = v_tenant;
    BEGIN
      PERFORM fabric._commit_set(v_tenant, v_ids, v_committer);
    EXCEPTION WHEN exclusion_violation THEN
      PERFORM fabric._contradiction();
    END;
    IF v_citus THEN
      -- Citus: a record read from its shard is of the shard's row type, so each is read
      -- into a fabric.memory_records first (fabric._record_json_now)
      FOR v_ord, v_memory IN
        SELECT u.ord, p.memory_id
        FROM ROWS FROM (pg_catalog.unnest(p_proposal_ids), pg_catalog.unnest(v_tenants)) WITH ORDINALITY AS u(proposal_id, tenant_id, ord)
        JOIN fabric.proposals p ON p.tenant_id = v_tenant AND p.proposal_id = u.proposal_id
        WHERE u.tenant_id = v_tenant
      LOOP
        v_records[v_ord] := fabric._record_json_now(v_tenant, v_memory);
      END LOOP;
      CONTINUE;
    END IF;
    SELECT pg_catalog.array_agg(x.record ORDER BY x.ord) INTO v_records
    FROM (SELECT u.ord, CASE WHEN u.tenant_id = v_tenant THEN fabric._record_json(m)
                             ELSE v_records[u.ord] END AS record
          FROM ROWS FROM (pg_catalog.unnest(p_proposal_ids), pg_catalog.unnest(v_tenants)) WITH ORDINALITY AS u(proposal_id, tenant_id, ord)
          LEFT JOIN fabric.proposals p ON p.tenant_id = v_tenant AND p.proposal_id = u.proposal_id
          LEFT JOIN fabric.memory_records m ON m.tenant_id = v_tenant AND m.memory_id = p.memory_id) x;
  END LOOP;
  PERFORM fabric._reset_context();
  RETURN pg_catalog.to_jsonb(v_records);
END $$;
COMMENT ON FUNCTION fabric_api.commit_many(uuid[]) IS
  'Commit up to 1000 validated proposals set-based, all or none; returns the record envelopes '
  'in the order of the ids (as fabric_api.commit returns one). Refuses, writing nothing, with '
  'the error commit would give for the first proposal that cannot commit (unknown P0002, '
  'committer not enabled 42501, not validated or listed twice 55000, a rule broken at '
  'formation). Committer only. Example: SELECT fabric_api.commit_many('
  'ARRAY[''<proposal_id>'', ''<proposal_id>'']::uuid[]);';

-- ---------------------------------------------------------------------------------------
-- fabric_api.commit_pending: drain validated proposals of the tenants the committer is
-- enabled in, tenant by tenant, skipping rows another committer holds; each tenant's batch
-- is formed set-based (fabric._commit_set). One proposal never
-- aborts the drain: one that breaks a rule at commit is rejected (with its event), one
-- that meets a transient failure stays validated for the next drain (counted as retry).
CREATE OR REPLACE FUNCTION fabric_api.commit_pending(p_limit integer DEFAULT 100)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text;
  v_proposal fabric.proposals;
  v_committed integer := 0;
  v_rejected integer := 0;
  v_retry integer := 0;
  v_cancelled boolean := false;
  v_state text;
  v_reason text;
  v_ids uuid[];
  v_failed boolean;
BEGIN
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'limit must be between 1 and 10000', 'the default is 100');
  END IF;
  <<tenants>>
  FOR v_tenant IN SELECT t FROM fabric._tenants_with_validated_proposals() t ORDER BY t LOOP
    PERFORM fabric._reset_context();
    CONTINUE WHEN NOT fabric._committer_enabled_in(v_tenant, v_committer, false);
    PERFORM fabric._set_context('actor', v_committer);
    SELECT pg_catalog.array_agg(q.proposal_id ORDER BY q.proposed_at, q.proposal_id) INTO v_ids
    FROM (SELECT p.proposal_id, p.proposed_at FROM fabric.proposals p
          WHERE p.tenant_id = v_tenant AND p.status = 'validated'
          ORDER BY p.proposed_at, p.proposal_id
          LIMIT p_limit - v_committed - v_rejected - v_retry
          FOR UPDATE SKIP LOCKED) q;
    CONTINUE WHEN v_ids IS NULL;
    -- The batch set-based; if one proposal of it breaks a rule, the batch is redone
    -- proposal by proposal so that only that one is refused.
    v_failed := false;
    BEGIN
      PERFORM fabric._commit_set(v_tenant, v_ids, v_committer);
      v_committed := v_committed + pg_catalog.cardinality(v_ids);
    EXCEPTION
      WHEN query_canceled THEN             -- a cancel or timeout stops the drain, keeping its work
        v_retry := v_retry + 1;
        v_cancelled := true;
      WHEN OTHERS THEN
        IF fabric._commit_failure_kind(SQLSTATE) IS NULL THEN
          RAISE;
        END IF;
        v_failed := true;
    END;
    EXIT tenants WHEN v_cancelled;
    CONTINUE WHEN NOT v_failed;
    FOR v_proposal IN
      SELECT * FROM fabric.proposals p
      WHERE p.tenant_id = v_tenant AND p.proposal_id = ANY (v_ids)
      ORDER BY p.proposed_at, p.proposal_id
    LOOP
      BEGIN
        PERFORM fabric._commit_locked(v_proposal, v_committer);
        v_committed := v_committed + 1;
      EXCEPTION
        WHEN query_canceled THEN
          v_retry := v_retry + 1;
          v_cancelled := true;
        WHEN OTHERS THEN
          v_state := SQLSTATE;
          CASE fabric._commit_failure_kind(v_state)
            WHEN 'rejected' THEN
              v_reason := pg_catalog.format('refused at commit (%s)', v_state);
              UPDATE fabric.proposals p SET status = 'rejected', reason = v_reason,
                                            decided_at = pg_catalog.now()
              WHERE p.tenant_id = v_tenant AND p.proposal_id = v_proposal.proposal_id;
              PERFORM fabric._emit('memory.proposal.rejected', v_tenant, v_proposal.correlation_id,
                v_proposal.causation_id, NULL, v_proposal.proposal_id,
                pg_catalog.jsonb_build_object('reason', v_reason, 'sqlstate', v_state));
              v_rejected := v_rejected + 1;
            WHEN 'retry' THEN
              v_retry := v_retry + 1;
            ELSE
              RAISE;
          END CASE;
      END;
      EXIT tenants WHEN v_cancelled;
    END LOOP;
    EXIT WHEN v_committed + v_rejected + v_retry >= p_limit;
  END LOOP;
  PERFORM fabric._reset_context();
  RETURN pg_catalog.jsonb_build_object('committed', v_committed, 'rejected', v_rejected,
                                       'retry', v_retry);
END $$;
COMMENT ON FUNCTION fabric_api.commit_pending(integer) IS
  'Commit up to p_limit validated proposals in the tenants the committer is enabled in '
  '(SKIP LOCKED; safe to run concurrently); answers {"committed", "rejected", "retry"}. '
  'Committer only. Example: SELECT fabric_api.commit_pending(100);';
