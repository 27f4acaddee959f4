"""The row rules of proposals and memory_records: one CHECK constraint a table instead of
13 and 15.

PostgreSQL reads a table's CHECK constraints back from their catalog text and plans them
once for every statement that writes the table; for the 28 of these two tables (32 kB of
node text) that was about 150-200 us of CPU per single-row INSERT or UPDATE, three times
in every governed propose + commit. Each table now has one constraint,
`proposals_row_rules` / `memory_records_row_rules`, calling one PL/pgSQL function that
holds the same rules with the same names (`fabric._proposals_row_rules`,
`fabric._memory_records_row_rules`): PL/pgSQL keeps the function's compiled expression for
the session, so a statement reads and plans one function call (docs/benchmarks.md, "One
CHECK constraint a table").

A row that breaks a rule raises what the rule's own constraint raised: SQLSTATE 23514,
the message `new row for relation "<table>" violates check constraint "<rule>"`, and the
rule's name in `constraint_name` (with the table and schema); with several broken, the
first by name, as PostgreSQL checks constraints in name order. A NULL rule passes, as in a
CHECK constraint. Adding the constraint validates every row already stored.

Revision ID: 0025_row_rules
Revises: 0024_hybrid_latency
Create Date: 2026-12-01
"""

from alembic import op

revision = "0025_row_rules"
down_revision = "0024_hybrid_latency"
branch_labels = None
depends_on = None

# Each rule is written as its constraint was (migrations 0002, 0007, 0008, 0013), in the
# order of the names. `WHEN NOT (rule)` skips a rule that is NULL, as a CHECK constraint
# passes it; the CASE stops at the first broken rule.
PROPOSALS_RULES = r"""
CREATE OR REPLACE FUNCTION fabric._proposals_row_rules(
  status text, reason text, tier text, visibility text, content jsonb, content_hash text,
  source_event_id text, formation_method text, supersedes uuid, confidence double precision,
  valid_from timestamptz, valid_until timestamptz, retention_class text, version text,
  committed_by text, memory_id uuid, request_hash text, from_tier text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_broken text;
BEGIN
  v_broken := CASE
    WHEN NOT ((status = 'committed') = (memory_id IS NOT NULL AND committed_by IS NOT NULL))
      THEN 'proposals_committed_name_their_record'
    WHEN NOT (content_hash ~ '^sha256:[0-9a-f]+$' AND octet_length(content_hash) = 71)
      THEN 'proposals_content_hash_format'
    WHEN NOT (jsonb_typeof(content) = 'object')
      THEN 'proposals_content_is_an_object'
    WHEN NOT (formation_method = ANY (ARRAY['extraction'::text, 'declaration'::text,
                                            'consolidation'::text, 'reflection'::text,
                                            'import'::text]))
      THEN 'proposals_formation_method_is_known'
    WHEN NOT (from_tier = 'working')
      THEN 'proposals_from_tier_is_working'
    WHEN NOT (from_tier IS NULL OR (tier = 'episodic' AND formation_method = 'extraction'))
      THEN 'proposals_handoff_forms_extracted_episodes'
    WHEN NOT ((status = 'rejected') = (reason IS NOT NULL))
      THEN 'proposals_rejected_have_a_reason'
    WHEN NOT (request_hash ~ '^sha256:[0-9a-f]+$' AND octet_length(request_hash) = 71)
      THEN 'proposals_request_hash_format'
    WHEN NOT (retention_class = ANY (ARRAY['ephemeral'::text, 'operational'::text,
                                           'durable'::text, 'audit'::text,
                                           'regulated'::text]))
      THEN 'proposals_retention_class_is_known'
    WHEN NOT (status = ANY (ARRAY['validated'::text, 'rejected'::text, 'committed'::text,
                                  'withdrawn'::text]))
      THEN 'proposals_status_is_known'
    WHEN NOT (tier = ANY (ARRAY['episodic'::text, 'semantic'::text, 'procedural'::text,
                                'profile'::text, 'relational'::text]))
      THEN 'proposals_tier_is_known'
    WHEN NOT (status = 'rejected' OR (
                source_event_id IS NOT NULL
                AND confidence BETWEEN 0 AND 1
                AND (valid_until IS NULL OR valid_until > valid_from)
                AND formation_method = ANY (ARRAY['extraction'::text, 'declaration'::text,
                                                  'import'::text])
                AND tier <> 'relational'
                AND supersedes IS NULL
                AND (retention_class <> 'audit' OR tier = 'episodic')
                AND version ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$'))
      THEN 'proposals_validated_obey_formation_rules'
    WHEN NOT (visibility = ANY (ARRAY['session'::text, 'agent'::text, 'subject'::text,
                                      'tenant'::text]))
      THEN 'proposals_visibility_is_known'
  END;
  IF v_broken IS NULL THEN
    RETURN true;
  END IF;
  -- The error of the rule's own CHECK constraint (no DETAIL: the row is not echoed).
  RAISE EXCEPTION USING ERRCODE = 'check_violation',
    MESSAGE = 'new row for relation "proposals" violates check constraint "' || v_broken || '"',
    CONSTRAINT = v_broken, TABLE = 'proposals', SCHEMA = 'fabric';
END $$;
"""

