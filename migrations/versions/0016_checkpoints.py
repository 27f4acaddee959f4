"""LangGraph's checkpoints, kept apart from memory: the `langgraph` schema with the tables
of the pinned langgraph-checkpoint-postgres, and fabric_checkpointer, the role that may
read and write them (DML only).

PINNED_MIGRATIONS is that package's own migration list, verbatim, for the pinned version;
tests/integration/test_langgraph_checkpointer.py fails when the installed package's list
drifts from it. Its `checkpoint_migrations` table is filled as if the package's setup() had
run, so a setup() run by mistake changes nothing. Its indexes are built without
CONCURRENTLY (the tables are new and empty, and a migration is one transaction).
Roles are cluster-wide: created idempotently, never dropped by a downgrade.

Revision ID: 0016_checkpoints
Revises: 0015_schema_revision
Create Date: 2026-12-01
"""

from alembic import op

revision = "0016_checkpoints"
down_revision = "0015_schema_revision"
branch_labels = None
depends_on = None

SCHEMA = "langgraph"
PINNED_VERSION = "3.2.0"  # langgraph-checkpoint-postgres
PINNED_MIGRATIONS = [
    """CREATE TABLE IF NOT EXISTS checkpoint_migrations (
    v INTEGER PRIMARY KEY
);""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    type TEXT,
    checkpoint JSONB NOT NULL,
    metadata JSONB NOT NULL DEFAULT '{}',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);""",
    """CREATE TABLE IF NOT EXISTS checkpoint_blobs (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    blob BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);""",
    """CREATE TABLE IF NOT EXISTS checkpoint_writes (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    type TEXT,
    blob BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);""",
    "ALTER TABLE checkpoint_blobs ALTER COLUMN blob DROP not null;",
    # NOTE: this is a no-op migration to ensure that the versions in the migrations table are correct.
    # This is necessary due to an empty migration previously added to the list.
    "SELECT 1;",
    """
    CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoints_thread_id_idx ON checkpoints(thread_id);
    """,
    """
    CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoint_blobs_thread_id_idx ON checkpoint_blobs(thread_id);
    """,
    """
    CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoint_writes_thread_id_idx ON checkpoint_writes(thread_id);
    """,
    """ALTER TABLE checkpoint_writes ADD COLUMN IF NOT EXISTS task_path TEXT NOT NULL DEFAULT '';""",
]


def upgrade() -> None:
    op.execute(
        """
        DO $$
        BEGIN
          IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'fabric_checkpointer') THEN
            CREATE ROLE fabric_checkpointer NOLOGIN;
          END IF;
        END $$
        """
    )
    op.execute(f"CREATE SCHEMA {SCHEMA} AUTHORIZATION fabric_owner")
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(f"SET LOCAL search_path = {SCHEMA}")
    for step in PINNED_MIGRATIONS:
        op.execute(step.replace("CONCURRENTLY ", ""))
    op.execute(
        "INSERT INTO checkpoint_migrations (v) "
        f"SELECT generate_series(0, {len(PINNED_MIGRATIONS) - 1})"
    )
    # Retention and erasure find a thread's tenant, subject and age without reading state.
    op.execute(
        "CREATE INDEX checkpoints_by_subject ON checkpoints "
        "((metadata ->> 'tenant_id'), (metadata ->> 'subject_id'))"
    )
    op.execute("RESET search_path")
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    op.execute("RESET ROLE")
