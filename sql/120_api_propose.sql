-- Proposals: any registered agent proposes inside its open run; os-agt-012's scope check
-- runs here. Structural and authorization failures are errors that write nothing;
-- governance violations inside an authorized tenant become rejected proposals.

-- ---------------------------------------------------------------------------------------
-- fabric._bad_envelope: raise the one structural error of propose (22023), never with values.
CREATE OR REPLACE FUNCTION fabric._bad_envelope(p_message text, p_hint text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._raise_rule('invalid_parameter_value', p_message, p_hint);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._envelope_text: an optional identifier field, refused if present and not a string
-- or not an identifier (fabric._ident).
CREATE OR REPLACE FUNCTION fabric._envelope_text(p_value jsonb, p_field text,
                                                 p_max integer DEFAULT 200)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_value IS NULL OR pg_catalog.jsonb_typeof(p_value) = 'null' THEN
    RETURN NULL;
  END IF;
  IF pg_catalog.jsonb_typeof(p_value) <> 'string' THEN
    PERFORM fabric._bad_envelope(pg_catalog.format('%s must be a string', p_field),
                                 'see the envelope in docs/concepts.md');
  END IF;
  RETURN fabric._ident(p_value #>> '{}', p_field, p_max);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._schema_ident: the JSON Schema of an identifier (fabric._ident) up to p_max
-- characters: the same refused code points; NFC and assignment are left to the database.
CREATE OR REPLACE FUNCTION fabric._schema_ident(p_max integer DEFAULT 200)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.jsonb_build_object('type', 'string', 'pattern',
    U&'^[^\0001-\0020\007F-\00A0\00AD\0600-\0605\061C\06DD\070F\0890-\0891\08E2\1680\180E\2000-\200F\2028-\202F\205F-\206F\3000\E000-\F8FF\FEFF\FFF9-\FFFB\+0110BD\+0110CD\+013430-\+01343F\+01BCA0-\+01BCA3\+01D173-\+01D17A\+0E0001\+0E0020-\+0E007F\+0F0000-\+10FFFF]{1,'
    || p_max || '}$')
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._schema_timestamp: the JSON Schema of fabric._envelope_timestamp (RFC 3339 with an
-- offset, hours 00-23, seconds 00-59, years 1900-9999); whether the date exists is the
-- database's.
CREATE OR REPLACE FUNCTION fabric._schema_timestamp()
RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.jsonb_build_object('type', 'string', 'format', 'date-time', 'pattern',
    '^(19|[2-9][0-9])[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-](0[0-9]|1[0-5]):[0-5][0-9])$',
    'description', 'RFC 3339 with an offset, e.g. 2026-08-16T10:00:00Z')
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._envelope_timestamp: RFC 3339 with a mandatory offset; no 'now', no 'infinity', no
-- 24:00:00 or leap second (PostgreSQL would roll both into the next day or minute), and only
-- instants in the years 1900-9999 (UTC), which every client library can represent.
CREATE OR REPLACE FUNCTION fabric._envelope_timestamp(p_value jsonb, p_field text)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_text text;
  v_at timestamptz;
BEGIN
  IF p_value IS NULL OR pg_catalog.jsonb_typeof(p_value) = 'null' THEN
    RETURN NULL;
  END IF;
  v_text := CASE WHEN pg_catalog.jsonb_typeof(p_value) = 'string' THEN p_value #>> '{}' END;
  IF v_text IS NULL OR v_text !~
     '^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})$' THEN
    PERFORM fabric._raise_rule('invalid_datetime_format',
      pg_catalog.format('%s must be an RFC 3339 timestamp with an offset', p_field),
      'e.g. "2026-08-16T10:00:00Z"; now, yesterday and infinity are refused');
  END IF;
  IF pg_catalog.substr(v_text, 12, 2) > '23' OR pg_catalog.substr(v_text, 18, 2) > '59' THEN
    PERFORM fabric._raise_rule('invalid_datetime_format',
      pg_catalog.format('%s has an hour above 23 or a second above 59', p_field),
      'write 24:00:00 as 00:00:00 of the next day; leap seconds (:60) are not represented');
  END IF;
  v_at := v_text::timestamptz;
  IF v_at < '1900-01-01 00:00:00+00' OR v_at >= '10000-01-01 00:00:00+00' THEN
    PERFORM fabric._raise_rule('invalid_datetime_format',
      pg_catalog.format('%s must lie in the years 1900 to 9999 (UTC)', p_field),
      'open-ended validity is valid_until null, not a far-future date');
  END IF;
  RETURN v_at;
EXCEPTION
  WHEN datetime_field_overflow OR invalid_datetime_format
       OR invalid_time_zone_displacement_value THEN
    PERFORM fabric._raise_rule('invalid_datetime_format',
      pg_catalog.format('%s must be an RFC 3339 timestamp with an offset', p_field),
      'e.g. "2026-08-16T10:00:00Z"; the date must exist');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._envelope_text_array: an optional array of identifiers.
CREATE OR REPLACE FUNCTION fabric._envelope_text_array(p_value jsonb, p_field text)
RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_result text[] := '{}';
  v_item jsonb;
BEGIN
  IF p_value IS NULL OR pg_catalog.jsonb_typeof(p_value) = 'null' THEN
    RETURN v_result;
  END IF;
  IF pg_catalog.jsonb_typeof(p_value) <> 'array' OR pg_catalog.jsonb_array_length(p_value) > 64 THEN
    PERFORM fabric._bad_envelope(pg_catalog.format('%s must be an array of at most 64 items', p_field),
                                 'see the envelope in docs/concepts.md');
  END IF;
  FOR v_item IN SELECT x FROM pg_catalog.jsonb_array_elements(p_value) x LOOP
    IF pg_catalog.jsonb_typeof(v_item) = 'null' THEN   -- _envelope_text lets null through
      PERFORM fabric._bad_envelope(pg_catalog.format('%s items must be strings', p_field),
                                   'see the envelope in docs/concepts.md');
    END IF;
    v_result := v_result || fabric._envelope_text(v_item, p_field || '[]');
  END LOOP;
  RETURN v_result;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._jsonb_depth: nesting depth of a jsonb value (scalars are depth 0).
CREATE OR REPLACE FUNCTION fabric._jsonb_depth(p_value jsonb)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (WITH RECURSIVE walk(v, depth) AS (
    SELECT p_value, 0
    UNION ALL
    SELECT c.v, w.depth + 1
    FROM walk w
    CROSS JOIN LATERAL (
      SELECT e.value AS v FROM pg_catalog.jsonb_each(
        CASE WHEN pg_catalog.jsonb_typeof(w.v) = 'object' THEN w.v ELSE '{}' END) e
      UNION ALL
      SELECT a.value FROM pg_catalog.jsonb_array_elements(
        CASE WHEN pg_catalog.jsonb_typeof(w.v) = 'array' THEN w.v ELSE '[]' END) a
    ) c
    WHERE w.depth < 100
  )
  SELECT max(depth) FROM walk);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._is_double: a number that is exactly some IEEE double's shortest decimal (the rule
-- content numbers follow), so that no reader rounds it across a bound: 1.0000000000000000001
-- would read as 1 and 1e-400 as 0.
CREATE OR REPLACE FUNCTION fabric._is_double(p_value numeric)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._jcs_number(p_value);   -- 22003 unless exactly a double
  RETURN true;
EXCEPTION WHEN numeric_value_out_of_range THEN
  RETURN false;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._envelope_double: a JSON number field that is exactly a double (fabric._is_double),
-- else 22023 naming the field, never the number.
CREATE OR REPLACE FUNCTION fabric._envelope_double(p_value jsonb, p_field text)
RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NOT fabric._is_double((p_value)::numeric) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      pg_catalog.format('%s must be a number that a double represents exactly', p_field),
      'send the shortest decimal of a double, e.g. 0.9; at most 17 significant digits, '
      'nothing below 5e-324');
  END IF;
  RETURN (p_value)::numeric::double precision;
END $$;

-- ---------------------------------------------------------------------------------------
-- The checks an envelope's fields meet wherever an envelope enters (fabric._parse_envelope
-- for propose and propose_many, fabric._import_element for the elements of import_records
-- that fabric._import_elements does not read set-based): one reader per field, one error
-- per rule.

