-- Recall: an authorized tool call whose scope is resolved (os-agt-012) and pushed into the
-- store query before retrieval. Every recall -- served, partial or denied -- leaves exactly
-- one audit event with identifiers, never content.

-- ---------------------------------------------------------------------------------------
-- fabric.resolve_recall_scope: the os-agt-012 path. Intersects the request with the run
-- and with memory_profile.recall_scope; returns the resolved scope, the scope keys to
-- push down, the tiers served and denied, and a reason when the request must be denied.
CREATE OR REPLACE FUNCTION fabric.resolve_recall_scope(p_profile jsonb, p_run fabric.runs,
                                                       p_request jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_scope jsonb := coalesce(p_request -> 'scope', '{}');
  v_profile_tiers text[];
  v_profile_vis text[];
  v_tiers text[];
  v_vis text[];
  v_served_vis text[] := '{}';
  v_keys text[] := '{}';
  v_level text;
  v_reason text;
  v_sorted boolean;
  v_readable text[];
  v_denied text[];
BEGIN
  -- The profile's tiers and visibility and the request's (NULL when it names none: the
  -- profile's then). Arrays of at most one element need no DISTINCT: then they are read by
  -- simple expressions (JSON_QUERY ... RETURNING text[] is the elements' text, as
  -- jsonb_array_elements_text gives it), else by one statement.
  IF coalesce(pg_catalog.jsonb_typeof(p_profile #> '{recall_scope,tiers}'), 'array') = 'array'
     AND coalesce(pg_catalog.jsonb_typeof(p_profile #> '{recall_scope,visibility}'), 'array') = 'array'
     AND (NOT p_request ? 'tiers'
          OR (pg_catalog.jsonb_typeof(p_request -> 'tiers') = 'array'
              AND pg_catalog.jsonb_array_length(p_request -> 'tiers') <= 1))
     AND (pg_catalog.jsonb_typeof(v_scope -> 'visibility') IS DISTINCT FROM 'array'
          OR pg_catalog.jsonb_array_length(v_scope -> 'visibility') <= 1) THEN
    v_profile_tiers := coalesce(JSON_QUERY(p_profile #> '{recall_scope,tiers}', '$' RETURNING text[]), '{}');
    v_profile_vis := coalesce(JSON_QUERY(p_profile #> '{recall_scope,visibility}', '$' RETURNING text[]), '{}');
    v_tiers := CASE WHEN p_request ? 'tiers'
                    THEN JSON_QUERY(p_request -> 'tiers', '$' RETURNING text[]) END;
    v_vis := CASE
      WHEN pg_catalog.jsonb_typeof(v_scope -> 'visibility') = 'string' THEN ARRAY[v_scope ->> 'visibility']
      WHEN pg_catalog.jsonb_typeof(v_scope -> 'visibility') = 'array'
        THEN JSON_QUERY(v_scope -> 'visibility', '$' RETURNING text[]) END;
  ELSE
    SELECT ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                   coalesce(p_profile #> '{recall_scope,tiers}', '[]'))),
           ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                   coalesce(p_profile #> '{recall_scope,visibility}', '[]'))),
           CASE WHEN p_request ? 'tiers'
                THEN ARRAY(SELECT DISTINCT pg_catalog.jsonb_array_elements_text(p_request -> 'tiers')) END,
           CASE
             WHEN pg_catalog.jsonb_typeof(v_scope -> 'visibility') = 'string' THEN ARRAY[v_scope ->> 'visibility']
             WHEN pg_catalog.jsonb_typeof(v_scope -> 'visibility') = 'array'
               THEN ARRAY(SELECT DISTINCT pg_catalog.jsonb_array_elements_text(v_scope -> 'visibility')) END
      INTO v_profile_tiers, v_profile_vis, v_tiers, v_vis;
  END IF;
  v_tiers := coalesce(v_tiers, v_profile_tiers);
  v_vis := coalesce(v_vis, v_profile_vis);

  -- (a request without a scope or requesting_agent, the common one, can break none of these:
  -- the expression is not built)
  IF v_scope <> '{}' OR p_request ? 'requesting_agent' THEN
    v_reason := CASE
      WHEN v_scope ->> 'tenant_id' IS DISTINCT FROM p_run.tenant_id AND v_scope ? 'tenant_id' THEN
        'scope.tenant_id is not the tenant of the run: there is no cross-tenant recall'
      WHEN v_scope ? 'subject_id' AND v_scope ->> 'subject_id' IS DISTINCT FROM p_run.subject_id THEN
        'scope.subject_id is not the subject of the run: a request can only narrow the run''s scope'
      WHEN v_scope ? 'session_id' AND v_scope ->> 'session_id' IS DISTINCT FROM p_run.session_id THEN
        'scope.session_id is not the session of the run: a request can only narrow the run''s scope'
      WHEN v_scope ? 'agent_id' AND v_scope ->> 'agent_id' IS DISTINCT FROM p_run.agent_id THEN
        'scope.agent_id is not the calling agent'
      WHEN p_request ? 'requesting_agent' AND p_request ->> 'requesting_agent' IS DISTINCT FROM p_run.agent_id THEN
        'requesting_agent is not the calling agent'
    END;
  END IF;
  -- (a visibility the profile holds, the common case, needs no statement to tell)
  IF v_reason IS NULL AND NOT coalesce(v_vis <@ v_profile_vis, false) THEN
    v_reason := CASE
      WHEN EXISTS (SELECT 1 FROM pg_catalog.unnest(v_vis) x WHERE NOT x = ANY (v_profile_vis)) THEN
        'visibility ' || (SELECT pg_catalog.string_agg(x, ', ' ORDER BY x) FROM pg_catalog.unnest(v_vis) x
                          WHERE NOT x = ANY (v_profile_vis))
        || ' is outside the agent''s memory_profile.recall_scope.visibility'
    END;
  END IF;

  -- The levels served (a run without a session or subject serves none of those) and their
  -- scope keys, in the order asked. Levels that are all known (the common case) are mapped
  -- by two expressions; any other list (an unknown level gets no key) level by level.
  IF v_vis <@ ARRAY['session', 'agent', 'subject', 'tenant'] THEN
    v_served_vis := pg_catalog.array_remove(pg_catalog.array_remove(v_vis,
                      CASE WHEN p_run.session_id IS NULL THEN 'session' END),
                      CASE WHEN p_run.subject_id IS NULL THEN 'subject' END);
    v_keys := pg_catalog.array_replace(pg_catalog.array_replace(pg_catalog.array_replace(
                v_served_vis, 'session', 'session:' || p_run.session_id),
                'agent', 'agent:' || p_run.agent_id), 'subject', 'subject:' || p_run.subject_id);
  ELSE
    FOREACH v_level IN ARRAY v_vis LOOP
      CONTINUE WHEN v_level = 'session' AND p_run.session_id IS NULL;
      CONTINUE WHEN v_level = 'subject' AND p_run.subject_id IS NULL;
      v_served_vis := v_served_vis || v_level;
      v_keys := v_keys || CASE v_level
        WHEN 'session' THEN 'session:' || p_run.session_id
        WHEN 'agent' THEN 'agent:' || p_run.agent_id
        WHEN 'subject' THEN 'subject:' || p_run.subject_id
        WHEN 'tenant' THEN 'tenant' END;
    END LOOP;
  END IF;

  -- The answer's lists, sorted. When the served visibility and the tiers are already in
  -- order and every tier is readable (the common case: the profile's lists), they are the
  -- lists themselves, told without a statement; else one statement sorts and splits them.
  v_sorted := coalesce(v_tiers <@ v_profile_tiers, false);
  FOR i IN 2 .. pg_catalog.cardinality(v_tiers) LOOP
    EXIT WHEN NOT v_sorted;
    v_sorted := coalesce(v_tiers[i - 1] <= v_tiers[i], false);
  END LOOP;
  FOR i IN 2 .. pg_catalog.cardinality(v_served_vis) LOOP
    EXIT WHEN NOT v_sorted;
    v_sorted := coalesce(v_served_vis[i - 1] <= v_served_vis[i], false);
  END LOOP;
  IF v_sorted THEN
    v_readable := v_tiers;
    v_denied := '{}';
  ELSE
    SELECT ARRAY(SELECT x FROM pg_catalog.unnest(v_served_vis) x ORDER BY x),
           ARRAY(SELECT x FROM pg_catalog.unnest(v_tiers) x ORDER BY x),
           ARRAY(SELECT x FROM pg_catalog.unnest(v_tiers) x WHERE x = ANY (v_profile_tiers) ORDER BY x),
           ARRAY(SELECT x FROM pg_catalog.unnest(v_tiers) x WHERE NOT x = ANY (v_profile_tiers) ORDER BY x)
      INTO v_served_vis, v_tiers, v_readable, v_denied;
  END IF;

  RETURN pg_catalog.jsonb_build_object(
    'scope_applied', pg_catalog.jsonb_build_object(
      'tenant_id', p_run.tenant_id, 'subject_id', p_run.subject_id,
      'session_id', p_run.session_id, 'agent_id', p_run.agent_id,
      'visibility', pg_catalog.to_jsonb(v_served_vis)),
    'scope_keys', pg_catalog.to_jsonb(v_keys),
    'tiers_requested', pg_catalog.to_jsonb(v_tiers),
    'tiers', pg_catalog.to_jsonb(v_readable),
    'tiers_denied', pg_catalog.to_jsonb(v_denied),
    'denied_reason', v_reason);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._vector_tiers: the tiers that have a vector collection (the projector's indexed
-- tiers). A readable tier outside it is served lexically in semantic and hybrid recall.
CREATE OR REPLACE FUNCTION fabric._vector_tiers()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT ARRAY['episodic', 'procedural', 'profile', 'semantic']::text[]
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._any_term_query: the OR of some lexemes as a tsquery. Lexemes are quoted as
-- values of the tsquery syntax (quotes and backslashes doubled), never parsed as operators.
CREATE OR REPLACE FUNCTION fabric._any_term_query(p_lexemes text[])
RETURNS tsquery
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- PL/pgSQL, not SQL: its plan is kept for the session instead of made on every recall.
  RETURN (SELECT pg_catalog.string_agg(
            '''' || pg_catalog.replace(pg_catalog.replace(l, '\', '\\'), '''', '''''') || '''',
            ' | ' ORDER BY l)::tsquery
          FROM pg_catalog.unnest(p_lexemes) l);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_envelope: a record as filter-only and text recall answer it, built once:
-- the envelope (fabric._record_envelope's fields, its one definition kept equal to this one
-- by tests/sql/test_recall_audit_cost.py) with its score (null without a ranking) and
-- retrieval ({} without one), which recall appended to each envelope with || before (a
-- second encoding of every record it served: about a sixth of governed recall's own CPU,
-- docs/benchmarks.md). Fused lists (semantic, hybrid, graph) still append theirs.
DROP FUNCTION IF EXISTS fabric._recall_envelope(fabric.memory_records, jsonb);
CREATE OR REPLACE FUNCTION fabric._recall_envelope(p_record fabric.memory_records,
                                                   p_derived_from jsonb,
                                                   p_score numeric DEFAULT NULL,
                                                   p_retrieval jsonb DEFAULT '{}')
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.jsonb_build_object(
    'memory_id', p_record.memory_id,
    'tier', p_record.tier,
    'scope', pg_catalog.jsonb_build_object('tenant_id', p_record.tenant_id,
      'subject_id', p_record.subject_id, 'agent_id', p_record.agent_id,
      'session_id', p_record.session_id, 'visibility', p_record.visibility),
    'content', p_record.content,
    'content_hash', p_record.content_hash,
    'provenance', pg_catalog.jsonb_build_object('source_event_id', p_record.source_event_id,
      'correlation_id', p_record.correlation_id, 'causation_id', p_record.causation_id,
      'formed_by', p_record.formed_by, 'formation_method', p_record.formation_method),
    'derived_from', p_derived_from,
    'confidence', p_record.confidence,
    'validity_interval', pg_catalog.jsonb_build_object('valid_from', p_record.valid_from,
                                                       'valid_until', p_record.valid_until),
    'recorded_at', p_record.recorded_at,
    'consolidation_state', p_record.consolidation_state,
    'supersedes', p_record.supersedes,
    'retention_class', p_record.retention_class,
    'compliance_labels', pg_catalog.to_jsonb(p_record.compliance_labels),
    'version', p_record.version,
    'business_instance_id', p_record.business_instance_id,
    'score', p_score,
    'retrieval', p_retrieval);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_candidates: the one retrieval query. Owned by fabric_retriever (BYPASSRLS,
-- owns nothing else) so full-text matching can use its GIN index; tenant, scope keys,
-- tiers, validity, confidence and label exclusions are explicit predicates of the query,
-- never applied after fetching. One statement, one snapshot: retrieval and hydration agree.
--
-- With a query (and no candidates) it is lexical retrieval: any record holding any of the
-- query's lexemes (stop words removed by the deployment's configuration), ranked by BM25
-- (k1 1.2, b 0.75). Document frequencies, document count and average length come from
-- fabric.search_stats summed over exactly the requested tenant and scope keys, so records
-- outside the caller's scope never change its ranking. Missing or stale statistics (bulk
-- loads) degrade the ranking, never the answer: df is floored at 0, N at the largest df.
-- The candidate set is bounded by deployment_settings.recall_lexical_bound (see below).
-- The score returned here is BM25 itself; fabric_api.recall turns it into a rank.
SET LOCAL ROLE fabric_retriever;
CREATE OR REPLACE FUNCTION fabric._recall_candidates(
  p_tenant_id text,
  p_scope_keys text[],
  p_tiers text[],
  p_valid_at timestamptz,
  p_min_confidence double precision,
  p_excluded_labels text[],
  p_query text,
  p_candidate_ids uuid[],
  p_candidate_scores double precision[],
  p_limit integer
)
RETURNS TABLE (memory_id uuid, score double precision, record jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
  c_k1 CONSTANT double precision := 1.2;
  c_b CONSTANT double precision := 0.75;
  v_lexemes text[];
  v_df double precision[];
  v_idf double precision[];
  v_tsq tsquery;
  v_docs double precision;
  v_total double precision;
  v_n double precision;
  v_avgdl double precision;
  v_bound integer;
  v_match text[];
  v_top integer;
  v_max_df double precision;
  v_postings bigint[];
  v_walk_keys text[];
  v_walk_lexemes text[];
  v_walk_queries tsquery[];
  v_walk_reads integer[];
  v_post_keys text[];
  v_post_lexemes text[];
  v_scores jsonb;
  v_set text;  -- (set_config as an assignment: a simple expression, without a statement)
  -- On a Citus cluster the lexical statements are simpler ones (below): Citus sends a
  -- statement on the tenant's rows to its shard whole, so it may call no function that reads
  -- a table, join a shard to values of this node only as a subquery of its own, nor join a
  -- shard's rows back by ctid.
  v_citus boolean := coalesce(
    pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local', false);
  v_config regconfig;
  v_found_lexemes text[];
  v_found_df double precision[];
BEGIN
  IF p_tenant_id IS NULL OR p_scope_keys IS NULL OR p_tiers IS NULL
     OR pg_catalog.cardinality(p_tiers) = 0 OR pg_catalog.cardinality(p_scope_keys) = 0 THEN
    RETURN;                                   -- an unresolved scope matches nothing
  END IF;

  IF p_query IS NOT NULL AND p_candidate_ids IS NULL THEN
    -- Lexical statements run on generic plans, made once per session: planning them again
    -- on every call (the function's force_custom_plan, kept for the by-ids statement below)
    -- cost more than the whole retrieval in a small scope (backend CPU of a 10-word question
    -- over a 40-record scope: 4.5 ms custom, 1.3 ms generic, same plans; docs/benchmarks.md).
    -- The function's SET clause restores the setting when it returns.
    v_set := pg_catalog.set_config('plan_cache_mode',
      -- on Citus a custom plan: a generic one cannot be pruned to the tenant's shard
      CASE WHEN pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
           THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);
    IF v_citus THEN
      -- the query's lexemes here, their document frequencies in one statement on the shard
      v_config := fabric._text_search_config();
      v_lexemes := ARRAY(SELECT l.lexeme FROM pg_catalog.unnest(pg_catalog.tsvector_to_array(
                           pg_catalog.to_tsvector(v_config, p_query))) AS l(lexeme)
                         ORDER BY l.lexeme);
      SELECT pg_catalog.array_agg(d.lexeme), pg_catalog.array_agg(d.df)
        INTO v_found_lexemes, v_found_df
        FROM (SELECT s.lexeme,
                     GREATEST(coalesce(pg_catalog.sum(s.docs), 0), 0)::double precision AS df
                FROM fabric.search_stats s
               WHERE s.tenant_id = p_tenant_id AND s.scope_key = ANY (p_scope_keys)
                 AND s.lexeme = ANY (v_lexemes)
               GROUP BY s.lexeme) d;
      v_df := ARRAY(SELECT coalesce(f.df, 0)
                      FROM pg_catalog.unnest(v_lexemes) WITH ORDINALITY AS l(lexeme, i)
                      LEFT JOIN ROWS FROM (pg_catalog.unnest(v_found_lexemes),
                                           pg_catalog.unnest(v_found_df)) AS f(lexeme, df)
                        ON f.lexeme = l.lexeme
                     ORDER BY l.i);
      IF pg_catalog.cardinality(v_lexemes) = 0 THEN
        v_lexemes := NULL;
      END IF;
    ELSE
    SELECT pg_catalog.array_agg(t.lexeme ORDER BY t.lexeme),
           pg_catalog.array_agg(t.df ORDER BY t.lexeme)
      INTO v_lexemes, v_df
      FROM (SELECT l.lexeme, d.df   -- a tsvector's lexemes are distinct
              FROM pg_catalog.unnest(pg_catalog.tsvector_to_array(
                     pg_catalog.to_tsvector(fabric._text_search_config(), p_query))) AS l(lexeme)
              -- one index lookup per lexeme (a join would read the scopes' whole statistics)
              CROSS JOIN LATERAL (
                SELECT GREATEST(coalesce(pg_catalog.sum(s.docs), 0), 0)::double precision AS df
                  FROM fabric.search_stats s
                 WHERE s.tenant_id = p_tenant_id AND s.scope_key = ANY (p_scope_keys)
                   AND s.lexeme = l.lexeme) d) t;
    END IF;
    IF v_lexemes IS NULL THEN
      RETURN;                                 -- nothing searchable (empty, stop words only)
    END IF;
    SELECT pg_catalog.sum(s.docs), pg_catalog.sum(s.length) INTO v_docs, v_total
      FROM fabric.search_stats s
     WHERE s.tenant_id = p_tenant_id AND s.scope_key = ANY (p_scope_keys) AND s.lexeme = '';
    v_n := GREATEST(coalesce(v_docs, 0),
                               (SELECT pg_catalog.max(d) FROM pg_catalog.unnest(v_df) d), 1);
    v_avgdl := CASE WHEN v_docs > 0 AND v_total > 0 THEN v_total / v_docs END;
    v_idf := ARRAY(SELECT pg_catalog.ln(1 + (v_n - x.d + 0.5) / (x.d + 0.5))
                     FROM pg_catalog.unnest(v_df) WITH ORDINALITY AS x(d, i) ORDER BY x.i);
    -- The candidate bound: match the rarest lexemes while their summed frequency stays
    -- within recall_lexical_bound (the rarest always), score every query lexeme a candidate
    -- holds. A record holding only very common words is left out; it would rank low anyway.
    SELECT s.recall_lexical_bound, s.recall_lexical_top INTO v_bound, v_top
      FROM fabric.deployment_settings s;
    SELECT pg_catalog.array_agg(x.lexeme ORDER BY x.n), pg_catalog.max(x.df) INTO v_match, v_max_df
      FROM (SELECT l.lexeme, l.df, pg_catalog.row_number() OVER w AS n,
                   pg_catalog.sum(l.df) OVER w AS cum
              FROM ROWS FROM (pg_catalog.unnest(v_lexemes), pg_catalog.unnest(v_df)) AS l(lexeme, df)
            WINDOW w AS (ORDER BY l.df, l.lexeme ROWS UNBOUNDED PRECEDING)) x
     WHERE v_bound = 0 OR x.n = 1 OR x.cum <= v_bound;
    v_tsq := fabric._any_term_query(v_match);
    -- The per-lexeme bound (recall_lexical_top, N; at least p_limit): per resolved scope
    -- key, a matched lexeme is read from its postings (df records), unless walking the key
    -- in recall's order (memory_records_topk: most confident, then most recent) would read
    -- fewer records: about 2 N S / df per tier (S the key's records; twice what finding N
    -- holders takes on average). Then only the first N holders per tier that walk meets are
    -- candidates (and it stops after 2 N S / df records), scored exactly like the others.
    -- Statistics of the key alone decide; missing ones (df 0) mean postings, never a bound.
    -- A walk is chosen only if df^2 > 2 N S tiers, so never for a lexeme held by at most
    -- 2 N records per tier (S >= df), nor, with one scope key (whose S and df are the sums
    -- above), when the most frequent lexeme fails it: then the per-key statistics are not
    -- even read.
    v_top := CASE WHEN v_top > 0 THEN GREATEST(v_top, p_limit) ELSE 0 END;
    IF NOT v_citus  -- (no walk on a cluster: its per-key statistics are a correlated read)
       AND v_top > 0 AND v_max_df > 2.0 * v_top * pg_catalog.cardinality(p_tiers)
       AND (pg_catalog.cardinality(p_scope_keys) > 1
            OR v_max_df * v_max_df > 2.0 * v_top * GREATEST(coalesce(v_docs, 0), v_max_df)
                                     * pg_catalog.cardinality(p_tiers)) THEN
      SELECT pg_catalog.array_agg(p.key ORDER BY p.key, p.lexeme) FILTER (WHERE p.walk),
             pg_catalog.array_agg(p.lexeme ORDER BY p.key, p.lexeme) FILTER (WHERE p.walk),
             pg_catalog.array_agg(p.reads ORDER BY p.key, p.lexeme) FILTER (WHERE p.walk),
             pg_catalog.array_agg(p.key) FILTER (WHERE NOT p.walk),
             pg_catalog.array_agg(p.lexeme) FILTER (WHERE NOT p.walk)
        INTO v_walk_keys, v_walk_lexemes, v_walk_reads, v_post_keys, v_post_lexemes
        FROM (SELECT d.key, d.lexeme, r.reads,
                     v_top > 0 AND d.df > 0
                     AND r.reads * pg_catalog.cardinality(p_tiers)::bigint < d.df AS walk
                FROM (SELECT k.key, l.lexeme,
                             (SELECT coalesce(pg_catalog.sum(s.docs), 0) FROM fabric.search_stats s
                               WHERE s.tenant_id = p_tenant_id AND s.scope_key = k.key
                                 AND s.lexeme = l.lexeme) AS df,
                             (SELECT coalesce(pg_catalog.sum(s.docs), 0) FROM fabric.search_stats s
                               WHERE s.tenant_id = p_tenant_id AND s.scope_key = k.key
                                 AND s.lexeme = '') AS docs
                        FROM (SELECT DISTINCT x.key FROM pg_catalog.unnest(p_scope_keys) x(key)) k
                        CROSS JOIN pg_catalog.unnest(v_match) l(lexeme)) d
                CROSS JOIN LATERAL (
                  SELECT LEAST(pg_catalog.ceil(2.0 * v_top * GREATEST(d.docs, d.df)
                                               / GREATEST(d.df, 1)), 2147483647)::integer AS reads) r
             ) p;
    END IF;
    IF v_citus THEN
      -- One statement on the tenant's shard: the matching records (postings through
      -- memory_records_search_keys, then every rule), scored by the same BM25, the p_limit
      -- winners built as the table's row type (on a worker a row of a shard) with their
      -- lineage (colocated).
      RETURN QUERY
        SELECT w.memory_id, w.score, fabric._recall_envelope(w.rec, d.derived_from,  -- as below
                 pg_catalog.round(((1.0 / (60 + pg_catalog.row_number() OVER o))
                                   / (1.0 / 61)::double precision)::numeric, 6),
                 pg_catalog.jsonb_build_object('lexical', pg_catalog.row_number() OVER o))
        FROM (SELECT c.memory_id, bm.score, ROW(c.*)::fabric.memory_records AS rec,
                     c.confidence, c.valid_from, c.recorded_at
                FROM fabric.memory_records c
                CROSS JOIN LATERAL (
                  SELECT GREATEST(c.search_length, 1)::double precision AS n) dl
                CROSS JOIN LATERAL (
                  SELECT coalesce(pg_catalog.sum(q.idf * tf.n * (c_k1 + 1)
                           / (tf.n + c_k1 * (1 - c_b + c_b * dl.n / coalesce(v_avgdl, dl.n)))),
                           0) AS score
                    FROM pg_catalog.unnest(pg_catalog.ts_filter(
                           pg_catalog.setweight(c.search_tsv, 'A', v_lexemes), '{a}')) u
                    JOIN ROWS FROM (pg_catalog.unnest(v_lexemes), pg_catalog.unnest(v_idf))
                           AS q(lexeme, idf) ON q.lexeme = u.lexeme
                    CROSS JOIN LATERAL (SELECT coalesce(pg_catalog.array_length(u.positions, 1), 1)
                                                 ::double precision AS n) tf
                ) bm
               WHERE c.tenant_id = p_tenant_id
                 AND fabric._search_keys(c.tenant_id, ARRAY[c.scope_key],
                                         pg_catalog.tsvector_to_array(c.search_tsv))
                     OPERATOR(pg_catalog.&&) fabric._search_keys(p_tenant_id, p_scope_keys, v_match)
                 AND c.search_tsv @@ v_tsq
                 AND c.scope_key = ANY (p_scope_keys)
                 AND c.tier = ANY (p_tiers)
                 AND c.consolidation_state IN ('raw', 'consolidated', 'reflected')
                 AND c.content IS NOT NULL
                 AND c.valid_from <= p_valid_at
                 AND (c.valid_until IS NULL OR c.valid_until > p_valid_at)
                 AND c.confidence >= p_min_confidence
                 AND NOT (c.compliance_labels && p_excluded_labels)
               ORDER BY bm.score DESC, c.confidence DESC, c.valid_from DESC, c.recorded_at DESC,
                        c.memory_id
               LIMIT p_limit) w
        CROSS JOIN LATERAL (
          SELECT coalesce(pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id),
                          '[]') AS derived_from
            FROM fabric.memory_lineage l
           WHERE l.tenant_id = p_tenant_id AND l.memory_id = w.memory_id) d
        WINDOW o AS (ORDER BY w.score DESC, w.confidence DESC, w.valid_from DESC,
                     w.recorded_at DESC, w.memory_id)
        ORDER BY w.score DESC, w.confidence DESC, w.valid_from DESC, w.recorded_at DESC,
                 w.memory_id;
      RETURN;
    END IF;
    IF v_walk_keys IS NULL THEN
      -- Candidates are scored and sorted as narrow rows (id, score, order keys); only the
      -- p_limit winners are read whole (by their row address, within this one statement:
      -- the same row version) and built.
      RETURN QUERY
        -- (each record as text recall answers it, given its rank in this order: score
        -- 1 / (60 + rank) over the best, 1 / 61, and retrieval {"lexical": rank}, what
        -- fabric._recall_fused gives a single lexical list; a fused list replaces both)
        SELECT m.memory_id, w.score, fabric._recall_envelope(m, d.derived_from,
                 pg_catalog.round(((1.0 / (60 + pg_catalog.row_number() OVER o))
                                   / (1.0 / 61)::double precision)::numeric, 6),
                 pg_catalog.jsonb_build_object('lexical', pg_catalog.row_number() OVER o))
        FROM (SELECT m.row_id, m.memory_id, bm.score, m.confidence, m.valid_from,
                     m.recorded_at
        -- The postings of the matched lexemes in exactly these scope keys, read through
        -- memory_records_search_keys alone (its keys hold tenant and scope key); every rule
        -- is checked on each posting right after (the WHERE below). The scan sits in its
        -- own subquery (OFFSET 0) so that the generic plan, which cannot know how few the
        -- postings are, does not AND them with a scan of the tenant's primary key or of
        -- memory_records_topk: measured at 1,000,000 records, that scan read the scope's
        -- 9,500 index entries to narrow 69 postings (docs/benchmarks.md).
        FROM (SELECT c.ctid AS row_id, c.memory_id, c.tenant_id, c.scope_key, c.tier,
                     c.consolidation_state, c.content IS NOT NULL AS has_content,
                     c.valid_from, c.valid_until, c.confidence, c.compliance_labels,
                     c.recorded_at, c.search_tsv, c.search_length
                FROM fabric.memory_records c
               WHERE fabric._search_keys(c.tenant_id, ARRAY[c.scope_key],
                                         pg_catalog.tsvector_to_array(c.search_tsv))
                     OPERATOR(pg_catalog.&&) fabric._search_keys(p_tenant_id, p_scope_keys, v_match)
                 AND c.search_tsv @@ v_tsq
              OFFSET 0) m
        -- BM25 per candidate, without a function call per record: the record's length is
        -- its stored search_length (fabric._search_length of its search text, written with
        -- it); the query lexemes it holds are picked out of its search text by
        -- setweight/ts_filter (both in C) before anything is unnested, so only the few
        -- matching lexemes become rows. The join on the lexeme keeps the sum exact whatever
        -- weights the search text carries. (ts_filter drops a lexeme stored without
        -- positions, which search text derived by the database never has; a record left
        -- with no scored lexeme scores 0, never NULL.)
        CROSS JOIN LATERAL (
          SELECT GREATEST(m.search_length, 1)::double precision AS n) dl
        CROSS JOIN LATERAL (
          SELECT coalesce(pg_catalog.sum(q.idf * tf.n * (c_k1 + 1)
                   / (tf.n + c_k1 * (1 - c_b + c_b * dl.n / coalesce(v_avgdl, dl.n)))), 0) AS score
            FROM pg_catalog.unnest(pg_catalog.ts_filter(
                   pg_catalog.setweight(m.search_tsv, 'A', v_lexemes), '{a}')) u
            JOIN ROWS FROM (pg_catalog.unnest(v_lexemes), pg_catalog.unnest(v_idf)) AS q(lexeme, idf)
              ON q.lexeme = u.lexeme
            CROSS JOIN LATERAL (SELECT coalesce(pg_catalog.array_length(u.positions, 1), 1)
                                         ::double precision AS n) tf
        ) bm
        WHERE m.tenant_id = p_tenant_id
          AND m.scope_key = ANY (p_scope_keys)
          AND m.tier = ANY (p_tiers)
          AND m.consolidation_state IN ('raw', 'consolidated', 'reflected')
          AND m.has_content
          AND m.valid_from <= p_valid_at
          AND (m.valid_until IS NULL OR m.valid_until > p_valid_at)
          AND m.confidence >= p_min_confidence
          AND NOT (m.compliance_labels && p_excluded_labels)
        ORDER BY bm.score DESC, m.confidence DESC, m.valid_from DESC, m.recorded_at DESC,
                 m.memory_id
        LIMIT p_limit) w
        JOIN fabric.memory_records m ON m.ctid = w.row_id  -- the very row version scored
        -- and its lineage, in the same statement (as the filter-only statement reads it)
        CROSS JOIN LATERAL (
          SELECT coalesce(pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id),
                          '[]') AS derived_from
            FROM fabric.memory_lineage l
           WHERE l.tenant_id = m.tenant_id AND l.memory_id = m.memory_id) d
        WINDOW o AS (ORDER BY w.score DESC, w.confidence DESC, w.valid_from DESC,
                     w.recorded_at DESC, w.memory_id)
        ORDER BY w.score DESC, w.confidence DESC, w.valid_from DESC, w.recorded_at DESC, w.memory_id;
      RETURN;
    END IF;
    -- Some lexeme is walked: the other (key, lexeme) pairs are read from their postings, and
    -- the candidates of both are scored by the same BM25 as above.
    v_postings := ARRAY(
      SELECT pg_catalog.unnest(fabric._search_keys(p_tenant_id, ARRAY[x.key], ARRAY[x.lexeme]))
        FROM ROWS FROM (pg_catalog.unnest(v_post_keys), pg_catalog.unnest(v_post_lexemes))
             AS x(key, lexeme));
    v_walk_queries := ARRAY(SELECT fabric._any_term_query(ARRAY[x.lexeme])
                              FROM pg_catalog.unnest(v_walk_lexemes) WITH ORDINALITY AS x(lexeme, i)
                             ORDER BY x.i);
    -- Candidates are scored and sorted as narrow rows (id, score, order keys); only the
    -- p_limit winners are read whole (by their row address, within this one statement:
    -- the same row version) and built. A record both read from postings and met by a
    -- walk (or by two walks) is one candidate (UNION).
    RETURN QUERY
      SELECT m.memory_id, w.score, fabric._recall_envelope(m, d.derived_from,  -- as above
               pg_catalog.round(((1.0 / (60 + pg_catalog.row_number() OVER o))
                                 / (1.0 / 61)::double precision)::numeric, 6),
               pg_catalog.jsonb_build_object('lexical', pg_catalog.row_number() OVER o))
      FROM (SELECT m.row_id, m.memory_id, bm.score, m.confidence, m.valid_from,
                   m.recorded_at
      FROM (
        SELECT c.row_id, c.memory_id, c.search_tsv, c.search_length, c.confidence,
               c.valid_from, c.recorded_at
          -- the postings of the matched lexemes in exactly these scope keys (less the walked
          -- ones), read through memory_records_search_keys alone in their own subquery
          -- (OFFSET 0), as the statement above reads its postings: the generic plan cannot
          -- know how few they are, and ANDed them with a scan of the scope's entries in
          -- memory_records_scope (950 entries read for 10 postings in a 10,000-record
          -- tenant). Every rule is checked on each posting right after (the WHERE below).
          FROM (SELECT p.ctid AS row_id, p.memory_id, p.tenant_id, p.scope_key, p.tier,
                       p.consolidation_state, p.content IS NOT NULL AS has_content,
                       p.valid_from, p.valid_until, p.confidence, p.compliance_labels,
                       p.recorded_at, p.search_tsv, p.search_length
                  FROM fabric.memory_records p
                 WHERE fabric._search_keys(p.tenant_id, ARRAY[p.scope_key],
                                           pg_catalog.tsvector_to_array(p.search_tsv))
                       OPERATOR(pg_catalog.&&) v_postings
                   AND p.search_tsv @@ v_tsq
                OFFSET 0) c
         WHERE c.tenant_id = p_tenant_id
           AND c.scope_key = ANY (p_scope_keys)
           AND c.tier = ANY (p_tiers)
           AND c.consolidation_state IN ('raw', 'consolidated', 'reflected')
           AND c.has_content
           AND c.valid_from <= p_valid_at
           AND (c.valid_until IS NULL OR c.valid_until > p_valid_at)
           AND c.confidence >= p_min_confidence
           AND NOT (c.compliance_labels && p_excluded_labels)
        UNION
        SELECT t.row_id, t.memory_id, t.search_tsv, t.search_length, t.confidence,
               t.valid_from, t.recorded_at
          FROM ROWS FROM (pg_catalog.unnest(v_walk_keys), pg_catalog.unnest(v_walk_queries),
                          pg_catalog.unnest(v_walk_reads)) AS w(key, q, reads)
          CROSS JOIN (SELECT DISTINCT r.tier FROM pg_catalog.unnest(p_tiers) AS r(tier)) r
          CROSS JOIN LATERAL (
            SELECT h.* FROM (
              SELECT i.ctid AS row_id, i.memory_id, i.search_tsv, i.search_length,
                     i.confidence, i.valid_from, i.recorded_at
                FROM fabric.memory_records i
               WHERE i.tenant_id = p_tenant_id
                 AND i.scope_key = w.key
                 AND i.tier = r.tier
                 AND i.consolidation_state IN ('raw', 'consolidated', 'reflected')
                 AND i.content IS NOT NULL
                 AND i.valid_from <= p_valid_at
                 AND (i.valid_until IS NULL OR i.valid_until > p_valid_at)
                 AND i.confidence >= p_min_confidence
                 AND NOT (i.compliance_labels && p_excluded_labels)
               ORDER BY i.confidence DESC, i.valid_from DESC, i.recorded_at DESC, i.memory_id
               LIMIT w.reads) h
             WHERE h.search_tsv @@ w.q
             LIMIT v_top) t
      ) m
      -- BM25 per candidate, exactly as above
      CROSS JOIN LATERAL (
        SELECT GREATEST(m.search_length, 1)::double precision AS n) dl
      CROSS JOIN LATERAL (
        SELECT coalesce(pg_catalog.sum(q.idf * tf.n * (c_k1 + 1)
                 / (tf.n + c_k1 * (1 - c_b + c_b * dl.n / coalesce(v_avgdl, dl.n)))), 0) AS score
          FROM pg_catalog.unnest(pg_catalog.ts_filter(
                 pg_catalog.setweight(m.search_tsv, 'A', v_lexemes), '{a}')) u
          JOIN ROWS FROM (pg_catalog.unnest(v_lexemes), pg_catalog.unnest(v_idf)) AS q(lexeme, idf)
            ON q.lexeme = u.lexeme
          CROSS JOIN LATERAL (SELECT coalesce(pg_catalog.array_length(u.positions, 1), 1)
                                       ::double precision AS n) tf
      ) bm
      ORDER BY bm.score DESC, m.confidence DESC, m.valid_from DESC, m.recorded_at DESC,
               m.memory_id
      LIMIT p_limit) w
      JOIN fabric.memory_records m ON m.ctid = w.row_id  -- the very row version scored
      CROSS JOIN LATERAL (  -- and its lineage, as above
        SELECT coalesce(pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id),
                        '[]') AS derived_from
          FROM fabric.memory_lineage l
         WHERE l.tenant_id = m.tenant_id AND l.memory_id = m.memory_id) d
      WINDOW o AS (ORDER BY w.score DESC, w.confidence DESC, w.valid_from DESC,
                   w.recorded_at DESC, w.memory_id)
      ORDER BY w.score DESC, w.confidence DESC, w.valid_from DESC, w.recorded_at DESC, w.memory_id;
    RETURN;
  END IF;

  IF p_candidate_ids IS NULL THEN
    -- Nothing to rank by: the top k in recall's order, read from memory_records_topk (live
    -- records with content, in that order) by one ordered scan per resolved scope key and
    -- tier, each stopping after k entries that pass every rule, then merged. Validity,
    -- confidence and labels are checked on the index entries; only the k winners are
    -- read whole, one lookup each by their full key (tenant stays an index condition).
    -- The cost follows k and the number of scope keys and tiers, not the size of the scope.
    -- Like the lexical statements, this one runs on its generic plan, made once per session:
    -- planning it on every call cost more CPU than running it (docs/benchmarks.md). The
    -- plan does not depend on p_limit to stay bounded: each per-key scan is an ordered scan
    -- of memory_records_topk, which holds every column it reads, in the order it asks for,
    -- and each winner is a lateral lookup (tests/sql/test_recall_plan.py checks the plan
    -- and the rows it reads). The function's SET clause restores the setting on return.
    v_set := pg_catalog.set_config('plan_cache_mode',
      -- on Citus a custom plan: a generic one cannot be pruned to the tenant's shard
      CASE WHEN pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
           THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);
    -- (each record as filter-only recall answers it, score and retrieval included:
    -- fabric._recall_envelope)
    RETURN QUERY
      SELECT (x.m).memory_id, NULL::double precision, fabric._recall_envelope(x.m, d.derived_from)
      FROM (SELECT k.key, r.tier, t.memory_id, t.confidence, t.valid_from, t.recorded_at
              FROM (SELECT DISTINCT k.key FROM pg_catalog.unnest(p_scope_keys) AS k(key)) k
              CROSS JOIN (SELECT DISTINCT r.tier FROM pg_catalog.unnest(p_tiers) AS r(tier)) r
              CROSS JOIN LATERAL (
                SELECT i.memory_id, i.confidence, i.valid_from, i.recorded_at
                  FROM fabric.memory_records i
                 WHERE i.tenant_id = p_tenant_id
                   AND i.scope_key = k.key
                   AND i.tier = r.tier
                   AND i.consolidation_state IN ('raw', 'consolidated', 'reflected')
                   AND i.content IS NOT NULL
                   AND i.valid_from <= p_valid_at
                   AND (i.valid_until IS NULL OR i.valid_until > p_valid_at)
                   AND i.confidence >= p_min_confidence
                   AND NOT (i.compliance_labels && p_excluded_labels)
                 ORDER BY i.confidence DESC, i.valid_from DESC, i.recorded_at DESC, i.memory_id
                 LIMIT p_limit) t
             ORDER BY t.confidence DESC, t.valid_from DESC, t.recorded_at DESC, t.memory_id
             LIMIT p_limit) w
      -- Each winner read whole by its full key, as a lateral lookup: one index probe per
      -- winner whatever the estimates (a plain join let a generic plan, which cannot know
      -- p_limit, merge the winners with a scan of the whole tenant). LIMIT 1 keeps the
      -- lookup from being flattened into a join; the primary key allows one row anyway.
      -- (ROW(m.*) as the table's row type: on a Citus worker m is a row of a shard)
      CROSS JOIN LATERAL (
        SELECT ROW(m.*)::fabric.memory_records AS m FROM fabric.memory_records m
         WHERE m.tenant_id = p_tenant_id AND m.memory_id = w.memory_id
           AND m.scope_key = w.key AND m.tier = w.tier
           AND m.consolidation_state IN ('raw', 'consolidated', 'reflected')
           AND m.content IS NOT NULL
           AND m.confidence = w.confidence AND m.valid_from = w.valid_from
           AND m.recorded_at = w.recorded_at
         LIMIT 1) x
      -- and its lineage, in the same statement: each envelope (fabric._record_envelope, what
      -- fabric._record_json builds) is then a simple expression, no statement per winner
      CROSS JOIN LATERAL (
        SELECT coalesce(pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id),
                        '[]') AS derived_from
          FROM fabric.memory_lineage l
         WHERE l.tenant_id = p_tenant_id AND l.memory_id = w.memory_id) d
      ORDER BY w.confidence DESC, w.valid_from DESC, w.recorded_at DESC, w.memory_id;
    RETURN;
  END IF;

  -- By ids (the vector store's candidates, or filters.memory_ids): each id is re-checked
  -- against every rule here, read through the primary key. A generic plan, made once per
  -- session like the lexical statements': planning it again on every call cost as much as
  -- running it (docs/benchmarks.md, "The re-check of semantic recall"). The ids are never
  -- NULL here (the branch above took that case), so the plan needs no NULL alternative,
  -- which would keep the ids out of the index condition of a generic plan.
  v_set := pg_catalog.set_config('plan_cache_mode',
      -- on Citus a custom plan: a generic one cannot be pruned to the tenant's shard
      CASE WHEN pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
           THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);
  -- Each candidate's score (the best one given for its id) is looked up in a jsonb object
  -- keyed by id, made once here: a join with the candidate list ran, on the generic plan
  -- (which cannot know how many candidates come), as a nested loop that read the whole list
  -- again for every record found (1,000 graph candidates: 0.25 s instead of 20 ms).
  v_scores := (SELECT pg_catalog.jsonb_object_agg(u.id, u.score)
                 FROM (SELECT u.id, pg_catalog.max(u.score) AS score
                         FROM unnest(p_candidate_ids, p_candidate_scores) AS u(id, score)  -- ROWS FROM form
                        GROUP BY u.id) u);
  -- The winners' lineage is read in the same statement, for the p_limit winners only.
  RETURN QUERY
    SELECT w.memory_id, w.score, fabric._record_envelope(w.m, d.derived_from)
    -- (ROW(m.*) as the table's row type: on a Citus worker m is a row of a shard)
    FROM (SELECT m.memory_id,
                 (v_scores ->> m.memory_id::text)::double precision AS score,
                 ROW(m.*)::fabric.memory_records AS m, m.confidence, m.valid_from, m.recorded_at
            FROM fabric.memory_records m
           WHERE m.tenant_id = p_tenant_id
             AND m.memory_id = ANY (p_candidate_ids)
             AND m.scope_key = ANY (p_scope_keys)
             AND m.tier = ANY (p_tiers)
             AND m.consolidation_state IN ('raw', 'consolidated', 'reflected')
             AND m.content IS NOT NULL
             AND m.valid_from <= p_valid_at
             AND (m.valid_until IS NULL OR m.valid_until > p_valid_at)
             AND m.confidence >= p_min_confidence
             AND NOT (m.compliance_labels && p_excluded_labels)
           ORDER BY 2 DESC NULLS LAST, m.confidence DESC, m.valid_from DESC, m.recorded_at DESC,
                    m.memory_id
           LIMIT p_limit) w
    CROSS JOIN LATERAL (
      SELECT coalesce(pg_catalog.jsonb_agg(l.derived_from_id ORDER BY l.derived_from_id),
                      '[]') AS derived_from
        FROM fabric.memory_lineage l
       WHERE l.tenant_id = p_tenant_id AND l.memory_id = w.memory_id) d
    ORDER BY w.score DESC NULLS LAST, w.confidence DESC, w.valid_from DESC, w.recorded_at DESC,
             w.memory_id;
END $$;
REVOKE ALL ON FUNCTION fabric._recall_candidates(text, text[], text[], timestamptz,
  double precision, text[], text, uuid[], double precision[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._recall_candidates(text, text[], text[], timestamptz,
  double precision, text[], text, uuid[], double precision[], integer) TO fabric_owner;
-- ---------------------------------------------------------------------------------------
-- fabric._recall_ranked_ids: a ranked list of candidate ids (vector, kept lexical or graph
-- candidates) re-checked against every rule exactly as fabric._recall_candidates re-checks
-- them by id, in its order (best score first, then confidence, recency and id), the first
-- p_limit only, as narrow rows: ids and ranks, no record built. The fusion ranks these and
-- reads only its winners whole, through fabric._recall_candidates, which checks them again
-- in the same statement.
-- Owned by fabric_retriever, as fabric._recall_candidates (BYPASSRLS: every rule is a
-- predicate of its query).
CREATE OR REPLACE FUNCTION fabric._recall_ranked_ids(
  p_tenant_id text, p_scope_keys text[], p_tiers text[], p_valid_at timestamptz,
  p_min_confidence double precision, p_excluded_labels text[], p_candidate_ids uuid[],
  p_candidate_scores double precision[], p_limit integer)
RETURNS TABLE (memory_id uuid, ord bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_scores jsonb;
  v_set text;
BEGIN
  IF p_tenant_id IS NULL OR p_scope_keys IS NULL OR p_tiers IS NULL OR p_candidate_ids IS NULL
     OR pg_catalog.cardinality(p_tiers) = 0 OR pg_catalog.cardinality(p_scope_keys) = 0 THEN
    RETURN;                                   -- an unresolved scope matches nothing
  END IF;
  -- a generic plan, as fabric._recall_candidates' by-ids statement (on Citus a custom one)
  v_set := pg_catalog.set_config('plan_cache_mode',
      CASE WHEN pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
           THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);
  v_scores := (SELECT pg_catalog.jsonb_object_agg(u.id, u.score)
                 FROM (SELECT u.id, pg_catalog.max(u.score) AS score
                         FROM unnest(p_candidate_ids, p_candidate_scores) AS u(id, score)  -- ROWS FROM form
                        GROUP BY u.id) u);
  RETURN QUERY
    SELECT w.memory_id, pg_catalog.row_number() OVER (
             ORDER BY w.score DESC NULLS LAST, w.confidence DESC, w.valid_from DESC,
                      w.recorded_at DESC, w.memory_id)
      FROM (SELECT m.memory_id, (v_scores ->> m.memory_id::text)::double precision AS score,
                   m.confidence, m.valid_from, m.recorded_at
              FROM fabric.memory_records m
             WHERE m.tenant_id = p_tenant_id
               AND m.memory_id = ANY (p_candidate_ids)
               AND m.scope_key = ANY (p_scope_keys)
               AND m.tier = ANY (p_tiers)
               AND m.consolidation_state IN ('raw', 'consolidated', 'reflected')
               AND m.content IS NOT NULL
               AND m.valid_from <= p_valid_at
               AND (m.valid_until IS NULL OR m.valid_until > p_valid_at)
               AND m.confidence >= p_min_confidence
               AND NOT (m.compliance_labels && p_excluded_labels)
             ORDER BY 2 DESC NULLS LAST, m.confidence DESC, m.valid_from DESC,
                      m.recorded_at DESC, m.memory_id
             LIMIT p_limit) w
     ORDER BY 2;
END $$;
REVOKE ALL ON FUNCTION fabric._recall_ranked_ids(text, text[], text[], timestamptz,
  double precision, text[], uuid[], double precision[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._recall_ranked_ids(text, text[], text[], timestamptz,
  double precision, text[], uuid[], double precision[], integer) TO fabric_owner;
-- ---------------------------------------------------------------------------------------
-- fabric._recall_neighbours: the turns of a conversation next to some served records (a
-- recall's `neighbours` option, docs/recall.md "Neighbours"). For each hit (p_hit_ids, in
-- served order), the p_turns records just before it and the p_turns just after it in its
-- conversation: the records of the same tenant, scope key, tier, subject and session
-- (session_id equal, or both without one) in valid-time order (valid_from, then
-- recorded_at, then memory_id), no further than an hour of valid time from the hit (a chat's
-- turns are seconds to minutes apart; sessions days apart are other conversations). Only
-- records that pass every rule a served record passes count (the resolved scope keys and
-- tiers, live states, content, validity at p_valid_at, confidence, excluded labels: the
-- predicates of fabric._recall_candidates), so a record the caller may not read is never a
-- neighbour and never takes a neighbour's place. A record already served (p_served_ids) is
-- not answered, nor one twice (it stays with the first hit that reached it). Ids only, in
-- the answer's order: by hit, then in the conversation's order. fabric_api.recall re-checks
-- them by id through fabric._recall_candidates, in the statement that builds them.
-- Owned by fabric_retriever, as fabric._recall_candidates (BYPASSRLS: every rule is a
-- predicate of its query). Each side of a hit is one ordered scan of
-- memory_records_conversation that stops after p_turns entries (or at the hour's edge).
CREATE OR REPLACE FUNCTION fabric._recall_neighbours(
  p_tenant_id text, p_scope_keys text[], p_tiers text[], p_valid_at timestamptz,
  p_min_confidence double precision, p_excluded_labels text[], p_hit_ids uuid[],
  p_served_ids uuid[], p_turns integer)
RETURNS TABLE (memory_id uuid, neighbour_of uuid)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  c_gap CONSTANT interval := '1 hour';  -- the furthest a neighbour is from its hit
  v_set text;
BEGIN
  IF p_tenant_id IS NULL OR p_scope_keys IS NULL OR p_tiers IS NULL OR p_hit_ids IS NULL
     OR pg_catalog.cardinality(p_tiers) = 0 OR pg_catalog.cardinality(p_scope_keys) = 0
     OR pg_catalog.cardinality(p_hit_ids) = 0 OR p_turns IS NULL OR p_turns < 1 THEN
    RETURN;                                   -- an unresolved scope matches nothing
  END IF;
  -- a generic plan, as fabric._recall_candidates' by-ids statement (on Citus a custom one:
  -- a generic plan cannot be pruned to the tenant's shard)
  v_set := pg_catalog.set_config('plan_cache_mode',
      CASE WHEN pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
           THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);
  -- One statement on the tenant's rows (on Citus, on its shard: no function reads a table)
  RETURN QUERY
    SELECT n.memory_id, n.hit_id
      FROM (SELECT DISTINCT ON (x.memory_id) x.memory_id, x.hit_id, x.hit_ord, x.valid_from,
                   x.recorded_at
              FROM (SELECT h.memory_id AS hit_id,
                           pg_catalog.array_position(p_hit_ids, h.memory_id) AS hit_ord,
                           c.memory_id, c.valid_from, c.recorded_at
                      FROM fabric.memory_records h
                      CROSS JOIN LATERAL (
                        -- the p_turns readable records just before the hit
                        (SELECT b.memory_id, b.valid_from, b.recorded_at
                           FROM fabric.memory_records b
                          WHERE b.tenant_id = p_tenant_id
                            AND b.scope_key = h.scope_key
                            AND b.tier = h.tier
                            AND (b.valid_from, b.recorded_at, b.memory_id)
                                < (h.valid_from, h.recorded_at, h.memory_id)
                            AND b.valid_from >= h.valid_from - c_gap
                            AND b.subject_id IS NOT DISTINCT FROM h.subject_id
                            AND b.session_id IS NOT DISTINCT FROM h.session_id
                            -- every rule of a served record (the scope key and tier:
                            -- the hit's, resolved ones)
                            AND b.consolidation_state IN ('raw', 'consolidated', 'reflected')
                            AND b.content IS NOT NULL
                            AND b.valid_from <= p_valid_at
                            AND (b.valid_until IS NULL OR b.valid_until > p_valid_at)
                            AND b.confidence >= p_min_confidence
                            AND NOT (b.compliance_labels && p_excluded_labels)
                          ORDER BY b.valid_from DESC, b.recorded_at DESC, b.memory_id DESC
                          LIMIT p_turns)
                        UNION ALL
                        -- and the p_turns just after it
                        (SELECT a.memory_id, a.valid_from, a.recorded_at
                           FROM fabric.memory_records a
                          WHERE a.tenant_id = p_tenant_id
                            AND a.scope_key = h.scope_key
                            AND a.tier = h.tier
                            AND (a.valid_from, a.recorded_at, a.memory_id)
                                > (h.valid_from, h.recorded_at, h.memory_id)
                            AND a.valid_from <= h.valid_from + c_gap
                            AND a.subject_id IS NOT DISTINCT FROM h.subject_id
                            AND a.session_id IS NOT DISTINCT FROM h.session_id
                            AND a.consolidation_state IN ('raw', 'consolidated', 'reflected')
                            AND a.content IS NOT NULL
                            AND a.valid_from <= p_valid_at
                            AND (a.valid_until IS NULL OR a.valid_until > p_valid_at)
                            AND a.confidence >= p_min_confidence
                            AND NOT (a.compliance_labels && p_excluded_labels)
                          ORDER BY a.valid_from, a.recorded_at, a.memory_id
                          LIMIT p_turns)) c
                     WHERE h.tenant_id = p_tenant_id
                       AND h.memory_id = ANY (p_hit_ids)
                       AND h.scope_key = ANY (p_scope_keys)
                       AND h.tier = ANY (p_tiers)) x
             WHERE NOT x.memory_id = ANY (coalesce(p_served_ids, '{}'))
             ORDER BY x.memory_id, x.hit_ord) n
     ORDER BY n.hit_ord, n.valid_from, n.recorded_at, n.memory_id;
END $$;
REVOKE ALL ON FUNCTION fabric._recall_neighbours(text, text[], text[], timestamptz,
  double precision, text[], uuid[], uuid[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._recall_neighbours(text, text[], text[], timestamptz,
  double precision, text[], uuid[], uuid[], integer) TO fabric_owner;
SET LOCAL ROLE fabric_owner;
GRANT SELECT ON fabric.memory_records, fabric.memory_lineage, fabric.deployment_settings,
  fabric.search_stats TO fabric_retriever;
GRANT EXECUTE ON FUNCTION fabric._record_json(fabric.memory_records),
  fabric._record_envelope(fabric.memory_records, jsonb),
  fabric._recall_envelope(fabric.memory_records, jsonb, numeric, jsonb), fabric._text_search_config(), fabric._any_term_query(text[]),
  fabric._search_keys(text, text[], text[]) TO fabric_retriever;
-- BM25 reads the stored length (memory_records.search_length): the retriever no longer
-- counts it, so it loses the grant it had before 0.4.0.
REVOKE EXECUTE ON FUNCTION fabric._search_length(tsvector) FROM fabric_retriever;

-- ---------------------------------------------------------------------------------------
-- fabric._fusion_depth: how deep each ranked list is taken before the fusion cuts the
-- answer to its limit: 50 (what the broker returns at limit 10), or the limit when larger.
-- Fusing each list's top 50 rather than its top 10 measured better once the lexical list
-- stopped voting for records that match the question only by their speaker's name
-- (fabric._fused_lexical; make bench-quality, docs/benchmarks.md).
CREATE OR REPLACE FUNCTION fabric._fusion_depth(p_limit integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN GREATEST(p_limit, 50);
END $$;
REVOKE ALL ON FUNCTION fabric._fusion_depth(integer) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric._fusion_lexical_weight: the lexical list's weight in a fusion of lists that rank
-- the same records (hybrid recall), against 1 for the vector list and the graph walk's,
-- for the deployment's embedder. Equal (1) where the dense leg is about as strong as the
-- lexical one: MiniLM's dense recall@10 on the synthetic set is 0.355 against the lexical
-- list's 0.338, and any lighter lexical weight cost (0.454 -> 0.435 at 0.9 / 1.1). e5's
-- dense leg is 1.7x the lexical one (0.569 against 0.338): fused at equal weights the
-- lexical list's own records push the dense list's out of the top 10 and hybrid falls
-- under its dense leg (0.556); at 2/3 (lexical 0.8 against vector 1.2) a record the lexical
-- list alone found no longer outranks the dense list's top 10, and the lexical list
-- re-orders the dense list's top 50 by agreement: 0.592 (make bench-quality,
-- docs/benchmarks.md "e5 as the dense leg"; every weight from 0.9 / 1.1 to 0.7 / 1.3 gives
-- the same answers within 0.001). Other embedders are not measured: equal.
CREATE OR REPLACE FUNCTION fabric._fusion_lexical_weight(p_embedder text)
RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT CASE p_embedder WHEN 'e5' THEN 2.0 / 3 ELSE 1 END $$;
REVOKE ALL ON FUNCTION fabric._fusion_lexical_weight(text) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric._fused_lexical: the lexical list a fusion takes (hybrid recall's, and semantic
-- recall's for the tiers without a vector collection): lexical retrieval's top
-- fabric._fusion_depth(p_limit), less the records of a vector tier whose content names a
-- `speaker` and that hold none of the query's lexemes outside that name. Such a record's
-- vector is its transcript line, name included (memfabric.embedding.text_of), so the vector
-- list already counts the name; a lexical vote for the name alone counted it twice, and
-- put a named person's every short reply ("Right?!") at the top of the fused list, above
-- what answers the question. The record stays a candidate of the vector list, and text
-- recall is not changed. Every record comes from fabric._recall_candidates, under every
-- rule; this only leaves some out. ord is the rank in what is left.
CREATE OR REPLACE FUNCTION fabric._fused_lexical(
  p_tenant_id text, p_scope_keys text[], p_tiers text[], p_valid_at timestamptz,
  p_min_confidence double precision, p_excluded_labels text[], p_query text,
  p_limit integer)
RETURNS TABLE (memory_id uuid, record jsonb, ord bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_config regconfig := fabric._text_search_config();
  -- the query's lexemes, as lexical retrieval reads them (any of them)
  v_words tsquery := fabric._any_term_query(pg_catalog.tsvector_to_array(
                       pg_catalog.to_tsvector(v_config, p_query)));
BEGIN
  RETURN QUERY
    SELECT l.memory_id, l.record, pg_catalog.row_number() OVER (ORDER BY l.ord)
      FROM fabric._recall_candidates(p_tenant_id, p_scope_keys, p_tiers, p_valid_at,
             p_min_confidence, p_excluded_labels, p_query, NULL, NULL,
             fabric._fusion_depth(p_limit)) WITH ORDINALITY AS l(memory_id, score, record, ord)
     -- (CASE, not AND: the words are read only for a record with a speaker, of a vector tier)
     WHERE CASE WHEN pg_catalog.jsonb_typeof(l.record #> '{content,speaker}') = 'string'
                     AND (l.record ->> 'tier') = ANY (fabric._vector_tiers())
                THEN coalesce(pg_catalog.jsonb_to_tsvector(v_config,
                       (l.record -> 'content') - 'speaker', '["string"]') @@ v_words, false)
                ELSE true END
     ORDER BY l.ord;
END $$;
REVOKE ALL ON FUNCTION fabric._fused_lexical(text, text[], text[], timestamptz,
  double precision, text[], text, integer) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_fused: the answer's records from up to three ranked lists, fused by
-- reciprocal rank fusion (k = 60) over their union: the vector candidates re-checked
-- against every rule (vector tiers), lexical retrieval (lexical tiers:
-- fabric._fused_lexical, or the list the resolution kept) and the graph walk's candidates
-- re-checked like the vector ones. Each list is taken to fabric._fusion_depth(p_limit)
-- (p_depth at least) before the union is cut to p_limit. Where the vector and lexical lists
-- rank the same tiers (hybrid), the lexical list votes at fabric._fusion_lexical_weight
-- (the deployment's embedder) against 1 for the others, the weights scaled to sum to the
-- number of lists (so p_best, the best fused score, is unchanged). Each record says where
-- each retriever ranked it; its score is the fused score divided by the best score a record
-- could reach in this mode (1 for the top of a single list), never a raw statistic.
-- `found` is how many records the union held (more than p_limit: truncated).
DROP FUNCTION IF EXISTS fabric._recall_fused(text, text[], text[], text[], timestamptz,
  double precision, text[], text, uuid[], double precision[], integer, double precision,
  integer);
DROP FUNCTION IF EXISTS fabric._recall_fused(text, text[], text[], text[], timestamptz,
  double precision, text[], text, uuid[], double precision[], integer, double precision,
  integer, uuid[], double precision[]);  -- before the graph list
CREATE OR REPLACE FUNCTION fabric._recall_fused(
  p_tenant_id text, p_scope_keys text[], p_vector_tiers text[], p_lexical_tiers text[],
  p_valid_at timestamptz, p_min_confidence double precision, p_excluded_labels text[],
  p_query text, p_candidate_ids uuid[], p_candidate_scores double precision[],
  p_depth integer, p_best double precision, p_limit integer,
  p_lexical_ids uuid[], p_lexical_ranks double precision[],
  p_graph_tiers text[] DEFAULT NULL, p_graph_ids uuid[] DEFAULT NULL,
  p_graph_scores double precision[] DEFAULT NULL)
RETURNS TABLE (records jsonb, found bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_depth integer := GREATEST(p_depth, fabric._fusion_depth(p_limit));
  v_lexical_list boolean := p_query IS NOT NULL AND pg_catalog.cardinality(p_lexical_tiers) > 0;
  v_lists integer := (p_candidate_ids IS NOT NULL)::integer + v_lexical_list::integer
                     + (p_graph_ids IS NOT NULL)::integer;
  v_lexical numeric := 1;  -- numeric, as the ranks' fractions: at 1 the scores are exact
  v_scale numeric := 1;  -- the weights of the lists fused sum to v_lists
BEGIN
  IF v_lexical_list AND p_vector_tiers && p_lexical_tiers THEN
    v_lexical := fabric._fusion_lexical_weight(
                   (SELECT s.embedder FROM fabric.deployment_settings s));
    v_scale := v_lists / (v_lists - 1 + v_lexical);
  END IF;
  -- PL/pgSQL, not SQL: its plan is kept for the session instead of made on every call.
  -- The lists are ranked as narrow rows (ids and ranks, every id re-checked against every
  -- rule); only the p_limit winners are read whole, by fabric._recall_candidates (which
  -- checks them once more, in the same statement and snapshot), in the fused order.
  RETURN QUERY
  WITH vec AS (
    SELECT a.memory_id, a.ord
      FROM fabric._recall_ranked_ids(p_tenant_id, p_scope_keys, p_vector_tiers, p_valid_at,
             p_min_confidence, p_excluded_labels, p_candidate_ids, p_candidate_scores,
             v_depth) AS a
     WHERE p_candidate_ids IS NOT NULL),
  lex AS (  -- none in semantic recall of vector tiers only: not even the statistics read
    SELECT b.memory_id, b.ord
      FROM fabric._fused_lexical(p_tenant_id, p_scope_keys, p_lexical_tiers, p_valid_at,
             p_min_confidence, p_excluded_labels, p_query, v_depth) AS b
     WHERE p_query IS NOT NULL AND pg_catalog.cardinality(p_lexical_tiers) > 0
       AND p_lexical_ids IS NULL
    UNION ALL  -- the list the resolution computed (fabric._lexical_unstash): each id
    SELECT b.memory_id, b.ord  -- re-checked against every rule, in its order
      FROM fabric._recall_ranked_ids(p_tenant_id, p_scope_keys, p_lexical_tiers, p_valid_at,
             p_min_confidence, p_excluded_labels, p_lexical_ids, p_lexical_ranks,
             v_depth) AS b
     WHERE p_query IS NOT NULL AND pg_catalog.cardinality(p_lexical_tiers) > 0
       AND p_lexical_ids IS NOT NULL),
  gra AS (  -- the graph walk's candidates (expand), re-checked like the vector ones
    SELECT g.memory_id, g.ord
      FROM fabric._recall_ranked_ids(p_tenant_id, p_scope_keys, p_graph_tiers, p_valid_at,
             p_min_confidence, p_excluded_labels, p_graph_ids, p_graph_scores, v_depth) AS g
     WHERE p_graph_ids IS NOT NULL),
  fused AS (
    SELECT coalesce(v.memory_id, l.memory_id, g.memory_id) AS memory_id,
           v.ord AS vector_rank, l.ord AS lexical_rank, g.ord AS graph_rank,
           v_scale * (coalesce(1.0 / (60 + v.ord), 0) + v_lexical * coalesce(1.0 / (60 + l.ord), 0)
                      + coalesce(1.0 / (60 + g.ord), 0)) AS rrf
      FROM vec v FULL JOIN lex l ON l.memory_id = v.memory_id
      FULL JOIN gra g ON g.memory_id = coalesce(v.memory_id, l.memory_id)),
  total AS (SELECT pg_catalog.count(*) AS n FROM fused),
  -- the winners: the p_limit best fused scores (ties broken as every recall breaks them,
  -- by fabric._recall_candidates below), read whole in that order
  top AS (
    SELECT f.* FROM fused f
     ORDER BY f.rrf DESC
     FETCH FIRST p_limit ROWS WITH TIES),
  won AS (
    SELECT w.memory_id, w.record, w.ord
      FROM fabric._recall_candidates(p_tenant_id, p_scope_keys,
             ARRAY(SELECT DISTINCT x FROM pg_catalog.unnest(p_vector_tiers || p_lexical_tiers
                                            || coalesce(p_graph_tiers, '{}')) x),
             p_valid_at, p_min_confidence, p_excluded_labels, NULL,
             ARRAY(SELECT t.memory_id FROM top t),
             ARRAY(SELECT t.rrf::double precision FROM top t), p_limit)
             WITH ORDINALITY AS w(memory_id, score, record, ord))
  SELECT coalesce((SELECT pg_catalog.jsonb_agg(
           w.record || pg_catalog.jsonb_build_object(
             'score', pg_catalog.round((t.rrf / p_best)::numeric, 6),
             'retrieval', pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
               'lexical', t.lexical_rank, 'vector', t.vector_rank, 'graph', t.graph_rank)))
           ORDER BY w.ord)
           FROM won w JOIN top t ON t.memory_id = w.memory_id), '[]'::jsonb),
         (SELECT x.n FROM total x);
END $$;
REVOKE ALL ON FUNCTION fabric._recall_fused(text, text[], text[], text[], timestamptz,
  double precision, text[], text, uuid[], double precision[], integer, double precision,
  integer, uuid[], double precision[], text[], uuid[], double precision[]) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- Hybrid recall's lexical list, kept from the first call to the second in the session.
-- The first call (the resolution) computes it while the client embeds the query; the second
-- re-checks those ids instead of running BM25 again. It stays in the database: a temporary
-- table of the session, owned by the role these functions run as (the agent holds no
-- privilege on it), one row, keyed by the request without its candidates. Answering the ids
-- to the client instead would be a retrieval without its audit event. A table of that name
-- the session made itself is never used; without the privilege to make one (or in a
-- read-only transaction, which may not), nothing is kept and the second call computes the
-- list itself, as it does whenever nothing matches its key.
-- the key: the request as the first call has it (the second adds only its candidates and
-- graph candidates)
-- (PL/pgSQL, not SQL: a SQL function with a SET clause is parsed and planned again in every
-- statement that calls it, about 0.1 ms here; this one is a simple expression)
CREATE OR REPLACE FUNCTION fabric._lexical_stash_key(p_request jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.md5((p_request - ARRAY['candidates', 'graph_candidates'])::text);
END $$;
REVOKE ALL ON FUNCTION fabric._lexical_stash_key(jsonb) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fabric._lexical_stash_owned()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_owner oid;
BEGIN
  -- the session's own temporary table of that name (pg_temp names no other schema), by
  -- its oid, and its owner's name from the catalog cache (no scan, no view)
  SELECT c.relowner INTO v_owner FROM pg_catalog.pg_class c
   WHERE c.oid = pg_catalog.to_regclass('pg_temp.fabric_lexical_stash') AND c.relkind = 'r';
  RETURN FOUND AND pg_catalog.pg_get_userbyid(v_owner) = current_user;
END $$;
REVOKE ALL ON FUNCTION fabric._lexical_stash_owned() FROM PUBLIC;

CREATE OR REPLACE FUNCTION fabric._lexical_stash(p_request jsonb, p_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.to_regclass('pg_temp.fabric_lexical_stash') IS NULL THEN
    BEGIN
      CREATE TEMPORARY TABLE fabric_lexical_stash (key text NOT NULL, ids uuid[] NOT NULL);
    EXCEPTION WHEN insufficient_privilege OR duplicate_table OR read_only_sql_transaction THEN
      NULL;  -- no temporary table for this role here, or a read-only transaction: nothing
             -- is kept
    END;
  END IF;
  IF fabric._lexical_stash_owned() THEN
    DELETE FROM pg_temp.fabric_lexical_stash;
    INSERT INTO pg_temp.fabric_lexical_stash (key, ids)
    VALUES (fabric._lexical_stash_key(p_request), p_ids);
  END IF;
END $$;
REVOKE ALL ON FUNCTION fabric._lexical_stash(jsonb, uuid[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fabric._lexical_unstash(p_request jsonb)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_ids uuid[];
BEGIN
  IF pg_catalog.to_regclass('pg_temp.fabric_lexical_stash') IS NULL
     OR NOT fabric._lexical_stash_owned() THEN
    RETURN NULL;
  END IF;
  DELETE FROM pg_temp.fabric_lexical_stash s WHERE s.key = fabric._lexical_stash_key(p_request)
  RETURNING s.ids INTO v_ids;
  RETURN v_ids;
END $$;
REVOKE ALL ON FUNCTION fabric._lexical_unstash(jsonb) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_answer: the response and its one audit event (identifiers, never content).
-- The event names the run's subject and session only by pseudonyms under the subject's key,
-- and hashes the request without them, under that key: erasing the key unlinks the event.
-- It takes the run recall entered (no second read) and the subject's key recall read with
-- the agent's profile (p_key: no statement of its own); p_served (mode_served,
-- tiers_served_lexically) joins the answer in the same object; p_memory_ids, the served
-- records' ids as the retrieval statement aggregated them beside the records (else read
-- from the records here); p_record_list, the served records as a list (jsonb[]) when the
-- retrieval statement aggregated them so, which the answer then encodes once (else
-- p_records, a jsonb array).
DROP FUNCTION IF EXISTS fabric._recall_answer(text, jsonb, text, text, jsonb, jsonb, boolean);
DROP FUNCTION IF EXISTS fabric._recall_answer(fabric.runs, jsonb, text, text, jsonb, jsonb,
                                              boolean, jsonb);
DROP FUNCTION IF EXISTS fabric._recall_answer(fabric.runs, jsonb, text, text, jsonb, jsonb,
                                              boolean, jsonb, fabric.subject_keys);
DROP FUNCTION IF EXISTS fabric._recall_answer(fabric.runs, jsonb, text, text, jsonb, jsonb,
                                              boolean, jsonb, fabric.subject_keys, jsonb);
CREATE OR REPLACE FUNCTION fabric._recall_answer(
  p_run fabric.runs, p_request jsonb, p_status text, p_reason text, p_resolved jsonb,
  p_records jsonb, p_truncated boolean, p_served jsonb,
  p_key fabric.subject_keys DEFAULT NULL, p_memory_ids jsonb DEFAULT NULL,
  p_record_list jsonb[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  -- the subject's key as the caller read it, else read (or made, on first use) here
  v_key fabric.subject_keys := CASE WHEN p_key.key IS NOT NULL THEN p_key
    ELSE fabric._subject_key(p_run.tenant_id, p_run.subject_id) END;
  v_scope jsonb;
  v_request text;
  v_event fabric.shard_events;
BEGIN
  v_scope := CASE WHEN v_key.key IS NULL THEN p_resolved -> 'scope_applied'  -- no subject
    ELSE (p_resolved -> 'scope_applied') - 'subject_id' - 'session_id'
         || pg_catalog.jsonb_build_object('subject_ref', v_key.subject_ref,
              'session_ref', fabric._pseudonym(v_key.key, 'session', p_run.session_id)) END;
  v_request := (CASE WHEN pg_catalog.jsonb_typeof(p_request -> 'scope') = 'object'
                     THEN pg_catalog.jsonb_set(p_request, '{scope}',
                            (p_request -> 'scope') - 'subject_id' - 'session_id')
                     ELSE p_request END)::text;
  -- The event, written here with fabric._emit's envelope (its time-ordered id, the actor and
  -- run of the context) instead of through a call of it: one call less a recall.
  -- The payload leaves out every null field, as jsonb_strip_nulls of the whole object did:
  -- ABSENT ON NULL drops its own fields that are null (SQL or JSON), and the scope, the one
  -- object inside it that can hold nulls (a run without a session), is stripped alone; no
  -- other field is an object (tiers and memory_ids are arrays of strings, traceparent a
  -- string), so the payload is the same without walking and copying it all a second time.
  -- A row of fabric.shard_events, in its column order (an expression, evaluated without a
  -- statement of its own), written to the outbox, or in a call delegated to a Citus worker
  -- to the tenant's shard for the relay (fabric._append_events).
  v_event := ROW(p_run.tenant_id, fabric._event_id(), NULL,
    CASE WHEN p_status = 'denied' THEN 'memory.recall.denied' ELSE 'memory.recall.served' END,
    CASE WHEN pg_catalog.jsonb_typeof(p_request -> 'correlation_id') = 'string'
         THEN pg_catalog.left(p_request ->> 'correlation_id', 200) END,
    CASE WHEN pg_catalog.jsonb_typeof(p_request -> 'causation_id') = 'string'
         THEN pg_catalog.left(p_request ->> 'causation_id', 200) END,
    nullif(pg_catalog.current_setting('fabric.actor', true), ''),
    nullif(pg_catalog.current_setting('fabric.run_id', true), '')::uuid, NULL, NULL,
    JSON_OBJECT(
      'status': p_status, 'reason': p_reason,
      'agent_id': p_run.agent_id,
      'tiers_requested': p_resolved -> 'tiers_requested',
      'tiers_served': CASE WHEN p_status <> 'denied' THEN p_resolved -> 'tiers' END,
      'tiers_denied': p_resolved -> 'tiers_denied',
      'scope': pg_catalog.jsonb_strip_nulls(v_scope),
      'request_hash': coalesce(fabric._pseudonym(v_key.key, 'request', v_request),
                               'sha256:' || pg_catalog.encode(pg_catalog.sha256(
                                 pg_catalog.convert_to(v_request, 'UTF8')), 'hex')),
      'memory_ids': coalesce(p_memory_ids, pg_catalog.jsonb_path_query_array(
                               coalesce(p_records, pg_catalog.to_jsonb(p_record_list)),
                               '$[*].memory_id')),
      'truncated': p_truncated, 'traceparent': p_request -> 'traceparent',
      'mode_served': p_served -> 'mode_served',
      -- the neighbour expansion, when asked: {turns, of, served}
      'neighbours': p_served -> 'neighbours',
      'duration_ms': pg_catalog.round(EXTRACT(epoch FROM
        pg_catalog.clock_timestamp() - pg_catalog.statement_timestamp()) * 1000, 3)
      ABSENT ON NULL RETURNING jsonb))::fabric.shard_events;
  IF fabric._on_worker() THEN
    PERFORM fabric._append_events(ARRAY[v_event]);
  ELSE
    INSERT INTO fabric.events (event_id, tenant_id, event_type, correlation_id, causation_id,
                               actor_agent_id, run_id, payload)
    VALUES (v_event.event_id, v_event.tenant_id, v_event.event_type, v_event.correlation_id,
            v_event.causation_id, v_event.actor_agent_id, v_event.run_id, v_event.payload);
  END IF;
  -- The answer, the records in it as the caller has them: a list (p_record_list) goes into
  -- the answer's encoding once, where a jsonb array is decoded and encoded again. The two
  -- objects are the same but for that one argument's type.
  IF p_record_list IS NOT NULL THEN
    RETURN pg_catalog.jsonb_build_object(
      'correlation_id', p_request -> 'correlation_id',
      'status', p_status,
      'reason', p_reason,
      'records', p_record_list,
      'truncated', p_truncated,
      'scope_applied', p_resolved -> 'scope_applied',
      'tiers_served', CASE WHEN p_status <> 'denied' THEN p_resolved -> 'tiers' ELSE '[]' END,
      'tiers_denied', coalesce(p_resolved -> 'tiers_denied', '[]'),
      'mode_served', p_served -> 'mode_served',
      'tiers_served_lexically', p_served -> 'tiers_served_lexically');
  END IF;
  RETURN pg_catalog.jsonb_build_object(
    'correlation_id', p_request -> 'correlation_id',
    'status', p_status,
    'reason', p_reason,
    'records', p_records,
    'truncated', p_truncated,
    'scope_applied', p_resolved -> 'scope_applied',
    'tiers_served', CASE WHEN p_status <> 'denied' THEN p_resolved -> 'tiers' ELSE '[]' END,
    'tiers_denied', coalesce(p_resolved -> 'tiers_denied', '[]'),
    -- p_served's fields in the same object (a || after it would copy the records again)
    'mode_served', p_served -> 'mode_served',
    'tiers_served_lexically', p_served -> 'tiers_served_lexically');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_request_is_common: true for the common well-formed request, which every
-- condition below shows well formed: each is one fabric._recall_request_problem's full check
-- requires, so whatever passes them passes it. A request they do not cover (scope, filters,
-- candidates, traceparent, any other value) is false (or NULL) here and goes through the
-- full check, which alone names the problem. An SQL function with an SQL-standard body
-- (RETURN expression: names bound when it is created, no SET search_path), so that
-- recall's expression holds it inlined: the common request is checked without a call.
CREATE OR REPLACE FUNCTION fabric._recall_request_is_common(p_request jsonb)
RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN pg_catalog.jsonb_typeof(p_request) = 'object'
     AND (p_request - ARRAY['run_id', 'correlation_id', 'causation_id', 'requesting_agent',
                            'tiers', 'query', 'limit', 'allow_partial', 'mode']) = '{}'::jsonb
     AND pg_catalog.jsonb_typeof(p_request -> 'run_id') = 'string'
     AND (p_request ->> 'run_id') ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
     -- an array of known tiers (containment: strings only, each one of these), each once
     -- (as many elements as the tiers it holds)
     AND (CASE WHEN p_request ? 'tiers'
              THEN pg_catalog.jsonb_typeof(p_request -> 'tiers') = 'array'
                   AND (p_request -> 'tiers')
                       <@ '["episodic", "semantic", "procedural", "profile", "relational"]'::jsonb
                   AND pg_catalog.jsonb_array_length(p_request -> 'tiers')
                       = ((p_request -> 'tiers') ? 'episodic')::integer
                         + ((p_request -> 'tiers') ? 'semantic')::integer
                         + ((p_request -> 'tiers') ? 'procedural')::integer
                         + ((p_request -> 'tiers') ? 'profile')::integer
                         + ((p_request -> 'tiers') ? 'relational')::integer
              ELSE true END)
     AND coalesce(pg_catalog.jsonb_typeof(p_request -> 'query'), 'null') IN ('string', 'null')
     AND coalesce(pg_catalog.length(p_request ->> 'query'), 0) <= 1000
     -- text (or none), or semantic and hybrid with a query that has words
     AND (CASE WHEN coalesce(p_request ->> 'mode', 'text') = 'text' THEN true
              WHEN (p_request ->> 'mode') IN ('semantic', 'hybrid', 'graph')
              THEN pg_catalog.jsonb_typeof(p_request -> 'query') = 'string'
                   AND (p_request ->> 'query') !~ '^[[:space:][:cntrl:]]*$'
              ELSE false END)
     AND coalesce(pg_catalog.jsonb_typeof(p_request -> 'requesting_agent'), 'string') = 'string'
     AND coalesce(pg_catalog.jsonb_typeof(p_request -> 'allow_partial'), 'boolean') = 'boolean'
     AND (CASE WHEN NOT p_request ? 'limit' THEN true
              WHEN pg_catalog.jsonb_typeof(p_request -> 'limit') = 'number'
              THEN (p_request -> 'limit')::numeric = pg_catalog.trunc((p_request -> 'limit')::numeric)
                   AND (p_request -> 'limit')::numeric BETWEEN 1 AND 2147483647
              ELSE false END);

-- ---------------------------------------------------------------------------------------
-- fabric._recall_request_problem: NULL if the request is well formed, else why (22023).
CREATE OR REPLACE FUNCTION fabric._recall_request_problem(p_request jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- The common well-formed request first (fabric._recall_request_is_common, inlined).
  IF fabric._recall_request_is_common(p_request) THEN
    RETURN NULL;
  END IF;
  -- PL/pgSQL, not SQL: its plan is kept for the session instead of made on every recall.
  RETURN (SELECT CASE
    WHEN p_request IS NULL OR pg_catalog.jsonb_typeof(p_request) <> 'object' THEN
      'the recall request must be a JSON object'
    WHEN EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_request) k
                 WHERE k NOT IN ('run_id', 'correlation_id', 'causation_id', 'requesting_agent',
                                 'tiers', 'scope', 'query', 'filters', 'limit', 'allow_partial',
                                 'candidates', 'mode', 'traceparent', 'expand',
                                 'graph_candidates', 'neighbours')) THEN
      'the recall request has unknown keys (see docs/sql.md, Recall)'
    -- (checked only when present: absent is valid, and the check is a function call)
    WHEN CASE WHEN p_request ? 'traceparent'
              THEN fabric._traceparent_problem(p_request -> 'traceparent') END IS NOT NULL THEN
      fabric._traceparent_problem(p_request -> 'traceparent')
    WHEN p_request ? 'mode' AND (p_request ->> 'mode') NOT IN ('text', 'semantic', 'hybrid', 'graph') THEN
      'mode must be text, semantic, hybrid or graph'
    WHEN (p_request ->> 'mode') IN ('semantic', 'hybrid', 'graph')
      AND (pg_catalog.jsonb_typeof(p_request -> 'query') IS DISTINCT FROM 'string'
           OR (p_request ->> 'query') ~ '^[[:space:][:cntrl:]]*$') THEN
      'semantic, hybrid and graph recall need a query with words (omit mode to list without one)'
    WHEN p_request ? 'expand' AND (pg_catalog.jsonb_typeof(p_request -> 'expand') <> 'object'
      OR (p_request -> 'expand') - 'hops' - 'via' <> '{}'::jsonb
      OR coalesce((p_request -> 'expand' -> 'hops') NOT IN ('1', '2', '3'), true)
      OR coalesce(p_request ->> 'mode', '') NOT IN ('semantic', 'hybrid', 'graph')) THEN
      'expand must be {"hops": 1, 2 or 3, "via"?: [edge kinds]}, with mode semantic, hybrid or graph'
    -- the edge kinds a walk may follow from the records it reached (fabric._graph_walk_kinds)
    WHEN p_request -> 'expand' ? 'via' AND (pg_catalog.jsonb_typeof(p_request #> '{expand,via}') <> 'array'
      OR pg_catalog.jsonb_array_length(p_request #> '{expand,via}') NOT BETWEEN 1 AND 4
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request #> '{expand,via}') k
                 WHERE pg_catalog.jsonb_typeof(k) <> 'string'
                    OR NOT (k #>> '{}') = ANY (fabric._graph_walk_kinds()))) THEN
      'expand.via must be a list of the edge kinds MENTIONS, DERIVED_FROM, SUPERSEDES, INFLUENCED'
    WHEN p_request ? 'graph_candidates' AND NOT (p_request ? 'expand'
                                                 OR coalesce(p_request ->> 'mode', '') = 'graph') THEN
      'graph_candidates come with mode graph or with expand'
    -- the neighbour expansion: turns each side 1-3, of the first 1-10 records served
    WHEN p_request ? 'neighbours' AND (pg_catalog.jsonb_typeof(p_request -> 'neighbours') <> 'object'
      OR (p_request -> 'neighbours') - 'turns' - 'of' <> '{}'::jsonb
      OR coalesce((p_request #> '{neighbours,turns}') NOT IN ('1', '2', '3'), false)
      OR CASE WHEN NOT p_request -> 'neighbours' ? 'of' THEN false
              WHEN pg_catalog.jsonb_typeof(p_request #> '{neighbours,of}') <> 'number' THEN true
              ELSE (p_request #> '{neighbours,of}')::numeric
                     <> pg_catalog.trunc((p_request #> '{neighbours,of}')::numeric)
                   OR (p_request #> '{neighbours,of}')::numeric NOT BETWEEN 1 AND 10 END) THEN
      'neighbours must be {"turns"?: 1, 2 or 3, "of"?: 1 to 10}: the turns added each side of each of the first "of" records served'
    WHEN p_request ? 'neighbours' AND (pg_catalog.jsonb_typeof(p_request -> 'query') IS DISTINCT FROM 'string'
                                       OR (p_request ->> 'query') ~ '^[[:space:][:cntrl:]]*$') THEN
      'neighbours need a query with words: they expand the hits of a search, not a listing'
    WHEN pg_catalog.jsonb_typeof(p_request -> 'run_id') IS DISTINCT FROM 'string'
      OR (p_request ->> 'run_id') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
      'run_id is required and must be the UUID of your open run'
    WHEN p_request ? 'tiers' AND (pg_catalog.jsonb_typeof(p_request -> 'tiers') <> 'array'
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request -> 'tiers') t
                 WHERE pg_catalog.jsonb_typeof(t) <> 'string'
                    OR (t #>> '{}') NOT IN ('episodic', 'semantic', 'procedural', 'profile', 'relational'))) THEN
      'tiers must be an array of episodic, semantic, procedural, profile, relational'
    WHEN p_request ? 'tiers' AND pg_catalog.jsonb_array_length(p_request -> 'tiers')
      > (SELECT pg_catalog.count(DISTINCT t) FROM pg_catalog.jsonb_array_elements(p_request -> 'tiers') t) THEN
      'tiers must name each tier at most once'
    WHEN p_request ? 'scope' AND (pg_catalog.jsonb_typeof(p_request -> 'scope') <> 'object'
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_each(p_request -> 'scope') e
                 WHERE e.key NOT IN ('tenant_id', 'subject_id', 'session_id', 'agent_id', 'visibility')
                    OR (e.key <> 'visibility' AND pg_catalog.jsonb_typeof(e.value) NOT IN ('string', 'null')))
      OR (pg_catalog.jsonb_typeof(p_request #> '{scope,visibility}') = 'string'
          AND (p_request #>> '{scope,visibility}') NOT IN ('session', 'agent', 'subject', 'tenant'))
      OR (pg_catalog.jsonb_typeof(p_request #> '{scope,visibility}') = 'array'
          AND EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request #> '{scope,visibility}') v
                      WHERE pg_catalog.jsonb_typeof(v) <> 'string'
                         OR (v #>> '{}') NOT IN ('session', 'agent', 'subject', 'tenant')))
      OR pg_catalog.jsonb_typeof(p_request #> '{scope,visibility}') NOT IN ('string', 'array', 'null')) THEN
      'scope must be an object of tenant_id, subject_id, session_id, agent_id (strings) and visibility'
    WHEN p_request ? 'query' AND pg_catalog.jsonb_typeof(p_request -> 'query') NOT IN ('string', 'null') THEN
      'query must be a string'
    WHEN pg_catalog.length(p_request ->> 'query') > 1000 THEN
      'query must be at most 1000 characters'
    WHEN p_request ? 'requesting_agent' AND pg_catalog.jsonb_typeof(p_request -> 'requesting_agent') <> 'string' THEN
      'requesting_agent must be a string'
    WHEN p_request ? 'allow_partial' AND pg_catalog.jsonb_typeof(p_request -> 'allow_partial') <> 'boolean' THEN
      'allow_partial must be a boolean'
    WHEN p_request ? 'limit' AND (pg_catalog.jsonb_typeof(p_request -> 'limit') <> 'number'
      OR (p_request -> 'limit')::numeric <> pg_catalog.trunc((p_request -> 'limit')::numeric)
      OR (p_request -> 'limit')::numeric < 1
      OR (p_request -> 'limit')::numeric > 2147483647) THEN
      'limit must be a positive integer no larger than the deployment''s recall_max_limit'
    WHEN p_request ? 'filters' AND (pg_catalog.jsonb_typeof(p_request -> 'filters') <> 'object'
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_request -> 'filters') k
                 WHERE k NOT IN ('min_confidence', 'valid_at', 'compliance_labels_excluded',
                                 'memory_ids'))) THEN
      'filters must be an object of min_confidence, valid_at, compliance_labels_excluded, memory_ids'
    WHEN p_request #> '{filters,memory_ids}' IS NOT NULL
      AND (pg_catalog.jsonb_typeof(p_request #> '{filters,memory_ids}') <> 'array'
           OR pg_catalog.jsonb_array_length(p_request #> '{filters,memory_ids}') NOT BETWEEN 1 AND 100
           OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request #> '{filters,memory_ids}') x
                      WHERE pg_catalog.jsonb_typeof(x) <> 'string'
                         OR (x #>> '{}') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$')) THEN
      'filters.memory_ids must be an array of 1 to 100 memory ids (UUIDs)'
    WHEN p_request #> '{filters,memory_ids}' IS NOT NULL
      AND (p_request ? 'candidates' OR (p_request ->> 'mode') IN ('semantic', 'hybrid', 'graph')
           OR coalesce(p_request ->> 'query', '') !~ '^[[:space:][:cntrl:]]*$') THEN
      'filters.memory_ids reads records by id: omit query, candidates and a semantic, hybrid or graph mode'
    WHEN p_request #> '{filters,min_confidence}' IS NOT NULL
      AND (pg_catalog.jsonb_typeof(p_request #> '{filters,min_confidence}') <> 'number'
           OR (p_request #> '{filters,min_confidence}')::numeric NOT BETWEEN 0 AND 1
           OR ((p_request #> '{filters,min_confidence}')::numeric > 0
               AND (p_request #> '{filters,min_confidence}')::numeric < 1e-300)) THEN
      'filters.min_confidence must be a number in [0, 1] (0, or at least 1e-300)'
    WHEN p_request #> '{filters,compliance_labels_excluded}' IS NOT NULL
      AND (pg_catalog.jsonb_typeof(p_request #> '{filters,compliance_labels_excluded}') <> 'array'
           OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request #> '{filters,compliance_labels_excluded}') x
                      WHERE pg_catalog.jsonb_typeof(x) <> 'string')) THEN
      'filters.compliance_labels_excluded must be an array of strings'
    WHEN p_request ? 'candidates' AND (pg_catalog.jsonb_typeof(p_request -> 'candidates') <> 'array'
      OR pg_catalog.jsonb_array_length(p_request -> 'candidates') > 1000
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request -> 'candidates') c
                 WHERE pg_catalog.jsonb_typeof(c) <> 'object'
                    OR pg_catalog.jsonb_typeof(c -> 'memory_id') IS DISTINCT FROM 'string'
                    -- the canonical 8-4-4-4-12 form, as the run_id pattern above, without a
                    -- regular expression per candidate (~10 us each, most of this check's
                    -- cost): 36 characters, hyphens at 9, 14, 19, 24, and a valid uuid
                    -- (which then holds 32 hex digits, no braces)
                    OR pg_catalog.length(c ->> 'memory_id') <> 36
                    OR pg_catalog.substr(c ->> 'memory_id', 9, 1) || pg_catalog.substr(c ->> 'memory_id', 14, 1)
                       || pg_catalog.substr(c ->> 'memory_id', 19, 1) || pg_catalog.substr(c ->> 'memory_id', 24, 1) <> '----'
                    OR NOT pg_catalog.pg_input_is_valid(c ->> 'memory_id', 'uuid')
                    OR pg_catalog.jsonb_typeof(c -> 'score') IS DISTINCT FROM 'number'
                    OR pg_catalog.abs((c -> 'score')::numeric) > 1e300)) THEN
      'candidates must be an array of at most 1000 {"memory_id": uuid, "score": number}'
    WHEN p_request ? 'graph_candidates' AND (pg_catalog.jsonb_typeof(p_request -> 'graph_candidates') <> 'array'
      OR pg_catalog.jsonb_array_length(p_request -> 'graph_candidates') > 1000
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(p_request -> 'graph_candidates') c
                 WHERE pg_catalog.jsonb_typeof(c) <> 'object'
                    OR pg_catalog.jsonb_typeof(c -> 'memory_id') IS DISTINCT FROM 'string'
                    -- the canonical 8-4-4-4-12 form, as the run_id pattern above, without a
                    -- regular expression per candidate (~10 us each, most of this check's
                    -- cost): 36 characters, hyphens at 9, 14, 19, 24, and a valid uuid
                    -- (which then holds 32 hex digits, no braces)
                    OR pg_catalog.length(c ->> 'memory_id') <> 36
                    OR pg_catalog.substr(c ->> 'memory_id', 9, 1) || pg_catalog.substr(c ->> 'memory_id', 14, 1)
                       || pg_catalog.substr(c ->> 'memory_id', 19, 1) || pg_catalog.substr(c ->> 'memory_id', 24, 1) <> '----'
                    OR NOT pg_catalog.pg_input_is_valid(c ->> 'memory_id', 'uuid')
                    OR pg_catalog.jsonb_typeof(c -> 'score') IS DISTINCT FROM 'number'
                    OR pg_catalog.abs((c -> 'score')::numeric) > 1e300)) THEN
      'graph_candidates must be an array of at most 1000 {"memory_id": uuid, "score": number}'
  END);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._recall_request_schema: fabric._recall_request_problem (and the checks recall makes
-- after it: identifiers, filters.valid_at, the deployment's recall_max_limit) as a JSON
-- Schema. The MCP server and the docs read it through fabric_api.request_schema('recall');
-- tests/sql/test_request_schema.py checks the two agree on generated requests.
CREATE OR REPLACE FUNCTION fabric._recall_request_schema(p_max_limit integer)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_uuid constant text := '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$';
  -- a character other than ASCII space and control (what [[:space:][:cntrl:]] is in every locale)
  v_words constant text := U&'[^\0001-\0020\007F]';
  v_tiers constant jsonb := '["episodic", "semantic", "procedural", "profile", "relational"]';
  v_visibility constant jsonb := '["session", "agent", "subject", "tenant"]';
  v_ident jsonb := fabric._schema_ident(200);
  v_blank_query jsonb;
BEGIN
  v_blank_query := pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(
    '{"required": ["query"], "properties": {"query": {"type": "null"}}}'::jsonb,
    pg_catalog.jsonb_build_object('required', '["query"]'::jsonb, 'properties', pg_catalog.jsonb_build_object(
      'query', pg_catalog.jsonb_build_object('type', 'string', 'not', pg_catalog.jsonb_build_object('pattern', v_words)))),
    '{"not": {"required": ["query"]}}'::jsonb));
  RETURN pg_catalog.jsonb_build_object(
    '$schema', 'https://json-schema.org/draft/2020-12/schema',
    'title', 'recall request',
    'description', 'Recall memory records inside an open run. The database resolves the '
      'scope from the run and the agent''s memory profile; a request can only narrow it.',
    'type', 'object',
    'additionalProperties', false,
    'required', '["run_id"]'::jsonb,
    'properties', pg_catalog.jsonb_build_object(
      'run_id', pg_catalog.jsonb_build_object('type', 'string', 'pattern', v_uuid,
        'description', 'the UUID of the caller''s open run'),
      'correlation_id', pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(v_ident, '{"type": "null"}'::jsonb),
        'description', 'an identifier tying this recall to the caller''s other work (audited)'),
      'causation_id', pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(v_ident, '{"type": "null"}'::jsonb),
        'description', 'the identifier of the event that caused this recall (audited)'),
      'requesting_agent', '{"type": "string", "description": "the calling agent''s id; the run decides who asks"}'::jsonb,
      'tiers', pg_catalog.jsonb_build_object('type', 'array', 'uniqueItems', true, 'items', pg_catalog.jsonb_build_object('enum', v_tiers),
        'description', 'memory tiers to read; default: every tier the agent may read'),
      'scope', pg_catalog.jsonb_build_object('type', 'object', 'additionalProperties', false,
        'description', 'narrows the run''s scope; naming another tenant, subject or session is refused',
        'properties', pg_catalog.jsonb_build_object(
          'tenant_id', '{"type": ["string", "null"]}'::jsonb,
          'subject_id', '{"type": ["string", "null"]}'::jsonb,
          'session_id', '{"type": ["string", "null"]}'::jsonb,
          'agent_id', '{"type": ["string", "null"]}'::jsonb,
          'visibility', pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(
            pg_catalog.jsonb_build_object('enum', v_visibility || '[null]'::jsonb),
            pg_catalog.jsonb_build_object('type', 'array', 'items', pg_catalog.jsonb_build_object('enum', v_visibility)))))),
      'query', '{"type": ["string", "null"], "maxLength": 1000, "description": "what to look for, in words; omit to list the most recent records in scope"}'::jsonb,
      'filters', pg_catalog.jsonb_build_object('type', 'object', 'additionalProperties', false,
        'properties', pg_catalog.jsonb_build_object(
          'min_confidence', pg_catalog.jsonb_build_object('anyOf', '[{"const": 0}, {"type": "number", "minimum": 1e-300, "maximum": 1}]'::jsonb,
            'description', 'the lowest confidence served, in [0, 1]'),
          'valid_at', pg_catalog.jsonb_build_object('anyOf', pg_catalog.jsonb_build_array(fabric._schema_timestamp(), '{"type": "null"}'::jsonb),
            'description', 'serve what was valid at this instant (default now)'),
          'compliance_labels_excluded', '{"type": "array", "items": {"type": "string"}, "description": "leave out records carrying any of these labels"}'::jsonb,
          'memory_ids', pg_catalog.jsonb_build_object('type', 'array', 'minItems', 1, 'maxItems', 100,
            'items', pg_catalog.jsonb_build_object('type', 'string', 'pattern', v_uuid),
            'description', 'read these records by id (no query, no candidates, text mode)'))),
      'limit', pg_catalog.jsonb_build_object('type', 'integer', 'minimum', 1, 'maximum', p_max_limit,
        'description', 'how many records at most'),
      'allow_partial', '{"type": "boolean", "description": "serve the readable tiers when some requested tier is not readable"}'::jsonb,
      'candidates', pg_catalog.jsonb_build_object('type', 'array', 'maxItems', 1000,
        'items', pg_catalog.jsonb_build_object('type', 'object', 'required', '["memory_id", "score"]'::jsonb,
          'properties', pg_catalog.jsonb_build_object(
            'memory_id', pg_catalog.jsonb_build_object('type', 'string', 'pattern', v_uuid),
            'score', '{"type": "number", "minimum": -1e300, "maximum": 1e300}'::jsonb)),
        'description', 'vector candidates from a broker (clients fill this, not models)'),
      'graph_candidates', pg_catalog.jsonb_build_object('type', 'array', 'maxItems', 1000,
        'items', pg_catalog.jsonb_build_object('type', 'object', 'required', '["memory_id", "score"]'::jsonb,
          'properties', pg_catalog.jsonb_build_object(
            'memory_id', pg_catalog.jsonb_build_object('type', 'string', 'pattern', v_uuid),
            'score', '{"type": "number", "minimum": -1e300, "maximum": 1e300}'::jsonb)),
        'description', 'graph candidates from a walk of the graph projection (clients fill this, not models)'),
      'expand', '{"type": "object", "additionalProperties": false, "required": ["hops"], "properties": {"hops": {"enum": [1, 2, 3]}, "via": {"type": "array", "minItems": 1, "maxItems": 4, "items": {"enum": ["MENTIONS", "DERIVED_FROM", "SUPERSEDES", "INFLUENCED"]}, "description": "the edge kinds the walk follows from the records it reached (default MENTIONS)"}}, "description": "also walk the graph this many hops from the query''s entities (or the subject) and fuse what it finds"}'::jsonb,
      'neighbours', '{"type": "object", "additionalProperties": false, "properties": {"turns": {"enum": [1, 2, 3], "description": "records added each side of a hit (default 1)"}, "of": {"type": "integer", "minimum": 1, "maximum": 10, "description": "how many of the first records served are expanded (default 3)"}}, "description": "also serve, after the limit, the records just before and after each of the first hits in the same conversation (same scope, tier and session, within an hour of valid time), each marked retrieval.neighbour_of"}'::jsonb,
      'mode', '{"enum": ["text", "semantic", "hybrid", "graph", null], "description": "text (lexical), semantic (vectors), hybrid, or graph (a walk of the graph projection); omit to let the client choose"}'::jsonb,
      'traceparent', '{"anyOf": [{"type": "string", "pattern": "^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$"}, {"type": "null"}], "description": "W3C trace context of the caller''s span"}'::jsonb),
    'allOf', pg_catalog.jsonb_build_array(
      pg_catalog.jsonb_build_object(
        'if', '{"required": ["mode"], "properties": {"mode": {"enum": ["semantic", "hybrid", "graph"]}}}'::jsonb,
        'then', pg_catalog.jsonb_build_object('required', '["query"]'::jsonb, 'properties', pg_catalog.jsonb_build_object(
          'query', pg_catalog.jsonb_build_object('type', 'string', 'pattern', v_words)))),
      pg_catalog.jsonb_build_object(
        'if', '{"required": ["neighbours"]}'::jsonb,
        'then', pg_catalog.jsonb_build_object('required', '["query"]'::jsonb, 'properties', pg_catalog.jsonb_build_object(
          'query', pg_catalog.jsonb_build_object('type', 'string', 'pattern', v_words)))),
      '{"if": {"required": ["expand"]}, "then": {"required": ["mode"], "properties": {"mode": {"enum": ["semantic", "hybrid", "graph"]}}}}'::jsonb,
      '{"if": {"required": ["graph_candidates"]}, "then": {"anyOf": [{"required": ["expand"]}, {"required": ["mode"], "properties": {"mode": {"const": "graph"}}}]}}'::jsonb,
      pg_catalog.jsonb_build_object(
        'if', '{"required": ["filters"], "properties": {"filters": {"required": ["memory_ids"], "properties": {"memory_ids": {"not": {"type": "null"}}}}}}'::jsonb,
        'then', pg_catalog.jsonb_build_object('allOf', pg_catalog.jsonb_build_array(
          '{"not": {"required": ["candidates"]}}'::jsonb,
          '{"not": {"required": ["mode"], "properties": {"mode": {"enum": ["semantic", "hybrid", "graph"]}}}}'::jsonb,
          v_blank_query)))));
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.recall: R-RECALL-1 -- authorize the tool, resolve scope, push filters
-- into the query, answer with provenance and validity, audit.
CREATE OR REPLACE FUNCTION fabric_api.recall(p_request jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  -- (the common request is told well formed by an expression, inlined: no call)
  v_problem text := CASE WHEN fabric._recall_request_is_common(p_request) THEN NULL
                         ELSE fabric._recall_request_problem(p_request) END;
  v_run fabric.runs;
  v_profile jsonb;
  v_missing text[];
  v_resolved jsonb;
  v_reason text;
  v_status text;
  v_limit integer;
  v_valid_at timestamptz;
  v_records jsonb;
  -- the served records as a list (fabric._recall_answer puts each into the answer once)
  v_record_list jsonb[];
  v_count bigint;
  v_keys text[];
  v_tiers text[];
  v_vector_tiers text[];
  v_lexical_tiers text[];
  v_min_conf double precision;
  v_excluded text[];
  v_mode text;
  v_query text;
  v_ids uuid[];
  v_scores double precision[];
  v_served jsonb;
  v_only uuid[];
  v_lex_ids uuid[];
  v_lex_ranks double precision[];
  v_max_limit integer;
  v_default_limit integer;
  v_checked text;
  v_graph_ids uuid[];
  v_graph_scores double precision[];
  v_graph_tiers text[];
  v_key fabric.subject_keys;
  v_key_ref text;
  v_key_key bytea;
  v_memory_ids jsonb;  -- the served records' ids, when the retrieval statement gave them
  v_served_ids uuid[];
  v_near_ids uuid[];
  v_near_of uuid[];
  v_near_list jsonb[];
  v_turns integer;
  v_of integer;
BEGIN
  -- (an assignment of its void result, not PERFORM: a simple expression, without a
  -- statement of the executor)
  v_checked := fabric._reset_context();
  IF v_problem IS NOT NULL THEN
    PERFORM fabric._bad_envelope(v_problem, 'see docs/sql.md, Recall; run_id names your open run');
  END IF;
  -- Correlation and causation ids reach the append-only audit trail: identifiers only,
  -- checked exactly as propose checks them. (Assignments, not PERFORM: simple expressions,
  -- evaluated without a statement of the executor; absent ids need no check, told by one
  -- expression.)
  IF p_request ?| ARRAY['correlation_id', 'causation_id'] THEN
    IF p_request ? 'correlation_id' THEN
      v_checked := fabric._envelope_text(p_request -> 'correlation_id', 'correlation_id');
    END IF;
    IF p_request ? 'causation_id' THEN
      v_checked := fabric._envelope_text(p_request -> 'causation_id', 'causation_id');
    END IF;
  END IF;
  -- Without a mode the database serves text (the Python client picks hybrid when it can
  -- reach a vector broker); candidates come only from a broker, so they mean semantic.
  v_mode := coalesce(p_request ->> 'mode', CASE WHEN p_request ? 'candidates' THEN 'semantic' ELSE 'text' END);
  -- A query of only whitespace or control characters asks for nothing in particular.
  IF p_request ? 'query' THEN
    v_query := CASE WHEN p_request ->> 'query' !~ '^[[:space:][:cntrl:]]*$'
                    THEN p_request ->> 'query' END;
  END IF;

  v_run := fabric._enter_run((p_request ->> 'run_id')::uuid);
  -- One statement: the agent's profile, the deployment's limits, the three tool layers (as
  -- fabric._tool_denial reads them) and the subject's key for the audit event (NULL until
  -- the subject's first use: fabric._recall_answer makes it then). The tenant's rows are
  -- read by subqueries on the tenant, as fabric._tool_denial and fabric._subject_key read
  -- them (on Citus each goes to the tenant's shard; tests/citus).
  SELECT a.memory_profile, s.recall_max_limit, s.recall_default_limit,
         fabric._tool_layers_missing('tool:memory-recall' = ANY (a.tools_allowed),
           EXISTS (SELECT 1 FROM fabric.tenant_agent_tools t
                   WHERE t.tenant_id = v_run.tenant_id AND t.agent_id = v_run.agent_id
                     AND t.tool_id = 'tool:memory-recall'),
           v_run, 'tool:memory-recall'),
         (SELECT k.subject_ref FROM fabric.subject_keys k
           WHERE k.tenant_id = v_run.tenant_id AND k.subject_id = v_run.subject_id),
         (SELECT k.key FROM fabric.subject_keys k
           WHERE k.tenant_id = v_run.tenant_id AND k.subject_id = v_run.subject_id)
    INTO v_profile, v_max_limit, v_default_limit, v_missing, v_key_ref, v_key_key
    FROM fabric.deployment_settings s
    LEFT JOIN fabric.agents a ON a.agent_id = v_run.agent_id;
  IF v_key_key IS NOT NULL THEN
    v_key := ROW(v_run.tenant_id, v_run.subject_id, v_key_ref, v_key_key, NULL)::fabric.subject_keys;
  END IF;
  IF (p_request ->> 'limit')::numeric > v_max_limit THEN
    PERFORM fabric._bad_envelope(pg_catalog.format('limit must be at most %s', v_max_limit),
                                 'the deployment''s recall_max_limit caps every recall');
  END IF;
  v_limit := coalesce((p_request ->> 'limit')::numeric::integer, v_default_limit);
  -- (an absent valid_at is now, without the check's subtransaction)
  v_valid_at := coalesce(CASE WHEN p_request #> '{filters,valid_at}' IS NOT NULL
    THEN fabric._envelope_timestamp(p_request #> '{filters,valid_at}', 'filters.valid_at') END,
    pg_catalog.now());

  -- 1. Tool authorization, three layers (read above).
  IF pg_catalog.cardinality(v_missing) > 0 THEN
    v_reason := 'tool:memory-recall is not authorized: missing from '
                || pg_catalog.array_to_string(v_missing, ', ');
    PERFORM fabric._emit('agent.tool.unauthorized', v_run.tenant_id, p_payload =>
      pg_catalog.jsonb_build_object('tool', 'tool:memory-recall', 'agent_id', v_run.agent_id,
                                    'missing_layers', v_missing));
    RETURN fabric._recall_answer(v_run, p_request, 'denied', v_reason, NULL, '[]', false,
             pg_catalog.jsonb_build_object('mode_served', v_mode, 'tiers_served_lexically', '[]'::jsonb),
             v_key);
  END IF;

  -- 2. Scope before retrieval (os-agt-012).
  v_resolved := fabric.resolve_recall_scope(v_profile, v_run, p_request);
  v_reason := v_resolved ->> 'denied_reason';
  IF v_reason IS NULL AND pg_catalog.jsonb_array_length(v_resolved -> 'tiers_denied') > 0
     AND NOT coalesce((p_request ->> 'allow_partial')::boolean, false) THEN
    v_reason := 'tier ' || (SELECT pg_catalog.string_agg(t, ', ') FROM
                 pg_catalog.jsonb_array_elements_text(v_resolved -> 'tiers_denied') t)
                || ' is outside the agent''s memory_profile.recall_scope.tiers'
                || ' (set allow_partial to be served the other tiers)';
  END IF;
  IF v_reason IS NULL AND pg_catalog.jsonb_array_length(v_resolved -> 'tiers') = 0 THEN
    v_reason := 'no requested tier is readable under the agent''s memory_profile.recall_scope';
  END IF;
  IF v_reason IS NOT NULL THEN
    RETURN fabric._recall_answer(v_run, p_request, 'denied', v_reason, v_resolved, '[]', false,
             pg_catalog.jsonb_build_object('mode_served', v_mode, 'tiers_served_lexically', '[]'::jsonb),
             v_key);
  END IF;
  v_status := CASE WHEN pg_catalog.jsonb_array_length(v_resolved -> 'tiers_denied') > 0
                   THEN 'partial' ELSE 'served' END;

  -- 3-5. Retrieval with every filter in the query.
  -- (the resolution's arrays of strings as text[], by simple expressions: JSON_QUERY ...
  -- RETURNING text[] gives what jsonb_array_elements_text does, without a statement)
  v_keys := JSON_QUERY(v_resolved -> 'scope_keys', '$' RETURNING text[]);
  v_tiers := JSON_QUERY(v_resolved -> 'tiers', '$' RETURNING text[]);
  v_min_conf := coalesce((p_request #>> '{filters,min_confidence}')::numeric::double precision, 0);
  v_excluded := '{}';
  IF p_request #> '{filters,compliance_labels_excluded}' IS NOT NULL THEN
    v_excluded := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                    p_request #> '{filters,compliance_labels_excluded}'));
  END IF;
  -- Tiers with a vector collection are searched by the broker in semantic and hybrid
  -- recall; the others the agent may read are served lexically. Text is lexical throughout.
  -- A graph walk (mode graph, or expand) may reach every tier the agent may read.
  IF v_mode = 'graph' OR p_request ? 'expand' THEN
    v_graph_tiers := v_tiers;
  END IF;
  IF v_mode = 'graph' THEN
    v_vector_tiers := '{}';
    v_lexical_tiers := '{}';
    v_served := pg_catalog.jsonb_build_object('mode_served', v_mode,
                                              'tiers_served_lexically', '[]'::jsonb);
  ELSIF v_mode = 'text' THEN
    v_vector_tiers := '{}';
    v_lexical_tiers := v_tiers;
    -- every tier lexically: the resolved tiers as they are (already sorted)
    v_served := pg_catalog.jsonb_build_object('mode_served', v_mode, 'tiers_served_lexically',
                                              v_resolved -> 'tiers');
  ELSE
    v_vector_tiers := ARRAY(SELECT t FROM pg_catalog.unnest(v_tiers) t
                            WHERE t = ANY (fabric._vector_tiers()) ORDER BY t);
    v_lexical_tiers := ARRAY(SELECT t FROM pg_catalog.unnest(v_tiers) t
                             WHERE v_mode = 'hybrid' OR NOT t = ANY (fabric._vector_tiers())
                             ORDER BY t);
    v_served := pg_catalog.jsonb_build_object('mode_served', v_mode, 'tiers_served_lexically',
      pg_catalog.to_jsonb(ARRAY(SELECT t FROM pg_catalog.unnest(v_tiers) t
                                WHERE NOT t = ANY (fabric._vector_tiers()) ORDER BY t)));
  END IF;

  -- Semantic and hybrid recall come in two steps: first the broker learns the resolved
  -- filter (nothing is retrieved, nothing audited but a denial), then it returns the
  -- vector store's candidates, which are re-checked here against every rule.
  IF v_mode <> 'text' AND NOT p_request ? 'candidates' AND NOT p_request ? 'graph_candidates' THEN
    -- Hybrid recall's lexical list needs only the resolved scope and the query: it is
    -- computed now, while the client embeds the query, exactly as the second call would
    -- (same function, tiers and depth: fabric._fused_lexical), and kept in the session for
    -- that call (fabric._lexical_stash); nothing of it is answered.
    IF v_mode = 'hybrid' AND v_query IS NOT NULL
       AND pg_catalog.cardinality(v_lexical_tiers) > 0 THEN
      PERFORM fabric._lexical_stash(p_request,
        ARRAY(SELECT r.memory_id
                FROM fabric._fused_lexical(v_run.tenant_id, v_keys, v_lexical_tiers,
                       v_valid_at, v_min_conf, v_excluded, v_query,
                       GREATEST(v_limit, 10)) AS r
               ORDER BY r.ord));
    END IF;
    RETURN pg_catalog.jsonb_build_object('correlation_id', p_request -> 'correlation_id',
      'status', 'resolved', 'tiers_denied', v_resolved -> 'tiers_denied',
      'scope_applied', v_resolved -> 'scope_applied',
      -- the scope keys as the projections hold them: pseudonyms of the subject and session
      'filter', pg_catalog.jsonb_build_object('tenant_id', v_run.tenant_id,
        'scope_keys', fabric._projection_scope_keys(v_run.tenant_id, v_run.agent_id,
          v_run.subject_id, v_run.session_id,
          JSON_QUERY(v_resolved #> '{scope_applied,visibility}', '$' RETURNING text[])),
        'tiers', pg_catalog.to_jsonb(v_vector_tiers),
        'valid_at', v_valid_at, 'min_confidence', v_min_conf,
        'excluded_labels', pg_catalog.to_jsonb(v_excluded), 'limit', v_limit)) || v_served
      -- where a graph walk starts (entity ids only: names stay here) and how far it goes
      || CASE WHEN v_graph_tiers IS NOT NULL THEN pg_catalog.jsonb_build_object('graph',
           pg_catalog.jsonb_build_object(
             -- (the subject only for mode graph: as one fused list among others, a walk from
        -- the subject reaches every record of it and ranks nothing)
        'seeds', pg_catalog.to_jsonb(fabric._graph_seeds(v_run.tenant_id, v_query, v_keys,
                   CASE WHEN v_mode = 'graph' THEN v_run.subject_id END)),
             'hops', coalesce((p_request #>> '{expand,hops}')::integer, 2),
             -- the edge kinds it follows from the records it reached (MENTIONS by default)
             'via', pg_catalog.to_jsonb(CASE WHEN p_request -> 'expand' ? 'via' THEN ARRAY(
                      SELECT DISTINCT k FROM pg_catalog.jsonb_array_elements_text(
                        p_request #> '{expand,via}') k ORDER BY 1)
                      ELSE ARRAY['MENTIONS'] END),
             'tiers', pg_catalog.to_jsonb(v_graph_tiers)))
         ELSE '{}'::jsonb END;
  END IF;
  IF p_request ? 'graph_candidates' THEN
    v_graph_ids := ARRAY(SELECT (x ->> 'memory_id')::uuid
                         FROM pg_catalog.jsonb_array_elements(p_request -> 'graph_candidates') x);
    v_graph_scores := ARRAY(SELECT (x ->> 'score')::numeric::double precision
                            FROM pg_catalog.jsonb_array_elements(p_request -> 'graph_candidates') x);
    IF v_mode <> 'graph' THEN  -- expanded: the graph answered too
      v_served := pg_catalog.jsonb_set(v_served, '{mode_served}', pg_catalog.to_jsonb(v_mode || '+graph'));
    END IF;
  END IF;
  IF p_request ? 'candidates' THEN
    v_ids := ARRAY(SELECT (x ->> 'memory_id')::uuid
                   FROM pg_catalog.jsonb_array_elements(p_request -> 'candidates') x);
    v_scores := ARRAY(SELECT (x ->> 'score')::numeric::double precision
                      FROM pg_catalog.jsonb_array_elements(p_request -> 'candidates') x);
    -- the lexical list this request's resolution kept, if this session made it: its ids
    -- are re-checked by id against every rule, ranked as kept (minus the position is the
    -- score the by-ids path orders by)
    IF v_mode = 'hybrid' AND v_query IS NOT NULL
       AND pg_catalog.cardinality(v_lexical_tiers) > 0 THEN
      v_lex_ids := fabric._lexical_unstash(p_request);
      IF v_lex_ids IS NOT NULL THEN
        v_lex_ranks := ARRAY(SELECT -x.i::double precision
                               FROM pg_catalog.generate_subscripts(v_lex_ids, 1) AS x(i)
                              ORDER BY x.i);
      END IF;
    END IF;
  END IF;

  IF p_request #> '{filters,memory_ids}' IS NOT NULL THEN
    v_only := ARRAY(SELECT (x #>> '{}')::uuid
                    FROM pg_catalog.jsonb_array_elements(p_request #> '{filters,memory_ids}') x);
    IF v_only = '{}' THEN
      v_only := NULL;
    END IF;
  END IF;

  IF v_mode = 'graph' THEN
    -- Graph recall: the walk's candidates alone, each re-checked against every rule like a
    -- vector candidate, in the walk's order (score and retrieval as for one vector list).
    SELECT coalesce(pg_catalog.array_agg(r.record || pg_catalog.jsonb_build_object(
                      'score', pg_catalog.round(((1.0 / (60 + r.ord))
                                                 / (1.0 / 61)::double precision)::numeric, 6),
                      'retrieval', pg_catalog.jsonb_build_object('graph', r.ord)) ORDER BY r.ord)
                      FILTER (WHERE r.ord <= v_limit), '{}'),
           coalesce(pg_catalog.jsonb_agg(r.memory_id ORDER BY r.ord)
                      FILTER (WHERE r.ord <= v_limit), '[]'),
           pg_catalog.count(*)
    INTO v_record_list, v_memory_ids, v_count
    FROM fabric._recall_candidates(v_run.tenant_id, v_keys, v_graph_tiers, v_valid_at,
           v_min_conf, v_excluded, NULL, coalesce(v_graph_ids, '{}'), v_graph_scores,
           GREATEST(v_limit, 10))
           WITH ORDINALITY AS r(memory_id, score, record, ord);
  ELSIF v_ids IS NULL AND v_query IS NULL THEN
    -- Nothing to rank by: the readable records (only the ones named by filters.memory_ids,
    -- when given), most confident and most recent first. The top k come with their score
    -- (null) and retrieval ({}) already (fabric._recall_envelope); records read by id get
    -- them here. The records are a list, not a jsonb array (here and in the paths below):
    -- an array built by jsonb_agg is encoded, then decoded and encoded again into the
    -- answer; a list goes into the answer once (8 records: 38 µs against 85).
    SELECT coalesce(pg_catalog.array_agg(CASE WHEN r.record ? 'retrieval' THEN r.record
                      ELSE r.record || '{"score": null, "retrieval": {}}'::jsonb END
                      ORDER BY r.ord)
                      FILTER (WHERE r.ord <= v_limit), '{}'),
           coalesce(pg_catalog.jsonb_agg(r.memory_id ORDER BY r.ord)
                      FILTER (WHERE r.ord <= v_limit), '[]'),
           pg_catalog.count(*)
    INTO v_record_list, v_memory_ids, v_count
    FROM fabric._recall_candidates(v_run.tenant_id, v_keys, v_tiers, v_valid_at, v_min_conf,
           v_excluded, NULL, v_only, NULL, v_limit + 1)
           WITH ORDINALITY AS r(memory_id, score, record, ord);
  ELSIF v_ids IS NULL THEN
    -- Text recall: the lexical list alone, whose order is the answer's. Each record's score
    -- and retrieval are what fabric._recall_fused gives a single lexical list (fused score
    -- 1 / (60 + rank) over the best, 1 / 61), built with the record by the retrieval itself
    -- (fabric._recall_envelope), without the fusion's join and ranking. limit + 1 records:
    -- the one more tells truncation.
    SELECT coalesce(pg_catalog.array_agg(r.record ORDER BY r.ord)
                      FILTER (WHERE r.ord <= v_limit), '{}'),
           coalesce(pg_catalog.jsonb_agg(r.memory_id ORDER BY r.ord)
                      FILTER (WHERE r.ord <= v_limit), '[]'),
           pg_catalog.count(*)
    INTO v_record_list, v_memory_ids, v_count
    FROM fabric._recall_candidates(v_run.tenant_id, v_keys, v_lexical_tiers, v_valid_at,
           v_min_conf, v_excluded, v_query, NULL, NULL, v_limit + 1)
           WITH ORDINALITY AS r(memory_id, score, record, ord);
  ELSIF pg_catalog.cardinality(v_lexical_tiers) = 0 AND v_graph_ids IS NULL THEN
    -- Semantic recall of vector tiers only: the re-checked vector list alone, whose order
    -- is the answer's. Each record's score and retrieval are what fabric._recall_fused
    -- gives a single vector list (fused score 1 / (60 + rank) over the best, 1 / 61), built
    -- here in one aggregate without the fusion's join and ranking (as text recall does for
    -- its lexical list). The list is cut where the fusion cuts it (the limit, at least 10).
    SELECT coalesce(pg_catalog.array_agg(r.record || pg_catalog.jsonb_build_object(
                      'score', pg_catalog.round(((1.0 / (60 + r.ord))
                                                 / (1.0 / 61)::double precision)::numeric, 6),
                      'retrieval', pg_catalog.jsonb_build_object('vector', r.ord)) ORDER BY r.ord)
                      FILTER (WHERE r.ord <= v_limit), '{}'),
           coalesce(pg_catalog.jsonb_agg(r.memory_id ORDER BY r.ord)
                      FILTER (WHERE r.ord <= v_limit), '[]'),
           pg_catalog.count(*)
    INTO v_record_list, v_memory_ids, v_count
    FROM fabric._recall_candidates(v_run.tenant_id, v_keys, v_vector_tiers, v_valid_at,
           v_min_conf, v_excluded, NULL, v_ids, v_scores, GREATEST(v_limit, 10))
           WITH ORDINALITY AS r(memory_id, score, record, ord);
  ELSE
    -- Vector candidates (semantic or hybrid): reciprocal rank fusion over the union of the
    -- vector and lexical lists, in one statement (one snapshot). Each list is taken to
    -- fabric._fusion_depth (50 at limit 10) before the union is cut to the limit
    -- (measured by make bench-quality).
    SELECT f.records, f.found INTO v_records, v_count
      FROM fabric._recall_fused(v_run.tenant_id, v_keys, v_vector_tiers, v_lexical_tiers,
             v_valid_at, v_min_conf, v_excluded, v_query, v_ids, v_scores,
             GREATEST(v_limit, 10),
             (CASE WHEN v_mode = 'hybrid' AND v_query IS NOT NULL
                        AND pg_catalog.cardinality(v_vector_tiers) > 0
                   THEN 2.0 / 61 ELSE 1.0 / 61 END)
               + CASE WHEN v_graph_ids IS NOT NULL THEN 1.0 / 61 ELSE 0 END,
             v_limit, v_lex_ids, v_lex_ranks, v_graph_tiers, v_graph_ids, v_graph_scores) f;
  END IF;

  -- Neighbours (the request's `neighbours`): after the served records, the turns just before
  -- and after each of the first `of` of them in the same conversation (fabric._recall_neighbours:
  -- the same scope key, tier, subject and session, within an hour of valid time, under every
  -- rule), none twice and none already served; each re-checked by id against every rule by
  -- fabric._recall_candidates as a vector candidate is, and marked
  -- `"retrieval": {"neighbour_of": <memory_id>}` without a score. They never displace a hit:
  -- the `limit` records are served as without the option, the neighbours come after them.
  -- The audit event names them with the others and says the option was used.
  IF p_request ? 'neighbours' THEN
    v_turns := coalesce((p_request #>> '{neighbours,turns}')::numeric::integer, 1);
    v_of := coalesce((p_request #>> '{neighbours,of}')::numeric::integer, 3);
    v_served_ids := ARRAY(SELECT (x #>> '{}')::uuid
                            FROM pg_catalog.jsonb_array_elements(coalesce(v_memory_ids,
                                   pg_catalog.jsonb_path_query_array(v_records, '$[*].memory_id'))) x);
    SELECT pg_catalog.array_agg(n.memory_id ORDER BY n.ord),
           pg_catalog.array_agg(n.neighbour_of ORDER BY n.ord)
      INTO v_near_ids, v_near_of
      FROM fabric._recall_neighbours(v_run.tenant_id, v_keys, v_tiers, v_valid_at, v_min_conf,
             v_excluded, v_served_ids[1:v_of], v_served_ids, v_turns)
             WITH ORDINALITY AS n(memory_id, neighbour_of, ord);
    IF v_near_ids IS NOT NULL THEN
      -- the by-ids re-check keeps the order of the scores given (minus the position)
      SELECT coalesce(pg_catalog.array_agg(r.record || pg_catalog.jsonb_build_object(
                        'score', NULL, 'retrieval',
                        pg_catalog.jsonb_build_object('neighbour_of', n.neighbour_of))
                        ORDER BY n.ord), '{}'),
             coalesce(pg_catalog.jsonb_agg(r.memory_id ORDER BY n.ord), '[]')
        INTO v_near_list, v_memory_ids
        FROM fabric._recall_candidates(v_run.tenant_id, v_keys, v_tiers, v_valid_at,
               v_min_conf, v_excluded, NULL, v_near_ids,
               ARRAY(SELECT -x.i::double precision
                       FROM pg_catalog.generate_subscripts(v_near_ids, 1) AS x(i) ORDER BY x.i),
               pg_catalog.cardinality(v_near_ids)) AS r(memory_id, score, record)
        JOIN ROWS FROM (pg_catalog.unnest(v_near_ids), pg_catalog.unnest(v_near_of))
             WITH ORDINALITY AS n(memory_id, neighbour_of, ord) ON n.memory_id = r.memory_id;
      -- (v_memory_ids now holds the neighbours' ids: the served ones go first)
      v_memory_ids := pg_catalog.to_jsonb(v_served_ids) || v_memory_ids;
      IF v_records IS NOT NULL THEN
        v_records := v_records || pg_catalog.to_jsonb(v_near_list);
      ELSE
        v_record_list := v_record_list || v_near_list;
      END IF;
    END IF;
    v_served := v_served || pg_catalog.jsonb_build_object('neighbours',
      pg_catalog.jsonb_build_object('turns', v_turns, 'of', v_of,
        'served', coalesce(pg_catalog.cardinality(v_near_list), 0)));
  END IF;

  -- A recall that walked the graph is a reasoning step of its run: the entities it started
  -- from are the ones it touched (fabric_audit.entity_touches answers for it, and the
  -- projector writes its TOUCHED edges as for a workflow's step).
  IF v_graph_ids IS NOT NULL THEN
    PERFORM fabric._record_recall_step(v_run, p_request ->> 'correlation_id',
      fabric._graph_seeds(v_run.tenant_id, v_query, v_keys,
                          CASE WHEN v_mode = 'graph' THEN v_run.subject_id END));
  END IF;
  RETURN fabric._recall_answer(v_run, p_request, v_status, NULL, v_resolved, v_records,
                               v_count > v_limit, v_served, v_key, v_memory_ids, v_record_list);
END $$;
COMMENT ON FUNCTION fabric_api.recall(jsonb) IS
  'Recall memory inside your open run (docs/sql.md, Recall): authorized, scope-first, filters pushed '
  'down, audited. Example: SELECT fabric_api.recall(''{"run_id": "<run_id>", "tiers": ["semantic"], '
  '"query": "billing entity", "filters": {"min_confidence": 0.7}, "limit": 8}'');';
