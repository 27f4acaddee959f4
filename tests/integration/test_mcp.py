"""`memfabric mcp`, end to end with the `mcp` client SDK over both transports: the tools
listed with the database's schemas, recall and propose as an agent, a denied tool, an
expired run, a revoked token, and two agents of two tenants that cannot see each other.

The stdio server is spawned as an MCP client configuration would spawn it; the HTTP
gateway runs as `memfabric mcp http` with its own login (mf_gateway, a member of
fabric_mcp_gateway). Both log in as the agent's own login. The test server trusts local
logins, except two made to authenticate with scram-sha-256 for the password-file tests at
the end.

Starting either server costs about 2 s of CPU (the interpreter and the mcp SDK), so the
tests that need nothing fresh share one database (`shared`), one gateway and one stdio
server of mf_agent_a on one run (`agent_a`), kept open between tests as a client keeps its
server: each test writes under runs, tokens and texts of its own and reads back only what
it wrote. The tests of start-up, expiry and passwords start their own.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError
from psycopg import sql
from psycopg.types.json import Jsonb

from conftest import MEMORY_TOOLS, PROFILE_WIDE, ClonePool, Fabric, cloned
from servers import stop_process

ROOT = Path(__file__).resolve().parents[2]
NO_BROKER = {"MEMFABRIC_SOCKET": str(Path(tempfile.gettempdir()) / "mf-no-broker.sock")}


def env_for(fabric: Fabric) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("QDRANT_", "MEMFABRIC_"))},
        **NO_BROKER,
        "DATABASE_URL": fabric.url,
    }


def stdio(fabric: Fabric, login: str, run: uuid.UUID) -> Client:
    """The server an MCP client configuration starts: `memfabric mcp stdio`."""
    return Client(
        StdioServerParameters(
            command=sys.executable,
            args=["-m", "memfabric.cli", "mcp", "stdio", "--login", login, "--run", str(run)],
            env=env_for(fabric),
            cwd=str(ROOT),
        )
    )


@asynccontextmanager
async def http(url: str, token: str, statuses: list[int] | None = None) -> AsyncIterator[Client]:
    """An MCP client over HTTP with `token`; the HTTP status of every response is appended
    to `statuses` when given (the client turns a refusal into a generic MCPError)."""
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as h:
        if statuses is not None:

            async def record(response: httpx2.Response) -> None:
                statuses.append(response.status_code)

            h.event_hooks["response"].append(record)
        async with Client(streamable_http_client(url, http_client=h)) as client:
            yield client


def run_async(fn: Callable[[], Awaitable[None]]) -> None:
    anyio.run(fn)


def issue(fabric: Fabric, run: uuid.UUID, ttl: str | None = None) -> str:
    row = (
        fabric.session("mf_orchestrator")
        .execute("SELECT fabric_api.issue_mcp_token(%s, %s::interval)", (run, ttl))
        .fetchone()
    )
    assert row is not None
    return str(row[0])


def envelope(text: str, tenant: str = "acme", **extra: Any) -> dict[str, Any]:
    """What a model sends: no source_event_id (the MCP request becomes it)."""
    return {
        "tier": "episodic",
        "scope": {"tenant_id": tenant, "visibility": "subject"},
        "content": {"text": text},
        "provenance": {"formation_method": "extraction"},
        "confidence": 0.9,
        **extra,
    }


def property_names(schema: Any) -> set[str]:
    """Every property name a JSON schema declares, at any depth."""
    if isinstance(schema, list):
        return set().union(set(), *(property_names(s) for s in schema))
    if not isinstance(schema, dict):
        return set()
    names = (
        set(schema.get("properties", {})) if isinstance(schema.get("properties"), dict) else set()
    )
    return names.union(*(property_names(v) for v in schema.values()))


def answer(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None, result
    return dict(result.structured_content)


@contextmanager
def http_gateway(env: dict[str, str], login: str, *extra: str) -> Iterator[str]:
    """`memfabric mcp http` on a free port, logging in as `login`; its /mcp URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memfabric.cli",
            "mcp",
            "http",
            "--port",
            str(port),
            "--gateway-login",
            login,
            *extra,
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for _ in range(300):
            if proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def shared(clones: ClonePool) -> Iterator[Fabric]:
    """The database of the module's shared gateway and stdio server (module docstring)."""
    with cloned(clones) as f:
        yield f


