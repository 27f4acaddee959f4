-- Grants: group roles get EXECUTE on their doors and nothing else. Agent logins hold no
-- table privileges at all; tests/golden/privileges.txt is the committed matrix.

REVOKE ALL ON ALL TABLES IN SCHEMA fabric FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fabric, fabric_api, fabric_audit FROM PUBLIC;
REVOKE ALL ON SCHEMA fabric, fabric_api, fabric_audit FROM PUBLIC;

GRANT USAGE ON SCHEMA fabric_api
  TO fabric_admin, fabric_orchestrator, fabric_agent, fabric_committer;
GRANT USAGE ON SCHEMA fabric_audit TO fabric_auditor;

GRANT EXECUTE ON FUNCTION
  fabric_api.create_tenant(text),
  fabric_api.register_agent(text, name, jsonb, text[]),
  fabric_api.enable_agent(text, text, text[]),
  fabric_api.configure_instance(text, text, jsonb),
  fabric_api.declare_pack_defaults(text, jsonb),
  fabric_api.configure_deployment(jsonb)
  TO fabric_admin;
GRANT EXECUTE ON FUNCTION
  fabric_api.open_run(text, text, text, text, text[], interval),
  fabric_api.close_run(uuid), fabric_api.close_run(text, uuid)
  TO fabric_orchestrator;
-- An admin may close any run (an operator stopping one); an orchestrator only its own.
GRANT EXECUTE ON FUNCTION fabric_api.close_run(uuid), fabric_api.close_run(text, uuid)
  TO fabric_admin;
GRANT EXECUTE ON FUNCTION fabric_api.propose(jsonb, uuid), fabric_api.propose_many(jsonb, uuid),
  fabric_api.recall(jsonb) TO fabric_agent;
-- the tenant-keyed calls (sql/296_delegation.sql) go with the calls they wrap
GRANT EXECUTE ON FUNCTION fabric_api.propose(text, jsonb, uuid),
  fabric_api.propose_many(text, jsonb, uuid), fabric_api.recall(text, jsonb) TO fabric_agent;
GRANT EXECUTE ON FUNCTION fabric_api.recall_procedure_as_of(jsonb) TO fabric_agent;
GRANT EXECUTE ON FUNCTION fabric_api.handoff(jsonb, uuid), fabric_api.working_key(uuid)
  TO fabric_agent;
-- MCP: the orchestrator issues and revokes bearer tokens of its runs; the gateway resolves
-- them (and nothing else); everyone who calls recall or propose may read their schemas.
GRANT USAGE ON SCHEMA fabric_api TO fabric_mcp_gateway;
GRANT EXECUTE ON FUNCTION fabric_api.issue_mcp_token(uuid, interval),
  fabric_api.revoke_mcp_token(text) TO fabric_orchestrator;
GRANT EXECUTE ON FUNCTION fabric_api.resolve_mcp_token(text) TO fabric_mcp_gateway;
-- Agent tokens: the orchestrator issues and revokes run templates; the gateway's own login
-- opens runs from them (and no other run).
GRANT EXECUTE ON FUNCTION
  fabric_api.issue_agent_token(text, text, text, text, text[], interval, interval),
  fabric_api.revoke_agent_token(text, uuid) TO fabric_orchestrator;
GRANT EXECUTE ON FUNCTION fabric_api.open_token_run(text) TO fabric_mcp_gateway;
GRANT EXECUTE ON FUNCTION fabric_api.request_schema(text)
  TO fabric_agent, fabric_orchestrator, fabric_mcp_gateway;
GRANT EXECUTE ON FUNCTION fabric_api.working_erasure_scope(uuid),
  fabric_api.record_working_erasure(uuid, integer, text[]) TO fabric_committer;
GRANT EXECUTE ON FUNCTION fabric_api.check_working_uri(text, text)
  TO fabric_agent, fabric_admin, fabric_committer;
