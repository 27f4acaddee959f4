"""The maintenance login: erasure's VACUUM, and nothing else.

VACUUM cannot run inside a function, so it needs a table privilege (MAINTAIN), and MAINTAIN
also allows LOCK TABLE ... ACCESS EXCLUSIVE, which stalls every tenant. So the committer
holds no MAINTAIN (nor USAGE on the fabric schema); a separate login, a member of
fabric_maintainer, holds MAINTAIN on exactly the tables erasure and decay rewrite and
cannot read a row, write one or call the API.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric, episode
from memfabric.errors import NotAuthorized
from memfabric.worker import ERASURE_VACUUM, erase, run_decay_once, vacuum

OTHER_TABLES = ("fabric.events", "fabric.approvals", "fabric.agents", "fabric.memory_lineage")


def refused(conn: psycopg.Connection[Any], statement: str) -> str | None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(statement)
    return info.value.sqlstate


def approved_erasure(fabric: Fabric, memory_id: str) -> str:
    committer = fabric.connect("mf_committer")
    row = committer.execute(
        "SELECT fabric_api.request_erasure(%s, 'gdpr', false)", (memory_id,)
    ).fetchone()
    assert row is not None
    approval = row[0]["approval_id"]
    fabric.session("mf_policy").execute(
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval,)
    )
    return str(approval)


def formed(fabric: Fabric, text: str = "asked for invoices in EUR") -> str:
    return fabric.form(fabric.open_run(), text)


def warnings_of(conn: psycopg.Connection[Any]) -> list[str]:
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(f"{d.severity} {d.message_primary}"))
    return seen


@pytest.mark.parametrize("table", ERASURE_VACUUM)
def test_the_committer_cannot_lock_a_table(fabric: Fabric, table: str) -> None:
    conn = fabric.connect("mf_committer", autocommit=False)
    assert refused(conn, f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE") == "42501"
    conn.rollback()
    assert refused(conn, f"LOCK TABLE {table} IN SHARE MODE") == "42501"


@pytest.mark.parametrize("table", ERASURE_VACUUM)
def test_the_committer_cannot_vacuum(fabric: Fabric, table: str) -> None:
    conn = fabric.connect("mf_committer")
    assert refused(conn, f"VACUUM {table}") == "42501"
    assert refused(conn, f"ANALYZE {table}") == "42501"


def test_the_committer_holds_no_maintain_anywhere(fabric: Fabric) -> None:
    row = (
        fabric.session()
        .execute(
            "SELECT count(*) FROM pg_class c WHERE c.relnamespace = 'fabric'::regnamespace"
            " AND c.relkind IN ('r', 'p')"
            " AND has_table_privilege('mf_committer', c.oid, 'MAINTAIN')"
        )
        .fetchone()
    )
    assert row == (0,)


@pytest.mark.parametrize("table", ERASURE_VACUUM)
def test_the_maintainer_vacuums_the_erasure_tables(fabric: Fabric, table: str) -> None:
    conn = fabric.connect("mf_maintainer")
    seen = warnings_of(conn)
    conn.execute(f"VACUUM {table}")
    assert seen == []


@pytest.mark.parametrize("table", OTHER_TABLES)
def test_the_maintainer_cannot_lock_or_vacuum_other_tables(fabric: Fabric, table: str) -> None:
    conn = fabric.connect("mf_maintainer", autocommit=False)
    assert refused(conn, f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE") == "42501"
    conn.rollback()
    conn.autocommit = True
    seen = warnings_of(conn)
    conn.execute(f"VACUUM {table}")  # PostgreSQL warns and skips rather than raising
    assert [w for w in seen if "permission denied" in w] != []


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT content FROM fabric.memory_records",
        "SELECT count(*) FROM fabric.proposals",
        "SELECT * FROM fabric.events",
        "INSERT INTO fabric.runs (tenant_id, agent_id, active_tool_set, expires_at)"
        " VALUES ('acme', 'com-agt-003', '{}', now() + interval '1 hour')",
        "UPDATE fabric.memory_records SET content = NULL",
        "DELETE FROM fabric.temporal_summaries",
        "TRUNCATE fabric.memory_embeddings",
        "SELECT fabric_api.commit_pending(10)",
        "SELECT fabric_api.recall('{}')",
    ],
)
def test_the_maintainer_reads_and_writes_nothing(fabric: Fabric, statement: str) -> None:
    formed(fabric)
    before = {**fabric.counts(), "summaries": fabric.count("temporal_summaries")}
    assert refused(fabric.connect("mf_maintainer"), statement) == "42501"
    assert {**fabric.counts(), "summaries": fabric.count("temporal_summaries")} == before
    assert fabric.count("memory_records", "content IS NULL") == 0


def test_erase_vacuums_through_the_maintenance_login(fabric: Fabric) -> None:
    memory_id = formed(fabric)
    result = erase(
        fabric.connect("mf_committer"),
        approved_erasure(fabric, memory_id),
        maintainer=fabric.connect("mf_maintainer"),
    )
    assert result["erased"] == [memory_id]
    assert result["vacuumed"] == list(ERASURE_VACUUM)


def test_erase_refuses_a_maintenance_login_that_may_not_vacuum(fabric: Fabric) -> None:
    """PostgreSQL only warns when VACUUM is not allowed: the worker makes it an error."""
    memory_id = formed(fabric)
    with pytest.raises(NotAuthorized) as info:
        erase(
            fabric.connect("mf_committer"),
            approved_erasure(fabric, memory_id),
            maintainer=fabric.connect("mf_agent_a"),
        )
    assert info.value.sqlstate == "42501"
    assert info.value.hint and "fabric_maintainer" in info.value.hint


def test_decay_vacuums_after_closing_operational_windows(fabric: Fabric) -> None:
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        (Jsonb({"operational_window": "1 millisecond"}),),
    )
    run = fabric.open_run()
    proposal = fabric.propose("mf_agent_a", episode("op", retention_class="operational"), run)
    fabric.commit(proposal["proposal_id"])
    time.sleep(0.02)
    result = run_decay_once(
        fabric.connect("mf_committer"), maintainer=fabric.connect("mf_maintainer")
    )
    assert result["windows_closed"] == 1
    assert result["vacuumed"] == ["fabric.memory_records"]
    again = run_decay_once(
        fabric.connect("mf_committer"), maintainer=fabric.connect("mf_maintainer")
    )
    assert again["windows_closed"] == 0
    assert again["vacuumed"] == []


def test_the_maintainer_group_cannot_log_in_and_the_login_is_not_an_agent(fabric: Fabric) -> None:
    row = (
        fabric.session()
        .execute(
            "SELECT rolcanlogin, rolbypassrls, rolsuper FROM pg_roles"
            " WHERE rolname = 'fabric_maintainer'"
        )
        .fetchone()
    )
    assert row == (False, False, False)
    with pytest.raises(psycopg.Error) as info:
        fabric.session("mf_admin").execute(
            "SELECT fabric_api.register_agent('mnt-agt-001', 'mf_maintainer', '{}', '{}')"
        )
    assert info.value.sqlstate == "42501"
    assert fabric.count("agents", "agent_id = 'mnt-agt-001'") == 0


def test_vacuum_refuses_when_a_partition_is_not_maintainable(fabric: Fabric) -> None:
    """VACUUM of a partitioned table recurses: a partition without MAINTAIN is a refusal too."""
    fabric.session().execute(
        "REVOKE MAINTAIN ON fabric.temporal_summaries_default FROM fabric_maintainer"
    )
    with pytest.raises(NotAuthorized):
        vacuum(fabric.connect("mf_maintainer"), list(ERASURE_VACUUM))


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT fabric._raise_rule('check_violation', 'x', 'y')",
        "SELECT fabric._delete_checkpoint_threads(ARRAY['mf_service:t'])",
        "SELECT fabric._erase_checkpoints('acme', 'user-8842')",
        "SELECT fabric._tenants_with_records()",
        "SELECT fabric._tenant_of_run(gen_random_uuid())",
    ],
)
def test_the_maintainer_executes_no_private_helper(fabric: Fabric, statement: str) -> None:
    """The private helpers are for the owner's functions only: USAGE on the fabric schema
    (which VACUUM needs to name a table) gives the maintainer none of them."""
    assert refused(fabric.connect("mf_maintainer"), statement) == "42501"


def test_no_fabric_function_is_executable_by_the_maintainer(fabric: Fabric) -> None:
    row = (
        fabric.session()
        .execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname IN ('fabric', 'fabric_api', 'fabric_audit', 'langgraph')"
            " AND (has_function_privilege('mf_maintainer', p.oid, 'EXECUTE')"
            " OR has_function_privilege('fabric_maintainer', p.oid, 'EXECUTE'))"
        )
        .fetchone()
    )
    assert row == (0,)
