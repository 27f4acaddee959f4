"""Lexical recall's per-lexeme bound: deployment_settings.recall_lexical_top.

A lexeme held by so many records of a resolved scope key that reading its postings would
cost more than walking the key in recall's order (memory_records_topk) contributes only its
first recall_lexical_top holders per tier in that order (most confident, then most recent),
found by that walk; every candidate is still scored by exact BM25 (docs/recall.md, "The
candidate bound"). 0 turns the bound off. The function that reads the setting,
fabric._recall_candidates, is replaced by the sql/ replay that follows every migrate.

Revision ID: 0024_hybrid_latency
Revises: 0023_static_embedder
Create Date: 2026-12-01
"""

from alembic import op

revision = "0024_hybrid_latency"
down_revision = "0023_static_embedder"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(
        "ALTER TABLE fabric.deployment_settings "
        "ADD COLUMN recall_lexical_top integer NOT NULL DEFAULT 50, "
        "ADD CONSTRAINT deployment_settings_lexical_top_is_sane "
        "CHECK (recall_lexical_top BETWEEN 0 AND 1000000)"
    )
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("ALTER TABLE fabric.deployment_settings DROP COLUMN IF EXISTS recall_lexical_top")
    op.execute("RESET ROLE")
