"""On a Citus cluster, the fabric is distributed: tenant tables by tenant_id, colocated;
the global registries are reference tables. On plain PostgreSQL this revision does nothing.

The lists below are the one place that says where each fabric table lives on Citus; a test
(tests/sql/test_citus_layout.py) fails when a table of schema fabric is in none of them,
so a table added later must be placed here (or in a later revision of the same shape):

- TENANT_TABLES: every table that starts with tenant_id, distributed by it and colocated
  with fabric.tenant_agents, in an order where a foreign key's target comes first;
- REFERENCE_TABLES: registries without a tenant (tenants, agents, tools, ...), copied to
  every node, so a tenant table may point at them;
- COORDINATOR_TABLES: tables kept on the coordinator and added to Citus's metadata, so
  every node can reach them (none yet);
- LOCAL_TABLES: tables left as they are, plain tables of the coordinator: the event outbox
  and its partitions (one global order read by the workers; Citus refuses to add its
  partitions to its metadata as they are: where the outbox lives on a cluster is part two
  of the scale-out).

The revisions before this one build the fabric on the coordinator alone (migrations/env.py
turns DDL propagation off until the fabric is distributed); distributing a table makes
Citus create its shards and everything it depends on (schema, owner, functions, types) on
the workers. Every function of the fabric's schemas is then distributed as well (created
on every node), because a trigger or policy on a shard calls helpers that no catalog
dependency names. DDL propagation is on again after this revision.

Revision ID: 0049_citus
Revises: 0048_ops_temporal
Create Date: 2026-12-04
"""

from alembic import op
from sqlalchemy import text

revision = "0049_citus"
down_revision = "0048_ops_temporal"
branch_labels = None
depends_on = None

COLOCATE_WITH = "fabric.tenant_agents"

TENANT_TABLES = (
    "fabric.tenant_agents",
    "fabric.tenant_agent_tools",
    "fabric.agent_tokens",
    "fabric.runs",
    "fabric.proposals",
    "fabric.memory_records",
    "fabric.memory_lineage",
    "fabric.memory_record_versions",
    "fabric.memory_embeddings",
    "fabric.approvals",
    "fabric.erasure_receipts",
    "fabric.review_flags",
    "fabric.recommendations",
    "fabric.instance_config",
    "fabric.subject_keys",
    "fabric.mcp_tokens",
    "fabric.search_stats",
    "fabric.temporal_summaries",
    "fabric.event_seals",
    "fabric.consolidation_outcomes",
    "fabric.contradiction_flags",
    "fabric.entities",
    "fabric.memory_mentions",
    "fabric.agent_lineage_links",
    "fabric.reasoning_steps",
    "fabric.step_touches",
    "fabric.memory_corroborations",
    "fabric.measurements",
)

REFERENCE_TABLES = (
    "fabric.tenants",
    "fabric.agents",
    "fabric.tools",
    "fabric.promotion_edges",
    "fabric.domain_pack_defaults",
    "fabric.deployment_settings",
    "fabric.projection_cursors",
)

COORDINATOR_TABLES: tuple[str, ...] = ()

LOCAL_TABLES = ("fabric.events",)

# Unique across the fabric on one node, unique within the tenant on Citus (a distributed
# table's unique keys include its distribution column): each value is random (a uuid, an
# event id, the hash of a random token), so the two are the same rule in practice.
# (table, unique constraint, column)
TENANT_UNIQUE = (
    ("fabric.review_flags", "review_flags_flag_id_is_unique", "flag_id"),
    ("fabric.event_seals", "event_seals_one_per_event", "event_id"),
)
# (table, unique index, column)
TENANT_UNIQUE_INDEXES = (
    ("fabric.mcp_tokens", "mcp_tokens_by_hash", "token_hash"),
    ("fabric.agent_tokens", "agent_tokens_by_hash", "token_hash"),
)

