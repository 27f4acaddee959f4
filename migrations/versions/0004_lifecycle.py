"""Governed lifecycle: instance configuration, approvals, promotion edges, contradictions,
recommendations.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

-- instance_config: one row per (tenant, business instance); '' is the tenant's default
-- instance. NULL thresholds fall back to the domain pack's declared default, then to the
-- fabric's (2 episodes, confidence 0.8, 3 trajectories).
CREATE TABLE fabric.instance_config (
  tenant_id                    fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  business_instance_id         text NOT NULL DEFAULT '',
  domain_pack_id               fabric.ident,
  min_corroborating_episodes   integer,
  min_confidence               double precision,
  min_successful_trajectories  integer,
  updated_at                   timestamptz NOT NULL DEFAULT now(),
  updated_by                   name NOT NULL DEFAULT session_user,
  PRIMARY KEY (tenant_id, business_instance_id),
  CONSTRAINT instance_config_thresholds_are_sane CHECK (
    coalesce(min_corroborating_episodes, 1) >= 1
    AND coalesce(min_confidence, 0) BETWEEN 0 AND 1
    AND coalesce(min_successful_trajectories, 1) >= 1)
);

-- domain_pack_defaults: what a domain pack declares; only an instance sets its own values.
CREATE TABLE fabric.domain_pack_defaults (
  domain_pack_id               fabric.ident PRIMARY KEY,
  min_corroborating_episodes   integer,
  min_confidence               double precision,
  min_successful_trajectories  integer,
  CONSTRAINT domain_pack_defaults_are_sane CHECK (
    coalesce(min_corroborating_episodes, 1) >= 1
    AND coalesce(min_confidence, 0) BETWEEN 0 AND 1
    AND coalesce(min_successful_trajectories, 1) >= 1)
);

-- approvals: requested by the committer, decided by policy (os-agt-002), bound to one record
-- (or one data subject) and one action, consumed once, before it expires.
CREATE TABLE fabric.approvals (
  tenant_id        fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  approval_id      uuid NOT NULL DEFAULT gen_random_uuid(),
  action           text NOT NULL,
  memory_id        uuid,
  subject_id       fabric.ident,
  target           jsonb NOT NULL DEFAULT '{}',
  reason           text NOT NULL,
  legal_erasure    boolean NOT NULL DEFAULT false,
  status           text NOT NULL DEFAULT 'pending',
  requested_by     fabric.ident NOT NULL,
  requested_at     timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz NOT NULL,
  decided_by       fabric.ident,
  decided_at       timestamptz,
  decision_reason  text,
  consumed_at      timestamptz,
  PRIMARY KEY (tenant_id, approval_id),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  CONSTRAINT approvals_action_is_known
    CHECK (action IN ('promote', 'supersede', 'erase', 'erase_subject')),
  CONSTRAINT approvals_status_is_known
    CHECK (status IN ('pending', 'approved', 'denied', 'consumed')),
  CONSTRAINT approvals_bind_one_record_or_one_subject CHECK (
    (action = 'erase_subject') = (memory_id IS NULL AND subject_id IS NOT NULL)),
  CONSTRAINT approvals_expire_after_request CHECK (expires_at > requested_at),
  CONSTRAINT approvals_decisions_are_stamped
    CHECK ((status = 'pending') = (decided_at IS NULL)),
  CONSTRAINT approvals_consumed_once CHECK ((status = 'consumed') = (consumed_at IS NOT NULL))
);
CREATE INDEX approvals_by_approval_id ON fabric.approvals (approval_id);

-- promotion_edges: the legal promotions, as data (R-PROMO-1).
CREATE TABLE fabric.promotion_edges (
  from_tier       text NOT NULL,
  to_tier         text NOT NULL,
  needs_approval  boolean NOT NULL,
  threshold       text,
  PRIMARY KEY (from_tier, to_tier),
  CONSTRAINT promotion_edges_threshold_is_known CHECK (threshold IN ('corroboration'))
);
INSERT INTO fabric.promotion_edges VALUES
  ('semantic', 'profile', false, 'corroboration'),
  ('semantic', 'procedural', false, 'corroboration'),
  ('episodic', 'relational', true, NULL),
  ('semantic', 'relational', true, NULL),
  ('procedural', 'relational', true, NULL),
  ('profile', 'relational', true, NULL);

-- Contradictions: at most one live record per (tenant, tier, scope, assertion key) at any
-- valid instant on the assertion tiers. Episodic records are evidence and may disagree.
ALTER TABLE fabric.memory_records
  ADD COLUMN assertion_key text GENERATED ALWAYS AS (content ->> 'key') STORED;
ALTER TABLE fabric.memory_records
  ADD CONSTRAINT memory_records_one_live_assertion_per_key
  EXCLUDE USING gist (tenant_id WITH =, tier WITH =, scope_key WITH =, assertion_key WITH =,
                      tstzrange(valid_from, valid_until) WITH &&)
  WHERE (consolidation_state IN ('raw', 'consolidated', 'reflected')
         AND tier IN ('semantic', 'profile', 'procedural') AND assertion_key IS NOT NULL);

-- recommendations: what os-agt-011 recommends; committing is the committer's act.
CREATE TABLE fabric.recommendations (
  tenant_id          fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  recommendation_id  uuid NOT NULL DEFAULT gen_random_uuid(),
  kind               text NOT NULL,
  workflow_event_id  uuid NOT NULL,
  sources            uuid[] NOT NULL,
  proposal           jsonb NOT NULL,
  status             text NOT NULL DEFAULT 'pending',
  reason             text,
  recommended_by     fabric.ident NOT NULL,
  recommended_at     timestamptz NOT NULL DEFAULT now(),
  decided_at         timestamptz,
  memory_id          uuid,
  PRIMARY KEY (tenant_id, recommendation_id),
  CONSTRAINT recommendations_kind_is_known
    CHECK (kind IN ('consolidation', 'reflection', 'promotion', 'distillation')),
  CONSTRAINT recommendations_status_is_known
    CHECK (status IN ('pending', 'committed', 'rejected')),
  CONSTRAINT recommendations_name_their_sources CHECK (cardinality(sources) >= 1),
  CONSTRAINT recommendations_rejected_have_a_reason
    CHECK ((status = 'rejected') = (reason IS NOT NULL))
);
CREATE INDEX recommendations_by_id ON fabric.recommendations (recommendation_id);
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP TABLE IF EXISTS fabric.recommendations CASCADE")
    op.execute(
        "ALTER TABLE fabric.memory_records "
        "DROP CONSTRAINT IF EXISTS memory_records_one_live_assertion_per_key"
    )
    op.execute("ALTER TABLE fabric.memory_records DROP COLUMN IF EXISTS assertion_key")
    op.execute("DROP TABLE IF EXISTS fabric.promotion_edges CASCADE")
    op.execute("DROP TABLE IF EXISTS fabric.approvals CASCADE")
    op.execute("DROP TABLE IF EXISTS fabric.domain_pack_defaults CASCADE")
    op.execute("DROP TABLE IF EXISTS fabric.instance_config CASCADE")
    op.execute("RESET ROLE")
