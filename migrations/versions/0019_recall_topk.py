"""Recall's top-k from an index in recall's order: filter-only recall reads about k index
entries per resolved scope key and tier, whatever the size of the scope.

memory_records_topk holds the live records that have content (the only ones recall can
return), keyed by tenant, scope key and tier, then in the order of a recall without a
query: most confident, then latest valid_from, then latest recorded_at, then memory_id.
Validity and compliance labels are included so a record that fails them is skipped
without visiting the heap; content and search text are read only for the k winners.

Revision ID: 0019_recall_topk
Revises: 0018_mcp_tokens
Create Date: 2026-12-01
"""

from alembic import op

revision = "0019_recall_topk"
down_revision = "0018_mcp_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(
        "CREATE INDEX memory_records_topk ON fabric.memory_records "
        "(tenant_id, scope_key, tier, confidence DESC, valid_from DESC, recorded_at DESC, "
        "memory_id) INCLUDE (valid_until, compliance_labels) "
        "WHERE consolidation_state IN ('raw', 'consolidated', 'reflected') "
        "AND content IS NOT NULL"
    )
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP INDEX fabric.memory_records_topk")
    op.execute("RESET ROLE")
