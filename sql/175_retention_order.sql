-- Retention order: retention never grows without an approval. Classes are ordered by when
-- they end for the record's instance -- ephemeral (now) < operational (its window) <
-- regulated (its ceiling) < durable (never); audit counts as durable. A record derived from
-- others takes the earliest-ending class of its sources; audit records never close.

-- ---------------------------------------------------------------------------------------
-- fabric._retention_end: {seconds until the class ends, class rank} for ordering, compared
-- as an array; the rank breaks ties (a regulated record without a ceiling still ends before
-- a durable one).
CREATE OR REPLACE FUNCTION fabric._retention_end(p_tenant_id text, p_instance text,
                                                 p_class text, p_labels text[])
RETURNS numeric[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_probe fabric.memory_records;
  v_ceiling interval;
BEGIN
  IF p_class = 'ephemeral' THEN
    RETURN ARRAY[0, 1]::numeric[];
  ELSIF p_class = 'operational' THEN
    RETURN ARRAY[pg_catalog.date_part('epoch',
                   (fabric._instance_config(p_tenant_id, p_instance)).operational_window)::numeric,
                 2];
  ELSIF p_class = 'regulated' THEN
    v_probe.tenant_id := p_tenant_id;
    v_probe.business_instance_id := p_instance;
    v_probe.compliance_labels := coalesce(p_labels, '{}');
    SELECT l.ceiling INTO v_ceiling FROM fabric._regulated_limits(v_probe) l;
    RETURN ARRAY[coalesce(pg_catalog.date_part('epoch', v_ceiling)::numeric, 'Infinity'::numeric), 3];
  END IF;
  RETURN ARRAY['Infinity'::numeric, 4];          -- durable and audit never end by retention
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._outlives: does class a (with its labels) end later than class b for the instance?
CREATE OR REPLACE FUNCTION fabric._outlives(p_tenant_id text, p_instance text,
  p_class_a text, p_labels_a text[], p_class_b text, p_labels_b text[])
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT fabric._retention_end(p_tenant_id, p_instance, p_class_a, p_labels_a)
       > fabric._retention_end(p_tenant_id, p_instance, p_class_b, p_labels_b)
$$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__audit_never_closes: audit records are append-only evidence;
-- they never decay and are never superseded, whoever runs the UPDATE (erasure alone may
-- tombstone them).
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__audit_never_closes()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM fabric._raise_rule('MF002',
    pg_catalog.format('audit-class records never become %s', NEW.consolidation_state),
    'audit records are append-only: they never decay and are never superseded; '
    'only an approved erasure tombstones one');
END $$;

CREATE OR REPLACE TRIGGER _505_audit_never_closes
  BEFORE UPDATE OF consolidation_state ON fabric.memory_records
  FOR EACH ROW WHEN (OLD.retention_class = 'audit'
                     AND NEW.consolidation_state IN ('superseded', 'expired')
                     AND NEW.consolidation_state IS DISTINCT FROM OLD.consolidation_state)
  EXECUTE FUNCTION fabric.tg_memory_records__audit_never_closes();
