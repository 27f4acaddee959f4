-- The sealed event chain: detection where prevention cannot reach (the migration role and
-- superusers can change any table). Every event of a tenant is linked into a hash chain,
-- in (xid, event_id) order and only below the snapshot xmin -- the projector's horizon, so
-- a slow writer is never skipped and sealing never makes writers wait. Each link covers the
-- event's envelope and the previous link; the auditor recomputes the chain.

-- ---------------------------------------------------------------------------------------
-- fabric._event_envelope: the sealed text of one event; every column, time in UTC, so it
-- does not depend on the session's TimeZone.
CREATE OR REPLACE FUNCTION fabric._event_envelope(p_event fabric.events)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.jsonb_build_object(
    'event_id', p_event.event_id, 'occurred_at', p_event.occurred_at AT TIME ZONE 'UTC',
    'tenant_id', p_event.tenant_id, 'event_type', p_event.event_type,
    'correlation_id', p_event.correlation_id, 'causation_id', p_event.causation_id,
    'actor_agent_id', p_event.actor_agent_id, 'actor_login', p_event.actor_login,
    'run_id', p_event.run_id, 'memory_id', p_event.memory_id, 'proposal_id', p_event.proposal_id,
    'payload', p_event.payload, 'xid', p_event.xid::text)::text
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._chain_link: sha256 over the previous link and an event's envelope (its text).
CREATE OR REPLACE FUNCTION fabric._chain_link(p_prev text, p_envelope text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
    coalesce(p_prev, '') || pg_catalog.chr(10) || p_envelope, 'UTF8')), 'hex');
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._event_link: the link of an event after the previous link.
CREATE OR REPLACE FUNCTION fabric._event_link(p_prev text, p_event fabric.events)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT fabric._chain_link(p_prev, fabric._event_envelope(p_event))
$$;

-- ---------------------------------------------------------------------------------------
-- The seals are append-only, like the events they seal.
CREATE OR REPLACE TRIGGER _200_append_only
  BEFORE UPDATE OR DELETE ON fabric.event_seals
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_events__append_only();

CREATE OR REPLACE TRIGGER _200_append_only_truncate
  BEFORE TRUNCATE ON fabric.event_seals
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__append_only();