@pytest.fixture(scope="module")
def gateway(shared: Fabric) -> Iterator[str]:
    with http_gateway(env_for(shared), "mf_gateway") as url:
        yield url


@dataclass
class StdioServer:
    """A stdio server kept open across tests: its client lives in the event loop of a
    background thread (`portal`), where `run_async` runs a test's coroutine."""

    fabric: Fabric
    run: uuid.UUID
    client: Client
    portal: BlockingPortal

    def run_async(self, fn: Callable[[], Awaitable[None]]) -> None:
        self.portal.call(fn)


@pytest.fixture(scope="module")
def agent_a(shared: Fabric) -> Iterator[StdioServer]:
    """`memfabric mcp stdio` as mf_agent_a on one ordinary run of `shared`."""
    run = shared.open_run()
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(stdio(shared, "mf_agent_a", run)) as client,
    ):
        yield StdioServer(shared, run, client, portal)


# --- stdio ---------------------------------------------------------------------------------


def test_stdio_lists_the_three_tools_with_the_database_schemas(agent_a: StdioServer) -> None:
    fabric, client = agent_a.fabric, agent_a.client
    published = (
        fabric.session("mf_agent_a")
        .execute("SELECT fabric_api.request_schema('recall'), fabric_api.request_schema('propose')")
        .fetchone()
    )
    assert published is not None

    async def go() -> None:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == {"memory_recall", "memory_get", "memory_propose"}
        recall_schema = listed["memory_recall"].input_schema
        assert "run_id" not in recall_schema["properties"]
        assert "run_id" not in recall_schema.get("required", [])
        assert recall_schema["properties"] == {
            k: v for k, v in published[0]["properties"].items() if k not in ("run_id", "scope")
        }
        propose_schema = listed["memory_propose"].input_schema
        assert propose_schema["required"] == ["content"]
        assert propose_schema["properties"]["content"] == published[1]["properties"]["content"]
        # nothing the run knows better than the model: no tenant, subject, session, agent,
        # run or formation method is a property anywhere in the tools' schemas
        asked = set().union(*(property_names(t.input_schema) for t in listed.values()))
        run_fields = {"tenant_id", "subject_id", "session_id", "agent_id", "run_id", "scope"}
        assert asked & (run_fields | {"provenance", "formation_method"}) == set()
        assert listed["memory_get"].annotations.read_only_hint is True
        for tool in listed.values():
            assert tool.description and len(tool.description) > 80

    agent_a.run_async(go)


def test_stdio_propose_then_recall_and_get_as_the_agent(agent_a: StdioServer) -> None:
    fabric, client = agent_a.fabric, agent_a.client
    served = f"event_type = 'memory.recall.served' AND run_id = '{agent_a.run}'"
    earlier = len(fabric.events(served))
    proposal: list[str] = []

    async def go() -> None:
        proposed = answer(await client.call_tool("memory_propose", envelope("prefers EUR")))
        assert proposed["status"] == "validated", proposed
        proposal.append(proposed["proposal_id"])
        committed = fabric.commit(proposed["proposal_id"])
        recalled = answer(await client.call_tool("memory_recall", {"query": "EUR"}))
        assert recalled["status"] == "served", recalled
        assert recalled["mode_served"] == "text"
        assert [r["memory_id"] for r in recalled["records"]] == [committed["memory_id"]]
        got = answer(await client.call_tool("memory_get", {"memory_ids": [committed["memory_id"]]}))
        assert [r["content"] for r in got["records"]] == [{"text": "prefers EUR"}]

    agent_a.run_async(go)
    # Provenance is the MCP request, never invented; the audit names the tool.
    (pid,) = proposal
    source = fabric.events(
        f"event_type = 'memory.proposal.validated' AND proposal_id = '{uuid.UUID(pid)}'"
    )
    assert source
    with fabric.su() as c:
        row = c.execute(
            "SELECT source_event_id FROM fabric.proposals WHERE proposal_id = %s", (pid,)
        ).fetchone()
    assert row is not None and row[0].startswith("mcp:") and row[0].count(":") == 2
    recalls = fabric.events(served)[earlier:]
    assert len(recalls) == 2  # memory_get is audited as a recall
    assert all(e["correlation_id"] for e in recalls)


