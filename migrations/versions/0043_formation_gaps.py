"""Memory that forms itself, the gaps: corroboration links, resolvable contradiction flags,
and the instance's consolidation schedule window.

- `fabric.memory_corroborations`: append-only links from a live assertion to the episodes
  that corroborated it after it was formed. `derived_from` (memory_lineage) stays immutable;
  lineage reads and the promotion threshold read both.
- `fabric.contradiction_flags`: who resolved a flag and why.
- `fabric.instance_config.consolidation_window_start/_end`: the UTC time of day in which
  scheduled consolidation runs (both or neither; a window that ends before it starts spans
  midnight).

The functions are replaced by the sql/ replay that follows every migrate.

Revision ID: 0043_formation_gaps
Revises: 0042_graph_tier
Create Date: 2026-12-04
"""

from alembic import op

revision = "0043_formation_gaps"
down_revision = "0042_graph_tier"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

CREATE TABLE fabric.memory_corroborations (
  tenant_id          fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  memory_id          uuid NOT NULL,
  episode_id         uuid NOT NULL,
  recommendation_id  uuid NOT NULL,
  corroborated_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, memory_id, episode_id),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, episode_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, recommendation_id)
    REFERENCES fabric.recommendations (tenant_id, recommendation_id),
  CONSTRAINT memory_corroborations_not_self CHECK (memory_id <> episode_id)
);
CREATE INDEX memory_corroborations_by_episode
  ON fabric.memory_corroborations (tenant_id, episode_id);

ALTER TABLE fabric.contradiction_flags
  ADD COLUMN resolved_by fabric.ident,
  ADD COLUMN resolution_reason text,
  ADD CONSTRAINT contradiction_flags_resolved_say_who_and_why
    CHECK ((resolved_at IS NULL) = (resolved_by IS NULL)
           AND (resolved_at IS NULL) = (resolution_reason IS NULL));

ALTER TABLE fabric.instance_config
  ADD COLUMN consolidation_window_start time,
  ADD COLUMN consolidation_window_end time,
  ADD CONSTRAINT instance_config_consolidation_window_is_whole
    CHECK ((consolidation_window_start IS NULL AND consolidation_window_end IS NULL)
           OR (consolidation_window_start IS NOT NULL AND consolidation_window_end IS NOT NULL
               AND consolidation_window_start <> consolidation_window_end));
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
ALTER TABLE fabric.instance_config
  DROP CONSTRAINT IF EXISTS instance_config_consolidation_window_is_whole,
  DROP COLUMN IF EXISTS consolidation_window_end,
  DROP COLUMN IF EXISTS consolidation_window_start;
ALTER TABLE fabric.contradiction_flags
  DROP CONSTRAINT IF EXISTS contradiction_flags_resolved_say_who_and_why,
  DROP COLUMN IF EXISTS resolution_reason,
  DROP COLUMN IF EXISTS resolved_by;
DROP TABLE IF EXISTS fabric.memory_corroborations;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
