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
-- fabric._on_worker: whether this backend runs on a Citus worker, which is where a call
-- delegated by its tenant runs (docs/citus.md, "Delegated calls"). There the coordinator's
-- outbox and tenant directory do not exist: a call's events wait in fabric.shard_events on
-- the tenant's shard, in the call's own transaction, until the coordinator relays them
-- (fabric_api.relay_events). False on plain PostgreSQL, answered from a setting alone; the
-- Citus function is resolved only on a cluster.
CREATE OR REPLACE FUNCTION fabric._on_worker()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local' THEN
    RETURN false;
  END IF;
  RETURN NOT pg_catalog.citus_is_coordinator();
END $$;
REVOKE ALL ON FUNCTION fabric._on_worker() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._on_worker() TO fabric_lookup;  -- the tenant lookups'

-- ---------------------------------------------------------------------------------------
-- fabric._set_local_statement: SET LOCAL of one fabric setting (fabric._set_local on Citus).
CREATE OR REPLACE FUNCTION fabric._set_local_statement(p_name text, p_value text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  EXECUTE pg_catalog.format('SET LOCAL %I.%I = %L',
    pg_catalog.split_part(p_name, '.', 1), pg_catalog.split_part(p_name, '.', 2), p_value);
  RETURN p_value;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._set_local: set a governance setting for the rest of the transaction, on every
-- node the transaction reaches. set_config() stays in this backend; on a Citus cluster the
-- shards' policies and triggers run in the workers' backends, and only SET LOCAL reaches
-- them (citus.propagate_set_commands = 'local', which the bootstrap sets there; docs/citus.md).
-- The name is one of the fabric's own settings, never an input.
CREATE OR REPLACE FUNCTION fabric._set_local(p_name text, p_value text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local' THEN
    RETURN pg_catalog.set_config(p_name, p_value, true);
  END IF;
  -- Citus passes a SET LOCAL on only from inside a query of a function call (or a
  -- transaction block); a plpgsql assignment is evaluated outside the executor, so the
  -- statement runs in a query of its own.
  EXECUTE 'SELECT fabric._set_local_statement($1, $2)' USING p_name, p_value;
  IF p_name = 'fabric.tenant_id' AND p_value <> '' THEN
    -- Citus sends the SET LOCALs to a worker when it opens a transaction block there, and a
    -- plain read outside BEGIN opens none; a row-locking read does, inside a function. So
    -- the tenant's worker joins the transaction now, with the tenant set, and every later
    -- statement on its shards runs there (colocated: one connection per worker and role).
    PERFORM 1 FROM fabric.tenant_agents e WHERE e.tenant_id = p_value LIMIT 1 FOR KEY SHARE;
  END IF;
  RETURN p_value;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._reset_context: every API function starts from nothing, whatever the caller set.
CREATE OR REPLACE FUNCTION fabric._reset_context()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v text;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- a Citus cluster: statements that reach the workers (fabric._set_local)
    v := fabric._set_local('fabric.tenant_id', '');
    v := fabric._set_local('fabric.actor', '');
    v := fabric._set_local('fabric.run_id', '');
    v := fabric._set_local('fabric.correlation_id', '');
    v := fabric._set_local('fabric.causation_id', '');
    v := fabric._set_local('fabric.approval_id', '');
    v := fabric._set_local('fabric.action', '');
    RETURN;
  END IF;
  -- one assignment, not PERFORM: a simple expression, evaluated without a statement of the
  -- executor (every API call starts here), all seven in it
  v := pg_catalog.set_config('fabric.tenant_id', '', true)
       || pg_catalog.set_config('fabric.actor', '', true)
       || pg_catalog.set_config('fabric.run_id', '', true)
       || pg_catalog.set_config('fabric.correlation_id', '', true)
       || pg_catalog.set_config('fabric.causation_id', '', true)
       || pg_catalog.set_config('fabric.approval_id', '', true)
       || pg_catalog.set_config('fabric.action', '', true);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._set_context: set one governance setting for the rest of the transaction.
CREATE OR REPLACE FUNCTION fabric._set_context(p_name text, p_value text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v text;
BEGIN
  -- assignments, not PERFORM: simple expressions, evaluated without a statement of the
  -- executor (about 9 µs less a call); fabric._set_local on a Citus cluster only
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local' THEN
    v := pg_catalog.set_config('fabric.' || p_name, coalesce(p_value, ''), true);
  ELSE
    v := fabric._set_local('fabric.' || p_name, coalesce(p_value, ''));
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._require_role: authority comes from membership in a group role (R-ID-2).
CREATE OR REPLACE FUNCTION fabric._require_role(p_role name, p_action text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NOT pg_catalog.pg_has_role(session_user, p_role, 'MEMBER') THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      pg_catalog.format('only members of %s may %s', p_role, p_action),
      pg_catalog.format('log in as a role that is a member of %s', p_role));
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

-- ---------------------------------------------------------------------------------------
-- fabric._require_tenant: an id names an existing tenant, else a clear error (P0002).
CREATE OR REPLACE FUNCTION fabric._require_tenant(p_tenant_id text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM fabric.tenants t WHERE t.tenant_id = p_tenant_id) THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown tenant',
      'tenants are created with fabric_api.create_tenant');
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._enter_as: a fresh context for a member of p_role that is a registered agent
-- (its agent id is what it acts as, e.g. formed_by); returns that agent id.
CREATE OR REPLACE FUNCTION fabric._enter_as(p_role name, p_action text, p_agent_example text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_agent_id text;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role(p_role, p_action);
  v_agent_id := fabric._caller_agent_id();
  IF v_agent_id IS NULL THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      pg_catalog.format('the %s login is not a registered agent', p_role),
      pg_catalog.format('register it (e.g. as %s) with fabric_api.register_agent',
                        p_agent_example));
  END IF;
  RETURN v_agent_id;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_known_record: the tenant of a record, or a clear error (P0002).
CREATE OR REPLACE FUNCTION fabric._tenant_of_known_record(p_memory_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := fabric._tenant_of_record(p_memory_id);
BEGIN
  IF v_tenant IS NULL THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown memory record',
      'memory ids come from fabric_api.commit; tombstones keep theirs');
  END IF;
  RETURN v_tenant;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._run_in_its_tenant: the run with this id, read under its own tenant, which becomes
-- the transaction's tenant; a row of NULLs (and no tenant) when no run has the id. The one
-- run lookup of the entry points that take a run id: fabric._live_run (agents entering a
-- run, MCP tokens) then checks whose run it is and that it is live; close_run, which also
-- closes a closed run, checks whose it is itself.
CREATE OR REPLACE FUNCTION fabric._run_in_its_tenant(p_run_id uuid)
RETURNS fabric.runs
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := fabric._tenant_of_run(p_run_id);
  v_run fabric.runs;
  v text;
BEGIN
  IF v_tenant IS NOT NULL THEN
    -- _set_context's: on plain PostgreSQL set_config itself, without a call
    v := CASE WHEN pg_catalog.current_setting('citus.propagate_set_commands', true)
                   IS DISTINCT FROM 'local'
              THEN pg_catalog.set_config('fabric.tenant_id', v_tenant, true)
              ELSE fabric._set_local('fabric.tenant_id', v_tenant) END;
    SELECT * INTO v_run FROM fabric.runs r WHERE r.tenant_id = v_tenant AND r.run_id = p_run_id;
  END IF;
  RETURN v_run;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._run_is_live: a run authorizes only while it is open and unexpired.
-- An SQL function with an SQL-standard body (RETURN expression): its names are bound when
-- it is created, so it needs no SET search_path, and without one the planner inlines it
-- into its caller's expression (no function call, no executor state of its own per
-- transaction: see docs/benchmarks.md, "Governed recall: fewer layers").
CREATE OR REPLACE FUNCTION fabric._run_is_live(p_run fabric.runs)
RETURNS boolean
LANGUAGE sql STABLE
RETURN p_run.closed_at IS NULL AND p_run.expires_at > pg_catalog.now();

-- ---------------------------------------------------------------------------------------
-- fabric._ident: the one identifier rule for every API input (22023 naming the field, never
-- the value). The rule itself is the fabric.ident domain: 1-200 printable characters, no
-- spaces, controls, format characters (bidi overrides, zero-width, BOM) or private use,
-- every code point assigned, Unicode NFC. p_max only shortens it. NULL passes as NULL.
CREATE OR REPLACE FUNCTION fabric._ident(p_value text, p_field text, p_max integer DEFAULT 200)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_value IS NULL THEN
    RETURN NULL;
  END IF;
  -- Printable ASCII without spaces meets every part of the domain (no control, space or
  -- format character, assigned, NFC): answered without the cast and the subtransaction.
  IF pg_catalog.length(p_value) <= p_max AND p_value ~ '^[!-~]+$' THEN
    RETURN p_value;
  END IF;
  BEGIN
    IF pg_catalog.length(p_value) > p_max THEN   -- caught below: never seen by a caller
      RAISE EXCEPTION USING ERRCODE = 'check_violation';
    END IF;
    RETURN p_value::fabric.ident;
  EXCEPTION WHEN check_violation THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      pg_catalog.format('%s must be 1-%s printable characters in Unicode NFC, without '
                        'spaces, control or format characters', p_field, p_max),
      'identifiers look like user-8842, sess-1f9c, evt-7b21; bidi overrides, '
      'zero-width characters and a BOM are refused');
  END;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._new_secret: a bearer secret of the fabric's one form: its kind's prefix (mft_ an
-- MCP token, mfa_ an agent token, mfb_ a broker ticket), then 64 hex: 244 random bits from
-- two version-4 UUIDs (the server's strong random source). Returned to its caller once;
-- only fabric._secret_hash of it is stored.
CREATE OR REPLACE FUNCTION fabric._new_secret(p_prefix text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN p_prefix || pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '')
                  || pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._secret_hash: what is stored of a bearer secret (its SHA-256); NULL unless it has
-- the form fabric._new_secret gives it, with this kind's prefix.
CREATE OR REPLACE FUNCTION fabric._secret_hash(p_prefix text, p_secret text)
RETURNS bytea
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE WHEN pg_catalog.starts_with(p_secret, p_prefix)
                   AND pg_catalog.substr(p_secret, pg_catalog.length(p_prefix) + 1)
                       ~ '^[0-9a-f]{64}$'
              THEN pg_catalog.sha256(pg_catalog.convert_to(p_secret, 'UTF8')) END
$$;
