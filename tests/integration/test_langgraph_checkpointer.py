"""LangGraph's Postgres checkpointer on the fabric's database, kept apart from memory: the
schema the migration made from the pinned package's DDL, DML only for services, one
namespace (thread-id prefix) per service, thread metadata checked by a trigger, retention by
the scheduled decay, and a subject's erasure reaching its threads. The checkpointer also
passes LangGraph's own conformance suite (langgraph-checkpoint-conformance)."""

from __future__ import annotations

import asyncio
import importlib.util
import operator
import uuid
from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.postgres.base import BasePostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore
from langgraph.types import Command, interrupt
from psycopg.types.json import Jsonb

from conftest import ROOT, Fabric, episode
from memfabric.langgraph import (
    SynedrixMemoryStore,
    async_checkpointer,
    checkpoint_conninfo,
    checkpointer,
)
from memfabric.worker import erase, run_decay_once

pytestmark = pytest.mark.rollback

SERVICE = "mf_service"  # a login holding fabric_checkpointer


def migration() -> Any:
    path = ROOT / "migrations" / "versions" / "0016_checkpoints.py"
    spec = importlib.util.spec_from_file_location("m0016_checkpoints", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def conninfo(fabric: Fabric, login: str = SERVICE) -> str:
    return psycopg.conninfo.make_conninfo(fabric.url, user=login)


def thread(
    tid: str, subject: str | None = "user-8842", tenant: str = "acme", run: Any = None
) -> dict[str, Any]:
    conf = {"thread_id": tid, "tenant_id": tenant, "subject_id": subject}
    return {"configurable": conf | ({"fabric_run_id": str(run)} if run else {})}


class State(TypedDict, total=False):
    steps: Annotated[list[str], operator.add]
    decision: str


def ask(state: State) -> State:
    return {"steps": ["asked"]}


def wait_for_approval(state: State) -> State:
    return {"steps": ["approval"], "decision": interrupt({"approve": "refund 40 EUR?"})}


def approval_graph(saver: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_node("approve", wait_for_approval)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "approve")
    builder.add_edge("approve", END)
    return builder.compile(checkpointer=saver)


def threads(fabric: Fabric) -> list[str]:
    with fabric.su() as su:
        rows = su.execute(
            "SELECT DISTINCT thread_id FROM langgraph.checkpoints ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def rows(fabric: Fabric) -> int:
    with fabric.su() as su:
        row = su.execute(
            "SELECT (SELECT count(*) FROM langgraph.checkpoints)"
            " + (SELECT count(*) FROM langgraph.checkpoint_blobs)"
            " + (SELECT count(*) FROM langgraph.checkpoint_writes)"
        ).fetchone()
    assert row is not None
    return int(row[0])


# --- the schema ---------------------------------------------------------------------------


def test_the_pinned_ddl_is_the_installed_packages() -> None:
    m = migration()
    assert version("langgraph-checkpoint-postgres") == m.PINNED_VERSION
    assert m.PINNED_MIGRATIONS == BasePostgresSaver.MIGRATIONS


def test_the_schema_is_owned_like_the_fabric_and_never_in_it(fabric: Fabric) -> None:
    with fabric.su() as su:
        owners = su.execute(
            "SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'langgraph' AND c.relkind = 'r' ORDER BY 1"
        ).fetchall()
        in_fabric = su.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'fabric' AND c.relname LIKE 'checkpoint%'"
        ).fetchone()
        done = su.execute("SELECT max(v) FROM langgraph.checkpoint_migrations").fetchone()
    assert owners == [
        ("checkpoint_blobs", "fabric_owner"),
        ("checkpoint_migrations", "fabric_owner"),
        ("checkpoint_writes", "fabric_owner"),
        ("checkpoints", "fabric_owner"),
    ]
    assert in_fabric == (0,)
    assert done == (len(BasePostgresSaver.MIGRATIONS) - 1,)  # setup() would do nothing


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE langgraph.mine (x int)",
        "ALTER TABLE langgraph.checkpoints ADD COLUMN x int",
        "DROP TABLE langgraph.checkpoint_writes",
        "TRUNCATE langgraph.checkpoints",
        "INSERT INTO langgraph.checkpoint_migrations VALUES (99)",
        "SELECT count(*) FROM fabric.memory_records",
    ],
)
def test_a_service_has_dml_on_its_checkpoints_only(fabric: Fabric, statement: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.connect(SERVICE).execute(statement)


CHECKPOINT_TABLES = (
    "langgraph.checkpoints",
    "langgraph.checkpoint_blobs",
    "langgraph.checkpoint_writes",
    "langgraph.checkpoint_migrations",
)
LOCK_MODES = (
    "ACCESS EXCLUSIVE",
    "EXCLUSIVE",
    "SHARE ROW EXCLUSIVE",
    "SHARE",
    "SHARE UPDATE EXCLUSIVE",
)


@pytest.mark.parametrize("table", CHECKPOINT_TABLES)
@pytest.mark.parametrize("mode", LOCK_MODES)
def test_a_service_cannot_lock_the_checkpoints_of_every_service(
    fabric: Fabric, table: str, mode: str
) -> None:
    """A table-level UPDATE or DELETE privilege allows LOCK TABLE in any mode: a service holds
    neither (UPDATE on columns, deletes through fabric_api), so it takes at most the lock its
    own writes take (ROW EXCLUSIVE), which no other service's reads and writes wait for."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.connect(SERVICE).execute(f"LOCK TABLE {table} IN {mode} MODE")


@pytest.mark.parametrize("login", ["mf_service", "mf_maintainer"])
def test_the_checkpoint_versions_table_is_locked_by_no_service(fabric: Fabric, login: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.connect(login).execute(
            "LOCK TABLE langgraph.checkpoint_migrations IN ACCESS EXCLUSIVE MODE"
        )


@pytest.mark.clone
def test_delete_thread_and_prune_go_through_the_api_and_keep_to_the_service(
    fabric: Fabric,
) -> None:
    """The sync checkpointer's deletes (the conformance suite runs the async one): prune
    keeps the latest checkpoint, delete_thread removes the thread, another service's
    thread of the same name stays."""
    with checkpointer(conninfo(fabric, "mf_service_b")) as other:
        approval_graph(other).invoke({"steps": []}, thread("t-1"))
    with checkpointer(conninfo(fabric)) as saver:
        graph = approval_graph(saver)
        graph.invoke({"steps": []}, thread("t-1"))
        graph.invoke({"steps": []}, thread("t-2"))
        assert len(list(saver.list(thread("t-1")))) > 1
        saver.prune(["t-1"])
        assert len(list(saver.list(thread("t-1")))) == 1
        assert saver.get_tuple(thread("t-1")) is not None
        saver.delete_thread("t-1")
        assert saver.get_tuple(thread("t-1")) is None
        saver.prune(["t-2"], strategy="delete")
        assert saver.get_tuple(thread("t-2")) is None
    assert threads(fabric) == ["mf_service_b:t-1"]


@pytest.mark.clone
def test_the_ddl_guard_covers_the_checkpoint_schema(fabric: Fabric) -> None:
    login = "mf_leaked_checkpoint_owner"
    with fabric.su() as su:
        su.execute(f"CREATE ROLE {login} LOGIN")
        su.execute(f"GRANT fabric_owner TO {login}")
    try:
        conn = fabric.owner(None, actor=None, login=login)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="migration role"):
            conn.execute("ALTER TABLE langgraph.checkpoints ADD COLUMN x int")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="migration role"):
            conn.execute("DROP TRIGGER _100_thread_metadata ON langgraph.checkpoints")
        conn.close()
    finally:
        with fabric.su() as su:
            su.execute(f"DROP ROLE IF EXISTS {login}")


@pytest.mark.clone
def test_setup_never_needed_and_refused_to_a_service(fabric: Fabric) -> None:
    with checkpointer(conninfo(fabric)) as saver:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            saver.setup()


# --- one namespace per service ------------------------------------------------------------


@pytest.mark.clone
def test_two_services_never_share_a_thread(fabric: Fabric) -> None:
    with (
        checkpointer(conninfo(fabric)) as support,
        checkpointer(conninfo(fabric, "mf_service_b")) as billing,
    ):
        approval_graph(support).invoke({"steps": []}, thread("t-1"))
        assert approval_graph(billing).get_state(thread("t-1")).values == {}
        assert list(billing.list(None)) == []
        assert {t.config["configurable"]["thread_id"] for t in support.list(None)} == {"t-1"}
        billing.delete_thread("t-1")  # its own t-1, which does not exist
        assert approval_graph(support).get_state(thread("t-1")).values["steps"] == ["asked"]
    assert threads(fabric) == ["mf_service:t-1"]


@pytest.mark.clone
def test_a_login_reads_and_writes_only_its_own_threads(fabric: Fabric) -> None:
    with checkpointer(conninfo(fabric)) as mine:
        approval_graph(mine).invoke({"steps": []}, thread("t-1"))
    other = fabric.connect("mf_service_b")
    assert other.execute("SELECT count(*) FROM langgraph.checkpoints").fetchone() == (0,)
    assert other.execute("SELECT count(*) FROM langgraph.checkpoint_blobs").fetchone() == (0,)
    before = rows(fabric)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # deletes go through fabric_api
        other.execute("DELETE FROM langgraph.checkpoints")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # a thread's id never changes
        other.execute(
            "UPDATE langgraph.checkpoints SET thread_id = 'mf_service_b:t-1'"
            " WHERE thread_id = 'mf_service:t-1'"
        )
    moved = other.execute(
        "UPDATE langgraph.checkpoints SET metadata = metadata WHERE thread_id = 'mf_service:t-1'"
    ).rowcount
    assert moved == 0  # it cannot see them
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # another login's threads
        other.execute("SELECT fabric_api.delete_checkpoint_threads(ARRAY['mf_service:t-1'])")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        other.execute(
            "SELECT * FROM fabric_api.delete_unkept_checkpoints('mf_service:t-1', '', '{}')"
        )
    assert rows(fabric) == before
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # another login's prefix
        raw_put(fabric, "mf_service_b:x", {**GOOD, "service": "mf_service_b"}, login=SERVICE)
    assert rows(fabric) == before
    with checkpointer(conninfo(fabric), service="mf_service_b") as pretender:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            approval_graph(pretender).invoke({"steps": []}, thread("t-2"))
    assert rows(fabric) == before


# --- thread metadata, checked by a trigger ------------------------------------------------


def raw_put(
    fabric: Fabric, thread_id: str, metadata: dict[str, Any], cid: str = "c1", login: str = SERVICE
) -> None:
    fabric.connect(login).execute(
        "INSERT INTO langgraph.checkpoints (thread_id, checkpoint_id, checkpoint, metadata)"
        " VALUES (%s, %s, '{}', %s)",
        (thread_id, cid, Jsonb(metadata)),
    )


GOOD = {"service": "mf_service", "tenant_id": "acme", "subject_id": "user-8842"}


@pytest.mark.parametrize(
    ("thread_id", "metadata"),
    [
        ("mf_service:t", {}),
        ("mf_service:t", {k: v for k, v in GOOD.items() if k != "service"}),
        ("mf_service_b:t", GOOD),
        ("t", GOOD),
        ("mf_service:t", {**GOOD, "tenant_id": "canary-tenant"}),
        ("mf_service:t", {k: v for k, v in GOOD.items() if k != "tenant_id"}),
        ("mf_service:t", {k: v for k, v in GOOD.items() if k != "subject_id"}),
        ("mf_service:t", {**GOOD, "subject_id": 42}),
        ("mf_service:t", {**GOOD, "subject_id": "canary\u202eid"}),
        ("mf_service:t", {**GOOD, "business_instance_id": ["x"]}),
        ("mf_service:t", {**GOOD, "fabric_run_id": "canary-run"}),
        ("mf_service:t", {**GOOD, "fabric_run_id": 42}),
        ("mf_service:t", {**GOOD, "fabric_run_id": str(uuid.uuid4())}),  # no such run
    ],
)
def test_a_checkpoint_must_name_its_service_tenant_and_subject(
    fabric: Fabric, thread_id: str, metadata: dict[str, Any]
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        raw_put(fabric, thread_id, metadata)
    assert refused.value.sqlstate == "22023"
    assert "canary" not in str(refused.value)  # no client value echoed
    assert rows(fabric) == 0


def test_a_checkpoint_names_only_a_run_of_its_own_tenant(fabric: Fabric) -> None:
    globex = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        raw_put(fabric, "mf_service:t", {**GOOD, "fabric_run_id": str(globex)})
    assert refused.value.sqlstate == "22023"
    assert rows(fabric) == 0
    raw_put(fabric, "mf_service:t", {**GOOD, "fabric_run_id": str(fabric.open_run())})
    raw_put(fabric, "mf_service:t", {**GOOD, "fabric_run_id": None}, cid="c2")
    assert rows(fabric) == 2


def test_a_thread_keeps_its_tenant_and_subject(fabric: Fabric) -> None:
    raw_put(fabric, "mf_service:t", GOOD)
    for changed in ({**GOOD, "subject_id": "user-9999"}, {**GOOD, "tenant_id": "globex"}):
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            raw_put(fabric, "mf_service:t", changed, cid="c2")
        assert refused.value.sqlstate == "42501"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fabric.connect(SERVICE).execute(
            "UPDATE langgraph.checkpoints SET metadata = metadata || '{\"subject_id\": null}'"
            " WHERE thread_id = 'mf_service:t' AND checkpoint_id = 'c1'"
        )
    with fabric.su() as su:
        kept = su.execute("SELECT metadata FROM langgraph.checkpoints").fetchall()
    assert kept == [(GOOD,)]


@pytest.mark.clone
def test_a_graph_without_a_known_tenant_cannot_checkpoint(fabric: Fabric) -> None:
    with checkpointer(conninfo(fabric)) as saver:
        with pytest.raises(ValueError, match="tenant"):
            approval_graph(saver).invoke({"steps": []}, {"configurable": {"thread_id": "t"}})
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            approval_graph(saver).invoke({"steps": []}, thread("t", tenant="no-such-tenant"))
    assert rows(fabric) == 0  # not even the refused checkpoint's blobs


# --- retention: longer than any approval wait, then gone ----------------------------------


def age(fabric: Fabric, thread_id: str, by: str) -> None:
    """Move a thread's checkpoints back in time (the clock the decay reads is their ts)."""
    with fabric.su() as su:
        su.execute(
            "UPDATE langgraph.checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}',"
            " to_jsonb((checkpoint ->> 'ts')::timestamptz - %s::interval))"
            " WHERE thread_id = %s",
            (by, thread_id),
        )


@pytest.mark.clone
def test_a_graph_waiting_for_approval_survives_the_decay_and_resumes(fabric: Fabric) -> None:
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        (Jsonb({"approval_timeout": "1 day", "checkpoint_retention": "3 days"}),),
    )
    with checkpointer(conninfo(fabric)) as saver:
        g = approval_graph(saver)
        first = g.invoke({"steps": []}, thread("refund-1"))
        assert "__interrupt__" in first
        age(fabric, "mf_service:refund-1", "2 days")  # past the approval timeout
        result = run_decay_once(fabric.connect("mf_committer"))
        assert result["checkpoint_threads_deleted"] == 0
        resumed = g.invoke(Command(resume="approved"), thread("refund-1"))
        assert resumed == {"steps": ["asked", "approval"], "decision": "approved"}

        g.invoke({"steps": []}, thread("refund-2"))
        age(fabric, "mf_service:refund-2", "3 days 1 minute")  # idle beyond the retention
        age(fabric, "mf_service:refund-1", "2 days 23 hours")  # still inside it
        result = run_decay_once(fabric.connect("mf_committer"))
        assert result["checkpoint_threads_deleted"] == 1
        assert threads(fabric) == ["mf_service:refund-1"]
        assert g.get_state(thread("refund-2")).values == {}
    with fabric.su() as su:
        left = su.execute(
            "SELECT (SELECT count(*) FROM langgraph.checkpoint_blobs WHERE thread_id = %s)"
            " + (SELECT count(*) FROM langgraph.checkpoint_writes WHERE thread_id = %s)",
            ("mf_service:refund-2", "mf_service:refund-2"),
        ).fetchone()
    assert left == (0,)