RECORDS_RULES = r"""
CREATE OR REPLACE FUNCTION fabric._memory_records_row_rules(
  tier text, visibility text, scope_key text, content jsonb, content_hash text,
  formation_method text, confidence double precision, valid_from timestamptz,
  valid_until timestamptz, consolidation_state text, retention_class text, version text,
  erased_at timestamptz, erasure_approval_id uuid)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_broken text;
BEGIN
  v_broken := CASE
    WHEN NOT (retention_class <> 'audit' OR tier = 'episodic')
      THEN 'memory_records_audit_retention_only_on_episodic'
    WHEN NOT (confidence >= (0)::double precision AND confidence <= (1)::double precision)
      THEN 'memory_records_confidence_in_unit_interval'
    WHEN NOT (content_hash ~ '^sha256:[0-9a-f]+$' AND octet_length(content_hash) = 71)
      THEN 'memory_records_content_hash_format'
    WHEN NOT (content IS NULL OR jsonb_typeof(content) = 'object')
      THEN 'memory_records_content_is_an_object'
    WHEN NOT (content IS NOT NULL
              OR consolidation_state = ANY (ARRAY['expired'::text, 'tombstoned'::text]))
      THEN 'memory_records_content_only_absent_when_ended'
    WHEN NOT (retention_class <> 'ephemeral')
      THEN 'memory_records_ephemeral_is_never_durable'
    WHEN NOT (formation_method = ANY (ARRAY['extraction'::text, 'declaration'::text,
                                            'consolidation'::text, 'reflection'::text,
                                            'import'::text]))
      THEN 'memory_records_formation_method_is_known'
    WHEN NOT (retention_class = ANY (ARRAY['ephemeral'::text, 'operational'::text,
                                           'durable'::text, 'audit'::text,
                                           'regulated'::text]))
      THEN 'memory_records_retention_class_is_known'
    WHEN NOT (consolidation_state = ANY (ARRAY['raw'::text, 'consolidated'::text,
                                               'reflected'::text, 'superseded'::text,
                                               'expired'::text, 'tombstoned'::text]))
      THEN 'memory_records_state_is_known'
    WHEN NOT (tier = ANY (ARRAY['episodic'::text, 'semantic'::text, 'procedural'::text,
                                'profile'::text, 'relational'::text]))
      THEN 'memory_records_tier_is_known'
    WHEN NOT ((consolidation_state = 'tombstoned')
              = (erased_at IS NOT NULL AND erasure_approval_id IS NOT NULL))
      THEN 'memory_records_tombstone_has_approval'
    WHEN NOT (valid_until IS NULL OR valid_until > valid_from)
      THEN 'memory_records_valid_until_after_valid_from'
    WHEN NOT (version ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$')
      THEN 'memory_records_version_is_semver'
    WHEN NOT (consolidation_state = 'tombstoned' OR scope_key IS NOT NULL)
      THEN 'memory_records_visibility_has_its_id'
    WHEN NOT (visibility = ANY (ARRAY['session'::text, 'agent'::text, 'subject'::text,
                                      'tenant'::text]))
      THEN 'memory_records_visibility_is_known'
  END;
  IF v_broken IS NULL THEN
    RETURN true;
  END IF;
  -- The error of the rule's own CHECK constraint (no DETAIL: the row is not echoed).
  RAISE EXCEPTION USING ERRCODE = 'check_violation',
    MESSAGE = 'new row for relation "memory_records" violates check constraint "'
              || v_broken || '"',
    CONSTRAINT = v_broken, TABLE = 'memory_records', SCHEMA = 'fabric';
END $$;
"""

