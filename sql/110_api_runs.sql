-- Runs: the orchestrator binds an agent to a tenant, subject, session and active tool set.

-- ---------------------------------------------------------------------------------------
-- fabric_api.open_run: the third layer of tool authorization is set here, by the runtime.
CREATE OR REPLACE FUNCTION fabric_api.open_run(
  p_tenant_id text,
  p_agent_id text,
  p_subject_id text,
  p_session_id text,
  p_active_tool_set text[],
  p_ttl interval DEFAULT '1 hour'
)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_login name := session_user;  -- a value: a Citus worker would read its own session
  v_run_id uuid := pg_catalog.gen_random_uuid();
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_orchestrator', 'open runs');
  IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '7 days' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a run''s ttl must be positive and at most 7 days',
      'the default is 1 hour; reopen a run rather than keeping one open');
  END IF;
  IF p_active_tool_set IS NULL OR pg_catalog.array_position(p_active_tool_set, NULL) IS NOT NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'active_tool_set must be an array of tool ids without NULLs',
      'e.g. ARRAY[''tool:memory-propose'', ''tool:memory-recall'']');
  END IF;
  IF pg_catalog.cardinality(p_active_tool_set) > 1
     AND (SELECT pg_catalog.count(DISTINCT t) FROM pg_catalog.unnest(p_active_tool_set) t)
         < pg_catalog.cardinality(p_active_tool_set) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'active_tool_set must name each tool once',
      'e.g. ARRAY[''tool:memory-propose'', ''tool:memory-recall'']');
  END IF;
  IF EXISTS (SELECT 1 FROM pg_catalog.unnest(p_active_tool_set) t
             WHERE NOT EXISTS (SELECT 1 FROM fabric.tools x WHERE x.tool_id = t)) THEN
    PERFORM fabric._raise_rule('foreign_key_violation',
      'active_tool_set names an unknown tool',
      'tools are the rows of fabric.tools');
  END IF;
  PERFORM fabric._refuse_audit_tools(p_active_tool_set);  -- R-TOOL-2
  PERFORM fabric._ident(p_subject_id, 'subject_id');   -- NULL: the run has no subject
  PERFORM fabric._ident(p_session_id, 'session_id');
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  IF NOT EXISTS (SELECT 1 FROM fabric.tenant_agents e
                 WHERE e.tenant_id = p_tenant_id AND e.agent_id = p_agent_id) THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the agent is not enabled in this tenant',
      'an admin enables it with fabric_api.enable_agent');
  END IF;
  -- opened_by is named, not left to its default: on a Citus cluster the default would be
  -- evaluated on the tenant's worker, where the session is the function owner's.
  INSERT INTO fabric.runs (tenant_id, run_id, agent_id, subject_id, session_id,
                           active_tool_set, expires_at, opened_by)
  VALUES (p_tenant_id, v_run_id, p_agent_id, p_subject_id, p_session_id,
          p_active_tool_set, pg_catalog.now() + p_ttl, v_login);
  PERFORM fabric._note_tenant('run', v_run_id, p_tenant_id);  -- a cluster's lookup
  -- The subject's key, made here in a short transaction of its own: the records of the run
  -- find it made (tg_memory_records__subject_key makes one only for a subject without a
  -- run), so two commits of a new subject never wait for each other on it.
  PERFORM fabric._subject_key(p_tenant_id, p_subject_id);
  -- and the subject's person entity, for the same reason (sql/285_graph_tier.sql)
  PERFORM fabric._subject_entity(p_tenant_id, p_subject_id);
  PERFORM fabric._set_context('run_id', v_run_id::text);
  PERFORM fabric._emit('fabric.run.opened', p_tenant_id, p_payload =>
    pg_catalog.jsonb_build_object('agent_id', p_agent_id, 'active_tool_set', p_active_tool_set,
                                  'expires_at', pg_catalog.now() + p_ttl));
  RETURN v_run_id;
