"""Every table of schema fabric has its place on a Citus cluster (the lists of migration 0049
and of the later revisions that place a table, tests/citus_layout.py), checked on plain
PostgreSQL, so a table added later fails here until it is placed: a tenant table (one that
starts with tenant_id, but the tenants' own registry) is distributed by it, a registry is a
reference table, and the outbox stays on the coordinator. tests/citus checks the same on a
cluster."""

from __future__ import annotations

from citus_layout import layout
from conftest import Fabric

TABLES = """
SELECT c.oid::regclass::text,
       (SELECT a.attname FROM pg_catalog.pg_attribute a
        WHERE a.attrelid = c.oid AND a.attnum = 1) = 'tenant_id'
FROM pg_catalog.pg_class c
WHERE c.relnamespace = 'fabric'::regnamespace AND c.relkind IN ('r', 'p')
  AND NOT c.relispartition
ORDER BY 1
"""


def test_every_fabric_table_has_a_place_on_citus(fabric: Fabric) -> None:
    tables = dict(fabric.session(None).execute(TABLES).fetchall())
    placed = {
        *layout.TENANT_TABLES,
        *layout.REFERENCE_TABLES,
        *layout.COORDINATOR_TABLES,
        *layout.LOCAL_TABLES,
    }
    assert sorted(set(tables) - placed) == [], "add each to a list of migration 0049 or a later one"
    assert sorted(placed - set(tables)) == []


def test_every_tenant_table_is_distributed_by_tenant_id(fabric: Fabric) -> None:
    tables = dict(fabric.session(None).execute(TABLES).fetchall())
    tenant_tables = {t for t, starts_with_tenant in tables.items() if starts_with_tenant}
    # the registry of the tenants themselves: one small row each, referenced by every tenant
    # table, so a reference table
    assert tenant_tables - {"fabric.tenants"} == set(layout.TENANT_TABLES)


def test_a_foreign_key_target_is_distributed_before_the_table_that_points_at_it(
    fabric: Fabric,
) -> None:
    order = {t: i for i, t in enumerate(layout.TENANT_TABLES)}
    edges = fabric.session(None).execute(
        "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint "
        "WHERE contype = 'f' AND connamespace = 'fabric'::regnamespace"
    )
    for table, target in edges:
        if table in order and target in order and table != target:
            assert order[target] < order[table], (table, target)
        if table in layout.REFERENCE_TABLES:
            assert target in layout.REFERENCE_TABLES, (table, target)
