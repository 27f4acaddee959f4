"""Input hardening: identifiers are printable Unicode, NFC, without format characters, in any
locale; propose is idempotent on (tenant_id, proposed_by, source_event_id, content_hash).

The identifier rule names its characters by code point, so it does not depend on the
database's ctype locale (whose [:space:] and [:cntrl:] let U+200B, U+202E or U+FEFF through
under C.UTF-8). Refused: controls (Cc), separators (Zs, Zl, Zp, so every space), format
characters (Cf: bidi overrides, zero-width, BOM, tags), private use (Co), unassigned code
points (Cn), and text that is not in Unicode normalization form C.

request_hash is the digest of what a proposal asked for beyond its key (see
fabric._request_hash); proposals filed before this revision have none and keep no key.

Revision ID: 0010_input_hardening
Revises: 0009_maintainer
Create Date: 2026-12-01
"""

from alembic import op

revision = "0010_input_hardening"
down_revision = "0009_maintainer"
branch_labels = None
depends_on = None

# Cc and space (0001-0020, 007F-00A0), soft hyphen, Arabic and Syriac format marks, Ogham
# space, Mongolian vowel separator, the 2000-200F spaces and zero-width marks, line and
# paragraph separators, bidi embeddings and overrides (202A-202E), narrow no-break space,
# 205F-206F (math space, invisible operators, bidi isolates), ideographic space, private
# use, BOM, interlinear annotation, Kaithi and Egyptian format marks, shorthand format
# controls, musical symbol formatting, tags, and the supplementary private use planes.
IDENT_CHECK = r"""
  CHECK (VALUE ~ '^[^\u0001-\u0020\u007F-\u00A0\u00AD\u0600-\u0605\u061C\u06DD\u070F\u0890-\u0891\u08E2\u1680\u180E\u2000-\u200F\u2028-\u202F\u205F-\u206F\u3000\uE000-\uF8FF\uFEFF\uFFF9-\uFFFB\U000110BD\U000110CD\U00013430-\U0001343F\U0001BCA0-\U0001BCA3\U0001D173-\U0001D17A\U000E0001\U000E0020-\U000E007F\U000F0000-\U0010FFFF]+$'
         AND length(VALUE) <= 200
         AND VALUE IS NFC NORMALIZED
         AND unicode_assigned(VALUE))
"""

UPGRADE = rf"""
SET LOCAL ROLE fabric_owner;
ALTER DOMAIN fabric.ident DROP CONSTRAINT ident_is_short_and_printable;
ALTER DOMAIN fabric.ident ADD CONSTRAINT ident_is_short_and_printable {IDENT_CHECK};
ALTER TABLE fabric.proposals ADD COLUMN request_hash text;
ALTER TABLE fabric.proposals ADD CONSTRAINT proposals_request_hash_format
  CHECK (request_hash ~ '^sha256:[0-9a-f]+$' AND octet_length(request_hash) = 71);
CREATE UNIQUE INDEX proposals_idempotency_key
  ON fabric.proposals (tenant_id, proposed_by, source_event_id, content_hash)
  WHERE request_hash IS NOT NULL;
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP INDEX fabric.proposals_idempotency_key;
ALTER TABLE fabric.proposals DROP COLUMN request_hash;
ALTER DOMAIN fabric.ident DROP CONSTRAINT ident_is_short_and_printable;
ALTER DOMAIN fabric.ident ADD CONSTRAINT ident_is_short_and_printable
  CHECK (VALUE ~ '^[^[:space:][:cntrl:]]+$' AND length(VALUE) <= 200);
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
