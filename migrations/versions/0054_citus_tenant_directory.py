"""The tenant of a run or a proposal, kept where the API runs: fabric.tenant_directory.

On a Citus cluster every fabric_api call runs on the coordinator, and an agent's call names
a run (`propose`, `recall`) or a proposal (`commit`), not a tenant: learning the tenant from
the distributed fabric.runs or fabric.proposals by id alone queries every shard on every
worker. So on a cluster `open_run` and `propose` also note the id's tenant in this plain
table of the coordinator, and the lookups read it first (falling back to the shards for an id
noted nowhere, e.g. one made before this revision): a tenant-scoped call then reaches only
the tenant's worker. It holds ids and tenant keys only, never content or a subject. On plain
PostgreSQL the lookups read the tables directly, as before, and this table stays empty.

The lists below say where the table lives on Citus, as migration 0049's do
(tests/sql/test_citus_layout.py reads them).

Revision ID: 0054_citus_tenant_directory
Revises: 0053_domain_fast_paths
Create Date: 2026-12-05
"""

from alembic import op

revision = "0054_citus_tenant_directory"
down_revision = "0053_domain_fast_paths"
branch_labels = None
depends_on = None

TENANT_TABLES: tuple[str, ...] = ()
REFERENCE_TABLES: tuple[str, ...] = ()
COORDINATOR_TABLES: tuple[str, ...] = ()
# a plain table of the coordinator, like the outbox: nothing to distribute
LOCAL_TABLES = ("fabric.tenant_directory",)

UPGRADE = (
    "CREATE TABLE fabric.tenant_directory ("
    " id uuid PRIMARY KEY,"
    " kind text NOT NULL CONSTRAINT tenant_directory_kind_is_known"
    " CHECK (kind IN ('run', 'proposal')),"
    " tenant_id text NOT NULL CONSTRAINT tenant_directory_tenant_id_is_a_tenant_ident"
    " CHECK (CAST(tenant_id AS fabric.tenant_ident) IS NOT NULL))",
)


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    for statement in UPGRADE:
        op.execute(statement)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP TABLE IF EXISTS fabric.tenant_directory")
    op.execute("RESET ROLE")
