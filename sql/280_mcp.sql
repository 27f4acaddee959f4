-- The agent-facing MCP surface: bearer tokens for the MCP gateway, and the JSON Schemas of
-- the requests recall and propose accept, published next to their validators.
--
-- A token binds one run (so one agent login, one tenant): the orchestrator that opened the
-- run issues it, it is returned once and only its SHA-256 is kept, it expires with the run
-- or earlier, and the orchestrator can revoke it. The gateway's login (a member of
-- fabric_mcp_gateway) resolves a token to the agent's login and run, then connects as that
-- login: every rule of the fabric applies to the agent unchanged.

SET LOCAL ROLE fabric_lookup;
-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_mcp_token: which tenant a token hash belongs to.
CREATE OR REPLACE FUNCTION fabric._tenant_of_mcp_token(p_hash bytea)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- plpgsql: Citus plans no statement of an SQL function with parameters
  RETURN (SELECT t.tenant_id FROM fabric.mcp_tokens t WHERE t.token_hash = p_hash);
END $$;
REVOKE ALL ON FUNCTION fabric._tenant_of_mcp_token(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._tenant_of_mcp_token(bytea) TO fabric_owner;

SET LOCAL ROLE fabric_owner;
GRANT SELECT (tenant_id, token_hash) ON fabric.mcp_tokens TO fabric_lookup;

-- ---------------------------------------------------------------------------------------
-- fabric._mcp_token_hash: what is stored of a token; NULL unless it has the issued form.
CREATE OR REPLACE FUNCTION fabric._mcp_token_hash(p_token text)
RETURNS bytea
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT fabric._secret_hash('mft_', p_token)
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.issue_mcp_token: a bearer token for a run the calling orchestrator opened.
CREATE OR REPLACE FUNCTION fabric_api.issue_mcp_token(p_run_id uuid, p_ttl interval DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_login name := session_user;  -- a value: a Citus worker would read its own session
  v_run fabric.runs;
  v_token text;
  v_expires timestamptz;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_orchestrator', 'issue MCP tokens');
  IF p_ttl IS NOT NULL AND p_ttl <= interval '0' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'an MCP token''s ttl must be positive',
      'omit the ttl to let the token expire with its run');
  END IF;
  v_run := fabric._live_run(p_run_id, NULL, session_user,
    'an MCP token is issued only for a run the calling orchestrator opened',
    'open the run with fabric_api.open_run under this login, then issue its token',
    'open a new run and issue a token for it');
  PERFORM fabric._set_context('run_id', p_run_id::text);
  v_token := fabric._new_secret('mft_');
  v_expires := CASE WHEN p_ttl IS NULL THEN v_run.expires_at
                    ELSE LEAST(v_run.expires_at, pg_catalog.now() + p_ttl) END;
  -- issued_by is named: a Citus worker would evaluate its default as the function owner
  INSERT INTO fabric.mcp_tokens (tenant_id, token_hash, run_id, agent_id, expires_at, issued_by)
  VALUES (v_run.tenant_id, fabric._mcp_token_hash(v_token), p_run_id, v_run.agent_id, v_expires,
          v_login);
  PERFORM fabric._emit('fabric.mcp_token.issued', v_run.tenant_id, p_payload =>
    pg_catalog.jsonb_build_object('agent_id', v_run.agent_id, 'expires_at', v_expires));
  RETURN v_token;
END $$;
COMMENT ON FUNCTION fabric_api.issue_mcp_token(uuid, interval) IS
  'Issue a bearer token for the MCP gateway, bound to one run this orchestrator opened (so to '
  'its agent and tenant). Returned once; only its SHA-256 is stored. It expires with the run, or '
  'after p_ttl if sooner. Orchestrator only. Example: SELECT fabric_api.issue_mcp_token('
  '''<run_id>'', ''15 minutes'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.revoke_mcp_token: the token authorizes nothing more (idempotent).
CREATE OR REPLACE FUNCTION fabric_api.revoke_mcp_token(p_token text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_hash bytea := fabric._mcp_token_hash(p_token);
  v_tenant text;
  v_token fabric.mcp_tokens;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_orchestrator', 'revoke MCP tokens');
  v_tenant := fabric._tenant_of_mcp_token(v_hash);
  IF v_tenant IS NOT NULL THEN
    PERFORM fabric._set_context('tenant_id', v_tenant);
    SELECT * INTO v_token FROM fabric.mcp_tokens t
    WHERE t.tenant_id = v_tenant AND t.token_hash = v_hash;
  END IF;
  IF v_token.token_hash IS NULL OR v_token.issued_by <> session_user THEN
    PERFORM fabric._set_context('tenant_id', NULL);
    PERFORM fabric._raise_rule('no_data_found', 'no MCP token issued by this orchestrator matches',
      'tokens come from fabric_api.issue_mcp_token; closing the run also ends them');
  END IF;
  PERFORM fabric._set_context('run_id', v_token.run_id::text);
  IF v_token.revoked_at IS NULL THEN
    UPDATE fabric.mcp_tokens t SET revoked_at = pg_catalog.now()
    WHERE t.tenant_id = v_tenant AND t.token_hash = v_hash
    RETURNING * INTO v_token;
    PERFORM fabric._emit('fabric.mcp_token.revoked', v_tenant, p_payload =>
      pg_catalog.jsonb_build_object('agent_id', v_token.agent_id));
  END IF;
  RETURN pg_catalog.jsonb_build_object('run_id', v_token.run_id, 'revoked_at', v_token.revoked_at);
END $$;
COMMENT ON FUNCTION fabric_api.revoke_mcp_token(text) IS
  'Revoke an MCP token this orchestrator issued (idempotent). Orchestrator only. '
  'Example: SELECT fabric_api.revoke_mcp_token(''mft_...'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.resolve_mcp_token: the agent login and run a live token stands for. Unknown,
-- revoked and expired tokens, and tokens of a closed or expired run, are one refusal.
CREATE OR REPLACE FUNCTION fabric_api.resolve_mcp_token(p_token text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_hash bytea := fabric._mcp_token_hash(p_token);
  v_tenant text;
  v_answer jsonb;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_mcp_gateway', 'resolve MCP tokens');
  v_tenant := fabric._tenant_of_mcp_token(v_hash);
  IF v_tenant IS NOT NULL THEN
    PERFORM fabric._set_context('tenant_id', v_tenant);
    SELECT pg_catalog.jsonb_build_object('login', a.login, 'run_id', t.run_id,
                                         'tenant_id', t.tenant_id, 'agent_id', t.agent_id,
                                         'expires_at', LEAST(t.expires_at, r.expires_at))
      INTO v_answer
      FROM fabric.mcp_tokens t
      JOIN fabric.runs r ON r.tenant_id = t.tenant_id AND r.run_id = t.run_id
      JOIN fabric.agents a ON a.agent_id = t.agent_id
     WHERE t.tenant_id = v_tenant AND t.token_hash = v_hash
       AND t.revoked_at IS NULL AND t.expires_at > pg_catalog.now()
       -- (ROW(r.*) as the table's row type: on a Citus worker r is a row of a shard)
       AND fabric._run_is_live(ROW(r.*)::fabric.runs);
  END IF;
  PERFORM fabric._set_context('tenant_id', NULL);
  IF v_answer IS NULL THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the MCP token is unknown, revoked or expired, or its run is closed',
      'ask the orchestrator for a token of an open run (fabric_api.issue_mcp_token)');
  END IF;
  RETURN v_answer;
END $$;
COMMENT ON FUNCTION fabric_api.resolve_mcp_token(text) IS
  'The agent login, run, tenant and expiry a live MCP token stands for. MCP gateway only '
  '(fabric_mcp_gateway); the gateway then connects as that login. '
  'Example: SELECT fabric_api.resolve_mcp_token(''mft_...'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.request_schema: the JSON Schema of a request the API validates, from the one
-- source next to its validator: 'recall' (fabric_api.recall's request, with this
-- deployment's recall_max_limit) or 'propose' (fabric_api.propose's envelope).
CREATE OR REPLACE FUNCTION fabric_api.request_schema(p_name text)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  CASE p_name
    WHEN 'recall' THEN
      RETURN fabric._recall_request_schema((SELECT d.recall_max_limit FROM fabric.deployment_settings d));
    WHEN 'propose' THEN
      RETURN fabric._propose_envelope_schema();
    ELSE
      PERFORM fabric._raise_rule('invalid_parameter_value',
        'request_schema knows the requests recall and propose',
        'SELECT fabric_api.request_schema(''recall'') or (''propose'')');
  END CASE;
END $$;
COMMENT ON FUNCTION fabric_api.request_schema(text) IS
  'The JSON Schema (draft 2020-12) of a request: ''recall'' or ''propose''. '
  'Example: SELECT fabric_api.request_schema(''recall'');';
