-- The registry: agents, their memory profiles and tools. R-TOOL-2: a tool backed by
-- os-agt-008 (audit and lineage) can never be allowed to, or enabled for, any agent, nor
-- be active in a run; and os-agt-008 itself is read-only: it holds no tool and no propose
-- scope, in its registration or in any tenant.

-- ---------------------------------------------------------------------------------------
-- fabric._profile_scope_problem: NULL if a memory_profile scope is well formed, else why.
CREATE OR REPLACE FUNCTION fabric._memory_profile_problem(p_profile jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text;
  v_scope jsonb;
  v_field text;
  v_allowed text[];
BEGIN
  IF p_profile IS NULL OR pg_catalog.jsonb_typeof(p_profile) <> 'object' THEN
    RETURN 'memory_profile must be a JSON object';
  END IF;
  FOR v_key, v_scope IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(p_profile) e LOOP
    IF v_key NOT IN ('recall_scope', 'propose_scope') THEN
      RETURN 'memory_profile keys are recall_scope and propose_scope';
    END IF;
    IF pg_catalog.jsonb_typeof(v_scope) <> 'object' THEN
      RETURN pg_catalog.format('memory_profile.%s must be an object', v_key);
    END IF;
    FOR v_field IN SELECT k FROM pg_catalog.jsonb_object_keys(v_scope) k LOOP
      IF v_field NOT IN ('tiers', 'visibility') THEN
        RETURN pg_catalog.format('memory_profile.%s keys are tiers and visibility', v_key);
      END IF;
      v_allowed := CASE v_field
        WHEN 'tiers' THEN ARRAY['episodic', 'semantic', 'procedural', 'profile', 'relational']
        ELSE ARRAY['session', 'agent', 'subject', 'tenant'] END;
      IF pg_catalog.jsonb_typeof(v_scope -> v_field) <> 'array'
         OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(v_scope -> v_field) x
                    WHERE pg_catalog.jsonb_typeof(x) <> 'string'
                       OR NOT (x #>> '{}') = ANY (v_allowed)) THEN
        RETURN pg_catalog.format('memory_profile.%s.%s must be an array of %s', v_key,
                                 v_field, pg_catalog.array_to_string(v_allowed, ', '));
      END IF;
    END LOOP;
  END LOOP;
  RETURN NULL;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._profile_allows: does the memory_profile list this value under scope.field?
CREATE OR REPLACE FUNCTION fabric._profile_allows(p_profile jsonb, p_scope text,
                                                  p_field text, p_value text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT coalesce((p_profile -> p_scope -> p_field) ? p_value, false));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._refuse_audit_tools: R-TOOL-2 for a list of tool ids.
CREATE OR REPLACE FUNCTION fabric._refuse_audit_tools(p_tools text[])
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_audit text;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.unnest(p_tools) t
             WHERE NOT EXISTS (SELECT 1 FROM fabric.tools x WHERE x.tool_id = t)) THEN
    PERFORM fabric._raise_rule('foreign_key_violation', 'a tool id names no known tool',
      'tools are the rows of fabric.tools');
  END IF;
  SELECT t INTO v_audit FROM pg_catalog.unnest(p_tools) t
  JOIN fabric.tools x ON x.tool_id = t WHERE x.agent_id = 'os-agt-008' LIMIT 1;
  IF FOUND THEN
    PERFORM fabric._raise_rule('check_violation',
      pg_catalog.format('tool %s is backed by os-agt-008 and can never be allowed '
                        'to an agent (R-TOOL-2)', v_audit),
      'audit reads go through fabric_audit as a member of fabric_auditor',
      p_constraint => 'tools_audit_agent_is_never_allowed');
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._refuse_writing_audit_agent: R-TOOL-2 for os-agt-008 itself (read-only).
CREATE OR REPLACE FUNCTION fabric._refuse_writing_audit_agent(p_agent_id text, p_what text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_agent_id = 'os-agt-008' THEN
    PERFORM fabric._raise_rule('check_violation',
      pg_catalog.format('os-agt-008, the audit agent, is read-only and can hold no %s '
                        '(R-TOOL-2)', p_what),
      'register os-agt-008 with no tools and at most a recall_scope, enable it with '
      '''{}''; audit reads go through fabric_audit as a member of fabric_auditor',
      p_constraint => 'audit_agent_is_read_only');
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_agents__validate: memory_profile shape and R-TOOL-2, for every writer.
CREATE OR REPLACE FUNCTION fabric.tg_agents__validate()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_problem text := fabric._memory_profile_problem(NEW.memory_profile);
BEGIN
  IF v_problem IS NOT NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', v_problem,
      'shape: {"recall_scope": {"tiers": [...], "visibility": [...]}, '
      '"propose_scope": {"tiers": [...], "visibility": [...]}}');
  END IF;
  PERFORM fabric._refuse_audit_tools(NEW.tools_allowed);
  IF pg_catalog.cardinality(NEW.tools_allowed) > 0 THEN
    PERFORM fabric._refuse_writing_audit_agent(NEW.agent_id, 'tool');
  END IF;
  IF NEW.memory_profile ? 'propose_scope' THEN
    PERFORM fabric._refuse_writing_audit_agent(NEW.agent_id, 'propose scope');
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _200_validate
  BEFORE INSERT OR UPDATE ON fabric.agents
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_agents__validate();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_tenant_agent_tools__validate: R-TOOL-2 for tenant enablement.
CREATE OR REPLACE FUNCTION fabric.tg_tenant_agent_tools__validate()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._refuse_audit_tools(ARRAY[NEW.tool_id::text]);
  PERFORM fabric._refuse_writing_audit_agent(NEW.agent_id, 'tool');
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _200_validate
  BEFORE INSERT OR UPDATE ON fabric.tenant_agent_tools
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_tenant_agent_tools__validate();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_tools__validate: a tool that some agent holds (allowed, or enabled in any
-- tenant: that table is under RLS, hence the lookup) cannot become an audit tool.
CREATE OR REPLACE FUNCTION fabric.tg_tools__validate()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NEW.agent_id = 'os-agt-008'
     AND (EXISTS (SELECT 1 FROM fabric.agents a WHERE NEW.tool_id = ANY (a.tools_allowed))
          OR fabric._tool_is_enabled_anywhere(NEW.tool_id)) THEN
    PERFORM fabric._raise_rule('check_violation',
      pg_catalog.format('tool %s is allowed to an agent and cannot be backed by '
                        'os-agt-008 (R-TOOL-2)', NEW.tool_id),
      'remove the tool from every agent''s tools_allowed and tenant enablement first',
      p_constraint => 'tools_audit_agent_is_never_allowed');
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _200_validate
  BEFORE INSERT OR UPDATE ON fabric.tools
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_tools__validate();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_runs__validate: R-TOOL-2 for a run's active tool set, for every writer.
CREATE OR REPLACE FUNCTION fabric.tg_runs__validate()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._refuse_audit_tools(NEW.active_tool_set);
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _200_validate
  BEFORE INSERT OR UPDATE OF active_tool_set ON fabric.runs
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_runs__validate();