-- fabric._envelope_visibility: scope.visibility is one of the four (22023).
CREATE OR REPLACE FUNCTION fabric._envelope_visibility(p_visibility text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_visibility IS NULL OR p_visibility NOT IN ('session', 'agent', 'subject', 'tenant') THEN
    PERFORM fabric._bad_envelope('scope.visibility must be one of session, agent, subject, tenant',
                                 'there is no cross-tenant visibility');
  END IF;
END $$;

-- fabric._envelope_content: content is a non-empty JSON object (a memory says something:
-- {} is refused, 22023) of at most 65536 bytes and 32 levels (54000), with numbers that are doubles (22003, from fabric.content_hash) and a supplied
-- content_hash that matches (22023). The hash is answered when p_hash is true or a
-- content_hash was supplied; otherwise only when a number needs the check (the record's
-- trigger computes it at formation).
CREATE OR REPLACE FUNCTION fabric._envelope_content(p_envelope jsonb, p_hash boolean,
  OUT content jsonb, OUT content_hash text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_text text;
  v_numbers text;
BEGIN
  content := p_envelope -> 'content';
  IF content IS NULL OR pg_catalog.jsonb_typeof(content) <> 'object' THEN
    PERFORM fabric._bad_envelope('content must be a JSON object', 'e.g. {"assertion": "..."}');
  END IF;
  IF content = '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('content must not be empty',
      'a memory says something, e.g. {"assertion": "prefers invoices in EUR"}');
  END IF;
  IF content ? 'entities' THEN
    PERFORM fabric._envelope_entities(content -> 'entities');  -- sql/285_graph_tier.sql
  END IF;
  v_text := content::text;
  IF pg_catalog.octet_length(v_text) > 65536 THEN
    PERFORM fabric._raise_rule('program_limit_exceeded', 'content exceeds 65536 bytes',
                               'store large artefacts elsewhere and reference them');
  END IF;
  -- Nesting deeper than 32 needs at least 33 brackets: count them before walking the tree.
  IF pg_catalog.length(v_text) - pg_catalog.length(pg_catalog.translate(v_text, '{[', '')) > 32
     AND fabric._jsonb_depth(content) > 32 THEN
    PERFORM fabric._raise_rule('program_limit_exceeded', 'content nests deeper than 32 levels',
                               'flatten the content');
  END IF;
  IF p_envelope ? 'content_hash' AND pg_catalog.jsonb_typeof(p_envelope -> 'content_hash') <> 'null' THEN
    content_hash := fabric.content_hash(content);     -- refuses numbers that are not doubles
    IF content_hash IS DISTINCT FROM (CASE WHEN pg_catalog.jsonb_typeof(p_envelope -> 'content_hash') = 'string'
                                           THEN p_envelope ->> 'content_hash' END) THEN
      PERFORM fabric._bad_envelope('content_hash does not match the content',
        'omit content_hash, or send sha256: + hex SHA-256 of the RFC 8785 form of the content');
    END IF;
  ELSIF p_hash THEN
    content_hash := fabric.content_hash(content);
  ELSE
    -- Numbers must be doubles: a number written with at most 15 digits (and no exponent,
    -- which jsonb never prints) is some double's shortest decimal; content with another
    -- number is hashed here, where content_hash refuses it.
    v_numbers := pg_catalog.jsonb_path_query_array(content, 'strict $.** ? (@.type() == "number")')::text;
    IF v_numbers <> '[]' AND (v_numbers !~ '^\[(-?[0-9.]{1,16}, )*-?[0-9.]{1,16}\]$'
                              OR v_numbers ~ '[0-9]{16}') THEN
      content_hash := fabric.content_hash(content);
    END IF;
  END IF;
END $$;

-- fabric._envelope_confidence: confidence is required, a number a double represents
-- exactly (22023).
CREATE OR REPLACE FUNCTION fabric._envelope_confidence(p_envelope jsonb)
RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.jsonb_typeof(p_envelope -> 'confidence') IS DISTINCT FROM 'number' THEN
    PERFORM fabric._bad_envelope('confidence is required and must be a number', 'a number in [0, 1]');
  END IF;
  -- at most 15 digits: some double's shortest decimal (as for content numbers)
  IF (p_envelope ->> 'confidence') ~ '^-?[0-9.]{1,16}$' AND (p_envelope ->> 'confidence') !~ '[0-9]{16}' THEN
    RETURN (p_envelope ->> 'confidence')::float8;
  END IF;
  RETURN fabric._envelope_double(p_envelope -> 'confidence', 'confidence');
END $$;

-- fabric._envelope_retention: retention_class, default durable, one of the five (22023).
-- p_read_ident: the value is already known to be an identifier string (import's fast path).
CREATE OR REPLACE FUNCTION fabric._envelope_retention(p_value jsonb, p_read_ident boolean)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_retention text := coalesce(CASE WHEN p_read_ident THEN p_value #>> '{}'
                                    ELSE fabric._envelope_text(p_value, 'retention_class') END,
                               'durable');
BEGIN
  IF v_retention NOT IN ('ephemeral', 'operational', 'durable', 'audit', 'regulated') THEN
    PERFORM fabric._bad_envelope('retention_class must be one of ephemeral, operational, durable, audit, regulated',
                                 'the default is durable');
  END IF;
  RETURN v_retention;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._replayed_proposal: the answer to a proposal whose idempotency key (tenant, agent,
-- source event, content hash) is already taken, or NULL when it is free. The same request
-- gets the first proposal's id and current status and writes nothing; another request
-- under the same key is refused (23505), unless the first was rejected: a rejected
-- proposal holds its key only against exact replays, so a corrected envelope of the same
-- event and content is a new proposal. An erased proposal's subject and session are gone:
-- its key and request hash still answer, so a replayed event does not re-form erased memory.
CREATE OR REPLACE FUNCTION fabric._replayed_proposal(p_tenant_id text, p_agent_id text,
  p_source_event_id text, p_content_hash text, p_request_hash text, p_subject_id text,
  p_session_id text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_first fabric.proposals;
BEGIN
  SELECT * INTO v_first FROM fabric.proposals p
  WHERE p.tenant_id = p_tenant_id AND p.proposed_by = p_agent_id
    AND p.source_event_id = p_source_event_id AND p.content_hash = p_content_hash
    AND p.request_hash IS NOT NULL;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF v_first.status = 'rejected' AND v_first.request_hash <> p_request_hash THEN
    RETURN NULL;  -- a corrected envelope: the rejected proposal gives up the key (propose)
  END IF;
  IF v_first.request_hash <> p_request_hash
     OR (v_first.content IS NOT NULL AND (v_first.subject_id IS DISTINCT FROM p_subject_id
                                          OR v_first.session_id IS DISTINCT FROM p_session_id)) THEN
    PERFORM fabric._key_reused();
  END IF;
  RETURN pg_catalog.jsonb_build_object('proposal_id', v_first.proposal_id,
           'status', v_first.status, 'reason', v_first.reason, 'replayed', true)
         || CASE WHEN v_first.memory_id IS NULL THEN '{}'::jsonb
                 ELSE pg_catalog.jsonb_build_object('memory_id', v_first.memory_id) END;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._propose_envelope_schema: the structural checks of fabric_api.propose below as a
-- JSON Schema (read through fabric_api.request_schema('propose')). Beyond it the database
-- refuses content over 65536 bytes or nested deeper than 32 levels (54000), numbers that
-- are not exactly doubles (22023, 22003), a content_hash that does not match, and version
-- components above 2147483647; governance (scope, formation rules) answers a rejection.
CREATE OR REPLACE FUNCTION fabric._propose_envelope_schema()
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_uuid constant text := '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$';
  v_ident jsonb := fabric._schema_ident(200);
  v_ident_or_null jsonb := pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(
                             fabric._schema_ident(200), '{"type": "null"}'::jsonb));
  v_ts_or_null jsonb := pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(
                          fabric._schema_timestamp(), '{"type": "null"}'::jsonb));
BEGIN
  RETURN pg_catalog.jsonb_build_object(
    '$schema', 'https://json-schema.org/draft/2020-12/schema',
    'title', 'memory record envelope (proposal)',
    'description', 'A memory proposed inside an open run. memory_id, consolidation_state and '
      'provenance.formed_by are set by the fabric at commit; the scope must be the run''s.',
    'type', 'object',
    'additionalProperties', false,
    'required', '["tier", "scope", "content", "provenance", "confidence"]'::jsonb,
    'properties', pg_catalog.jsonb_build_object(
      'tier', '{"enum": ["episodic", "semantic", "procedural", "profile", "relational"], "description": "episodic: what happened; semantic: a fact; procedural: how to; profile: about the subject; relational: between entities"}'::jsonb,
      'scope', pg_catalog.jsonb_build_object('type', 'object', 'additionalProperties', false,
        'required', '["tenant_id", "visibility"]'::jsonb,
        'description', 'who may read the memory: the run''s tenant, optionally its subject, session or agent',
        'properties', pg_catalog.jsonb_build_object(
          'tenant_id', v_ident || '{"description": "the run''s tenant"}'::jsonb,
          'subject_id', v_ident_or_null || '{"description": "the run''s subject (or null)"}'::jsonb,
          'session_id', v_ident_or_null || '{"description": "the run''s session (or null)"}'::jsonb,
          'agent_id', v_ident_or_null || '{"description": "the run''s agent (or null)"}'::jsonb,
          'visibility', '{"enum": ["session", "agent", "subject", "tenant"]}'::jsonb)),
      'content', '{"type": "object", "minProperties": 1, "description": "the memory itself, a non-empty JSON object such as {\"assertion\": \"prefers invoices in EUR\"}; at most 65536 bytes, 32 levels deep"}'::jsonb,
      'content_hash', '{"anyOf": [{"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}, {"type": "null"}], "description": "omit: the fabric computes it (sha256 of the RFC 8785 form of content)"}'::jsonb,
      'provenance', pg_catalog.jsonb_build_object('type', 'object', 'additionalProperties', false,
        'required', '["formation_method"]'::jsonb,
        'properties', pg_catalog.jsonb_build_object(
          'source_event_id', v_ident_or_null || '{"description": "the event that caused this memory; required for the proposal to be validated"}'::jsonb,
          'correlation_id', v_ident_or_null,
          'causation_id', v_ident_or_null,
          'formation_method', '{"enum": ["extraction", "declaration", "consolidation", "reflection", "import"], "description": "agents propose extraction, declaration or import"}'::jsonb)),
      'derived_from', pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(
        pg_catalog.jsonb_build_object('type', 'array', 'maxItems', 256, 'uniqueItems', true,
          'items', pg_catalog.jsonb_build_object('type', 'string', 'pattern', v_uuid)),
        '{"type": "null"}'::jsonb), 'description', 'memory ids this memory was derived from, each once'),
      'confidence', '{"type": "number", "minimum": 0, "maximum": 1, "description": "how sure the agent is, in [0, 1]"}'::jsonb,
      'validity_interval', pg_catalog.jsonb_build_object('type', 'object', 'additionalProperties', false,
        'properties', pg_catalog.jsonb_build_object('valid_from', v_ts_or_null, 'valid_until', v_ts_or_null),
        'description', 'when the memory holds in the world; valid_until null means open-ended'),
      'retention_class', '{"enum": ["ephemeral", "operational", "durable", "audit", "regulated", null], "description": "default durable"}'::jsonb,
      'compliance_labels', pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(
        pg_catalog.jsonb_build_object('type', 'array', 'maxItems', 64, 'items', v_ident),
        '{"type": "null"}'::jsonb)),
      'version', pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(
        fabric._schema_ident(64), '{"type": "null"}'::jsonb), 'description', 'MAJOR.MINOR.PATCH, default 1.0.0'),
      'supersedes', '{"type": ["string", "null"], "description": "the memory id this one replaces"}'::jsonb,
      'business_instance_id', v_ident_or_null));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._parse_envelope: the structure of a proposal envelope, checked. Reads nothing
