"""Same-as merges of entities as reviewed proposals: an approval of action `merge_entities`
(requested by the consolidator, decided by policy) and `fabric.entities.merged_into`, the
entity an approved merge resolved one into. The merged entity stays (its mentions are the
history); the functions are created by the sql/ replay that follows every migrate. No new
table: on Citus both tables are already placed by 0049_citus.

Revision ID: 0051_graph_gaps
Revises: 0050_citus_shard_events
Create Date: 2026-12-04
"""

from alembic import op

revision = "0051_graph_gaps"
down_revision = "0050_citus_shard_events"
branch_labels = None
depends_on = None

# One statement each: Citus sends a distributed table's DDL to its shards as prepared
# statements, which hold one command.
UPGRADE = (
    "ALTER TABLE fabric.approvals DROP CONSTRAINT approvals_action_is_known",
    "ALTER TABLE fabric.approvals ADD CONSTRAINT approvals_action_is_known"
    " CHECK (action IN ('promote', 'supersede', 'erase', 'erase_subject', 'merge_entities'))",
    # merged_into: the entity an approved same-as merge resolved this one into (same
    # tenant); cleared before that entity goes (erasure), never pointing at itself.
    "ALTER TABLE fabric.entities ADD COLUMN merged_into uuid",
    # No ON DELETE SET NULL (Citus refuses it on a key with the distribution column): the
    # statements that delete entities clear what was merged into them first.
    "ALTER TABLE fabric.entities ADD CONSTRAINT entities_merged_into_same_tenant"
    " FOREIGN KEY (tenant_id, merged_into) REFERENCES fabric.entities (tenant_id, entity_id)",
    "ALTER TABLE fabric.entities ADD CONSTRAINT entities_not_merged_into_itself"
    " CHECK (merged_into IS DISTINCT FROM entity_id)",
)


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    for statement in UPGRADE:
        op.execute(statement)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("ALTER TABLE fabric.entities DROP COLUMN IF EXISTS merged_into")
    op.execute("DELETE FROM fabric.approvals WHERE action = 'merge_entities'")
    op.execute("ALTER TABLE fabric.approvals DROP CONSTRAINT approvals_action_is_known")
    op.execute(
        "ALTER TABLE fabric.approvals ADD CONSTRAINT approvals_action_is_known"
        " CHECK (action IN ('promote', 'supersede', 'erase', 'erase_subject'))"
    )
    op.execute("RESET ROLE")
