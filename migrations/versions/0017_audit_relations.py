"""Audit relations: the indexes that serve fabric_audit's set-returning functions.

Each relation reads one tenant by time or by record. Events by tenant and time, recalls
and the record history already have their index; these add approvals by request time,
erasure receipts by erasure time, review flags by the erased record they point at, seals
by time (a month of events joins a month of seals instead of one lookup per event), and
tool denials (a partial index on the outbox, like the one recalls use).

Revision ID: 0017_audit_relations
Revises: 0016_checkpoints
Create Date: 2026-12-01
"""

from alembic import op

revision = "0017_audit_relations"
down_revision = "0016_checkpoints"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;
CREATE INDEX approvals_by_request_time ON fabric.approvals (tenant_id, requested_at);
CREATE INDEX erasure_receipts_by_time ON fabric.erasure_receipts (tenant_id, erased_at);
CREATE INDEX review_flags_by_source ON fabric.review_flags (tenant_id, tombstoned_source);
CREATE INDEX event_seals_by_time ON fabric.event_seals (tenant_id, occurred_at);
CREATE INDEX events_tool_denials ON fabric.events (tenant_id, occurred_at)
  WHERE event_type = 'agent.tool.unauthorized';
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP INDEX IF EXISTS fabric.events_tool_denials;
DROP INDEX IF EXISTS fabric.event_seals_by_time;
DROP INDEX IF EXISTS fabric.review_flags_by_source;
DROP INDEX IF EXISTS fabric.erasure_receipts_by_time;
DROP INDEX IF EXISTS fabric.approvals_by_request_time;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