-- but the envelope and raises propose's structural errors (22023, 22007, 22003, 54000)
-- in the order propose always has; answers the checked fields. Scope ids are the
-- envelope's (NULL when omitted): fabric._judge_envelope compares them with the run.
-- supersedes is answered as given (a JSON string or NULL), given_from as sent (NULL when
-- omitted), for the rejection reason and the idempotency hash.
CREATE OR REPLACE FUNCTION fabric._parse_envelope(p_envelope jsonb,
  OUT tier text, OUT visibility text, OUT tenant_id text, OUT subject_id text,
  OUT session_id text, OUT agent_id text, OUT content jsonb, OUT content_hash text,
  OUT source_event_id text, OUT correlation_id text, OUT causation_id text,
  OUT formation_method text, OUT derived_from uuid[], OUT supersedes jsonb,
  OUT confidence double precision, OUT given_from timestamptz, OUT valid_from timestamptz,
  OUT valid_until timestamptz, OUT retention_class text, OUT compliance_labels text[],
  OUT version text, OUT business_instance_id text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_scope jsonb;
  v_prov jsonb;
  v_validity jsonb;
  v_supplied_hash text;
  v_item jsonb;
  v_content record;
BEGIN
  derived_from := '{}';
  IF p_envelope IS NULL OR pg_catalog.jsonb_typeof(p_envelope) <> 'object' THEN
    PERFORM fabric._bad_envelope('the envelope must be a JSON object',
                                 'see the envelope in docs/concepts.md');
  END IF;
  IF (p_envelope - ARRAY['tier', 'scope', 'content', 'content_hash', 'provenance',
                         'derived_from', 'confidence', 'validity_interval', 'retention_class',
                         'compliance_labels', 'version', 'supersedes',
                         'business_instance_id']) <> '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('the envelope has keys outside the proposal envelope',
      'allowed: tier, scope, content, content_hash, provenance, derived_from, confidence, '
      'validity_interval, retention_class, compliance_labels, version, supersedes, '
      'business_instance_id (memory_id and consolidation_state are set at commit)');
  END IF;

  tier := fabric._envelope_text(p_envelope -> 'tier', 'tier');
  IF tier IS NULL OR tier NOT IN ('episodic', 'semantic', 'procedural', 'profile', 'relational') THEN
    PERFORM fabric._bad_envelope('tier must be one of episodic, semantic, procedural, profile, relational',
      'working memory never enters the fabric; graph and temporal are not proposed');
  END IF;

  v_scope := p_envelope -> 'scope';
  IF v_scope IS NULL OR pg_catalog.jsonb_typeof(v_scope) <> 'object'
     OR (v_scope - ARRAY['tenant_id', 'subject_id', 'agent_id', 'session_id', 'visibility']) <> '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('scope must be an object of tenant_id, subject_id, agent_id, session_id, visibility',
      'tenant_id comes first and is required');
  END IF;
  tenant_id := fabric._envelope_text(v_scope -> 'tenant_id', 'scope.tenant_id');
  subject_id := fabric._envelope_text(v_scope -> 'subject_id', 'scope.subject_id');
  session_id := fabric._envelope_text(v_scope -> 'session_id', 'scope.session_id');
  agent_id := fabric._envelope_text(v_scope -> 'agent_id', 'scope.agent_id');
  visibility := fabric._envelope_text(v_scope -> 'visibility', 'scope.visibility');
  IF tenant_id IS NULL THEN
    PERFORM fabric._bad_envelope('scope.tenant_id is required',
                                 'name the tenant of the run; it always comes first');
  END IF;
  PERFORM fabric._envelope_visibility(visibility);

  -- an expression, not SELECT ... FROM the function (a function scan's executor costs
  -- about 50 µs a call more)
  v_content := fabric._envelope_content(p_envelope, true);
  content := v_content.content;
  content_hash := v_content.content_hash;

  v_prov := p_envelope -> 'provenance';
  IF v_prov IS NULL OR pg_catalog.jsonb_typeof(v_prov) <> 'object'
     OR (v_prov - ARRAY['source_event_id', 'correlation_id', 'causation_id', 'formation_method']) <> '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('provenance must be an object of source_event_id, correlation_id, causation_id, formation_method',
      'formed_by is set by the committer');
  END IF;
  source_event_id := fabric._envelope_text(v_prov -> 'source_event_id', 'provenance.source_event_id');
  correlation_id := fabric._envelope_text(v_prov -> 'correlation_id', 'provenance.correlation_id');
  causation_id := fabric._envelope_text(v_prov -> 'causation_id', 'provenance.causation_id');
  formation_method := fabric._envelope_text(v_prov -> 'formation_method', 'provenance.formation_method');
  IF formation_method IS NULL OR formation_method NOT IN ('extraction', 'declaration', 'consolidation', 'reflection', 'import') THEN
    PERFORM fabric._bad_envelope('provenance.formation_method must be one of extraction, declaration, consolidation, reflection, import',
                                 'agents propose extraction, declaration or import');
  END IF;

  IF p_envelope ? 'derived_from' AND pg_catalog.jsonb_typeof(p_envelope -> 'derived_from') <> 'null' THEN
    IF pg_catalog.jsonb_typeof(p_envelope -> 'derived_from') <> 'array'
       OR pg_catalog.jsonb_array_length(p_envelope -> 'derived_from') > 256 THEN
      PERFORM fabric._bad_envelope('derived_from must be an array of at most 256 memory ids', 'memory ids are UUIDs');
    END IF;
    FOR v_item IN SELECT x FROM pg_catalog.jsonb_array_elements(p_envelope -> 'derived_from') x LOOP
      IF pg_catalog.jsonb_typeof(v_item) <> 'string' OR (v_item #>> '{}') !~*
         '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        PERFORM fabric._bad_envelope('derived_from must be an array of memory ids', 'memory ids are UUIDs');
      END IF;
      IF (v_item #>> '{}')::uuid = ANY (derived_from) THEN
        PERFORM fabric._bad_envelope('derived_from names a memory id more than once',
          'name each source record once');
      END IF;
      derived_from := derived_from || (v_item #>> '{}')::uuid;
    END LOOP;
    SELECT pg_catalog.array_agg(d ORDER BY d) INTO derived_from
    FROM pg_catalog.unnest(derived_from) d;
    derived_from := coalesce(derived_from, '{}');
  END IF;
  supersedes := p_envelope -> 'supersedes';
  IF supersedes IS NOT NULL AND pg_catalog.jsonb_typeof(supersedes) NOT IN ('null', 'string') THEN
    PERFORM fabric._bad_envelope('supersedes must be a memory id or null', 'memory ids are UUIDs');
  END IF;
  IF pg_catalog.jsonb_typeof(supersedes) = 'null' THEN
    supersedes := NULL;
  END IF;

  confidence := fabric._envelope_confidence(p_envelope);

  v_validity := p_envelope -> 'validity_interval';
  IF v_validity IS NOT NULL AND (pg_catalog.jsonb_typeof(v_validity) <> 'object'
     OR (v_validity - ARRAY['valid_from', 'valid_until']) <> '{}'::jsonb) THEN
    PERFORM fabric._bad_envelope('validity_interval must be an object of valid_from, valid_until',
                                 'valid_until null means open-ended');
  END IF;
  given_from := fabric._envelope_timestamp(v_validity -> 'valid_from', 'validity_interval.valid_from');
  valid_from := coalesce(given_from, pg_catalog.now());
  valid_until := fabric._envelope_timestamp(v_validity -> 'valid_until', 'validity_interval.valid_until');

  retention_class := fabric._envelope_retention(p_envelope -> 'retention_class', false);
  compliance_labels := fabric._envelope_text_array(p_envelope -> 'compliance_labels', 'compliance_labels');
  version := coalesce(fabric._envelope_text(p_envelope -> 'version', 'version', 64), '1.0.0');
  PERFORM fabric._envelope_version_components(version);
  business_instance_id := fabric._envelope_text(p_envelope -> 'business_instance_id', 'business_instance_id');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._envelope_version_components: a version whose numeric components fit an integer
-- (22023 otherwise); whether it is SemVer is governance (a rejection), not structure.
CREATE OR REPLACE FUNCTION fabric._envelope_version_components(p_version text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_version <> '1.0.0' AND EXISTS (SELECT 1 FROM pg_catalog.regexp_split_to_table(
               pg_catalog.split_part(pg_catalog.split_part(p_version, '+', 1), '-', 1), '\.') c
             WHERE c ~ '^[0-9]+$'
               AND CASE WHEN pg_catalog.length(c) > 10 THEN true ELSE c::bigint > 2147483647 END) THEN
    PERFORM fabric._bad_envelope('version components must be at most 2147483647',
                                 'MAJOR.MINOR.PATCH, e.g. 1.4.2');
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._judge_envelope: governance of one envelope inside the caller's run. Parses it
-- (fabric._parse_envelope), refuses a scope outside the run (42501), an unknown business
-- instance (22023) and derived_from outside the tenant (23503) as errors, and answers the
-- proposal row to file: status validated, or rejected with its reason; scope taken from
-- the run, a fresh proposal id, and the request hash of the idempotency key. Writes nothing.
-- (Generic plans: the custom plan of the derived_from check, whose estimate knows the
-- array's length, was made again on every call.)
CREATE OR REPLACE FUNCTION fabric._judge_envelope(p_run fabric.runs, p_agent fabric.agents,
                                                  p_envelope jsonb)
RETURNS fabric.proposals
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_sources bigint;
  e record;
  v fabric.proposals;
BEGIN
  e := fabric._parse_envelope(p_envelope);   -- an expression: no function scan

  -- Scope comes from the run; a request can only narrow it (errors, nothing written).
  IF e.tenant_id <> p_run.tenant_id THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'scope.tenant_id is not the tenant of the run',
      'a run acts in exactly one tenant; there is no cross-tenant write');
  END IF;
  IF e.subject_id IS DISTINCT FROM p_run.subject_id AND e.subject_id IS NOT NULL THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'scope.subject_id is not the subject of the run',
      'omit subject_id to use the run''s subject');
  END IF;
  IF e.session_id IS DISTINCT FROM p_run.session_id AND e.session_id IS NOT NULL THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'scope.session_id is not the session of the run',
      'omit session_id to use the run''s session');
  END IF;
  IF e.agent_id IS NOT NULL AND e.agent_id <> p_run.agent_id THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'scope.agent_id is neither the calling agent nor null',
      'an agent proposes only for itself');
  END IF;
  -- (the lookup only when an instance is named: one expression of both was planned again
  -- on every call, its custom plan folding the absent instance away)
  IF e.business_instance_id IS NOT NULL THEN
    IF NOT EXISTS (
         SELECT 1 FROM fabric.instance_config c
         WHERE c.tenant_id = p_run.tenant_id AND c.business_instance_id = e.business_instance_id) THEN
      PERFORM fabric._bad_envelope('business_instance_id names no configured instance of the tenant',
        'omit it for the tenant''s default instance, or configure the instance first '
        '(fabric_api.configure_instance)');
    END IF;
  END IF;
  -- every id a record of the tenant: as many records found as distinct ids (a query of its
  -- own on the tenant's shard: Citus plans no distributed subquery inside an expression)
  IF pg_catalog.cardinality(e.derived_from) > 0 THEN
    SELECT pg_catalog.count(*) INTO v_sources FROM fabric.memory_records m
    WHERE m.tenant_id = p_run.tenant_id AND m.memory_id = ANY (e.derived_from);
  END IF;
  IF pg_catalog.cardinality(e.derived_from) > 0
     AND v_sources < (SELECT pg_catalog.count(DISTINCT d) FROM pg_catalog.unnest(e.derived_from) d) THEN
    PERFORM fabric._raise_rule('foreign_key_violation',
      'derived_from names a memory id that is not a record of this tenant',
      'derive only from committed records of the run''s tenant');
  END IF;

  v.tenant_id := p_run.tenant_id;
  v.proposal_id := fabric._event_id();
  v.run_id := p_run.run_id;
  v.proposed_by := p_run.agent_id;
  v.tier := e.tier;
  v.visibility := e.visibility;
  v.subject_id := p_run.subject_id;
  v.session_id := p_run.session_id;
  v.agent_id := CASE WHEN e.visibility = 'agent' THEN p_run.agent_id ELSE e.agent_id END;
  v.business_instance_id := e.business_instance_id;
  v.content := e.content;
  v.content_hash := e.content_hash;
  v.source_event_id := e.source_event_id;
  v.correlation_id := e.correlation_id;
  v.causation_id := e.causation_id;
  v.formation_method := e.formation_method;
  v.derived_from := e.derived_from;
  v.supersedes := CASE WHEN (e.supersedes #>> '{}') ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                       THEN (e.supersedes #>> '{}')::uuid END;
  v.confidence := e.confidence;
  v.valid_from := e.valid_from;
  v.valid_until := e.valid_until;
  v.retention_class := e.retention_class;
  v.compliance_labels := e.compliance_labels;
  v.version := e.version;

  -- Governance: a rejected proposal with its reason.
  v.reason := CASE
    WHEN e.source_event_id IS NULL THEN
      'provenance.source_event_id is required: memory never enters the fabric uncaused (R-PROP-2)'
    WHEN e.formation_method NOT IN ('extraction', 'declaration', 'import') THEN
      'agents propose only extraction, declaration or import; consolidation and reflection are formed from os-agt-011 recommendations'
    WHEN e.tier = 'relational' THEN
      'agents never propose into the relational tier; it is reached only by an approved promotion'
    WHEN e.supersedes IS NOT NULL THEN
      'agents never propose with supersedes; supersession is a committer action'
    WHEN NOT fabric._profile_allows(p_agent.memory_profile, 'propose_scope', 'tiers', e.tier) THEN
      pg_catalog.format('tier %s is outside the agent''s memory_profile.propose_scope.tiers', e.tier)
    WHEN NOT fabric._profile_allows(p_agent.memory_profile, 'propose_scope', 'visibility', e.visibility) THEN
      pg_catalog.format('visibility %s is outside the agent''s memory_profile.propose_scope.visibility', e.visibility)
    WHEN e.visibility = 'session' AND v.session_id IS NULL THEN
      'visibility session needs a session: the run has none'
    WHEN e.visibility = 'subject' AND v.subject_id IS NULL THEN
      'visibility subject needs a subject: the run has none'
    WHEN e.retention_class = 'ephemeral' THEN
      'ephemeral retention belongs to the working tier, which never enters the fabric'
    WHEN e.retention_class = 'audit' AND e.tier <> 'episodic' THEN
      'audit retention is only for episodic records'
    WHEN e.confidence IS NULL OR NOT (e.confidence BETWEEN 0 AND 1) THEN
      'confidence must lie in [0, 1]'
    WHEN e.valid_until IS NOT NULL AND e.valid_until <= e.valid_from THEN
      'validity_interval.valid_until must be after valid_from'
    WHEN e.version !~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$' THEN
      'version must be SemVer (MAJOR.MINOR.PATCH)'
    WHEN e.tier = 'semantic' AND NOT fabric._ids_have_episodic_ancestor(p_run.tenant_id, e.derived_from) THEN
      'semantic record needs at least one episodic source: pass derived_from with the episodes it was extracted from'
  END;
  v.status := CASE WHEN v.reason IS NULL THEN 'validated' ELSE 'rejected' END;

  -- Idempotency: the key is (tenant, agent, source event, content hash); the request hash
  -- covers the rest of what was asked (subject and session are compared as stored, so no
  -- digest of them outlives an erasure). An omitted valid_from is hashed as omitted.
  v.request_hash := 'sha256:' || pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
    pg_catalog.jsonb_build_object('tier', e.tier, 'visibility', e.visibility,
      'agent_id', v.agent_id, 'business_instance_id', e.business_instance_id,
      'correlation_id', e.correlation_id, 'causation_id', e.causation_id,
      'formation_method', e.formation_method,
      'derived_from', e.derived_from, 'supersedes', e.supersedes,
      'confidence', pg_catalog.trim_scale((p_envelope -> 'confidence')::numeric),
      'valid_from', pg_catalog.extract('epoch', e.given_from),
      'valid_until', pg_catalog.extract('epoch', e.valid_until),
      'retention_class', e.retention_class, 'compliance_labels', e.compliance_labels,
      'version', e.version
    )::text, 'UTF8')), 'hex');
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._key_reused: the refusal of a request under a taken idempotency key (23505).
CREATE OR REPLACE FUNCTION fabric._key_reused()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._raise_rule('unique_violation',
    'idempotency key reused: this agent already proposed this content for this '
    'source event, with a different envelope or run scope',
    'resend the first envelope unchanged (in a run of the same subject and session) '
    'to get its status, or propose under a new provenance.source_event_id');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._enter_proposer: the caller's open run for a proposal (committers are refused:
