-- The schema revision a database is at (alembic's version of fabric_migrations, which only
-- the migration role reads). Workers and `memfabric serve` compare it with the revisions
-- their package ships and refuse to start against one they do not know; agent runtimes may
-- do the same. It returns the revision id and nothing else.

-- ---------------------------------------------------------------------------------------
-- fabric_api.schema_revision: the database's alembic revision (NULL before any migration).
CREATE OR REPLACE FUNCTION fabric_api.schema_revision()
RETURNS text
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.string_agg(v.version_num::text, ' ' ORDER BY v.version_num)
  FROM fabric_migrations.alembic_version v
$$;

COMMENT ON FUNCTION fabric_api.schema_revision() IS
  'The alembic revision of this database''s schema; memfabric workers and serve refuse one '
  'they do not know. Example: SELECT fabric_api.schema_revision();';
