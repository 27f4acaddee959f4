"""A new record's id is time-ordered (UUID version 7), like a governed event's.

`memory_records.memory_id` defaulted to a random (version 4) UUID. Every record's id is a
key of two of the table's indexes and of the rows written beside it (its formation event's
`events_by_memory`, its mentions' primary key, the lookups of their foreign keys): a random
id lands each of those entries on a random leaf, which on a large table is a page to read
and, after a checkpoint, a full page image to log. A version 7 id (48 bits of Unix
milliseconds, then the random bits of a version 4 id: RFC 9562) puts a batch's entries
beside each other. The expression is `fabric._event_id()`'s, written with built-in functions
only, so the default needs nothing the replay of sql/ creates and every Citus node has it.
Ids already given are unchanged; nothing reads an order into them.

Revision ID: 0058_time_ordered_ids
Revises: 0057_recall_neighbours
Create Date: 2026-12-05
"""

from alembic import op

revision = "0058_time_ordered_ids"
down_revision = "0057_recall_neighbours"
branch_labels = None
depends_on = None

V7 = (
    "pg_catalog.encode(pg_catalog.set_bit(pg_catalog.set_bit(pg_catalog.overlay("
    "pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), "
    "pg_catalog.substr(pg_catalog.int8send(pg_catalog.floor("
    "EXTRACT(epoch FROM pg_catalog.clock_timestamp()) * 1000)::bigint), 3), "
    "1, 6), 52, 1), 53, 1), 'hex')::uuid"
)


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(f"ALTER TABLE fabric.memory_records ALTER COLUMN memory_id SET DEFAULT {V7}")
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(
        "ALTER TABLE fabric.memory_records ALTER COLUMN memory_id "
        "SET DEFAULT pg_catalog.gen_random_uuid()"
    )
    op.execute("RESET ROLE")
