-- Bulk import: a committer enabled in a tenant forms raw episodic records from another
-- store's history (formation method import), up to 10,000 per call, in a few set-based
-- statements. Every element is checked by the rules a proposal meets (the same helpers as
-- propose) and formed by one INSERT whose triggers are the commit's; an element that breaks
-- a rule is refused with its position and reason without stopping the others. The call's
-- own errors (role, tenant, the array) write nothing. One memory.import.completed event is
-- the source event of every record formed; its id is derived from (tenant, import_id), which
-- makes the import id the idempotency key. See docs/import.md.

-- ---------------------------------------------------------------------------------------
-- fabric._import_element: one element of an import, parsed and checked by the rules that
-- need nothing but the element, through the field readers propose's parser uses
-- (fabric._envelope_text, _envelope_content, _envelope_timestamp, ...). A structural error
-- is caught and answered as (sqlstate, reason) -- the error propose would raise; a
-- governance violation as (NULL, reason) -- the reason propose would reject with. The rules
-- that read tables (agent enablement and profile, instance, duplicates) are checked by the
-- caller, set-based. fabric._import_elements reads the common, valid element without it and
-- hands every other element here.
CREATE OR REPLACE FUNCTION fabric._import_element(p_element jsonb, p_tenant_id text,
  OUT o_sqlstate text, OUT o_reason text, OUT o_visibility text, OUT o_subject_id text,
  OUT o_agent_id text, OUT o_session_id text, OUT o_instance text, OUT o_content jsonb,
  OUT o_content_hash text, OUT o_correlation_id text, OUT o_causation_id text,
  OUT o_confidence double precision, OUT o_valid_from timestamptz,
  OUT o_valid_until timestamptz, OUT o_retention text, OUT o_labels text[], OUT o_version text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_scope jsonb;
  v_prov jsonb;
  v_validity jsonb;
  v_tier text;
  v_tenant text;
  v_method text;
  v_given_from timestamptz;
BEGIN
  IF p_element IS NULL OR pg_catalog.jsonb_typeof(p_element) <> 'object' THEN
    PERFORM fabric._bad_envelope('an import element must be a JSON object',
                                 'one episodic envelope per element (docs/import.md)');
  END IF;
  IF (p_element - ARRAY['tier', 'scope', 'content', 'content_hash', 'provenance',
                        'derived_from', 'confidence', 'validity_interval', 'retention_class',
                        'compliance_labels', 'version', 'supersedes',
                        'business_instance_id']) <> '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('the element has keys outside the import envelope',
      'allowed: tier, scope, content, content_hash, provenance, derived_from, confidence, '
      'validity_interval, retention_class, compliance_labels, version, supersedes, '
      'business_instance_id');
  END IF;
  v_tier := fabric._envelope_text(p_element -> 'tier', 'tier');

  v_scope := p_element -> 'scope';
  IF v_scope IS NULL OR pg_catalog.jsonb_typeof(v_scope) <> 'object'
     OR (v_scope - ARRAY['tenant_id', 'subject_id', 'agent_id', 'session_id', 'visibility']) <> '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('scope must be an object of tenant_id, subject_id, agent_id, session_id, visibility',
      'an imported record carries its full scope');
  END IF;
  v_tenant := fabric._envelope_text(v_scope -> 'tenant_id', 'scope.tenant_id');
  o_subject_id := fabric._envelope_text(v_scope -> 'subject_id', 'scope.subject_id');
  o_session_id := fabric._envelope_text(v_scope -> 'session_id', 'scope.session_id');
  o_agent_id := fabric._envelope_text(v_scope -> 'agent_id', 'scope.agent_id');
  o_visibility := fabric._envelope_text(v_scope -> 'visibility', 'scope.visibility');
  PERFORM fabric._envelope_visibility(o_visibility);
  IF v_tenant IS DISTINCT FROM p_tenant_id AND v_tenant IS NOT NULL THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'scope.tenant_id is not the tenant of the import',
      'an import acts in exactly one tenant; omit scope.tenant_id or name that tenant');
  END IF;

  SELECT c.content, c.content_hash INTO o_content, o_content_hash
  FROM fabric._envelope_content(p_element, false) c;

  v_prov := coalesce(p_element -> 'provenance', '{}');
  IF pg_catalog.jsonb_typeof(v_prov) <> 'object'
     OR (v_prov - ARRAY['source_event_id', 'correlation_id', 'causation_id', 'formation_method']) <> '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('provenance must be an object of correlation_id, causation_id, formation_method',
      'source_event_id and formed_by are set by the import');
  END IF;
  IF v_prov ? 'source_event_id' AND pg_catalog.jsonb_typeof(v_prov -> 'source_event_id') <> 'null' THEN
    PERFORM fabric._bad_envelope('provenance.source_event_id is set by the import: it names the import event',
      'omit it; keep the original store''s ids in correlation_id or causation_id, or in content');
  END IF;
  o_correlation_id := fabric._envelope_text(v_prov -> 'correlation_id', 'provenance.correlation_id');
  o_causation_id := fabric._envelope_text(v_prov -> 'causation_id', 'provenance.causation_id');
  v_method := fabric._envelope_text(v_prov -> 'formation_method', 'provenance.formation_method');
  IF v_method IS DISTINCT FROM 'import' AND v_method IS NOT NULL THEN
    PERFORM fabric._bad_envelope('provenance.formation_method of an imported record is import',
                                 'omit it or send "import"');
  END IF;

  o_confidence := fabric._envelope_confidence(p_element);

  v_validity := p_element -> 'validity_interval';
  IF v_validity IS NOT NULL AND pg_catalog.jsonb_typeof(v_validity) <> 'null'
     AND (pg_catalog.jsonb_typeof(v_validity) <> 'object'
          OR (v_validity - ARRAY['valid_from', 'valid_until']) <> '{}'::jsonb) THEN
    PERFORM fabric._bad_envelope('validity_interval must be an object of valid_from, valid_until',
                                 'valid_until null means open-ended');
  END IF;
  v_given_from := fabric._envelope_timestamp(v_validity -> 'valid_from', 'validity_interval.valid_from');
  o_valid_from := coalesce(v_given_from, pg_catalog.now());
  o_valid_until := fabric._envelope_timestamp(v_validity -> 'valid_until', 'validity_interval.valid_until');

  o_retention := fabric._envelope_retention(p_element -> 'retention_class', false);
  o_labels := fabric._envelope_text_array(p_element -> 'compliance_labels', 'compliance_labels');
  o_version := coalesce(fabric._envelope_text(p_element -> 'version', 'version', 64), '1.0.0');
  PERFORM fabric._envelope_version_components(o_version);
  o_instance := fabric._envelope_text(p_element -> 'business_instance_id', 'business_instance_id');
  IF (p_element ? 'derived_from' AND pg_catalog.jsonb_typeof(p_element -> 'derived_from') NOT IN ('null', 'array'))
     OR (p_element ? 'supersedes' AND pg_catalog.jsonb_typeof(p_element -> 'supersedes') NOT IN ('null', 'string')) THEN
    PERFORM fabric._bad_envelope('derived_from must be an array and supersedes a memory id or null',
                                 'imported records are raw episodes: omit both');
  END IF;

  -- Governance: the reasons propose rejects with, for the import's envelope.
  o_reason := CASE
    WHEN v_tier IS DISTINCT FROM 'episodic' AND v_tier IS NOT NULL THEN
      'an import forms only episodic records; semantic and other tiers are formed by consolidation or promotion'
    WHEN pg_catalog.jsonb_typeof(p_element -> 'supersedes') = 'string' THEN
      'agents never propose with supersedes; supersession is a committer action'
    WHEN pg_catalog.jsonb_array_length(coalesce(p_element -> 'derived_from', '[]')) > 0 THEN
      'an imported record is a raw episode: derived_from must be empty'
    WHEN o_visibility = 'session' AND o_session_id IS NULL THEN
      'visibility session needs a session: scope.session_id is missing'
    WHEN o_visibility = 'subject' AND o_subject_id IS NULL THEN
      'visibility subject needs a subject: scope.subject_id is missing'
    WHEN o_visibility = 'agent' AND o_agent_id IS NULL THEN
      'visibility agent needs an agent: scope.agent_id is missing'
    WHEN o_retention = 'ephemeral' THEN
      'ephemeral retention belongs to the working tier, which never enters the fabric'
    WHEN o_confidence IS NULL OR NOT (o_confidence BETWEEN 0 AND 1) THEN
      'confidence must lie in [0, 1]'
    WHEN o_valid_until IS NOT NULL AND o_valid_until <= o_valid_from THEN
      'validity_interval.valid_until must be after valid_from'
    WHEN o_version !~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$' THEN
      'version must be SemVer (MAJOR.MINOR.PATCH)'
  END;
