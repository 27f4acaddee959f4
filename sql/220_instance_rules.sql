-- Instance configuration rules (docs/concepts.md, Retention classes), checked by the database at configuration
-- time whoever writes the row: air-gapped means local endpoints only; checkpoints outlive
-- every approval; a regulated ceiling is never below its floor.

-- ---------------------------------------------------------------------------------------
-- fabric._uri_host: the lowercased host of a URI; 'unix' for unix sockets; NULL if none.
CREATE OR REPLACE FUNCTION fabric._uri_host(p_uri text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE
    WHEN p_uri ~* '^(unix|[a-z]+\+unix):' OR p_uri LIKE '/%' THEN 'unix'
    ELSE pg_catalog.lower(pg_catalog.btrim(pg_catalog.substring(p_uri,
           '^[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/?#]*@)?(\[[^]]+\]|[^:/?#]+)'), '[]'))
  END
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._host_is_local: loopback, unix sockets, or the instance's local allowlist.
CREATE OR REPLACE FUNCTION fabric._host_is_local(p_host text, p_allowlist text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT p_host IS NOT NULL AND (
    p_host IN ('unix', 'localhost', '::1', '0:0:0:0:0:0:0:1')
    OR p_host ~ '^127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$'
    OR p_host = ANY (ARRAY(SELECT pg_catalog.lower(h) FROM pg_catalog.unnest(p_allowlist) h)))
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._config_rule, once a copy of fabric._raise_rule, is gone: a broken configuration rule is
-- raised by fabric._raise_rule('check_violation', ..., p_constraint => <the rule>).
DROP FUNCTION IF EXISTS fabric._config_rule(text, text, text);

-- ---------------------------------------------------------------------------------------
-- fabric._longest_approval_timeout: the default timeout or any per-action one.
CREATE OR REPLACE FUNCTION fabric._longest_approval_timeout(p_config fabric.instance_config)
RETURNS interval
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.max(t) FROM (
    SELECT p_config.approval_timeout AS t
    UNION ALL
    SELECT (v #>> '{}')::interval FROM pg_catalog.jsonb_each(p_config.approval_timeouts) e(k, v)) x
$$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_instance_config__validate: the three load-bearing configuration rules.
CREATE OR REPLACE FUNCTION fabric.tg_instance_config__validate()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key text;
  v_value jsonb;
BEGIN
  IF NEW.deployment_mode = 'air-gapped' THEN
    IF NEW.model_uri IS NOT NULL AND NOT fabric._host_is_local(fabric._uri_host(NEW.model_uri), NEW.local_hosts) THEN
      PERFORM fabric._raise_rule('check_violation',
        'an air-gapped instance cannot use a model URI whose host is not local',
        'use a loopback or unix-socket endpoint, or add the host to local_hosts',
        p_constraint => 'instance_config_air_gapped_is_local');
    END IF;
    IF NEW.embedding_uri IS NOT NULL AND NOT fabric._host_is_local(fabric._uri_host(NEW.embedding_uri), NEW.local_hosts) THEN
      PERFORM fabric._raise_rule('check_violation',
        'an air-gapped instance cannot use an embedding URI whose host is not local',
        'use a loopback or unix-socket endpoint, or add the host to local_hosts',
        p_constraint => 'instance_config_air_gapped_is_local');
    END IF;
    IF EXISTS (SELECT 1 FROM fabric.deployment_settings d
               WHERE d.embedder_url IS NOT NULL
                 AND NOT fabric._host_is_local(fabric._uri_host(d.embedder_url), NEW.local_hosts)) THEN
      PERFORM fabric._raise_rule('check_violation',
        'an air-gapped instance cannot run on a deployment whose embedder endpoint is not local',
        'point the deployment embedder at a loopback or unix-socket endpoint',
        p_constraint => 'instance_config_air_gapped_is_local');
    END IF;
  END IF;
  FOR v_key, v_value IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(NEW.approval_timeouts) e LOOP
    IF v_key NOT IN ('promote', 'supersede', 'erase', 'erase_subject')
       OR pg_catalog.jsonb_typeof(v_value) <> 'string'
       OR pg_catalog.pg_input_is_valid(v_value #>> '{}', 'interval') IS NOT TRUE THEN
      PERFORM fabric._raise_rule('invalid_parameter_value',
        'approval_timeouts maps an action (promote, supersede, erase, erase_subject) to an interval',
        'e.g. {"erase": "3 days"}');
    END IF;
  END LOOP;
  -- NEW as a row of fabric.instance_config: on a Citus worker the trigger fires on a shard,
  -- whose row type is the shard's own.
  IF NEW.checkpoint_retention <= fabric._longest_approval_timeout(
       pg_catalog.jsonb_populate_record(NULL::fabric.instance_config, pg_catalog.to_jsonb(NEW))) THEN
    PERFORM fabric._raise_rule('check_violation',
      'checkpoint retention must exceed the longest approval timeout',
      'a checkpoint that expires before its approval leaves an approved action with no run to resume',
      p_constraint => 'instance_config_checkpoint_outlives_approvals');
  END IF;
  FOR v_key, v_value IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(NEW.regulated_retention) e LOOP
    IF pg_catalog.jsonb_typeof(v_value) <> 'object'
       OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(v_value) k WHERE k NOT IN ('floor', 'ceiling'))
       OR pg_catalog.pg_input_is_valid(v_value ->> 'floor', 'interval') IS NOT TRUE
       OR pg_catalog.pg_input_is_valid(v_value ->> 'ceiling', 'interval') IS NOT TRUE THEN
      PERFORM fabric._raise_rule('invalid_parameter_value',
        'regulated_retention maps a jurisdiction to {"floor": interval, "ceiling": interval}',
        'e.g. {"eu": {"floor": "1 year", "ceiling": "7 years"}, "default": {...}}');
    END IF;
    IF (v_value ->> 'ceiling')::interval < (v_value ->> 'floor')::interval THEN
      PERFORM fabric._raise_rule('check_violation',
        pg_catalog.format('the regulated ceiling of jurisdiction %s is below its floor', pg_catalog.left(v_key, 40)),
        'a ceiling is when regulated records must go; a floor is how long they must stay',
        p_constraint => 'instance_config_regulated_ceiling_above_floor');
    END IF;
  END LOOP;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _200_validate
  BEFORE INSERT OR UPDATE ON fabric.instance_config
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_instance_config__validate();

-- ---------------------------------------------------------------------------------------
-- fabric._instance_config: a record's instance configuration, else the tenant default's
-- (created with the tenant).
CREATE OR REPLACE FUNCTION fabric._instance_config(p_tenant_id text, p_instance text)
RETURNS fabric.instance_config
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v fabric.instance_config;
BEGIN
  SELECT * INTO v FROM fabric.instance_config c
  WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = coalesce(p_instance, '');
  IF NOT FOUND THEN
    SELECT * INTO v FROM fabric.instance_config c
    WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = '';
  END IF;
  IF NOT FOUND THEN
    PERFORM fabric._raise_rule('no_data_found', 'the tenant has no instance configuration',
      'fabric_api.create_tenant creates the default instance''s row');
  END IF;
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._approval_timeout: how long an approval request stays decidable (per action).
DROP FUNCTION IF EXISTS fabric._approval_timeout(text);
CREATE OR REPLACE FUNCTION fabric._approval_timeout(p_tenant_id text, p_action text DEFAULT NULL)
RETURNS interval
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT coalesce((c.approval_timeouts ->> p_action)::interval, c.approval_timeout)
  FROM fabric._instance_config(p_tenant_id, NULL) c
$$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_deployment_settings__validate: the deployment embedder must be local for every
-- air-gapped instance (the same rule, checked from the other side).
CREATE OR REPLACE FUNCTION fabric.tg_deployment_settings__validate()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NEW.embedder_url IS NOT NULL
     AND NOT fabric._local_to_every_air_gapped_instance(NEW.embedder_url) THEN
    PERFORM fabric._raise_rule('check_violation',
      'an air-gapped instance exists: the deployment embedder endpoint must be local to it',
      'use a loopback or unix-socket endpoint, or add the host to that instance''s local_hosts',
      p_constraint => 'instance_config_air_gapped_is_local');
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _200_validate
  BEFORE INSERT OR UPDATE ON fabric.deployment_settings
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_deployment_settings__validate();
