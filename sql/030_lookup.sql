-- Tenant-of-id lookups. Before the tenant is known, an API function must learn it from an
-- id; these narrow functions are owned by fabric_lookup (NOLOGIN, BYPASSRLS, owns nothing
-- else) and return only the tenant key. Only fabric_owner may execute them.
SET LOCAL ROLE fabric_lookup;

-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_run: which tenant a run belongs to. A call that names its tenant (the
-- tenant-keyed entry points, fabric.call_tenant) looks the run up in that tenant alone: on a
-- cluster one shard, the one on the node the call was delegated to; a run of another tenant
-- is not found there, and the call refuses it as an unknown run.
CREATE OR REPLACE FUNCTION fabric._tenant_of_run(p_run_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := nullif(pg_catalog.current_setting('fabric.call_tenant', true), '');
BEGIN
  IF v_tenant IS NOT NULL THEN
    RETURN (SELECT r.tenant_id FROM fabric.runs r
            WHERE r.tenant_id = v_tenant AND r.run_id = p_run_id);
  END IF;
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
     AND NOT fabric._on_worker() THEN
    -- on a Citus cluster the coordinator's directory first: the runs' shards by id alone
    -- would be every shard of every worker (fabric._note_tenant)
    SELECT d.tenant_id INTO v_tenant FROM fabric.tenant_directory d
    WHERE d.id = p_run_id AND d.kind = 'run';
    IF FOUND THEN
      RETURN v_tenant;
    END IF;
  END IF;
  RETURN (SELECT r.tenant_id FROM fabric.runs r WHERE r.run_id = p_run_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_proposal: which tenant a proposal belongs to (as _tenant_of_run).
CREATE OR REPLACE FUNCTION fabric._tenant_of_proposal(p_proposal_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_tenant text := nullif(pg_catalog.current_setting('fabric.call_tenant', true), '');
BEGIN
  IF v_tenant IS NOT NULL THEN
    RETURN (SELECT p.tenant_id FROM fabric.proposals p
            WHERE p.tenant_id = v_tenant AND p.proposal_id = p_proposal_id);
  END IF;
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
     AND NOT fabric._on_worker() THEN
    SELECT d.tenant_id INTO v_tenant FROM fabric.tenant_directory d  -- as _tenant_of_run
    WHERE d.id = p_proposal_id AND d.kind = 'proposal';
    IF FOUND THEN
      RETURN v_tenant;
    END IF;
  END IF;
  RETURN (SELECT p.tenant_id FROM fabric.proposals p WHERE p.proposal_id = p_proposal_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_record: which tenant a memory record belongs to.
CREATE OR REPLACE FUNCTION fabric._tenant_of_record(p_memory_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT m.tenant_id FROM fabric.memory_records m WHERE m.memory_id = p_memory_id);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric._tenants_with_validated_proposals: the committer's drain iterates these.
CREATE OR REPLACE FUNCTION fabric._tenants_with_validated_proposals()
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT DISTINCT p.tenant_id FROM fabric.proposals p WHERE p.status = 'validated' $$;

-- ---------------------------------------------------------------------------------------
-- fabric._tool_is_enabled_anywhere: R-TOOL-2 must see every tenant's enablements.
CREATE OR REPLACE FUNCTION fabric._tool_is_enabled_anywhere(p_tool_id text)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT EXISTS (SELECT 1 FROM fabric.tenant_agent_tools t WHERE t.tool_id = p_tool_id) $$;

-- ---------------------------------------------------------------------------------------
-- fabric._tenants_with_staged_events: on a Citus cluster, the tenants whose shards hold
-- events that wait for the coordinator's outbox (the relay's work list; a tenant key each).
CREATE OR REPLACE FUNCTION fabric._tenants_with_staged_events()
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT DISTINCT s.tenant_id FROM fabric.shard_events s $$;

REVOKE ALL ON FUNCTION fabric._tenants_with_staged_events() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._tenants_with_staged_events() TO fabric_owner;

REVOKE ALL ON FUNCTION fabric._tenant_of_run(uuid), fabric._tenant_of_proposal(uuid),
  fabric._tenant_of_record(uuid), fabric._tenants_with_validated_proposals(),
  fabric._tool_is_enabled_anywhere(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._tenant_of_run(uuid), fabric._tenant_of_proposal(uuid),
  fabric._tenant_of_record(uuid), fabric._tenants_with_validated_proposals(),
  fabric._tool_is_enabled_anywhere(text) TO fabric_owner;

SET LOCAL ROLE fabric_owner;
-- ---------------------------------------------------------------------------------------
-- fabric._note_tenant: on a Citus cluster, note which tenant a new run or proposal belongs
-- to in the coordinator's fabric.tenant_directory, in the transaction that makes it, so the
-- lookups above reach no worker; on plain PostgreSQL nothing (they read the tables). A call
-- delegated to a worker notes nothing there: the relay notes its runs and proposals from
-- their events (fabric._flush_shard_events).
CREATE OR REPLACE FUNCTION fabric._note_tenant(p_kind text, p_id uuid, p_tenant_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
     AND NOT fabric._on_worker() THEN
    INSERT INTO fabric.tenant_directory (id, kind, tenant_id) VALUES (p_id, p_kind, p_tenant_id)
    ON CONFLICT (id) DO NOTHING;
  END IF;
END $$;
REVOKE ALL ON FUNCTION fabric._note_tenant(text, uuid, text) FROM PUBLIC;

-- fabric._note_tenants: the same for many ids of one tenant, in one statement (propose_many).
CREATE OR REPLACE FUNCTION fabric._note_tenants(p_kind text, p_ids uuid[], p_tenant_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF pg_catalog.current_setting('citus.propagate_set_commands', true) = 'local'
     AND NOT fabric._on_worker() THEN
    INSERT INTO fabric.tenant_directory (id, kind, tenant_id)
    SELECT DISTINCT i.id, p_kind, p_tenant_id FROM pg_catalog.unnest(p_ids) AS i(id)
    WHERE i.id IS NOT NULL
    ON CONFLICT (id) DO NOTHING;
  END IF;
END $$;
REVOKE ALL ON FUNCTION fabric._note_tenants(text, uuid[], text) FROM PUBLIC;

GRANT SELECT (id, kind, tenant_id) ON fabric.tenant_directory TO fabric_lookup;
GRANT SELECT (tenant_id, run_id) ON fabric.runs TO fabric_lookup;
GRANT SELECT (tenant_id, proposal_id, status) ON fabric.proposals TO fabric_lookup;
GRANT SELECT (tenant_id, memory_id) ON fabric.memory_records TO fabric_lookup;
GRANT SELECT (tool_id) ON fabric.tenant_agent_tools TO fabric_lookup;
GRANT SELECT (tenant_id) ON fabric.shard_events TO fabric_lookup;

SET LOCAL ROLE fabric_lookup;
-- ---------------------------------------------------------------------------------------
-- fabric._tenant_of_approval / fabric._tenant_of_recommendation: tenant keys by id.
CREATE OR REPLACE FUNCTION fabric._tenant_of_approval(p_approval_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT a.tenant_id FROM fabric.approvals a WHERE a.approval_id = p_approval_id);
END $$;

CREATE OR REPLACE FUNCTION fabric._tenant_of_recommendation(p_recommendation_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT r.tenant_id FROM fabric.recommendations r
          WHERE r.recommendation_id = p_recommendation_id);
END $$;

REVOKE ALL ON FUNCTION fabric._tenant_of_approval(uuid), fabric._tenant_of_recommendation(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._tenant_of_approval(uuid), fabric._tenant_of_recommendation(uuid)
  TO fabric_owner;
SET LOCAL ROLE fabric_owner;
GRANT SELECT (tenant_id, approval_id) ON fabric.approvals TO fabric_lookup;
GRANT SELECT (tenant_id, recommendation_id) ON fabric.recommendations TO fabric_lookup;

SET LOCAL ROLE fabric_lookup;
-- ---------------------------------------------------------------------------------------
-- fabric._local_to_every_air_gapped_instance: is this endpoint local for every air-gapped
-- instance, across tenants? (a yes/no, never a row)
DROP FUNCTION IF EXISTS fabric._air_gapped_allowlists();
CREATE OR REPLACE FUNCTION fabric._local_to_every_air_gapped_instance(p_uri text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN NOT EXISTS (SELECT 1 FROM fabric.instance_config c
                     WHERE c.deployment_mode = 'air-gapped'
                       AND NOT fabric._host_is_local(fabric._uri_host(p_uri), c.local_hosts));
END $$;
REVOKE ALL ON FUNCTION fabric._local_to_every_air_gapped_instance(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fabric._local_to_every_air_gapped_instance(text) TO fabric_owner;
SET LOCAL ROLE fabric_owner;
GRANT SELECT (local_hosts, deployment_mode) ON fabric.instance_config TO fabric_lookup;
