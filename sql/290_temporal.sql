-- The temporal tier: time-series measurements (fabric.measurements) that intelligence agents
-- consume, aggregated by window. Producers write through record_measurements, decay's
-- window-closure summaries are read as one more producer's series, agents read through
-- read_measurements (tool:temporal-read, audited), and run_temporal_retention removes what a
-- point's retention class no longer keeps. fabric._temporal_points is the one read of the
-- storage: a time-series engine (TimescaleDB, QuestDB) replaces the table behind it.

-- ---------------------------------------------------------------------------------------
-- fabric._temporal_points: the points of one series of a tenant in [p_from, p_until), of
-- the tenant (subject NULL) or of p_subject_id, of one business instance (NULL = the
-- default). Decay's summaries are the series memory.<tier>.window_closed (records whose
-- operational window closed, per day).
CREATE OR REPLACE FUNCTION fabric._temporal_points(p_tenant_id text, p_series text,
  p_from timestamptz, p_until timestamptz, p_subject_id text, p_instance text)
RETURNS TABLE (at timestamptz, value double precision)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
  -- plpgsql: Citus plans no statement of an SQL function with parameters
  RETURN QUERY
  SELECT m.at, m.value FROM fabric.measurements m
   WHERE m.tenant_id = p_tenant_id AND m.series = p_series
     AND m.at >= p_from AND m.at < p_until
     AND (m.subject_id IS NULL OR m.subject_id = p_subject_id)
     AND m.business_instance_id IS NOT DISTINCT FROM p_instance
  UNION ALL
  SELECT (s.day::timestamp AT TIME ZONE 'UTC'), s.records::double precision
    FROM fabric.temporal_summaries s
   WHERE p_instance IS NULL
     AND p_series = 'memory.' || s.tier || '.window_closed'
     AND s.tenant_id = p_tenant_id
     AND s.day >= (p_from AT TIME ZONE 'UTC')::date - 1
     AND (s.day::timestamp AT TIME ZONE 'UTC') >= p_from
     AND (s.day::timestamp AT TIME ZONE 'UTC') < p_until
     AND (s.subject_id IS NULL OR s.subject_id = p_subject_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.record_measurements: a producer (a domain workflow login: fabric_workflow,
-- enabled in the tenant) writes points of the tenant's series. All or nothing: one bad
-- point refuses the call (22023, or the table's named constraint, 23514) and writes nothing.
CREATE OR REPLACE FUNCTION fabric_api.record_measurements(p_tenant_id text, p_points jsonb)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_producer text := fabric._enter_as('fabric_workflow', 'record measurements',
                                      'wf-billing-001');
  v_bad text;
  v_n integer;
  v_point jsonb;
BEGIN
  IF p_tenant_id IS NULL OR pg_catalog.jsonb_typeof(p_points) IS DISTINCT FROM 'array'
     OR pg_catalog.jsonb_array_length(p_points) NOT BETWEEN 1 AND 10000 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'measurements are a tenant and an array of 1 to 10000 points',
      'e.g. fabric_api.record_measurements(''acme'', ''[{"series": "trading.fill_latency_ms", '
      '"at": "2026-08-16T10:00:00Z", "value": 12.5}]'')');
  END IF;
  SELECT pg_catalog.format('point %s: %s', p.n - 1, CASE
           WHEN pg_catalog.jsonb_typeof(p.v) <> 'object' THEN 'a point is an object'
           WHEN EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p.v) k
                        WHERE k NOT IN ('series', 'at', 'value', 'subject_id',
                                        'business_instance_id', 'retention_class'))
             THEN 'keys are series, at, value, subject_id, business_instance_id, retention_class'
           WHEN pg_catalog.jsonb_typeof(p.v -> 'series') IS DISTINCT FROM 'string'
             THEN 'series must be a string'
           WHEN pg_catalog.jsonb_typeof(p.v -> 'value') IS DISTINCT FROM 'number'
             THEN 'value must be a number'
           WHEN pg_catalog.jsonb_typeof(p.v -> 'at') IS DISTINCT FROM 'string'
             OR (p.v ->> 'at') !~ '^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d{1,6})?)?(Z|[+-]\d\d:\d\d)$'
             THEN 'at must be an RFC 3339 timestamp with its offset'
           WHEN p.v ? 'subject_id' AND pg_catalog.jsonb_typeof(p.v -> 'subject_id') NOT IN ('string', 'null')
             THEN 'subject_id must be a string'
           WHEN p.v ? 'business_instance_id'
                AND pg_catalog.jsonb_typeof(p.v -> 'business_instance_id') NOT IN ('string', 'null')
             THEN 'business_instance_id must be a string'
           WHEN p.v ? 'retention_class' AND pg_catalog.jsonb_typeof(p.v -> 'retention_class') <> 'string'
             THEN 'retention_class must be a string' END)
    INTO v_bad
    FROM pg_catalog.jsonb_array_elements(p_points) WITH ORDINALITY AS p(v, n)
   WHERE pg_catalog.jsonb_typeof(p.v) <> 'object'
      OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(
                   CASE WHEN pg_catalog.jsonb_typeof(p.v) = 'object' THEN p.v ELSE '{}' END) k
                 WHERE k NOT IN ('series', 'at', 'value', 'subject_id', 'business_instance_id',
                                 'retention_class'))
      OR pg_catalog.jsonb_typeof(p.v -> 'series') IS DISTINCT FROM 'string'
      OR pg_catalog.jsonb_typeof(p.v -> 'value') IS DISTINCT FROM 'number'
      OR pg_catalog.jsonb_typeof(p.v -> 'at') IS DISTINCT FROM 'string'
      OR (p.v ->> 'at') !~ '^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d{1,6})?)?(Z|[+-]\d\d:\d\d)$'
      OR (p.v ? 'subject_id' AND pg_catalog.jsonb_typeof(p.v -> 'subject_id') NOT IN ('string', 'null'))
      OR (p.v ? 'business_instance_id'
          AND pg_catalog.jsonb_typeof(p.v -> 'business_instance_id') NOT IN ('string', 'null'))
      OR (p.v ? 'retention_class' AND pg_catalog.jsonb_typeof(p.v -> 'retention_class') <> 'string')
   ORDER BY p.n LIMIT 1;
  IF v_bad IS NOT NULL THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', v_bad,
      'a point is {"series": "<dotted.name>", "at": "<RFC 3339>", "value": <number>}');
  END IF;
  PERFORM fabric._require_tenant(p_tenant_id);
  PERFORM fabric._set_context('tenant_id', p_tenant_id);
  IF NOT EXISTS (SELECT 1 FROM fabric.tenant_agents e
                 WHERE e.tenant_id = p_tenant_id AND e.agent_id = v_producer) THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the producer is not enabled in this tenant',
      'an admin enables its agent with fabric_api.enable_agent');
  END IF;
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
    -- Citus runs an INSERT ... SELECT from a function's rows as a COPY into the shard, which
    -- row-level security refuses: one INSERT ... VALUES per point there.
    v_n := 0;
    FOR v_point IN SELECT p.v FROM pg_catalog.jsonb_array_elements(p_points) p(v) LOOP
      INSERT INTO fabric.measurements (tenant_id, series, at, value, business_instance_id,
                                       subject_id, retention_class, producer)
      VALUES (p_tenant_id, v_point ->> 'series', (v_point ->> 'at')::timestamptz,
              (v_point ->> 'value')::double precision, v_point ->> 'business_instance_id',
              v_point ->> 'subject_id', coalesce(v_point ->> 'retention_class', 'operational'),
              v_producer);
      v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
  END IF;
  INSERT INTO fabric.measurements (tenant_id, series, at, value, business_instance_id,
                                   subject_id, retention_class, producer)
  SELECT p_tenant_id, p.v ->> 'series', (p.v ->> 'at')::timestamptz,
         (p.v ->> 'value')::double precision, p.v ->> 'business_instance_id',
         p.v ->> 'subject_id', coalesce(p.v ->> 'retention_class', 'operational'), v_producer
    FROM pg_catalog.jsonb_array_elements(p_points) p(v);
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION fabric_api.record_measurements(text, jsonb) IS
  'Write time-series points of a tenant (the temporal tier); all or nothing. Producers only '
  '(fabric_workflow, enabled in the tenant). Example: SELECT fabric_api.record_measurements(''acme'', '
  '''[{"series": "trading.fill_latency_ms", "at": "2026-08-16T10:00:00Z", "value": 12.5}]'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.read_measurements: an agent, inside its open run and authorized for
-- tool:temporal-read in all three layers, reads one series of the run's tenant (tenant-level
-- points and the run's subject's, never another subject's) aggregated by window. Every read
-- leaves one memory.temporal.read event (identifiers, never values); a denial leaves
-- agent.tool.unauthorized and reads nothing.
CREATE OR REPLACE FUNCTION fabric_api.read_measurements(p_request jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_checked text;
  v_run fabric.runs;
  v_missing text[];
  v_from timestamptz;
  v_until timestamptz;
  v_window interval;
  v_agg text := coalesce(p_request ->> 'aggregate', 'avg');
  v_instance text := p_request ->> 'business_instance_id';
  v_points jsonb;
  v_n integer;
BEGIN
  v_checked := fabric._reset_context();
  IF pg_catalog.jsonb_typeof(p_request) IS DISTINCT FROM 'object'
     OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_request) k
                WHERE k NOT IN ('run_id', 'series', 'from', 'until', 'window', 'aggregate',
                                'business_instance_id', 'correlation_id'))
     OR pg_catalog.jsonb_typeof(p_request -> 'run_id') IS DISTINCT FROM 'string'
     OR (p_request ->> 'run_id') !~* '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$'
     OR pg_catalog.jsonb_typeof(p_request -> 'series') IS DISTINCT FROM 'string'
     OR pg_catalog.jsonb_typeof(p_request -> 'window') IS DISTINCT FROM 'string'
     OR (p_request ->> 'window') !~ '^[1-9][0-9]{0,5} (second|minute|hour|day)s?$'
     OR (p_request ? 'business_instance_id'
         AND pg_catalog.jsonb_typeof(p_request -> 'business_instance_id') NOT IN ('string', 'null'))
     OR v_agg NOT IN ('avg', 'min', 'max', 'sum', 'count', 'first', 'last') THEN
    PERFORM fabric._bad_envelope(
      'a measurement read is {run_id, series, from, until, window, aggregate?, '
      'business_instance_id?}: window like "5 minutes" (seconds to days), aggregate one of '
      'avg, min, max, sum, count, first, last',
      'example: {"run_id": "<run_id>", "series": "trading.fill_latency_ms", "from": '
      '"2026-08-16T00:00:00Z", "until": "2026-08-17T00:00:00Z", "window": "1 hour"}');
  END IF;
  IF p_request ? 'correlation_id' THEN
    v_checked := fabric._envelope_text(p_request -> 'correlation_id', 'correlation_id');
  END IF;
  v_from := fabric._envelope_timestamp(p_request -> 'from', 'from');
  v_until := fabric._envelope_timestamp(p_request -> 'until', 'until');
  v_window := (p_request ->> 'window')::interval;
  IF v_until <= v_from
     OR EXTRACT(epoch FROM v_until - v_from) / EXTRACT(epoch FROM v_window) > 10000 THEN
    PERFORM fabric._bad_envelope('until must be after from, with at most 10000 windows between',
                                 'narrow the range or widen the window');
  END IF;

  v_run := fabric._enter_run((p_request ->> 'run_id')::uuid);
  v_missing := fabric._tool_denial(v_run, 'tool:temporal-read');
  IF pg_catalog.cardinality(v_missing) > 0 THEN
    PERFORM fabric._emit('agent.tool.unauthorized', v_run.tenant_id, p_payload =>
      pg_catalog.jsonb_build_object('tool', 'tool:temporal-read', 'agent_id', v_run.agent_id,
                                    'missing_layers', v_missing));
    RETURN pg_catalog.jsonb_build_object('status', 'denied', 'points', '[]'::jsonb,
      'reason', 'tool:temporal-read is not authorized: missing from '
                || pg_catalog.array_to_string(v_missing, ', '));
  END IF;

  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
           'window_start', b.bucket, 'value', b.value, 'samples', b.samples) ORDER BY b.bucket),
           '[]'), pg_catalog.count(*)
    INTO v_points, v_n
    FROM (SELECT pg_catalog.date_bin(v_window, p.at, v_from) AS bucket,
                 CASE v_agg
                   WHEN 'avg' THEN pg_catalog.avg(p.value)
                   WHEN 'min' THEN pg_catalog.min(p.value)
                   WHEN 'max' THEN pg_catalog.max(p.value)
                   WHEN 'sum' THEN pg_catalog.sum(p.value)
                   WHEN 'count' THEN pg_catalog.count(*)::double precision
                   WHEN 'first' THEN (pg_catalog.array_agg(p.value ORDER BY p.at, p.value))[1]
                   ELSE (pg_catalog.array_agg(p.value ORDER BY p.at DESC, p.value DESC))[1]
                 END AS value,
                 pg_catalog.count(*) AS samples
            FROM fabric._temporal_points(v_run.tenant_id, p_request ->> 'series', v_from,
                                         v_until, v_run.subject_id, v_instance) p
           GROUP BY 1) b;

  PERFORM fabric._emit('memory.temporal.read', v_run.tenant_id,
    CASE WHEN pg_catalog.jsonb_typeof(p_request -> 'correlation_id') = 'string'
         THEN p_request ->> 'correlation_id' END,
    p_payload => pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
      'agent_id', v_run.agent_id, 'series', p_request ->> 'series',
      'from', v_from, 'until', v_until, 'window', p_request ->> 'window', 'aggregate', v_agg,
      'business_instance_id', v_instance, 'windows_served', v_n)));
  RETURN pg_catalog.jsonb_build_object('status', 'served', 'series', p_request ->> 'series',
    'window', p_request ->> 'window', 'aggregate', v_agg, 'points', v_points);
END $$;
COMMENT ON FUNCTION fabric_api.read_measurements(jsonb) IS
  'Read one time series of your run''s tenant and subject, aggregated by window (tool:temporal-read, '
  'audited). Example: SELECT fabric_api.read_measurements(''{"run_id": "<run_id>", "series": '
  '"trading.fill_latency_ms", "from": "2026-08-16T00:00:00Z", "until": "2026-08-17T00:00:00Z", '
  '"window": "1 hour", "aggregate": "avg"}'');';

-- ---------------------------------------------------------------------------------------
-- fabric._measurement_partition: the month's partition of fabric.measurements
-- (measurements_YYYY_MM, the month in UTC), made if missing. Points of that month that fell
-- into the default partition move into it (a partition cannot be made over rows the default
-- holds), so the default stays empty once maintenance has run. The caller holds the
-- partitioning lock and has marked the transaction (fabric.ensure_measurement_partitions).
CREATE OR REPLACE FUNCTION fabric._measurement_partition(p_month date)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_name text := 'measurements_' || pg_catalog.to_char(p_month, 'YYYY_MM');
  v_from timestamptz := p_month::timestamp AT TIME ZONE 'UTC';
  v_until timestamptz := (p_month + interval '1 month')::timestamp AT TIME ZONE 'UTC';
  v_rows jsonb;
BEGIN
  IF pg_catalog.to_regclass('fabric.' || v_name) IS NOT NULL THEN
    RETURN 0;
  END IF;
  -- The partition itself has no row level security: the move sees every tenant's points.
  SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(d)) INTO v_rows
    FROM fabric.measurements_default d WHERE d.at >= v_from AND d.at < v_until;
  IF v_rows IS NOT NULL THEN
    DELETE FROM fabric.measurements_default d WHERE d.at >= v_from AND d.at < v_until;
  END IF;
  EXECUTE pg_catalog.format(
    'CREATE TABLE fabric.%I PARTITION OF fabric.measurements FOR VALUES FROM (%L) TO (%L)',
    v_name, v_from, v_until);
  -- what the maintenance login holds on the table it holds on each partition (VACUUM)
  EXECUTE pg_catalog.format('GRANT MAINTAIN ON fabric.%I TO fabric_maintainer', v_name);
  IF v_rows IS NOT NULL THEN
    EXECUTE pg_catalog.format(
      'INSERT INTO fabric.%I SELECT * FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.%I, $1)',
      v_name, v_name) USING v_rows;
  END IF;
  RETURN 1;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.ensure_measurement_partitions: monthly partitions of fabric.measurements for the
-- month of p_now and p_months_ahead after it, and for every month whose points sit in the
-- default partition (a backfill, a point far ahead), which move into it. Called by migrate
-- and by fabric_api.run_temporal_retention (the decay worker's pass): inside that API
-- function the DDL guard lets this one command through, a CREATE TABLE of a measurements
-- partition by the owner in a transaction this function marked. Answers how many it made.
CREATE OR REPLACE FUNCTION fabric.ensure_measurement_partitions(p_now timestamptz DEFAULT now(),
                                                              p_months_ahead integer DEFAULT 3)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_this date := pg_catalog.date_trunc('month', p_now AT TIME ZONE 'UTC')::date;
  v_month date;
  v_created integer := 0;
BEGIN
  IF p_now IS NULL OR NOT pg_catalog.isfinite(p_now) OR p_months_ahead IS NULL
     OR p_months_ahead NOT BETWEEN 0 AND 24 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'partitions are made from a finite time for 0 to 24 months ahead',
      'e.g. fabric.ensure_measurement_partitions(now(), 3)');
  END IF;
  -- One maker at a time (the lock conflicts with itself); writers of the default partition
  -- wait for the move (they are rare: a point outside every partition).
  LOCK TABLE fabric.measurements_default IN SHARE ROW EXCLUSIVE MODE;
  PERFORM pg_catalog.set_config('fabric.partition_maintenance', 'measurements', true);
  FOR v_month IN
    SELECT (v_this + pg_catalog.make_interval(months => i))::date
      FROM pg_catalog.generate_series(0, p_months_ahead) i
    UNION
    SELECT pg_catalog.date_trunc('month', d.at AT TIME ZONE 'UTC')::date
      FROM fabric.measurements_default d WHERE pg_catalog.isfinite(d.at)
    ORDER BY 1
  LOOP
    v_created := v_created + fabric._measurement_partition(v_month);
  END LOOP;
  PERFORM pg_catalog.set_config('fabric.partition_maintenance', '', true);
  RETURN v_created;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._empty_due_measurement_partitions: retention by whole months. A monthly partition
-- that ended by p_now, in which every point is operational and past its instance's window
-- (and whose tenants all enable the committer), is emptied with TRUNCATE instead of deleted
-- row by row; answers the points it removed. The check holds a SHARE lock (reads go on, no
-- point slips in between the check and the TRUNCATE); a partition another session holds is
-- left to the row deletes (NOWAIT). Empty partitions and those holding a durable point are
-- passed over before the full check.
CREATE OR REPLACE FUNCTION fabric._empty_due_measurement_partitions(p_now timestamptz,
                                                                   p_committer text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_part regclass;
  v_group record;
  v_skip boolean;
  v_due boolean;
  v_n bigint;
  v_total integer := 0;
BEGIN
  FOR v_part IN
    SELECT c.oid::regclass FROM pg_catalog.pg_inherits i
      JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'fabric.measurements'::regclass
       AND c.relname ~ '^measurements_[0-9]{4}_[0-9]{2}$'
       AND ((pg_catalog.to_date(pg_catalog.substr(c.relname, 14), 'YYYY_MM') + interval '1 month')
            AT TIME ZONE 'UTC') <= p_now
     ORDER BY c.relname
  LOOP
    BEGIN
      EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE MODE NOWAIT', v_part);
    EXCEPTION WHEN lock_not_available THEN
      CONTINUE;
    END;
    EXECUTE pg_catalog.format(
      'SELECT NOT EXISTS (SELECT 1 FROM %1$s) '
      'OR EXISTS (SELECT 1 FROM %1$s p WHERE p.retention_class <> ''operational'')', v_part)
      INTO v_skip;
    CONTINUE WHEN v_skip;
    v_due := true;
    v_n := 0;
    FOR v_group IN EXECUTE pg_catalog.format(
        'SELECT p.tenant_id, p.business_instance_id, max(p.at) AS last_at, count(*) AS points '
        'FROM %s p GROUP BY 1, 2', v_part)
    LOOP
      IF NOT fabric._committer_enabled_in(v_group.tenant_id, p_committer, false)
         OR v_group.last_at + (fabric._instance_config(v_group.tenant_id,
                                 v_group.business_instance_id)).operational_window > p_now THEN
        v_due := false;
        EXIT;
      END IF;
      v_n := v_n + v_group.points;
    END LOOP;
    CONTINUE WHEN NOT v_due;
    BEGIN
      EXECUTE pg_catalog.format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE NOWAIT', v_part);
      EXECUTE pg_catalog.format('TRUNCATE %s', v_part);
      v_total := v_total + v_n;
    EXCEPTION WHEN lock_not_available THEN
      NULL;  -- a reader holds the month: the row deletes take its points
    END;
  END LOOP;
  PERFORM fabric._reset_context();
  RETURN v_total;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.run_temporal_retention: removes the points whose class no longer keeps them:
-- operational points once the instance's operational_window has passed since their time;
-- durable points are kept. Committer only (the decay worker's pass). First the table's
-- partitions: made ahead, strays of the default partition moved into their month's, and
-- whole past months whose every point is due emptied at once; then the remaining due points
-- row by row, per tenant, bounded by p_batch per tenant.
CREATE OR REPLACE FUNCTION fabric_api.run_temporal_retention(p_now timestamptz DEFAULT now(),
                                                             p_batch integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_committer text := fabric._enter_committer();
  v_tenant text;
  v_n integer;
  v_total integer := 0;
  v_instance text;
  v_due timestamptz;
  v_last timestamptz;
  v_left integer;
BEGIN
  IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 1000000 THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'batch must be between 1 and 1000000',
      'the default is 10000');
  END IF;
  IF p_now IS NULL OR NOT pg_catalog.isfinite(p_now) THEN
    PERFORM fabric._raise_rule('invalid_parameter_value', 'now must be a finite timestamp',
      'the default is now()');
  END IF;
  PERFORM fabric.ensure_measurement_partitions(GREATEST(p_now, pg_catalog.now()));
  v_total := fabric._empty_due_measurement_partitions(p_now, v_committer);
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t ORDER BY 1 LOOP
    PERFORM fabric._reset_context();
    CONTINUE WHEN NOT fabric._committer_enabled_in(v_tenant, v_committer, false);
    PERFORM fabric._set_context('actor', v_committer);
    IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local' THEN
      -- Citus: a helper that reads a table (the instance's window) may not run inside a
      -- query on a shard, nor is a row addressed by ctid there. Each instance's window is
      -- read first, then its due points are deleted up to the batch's last instant (points
      -- sharing that instant go together), at most a batch per tenant as below.
      v_left := p_batch;
      FOR v_instance IN
        SELECT DISTINCT m.business_instance_id FROM fabric.measurements m
         WHERE m.tenant_id = v_tenant AND m.retention_class = 'operational'
      LOOP
        EXIT WHEN v_left <= 0;
        v_due := p_now - (fabric._instance_config(v_tenant, v_instance)).operational_window;
        SELECT m.at INTO v_last FROM fabric.measurements m
         WHERE m.tenant_id = v_tenant AND m.retention_class = 'operational'
           AND m.business_instance_id IS NOT DISTINCT FROM v_instance AND m.at <= v_due
         ORDER BY m.at OFFSET v_left - 1 LIMIT 1;
        DELETE FROM fabric.measurements m
         WHERE m.tenant_id = v_tenant AND m.retention_class = 'operational'
           AND m.business_instance_id IS NOT DISTINCT FROM v_instance
           AND m.at <= LEAST(v_due, coalesce(v_last, v_due));
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
        v_left := v_left - v_n;
      END LOOP;
      CONTINUE;
    END IF;
    DELETE FROM fabric.measurements d
     USING (SELECT m.tableoid AS part, m.ctid AS row_id FROM fabric.measurements m
             WHERE m.tenant_id = v_tenant AND m.retention_class = 'operational'
               AND m.at + (fabric._instance_config(v_tenant, m.business_instance_id)).operational_window
                   <= p_now
             LIMIT p_batch) due
     WHERE d.tenant_id = v_tenant AND d.tableoid = due.part AND d.ctid = due.row_id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_total := v_total + v_n;
  END LOOP;
  PERFORM fabric._reset_context();
  RETURN v_total;
END $$;
COMMENT ON FUNCTION fabric_api.run_temporal_retention(timestamptz, integer) IS
  'Remove time-series points their retention class no longer keeps (operational: after the '
  'instance''s operational_window). Committer only. Example: SELECT fabric_api.run_temporal_retention(now(), 10000);';
