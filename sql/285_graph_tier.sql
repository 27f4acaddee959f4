-- The graph tier's sources in PostgreSQL: agent lineage links (which agent caused or
-- contributed to which outcome), POLE+O entities and the records that mention them. The
-- graph projection (py/memfabric/graph.py) is rebuilt from these rows alone; names stay
-- here, the graph holds a person only by an entity id or its subject's pseudonym.

-- ---------------------------------------------------------------------------------------
-- fabric._entity_types: POLE+O, the entity types a record may declare.
CREATE OR REPLACE FUNCTION fabric._entity_types()
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN ARRAY['person', 'organization', 'location', 'event', 'object'];
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._graph_walk_kinds: the edge kinds a graph recall's walk may follow from the
-- records it reached (recall's expand.via): MENTIONS (the records mentioning the entities
-- they mention), DERIVED_FROM and SUPERSEDES (the records linked either way) and INFLUENCED
-- (the other outcomes of the agents that influenced them).
CREATE OR REPLACE FUNCTION fabric._graph_walk_kinds()
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN ARRAY['MENTIONS', 'DERIVED_FROM', 'SUPERSEDES', 'INFLUENCED'];
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._entity_name_key: the key that deduplicates entities by name: NFKC, trimmed,
-- inner whitespace collapsed, lower case ('Acme  GmbH' and 'acme gmbh' are one entity).
CREATE OR REPLACE FUNCTION fabric._entity_name_key(p_name text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN 'name:' || pg_catalog.lower(pg_catalog.regexp_replace(
    pg_catalog.btrim(normalize(p_name, NFKC)), '\s+', ' ', 'g'));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._envelope_entities: content.entities, when present, is a list of at most 50
-- entities {"type", "name", "id"?}: type from POLE+O, a name of 1-200 characters, an
-- optional external id (an identifier). Anything else is a malformed envelope (22023).
CREATE OR REPLACE FUNCTION fabric._envelope_entities(p_entities jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v jsonb;
  v_hint constant text :=
    'e.g. "entities": [{"type": "organization", "name": "Acme GmbH", "id": "crm:4711"}]; '
    'types: person, organization, location, event, object';
BEGIN
  IF pg_catalog.jsonb_typeof(p_entities) <> 'array' OR pg_catalog.jsonb_array_length(p_entities) > 50 THEN
    PERFORM fabric._bad_envelope('content.entities must be a list of at most 50 entities', v_hint);
  END IF;
  FOR v IN SELECT e FROM pg_catalog.jsonb_array_elements(p_entities) e LOOP
    IF pg_catalog.jsonb_typeof(v) <> 'object'
       OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(v) k WHERE k NOT IN ('type', 'name', 'id'))
       OR pg_catalog.jsonb_typeof(v -> 'type') IS DISTINCT FROM 'string'
       OR NOT (v ->> 'type') = ANY (fabric._entity_types())
       OR pg_catalog.jsonb_typeof(v -> 'name') IS DISTINCT FROM 'string'
       OR pg_catalog.length(pg_catalog.btrim(v ->> 'name')) NOT BETWEEN 1 AND 200
       OR (v ? 'id' AND pg_catalog.jsonb_typeof(v -> 'id') <> 'string') THEN
      PERFORM fabric._bad_envelope(
        'each of content.entities is {"type", "name", "id"?} with a POLE+O type and a name '
        'of 1-200 characters', v_hint);
    END IF;
    PERFORM fabric._ident(v ->> 'id', 'content.entities[].id');
  END LOOP;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._records_entities: the deterministic extractor, for many records at once (one
-- query for all the records a statement formed, not one per record). The entities each
-- record's content and subject
-- name, by the record's position (ord, from 1) in the arrays, each with the key that
-- deduplicates it and how it was found: declared in content.entities (keyed by external id,
-- else by name), an @mention in a string of the content (a person, keyed by the handle),
-- and the record's subject (a person, keyed by the subject). rank orders the sources when
-- one entity is found several ways.
CREATE OR REPLACE FUNCTION fabric._records_entities(p_contents jsonb[], p_subject_ids text[])
RETURNS TABLE (ord integer, entity_type text, entity_key text, name text, external_id text,
               subject_id text, source text, rank integer)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- PL/pgSQL keeps the query's plan for the session (a SQL function with a SET clause is
  -- planned again by every statement that calls it)
  RETURN QUERY
  WITH r AS MATERIALIZED (
    SELECT u.ord::integer AS ord, u.content, u.subject_id
    FROM ROWS FROM (pg_catalog.unnest(p_contents), pg_catalog.unnest(p_subject_ids))
         WITH ORDINALITY AS u(content, subject_id, ord)
  )
  SELECT r.ord, d.value ->> 'type',
         CASE WHEN d.value ? 'id' THEN 'id:' || (d.value ->> 'id')
              ELSE fabric._entity_name_key(d.value ->> 'name') END,
         pg_catalog.btrim(d.value ->> 'name'), d.value ->> 'id', NULL::text, 'declared', 1
  FROM r CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(
         CASE WHEN pg_catalog.jsonb_typeof(r.content -> 'entities') = 'array'
              THEN r.content -> 'entities' ELSE '[]' END) d
  UNION ALL
  SELECT r.ord, 'person', 'name:@' || pg_catalog.lower(m[2]), '@' || m[2], NULL, NULL, 'mention', 2
  FROM r CROSS JOIN LATERAL pg_catalog.jsonb_path_query(coalesce(r.content, '{}') - 'entities',
                                   'strict $.** ? (@.type() == "string")') s(v)
  CROSS JOIN LATERAL pg_catalog.regexp_matches(s.v #>> '{}',
    '(^|[^[:alnum:]_@.])@([[:alpha:]][[:alnum:]_]{0,62})', 'g') m
  -- (the expression runs only on strings with an @: its counted repetition is slow to try)
  WHERE pg_catalog.strpos(s.v #>> '{}', '@') > 0
  UNION ALL
  SELECT r.ord, 'person', 'subject:' || r.subject_id, r.subject_id, NULL, r.subject_id, 'subject', 3
  FROM r WHERE r.subject_id IS NOT NULL AND r.content IS NOT NULL;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._record_entities: the extractor for one record (fabric._records_entities).
CREATE OR REPLACE FUNCTION fabric._record_entities(p_content jsonb, p_subject_id text)
RETURNS TABLE (entity_type text, entity_key text, name text, external_id text,
               subject_id text, source text, rank integer)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT x.entity_type, x.entity_key, x.name, x.external_id, x.subject_id, x.source, x.rank
  FROM fabric._records_entities(ARRAY[p_content], ARRAY[p_subject_id]) x
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._subject_entity: the subject's person entity, made when a run names the subject
-- (open_run), in a short transaction of its own: the records of the run find it made, so two
-- commits of a new subject never wait for each other on it (as for its key). Entities named
-- by content are made with the first record naming them; two transactions making the same
-- one meet on its unique key, and the second waits for the first.
CREATE OR REPLACE FUNCTION fabric._subject_entity(p_tenant_id text, p_subject_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF p_subject_id IS NOT NULL THEN
    INSERT INTO fabric.entities (tenant_id, entity_type, entity_key, name, subject_id)
    SELECT p_tenant_id, x.entity_type, x.entity_key, x.name, x.subject_id
    FROM fabric._record_entities('{}', p_subject_id) x
    ON CONFLICT ON CONSTRAINT entities_once_per_key DO NOTHING;
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__mentions: a formed record's entities exist (one row per
-- tenant, type and key: a second record naming one finds it) and the record mentions them,
-- in the transaction that forms it. Two transactions making the same entity meet on its
-- unique key; the second waits, and its next statement sees the first's row.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__mentions()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_formed jsonb;
  v_m record;
  v_tenants text[];
  v_ids uuid[];
  v_contents jsonb[];
  v_subjects text[];
  v_x_ord integer[];
  v_x_type text[];
  v_x_key text[];
  v_x_name text[];
  v_x_external text[];
  v_x_subject text[];
  v_x_source text[];
  v_x_rank integer[];
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: this runs on the tenant's shard, where a statement on another distributed
    -- table cannot read the transition table: it is read here first, and each mention
    -- finds its entity by a query of its own (docs/citus.md).
    v_formed := (SELECT pg_catalog.jsonb_agg(n) FROM formed_rows n);
    INSERT INTO fabric.entities (tenant_id, entity_type, entity_key, name, external_id,
                                 subject_id)
    SELECT DISTINCT ON (n.tenant_id, x.entity_type, x.entity_key)
           n.tenant_id, x.entity_type, x.entity_key, x.name, x.external_id, x.subject_id
    FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_formed) n
    CROSS JOIN LATERAL fabric._record_entities(n.content, n.subject_id) x
    WHERE n.content IS NOT NULL
    ORDER BY n.tenant_id, x.entity_type, x.entity_key, x.rank, n.memory_id
    ON CONFLICT ON CONSTRAINT entities_once_per_key DO NOTHING;
    FOR v_m IN
      SELECT DISTINCT ON (n.tenant_id, n.memory_id, x.entity_type, x.entity_key)
             n.tenant_id, n.memory_id, x.entity_type, x.entity_key, x.source
      FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_formed) n
      CROSS JOIN LATERAL fabric._record_entities(n.content, n.subject_id) x
      WHERE n.content IS NOT NULL
      ORDER BY n.tenant_id, n.memory_id, x.entity_type, x.entity_key, x.rank
    LOOP
      INSERT INTO fabric.memory_mentions (tenant_id, memory_id, entity_id, source)
      SELECT e.tenant_id, v_m.memory_id, e.entity_id, v_m.source
      FROM fabric.entities e
      WHERE e.tenant_id = v_m.tenant_id AND e.entity_type = v_m.entity_type
        AND e.entity_key = v_m.entity_key
      ON CONFLICT DO NOTHING;
    END LOOP;
    RETURN NULL;
  END IF;
  -- the formed records with content, by position; the extractor runs once over all of them
  -- and its rows serve both statements
  SELECT pg_catalog.array_agg(n.tenant_id::text ORDER BY n.memory_id),
         pg_catalog.array_agg(n.memory_id ORDER BY n.memory_id),
         pg_catalog.array_agg(n.content ORDER BY n.memory_id),
         pg_catalog.array_agg(n.subject_id::text ORDER BY n.memory_id)
  INTO v_tenants, v_ids, v_contents, v_subjects
  FROM formed_rows n WHERE n.content IS NOT NULL;
  IF v_ids IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT pg_catalog.array_agg(x.ord), pg_catalog.array_agg(x.entity_type),
         pg_catalog.array_agg(x.entity_key), pg_catalog.array_agg(x.name),
         pg_catalog.array_agg(x.external_id), pg_catalog.array_agg(x.subject_id),
         pg_catalog.array_agg(x.source), pg_catalog.array_agg(x.rank)
  INTO v_x_ord, v_x_type, v_x_key, v_x_name, v_x_external, v_x_subject, v_x_source, v_x_rank
  FROM fabric._records_entities(v_contents, v_subjects) x;
  IF v_x_ord IS NULL THEN
    RETURN NULL;
  END IF;
  INSERT INTO fabric.entities (tenant_id, entity_type, entity_key, name, external_id, subject_id)
  SELECT DISTINCT ON (n.tenant_id, x.entity_type, x.entity_key)
         n.tenant_id, x.entity_type, x.entity_key, x.name, x.external_id, x.subject_id
  FROM ROWS FROM (pg_catalog.unnest(v_tenants), pg_catalog.unnest(v_ids))
       WITH ORDINALITY AS n(tenant_id, memory_id, ord)
  JOIN ROWS FROM (pg_catalog.unnest(v_x_ord), pg_catalog.unnest(v_x_type),
                  pg_catalog.unnest(v_x_key), pg_catalog.unnest(v_x_name),
                  pg_catalog.unnest(v_x_external), pg_catalog.unnest(v_x_subject),
                  pg_catalog.unnest(v_x_rank))
       AS x(ord, entity_type, entity_key, name, external_id, subject_id, rank) ON x.ord = n.ord
  ORDER BY n.tenant_id, x.entity_type, x.entity_key, x.rank, n.memory_id
  ON CONFLICT ON CONSTRAINT entities_once_per_key DO NOTHING;
  INSERT INTO fabric.memory_mentions (tenant_id, memory_id, entity_id, source)
  SELECT DISTINCT ON (n.tenant_id, n.memory_id, coalesce(e.merged_into, e.entity_id))
         n.tenant_id, n.memory_id, coalesce(e.merged_into, e.entity_id), x.source
  FROM ROWS FROM (pg_catalog.unnest(v_tenants), pg_catalog.unnest(v_ids))
       WITH ORDINALITY AS n(tenant_id, memory_id, ord)
  JOIN ROWS FROM (pg_catalog.unnest(v_x_ord), pg_catalog.unnest(v_x_type),
                  pg_catalog.unnest(v_x_key), pg_catalog.unnest(v_x_source),
                  pg_catalog.unnest(v_x_rank))
       AS x(ord, entity_type, entity_key, source, rank) ON x.ord = n.ord
  JOIN fabric.entities e ON e.tenant_id = n.tenant_id AND e.entity_type = x.entity_type
                        AND e.entity_key = x.entity_key
  -- (an entity merged by a reviewed same-as merge resolves to the one it was merged into;
  -- the records are new, so no mention of theirs exists to conflict with: DISTINCT ON
  -- keeps one row a record and entity, and the insert needs no speculative check)
  ORDER BY n.tenant_id, n.memory_id, coalesce(e.merged_into, e.entity_id), x.rank;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS _710_mentions ON fabric.memory_records;
