-- The governance context: transaction-local settings that API functions set and triggers
-- read. Unset means no tenant (RLS shows nothing) and no actor (lifecycle changes fail).

-- ---------------------------------------------------------------------------------------
-- fabric._setting: a transaction setting, NULL when unset or empty.
CREATE OR REPLACE FUNCTION fabric._setting(p_name text)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT nullif(pg_catalog.current_setting(p_name, true), ''));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._reset_context: every API function starts from nothing, whatever the caller set.
CREATE OR REPLACE FUNCTION fabric._reset_context()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_name text;
BEGIN
  FOREACH v_name IN ARRAY ARRAY['fabric.tenant_id', 'fabric.actor', 'fabric.run_id',
      'fabric.correlation_id', 'fabric.causation_id', 'fabric.approval_id', 'fabric.action'] LOOP
    PERFORM pg_catalog.set_config(v_name, '', true);
  END LOOP;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._set_context: set one governance setting for the rest of the transaction.
CREATE OR REPLACE FUNCTION fabric._set_context(p_name text, p_value text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM pg_catalog.set_config('fabric.' || p_name, coalesce(p_value, ''), true);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._require_role: authority comes from membership in a group role (DESIGN.md §4).
CREATE OR REPLACE FUNCTION fabric._require_role(p_role name, p_action text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NOT pg_catalog.pg_has_role(session_user, p_role, 'MEMBER') THEN
    RAISE EXCEPTION USING
      ERRCODE = 'insufficient_privilege',
      MESSAGE = pg_catalog.format('only members of %s may %s', p_role, p_action),
      HINT = pg_catalog.format('log in as a role that is a member of %s', p_role);
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._caller_agent_id: the registered agent behind session_user, or NULL.
CREATE OR REPLACE FUNCTION fabric._caller_agent_id()
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT a.agent_id FROM fabric.agents a WHERE a.login = session_user);
END $$;