-- ---------------------------------------------------------------------------------------
-- fabric._sealed_position: where sealing stands, derived from the append-only seals (there
-- is no cursor to move back or empty): the (xid, event_id) of the last sealed event of any
-- tenant. Every event at or below it was sealed, as passes seal in that order.
CREATE OR REPLACE FUNCTION fabric._sealed_position(OUT p_xid xid8, OUT p_event_id uuid)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT coalesce(l.xid, '0'::xid8),
         coalesce(l.event_id, '00000000-0000-0000-0000-000000000000'::uuid)
  FROM (SELECT) AS one
  LEFT JOIN LATERAL (SELECT s.xid, s.event_id FROM fabric.event_seals s
                     ORDER BY s.xid DESC, s.event_id DESC LIMIT 1) l ON true
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._chain_head: a tenant's head, its last seal: position (= the number of sealed
-- events, as positions run from 1 without gaps), the sealed event and its link.
CREATE OR REPLACE FUNCTION fabric._chain_head(p_tenant_id text)
RETURNS fabric.event_seals
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT s.* FROM fabric.event_seals s WHERE s.tenant_id = p_tenant_id
  ORDER BY s.seq DESC LIMIT 1
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.seal_events: extend every tenant's chain by the events below the horizon,
-- from where sealing stands (fabric._sealed_position). One sealer at a time (a transaction
-- advisory lock); others return at once. A pass reads its events with their envelopes in
-- one query, links them tenant by tenant (each head read once) and writes their seals in
-- one INSERT: the same links, the same chain.
CREATE OR REPLACE FUNCTION fabric_api.seal_events(p_limit integer DEFAULT 10000)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_from record;
  v_horizon xid8;
  v_tenants text[];
  v_ids uuid[];
  v_times timestamptz[];
  v_xids xid8[];
  v_envelopes text[];
  v_seqs bigint[] := '{}';
  v_links text[] := '{}';
  v_head fabric.event_seals;
  v_tenant text;
  v_seq bigint;
  v_link text;
  v_count integer;
  v_heads integer := 0;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_committer', 'seal events');
  IF NOT pg_catalog.pg_try_advisory_xact_lock(
           pg_catalog.hashtextextended('fabric_api.seal_events', 0)) THEN
    RETURN pg_catalog.jsonb_build_object('sealed', 0, 'busy', true);
  END IF;
  v_from := fabric._sealed_position();
  -- Every transaction below the horizon has ended: no event can appear there later.
  v_horizon := pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot());
  -- the pass: the next events in (xid, event_id) order, each tenant's in that order
  SELECT pg_catalog.array_agg(p.tenant_id ORDER BY p.tenant_id, p.xid, p.event_id),
         pg_catalog.array_agg(p.event_id ORDER BY p.tenant_id, p.xid, p.event_id),
         pg_catalog.array_agg(p.occurred_at ORDER BY p.tenant_id, p.xid, p.event_id),
         pg_catalog.array_agg(p.xid ORDER BY p.tenant_id, p.xid, p.event_id),
         pg_catalog.array_agg(fabric._event_envelope(p.e) ORDER BY p.tenant_id, p.xid, p.event_id)
    INTO v_tenants, v_ids, v_times, v_xids, v_envelopes
    FROM (SELECT e.tenant_id::text AS tenant_id, e.xid, e.event_id, e.occurred_at, e
          FROM fabric.events e
          WHERE (e.xid, e.event_id) > (v_from.p_xid, v_from.p_event_id)
            AND e.xid < v_horizon
          ORDER BY e.xid, e.event_id
          LIMIT greatest(1, least(coalesce(p_limit, 10000), 100000))) p;
  v_count := coalesce(pg_catalog.cardinality(v_ids), 0);
  FOR i IN 1 .. v_count LOOP
    IF v_tenant IS DISTINCT FROM v_tenants[i] THEN
      v_tenant := v_tenants[i];
      v_head := fabric._chain_head(v_tenant);
      v_seq := coalesce(v_head.seq, 0);
      v_link := v_head.link;
      v_heads := v_heads + 1;
    END IF;
    v_seq := v_seq + 1;
    v_link := fabric._chain_link(v_link, v_envelopes[i]);
    v_seqs[i] := v_seq;
    v_links[i] := v_link;
  END LOOP;
  IF v_count > 0 THEN
    INSERT INTO fabric.event_seals (tenant_id, seq, event_id, occurred_at, xid, link)
    SELECT s.tenant_id, s.seq, s.event_id, s.occurred_at, s.xid, s.link
    FROM ROWS FROM (pg_catalog.unnest(v_tenants), pg_catalog.unnest(v_seqs),
                    pg_catalog.unnest(v_ids), pg_catalog.unnest(v_times),
                    pg_catalog.unnest(v_xids), pg_catalog.unnest(v_links))
         AS s(tenant_id, seq, event_id, occurred_at, xid, link);
  END IF;
  RETURN pg_catalog.jsonb_build_object('sealed', v_count, 'tenants', v_heads, 'busy', false);
END $$;
COMMENT ON FUNCTION fabric_api.seal_events(integer) IS
  'Seal the events below the snapshot horizon into each tenant''s hash chain (asynchronous; '
  'one process owns sealing: the sealer memfabric serve runs beside the projector; the '
  'commit worker does not seal). Committer only. '
  'Example: SELECT fabric_api.seal_events(10000);';

-- ---------------------------------------------------------------------------------------
-- fabric_api.sealing_lag: how far sealing is behind, for the metrics and `memfabric check`:
-- the events after where sealing stands and the age of the oldest of them. An event is
-- alterable without detection until it is sealed, so a growing age is an alarm.
CREATE OR REPLACE FUNCTION fabric_api.sealing_lag()
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_from record;
  v_unsealed bigint;
  v_oldest timestamptz;