# On Citus the distribution column is text, not the fabric.tenant_ident domain: Citus
# prunes shards wrongly on a domain-typed column compared with text (`tenant_id = $1`
# with a text parameter finds no shard at all), and colocates only columns of one type
# (search_stats, temporal_summaries and event_seals hold text). The domain's rules stay:
# a check casts the value to the domain, which raises the domain's own constraint.
DOMAIN = "fabric.tenant_ident"

# The fabric's functions, created on every node.
FUNCTION_SCHEMAS = ("fabric", "fabric_api", "fabric_audit")


def _citus(bind) -> bool:  # type: ignore[no-untyped-def]
    row = bind.execute(
        text("SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'")
    ).first()
    return row is not None


def upgrade() -> None:
    bind = op.get_bind()
    if not _citus(bind):
        return
    op.execute("SET citus.enable_ddl_propagation TO on")
    op.execute("SET citus.enable_create_role_propagation TO on")
    # This revision's own SET LOCALs (the role above all) stay on the coordinator.
    op.execute("SET LOCAL citus.propagate_set_commands TO none")
    # The fabric's row triggers run on the shards; Citus asks for this to allow them.
    op.execute("SET LOCAL citus.enable_unsafe_triggers TO on")
    op.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
    # The fabric's group roles and their memberships, then its schemas, on every worker
    # (made on the coordinator alone by the revisions before this one), from the catalog's
    # own names; Citus finds the schemas there when it distributes the first table.
    failed = bind.execute(
        text(
            """
            WITH fabric_roles AS (
              SELECT oid, rolname, rolcanlogin, rolbypassrls FROM pg_catalog.pg_roles
              WHERE rolname LIKE 'fabric\\_%'),
            commands AS (
              SELECT 1 AS step, pg_catalog.format(
                'SET citus.enable_create_role_propagation TO off; DO $do$ BEGIN '
                'IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = %L) THEN '
                'CREATE ROLE %I %s %s; END IF; END $do$',
                rolname, rolname, CASE WHEN rolcanlogin THEN 'LOGIN' ELSE 'NOLOGIN' END,
                CASE WHEN rolbypassrls THEN 'BYPASSRLS' ELSE '' END) AS command
              FROM fabric_roles
              UNION ALL
              SELECT 2, pg_catalog.format(
                'SET citus.enable_create_role_propagation TO off; '
                'GRANT %I TO %I WITH ADMIN %s, INHERIT %s, SET %s',
                r.rolname, m.rolname, a.admin_option::text, a.inherit_option::text, a.set_option::text)
              FROM pg_catalog.pg_auth_members a
              JOIN fabric_roles r ON r.oid = a.roleid
              JOIN fabric_roles m ON m.oid = a.member
              WHERE m.rolname <> current_user)  -- the migration role's own: the bootstrap's
            SELECT w.nodename, w.nodeport, w.result
            FROM (SELECT array_agg(command ORDER BY step, command) ||
                         (SELECT array_agg(pg_catalog.format(
                            'SET citus.enable_ddl_propagation TO off; '
                            'CREATE SCHEMA IF NOT EXISTS %I AUTHORIZATION fabric_owner', s)
                            ORDER BY s)
                          FROM pg_catalog.unnest(ARRAY['fabric', 'fabric_api', 'fabric_audit']) s)
                         AS c FROM commands) c,
                 LATERAL (SELECT * FROM pg_catalog.unnest(c.c) AS cmd,
                          LATERAL run_command_on_workers(cmd)) w
            WHERE NOT w.success
            """
        )
    ).all()
    if failed:
        raise RuntimeError(f"the fabric's roles could not be created on the workers: {failed}")
    op.execute("SET LOCAL ROLE fabric_owner")
    for table in REFERENCE_TABLES:
        bind.execute(text("SELECT create_reference_table(CAST(:t AS regclass))"), {"t": table})
    for table in COORDINATOR_TABLES:
        bind.execute(
            text("SELECT citus_add_local_table_to_metadata(CAST(:t AS regclass))"), {"t": table}
        )
    # Citus distributes a table only when no local table points at it: the foreign keys
    # between tenant tables (all composite, same-tenant, so colocated) go and come back.
    foreign_keys = bind.execute(
        text(
            "SELECT conrelid::regclass::text, conname, pg_catalog.pg_get_constraintdef(oid) "
            "FROM pg_catalog.pg_constraint WHERE contype = 'f' "
            "AND conrelid::regclass::text = ANY (:t) AND confrelid::regclass::text = ANY (:t) "
            "ORDER BY conrelid::regclass::text, conname"
        ),
        {"t": list(TENANT_TABLES)},
    ).all()
    for table, name, _ in foreign_keys:
        op.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    domain_typed = bind.execute(
        text(
            "SELECT a.attrelid::regclass::text, c.relname FROM pg_catalog.pg_attribute a "
            "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
            "WHERE a.attname = 'tenant_id' AND a.atttypid = CAST(:d AS regtype) "
            "AND a.attrelid::regclass::text = ANY (:t) ORDER BY 1"
        ),
        {"d": DOMAIN, "t": [*TENANT_TABLES, *REFERENCE_TABLES]},
    ).all()
    for table, name in domain_typed:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN tenant_id TYPE text")
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {name}_tenant_id_is_a_tenant_ident "
            f"CHECK (CAST(tenant_id AS {DOMAIN}) IS NOT NULL OR tenant_id IS NULL)"
        )
    for table, name, column in TENANT_UNIQUE:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE (tenant_id, {column})")
    for table, index, column in TENANT_UNIQUE_INDEXES:
        op.execute(f"DROP INDEX fabric.{index}")
        op.execute(f"CREATE UNIQUE INDEX {index} ON {table} (tenant_id, {column})")
    for table in TENANT_TABLES:
        if bind.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
            continue  # a table of a later revision, which distributes it itself
        bind.execute(
            text(
                "SELECT create_distributed_table(CAST(:t AS regclass), 'tenant_id', "
                "colocate_with => :c)"
            ),
            {"t": table, "c": "default" if table == COLOCATE_WITH else COLOCATE_WITH},
        )
    for table, name, definition in foreign_keys:
        # the catalog's own text of a constraint this revision just dropped
        op.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
    functions = bind.execute(
        text(
            "SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p "
            "WHERE p.pronamespace::regnamespace::text = ANY (:s) AND p.prokind IN ('f', 'p') "
            "AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = "
            "'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e') ORDER BY 1"
        ),
        {"s": list(FUNCTION_SCHEMAS)},
    ).scalars()
    for signature in list(functions):
        bind.execute(text("SELECT create_distributed_function(:f)"), {"f": signature})
    op.execute("RESET ROLE")


def downgrade() -> None:
    bind = op.get_bind()
    if not _citus(bind):
        return
    op.execute("SET LOCAL ROLE fabric_owner")
    for table in (*reversed(TENANT_TABLES), *COORDINATOR_TABLES, *REFERENCE_TABLES):
        if bind.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
            continue
        bind.execute(
            text(
                "SELECT undistribute_table(CAST(:t AS regclass), cascade_via_foreign_keys => true)"
            ),
            {"t": table},
        )
    for table, name, column in TENANT_UNIQUE:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE ({column})")
    for table, name in bind.execute(
        text(
            "SELECT conrelid::regclass::text, conname FROM pg_catalog.pg_constraint "
            "WHERE conname LIKE '%\\_tenant_id\\_is\\_a\\_tenant\\_ident' ORDER BY 1"
        )
    ).all():
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN tenant_id TYPE {DOMAIN}")
    for table, index, column in TENANT_UNIQUE_INDEXES:
        op.execute(f"DROP INDEX fabric.{index}")
        op.execute(f"CREATE UNIQUE INDEX {index} ON {table} ({column})")
    op.execute("RESET ROLE")
