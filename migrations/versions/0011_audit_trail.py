"""The audit trail: keyed subject pseudonyms (crypto-shredding) and the sealed event chain.

subject_keys holds one random key per (tenant, subject); events and approvals carry an
HMAC pseudonym of the subject under that key instead of the identifier, and subject
erasure deletes the key. Existing approvals and recall events are rewritten to carry
the pseudonym (before any event is sealed, so the chain never covers a clear subject id).
event_seals links every event of a tenant into a hash chain, in (xid, event_id) order;
event_seal_cursor is how far sealing has gone.

Revision ID: 0011_audit_trail
Revises: 0010_input_hardening
Create Date: 2026-12-01
"""

from alembic import op

revision = "0011_audit_trail"
down_revision = "0010_input_hardening"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

CREATE TABLE fabric.subject_keys (
  tenant_id    fabric.tenant_ident NOT NULL REFERENCES fabric.tenants,
  subject_id   fabric.ident NOT NULL,
  subject_ref  text NOT NULL,
  key          bytea NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, subject_id),
  CONSTRAINT subject_keys_one_subject_per_pseudonym UNIQUE (tenant_id, subject_ref),
  CONSTRAINT subject_keys_key_is_256_bits CHECK (octet_length(key) = 32)
);

-- Keys for every subject named by an approval or a recall event so far.
INSERT INTO fabric.subject_keys (tenant_id, subject_id, subject_ref, key)
SELECT s.tenant_id, s.subject_id,
       'hmac:' || encode(ext.hmac(convert_to('subject:' || s.subject_id, 'UTF8'), s.key, 'sha256'), 'hex'),
       s.key
FROM (SELECT u.tenant_id, u.subject_id, ext.gen_random_bytes(32) AS key
      FROM (SELECT a.tenant_id, a.subject_id::text AS subject_id FROM fabric.approvals a
            WHERE a.subject_id IS NOT NULL
            UNION
            SELECT e.tenant_id, e.payload #>> '{scope,subject_id}' FROM fabric.events e
            WHERE e.event_type IN ('memory.recall.served', 'memory.recall.denied')
              AND e.payload #>> '{scope,subject_id}' IS NOT NULL) u) s;

ALTER TABLE fabric.approvals ADD COLUMN subject_ref text;
UPDATE fabric.approvals a SET subject_ref = k.subject_ref
FROM fabric.subject_keys k WHERE k.tenant_id = a.tenant_id AND k.subject_id = a.subject_id;
ALTER TABLE fabric.approvals DROP CONSTRAINT approvals_bind_one_record_or_one_subject;
ALTER TABLE fabric.approvals DROP COLUMN subject_id;
ALTER TABLE fabric.approvals ADD CONSTRAINT approvals_bind_one_record_or_one_subject CHECK (
  (action = 'erase_subject') = (memory_id IS NULL AND subject_ref IS NOT NULL));

-- Recall events written before pseudonyms: the subject and session ids become pseudonyms
-- and the request hash is re-keyed, so erasing the subject's key unlinks them too.
ALTER TABLE fabric.events DISABLE TRIGGER USER;
UPDATE fabric.events e
SET payload = e.payload || jsonb_build_object(
  'scope', (e.payload -> 'scope') - 'subject_id' - 'session_id' || jsonb_strip_nulls(jsonb_build_object(
    'subject_ref', k.subject_ref,
    'session_ref', 'hmac:' || encode(ext.hmac(convert_to('session:' || (e.payload #>> '{scope,session_id}'), 'UTF8'),
                                              k.key, 'sha256'), 'hex'))),
  'request_hash', 'hmac:' || encode(ext.hmac(convert_to(e.payload ->> 'request_hash', 'UTF8'), k.key, 'sha256'), 'hex'))
FROM fabric.subject_keys k
WHERE e.event_type IN ('memory.recall.served', 'memory.recall.denied')
  AND k.tenant_id = e.tenant_id AND k.subject_id = e.payload #>> '{scope,subject_id}';
ALTER TABLE fabric.events ENABLE TRIGGER USER;

CREATE TABLE fabric.event_seals (
  tenant_id    text NOT NULL,
  seq          bigint NOT NULL,
  event_id     uuid NOT NULL,
  occurred_at  timestamptz NOT NULL,
  xid          xid8 NOT NULL,
  link         text NOT NULL,
  sealed_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, seq),
  CONSTRAINT event_seals_one_per_event UNIQUE (event_id),
  CONSTRAINT event_seals_link_is_sha256 CHECK (link ~ '^[0-9a-f]+$' AND octet_length(link) = 64),
  CONSTRAINT event_seals_seq_from_one CHECK (seq >= 1)
);

CREATE TABLE fabric.event_seal_cursor (
  only_row       boolean PRIMARY KEY DEFAULT true,
  last_xid       xid8 NOT NULL DEFAULT '0',
  last_event_id  uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
  sealed_at      timestamptz,
  CONSTRAINT event_seal_cursor_is_one_row CHECK (only_row)
);
INSERT INTO fabric.event_seal_cursor DEFAULT VALUES;
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP TABLE IF EXISTS fabric.event_seal_cursor, fabric.event_seals CASCADE;
ALTER TABLE fabric.approvals ADD COLUMN subject_id fabric.ident;
UPDATE fabric.approvals a SET subject_id = k.subject_id
FROM fabric.subject_keys k WHERE k.tenant_id = a.tenant_id AND k.subject_ref = a.subject_ref;
-- A subject erased under pseudonyms has no key left: its approval keeps a placeholder.
UPDATE fabric.approvals a SET subject_id = 'erased-subject'
WHERE a.subject_ref IS NOT NULL AND a.subject_id IS NULL;
ALTER TABLE fabric.approvals DROP CONSTRAINT approvals_bind_one_record_or_one_subject;
ALTER TABLE fabric.approvals DROP COLUMN subject_ref;
ALTER TABLE fabric.approvals ADD CONSTRAINT approvals_bind_one_record_or_one_subject CHECK (
  (action = 'erase_subject') = (memory_id IS NULL AND subject_id IS NOT NULL));
DROP TABLE IF EXISTS fabric.subject_keys CASCADE;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