BEGIN
  PERFORM fabric._require_role('fabric_committer', 'read the sealing lag');
  v_from := fabric._sealed_position();
  SELECT pg_catalog.count(*), pg_catalog.min(e.occurred_at) INTO v_unsealed, v_oldest
  FROM fabric.events e WHERE (e.xid, e.event_id) > (v_from.p_xid, v_from.p_event_id);
  RETURN pg_catalog.jsonb_build_object('unsealed', v_unsealed,
    'oldest_unsealed_at', v_oldest,
    'oldest_unsealed_seconds', coalesce(pg_catalog.round(greatest(0, pg_catalog.extract('epoch',
      pg_catalog.clock_timestamp() - v_oldest)), 3), 0));
END $$;
COMMENT ON FUNCTION fabric_api.sealing_lag() IS
  'Events not sealed yet and the age of the oldest (seconds; 0 when none). Committer only. '
  'Example: SELECT fabric_api.sealing_lag();';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.chain_head: the head an auditor holds outside the database: the tenant's
-- last sealed event, its link and how many events are sealed. Given back to
-- verify_event_chain, it shows a chain cut short or rewritten behind it.
CREATE OR REPLACE FUNCTION fabric_audit.chain_head(p_tenant_id text)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_head fabric.event_seals;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_auditor', 'read the event chain''s head');
  PERFORM fabric._require_tenant(p_tenant_id);
  v_head := fabric._chain_head(p_tenant_id);
  RETURN pg_catalog.jsonb_build_object('tenant_id', p_tenant_id,
    'seq', coalesce(v_head.seq, 0), 'events', coalesce(v_head.seq, 0),
    'event_id', v_head.event_id, 'occurred_at', v_head.occurred_at, 'link', v_head.link,
    'sealed_at', v_head.sealed_at);
END $$;
COMMENT ON FUNCTION fabric_audit.chain_head(text) IS
  'A tenant''s sealed chain head to keep outside the database: the last sealed event, its '
  'link (hash) and the number of sealed events (seq). Auditors only. '
  'Example: SELECT fabric_audit.chain_head(''acme'');';

