-- Subject pseudonyms: what outlives erasure (events, approvals) names a data subject only
-- by an HMAC under a random key of its own (tenant, subject). Subject erasure deletes the
-- key, and with it every link from the trail back to the person (crypto-shredding).

-- ---------------------------------------------------------------------------------------
-- fabric._pseudonym: one identifier of a kind ('subject', 'session', 'request') under a key.
-- An SQL function with an SQL-standard body (RETURN expression): its names are bound when
-- it is created, so it needs no SET search_path, and without one the planner inlines it
-- into the caller's expression (every recall computes two for its audit event). STABLE,
-- not IMMUTABLE: convert_to is STABLE, and an IMMUTABLE function over it is never inlined.
CREATE OR REPLACE FUNCTION fabric._pseudonym(p_key bytea, p_kind text, p_value text)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN p_key IS NOT NULL AND p_value IS NOT NULL THEN
    'hmac:' || pg_catalog.encode(ext.hmac(pg_catalog.convert_to(p_kind || ':' || p_value, 'UTF8'),
                                          p_key, 'sha256'), 'hex') END;

-- ---------------------------------------------------------------------------------------
-- fabric._subject_key: the subject's key in the tenant of the context, made on first use.
-- Two transactions making the same key meet on the primary key; the loser reads the winner's.
CREATE OR REPLACE FUNCTION fabric._subject_key(p_tenant_id text, p_subject_id text)
RETURNS fabric.subject_keys
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v fabric.subject_keys;
  v_key bytea;
BEGIN
  IF p_subject_id IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT * INTO v FROM fabric.subject_keys k
  WHERE k.tenant_id = p_tenant_id AND k.subject_id = p_subject_id;
  IF FOUND THEN
    RETURN v;
  END IF;
  v_key := ext.gen_random_bytes(32);
  INSERT INTO fabric.subject_keys (tenant_id, subject_id, subject_ref, key)
  VALUES (p_tenant_id, p_subject_id, fabric._pseudonym(v_key, 'subject', p_subject_id), v_key)
  ON CONFLICT (tenant_id, subject_id) DO NOTHING;
  SELECT * INTO STRICT v FROM fabric.subject_keys k
  WHERE k.tenant_id = p_tenant_id AND k.subject_id = p_subject_id;
  RETURN v;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._subject_of_ref: the living subject behind a pseudonym (NULL once erased).
CREATE OR REPLACE FUNCTION fabric._subject_of_ref(p_tenant_id text, p_subject_ref text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- plpgsql: Citus plans no statement of an SQL function with parameters
  RETURN (SELECT k.subject_id::text FROM fabric.subject_keys k
          WHERE k.tenant_id = p_tenant_id AND k.subject_ref = p_subject_ref);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._shred_subject_key: subject erasure destroys the key; true if there was one.
CREATE OR REPLACE FUNCTION fabric._shred_subject_key(p_tenant_id text, p_subject_id text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- the subject's person entity goes with the key (its mentions with it; sql/285_graph_tier.sql)
  UPDATE fabric.entities m SET merged_into = NULL
  WHERE m.tenant_id = p_tenant_id AND m.merged_into IN (
    SELECT e.entity_id FROM fabric.entities e
    WHERE e.tenant_id = p_tenant_id AND e.subject_id = p_subject_id);
  DELETE FROM fabric.entities e WHERE e.tenant_id = p_tenant_id AND e.subject_id = p_subject_id;
  DELETE FROM fabric.subject_keys k WHERE k.tenant_id = p_tenant_id AND k.subject_id = p_subject_id;
  RETURN FOUND;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__subject_key: every record's subject has a key from the
-- transaction that forms the record on, so every live record can be projected under its
-- subject's pseudonym (the projection feeds only read keys; they never make one). open_run
-- makes the key of a run's subject beforehand, so this makes one only for a subject no run
-- named (an import): two transactions forming such a subject's first records meet on the
-- primary key, and the second waits for the first.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__subject_key()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_s record;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: this runs on the tenant's shard, where a statement on another distributed
    -- table cannot read the transition table: the subjects are read from it first, then
    -- each key is made by a statement of its own (docs/citus.md).
    FOR v_s IN SELECT DISTINCT n.tenant_id::text AS tenant_id, n.subject_id::text AS subject_id
               FROM formed_rows n WHERE n.subject_id IS NOT NULL LOOP
      CONTINUE WHEN EXISTS (SELECT 1 FROM fabric.subject_keys k
                            WHERE k.tenant_id = v_s.tenant_id AND k.subject_id = v_s.subject_id);
      INSERT INTO fabric.subject_keys (tenant_id, subject_id, subject_ref, key)
      SELECT v_s.tenant_id, v_s.subject_id, fabric._pseudonym(k.key, 'subject', v_s.subject_id),
             k.key
      FROM (SELECT ext.gen_random_bytes(32) AS key) k
      ON CONFLICT (tenant_id, subject_id) DO NOTHING;
    END LOOP;
    RETURN NULL;
  END IF;
  INSERT INTO fabric.subject_keys (tenant_id, subject_id, subject_ref, key)
  SELECT s.tenant_id, s.subject_id, fabric._pseudonym(s.key, 'subject', s.subject_id), s.key
  FROM (SELECT d.tenant_id, d.subject_id, ext.gen_random_bytes(32) AS key
        FROM (SELECT DISTINCT n.tenant_id::text AS tenant_id, n.subject_id::text AS subject_id
              FROM formed_rows n
              WHERE n.subject_id IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM fabric.subject_keys k
                                WHERE k.tenant_id = n.tenant_id
                                  AND k.subject_id = n.subject_id)) d) s
  ON CONFLICT (tenant_id, subject_id) DO NOTHING;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS _700_subject_key ON fabric.memory_records;
CREATE TRIGGER _700_subject_key
  AFTER INSERT ON fabric.memory_records
  REFERENCING NEW TABLE AS formed_rows
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__subject_key();

-- ---------------------------------------------------------------------------------------
-- Projected identifiers. Qdrant and the graph keep what they are given on disk (write-ahead
-- logs, payload indexes, transaction logs) long after a point is deleted, so they never hold
-- a subject or session id in clear: a record's subject is its subject_ref (the pseudonym of
-- the audit trail), its session the session_ref under the same key. Subject erasure destroys
-- the key, and with it every link from a projection back to the person; a rebuild writes the
-- pseudonyms of the keys that exist then.

