"""SynedrixMemoryStore against the real LangGraph and the real fabric: the read side on the
model of LangGraph's own store tests (batch order, get, search by prefix at segment
boundaries, pagination, filters, list_namespaces), and what the stock store does not do:
no cross-tenant read, every read audited, no write."""

from __future__ import annotations

import asyncio
import operator
import uuid
from datetime import datetime
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from psycopg_pool import ConnectionPool

from conftest import Fabric, episode
from memfabric.langgraph import GovernedWriteRefused, SynedrixMemoryStore

pytestmark = pytest.mark.rollback

SUBJECT = ("acme", "episodic", "user-8842")


@pytest.fixture
def seeded(fabric: Fabric) -> dict[str, Any]:
    """acme: three of user-8842's episodes, one tenant-visible, one agent-private, one of
    user-9999; globex: one episode of its own user-8842."""
    run = fabric.open_run()
    ids = {
        "eur": fabric.form(run, envelope=episode("asked for invoices in EUR")),
        "usd": fabric.form(run, envelope=episode("asked for invoices in USD")),
        "call": fabric.form(run, envelope=episode("prefers a call on Monday")),
        "tenant": fabric.form(
            run,
            envelope=episode(
                "the office closes on Friday",
                scope={"tenant_id": "acme", "visibility": "tenant"},
            ),
        ),
        "agent": fabric.form(
            run,
            envelope=episode(
                "escalate invoices to finance", scope={"tenant_id": "acme", "visibility": "agent"}
            ),
        ),
    }
    other = fabric.open_run(subject="user-9999", session="sess-2")
    ids["other"] = fabric.form(other, envelope=episode("asked for invoices in GBP"))
    glx = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    globex_episode = episode(
        "globex secret invoices", scope={"tenant_id": "globex", "visibility": "subject"}
    )
    ids["globex"] = fabric.form(glx, login="mf_agent_g", envelope=globex_episode)
    return {"run": run, "ids": ids}


@pytest.fixture
def store(fabric: Fabric, seeded: dict[str, Any]) -> SynedrixMemoryStore:
    return SynedrixMemoryStore(fabric.connect("mf_agent_a"), run_id=seeded["run"])


def recall_events(fabric: Fabric, run: uuid.UUID, kind: str) -> list[dict[str, Any]]:
    return fabric.events(f"run_id = '{run}' AND event_type = 'memory.recall.{kind}'")


# --- get ----------------------------------------------------------------------------------


