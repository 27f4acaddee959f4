"""Projection: cursors per projection and the deployment's embedder.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

-- projection_cursors: how far each projection has applied the outbox, as (xid8, event_id).
CREATE TABLE fabric.projection_cursors (
  projection     text PRIMARY KEY,
  last_xid       xid8 NOT NULL DEFAULT '0',
  last_event_id  uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
  updated_at     timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT projection_cursors_name_is_known CHECK (projection IN ('qdrant', 'graph'))
);
INSERT INTO fabric.projection_cursors (projection) VALUES ('qdrant'), ('graph');

-- The embedder is a deployment setting: one per database.
ALTER TABLE fabric.deployment_settings
  ADD COLUMN embedder text NOT NULL DEFAULT 'minilm',
  ADD COLUMN embedder_url text,
  ADD COLUMN embedder_model text,
  ADD CONSTRAINT deployment_settings_embedder_is_known CHECK (embedder IN ('minilm', 'http')),
  ADD CONSTRAINT deployment_settings_http_embedder_has_url
    CHECK (embedder <> 'http' OR (embedder_url IS NOT NULL AND embedder_model IS NOT NULL));
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP TABLE IF EXISTS fabric.projection_cursors")
    op.execute(
        "ALTER TABLE fabric.deployment_settings DROP COLUMN IF EXISTS embedder, "
        "DROP COLUMN IF EXISTS embedder_url, DROP COLUMN IF EXISTS embedder_model"
    )
    op.execute("RESET ROLE")
