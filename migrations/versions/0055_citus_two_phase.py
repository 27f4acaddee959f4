"""Every call that writes the outbox commits two-phase on a Citus cluster:
fabric.two_phase_anchor.

On a cluster a governed call writes the tenant's worker (records, proposals, ...) and the
coordinator's outbox (fabric.events, a plain table of the coordinator) in one distributed
transaction. Citus commits such a transaction two-phase only when it modified data over
more than one connection or through its own local execution on the coordinator; a write to
a plain table of the coordinator counts as neither, so the call's commit was one-phase: the
worker committed first, then the coordinator, and a coordinator that failed in between kept
the worker's rows without the call's events.

This revision adds a one-row table that Citus manages on the coordinator (a Citus local
table, `citus_add_local_table_to_metadata`; COORDINATOR_TABLES below). On a cluster the
outbox's statement trigger `_050_two_phase` (sql/040_events.sql) makes one write to it
that changes nothing (an `INSERT ... ON CONFLICT DO NOTHING` of its one row), once per
transaction that writes an event: Citus executes it locally, and a local modification
makes Citus prepare every worker the transaction wrote before the coordinator commits
(PREPARE TRANSACTION, then the coordinator's commit with its record in pg_dist_transaction,
then COMMIT PREPARED; Citus's recovery finishes or rolls back what a failure left). The
outbox itself stays a plain partitioned table: nothing that reads or writes it changes.

On plain PostgreSQL the table holds its row and nothing writes it (the trigger is made on a
cluster only).

The lists below say where the table lives on Citus, as migration 0049's do
(tests/sql/test_citus_layout.py reads them).

Revision ID: 0055_citus_two_phase
Revises: 0054_citus_tenant_directory
Create Date: 2026-12-05
"""

from alembic import op
from sqlalchemy import text

revision = "0055_citus_two_phase"
down_revision = "0054_citus_tenant_directory"
branch_labels = None
depends_on = None

TENANT_TABLES: tuple[str, ...] = ()
REFERENCE_TABLES: tuple[str, ...] = ()
# on the coordinator, in Citus's metadata: its writes are Citus's local execution
COORDINATOR_TABLES = ("fabric.two_phase_anchor",)
LOCAL_TABLES: tuple[str, ...] = ()

# One statement each (Citus sends DDL on as single commands).
UPGRADE = (
    "CREATE TABLE fabric.two_phase_anchor ("
    " anchor boolean PRIMARY KEY CONSTRAINT two_phase_anchor_has_one_row CHECK (anchor))",
    "INSERT INTO fabric.two_phase_anchor (anchor) VALUES (true)",
)


def _citus(bind) -> bool:  # type: ignore[no-untyped-def]
    row = bind.execute(
        text("SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'")
    ).first()
    return row is not None


def upgrade() -> None:
    bind = op.get_bind()
    op.execute("SET LOCAL ROLE fabric_owner")
    for statement in UPGRADE:
        op.execute(statement)
    if _citus(bind):
        for table in COORDINATOR_TABLES:
            bind.execute(
                text("SELECT citus_add_local_table_to_metadata(CAST(:t AS regclass))"),
                {"t": table},
            )
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP TRIGGER IF EXISTS _050_two_phase ON fabric.events")
    op.execute("DROP TABLE IF EXISTS fabric.two_phase_anchor")  # on Citus its shard as well
    op.execute("RESET ROLE")
