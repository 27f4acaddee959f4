-- The events outbox: the audit trail and the projection feed. Append-only; one NOTIFY per
-- statement, empty payload, only when a projection consumes one of the inserted types.

-- ---------------------------------------------------------------------------------------
-- fabric._projected_event_types: the event types some projection consumes.
CREATE OR REPLACE FUNCTION fabric._projected_event_types()
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT ARRAY['memory.record.formed', 'memory.record.consolidated', 'memory.record.promoted',
               'memory.record.demoted', 'memory.record.superseded', 'memory.record.expired',
               'memory.record.forgotten', 'memory.reflection.completed',
               'memory.skill.distilled', 'memory.agent_link.recorded',
               'memory.reasoning_step.recorded', 'memory.entity.merged']);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._event_id: a new event's id, time-ordered (UUID version 7, RFC 9562: 48 bits of
-- Unix milliseconds, then the random bits of a version 4 id): each new entry of the primary
-- key lands beside the last one instead of on a random leaf of an index as large as the
-- trail, so a single event's commit (every recall's) dirties a page already in memory and,
-- after a checkpoint, logs no full page image of a random leaf. An SQL function with an
-- SQL-standard body (RETURN expression: names bound when it is created, so no SET
-- search_path), inlined into the expression that calls it.
CREATE OR REPLACE FUNCTION fabric._event_id()
RETURNS uuid
LANGUAGE sql VOLATILE
RETURN pg_catalog.encode(pg_catalog.set_bit(pg_catalog.set_bit(pg_catalog.overlay(
    pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
    pg_catalog.substr(pg_catalog.int8send(pg_catalog.floor(
      EXTRACT(epoch FROM pg_catalog.clock_timestamp()) * 1000)::bigint), 3),
    1, 6), 52, 1), 53, 1), 'hex')::uuid;

-- ---------------------------------------------------------------------------------------
-- fabric._emit: append one event with the common envelope; actor and run from the context.
-- (fabric._recall_answer writes recall's one event with the same envelope itself: a call
-- less on the path of every recall.)
CREATE OR REPLACE FUNCTION fabric._emit(
  p_event_type text,
  p_tenant_id text,
  p_correlation_id text DEFAULT NULL,
  p_causation_id text DEFAULT NULL,
  p_memory_id uuid DEFAULT NULL,
  p_proposal_id uuid DEFAULT NULL,
  p_payload jsonb DEFAULT '{}'
)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_event_id uuid := fabric._event_id();
  -- what fabric._setting answers for both, as simple expressions: this runs for every event
  v_actor text := nullif(pg_catalog.current_setting('fabric.actor', true), '');
  v_run_id uuid := nullif(pg_catalog.current_setting('fabric.run_id', true), '')::uuid;
BEGIN
  IF fabric._on_worker() THEN  -- a delegated call: the tenant's shard holds it for the relay
    INSERT INTO fabric.shard_events (event_id, tenant_id, event_type, correlation_id,
                                     causation_id, actor_agent_id, run_id, memory_id,
                                     proposal_id, payload)
    VALUES (v_event_id, p_tenant_id, p_event_type, p_correlation_id, p_causation_id,
            v_actor, v_run_id, p_memory_id, p_proposal_id, coalesce(p_payload, '{}'));
    RETURN v_event_id;
  END IF;
  INSERT INTO fabric.events (event_id, tenant_id, event_type, correlation_id, causation_id,
                             actor_agent_id, run_id, memory_id, proposal_id, payload)
  VALUES (v_event_id, p_tenant_id, p_event_type, p_correlation_id, p_causation_id,
          v_actor, v_run_id, p_memory_id, p_proposal_id, coalesce(p_payload, '{}'));
  RETURN v_event_id;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._append_events: append events built by a set-based caller, in array order: into
