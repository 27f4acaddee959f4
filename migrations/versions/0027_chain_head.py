"""The chain's head is derived from the append-only seals: the one-row cursor goes.

`fabric.event_seal_cursor` said how far sealing had gone, and was updated in place, so the
owner's members and the migration role could move it back or empty it. How far sealing has
gone is now read from `fabric.event_seals` itself, which refuses UPDATE, DELETE and TRUNCATE:
each tenant's head is its last seal (primary key order), and where the next pass starts is
the last sealed position, (xid, event_id), of any tenant (the new index). The functions that
read them are replaced by the sql/ replay that follows every migrate.

Revision ID: 0027_chain_head
Revises: 0026_projection_rebuild
Create Date: 2026-12-04
"""

from alembic import op

revision = "0027_chain_head"
down_revision = "0026_projection_rebuild"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("CREATE INDEX event_seals_by_position ON fabric.event_seals (xid, event_id)")
    op.execute("DROP TABLE fabric.event_seal_cursor")
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(
        """
CREATE TABLE fabric.event_seal_cursor (
  only_row       boolean PRIMARY KEY DEFAULT true,
  last_xid       xid8 NOT NULL DEFAULT '0',
  last_event_id  uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
  sealed_at      timestamptz,
  CONSTRAINT event_seal_cursor_is_one_row CHECK (only_row)
);
INSERT INTO fabric.event_seal_cursor (last_xid, last_event_id, sealed_at)
SELECT coalesce(max(s.xid), '0'),
       coalesce((SELECT s2.event_id FROM fabric.event_seals s2
                 ORDER BY s2.xid DESC, s2.event_id DESC LIMIT 1),
                '00000000-0000-0000-0000-000000000000'),
       max(s.sealed_at)
FROM fabric.event_seals s;
DROP INDEX IF EXISTS fabric.event_seals_by_position;
"""
    )
    op.execute("RESET ROLE")
