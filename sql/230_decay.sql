-- Decay (R-RET-1): scheduled, never opportunistic. Interval expiry, operational window
-- closure (summarised into the temporal tier first), erasure requests for regulated records
-- at their ceiling. Idempotent, bounded batches, tenant by tenant, safe to run concurrently.

-- ---------------------------------------------------------------------------------------
-- fabric._regulated_limits: a record's regulated floor and ceiling (its jurisdiction is
-- the compliance label 'jurisdiction:<name>', else 'default').
CREATE OR REPLACE FUNCTION fabric._regulated_limits(p_record fabric.memory_records)
RETURNS TABLE (floor interval, ceiling interval)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT (r ->> 'floor')::interval, (r ->> 'ceiling')::interval
  FROM fabric._instance_config(p_record.tenant_id, p_record.business_instance_id) c,
       LATERAL (SELECT coalesce(
         (SELECT c.regulated_retention -> pg_catalog.substring(l, 14)
          FROM pg_catalog.unnest(p_record.compliance_labels) l
          WHERE l LIKE 'jurisdiction:%' AND c.regulated_retention ? pg_catalog.substring(l, 14) LIMIT 1),
         c.regulated_retention -> 'default') AS r) j
$$;

-- ---------------------------------------------------------------------------------------
-- fabric._tenants_with_records: the decay iterates tenants (content-free lookup).
SET LOCAL ROLE fabric_lookup;
CREATE OR REPLACE FUNCTION fabric._tenants_with_records()
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT t.tenant_id FROM fabric.tenants t ORDER BY t.tenant_id $$;
REVOKE ALL ON FUNCTION fabric._tenants_with_records() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._tenants_with_records() TO fabric_owner;
SET LOCAL ROLE fabric_owner;
GRANT SELECT (tenant_id) ON fabric.tenants TO fabric_lookup;

-- ---------------------------------------------------------------------------------------
-- fabric_api.run_decay: one bounded pass of decay at p_now; returns what it did.
CREATE OR REPLACE FUNCTION fabric_api.run_decay(p_now timestamptz DEFAULT now(),
                                                p_batch integer DEFAULT 1000)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text;
  v_expired integer := 0;
  v_closed integer := 0;
  v_requests integer := 0;
  v_threads integer := 0;
  v_n integer;
  v_rec fabric.memory_records;
  v_ceiling interval;
  v_due uuid[];
  v_close record;
  v_instance text;
  v_window interval;