-- the outbox, or in a call delegated to a Citus worker into the tenant's fabric.shard_events
-- for the relay (fabric._emit's two places). The rows are fabric.shard_events rows (the
-- envelope fabric._emit writes, and when they were made); their staged_at orders the relay.
CREATE OR REPLACE FUNCTION fabric._append_events(p_events fabric.shard_events[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF fabric._on_worker() THEN
    INSERT INTO fabric.shard_events (event_id, tenant_id, event_type, correlation_id,
                                     causation_id, actor_agent_id, run_id, memory_id,
                                     proposal_id, payload, staged_at)
    SELECT e.event_id, e.tenant_id, e.event_type, e.correlation_id, e.causation_id,
           e.actor_agent_id, e.run_id, e.memory_id, e.proposal_id, e.payload,
           pg_catalog.clock_timestamp()
      FROM pg_catalog.unnest(p_events) WITH ORDINALITY AS e
     ORDER BY e.ordinality;
    RETURN;
  END IF;
  INSERT INTO fabric.events (event_id, tenant_id, event_type, correlation_id, causation_id,
                             actor_agent_id, run_id, memory_id, proposal_id, payload)
  SELECT e.event_id, e.tenant_id, e.event_type, e.correlation_id, e.causation_id,
         e.actor_agent_id, e.run_id, e.memory_id, e.proposal_id, e.payload
    FROM pg_catalog.unnest(p_events) WITH ORDINALITY AS e
   ORDER BY e.ordinality;
END $$;
REVOKE ALL ON FUNCTION fabric._append_events(fabric.shard_events[]) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric._flush_shard_events: on a Citus cluster, move the events the tenant's shard
-- staged in fabric.shard_events (the shard triggers', which cannot reach this outbox from a
-- worker, and those of calls delegated to the worker) into fabric.events, in the order they
-- were staged, in the calling transaction. Each API function that writes memory_records
-- calls it after the write, and the relay (fabric_api.relay_events) for every tenant; on
-- plain PostgreSQL the triggers write the outbox themselves and this returns at once, and in
-- a call delegated to a worker it leaves them for the relay. A move commits two-phase (the
-- staged rows leave the worker and enter the outbox together, or neither), whatever the
-- moved events are. The runs and proposals a delegated call made are noted in the tenant
-- directory here. The caller has set the tenant context.
CREATE OR REPLACE FUNCTION fabric._flush_shard_events(p_tenant_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS DISTINCT FROM 'local'
     OR fabric._on_worker() THEN
    RETURN;
  END IF;
  PERFORM fabric._move_staged_events(p_tenant_id);
END $$;
REVOKE ALL ON FUNCTION fabric._flush_shard_events(text) FROM PUBLIC;

-- fabric._move_staged_events: the move itself, on a cluster's coordinator; how many moved.
CREATE OR REPLACE FUNCTION fabric._move_staged_events(p_tenant_id text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_staged jsonb;
BEGIN
  -- one statement on the tenant's shard, then the outbox of this node
  WITH moved AS (
    DELETE FROM fabric.shard_events s WHERE s.tenant_id = p_tenant_id RETURNING s.*)
  SELECT pg_catalog.jsonb_agg(m) INTO v_staged FROM moved m;
  IF v_staged IS NULL THEN
    RETURN 0;
  END IF;
  PERFORM fabric._two_phase();
  INSERT INTO fabric.events (event_id, tenant_id, event_type, correlation_id, causation_id,
                             actor_agent_id, run_id, memory_id, proposal_id, payload)
  SELECT s.event_id, s.tenant_id, s.event_type, s.correlation_id, s.causation_id,
         s.actor_agent_id, s.run_id, s.memory_id, s.proposal_id, s.payload
    FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.shard_events, v_staged) s
   ORDER BY s.staged_at, s.event_id;
  INSERT INTO fabric.tenant_directory (id, kind, tenant_id)
  SELECT DISTINCT n.id, n.kind, p_tenant_id
    FROM pg_catalog.jsonb_populate_recordset(NULL::fabric.shard_events, v_staged) s,
         LATERAL (VALUES (s.run_id, 'run'), (s.proposal_id, 'proposal')) n(id, kind)
   WHERE (n.kind = 'run' AND s.event_type = 'fabric.run.opened')
      OR (n.kind = 'proposal' AND s.event_type LIKE 'memory.proposal.%' AND n.id IS NOT NULL)
  ON CONFLICT (id) DO NOTHING;
  RETURN pg_catalog.jsonb_array_length(v_staged);
END $$;
REVOKE ALL ON FUNCTION fabric._move_staged_events(text) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_events__append_only: the audit trail (and the record history) is never
-- rewritten, not even by its owner.
CREATE OR REPLACE FUNCTION fabric.tg_events__append_only()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._raise_rule('MF003',
    pg_catalog.format('%s is append-only: %s is refused', TG_TABLE_NAME, TG_OP),
    'record a new event instead of changing or removing one');
END $$;

CREATE OR REPLACE TRIGGER _200_append_only
  BEFORE UPDATE OR DELETE ON fabric.events
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_events__append_only();

CREATE OR REPLACE TRIGGER _200_append_only_truncate
  BEFORE TRUNCATE ON fabric.events
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__append_only();

-- ---------------------------------------------------------------------------------------
-- fabric.tg_events__notify: wake the projectors once per statement; the table is the truth.
CREATE OR REPLACE FUNCTION fabric.tg_events__notify()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM inserted_events e
             WHERE e.event_type = ANY (fabric._projected_event_types())) THEN
    PERFORM pg_catalog.pg_notify('fabric_events', '');
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER _900_notify
  AFTER INSERT ON fabric.events
  REFERENCING NEW TABLE AS inserted_events
  FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__notify();

-- ---------------------------------------------------------------------------------------
-- fabric._read_event_types: the events of calls that read: their transaction writes no data
-- on a worker (its worker side holds row locks at most), so nothing there can be kept
-- without the event, and a cluster commits it as Citus decides (below).
CREATE OR REPLACE FUNCTION fabric._read_event_types()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT ARRAY['memory.recall.served', 'memory.recall.denied', 'memory.temporal.read',
                   'memory.consolidation.candidates_read', 'agent.tool.unauthorized'] $$;

-- ---------------------------------------------------------------------------------------
-- fabric._two_phase: make this transaction commit two-phase on a Citus cluster (below): one
-- write that changes nothing to fabric.two_phase_anchor, once per transaction.
CREATE OR REPLACE FUNCTION fabric._two_phase()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_xact text := pg_catalog.pg_current_xact_id()::text;
BEGIN
  IF pg_catalog.current_setting('fabric.two_phase_xact', true) IS DISTINCT FROM v_xact THEN
    INSERT INTO fabric.two_phase_anchor (anchor) VALUES (true) ON CONFLICT DO NOTHING;
    PERFORM pg_catalog.set_config('fabric.two_phase_xact', v_xact, true);
  END IF;
END $$;
REVOKE ALL ON FUNCTION fabric._two_phase() FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_events__two_phase: on a Citus cluster, make the transaction that writes an
-- event commit two-phase. A call writes the tenant's worker and this outbox, a plain table
-- of the coordinator, which Citus does not count as a write of its own: it would commit the
-- worker first and the coordinator after, one-phase, and a coordinator failing in between
-- would keep the worker's rows without their events. One write to fabric.two_phase_anchor,
-- a table Citus manages on the coordinator (revision 0055_citus_two_phase), is Citus's local
-- execution of a modification, after which Citus prepares every worker the transaction
-- wrote before the coordinator commits: the call's rows and its events commit together or
-- not at all. The write changes nothing (its one row is there) and is made once per
-- transaction (fabric.two_phase_xact remembers which). A statement whose events are all
-- reads' (fabric._read_event_types: a recall, whose worker side only locks the tenant's
-- enablement row) makes none: a later event of a write in the same transaction does. Made
-- on a cluster only (below).
CREATE OR REPLACE FUNCTION fabric.tg_events__two_phase()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.current_setting('fabric.two_phase_xact', true)
       IS DISTINCT FROM pg_catalog.pg_current_xact_id()::text
     AND EXISTS (SELECT 1 FROM inserted_events e
                 WHERE NOT e.event_type = ANY (fabric._read_event_types())) THEN
    PERFORM fabric._two_phase();
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION fabric.tg_events__two_phase() FROM PUBLIC;

-- The trigger exists on a Citus cluster only: a single node commits in one phase anyway.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
    CREATE OR REPLACE TRIGGER _050_two_phase
      AFTER INSERT ON fabric.events
      REFERENCING NEW TABLE AS inserted_events
      FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__two_phase();
  ELSE
    DROP TRIGGER IF EXISTS _050_two_phase ON fabric.events;
  END IF;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.ensure_event_partitions: monthly partitions from this month on; called by migrate.
CREATE OR REPLACE FUNCTION fabric.ensure_event_partitions(p_months_ahead integer DEFAULT 3)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_start date := pg_catalog.date_trunc('month', pg_catalog.now())::date;
  v_from date;
  v_name text;
  v_created integer := 0;
BEGIN
  FOR i IN 0..p_months_ahead LOOP
    v_from := (v_start + pg_catalog.make_interval(months => i))::date;
    v_name := 'events_' || pg_catalog.to_char(v_from, 'YYYY_MM');
    CONTINUE WHEN pg_catalog.to_regclass('fabric.' || v_name) IS NOT NULL;
    -- A month whose rows already fell into the default partition stays there.
    CONTINUE WHEN EXISTS (SELECT 1 FROM fabric.events_default d
                          WHERE d.occurred_at >= v_from
                            AND d.occurred_at < (v_from + interval '1 month'));
    EXECUTE pg_catalog.format(
      'CREATE TABLE fabric.%I PARTITION OF fabric.events FOR VALUES FROM (%L) TO (%L)',
      v_name, v_from, (v_from + interval '1 month')::date);
    v_created := v_created + 1;
  END LOOP;
  -- Statement triggers are not inherited: each partition refuses TRUNCATE itself.
  FOR v_name IN SELECT i.inhrelid::regclass::text FROM pg_catalog.pg_inherits i
                WHERE i.inhparent = 'fabric.events'::regclass LOOP
    EXECUTE pg_catalog.format(
      'CREATE OR REPLACE TRIGGER _200_append_only_truncate BEFORE TRUNCATE ON %s '
      'FOR EACH STATEMENT EXECUTE FUNCTION fabric.tg_events__append_only()', v_name);
  END LOOP;
  RETURN v_created;
END $$;
