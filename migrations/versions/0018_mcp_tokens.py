"""MCP bearer tokens: the orchestrator issues a token for a run it opened; the MCP gateway
resolves it to the run's agent login and run. Only a SHA-256 of the token is stored; a token
expires with its run (or earlier) and can be revoked. fabric_mcp_gateway (NOLOGIN) is the
group role of the gateway's own login: it resolves tokens and reads the request schemas,
nothing else. Roles are cluster-wide: created idempotently, never dropped by a downgrade.

Revision ID: 0018_mcp_tokens
Revises: 0017_audit_relations
Create Date: 2026-12-01
"""

from alembic import op

revision = "0018_mcp_tokens"
down_revision = "0017_audit_relations"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;
CREATE TABLE fabric.mcp_tokens (
  tenant_id    fabric.tenant_ident NOT NULL,
  token_hash   bytea NOT NULL,
  run_id       uuid NOT NULL,
  agent_id     fabric.ident NOT NULL,
  issued_by    name NOT NULL DEFAULT session_user,
  issued_at    timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL,
  revoked_at   timestamptz,
  PRIMARY KEY (tenant_id, token_hash),
  FOREIGN KEY (tenant_id, run_id) REFERENCES fabric.runs ON DELETE CASCADE,
  CONSTRAINT mcp_tokens_hash_is_sha256 CHECK (octet_length(token_hash) = 32),
  CONSTRAINT mcp_tokens_expire_after_issue CHECK (expires_at > issued_at),
  CONSTRAINT mcp_tokens_revoked_after_issue CHECK (revoked_at >= issued_at)
);
CREATE UNIQUE INDEX mcp_tokens_by_hash ON fabric.mcp_tokens (token_hash);
CREATE INDEX mcp_tokens_by_run ON fabric.mcp_tokens (tenant_id, run_id);
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP FUNCTION IF EXISTS fabric_api.issue_mcp_token(uuid, interval);
DROP FUNCTION IF EXISTS fabric_api.revoke_mcp_token(text);
DROP FUNCTION IF EXISTS fabric_api.resolve_mcp_token(text);
DROP FUNCTION IF EXISTS fabric_api.request_schema(text);
DROP FUNCTION IF EXISTS fabric._mcp_token_hash(text);
SET LOCAL ROLE fabric_lookup;
DROP FUNCTION IF EXISTS fabric._tenant_of_mcp_token(bytea);
SET LOCAL ROLE fabric_owner;
DROP TABLE fabric.mcp_tokens;
"""


def upgrade() -> None:
    op.execute(
        """
        DO $$
        BEGIN
          IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'fabric_mcp_gateway') THEN
            CREATE ROLE fabric_mcp_gateway NOLOGIN;
          END IF;
        END $$
        """
    )
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