def test_stdio_propose_takes_only_what_the_model_knows(agent_a: StdioServer) -> None:
    """The model sends content (and optional tier, visibility, confidence); the tenant comes
    from the run, the formation method is extraction, the request is the source event."""
    fabric, client = agent_a.fabric, agent_a.client

    ids: list[str] = []

    async def go() -> None:
        proposed = answer(
            await client.call_tool("memory_propose", {"content": {"text": "prefers tea"}})
        )
        assert proposed["status"] == "validated", proposed
        ids.append(str(proposed["proposal_id"]))

    agent_a.run_async(go)
    (proposal_id,) = ids
    row = (
        fabric.session(None)
        .execute(
            "SELECT tenant_id, subject_id, visibility, formation_method, source_event_id, tier"
            " FROM fabric.proposals WHERE proposal_id = %s",
            (proposal_id,),
        )
        .fetchone()
    )
    assert row is not None
    assert row[:4] == ("acme", "user-8842", "subject", "extraction")
    assert row[4].startswith("mcp:") and row[5] == "episodic"


def test_stdio_answers_an_unreadable_line_with_a_json_rpc_error_and_serves_on(
    agent_a: StdioServer,
) -> None:
    """A line that is not JSON gets -32700 and one that is JSON but no message -32600, both
    with id null (JSON-RPC 2.0, section 5.1), an empty line nothing; the server answers the
    next request."""
    run = agent_a.fabric.open_run()
    server = ("mcp", "stdio", "--login", "mf_agent_a", "--run", str(run))
    proc = subprocess.Popen(
        [sys.executable, "-m", "memfabric.cli", *server],
        env=env_for(agent_a.fabric),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        init = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        }
        for line in ("", "{this is not json", '{"hello": "world"}', json.dumps(init)):
            proc.stdin.write(line + "\n")
        proc.stdin.flush()
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
        answers = []
        for _ in range(3):
            try:
                answers.append(json.loads(lines.get(timeout=30)))
            except queue.Empty:
                raise AssertionError(f"no answer after {answers}") from None
    finally:
        proc.stdin.close()
        stop_process(proc)
    parse, invalid, initialized = answers
    assert parse == {"jsonrpc": "2.0", "id": None, "error": parse["error"]}, parse
    assert parse["error"]["code"] == -32700
    assert invalid["id"] is None and invalid["error"]["code"] == -32600, invalid
    assert initialized["id"] == 7 and initialized["result"]["serverInfo"]["name"] == "memfabric"


def test_a_caller_supplied_source_event_is_kept(agent_a: StdioServer) -> None:
    fabric, client = agent_a.fabric, agent_a.client
    env = envelope("asked twice")
    env["provenance"]["source_event_id"] = "evt-chat-42"

    async def go() -> None:
        assert answer(await client.call_tool("memory_propose", env))["status"] == "validated"

    agent_a.run_async(go)
    assert fabric.count("proposals", "source_event_id = 'evt-chat-42'") == 1


def test_a_tool_outside_the_run_is_a_tool_error_with_the_denial(fabric: Fabric) -> None:
    run = fabric.open_run(tools=["tool:memory-recall"])
    before = fabric.count("proposals")

    async def go() -> None:
        async with stdio(fabric, "mf_agent_a", run) as client:
            result = await client.call_tool("memory_propose", envelope("not allowed"))
            assert result.is_error
            denied = answer(result)
            assert denied["status"] == "denied"
            assert "active_tool_set" in denied["reason"]
            # still serving
            assert not (await client.call_tool("memory_recall", {})).is_error

    run_async(go)
    assert fabric.count("proposals") == before
    events = fabric.events("event_type = 'agent.tool.unauthorized'")
    assert [e["payload"]["tool"] for e in events] == ["tool:memory-propose"]


def test_an_agent_without_the_tool_gets_a_denied_recall(fabric: Fabric) -> None:
    run = fabric.open_run(agent_id="com-agt-009", tools=[])

    async def go() -> None:
        async with stdio(fabric, "mf_agent_notools", run) as client:
            result = await client.call_tool("memory_get", {"memory_ids": [str(uuid.uuid4())]})
            assert result.is_error
            assert "tools_allowed" in answer(result)["reason"]

    run_async(go)
    assert fabric.count("events", "event_type = 'agent.tool.unauthorized'") == 1


