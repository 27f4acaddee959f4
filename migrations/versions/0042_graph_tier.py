"""The graph tier's sources: agent lineage links, entities and the records that mention them.

- `fabric.agent_lineage_links`: which agent caused or contributed to which outcome (a
  committed record), each citing the event it was learnt from, a correlation id and,
  once the formation work persists them, its Outcome Envelope (a nullable id, without a
  foreign key until that table exists). Written by domain workflows only
  (`fabric_api.record_agent_link`, granted to the new group role fabric_workflow);
  append-only; projected as `(:Agent)-[:INFLUENCED]->(:Memory)` edges.
- `fabric.entities`: POLE+O entities (person, organization, location, event, object), one
  row per (tenant, type, key), the key being the declared external id or the normalized
  name (or, for a record's subject, the subject). Names stay here: the graph holds a person
  only by its entity id or its subject's pseudonym.
- `fabric.memory_mentions`: record -> entity links (declared, @mention, subject), deleted
  with the record's content (erasure, window closure), projected as MENTIONS edges.
- `fabric.reasoning_steps` and `fabric.step_touches`: a workflow step of a run (agent,
  correlation, Outcome Envelope) and the entities it touched, recorded by domain workflows
  (`fabric_api.record_step`); projected as `(:Agent)-[:TOOK]->(:Step)-[:TOUCHED]->(:Entity)`.

Tenant-first with composite same-tenant keys (distributable by tenant_id). Row-level
security, triggers and functions are replayed from sql/ and rls/ after every migrate.
Roles are cluster-wide: created idempotently, never dropped by a downgrade.

Revision ID: 0042_graph_tier
Revises: 0040_formation
Create Date: 2026-12-04
"""

from alembic import op

revision = "0042_graph_tier"
down_revision = "0040_formation"
branch_labels = None
depends_on = None

UPGRADE = r"""
SET LOCAL ROLE fabric_owner;

-- agent_lineage_links: agent -> outcome causal and contribution links (Group F).
CREATE TABLE fabric.agent_lineage_links (
  tenant_id            fabric.tenant_ident NOT NULL,
  link_id              uuid NOT NULL DEFAULT gen_random_uuid(),
  agent_id             fabric.ident NOT NULL,
  outcome_id           uuid NOT NULL,
  link_kind            text NOT NULL,
  source_event_id      uuid NOT NULL,
  correlation_id       fabric.ident NOT NULL,
  outcome_envelope_id  uuid,
  recorded_by          fabric.ident NOT NULL,
  recorded_at          timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, link_id),
  FOREIGN KEY (tenant_id, agent_id) REFERENCES fabric.tenant_agents (tenant_id, agent_id),
  FOREIGN KEY (tenant_id, outcome_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  CONSTRAINT agent_lineage_links_kind_is_known CHECK (link_kind IN ('caused', 'contributed')),
  CONSTRAINT agent_lineage_links_once
    UNIQUE (tenant_id, agent_id, outcome_id, link_kind, source_event_id)
);
CREATE INDEX agent_lineage_links_by_outcome ON fabric.agent_lineage_links (tenant_id, outcome_id);

-- entities: POLE+O entities per tenant, deduplicated by (type, key).
CREATE TABLE fabric.entities (
  tenant_id    fabric.tenant_ident NOT NULL,
  entity_id    uuid NOT NULL DEFAULT gen_random_uuid(),
  entity_type  text NOT NULL,
  entity_key   text NOT NULL,
  name         text NOT NULL,
  external_id  text,
  subject_id   fabric.ident,
  created_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, entity_id),
  CONSTRAINT entities_type_is_pole_o
    CHECK (entity_type IN ('person', 'organization', 'location', 'event', 'object')),
  CONSTRAINT entities_once_per_key UNIQUE (tenant_id, entity_type, entity_key),
  CONSTRAINT entities_subject_is_a_person CHECK (subject_id IS NULL OR entity_type = 'person')
);
CREATE INDEX entities_by_subject ON fabric.entities (tenant_id, subject_id)
  WHERE subject_id IS NOT NULL;

-- memory_mentions: the entities a record mentions; gone with the record's content.
CREATE TABLE fabric.memory_mentions (
  tenant_id  fabric.tenant_ident NOT NULL,
  memory_id  uuid NOT NULL,
  entity_id  uuid NOT NULL,
  source     text NOT NULL,
  PRIMARY KEY (tenant_id, memory_id, entity_id),
  FOREIGN KEY (tenant_id, memory_id) REFERENCES fabric.memory_records (tenant_id, memory_id),
  FOREIGN KEY (tenant_id, entity_id) REFERENCES fabric.entities (tenant_id, entity_id)
    ON DELETE CASCADE,
  CONSTRAINT memory_mentions_source_is_known CHECK (source IN ('declared', 'mention', 'subject'))
);
CREATE INDEX memory_mentions_by_entity ON fabric.memory_mentions (tenant_id, entity_id);

-- reasoning_steps: a workflow step of a run (its agent, correlation and Outcome Envelope)
-- and the entities it touched; projected as Step nodes with TOUCHED edges.
CREATE TABLE fabric.reasoning_steps (
  tenant_id            fabric.tenant_ident NOT NULL,
  step_id              uuid NOT NULL DEFAULT gen_random_uuid(),
  run_id               uuid NOT NULL,
  agent_id             fabric.ident NOT NULL,
  correlation_id       fabric.ident NOT NULL,
  outcome_envelope_id  uuid,
  event_id             uuid NOT NULL,
  recorded_by          fabric.ident NOT NULL,
  recorded_at          timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, step_id),
  FOREIGN KEY (tenant_id, run_id) REFERENCES fabric.runs (tenant_id, run_id)
);
CREATE INDEX reasoning_steps_by_event ON fabric.reasoning_steps (tenant_id, event_id);
CREATE INDEX reasoning_steps_by_correlation ON fabric.reasoning_steps (tenant_id, correlation_id);
CREATE TABLE fabric.step_touches (
  tenant_id  fabric.tenant_ident NOT NULL,
  step_id    uuid NOT NULL,
  entity_id  uuid NOT NULL,
  PRIMARY KEY (tenant_id, step_id, entity_id),
  FOREIGN KEY (tenant_id, step_id) REFERENCES fabric.reasoning_steps (tenant_id, step_id),
  FOREIGN KEY (tenant_id, entity_id) REFERENCES fabric.entities (tenant_id, entity_id)
    ON DELETE CASCADE
);
CREATE INDEX step_touches_by_entity ON fabric.step_touches (tenant_id, entity_id);
"""

DOWNGRADE = r"""
SET LOCAL ROLE fabric_owner;
DROP TABLE IF EXISTS fabric.step_touches, fabric.reasoning_steps, fabric.memory_mentions,
  fabric.entities, fabric.agent_lineage_links;
"""


def upgrade() -> None:
    op.execute(
        """
        DO $$
        BEGIN
          IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'fabric_workflow') THEN
            CREATE ROLE fabric_workflow NOLOGIN;
          END IF;
        END $$
        """
    )
    op.execute(UPGRADE)
    op.execute("RESET ROLE")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("RESET ROLE")
