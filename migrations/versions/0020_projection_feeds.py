"""Projection feeds as rows: fabric_api.projection_events_v2, projection_records_v2 and
projection_snapshot_v2 return one row per event or record (a page is streamed, never built
into one jsonb value, which has a size limit), embeddings travel as ext.vector, and
fabric_api.store_embeddings stores a batch of them. The jsonb feeds of 0.3 become thin
deprecated wrappers; the projection and trace cursors move through one private helper,
fabric._move_cursor. No table changes: the functions are (re)created by the replay of sql/
that follows every upgrade; the downgrade drops the new ones (the replay of an older
release's sql/ restores the old bodies).

Revision ID: 0020_projection_feeds
Revises: 0019_recall_topk
Create Date: 2026-12-01
"""

from alembic import op

revision = "0020_projection_feeds"
down_revision = "0019_recall_topk"
branch_labels = None
depends_on = None

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP FUNCTION IF EXISTS fabric_api.projection_events(text, integer);
DROP FUNCTION IF EXISTS fabric_api.projection_records(uuid[], text, text);
DROP FUNCTION IF EXISTS fabric_api.projection_snapshot(text, uuid, integer, text, text);
DROP FUNCTION IF EXISTS fabric_api.projection_events_v2(text, integer, xid8, uuid);
DROP FUNCTION IF EXISTS fabric_api.projection_records_v2(uuid[], text, text);
DROP FUNCTION IF EXISTS fabric_api.projection_snapshot_v2(text, uuid, integer, text, text);
DROP FUNCTION IF EXISTS fabric_api.store_embeddings(uuid[], text, text, ext.vector[], text[]);
DROP FUNCTION IF EXISTS fabric._projection_rows(text, uuid[], uuid, integer, text, text);
DROP FUNCTION IF EXISTS fabric._projection_cursor(text);
"""


def upgrade() -> None:
    # Functions only: sql/250_projection.sql and sql/260_tracing.sql are replayed after
    # the upgrade (memfabric db migrate), which creates them.
    pass


def downgrade() -> None:
    # The wrappers depend on the row functions, so they go too; replaying the older
    # release's sql/ recreates 0.3's jsonb feeds (and set_*_cursor, which do not depend on
    # fabric._move_cursor once replaced).
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