-- no agent both proposes and commits durable memory).
CREATE OR REPLACE FUNCTION fabric._enter_proposer(p_run_id uuid)
RETURNS fabric.runs
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._reset_context();
  IF pg_catalog.pg_has_role(session_user, 'fabric_committer', 'MEMBER') THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'committers cannot propose: no agent both proposes and commits durable memory',
      'propose with an agent login that is not a member of fabric_committer');
  END IF;
  RETURN fabric._enter_run(p_run_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._propose_denial: the three-layer tool authorization of a proposal. NULL when
-- authorized; else the denied answer, with one agent.tool.unauthorized event per
-- envelope refused (p_count: one for propose, the batch size for propose_many).
CREATE OR REPLACE FUNCTION fabric._propose_denial(p_run fabric.runs, p_count integer DEFAULT 1)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_missing text[] := fabric._tool_denial(p_run, 'tool:memory-propose');
BEGIN
  IF pg_catalog.cardinality(v_missing) = 0 THEN
    RETURN NULL;
  END IF;
  -- rows of fabric.shard_events, in its column order (fabric._append_events)
  PERFORM fabric._append_events(ARRAY(
    SELECT ROW(p_run.tenant_id, fabric._event_id(), NULL, 'agent.tool.unauthorized', NULL,
               NULL, fabric._setting('fabric.actor'), fabric._setting('fabric.run_id')::uuid,
               NULL, NULL,
               pg_catalog.jsonb_build_object('tool', 'tool:memory-propose',
                                             'agent_id', p_run.agent_id,
                                             'missing_layers', v_missing))::fabric.shard_events
    FROM pg_catalog.generate_series(1, p_count)));
  RETURN pg_catalog.jsonb_build_object('proposal_id', NULL, 'status', 'denied',
    'reason', 'tool:memory-propose is not authorized: missing from '
              || pg_catalog.array_to_string(v_missing, ', '));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._propose_entry: the entry of every proposing call (propose, propose_many, handoff):
-- the caller's open run, committers refused (fabric._enter_proposer), the run's agent, and
-- the tool authorization (fabric._propose_denial: NULL when authorized, else the denied
-- answer, with p_count agent.tool.unauthorized events written).
CREATE OR REPLACE FUNCTION fabric._propose_entry(p_run_id uuid, p_count integer,
  OUT run fabric.runs, OUT agent fabric.agents, OUT denial jsonb)
RETURNS record
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  run := fabric._enter_proposer(p_run_id);
  SELECT * INTO agent FROM fabric.agents a WHERE a.agent_id = run.agent_id;
  denial := fabric._propose_denial(run, p_count);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._proposal_event_payload: the payload of a filed proposal's event. (plpgsql: a SQL
-- function with a SET clause is never inlined and is parsed and planned on every call.)
CREATE OR REPLACE FUNCTION fabric._proposal_event_payload(p fabric.proposals)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('tier', p.tier,
    'visibility', p.visibility, 'content_hash', p.content_hash, 'reason', p.reason));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._file_proposal: judge one envelope inside a run already entered and authorized
