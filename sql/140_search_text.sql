-- Derived search text: the full-text vector of a record's string values, computed by the
-- database with the deployment's text search configuration, destroyed with the content;
-- and the per-scope statistics that BM25 ranking reads (fabric.search_stats).

-- ---------------------------------------------------------------------------------------
-- fabric._text_search_config: the deployment's configuration (default english).
CREATE OR REPLACE FUNCTION fabric._text_search_config()
RETURNS regconfig
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT s.text_search_config FROM fabric.deployment_settings s);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._search_text: the one derivation of search text from content. (plpgsql: a SQL
-- function with a SET clause is never inlined and is planned again on every call; this one
-- runs once per record formed.)
CREATE OR REPLACE FUNCTION fabric._search_text(p_content jsonb)
RETURNS tsvector
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN fabric._search_text_in((SELECT s.text_search_config FROM fabric.deployment_settings s),
                                p_content);
END $$;

-- fabric._search_text_in: the same derivation under a configuration the caller read once
-- (fabric._text_search_config()): what a set-based statement calls per row, since on Citus a
-- statement pushed to a tenant's shard may not read another table in a function it calls.
CREATE OR REPLACE FUNCTION fabric._search_text_in(p_config regconfig, p_content jsonb)
RETURNS tsvector
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.jsonb_to_tsvector(p_config, p_content, '["string"]');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._search_length: a document's length for BM25, the number of positions it holds
-- (a lexeme stored without positions counts once).
-- (plpgsql, as fabric._search_text: its plan is kept for the session, where a SQL function
-- with a SET clause is parsed and planned again for every statement that calls it, i.e.
-- for every record a single commit forms.)
CREATE OR REPLACE FUNCTION fabric._search_length(p_tsv tsvector)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT coalesce(pg_catalog.sum(coalesce(pg_catalog.array_length(u.positions, 1), 1)),
                          0)::bigint
            FROM pg_catalog.unnest(p_tsv) u);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._search_keys: the keys of the lexical index (memory_records_search_keys), one per
-- scope key and lexeme, each naming the tenant too: a lexical lookup reads the postings of
-- exactly the scopes recall resolved, never the whole tenant's. 64-bit hashes: a collision
-- can only add a candidate, which the query's own predicates (tenant, scope key, search
-- text) then drop. Migration 0022 creates it (the index needs it before sql/ is replayed) as
-- a SQL function of the same query: this plpgsql one runs that very query, so its result
-- is identical for every input and the index built by either stays valid; both must keep
-- the same query (tests/sql/test_search_keys.py compares them). plpgsql keeps its plan for the session, where the SQL function was
-- parsed and planned again for every INSERT of records (docs/benchmarks.md).
CREATE OR REPLACE FUNCTION fabric._search_keys(p_tenant_id text, p_scope_keys text[],
                                               p_lexemes text[])
RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN ARRAY(SELECT pg_catalog.hashtextextended(
                        p_tenant_id || E'\x1f' || k.key || E'\x1f' || l.lexeme, 0)
                 FROM pg_catalog.unnest(p_scope_keys) AS k(key),
                      pg_catalog.unnest(p_lexemes) AS l(lexeme));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__search_text: search text follows content, never the reverse.
-- A record is formed with the derived text (fabric.tg_memory_records__normalise, in the
-- one BEFORE INSERT trigger); after that the one change allowed is to the text the current
-- configuration derives from the content (what `memfabric db reindex-text` does after the
-- configuration changed). The stored search length (what BM25 reads) follows the search
-- text: no one sets it, every change of the text re-counts it.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__search_text()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NEW.search_length IS DISTINCT FROM OLD.search_length THEN
    PERFORM fabric._raise_rule('MF001',
      'committed memory records are immutable: search length cannot change',
      'search length is counted from the search text by the database');
  END IF;
  IF NEW.content IS NULL THEN
    NEW.search_tsv := NULL;          -- erased or window-closed: the derived text goes too
  ELSIF NEW.search_tsv IS DISTINCT FROM OLD.search_tsv
        AND NEW.search_tsv IS DISTINCT FROM fabric._search_text(NEW.content) THEN
    PERFORM fabric._raise_rule('MF001',
      'committed memory records are immutable: search text cannot change',
      'search text is derived from content; memfabric db reindex-text re-derives it');
  END IF;
  IF NEW.search_tsv IS DISTINCT FROM OLD.search_tsv THEN
    NEW.search_length := fabric._search_length(NEW.search_tsv);
  END IF;
  RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS _150_search_text ON fabric.memory_records;
