"""Roles and schemas.

Roles are cluster-wide, so they are created idempotently and a downgrade never drops one.
The migration role (fabric_migrator: LOGIN, CREATEROLE, BYPASSRLS) is made by the
superuser bootstrap; it creates every other role here. fabric_owner owns every object and
is neither superuser nor BYPASSRLS, so FORCE ROW LEVEL SECURITY holds inside the API.
fabric_lookup is the narrow BYPASSRLS owner of the tenant-of-id lookups.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# (role, attributes): group roles, none of them can log in.
ROLES = [
    ("fabric_owner", "NOLOGIN"),
    ("fabric_lookup", "NOLOGIN BYPASSRLS"),
    ("fabric_admin", "NOLOGIN"),
    ("fabric_orchestrator", "NOLOGIN"),
    ("fabric_agent", "NOLOGIN"),
    ("fabric_committer", "NOLOGIN"),
    ("fabric_consolidator", "NOLOGIN"),
    ("fabric_policy", "NOLOGIN"),
    ("fabric_auditor", "NOLOGIN"),
    ("fabric_projector", "NOLOGIN"),
]


def upgrade() -> None:
    for role, attrs in ROLES:
        op.execute(
            f"""
            DO $$
            BEGIN
              IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = '{role}') THEN
                CREATE ROLE {role} {attrs};
              END IF;
            END $$
            """
        )
    # The migration role becomes the owner and the lookup owner while it migrates.
    op.execute("GRANT fabric_owner TO CURRENT_USER WITH INHERIT FALSE, SET TRUE")
    op.execute("GRANT fabric_lookup TO CURRENT_USER WITH INHERIT FALSE, SET TRUE")
    # register_agent (owned by fabric_owner) makes each agent login a member of fabric_agent.
    op.execute("GRANT fabric_agent TO fabric_owner WITH ADMIN TRUE, INHERIT FALSE, SET FALSE")
    for schema in ("fabric", "fabric_api", "fabric_audit"):
        op.execute(f"CREATE SCHEMA {schema} AUTHORIZATION fabric_owner")
    # Functions are executable by nobody until sql/ grants them by group role.
    op.execute("SET LOCAL ROLE fabric_lookup")
    op.execute(
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_lookup REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC"
    )
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("REVOKE ALL ON SCHEMA fabric, fabric_api, fabric_audit FROM PUBLIC")
    op.execute("GRANT USAGE, CREATE ON SCHEMA fabric TO fabric_lookup")
    op.execute(
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC"
    )
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP SCHEMA IF EXISTS fabric_audit, fabric_api, fabric CASCADE")
    op.execute(
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_owner GRANT EXECUTE ON FUNCTIONS TO PUBLIC"
    )
    op.execute("SET LOCAL ROLE fabric_lookup")
    op.execute(
        "ALTER DEFAULT PRIVILEGES FOR ROLE fabric_lookup GRANT EXECUTE ON FUNCTIONS TO PUBLIC"
    )
    op.execute("RESET ROLE")
