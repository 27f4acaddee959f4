-- Administration: tenants, agents and their tenant enablement (members of fabric_admin).

-- ---------------------------------------------------------------------------------------
-- fabric_api.create_tenant: a tenant is the contracting organisation; ids are slugs.
CREATE OR REPLACE FUNCTION fabric_api.create_tenant(p_tenant_id text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_created boolean;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_admin', 'create tenants');
  IF p_tenant_id IS NULL OR p_tenant_id !~ '^[a-z0-9][a-z0-9_-]{0,62}$' OR p_tenant_id = 'platform' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'tenant_id must be a lowercase slug of 1-63 characters and not ''platform''',
      'e.g. fabric_api.create_tenant(''acme'')');
  END IF;
  INSERT INTO fabric.tenants (tenant_id) VALUES (p_tenant_id) ON CONFLICT DO NOTHING;
  v_created := FOUND;
  IF v_created THEN
    PERFORM fabric._set_context('tenant_id', p_tenant_id);
    INSERT INTO fabric.instance_config (tenant_id) VALUES (p_tenant_id);  -- the default instance
    PERFORM fabric._emit('fabric.tenant.created', p_tenant_id);
  END IF;
  RETURN pg_catalog.jsonb_build_object('tenant_id', p_tenant_id, 'created', v_created);
END $$;
COMMENT ON FUNCTION fabric_api.create_tenant(text) IS
  'Create a tenant (idempotent). Admin only. Example: SELECT fabric_api.create_tenant(''acme'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.register_agent: map an agent id to its own login role, with its memory
-- profile and tools_allowed; the login becomes a member of fabric_agent.
CREATE OR REPLACE FUNCTION fabric_api.register_agent(
  p_agent_id text,
  p_login name,
  p_memory_profile jsonb DEFAULT '{}',
  p_tools_allowed text[] DEFAULT '{}'
)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_role pg_catalog.pg_roles%ROWTYPE;
  v_existing fabric.agents%ROWTYPE;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_admin', 'register agents');
  IF p_agent_id IS NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'agent_id is required',
      'e.g. ''com-agt-003''');
  END IF;
  PERFORM fabric._ident(p_agent_id, 'agent_id');
  SELECT * INTO v_role FROM pg_catalog.pg_roles r WHERE r.rolname = p_login;
  IF NOT FOUND OR NOT v_role.rolcanlogin THEN
    PERFORM fabric._raise_rule('undefined_object',
      'an agent is registered with an existing login role',
      'CREATE ROLE <login> LOGIN first (one login per agent)');
  END IF;
  -- An agent login holds no other authority: not superuser or BYPASSRLS, and a member of
  -- none of the fabric's group roles but the two that act as agents (the committer,
  -- os-agt-010, and the consolidator, os-agt-011) and fabric_checkpointer (a LangGraph
  -- service may keep its threads under its agent login: they are its own, by row-level
  -- security). The migration role is a member of the owner, and so refused with it.
  IF v_role.rolsuper OR v_role.rolbypassrls OR EXISTS (
       SELECT 1 FROM pg_catalog.unnest(ARRAY['fabric_owner', 'fabric_lookup', 'fabric_retriever',
                       'fabric_admin', 'fabric_orchestrator', 'fabric_policy', 'fabric_auditor',
                       'fabric_projector', 'fabric_maintainer', 'fabric_tracer',
                       'fabric_mcp_gateway']) g(role)
       JOIN pg_catalog.pg_roles r ON r.rolname = g.role
       WHERE pg_catalog.pg_has_role(p_login, r.oid, 'MEMBER')) THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'an agent login may not be superuser, BYPASSRLS, or a member of a privileged fabric '
      'group role (admin, orchestrator, policy, auditor, projector, tracer, maintainer, MCP '
      'gateway, owner, lookup, retriever)',
      'give each agent its own login; of the group roles only fabric_committer, '
      'fabric_consolidator and fabric_checkpointer go with an agent login');
  END IF;
  IF p_tools_allowed IS NULL OR pg_catalog.array_position(p_tools_allowed, NULL) IS NOT NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'tools_allowed must be an array of tool ids without NULLs',
      'e.g. ARRAY[''tool:memory-propose'', ''tool:memory-recall'']');
  END IF;
  IF pg_catalog.cardinality(p_tools_allowed) > 0 THEN
    PERFORM fabric._refuse_writing_audit_agent(p_agent_id, 'tool');
  END IF;
  IF coalesce(p_memory_profile, '{}') ? 'propose_scope' THEN
    PERFORM fabric._refuse_writing_audit_agent(p_agent_id, 'propose scope');
  END IF;
  SELECT * INTO v_existing FROM fabric.agents a WHERE a.agent_id = p_agent_id;
  IF FOUND AND v_existing.login <> p_login THEN
    PERFORM fabric._raise_rule('unique_violation',
      'this agent_id is already registered to another login',
      'one agent, one login: pick another agent_id');
  END IF;
  IF EXISTS (SELECT 1 FROM fabric.agents a WHERE a.login = p_login AND a.agent_id <> p_agent_id) THEN
    PERFORM fabric._raise_rule('unique_violation', 'this login already belongs to another agent',
      'one agent, one login: create a new login role');
  END IF;
  INSERT INTO fabric.agents (agent_id, login, memory_profile, tools_allowed)
  VALUES (p_agent_id, p_login, coalesce(p_memory_profile, '{}'), p_tools_allowed)
  ON CONFLICT (agent_id) DO UPDATE
    SET memory_profile = EXCLUDED.memory_profile, tools_allowed = EXCLUDED.tools_allowed;
  PERFORM fabric._grant_on_workers('fabric_agent', p_login);  -- first: it holds no lock yet
  EXECUTE pg_catalog.format('GRANT fabric_agent TO %I', p_login);
  PERFORM fabric._emit('fabric.agent.registered', 'platform', p_payload =>
    pg_catalog.jsonb_build_object('agent_id', p_agent_id, 'login', p_login,
                                  'tools_allowed', p_tools_allowed));
  RETURN pg_catalog.jsonb_build_object('agent_id', p_agent_id, 'login', p_login,
    'memory_profile', coalesce(p_memory_profile, '{}'), 'tools_allowed', p_tools_allowed);