-- migration 0021's bridge, until this replay: the triggers here write the search length
DROP TRIGGER IF EXISTS _999_search_length_0021 ON fabric.memory_records;
DROP FUNCTION IF EXISTS fabric.tg_memory_records__search_length_0021();
CREATE TRIGGER _150_search_text
  BEFORE UPDATE ON fabric.memory_records
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_memory_records__search_text();

-- ---------------------------------------------------------------------------------------
-- fabric._compact_search_stats: fold a tenant's deltas for some scopes into one row per
-- lexeme, dropping what sums to nothing (so an erased scope leaves no lexeme behind).
-- Each delta is moved exactly once even under concurrent compactions (a row deleted by
-- another is skipped); deltas committed meanwhile stay deltas. Commits never wait for it.
CREATE OR REPLACE FUNCTION fabric._compact_search_stats(p_tenant_id text, p_scope_keys text[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_moved bigint;
  v_rows jsonb;
  v_fold record;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus (from a shard's trigger too): the deltas deleted by one statement on the
    -- tenant's shard, folded here, inserted by another (a modifying CTE feeding another
    -- statement is planned through the coordinator, which a shard's trigger cannot reach)
    WITH moved AS (
      DELETE FROM fabric.search_stats s
       WHERE s.tenant_id = p_tenant_id AND s.scope_key = ANY (p_scope_keys)
      RETURNING s.*)
    SELECT pg_catalog.jsonb_agg(m), pg_catalog.count(*) INTO v_rows, v_moved FROM moved m;
    -- one INSERT ... VALUES per folded row: from the coordinator (compact_search_stats) an
    -- INSERT ... SELECT of values is a COPY into the shard, which row-level security refuses
    FOR v_fold IN
      SELECT m.tenant_id, m.scope_key, m.lexeme, pg_catalog.sum(m.docs) AS docs,
             pg_catalog.sum(m.length) AS length
        FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.search_stats, v_rows) m
       GROUP BY m.tenant_id, m.scope_key, m.lexeme
      HAVING pg_catalog.sum(m.docs) > 0
    LOOP
      INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
      VALUES (v_fold.tenant_id, v_fold.scope_key, v_fold.lexeme, v_fold.docs, v_fold.length);
    END LOOP;
    RETURN v_moved;
  END IF;
  WITH moved AS (
    DELETE FROM fabric.search_stats s
     WHERE s.tenant_id = p_tenant_id AND s.scope_key = ANY (p_scope_keys)
    RETURNING s.tenant_id, s.scope_key, s.lexeme, s.docs, s.length),
  folded AS (
    INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
    SELECT m.tenant_id, m.scope_key, m.lexeme, pg_catalog.sum(m.docs), pg_catalog.sum(m.length)
      FROM moved m
     GROUP BY m.tenant_id, m.scope_key, m.lexeme
    HAVING pg_catalog.sum(m.docs) > 0
    RETURNING 1)
  SELECT pg_catalog.count(*) INTO v_moved FROM moved;
  RETURN v_moved;
END $$;
REVOKE ALL ON FUNCTION fabric._compact_search_stats(text, text[]) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__search_stats: append the statistics' deltas of the records a
-- statement gave or took search text (never an update in place: commits in one scope
-- never wait for each other). A scope that lost search text is compacted at once, so the
-- lexemes of erased content do not outlive it.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__search_stats()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_group record;
  v_old jsonb;
  v_new jsonb;
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus: this runs on the tenant's shard, where a statement on another distributed
    -- table cannot read the transition tables: they are read here first (docs/citus.md)
    v_new := (SELECT pg_catalog.jsonb_agg(n) FROM new_rows n);
    IF TG_OP = 'UPDATE' THEN
      v_old := (SELECT pg_catalog.jsonb_agg(o) FROM old_rows o);
    END IF;
    IF TG_OP = 'INSERT' THEN
      -- each record's lexemes unnested once and grouped once: a lexeme's row counts the
      -- records holding it; the scope's row sums the records' stored search lengths
      INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
      SELECT n.tenant_id, n.scope_key, '', pg_catalog.count(*), pg_catalog.sum(n.search_length)
        FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_new) n
       WHERE n.search_tsv IS NOT NULL AND n.scope_key IS NOT NULL
       GROUP BY n.tenant_id, n.scope_key
      UNION ALL
      SELECT n.tenant_id, n.scope_key, u.lexeme, pg_catalog.count(*), 0
        FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_new) n
        CROSS JOIN LATERAL pg_catalog.unnest(pg_catalog.tsvector_to_array(n.search_tsv)) u(lexeme)
       WHERE n.search_tsv IS NOT NULL AND n.scope_key IS NOT NULL
       GROUP BY n.tenant_id, n.scope_key, u.lexeme;
      RETURN NULL;
    END IF;

    INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
    WITH changed AS (
      SELECT o.tenant_id, o.scope_key AS old_key, o.search_tsv AS old_tsv,
             o.search_length AS old_length, n.scope_key AS new_key, n.search_tsv AS new_tsv,
             n.search_length AS new_length
        FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_old) o
        JOIN pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_new) n USING (memory_id)
       WHERE (o.search_tsv, o.scope_key) IS DISTINCT FROM (n.search_tsv, n.scope_key)),
    delta AS (
      SELECT c.tenant_id, c.old_key AS scope_key, c.old_tsv AS search_tsv,
             c.old_length AS search_length, -1 AS sign
        FROM changed c WHERE c.old_tsv IS NOT NULL AND c.old_key IS NOT NULL
      UNION ALL
      SELECT c.tenant_id, c.new_key, c.new_tsv, c.new_length, 1
        FROM changed c WHERE c.new_tsv IS NOT NULL AND c.new_key IS NOT NULL)
    SELECT d.tenant_id, d.scope_key, '', pg_catalog.sum(d.sign),
           pg_catalog.sum(d.sign * d.search_length)
      FROM delta d GROUP BY d.tenant_id, d.scope_key
    UNION ALL
    SELECT d.tenant_id, d.scope_key, u.lexeme, pg_catalog.sum(d.sign), 0
      FROM delta d
      CROSS JOIN LATERAL pg_catalog.unnest(pg_catalog.tsvector_to_array(d.search_tsv)) u(lexeme)
     GROUP BY d.tenant_id, d.scope_key, u.lexeme;
    FOR v_group IN
      SELECT o.tenant_id, pg_catalog.array_agg(DISTINCT o.scope_key) AS scope_keys
        FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_old) o
        JOIN pg_catalog.jsonb_populate_recordset(NULL::fabric.memory_records, v_new) n USING (memory_id)
       WHERE o.search_tsv IS NOT NULL AND o.scope_key IS NOT NULL
         AND (o.search_tsv, o.scope_key) IS DISTINCT FROM (n.search_tsv, n.scope_key)
       GROUP BY o.tenant_id
    LOOP
      PERFORM fabric._compact_search_stats(v_group.tenant_id, v_group.scope_keys);
    END LOOP;
    RETURN NULL;
  END IF;
  IF TG_OP = 'INSERT' THEN
    -- each record's lexemes unnested once and grouped once: a lexeme's row counts the
    -- records holding it; the scope's row sums the records' stored search lengths
    INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
    SELECT n.tenant_id, n.scope_key, '', pg_catalog.count(*), pg_catalog.sum(n.search_length)
      FROM new_rows n
     WHERE n.search_tsv IS NOT NULL AND n.scope_key IS NOT NULL
     GROUP BY n.tenant_id, n.scope_key
    UNION ALL
    SELECT n.tenant_id, n.scope_key, u.lexeme, pg_catalog.count(*), 0
      FROM new_rows n
      CROSS JOIN LATERAL pg_catalog.unnest(pg_catalog.tsvector_to_array(n.search_tsv)) u(lexeme)
     WHERE n.search_tsv IS NOT NULL AND n.scope_key IS NOT NULL
     GROUP BY n.tenant_id, n.scope_key, u.lexeme;
    RETURN NULL;
  END IF;

  INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
  WITH changed AS (
    SELECT o.tenant_id, o.scope_key AS old_key, o.search_tsv AS old_tsv,
           o.search_length AS old_length, n.scope_key AS new_key, n.search_tsv AS new_tsv,
           n.search_length AS new_length
      FROM old_rows o JOIN new_rows n USING (memory_id)
     WHERE (o.search_tsv, o.scope_key) IS DISTINCT FROM (n.search_tsv, n.scope_key)),
  delta AS (
    SELECT c.tenant_id, c.old_key AS scope_key, c.old_tsv AS search_tsv,
           c.old_length AS search_length, -1 AS sign
      FROM changed c WHERE c.old_tsv IS NOT NULL AND c.old_key IS NOT NULL
    UNION ALL
    SELECT c.tenant_id, c.new_key, c.new_tsv, c.new_length, 1
      FROM changed c WHERE c.new_tsv IS NOT NULL AND c.new_key IS NOT NULL)
  SELECT d.tenant_id, d.scope_key, '', pg_catalog.sum(d.sign),
         pg_catalog.sum(d.sign * d.search_length)
    FROM delta d GROUP BY d.tenant_id, d.scope_key
  UNION ALL
  SELECT d.tenant_id, d.scope_key, u.lexeme, pg_catalog.sum(d.sign), 0
    FROM delta d
    CROSS JOIN LATERAL pg_catalog.unnest(pg_catalog.tsvector_to_array(d.search_tsv)) u(lexeme)
   GROUP BY d.tenant_id, d.scope_key, u.lexeme;
  FOR v_group IN
    SELECT o.tenant_id, pg_catalog.array_agg(DISTINCT o.scope_key) AS scope_keys
      FROM old_rows o JOIN new_rows n USING (memory_id)
     WHERE o.search_tsv IS NOT NULL AND o.scope_key IS NOT NULL
       AND (o.search_tsv, o.scope_key) IS DISTINCT FROM (n.search_tsv, n.scope_key)
     GROUP BY o.tenant_id
  LOOP
    PERFORM fabric._compact_search_stats(v_group.tenant_id, v_group.scope_keys);
  END LOOP;
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER _850_search_stats_insert
  AFTER INSERT ON fabric.memory_records
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__search_stats();
CREATE OR REPLACE TRIGGER _850_search_stats_update
  AFTER UPDATE ON fabric.memory_records
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_memory_records__search_stats();