CREATE TRIGGER _710_mentions
  AFTER INSERT ON fabric.memory_records
  REFERENCING NEW TABLE AS formed_rows
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__mentions();

-- ---------------------------------------------------------------------------------------
-- fabric._forget_entities: of these entities of a tenant, those no record mentions any more
-- go; what was merged into one of them forgets it first (entities_merged_into_same_tenant
-- has no ON DELETE action: Citus refuses SET NULL on a key with the distribution column).
CREATE OR REPLACE FUNCTION fabric._forget_entities(p_tenant_id text, p_entity_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  UPDATE fabric.entities m SET merged_into = NULL
  WHERE m.tenant_id = p_tenant_id AND m.merged_into = ANY (p_entity_ids)
    AND NOT EXISTS (SELECT 1 FROM fabric.memory_mentions x
                    WHERE x.tenant_id = m.tenant_id AND x.entity_id = m.merged_into);
  DELETE FROM fabric.entities e
  WHERE e.tenant_id = p_tenant_id AND e.entity_id = ANY (p_entity_ids)
    AND NOT EXISTS (SELECT 1 FROM fabric.memory_mentions x
                    WHERE x.tenant_id = e.tenant_id AND x.entity_id = e.entity_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__forget_mentions: mentions are derived from content, so they go
-- with it (erasure, the closing of a retention window), and so does every entity no record
-- mentions any more: its name came from content that is gone. A subject's erasure thus
-- removes the subject's person entity with the subject's last record.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__forget_mentions()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_gone record;
  v_entity_ids uuid[];
BEGIN
  IF NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.content IS NULL) THEN
    RETURN NULL;
  END IF;
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: the emptied records read from the transition tables first, then a statement
    -- per tenant on its shards (as tg_memory_records__mentions)
    FOR v_gone IN
      SELECT n.tenant_id, pg_catalog.array_agg(n.memory_id) AS memory_ids
      FROM new_rows n
      JOIN old_rows o ON o.tenant_id = n.tenant_id AND o.memory_id = n.memory_id
      WHERE n.content IS NULL AND o.content IS NOT NULL
      GROUP BY n.tenant_id
    LOOP
      WITH gone AS (
        DELETE FROM fabric.memory_mentions x
        WHERE x.tenant_id = v_gone.tenant_id AND x.memory_id = ANY (v_gone.memory_ids)
        RETURNING x.entity_id)
      SELECT pg_catalog.array_agg(DISTINCT g.entity_id) INTO v_entity_ids FROM gone g;
      PERFORM fabric._forget_entities(v_gone.tenant_id, v_entity_ids);
    END LOOP;
    RETURN NULL;
  END IF;
  FOR v_gone IN
    WITH emptied AS (
      SELECT n.tenant_id, n.memory_id FROM new_rows n
      JOIN old_rows o ON o.tenant_id = n.tenant_id AND o.memory_id = n.memory_id
      WHERE n.content IS NULL AND o.content IS NOT NULL),
    gone AS (
      DELETE FROM fabric.memory_mentions x USING emptied d
      WHERE x.tenant_id = d.tenant_id AND x.memory_id = d.memory_id
      RETURNING x.tenant_id, x.entity_id)
    SELECT g.tenant_id, pg_catalog.array_agg(DISTINCT g.entity_id) AS entity_ids
    FROM gone g GROUP BY g.tenant_id
  LOOP
    PERFORM fabric._forget_entities(v_gone.tenant_id, v_gone.entity_ids);
  END LOOP;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS _710_forget_mentions ON fabric.memory_records;
CREATE TRIGGER _710_forget_mentions
  AFTER UPDATE ON fabric.memory_records
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__forget_mentions();

-- ---------------------------------------------------------------------------------------
-- Agent lineage links are append-only, like the outbox: a link is never changed or removed
-- (it holds identifiers only, nothing erasure must scrub).
CREATE OR REPLACE TRIGGER _200_append_only
  BEFORE UPDATE OR DELETE ON fabric.agent_lineage_links
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_events__append_only();
CREATE OR REPLACE TRIGGER _200_append_only_truncate
  BEFORE TRUNCATE ON fabric.agent_lineage_links
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__append_only();

-- ---------------------------------------------------------------------------------------
-- fabric_api.record_agent_link: a domain workflow (a registered agent login that is a
-- member of fabric_workflow and enabled in the tenant) records that an agent caused or
-- contributed to an outcome (a committed record), citing the event it learnt it from and a
-- correlation id. The agent, the outcome and the event must be of this tenant: an unknown
-- one is P0002, another tenant's 42501, an erased outcome 55000; a refusal writes nothing.
-- The same link again (agent, outcome, kind, event) answers the first one.
CREATE OR REPLACE FUNCTION fabric_api.record_agent_link(p_tenant_id text, p_agent_id text,
  p_outcome_id uuid, p_kind text, p_source_event_id uuid, p_correlation_id text,
  p_outcome_envelope_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_workflow text := fabric._enter_as('fabric_workflow', 'record agent lineage links',
                                      'wf-billing-001');
  v_tenant text;
  v_state text;
  v_link fabric.agent_lineage_links;
BEGIN
  IF p_tenant_id IS NULL OR p_agent_id IS NULL OR p_outcome_id IS NULL
     OR p_source_event_id IS NULL OR p_correlation_id IS NULL
     OR p_kind IS NULL OR p_kind NOT IN ('caused', 'contributed') THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'an agent lineage link names a tenant, an agent, an outcome, a kind (caused or '
      'contributed), its source event and a correlation id',
      'e.g. fabric_api.record_agent_link(''acme'', ''com-agt-003'', ''<memory_id>'', '
      '''contributed'', ''<event_id>'', ''corr-7f2a'')');
  END IF;
  PERFORM fabric._ident(p_agent_id, 'agent_id');
  PERFORM fabric._ident(p_correlation_id, 'correlation_id');
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  IF NOT EXISTS (SELECT 1 FROM fabric.tenant_agents e
                 WHERE e.tenant_id = p_tenant_id AND e.agent_id = v_workflow) THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the workflow is not enabled in this tenant',
      'an admin enables its agent with fabric_api.enable_agent');
  END IF;
  IF NOT EXISTS (SELECT 1 FROM fabric.agents a WHERE a.agent_id = p_agent_id) THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown agent',
      'agents are registered with fabric_api.register_agent');
  END IF;
  IF NOT EXISTS (SELECT 1 FROM fabric.tenant_agents e
                 WHERE e.tenant_id = p_tenant_id AND e.agent_id = p_agent_id) THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'a link names an agent enabled in its tenant',
      'link agents of the tenant only; an admin enables one with fabric_api.enable_agent');
  END IF;
  v_tenant := fabric._tenant_of_known_record(p_outcome_id);    -- P0002 when unknown
  IF v_tenant <> p_tenant_id THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'a link''s outcome is a record of its tenant',
      'link outcomes of the tenant only');
  END IF;
  SELECT e.tenant_id INTO v_tenant FROM fabric.events e WHERE e.event_id = p_source_event_id
  LIMIT 1;
  IF NOT FOUND THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown source event',
      'cite the event_id of an event of the tenant (fabric_audit.events lists them)');
  ELSIF v_tenant <> p_tenant_id THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'a link''s source event is an event of its tenant',
      'cite events of the tenant only');
  END IF;
  PERFORM fabric._set_context('actor', v_workflow);
  PERFORM fabric._set_context('correlation_id', p_correlation_id);
  SELECT m.consolidation_state INTO v_state FROM fabric.memory_records m
  WHERE m.tenant_id = p_tenant_id AND m.memory_id = p_outcome_id
  FOR SHARE;  -- an erasure racing this call waits, or has already won
  IF v_state = 'tombstoned' THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'an erased record is no outcome to link',
      'link outcomes that are not erased');
  END IF;
  INSERT INTO fabric.agent_lineage_links AS l (tenant_id, agent_id, outcome_id, link_kind,
    source_event_id, correlation_id, outcome_envelope_id, recorded_by)
  VALUES (p_tenant_id, p_agent_id, p_outcome_id, p_kind, p_source_event_id, p_correlation_id,
          p_outcome_envelope_id, v_workflow)
  ON CONFLICT ON CONSTRAINT agent_lineage_links_once DO NOTHING
  RETURNING * INTO v_link;
  IF v_link.link_id IS NULL THEN
    SELECT * INTO STRICT v_link FROM fabric.agent_lineage_links l
    WHERE l.tenant_id = p_tenant_id AND l.agent_id = p_agent_id AND l.outcome_id = p_outcome_id
      AND l.link_kind = p_kind AND l.source_event_id = p_source_event_id;
    RETURN pg_catalog.jsonb_build_object('link_id', v_link.link_id, 'recorded', false);
  END IF;
  PERFORM fabric._emit('memory.agent_link.recorded', p_tenant_id, p_correlation_id,
    p_source_event_id::text, p_outcome_id, NULL,
    pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('link_id', v_link.link_id,
      'agent_id', p_agent_id, 'kind', p_kind, 'source_event_id', p_source_event_id,
      'outcome_envelope_id', p_outcome_envelope_id)));
  RETURN pg_catalog.jsonb_build_object('link_id', v_link.link_id, 'recorded', true);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_agent_links: the lineage links whose outcome is one of these
-- records, for the graph projection: tenant by tenant, then by outcome and link id.
CREATE OR REPLACE FUNCTION fabric_api.projection_agent_links(p_memory_ids uuid[])
RETURNS TABLE (tenant_id text, link_id uuid, agent_id text, outcome_id uuid, link_kind text,
  source_event_id uuid, correlation_id text, outcome_envelope_id uuid, recorded_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT DISTINCT fabric._tenant_of_record(i) t FROM pg_catalog.unnest(p_memory_ids) i
                  WHERE fabric._tenant_of_record(i) IS NOT NULL ORDER BY 1 LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);  -- reaches the shards on Citus
    RETURN QUERY
      SELECT l.tenant_id::text, l.link_id, l.agent_id::text, l.outcome_id, l.link_kind,
             l.source_event_id, l.correlation_id::text, l.outcome_envelope_id, l.recorded_at
      FROM fabric.agent_lineage_links l
      WHERE l.tenant_id = v_tenant AND l.outcome_id = ANY (p_memory_ids)
      ORDER BY l.outcome_id, l.link_id;
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_mentions: the entities these records mention, for the graph
-- projection, with each record's correlation and validity. A person's name never leaves:
-- a person is its entity id, and a subject's person also its subject's pseudonym
-- (subject_ref, as in the record feed). A record without content mentions nothing.
CREATE OR REPLACE FUNCTION fabric_api.projection_mentions(p_memory_ids uuid[])
RETURNS TABLE (tenant_id text, memory_id uuid, entity_id uuid, entity_type text, name text,
  subject_ref text, source text, correlation_id text, valid_from timestamptz,
  valid_until timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT DISTINCT fabric._tenant_of_record(i) t FROM pg_catalog.unnest(p_memory_ids) i
                  WHERE fabric._tenant_of_record(i) IS NOT NULL ORDER BY 1 LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);  -- reaches the shards on Citus
    RETURN QUERY
      SELECT x.tenant_id::text, x.memory_id, e.entity_id, e.entity_type,
             CASE WHEN e.entity_type = 'person' THEN NULL ELSE e.name END,
             k.subject_ref, x.source, m.correlation_id::text, m.valid_from, m.valid_until
      FROM fabric.memory_mentions x
      JOIN fabric.entities e ON e.tenant_id = x.tenant_id AND e.entity_id = x.entity_id
      JOIN fabric.memory_records m ON m.tenant_id = x.tenant_id AND m.memory_id = x.memory_id
      LEFT JOIN fabric.subject_keys k ON k.tenant_id = e.tenant_id AND k.subject_id = e.subject_id
      WHERE x.tenant_id = v_tenant AND x.memory_id = ANY (p_memory_ids)
        AND m.content IS NOT NULL
      ORDER BY x.memory_id, e.entity_id;
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_audit.agent_links: which agent influenced which outcome in a tenant, recorded in
-- [p_from, p_to): the links with their source event, correlation and Outcome Envelope.
CREATE OR REPLACE FUNCTION fabric_audit.agent_links(p_tenant_id text,
  p_from timestamptz DEFAULT '-infinity', p_to timestamptz DEFAULT 'infinity')
RETURNS TABLE (link_id uuid, agent_id text, outcome_id uuid, link_kind text,
  source_event_id uuid, correlation_id text, outcome_envelope_id uuid, recorded_by text,
  recorded_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT l.link_id, l.agent_id::text, l.outcome_id, l.link_kind, l.source_event_id,
           l.correlation_id::text, l.outcome_envelope_id, l.recorded_by::text, l.recorded_at
    FROM fabric.agent_lineage_links l
    WHERE l.tenant_id = p_tenant_id AND l.recorded_at >= p_from AND l.recorded_at < p_to
    ORDER BY l.recorded_at, l.link_id;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._graph_seeds: where a graph recall starts: the entities the query names (every run
-- of 1-4 of its words, normalized as entity names are, and @handles; possessives dropped),
-- among those mentioned by at least one record in the caller's scope; when the query names
-- none, p_subject_id's person (recall passes the run's subject for mode graph only). Ids only: names never leave the database. An entity declared
-- with an external id is keyed by it, so a query reaches it through the records that
-- mention it, not by its name. The caller has set the tenant context.
CREATE OR REPLACE FUNCTION fabric._graph_seeds(p_tenant_id text, p_query text,
  p_scope_keys text[], p_subject_id text)
RETURNS uuid[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_words text[];
  v_keys text[];
  v_seeds uuid[];
BEGIN
  v_words := ARRAY(
    SELECT w FROM (
      SELECT pg_catalog.regexp_replace(pg_catalog.regexp_replace(t.word, '[''’]s$', ''),
                                       '^[^[:alnum:]@]+|[^[:alnum:]]+$', '', 'g') AS w, t.n
      FROM pg_catalog.regexp_split_to_table(
             pg_catalog.lower(normalize(coalesce(p_query, ''), NFKC)), '\s+')
           WITH ORDINALITY AS t(word, n)) x
    WHERE x.w <> '' ORDER BY x.n);
  v_keys := ARRAY(
    SELECT DISTINCT 'name:' || pg_catalog.array_to_string(v_words[i:i + k], ' ')
    FROM pg_catalog.generate_subscripts(v_words, 1) i, pg_catalog.generate_series(0, 3) k
    WHERE i + k <= pg_catalog.cardinality(v_words));
  -- (an entity merged by a reviewed same-as merge starts the walk at the one it was merged
  -- into, whose mentions include its own)
  SELECT pg_catalog.array_agg(DISTINCT coalesce(e.merged_into, e.entity_id)) INTO v_seeds
  FROM fabric.entities e
  WHERE e.tenant_id = p_tenant_id AND e.entity_type = ANY (fabric._entity_types())
    AND e.entity_key = ANY (v_keys)
    AND EXISTS (SELECT 1 FROM fabric.memory_mentions x
                JOIN fabric.memory_records m ON m.tenant_id = x.tenant_id AND m.memory_id = x.memory_id
                WHERE x.tenant_id = e.tenant_id AND x.entity_id = e.entity_id
                  AND m.scope_key = ANY (p_scope_keys));
  IF v_seeds IS NULL AND p_subject_id IS NOT NULL THEN
    SELECT pg_catalog.array_agg(e.entity_id) INTO v_seeds
    FROM fabric.entities e
    WHERE e.tenant_id = p_tenant_id AND e.entity_type = 'person'
      AND e.entity_key = 'subject:' || p_subject_id;
  END IF;
  RETURN coalesce(v_seeds, '{}');
END $$;

-- ---------------------------------------------------------------------------------------
-- Reasoning steps are append-only: a step is never changed or removed. (Its touches go only
-- with an entity that erasure removes: a foreign key's cascade, under no policy of a caller.)
CREATE OR REPLACE TRIGGER _200_append_only
  BEFORE UPDATE OR DELETE ON fabric.reasoning_steps
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_events__append_only();
CREATE OR REPLACE TRIGGER _200_append_only_truncate
  BEFORE TRUNCATE ON fabric.reasoning_steps
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__append_only();

-- ---------------------------------------------------------------------------------------
-- fabric._touch_entities: a reasoning step touched these entities (distinct ids of its
-- tenant): its step_touches rows, written by fabric_api.record_step and
-- fabric._record_recall_step alike.
CREATE OR REPLACE FUNCTION fabric._touch_entities(p_tenant_id text, p_step_id uuid,
  p_entity_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_entity uuid;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus runs an INSERT ... SELECT of an array's elements as a COPY into the shard,
    -- which row-level security refuses: one INSERT ... VALUES per entity there.
    FOREACH v_entity IN ARRAY p_entity_ids LOOP
      INSERT INTO fabric.step_touches (tenant_id, step_id, entity_id)
      VALUES (p_tenant_id, p_step_id, v_entity);
    END LOOP;
  ELSE
    INSERT INTO fabric.step_touches (tenant_id, step_id, entity_id)
    SELECT p_tenant_id, p_step_id, i FROM pg_catalog.unnest(p_entity_ids) i;
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.record_step: a domain workflow (fabric_workflow, enabled in the run's tenant)
-- records a step of a run -- the run's agent, a correlation id and, once formation persists
-- them, its Outcome Envelope -- and the entities it touched (1-100 entity ids of the run's
-- tenant). An unknown run or entity (or one of another tenant) is P0002; a refusal writes
-- nothing. One `memory.reasoning_step.recorded` event; the graph gets
-- (:Agent)-[:TOOK]->(:Step)-[:TOUCHED]->(:Entity).
CREATE OR REPLACE FUNCTION fabric_api.record_step(p_run_id uuid, p_correlation_id text,
  p_entity_ids uuid[], p_outcome_envelope_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_workflow text := fabric._enter_as('fabric_workflow', 'record reasoning steps',
                                      'wf-billing-001');
  v_run fabric.runs;
  v_step uuid := pg_catalog.gen_random_uuid();
  v_event uuid;
  v_entities uuid[];
BEGIN
  IF p_run_id IS NULL OR p_correlation_id IS NULL OR p_entity_ids IS NULL
     OR pg_catalog.cardinality(p_entity_ids) NOT BETWEEN 1 AND 100
     OR pg_catalog.array_position(p_entity_ids, NULL) IS NOT NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a reasoning step names its run, a correlation id and the 1-100 entities it touched',
      'e.g. fabric_api.record_step(''<run_id>'', ''corr-7f2a'', ARRAY[''<entity_id>''::uuid])');
  END IF;
  PERFORM fabric._ident(p_correlation_id, 'correlation_id');
  v_run := fabric._run_in_its_tenant(p_run_id);  -- sets the run's tenant
  IF v_run.run_id IS NULL THEN
    PERFORM fabric._set_context('tenant_id', NULL);
    PERFORM fabric._raise_rule('no_data_found', 'unknown run',
      'runs are opened with fabric_api.open_run');
  END IF;
  IF NOT EXISTS (SELECT 1 FROM fabric.tenant_agents e
                 WHERE e.tenant_id = v_run.tenant_id AND e.agent_id = v_workflow) THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the workflow is not enabled in this tenant',
      'an admin enables its agent with fabric_api.enable_agent');
  END IF;
  v_entities := ARRAY(SELECT DISTINCT i FROM pg_catalog.unnest(p_entity_ids) i ORDER BY 1);
  IF (SELECT pg_catalog.count(*) FROM fabric.entities e
      WHERE e.tenant_id = v_run.tenant_id AND e.entity_id = ANY (v_entities))
     < pg_catalog.cardinality(v_entities) THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown entity',
      'entity ids of the run''s tenant (a graph recall''s seeds, or fabric.entities)');
  END IF;
  PERFORM fabric._set_context('actor', v_workflow);
  PERFORM fabric._set_context('run_id', p_run_id::text);
  v_event := fabric._emit('memory.reasoning_step.recorded', v_run.tenant_id, p_correlation_id,
    NULL, NULL, NULL, pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
      'step_id', v_step, 'agent_id', v_run.agent_id, 'entities', pg_catalog.cardinality(v_entities),
      'outcome_envelope_id', p_outcome_envelope_id)));
  INSERT INTO fabric.reasoning_steps (tenant_id, step_id, run_id, agent_id, correlation_id,
    outcome_envelope_id, event_id, recorded_by)
  VALUES (v_run.tenant_id, v_step, p_run_id, v_run.agent_id, p_correlation_id,
          p_outcome_envelope_id, v_event, v_workflow);
  PERFORM fabric._touch_entities(v_run.tenant_id, v_step, v_entities);
  RETURN pg_catalog.jsonb_build_object('step_id', v_step, 'event_id', v_event);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._record_recall_step: a served recall that walked the graph records itself as a
-- step of its run, taken by the run's agent, touching the entities the walk started from
-- (none: no step). Its correlation id is the recall's, else one of its own ('recall:<step>').
-- One `memory.reasoning_step.recorded` event, as for a workflow's step. The caller (recall)
-- has entered the run and set its tenant.
CREATE OR REPLACE FUNCTION fabric._record_recall_step(p_run fabric.runs, p_correlation_id text,
  p_entity_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_step uuid := pg_catalog.gen_random_uuid();
  v_correlation text := CASE WHEN p_correlation_id ~ '^[^[:space:][:cntrl:]]{1,200}$'
                             THEN p_correlation_id ELSE 'recall:' || v_step::text END;
  v_entities uuid[] := ARRAY(SELECT DISTINCT i FROM pg_catalog.unnest(p_entity_ids) i
                             WHERE i IS NOT NULL ORDER BY 1 LIMIT 100);
  v_event uuid;
BEGIN
  IF pg_catalog.cardinality(v_entities) = 0 THEN
    RETURN;
  END IF;
  v_event := fabric._emit('memory.reasoning_step.recorded', p_run.tenant_id, v_correlation,
    NULL, NULL, NULL, pg_catalog.jsonb_build_object('step_id', v_step,
      'agent_id', p_run.agent_id, 'entities', pg_catalog.cardinality(v_entities),
      'source', 'recall'));
  INSERT INTO fabric.reasoning_steps (tenant_id, step_id, run_id, agent_id, correlation_id,
    event_id, recorded_by)
  VALUES (p_run.tenant_id, v_step, p_run.run_id, p_run.agent_id, v_correlation, v_event,
          p_run.agent_id);
  PERFORM fabric._touch_entities(p_run.tenant_id, v_step, v_entities);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._projection_step_rows: steps of one tenant as the graph sees them (entity ids in
-- order), by the events that recorded them (p_event_ids) or every step after p_after_step.
CREATE OR REPLACE FUNCTION fabric._projection_step_rows(p_tenant text, p_event_ids uuid[],
  p_after_step uuid, p_limit integer)
RETURNS TABLE (tenant_id text, step_id uuid, run_id uuid, agent_id text, correlation_id text,
  outcome_envelope_id uuid, recorded_at timestamptz, entity_ids uuid[])
LANGUAGE plpgsql STABLE  -- not SQL: Citus plans no statement of an SQL function with parameters
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN QUERY
  SELECT s.tenant_id::text, s.step_id::uuid, s.run_id::uuid, s.agent_id::text,
         s.correlation_id::text, s.outcome_envelope_id::uuid, s.recorded_at::timestamptz,
         coalesce((SELECT pg_catalog.array_agg(t.entity_id ORDER BY t.entity_id)
                   FROM fabric.step_touches t
                   WHERE t.tenant_id = s.tenant_id AND t.step_id = s.step_id), '{}')::uuid[]
  FROM fabric.reasoning_steps s
  WHERE s.tenant_id = p_tenant
    AND (p_event_ids IS NULL OR s.event_id = ANY (p_event_ids))
    AND (p_after_step IS NULL OR s.step_id > p_after_step)
  ORDER BY s.step_id
  LIMIT p_limit;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_steps: the steps these events recorded, for the graph projection.
CREATE OR REPLACE FUNCTION fabric_api.projection_steps(p_event_ids uuid[])
RETURNS TABLE (tenant_id text, step_id uuid, run_id uuid, agent_id text, correlation_id text,
  outcome_envelope_id uuid, recorded_at timestamptz, entity_ids uuid[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT DISTINCT e.tenant_id FROM fabric.events e
                  WHERE e.event_id = ANY (p_event_ids)
                    AND e.event_type = 'memory.reasoning_step.recorded' ORDER BY 1 LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);  -- reaches the shards on Citus
    RETURN QUERY SELECT * FROM fabric._projection_step_rows(v_tenant, p_event_ids, NULL, NULL);
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_steps_snapshot: every step, paged by (tenant_id, step_id), for
-- rebuilds: the page after (p_after_tenant, p_after_step), at most p_limit.
CREATE OR REPLACE FUNCTION fabric_api.projection_steps_snapshot(p_after_tenant text,
  p_after_step uuid, p_limit integer DEFAULT 1000)
RETURNS TABLE (tenant_id text, step_id uuid, run_id uuid, agent_id text, correlation_id text,
  outcome_envelope_id uuid, recorded_at timestamptz, entity_ids uuid[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_left integer := greatest(1, least(coalesce(p_limit, 1000), 10000));
  v_rows integer;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t
                  WHERE p_after_tenant IS NULL OR t.tenant_id >= p_after_tenant ORDER BY 1 LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);  -- reaches the shards on Citus
    RETURN QUERY SELECT * FROM fabric._projection_step_rows(v_tenant, NULL,
      CASE WHEN v_tenant = p_after_tenant THEN p_after_step END, v_left);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_left := v_left - v_rows;
    EXIT WHEN v_left <= 0;
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_audit.entity_touches: which agent step touched an entity, and what outcome
-- followed: each step with its run, agent, correlation and Outcome Envelope, and the
-- outcomes the agent lineage links of the same correlation (or Outcome Envelope) name.
CREATE OR REPLACE FUNCTION fabric_audit.entity_touches(p_tenant_id text, p_entity_id uuid)
RETURNS TABLE (step_id uuid, run_id uuid, agent_id text, correlation_id text,
  outcome_envelope_id uuid, recorded_at timestamptz, outcome_ids uuid[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT s.step_id, s.run_id, s.agent_id::text, s.correlation_id::text, s.outcome_envelope_id,
           s.recorded_at,
           coalesce((SELECT pg_catalog.array_agg(DISTINCT l.outcome_id ORDER BY l.outcome_id)
                     FROM fabric.agent_lineage_links l
                     WHERE l.tenant_id = p_tenant_id
                       AND (l.correlation_id = s.correlation_id
                            OR l.outcome_envelope_id = s.outcome_envelope_id)), '{}')
    FROM fabric.step_touches t
    JOIN fabric.reasoning_steps s ON s.tenant_id = t.tenant_id AND s.step_id = t.step_id
    WHERE t.tenant_id = p_tenant_id AND t.entity_id = p_entity_id
    ORDER BY s.recorded_at, s.step_id;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.propose_entity_merge: a same-as merge is a reviewed proposal, never silent.
-- The consolidator proposes that p_entity_id is the same as p_into_entity_id (both of the
-- tenant, of one type, neither merged already): a pending approval of action
-- merge_entities, which policy decides (fabric_api.decide_approval) and the consolidator
-- then applies (fabric_api.merge_entities). A refusal writes nothing: two ids that are one,
-- or of different types, 22023; an unknown entity P0002; one merged already 55000.
CREATE OR REPLACE FUNCTION fabric_api.propose_entity_merge(p_tenant_id text, p_entity_id uuid,
  p_into_entity_id uuid, p_reason text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_from fabric.entities;
  v_into fabric.entities;
  v_id uuid := pg_catalog.gen_random_uuid();
  v_target jsonb;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_consolidator', 'propose entity merges');
  IF p_tenant_id IS NULL OR p_entity_id IS NULL OR p_into_entity_id IS NULL
     OR p_entity_id = p_into_entity_id OR coalesce(pg_catalog.btrim(p_reason), '') = '' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a merge proposal names a tenant, two different entities and a reason',
      'e.g. fabric_api.propose_entity_merge(''acme'', ''<entity_id>'', ''<into_entity_id>'', '
      '''same company, renamed'')');
  END IF;
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  PERFORM fabric._set_context('actor', fabric._actor_id());
  SELECT * INTO v_from FROM fabric.entities e
  WHERE e.tenant_id = p_tenant_id AND e.entity_id = p_entity_id;
  SELECT * INTO v_into FROM fabric.entities e
  WHERE e.tenant_id = p_tenant_id AND e.entity_id = p_into_entity_id;
  IF v_from.entity_id IS NULL OR v_into.entity_id IS NULL THEN
    PERFORM fabric._raise_rule('no_data_found', 'unknown entity',
      'entity ids of the tenant (fabric.entities, a graph recall''s seeds)');
  END IF;
  IF v_from.entity_type <> v_into.entity_type THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'only entities of one type can be the same',
      pg_catalog.format('%s is a %s, %s a %s', p_entity_id, v_from.entity_type,
                        p_into_entity_id, v_into.entity_type));
  END IF;
  IF v_from.merged_into IS NOT NULL OR v_into.merged_into IS NOT NULL THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'an entity merged already is merged no further',
      'propose the merge into the entity it was merged into');
  END IF;
  v_target := pg_catalog.jsonb_build_object('entity_id', p_entity_id,
                                            'into_entity_id', p_into_entity_id);
  INSERT INTO fabric.approvals (tenant_id, approval_id, action, target, reason, requested_by,
                                expires_at)
  VALUES (p_tenant_id, v_id, 'merge_entities', v_target, p_reason, fabric._actor_id(),
          pg_catalog.now() + fabric._approval_timeout(p_tenant_id, 'merge_entities'));
  PERFORM fabric._emit('memory.approval.requested', p_tenant_id, NULL, NULL, NULL, NULL,
    pg_catalog.jsonb_build_object('approval_id', v_id, 'action', 'merge_entities',
                                  'target', v_target));
  RETURN pg_catalog.jsonb_build_object('approval_id', v_id, 'status', 'pending');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.merge_entities: the consolidator applies an approved merge_entities approval
