"""Projections hold subject pseudonyms: every subject with a record has its key, and both
projections are due for a rebuild.

The projection feeds name a record's subject and session only by pseudonyms under the
subject's key (sql/045_pseudonyms.sql), and a subject's key is now made with its first
record (a trigger, replayed from sql/). Subjects whose records were formed before then and
who never recalled nor had an approval have no key yet: they get one here, so their records
keep being projected. Projections built before this revision hold the ids in clear; when
there are records, both are noted as rebuilding (projection_cursors.rebuild_started_at), so
`memfabric serve` rebuilds them at start and `memfabric verify` reports them until rebuilt
(a rebuild writes the pseudonyms).

Revision ID: 0029_projection_pseudonyms
Revises: 0028_erasure_flags
Create Date: 2026-12-04
"""

from alembic import op

revision = "0029_projection_pseudonyms"
down_revision = "0028_erasure_flags"
branch_labels = None
depends_on = None

# Records are read tenant by tenant (FORCE ROW LEVEL SECURITY holds for the owner too); the
# key and its pseudonym are made as fabric._subject_key makes them.
UPGRADE = r"""
DO $$
DECLARE
  v_tenant text;
  v_records boolean := false;
BEGIN
  FOR v_tenant IN SELECT t.tenant_id FROM fabric.tenants t ORDER BY 1 LOOP
    PERFORM set_config('fabric.tenant_id', v_tenant, true);
    INSERT INTO fabric.subject_keys (tenant_id, subject_id, subject_ref, key)
    SELECT s.tenant_id, s.subject_id,
           'hmac:' || encode(ext.hmac(convert_to('subject:' || s.subject_id, 'UTF8'), s.key,
                                      'sha256'), 'hex'),
           s.key
    FROM (SELECT d.tenant_id, d.subject_id, ext.gen_random_bytes(32) AS key
          FROM (SELECT DISTINCT m.tenant_id, m.subject_id::text AS subject_id
                FROM fabric.memory_records m
                WHERE m.tenant_id = v_tenant AND m.subject_id IS NOT NULL) d) s
    ON CONFLICT (tenant_id, subject_id) DO NOTHING;
    v_records := v_records
                 OR EXISTS (SELECT 1 FROM fabric.memory_records m WHERE m.tenant_id = v_tenant);
  END LOOP;
  PERFORM set_config('fabric.tenant_id', '', true);
  IF v_records THEN
    UPDATE fabric.projection_cursors c
    SET rebuild_started_at = coalesce(c.rebuild_started_at, clock_timestamp())
    WHERE c.projection IN ('qdrant', 'graph');
  END IF;
END $$;
"""


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    # The keys stay: they are what a later subject erasure destroys.
    pass
