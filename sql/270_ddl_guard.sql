-- The DDL guard: the schema of the fabric changes only through migrations. An event
-- trigger (installed by a superuser migrate, see memfabric.db) calls this function after
-- every DDL command and at every drop; a command touching the fabric schemas is refused
-- unless the session is the migration role's (or a superuser's, whom nothing can stop:
-- the sealed event chain detects what they change).

-- ---------------------------------------------------------------------------------------
-- fabric.tg_ddl__migration_role_only: refuse DDL on fabric, fabric_api, fabric_audit and
-- langgraph (the checkpoints, whose tables are the pinned package's, made by a migration).
CREATE OR REPLACE FUNCTION fabric.tg_ddl__migration_role_only()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF session_user = 'fabric_migrator'
     OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = session_user) THEN
    RETURN;
  END IF;
  IF (TG_EVENT = 'ddl_command_end' AND EXISTS (
        SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() c
        WHERE c.schema_name IN ('fabric', 'fabric_api', 'fabric_audit', 'langgraph')
           OR (c.object_type = 'schema' AND c.object_identity IN ('fabric', 'fabric_api', 'fabric_audit', 'langgraph'))))
     OR (TG_EVENT = 'sql_drop' AND EXISTS (
        SELECT 1 FROM pg_catalog.pg_event_trigger_dropped_objects() d
        WHERE d.schema_name IN ('fabric', 'fabric_api', 'fabric_audit', 'langgraph')
           OR (d.object_type = 'schema' AND d.object_name IN ('fabric', 'fabric_api', 'fabric_audit', 'langgraph'))))
  THEN
    -- Raised here, not through fabric._raise_rule: an event trigger runs as whoever ran the
    -- DDL (fabric_maintainer's REINDEX fires it), who may not execute that function.
    RAISE EXCEPTION USING
      ERRCODE = 'insufficient_privilege',
      MESSAGE = 'schema changes to the fabric are made by the migration role only',
      HINT = 'change the schema with a migration: memfabric db migrate (as fabric_migrator)';
  END IF;
END $$;
