-- Agent tokens: a desktop MCP configuration that keeps working. An orchestrator issues a
-- token bound to a run template it fixes: tenant, agent, subject, session policy (one
-- session for every run, or each run its own), a tool set within the agent's enablement in
-- the tenant, and the longest run. The MCP gateway's own login (fabric_mcp_gateway: never
-- the agent's login, never an orchestrator that could open any run) opens runs from the
-- template and nothing else; each run it opens names the token (runs.token_id, and the
-- fabric.run.opened event). A token never widens its template; revoking it closes its runs.

SET LOCAL ROLE fabric_lookup;
-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_agent_token: which tenant a token hash belongs to.
CREATE OR REPLACE FUNCTION fabric._tenant_of_agent_token(p_hash bytea)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- plpgsql: Citus plans no statement of an SQL function with parameters
  RETURN (SELECT t.tenant_id FROM fabric.agent_tokens t WHERE t.token_hash = p_hash);
END $$;
REVOKE ALL ON FUNCTION fabric._tenant_of_agent_token(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._tenant_of_agent_token(bytea) TO fabric_owner;

SET LOCAL ROLE fabric_owner;
GRANT SELECT (tenant_id, token_hash) ON fabric.agent_tokens TO fabric_lookup;

-- ---------------------------------------------------------------------------------------
-- fabric._agent_token_hash: what is stored of a token; NULL unless it has the issued form.
CREATE OR REPLACE FUNCTION fabric._agent_token_hash(p_token text)
RETURNS bytea
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT fabric._secret_hash('mfa_', p_token)
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.issue_agent_token: a token bound to a run template (orchestrator only). The
-- tool set must lie within the agent's enablement in the tenant; the run ttl is at most 7
-- days; the token itself expires after p_ttl (default 90 days) unless revoked first.
CREATE OR REPLACE FUNCTION fabric_api.issue_agent_token(p_tenant_id text, p_agent_id text,
  p_subject_id text, p_session_id text, p_active_tool_set text[], p_run_ttl interval,
  p_ttl interval DEFAULT '90 days')
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_login name := session_user;  -- a value: a Citus worker would read its own session
  v_token text;
  v_id uuid := pg_catalog.gen_random_uuid();
  v_expires timestamptz;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_orchestrator', 'issue agent tokens');
  IF p_run_ttl IS NULL OR p_run_ttl <= interval '0' OR p_run_ttl > interval '7 days' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a token''s run ttl must be positive and at most 7 days',
      'runs are renewed from the token; each one stays short');
  END IF;
  IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'an agent token''s ttl must be positive',
      'e.g. ''90 days''; revoke the token to end it sooner');
  END IF;
  IF p_active_tool_set IS NULL OR pg_catalog.array_position(p_active_tool_set, NULL) IS NOT NULL
     OR pg_catalog.cardinality(p_active_tool_set) = 0 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'active_tool_set must be a non-empty array of tool ids without NULLs',
      'e.g. ARRAY[''tool:memory-propose'', ''tool:memory-recall'']');
  END IF;
  PERFORM fabric._refuse_audit_tools(p_active_tool_set);
  PERFORM fabric._ident(p_agent_id, 'agent_id');
  PERFORM fabric._ident(p_subject_id, 'subject_id');
  PERFORM fabric._ident(p_session_id, 'session_id');
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  IF NOT EXISTS (SELECT 1 FROM fabric.tenant_agents e
                 WHERE e.tenant_id = p_tenant_id AND e.agent_id = p_agent_id) THEN
    PERFORM fabric._raise_rule('insufficient_privilege', 'the agent is not enabled in this tenant',
      'an admin enables it with fabric_api.enable_agent');
  END IF;
  IF EXISTS (SELECT 1 FROM pg_catalog.unnest(p_active_tool_set) t(tool_id)
             WHERE NOT EXISTS (SELECT 1 FROM fabric.tenant_agent_tools x
                               WHERE x.tenant_id = p_tenant_id AND x.agent_id = p_agent_id
                                 AND x.tool_id = t.tool_id)) THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'a token''s tool set lies within the agent''s enablement in the tenant',
      'name only tools fabric_api.enable_agent enabled for this agent here');
  END IF;
  v_token := fabric._new_secret('mfa_');
  v_expires := pg_catalog.now() + p_ttl;
  -- issued_by is named: a Citus worker would evaluate its default as the function owner
  INSERT INTO fabric.agent_tokens (tenant_id, token_id, token_hash, agent_id, subject_id,
                                   session_id, active_tool_set, run_ttl, expires_at, issued_by)
  VALUES (p_tenant_id, v_id, fabric._agent_token_hash(v_token), p_agent_id, p_subject_id,
          p_session_id, p_active_tool_set, p_run_ttl, v_expires, v_login);
  PERFORM fabric._emit('fabric.agent_token.issued', p_tenant_id, p_payload =>
    pg_catalog.jsonb_build_object('token_id', v_id, 'agent_id', p_agent_id,
                                  'active_tool_set', p_active_tool_set,
                                  'run_ttl', p_run_ttl, 'expires_at', v_expires));
  RETURN pg_catalog.jsonb_build_object('token', v_token, 'token_id', v_id,
                                       'expires_at', v_expires);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.open_token_run: a run from a live token's template (MCP gateway only). The