def test_get_reads_a_record_by_its_memory_id_with_provenance_and_validity(
    store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    item = store.get(SUBJECT, seeded["ids"]["eur"])
    assert isinstance(item, Item)
    assert item.key == seeded["ids"]["eur"]
    assert item.namespace == SUBJECT
    assert item.value["content"] == {"text": "asked for invoices in EUR"}
    assert item.value["provenance"]["source_event_id"].startswith("evt-7b21-")
    assert item.value["provenance"]["formation_method"] == "extraction"
    assert item.value["validity_interval"]["valid_from"].startswith("2026-07-02")
    assert item.value["derived_from"] == []
    assert item.created_at == datetime.fromisoformat(item.value["recorded_at"])


def test_get_returns_none_outside_the_namespace_or_the_scope(
    store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    ids = seeded["ids"]
    assert store.get(("acme", "episodic", "tenant"), ids["eur"]) is None  # wrong scope_id
    assert store.get(("acme", "semantic", "user-8842"), ids["eur"]) is None  # wrong tier
    assert store.get(("acme", "episodic", "tenant"), ids["tenant"]) is not None
    assert store.get(("acme", "episodic", "user-9999"), ids["other"]) is None  # not the run's
    assert store.get(("globex", "episodic", "user-8842"), ids["globex"]) is None
    assert store.get(SUBJECT, ids["globex"]) is None  # another tenant's id in our namespace
    assert store.get(SUBJECT, "not-a-memory-id") is None
    assert store.get(("acme", "episodic"), ids["eur"]) is None  # not a full namespace


# --- search -------------------------------------------------------------------------------


def _keys(items: list[SearchItem]) -> set[str]:
    return {i.key for i in items}


def test_search_by_prefix_matches_whole_segments(
    store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    ids = seeded["ids"]
    visible = {ids[k] for k in ("eur", "usd", "call", "tenant", "agent")}
    assert _keys(store.search(("acme",), limit=50)) == visible
    assert _keys(store.search((), limit=50)) == visible  # the run's tenant, nothing else
    assert _keys(store.search(("acme", "episodic"), limit=50)) == visible
    assert _keys(store.search(SUBJECT, limit=50)) == {ids["eur"], ids["usd"], ids["call"]}
    assert _keys(store.search(("acme", "episodic", "tenant"), limit=50)) == {ids["tenant"]}
    assert _keys(store.search(("acme", "episodic", "com-agt-003"), limit=50)) == {ids["agent"]}
    assert store.search(("acme", "semantic"), limit=50) == []
    assert store.search(("acme", "episodic", "user-8842", "deeper"), limit=50) == []
    # ("acm",) and ("acme-corp",) are other tenants, never prefixes of acme
    assert store.search(("acm",), limit=50) == []
    assert store.search(("acme-corp",), limit=50) == []
    namespaces = {i.namespace for i in store.search(("acme",), limit=50)}
    assert namespaces == {
        SUBJECT,
        ("acme", "episodic", "tenant"),
        ("acme", "episodic", "com-agt-003"),
    }


def test_a_foreign_tenant_returns_nothing_and_is_audited_as_denied(
    fabric: Fabric, store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    assert store.search(("globex",), query="invoices", limit=10) == []
    assert store.search(("globex", "episodic", "user-8842"), limit=10) == []
    denied = recall_events(fabric, seeded["run"], "denied")
    assert len(denied) == 2
    assert "globex" not in str(denied)  # the event names the rule, not the value
    assert fabric.count("events", "tenant_id = 'globex' AND event_type LIKE 'memory.recall.%'") == 0


def test_another_subject_of_the_tenant_is_denied_not_served(
    fabric: Fabric, store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    assert store.search(("acme", "episodic", "user-9999"), limit=10) == []
    assert len(recall_events(fabric, seeded["run"], "denied")) == 1


def test_search_with_a_query_is_one_recall_with_scores(
    fabric: Fabric, store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    before = len(recall_events(fabric, seeded["run"], "served"))
    items = store.search(("acme",), query="invoices EUR", limit=10)
    assert len(recall_events(fabric, seeded["run"], "served")) == before + 1
    assert items[0].key == seeded["ids"]["eur"]
    assert items[0].score == 1
    assert all(isinstance(i.score, float) for i in items)
    assert [i.score for i in items] == sorted((i.score for i in items), reverse=True)
    assert seeded["ids"]["call"] not in _keys(items)  # holds neither word
    assert all(i.score is None for i in store.search(("acme",), limit=10))  # no query


def test_search_pages_with_limit_and_offset(store: SynedrixMemoryStore) -> None:
    everything = store.search(("acme",), limit=5)
    pages = [store.search(("acme",), limit=2, offset=o) for o in (0, 2, 4)]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [i.key for p in pages for i in p] == [i.key for i in everything]


def test_search_limit_beyond_recalls_maximum_is_an_error(store: SynedrixMemoryStore) -> None:
    from memfabric.errors import InvalidEnvelope

    with pytest.raises(InvalidEnvelope):
        store.search(("acme",), limit=10, offset=100_000)


@pytest.mark.parametrize(
    "page",
    [{"offset": -5}, {"offset": -5, "limit": 10}, {"limit": -1}],
    ids=["offset", "offset-within-limit", "limit"],
)
def test_a_negative_page_is_refused_before_anything_is_read(
    fabric: Fabric, store: SynedrixMemoryStore, page: dict[str, int]
) -> None:
    """offset=-5 used to send limit + offset and slice the answer from its end."""
    from memfabric.errors import InvalidEnvelope

    before = fabric.counts()
    with pytest.raises(InvalidEnvelope) as info:
        store.search(("acme",), **page)
    assert info.value.sqlstate == "22023" and info.value.hint
    with pytest.raises(InvalidEnvelope):
        asyncio.run(store.asearch(("acme",), **page))
    with pytest.raises(InvalidEnvelope):
        store.list_namespaces(**page)
    assert fabric.counts() == before  # no recall ran, none was audited


def test_search_filters_are_recall_filters(
    store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    assert store.search(("acme",), filter={"min_confidence": 0.95}, limit=10) == []
    assert len(store.search(("acme",), filter={"min_confidence": 0.5}, limit=10)) == 5
    with pytest.raises(ValueError, match="unknown search filter keys"):
        store.search(("acme",), filter={"content.text": "x"}, limit=10)


# --- list_namespaces ----------------------------------------------------------------------


def test_list_namespaces_lists_what_the_run_may_see_and_is_audited(
    fabric: Fabric, store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    before = len(recall_events(fabric, seeded["run"], "served"))
    namespaces = store.list_namespaces()
    assert len(recall_events(fabric, seeded["run"], "served")) == before + 1
    assert all(ns[0] == "acme" for ns in namespaces)
    assert {ns[2] for ns in namespaces} == {"user-8842", "com-agt-003", "sess-1f9c", "tenant"}
    assert {ns[1] for ns in namespaces} == {"episodic", "semantic", "procedural", "profile"}
    assert SUBJECT in namespaces
    assert not any("user-9999" in ns for ns in namespaces)
    assert store.list_namespaces(prefix=("acme", "episodic")) == sorted(
        ns for ns in namespaces if ns[1] == "episodic"
    )
    assert store.list_namespaces(suffix=("tenant",)) == sorted(
        ns for ns in namespaces if ns[2] == "tenant"
    )
    assert store.list_namespaces(prefix=("acme", "*", "tenant")) == sorted(
        ns for ns in namespaces if ns[2] == "tenant"
    )
    assert store.list_namespaces(max_depth=2) == [
        ("acme", t) for t in ("episodic", "procedural", "profile", "semantic")
    ]
    assert store.list_namespaces(prefix=("globex",)) == []
    assert store.list_namespaces(limit=3, offset=1) == sorted(namespaces)[1:4]


# --- batch, as LangGraph's own tests drive it ---------------------------------------------


def test_batch_answers_in_order(store: SynedrixMemoryStore, seeded: dict[str, Any]) -> None:
    ids = seeded["ids"]
    results = store.batch(
        [
            GetOp(namespace=SUBJECT, key=ids["usd"]),
            SearchOp(namespace_prefix=("acme",), query="Monday", limit=5),
            ListNamespacesOp(
                match_conditions=(MatchCondition(match_type="suffix", path=("tenant",)),),
                limit=10,
            ),
            GetOp(namespace=SUBJECT, key=str(uuid.uuid4())),
        ]
    )
    assert len(results) == 4
    assert isinstance(results[0], Item) and results[0].key == ids["usd"]
    assert isinstance(results[1], list) and [i.key for i in results[1]] == [ids["call"]]
    assert isinstance(results[2], list) and all(ns[-1] == "tenant" for ns in results[2])
    assert results[3] is None


def test_async_reads_answer_like_sync_reads(
    store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    async def reads() -> tuple[Any, ...]:
        return (
            await store.aget(SUBJECT, seeded["ids"]["eur"]),
            await store.asearch(("acme",), query="invoices", limit=10),
            await store.alist_namespaces(prefix=("acme", "episodic")),
        )

    got, found, namespaces = asyncio.run(reads())
    assert got == store.get(SUBJECT, seeded["ids"]["eur"])
    assert [i.key for i in found] == [i.key for i in store.search(("acme",), query="invoices")]
    assert namespaces == store.list_namespaces(prefix=("acme", "episodic"))


# --- writes: refused, and the governed path offered ---------------------------------------


def test_put_and_delete_refuse_and_name_the_governed_path(
    fabric: Fabric, store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    before = fabric.counts()
    for attempt in (
        lambda: store.put(SUBJECT, "k", {"text": "remember this"}),
        lambda: store.delete(SUBJECT, seeded["ids"]["eur"]),
        lambda: asyncio.run(store.aput(SUBJECT, "k", {"text": "remember this"})),
        lambda: asyncio.run(store.adelete(SUBJECT, seeded["ids"]["eur"])),
        lambda: store.batch([GetOp(SUBJECT, seeded["ids"]["eur"]), PutOp(SUBJECT, "k", {})]),
    ):
        with pytest.raises(GovernedWriteRefused, match="propose") as refused:
            attempt()
        assert "request_erasure" in str(refused.value)
    assert fabric.counts() == before  # nothing written, nothing even read by the batch


@pytest.mark.clone
def test_propose_maps_a_value_to_an_envelope_inside_the_run(
    fabric: Fabric, store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    answer = store.propose(
        SUBJECT,
        {"text": "wants paper invoices"},
        source_event_id="evt-chat-42",
        correlation_id="corr-9d4a",
        causation_id="evt-chat-41",
    )
    assert answer["status"] == "validated", answer
    memory_id = str(fabric.commit(answer["proposal_id"])["memory_id"])
    item = store.get(SUBJECT, memory_id)
    assert item is not None
    assert item.value["content"] == {"text": "wants paper invoices"}
    assert item.value["provenance"]["source_event_id"] == "evt-chat-42"
    assert item.value["provenance"]["formed_by"] == "os-agt-010"


def test_propose_never_mints_provenance(fabric: Fabric, store: SynedrixMemoryStore) -> None:
    before = fabric.counts()
    with pytest.raises(TypeError):
        store.propose(SUBJECT, {"text": "x"})  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="source_event_id"):
        store.propose(SUBJECT, {"text": "x"}, source_event_id="")
    assert fabric.counts() == before


def test_propose_outside_the_run_scope_is_refused(
    fabric: Fabric, store: SynedrixMemoryStore
) -> None:
    from memfabric.errors import FabricError

    before = fabric.count("proposals")
    with pytest.raises(FabricError) as refused:
        store.propose(("globex", "episodic", "user-8842"), {"text": "x"}, source_event_id="e-1")
    assert refused.value.sqlstate == "42501"
    assert fabric.count("proposals") == before


# --- a compiled graph: the store injected into its nodes ----------------------------------


class State(TypedDict, total=False):
    namespace: tuple[str, ...]
    read: list[str]
    refusals: Annotated[list[str], operator.add]


def reader(state: State, *, store: BaseStore) -> State:
    items = store.search(state["namespace"], query="invoices", limit=10)
    return {"read": sorted(str(i.value.get("content", i.value)) for i in items)}


def writer(state: State, *, store: BaseStore) -> State:
    try:
        store.put(("acme", "episodic", "user-8842"), "note", {"text": "remember me"})
    except GovernedWriteRefused as refused:
        return {"refusals": [str(refused)]}
    return {"refusals": []}


def graph(store: BaseStore) -> Any:
    builder = StateGraph(State)
    builder.add_node("read", reader)
    builder.add_node("write", writer)
    builder.add_edge(START, "read")
    builder.add_edge("read", "write")
    builder.add_edge("write", END)
    return builder.compile(store=store)


def test_a_graph_reads_through_the_store_and_its_write_is_refused(
    fabric: Fabric, store: SynedrixMemoryStore
) -> None:
    before = fabric.count("proposals")
    out = graph(store).invoke({"namespace": ("acme",)})
    assert out["read"] == sorted(
        str({"text": t})
        for t in (
            "asked for invoices in EUR",
            "asked for invoices in USD",
            "escalate invoices to finance",
        )
    )
    assert len(out["refusals"]) == 1
    assert "propose" in out["refusals"][0] and "request_erasure" in out["refusals"][0]
    assert fabric.count("proposals") == before


def test_the_stock_store_leaks_across_tenants_and_ours_does_not(
    fabric: Fabric, store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    stock = InMemoryStore()
    stock.put(("acme", "episodic", "user-8842"), "a", {"text": "asked for invoices in EUR"})
    stock.put(("globex", "episodic", "user-8842"), "g", {"text": "globex secret invoices"})
    # A namespace assembled from untrusted input names another tenant.
    leaked = graph(stock).invoke({"namespace": ("globex",)})
    assert leaked["read"] == ["{'text': 'globex secret invoices'}"]
    assert leaked["refusals"] == []  # and the stock store took the write
    assert stock.get(("acme", "episodic", "user-8842"), "note") is not None

    ours = graph(store).invoke({"namespace": ("globex",)})
    assert ours["read"] == []
    assert len(ours["refusals"]) == 1
    assert len(recall_events(fabric, seeded["run"], "denied")) == 1


@pytest.mark.clone
def test_the_store_reads_over_a_pool_and_from_a_conninfo(
    fabric: Fabric, seeded: dict[str, Any]
) -> None:
    conninfo = psycopg.conninfo.make_conninfo(fabric.url, user="mf_agent_a")
    with ConnectionPool(conninfo, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        pooled = SynedrixMemoryStore(pool, run_id=seeded["run"])
        assert pooled.get(SUBJECT, seeded["ids"]["eur"]) is not None
    with SynedrixMemoryStore.from_conn_string(conninfo, run_id=seeded["run"]) as own:
        assert _keys(own.search(SUBJECT, limit=10)) == {
            seeded["ids"][k] for k in ("eur", "usd", "call")
        }


def test_an_unreadable_tier_is_denied_and_an_unknown_tier_is_an_error(
    fabric: Fabric, store: SynedrixMemoryStore, seeded: dict[str, Any]
) -> None:
    from memfabric.errors import InvalidEnvelope

    assert store.search(("acme", "relational"), limit=10) == []  # outside recall_scope
    assert len(recall_events(fabric, seeded["run"], "denied")) == 1
    with pytest.raises(InvalidEnvelope):
        store.search(("acme", "no-such-tier"), limit=10)
