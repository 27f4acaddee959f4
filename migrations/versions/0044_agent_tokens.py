"""Agent tokens: a bearer token bound to a run template that an orchestrator fixes when it
issues the token (tenant, agent, subject, session policy, tool set, the longest run), with
which the MCP gateway's own login opens and renews runs for the agent; `runs.token_id` says
which token opened a run. Only a SHA-256 of each token is stored. The functions are created
by the sql/ replay that follows every migrate.

Revision ID: 0044_agent_tokens
Revises: 0043_formation_gaps
Create Date: 2026-12-04
"""

from alembic import op

revision = "0044_agent_tokens"
down_revision = "0043_formation_gaps"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;
CREATE TABLE fabric.agent_tokens (
  tenant_id        fabric.tenant_ident NOT NULL,
  token_id         uuid NOT NULL DEFAULT gen_random_uuid(),
  token_hash       bytea NOT NULL,
  agent_id         fabric.ident NOT NULL,
  subject_id       fabric.ident,
  session_id       fabric.ident,
  active_tool_set  text[] NOT NULL,
  run_ttl          interval NOT NULL,
  issued_by        name NOT NULL DEFAULT session_user,
  issued_at        timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz NOT NULL,
  revoked_at       timestamptz,
  PRIMARY KEY (tenant_id, token_id),
  FOREIGN KEY (tenant_id, agent_id) REFERENCES fabric.tenant_agents,
  CONSTRAINT agent_tokens_hash_is_sha256 CHECK (octet_length(token_hash) = 32),
  CONSTRAINT agent_tokens_run_ttl_at_most_7_days
    CHECK (run_ttl > interval '0' AND run_ttl <= interval '7 days'),
  CONSTRAINT agent_tokens_expire_after_issue CHECK (expires_at > issued_at),
  CONSTRAINT agent_tokens_revoked_after_issue CHECK (revoked_at >= issued_at)
);
CREATE UNIQUE INDEX agent_tokens_by_hash ON fabric.agent_tokens (token_hash);
ALTER TABLE fabric.runs ADD COLUMN token_id uuid;
ALTER TABLE fabric.runs ADD CONSTRAINT runs_token_of_the_same_tenant
  FOREIGN KEY (tenant_id, token_id) REFERENCES fabric.agent_tokens (tenant_id, token_id);
CREATE INDEX runs_by_token ON fabric.runs (tenant_id, token_id) WHERE token_id IS NOT NULL;
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP FUNCTION IF EXISTS fabric_api.issue_agent_token(text, text, text, text, text[], interval,
  interval);
DROP FUNCTION IF EXISTS fabric_api.revoke_agent_token(text, uuid);
DROP FUNCTION IF EXISTS fabric_api.open_token_run(text);
DROP FUNCTION IF EXISTS fabric._agent_token_hash(text);
SET LOCAL ROLE fabric_lookup;
DROP FUNCTION IF EXISTS fabric._tenant_of_agent_token(bytea);
SET LOCAL ROLE fabric_owner;
ALTER TABLE fabric.runs DROP COLUMN IF EXISTS token_id;
DROP TABLE fabric.agent_tokens;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
