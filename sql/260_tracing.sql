-- Tracing feed: the trace consumer (fabric_tracer) reads recall, tool-denial and
-- consolidation-run events (with the run's model calls: metadata only) from
-- the outbox after its own cursor and below the snapshot's xmin, like the projections, and
-- turns each into an OpenTelemetry span. It sees identifiers, tiers, status, mode and timing,
-- and the subject and session only as the event's keyed pseudonyms -- never content, never
-- subject or session ids, never the recall scope.

-- ---------------------------------------------------------------------------------------
-- fabric._traced_event_types: the event types that become spans.
CREATE OR REPLACE FUNCTION fabric._traced_event_types()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT ARRAY['memory.recall.served', 'memory.recall.denied', 'agent.tool.unauthorized',
                   'memory.consolidation.completed'] $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.trace_events: the next traced events after the trace cursor (identifiers only;
-- the subject and session as the pseudonyms the event holds, unlinkable once erased).
CREATE OR REPLACE FUNCTION fabric_api.trace_events(p_limit integer DEFAULT 500)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_cursor fabric.projection_cursors;
BEGIN
  PERFORM fabric._require_role('fabric_tracer', 'read the trace feed');
  SELECT * INTO STRICT v_cursor FROM fabric.projection_cursors c WHERE c.projection = 'trace';
  RETURN (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
            'xid', e.xid::text, 'event_id', e.event_id, 'event_type', e.event_type,
            'tenant_id', e.tenant_id, 'agent_id', coalesce(e.payload ->> 'agent_id', e.actor_agent_id),
            'run_id', e.run_id, 'occurred_at', e.occurred_at,
            'status', e.payload -> 'status', 'reason', e.payload -> 'reason',
            'tool', e.payload -> 'tool', 'missing_layers', e.payload -> 'missing_layers',
            'tiers_requested', e.payload -> 'tiers_requested',
            'tiers_served', e.payload -> 'tiers_served', 'tiers_denied', e.payload -> 'tiers_denied',
            'memory_ids', e.payload -> 'memory_ids', 'truncated', e.payload -> 'truncated',
            'duration_ms', e.payload -> 'duration_ms', 'traceparent', e.payload -> 'traceparent',
            'workflow_event_id', e.payload -> 'workflow_event_id',
            'model_calls', e.payload -> 'model_calls',
            'mode', e.payload -> 'mode_served',
            'subject_ref', e.payload #> '{scope,subject_ref}',
            'session_ref', e.payload #> '{scope,session_ref}'))
            ORDER BY e.xid, e.event_id), '[]')
          FROM (SELECT * FROM fabric.events e
                WHERE (e.xid, e.event_id) > (v_cursor.last_xid, v_cursor.last_event_id)
                  AND e.xid < pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())
                  AND e.event_type = ANY (fabric._traced_event_types())
                ORDER BY e.xid, e.event_id
                LIMIT greatest(1, least(coalesce(p_limit, 500), 10000))) e);
END $$;
COMMENT ON FUNCTION fabric_api.trace_events(integer) IS
  'Recall, tool-denial and consolidation-run events (with their model calls) after the trace '
  'cursor, below the snapshot xmin: identifiers, tiers, status, timing, model metadata, never '
  'content. Tracer only. Example: SELECT fabric_api.trace_events(500);';

-- ---------------------------------------------------------------------------------------
-- fabric_api.set_trace_cursor: advance the trace cursor (never backwards) to an event the
-- trace feed serves: a traced event below the snapshot's xmin. A position past every event
-- (xid 18446744073709551615) would stop tracing for good, so anything else is refused
-- (22023) and the cursor stays where it was.
CREATE OR REPLACE FUNCTION fabric_api.set_trace_cursor(p_xid xid8, p_event_id uuid)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._require_role('fabric_tracer', 'move the trace cursor');
  RETURN fabric._set_cursor('trace', p_xid, p_event_id, false, true);
END $$;
COMMENT ON FUNCTION fabric_api.set_trace_cursor(xid8, uuid) IS
  'Advance the trace cursor (never backwards). Tracer only. '
  'Example: SELECT fabric_api.set_trace_cursor(''1234'', ''<event_id>'');';

-- ---------------------------------------------------------------------------------------
-- fabric_api.trace_lag: how many traced events wait behind the trace cursor.
CREATE OR REPLACE FUNCTION fabric_api.trace_lag()
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_cursor fabric.projection_cursors;
BEGIN
  PERFORM fabric._require_role('fabric_tracer', 'read the trace lag');
  SELECT * INTO STRICT v_cursor FROM fabric.projection_cursors c WHERE c.projection = 'trace';
  RETURN (SELECT pg_catalog.count(*) FROM fabric.events e
          WHERE (e.xid, e.event_id) > (v_cursor.last_xid, v_cursor.last_event_id)
            AND e.event_type = ANY (fabric._traced_event_types()));
END $$;
COMMENT ON FUNCTION fabric_api.trace_lag() IS
  'Traced events not yet exported. Tracer only. Example: SELECT fabric_api.trace_lag();';

-- ---------------------------------------------------------------------------------------
-- fabric_api.check_trace_endpoint: the OTLP endpoint spans may leave for. Spans of every
-- tenant go to one endpoint, so it must be local to every air-gapped instance (loopback,
-- unix socket or on that instance's local_hosts), the same rule as model and embedding URIs.
-- An endpoint without a host (NULL, empty, not a URI) is refused (22023), never allowed.
CREATE OR REPLACE FUNCTION fabric_api.check_trace_endpoint(p_endpoint text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text;
  v_host text := fabric._uri_host(p_endpoint);
  v_refused boolean := false;
BEGIN
  PERFORM fabric._require_role('fabric_tracer', 'check the trace endpoint');
  IF v_host IS NULL OR v_host = '' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'the OTLP endpoint must be a URI that names a host or a unix socket',
      'e.g. http://127.0.0.1:4318/v1/traces');
  END IF;
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t ORDER BY 1 LOOP
    PERFORM fabric._set_local('fabric.tenant_id', v_tenant);
    v_refused := v_refused OR EXISTS (
      SELECT 1 FROM fabric.instance_config c
      WHERE c.tenant_id = v_tenant AND c.deployment_mode = 'air-gapped'
        AND NOT fabric._host_is_local(v_host, c.local_hosts));
  END LOOP;
  PERFORM fabric._set_local('fabric.tenant_id', '');
  IF v_refused THEN
    PERFORM fabric._raise_rule('check_violation',
      'an air-gapped instance cannot export traces to an OTLP endpoint whose host is not local',
      'use a loopback or unix-socket collector, or add its host to the instance''s local_hosts',
      p_constraint => 'instance_config_air_gapped_is_local');
  END IF;
  RETURN true;
END $$;
COMMENT ON FUNCTION fabric_api.check_trace_endpoint(text) IS
  'Refuse (23514) an OTLP endpoint that is not local to every air-gapped instance. Tracer only. '
  'Example: SELECT fabric_api.check_trace_endpoint(''http://127.0.0.1:4318'');';
