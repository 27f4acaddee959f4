"""The working tier against a real Redis server (the redis-server scripts/redis.sh starts,
on a free port, per session) and the real fabric: TTLs everywhere, tenant isolation by ACL,
the governed hand-off, erasure, and an outage that leaves durable memory untouched."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, PROFILE_WIDE, ROOT, Fabric, episode
from memfabric import working
from memfabric.errors import FabricError
from memfabric.worker import erase
from memfabric.working import RunRef, WorkingTier, WorkingTierUnavailable

pytestmark = pytest.mark.rollback

REDIS_SH = ROOT / "scripts" / "redis.sh"
MEMFABRIC = ROOT / ".venv" / "bin" / "memfabric"


@dataclass
class RedisServer:
    env: dict[str, str]
    url: str  # the admin (default user)

    def sh(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(REDIS_SH), *args], env=self.env, capture_output=True, text=True, timeout=60
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(root: Path) -> RedisServer:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env |= {"REDIS_DIR": str(root), "REDIS_PORT": str(_free_port())}
    server = RedisServer(env=env, url="")
    try:
        up = server.sh("up")
    except BaseException:  # interrupted while it starts (SIGTERM): it may be up already
        server.sh("down")
        raise
    assert up.returncode == 0, up.stdout + up.stderr
    server.url = server.sh("url").stdout.strip()
    return server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = _start(tmp_path_factory.mktemp("redis"))
    yield server
    assert server.sh("down").returncode == 0


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = working.connect(redis_server.url)
    client.flushall()
    yield client
    client.close()


def tenant_client(server: RedisServer, admin: redis.Redis, tenant: str) -> redis.Redis:
    password = working.grant_tenant(admin, tenant)
    return working.connect(working.tenant_url(server.url, tenant, password))


@pytest.fixture
def run(fabric: Fabric) -> RunRef:
    run_id = fabric.open_run()  # acme, com-agt-003 (mf_agent_a), subject user-8842
    ref = working.run_ref(fabric.connect("mf_agent_a"), str(run_id))
    return dataclasses.replace(ref, subject_id="user-8842", session_id="sess-1f9c")


def unkeyed_digest(tenant: str, subject: str) -> str:
    """How keys named a subject up to 0.11: anyone could compute it from a guessed id."""
    return "s-" + hashlib.sha256(f"{tenant}:{subject}".encode()).hexdigest()[:32]


def turn(n: int, text: str = "asked for invoices in EUR") -> dict[str, Any]:
    return {
        "event_id": f"evt-turn-{n}",
        "correlation_id": "corr-9d4a",
        "causation_id": f"evt-cause-{n}",
        "content": {"text": f"{text} ({n})"},
        "occurred_at": "2026-07-02T09:14:00Z",
    }


def handed_off_and_committed(fabric: Fabric, run: RunRef, wt: WorkingTier) -> list[dict[str, Any]]:
    answers = working.handoff(fabric.connect("mf_agent_a"), run, working=wt)
    assert [a["status"] for a in answers] == ["validated"] * len(answers)
    return [fabric.commit(a["proposal_id"]) for a in answers]


def recall_texts(fabric: Fabric, run: RunRef) -> list[str]:
    answer = fabric.recall(
        "mf_agent_a", {"run_id": run.run_id, "query": "invoices", "tiers": ["episodic"]}
    )
    return sorted(r["content"]["text"] for r in answer["records"])


# --- TTLs: nothing in Redis lives forever ----------------------------------------------------


def test_every_working_key_has_a_ttl(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    wt = WorkingTier(tenant_client(redis_server, admin, "acme"), "acme")
    wt.append_turn(run, turn(1))
    wt.append_turn(run, turn(2))
    assert wt.first_seen(run, "tool-calls", "lookup:42")
    assert not wt.first_seen(run, "tool-calls", "lookup:42")
    wt.remember_response(run, "mcp:propose", "idem-1", {"proposal_id": "p-1"})
    anonymous = RunRef("acme", str(uuid.uuid4()))
    wt.append_turn(anonymous, turn(3))
    keys = list(admin.scan_iter(match="*"))
    assert len(keys) == 4  # two buffers, one dedup window, one idempotency key
    assert all(admin.ttl(k) > 0 for k in keys), {k: admin.ttl(k) for k in keys}
    assert all(k.startswith(b"mf:acme:") for k in keys)
    assert not any(b"user-8842" in k for k in keys)  # subjects appear only as keyed segments


def test_a_tenants_user_cannot_make_a_key_without_a_ttl(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    """A Redis ACL cannot tell SET … EX from SET, so a tenant's user has no command that can
    create a key without a TTL or take one away: SETEX and PSETEX are its only writes, and a
    script runs with its caller's ACL."""
    acme = tenant_client(redis_server, admin, "acme")
    wt = WorkingTier(acme, "acme")
    wt.append_turn(run, turn(1))
    (held,) = admin.scan_iter(match="mf:acme:*")
    before = {k: (admin.dump(k), admin.ttl(k) > 0) for k in admin.scan_iter(match="*")}
    key = "mf:acme:forever"
    for attempt in (
        lambda: acme.set(key, "x"),
        lambda: acme.set(key, "x", ex=60),  # refused too: the ACL cannot see the EX
        lambda: acme.setnx(key, "x"),
        lambda: acme.getset(key, "x"),
        lambda: acme.mset({key: "x"}),
        lambda: acme.append(key, "x"),
        lambda: acme.setrange(key, 0, "x"),
        lambda: acme.incr(key),
        lambda: acme.rpush(key, "x"),
        lambda: acme.hset(key, "f", "x"),
        lambda: acme.sadd(key, "x"),
        lambda: acme.zadd(key, {"x": 1}),
        lambda: acme.xadd(key, {"f": "x"}),
        lambda: acme.persist(held),
        lambda: acme.expire(held, 10**9),
        lambda: acme.rename(held, key),
        lambda: acme.execute_command("COPY", held, key),
        lambda: acme.restore(key, 0, admin.dump(held)),
        lambda: acme.eval("return redis.call('SET', KEYS[1], 'x')", 1, key),
        lambda: acme.script_load("return 1"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    with pytest.raises(redis.exceptions.ResponseError, match="invalid expire"):
        acme.setex(key, 0, "x")
    assert {k: (admin.dump(k), admin.ttl(k) > 0) for k in admin.scan_iter(match="*")} == before
    assert all(ttl for _, ttl in before.values())


def test_cap_ttl_cuts_back_a_ttl_longer_than_the_tiers_longest(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    """What an ACL cannot bound, the admin's `memfabric working cap-ttl` does."""
    acme = tenant_client(redis_server, admin, "acme")
    WorkingTier(acme, "acme").append_turn(run, turn(1))
    acme.setex("mf:acme:for-ten-years", 10 * 365 * 24 * 3600, "x")
    admin.set("mf:acme:set-by-the-admin", "x")  # no TTL: only the admin can do this
    cli = subprocess.run(
        [str(MEMFABRIC), "working", "cap-ttl"],
        env=redis_server.env | {"REDIS_URL": redis_server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert '"ttl_capped": 2' in cli.stdout and '"working_keys": 3' in cli.stdout, cli.stdout
    ttls = {k: admin.ttl(k) for k in admin.scan_iter(match="*")}
    assert all(0 < ttl <= working.IDEMPOTENCY_TTL for ttl in ttls.values()), ttls
    assert admin.ttl(b"mf:acme:for-ten-years") > working.TURN_TTL  # cut back, not expired


def test_a_list_buffer_of_the_previous_version_is_left_to_expire(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    """Up to 0.11 the session buffer was a Redis list under `…:turns`; after an upgrade
    such a key is never read or written again (it expires with its TTL)."""
    segment = unkeyed_digest("acme", run.subject_id) if run.subject_id else "anon"
    old = f"mf:acme:{segment}:run:{run.run_id}:turns"
    admin.rpush(old, json.dumps(turn(0)))
    admin.expire(old, 60)
    wt = WorkingTier(tenant_client(redis_server, admin, "acme"), "acme")
    wt.append_turn(run, turn(1))
    assert [t["event_id"] for t in wt.turns(run)] == ["evt-turn-1"]
    assert admin.llen(old) == 1


def test_first_seen_is_first_once_among_concurrent_workers(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    """NX semantics without SET NX: a WATCHed claim, raced by eight connections."""
    import threading

    url = working.tenant_url(redis_server.url, "acme", working.grant_tenant(admin, "acme"))
    tiers = [WorkingTier(working.connect(url), "acme") for _ in range(8)]
    gate = threading.Barrier(len(tiers))
    firsts: list[bool] = []

    def claim(wt: WorkingTier) -> None:
        gate.wait()
        firsts.append(wt.first_seen(run, "tool-calls", "lookup:race"))

    threads = [threading.Thread(target=claim, args=(wt,)) for wt in tiers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(firsts) == [False] * 7 + [True]


def test_the_session_buffer_keeps_the_last_turns_in_order(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    wt = WorkingTier(tenant_client(redis_server, admin, "acme"), "acme")
    for n in range(working.MAX_TURNS + 5):
        wt.append_turn(run, turn(n))
    held = wt.turns(run)
    assert [t["event_id"] for t in held] == [
        f"evt-turn-{n}" for n in range(5, working.MAX_TURNS + 5)
    ]


def test_a_turn_without_its_event_id_is_refused(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    wt = WorkingTier(admin, "acme")
    with pytest.raises(ValueError, match="event_id"):
        wt.append_turn(run, {"content": {"text": "uncaused"}})
    assert admin.dbsize() == 0


def test_idempotency_key_keeps_the_first_answer(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    wt = WorkingTier(admin, "acme")
    assert wt.remember_response(run, "mcp:propose", "k", {"proposal_id": "p-1"}) == {
        "proposal_id": "p-1"
    }
    assert wt.remember_response(run, "mcp:propose", "k", {"proposal_id": "p-2"}) == {
        "proposal_id": "p-1"
    }
    assert wt.response_for(run, "mcp:propose", "k") == {"proposal_id": "p-1"}
    assert wt.response_for(run, "mcp:recall", "k") is None


def test_a_subject_appears_in_working_keys_only_under_its_key(
    fabric: Fabric, admin: redis.Redis, run: RunRef
) -> None:
    """A key names its subject by an HMAC under the subject's key (fabric_api.working_key),
    never by a digest anyone can compute from a guessed subject id."""
    wt = WorkingTier(admin, "acme")
    wt.append_turn(run, turn(1))
    (key,) = admin.scan_iter(match="mf:acme:*")
    assert re.fullmatch(rb"mf:acme:w-[0-9a-f]{32}:run:[0-9a-f-]{36}:buffer", key), key
    assert unkeyed_digest("acme", "user-8842").encode() not in key
    # every run of the subject shares the segment, so an erasure finds all of its keys
    again = working.run_ref(fabric.connect("mf_agent_a"), str(fabric.open_run()))
    assert again.subject_key == run.subject_key
    other = working.run_ref(fabric.connect("mf_agent_a"), str(fabric.open_run(subject="u-2")))
    assert other.subject_key != run.subject_key
    anonymous = working.run_ref(fabric.connect("mf_agent_a"), str(fabric.open_run(subject=None)))
    assert anonymous.subject_key == "anon"
    # a run with a subject cannot name its keys without the database's segment
    with pytest.raises(ValueError, match=r"working\.run_ref"):
        wt.append_turn(RunRef("acme", run.run_id, "user-8842"), turn(2))


def test_only_the_runs_agent_reads_its_working_key(fabric: Fabric, run: RunRef) -> None:
    sql = "SELECT fabric_api.working_key(%s)"
    assert _refused(fabric, "mf_agent_b", sql, run.run_id) == "42501"
    assert _refused(fabric, "mf_committer", sql, run.run_id) == "42501"


# --- isolation is enforced by Redis ACLs, not by convention ----------------------------------


def test_a_tenants_user_gets_noperm_on_another_tenants_keys(
    redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    acme = tenant_client(redis_server, admin, "acme")
    globex = tenant_client(redis_server, admin, "globex")
    glx_run = RunRef("globex", str(uuid.uuid4()), subject_key="w-" + "1" * 32)
    WorkingTier(globex, "globex").append_turn(glx_run, turn(1))
    WorkingTier(acme, "acme").append_turn(run, turn(1))
    (glx_key,) = admin.scan_iter(match="mf:globex:*")
    before = {k: admin.get(k) for k in admin.scan_iter(match="*")}
    for attempt in (
        lambda: acme.lrange(glx_key, 0, -1),
        lambda: acme.get(glx_key),
        lambda: acme.delete(glx_key),
        lambda: acme.setex("mf:globex:planted", 60, "x"),
        lambda: acme.setex("unprefixed", 60, "x"),
        lambda: acme.keys("*"),
        lambda: list(acme.scan_iter(match="*")),
        lambda: acme.flushall(),
        lambda: acme.acl_setuser("mf-acme", keys=["*"]),
        lambda: acme.config_get("*"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    assert {k: admin.get(k) for k in admin.scan_iter(match="*")} == before
    with pytest.raises(ValueError, match="another tenant"):
        WorkingTier(acme, "acme").append_turn(glx_run, turn(2))


@pytest.mark.clone  # another process connects by URL: needs a clone
def test_grant_tenant_prints_a_url_limited_to_the_tenant(
    fabric: Fabric, redis_server: RedisServer, admin: redis.Redis
) -> None:
    cli = subprocess.run(
        [str(MEMFABRIC), "working", "grant-tenant", "acme"],
        env=redis_server.env | {"REDIS_URL": redis_server.url, "DATABASE_URL": fabric.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    client = working.connect(cli.stdout.strip())
    assert client.ping()
    client.setex("mf:acme:x", 60, "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.setex("mf:globex:x", 60, "1")


def test_granting_a_tenant_again_revokes_its_old_password(
    redis_server: RedisServer, admin: redis.Redis
) -> None:
    old = working.grant_tenant(admin, "acme")
    working.grant_tenant(admin, "acme")
    with pytest.raises(redis.exceptions.AuthenticationError):
        working.connect(working.tenant_url(redis_server.url, "acme", old)).ping()


def test_a_tenant_id_with_glob_characters_is_refused(admin: redis.Redis) -> None:
    with pytest.raises(ValueError, match="slugs"):
        working.grant_tenant(admin, "acme*")
    assert "mf-acme*" not in admin.acl_users()


# --- the hand-off: the only path into durable memory ----------------------------------------


def test_handoff_forms_episodes_with_the_items_provenance_and_emits_promoted(
    fabric: Fabric, admin: redis.Redis, run: RunRef
) -> None:
    wt = WorkingTier(admin, "acme")
    wt.append_turn(run, turn(1))
    wt.append_turn(run, turn(2))
    records = handed_off_and_committed(fabric, run, wt)
    assert [r["provenance"] for r in records] == [
        {
            "source_event_id": f"evt-turn-{n}",
            "correlation_id": "corr-9d4a",
            "causation_id": f"evt-cause-{n}",
            "formation_method": "extraction",
            "formed_by": "os-agt-010",
        }
        for n in (1, 2)
    ]
    assert {r["tier"] for r in records} == {"episodic"}
    assert {r["consolidation_state"] for r in records} == {"raw"}
    for record in records:
        types = [
            (e["event_type"], e["payload"].get("from_tier"), e["correlation_id"], e["causation_id"])
            for e in fabric.events(f"memory_id = '{record['memory_id']}'")
        ]
        cause = record["provenance"]["causation_id"]
        # both events come from the commit's one transaction, where events have no order
        # among themselves (an outbox cursor reads a transaction's events together)
        assert sorted(types, key=str) == [
            ("memory.record.formed", None, "corr-9d4a", cause),
            ("memory.record.promoted", "working", "corr-9d4a", cause),
        ]


def test_handing_off_an_item_again_answers_its_first_proposal(
    fabric: Fabric, admin: redis.Redis, run: RunRef
) -> None:
    """A run resumed after Redis was lost re-hands off what it still holds: nothing forms
    twice. A rejected hand-off is not a hand-off: the item may be handed off again."""
    agent = fabric.connect("mf_agent_a")
    (first,) = working.handoff(agent, run, [turn(1)])
    fabric.commit(first["proposal_id"])
    later_run = RunRef("acme", str(fabric.open_run()), "user-8842", "sess-1f9c")
    again = working.handoff(agent, later_run, [turn(1), turn(2)])
    assert again[0] == {
        "proposal_id": first["proposal_id"],
        "status": "committed",
        "reason": None,
        "replayed": True,
        "event_id": "evt-turn-1",
    }
    assert again[1]["status"] == "validated" and "replayed" not in again[1]
    assert fabric.count("proposals") == 2
    (bad,) = working.handoff(agent, run, [{**turn(3), "confidence": 7}])
    assert bad["status"] == "rejected"
    (retry,) = working.handoff(agent, run, [turn(3)])
    assert retry["status"] == "validated" and retry["proposal_id"] != bad["proposal_id"]


def test_a_rejected_handoff_is_judged_again_once_its_cause_is_fixed(fabric: Fabric) -> None:
    """The same item, unchanged, handed off again after a rejection is judged anew (not the
    old rejection replayed): rejected again while the cause stands, validated once the
    agent's profile allows it, and from then on replayed, in this run or a new one."""
    run = RunRef("acme", str(fabric.open_run(agent_id="com-agt-004")), "user-8842", "sess-1f9c")
    agent = fabric.connect("mf_agent_b")  # may propose subject-visible episodes only
    (bad,) = working.handoff(agent, run, [turn(1)])
    assert bad["status"] == "rejected" and "visibility session" in bad["reason"]
    (still,) = working.handoff(agent, run, [turn(1)])
    assert still["status"] == "rejected" and "replayed" not in still
    assert still["proposal_id"] != bad["proposal_id"]
    fabric.call(
        "mf_admin",
        "SELECT fabric_api.register_agent('com-agt-004', 'mf_agent_b', %s, %s)",
        Jsonb(PROFILE_WIDE),
        MEMORY_TOOLS,
    )
    (fixed,) = working.handoff(agent, run, [turn(1)])
    assert fixed["status"] == "validated" and "replayed" not in fixed
    assert fixed["proposal_id"] not in (bad["proposal_id"], still["proposal_id"])
    record = fabric.commit(fixed["proposal_id"])
    later = RunRef("acme", str(fabric.open_run(agent_id="com-agt-004")), "user-8842", "sess-1f9c")
    (again,) = working.handoff(agent, later, [turn(1)])
    assert again == {
        "proposal_id": fixed["proposal_id"],
        "status": "committed",
        "reason": None,
        "replayed": True,
        "event_id": "evt-turn-1",
    }
    assert fabric.count("memory_records") == 1
    assert fabric.count("proposals", "status = 'rejected'") == 2
    promoted = fabric.events("event_type = 'memory.record.promoted'")
    assert [e["memory_id"] for e in promoted] == [record["memory_id"]]


def test_a_withdrawn_handoff_keeps_answering_after_its_subject_was_erased(
    fabric: Fabric, run: RunRef
) -> None:
    """An item whose proposal was withdrawn by a subject erasure is not formed again when a
    resumed run hands it off: it answers the withdrawn proposal and writes nothing."""
    agent = fabric.connect("mf_agent_a")
    (first,) = working.handoff(agent, run, [turn(1)])
    approval = fabric.call(
        "mf_committer",
        "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'asked')",
    )["approval_id"]
    fabric.call("mf_policy", "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", approval)
    fabric.call("mf_committer", "SELECT fabric_api.erase(%s)", approval)
    later = RunRef("acme", str(fabric.open_run()), "user-8842", "sess-1f9c")
    before = fabric.counts()
    (again,) = working.handoff(agent, later, [turn(1)])
    assert again["proposal_id"] == first["proposal_id"]
    assert again["status"] == "withdrawn" and again["replayed"] is True
    assert fabric.counts() == before


def test_the_committer_drain_promotes_handed_off_items_too(fabric: Fabric, run: RunRef) -> None:
    working.handoff(fabric.connect("mf_agent_a"), run, [turn(1), turn(2)])
    p = fabric.propose("mf_agent_a", episode("said hello"), uuid.UUID(run.run_id))
    drained = fabric.session("mf_committer").execute("SELECT fabric_api.commit_pending(10)")
    assert drained.fetchone()[0]["committed"] == 3  # type: ignore[index]
    promoted = fabric.events("event_type = 'memory.record.promoted'")
    assert sorted(e["payload"]["source_event_id"] for e in promoted) == [
        "evt-turn-1",
        "evt-turn-2",
    ]
    assert p["proposal_id"] not in {e["proposal_id"] for e in promoted}


def test_a_plain_proposal_is_no_promotion(fabric: Fabric, run: RunRef) -> None:
    p = fabric.propose("mf_agent_a", episode(), uuid.UUID(run.run_id))
    fabric.commit(p["proposal_id"])
    assert fabric.events("event_type = 'memory.record.promoted'") == []


def test_handoff_obeys_every_rule_of_propose(fabric: Fabric) -> None:
    """mf_agent_b may propose only subject-visible episodes: a session-visible hand-off is
    a rejected proposal with its reason, and nothing commits or is promoted."""
    run_id = fabric.open_run(agent_id="com-agt-004")
    run = RunRef("acme", str(run_id), "user-8842", "sess-1f9c")
    (answer,) = working.handoff(fabric.connect("mf_agent_b"), run, [turn(1)])
    assert answer["status"] == "rejected"
    assert "visibility session" in answer["reason"]
    assert fabric.count("memory_records") == 0
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        fabric.commit(answer["proposal_id"])


def _refused(fabric: Fabric, login: str, sql: str, *args: Any) -> str:
    before = fabric.counts()
    with pytest.raises(psycopg.Error) as caught:
        fabric.connect(login).execute(sql, args)
    assert fabric.counts() == before
    assert caught.value.sqlstate is not None
    return caught.value.sqlstate


@pytest.mark.parametrize(
    "item",
    [
        {**turn(1), "tier": "semantic"},
        {**turn(1), "formation_method": "consolidation"},
        {**turn(1), "derived_from": []},
        {**turn(1), "from_tier": "working"},
        {k: v for k, v in turn(1).items() if k != "event_id"},
        "not an object",
    ],
    ids=["tier", "formation_method", "derived_from", "from_tier", "no_event_id", "scalar"],
)
def test_a_handoff_item_cannot_choose_what_the_handoff_fixes(
    fabric: Fabric, run: RunRef, item: Any
) -> None:
    sql = "SELECT fabric_api.handoff(%s, %s)"
    assert _refused(fabric, "mf_agent_a", sql, Jsonb([item]), run.run_id) == "22023"


@pytest.mark.parametrize("items", [[], [turn(n) for n in range(101)], {"event_id": "e"}])
def test_a_handoff_batch_is_an_array_of_1_to_100_items(
    fabric: Fabric, run: RunRef, items: Any
) -> None:
    sql = "SELECT fabric_api.handoff(%s, %s)"
    assert _refused(fabric, "mf_agent_a", sql, Jsonb(items), run.run_id) == "22023"


def test_an_agent_cannot_hand_off_into_another_agents_run(fabric: Fabric, run: RunRef) -> None:
    sql = "SELECT fabric_api.handoff(%s, %s)"
    assert _refused(fabric, "mf_agent_b", sql, Jsonb([turn(1)]), run.run_id) == "42501"


def test_an_agent_cannot_mark_its_own_proposal_as_working(fabric: Fabric, run: RunRef) -> None:
    env = episode() | {"from_tier": "working"}
    sql = "SELECT fabric_api.propose(%s, %s)"
    assert _refused(fabric, "mf_agent_a", sql, Jsonb(env), run.run_id) == "22023"
    p = fabric.propose("mf_agent_a", episode(), uuid.UUID(run.run_id))
    update = "UPDATE fabric.proposals SET from_tier = 'working' WHERE proposal_id = %s"
    assert _refused(fabric, "mf_agent_a", update, p["proposal_id"]) == "42501"


@pytest.mark.clone  # sets fabric.tenant_id with set_config
def test_only_the_handoff_marks_a_proposal_even_for_the_owner(fabric: Fabric, run: RunRef) -> None:
    p = fabric.propose("mf_agent_a", episode(), uuid.UUID(run.run_id))
    update = "UPDATE fabric.proposals SET from_tier = 'working' WHERE proposal_id = %s"
    assert _refused(fabric, None, update, p["proposal_id"]) == "MF002"  # type: ignore[arg-type]
    (h,) = working.handoff(fabric.connect("mf_agent_a"), run, [turn(1)])
    unmark = "UPDATE fabric.proposals SET from_tier = NULL WHERE proposal_id = %s"
    su = fabric.su()
    su.execute("SELECT set_config('fabric.tenant_id', 'acme', false)")
    with pytest.raises(psycopg.Error) as caught:
        su.execute(unmark, (h["proposal_id"],))
    assert caught.value.sqlstate == "MF002"


@pytest.mark.clone  # sets session_replication_role
def test_a_handed_off_proposal_is_always_an_extracted_episode(fabric: Fabric, run: RunRef) -> None:
    p = fabric.propose(
        "mf_agent_a",
        episode(provenance={"source_event_id": "e", "formation_method": "declaration"}),
        uuid.UUID(run.run_id),
    )
    su = fabric.su()
    su.execute("SET session_replication_role = replica")  # past the guard trigger
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        su.execute(
            "UPDATE fabric.proposals SET from_tier = 'working' WHERE proposal_id = %s",
            (p["proposal_id"],),
        )
    assert caught.value.diag.constraint_name == "proposals_handoff_forms_extracted_episodes"


# --- nothing in Redis is truth ---------------------------------------------------------------


def test_flushing_redis_loses_no_durable_memory(
    fabric: Fabric, admin: redis.Redis, run: RunRef
) -> None:
    wt = WorkingTier(admin, "acme")
    for n in (1, 2, 3):
        wt.append_turn(run, turn(n))
    handed_off_and_committed(fabric, run, wt)
    wt.append_turn(run, turn(4, "not handed off yet"))
    recalled = recall_texts(fabric, run)
    assert len(recalled) == 3
    admin.flushall()
    assert wt.turns(run) == []
    assert recall_texts(fabric, run) == recalled


def test_recall_never_reads_redis(fabric: Fabric, admin: redis.Redis, run: RunRef) -> None:
    """A turn held only in working memory is invisible to recall until handed off."""
    wt = WorkingTier(admin, "acme")
    wt.append_turn(run, turn(1))
    assert recall_texts(fabric, run) == []
    handed_off_and_committed(fabric, run, wt)
    assert recall_texts(fabric, run) == ["asked for invoices in EUR (1)"]


# --- an outage degrades the working tier only ------------------------------------------------


@pytest.mark.clone  # another process connects by URL: needs a clone
def test_a_redis_outage_fails_working_ops_clearly_while_propose_and_recall_work(
    fabric: Fabric, run: RunRef, tmp_path: Path
) -> None:
    server = _start(tmp_path / "redis")
    wt = WorkingTier(working.connect(server.url, timeout=0.5), "acme")
    wt.append_turn(run, turn(1))
    assert server.sh("down").returncode == 0
    for op in (
        lambda: wt.append_turn(run, turn(2)),
        lambda: wt.turns(run),
        lambda: wt.first_seen(run, "w", "t"),
        lambda: wt.remember_response(run, "s", "k", {}),
    ):
        with pytest.raises(WorkingTierUnavailable, match="propose, commit and recall"):
            op()
    # The durable path does not notice: the items are handed off from the caller's copy.
    (answer,) = working.handoff(fabric.connect("mf_agent_a"), run, [turn(1)])
    fabric.commit(answer["proposal_id"])
    p = fabric.propose("mf_agent_a", episode("invoices by post"), uuid.UUID(run.run_id))
    fabric.commit(p["proposal_id"])
    assert recall_texts(fabric, run) == ["asked for invoices in EUR (1)", "invoices by post"]

    cli = subprocess.run(
        [str(MEMFABRIC), "working", "grant-tenant", "acme"],
        env=server.env | {"REDIS_URL": server.url, "DATABASE_URL": fabric.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 1
    assert cli.stderr.count("\n") == 1
    assert cli.stderr.startswith("error: the working tier (Redis) is unavailable")
    assert "Traceback" not in cli.stderr + cli.stdout


# --- erasure reaches the working tier --------------------------------------------------------


@pytest.mark.clone  # another process connects by URL: needs a clone
def test_a_subject_erasure_deletes_the_subjects_working_keys(
    fabric: Fabric, redis_server: RedisServer, admin: redis.Redis, run: RunRef
) -> None:
    wt = WorkingTier(admin, "acme")
    wt.append_turn(run, turn(1))
    wt.first_seen(run, "w", "t")
    wt.remember_response(run, "mcp:propose", "k", {"proposal_id": "p"})
    other = working.run_ref(fabric.connect("mf_agent_a"), str(fabric.open_run(subject="user-1")))
    wt.append_turn(other, turn(9))
    # a key written by 0.11 or earlier under the unkeyed digest: the erasure reaches it too
    legacy = unkeyed_digest("acme", "user-8842")
    admin.set(f"mf:acme:{legacy}:run:{run.run_id}:turns", b"[]", ex=3600)
    committer = fabric.connect("mf_committer")
    approval = committer.execute(
        "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'art. 17')"
    ).fetchone()[0]["approval_id"]  # type: ignore[index]
    fabric.session("mf_policy").execute(
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval,)
    )
    cli = subprocess.run(
        [str(MEMFABRIC), "erase", str(approval)],
        env=redis_server.env
        | {
            "REDIS_URL": redis_server.url,
            "MEMFABRIC_COMMITTER_URL": psycopg.conninfo.make_conninfo(
                fabric.url, user="mf_committer"
            ),
            "MEMFABRIC_MAINTAINER_URL": psycopg.conninfo.make_conninfo(
                fabric.url, user="mf_maintainer"
            ),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    segment = run.subject_key
    assert f"'working_keys_deleted': 4, 'patterns': ['mf:acme:{segment}:*']" in cli.stdout
    assert "user-8842" not in cli.stdout and legacy not in cli.stdout
    assert list(admin.scan_iter(match=f"mf:acme:{segment}:*")) == []
    assert list(admin.scan_iter(match=f"mf:acme:{legacy}:*")) == []
    assert wt.turns(other) == [turn(9)]
    (receipt,) = fabric.events("event_type = 'memory.working.erased'")
    assert receipt["payload"] == {
        "approval_id": str(approval),
        "keys_deleted": 4,
        "patterns": [f"mf:acme:{segment}:*"],
    }
    assert receipt["actor_agent_id"] == "os-agt-010"
    # No event confirms a guessed subject id; the subject's key is destroyed, so the
    # segment is unlinkable: the same subject id comes back under a new key.
    assert legacy not in json.dumps([e["payload"] for e in fabric.events()], default=str)
    later = working.run_ref(fabric.connect("mf_agent_a"), str(fabric.open_run()))
    assert later.subject_key not in (segment, legacy)


def _approved_subject_erasure(fabric: Fabric) -> str:
    committer = fabric.connect("mf_committer")
    approval = committer.execute(
        "SELECT fabric_api.request_subject_erasure('acme', 'user-8842', 'art. 17')"
    ).fetchone()[0]["approval_id"]  # type: ignore[index]
    fabric.session("mf_policy").execute(
        "SELECT fabric_api.decide_approval(%s, 'approved', 'ok')", (approval,)
    )
    return str(approval)


def test_a_working_erasure_is_recorded_only_after_the_erasure_ran(fabric: Fabric) -> None:
    approval = _approved_subject_erasure(fabric)
    pattern = "mf:acme:w-" + "0" * 32 + ":*"
    sql = "SELECT fabric_api.record_working_erasure(%s, 1, %s)"
    assert _refused(fabric, "mf_committer", sql, approval, [pattern]) == "55000"


@pytest.mark.parametrize(
    "patterns",
    [
        [],
        ["*"],
        ["mf:globex:w-" + "0" * 32 + ":*"],
        ["mf:acme:user-8842:*"],
        [None],
        ["mf:acme:" + unkeyed_digest("acme", "user-8842") + ":*"],
    ],
    ids=["none", "everything", "other_tenant", "subject_id", "null", "unkeyed_digest"],
)
def test_a_working_erasure_receipt_names_only_keyed_subject_patterns(
    fabric: Fabric, patterns: list[str | None]
) -> None:
    approval = _approved_subject_erasure(fabric)
    erase(fabric.connect("mf_committer"), approval)
    sql = "SELECT fabric_api.record_working_erasure(%s, 1, %s)"
    assert _refused(fabric, "mf_committer", sql, approval, patterns) == "22023"


def test_only_a_committer_records_a_working_erasure(fabric: Fabric) -> None:
    approval = _approved_subject_erasure(fabric)
    pattern = "mf:acme:w-" + "0" * 32 + ":*"
    sql = "SELECT fabric_api.record_working_erasure(%s, 1, %s)"
    assert _refused(fabric, "mf_agent_a", sql, approval, [pattern]) == "42501"


def test_the_working_erasure_scope_is_for_committers_only(fabric: Fabric) -> None:
    sql = "SELECT fabric_api.working_erasure_scope(%s)"
    assert _refused(fabric, "mf_agent_a", sql, uuid.uuid4()) == "42501"


def test_a_record_erasure_has_no_working_scope(fabric: Fabric, run: RunRef) -> None:
    p = fabric.propose("mf_agent_a", episode(), uuid.UUID(run.run_id))
    record = fabric.commit(p["proposal_id"])
    committer = fabric.connect("mf_committer")
    approval = committer.execute(
        "SELECT fabric_api.request_erasure(%s, 'art. 17')", (record["memory_id"],)
    ).fetchone()[0]["approval_id"]  # type: ignore[index]
    assert working.erasure_scope(committer, str(approval)) is None


# --- air-gapped instances use a local Redis --------------------------------------------------


def test_an_air_gapped_instance_refuses_a_remote_redis(fabric: Fabric) -> None:
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        (Jsonb({"deployment_mode": "air-gapped", "local_hosts": ["redis.internal"]}),),
    )
    conn = fabric.connect("mf_agent_a")
    with pytest.raises(FabricError) as caught:
        working.check_uri(conn, "acme", "redis://default:pw@cache.example.com:6379/0")
    assert caught.value.sqlstate == "23514"
    assert "pw" not in str(caught.value)
    for local in ("redis://127.0.0.1:6379/0", "redis://u:p@redis.internal:6379", "unix:///tmp/r"):
        working.check_uri(conn, "acme", local)
    working.check_uri(conn, "globex", "redis://cache.example.com:6379/0")  # globex: saas


def test_open_tier_checks_the_uri_before_it_connects(
    fabric: Fabric, redis_server: RedisServer
) -> None:
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        (Jsonb({"deployment_mode": "air-gapped"}),),
    )
    conn = fabric.connect("mf_agent_a")
    with pytest.raises(FabricError) as caught:
        working.open_tier(conn, "acme", "redis://cache.example.com:6379/0")
    assert caught.value.sqlstate == "23514"
    assert working.open_tier(conn, "acme", redis_server.url).client.ping()