GRANT EXECUTE ON FUNCTION
  fabric_api.commit(uuid),
  fabric_api.commit(text, uuid),
  fabric_api.commit_many(uuid[]),
  fabric_api.commit_pending(integer),
  fabric_api.request_approval(uuid, text, jsonb, text),
  fabric_api.promote(uuid, text, uuid, uuid),
  fabric_api.demote(uuid, text),
  fabric_api.supersede(uuid, uuid, uuid),
  fabric_api.commit_recommendation(uuid, uuid),
  fabric_api.awaiting_recommendations(text),
  fabric_api.run_decay(timestamptz, integer),
  fabric_api.request_erasure(uuid, text, boolean),
  fabric_api.request_subject_erasure(text, text, text, boolean),
  fabric_api.erase(uuid),
  fabric_api.compact_search_stats(integer),
  fabric_api.import_records(text, text, jsonb)
  TO fabric_committer;
-- The maintenance login VACUUMs what erasure and decay rewrote (PostgreSQL 17's MAINTAIN;
-- VACUUM cannot run inside a function). MAINTAIN also allows LOCK TABLE, so the committer
-- never holds it: fabric_maintainer holds it on these tables only, and nothing else.
GRANT MAINTAIN ON fabric.memory_records, fabric.proposals, fabric.memory_embeddings,
  fabric.runs, fabric.agent_tokens, fabric.temporal_summaries,
  fabric.temporal_summaries_default, fabric.measurements, fabric.measurements_default,
  fabric.subject_keys TO fabric_maintainer;
GRANT USAGE ON SCHEMA fabric TO fabric_maintainer;
GRANT USAGE ON SCHEMA fabric_api TO fabric_projector;
GRANT EXECUTE ON FUNCTION
  fabric_api.store_embedding(uuid, text, text, ext.vector, text),
  fabric_api.store_embeddings(uuid[], text, text, ext.vector[], text[]),
  fabric_api.projection_events_v2(text, integer, xid8, uuid),
  fabric_api.set_projection_cursor(text, xid8, uuid, boolean),
  fabric_api.begin_projection_rebuild(text),
  fabric_api.unfinished_projection_rebuild(text),
  fabric_api.projection_horizon(),
  fabric_api.projection_records_v2(uuid[], text, text),
  fabric_api.projection_snapshot_v2(text, uuid, integer, text, text),
  fabric_api.deployment_embedder(),
  fabric_api.projection_agent_links(uuid[]),
  fabric_api.projection_mentions(uuid[]),
  fabric_api.projection_steps(uuid[]),
  fabric_api.projection_steps_snapshot(text, uuid, integer),
  fabric_api.projection_same_as(uuid[]),
  fabric_api.projection_same_as_snapshot(text, uuid, integer)
  TO fabric_projector;
-- Domain workflows record agent lineage links (sql/285_graph_tier.sql), and nothing else.
GRANT USAGE ON SCHEMA fabric_api TO fabric_workflow;
GRANT EXECUTE ON FUNCTION
  fabric_api.record_agent_link(text, text, uuid, text, uuid, text, uuid),
  fabric_api.record_step(uuid, text, uuid[], uuid)
  TO fabric_workflow;
-- The temporal tier (sql/290_temporal.sql): producers write, agents read, the committer
-- runs retention.
GRANT EXECUTE ON FUNCTION fabric_api.record_measurements(text, jsonb) TO fabric_workflow;
GRANT EXECUTE ON FUNCTION fabric_api.read_measurements(jsonb) TO fabric_agent;
GRANT EXECUTE ON FUNCTION fabric_api.run_temporal_retention(timestamptz, integer)
  TO fabric_committer;
GRANT EXECUTE ON FUNCTION fabric_api.deployment_embedder() TO fabric_agent;
-- Broker tickets (sql/295_broker_tickets.sql): agents and domain workflows take one for
-- their own login; the serve process (a projector login) redeems it.
GRANT EXECUTE ON FUNCTION fabric_api.issue_broker_ticket(interval)
  TO fabric_agent, fabric_workflow;
