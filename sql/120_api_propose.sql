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
    RAISE EXCEPTION USING ERRCODE = 'invalid_datetime_format',
      MESSAGE = pg_catalog.format('%s must be an RFC 3339 timestamp with an offset', p_field),
      HINT = 'e.g. "2026-08-16T10:00:00Z"; now, yesterday and infinity are refused';
  END IF;
  IF pg_catalog.substr(v_text, 12, 2) > '23' OR pg_catalog.substr(v_text, 18, 2) > '59' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_datetime_format',
      MESSAGE = pg_catalog.format('%s has an hour above 23 or a second above 59', p_field),
      HINT = 'write 24:00:00 as 00:00:00 of the next day; leap seconds (:60) are not represented';
  END IF;
  v_at := v_text::timestamptz;
  IF v_at < '1900-01-01 00:00:00+00' OR v_at >= '10000-01-01 00:00:00+00' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_datetime_format',
      MESSAGE = pg_catalog.format('%s must lie in the years 1900 to 9999 (UTC)', p_field),
      HINT = 'open-ended validity is valid_until null, not a far-future date';
  END IF;
  RETURN v_at;
EXCEPTION
  WHEN datetime_field_overflow OR invalid_datetime_format
       OR invalid_time_zone_displacement_value THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_datetime_format',
      MESSAGE = pg_catalog.format('%s must be an RFC 3339 timestamp with an offset', p_field),
      HINT = 'e.g. "2026-08-16T10:00:00Z"; the date must exist';
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
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = pg_catalog.format('%s must be a number that a double represents exactly', p_field),
      HINT = 'send the shortest decimal of a double, e.g. 0.9; at most 17 significant digits, '
             'nothing below 5e-324';
  END IF;
  RETURN (p_value)::numeric::double precision;
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
    RAISE EXCEPTION USING ERRCODE = 'unique_violation',
      MESSAGE = 'idempotency key reused: this agent already proposed this content for this '
                'source event, with a different envelope or run scope',
      HINT = 'resend the first envelope unchanged (in a run of the same subject and session) '
             'to get its status, or propose under a new provenance.source_event_id';
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
      'content', '{"type": "object", "description": "the memory itself, a JSON object such as {\"assertion\": \"prefers invoices in EUR\"}; at most 65536 bytes, 32 levels deep"}'::jsonb,
      'content_hash', '{"anyOf": [{"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}, {"type": "null"}], "description": "omit: the fabric computes it (sha256 of the RFC 8785 form of content)"}'::jsonb,
      'provenance', pg_catalog.jsonb_build_object('type', 'object', 'additionalProperties', false,
        'required', '["formation_method"]'::jsonb,
        'properties', pg_catalog.jsonb_build_object(
          'source_event_id', v_ident_or_null || '{"description": "the event that caused this memory; required for the proposal to be validated"}'::jsonb,
          'correlation_id', v_ident_or_null,
          'causation_id', v_ident_or_null,
          'formation_method', '{"enum": ["extraction", "declaration", "consolidation", "reflection", "import"], "description": "agents propose extraction, declaration or import"}'::jsonb)),
      'derived_from', pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(
        pg_catalog.jsonb_build_object('type', 'array', 'maxItems', 256,
          'items', pg_catalog.jsonb_build_object('type', 'string', 'pattern', v_uuid)),
        '{"type": "null"}'::jsonb), 'description', 'memory ids this memory was derived from'),
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
-- fabric_api.propose: validate an envelope inside the caller's run and file a proposal.
CREATE OR REPLACE FUNCTION fabric_api.propose(p_envelope jsonb, p_run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_run fabric.runs;
  v_agent fabric.agents;
  v_missing text[];
  v_scope jsonb;
  v_prov jsonb;
  v_validity jsonb;
  v_tier text;
  v_visibility text;
  v_tenant text;
  v_subject text;
  v_session text;
  v_scope_agent text;
  v_content jsonb;
  v_hash text;
  v_supplied_hash text;
  v_source_event text;
  v_correlation text;
  v_causation text;
  v_method text;
  v_derived uuid[] := '{}';
  v_supersedes jsonb;
  v_confidence double precision;
  v_valid_from timestamptz;
  v_valid_until timestamptz;
  v_retention text;
  v_labels text[];
  v_version text;
  v_instance text;
  v_item jsonb;
  v_reason text;
  v_given_from timestamptz;
  v_request_hash text;
  v_answer jsonb;
  v_proposal_id uuid := pg_catalog.gen_random_uuid();
BEGIN
  PERFORM fabric._reset_context();
  IF pg_catalog.pg_has_role(session_user, 'fabric_committer', 'MEMBER') THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = 'committers cannot propose: no agent both proposes and commits durable memory',
      HINT = 'propose with an agent login that is not a member of fabric_committer';
  END IF;
  v_run := fabric._enter_run(p_run_id);
  SELECT * INTO v_agent FROM fabric.agents a WHERE a.agent_id = v_run.agent_id;

  -- Three-layer tool authorization: a refusal is an answer, not an error.
  v_missing := fabric._tool_denial(v_run, 'tool:memory-propose');
  IF pg_catalog.cardinality(v_missing) > 0 THEN
    v_reason := 'tool:memory-propose is not authorized: missing from '
                || pg_catalog.array_to_string(v_missing, ', ');
    PERFORM fabric._emit('agent.tool.unauthorized', v_run.tenant_id, p_payload =>
      pg_catalog.jsonb_build_object('tool', 'tool:memory-propose', 'agent_id', v_run.agent_id,
                                    'missing_layers', v_missing));
    RETURN pg_catalog.jsonb_build_object('proposal_id', NULL, 'status', 'denied',
                                         'reason', v_reason);
  END IF;

  -- Structure: errors, nothing written.
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

  v_tier := fabric._envelope_text(p_envelope -> 'tier', 'tier');
  IF v_tier IS NULL OR v_tier NOT IN ('episodic', 'semantic', 'procedural', 'profile', 'relational') THEN
    PERFORM fabric._bad_envelope('tier must be one of episodic, semantic, procedural, profile, relational',
      'working memory never enters the fabric; graph and temporal are not proposed');
  END IF;

  v_scope := p_envelope -> 'scope';
  IF v_scope IS NULL OR pg_catalog.jsonb_typeof(v_scope) <> 'object'
     OR (v_scope - ARRAY['tenant_id', 'subject_id', 'agent_id', 'session_id', 'visibility']) <> '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('scope must be an object of tenant_id, subject_id, agent_id, session_id, visibility',
      'tenant_id comes first and is required');
  END IF;
  v_tenant := fabric._envelope_text(v_scope -> 'tenant_id', 'scope.tenant_id');
  v_subject := fabric._envelope_text(v_scope -> 'subject_id', 'scope.subject_id');
  v_session := fabric._envelope_text(v_scope -> 'session_id', 'scope.session_id');
  v_scope_agent := fabric._envelope_text(v_scope -> 'agent_id', 'scope.agent_id');
  v_visibility := fabric._envelope_text(v_scope -> 'visibility', 'scope.visibility');
  IF v_tenant IS NULL THEN
    PERFORM fabric._bad_envelope('scope.tenant_id is required',
                                 'name the tenant of the run; it always comes first');
  END IF;
  IF v_visibility IS NULL OR v_visibility NOT IN ('session', 'agent', 'subject', 'tenant') THEN
    PERFORM fabric._bad_envelope('scope.visibility must be one of session, agent, subject, tenant',
                                 'there is no cross-tenant visibility');
  END IF;

  v_content := p_envelope -> 'content';
  IF v_content IS NULL OR pg_catalog.jsonb_typeof(v_content) <> 'object' THEN
    PERFORM fabric._bad_envelope('content must be a JSON object', 'e.g. {"assertion": "..."}');
  END IF;
  IF pg_catalog.octet_length(v_content::text) > 65536 THEN
    RAISE EXCEPTION USING ERRCODE = 'program_limit_exceeded',
      MESSAGE = 'content exceeds 65536 bytes', HINT = 'store large artefacts elsewhere and reference them';
  END IF;
  IF fabric._jsonb_depth(v_content) > 32 THEN
    RAISE EXCEPTION USING ERRCODE = 'program_limit_exceeded',
      MESSAGE = 'content nests deeper than 32 levels', HINT = 'flatten the content';
  END IF;
  v_hash := fabric.content_hash(v_content);         -- refuses numbers that are not doubles
  IF p_envelope ? 'content_hash' AND pg_catalog.jsonb_typeof(p_envelope -> 'content_hash') <> 'null' THEN
    v_supplied_hash := CASE WHEN pg_catalog.jsonb_typeof(p_envelope -> 'content_hash') = 'string'
                            THEN p_envelope ->> 'content_hash' END;
    IF v_supplied_hash IS DISTINCT FROM v_hash THEN
      PERFORM fabric._bad_envelope('content_hash does not match the content',
        'omit content_hash, or send sha256: + hex SHA-256 of the RFC 8785 form of the content');
    END IF;
  END IF;

  v_prov := p_envelope -> 'provenance';
  IF v_prov IS NULL OR pg_catalog.jsonb_typeof(v_prov) <> 'object'
     OR (v_prov - ARRAY['source_event_id', 'correlation_id', 'causation_id', 'formation_method']) <> '{}'::jsonb THEN
    PERFORM fabric._bad_envelope('provenance must be an object of source_event_id, correlation_id, causation_id, formation_method',
      'formed_by is set by the committer');
  END IF;
  v_source_event := fabric._envelope_text(v_prov -> 'source_event_id', 'provenance.source_event_id');
  v_correlation := fabric._envelope_text(v_prov -> 'correlation_id', 'provenance.correlation_id');
  v_causation := fabric._envelope_text(v_prov -> 'causation_id', 'provenance.causation_id');
  v_method := fabric._envelope_text(v_prov -> 'formation_method', 'provenance.formation_method');
  IF v_method IS NULL OR v_method NOT IN ('extraction', 'declaration', 'consolidation', 'reflection', 'import') THEN
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
      v_derived := v_derived || (v_item #>> '{}')::uuid;
    END LOOP;
    SELECT pg_catalog.array_agg(DISTINCT d ORDER BY d) INTO v_derived FROM pg_catalog.unnest(v_derived) d;
    v_derived := coalesce(v_derived, '{}');
  END IF;
  v_supersedes := p_envelope -> 'supersedes';
  IF v_supersedes IS NOT NULL AND pg_catalog.jsonb_typeof(v_supersedes) NOT IN ('null', 'string') THEN
    PERFORM fabric._bad_envelope('supersedes must be a memory id or null', 'memory ids are UUIDs');
  END IF;

  IF pg_catalog.jsonb_typeof(p_envelope -> 'confidence') IS DISTINCT FROM 'number' THEN
    PERFORM fabric._bad_envelope('confidence is required and must be a number', 'a number in [0, 1]');
  END IF;
  v_confidence := fabric._envelope_double(p_envelope -> 'confidence', 'confidence');

  v_validity := p_envelope -> 'validity_interval';
  IF v_validity IS NOT NULL AND (pg_catalog.jsonb_typeof(v_validity) <> 'object'
     OR (v_validity - ARRAY['valid_from', 'valid_until']) <> '{}'::jsonb) THEN
    PERFORM fabric._bad_envelope('validity_interval must be an object of valid_from, valid_until',
                                 'valid_until null means open-ended');
  END IF;
  v_given_from := fabric._envelope_timestamp(v_validity -> 'valid_from', 'validity_interval.valid_from');
  v_valid_from := coalesce(v_given_from, pg_catalog.now());
  v_valid_until := fabric._envelope_timestamp(v_validity -> 'valid_until', 'validity_interval.valid_until');

  v_retention := coalesce(fabric._envelope_text(p_envelope -> 'retention_class', 'retention_class'), 'durable');
  IF v_retention NOT IN ('ephemeral', 'operational', 'durable', 'audit', 'regulated') THEN
    PERFORM fabric._bad_envelope('retention_class must be one of ephemeral, operational, durable, audit, regulated',
                                 'the default is durable');
  END IF;
  v_labels := fabric._envelope_text_array(p_envelope -> 'compliance_labels', 'compliance_labels');
  v_version := coalesce(fabric._envelope_text(p_envelope -> 'version', 'version', 64), '1.0.0');
  IF EXISTS (SELECT 1 FROM pg_catalog.regexp_split_to_table(
               pg_catalog.split_part(pg_catalog.split_part(v_version, '+', 1), '-', 1), '\.') c
             WHERE c ~ '^[0-9]+$'
               AND CASE WHEN pg_catalog.length(c) > 10 THEN true ELSE c::bigint > 2147483647 END) THEN
    PERFORM fabric._bad_envelope('version components must be at most 2147483647',
                                 'MAJOR.MINOR.PATCH, e.g. 1.4.2');
  END IF;
  v_instance := fabric._envelope_text(p_envelope -> 'business_instance_id', 'business_instance_id');

  -- Scope comes from the run; a request can only narrow it (errors, nothing written).
  IF v_tenant <> v_run.tenant_id THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = 'scope.tenant_id is not the tenant of the run',
      HINT = 'a run acts in exactly one tenant; there is no cross-tenant write';
  END IF;
  IF v_subject IS DISTINCT FROM v_run.subject_id AND v_subject IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = 'scope.subject_id is not the subject of the run',
      HINT = 'omit subject_id to use the run''s subject';
  END IF;
  IF v_session IS DISTINCT FROM v_run.session_id AND v_session IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = 'scope.session_id is not the session of the run',
      HINT = 'omit session_id to use the run''s session';
  END IF;
  IF v_scope_agent IS NOT NULL AND v_scope_agent <> v_run.agent_id THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = 'scope.agent_id is neither the calling agent nor null',
      HINT = 'an agent proposes only for itself';
  END IF;
  IF v_instance IS NOT NULL AND NOT EXISTS (
       SELECT 1 FROM fabric.instance_config c
       WHERE c.tenant_id = v_run.tenant_id AND c.business_instance_id = v_instance) THEN
    PERFORM fabric._bad_envelope('business_instance_id names no configured instance of the tenant',
      'omit it for the tenant''s default instance, or configure the instance first '
      '(fabric_api.configure_instance)');
  END IF;
  v_subject := v_run.subject_id;
  v_session := v_run.session_id;
  IF v_visibility = 'agent' THEN
    v_scope_agent := v_run.agent_id;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_catalog.unnest(v_derived) d
             WHERE NOT EXISTS (SELECT 1 FROM fabric.memory_records m
                               WHERE m.tenant_id = v_run.tenant_id AND m.memory_id = d)) THEN
    RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
      MESSAGE = 'derived_from names a memory id that is not a record of this tenant',
      HINT = 'derive only from committed records of the run''s tenant';
  END IF;

  -- Governance: a rejected proposal with its reason.
  v_reason := CASE
    WHEN v_source_event IS NULL THEN
      'provenance.source_event_id is required: memory never enters the fabric uncaused (R-PROP-2)'
    WHEN v_method NOT IN ('extraction', 'declaration', 'import') THEN
      'agents propose only extraction, declaration or import; consolidation and reflection are formed from os-agt-011 recommendations'
    WHEN v_tier = 'relational' THEN
      'agents never propose into the relational tier; it is reached only by an approved promotion'
    WHEN v_supersedes IS NOT NULL AND pg_catalog.jsonb_typeof(v_supersedes) <> 'null' THEN
      'agents never propose with supersedes; supersession is a committer action'
    WHEN NOT fabric._profile_allows(v_agent.memory_profile, 'propose_scope', 'tiers', v_tier) THEN
      pg_catalog.format('tier %s is outside the agent''s memory_profile.propose_scope.tiers', v_tier)
    WHEN NOT fabric._profile_allows(v_agent.memory_profile, 'propose_scope', 'visibility', v_visibility) THEN
      pg_catalog.format('visibility %s is outside the agent''s memory_profile.propose_scope.visibility', v_visibility)
    WHEN v_visibility = 'session' AND v_session IS NULL THEN
      'visibility session needs a session: the run has none'
    WHEN v_visibility = 'subject' AND v_subject IS NULL THEN
      'visibility subject needs a subject: the run has none'
    WHEN v_retention = 'ephemeral' THEN
      'ephemeral retention belongs to the working tier, which never enters the fabric'
    WHEN v_retention = 'audit' AND v_tier <> 'episodic' THEN
      'audit retention is only for episodic records'
    WHEN v_confidence IS NULL OR NOT (v_confidence BETWEEN 0 AND 1) THEN
      'confidence must lie in [0, 1]'
    WHEN v_valid_until IS NOT NULL AND v_valid_until <= v_valid_from THEN
      'validity_interval.valid_until must be after valid_from'
    WHEN v_version !~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$' THEN
      'version must be SemVer (MAJOR.MINOR.PATCH)'
    WHEN v_tier = 'semantic' AND NOT fabric._ids_have_episodic_ancestor(v_run.tenant_id, v_derived) THEN
      'semantic record needs at least one episodic source: pass derived_from with the episodes it was extracted from'
  END;

  -- Idempotency: the key is (tenant, agent, source event, content hash); the request hash
  -- covers the rest of what was asked (subject and session are compared as stored, so no
  -- digest of them outlives an erasure). An omitted valid_from is hashed as omitted.
  v_request_hash := 'sha256:' || pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
    pg_catalog.jsonb_build_object('tier', v_tier, 'visibility', v_visibility,
      'agent_id', v_scope_agent, 'business_instance_id', v_instance,
      'correlation_id', v_correlation, 'causation_id', v_causation, 'formation_method', v_method,
      'derived_from', v_derived, 'supersedes', v_supersedes,
      'confidence', pg_catalog.trim_scale((p_envelope -> 'confidence')::numeric),
      'valid_from', pg_catalog.extract('epoch', v_given_from),
      'valid_until', pg_catalog.extract('epoch', v_valid_until),
      'retention_class', v_retention, 'compliance_labels', v_labels, 'version', v_version
    )::text, 'UTF8')), 'hex');
  IF v_source_event IS NOT NULL THEN
    v_answer := fabric._replayed_proposal(v_run.tenant_id, v_run.agent_id, v_source_event, v_hash,
                                          v_request_hash, v_subject, v_session);
    IF v_answer IS NOT NULL THEN
      RETURN v_answer;
    END IF;
    UPDATE fabric.proposals p SET request_hash = NULL
    WHERE p.tenant_id = v_run.tenant_id AND p.proposed_by = v_run.agent_id
      AND p.source_event_id = v_source_event AND p.content_hash = v_hash
      AND p.request_hash IS NOT NULL AND p.status = 'rejected';
  END IF;

  INSERT INTO fabric.proposals (tenant_id, proposal_id, run_id, proposed_by, status, reason, tier,
    visibility, subject_id, agent_id, session_id, business_instance_id, content, content_hash,
    source_event_id, correlation_id, causation_id, formation_method, derived_from, supersedes,
    confidence, valid_from, valid_until, retention_class, compliance_labels, version, request_hash)
  VALUES (v_run.tenant_id, v_proposal_id, v_run.run_id, v_run.agent_id,
    CASE WHEN v_reason IS NULL THEN 'validated' ELSE 'rejected' END, v_reason, v_tier,
    v_visibility, v_subject, v_scope_agent, v_session, v_instance, v_content, v_hash,
    v_source_event, v_correlation, v_causation, v_method, v_derived,
    CASE WHEN pg_catalog.jsonb_typeof(v_supersedes) = 'string'
              AND (v_supersedes #>> '{}') ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
         THEN (v_supersedes #>> '{}')::uuid END,
    v_confidence, v_valid_from, v_valid_until, v_retention, v_labels, v_version, v_request_hash)
  ON CONFLICT (tenant_id, proposed_by, source_event_id, content_hash) WHERE request_hash IS NOT NULL
  DO NOTHING;
  IF NOT FOUND THEN
    -- A concurrent twin took the key first; its transaction has committed by now.
    v_answer := fabric._replayed_proposal(v_run.tenant_id, v_run.agent_id, v_source_event, v_hash,
                                          v_request_hash, v_subject, v_session);
    IF v_answer IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
        MESSAGE = 'a concurrent proposal with the same idempotency key is not visible yet',
        HINT = 'retry the call';
    END IF;
    RETURN v_answer;
  END IF;

  PERFORM fabric._emit(
    CASE WHEN v_reason IS NULL THEN 'memory.proposal.validated' ELSE 'memory.proposal.rejected' END,
    v_run.tenant_id, v_correlation, v_causation, NULL, v_proposal_id,
    pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('tier', v_tier,
      'visibility', v_visibility, 'content_hash', v_hash, 'reason', v_reason)));

  RETURN pg_catalog.jsonb_build_object('proposal_id', v_proposal_id,
    'status', CASE WHEN v_reason IS NULL THEN 'validated' ELSE 'rejected' END,
    'reason', v_reason);
END $$;
COMMENT ON FUNCTION fabric_api.propose(jsonb, uuid) IS
  'Propose a memory inside your open run; returns {"proposal_id","status","reason"} with status '
  'validated, rejected or denied. Idempotent on (tenant, agent, source_event_id, content_hash): '
  'a repeat returns the first proposal with "replayed": true. Agents only. '
  'Example: SELECT fabric_api.propose('
  '''{"tier":"episodic","scope":{"tenant_id":"acme","visibility":"subject"},'
  '"content":{"text":"asked for invoices in EUR"},"provenance":{"source_event_id":"evt-1",'
  '"formation_method":"extraction"},"confidence":0.9}'', ''<run_id>'');';
