"""A rebuild that did not end is remembered: projection_cursors.rebuild_started_at.

`fabric_api.begin_projection_rebuild` sets it before a rebuild wipes its projection; the
rewind of the cursor that ends the rebuild clears it (`fabric._move_cursor`). A value left
behind means the projection may be incomplete: `memfabric serve` runs the rebuild again at
start (docs/projections.md). The functions are replaced by the sql/ replay that follows
every migrate.

Revision ID: 0026_projection_rebuild
Revises: 0025_row_rules
Create Date: 2026-12-02
"""

from alembic import op

revision = "0026_projection_rebuild"
down_revision = "0025_row_rules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("ALTER TABLE fabric.projection_cursors ADD COLUMN rebuild_started_at timestamptz")
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("ALTER TABLE fabric.projection_cursors DROP COLUMN IF EXISTS rebuild_started_at")
    op.execute("RESET ROLE")
