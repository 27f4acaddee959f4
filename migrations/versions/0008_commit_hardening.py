"""Commit hardening: a subject's erasure withdraws its uncommitted proposals (status
`withdrawn`), and review flags get an id and a recorded resolution.

Revision ID: 0008_commit_hardening
Revises: 0007
Create Date: 2026-12-01
"""

from alembic import op

revision = "0008_commit_hardening"
down_revision = "0007"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;
ALTER TABLE fabric.proposals DROP CONSTRAINT proposals_status_is_known,
  ADD CONSTRAINT proposals_status_is_known
  CHECK (status IN ('validated', 'rejected', 'committed', 'withdrawn'));

-- A flag is resolved once, by the consolidator, with one of two decisions.
ALTER TABLE fabric.review_flags
  ADD COLUMN flag_id uuid NOT NULL DEFAULT gen_random_uuid(),
  ADD COLUMN resolution text,
  ADD COLUMN resolved_by fabric.ident,
  ADD COLUMN resolution_reason text,
  ADD CONSTRAINT review_flags_flag_id_is_unique UNIQUE (flag_id),
  ADD CONSTRAINT review_flags_resolution_is_known
    CHECK (resolution IN ('keep', 'request_erasure')),
  ADD CONSTRAINT review_flags_resolved_flags_say_how CHECK (
    (resolved_at IS NULL) = (resolution IS NULL)
    AND (resolved_at IS NULL) = (resolved_by IS NULL)
    AND (resolved_at IS NULL) = (resolution_reason IS NULL));
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
ALTER TABLE fabric.review_flags
  DROP COLUMN flag_id, DROP COLUMN resolution, DROP COLUMN resolved_by,
  DROP COLUMN resolution_reason;
UPDATE fabric.proposals SET status = 'rejected', reason = 'withdrawn: the data subject was erased'
WHERE status = 'withdrawn';
ALTER TABLE fabric.proposals DROP CONSTRAINT proposals_status_is_known,
  ADD CONSTRAINT proposals_status_is_known
  CHECK (status IN ('validated', 'rejected', 'committed'));
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
