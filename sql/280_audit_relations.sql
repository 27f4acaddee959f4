-- fabric_audit relations: the audit trail as tables an auditor joins, filters and
-- aggregates in plain SQL (docs/audit.md is the cookbook). Each takes the tenant first,
-- reads one tenant by time window [p_from, p_to) or by record, and returns identifiers,
-- states and pseudonyms: never content (events and history hold none), and never a subject
-- id (events and approvals name a subject only by its keyed pseudonym).

-- ---------------------------------------------------------------------------------------
-- fabric._jsonb_text_array: a JSON array of strings as text[] ('{}' for anything else).
CREATE OR REPLACE FUNCTION fabric._jsonb_text_array(p_value jsonb)
RETURNS text[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE WHEN pg_catalog.jsonb_typeof(p_value) = 'array'
              THEN ARRAY(SELECT pg_catalog.jsonb_array_elements_text(p_value))
              ELSE '{}'::text[] END
$$;
COMMENT ON FUNCTION fabric._jsonb_text_array(jsonb) IS
  'A JSON array of strings as text[] (''{}'' for anything else). Internal. Example: '
  'SELECT fabric._jsonb_text_array(''["episodic", "semantic"]'');';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.events: every event of the tenant in the window, with its envelope, its
-- payload and its position in the sealed chain (NULL while not sealed yet).
CREATE OR REPLACE FUNCTION fabric_audit.events(p_tenant_id text, p_from timestamptz,
                                               p_to timestamptz)
RETURNS TABLE (event_id uuid, occurred_at timestamptz, event_type text, actor_agent_id text,
               actor_login name, run_id uuid, memory_id uuid, proposal_id uuid,
               correlation_id text, causation_id text, payload jsonb, chain_seq bigint,
               chain_link text, sealed_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT e.event_id, e.occurred_at, e.event_type, e.actor_agent_id, e.actor_login, e.run_id,
           e.memory_id, e.proposal_id, e.correlation_id, e.causation_id, e.payload,
           s.seq, s.link, s.sealed_at
    FROM fabric.events e
    LEFT JOIN fabric.event_seals s  -- a seal keeps its event's time: read the window of both
      ON s.event_id = e.event_id AND s.tenant_id = p_tenant_id
     AND s.occurred_at >= p_from AND s.occurred_at < p_to
    WHERE e.tenant_id = p_tenant_id AND e.occurred_at >= p_from AND e.occurred_at < p_to
    ORDER BY e.occurred_at, e.event_id;
END $$;
COMMENT ON FUNCTION fabric_audit.events(text, timestamptz, timestamptz) IS
  'Every event of a tenant in [p_from, p_to): envelope, payload (identifiers, never content) '
  'and sealed-chain position (chain_seq NULL while unsealed). Auditors only. Example: '
  'SELECT event_type, count(*) FROM fabric_audit.events(''acme'', ''2026-03-01'', '
  '''2026-04-01'') GROUP BY 1;';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.record_history: every version of a record's mutable columns with the
-- transaction time the fabric knew it, and the change that made it (the record events of
-- that transaction, and their actor). Content is not versioned and is never returned.
CREATE OR REPLACE FUNCTION fabric_audit.record_history(p_tenant_id text, p_memory_id uuid)
RETURNS TABLE (memory_id uuid, revision integer, tier text, consolidation_state text,
               valid_until timestamptz, known_from timestamptz, known_until timestamptz,
               action text, changed_by text, changed_by_login name, is_current boolean,
               source_event_id text, proposed_by text, formed_by text, formation_method text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    WITH versions AS (
      SELECT v.revision, v.tier, v.consolidation_state, v.valid_until,
             pg_catalog.lower(v.known_during) AS known_from,
             pg_catalog.upper(v.known_during) AS known_until, false AS is_current
      FROM fabric.memory_record_versions v
      WHERE v.tenant_id = p_tenant_id AND v.memory_id = p_memory_id
      UNION ALL
      SELECT m.revision, m.tier, m.consolidation_state, m.valid_until, m.known_since, NULL, true
      FROM fabric.memory_records m
      WHERE m.tenant_id = p_tenant_id AND m.memory_id = p_memory_id
    ),
    -- the record's events by transaction time, read on their own (on Citus the outbox is a
    -- table of the coordinator, which a distributed query joins only through a CTE)
    acts AS MATERIALIZED (
      SELECT e.occurred_at,
             pg_catalog.string_agg(pg_catalog.substr(e.event_type, 8),
                                   ', ' ORDER BY e.event_type) AS action,
             pg_catalog.min(e.actor_agent_id) AS actor, pg_catalog.min(e.actor_login::text)::name AS login
      FROM fabric.events e
      WHERE e.memory_id = p_memory_id AND e.tenant_id = p_tenant_id
        AND (e.event_type LIKE 'memory.record.%'
             OR e.event_type IN ('memory.reflection.completed', 'memory.skill.distilled'))
      GROUP BY e.occurred_at
    )
    SELECT p_memory_id, x.revision, x.tier, x.consolidation_state, x.valid_until, x.known_from,
           x.known_until, c.action,
           coalesce(c.actor, (SELECT v.ended_by FROM fabric.memory_record_versions v
                              WHERE v.tenant_id = p_tenant_id AND v.memory_id = p_memory_id
                                AND v.revision = x.revision - 1)::text),
           c.login, x.is_current, r.source_event_id::text,
           (SELECT p.proposed_by::text FROM fabric.proposals p
            WHERE p.tenant_id = p_tenant_id AND p.proposal_id = r.proposal_id),
           r.formed_by::text, r.formation_method
    FROM versions x
    JOIN fabric.memory_records r ON r.tenant_id = p_tenant_id AND r.memory_id = p_memory_id
    LEFT JOIN acts c ON c.occurred_at = x.known_from
    ORDER BY x.revision;
END $$;
COMMENT ON FUNCTION fabric_audit.record_history(text, uuid) IS
  'Every version of a record''s mutable columns (tier, state, valid_until) with the '
  'transaction time it was known, the action that made it (record.formed, record.promoted, '
  'record.superseded, ...) and its actor, beside the record''s provenance (source event, '
  'proposing agent, committing agent, formation method). Never content. Auditors only. Example: '
  'SELECT * FROM fabric_audit.record_history(''acme'', ''<memory_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.approvals: approvals requested in the window -- requested, decided (by
-- whom, decision, reason), used or expired. A data subject appears as its pseudonym.
CREATE OR REPLACE FUNCTION fabric_audit.approvals(p_tenant_id text, p_from timestamptz,
                                                  p_to timestamptz)
RETURNS TABLE (approval_id uuid, action text, memory_id uuid, subject_ref text, target jsonb,
               reason text, legal_erasure boolean, requested_by text, requested_at timestamptz,
               expires_at timestamptz, decision text, decided_by text, decided_at timestamptz,
               decision_reason text, used_at timestamptz, outcome text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT a.approval_id, a.action, a.memory_id, a.subject_ref, a.target, a.reason,
           a.legal_erasure, a.requested_by::text, a.requested_at, a.expires_at,
           CASE a.status WHEN 'pending' THEN NULL WHEN 'denied' THEN 'denied'
                ELSE 'approved' END,
           a.decided_by::text, a.decided_at, a.decision_reason, a.consumed_at,
           CASE WHEN a.status = 'consumed' THEN 'used'
                WHEN a.status = 'denied' THEN 'denied'
                WHEN a.expires_at <= pg_catalog.now() THEN 'expired'
                ELSE a.status END
    FROM fabric.approvals a
    WHERE a.tenant_id = p_tenant_id AND a.requested_at >= p_from AND a.requested_at < p_to
    ORDER BY a.requested_at, a.approval_id;
END $$;
COMMENT ON FUNCTION fabric_audit.approvals(text, timestamptz, timestamptz) IS
  'Approvals requested in [p_from, p_to): decision (approved/denied/NULL while pending), '
  'who decided and why, and the outcome (pending, approved, denied, used, expired). '
  'Auditors only. Example: SELECT * FROM fabric_audit.approvals(''acme'', ''2026-07-01'', '
  '''2026-10-01'') WHERE action = ''promote'';';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.erasures: every record erased in the window, with its approval, what the
-- erasure destroyed and the review flags it raised on derived records and how they stand.
DROP FUNCTION IF EXISTS fabric_audit.erasures(text, timestamptz, timestamptz);  -- one column more
CREATE OR REPLACE FUNCTION fabric_audit.erasures(p_tenant_id text, p_from timestamptz,
                                                 p_to timestamptz)
RETURNS TABLE (memory_id uuid, tier text, erased_at timestamptz, erased_by text,
               approval_id uuid, action text, subject_ref text, approval_reason text,
               legal_erasure boolean, requested_by text, decided_by text,
               decided_at timestamptz, content_hash text, content_destroyed boolean,
               destroyed jsonb, flags_raised integer, flags_open integer, flags_kept integer,
               flags_erasure_requested integer, flags_erased integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT r.memory_id, m.tier, r.erased_at, r.erased_by::text, r.approval_id, a.action,
           a.subject_ref, a.reason, a.legal_erasure, a.requested_by::text, a.decided_by::text,
           a.decided_at, m.content_hash,
           m.content IS NULL AND m.consolidation_state = 'tombstoned', r.destroyed,
           f.raised, f.open, f.kept, f.erasure, f.erased
    FROM fabric.erasure_receipts r
    JOIN fabric.approvals a ON a.tenant_id = r.tenant_id AND a.approval_id = r.approval_id
    JOIN fabric.memory_records m ON m.tenant_id = r.tenant_id AND m.memory_id = r.memory_id
    CROSS JOIN LATERAL (
      SELECT pg_catalog.count(*)::integer AS raised,
             (pg_catalog.count(*) FILTER (WHERE g.resolved_at IS NULL))::integer AS open,
             (pg_catalog.count(*) FILTER (WHERE g.resolution = 'keep'))::integer AS kept,
             (pg_catalog.count(*) FILTER (WHERE g.resolution = 'request_erasure'))::integer
               AS erasure,
             (pg_catalog.count(*) FILTER (WHERE g.resolution = 'erased'))::integer AS erased
      FROM fabric.review_flags g
      WHERE g.tenant_id = r.tenant_id AND g.tombstoned_source = r.memory_id) f
    WHERE r.tenant_id = p_tenant_id AND r.erased_at >= p_from AND r.erased_at < p_to
    ORDER BY r.erased_at, r.memory_id;
END $$;
COMMENT ON FUNCTION fabric_audit.erasures(text, timestamptz, timestamptz) IS
  'Records erased in [p_from, p_to): approval (subject as pseudonym), what was destroyed, '
  'the kept content hash, and the review flags raised on derived records (open, kept, '
  'erasure requested, closed by the derived record''s own erasure). Auditors only. Example: SELECT * FROM fabric_audit.erasures(''acme'', '
  'now() - interval ''30 days'', now()) WHERE flags_open > 0;';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.tool_denials: every refused tool call (three-layer authorization) in the
-- window: which agent, which tool, which layers were missing.
CREATE OR REPLACE FUNCTION fabric_audit.tool_denials(p_tenant_id text, p_from timestamptz,
                                                     p_to timestamptz)
RETURNS TABLE (event_id uuid, occurred_at timestamptz, agent_id text, actor_login name,
               run_id uuid, tool text, missing_layers text[], correlation_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT e.event_id, e.occurred_at, coalesce(e.payload ->> 'agent_id', e.actor_agent_id),
           e.actor_login, e.run_id, e.payload ->> 'tool',
           fabric._jsonb_text_array(e.payload -> 'missing_layers'), e.correlation_id
    FROM fabric.events e
    WHERE e.tenant_id = p_tenant_id AND e.event_type = 'agent.tool.unauthorized'
      AND e.occurred_at >= p_from AND e.occurred_at < p_to
    ORDER BY e.occurred_at, e.event_id;
END $$;
COMMENT ON FUNCTION fabric_audit.tool_denials(text, timestamptz, timestamptz) IS
  'Tool calls refused by three-layer authorization in [p_from, p_to): agent, tool, missing '
  'layers. Auditors only. Example: SELECT agent_id, tool, count(*) FROM '
  'fabric_audit.tool_denials(''acme'', now() - interval ''7 days'', now()) GROUP BY 1, 2;';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.recall_history: one row per recall (served, partial or denied) in the
-- window; recall_id is the recall event's id. The run's subject and session appear only
-- as pseudonyms (subject_ref, session_ref). With recalled_records it is the canonical,
-- relational form of the recall events; fabric_audit.recalls (sql/160_audit.sql) is its
-- view as jsonb documents (this relation's recalls, with each event's documents).
CREATE OR REPLACE FUNCTION fabric_audit.recall_history(p_tenant_id text, p_from timestamptz,
                                                       p_to timestamptz)
RETURNS TABLE (recall_id uuid, occurred_at timestamptz, status text, agent_id text,
               actor_login name, run_id uuid, correlation_id text, subject_ref text,
               session_ref text, tiers_requested text[], tiers_served text[],
               tiers_denied text[], returned integer, truncated boolean, reason text,
               request_hash text, duration_ms numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT e.event_id, e.occurred_at, e.payload ->> 'status',
           coalesce(e.payload ->> 'agent_id', e.actor_agent_id), e.actor_login, e.run_id,
           e.correlation_id, e.payload #>> '{scope,subject_ref}',
           e.payload #>> '{scope,session_ref}',
           fabric._jsonb_text_array(e.payload -> 'tiers_requested'),
           fabric._jsonb_text_array(e.payload -> 'tiers_served'),
           fabric._jsonb_text_array(e.payload -> 'tiers_denied'),
           CASE WHEN pg_catalog.jsonb_typeof(e.payload -> 'memory_ids') = 'array'
                THEN pg_catalog.jsonb_array_length(e.payload -> 'memory_ids') ELSE 0 END,
           coalesce((e.payload ->> 'truncated')::boolean, false), e.payload ->> 'reason',
           e.payload ->> 'request_hash', (e.payload ->> 'duration_ms')::numeric
    FROM fabric.events e
    WHERE e.tenant_id = p_tenant_id
      AND e.event_type IN ('memory.recall.served', 'memory.recall.denied')
      AND e.occurred_at >= p_from AND e.occurred_at < p_to
    ORDER BY e.occurred_at, e.event_id;
END $$;
COMMENT ON FUNCTION fabric_audit.recall_history(text, timestamptz, timestamptz) IS
  'One row per recall in [p_from, p_to) (recall_id = its event id): status, agent, run, '
  'pseudonymous scope, tiers, how many records it returned. Auditors only. Example: '
  'SELECT agent_id, status, count(*) FROM fabric_audit.recall_history(''acme'', '
  '''2026-03-01'', ''2026-04-01'') GROUP BY 1, 2;';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.recalled_records: one row per memory id a recall in the window returned,
-- in the order it was returned (rank from 1).
CREATE OR REPLACE FUNCTION fabric_audit.recalled_records(p_tenant_id text, p_from timestamptz,
                                                         p_to timestamptz)
RETURNS TABLE (recall_id uuid, occurred_at timestamptz, agent_id text, run_id uuid,
               rank integer, memory_id uuid)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._enter_audit(p_tenant_id);
  RETURN QUERY
    SELECT e.event_id, e.occurred_at, coalesce(e.payload ->> 'agent_id', e.actor_agent_id),
           e.run_id, r.n::integer, r.id::uuid
    FROM fabric.events e
    CROSS JOIN LATERAL pg_catalog.jsonb_array_elements_text(
      CASE WHEN pg_catalog.jsonb_typeof(e.payload -> 'memory_ids') = 'array'
           THEN e.payload -> 'memory_ids' ELSE '[]'::jsonb END) WITH ORDINALITY AS r(id, n)
    WHERE e.tenant_id = p_tenant_id AND e.event_type = 'memory.recall.served'
      AND e.occurred_at >= p_from AND e.occurred_at < p_to
    ORDER BY e.occurred_at, e.event_id, r.n;
END $$;
COMMENT ON FUNCTION fabric_audit.recalled_records(text, timestamptz, timestamptz) IS
  'One row per memory id returned by a recall in [p_from, p_to), with its rank; join '
  'recall_history on recall_id. Auditors only. Example: SELECT memory_id, count(*) FROM '
  'fabric_audit.recalled_records(''acme'', now() - interval ''1 day'', now()) GROUP BY 1;';