@pytest.mark.slow
def test_an_expired_run_is_a_tool_error_and_the_server_keeps_serving(fabric: Fabric) -> None:
    run = fabric.open_run(ttl="1 second")
    time.sleep(1.2)

    async def go() -> None:
        async with stdio(fabric, "mf_agent_a", run) as client:
            for tool, args in (
                ("memory_recall", {"query": "x"}),
                ("memory_propose", envelope("late")),
            ):
                result = await client.call_tool(tool, args)
                assert result.is_error
                error = answer(result)
                assert error["sqlstate"] == "42501", error
                assert error["hint"]
            assert len((await client.list_tools()).tools) == 3

    run_async(go)
    assert fabric.count("proposals") == 0


def test_malformed_arguments_are_tool_errors_with_sqlstate_and_hint(agent_a: StdioServer) -> None:
    fabric, client = agent_a.fabric, agent_a.client
    before = fabric.count("proposals")

    async def go() -> None:
        bad_limit = answer(await client.call_tool("memory_recall", {"limit": 0}))
        assert bad_limit["sqlstate"] == "22023" and bad_limit["hint"]
        bad_time = await client.call_tool("memory_recall", {"filters": {"valid_at": "yesterday"}})
        assert answer(bad_time)["sqlstate"] == "22007"
        no_tier = answer(await client.call_tool("memory_propose", {"content": {}}))
        assert no_tier["sqlstate"] == "22023"
        unknown = await client.call_tool("memory_forget", {})
        assert unknown.is_error
        assert not (await client.call_tool("memory_recall", {})).is_error

    agent_a.run_async(go)
    assert fabric.count("proposals") == before


def test_the_caller_cannot_pick_another_run_or_tenant(agent_a: StdioServer) -> None:
    fabric, client = agent_a.fabric, agent_a.client
    other = fabric.open_run(agent_id="glx-agt-001", tenant="globex")
    before = fabric.counts()

    async def go() -> None:
        foreign = answer(await client.call_tool("memory_propose", envelope("x", "globex")))
        assert foreign["sqlstate"] == "42501", foreign
        # a run_id in the arguments is overridden by the session's run
        result = answer(await client.call_tool("memory_recall", {"run_id": str(other)}))
        assert result.get("sqlstate") == "22023" or result["status"] == "served", result

    agent_a.run_async(go)
    after = fabric.counts()
    assert after["proposals"] == before["proposals"]
    assert fabric.count("events", f"run_id = '{other}' AND event_type LIKE 'memory.recall%'") == 0


@pytest.mark.slow
def test_the_documented_stdio_configuration_recalls_and_proposes(
    fabric: Fabric, tmp_path: Path
) -> None:
    """docs/mcp.md's client configuration, as a desktop client would run it, with this
    test's database, run and a password file in place of the example values."""
    text = (ROOT / "docs" / "mcp.md").read_text()
    block = re.search(r"```json\n(\{\n  \"mcpServers\".*?)```", text, re.S)
    assert block is not None
    server = json.loads(block.group(1))["mcpServers"]["memory"]
    run = fabric.open_run()
    passfile = tmp_path / "agent.pgpass"
    passfile.write_text("*:*:*:mf_agent_a:unused-under-trust\n")
    passfile.chmod(0o600)
    assert set(server["env"]) == {
        "DATABASE_URL",
        "MEMFABRIC_AGENT_LOGIN",
        "MEMFABRIC_RUN_ID",
        "MEMFABRIC_MCP_PASSFILE",
    }
    env = {
        **env_for(fabric),
        "MEMFABRIC_AGENT_LOGIN": "mf_agent_a",
        "MEMFABRIC_RUN_ID": str(run),
        "MEMFABRIC_MCP_PASSFILE": str(passfile),
    }
    command = Path(sys.executable).parent / Path(server["command"]).name
    params = StdioServerParameters(command=str(command), args=server["args"], env=env)

    async def go() -> None:
        async with Client(params) as client:
            proposed = answer(await client.call_tool("memory_propose", envelope("likes tea")))
            assert proposed["status"] == "validated", proposed
            fabric.commit(proposed["proposal_id"])
            recalled = answer(await client.call_tool("memory_recall", {"query": "tea"}))
            assert [r["content"] for r in recalled["records"]] == [{"text": "likes tea"}]

    run_async(go)


