-- Business-instance configuration (docs/concepts.md): one row per (tenant, instance),
-- set only by the instance's administrator; every rule on it is checked by the database.

-- ---------------------------------------------------------------------------------------
-- fabric_api.configure_instance: merge p_config into the instance's row (created on first
-- use). Keys are the columns of fabric.instance_config; unknown keys are refused. A NULL
-- instance is the tenant's default instance, as a record's NULL business_instance_id is;
-- any other instance id is an identifier, so '' is refused (22023) like any empty id.
CREATE OR REPLACE FUNCTION fabric_api.configure_instance(p_tenant_id text,
  p_business_instance_id text, p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_instance text := coalesce(p_business_instance_id, '');
  v_row fabric.instance_config;
  v_settable text[];
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_admin', 'configure business instances');
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._ident(p_business_instance_id, 'business_instance_id');  -- NULL: the default
  SELECT pg_catalog.array_agg(a.attname::text) INTO v_settable
  FROM pg_catalog.pg_attribute a
  WHERE a.attrelid = 'fabric.instance_config'::regclass AND a.attnum > 0 AND NOT a.attisdropped
    AND a.attname NOT IN ('tenant_id', 'business_instance_id', 'updated_at', 'updated_by');
  IF p_config IS NULL OR pg_catalog.jsonb_typeof(p_config) <> 'object'
     OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_config) k WHERE NOT k = ANY (v_settable)) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'the configuration must be an object of instance settings',
      'settable keys: ' || pg_catalog.array_to_string(v_settable, ', '));
  END IF;
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  PERFORM fabric._set_context('actor', fabric._actor_id());
  SELECT * INTO v_row FROM fabric.instance_config c
  WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = v_instance FOR UPDATE;
  IF NOT FOUND THEN   -- a new instance starts from the column defaults, as the default one does
    INSERT INTO fabric.instance_config (tenant_id, business_instance_id)
    VALUES (p_tenant_id, v_instance) RETURNING * INTO v_row;
  END IF;
  BEGIN
    v_row := pg_catalog.jsonb_populate_record(v_row, p_config);
  EXCEPTION WHEN data_exception THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a configuration value has the wrong type',
      'intervals are ISO 8601 or PostgreSQL text (e.g. "P30D", "30 days"); thresholds are numbers');
  END;
  v_row.updated_at := pg_catalog.now();
  v_row.updated_by := session_user;
  -- Replace the row whole: the settable columns grow with the schema, so no column list.
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: an INSERT ... SELECT ... ON CONFLICT DO NOTHING counts the row it did not
    -- insert (FOUND), so the row would stay as it was; the row is there (locked or just
    -- made above): it is replaced, by an INSERT ... VALUES
    DELETE FROM fabric.instance_config c
    WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = v_instance;
    INSERT INTO fabric.instance_config VALUES (v_row.*);
  ELSE
    INSERT INTO fabric.instance_config SELECT v_row.*
    ON CONFLICT (tenant_id, business_instance_id) DO NOTHING;
  END IF;
  IF NOT FOUND THEN
    DELETE FROM fabric.instance_config c
    WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = v_instance;
    INSERT INTO fabric.instance_config SELECT v_row.*;
  END IF;
  PERFORM fabric._emit('fabric.instance.configured', p_tenant_id, p_payload =>
    pg_catalog.jsonb_build_object('business_instance_id', v_instance,
                                  'keys', (SELECT pg_catalog.jsonb_agg(k ORDER BY k)
                                           FROM pg_catalog.jsonb_object_keys(p_config) k)));
  RETURN pg_catalog.to_jsonb(v_row) - 'updated_by';
END $$;
COMMENT ON FUNCTION fabric_api.configure_instance(text, text, jsonb) IS
  'Set a business instance''s configuration (thresholds, retention, deployment). Admin only. '
  'NULL names the tenant''s default instance. '
  'Example: SELECT fabric_api.configure_instance(''acme'', NULL, ''{"min_corroborating_episodes": 3}'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.declare_pack_defaults: a domain pack's default thresholds.
CREATE OR REPLACE FUNCTION fabric_api.declare_pack_defaults(p_domain_pack_id text, p_defaults jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_row fabric.domain_pack_defaults;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_admin', 'declare domain pack defaults');
  IF p_defaults IS NULL OR pg_catalog.jsonb_typeof(p_defaults) <> 'object'
     OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_defaults) k
                WHERE k NOT IN ('min_corroborating_episodes', 'min_confidence', 'min_successful_trajectories')) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'pack defaults are min_corroborating_episodes, min_confidence, min_successful_trajectories',
      'only the instance sets its own values (fabric_api.configure_instance)');
  END IF;
  PERFORM fabric._ident(p_domain_pack_id, 'domain_pack_id');
  BEGIN
    v_row := pg_catalog.jsonb_populate_record(NULL::fabric.domain_pack_defaults,
               p_defaults || pg_catalog.jsonb_build_object('domain_pack_id', p_domain_pack_id));
  EXCEPTION WHEN data_exception THEN   -- e.g. an integer overflow, whose message prints the value
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a pack default has the wrong type or is out of range',
      'min_corroborating_episodes and min_successful_trajectories are integers, '
      'min_confidence a number in [0, 1]');
  END;
  INSERT INTO fabric.domain_pack_defaults SELECT v_row.*
  ON CONFLICT (domain_pack_id) DO UPDATE SET
    min_corroborating_episodes = EXCLUDED.min_corroborating_episodes,
    min_confidence = EXCLUDED.min_confidence,
    min_successful_trajectories = EXCLUDED.min_successful_trajectories;
  RETURN pg_catalog.to_jsonb(v_row);
END $$;
COMMENT ON FUNCTION fabric_api.declare_pack_defaults(text, jsonb) IS
  'Declare a domain pack''s default thresholds. Admin only. Example: SELECT '
  'fabric_api.declare_pack_defaults(''com-pack'', ''{"min_corroborating_episodes": 3}'');';