# --- erasure ------------------------------------------------------------------------------


@pytest.mark.clone
def test_a_subject_erasure_deletes_its_threads_and_the_receipt_lists_them(
    fabric: Fabric,
) -> None:
    run = fabric.open_run()
    answer = fabric.propose("mf_agent_a", episode("asked for a refund"), run)
    memory_id = fabric.commit(answer["proposal_id"])["memory_id"]
    with checkpointer(conninfo(fabric)) as saver:
        g = approval_graph(saver)
        g.invoke({"steps": []}, thread("chat-1"))
        g.invoke({"steps": []}, thread("chat-2"))
        g.invoke({"steps": []}, thread("chat-3", subject="user-9999"))
        g.invoke({"steps": []}, thread("chat-4", tenant="globex"))  # globex's user-8842
    committer = fabric.connect("mf_committer")
    row = committer.execute(
        "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'art. 17')"
    ).fetchone()
    assert row is not None
    approval = row[0]["approval_id"]
    fabric.session("mf_policy").execute(
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval,)
    )
    receipt = erase(committer, approval, maintainer=fabric.connect("mf_maintainer"))
    assert receipt["checkpoint_threads"] == ["mf_service:chat-1", "mf_service:chat-2"]
    assert "langgraph.checkpoint_blobs" in receipt["vacuumed"]  # type: ignore[operator]
    assert threads(fabric) == ["mf_service:chat-3", "mf_service:chat-4"]
    row = (
        fabric.session("mf_auditor")
        .execute("SELECT fabric_audit.erasure_receipt(%s)", (memory_id,))
        .fetchone()
    )
    assert row is not None
    assert row[0]["destroyed"]["checkpoint_threads"] == ["mf_service:chat-1", "mf_service:chat-2"]


