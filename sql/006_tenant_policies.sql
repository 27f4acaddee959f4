-- The standard tenant policies: one definition for every tenant table of `rls/`. A tenant
-- table shows and takes only the rows of the transaction's tenant (the setting
-- fabric.tenant_id); with no tenant set it shows nothing, even to its owner (FORCE). Each
-- file of `rls/` names its table and the commands its rows allow; the policy text is here.

-- ---------------------------------------------------------------------------------------
-- fabric._tenant_policies: enable and force row-level security on p_table and (re)create
-- its standard policies <command>_same_tenant, one per command of p_commands (select,
-- insert, update, delete); a standard policy of a command left out is dropped, so each
-- `rls/` file states the whole set. Run by the migration replay only (no grant): the table
-- is a regclass and every name goes through format's %I/%s, never concatenated.
CREATE OR REPLACE PROCEDURE fabric._tenant_policies(p_table regclass, p_commands text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_same_tenant constant text :=
    'tenant_id = pg_catalog.current_setting(''fabric.tenant_id'', true)';
  v_command text;
  v_policy text;
BEGIN
  IF p_commands IS NULL OR pg_catalog.array_position(p_commands, NULL) IS NOT NULL
     OR NOT p_commands <@ ARRAY['select', 'insert', 'update', 'delete'] THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'tenant policy commands must be select, insert, update or delete',
      'e.g. CALL fabric._tenant_policies(''fabric.runs'', ARRAY[''select'', ''insert''])');
  END IF;
  EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', p_table);
  EXECUTE pg_catalog.format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', p_table);
  FOREACH v_policy IN ARRAY ARRAY['select_same_tenant', 'insert_same_tenant',
                                  'update_same_tenant', 'delete_same_tenant'] LOOP
    v_command := pg_catalog.split_part(v_policy, '_', 1);
    EXECUTE pg_catalog.format('DROP POLICY IF EXISTS %I ON %s', v_policy, p_table);
    CONTINUE WHEN NOT v_command = ANY (p_commands);
    EXECUTE pg_catalog.format('CREATE POLICY %I ON %s FOR %s %s', v_policy, p_table,
      pg_catalog.upper(v_command),
      CASE v_command
        WHEN 'insert' THEN pg_catalog.format('WITH CHECK (%s)', v_same_tenant)
        WHEN 'update' THEN pg_catalog.format('USING (%s) WITH CHECK (%s)', v_same_tenant,
                                             v_same_tenant)
        ELSE pg_catalog.format('USING (%s)', v_same_tenant)
      END);
  END LOOP;
END $$;