-- (fabric._propose_entry) and file it, or answer the proposal that holds its idempotency
-- key; returns propose's answer.
CREATE OR REPLACE FUNCTION fabric._file_proposal(p_run fabric.runs, p_agent fabric.agents,
                                                 p_envelope jsonb)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_p fabric.proposals;
  v_answer jsonb;
  v_released boolean := false;
  v_event_id uuid;
BEGIN
  -- Structure and scope: errors, nothing written; governance: the reason of a rejection.
  v_p := fabric._judge_envelope(p_run, p_agent, p_envelope);

  -- The INSERT is tried first: it files the proposal when its idempotency key is free (the
  -- common case, with no lookup before it) and writes nothing when the key is held, which
  -- fabric._replayed_proposal then answers (the key it reads is the unique index's).
  <<file>>
  LOOP
    INSERT INTO fabric.proposals (tenant_id, proposal_id, run_id, proposed_by, status, reason, tier,
      visibility, subject_id, agent_id, session_id, business_instance_id, content, content_hash,
      source_event_id, correlation_id, causation_id, formation_method, derived_from, supersedes,
      confidence, valid_from, valid_until, retention_class, compliance_labels, version, request_hash)
    VALUES (v_p.tenant_id, v_p.proposal_id, v_p.run_id, v_p.proposed_by, v_p.status, v_p.reason,
      v_p.tier, v_p.visibility, v_p.subject_id, v_p.agent_id, v_p.session_id,
      v_p.business_instance_id, v_p.content, v_p.content_hash, v_p.source_event_id,
      v_p.correlation_id, v_p.causation_id, v_p.formation_method, v_p.derived_from,
      v_p.supersedes, v_p.confidence, v_p.valid_from, v_p.valid_until, v_p.retention_class,
      v_p.compliance_labels, v_p.version, v_p.request_hash)
    ON CONFLICT (tenant_id, proposed_by, source_event_id, content_hash) WHERE request_hash IS NOT NULL
    DO NOTHING;
    IF FOUND THEN
      PERFORM fabric._note_tenant('proposal', v_p.proposal_id, v_p.tenant_id);  -- a cluster's lookup
      EXIT file;
    END IF;
    -- The key is held: by the same request (its answer is replayed, nothing written), by
    -- another request (23505), or by a rejected proposal of another request, which gives the
    -- key up to this corrected envelope, once (the UPDATE runs only then, not on every
    -- propose). A concurrent twin that took it first has committed by now.
    v_answer := fabric._replayed_proposal(v_p.tenant_id, v_p.proposed_by, v_p.source_event_id,
                  v_p.content_hash, v_p.request_hash, v_p.subject_id, v_p.session_id);
    IF v_answer IS NOT NULL THEN
      RETURN v_answer;
    END IF;
    IF NOT v_released THEN
      UPDATE fabric.proposals p SET request_hash = NULL
      WHERE p.tenant_id = v_p.tenant_id AND p.proposed_by = v_p.proposed_by
        AND p.source_event_id = v_p.source_event_id AND p.content_hash = v_p.content_hash
        AND p.request_hash IS NOT NULL AND p.status = 'rejected';
      v_released := FOUND;
      CONTINUE file WHEN v_released;
    END IF;
    PERFORM fabric._raise_rule('serialization_failure',
      'a concurrent proposal with the same idempotency key is not visible yet',
      'retry the call');
  END LOOP;

  v_event_id := fabric._emit('memory.proposal.' || v_p.status, v_p.tenant_id,
    v_p.correlation_id, v_p.causation_id, NULL, v_p.proposal_id,
    fabric._proposal_event_payload(v_p));   -- an expression, not a statement (PERFORM)

  RETURN pg_catalog.jsonb_build_object('proposal_id', v_p.proposal_id, 'status', v_p.status,
                                       'reason', v_p.reason);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.propose: validate an envelope inside the caller's run and file a proposal.
CREATE OR REPLACE FUNCTION fabric_api.propose(p_envelope jsonb, p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_entry record := fabric._propose_entry(p_run_id, 1);
BEGIN
  -- Three-layer tool authorization: a refusal is an answer, not an error.
  IF v_entry.denial IS NOT NULL THEN
    RETURN v_entry.denial;
  END IF;
  RETURN fabric._file_proposal(v_entry.run, v_entry.agent, p_envelope);
END $$;
COMMENT ON FUNCTION fabric_api.propose(jsonb, uuid) IS
  'Propose a memory inside your open run; returns {"proposal_id","status","reason"} with status '
  'validated, rejected or denied. Idempotent on (tenant, agent, source_event_id, content_hash): '
  'a repeat returns the first proposal with "replayed": true. Agents only. '
  'Example: SELECT fabric_api.propose('
  '''{"tier":"episodic","scope":{"tenant_id":"acme","visibility":"subject"},'
  '"content":{"text":"asked for invoices in EUR"},"provenance":{"source_event_id":"evt-1",'
  '"formation_method":"extraction"},"confidence":0.9}'', ''<run_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric._judge_envelopes: the envelopes of a propose_many batch of the common, valid shape,
-- judged by one set-based query: the proposal row fabric._judge_envelope would answer for
-- each (status validated, the scope of the run, a fresh proposal id, the same request hash),
-- with its position (1-based). An envelope of that shape is an object of the proposal
-- envelope's keys; tier episodic, semantic, procedural or profile, allowed by the agent's
-- profile with its visibility; scope ids printable ASCII identifiers (as JSON text: nothing
-- to escape), the run's tenant, the run's subject, session and agent or null, a visibility
-- whose id the run has; content a non-empty object of at most 65536 bytes and 32 brackets, numbers
-- that are doubles' shortest decimals, no content_hash; provenance an object of identifiers
-- with a source_event_id and a formation method agents propose; derived_from absent, null
-- or up to 256 distinct ids of records of the tenant, one of them episodic for a semantic envelope;
-- confidence a plain decimal in [0, 1]; validity timestamps in RFC 3339 with T and Z or an
-- offset, valid_until after valid_from; retention a kept class (audit only episodic);
-- labels plain ASCII identifiers; version absent or plain MAJOR.MINOR.PATCH; no
-- supersedes; a business instance configured in the tenant. Every other envelope is
-- answered by no row: propose_many judges it with fabric._judge_envelope, which raises its
-- error or gives its rejection. The readers agree on every envelope the fast test accepts
-- (tests/sql/test_propose_reader.py). Reads, writes nothing.
CREATE OR REPLACE FUNCTION fabric._judge_envelopes(p_envelopes jsonb, p_run fabric.runs,
                                                   p_agent fabric.agents)
RETURNS TABLE (o_position integer, o_row fabric.proposals)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
  -- plpgsql, its generic plan kept for the session (a SQL function with a SET clause is
  -- planned again on every call). Not used by propose: for one envelope, starting this
  -- query costs about what fabric._judge_envelope does.
  RETURN QUERY
  SELECT r.position, ROW(
      p_run.tenant_id, fabric._event_id(), p_run.run_id, p_run.agent_id,
      'validated', NULL, r.tier, r.visibility, p_run.subject_id, r.agent_id, p_run.session_id,
      r.instance, r.content, fabric.content_hash(r.content), r.source_event_id,
      r.correlation_id, r.causation_id, r.method, r.derived_from, NULL,
      (r.element ->> 'confidence')::float8, coalesce(r.given_from, pg_catalog.now()),
      r.valid_until, r.retention, r.labels, r.version, NULL, NULL, NULL, NULL,
      'sha256:' || pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
        pg_catalog.jsonb_build_object('tier', r.tier, 'visibility', r.visibility,
          'agent_id', r.agent_id, 'business_instance_id', r.instance,
          'correlation_id', r.correlation_id, 'causation_id', r.causation_id,
          'formation_method', r.method,
          'derived_from', r.derived_from, 'supersedes', NULL::jsonb,
          'confidence', pg_catalog.trim_scale((r.element -> 'confidence')::numeric),
          'valid_from', pg_catalog.extract('epoch', r.given_from),
          'valid_until', pg_catalog.extract('epoch', r.valid_until),
          'retention_class', r.retention, 'compliance_labels', r.labels,
          'version', r.version
        )::text, 'UTF8')), 'hex'),
      NULL)::fabric.proposals
  FROM (
    SELECT s.position, s.element, s.tier, s.visibility, s.instance, s.content,
      s.prov ->> 'source_event_id' AS source_event_id,
      s.prov ->> 'correlation_id' AS correlation_id,
      s.prov ->> 'causation_id' AS causation_id, s.prov ->> 'formation_method' AS method,
      CASE WHEN s.visibility = 'agent' THEN p_run.agent_id ELSE s.scope ->> 'agent_id' END
        AS agent_id,
      CASE WHEN pg_catalog.jsonb_typeof(s.derived) = 'array' AND s.derived <> '[]'
           THEN ARRAY(SELECT (d #>> '{}')::uuid
                      FROM pg_catalog.jsonb_array_elements(s.derived) d ORDER BY 1)
           ELSE '{}'::uuid[] END AS derived_from,
      (s.validity ->> 'valid_from')::timestamptz AS given_from,
      (s.validity ->> 'valid_until')::timestamptz AS valid_until,
      coalesce(s.element ->> 'retention_class', 'durable') AS retention,
      CASE WHEN pg_catalog.jsonb_typeof(s.element -> 'compliance_labels') = 'array'
           THEN pg_catalog.translate((s.element -> 'compliance_labels')::text, '[]', '{}')::text[]
           ELSE '{}'::text[] END AS labels,
      coalesce(s.element ->> 'version', '1.0.0') AS version
    FROM (
      SELECT x.ord::integer AS position, x.element, e.*,
        pg_catalog.jsonb_typeof(x.element) = 'object'
        AND (x.element - ARRAY['tier', 'scope', 'content', 'content_hash', 'provenance',
                               'derived_from', 'confidence', 'validity_interval',
                               'retention_class', 'compliance_labels', 'version', 'supersedes',
                               'business_instance_id']) = '{}'::jsonb
        AND pg_catalog.jsonb_typeof(coalesce(x.element -> 'content_hash', 'null')) = 'null'
        AND pg_catalog.jsonb_typeof(coalesce(x.element -> 'supersedes', 'null')) = 'null'
        AND pg_catalog.jsonb_typeof(x.element -> 'tier') = 'string'
        AND e.tier IN ('episodic', 'semantic', 'procedural', 'profile')
        AND coalesce((p_agent.memory_profile -> 'propose_scope' -> 'tiers') ? e.tier, false)
        -- scope: an object of its keys, each null or a printable ASCII identifier (as JSON
        -- text: no quote or backslash to escape), inside the run, the visibility's id held
        AND pg_catalog.jsonb_typeof(e.scope) = 'object'
        AND (e.scope - ARRAY['tenant_id', 'subject_id', 'agent_id', 'session_id', 'visibility'])
            = '{}'::jsonb
        AND e.scope::text ~ '^\{"[a-z_]+": ("[!#-\[\]-~]+"|null)(, "[a-z_]+": ("[!#-\[\]-~]+"|null))*\}$'
        AND GREATEST(pg_catalog.length(e.scope ->> 'tenant_id'),
              pg_catalog.length(e.scope ->> 'subject_id'),
              pg_catalog.length(e.scope ->> 'agent_id'),
              pg_catalog.length(e.scope ->> 'session_id'),
              pg_catalog.length(e.scope ->> 'visibility'), 0) <= 200
        AND e.scope ->> 'tenant_id' = p_run.tenant_id
        AND coalesce(e.scope ->> 'subject_id' = p_run.subject_id, e.scope ->> 'subject_id' IS NULL)
        AND coalesce(e.scope ->> 'session_id' = p_run.session_id, e.scope ->> 'session_id' IS NULL)
        AND coalesce(e.scope ->> 'agent_id' = p_run.agent_id, e.scope ->> 'agent_id' IS NULL)
        AND CASE e.visibility
              WHEN 'tenant' THEN true
              WHEN 'agent' THEN true
              WHEN 'subject' THEN p_run.subject_id IS NOT NULL
              WHEN 'session' THEN p_run.session_id IS NOT NULL
              ELSE false END
        AND coalesce((p_agent.memory_profile -> 'propose_scope' -> 'visibility') ? e.visibility,
                     false)
        -- provenance: an object of identifiers with a source event and a method agents use
        AND pg_catalog.jsonb_typeof(e.prov) = 'object'
        AND (e.prov - ARRAY['source_event_id', 'correlation_id', 'causation_id',
                            'formation_method']) = '{}'::jsonb
        AND e.prov::text ~ '^\{"[a-z_]+": ("[!#-\[\]-~]+"|null)(, "[a-z_]+": ("[!#-\[\]-~]+"|null))*\}$'
        AND GREATEST(pg_catalog.length(e.prov ->> 'source_event_id'),
              pg_catalog.length(e.prov ->> 'correlation_id'),
              pg_catalog.length(e.prov ->> 'causation_id'), 0) <= 200
        AND e.prov ->> 'source_event_id' IS NOT NULL
        AND e.prov ->> 'formation_method' IN ('extraction', 'declaration', 'import')
        AND (pg_catalog.jsonb_typeof(coalesce(x.element -> 'business_instance_id', 'null')) = 'null'
             OR (pg_catalog.jsonb_typeof(x.element -> 'business_instance_id') = 'string'
                 AND x.element ->> 'business_instance_id' ~ '^[!-~]+$'
                 AND pg_catalog.length(x.element ->> 'business_instance_id') <= 200
                 AND EXISTS (SELECT 1 FROM fabric.instance_config c
                             WHERE c.tenant_id = p_run.tenant_id
                               AND c.business_instance_id = x.element ->> 'business_instance_id')))
        -- content: a non-empty object, small and shallow, numbers that the hash accepts
        AND pg_catalog.jsonb_typeof(e.content) = 'object'
        AND e.content <> '{}'::jsonb
        AND pg_catalog.octet_length(e.content_text) <= 65536
        AND pg_catalog.length(e.content_text)
            - pg_catalog.length(pg_catalog.translate(e.content_text, '{[', '')) <= 32
        AND (SELECT q.n = '[]' OR (q.n ~ '^\[(-?[0-9.]{1,16}, )*-?[0-9.]{1,16}\]$' AND q.n !~ '[0-9]{16}')
             FROM (SELECT pg_catalog.jsonb_path_query_array(e.content,
                            'strict $.** ? (@.type() == "number")')::text) AS q(n))
        -- derived_from: distinct records of the tenant, one of them an episode for a
        -- semantic record
        AND (pg_catalog.jsonb_typeof(coalesce(e.derived, 'null')) = 'null'
             OR (pg_catalog.jsonb_typeof(e.derived) = 'array'
                 AND pg_catalog.jsonb_array_length(e.derived) <= 256
                 AND (pg_catalog.jsonb_array_length(e.derived) <= 1
                      OR (SELECT pg_catalog.count(DISTINCT pg_catalog.lower(d #>> '{}'))
                          FROM pg_catalog.jsonb_array_elements(e.derived) d)
                         = pg_catalog.jsonb_array_length(e.derived))
                 AND NOT EXISTS (
                   SELECT 1 FROM pg_catalog.jsonb_array_elements(e.derived) d
                   WHERE pg_catalog.jsonb_typeof(d) <> 'string'
                      OR (d #>> '{}') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                      -- one index probe per id (OFFSET 0: never a hashed scan of the tenant)
                      OR NOT EXISTS (SELECT 1 FROM fabric.memory_records m
                                     WHERE m.tenant_id = p_run.tenant_id
                                       AND m.memory_id = (d #>> '{}')::uuid OFFSET 0))))
        AND (e.tier <> 'semantic' OR EXISTS (
               SELECT 1 FROM pg_catalog.jsonb_array_elements(
                 CASE WHEN pg_catalog.jsonb_typeof(e.derived) = 'array' THEN e.derived
                      ELSE '[]' END) d
               WHERE (SELECT m.tier FROM fabric.memory_records m
                      WHERE m.tenant_id = p_run.tenant_id AND m.memory_id = (d #>> '{}')::uuid
                      OFFSET 0) = 'episodic'))
        -- confidence: a plain decimal in [0, 1]
        AND pg_catalog.jsonb_typeof(x.element -> 'confidence') = 'number'
        AND x.element ->> 'confidence' ~ '^(0|1)(\.[0-9]{1,14})?$'
        AND (x.element ->> 'confidence')::float8 <= 1
        -- validity: absent, or RFC 3339 instants (T, Z or an offset) in 1900-9999,
        -- valid_until after valid_from
        AND (e.validity IS NULL
             OR (pg_catalog.jsonb_typeof(e.validity) = 'object'
                 AND (e.validity - ARRAY['valid_from', 'valid_until']) = '{}'::jsonb
                 AND NOT EXISTS (
                   SELECT 1 FROM pg_catalog.unnest(ARRAY[e.validity -> 'valid_from',
                                                         e.validity -> 'valid_until']) t(v)
                   WHERE pg_catalog.jsonb_typeof(coalesce(t.v, 'null')) <> 'null'
                     AND NOT CASE
                       WHEN pg_catalog.jsonb_typeof(t.v) = 'string'
                        AND (t.v #>> '{}') ~ '^(19|[2-9][0-9])[0-9]{2}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})$'
                        AND pg_catalog.pg_input_is_valid(t.v #>> '{}', 'timestamptz')
                       THEN (t.v #>> '{}')::timestamptz >= '1900-01-01 00:00:00+00'
                        AND (t.v #>> '{}')::timestamptz < '10000-01-01 00:00:00+00'
                       ELSE false END)
                 AND (e.validity ->> 'valid_until' IS NULL
                      OR (e.validity ->> 'valid_until')::timestamptz
                         > coalesce((e.validity ->> 'valid_from')::timestamptz, pg_catalog.now()))))
        AND pg_catalog.jsonb_typeof(coalesce(x.element -> 'retention_class', 'null')) IN ('null', 'string')
        AND (coalesce(x.element ->> 'retention_class', 'durable') IN ('operational', 'durable', 'regulated')
             OR (x.element ->> 'retention_class' = 'audit' AND e.tier = 'episodic'))
        -- labels: plain ASCII identifiers (nothing to escape), at most 200 bytes in all
        AND (pg_catalog.jsonb_typeof(coalesce(x.element -> 'compliance_labels', 'null')) = 'null'
             OR x.element -> 'compliance_labels' = '[]'
             OR (pg_catalog.jsonb_typeof(x.element -> 'compliance_labels') = 'array'
                 AND pg_catalog.octet_length((x.element -> 'compliance_labels')::text) <= 200
                 AND (x.element -> 'compliance_labels')::text
                     ~ '^\["[A-Za-z0-9._:/@+=-]+"(, "[A-Za-z0-9._:/@+=-]+")*\]$'))
        AND (pg_catalog.jsonb_typeof(coalesce(x.element -> 'version', 'null')) = 'null'
             OR (pg_catalog.jsonb_typeof(x.element -> 'version') = 'string'
                 AND x.element ->> 'version' ~ '^(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})$'))
        AS plain
      FROM pg_catalog.jsonb_array_elements(p_envelopes) WITH ORDINALITY AS x(element, ord)
      CROSS JOIN LATERAL (
        SELECT x.element ->> 'tier', x.element -> 'scope', x.element -> 'scope' ->> 'visibility',
               x.element -> 'provenance', x.element -> 'content',
               (x.element -> 'content')::text, x.element -> 'validity_interval',
               x.element -> 'derived_from', x.element ->> 'business_instance_id'
        OFFSET 0
      ) AS e(tier, scope, visibility, prov, content, content_text, validity, derived, instance)
      OFFSET 0   -- computed once, in this order: the test guards the casts that read the values
    ) s
    WHERE s.plain
    OFFSET 0
  ) r;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.propose_many: propose a batch of envelopes inside the caller's run. Each
-- envelope is parsed and judged as propose does it, no writes: those of the common, valid
-- shape by one query (fabric._judge_envelopes), the others one by one; idempotency keys
-- are resolved in order, against the table and the earlier envelopes of the batch, exactly
-- as the same calls one by one would; then the proposals and their events are written by
-- one statement each. The call's own errors (role, run, the array) fail the whole batch;
-- an envelope's error is answered at its position ({"status": "error", "sqlstate",
-- "reason", "hint"}) and writes nothing, while the other envelopes are filed.
CREATE OR REPLACE FUNCTION fabric_api.propose_many(p_envelopes jsonb, p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_run fabric.runs;
  v_agent fabric.agents;
  v_count integer;
  v_entry record;
  v_rows fabric.proposals[];
  v_answers jsonb[];
  v_new boolean[];
  v_judged boolean[];
  v_new_rows fabric.proposals[] := '{}';
  v_keys jsonb;
  v_first jsonb;
  v_key text;
  v_release uuid[] := '{}';
  v_p fabric.proposals;
  v_earlier fabric.proposals;
  v_inserted integer;
  v_state text;
  v_message text;
  v_hint text;
  v_citus boolean := coalesce(pg_catalog.current_setting('citus.propagate_set_commands', true), '') = 'local';
BEGIN
  -- The denial events are written for a batch that is answered (an array of 1-1000).
  v_count := CASE WHEN pg_catalog.jsonb_typeof(p_envelopes) = 'array'
                  THEN pg_catalog.jsonb_array_length(p_envelopes) END;
  v_entry := fabric._propose_entry(p_run_id, CASE WHEN v_count <= 1000 THEN v_count ELSE 0 END);
  v_run := v_entry.run;
  v_agent := v_entry.agent;
  IF p_envelopes IS NULL OR pg_catalog.jsonb_typeof(p_envelopes) <> 'array' THEN
    PERFORM fabric._bad_envelope('envelopes must be a JSON array of proposal envelopes',
                                 'one envelope per element, at most 1000 (docs/sql.md)');
  END IF;
  IF v_count > 1000 THEN
    PERFORM fabric._raise_rule('program_limit_exceeded',
      'a propose_many call takes at most 1000 envelopes', 'split the batch');
  END IF;
  IF v_count = 0 THEN
    RETURN '[]'::jsonb;
  END IF;
  -- Tool authorization comes first, as in propose: every position is denied.
  IF v_entry.denial IS NOT NULL THEN
    RETURN (SELECT pg_catalog.jsonb_agg(v_entry.denial) FROM pg_catalog.generate_series(1, v_count));
  END IF;

  -- Parse and judge each envelope: those of the common, valid shape by one query
  -- (fabric._judge_envelopes), the others one by one; an error is its position's answer.
  IF v_citus THEN
    -- Citus plans no query of the batch that reads the tenant's records and instances in
    -- correlated subqueries (fabric._judge_envelopes): each envelope is judged alone.
    v_rows := pg_catalog.array_fill(NULL::fabric.proposals, ARRAY[v_count]);
    v_judged := pg_catalog.array_fill(false, ARRAY[v_count]);
  ELSE
    SELECT pg_catalog.array_agg(j.o_row ORDER BY g.i), pg_catalog.array_agg(j.o_position IS NOT NULL ORDER BY g.i)
    INTO v_rows, v_judged
    FROM pg_catalog.generate_series(1, v_count) AS g(i)
    LEFT JOIN fabric._judge_envelopes(p_envelopes, v_run, v_agent) j ON j.o_position = g.i;
  END IF;
  v_answers := pg_catalog.array_fill(NULL::jsonb, ARRAY[v_count]);
  v_new := pg_catalog.array_fill(false, ARRAY[v_count]);
  FOR i IN 1 .. v_count LOOP
    CONTINUE WHEN v_judged[i];
    BEGIN
      v_rows[i] := fabric._judge_envelope(v_run, v_agent, p_envelopes -> (i - 1));
    EXCEPTION
      WHEN data_exception OR program_limit_exceeded OR insufficient_privilege
           OR integrity_constraint_violation THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                v_hint = PG_EXCEPTION_HINT;
        v_answers[i] := pg_catalog.jsonb_build_object('proposal_id', NULL, 'status', 'error',
          'sqlstate', v_state, 'reason', v_message, 'hint', NULLIF(v_hint, ''));
    END;
  END LOOP;

  -- Idempotency keys, in order: the proposals that hold them now, then the batch's own.
  SELECT pg_catalog.jsonb_object_agg(p.source_event_id || pg_catalog.chr(31) || p.content_hash,
           pg_catalog.jsonb_build_object('proposal_id', p.proposal_id, 'status', p.status,
             'reason', p.reason, 'request_hash', p.request_hash, 'memory_id', p.memory_id,
             'scope_differs', p.content IS NOT NULL
                              AND (p.subject_id IS DISTINCT FROM v_run.subject_id
                                   OR p.session_id IS DISTINCT FROM v_run.session_id)))
  INTO v_keys
  FROM (SELECT DISTINCT r.source_event_id, r.content_hash FROM pg_catalog.unnest(v_rows) r
        WHERE r.source_event_id IS NOT NULL) k
  -- one index probe per key of the batch, not a scan of the agent's proposals
  CROSS JOIN LATERAL (
    SELECT p0.* FROM fabric.proposals p0
    WHERE p0.tenant_id = v_run.tenant_id AND p0.proposed_by = v_run.agent_id
      AND p0.source_event_id = k.source_event_id AND p0.content_hash = k.content_hash
      AND p0.request_hash IS NOT NULL
    OFFSET 0) p;
  v_keys := coalesce(v_keys, '{}');
  IF v_keys = '{}'::jsonb
     AND NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(v_answers) a WHERE a IS NOT NULL)
     AND (SELECT pg_catalog.count(*) = pg_catalog.count(DISTINCT (r.source_event_id, r.content_hash))
          FROM pg_catalog.unnest(v_rows) r WHERE r.source_event_id IS NOT NULL) THEN
    -- The common case, what the loop below concludes for it: every envelope judged, no
    -- key held by a proposal or repeated in the batch, so each position files a new one.
    v_new_rows := v_rows;
    SELECT pg_catalog.array_agg(pg_catalog.jsonb_build_object('proposal_id', r.proposal_id,
             'status', r.status, 'reason', r.reason) ORDER BY r.ordinality)
    INTO v_answers FROM pg_catalog.unnest(v_rows) WITH ORDINALITY AS r;
  ELSE
    FOR i IN 1 .. v_count LOOP
      CONTINUE WHEN v_answers[i] IS NOT NULL;
      v_p := v_rows[i];
      IF v_p.source_event_id IS NOT NULL THEN
        v_key := v_p.source_event_id || pg_catalog.chr(31) || v_p.content_hash;
        v_first := v_keys -> v_key;
        IF v_first IS NOT NULL THEN
          IF v_first ->> 'status' = 'rejected' AND v_first ->> 'request_hash' <> v_p.request_hash THEN
            -- a corrected envelope: the rejected proposal gives up the key
            IF v_first ? 'position' THEN
              v_earlier := v_rows[(v_first ->> 'position')::integer];
              v_earlier.request_hash := NULL;
              v_rows[(v_first ->> 'position')::integer] := v_earlier;
            ELSE
              v_release := v_release || (v_first ->> 'proposal_id')::uuid;
            END IF;
          ELSIF v_first ->> 'request_hash' <> v_p.request_hash
                OR (v_first ->> 'scope_differs')::boolean THEN
            BEGIN
              PERFORM fabric._key_reused();
            EXCEPTION WHEN unique_violation THEN
              GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                      v_hint = PG_EXCEPTION_HINT;
              v_answers[i] := pg_catalog.jsonb_build_object('proposal_id', NULL,
                'status', 'error', 'sqlstate', v_state, 'reason', v_message, 'hint', v_hint);
            END;
            CONTINUE;
          ELSE
            v_answers[i] := pg_catalog.jsonb_build_object('proposal_id', v_first -> 'proposal_id',
                'status', v_first -> 'status', 'reason', v_first -> 'reason', 'replayed', true)
              || CASE WHEN coalesce(v_first -> 'memory_id', 'null') = 'null' THEN '{}'::jsonb
                      ELSE pg_catalog.jsonb_build_object('memory_id', v_first -> 'memory_id') END;
            CONTINUE;
          END IF;
        END IF;
        v_keys := v_keys || pg_catalog.jsonb_build_object(v_key, pg_catalog.jsonb_build_object(
          'proposal_id', v_p.proposal_id, 'status', v_p.status, 'reason', v_p.reason,
          'request_hash', v_p.request_hash, 'scope_differs', false, 'position', i));
      END IF;
      v_new[i] := true;
      v_answers[i] := pg_catalog.jsonb_build_object('proposal_id', v_p.proposal_id,
                                                    'status', v_p.status, 'reason', v_p.reason);
    END LOOP;
    FOR i IN 1 .. v_count LOOP
      IF v_new[i] THEN
        v_new_rows := v_new_rows || v_rows[i];
      END IF;
    END LOOP;
  END IF;

  -- The writes: one statement per table.
  IF pg_catalog.cardinality(v_release) > 0 THEN
    UPDATE fabric.proposals p SET request_hash = NULL
    WHERE p.tenant_id = v_run.tenant_id AND p.proposal_id = ANY (v_release);
  END IF;
  WITH filed AS (
    INSERT INTO fabric.proposals (tenant_id, proposal_id, run_id, proposed_by, status, reason,
      tier, visibility, subject_id, agent_id, session_id, business_instance_id, content,
      content_hash, source_event_id, correlation_id, causation_id, formation_method,
      derived_from, supersedes, confidence, valid_from, valid_until, retention_class,
      compliance_labels, version, request_hash)
    SELECT r.tenant_id, r.proposal_id, r.run_id, r.proposed_by, r.status, r.reason, r.tier,
      r.visibility, r.subject_id, r.agent_id, r.session_id, r.business_instance_id, r.content,
      r.content_hash, r.source_event_id, r.correlation_id, r.causation_id, r.formation_method,
      r.derived_from, r.supersedes, r.confidence, r.valid_from, r.valid_until,
      r.retention_class, r.compliance_labels, r.version, r.request_hash
    FROM pg_catalog.unnest(v_new_rows) WITH ORDINALITY AS r
    ORDER BY r.ordinality
    ON CONFLICT (tenant_id, proposed_by, source_event_id, content_hash) WHERE request_hash IS NOT NULL
    DO NOTHING
    RETURNING 1
  )
  SELECT pg_catalog.count(*) INTO v_inserted FROM filed;
  IF v_inserted < pg_catalog.cardinality(v_new_rows) THEN
    PERFORM fabric._raise_rule('serialization_failure',
      'a concurrent proposal took an idempotency key of this batch first',
      'retry the call: the batch then answers that proposal as a replay');
  END IF;
  IF v_citus THEN  -- a cluster's lookup, as propose notes its proposal
    PERFORM fabric._note_tenants('proposal',
      ARRAY(SELECT r.proposal_id FROM pg_catalog.unnest(v_new_rows) r), v_run.tenant_id);
  END IF;
  PERFORM fabric._append_events(ARRAY(  -- rows of fabric.shard_events, in its column order
    SELECT ROW(r.tenant_id, fabric._event_id(), NULL, 'memory.proposal.' || r.status,
               r.correlation_id, r.causation_id, fabric._setting('fabric.actor'),
               fabric._setting('fabric.run_id')::uuid, NULL, r.proposal_id,
               pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('tier', r.tier,
                 'visibility', r.visibility, 'content_hash', r.content_hash,
                 'reason', r.reason)))::fabric.shard_events
    FROM pg_catalog.unnest(v_new_rows) WITH ORDINALITY AS r
    ORDER BY r.ordinality));

  RETURN pg_catalog.to_jsonb(v_answers);
END $$;
COMMENT ON FUNCTION fabric_api.propose_many(jsonb, uuid) IS
  'Propose up to 1000 envelopes inside your open run, set-based; returns one answer per '
  'envelope, in order, exactly as propose would give it ({"proposal_id","status","reason"}, '
  'with "replayed": true for a repeat, also of an earlier envelope of the same batch). An '
  'envelope propose would refuse with an error is answered at its position as '
  '{"proposal_id": null, "status": "error", "sqlstate", "reason", "hint"} and the others are '
  'filed; errors of the call itself (role, run, not an array, over 1000) fail the batch. '
  'Agents only. Example: SELECT fabric_api.propose_many(''[{"tier":"episodic",'
  '"scope":{"tenant_id":"acme","visibility":"subject"},"content":{"text":"asked for '
  'invoices in EUR"},"provenance":{"source_event_id":"evt-1","formation_method":'
  '"extraction"},"confidence":0.9}]'', ''<run_id>'');';