def holding(fabric: Fabric, text: str) -> int:
    """Rows of the checkpoint tables whose bytes hold `text`."""
    needle = text.encode()
    with fabric.su() as su:
        row = su.execute(
            "SELECT (SELECT count(*) FROM langgraph.checkpoints"
            "        WHERE position(%(n)s IN convert_to(checkpoint::text || metadata::text,"
            "                                           'UTF8')) > 0)"
            " + (SELECT count(*) FROM langgraph.checkpoint_blobs"
            "    WHERE position(%(n)s IN coalesce(blob, '')) > 0)"
            " + (SELECT count(*) FROM langgraph.checkpoint_writes"
            "    WHERE position(%(n)s IN blob) > 0)",
            {"n": needle},
        ).fetchone()
    assert row is not None
    return int(row[0])


class Chat(TypedDict, total=False):
    question: str
    memories: list[str]
    answer: str


def remember_graph(store: Any, saver: Any) -> Any:
    """Recall into the graph's state, then answer from it: the state holds what was recalled."""

    def remember(state: Chat, *, store: BaseStore) -> Chat:
        items = store.search(("acme", "episodic", "user-8842"), query=state["question"])
        return {"memories": [i.value["content"]["text"] for i in items]}

    def respond(state: Chat) -> Chat:
        return {"answer": f"noted: {', '.join(state['memories'])}"}

    builder = StateGraph(Chat)
    builder.add_node("remember", remember)
    builder.add_node("respond", respond)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "respond")
    builder.add_edge("respond", END)
    return builder.compile(store=store, checkpointer=saver)