-- (once: it is consumed). The merged entity stays, marked merged_into, with its mentions
-- (the history); every record that mentions it now mentions the entity it was merged into
-- too, and records formed later that name it mention that one only. Not approved (pending,
-- denied, consumed) or not a merge: 55000; unknown: P0002.
CREATE OR REPLACE FUNCTION fabric_api.merge_entities(p_approval_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_merged uuid[];
  v_memory uuid;
  v_tenant text;
  v fabric.approvals;
  v_from uuid;
  v_into uuid;
  v_mentions integer;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_consolidator', 'apply entity merges');
  v := fabric._approval_for_update(p_approval_id,
    'approval ids come from fabric_api.propose_entity_merge');
  v_tenant := v.tenant_id;
  IF v.action <> 'merge_entities' OR v.status <> 'approved' OR v.consumed_at IS NOT NULL THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      pg_catalog.format('the approval is a %s, %s: only an approved entity merge is applied',
                        v.action, v.status),
      'policy decides merge proposals with fabric_api.decide_approval');
  END IF;
  v_from := (v.target ->> 'entity_id')::uuid;
  v_into := (v.target ->> 'into_entity_id')::uuid;
  IF EXISTS (SELECT 1 FROM fabric.entities e WHERE e.tenant_id = v_tenant
               AND e.entity_id IN (v_from, v_into) AND e.merged_into IS NOT NULL)
     OR (SELECT pg_catalog.count(*) FROM fabric.entities e
         WHERE e.tenant_id = v_tenant AND e.entity_id IN (v_from, v_into)) < 2 THEN
    PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
      'the entities of this merge are gone or merged since it was proposed',
      'propose the merge again');
  END IF;
  UPDATE fabric.approvals a SET status = 'consumed', consumed_at = pg_catalog.now()
  WHERE a.tenant_id = v_tenant AND a.approval_id = p_approval_id;
  UPDATE fabric.entities e SET merged_into = v_into
  WHERE e.tenant_id = v_tenant AND e.entity_id = v_from;
  INSERT INTO fabric.memory_mentions (tenant_id, memory_id, entity_id, source)
  SELECT x.tenant_id, x.memory_id, v_into, x.source FROM fabric.memory_mentions x
  WHERE x.tenant_id = v_tenant AND x.entity_id = v_from
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS v_mentions = ROW_COUNT;
  -- one event per record that mentions it now (the projector writes its MENTIONS again),
  -- or one without a record when none does; the merge's correlation id is its approval's
  -- ('merge:<approval_id>', fabric._merge_correlation), which its SAME_AS edge carries
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus would push the query down to the tenant's worker with the call in it, and the
    -- outbox is the coordinator's: the records are read first, then each event written.
    v_merged := ARRAY(SELECT x.memory_id FROM fabric.memory_mentions x
                      WHERE x.tenant_id = v_tenant AND x.entity_id = v_from ORDER BY 1);
    IF pg_catalog.cardinality(v_merged) = 0 THEN
      v_merged := ARRAY[NULL::uuid];
    END IF;
    FOREACH v_memory IN ARRAY v_merged LOOP
      PERFORM fabric._emit('memory.entity.merged', v_tenant,
      fabric._merge_correlation(p_approval_id), NULL, v_memory, NULL,
        pg_catalog.jsonb_build_object('approval_id', p_approval_id, 'entity_id', v_from,
                                      'into_entity_id', v_into));
    END LOOP;
  ELSE
    PERFORM fabric._emit('memory.entity.merged', v_tenant,
      fabric._merge_correlation(p_approval_id), NULL, r.memory_id, NULL,
      pg_catalog.jsonb_build_object('approval_id', p_approval_id, 'entity_id', v_from,
                                    'into_entity_id', v_into))
    FROM (SELECT x.memory_id FROM fabric.memory_mentions x
          WHERE x.tenant_id = v_tenant AND x.entity_id = v_from
          UNION ALL SELECT NULL::uuid
          WHERE NOT EXISTS (SELECT 1 FROM fabric.memory_mentions x
                            WHERE x.tenant_id = v_tenant AND x.entity_id = v_from)
          ORDER BY 1) r;
  END IF;
  RETURN pg_catalog.jsonb_build_object('approval_id', p_approval_id, 'entity_id', v_from,
                                       'into_entity_id', v_into, 'mentions', v_mentions);