def test_a_desktop_config_with_an_agent_token_keeps_working_across_runs(
    fabric: Fabric, tmp_path: Path
) -> None:
    """docs/mcp.md's token configuration, launched as a desktop client would: no run id; the
    gateway's login opens a run from the token, renews it when it expires, and revoking the
    token closes its runs and ends the calls."""
    text = (ROOT / "docs" / "mcp.md").read_text()
    blocks = re.findall(r"```json\n(\{\n  \"mcpServers\".*?)```", text, re.S)
    (server,) = [
        json.loads(b)["mcpServers"]["memory"] for b in blocks if "MEMFABRIC_AGENT_TOKEN" in b
    ]
    assert "MEMFABRIC_RUN_ID" not in server["env"] and "MEMFABRIC_AGENT_LOGIN" not in server["env"]
    issued = fabric.call(
        "mf_orchestrator",
        "SELECT fabric_api.issue_agent_token('acme', 'com-agt-003', 'user-8842', NULL, %s,"
        " '2 seconds')",
        MEMORY_TOOLS,
    )
    passfile = tmp_path / "agent.pgpass"
    passfile.write_text("*:*:*:mf_agent_a:unused\n*:*:*:mf_gateway:unused\n")
    passfile.chmod(0o600)
    env = {
        **env_for(fabric),
        "MEMFABRIC_AGENT_TOKEN": issued["token"],
        "MEMFABRIC_MCP_GATEWAY_LOGIN": "mf_gateway",
        "MEMFABRIC_MCP_PASSFILE": str(passfile),
    }
    assert set(server["env"]) == set(env) - set(env_for(fabric)) | {"DATABASE_URL"}
    command = Path(sys.executable).parent / Path(server["command"]).name
    params = StdioServerParameters(command=str(command), args=server["args"], env=env)
    token_runs = f"token_id = '{issued['token_id']}'"

    async def go() -> None:
        async with Client(params) as client:
            proposed = answer(
                await client.call_tool("memory_propose", {"content": {"text": "likes tea"}})
            )
            assert proposed["status"] == "validated", proposed
            fabric.commit(proposed["proposal_id"])
            await anyio.sleep(2.2)  # the first run has expired
            recalled = answer(await client.call_tool("memory_recall", {"query": "tea"}))
            assert [r["content"] for r in recalled["records"]] == [{"text": "likes tea"}]
            assert fabric.count("runs", token_runs) == 2
            fabric.call(
                "mf_orchestrator",
                "SELECT fabric_api.revoke_agent_token('acme', %s)",
                issued["token_id"],
            )
            refused = await client.call_tool("memory_recall", {"query": "tea"})
            assert refused.is_error and answer(refused)["sqlstate"] == "42501"

    run_async(go)
    assert fabric.count("runs", token_runs + " AND opened_by = 'mf_gateway'") == 2
    assert fabric.count("runs", token_runs + " AND closed_at IS NULL") == 0
    audited = "event_type = 'fabric.run.opened' AND payload->>'token_id' = '{}'"
    assert fabric.count("events", audited.format(issued["token_id"])) == 2


# --- streamable HTTP -----------------------------------------------------------------------


def test_http_recall_and_propose_with_a_token(shared: Fabric, gateway: str) -> None:
    fabric = shared
    run = fabric.open_run()
    token = issue(fabric, run)

    async def go() -> None:
        async with http(gateway, token) as client:
            assert len((await client.list_tools()).tools) == 3
            proposed = answer(await client.call_tool("memory_propose", envelope("ships to Oslo")))
            assert proposed["status"] == "validated", proposed
            fabric.commit(proposed["proposal_id"])
            recalled = answer(await client.call_tool("memory_recall", {"query": "Oslo"}))
            assert [r["content"] for r in recalled["records"]] == [{"text": "ships to Oslo"}]

    run_async(go)
    with fabric.su() as c:
        row = c.execute(
            "SELECT source_event_id, proposed_by FROM fabric.proposals WHERE run_id = %s", (run,)
        ).fetchone()
    assert row is not None and row[0].startswith("mcp:") and row[1] == "com-agt-003"
    # only the hash is stored
    assert fabric.count("mcp_tokens", f"token_hash = sha256('{token}'::bytea)") == 1


