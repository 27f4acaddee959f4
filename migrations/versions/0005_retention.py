"""Retention, decay and erasure: instance retention and deployment settings, temporal
summaries, review flags, erasure receipts and the embeddings table.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

ALTER TABLE fabric.instance_config
  ADD COLUMN deployment_mode text NOT NULL DEFAULT 'saas',
  ADD COLUMN model_uri text,
  ADD COLUMN embedding_uri text,
  ADD COLUMN local_hosts text[] NOT NULL DEFAULT '{}',
  ADD COLUMN operational_window interval NOT NULL DEFAULT '90 days',
  ADD COLUMN regulated_retention jsonb NOT NULL DEFAULT '{}',
  ADD COLUMN regulated_labels text[] NOT NULL DEFAULT '{pii-special,phi,pci}',
  ADD COLUMN approval_timeout interval NOT NULL DEFAULT '24 hours',
  ADD COLUMN approval_timeouts jsonb NOT NULL DEFAULT '{}',
  ADD COLUMN checkpoint_retention interval NOT NULL DEFAULT '7 days',
  ADD COLUMN consolidation_budget integer NOT NULL DEFAULT 100,
  ADD COLUMN decay_interval interval NOT NULL DEFAULT '1 hour',
  ADD CONSTRAINT instance_config_deployment_mode_is_known
    CHECK (deployment_mode IN ('saas', 'hybrid', 'air-gapped')),
  ADD CONSTRAINT instance_config_windows_are_positive CHECK (
    operational_window > interval '0' AND approval_timeout > interval '0'
    AND checkpoint_retention > interval '0' AND decay_interval > interval '0'
    AND consolidation_budget >= 0),
  ADD CONSTRAINT instance_config_maps_are_objects CHECK (
    jsonb_typeof(regulated_retention) = 'object' AND jsonb_typeof(approval_timeouts) = 'object');

-- Every tenant has its default instance's row (create_tenant makes it from now on).
DO $$
DECLARE
  t text;
BEGIN
  FOR t IN SELECT tenant_id FROM fabric.tenants LOOP
    PERFORM set_config('fabric.tenant_id', t, true);
    INSERT INTO fabric.instance_config (tenant_id) VALUES (t) ON CONFLICT DO NOTHING;
  END LOOP;
  PERFORM set_config('fabric.tenant_id', '', true);
END $$;

-- temporal_summaries: the temporal tier's aggregate of operational records whose window
-- closed -- the shape of the history survives its detail. Partitioned by month.
CREATE TABLE fabric.temporal_summaries (
  tenant_id        text NOT NULL,
  day              date NOT NULL,
  tier             text NOT NULL,
  subject_id       text,
  retention_class  text NOT NULL,
  records          integer NOT NULL,
  summarized_at    timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT temporal_summaries_count_positive CHECK (records > 0)
) PARTITION BY RANGE (day);
CREATE TABLE fabric.temporal_summaries_default PARTITION OF fabric.temporal_summaries DEFAULT;
CREATE INDEX temporal_summaries_by_tenant ON fabric.temporal_summaries (tenant_id, day);

-- review_flags: records derived from a tombstoned record, for os-agt-011 to judge.
CREATE TABLE fabric.review_flags (
  tenant_id          fabric.tenant_ident NOT NULL,
  memory_id          uuid NOT NULL,
  tombstoned_source  uuid NOT NULL,
  flagged_at         timestamptz NOT NULL DEFAULT now(),
  resolved_at        timestamptz,
  PRIMARY KEY (tenant_id, memory_id, tombstoned_source),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, tombstoned_source) REFERENCES fabric.memory_records (tenant_id, memory_id)
);

-- erasure_receipts: what was destroyed, when, under which approval (no values).
CREATE TABLE fabric.erasure_receipts (
  tenant_id    fabric.tenant_ident NOT NULL,
  memory_id    uuid NOT NULL,
  approval_id  uuid NOT NULL,
  erased_at    timestamptz NOT NULL DEFAULT now(),
  erased_by    fabric.ident NOT NULL,
  destroyed    jsonb NOT NULL,
  PRIMARY KEY (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, approval_id) REFERENCES fabric.approvals (tenant_id, approval_id)
);

-- memory_embeddings: vectors stored in Postgres (storage, not a retrieval path: no ANN
-- index), keyed by model and version; written only through fabric_api.store_embedding.
CREATE TABLE fabric.memory_embeddings (
  tenant_id      fabric.tenant_ident NOT NULL,
  memory_id      uuid NOT NULL,
  model          text NOT NULL,
  model_version  text NOT NULL,
  dims           integer NOT NULL,
  embedding      ext.vector NOT NULL,
  content_hash   text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, memory_id, model, model_version),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  CONSTRAINT memory_embeddings_dims_match CHECK (ext.vector_dims(embedding) = dims)
);
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    for table in ("memory_embeddings", "erasure_receipts", "review_flags", "temporal_summaries"):
        op.execute(f"DROP TABLE IF EXISTS fabric.{table} CASCADE")
    op.execute(
        "ALTER TABLE fabric.instance_config "
        + ", ".join(
            f"DROP COLUMN IF EXISTS {c}"
            for c in (
                "deployment_mode",
                "model_uri",
                "embedding_uri",
                "local_hosts",
                "operational_window",
                "regulated_retention",
                "regulated_labels",
                "approval_timeout",
                "approval_timeouts",
                "checkpoint_retention",
                "consolidation_budget",
                "decay_interval",
            )
        )
    )
    op.execute("RESET ROLE")