-- ---------------------------------------------------------------------------------------
-- fabric_api.compact_search_stats: fold the statistics' deltas of up to p_limit scopes
-- (those changed since their last compaction). Only for speed: recall reads deltas and
-- folded rows alike, so statistics are exact whether or not this ever runs.
CREATE OR REPLACE FUNCTION fabric_api.compact_search_stats(p_limit integer DEFAULT 100)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_keys text[];
  v_scopes bigint := 0;
  v_moved bigint := 0;
BEGIN
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'p_limit must be between 1 and 100000',
      'the number of scopes compacted in one call');
  END IF;
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t ORDER BY t.tenant_id LOOP
    EXIT WHEN v_scopes >= p_limit;
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);
    v_keys := ARRAY(SELECT s.scope_key FROM fabric.search_stats s
                     WHERE s.tenant_id = v_tenant AND s.lexeme = ''
                     GROUP BY s.scope_key HAVING pg_catalog.count(*) > 1
                     ORDER BY s.scope_key LIMIT p_limit - v_scopes);
    IF pg_catalog.cardinality(v_keys) > 0 THEN
      v_moved := v_moved + fabric._compact_search_stats(v_tenant, v_keys);
      v_scopes := v_scopes + pg_catalog.cardinality(v_keys);
    END IF;
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
  RETURN pg_catalog.jsonb_build_object('scopes', v_scopes, 'deltas_folded', v_moved);
