-- The governed write path in psql, each identity with its own login.
-- Run it on a migrated database as the superuser:  make psql  then  \i docs/session.sql
-- (docs/sql.md shows this file; tests/integration/test_readme_session.py executes it).
\set ON_ERROR_STOP on

-- It keeps to its own tenant (acme-readme), agent ids and logins, and runs again as is.
-- 0. The superuser (or your DBA) creates one login per identity, once per cluster.
SELECT pg_catalog.format('CREATE ROLE %I LOGIN', login)
FROM unnest(ARRAY['readme_admin', 'readme_orchestrator', 'readme_committer', 'readme_agent']) login
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = login) \gexec
GRANT fabric_admin TO readme_admin;
GRANT fabric_orchestrator TO readme_orchestrator;
GRANT fabric_committer TO readme_committer;

-- 1. The admin creates the tenant, registers the agents and enables them in the tenant:
-- the agent with its tools, the committer with none (it commits only where enabled).
\connect - readme_admin
SELECT fabric_api.create_tenant('acme-readme');
SELECT fabric_api.register_agent('readme-agt-003', 'readme_agent',
  '{"propose_scope": {"tiers": ["episodic", "semantic"], "visibility": ["subject", "tenant"]}}',
  ARRAY['tool:memory-propose']);
SELECT fabric_api.register_agent('readme-os-agt-010', 'readme_committer', '{}', '{}');
SELECT fabric_api.enable_agent('acme-readme', 'readme-agt-003', ARRAY['tool:memory-propose']);
SELECT fabric_api.enable_agent('acme-readme', 'readme-os-agt-010', '{}');

-- 2. The orchestrator opens a run: this agent, serving user-8842 in session sess-1f9c.
\connect - readme_orchestrator
SELECT fabric_api.open_run('acme-readme', 'readme-agt-003', 'user-8842', 'sess-1f9c',
                           ARRAY['tool:memory-propose'], '30 minutes') AS run_id \gset

-- 3. The agent proposes an episode inside its run: validated.
\connect - readme_agent
SELECT fabric_api.propose('{
  "tier": "episodic",
  "scope": {"tenant_id": "acme-readme", "visibility": "subject"},
  "content": {"text": "Customer asked to be invoiced via Acme Logistics BV (NL)."},
  "provenance": {"source_event_id": "evt-7b21", "correlation_id": "corr-9d4a",
                 "causation_id": "evt-7b1f", "formation_method": "extraction"},
  "confidence": 0.9,
  "validity_interval": {"valid_from": "2026-07-02T09:14:00Z", "valid_until": null}
}', :'run_id') AS proposed \gset
-- Proposing the same event and content again (running this file twice) answers the first
-- proposal with "replayed": true and writes nothing.
SELECT :'proposed'::jsonb ->> 'proposal_id' AS proposal_id,
       :'proposed'::jsonb ->> 'status' = 'validated' AS fresh \gset

-- A semantic assertion with no episodic source is a governance violation: rejected.
SELECT fabric_api.propose('{
  "tier": "semantic",
  "scope": {"tenant_id": "acme-readme", "visibility": "subject"},
  "content": {"assertion": "Primary billing entity is Acme Logistics BV (NL)."},
  "provenance": {"source_event_id": "evt-7b22", "formation_method": "extraction"},
  "confidence": 0.94
}', :'run_id');

-- 4. The committer (readme-os-agt-010) commits the validated proposal: a raw record.
\connect - readme_committer
\if :fresh
SELECT fabric_api.commit(:'proposal_id');
\else
\echo the proposal was committed by an earlier run of this file
\endif