END $$;
COMMENT ON FUNCTION fabric_api.register_agent(text, name, jsonb, text[]) IS
  'Register an agent with its own login (re-registering updates profile and tools). Admin only. '
  'Example: SELECT fabric_api.register_agent(''com-agt-003'', ''com_agt_003'', '
  '''{"propose_scope": {"tiers": ["episodic"], "visibility": ["subject"]}}'', '
  'ARRAY[''tool:memory-propose'']);';

-- ---------------------------------------------------------------------------------------
-- fabric._grant_on_workers: on a Citus cluster's coordinator, make the same role grant on
-- every worker. A call delegated to a worker (sql/296_delegation.sql) runs there as its
-- caller's login, whose EXECUTE privileges come from the group roles it is a member of on
-- that node; Citus does not carry a grant of a login it did not create. Idempotent; the
-- workers' grants are made on connections of their own, before this transaction's own (a
-- rolled-back registration leaves them, which authorizes nothing without the agent's
-- registry row).
CREATE OR REPLACE FUNCTION fabric._grant_on_workers(p_role name, p_login name)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_failed text;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local'
     OR fabric._on_worker() THEN
    RETURN;
  END IF;
  SELECT pg_catalog.string_agg(w.nodename || ':' || w.nodeport || ' ' || w.result, '; ')
    INTO v_failed
    FROM pg_catalog.run_command_on_workers(pg_catalog.format(
           -- made on that worker only: a worker would otherwise pass it on to every node,
           -- the coordinator too, where this transaction's own grant holds the role's lock
           -- (one statement: Citus reports only the first statement of a string)
           'DO $grant$ BEGIN PERFORM pg_catalog.set_config(''citus.enable_ddl_propagation'', '
           '''off'', true); GRANT %I TO %I; END $grant$', p_role, p_login)) w
   WHERE NOT w.success;
  IF v_failed IS NOT NULL THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the agent''s login could not be made a member of its role on every worker',
      'create the login on every node of the cluster (CREATE ROLE ... LOGIN), then register '
      'the agent again', v_failed);
  END IF;
END $$;
REVOKE ALL ON FUNCTION fabric._grant_on_workers(name, name) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric_api.enable_agent: the tenant layer of tool authorization; sets exactly p_tools.
CREATE OR REPLACE FUNCTION fabric_api.enable_agent(p_tenant_id text, p_agent_id text,
                                                   p_tools text[] DEFAULT '{}')
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_admin', 'enable agents in tenants');
  PERFORM fabric._require_tenant(p_tenant_id);
  IF NOT EXISTS (SELECT 1 FROM fabric.agents a WHERE a.agent_id = p_agent_id) THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown agent',
      'register it with fabric_api.register_agent');
  END IF;
  IF p_tools IS NULL OR pg_catalog.array_position(p_tools, NULL) IS NOT NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'tools must be an array of tool ids without NULLs',
      'pass ''{}'' to enable the agent with no tools');
  END IF;
  IF pg_catalog.cardinality(p_tools) > 1
     AND (SELECT pg_catalog.count(DISTINCT t) FROM pg_catalog.unnest(p_tools) t)
         < pg_catalog.cardinality(p_tools) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'tools must name each tool once',
      'e.g. ARRAY[''tool:memory-propose'', ''tool:memory-recall'']');
  END IF;
  PERFORM fabric._refuse_audit_tools(p_tools);
  IF pg_catalog.cardinality(p_tools) > 0 THEN
    PERFORM fabric._refuse_writing_audit_agent(p_agent_id, 'tool');
  END IF;
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  INSERT INTO fabric.tenant_agents (tenant_id, agent_id) VALUES (p_tenant_id, p_agent_id)
  ON CONFLICT DO NOTHING;
  DELETE FROM fabric.tenant_agent_tools t
  WHERE t.tenant_id = p_tenant_id AND t.agent_id = p_agent_id AND NOT t.tool_id = ANY (p_tools);
  INSERT INTO fabric.tenant_agent_tools (tenant_id, agent_id, tool_id)
  SELECT DISTINCT p_tenant_id, p_agent_id, x FROM pg_catalog.unnest(p_tools) x
  ON CONFLICT DO NOTHING;
  PERFORM fabric._emit('fabric.agent.enabled', p_tenant_id, p_payload =>
    pg_catalog.jsonb_build_object('agent_id', p_agent_id, 'tools', p_tools));
  RETURN pg_catalog.jsonb_build_object('tenant_id', p_tenant_id, 'agent_id', p_agent_id,
                                       'tools', p_tools);
END $$;
COMMENT ON FUNCTION fabric_api.enable_agent(text, text, text[]) IS
  'Enable an agent in a tenant with exactly these tools. Admin only. '
  'Example: SELECT fabric_api.enable_agent(''acme'', ''com-agt-003'', ARRAY[''tool:memory-propose'']);';
