"""A review flag on a record that is itself erased is closed by that erasure: resolution
`erased` (fabric._tombstone sets it, with the erasing committer and a reason), so no flag
stays open on a tombstone, whichever of a source and its derived record is erased first.
The functions are replaced by the sql/ replay that follows every migrate.

Revision ID: 0028_erasure_flags
Revises: 0027_chain_head
Create Date: 2026-12-04
"""

from alembic import op

revision = "0028_erasure_flags"
down_revision = "0027_chain_head"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;
ALTER TABLE fabric.review_flags DROP CONSTRAINT review_flags_resolution_is_known,
  ADD CONSTRAINT review_flags_resolution_is_known
    CHECK (resolution IN ('keep', 'request_erasure', 'erased'));
"""

# Flags closed by an erasure open again (the state before this revision: an open flag on a
# tombstone), so the older constraint holds.
DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DO $$
DECLARE
  v_tenant text;
BEGIN
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t ORDER BY 1 LOOP
    PERFORM pg_catalog.set_config('fabric.tenant_id', v_tenant, true);  -- review_flags is FORCE RLS
    UPDATE fabric.review_flags f
    SET resolved_at = NULL, resolution = NULL, resolved_by = NULL, resolution_reason = NULL
    WHERE f.tenant_id = v_tenant AND f.resolution = 'erased';
  END LOOP;
  PERFORM pg_catalog.set_config('fabric.tenant_id', '', true);
END $$;
ALTER TABLE fabric.review_flags DROP CONSTRAINT review_flags_resolution_is_known,
  ADD CONSTRAINT review_flags_resolution_is_known
    CHECK (resolution IN ('keep', 'request_erasure'));
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
