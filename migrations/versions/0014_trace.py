"""Tracing: a `trace` cursor on the outbox and fabric_tracer, the role that reads it.

The trace consumer turns recall and tool-denial events into OpenTelemetry spans. It reads
the outbox after its own cursor, below the snapshot xmin, like the projections, through
functions that return identifiers only; fabric_tracer (NOLOGIN) has no access to content.
Roles are cluster-wide: created idempotently, never dropped by a downgrade.

Revision ID: 0014_trace
Revises: 0013_working_tier
Create Date: 2026-12-01
"""

from alembic import op

revision = "0014_trace"
down_revision = "0013_working_tier"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        DO $$
        BEGIN
          IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'fabric_tracer') THEN
            CREATE ROLE fabric_tracer NOLOGIN;
          END IF;
        END $$
        """
    )
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(
        "ALTER TABLE fabric.projection_cursors "
        "DROP CONSTRAINT projection_cursors_name_is_known, "
        "ADD CONSTRAINT projection_cursors_name_is_known "
        "CHECK (projection IN ('qdrant', 'graph', 'trace'))"
    )
    op.execute("INSERT INTO fabric.projection_cursors (projection) VALUES ('trace')")
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DELETE FROM fabric.projection_cursors WHERE projection = 'trace'")
    op.execute(
        "ALTER TABLE fabric.projection_cursors "
        "DROP CONSTRAINT projection_cursors_name_is_known, "
        "ADD CONSTRAINT projection_cursors_name_is_known "
        "CHECK (projection IN ('qdrant', 'graph'))"
    )
    op.execute("RESET ROLE")
