-- The DDL guard: the schema of the fabric changes only through migrations. An event
-- trigger (installed by a superuser migrate, see memfabric.db) calls this function after
-- every DDL command and at every drop; a command touching the fabric schemas is refused
-- unless the session is the migration role's (or a superuser's, whom nothing can stop:
-- the sealed event chain detects what they change).

-- ---------------------------------------------------------------------------------------
-- fabric.tg_ddl__migration_role_only: refuse, outside the migration role's session, every
-- command that changes an object of fabric, fabric_api, fabric_audit or langgraph (the
-- checkpoints, whose tables are the pinned package's, made by a migration):
-- * DDL on an object of those schemas, or on the schemas themselves;
-- * a policy, rule or trigger on one of their tables (CREATE, ALTER, COMMENT, DROP): such an
--   object has no schema of its own, so its table's schema (the first part of its address)
--   is what counts; a table made a child or partition of one of their tables; a publication
--   of one of their tables;
-- * any object owned by a role that owns the fabric (fabric_owner, fabric_lookup,
--   fabric_retriever) outside a session's temporary schema: ALTER ... SET SCHEMA out of the
--   fabric leaves an object that is still the owner's;
-- * any command at all (GRANT, REVOKE and ALTER DEFAULT PRIVILEGES included) by a login that
--   is a member of one of those owning roles: PostgreSQL does not tell an event trigger
--   which objects a GRANT named, and an object of the login's own (a SECURITY DEFINER
--   function or a view over a fabric table, which PUBLIC may execute) reaches the fabric
--   with the owner's privileges wherever it lives. Only the migration role is meant to hold
--   that membership, so the rule is on who runs the command;
-- * ALTER DEFAULT PRIVILEGES that leaves a default naming one of the fabric's schemas.
-- Raised here, not through fabric._raise_rule: an event trigger runs as whoever ran the DDL
-- (fabric_maintainer's REINDEX fires it), who may not execute that function.
CREATE OR REPLACE FUNCTION fabric.tg_ddl__migration_role_only()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_schemas CONSTANT text[] := ARRAY['fabric', 'fabric_api', 'fabric_audit', 'langgraph'];
  v_owners CONSTANT text[] := ARRAY['fabric_owner', 'fabric_lookup', 'fabric_retriever'];
  -- object types without a schema of their own whose address starts with their table's
  -- (or, for a schema, is the schema's name)
  v_addressed CONSTANT text[] := ARRAY['schema', 'policy', 'rule', 'trigger', 'default value',
                                       'publication relation', 'publication namespace'];
  v_refused boolean := false;
BEGIN
  IF session_user = 'fabric_migrator'
     OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = session_user) THEN
    RETURN;
  END IF;
  v_refused := EXISTS (
    SELECT 1 FROM pg_catalog.unnest(v_owners) o(role)
    JOIN pg_catalog.pg_roles r ON r.rolname = o.role
    WHERE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER'));
  IF v_refused THEN
    NULL;  -- a login holding the fabric's ownership: whatever the command
  ELSIF TG_EVENT = 'ddl_command_end' AND TG_TAG IN ('GRANT', 'REVOKE', 'ALTER DEFAULT PRIVILEGES') THEN
    v_refused := TG_TAG = 'ALTER DEFAULT PRIVILEGES' AND EXISTS (
        SELECT 1 FROM pg_catalog.pg_default_acl d
        JOIN pg_catalog.pg_namespace n ON n.oid = d.defaclnamespace
        WHERE n.nspname = ANY (v_schemas));
  ELSIF TG_EVENT = 'ddl_command_end' AND TG_TAG = 'CREATE TABLE'
        AND current_user = 'fabric_owner'
        AND pg_catalog.current_setting('fabric.partition_maintenance', true) = 'measurements' THEN
    -- The temporal tier's monthly partitions, made by fabric.ensure_measurement_partitions
    -- inside an API function (the owner's privileges, a transaction it marked): every object
    -- the command made is a partition measurements_YYYY_MM of fabric.measurements over
    -- exactly that UTC month, or the partition of its index. Nothing else passes, marked or
    -- not (a month's name over other bounds would keep the month's own partition out).
    v_refused := EXISTS (
      SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() c
      WHERE c.classid IS DISTINCT FROM 'pg_catalog.pg_class'::pg_catalog.regclass
         OR NOT EXISTS (
              SELECT 1 FROM pg_catalog.pg_inherits i
              JOIN pg_catalog.pg_class x ON x.oid = i.inhrelid
              WHERE i.inhrelid = c.objid
                AND ((i.inhparent = pg_catalog.to_regclass('fabric.measurements')
                      AND x.relname ~ '^measurements_[0-9]{4}_(0[1-9]|1[0-2])$'
                      AND pg_catalog.pg_get_expr(x.relpartbound, x.oid) = pg_catalog.format(
                            'FOR VALUES FROM (%L) TO (%L)',
                            pg_catalog.to_date(pg_catalog.substr(x.relname, 14), 'YYYY_MM')::timestamp
                              AT TIME ZONE 'UTC',
                            (pg_catalog.to_date(pg_catalog.substr(x.relname, 14), 'YYYY_MM')
                              + interval '1 month')::timestamp AT TIME ZONE 'UTC'))
                  OR i.inhparent = pg_catalog.to_regclass('fabric.measurements_by_series'))));
  ELSIF TG_EVENT = 'ddl_command_end' THEN
    v_refused := EXISTS (
      SELECT 1
      FROM pg_catalog.pg_event_trigger_ddl_commands() c
      LEFT JOIN LATERAL pg_catalog.pg_identify_object_as_address(c.classid, c.objid, c.objsubid) a
        ON c.classid IS NOT NULL
      WHERE c.schema_name = ANY (v_schemas)
         OR (c.object_type = ANY (v_addressed) AND a.object_names[1] = ANY (v_schemas))
         -- a child or partition of a fabric table (CREATE TABLE ... PARTITION OF, INHERIT)
         OR (c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND EXISTS (
               SELECT 1 FROM pg_catalog.pg_inherits i
               JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
               JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace
               WHERE i.inhrelid = c.objid AND n.nspname = ANY (v_schemas)))
         -- a publication of a fabric table or schema
         OR (c.classid = 'pg_catalog.pg_publication'::pg_catalog.regclass AND (
               EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel pr
                       JOIN pg_catalog.pg_class p ON p.oid = pr.prrelid
                       JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace
                       WHERE pr.prpubid = c.objid AND n.nspname = ANY (v_schemas))
               OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace pn
                          JOIN pg_catalog.pg_namespace n ON n.oid = pn.pnnspid
                          WHERE pn.pnpubid = c.objid AND n.nspname = ANY (v_schemas))))
         -- an object the fabric's owners own, wherever it now is (but a temporary table of
         -- a session, which an API function may make for its own use)
         OR (coalesce(c.schema_name, '') <> 'pg_temp' AND coalesce(c.schema_name, '') NOT LIKE 'pg\_temp\_%'
             AND (SELECT o.rolname FROM pg_catalog.pg_roles o
                  WHERE o.oid = CASE c.classid
                    WHEN 'pg_catalog.pg_class'::pg_catalog.regclass
                      THEN (SELECT x.relowner FROM pg_catalog.pg_class x WHERE x.oid = c.objid)
                    WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass
                      THEN (SELECT x.proowner FROM pg_catalog.pg_proc x WHERE x.oid = c.objid)
                    WHEN 'pg_catalog.pg_type'::pg_catalog.regclass
                      THEN (SELECT x.typowner FROM pg_catalog.pg_type x WHERE x.oid = c.objid)
                    END) = ANY (v_owners)));
  ELSIF TG_EVENT = 'sql_drop' THEN
    v_refused := EXISTS (
      SELECT 1 FROM pg_catalog.pg_event_trigger_dropped_objects() d
      WHERE d.schema_name = ANY (v_schemas)
         OR (d.object_type = ANY (v_addressed) AND d.address_names[1] = ANY (v_schemas)));
  END IF;
  IF v_refused THEN
    RAISE EXCEPTION USING
      ERRCODE = 'insufficient_privilege',
      MESSAGE = 'schema changes to the fabric are made by the migration role only',
      HINT = 'change the schema with a migration: memfabric db migrate (as fabric_migrator)';
  END IF;
END $$;