-- run lasts the template's run ttl (never past the token), keeps the template's subject,
-- session (or, without one, a session of its own: the run id) and tool set, and names the
-- token. An unknown, revoked or expired token is one refusal (42501).
CREATE OR REPLACE FUNCTION fabric_api.open_token_run(p_token text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_opener name := session_user;  -- a value: a Citus worker would read its own session
  v_hash bytea := fabric._agent_token_hash(p_token);
  v_tenant text;
  v_token fabric.agent_tokens;
  v_login name;
  v_run_id uuid := pg_catalog.gen_random_uuid();
  v_session text;
  v_expires timestamptz;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_mcp_gateway', 'open runs from agent tokens');
  v_tenant := fabric._tenant_of_agent_token(v_hash);
  IF v_tenant IS NOT NULL THEN
    PERFORM fabric._set_context('tenant_id', v_tenant);
    SELECT * INTO v_token FROM fabric.agent_tokens t
    WHERE t.tenant_id = v_tenant AND t.token_hash = v_hash
      AND t.revoked_at IS NULL AND t.expires_at > pg_catalog.now()
    FOR SHARE;
  END IF;
  IF v_token.token_id IS NULL THEN
    PERFORM fabric._set_context('tenant_id', NULL);
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the agent token is unknown, revoked or expired',
      'ask the orchestrator for a new token (fabric_api.issue_agent_token)');
  END IF;
  SELECT a.login INTO v_login FROM fabric.agents a WHERE a.agent_id = v_token.agent_id;
  v_session := coalesce(v_token.session_id, 'run-' || v_run_id::text);
  v_expires := LEAST(pg_catalog.now() + v_token.run_ttl, v_token.expires_at);
  INSERT INTO fabric.runs (tenant_id, run_id, agent_id, subject_id, session_id,
                           active_tool_set, expires_at, token_id, opened_by)
  VALUES (v_tenant, v_run_id, v_token.agent_id, v_token.subject_id, v_session,
          v_token.active_tool_set, v_expires, v_token.token_id, v_opener);
  PERFORM fabric._note_tenant('run', v_run_id, v_tenant);  -- a cluster's lookup
  PERFORM fabric._subject_key(v_tenant, v_token.subject_id);
  PERFORM fabric._set_context('run_id', v_run_id::text);
  PERFORM fabric._emit('fabric.run.opened', v_tenant, p_payload =>
    pg_catalog.jsonb_build_object('agent_id', v_token.agent_id,
                                  'active_tool_set', v_token.active_tool_set,
                                  'expires_at', v_expires, 'token_id', v_token.token_id));
  RETURN pg_catalog.jsonb_build_object('run_id', v_run_id, 'login', v_login,
    'tenant_id', v_tenant, 'agent_id', v_token.agent_id, 'expires_at', v_expires,
    'token_id', v_token.token_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.revoke_agent_token: the token opens no run any more, and its open runs are
-- closed (each with its fabric.run.closed event). The orchestrator that issued it only;
-- idempotent.
CREATE OR REPLACE FUNCTION fabric_api.revoke_agent_token(p_tenant_id text, p_token_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_token fabric.agent_tokens;
  v_run fabric.runs;
  v_closed integer := 0;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_orchestrator', 'revoke agent tokens');
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  SELECT * INTO v_token FROM fabric.agent_tokens t
  WHERE t.tenant_id = p_tenant_id AND t.token_id = p_token_id FOR UPDATE;
  IF v_token.token_id IS NULL OR v_token.issued_by <> session_user THEN
    PERFORM fabric._set_context('tenant_id', NULL);
    PERFORM fabric._raise_rule('no_data_found', 'no agent token issued by this orchestrator matches',
      'tokens come from fabric_api.issue_agent_token under this login');
  END IF;
  PERFORM fabric._set_context('actor', fabric._actor_id());
  IF v_token.revoked_at IS NULL THEN
    UPDATE fabric.agent_tokens t SET revoked_at = pg_catalog.now()
    WHERE t.tenant_id = p_tenant_id AND t.token_id = p_token_id;
    PERFORM fabric._emit('fabric.agent_token.revoked', p_tenant_id, p_payload =>
      pg_catalog.jsonb_build_object('token_id', p_token_id, 'agent_id', v_token.agent_id));
  END IF;
  FOR v_run IN
    UPDATE fabric.runs r SET closed_at = pg_catalog.now()
    WHERE r.tenant_id = p_tenant_id AND r.token_id = p_token_id AND r.closed_at IS NULL
    RETURNING *
  LOOP
    PERFORM fabric._set_context('run_id', v_run.run_id::text);
    PERFORM fabric._emit('fabric.run.closed', p_tenant_id, p_payload =>
      pg_catalog.jsonb_build_object('agent_id', v_run.agent_id, 'closed_by', session_user::text,
        'closed_as', 'token_revoked', 'token_id', p_token_id));
    v_closed := v_closed + 1;
  END LOOP;
  RETURN pg_catalog.jsonb_build_object('token_id', p_token_id, 'runs_closed', v_closed);
END $$;