GRANT EXECUTE ON FUNCTION fabric_api.redeem_broker_ticket(text) TO fabric_projector;
-- The schema revision: every service login checks it before it starts, agents may too.
GRANT EXECUTE ON FUNCTION fabric_api.schema_revision()
  TO fabric_agent, fabric_committer, fabric_consolidator, fabric_projector, fabric_tracer;
GRANT USAGE ON SCHEMA fabric_api TO fabric_tracer;
GRANT EXECUTE ON FUNCTION fabric_api.trace_events(integer), fabric_api.set_trace_cursor(xid8, uuid),
  fabric_api.trace_lag(), fabric_api.check_trace_endpoint(text) TO fabric_tracer;
GRANT USAGE ON SCHEMA fabric_api TO fabric_policy, fabric_consolidator;
GRANT EXECUTE ON FUNCTION fabric_api.decide_approval(uuid, text, text),
  fabric_api.entity_merge_proposals(text, text),
  fabric_api.decide_entity_merge(uuid, text, text) TO fabric_policy;
GRANT EXECUTE ON FUNCTION
  fabric_api.start_workflow_run(text, text),
  fabric_api.consolidation_candidates(text, uuid, text, integer, timestamptz, uuid),
  fabric_api.recommend(jsonb),
  fabric_api.record_consolidation_outcome(text, uuid, jsonb, timestamptz, uuid),
  fabric_api.consolidation_cursor(text),
  fabric_api.consolidation_settings(text, text),
  fabric_api.contradiction_queue(text),
  fabric_api.review_queue(text),
  fabric_api.resolve_review_flag(uuid, text, text),
  fabric_api.resolve_contradiction_flag(uuid, text, text),
  fabric_api.propose_entity_merge(text, uuid, uuid, text),
  fabric_api.merge_entities(uuid)
  TO fabric_consolidator;
GRANT EXECUTE ON FUNCTION
  fabric_audit.records_as_of(text, timestamptz, timestamptz),
  fabric_audit.lineage(text, uuid),
  fabric_audit.recalls(text, timestamptz, timestamptz),
  fabric_audit.profile_at(text, text, timestamptz, timestamptz),
  fabric_audit.verify_tombstone(uuid, jsonb),
  fabric_audit.erasure_receipt(uuid),
  fabric_audit.consolidation_outcomes(text, timestamptz)
  TO fabric_auditor;
-- The audit relations (sql/280_audit_relations.sql; docs/audit.md).
GRANT EXECUTE ON FUNCTION
  fabric_audit.events(text, timestamptz, timestamptz),
  fabric_audit.record_history(text, uuid),
  fabric_audit.approvals(text, timestamptz, timestamptz),
  fabric_audit.erasures(text, timestamptz, timestamptz),
  fabric_audit.tool_denials(text, timestamptz, timestamptz),
  fabric_audit.recall_history(text, timestamptz, timestamptz),
  fabric_audit.recalled_records(text, timestamptz, timestamptz),
  fabric_audit.agent_links(text, timestamptz, timestamptz),
  fabric_audit.entity_touches(text, uuid)
  TO fabric_auditor;
-- The narrow cross-tenant check of the deployment embedder runs as fabric_lookup.
GRANT EXECUTE ON FUNCTION fabric._host_is_local(text, text[]), fabric._uri_host(text)
  TO fabric_lookup;
-- The checkpointer's deletes (sql/280_checkpoints.sql).
GRANT USAGE ON SCHEMA fabric_api TO fabric_checkpointer;

-- The relay of the events delegated calls left on the workers (a cluster only; 0 elsewhere):
-- the feeds' consumers run it before they read, and an admin may run it at once.
GRANT EXECUTE ON FUNCTION fabric_api.relay_events()
  TO fabric_projector, fabric_tracer, fabric_committer, fabric_admin;
