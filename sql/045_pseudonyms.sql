-- Subject pseudonyms: what outlives erasure (events, approvals) names a data subject only
-- by an HMAC under a random key of its own (tenant, subject). Subject erasure deletes the
-- key, and with it every link from the trail back to the person (crypto-shredding).

-- ---------------------------------------------------------------------------------------
-- fabric._pseudonym: one identifier of a kind ('subject', 'session', 'request') under a key.
-- PL/pgSQL, not SQL: a SQL function that cannot be inlined (its SET clause) is parsed and
-- planned again on every call in a new transaction; this one is a simple expression, run
-- without the executor (every recall calls it twice for its audit event).
CREATE OR REPLACE FUNCTION fabric._pseudonym(p_key bytea, p_kind text, p_value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN CASE WHEN p_key IS NOT NULL AND p_value IS NOT NULL THEN
    'hmac:' || pg_catalog.encode(ext.hmac(pg_catalog.convert_to(p_kind || ':' || p_value, 'UTF8'),
                                          p_key, 'sha256'), 'hex') END;
END $$;

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
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT k.subject_id::text FROM fabric.subject_keys k
  WHERE k.tenant_id = p_tenant_id AND k.subject_ref = p_subject_ref
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._shred_subject_key: subject erasure destroys the key; true if there was one.
CREATE OR REPLACE FUNCTION fabric._shred_subject_key(p_tenant_id text, p_subject_id text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  DELETE FROM fabric.subject_keys k WHERE k.tenant_id = p_tenant_id AND k.subject_id = p_subject_id;
  RETURN FOUND;
END $$;
