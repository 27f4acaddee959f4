"""Schema revision: the owner may read alembic's version table.

Workers and `memfabric serve` refuse to start against a schema revision they do not know.
They log in as service roles, which cannot read fabric_migrations (the migration role's);
fabric_api.schema_revision() (sql/275_schema_revision.sql), owned by fabric_owner, reads
it for them, so the owner gets USAGE on the schema and SELECT on the table, nothing more.

Revision ID: 0015_schema_revision
Revises: 0014_trace
Create Date: 2026-12-01
"""

from alembic import op

revision = "0015_schema_revision"
down_revision = "0014_trace"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("GRANT USAGE ON SCHEMA fabric_migrations TO fabric_owner")
    op.execute("GRANT SELECT ON fabric_migrations.alembic_version TO fabric_owner")


def downgrade() -> None:
    # The function would be left reading a table its owner may no longer read.
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP FUNCTION IF EXISTS fabric_api.schema_revision()")
    op.execute("RESET ROLE")
    op.execute("REVOKE SELECT ON fabric_migrations.alembic_version FROM fabric_owner")
    op.execute("REVOKE USAGE ON SCHEMA fabric_migrations FROM fabric_owner")