def test_http_refuses_a_missing_unknown_or_revoked_token(shared: Fabric, gateway: str) -> None:
    fabric = shared
    run = fabric.open_run()
    token = issue(fabric, run)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for header in ({}, {"Authorization": "Bearer mft_" + "0" * 64}):
        response = httpx2.post(gateway, json=body, headers=header)
        assert response.status_code == 401
        assert response.json()["sqlstate"] == "42501"

    async def go() -> None:
        statuses: list[int] = []
        async with http(gateway, token, statuses) as client:
            assert not (await client.call_tool("memory_recall", {})).is_error
            fabric.session("mf_orchestrator").execute(
                "SELECT fabric_api.revoke_mcp_token(%s)", (token,)
            )
            assert 401 not in statuses
            with pytest.raises(MCPError):  # the client's form of the transport's 401
                await client.call_tool("memory_recall", {})
            assert statuses[-1] == 401, statuses
        statuses.clear()
        with pytest.RaisesGroup(MCPError, flatten_subgroups=True):
            async with http(gateway, token, statuses) as client:
                await client.list_tools()
        assert statuses and set(statuses) == {401}, statuses  # refused from the start

    run_async(go)
    response = httpx2.post(gateway, json=body, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert fabric.count("events", f"event_type = 'memory.recall.served' AND run_id = '{run}'") == 1


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def rpc(url: str, token: str, body: dict[str, Any], session: str | None = None) -> Any:
    """One JSON-RPC message posted as a client would; the response (SSE or JSON)."""
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}"}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return httpx2.post(url, json=body, headers=headers, timeout=30)


def rpc_answer(response: Any) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(data[-1]))
    return dict(response.json())


def opened_session(url: str, token: str) -> str:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    opened = rpc(url, token, init)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert rpc(url, token, initialized, session).status_code == 202
    return str(session)


def test_http_a_session_serves_only_the_token_that_opened_it(shared: Fabric, gateway: str) -> None:
    """Another live token (here of the same agent and tenant, another run) posting into a
    session it did not open is refused with a reason and writes nothing; the session goes
    on serving its own token."""
    fabric = shared
    mine, theirs = issue(fabric, fabric.open_run()), issue(fabric, fabric.open_run())
    session = opened_session(gateway, mine)
    propose = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "memory_propose", "arguments": envelope("posted into a session")},
    }
    before = fabric.count("proposals")
    refused = rpc(gateway, theirs, propose, session)
    assert refused.status_code == 403, refused.text
    error = refused.json()
    assert error["sqlstate"] == "42501" and "another token" in error["message"], error
    assert error["hint"]
    assert fabric.count("proposals") == before
    served = rpc_answer(rpc(gateway, mine, propose, session))
    assert served["result"]["structuredContent"]["status"] == "validated", served
    assert fabric.count("proposals") == before + 1
    # its own session, opened by the other token, serves the other token
    assert rpc(gateway, theirs, propose, opened_session(gateway, theirs)).status_code == 200


