"""Broker tickets: how `memfabric serve` learns who is calling over its socket. A process
connected to PostgreSQL as its own login asks for a ticket (fabric_api.issue_broker_ticket);
the ticket names that login (session_user), lives a minute and is used once. The serve
process, which holds the operational stores of Qdrant Edge, redeems it
(fabric_api.redeem_broker_ticket) and serves that connection as the login the database
named, never as a login the client claims. Only the ticket's hash is stored.

On Citus the table stays a plain table of the coordinator (LOCAL_TABLES), like the outbox:
both functions run where the client and serve connect, and a ticket belongs to no tenant.
The functions are created by the sql/ replay that follows every migrate.

Revision ID: 0052_broker_tickets
Revises: 0051_graph_gaps
Create Date: 2026-12-05
"""

from alembic import op

revision = "0052_broker_tickets"
down_revision = "0051_graph_gaps"
branch_labels = None
depends_on = None

TENANT_TABLES: tuple[str, ...] = ()
REFERENCE_TABLES: tuple[str, ...] = ()
COORDINATOR_TABLES: tuple[str, ...] = ()
LOCAL_TABLES = ("fabric.broker_tickets",)

# One statement each (Citus sends DDL on as single commands).
UPGRADE = (
    "CREATE TABLE fabric.broker_tickets ("
    " ticket_hash bytea PRIMARY KEY,"
    " login name NOT NULL,"
    " issued_at timestamptz NOT NULL DEFAULT now(),"
    " expires_at timestamptz NOT NULL,"
    " CONSTRAINT broker_tickets_expire_after_issue CHECK (expires_at > issued_at))",
    "CREATE INDEX broker_tickets_by_expiry ON fabric.broker_tickets (expires_at)",
)


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    for statement in UPGRADE:
        op.execute(statement)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP TABLE IF EXISTS fabric.broker_tickets")
    op.execute("RESET ROLE")
