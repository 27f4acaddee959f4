"""Memory that forms itself: the Outcome Envelope of each consolidation run, contradiction
flags, and the recommendation kinds and states of reflect-and-revise formation.

- `fabric.consolidation_outcomes`: one append-only row per WF-OS-MEMORY-CONSOLIDATE run (what
  was read, proposed, refused, flagged, approved, committed, deferred; the model and its cost;
  identifiers and counts, never content), with the candidate cursor the next run starts after.
- `fabric.contradiction_flags`: an assertion an inference may not retire (a declaration)
  contradicted by episodes: both sides (the standing record, the recommendation that carries
  the contradicting assertion and its episodes) for review.
- `fabric.recommendations`: kind `corroboration` (episodes that support a live assertion),
  status `flagged` (a contradiction filed for review), `approval_id` (the policy approval a
  recommendation waits for; a later run resumes it).

The functions are replaced by the sql/ replay that follows every migrate.

Revision ID: 0040_formation
Revises: 0029_projection_pseudonyms
Create Date: 2026-12-04
"""

from alembic import op

revision = "0040_formation"
down_revision = "0029_projection_pseudonyms"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

ALTER TABLE fabric.recommendations
  DROP CONSTRAINT recommendations_kind_is_known,
  ADD CONSTRAINT recommendations_kind_is_known
    CHECK (kind IN ('consolidation', 'reflection', 'promotion', 'distillation', 'corroboration')),
  DROP CONSTRAINT recommendations_status_is_known,
  ADD CONSTRAINT recommendations_status_is_known
    CHECK (status IN ('pending', 'committed', 'rejected', 'flagged')),
  DROP CONSTRAINT recommendations_rejected_have_a_reason,
  ADD CONSTRAINT recommendations_rejected_have_a_reason
    CHECK ((status IN ('rejected', 'flagged')) = (reason IS NOT NULL)),
  ADD COLUMN approval_id uuid;

CREATE TABLE fabric.contradiction_flags (
  tenant_id          fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  flag_id            uuid NOT NULL DEFAULT gen_random_uuid(),
  memory_id          uuid NOT NULL,
  recommendation_id  uuid NOT NULL,
  flagged_at         timestamptz NOT NULL DEFAULT now(),
  resolved_at        timestamptz,
  resolution         text,
  PRIMARY KEY (tenant_id, flag_id),
  UNIQUE (tenant_id, recommendation_id),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, recommendation_id)
    REFERENCES fabric.recommendations (tenant_id, recommendation_id),
  CONSTRAINT contradiction_flags_resolution_is_known
    CHECK (resolution IS NULL OR resolution IN ('keep', 'supersede')),
  CONSTRAINT contradiction_flags_resolved_have_a_resolution
    CHECK ((resolved_at IS NULL) = (resolution IS NULL))
);

CREATE TABLE fabric.consolidation_outcomes (
  tenant_id           fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  workflow_event_id   uuid NOT NULL,
  recorded_by         fabric.ident NOT NULL,
  recorded_at         timestamptz NOT NULL DEFAULT now(),
  through_recorded_at timestamptz,
  through_memory_id   uuid,
  envelope            jsonb NOT NULL,
  PRIMARY KEY (tenant_id, workflow_event_id),
  CONSTRAINT consolidation_outcomes_envelope_is_an_object
    CHECK (jsonb_typeof(envelope) = 'object'),
  CONSTRAINT consolidation_outcomes_cursor_is_whole
    CHECK ((through_recorded_at IS NULL) = (through_memory_id IS NULL))
);
CREATE INDEX consolidation_outcomes_by_time
  ON fabric.consolidation_outcomes (tenant_id, recorded_at);
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP TABLE IF EXISTS fabric.consolidation_outcomes;
DROP TABLE IF EXISTS fabric.contradiction_flags;
DELETE FROM fabric.recommendations WHERE kind = 'corroboration' OR status = 'flagged';
ALTER TABLE fabric.recommendations
  DROP COLUMN IF EXISTS approval_id,
  DROP CONSTRAINT recommendations_kind_is_known,
  ADD CONSTRAINT recommendations_kind_is_known
    CHECK (kind IN ('consolidation', 'reflection', 'promotion', 'distillation')),
  DROP CONSTRAINT recommendations_status_is_known,
  ADD CONSTRAINT recommendations_status_is_known
    CHECK (status IN ('pending', 'committed', 'rejected')),
  DROP CONSTRAINT recommendations_rejected_have_a_reason,
  ADD CONSTRAINT recommendations_rejected_have_a_reason
    CHECK ((status = 'rejected') = (reason IS NOT NULL));
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