END $$;
COMMENT ON FUNCTION fabric_api.open_run(text, text, text, text, text[], interval) IS
  'Open a run binding an agent to tenant, subject, session and active tools. Orchestrator only. '
  'Example: SELECT fabric_api.open_run(''acme'', ''com-agt-003'', ''user-8842'', ''sess-1f9c'', '
  'ARRAY[''tool:memory-propose''], ''30 minutes'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.close_run: a closed run authorizes nothing more. Like its MCP tokens, a run is
-- closed by the orchestrator login that opened it, or by an admin (fabric_admin: an
-- operator stopping a run); the event names who closed it and in which role. Another
-- orchestrator's run is refused (42501) and nothing is written.
CREATE OR REPLACE FUNCTION fabric_api.close_run(p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_admin boolean;
  v_run fabric.runs;
  v_closed_at timestamptz;
BEGIN
  PERFORM fabric._reset_context();
  v_admin := pg_catalog.pg_has_role(session_user, 'fabric_admin', 'MEMBER');
  IF NOT v_admin THEN
    PERFORM fabric._require_role('fabric_orchestrator', 'close runs');
  END IF;
  v_run := fabric._run_in_its_tenant(p_run_id);
  IF v_run.run_id IS NULL THEN
    PERFORM fabric._set_context('tenant_id', NULL);
    PERFORM fabric._raise_rule('no_data_found',
      'unknown run',
      'runs are opened with fabric_api.open_run');
  END IF;
  IF NOT v_admin AND v_run.opened_by <> session_user THEN
    PERFORM fabric._set_context('tenant_id', NULL);
    PERFORM fabric._raise_rule('insufficient_privilege',
      'a run is closed only by the orchestrator that opened it, or by an admin',
      'close it under the login that opened it (fabric_api.open_run), or ask a member of '
      'fabric_admin');
  END IF;
  PERFORM fabric._set_context('run_id', p_run_id::text);
  PERFORM fabric._set_context('actor', fabric._actor_id());
  UPDATE fabric.runs r SET closed_at = pg_catalog.now()
  WHERE r.tenant_id = v_run.tenant_id AND r.run_id = p_run_id AND r.closed_at IS NULL
  RETURNING r.closed_at INTO v_closed_at;
  IF FOUND THEN
    PERFORM fabric._emit('fabric.run.closed', v_run.tenant_id, p_payload =>
      pg_catalog.jsonb_build_object('agent_id', v_run.agent_id, 'closed_by', session_user::text,
        'closed_as', CASE WHEN v_run.opened_by = session_user THEN 'opener' ELSE 'admin' END));
  ELSE
    v_closed_at := v_run.closed_at;
  END IF;
  RETURN pg_catalog.jsonb_build_object('run_id', p_run_id, 'closed_at', v_closed_at);
END $$;
COMMENT ON FUNCTION fabric_api.close_run(uuid) IS
  'Close a run (idempotent). The orchestrator that opened it, or an admin; the event names who '
  'closed it. Example: SELECT fabric_api.close_run(''<run_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric._live_run: the run of an entry point that acts in an open run: looked up in its
-- tenant (fabric._run_in_its_tenant, which sets the tenant), then whose it must be -- the
-- calling agent's (p_agent_id) or the orchestrator's that opened it (p_opened_by; one of
-- the two is named, else every run is refused) -- and
-- live (fabric._run_is_live). Each refusal is 42501: p_refusal with p_refusal_hint for a run
-- that is unknown or not the caller's, 'the run is closed or expired' with p_dead_hint for
-- one that no longer authorizes; the tenant is cleared before either, and nothing is written.
-- The one prologue of fabric._enter_run (agents) and fabric_api.issue_mcp_token.
CREATE OR REPLACE FUNCTION fabric._live_run(p_run_id uuid, p_agent_id text, p_opened_by name,
  p_refusal text, p_refusal_hint text, p_dead_hint text)
RETURNS fabric.runs
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_run fabric.runs := fabric._run_in_its_tenant(p_run_id);
BEGIN
  IF v_run.run_id IS NULL
     OR (p_agent_id IS NOT NULL AND v_run.agent_id <> p_agent_id)
     OR (p_opened_by IS NOT NULL AND v_run.opened_by <> p_opened_by)
     OR (p_agent_id IS NULL AND p_opened_by IS NULL) THEN
    PERFORM fabric._set_context('tenant_id', NULL);
    PERFORM fabric._raise_rule('insufficient_privilege', p_refusal, p_refusal_hint);
  END IF;
  IF NOT fabric._run_is_live(v_run) THEN
    PERFORM fabric._set_context('tenant_id', NULL);
    PERFORM fabric._raise_rule('insufficient_privilege', 'the run is closed or expired',
      p_dead_hint);
  END IF;
  RETURN v_run;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._enter_run: the caller's open, unexpired run; sets tenant, actor and run context.
-- An unknown, expired, closed or foreign run is an error (42501) that writes nothing.
CREATE OR REPLACE FUNCTION fabric._enter_run(p_run_id uuid)
RETURNS fabric.runs
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  -- fabric._caller_agent_id's read, in this expression (one function call less for every
  -- call an agent makes in its run)
  v_agent_id text := (SELECT a.agent_id FROM fabric.agents a WHERE a.login = session_user);
  v_run fabric.runs;
  v text;