@pytest.mark.clone
def test_erasing_a_record_deletes_the_threads_of_the_runs_it_was_recalled_in(
    fabric: Fabric,
) -> None:
    run, quiet = fabric.open_run(), fabric.open_run()  # the same subject; quiet recalls nothing
    answer = fabric.propose("mf_agent_a", episode("prefers invoices in EUR"), run)
    memory_id = str(fabric.commit(answer["proposal_id"])["memory_id"])
    with (
        SynedrixMemoryStore.from_conn_string(conninfo(fabric, "mf_agent_a"), run_id=run) as store,
        checkpointer(conninfo(fabric)) as saver,
    ):
        out = remember_graph(store, saver).invoke(
            {"question": "which currency for invoices?"}, thread("c-1", run=run)
        )
        assert out["answer"] == "noted: prefers invoices in EUR"
    with checkpointer(conninfo(fabric), fabric_run_id=str(quiet)) as saver:
        approval_graph(saver).invoke({"steps": []}, thread("c-2"))
    with checkpointer(conninfo(fabric)) as saver:
        approval_graph(saver).invoke({"steps": []}, thread("c-3"))  # names no run
    assert holding(fabric, "prefers invoices in EUR") > 0
    committer = fabric.connect("mf_committer")
    row = committer.execute(
        "SELECT fabric_api.request_erasure(%s, 'art. 17')", (memory_id,)
    ).fetchone()
    assert row is not None
    approval = row[0]["approval_id"]
    fabric.session("mf_policy").execute(
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval,)
    )
    erased = erase(committer, approval, maintainer=fabric.connect("mf_maintainer"))
    assert erased["checkpoint_threads"] == ["mf_service:c-1"]
    assert threads(fabric) == ["mf_service:c-2", "mf_service:c-3"]
    assert holding(fabric, "prefers invoices in EUR") == 0
    row = (
        fabric.session("mf_auditor")
        .execute("SELECT fabric_audit.erasure_receipt(%s)", (memory_id,))
        .fetchone()
    )
    assert row is not None
    destroyed = row[0]["destroyed"]
    assert destroyed["checkpoint_threads"] == ["mf_service:c-1"]
    assert destroyed["recalled_in_runs"] == 1