-- ---------------------------------------------------------------------------------------
-- fabric._projection_session_ref: a session as the projections name it: keyed by the key of
-- the record's (or run's) subject; a session without a subject, which no subject erasure
-- reaches and no key covers, as it is. A subject without a key gives NULL (fail closed).
CREATE OR REPLACE FUNCTION fabric._projection_session_ref(p_key bytea, p_subject_id text,
  p_session_id text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN CASE WHEN p_subject_id IS NULL THEN p_session_id
              ELSE fabric._pseudonym(p_key, 'session', p_session_id) END;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._projection_scope_key: a scope key as the projections hold it ('subject:hmac:...',
-- 'session:hmac:...', 'agent:<id>', 'tenant'); NULL when the visibility's id is NULL.
CREATE OR REPLACE FUNCTION fabric._projection_scope_key(p_visibility text, p_agent_id text,
  p_subject_ref text, p_session_ref text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN CASE p_visibility
    WHEN 'tenant' THEN 'tenant'
    WHEN 'agent' THEN 'agent:' || p_agent_id
    WHEN 'subject' THEN 'subject:' || p_subject_ref
    WHEN 'session' THEN 'session:' || p_session_ref END;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._projection_scope_keys: the scope keys a vector search names for a run's served
-- visibility levels (in their order), computed exactly as the feed computes a record's. A
-- subject without a key has no record to find (its key is made with its first record), so
-- its levels name nothing. A run's session also names the session's records formed
-- without a subject (held as they are). The caller has set the tenant context.
CREATE OR REPLACE FUNCTION fabric._projection_scope_keys(p_tenant_id text, p_agent_id text,
  p_subject_id text, p_session_id text, p_visibility text[])
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_key fabric.subject_keys;
  v_level text;
  v_keys text[] := '{}';
BEGIN
  IF p_subject_id IS NOT NULL THEN
    SELECT * INTO v_key FROM fabric.subject_keys k
    WHERE k.tenant_id = p_tenant_id AND k.subject_id = p_subject_id;
  END IF;
  FOREACH v_level IN ARRAY coalesce(p_visibility, '{}') LOOP
    v_keys := v_keys || fabric._projection_scope_key(v_level, p_agent_id, v_key.subject_ref,
                          fabric._projection_session_ref(v_key.key, p_subject_id, p_session_id));
    IF v_level = 'session' AND p_subject_id IS NOT NULL THEN
      v_keys := v_keys || fabric._projection_scope_key(v_level, NULL, NULL, p_session_id);
    END IF;
  END LOOP;
  RETURN pg_catalog.to_jsonb(pg_catalog.array_remove(v_keys, NULL));
END $$;