END $$;


-- ---------------------------------------------------------------------------------------
-- fabric._merge_correlation: the correlation id of a same-as merge, made of the approval
-- that decided it, so the merge's events and its SAME_AS edge in the graph (written live
-- or by a rebuild) carry the same one.
CREATE OR REPLACE FUNCTION fabric._merge_correlation(p_approval_id uuid)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT 'merge:' || p_approval_id::text
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._projection_same_as_rows: the applied same-as merges of one tenant as the graph
-- sees them: each merged entity and the one it was merged into, as entity nodes are (a
-- person without a name, a subject's person with its pseudonym), and the merge's
-- correlation id (of the approval consumed by it). Current state: a merge an erasure undid
-- (either entity gone) is no row. The merged entities p_entity_ids, or every one after
-- p_after_entity (at most p_limit). (plpgsql: Citus cannot plan a SQL function's
-- parameters.)
CREATE OR REPLACE FUNCTION fabric._projection_same_as_rows(p_tenant text, p_entity_ids uuid[],
  p_after_entity uuid, p_limit integer)
RETURNS TABLE (tenant_id text, entity_id uuid, entity_type text, name text, subject_ref text,
  into_entity_id uuid, into_name text, into_subject_ref text, correlation_id text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN QUERY
  SELECT e.tenant_id::text, e.entity_id, e.entity_type,
         CASE WHEN e.entity_type = 'person' THEN NULL ELSE e.name END, ke.subject_ref,
         i.entity_id, CASE WHEN i.entity_type = 'person' THEN NULL ELSE i.name END,
         ki.subject_ref,
         (SELECT fabric._merge_correlation(a.approval_id) FROM fabric.approvals a
          WHERE a.tenant_id = e.tenant_id AND a.action = 'merge_entities'
            AND a.status = 'consumed'
            AND a.target = pg_catalog.jsonb_build_object('entity_id', e.entity_id,
                                                         'into_entity_id', e.merged_into)
          ORDER BY a.consumed_at DESC, a.approval_id LIMIT 1)
  FROM fabric.entities e
  JOIN fabric.entities i ON i.tenant_id = e.tenant_id AND i.entity_id = e.merged_into
  LEFT JOIN fabric.subject_keys ke ON ke.tenant_id = e.tenant_id AND ke.subject_id = e.subject_id
  LEFT JOIN fabric.subject_keys ki ON ki.tenant_id = i.tenant_id AND ki.subject_id = i.subject_id
  WHERE e.tenant_id = p_tenant AND e.merged_into IS NOT NULL
    AND (p_entity_ids IS NULL OR e.entity_id = ANY (p_entity_ids))
    AND (p_after_entity IS NULL OR e.entity_id > p_after_entity)
  ORDER BY e.entity_id
  LIMIT p_limit;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_same_as: the same-as merges these `memory.entity.merged` events
-- applied, for the graph projection, as they stand now (fabric._projection_same_as_rows).
CREATE OR REPLACE FUNCTION fabric_api.projection_same_as(p_event_ids uuid[])
RETURNS TABLE (tenant_id text, entity_id uuid, entity_type text, name text, subject_ref text,
  into_entity_id uuid, into_name text, into_subject_ref text, correlation_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v record;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v IN SELECT e.tenant_id,
                  pg_catalog.array_agg(DISTINCT (e.payload ->> 'entity_id')::uuid) AS entity_ids
           FROM fabric.events e
           WHERE e.event_id = ANY (p_event_ids) AND e.event_type = 'memory.entity.merged'
           GROUP BY e.tenant_id ORDER BY 1 LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v.tenant_id);  -- reaches the shards on Citus
    RETURN QUERY SELECT * FROM fabric._projection_same_as_rows(v.tenant_id, v.entity_ids,
                                                               NULL, NULL);
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.projection_same_as_snapshot: every applied same-as merge, paged by (tenant_id,
-- entity_id), for rebuilds: the page after (p_after_tenant, p_after_entity), at most p_limit.
CREATE OR REPLACE FUNCTION fabric_api.projection_same_as_snapshot(p_after_tenant text,
  p_after_entity uuid, p_limit integer DEFAULT 1000)
RETURNS TABLE (tenant_id text, entity_id uuid, entity_type text, name text, subject_ref text,
  into_entity_id uuid, into_name text, into_subject_ref text, correlation_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_left integer := greatest(1, least(coalesce(p_limit, 1000), 10000));
  v_rows integer;
BEGIN
  PERFORM fabric._require_role('fabric_projector', 'read committed state for projection');
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t
                  WHERE p_after_tenant IS NULL OR t.tenant_id >= p_after_tenant ORDER BY 1 LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);  -- reaches the shards on Citus
    RETURN QUERY SELECT * FROM fabric._projection_same_as_rows(v_tenant, NULL,
      CASE WHEN v_tenant = p_after_tenant THEN p_after_entity END, v_left);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_left := v_left - v_rows;
    EXIT WHEN v_left <= 0;
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.entity_merge_proposals: what policy reads to decide a same-as merge: the
-- tenant's merge_entities approvals of status p_status (all of them with NULL), newest
-- first, each with both entities as PostgreSQL holds them (type and name: the decider must
-- see what would become one; names never leave for the graph) and the proposal's reason.
-- An entity erased since it was proposed has no type or name any more. Policy only (42501);
-- an unknown tenant P0002; a status that is none of an approval's 22023.
CREATE OR REPLACE FUNCTION fabric_api.entity_merge_proposals(p_tenant_id text,
  p_status text DEFAULT 'pending')
RETURNS TABLE (approval_id uuid, status text, entity_id uuid, entity_type text,
  entity_name text, into_entity_id uuid, into_entity_name text, reason text,
  requested_by text, requested_at timestamptz, expires_at timestamptz, decided_by text,
  decided_at timestamptz, decision_reason text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_policy', 'read entity merge proposals');
  IF p_status IS NOT NULL AND p_status NOT IN ('pending', 'approved', 'denied', 'consumed') THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'an approval''s status is pending, approved, denied or consumed',
      'e.g. fabric_api.entity_merge_proposals(''acme'', ''pending''), or NULL for all');
  END IF;
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  RETURN QUERY
    SELECT a.approval_id, a.status, (a.target ->> 'entity_id')::uuid, e.entity_type, e.name,
           (a.target ->> 'into_entity_id')::uuid, i.name, a.reason, a.requested_by::text,
           a.requested_at, a.expires_at, a.decided_by::text, a.decided_at, a.decision_reason
    FROM fabric.approvals a
    LEFT JOIN fabric.entities e ON e.tenant_id = a.tenant_id
                               AND e.entity_id = (a.target ->> 'entity_id')::uuid
    LEFT JOIN fabric.entities i ON i.tenant_id = a.tenant_id
                               AND i.entity_id = (a.target ->> 'into_entity_id')::uuid
    WHERE a.tenant_id = p_tenant_id AND a.action = 'merge_entities'
      AND (p_status IS NULL OR a.status = p_status)
    ORDER BY a.requested_at DESC, a.approval_id;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.decide_entity_merge: policy decides a same-as merge proposal
-- (fabric_api.decide_approval, for an approval of action merge_entities only: an id of
-- another kind of approval is refused with 55000 before anything is written, so a merge
-- decision never approves an erasure or a promotion by mistake).
CREATE OR REPLACE FUNCTION fabric_api.decide_entity_merge(p_approval_id uuid, p_decision text,
  p_reason text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_action text;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_policy', 'decide entity merges');
  v_tenant := fabric._tenant_of_approval(p_approval_id);
  IF v_tenant IS NOT NULL THEN
    PERFORM fabric._set_context('tenant_id', v_tenant);
    SELECT a.action INTO v_action FROM fabric.approvals a
    WHERE a.tenant_id = v_tenant AND a.approval_id = p_approval_id;
    IF v_action <> 'merge_entities' THEN
      PERFORM fabric._raise_rule('object_not_in_prerequisite_state',
        pg_catalog.format('the approval is a %s, not an entity merge', v_action),
        'decide other approvals with fabric_api.decide_approval');
    END IF;
  END IF;
  RETURN fabric_api.decide_approval(p_approval_id, p_decision, p_reason);  -- P0002 if unknown
END $$;