# --- the store and the checkpointer in one graph ------------------------------------------


@pytest.mark.clone
def test_store_and_checkpointer_in_one_graph(fabric: Fabric) -> None:
    run = fabric.open_run()
    answer = fabric.propose("mf_agent_a", episode("prefers invoices in EUR"), run)
    fabric.commit(answer["proposal_id"])

    class Chat(TypedDict, total=False):
        question: str
        memories: list[str]
        answer: str

    def remember(state: Chat, *, store: BaseStore) -> Chat:
        items = store.search(("acme", "episodic", "user-8842"), query=state["question"])
        return {"memories": [i.value["content"]["text"] for i in items]}

    def respond(state: Chat) -> Chat:
        return {"answer": f"noted: {', '.join(state['memories'])}"}

    builder = StateGraph(Chat)
    builder.add_node("remember", remember)
    builder.add_node("respond", respond)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "respond")
    builder.add_edge("respond", END)
    with (
        SynedrixMemoryStore.from_conn_string(conninfo(fabric, "mf_agent_a"), run_id=run) as store,
        checkpointer(conninfo(fabric)) as saver,
    ):
        g = builder.compile(store=store, checkpointer=saver)
        out = g.invoke({"question": "which currency for invoices?"}, thread("c-1", run=run))
        assert out["answer"] == "noted: prefers invoices in EUR"
        assert g.get_state(thread("c-1", run=run)).values["answer"] == out["answer"]
    with fabric.su() as su:
        meta = su.execute(
            "SELECT DISTINCT metadata ->> 'subject_id', metadata ->> 'fabric_run_id'"
            " FROM langgraph.checkpoints"
        )
        assert meta.fetchall() == [("user-8842", str(run))]