END $$;
COMMENT ON FUNCTION fabric_api.compact_search_stats(integer) IS
  'Fold the search statistics'' deltas of up to p_limit scopes (speed only; committer). '
  'Example: SELECT fabric_api.compact_search_stats(100);';

-- ---------------------------------------------------------------------------------------
-- fabric.reindex_search_text: re-derive every record's search text with the current
-- configuration and rebuild the statistics from it. Run by the migration role as
-- fabric_owner (`memfabric db reindex-text`) after text_search_config changed.
CREATE OR REPLACE FUNCTION fabric.reindex_search_text()
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_changed bigint;
  v_records bigint := 0;
BEGIN
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t ORDER BY t.tenant_id LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);
    UPDATE fabric.memory_records m SET search_tsv = fabric._search_text(m.content)
     WHERE m.tenant_id = v_tenant AND m.content IS NOT NULL
       AND m.search_tsv IS DISTINCT FROM fabric._search_text(m.content);
    GET DIAGNOSTICS v_changed = ROW_COUNT;
    v_records := v_records + v_changed;
    DELETE FROM fabric.search_stats s WHERE s.tenant_id = v_tenant;
    INSERT INTO fabric.search_stats (tenant_id, scope_key, lexeme, docs, length)
    SELECT m.tenant_id, m.scope_key, '', pg_catalog.count(*), pg_catalog.sum(m.search_length)
      FROM fabric.memory_records m
     WHERE m.tenant_id = v_tenant AND m.search_tsv IS NOT NULL AND m.scope_key IS NOT NULL
     GROUP BY m.tenant_id, m.scope_key
    UNION ALL
    SELECT m.tenant_id, m.scope_key, u.lexeme, pg_catalog.count(*), 0
      FROM fabric.memory_records m
      CROSS JOIN LATERAL pg_catalog.unnest(pg_catalog.tsvector_to_array(m.search_tsv)) u(lexeme)
     WHERE m.tenant_id = v_tenant AND m.search_tsv IS NOT NULL AND m.scope_key IS NOT NULL
     GROUP BY m.tenant_id, m.scope_key, u.lexeme;
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
  RETURN pg_catalog.jsonb_build_object(
    'text_search_config', fabric._text_search_config()::text, 'records_reindexed', v_records);
END $$;
REVOKE ALL ON FUNCTION fabric.reindex_search_text() FROM PUBLIC;