-- ---------------------------------------------------------------------------------------
-- fabric._verify_event_chain: recompute the chains; the first break names the tenant, the
-- link and what is wrong. NULL checks every tenant. With a head the auditor held
-- (chain_head), the tenant's chain must still reach it with the same link.
CREATE OR REPLACE FUNCTION fabric._verify_event_chain(p_tenant_id text, p_head jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_from record;
  v_tenant text;
  v_seal record;
  v_prev text;
  v_expect bigint;
  v_last fabric.event_seals;
  v_held_seq bigint;
  v_held_link text;
  v_checked bigint := 0;
  v_unsealed bigint := 0;
  v_break jsonb;
  v_inserted fabric.events;
  -- On a Citus cluster the seals are on the tenant's worker and the events on the
  -- coordinator: Citus cannot send a join of the two (nor a row of the coordinator's table)
  -- to a worker, so there the seals are read alone and each sealed event is looked up here.
  v_citus boolean := coalesce(
    pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local', false);
  v_seals refcursor;
  v_event fabric.events;
  v_tenant_seals bigint;
  v_sealed_ids uuid[];
BEGIN
  IF p_head IS NOT NULL THEN
    IF p_tenant_id IS NULL OR pg_catalog.jsonb_typeof(p_head) <> 'object'
       OR pg_catalog.jsonb_typeof(p_head -> 'seq') IS DISTINCT FROM 'number'
       OR (p_head ->> 'seq') !~ '^[0-9]{1,18}$'
       OR ((p_head ->> 'seq')::bigint > 0
           AND coalesce(p_head ->> 'link', '') !~ '^[0-9a-f]{64}$')
       OR coalesce(p_head ->> 'tenant_id', p_tenant_id) <> p_tenant_id THEN
      PERFORM fabric._raise_rule('invalid_parameter_value',
        'an expected head is a tenant''s head as fabric_audit.chain_head returned it',
        'pass the tenant and the head kept for it: {"tenant_id", "seq", "link", ...}');
    END IF;
    v_held_seq := (p_head ->> 'seq')::bigint;
  END IF;
  v_from := fabric._sealed_position();
  FOR v_tenant IN
    SELECT t.tenant_id FROM (SELECT s.tenant_id FROM fabric.event_seals s
                             UNION SELECT e.tenant_id FROM fabric.events e) t
    WHERE p_tenant_id IS NULL OR t.tenant_id = p_tenant_id
    ORDER BY t.tenant_id
  LOOP
    v_prev := NULL;
    v_expect := 1;
    v_held_link := NULL;
    v_tenant_seals := 0;
    IF v_citus THEN
      OPEN v_seals FOR
        SELECT s.seq, s.event_id, s.link, s.occurred_at
        FROM fabric.event_seals s
        WHERE s.tenant_id = v_tenant
        ORDER BY s.seq;
    ELSE
      OPEN v_seals FOR
        SELECT s.seq, s.event_id, s.link, s.occurred_at, e AS event
        FROM fabric.event_seals s
        LEFT JOIN fabric.events e ON e.event_id = s.event_id AND e.occurred_at = s.occurred_at
        WHERE s.tenant_id = v_tenant
        ORDER BY s.seq;
    END IF;
    LOOP
      FETCH v_seals INTO v_seal;
      EXIT WHEN NOT FOUND;
      IF v_citus THEN
        SELECT * INTO v_event FROM fabric.events e  -- all NULL when it is gone
        WHERE e.event_id = v_seal.event_id AND e.occurred_at = v_seal.occurred_at;
      ELSE
        v_event := v_seal.event;
      END IF;
      v_checked := v_checked + 1;
      v_tenant_seals := v_tenant_seals + 1;
      IF v_seal.seq = v_held_seq THEN
        v_held_link := v_seal.link;
      END IF;
      CONTINUE WHEN v_break IS NOT NULL;
      v_break := CASE
        WHEN v_seal.seq <> v_expect THEN pg_catalog.jsonb_build_object('seq', v_expect,
          'problem', 'a link of the chain is missing')
        WHEN v_event.event_id IS NULL THEN pg_catalog.jsonb_build_object('seq', v_seal.seq,
          'event_id', v_seal.event_id,
          'problem', 'a sealed event is missing (deleted, or its partition dropped or detached)')
        WHEN fabric._event_link(v_prev, v_event) <> v_seal.link THEN
          pg_catalog.jsonb_build_object('seq', v_seal.seq, 'event_id', v_seal.event_id,
            'problem', 'a sealed event was altered')
      END;
      v_prev := v_seal.link;
      v_expect := v_seal.seq + 1;
    END LOOP;
    CLOSE v_seals;
    -- What is gone from the end of a chain leaves nothing behind to recompute: only the
    -- head held outside shows it.
    IF v_break IS NULL AND v_held_seq > 0 THEN
      IF v_expect - 1 < v_held_seq THEN
        v_break := pg_catalog.jsonb_build_object('seq', v_held_seq,
          'event_id', p_head -> 'event_id', 'chain_seq', v_expect - 1,
          'problem', 'the chain ends before the head you hold: sealed events were removed '
                     'from its end (truncated)');
      ELSIF v_held_link <> (p_head ->> 'link') THEN
        v_break := pg_catalog.jsonb_build_object('seq', v_held_seq,
          'event_id', p_head -> 'event_id',
          'problem', 'the chain does not pass through the head you hold (rewritten)');
      END IF;
    END IF;
    IF v_break IS NULL AND NOT v_citus THEN
      SELECT * INTO v_inserted FROM fabric.events e
      WHERE e.tenant_id = v_tenant
        AND (e.xid, e.event_id) <= (v_from.p_xid, v_from.p_event_id)
        AND NOT EXISTS (SELECT 1 FROM fabric.event_seals s WHERE s.event_id = e.event_id)
      ORDER BY e.xid, e.event_id LIMIT 1;
    ELSIF v_break IS NULL
          AND (SELECT pg_catalog.count(*) FROM fabric.events e WHERE e.tenant_id = v_tenant
                 AND (e.xid, e.event_id) <= (v_from.p_xid, v_from.p_event_id)) > v_tenant_seals THEN
      -- more events below where sealing stands than seals: name the first one unsealed
      SELECT pg_catalog.array_agg(s.event_id) INTO v_sealed_ids
      FROM fabric.event_seals s WHERE s.tenant_id = v_tenant;
      SELECT * INTO v_inserted FROM fabric.events e
      WHERE e.tenant_id = v_tenant
        AND (e.xid, e.event_id) <= (v_from.p_xid, v_from.p_event_id)
        AND e.event_id <> ALL (coalesce(v_sealed_ids, '{}'))
      ORDER BY e.xid, e.event_id LIMIT 1;
    ELSE
      v_inserted := NULL;
    END IF;
    IF v_break IS NULL THEN
      IF v_inserted.event_id IS NOT NULL THEN
        v_break := pg_catalog.jsonb_build_object('event_id', v_inserted.event_id,
          'problem', 'an event was inserted among sealed events');
      END IF;
    END IF;
    IF v_break IS NOT NULL AND NOT v_break ? 'tenant_id' THEN
      v_break := pg_catalog.jsonb_build_object('tenant_id', v_tenant) || v_break;
    END IF;
    v_last := fabric._chain_head(v_tenant);
    v_unsealed := v_unsealed + (SELECT pg_catalog.count(*) FROM fabric.events e
      WHERE e.tenant_id = v_tenant
        AND (v_last.seq IS NULL
             OR (e.xid, e.event_id) > (v_last.xid, v_last.event_id)));
  END LOOP;
  IF p_head IS NOT NULL AND v_held_seq > 0 AND v_break IS NULL
     AND NOT EXISTS (SELECT 1 FROM fabric.event_seals s WHERE s.tenant_id = p_tenant_id) THEN
    v_break := pg_catalog.jsonb_build_object('tenant_id', p_tenant_id, 'seq', v_held_seq,
      'event_id', p_head -> 'event_id', 'chain_seq', 0,
      'problem', 'the chain ends before the head you hold: sealed events were removed '
                 'from its end (truncated)');
  END IF;
  RETURN pg_catalog.jsonb_build_object('ok', v_break IS NULL, 'events', v_checked,
    'unsealed', v_unsealed, 'first_break', v_break);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_audit.verify_event_chain: the check an auditor runs, of one tenant or all.
CREATE OR REPLACE FUNCTION fabric_audit.verify_event_chain(p_tenant_id text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_auditor', 'verify the event chain');
  IF p_tenant_id IS NOT NULL THEN
    PERFORM fabric._require_tenant(p_tenant_id);
  END IF;
  RETURN fabric._verify_event_chain(p_tenant_id, NULL);
END $$;
COMMENT ON FUNCTION fabric_audit.verify_event_chain(text) IS
  'Recompute the sealed event chain of one tenant (or all): ok, events checked, events not '
  'yet sealed, and the first break (deleted, altered or inserted event, dropped partition). '
  'Auditors only. Example: SELECT fabric_audit.verify_event_chain(''acme'');';

-- ---------------------------------------------------------------------------------------
-- fabric_audit.verify_event_chain(tenant, head): the same, and the chain must still reach
-- the head the auditor kept (fabric_audit.chain_head) with the same link: a chain cut
-- short behind it, or rewritten, is reported.
CREATE OR REPLACE FUNCTION fabric_audit.verify_event_chain(p_tenant_id text,
                                                           p_expected_head jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_auditor', 'verify the event chain');
  PERFORM fabric._require_tenant(p_tenant_id);
  RETURN fabric._verify_event_chain(p_tenant_id, coalesce(p_expected_head, 'null'::jsonb));
END $$;
COMMENT ON FUNCTION fabric_audit.verify_event_chain(text, jsonb) IS
  'Verify a tenant''s chain against the head kept from fabric_audit.chain_head: also reports '
  'a chain truncated or rewritten behind that head. Auditors only. Example: SELECT '
  'fabric_audit.verify_event_chain(''acme'', ''{"seq": 42, "link": "…"}''::jsonb);';

GRANT EXECUTE ON FUNCTION fabric_api.seal_events(integer) TO fabric_committer;
GRANT EXECUTE ON FUNCTION fabric_audit.verify_event_chain(text) TO fabric_auditor;
GRANT EXECUTE ON FUNCTION fabric_audit.verify_event_chain(text, jsonb) TO fabric_auditor;
GRANT EXECUTE ON FUNCTION fabric_audit.chain_head(text) TO fabric_auditor;
GRANT EXECUTE ON FUNCTION fabric_api.sealing_lag() TO fabric_committer;