# --- LangGraph's conformance suite --------------------------------------------------------


@pytest.mark.clone
def test_the_checkpointer_passes_langgraphs_conformance_suite(fabric: Fabric) -> None:
    @checkpointer_test(name="memfabric")
    async def saver() -> AsyncIterator[Any]:
        async with async_checkpointer(
            conninfo(fabric), tenant_id="acme", subject_id="user-8842"
        ) as s:
            yield s

    report = asyncio.run(validate(saver))
    failures = {
        name: result.failures for name, result in report.results.items() if result.passed is False
    }
    assert failures == {}
    assert report.passed_all_base(), report.results
    ran = {name: r.tests_passed for name, r in report.results.items() if r.detected}
    print("conformance", report.conformance_level(), ran)
    assert set(ran) >= {"put", "put_writes", "get_tuple", "list", "delete_thread"}
    assert all(n > 0 for n in ran.values())
    assert all(t.startswith("mf_service:") for t in threads(fabric))


@pytest.mark.clone
def test_checkpoint_conninfo_puts_the_schema_on_the_search_path(fabric: Fabric) -> None:
    with psycopg.connect(checkpoint_conninfo(conninfo(fabric))) as c:
        row = c.execute("SHOW search_path").fetchone()
    assert row == ("langgraph",)


def test_blobs_and_writes_without_a_checkpoint_are_refused(fabric: Fabric) -> None:
    service = fabric.connect(SERVICE)
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        service.execute(
            "INSERT INTO langgraph.checkpoint_blobs (thread_id, channel, version, type, blob)"
            " VALUES ('mf_service:t', 'steps', '1', 'json', '\\x00')"
        )
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        service.execute(
            "INSERT INTO langgraph.checkpoint_writes"
            " (thread_id, checkpoint_id, task_id, idx, channel, blob)"
            " VALUES ('mf_service:t', 'c1', 'task', 0, 'steps', '\\x00')"
        )
    assert rows(fabric) == 0
