"""The temporal tier's measurements and the tool agents read them with; an index of
supersession for replaying a procedure as it was.

`fabric.measurements` holds time series (what the intelligence agents consume): tenant
first, range-partitioned on the measurement's time, each point with its retention class.
Agents read it only through `fabric_api.read_measurements` (tool `tool:temporal-read`,
authorized in three layers like every tool); producers write it through
`fabric_api.record_measurements`; `fabric_api.run_temporal_retention` removes what its
class no longer keeps. The functions are created by the sql/ replay that follows every
migrate. On Citus the table is distributed by tenant_id with the other tenant tables by the
distribution step that follows (revision 0049_citus).

Revision ID: 0048_ops_temporal
Revises: 0046_e5_embedder
Create Date: 2026-12-04
"""

from alembic import op

revision = "0048_ops_temporal"
down_revision = "0046_e5_embedder"
branch_labels = None
depends_on = None

UPGRADE = """
SET LOCAL ROLE fabric_owner;

-- measurements: the temporal tier's points. series names what is measured (dotted, e.g.
-- trading.fill_latency_ms); subject_id NULL is a tenant-level series; business_instance_id
-- NULL is the tenant's default instance. Range-partitioned on at, so retention drops old
-- ranges and a time-series engine can take the table's place behind the same functions.
CREATE TABLE fabric.measurements (
  tenant_id             text NOT NULL,
  series                text NOT NULL,
  at                    timestamptz NOT NULL,
  value                 double precision NOT NULL,
  business_instance_id  text,
  subject_id            text,
  retention_class       text NOT NULL,
  producer              text NOT NULL,
  recorded_at           timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT measurements_tenant_id_is_a_tenant_ident
    CHECK (CAST(tenant_id AS fabric.tenant_ident) IS NOT NULL),
  CONSTRAINT measurements_series_is_dotted
    CHECK (series ~ '^[a-z][a-z0-9_]*(\\.[a-z0-9_]+)+$' AND length(series) <= 200),
  CONSTRAINT measurements_value_is_finite
    CHECK (value NOT IN ('NaN'::double precision, 'Infinity', '-Infinity')),
  CONSTRAINT measurements_retention_is_known
    CHECK (retention_class IN ('operational', 'durable'))
) PARTITION BY RANGE (at);
CREATE TABLE fabric.measurements_default PARTITION OF fabric.measurements DEFAULT;
CREATE INDEX measurements_by_series ON fabric.measurements (tenant_id, series, at);

-- A procedure's successors, for fabric_api.recall_procedure_as_of (its ancestors are
-- reached by primary key).
CREATE INDEX memory_records_by_supersedes ON fabric.memory_records (tenant_id, supersedes)
  WHERE supersedes IS NOT NULL;

INSERT INTO fabric.tools (tool_id, agent_id, description) VALUES
  ('tool:temporal-read', 'os-agt-012',
   'read time-series measurements of the run''s tenant and subject, aggregated by window')
ON CONFLICT (tool_id) DO NOTHING;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute("SET LOCAL ROLE fabric_owner")
    op.execute("DROP TABLE IF EXISTS fabric.measurements CASCADE")
    op.execute("DROP INDEX IF EXISTS fabric.memory_records_by_supersedes")
    op.execute("DELETE FROM fabric.tenant_agent_tools WHERE tool_id = 'tool:temporal-read'")
    op.execute("DELETE FROM fabric.tools WHERE tool_id = 'tool:temporal-read'")
    op.execute("RESET ROLE")