BEGIN
  -- -infinity would pass "not in the future" and decay nothing, silently: refused too
  IF p_now IS NULL OR NOT pg_catalog.isfinite(p_now)
     OR p_now > pg_catalog.now() + interval '1 minute' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'decay runs at a finite time that is not in the future',
      'decay is scheduled, never ahead of time; omit p_now to run it now');
  END IF;
  IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 100000 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'batch must be between 1 and 100000',
      'the default is 1000');
  END IF;
  FOR v_tenant IN SELECT t FROM fabric._tenants_with_records() t LOOP
    PERFORM fabric._reset_context();
    CONTINUE WHEN NOT fabric._committer_enabled_in(v_tenant, v_committer, false);
    PERFORM fabric._set_context('actor', v_committer);

    -- 1. Operational window closure: summarise, then remove content, set valid_until, expire.
    IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
      -- Citus: the same steps as the statement below, one statement each (Citus pushes no
      -- UPDATE down whose CASE calls a function that is not immutable), the new valid_until
      -- computed first and written row by row. Each instance's window is read first, by a
      -- statement of its own: the read of the due records runs on the tenant's shard,
      -- where a helper may not read another table (fabric._instance_config); the batch is
      -- filled instance by instance, oldest first within each.
      v_due := '{}';
      FOR v_instance IN
        SELECT DISTINCT m.business_instance_id FROM fabric.memory_records m
        WHERE m.tenant_id = v_tenant AND m.retention_class = 'operational'
          AND m.content IS NOT NULL
          AND m.consolidation_state IN ('raw', 'consolidated', 'reflected', 'expired')
      LOOP
        EXIT WHEN pg_catalog.cardinality(v_due) >= p_batch;
        v_window := (fabric._instance_config(v_tenant, v_instance)).operational_window;
        v_due := v_due || ARRAY(
          SELECT m.memory_id FROM fabric.memory_records m
          WHERE m.tenant_id = v_tenant AND m.retention_class = 'operational'
            AND m.content IS NOT NULL
            AND m.consolidation_state IN ('raw', 'consolidated', 'reflected', 'expired')
            AND m.business_instance_id IS NOT DISTINCT FROM v_instance
            AND m.recorded_at + v_window <= p_now
          ORDER BY m.recorded_at, m.memory_id LIMIT p_batch - pg_catalog.cardinality(v_due)
          FOR UPDATE SKIP LOCKED);
      END LOOP;
      INSERT INTO fabric.temporal_summaries (tenant_id, day, tier, subject_id, retention_class, records)
      SELECT m.tenant_id, (m.valid_from AT TIME ZONE 'UTC')::date, m.tier, m.subject_id,
             m.retention_class, pg_catalog.count(*)
      FROM fabric.memory_records m
      WHERE m.tenant_id = v_tenant AND m.memory_id = ANY (v_due)
      GROUP BY 1, 2, 3, 4, 5;
      FOR v_close IN
        SELECT m.memory_id,
               CASE WHEN m.valid_until IS NULL OR m.valid_until > p_now
                    THEN greatest(p_now, m.valid_from + interval '1 microsecond')
                    ELSE m.valid_until END AS valid_until
        FROM fabric.memory_records m
        WHERE m.tenant_id = v_tenant AND m.memory_id = ANY (v_due)
      LOOP
        UPDATE fabric.memory_records m
        SET content = NULL, consolidation_state = 'expired', valid_until = v_close.valid_until
        WHERE m.tenant_id = v_tenant AND m.memory_id = v_close.memory_id;
        v_closed := v_closed + 1;
      END LOOP;
    ELSE
      WITH due AS (
        SELECT m.memory_id FROM fabric.memory_records m
        WHERE m.tenant_id = v_tenant AND m.retention_class = 'operational'
          AND m.content IS NOT NULL AND m.consolidation_state IN ('raw', 'consolidated', 'reflected', 'expired')
          AND m.recorded_at + (fabric._instance_config(v_tenant, m.business_instance_id)).operational_window <= p_now
        ORDER BY m.recorded_at, m.memory_id LIMIT p_batch
        FOR UPDATE SKIP LOCKED
      ), summary AS (
        INSERT INTO fabric.temporal_summaries (tenant_id, day, tier, subject_id, retention_class, records)
        SELECT m.tenant_id, (m.valid_from AT TIME ZONE 'UTC')::date, m.tier, m.subject_id,
               m.retention_class, pg_catalog.count(*)
        FROM fabric.memory_records m JOIN due USING (memory_id)
        WHERE m.tenant_id = v_tenant
        GROUP BY 1, 2, 3, 4, 5
      )
      UPDATE fabric.memory_records m
      SET content = NULL, consolidation_state = 'expired',
          valid_until = CASE WHEN m.valid_until IS NULL OR m.valid_until > p_now
                             THEN greatest(p_now, m.valid_from + interval '1 microsecond')
                             ELSE m.valid_until END
      FROM due WHERE m.tenant_id = v_tenant AND m.memory_id = due.memory_id;
      GET DIAGNOSTICS v_n = ROW_COUNT;
      v_closed := v_closed + v_n;
    END IF;

    -- 2. Interval expiry: valid_until has passed (end exclusive: at valid_until it is over).
    --    Audit records never decay.
    WITH due AS (
      SELECT m.memory_id FROM fabric.memory_records m
      WHERE m.tenant_id = v_tenant AND m.consolidation_state IN ('raw', 'consolidated', 'reflected')
        AND m.retention_class <> 'audit' AND m.valid_until <= p_now
      ORDER BY m.valid_until, m.memory_id LIMIT p_batch
      FOR UPDATE SKIP LOCKED
    )
    UPDATE fabric.memory_records m SET consolidation_state = 'expired'
    FROM due WHERE m.tenant_id = v_tenant AND m.memory_id = due.memory_id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_expired := v_expired + v_n;
    IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
      PERFORM fabric._flush_shard_events(v_tenant);  -- Citus: the shard triggers' events
    END IF;

    -- 3. Regulated records at their ceiling: an erasure request for approval, never silent.
    FOR v_rec IN
      SELECT * FROM fabric.memory_records m
      WHERE m.tenant_id = v_tenant AND m.retention_class = 'regulated'
        AND m.consolidation_state <> 'tombstoned'
        AND NOT EXISTS (SELECT 1 FROM fabric.approvals a
                        WHERE a.tenant_id = v_tenant AND a.memory_id = m.memory_id
                          AND a.action = 'erase' AND a.status IN ('pending', 'approved')
                          AND a.expires_at > p_now)
      ORDER BY m.recorded_at, m.memory_id LIMIT p_batch
      FOR UPDATE SKIP LOCKED
    LOOP
      SELECT l.ceiling INTO v_ceiling FROM fabric._regulated_limits(v_rec) l;
      CONTINUE WHEN v_ceiling IS NULL OR v_rec.recorded_at + v_ceiling > p_now;
      PERFORM fabric._file_approval(v_tenant, 'erase', v_rec.memory_id, NULL, '{}',
        'regulated retention ceiling reached');
      v_requests := v_requests + 1;
    END LOOP;

    -- 4. LangGraph checkpoint threads idle beyond the instance's checkpoint_retention.
    v_threads := v_threads + fabric._expire_checkpoints(v_tenant, p_now, p_batch);
  END LOOP;
  PERFORM fabric._reset_context();
  RETURN pg_catalog.jsonb_build_object('expired', v_expired, 'windows_closed', v_closed,
                                       'erasure_requests', v_requests,
                                       'checkpoint_threads_deleted', v_threads, 'at', p_now);
END $$;
COMMENT ON FUNCTION fabric_api.run_decay(timestamptz, integer) IS
  'Run one bounded decay pass at p_now (idempotent, concurrent-safe). Committer only. '
  'Example: SELECT fabric_api.run_decay();';
