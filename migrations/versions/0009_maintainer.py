"""The maintenance role: erasure's VACUUM moves from the committer to fabric_maintainer.

VACUUM cannot run inside a function, so whoever runs it needs the MAINTAIN privilege on
the table, and MAINTAIN also allows LOCK TABLE ... ACCESS EXCLUSIVE. The committer, which
every tenant's writes go through, loses it (and USAGE on the fabric schema, which only
VACUUM needed); fabric_maintainer (NOLOGIN) gets MAINTAIN on the tables erasure and decay
rewrite, from sql/900_grants.sql. Roles are cluster-wide: created idempotently, never
dropped by a downgrade.

Revision ID: 0009_maintainer
Revises: 0008_commit_hardening
Create Date: 2026-12-01
"""

from alembic import op

revision = "0009_maintainer"
down_revision = "0008_commit_hardening"
branch_labels = None
depends_on = None

TABLES = (
    "fabric.memory_records, fabric.proposals, fabric.memory_embeddings, fabric.runs, "
    "fabric.temporal_summaries"
)


def upgrade() -> None:
    op.execute(
        """
        DO $$
        BEGIN
          IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'fabric_maintainer') THEN
            CREATE ROLE fabric_maintainer NOLOGIN;
          END IF;
        END $$
        """
    )
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(f"REVOKE MAINTAIN ON {TABLES} FROM fabric_committer")
    op.execute("REVOKE USAGE ON SCHEMA fabric FROM fabric_committer")
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(
        f"REVOKE MAINTAIN ON {TABLES}, fabric.temporal_summaries_default FROM fabric_maintainer"
    )
    op.execute("REVOKE USAGE ON SCHEMA fabric FROM fabric_maintainer")
    op.execute(f"GRANT MAINTAIN ON {TABLES} TO fabric_committer")
    op.execute("GRANT USAGE ON SCHEMA fabric TO fabric_committer")
    op.execute("RESET ROLE")
