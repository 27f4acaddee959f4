"""The working tier's hand-off: a proposal says it came from working memory, so that its
commit emits memory.record.promoted (from_tier working) in the same transaction.

Revision ID: 0013_working_tier
Revises: 0012_lexical_recall
Create Date: 2026-12-01
"""

from alembic import op

revision = "0013_working_tier"
down_revision = "0012_lexical_recall"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;
-- Only fabric_api.handoff sets it; a hand-off forms raw episodes by extraction, nothing else.
ALTER TABLE fabric.proposals
  ADD COLUMN from_tier text,
  ADD CONSTRAINT proposals_from_tier_is_working CHECK (from_tier = 'working'),
  ADD CONSTRAINT proposals_handoff_forms_extracted_episodes CHECK (
    from_tier IS NULL OR (tier = 'episodic' AND formation_method = 'extraction'));
-- A hand-off is idempotent per agent and working item (replayed after a resume).
CREATE INDEX proposals_handed_off ON fabric.proposals (tenant_id, proposed_by, source_event_id)
  WHERE from_tier = 'working';
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP TRIGGER IF EXISTS _210_from_tier_guard ON fabric.proposals;
DROP TRIGGER IF EXISTS _910_emit_handoff ON fabric.proposals;
ALTER TABLE fabric.proposals DROP COLUMN from_tier;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
