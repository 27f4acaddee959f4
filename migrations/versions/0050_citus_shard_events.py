"""Events a shard's trigger forms wait, in the same transaction, for the coordinator's outbox:
fabric.shard_events.

On a Citus cluster the triggers of fabric.memory_records run on the worker that holds the
tenant, and the outbox (fabric.events) is a table of the coordinator that a worker cannot
write. So there the formation and transition triggers write each event into this table,
colocated with the tenant's records, and the API function that caused them moves them into
fabric.events before it returns (fabric._flush_shard_events): the record and its event are
still written by one transaction, or neither is. On plain PostgreSQL the triggers write the
outbox directly and this table stays empty.

The lists below say where the table lives on Citus, as migration 0049's do
(tests/sql/test_citus_layout.py reads both).

Revision ID: 0050_citus_shard_events
Revises: 0049_citus
Create Date: 2026-12-04
"""

from alembic import op
from sqlalchemy import text

revision = "0050_citus_shard_events"
down_revision = "0049_citus"
branch_labels = None
depends_on = None

TENANT_TABLES = ("fabric.shard_events",)
REFERENCE_TABLES: tuple[str, ...] = ()
COORDINATOR_TABLES: tuple[str, ...] = ()
LOCAL_TABLES: tuple[str, ...] = ()

COLOCATE_WITH = "fabric.tenant_agents"

UPGRADE = """
CREATE TABLE fabric.shard_events (
  tenant_id       text NOT NULL,
  event_id        uuid NOT NULL,
  staged_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  event_type      text NOT NULL,
  correlation_id  text,
  causation_id    text,
  actor_agent_id  text,
  run_id          uuid,
  memory_id       uuid,
  proposal_id     uuid,
  payload         jsonb NOT NULL,
  PRIMARY KEY (tenant_id, event_id),
  CONSTRAINT shard_events_tenant_id_is_a_tenant_ident
    CHECK (CAST(tenant_id AS fabric.tenant_ident) IS NOT NULL)
);
"""


def _citus(bind) -> bool:  # type: ignore[no-untyped-def]
    row = bind.execute(
        text("SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'")
    ).first()
    return row is not None


def upgrade() -> None:
    bind = op.get_bind()
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(UPGRADE)
    if _citus(bind):
        for table in TENANT_TABLES:
            bind.execute(
                text(
                    "SELECT create_distributed_table(CAST(:t AS regclass), 'tenant_id', "
                    "colocate_with => :c)"
                ),
                {"t": table, "c": COLOCATE_WITH},
            )
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    # a replayed function takes the table's rows (sql/040_events.sql): it goes with them
    op.execute("DROP FUNCTION IF EXISTS fabric._append_events(fabric.shard_events[])")
    op.execute("DROP TABLE IF EXISTS fabric.shard_events")
    op.execute("RESET ROLE")
