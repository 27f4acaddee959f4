"""Core tables: tenants, agents, tools, enablement, runs, proposals, records, lineage,
record history and the events outbox.

Stateful DDL only (docs/architecture.md, The shape): tables, domains, constraints, indexes, seed rows. Functions,
triggers, policies and grants are replayed from sql/ and rls/ on every migrate.
Every tenant-owned table starts with tenant_id and every foreign key between tenant tables
is a composite same-tenant key.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

CREATE DOMAIN fabric.ident AS text
  CONSTRAINT ident_is_short_and_printable CHECK (VALUE ~ '^[^[:space:][:cntrl:]]{1,200}$');

CREATE DOMAIN fabric.tenant_ident AS text
  CONSTRAINT tenant_id_is_lowercase_slug CHECK (VALUE ~ '^[a-z0-9][a-z0-9_-]{0,62}$')
  CONSTRAINT tenant_id_is_not_platform CHECK (VALUE <> 'platform');

-- ---------------------------------------------------------------------------------------
-- tenants: the contracting organisations; 'platform' is reserved and never a tenant.
CREATE TABLE fabric.tenants (
  tenant_id   fabric.tenant_ident PRIMARY KEY,
  created_at  timestamptz NOT NULL DEFAULT now(),
  created_by  name NOT NULL DEFAULT session_user
);

-- agents: agent_id <-> login role, with the per-agent security boundary.
CREATE TABLE fabric.agents (
  agent_id        fabric.ident PRIMARY KEY,
  login           name NOT NULL,
  memory_profile  jsonb NOT NULL DEFAULT '{}',
  tools_allowed   text[] NOT NULL DEFAULT '{}',
  registered_at   timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT agents_login_is_unique UNIQUE (login),
  CONSTRAINT agents_memory_profile_is_object CHECK (jsonb_typeof(memory_profile) = 'object')
);

-- tools: every tool names the agent behind it (R-TOOL-2 is checked against this).
CREATE TABLE fabric.tools (
  tool_id      fabric.ident PRIMARY KEY,
  agent_id     fabric.ident NOT NULL,
  description  text NOT NULL
);

INSERT INTO fabric.tools (tool_id, agent_id, description) VALUES
  ('tool:memory-propose', 'os-agt-012', 'propose a memory record (scope-checked by os-agt-012)'),
  ('tool:memory-recall', 'os-agt-012', 'recall memory records (scope resolved by os-agt-012)'),
  ('tool:audit-lineage', 'os-agt-008', 'read lineage (audit and lineage; never grantable to an agent)'),
  ('tool:audit-records-as-of', 'os-agt-008', 'reconstruct past record states (audit only)'),
  ('tool:audit-recalls', 'os-agt-008', 'read recall history (audit only)');

-- tenant_agents / tenant_agent_tools: the second layer of tool authorization.
CREATE TABLE fabric.tenant_agents (
  tenant_id   fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  agent_id    fabric.ident NOT NULL REFERENCES fabric.agents,
  enabled_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, agent_id)
);

CREATE TABLE fabric.tenant_agent_tools (
  tenant_id  fabric.tenant_ident NOT NULL,
  agent_id   fabric.ident NOT NULL,
  tool_id    fabric.ident NOT NULL REFERENCES fabric.tools,
  PRIMARY KEY (tenant_id, agent_id, tool_id),
  FOREIGN KEY (tenant_id, agent_id) REFERENCES fabric.tenant_agents ON DELETE CASCADE
);

-- runs: an orchestrator binds an agent to a subject, a session and an active tool set.
CREATE TABLE fabric.runs (
  tenant_id        fabric.tenant_ident NOT NULL,
  run_id           uuid NOT NULL DEFAULT gen_random_uuid(),
  agent_id         fabric.ident NOT NULL,
  subject_id       fabric.ident,
  session_id       fabric.ident,
  active_tool_set  text[] NOT NULL,
  opened_by        name NOT NULL DEFAULT session_user,
  opened_at        timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz NOT NULL,
  closed_at        timestamptz,
  PRIMARY KEY (tenant_id, run_id),
  FOREIGN KEY (tenant_id, agent_id) REFERENCES fabric.tenant_agents,
  CONSTRAINT runs_expire_after_opening CHECK (expires_at > opened_at)
);
CREATE INDEX runs_by_run_id ON fabric.runs (run_id);

-- proposals: what agents propose; rejected ones keep their reason.
CREATE TABLE fabric.proposals (
  tenant_id             fabric.tenant_ident NOT NULL,
  proposal_id           uuid NOT NULL DEFAULT gen_random_uuid(),
  run_id                uuid NOT NULL,
  proposed_by           fabric.ident NOT NULL,
  status                text NOT NULL,
  reason                text,
  tier                  text NOT NULL,
  visibility            text NOT NULL,
  subject_id            fabric.ident,
  agent_id              fabric.ident,
  session_id            fabric.ident,
  business_instance_id  fabric.ident,
  content               jsonb,
  content_hash          text,
  source_event_id       fabric.ident,
  correlation_id        fabric.ident,
  causation_id          fabric.ident,
  formation_method      text NOT NULL,
  derived_from          uuid[] NOT NULL DEFAULT '{}',
  supersedes            uuid,
  confidence            double precision NOT NULL,
  valid_from            timestamptz NOT NULL,
  valid_until           timestamptz,
  retention_class       text NOT NULL,
  compliance_labels     text[] NOT NULL DEFAULT '{}',
  version               text NOT NULL,
  proposed_at           timestamptz NOT NULL DEFAULT now(),
  decided_at            timestamptz,
  committed_by          fabric.ident,
  memory_id             uuid,
  PRIMARY KEY (tenant_id, proposal_id),
  FOREIGN KEY (tenant_id, run_id) REFERENCES fabric.runs,
  CONSTRAINT proposals_status_is_known CHECK (status IN ('validated', 'rejected', 'committed')),
  CONSTRAINT proposals_rejected_have_a_reason CHECK ((status = 'rejected') = (reason IS NOT NULL)),
  CONSTRAINT proposals_committed_name_their_record
    CHECK ((status = 'committed') = (memory_id IS NOT NULL AND committed_by IS NOT NULL)),
  CONSTRAINT proposals_tier_is_known
    CHECK (tier IN ('episodic', 'semantic', 'procedural', 'profile', 'relational')),
  CONSTRAINT proposals_visibility_is_known
    CHECK (visibility IN ('session', 'agent', 'subject', 'tenant')),
  CONSTRAINT proposals_formation_method_is_known
    CHECK (formation_method IN ('extraction', 'declaration', 'consolidation', 'reflection', 'import')),
  CONSTRAINT proposals_retention_class_is_known
    CHECK (retention_class IN ('ephemeral', 'operational', 'durable', 'audit', 'regulated')),
  CONSTRAINT proposals_content_is_an_object CHECK (jsonb_typeof(content) = 'object'),
  CONSTRAINT proposals_content_hash_format CHECK (content_hash ~ '^sha256:[0-9a-f]{64}$'),
  CONSTRAINT proposals_validated_obey_formation_rules CHECK (
    status = 'rejected' OR (
      source_event_id IS NOT NULL
      AND confidence BETWEEN 0 AND 1
      AND (valid_until IS NULL OR valid_until > valid_from)
      AND formation_method IN ('extraction', 'declaration', 'import')
      AND tier <> 'relational'
      AND supersedes IS NULL
      AND (retention_class <> 'audit' OR tier = 'episodic')
      AND version ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$'
    ))
);
CREATE INDEX proposals_by_proposal_id ON fabric.proposals (proposal_id);
CREATE INDEX proposals_validated_queue ON fabric.proposals (tenant_id, proposed_at)
  WHERE status = 'validated';

-- memory_records: one row per governed record, holding its envelope (docs/concepts.md).
CREATE TABLE fabric.memory_records (
  tenant_id             fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  memory_id             uuid NOT NULL DEFAULT gen_random_uuid(),
  tier                  text NOT NULL,
  visibility            text NOT NULL,
  subject_id            fabric.ident,
  agent_id              fabric.ident,
  session_id            fabric.ident,
  scope_key             text GENERATED ALWAYS AS (
                          CASE visibility
                            WHEN 'session' THEN 'session:' || session_id
                            WHEN 'agent' THEN 'agent:' || agent_id
                            WHEN 'subject' THEN 'subject:' || subject_id
                            WHEN 'tenant' THEN 'tenant'
                          END) STORED,
  business_instance_id  fabric.ident,
  content               jsonb,
  content_hash          text NOT NULL,
  source_event_id       fabric.ident NOT NULL,
  correlation_id        fabric.ident,
  causation_id          fabric.ident,
  formed_by             fabric.ident NOT NULL,
  formation_method      text NOT NULL,
  confidence            double precision NOT NULL,
  valid_from            timestamptz NOT NULL,
  valid_until           timestamptz,
  recorded_at           timestamptz NOT NULL DEFAULT now(),
  consolidation_state   text NOT NULL DEFAULT 'raw',
  supersedes            uuid,
  retention_class       text NOT NULL,
  compliance_labels     text[] NOT NULL DEFAULT '{}',
  version               text NOT NULL DEFAULT '1.0.0',
  proposal_id           uuid,
  run_id                uuid,
  erased_at             timestamptz,
  erasure_approval_id   uuid,
  revision              integer NOT NULL DEFAULT 1,
  known_since           timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, supersedes) REFERENCES fabric.memory_records (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, proposal_id) REFERENCES fabric.proposals (tenant_id, proposal_id),
  CONSTRAINT memory_records_tier_is_known
    CHECK (tier IN ('episodic', 'semantic', 'procedural', 'profile', 'relational')),
  CONSTRAINT memory_records_visibility_is_known
    CHECK (visibility IN ('session', 'agent', 'subject', 'tenant')),
  CONSTRAINT memory_records_formation_method_is_known
    CHECK (formation_method IN ('extraction', 'declaration', 'consolidation', 'reflection', 'import')),
  CONSTRAINT memory_records_retention_class_is_known
    CHECK (retention_class IN ('ephemeral', 'operational', 'durable', 'audit', 'regulated')),
  CONSTRAINT memory_records_state_is_known CHECK (consolidation_state IN
    ('raw', 'consolidated', 'reflected', 'superseded', 'expired', 'tombstoned')),
  CONSTRAINT memory_records_confidence_in_unit_interval CHECK (confidence BETWEEN 0 AND 1),
  CONSTRAINT memory_records_valid_until_after_valid_from
    CHECK (valid_until IS NULL OR valid_until > valid_from),
  CONSTRAINT memory_records_version_is_semver CHECK (version ~
    '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$'),
  CONSTRAINT memory_records_audit_retention_only_on_episodic
    CHECK (retention_class <> 'audit' OR tier = 'episodic'),
  CONSTRAINT memory_records_ephemeral_is_never_durable CHECK (retention_class <> 'ephemeral'),
  CONSTRAINT memory_records_visibility_has_its_id CHECK (
    consolidation_state = 'tombstoned' OR scope_key IS NOT NULL),
  CONSTRAINT memory_records_content_hash_format CHECK (content_hash ~ '^sha256:[0-9a-f]{64}$'),
  CONSTRAINT memory_records_content_is_an_object
    CHECK (content IS NULL OR jsonb_typeof(content) = 'object'),
  CONSTRAINT memory_records_content_only_absent_when_ended
    CHECK (content IS NOT NULL OR consolidation_state IN ('expired', 'tombstoned')),
  CONSTRAINT memory_records_tombstone_has_approval CHECK (
    (consolidation_state = 'tombstoned') = (erased_at IS NOT NULL AND erasure_approval_id IS NOT NULL))
);
CREATE INDEX memory_records_scope ON fabric.memory_records (tenant_id, scope_key, tier, consolidation_state);
CREATE INDEX memory_records_by_memory_id ON fabric.memory_records (memory_id);

-- memory_lineage: derived_from as rows, both ends in the same tenant.
CREATE TABLE fabric.memory_lineage (
  tenant_id        fabric.tenant_ident NOT NULL,
  memory_id        uuid NOT NULL,
  derived_from_id  uuid NOT NULL,
  PRIMARY KEY (tenant_id, memory_id, derived_from_id),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, derived_from_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  CONSTRAINT memory_lineage_not_self_derived CHECK (memory_id <> derived_from_id)
);
CREATE INDEX memory_lineage_by_source ON fabric.memory_lineage (tenant_id, derived_from_id);

-- memory_record_versions: previous values of the mutable columns, with transaction time.
CREATE TABLE fabric.memory_record_versions (
  tenant_id            fabric.tenant_ident NOT NULL,
  memory_id            uuid NOT NULL,
  revision             integer NOT NULL,
  tier                 text NOT NULL,
  consolidation_state  text NOT NULL,
  valid_until          timestamptz,
  known_during         tstzrange NOT NULL,
  ended_by             fabric.ident NOT NULL,
  PRIMARY KEY (tenant_id, memory_id, revision),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id)
);

-- events: the outbox and the audit trail; append-only, partitioned by month.
CREATE TABLE fabric.events (
  event_id        uuid NOT NULL DEFAULT gen_random_uuid(),
  occurred_at     timestamptz NOT NULL DEFAULT now(),
  tenant_id       text NOT NULL,
  event_type      text NOT NULL,
  correlation_id  text,
  causation_id    text,
  actor_agent_id  text,
  actor_login     name NOT NULL DEFAULT session_user,
  run_id          uuid,
  memory_id       uuid,
  proposal_id     uuid,
  payload         jsonb NOT NULL DEFAULT '{}',
  xid             xid8 NOT NULL DEFAULT pg_current_xact_id(),
  PRIMARY KEY (event_id, occurred_at),
  CONSTRAINT events_type_is_dotted CHECK (event_type ~ '^[a-z]+(\.[a-z_]+)+$'),
  CONSTRAINT events_payload_is_object CHECK (jsonb_typeof(payload) = 'object')
) PARTITION BY RANGE (occurred_at);
CREATE TABLE fabric.events_default PARTITION OF fabric.events DEFAULT;
CREATE INDEX events_by_xid ON fabric.events (xid, event_id);
CREATE INDEX events_by_tenant ON fabric.events (tenant_id, occurred_at);
CREATE INDEX events_by_memory ON fabric.events (memory_id) WHERE memory_id IS NOT NULL;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    for table in (
        "events",
        "memory_record_versions",
        "memory_lineage",
        "memory_records",
        "proposals",
        "runs",
        "tenant_agent_tools",
        "tenant_agents",
        "tools",
        "agents",
        "tenants",
    ):
        op.execute(f"DROP TABLE IF EXISTS fabric.{table} CASCADE")
    op.execute("DROP DOMAIN IF EXISTS fabric.ident, fabric.tenant_ident CASCADE")
    op.execute("RESET ROLE")
