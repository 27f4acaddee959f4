"""Every table an auditor may query carries a catalog comment that says what it holds.

Auditors read this database directly (psql `\\dt+`, `\\d+`), so the meaning of each table and
column lives in the catalog itself (sql/950_comments.sql), not only in docs/.

Checked: every ordinary or partitioned table of `fabric` and `langgraph` that is not itself a
partition, and every column of those `fabric` tables. Partitions (the monthly `events_*`
partitions, `temporal_summaries_default`) are skipped: they are created at run time, hold
the same rows as their parent, and `\\d+` on the parent shows its comment. The `langgraph`
tables are checked at table level only: their columns are the checkpoint library's own.
"""

import pytest

from conftest import Fabric

pytestmark = pytest.mark.rollback

TABLES = """
SELECT n.nspname || '.' || c.relname
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname IN ('fabric', 'langgraph')
   AND c.relkind IN ('r', 'p')
   AND NOT c.relispartition
   AND coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), '') = ''
 ORDER BY 1
"""

COLUMNS = """
SELECT n.nspname || '.' || c.relname || '.' || a.attname
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE n.nspname = 'fabric'
   AND c.relkind IN ('r', 'p')
   AND NOT c.relispartition
   AND coalesce(pg_catalog.col_description(c.oid, a.attnum), '') = ''
 ORDER BY 1
"""

COUNT = """
SELECT count(*)
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname IN ('fabric', 'langgraph') AND c.relkind IN ('r', 'p') AND NOT c.relispartition
"""


def test_every_table_has_a_comment(fabric: Fabric) -> None:
    conn = fabric.su()
    row = conn.execute(COUNT).fetchone()
    assert row is not None and row[0] > 10, "the query found no tables: the check would be empty"
    missing = [r[0] for r in conn.execute(TABLES).fetchall()]
    assert not missing, "tables without COMMENT ON TABLE:\n  " + "\n  ".join(missing)


def test_every_fabric_column_has_a_comment(fabric: Fabric) -> None:
    missing = [r[0] for r in fabric.session().execute(COLUMNS).fetchall()]
    assert not missing, f"{len(missing)} columns without COMMENT ON COLUMN:\n  " + "\n  ".join(
        missing
    )


def test_the_check_sees_a_missing_comment(fabric: Fabric) -> None:
    """The check can fail: clear one table's and one column's comment and both are listed."""
    conn = fabric.su()
    conn.execute("COMMENT ON TABLE fabric.tenants IS NULL")
    conn.execute("COMMENT ON COLUMN fabric.agents.agent_id IS NULL")
    assert "fabric.tenants" in [r[0] for r in conn.execute(TABLES).fetchall()]
    assert "fabric.agents.agent_id" in [r[0] for r in conn.execute(COLUMNS).fetchall()]


def test_the_auditor_reads_the_comments(fabric: Fabric) -> None:
    """The auditor's login reads no table, yet the catalog's comments describe them to it."""
    row = (
        fabric.session("mf_auditor")
        .execute(
            "SELECT pg_catalog.obj_description(c.oid, 'pg_class'),"
            "       pg_catalog.col_description(c.oid, 1)"
            "  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'fabric' AND c.relname = 'memory_records'"
        )
        .fetchone()
    )
    assert row is not None and row[0] and row[1], row
