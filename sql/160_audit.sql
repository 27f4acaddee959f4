-- fabric_audit: read-only reconstruction for os-agt-008 (members of fabric_auditor only).
-- Past states come from the history table; erased content is never reconstructed.

-- ---------------------------------------------------------------------------------------
-- fabric._enter_audit: only auditors read here; the tenant is named explicitly.
CREATE OR REPLACE FUNCTION fabric._enter_audit(p_tenant_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_auditor', 'read the audit schema');
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._known_at: every record of a tenant as the fabric knew it at p_known_at -- the
-- mutable columns from the history row whose transaction time contains p_known_at.
CREATE OR REPLACE FUNCTION fabric._known_at(p_tenant_id text, p_known_at timestamptz)
RETURNS TABLE (memory_id uuid, tier text, consolidation_state text, visibility text,
               scope_key text, subject_id text, valid_from timestamptz, valid_until timestamptz,
               confidence double precision, formation_method text, content_hash text,
               content jsonb, recorded_at timestamptz, known_since timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT m.memory_id,
         coalesce(v.tier, m.tier),
         coalesce(v.consolidation_state, m.consolidation_state),
         m.visibility, m.scope_key, m.subject_id, m.valid_from,
         CASE WHEN v.memory_id IS NULL THEN m.valid_until ELSE v.valid_until END,
         m.confidence, m.formation_method, m.content_hash, m.content, m.recorded_at,
         coalesce(pg_catalog.lower(v.known_during), m.known_since)
  FROM fabric.memory_records m
  LEFT JOIN fabric.memory_record_versions v
    ON v.tenant_id = m.tenant_id AND v.memory_id = m.memory_id AND v.known_during @> p_known_at
  WHERE m.tenant_id = p_tenant_id
    AND m.recorded_at <= p_known_at
    AND (v.memory_id IS NOT NULL OR m.known_since <= p_known_at)
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_audit.records_as_of: what was valid at p_valid_at according to what the fabric
-- knew at p_known_at -- superseded and tombstoned shells included, erased content never.
-- supersedes names the record a successor replaced once that replacement was known.
DO $drop_older_shape$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
             WHERE p.oid = pg_catalog.to_regprocedure(
                             'fabric_audit.records_as_of(text, timestamptz, timestamptz)')
               AND NOT ('supersedes' = ANY (p.proargnames))) THEN
    DROP FUNCTION fabric_audit.records_as_of(text, timestamptz, timestamptz);
  END IF;
END
$drop_older_shape$;
CREATE OR REPLACE FUNCTION fabric_audit.records_as_of(p_tenant_id text, p_valid_at timestamptz,
                                                      p_known_at timestamptz DEFAULT now())
RETURNS TABLE (memory_id uuid, tier text, consolidation_state text, visibility text,
               scope_key text, valid_from timestamptz, valid_until timestamptz,
               confidence double precision, formation_method text, content_hash text,
               content jsonb, recorded_at timestamptz, known_since timestamptz,
               derived_from uuid[], supersedes uuid)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    WITH k AS MATERIALIZED (SELECT * FROM fabric._known_at(p_tenant_id, p_known_at))
    SELECT k.memory_id, k.tier, k.consolidation_state, k.visibility, k.scope_key, k.valid_from,
           k.valid_until, k.confidence, k.formation_method, k.content_hash, k.content,
           k.recorded_at, k.known_since,
           ARRAY(SELECT l.derived_from_id FROM fabric.memory_lineage l
                 WHERE l.tenant_id = p_tenant_id AND l.memory_id = k.memory_id
                 ORDER BY l.derived_from_id),
           (SELECT m.supersedes FROM fabric.memory_records m
            JOIN k o ON o.memory_id = m.supersedes
            WHERE m.tenant_id = p_tenant_id AND m.memory_id = k.memory_id
              AND o.consolidation_state IN ('superseded', 'tombstoned'))
    FROM k
    WHERE k.valid_from <= p_valid_at AND (k.valid_until IS NULL OR k.valid_until > p_valid_at)
    ORDER BY k.valid_from, k.memory_id;
END $$;
COMMENT ON FUNCTION fabric_audit.records_as_of(text, timestamptz, timestamptz) IS
  'What was valid at p_valid_at as known at p_known_at (bitemporal). Auditors only. '
  'Example: SELECT * FROM fabric_audit.records_as_of(''acme'', ''2026-08-16T10:00Z'', now());';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.lineage: derived_from both ways, recursive, with depth; the supersession
-- chain both ways ('supersedes': records this one replaced, 'superseded_by': its successors,
-- with derived_from_id naming the record each successor replaced); and corroboration
-- ('corroborated_by': episodes that corroborated this assertion after it was formed;
-- 'corroborates': assertions this episode corroborated, derived_from_id naming the episode).
CREATE OR REPLACE FUNCTION fabric_audit.lineage(p_tenant_id text, p_memory_id uuid)
RETURNS TABLE (direction text, depth integer, memory_id uuid, derived_from_id uuid, tier text,
               consolidation_state text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    WITH RECURSIVE up(child, parent, depth) AS (
      SELECT l.memory_id, l.derived_from_id, 1 FROM fabric.memory_lineage l
      WHERE l.tenant_id = p_tenant_id AND l.memory_id = p_memory_id
      UNION
      SELECT l.memory_id, l.derived_from_id, u.depth + 1 FROM fabric.memory_lineage l
      JOIN up u ON l.tenant_id = p_tenant_id AND l.memory_id = u.parent
      WHERE u.depth < 64
    ), down(child, parent, depth) AS (
      SELECT l.memory_id, l.derived_from_id, 1 FROM fabric.memory_lineage l
      WHERE l.tenant_id = p_tenant_id AND l.derived_from_id = p_memory_id
      UNION
      SELECT l.memory_id, l.derived_from_id, d.depth + 1 FROM fabric.memory_lineage l
      JOIN down d ON l.tenant_id = p_tenant_id AND l.derived_from_id = d.child
      WHERE d.depth < 64
    ), older(child, parent, depth) AS (
      SELECT m.memory_id, m.supersedes, 1 FROM fabric.memory_records m
      WHERE m.tenant_id = p_tenant_id AND m.memory_id = p_memory_id AND m.supersedes IS NOT NULL
      UNION
      SELECT m.memory_id, m.supersedes, o.depth + 1 FROM fabric.memory_records m
      JOIN older o ON m.tenant_id = p_tenant_id AND m.memory_id = o.parent
      WHERE m.supersedes IS NOT NULL AND o.depth < 64
    ), newer(child, parent, depth) AS (
      SELECT m.memory_id, m.supersedes, 1 FROM fabric.memory_records m
      WHERE m.tenant_id = p_tenant_id AND m.supersedes = p_memory_id
      UNION
      SELECT m.memory_id, m.supersedes, n.depth + 1 FROM fabric.memory_records m
      JOIN newer n ON m.tenant_id = p_tenant_id AND m.supersedes = n.child
      WHERE n.depth < 64
    ), edges AS (
      SELECT 'ancestor'::text AS direction, u.depth, u.parent AS node, u.child, u.parent FROM up u
      UNION ALL
      SELECT 'descendant', d.depth, d.child, d.child, d.parent FROM down d
      UNION ALL
      SELECT 'supersedes', o.depth, o.parent, o.child, o.parent FROM older o
      UNION ALL
      SELECT 'superseded_by', n.depth, n.child, n.child, n.parent FROM newer n
      UNION ALL  -- episodes that corroborated it after it was formed (derived_from stays as formed)
      SELECT 'corroborated_by', 1, c.episode_id, c.memory_id, c.episode_id
      FROM fabric.memory_corroborations c
      WHERE c.tenant_id = p_tenant_id AND c.memory_id = p_memory_id
      UNION ALL  -- assertions this episode corroborated
      SELECT 'corroborates', 1, c.memory_id, c.memory_id, c.episode_id
      FROM fabric.memory_corroborations c
      WHERE c.tenant_id = p_tenant_id AND c.episode_id = p_memory_id
    )
    SELECT e.direction, e.depth, e.node,
           CASE WHEN e.direction IN ('ancestor', 'supersedes', 'corroborated_by') THEN NULL
                ELSE e.parent END,
           m.tier, m.consolidation_state
    FROM edges e
    JOIN fabric.memory_records m ON m.tenant_id = p_tenant_id AND m.memory_id = e.node
    ORDER BY e.direction, e.depth, e.node;
END $$;
COMMENT ON FUNCTION fabric_audit.lineage(text, uuid) IS
  'Ancestors and descendants of a record through derived_from, its supersession chain '
  '(supersedes / superseded_by) and its corroborations (corroborated_by / corroborates), '
  'with depth. Auditors only. '
  'Example: SELECT * FROM fabric_audit.lineage(''acme'', ''<memory_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.recalls: who recalled what, when, in which run and scope -- each recall event
-- as its documents (scope, tiers and memory ids as jsonb, as the event holds them). A view
-- of the canonical relation, fabric_audit.recall_history (sql/280_audit_relations.sql): its
-- recalls, in its order and with its columns, and each recall's documents read from its
-- event by id; it stays for the callers that read whole documents (the SDK's recalls(),
-- the demo).
CREATE OR REPLACE FUNCTION fabric_audit.recalls(p_tenant_id text, p_from timestamptz,
                                                p_to timestamptz)
RETURNS TABLE (occurred_at timestamptz, status text, agent_id text, actor_login name,
               run_id uuid, correlation_id text, tiers_served jsonb, tiers_denied jsonb,
               scope jsonb, memory_ids jsonb, request_hash text, reason text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);  -- the tenant is set before the events are read
  RETURN QUERY
    SELECT h.occurred_at, h.status, e.actor_agent_id, h.actor_login, h.run_id,
           h.correlation_id, e.payload -> 'tiers_served', e.payload -> 'tiers_denied',
           e.payload -> 'scope', coalesce(e.payload -> 'memory_ids', '[]'),
           h.request_hash, h.reason
    FROM fabric_audit.recall_history(p_tenant_id, p_from, p_to) WITH ORDINALITY AS h
    JOIN fabric.events e
      ON e.tenant_id = p_tenant_id AND e.event_id = h.recall_id
     AND e.occurred_at = h.occurred_at
    ORDER BY h.ordinality;
END $$;
COMMENT ON FUNCTION fabric_audit.recalls(text, timestamptz, timestamptz) IS
  'Recall history (served, partial, denied) of a tenant in [p_from, p_to). Auditors only. '
  'Example: SELECT * FROM fabric_audit.recalls(''acme'', now() - interval ''1 day'', now());';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.profile_at: a subject's profile as it was at p_at, as known at p_known_at.
CREATE OR REPLACE FUNCTION fabric_audit.profile_at(p_tenant_id text, p_subject_id text,
  p_at timestamptz, p_known_at timestamptz DEFAULT now())
RETURNS TABLE (memory_id uuid, assertion_key text, content jsonb, content_hash text,
               consolidation_state text, valid_from timestamptz, valid_until timestamptz,
               confidence double precision, visibility text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT k.memory_id, k.content ->> 'key', k.content, k.content_hash, k.consolidation_state,
           k.valid_from, k.valid_until, k.confidence, k.visibility
    FROM fabric._known_at(p_tenant_id, p_known_at) k
    WHERE k.tier = 'profile' AND k.subject_id = p_subject_id
      AND k.consolidation_state <> 'tombstoned'
      AND k.valid_from <= p_at AND (k.valid_until IS NULL OR k.valid_until > p_at)
    ORDER BY k.content ->> 'key', k.valid_from, k.memory_id;
END $$;
COMMENT ON FUNCTION fabric_audit.profile_at(text, text, timestamptz, timestamptz) IS
  'A subject''s profile valid at p_at as known at p_known_at. Auditors only. '
  'Example: SELECT * FROM fabric_audit.profile_at(''acme'', ''user-8842'', ''2026-08-16T10:00Z'');';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.subject_events: a living subject's events in [p_from, p_to) -- those that
-- name it by its pseudonym and those of its runs. After its erasure there is no key to
-- compute the pseudonym with, so nothing is found.
CREATE OR REPLACE FUNCTION fabric_audit.subject_events(p_tenant_id text, p_subject_id text,
  p_from timestamptz, p_to timestamptz)
RETURNS TABLE (occurred_at timestamptz, event_id uuid, event_type text, actor_agent_id text,
               run_id uuid, memory_id uuid, payload jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_ref text;
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  SELECT k.subject_ref INTO v_ref FROM fabric.subject_keys k
  WHERE k.tenant_id = p_tenant_id AND k.subject_id = p_subject_id;
  RETURN QUERY
    SELECT e.occurred_at, e.event_id, e.event_type, e.actor_agent_id, e.run_id, e.memory_id,
           e.payload
    FROM fabric.events e
    WHERE e.tenant_id = p_tenant_id
      AND e.occurred_at >= p_from AND e.occurred_at < p_to
      AND ((v_ref IS NOT NULL AND e.payload #>> '{scope,subject_ref}' = v_ref)
           OR e.run_id IN (SELECT r.run_id FROM fabric.runs r
                           WHERE r.tenant_id = p_tenant_id AND r.subject_id = p_subject_id))
    ORDER BY e.occurred_at, e.event_id;
END $$;
COMMENT ON FUNCTION fabric_audit.subject_events(text, text, timestamptz, timestamptz) IS
  'A living data subject''s events in [p_from, p_to) (pseudonymous recall events and the '
  'events of its runs). Auditors only. Example: SELECT * FROM fabric_audit.subject_events('
  '''acme'', ''user-8842'', now() - interval ''1 day'', now());';
GRANT EXECUTE ON FUNCTION fabric_audit.subject_events(text, text, timestamptz, timestamptz)
  TO fabric_auditor;