BEGIN
  IF v_agent_id IS NULL THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the caller is not a registered agent',
      'each agent logs in with the login registered by fabric_api.register_agent');
  END IF;
  v_run := fabric._live_run(p_run_id, v_agent_id, NULL,
    'no run of the calling agent has this run_id',
    'the orchestrator opens a run for this agent with fabric_api.open_run',
    'ask the orchestrator to open a new run');
  -- fabric._set_context of both, as simple expressions (this runs once per propose); on
  -- plain PostgreSQL set_config itself, without a call of fabric._set_local each
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local' THEN
    v := pg_catalog.set_config('fabric.actor', v_agent_id, true);
    v := pg_catalog.set_config('fabric.run_id', p_run_id::text, true);
  ELSE
    v := fabric._set_local('fabric.actor', v_agent_id);
    v := fabric._set_local('fabric.run_id', p_run_id::text);
  END IF;
  RETURN v_run;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._tool_layers_missing: the three layers' verdict as the names of the ones that miss
-- (empty when the tool holds in all three). The one place the layers become a denial:
-- fabric._tool_denial reads them, and recall reads them in the statement that reads the
-- agent's profile (one statement less a recall).
-- (An SQL function with an SQL-standard body, inlined into the statement that calls it: see
-- fabric._run_is_live.)
CREATE OR REPLACE FUNCTION fabric._tool_layers_missing(p_allowed boolean, p_enabled boolean,
                                                       p_run fabric.runs, p_tool text)
RETURNS text[]
LANGUAGE sql IMMUTABLE
RETURN pg_catalog.array_remove(ARRAY[
    CASE WHEN NOT coalesce(p_allowed, false) THEN 'tools_allowed' END,
    CASE WHEN NOT coalesce(p_enabled, false) THEN 'tenant_enablement' END,
    CASE WHEN NOT p_tool = ANY (p_run.active_tool_set) THEN 'active_tool_set' END
  ], NULL);

-- ---------------------------------------------------------------------------------------
-- fabric._tool_denial: NULL if the tool holds in all three layers, else which ones miss.
CREATE OR REPLACE FUNCTION fabric._tool_denial(p_run fabric.runs, p_tool text)
RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT fabric._tool_layers_missing(
    EXISTS (SELECT 1 FROM fabric.agents a
            WHERE a.agent_id = p_run.agent_id AND p_tool = ANY (a.tools_allowed)),
    EXISTS (SELECT 1 FROM fabric.tenant_agent_tools t
            WHERE t.tenant_id = p_run.tenant_id AND t.agent_id = p_run.agent_id
              AND t.tool_id = p_tool),
    p_run, p_tool));
END $$;