def test_http_a_token_expires_with_its_ttl_or_its_run(shared: Fabric, gateway: str) -> None:
    fabric = shared
    short = issue(fabric, fabric.open_run(), "1 second")
    run = fabric.open_run(ttl="1 second")
    with_run = issue(fabric, run)
    time.sleep(1.2)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for token in (short, with_run):
        response = httpx2.post(gateway, json=body, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 401, response.text


def test_two_agents_of_two_tenants_cannot_see_each_other(shared: Fabric, gateway: str) -> None:
    fabric = shared
    acme = issue(fabric, fabric.open_run())
    globex = issue(fabric, fabric.open_run(agent_id="glx-agt-001", tenant="globex"))

    async def go() -> None:
        ids: dict[str, str] = {}
        async with http(gateway, acme) as a, http(gateway, globex) as g:
            for client, tenant in ((a, "acme"), (g, "globex")):
                proposed = answer(
                    await client.call_tool("memory_propose", envelope(f"{tenant} secret", tenant))
                )
                assert proposed["status"] == "validated", proposed
                ids[tenant] = fabric.commit(proposed["proposal_id"])["memory_id"]
            for client, mine, theirs in ((a, "acme", "globex"), (g, "globex", "acme")):
                seen = answer(await client.call_tool("memory_recall", {"query": "secret"}))
                assert [r["memory_id"] for r in seen["records"]] == [ids[mine]]
                got = answer(await client.call_tool("memory_get", {"memory_ids": [ids[theirs]]}))
                assert got["records"] == []
                named = await client.call_tool(
                    "memory_recall", {"query": "secret", "scope": {"tenant_id": theirs}}
                )
                result = answer(named)
                assert result.get("records", []) == [], result
                assert named.is_error or result["status"] == "denied"

    run_async(go)


# --- real passwords: the agent's own login, its password from a password file ---------------

PW_AGENT, PW_GATEWAY = "mf_agent_pw", "mf_gateway_pw"


@pytest.fixture
def password_logins(fabric: Fabric, tmp_path: Path) -> Iterator[Path]:
    """Two logins that must authenticate with a password (scram-sha-256 for these roles
    only), the agent registered in acme, and a password file holding both passwords."""
    su = fabric.su()
    hba = Path(su.execute("SHOW hba_file").fetchone()[0])  # type: ignore[index]
    rule = f"host all {PW_AGENT},{PW_GATEWAY} 127.0.0.1/32 scram-sha-256  # test_mcp\n"
    original = hba.read_text()
    for login, password in ((PW_AGENT, "agent-secret"), (PW_GATEWAY, "gateway-secret")):
        exists = su.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone()
        verb = "ALTER" if exists else "CREATE"
        su.execute(
            sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(login), sql.Literal(password)
            )
        )
    su.execute(sql.SQL("GRANT fabric_mcp_gateway TO {}").format(sql.Identifier(PW_GATEWAY)))
    admin = fabric.connect("mf_admin")
    admin.execute(
        "SELECT fabric_api.register_agent('com-agt-077', %s, %s, %s)",
        (PW_AGENT, Jsonb(PROFILE_WIDE), MEMORY_TOOLS),
    )
    admin.execute("SELECT fabric_api.enable_agent('acme', 'com-agt-077', %s)", (MEMORY_TOOLS,))
    hba.write_text(rule + original)
    su.execute("SELECT pg_reload_conf()")
    passfile = tmp_path / "fabric.pgpass"
    passfile.write_text(f"*:*:*:{PW_AGENT}:agent-secret\n*:*:*:{PW_GATEWAY}:gateway-secret\n")
    passfile.chmod(0o600)
    try:
        yield passfile
    finally:
        hba.write_text(original)
        su.execute("SELECT pg_reload_conf()")


@pytest.mark.slow
def test_stdio_logs_in_with_the_password_file_and_only_with_it(
    fabric: Fabric, password_logins: Path, tmp_path: Path
) -> None:
    run = fabric.open_run(agent_id="com-agt-077")
    base = {**env_for(fabric), "PGPASSFILE": str(tmp_path / "none.pgpass")}
    args = ["-m", "memfabric.cli", "mcp", "stdio", "--login", PW_AGENT, "--run", str(run)]

    async def go() -> None:
        with_file = StdioServerParameters(
            command=sys.executable,
            args=[*args, "--passfile", str(password_logins)],
            env=base,
        )
        async with Client(with_file) as client:
            proposed = answer(await client.call_tool("memory_propose", envelope("pw agent")))
            assert proposed["status"] == "validated", proposed
        without = StdioServerParameters(command=sys.executable, args=args, env=base)
        # the server cannot log in and exits: the client sees its connection close
        with pytest.RaisesGroup(
            pytest.RaisesExc(MCPError, match="Connection closed"), flatten_subgroups=True
        ):
            with anyio.fail_after(60):
                async with Client(without) as client:
                    await client.list_tools()

    run_async(go)
    with fabric.su() as c:
        row = c.execute("SELECT proposed_by FROM fabric.proposals").fetchone()
    assert row is not None and row[0] == "com-agt-077"


def test_the_gateway_logs_in_as_itself_and_as_the_agent_with_its_password_file(
    fabric: Fabric, password_logins: Path
) -> None:
    env = {**env_for(fabric), "PGPASSFILE": "/nonexistent"}
    with http_gateway(env, PW_GATEWAY, "--passfile", str(password_logins)) as url:
        token = issue(fabric, fabric.open_run(agent_id="com-agt-077"))

        async def go() -> None:
            async with http(url, token) as client:
                proposed = answer(await client.call_tool("memory_propose", envelope("via gw")))
                assert proposed["status"] == "validated", proposed

        run_async(go)
    with fabric.su() as c:
        row = c.execute("SELECT proposed_by FROM fabric.proposals").fetchone()
    assert row is not None and row[0] == "com-agt-077"