EXCEPTION
  WHEN data_exception OR program_limit_exceeded OR insufficient_privilege
       OR integrity_constraint_violation THEN
    o_sqlstate := SQLSTATE;
    o_reason := SQLERRM;
    o_visibility := NULL; o_subject_id := NULL; o_agent_id := NULL; o_session_id := NULL;
    o_instance := NULL; o_content := NULL; o_content_hash := NULL; o_correlation_id := NULL;
    o_causation_id := NULL; o_confidence := NULL; o_valid_from := NULL; o_valid_until := NULL;
    o_retention := NULL; o_labels := NULL; o_version := NULL;
END $$;
DROP FUNCTION IF EXISTS fabric._import_text(jsonb, text);        -- folded into _import_elements
DROP FUNCTION IF EXISTS fabric._import_timestamp(jsonb, text);   -- folded into _import_elements

-- ---------------------------------------------------------------------------------------
-- fabric._import_elements: every element of an import with its position, read in one
-- set-based query. An element of the common shape that breaks no rule of the element (an
-- object of the import envelope's keys; identifiers that are strings of printable ASCII
-- without spaces; tier absent or episodic; content a non-empty object without entities, of
-- at most 65536 bytes, 32 brackets, numbers of at most 15 digits and no content_hash;
-- provenance without source_event_id, formation method absent or import; confidence a
-- plain decimal in [0, 1]; validity timestamps in RFC 3339 with T and Z or an offset,
-- valid_until after valid_from; retention a kept class; labels plain ASCII identifiers;
-- version absent or plain MAJOR.MINOR.PATCH; no derived_from, supersedes or a visibility
-- without its id) is read by expressions of this query; every other element goes to
-- fabric._import_element, which answers its first error or rejection. The readers agree on
-- every element the fast test accepts (tests/sql/test_import_reader.py).
--
-- The fast test is built to be cheap (docs/benchmarks.md, "The element checks, cheaper"):
-- the element's objects are extracted once (lateral j) and each field once (lateral f);
-- each typed value is cast once (lateral t), behind a test that guarantees the cast cannot
-- fail, and the answer reuses it. A regular expression costs about 50 ns for every state of
-- its automaton a call visits (the automaton is built again on every call), so the test
-- uses few and small ones: the identifiers are checked together, as one string of
-- printable ASCII, with their lengths and JSON types beside it; a timestamp's shape is its
-- text with every digit made 0, which must be one of the RFC 3339 shapes this reader takes;
-- the content's numbers are short when the text of their list is. Memoize is off: its
-- cache key would be the content, hashed for every element and never hit.
CREATE OR REPLACE FUNCTION fabric._import_elements(p_records jsonb, p_tenant_id text)
RETURNS TABLE (o_position integer, o_sqlstate text, o_reason text, o_visibility text,
  o_subject_id text, o_agent_id text, o_session_id text, o_instance text, o_content jsonb,
  o_content_hash text, o_correlation_id text, o_causation_id text,
  o_confidence double precision, o_valid_from timestamptz, o_valid_until timestamptz,
  o_retention text, o_labels text[], o_version text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
SET enable_memoize = off
AS $$
  SELECT r.position, o.*
  FROM (
    SELECT (x.ord - 1)::integer AS position, x.element, f.*, t.*,
      pg_catalog.jsonb_typeof(x.element) = 'object'
      AND (x.element - ARRAY['tier', 'scope', 'content', 'provenance', 'derived_from',
                             'confidence', 'validity_interval', 'retention_class',
                             'compliance_labels', 'version', 'supersedes',
                             'business_instance_id']) = '{}'::jsonb
      AND (x.element -> 'tier' IS NULL OR x.element -> 'tier' = '"episodic"')
      AND (x.element -> 'derived_from' IS NULL OR x.element -> 'derived_from' = '[]')
      AND pg_catalog.jsonb_typeof(coalesce(x.element -> 'supersedes', 'null')) = 'null'
      -- scope: an object of its keys, visibility one of four with its id
      AND pg_catalog.jsonb_typeof(f.scope) = 'object'
      AND (f.scope - ARRAY['tenant_id', 'subject_id', 'agent_id', 'session_id', 'visibility'])
          = '{}'::jsonb
      AND CASE f.visibility
            WHEN 'tenant' THEN true
            WHEN 'subject' THEN f.subject_id IS NOT NULL
            WHEN 'agent' THEN f.agent_id IS NOT NULL
            WHEN 'session' THEN f.session_id IS NOT NULL
            ELSE false END
      AND coalesce(f.tenant_id, p_tenant_id) = p_tenant_id
      -- provenance: absent, or an object without source_event_id, the formation method
      -- absent or import
      AND (f.prov IS NULL
           OR (pg_catalog.jsonb_typeof(f.prov) = 'object'
               AND (f.prov - ARRAY['correlation_id', 'causation_id', 'formation_method']) = '{}'::jsonb
               AND coalesce(f.prov ->> 'formation_method', 'import') = 'import'))
      -- identifiers: each absent, null or a string (->> reads a number as text too) of
      -- 1-200 characters, all of them printable ASCII without spaces: one regular
      -- expression over their concatenation (an empty one is caught by the lengths)
      AND (f.tenant_id IS NULL OR pg_catalog.jsonb_typeof(f.scope -> 'tenant_id') = 'string')
      AND (f.subject_id IS NULL OR pg_catalog.jsonb_typeof(f.scope -> 'subject_id') = 'string')
      AND (f.agent_id IS NULL OR pg_catalog.jsonb_typeof(f.scope -> 'agent_id') = 'string')
      AND (f.session_id IS NULL OR pg_catalog.jsonb_typeof(f.scope -> 'session_id') = 'string')
      AND (f.correlation_id IS NULL OR pg_catalog.jsonb_typeof(f.prov -> 'correlation_id') = 'string')
      AND (f.causation_id IS NULL OR pg_catalog.jsonb_typeof(f.prov -> 'causation_id') = 'string')
      AND (f.instance IS NULL OR pg_catalog.jsonb_typeof(x.element -> 'business_instance_id') = 'string')
      AND pg_catalog.concat(f.visibility, f.tenant_id, f.subject_id, f.agent_id, f.session_id,
            f.correlation_id, f.causation_id, f.instance) ~ '^[!-~]+$'
      AND LEAST(pg_catalog.octet_length(f.tenant_id), pg_catalog.octet_length(f.subject_id),
            pg_catalog.octet_length(f.agent_id), pg_catalog.octet_length(f.session_id),
            pg_catalog.octet_length(f.correlation_id), pg_catalog.octet_length(f.causation_id),
            pg_catalog.octet_length(f.instance), 1) >= 1
      AND GREATEST(pg_catalog.octet_length(f.tenant_id), pg_catalog.octet_length(f.subject_id),
            pg_catalog.octet_length(f.agent_id), pg_catalog.octet_length(f.session_id),
            pg_catalog.octet_length(f.correlation_id), pg_catalog.octet_length(f.causation_id),
            pg_catalog.octet_length(f.instance), 0) <= 200
      -- content: a non-empty object without declared entities (their rules are the slow
      -- reader's), small and shallow (32 brackets, '{' or '[', allow no deeper nesting), its
      -- numbers of at most 15 digits (a list of at most 17 characters has no longer one)
      AND pg_catalog.jsonb_typeof(f.content) = 'object'
      AND f.content <> '{}'::jsonb
      AND NOT f.content ? 'entities'
      AND pg_catalog.octet_length(f.content_text) <= 65536
      AND pg_catalog.octet_length(f.content_text) - pg_catalog.octet_length(
            pg_catalog.replace(pg_catalog.replace(f.content_text, '{', ''), '[', '')) <= 32
      AND (t.numbers = '[]' OR pg_catalog.octet_length(t.numbers) <= 17
           OR (t.numbers ~ '^\[(-?[0-9.]{1,16}, )*-?[0-9.]{1,16}\]$'
               AND t.numbers !~ '[0-9]{16}'))
      -- confidence: a plain decimal in [0, 1]
      AND t.confidence <= 1
      -- validity: RFC 3339 instants (T, Z or an offset) in 1900-9999, valid_until after
      -- valid_from
      AND (pg_catalog.jsonb_typeof(coalesce(f.validity, 'null')) = 'null'
           OR (pg_catalog.jsonb_typeof(f.validity) = 'object'
               AND (f.validity - ARRAY['valid_from', 'valid_until']) = '{}'::jsonb
               AND (f.valid_from IS NULL
                    OR (t.valid_from_at >= '1900-01-01 00:00:00+00'
                        AND t.valid_from_at < '10000-01-01 00:00:00+00'))
               AND (f.valid_until IS NULL
                    OR (t.valid_until_at >= '1900-01-01 00:00:00+00'
                        AND t.valid_until_at < '10000-01-01 00:00:00+00'
                        AND t.valid_until_at > coalesce(t.valid_from_at, pg_catalog.now())))))
      AND coalesce(f.retention, 'durable') IN ('operational', 'durable', 'audit', 'regulated')
      -- labels: plain ASCII identifiers (nothing to escape), at most 200 bytes in all (so
      -- fewer than 64, each shorter than 200)
      AND (f.labels IS NULL OR f.labels IN ('null', '[]')
           OR (pg_catalog.octet_length(f.labels) <= 200
               AND f.labels ~ '^\["[A-Za-z0-9._:/@+=-]+"(, "[A-Za-z0-9._:/@+=-]+")*\]$'))
      AND (f.version IS NULL
           OR f.version ~ '^(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})$')
      AS plain
    FROM pg_catalog.jsonb_array_elements(p_records) WITH ORDINALITY AS x(element, ord)
    -- j: the element's objects; f: each field once, as text where the test reads text
    CROSS JOIN LATERAL (
      SELECT x.element -> 'scope', x.element -> 'provenance', x.element -> 'content',
             x.element -> 'validity_interval'
      OFFSET 0
    ) AS j(scope, prov, content, validity)
    CROSS JOIN LATERAL (
      SELECT j.scope, j.scope ->> 'visibility', j.scope ->> 'tenant_id',
             j.scope ->> 'subject_id', j.scope ->> 'agent_id', j.scope ->> 'session_id',
             j.prov, j.prov ->> 'correlation_id', j.prov ->> 'causation_id',
             x.element ->> 'business_instance_id', j.content, j.content::text,
             (x.element -> 'confidence')::text, j.validity, j.validity ->> 'valid_from',
             j.validity ->> 'valid_until', x.element ->> 'retention_class',
             (x.element -> 'compliance_labels')::text, x.element ->> 'version'
      OFFSET 0
    ) AS f(scope, visibility, tenant_id, subject_id, agent_id, session_id, prov,
           correlation_id, causation_id, instance, content, content_text, confidence_text,
           validity, valid_from, valid_until, retention, labels, version)
    -- t: the typed values, each cast once behind the test that guarantees the cast: a
    -- confidence of at most 16 characters, 0 or 1 and a fraction (the jsonb text of a
    -- number: a string is quoted); a timestamp whose digits made 0 give one of the shapes
    -- below, hour and second in range, and that PostgreSQL reads (the date exists)
    CROSS JOIN LATERAL (
      SELECT CASE WHEN pg_catalog.jsonb_typeof(f.content) = 'object'
                  THEN pg_catalog.jsonb_path_query_array(f.content,
                         'strict $.** ? (@.type() == "number")')::text END,
        CASE WHEN pg_catalog.octet_length(f.confidence_text) <= 16
              AND f.confidence_text ~ '^[01](\.[0-9]+)?$'
             THEN f.confidence_text::float8 END,
        CASE WHEN pg_catalog.translate(f.valid_from, '123456789', '000000000') = ANY (s.shapes)
              AND pg_catalog.substr(f.valid_from, 12, 2) COLLATE "C" <= '23'
              AND pg_catalog.substr(f.valid_from, 18, 2) COLLATE "C" <= '59'
              AND pg_catalog.pg_input_is_valid(f.valid_from, 'timestamptz')
             THEN f.valid_from::timestamptz END,
        CASE WHEN pg_catalog.translate(f.valid_until, '123456789', '000000000') = ANY (s.shapes)
              AND pg_catalog.substr(f.valid_until, 12, 2) COLLATE "C" <= '23'
              AND pg_catalog.substr(f.valid_until, 18, 2) COLLATE "C" <= '59'
              AND pg_catalog.pg_input_is_valid(f.valid_until, 'timestamptz')
             THEN f.valid_until::timestamptz END
      -- the shapes: no fraction or one of 1-9 digits, then Z or an offset
      FROM (SELECT ('{'
                    '0000-00-00T00:00:00Z,0000-00-00T00:00:00+00:00,'
                    '0000-00-00T00:00:00-00:00,0000-00-00T00:00:00.0Z,'
                    '0000-00-00T00:00:00.0+00:00,0000-00-00T00:00:00.0-00:00,'
                    '0000-00-00T00:00:00.00Z,0000-00-00T00:00:00.00+00:00,'
                    '0000-00-00T00:00:00.00-00:00,0000-00-00T00:00:00.000Z,'
                    '0000-00-00T00:00:00.000+00:00,0000-00-00T00:00:00.000-00:00,'
                    '0000-00-00T00:00:00.0000Z,0000-00-00T00:00:00.0000+00:00,'
                    '0000-00-00T00:00:00.0000-00:00,0000-00-00T00:00:00.00000Z,'
                    '0000-00-00T00:00:00.00000+00:00,0000-00-00T00:00:00.00000-00:00,'
                    '0000-00-00T00:00:00.000000Z,0000-00-00T00:00:00.000000+00:00,'
                    '0000-00-00T00:00:00.000000-00:00,0000-00-00T00:00:00.0000000Z,'
                    '0000-00-00T00:00:00.0000000+00:00,0000-00-00T00:00:00.0000000-00:00,'
                    '0000-00-00T00:00:00.00000000Z,0000-00-00T00:00:00.00000000+00:00,'
                    '0000-00-00T00:00:00.00000000-00:00,0000-00-00T00:00:00.000000000Z,'
                    '0000-00-00T00:00:00.000000000+00:00,0000-00-00T00:00:00.000000000-00:00'
                    '}')::text[]) s(shapes)
      OFFSET 0
    ) AS t(numbers, confidence, valid_from_at, valid_until_at)
    OFFSET 0   -- computed once, in this order: the test guards the casts that read the values
  ) r
  CROSS JOIN LATERAL (
    SELECT NULL::text, NULL::text, r.visibility, r.subject_id, r.agent_id, r.session_id,
      r.instance, r.content, NULL::text, r.correlation_id, r.causation_id, r.confidence,
      coalesce(r.valid_from_at, pg_catalog.now()), r.valid_until_at,
      coalesce(r.retention, 'durable'),
      CASE WHEN r.labels LIKE '[%' THEN pg_catalog.translate(r.labels, '[]', '{}')::text[]
           ELSE '{}'::text[] END,
      coalesce(r.version, '1.0.0')
    WHERE r.plain
    UNION ALL
    SELECT v.* FROM fabric._import_element(r.element, p_tenant_id) v
    WHERE r.plain IS NOT TRUE
  ) o
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._import_event_id: the import event's id, derived from (tenant, import id).
CREATE OR REPLACE FUNCTION fabric._import_event_id(p_tenant_id text, p_import_id text)
RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.md5(pg_catalog.convert_to(
    'memfabric-import' || pg_catalog.chr(31) || p_tenant_id || pg_catalog.chr(31) || p_import_id,
    'UTF8'))::uuid
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.import_records: form the valid elements of p_records as raw episodic records.
CREATE OR REPLACE FUNCTION fabric_api.import_records(p_tenant_id text, p_import_id text,
                                                     p_records jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_count integer;
  v_event_id uuid;
  v_request_hash text;
  v_first jsonb;
  v_formed bigint;
  v_refused bigint;
  v_refusals jsonb;
  v_result jsonb;
  v_bulk text;
BEGIN
  IF p_tenant_id IS NULL OR p_import_id IS NULL THEN
    PERFORM fabric._bad_envelope('tenant_id and import_id are required',
      'name the tenant and an id for this import (the CLI derives one from the file)');
  END IF;
  PERFORM fabric._ident(p_tenant_id, 'tenant_id');
  PERFORM fabric._ident(p_import_id, 'import_id');
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._committer_enabled_in(p_tenant_id, v_committer);
  IF p_records IS NULL OR pg_catalog.jsonb_typeof(p_records) <> 'array'
     OR pg_catalog.jsonb_array_length(p_records) = 0 THEN
    PERFORM fabric._bad_envelope('records must be a non-empty JSON array of envelopes',
                                 'one episodic envelope per element (docs/import.md)');
  END IF;
  v_count := pg_catalog.jsonb_array_length(p_records);
  IF v_count > 10000 THEN
    PERFORM fabric._raise_rule('program_limit_exceeded',
      'an import call takes at most 10000 records',
      'split the import into batches (memfabric import --batch), one import id each');
  END IF;

  -- Idempotency: the import id names one import event per tenant. The same records again
  -- answer the first result and write nothing; other records under the same id are refused.
  v_event_id := fabric._import_event_id(p_tenant_id, p_import_id);
  v_request_hash := 'sha256:' || pg_catalog.encode(pg_catalog.sha256(
                      pg_catalog.convert_to(p_records::text, 'UTF8')), 'hex');
  PERFORM pg_catalog.pg_advisory_xact_lock(
    pg_catalog.hashtextextended('memfabric-import:' || v_event_id::text, 0));
  SELECT e.payload INTO v_first FROM fabric.events e
  WHERE e.event_id = v_event_id AND e.tenant_id = p_tenant_id
    AND e.event_type = 'memory.import.completed';
  IF FOUND THEN
    IF v_first ->> 'request_hash' IS DISTINCT FROM v_request_hash THEN
      PERFORM fabric._raise_rule('unique_violation',
        'import id reused: this tenant already has an import with this id and other records',
        'resend the same records to get the first result, or import under a new import id');
    END IF;
    RETURN pg_catalog.jsonb_build_object('import_id', p_import_id, 'event_id', v_event_id,
      'records', v_first -> 'records', 'formed', v_first -> 'formed',
      'refused', v_first -> 'refused', 'refusals', v_first -> 'refusals', 'replayed', true);
  END IF;

  PERFORM fabric._set_context('actor', v_committer);
  -- A bulk statement (fabric.tg_bulk_rows__gate, sql/050_records.sql): the hash and the
  -- search text derived here, the row rules met as a set.
  -- (not on Citus: the shards' row triggers run there, docs/citus.md)
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local' THEN
    v_bulk := pg_catalog.set_config('fabric.bulk_rows', 'on', true);
  END IF;
  WITH elements AS (
    SELECT e.o_position AS position, e.o_sqlstate, e.o_reason, e.o_visibility, e.o_subject_id,
      e.o_agent_id, e.o_session_id, e.o_instance, e.o_content, e.o_content_hash,
      e.o_correlation_id, e.o_causation_id, e.o_confidence, e.o_valid_from, e.o_valid_until,
      e.o_retention, e.o_labels, e.o_version
    FROM fabric._import_elements(p_records, p_tenant_id) e
  ),
  -- The scope agents' standing, once per (agent, visibility) rather than per element.
  standing AS (
    SELECT ta.agent_id, v.visibility,
           fabric._profile_allows(a.memory_profile, 'propose_scope', 'tiers', 'episodic') AS tier_ok,
           fabric._profile_allows(a.memory_profile, 'propose_scope', 'visibility', v.visibility)
             AS visibility_ok
    FROM fabric.tenant_agents ta
    JOIN fabric.agents a ON a.agent_id = ta.agent_id
    CROSS JOIN pg_catalog.unnest(ARRAY['session', 'agent', 'subject', 'tenant']) AS v(visibility)
    WHERE ta.tenant_id = p_tenant_id
      AND ta.agent_id IN (SELECT e.o_agent_id FROM elements e WHERE e.o_agent_id IS NOT NULL)
  ),
  judged AS (
    SELECT e.*,
      CASE
        WHEN e.o_reason IS NOT NULL THEN pg_catalog.jsonb_build_array(e.o_sqlstate, e.o_reason)
        WHEN e.o_agent_id IS NOT NULL AND s.agent_id IS NULL THEN pg_catalog.jsonb_build_array(
          '42501', 'scope.agent_id is not an agent enabled in the tenant')
        WHEN e.o_instance IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM fabric.instance_config c
               WHERE c.tenant_id = p_tenant_id AND c.business_instance_id = e.o_instance) THEN
          pg_catalog.jsonb_build_array('22023',
            'business_instance_id names no configured instance of the tenant')
        WHEN e.o_agent_id IS NOT NULL AND NOT s.tier_ok THEN pg_catalog.jsonb_build_array(NULL,
          'tier episodic is outside the agent''s memory_profile.propose_scope.tiers')
        WHEN e.o_agent_id IS NOT NULL AND NOT s.visibility_ok THEN pg_catalog.jsonb_build_array(NULL,
          pg_catalog.format('visibility %s is outside the agent''s memory_profile.propose_scope.visibility',
                            e.o_visibility))
        WHEN e.first_position <> e.position THEN pg_catalog.jsonb_build_array('23505',
          pg_catalog.format('duplicate: element %s of this import has the same content for the same agent',
                            e.first_position))
      END AS verdict
    FROM (SELECT e0.*, pg_catalog.min(e0.position) OVER (
                   PARTITION BY e0.o_agent_id, e0.o_content) AS first_position
          FROM elements e0) e
    LEFT JOIN standing s ON s.agent_id = e.o_agent_id AND s.visibility = e.o_visibility
  ),
  checked AS (
    SELECT j.*, j.verdict ->> 0 AS sqlstate, j.verdict ->> 1 AS refusal FROM judged j
  ),
  formed AS (
    INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, agent_id,
      session_id, business_instance_id, content, content_hash, source_event_id, correlation_id,
      causation_id, formed_by, formation_method, confidence, valid_from, valid_until,
      retention_class, compliance_labels, version, search_tsv, search_length)
    SELECT p_tenant_id, 'episodic', c.o_visibility, c.o_subject_id, c.o_agent_id,
      c.o_session_id, c.o_instance, c.o_content,
      fabric._formed_content_hash(c.o_content, c.o_content_hash), v_event_id::text,
      c.o_correlation_id, c.o_causation_id, v_committer, 'import', c.o_confidence,
      c.o_valid_from, c.o_valid_until, c.o_retention, c.o_labels, c.o_version,
      x.tsv, fabric._search_length(x.tsv)
    FROM checked c
    CROSS JOIN LATERAL (SELECT fabric._search_text(c.o_content) AS tsv OFFSET 0) x
    WHERE c.refusal IS NULL
    ORDER BY c.position
    RETURNING 1
  )
  SELECT (SELECT pg_catalog.count(*) FROM formed),
         (SELECT pg_catalog.count(*) FROM checked c WHERE c.refusal IS NOT NULL),
         (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                   'position', r.position, 'sqlstate', r.sqlstate, 'reason', r.refusal)
                   ORDER BY r.position), '[]')
          FROM (SELECT c.position, c.sqlstate, c.refusal FROM checked c
                WHERE c.refusal IS NOT NULL ORDER BY c.position LIMIT 100) r)
  INTO v_formed, v_refused, v_refusals;
  v_bulk := pg_catalog.set_config('fabric.bulk_rows', '', true);
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    PERFORM fabric._flush_shard_events(p_tenant_id);  -- Citus: the shard triggers' events
  END IF;

  v_result := pg_catalog.jsonb_build_object('import_id', p_import_id, 'records', v_count,
    'formed', v_formed, 'refused', v_refused, 'refusals', v_refusals);
  -- The import event: written like fabric._emit, with the derived id; no content, no
  -- subject or session ids (refusal reasons never carry client values).
  INSERT INTO fabric.events (event_id, tenant_id, event_type, actor_agent_id, payload)
  VALUES (v_event_id, p_tenant_id, 'memory.import.completed', v_committer,
          v_result || pg_catalog.jsonb_build_object('request_hash', v_request_hash));
  PERFORM fabric._reset_context();
  RETURN v_result || pg_catalog.jsonb_build_object('event_id', v_event_id, 'replayed', false);
END $$;
COMMENT ON FUNCTION fabric_api.import_records(text, text, jsonb) IS
  'Import up to 10000 episodic envelopes (full scope each) into a tenant as raw records of '
  'formation method import, set-based; answers {"import_id","event_id","records","formed",'
  '"refused","refusals":[{"position","sqlstate","reason"}] (first 100),"replayed"}. '
  'Idempotent on (tenant, import_id). Committer only, in a tenant where it is enabled. '
  'Example: SELECT fabric_api.import_records(''acme'', ''crm-2026-07'', '
  '''[{"scope":{"subject_id":"user-8842","visibility":"subject"},'
  '"content":{"text":"asked for invoices in EUR"},"confidence":0.9}]'');';
