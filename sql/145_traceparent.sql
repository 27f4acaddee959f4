-- W3C trace context on recall requests: a recall may name the caller's span so that its
-- trace span (made later from the outbox) joins the caller's trace.

-- ---------------------------------------------------------------------------------------
-- fabric._traceparent_problem: NULL if p is absent or a valid W3C traceparent (version 00,
-- lowercase hex, trace and parent ids not all zeros), else why.
CREATE OR REPLACE FUNCTION fabric._traceparent_problem(p jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE
    WHEN p IS NULL OR pg_catalog.jsonb_typeof(p) = 'null' THEN NULL
    WHEN pg_catalog.jsonb_typeof(p) <> 'string'
      OR (p #>> '{}') !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
      OR pg_catalog.substr(p #>> '{}', 4, 32) = '00000000000000000000000000000000'
      OR pg_catalog.substr(p #>> '{}', 37, 16) = '0000000000000000' THEN
      'traceparent must be a W3C trace context header: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>'
  END
$$;
