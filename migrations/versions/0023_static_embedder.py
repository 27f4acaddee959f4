"""A third deployment embedder: minilm-static, a token table derived from the pinned MiniLM
artefacts (memfabric.embedding.StaticMiniLMEmbedder), for deployments whose projection must
embed faster than the model can on their cores (docs/benchmarks.md, "Keeping up").

Only the list of known embedders changes. A deployment that switches embedder gets new
collections and a cutover (rebuild), as for any other change of model or version.

Revision ID: 0023_static_embedder
Revises: 0022_recall_latency
Create Date: 2026-12-01
"""

from alembic import op

revision = "0023_static_embedder"
down_revision = "0022_recall_latency"
branch_labels = None
depends_on = None


def _known(embedders: str) -> str:
    return (
        "ALTER TABLE fabric.deployment_settings "
        "DROP CONSTRAINT deployment_settings_embedder_is_known, "
        "ADD CONSTRAINT deployment_settings_embedder_is_known "
        f"CHECK (embedder IN ({embedders}))"
    )


def upgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(_known("'minilm', 'minilm-static', 'http'"))
    op.execute("RESET ROLE")


def downgrade() -> None:
    # Refused (23514) while the deployment uses minilm-static: switch embedder first.
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute(_known("'minilm', 'http'"))
    op.execute("RESET ROLE")
