"""Recall's neighbour expansion reads a conversation in valid-time order:
memory_records_conversation.

A recall request may ask for the turns next to its first hits (`"neighbours": {"turns": 1,
"of": 3}`; fabric._recall_neighbours, docs/recall.md "Neighbours"): for each hit, the
records just before and after it in the same conversation (the same tenant, scope key,
tier, subject and session), no further than an hour of valid time from it. This index
holds the live records that have content, keyed by tenant, scope key and tier, then in
valid-time order (valid_from, recorded_at, memory_id), so each side of a hit is one short
ordered index scan that starts at the hit and stops after `turns` records that pass every
rule, or at the hour's edge: the cost follows `turns` and `of`, not the size of the scope.
Subject, session, validity, confidence and labels are included, so a record that fails
them is skipped without visiting the heap.

Revision ID: 0057_recall_neighbours
Revises: 0056_e5_default
Create Date: 2026-12-05
"""

from alembic import op

revision = "0057_recall_neighbours"
down_revision = "0056_e5_default"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(
        "CREATE INDEX memory_records_conversation ON fabric.memory_records "
        "(tenant_id, scope_key, tier, valid_from, recorded_at, memory_id) "
        "INCLUDE (subject_id, session_id, valid_until, confidence, compliance_labels) "
        "WHERE consolidation_state IN ('raw', 'consolidated', 'reflected') "
        "AND content IS NOT NULL"
    )
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP INDEX fabric.memory_records_conversation")
    op.execute("RESET ROLE")
