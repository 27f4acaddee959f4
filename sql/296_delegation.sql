-- Tenant-keyed calls: the agent calls that name a run or a proposal, with the tenant first.
-- On a Citus cluster they (and the other calls that take the tenant first, below) are
-- distributed functions on that argument, so Citus runs the whole call on the worker that
-- holds the tenant: one node, one local transaction (docs/citus.md, "Delegated calls"). The
-- call's events wait in the tenant's fabric.shard_events, written in that transaction, and
-- fabric_api.relay_events moves them into the coordinator's outbox. On plain PostgreSQL (and
-- on a cluster inside a transaction block, where Citus does not delegate) each is the call
-- it wraps, with the run or proposal looked up in the named tenant only.
--
-- Each runs as its caller (SECURITY INVOKER): the call it wraps checks the caller's EXECUTE
-- privilege and identity exactly as when called directly. fabric.call_tenant narrows the
-- lookups of a run's or a proposal's tenant to the named one (fabric._tenant_of_run,
-- _tenant_of_proposal): a caller who sets it only makes its own calls find less. It is
-- cleared when the call returns.

-- ---------------------------------------------------------------------------------------
-- fabric_api.propose(tenant, envelope, run): fabric_api.propose in the run's tenant.
CREATE OR REPLACE FUNCTION fabric_api.propose(p_tenant_id text, p_envelope jsonb, p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v jsonb;
BEGIN
  IF p_tenant_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'a tenant-keyed call needs its tenant_id',
      HINT = 'name the run''s tenant first, or call fabric_api.propose(envelope, run_id)';
  END IF;
  PERFORM pg_catalog.set_config('fabric.call_tenant', p_tenant_id, true);
  v := fabric_api.propose(p_envelope, p_run_id);
  PERFORM pg_catalog.set_config('fabric.call_tenant', '', true);
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.propose_many(tenant, envelopes, run): fabric_api.propose_many in the tenant.
CREATE OR REPLACE FUNCTION fabric_api.propose_many(p_tenant_id text, p_envelopes jsonb,
                                                   p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v jsonb;
BEGIN
  IF p_tenant_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'a tenant-keyed call needs its tenant_id',
      HINT = 'name the run''s tenant first, or call fabric_api.propose_many(envelopes, run_id)';
  END IF;
  PERFORM pg_catalog.set_config('fabric.call_tenant', p_tenant_id, true);
  v := fabric_api.propose_many(p_envelopes, p_run_id);
  PERFORM pg_catalog.set_config('fabric.call_tenant', '', true);
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.commit(tenant, proposal): fabric_api.commit in the proposal's tenant.
CREATE OR REPLACE FUNCTION fabric_api.commit(p_tenant_id text, p_proposal_id uuid)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v jsonb;
BEGIN
  IF p_tenant_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'a tenant-keyed call needs its tenant_id',
      HINT = 'name the proposal''s tenant first, or call fabric_api.commit(proposal_id)';
  END IF;
  PERFORM pg_catalog.set_config('fabric.call_tenant', p_tenant_id, true);
  v := fabric_api.commit(p_proposal_id);
  PERFORM pg_catalog.set_config('fabric.call_tenant', '', true);
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.recall(tenant, request): fabric_api.recall in the tenant of the request's run.
CREATE OR REPLACE FUNCTION fabric_api.recall(p_tenant_id text, p_request jsonb)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v jsonb;
BEGIN
  IF p_tenant_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'a tenant-keyed call needs its tenant_id',
      HINT = 'name the run''s tenant first, or call fabric_api.recall(request)';
  END IF;
  PERFORM pg_catalog.set_config('fabric.call_tenant', p_tenant_id, true);
  v := fabric_api.recall(p_request);
  PERFORM pg_catalog.set_config('fabric.call_tenant', '', true);
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.close_run(tenant, run): fabric_api.close_run in the run's tenant.
CREATE OR REPLACE FUNCTION fabric_api.close_run(p_tenant_id text, p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v jsonb;
BEGIN
  IF p_tenant_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'a tenant-keyed call needs its tenant_id',
      HINT = 'name the run''s tenant first, or call fabric_api.close_run(run_id)';
  END IF;
  PERFORM pg_catalog.set_config('fabric.call_tenant', p_tenant_id, true);
  v := fabric_api.close_run(p_run_id);
  PERFORM pg_catalog.set_config('fabric.call_tenant', '', true);
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.relay_events: on a Citus cluster, move the events that calls delegated to the
-- workers left in the tenants' fabric.shard_events into the coordinator's outbox, tenant by
-- tenant, in the order each tenant's were staged; the number moved. Relays run one at a
-- time. Each move is committed
-- two-phase with the staged rows' removal (fabric._move_staged_events), so an event is in
-- one of the two places, never both or neither; a staged row of a transaction still open is
-- not visible yet and waits for the next relay. The feeds' consumers call it before they
-- read (memfabric serve, the tracer, the sealer): a delegated call's events reach the outbox
-- within their poll interval. 0 at once on plain PostgreSQL, where nothing is staged.
CREATE OR REPLACE FUNCTION fabric_api.relay_events()
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_moved integer := 0;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local'
     OR fabric._on_worker() THEN
    RETURN 0;
  END IF;
  -- one relay at a time: each takes its transaction id after the last one committed, so
  -- the outbox's (xid, event_id) order keeps the order in which a tenant's events were made
  PERFORM pg_catalog.pg_advisory_xact_lock(
    pg_catalog.hashtextextended('memfabric-relay-events', 0));
  PERFORM fabric._reset_context();
  FOR v_tenant IN SELECT t FROM fabric._tenants_with_staged_events() t ORDER BY t LOOP
    PERFORM fabric._set_context('tenant_id', v_tenant);
    v_moved := v_moved + fabric._move_staged_events(v_tenant);
  END LOOP;
  PERFORM fabric._reset_context();
  RETURN v_moved;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._delegated_calls: the calls distributed by their tenant argument (p_tenant_id) on
-- a Citus cluster. Each reads and writes the named tenant's shards only and the reference
-- tables (a copy on every node), never a table of the coordinator alone; tests/citus holds
-- each to one node.
CREATE OR REPLACE FUNCTION fabric._delegated_calls()
RETURNS text[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT ARRAY[
  'fabric_api.open_run(text, text, text, text, text[], interval)',
  'fabric_api.close_run(text, uuid)',
  'fabric_api.propose(text, jsonb, uuid)',
  'fabric_api.propose_many(text, jsonb, uuid)',
  'fabric_api.commit(text, uuid)',
  'fabric_api.recall(text, jsonb)',
  -- the consolidator's and the committer's reads of a tenant's queues and settings
  'fabric_api.review_queue(text)',
  'fabric_api.contradiction_queue(text)',
  'fabric_api.consolidation_settings(text, text)',
  'fabric_api.consolidation_cursor(text)',
  'fabric_api.awaiting_recommendations(text)',
  -- the admin's, the orchestrator's, the committer's and the workflow's calls by tenant
  'fabric_api.enable_agent(text, text, text[])',
  'fabric_api.configure_instance(text, text, jsonb)',
  'fabric_api.issue_agent_token(text, text, text, text, text[], interval, interval)',
  'fabric_api.revoke_agent_token(text, uuid)',
  'fabric_api.record_measurements(text, jsonb)',
  'fabric_api.propose_entity_merge(text, uuid, uuid, text)',
  'fabric_api.check_working_uri(text, text)',
  'fabric_api.request_subject_erasure(text, text, text, boolean)'] $$;
REVOKE ALL ON FUNCTION fabric._delegated_calls() FROM PUBLIC;

-- On a cluster's coordinator: distribute them, colocated with the tenants' rows (again on
-- every replay: Citus keeps what it has).
DO $$
DECLARE
  v_function text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
    RETURN;
  END IF;
  IF NOT pg_catalog.citus_is_coordinator() THEN
    RETURN;
  END IF;
  FOREACH v_function IN ARRAY fabric._delegated_calls() LOOP
    PERFORM pg_catalog.create_distributed_function(v_function::regprocedure,
      'p_tenant_id', colocate_with => 'fabric.memory_records');
  END LOOP;
END $$;

COMMENT ON FUNCTION fabric_api.propose(text, jsonb, uuid) IS
  'fabric_api.propose with the run''s tenant first: on a Citus cluster the call runs on the '
  'worker that holds the tenant. Example: SELECT fabric_api.propose(''acme'', '
  '''{"tier": "episodic", "content": {"text": "prefers email"}}'', ''<run_id>'');';
COMMENT ON FUNCTION fabric_api.propose_many(text, jsonb, uuid) IS
  'fabric_api.propose_many with the run''s tenant first (delegated on a Citus cluster). '
  'Example: SELECT fabric_api.propose_many(''acme'', ''[{"tier": "episodic", '
  '"content": {"text": "a"}}]'', ''<run_id>'');';
COMMENT ON FUNCTION fabric_api.commit(text, uuid) IS
  'fabric_api.commit with the proposal''s tenant first (delegated on a Citus cluster). '
  'Example: SELECT fabric_api.commit(''acme'', ''<proposal_id>'');';
COMMENT ON FUNCTION fabric_api.recall(text, jsonb) IS
  'fabric_api.recall with the run''s tenant first (delegated on a Citus cluster). '
  'Example: SELECT fabric_api.recall(''acme'', ''{"run_id": "<run_id>", "tiers": ["episodic"]}'');';
COMMENT ON FUNCTION fabric_api.close_run(text, uuid) IS
  'fabric_api.close_run with the run''s tenant first (delegated on a Citus cluster). '
  'Example: SELECT fabric_api.close_run(''acme'', ''<run_id>'');';
COMMENT ON FUNCTION fabric_api.relay_events() IS
  'On a Citus cluster, move the events of calls delegated to the workers into the outbox; '
  'the number moved (0 on plain PostgreSQL). Example: SELECT fabric_api.relay_events();';