UPGRADE = r"""
ALTER TABLE fabric.proposals
  DROP CONSTRAINT proposals_committed_name_their_record,
  DROP CONSTRAINT proposals_content_hash_format,
  DROP CONSTRAINT proposals_content_is_an_object,
  DROP CONSTRAINT proposals_formation_method_is_known,
  DROP CONSTRAINT proposals_from_tier_is_working,
  DROP CONSTRAINT proposals_handoff_forms_extracted_episodes,
  DROP CONSTRAINT proposals_rejected_have_a_reason,
  DROP CONSTRAINT proposals_request_hash_format,
  DROP CONSTRAINT proposals_retention_class_is_known,
  DROP CONSTRAINT proposals_status_is_known,
  DROP CONSTRAINT proposals_tier_is_known,
  DROP CONSTRAINT proposals_validated_obey_formation_rules,
  DROP CONSTRAINT proposals_visibility_is_known,
  ADD CONSTRAINT proposals_row_rules CHECK (fabric._proposals_row_rules(
    status, reason, tier, visibility, content, content_hash, source_event_id,
    formation_method, supersedes, confidence, valid_from, valid_until, retention_class,
    version, committed_by, memory_id, request_hash, from_tier));
ALTER TABLE fabric.memory_records
  DROP CONSTRAINT memory_records_audit_retention_only_on_episodic,
  DROP CONSTRAINT memory_records_confidence_in_unit_interval,
  DROP CONSTRAINT memory_records_content_hash_format,
  DROP CONSTRAINT memory_records_content_is_an_object,
  DROP CONSTRAINT memory_records_content_only_absent_when_ended,
  DROP CONSTRAINT memory_records_ephemeral_is_never_durable,
  DROP CONSTRAINT memory_records_formation_method_is_known,
  DROP CONSTRAINT memory_records_retention_class_is_known,
  DROP CONSTRAINT memory_records_state_is_known,
  DROP CONSTRAINT memory_records_tier_is_known,
  DROP CONSTRAINT memory_records_tombstone_has_approval,
  DROP CONSTRAINT memory_records_valid_until_after_valid_from,
  DROP CONSTRAINT memory_records_version_is_semver,
  DROP CONSTRAINT memory_records_visibility_has_its_id,
  DROP CONSTRAINT memory_records_visibility_is_known,
  ADD CONSTRAINT memory_records_row_rules CHECK (fabric._memory_records_row_rules(
    tier, visibility, scope_key, content, content_hash, formation_method, confidence,
    valid_from, valid_until, consolidation_state, retention_class, version, erased_at,
    erasure_approval_id));
"""

# The constraints as they were at 0024 (pg_get_constraintdef of a database at that revision).
DOWNGRADE = r"""
ALTER TABLE fabric.proposals
  DROP CONSTRAINT proposals_row_rules,
  ADD CONSTRAINT proposals_committed_name_their_record
    CHECK ((status = 'committed') = (memory_id IS NOT NULL AND committed_by IS NOT NULL)),
  ADD CONSTRAINT proposals_content_hash_format
    CHECK (content_hash ~ '^sha256:[0-9a-f]+$' AND octet_length(content_hash) = 71),
  ADD CONSTRAINT proposals_content_is_an_object CHECK (jsonb_typeof(content) = 'object'),
  ADD CONSTRAINT proposals_formation_method_is_known
    CHECK (formation_method IN ('extraction', 'declaration', 'consolidation', 'reflection',
                                'import')),
  ADD CONSTRAINT proposals_from_tier_is_working CHECK (from_tier = 'working'),
  ADD CONSTRAINT proposals_handoff_forms_extracted_episodes
    CHECK (from_tier IS NULL OR (tier = 'episodic' AND formation_method = 'extraction')),
  ADD CONSTRAINT proposals_rejected_have_a_reason
    CHECK ((status = 'rejected') = (reason IS NOT NULL)),
  ADD CONSTRAINT proposals_request_hash_format
    CHECK (request_hash ~ '^sha256:[0-9a-f]+$' AND octet_length(request_hash) = 71),
  ADD CONSTRAINT proposals_retention_class_is_known
    CHECK (retention_class IN ('ephemeral', 'operational', 'durable', 'audit', 'regulated')),
  ADD CONSTRAINT proposals_status_is_known
    CHECK (status IN ('validated', 'rejected', 'committed', 'withdrawn')),
  ADD CONSTRAINT proposals_tier_is_known
    CHECK (tier IN ('episodic', 'semantic', 'procedural', 'profile', 'relational')),
  ADD CONSTRAINT proposals_validated_obey_formation_rules CHECK (status = 'rejected' OR (
    source_event_id IS NOT NULL
    AND confidence BETWEEN 0 AND 1
    AND (valid_until IS NULL OR valid_until > valid_from)
    AND formation_method IN ('extraction', 'declaration', 'import')
    AND tier <> 'relational'
    AND supersedes IS NULL
    AND (retention_class <> 'audit' OR tier = 'episodic')
    AND version ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$')),
  ADD CONSTRAINT proposals_visibility_is_known
    CHECK (visibility IN ('session', 'agent', 'subject', 'tenant'));
ALTER TABLE fabric.memory_records
  DROP CONSTRAINT memory_records_row_rules,
  ADD CONSTRAINT memory_records_audit_retention_only_on_episodic
    CHECK (retention_class <> 'audit' OR tier = 'episodic'),
  ADD CONSTRAINT memory_records_confidence_in_unit_interval
    CHECK (confidence >= 0 AND confidence <= 1),
  ADD CONSTRAINT memory_records_content_hash_format
    CHECK (content_hash ~ '^sha256:[0-9a-f]+$' AND octet_length(content_hash) = 71),
  ADD CONSTRAINT memory_records_content_is_an_object
    CHECK (content IS NULL OR jsonb_typeof(content) = 'object'),
  ADD CONSTRAINT memory_records_content_only_absent_when_ended
    CHECK (content IS NOT NULL OR consolidation_state IN ('expired', 'tombstoned')),
  ADD CONSTRAINT memory_records_ephemeral_is_never_durable
    CHECK (retention_class <> 'ephemeral'),
  ADD CONSTRAINT memory_records_formation_method_is_known
    CHECK (formation_method IN ('extraction', 'declaration', 'consolidation', 'reflection',
                                'import')),
  ADD CONSTRAINT memory_records_retention_class_is_known
    CHECK (retention_class IN ('ephemeral', 'operational', 'durable', 'audit', 'regulated')),
  ADD CONSTRAINT memory_records_state_is_known
    CHECK (consolidation_state IN ('raw', 'consolidated', 'reflected', 'superseded', 'expired',
                                   'tombstoned')),
  ADD CONSTRAINT memory_records_tier_is_known
    CHECK (tier IN ('episodic', 'semantic', 'procedural', 'profile', 'relational')),
  ADD CONSTRAINT memory_records_tombstone_has_approval
    CHECK ((consolidation_state = 'tombstoned')
           = (erased_at IS NOT NULL AND erasure_approval_id IS NOT NULL)),
  ADD CONSTRAINT memory_records_valid_until_after_valid_from
    CHECK (valid_until IS NULL OR valid_until > valid_from),
  ADD CONSTRAINT memory_records_version_is_semver
    CHECK (version ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$'),
  ADD CONSTRAINT memory_records_visibility_has_its_id
    CHECK (consolidation_state = 'tombstoned' OR scope_key IS NOT NULL),
  ADD CONSTRAINT memory_records_visibility_is_known
    CHECK (visibility IN ('session', 'agent', 'subject', 'tenant'));
DROP FUNCTION fabric._proposals_row_rules(text, text, text, text, jsonb, text, text, text, uuid,
  double precision, timestamptz, timestamptz, text, text, text, uuid, text, text);
DROP FUNCTION fabric._memory_records_row_rules(text, text, text, jsonb, text, text,
  double precision, timestamptz, timestamptz, text, text, text, timestamptz, uuid);
"""


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(PROPOSALS_RULES)
    op.execute(RECORDS_RULES)
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
