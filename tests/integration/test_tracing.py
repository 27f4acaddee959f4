"""Recall tracing: outbox events become OpenTelemetry spans exported over OTLP/HTTP to a
receiver the test starts itself (decoding ExportTraceServiceRequest with
opentelemetry-proto): attributes without content, raw-SQL recalls, denials, traceparent,
the air-gapped endpoint rule, metrics, and no LangSmith anywhere."""

from __future__ import annotations

import gzip
import importlib.metadata
import os
import re
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from psycopg.types.json import Jsonb

from conftest import Fabric
from memfabric.errors import InvalidEnvelope
from memfabric.metrics import serve_metrics
from memfabric.recall import recall
from memfabric.tracing import SpanMaker, TraceConfigError
from servers import stop_process

CANARY = "canary-7f3e-do-not-export"
ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    """An OTLP/HTTP traces endpoint: every span received, as {name, trace_id, ..., attrs}."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                outer.raw.append(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            outer.spans.append(_decode(s))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


def _decode(s: Any) -> dict[str, Any]:
    return {
        "name": s.name,
        "trace_id": s.trace_id.hex(),
        "span_id": s.span_id.hex(),
        "parent_span_id": s.parent_span_id.hex(),
        "start": s.start_time_unix_nano,
        "end": s.end_time_unix_nano,
        "status": s.status.code,
        "attrs": {a.key: _value(a.value) for a in s.attributes},
    }


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def tracer_url(fabric: Fabric) -> str:
    return psycopg.conninfo.make_conninfo(fabric.url, user="mf_tracer")


def export(fabric: Fabric, receiver: Receiver) -> SpanMaker:
    fabric.settle()  # the test's events below the horizon, then one drain
    maker = SpanMaker(tracer_url(fabric), endpoint=receiver.endpoint)
    with psycopg.connect(maker.conninfo, autocommit=True) as conn:
        maker.drain(conn)
    return maker


def test_recalls_from_raw_sql_become_spans_without_content(
    fabric: Fabric, receiver: Receiver
) -> None:
    run = fabric.open_run("com-agt-003")
    memory_id = fabric.form(run, f"invoices in EUR {CANARY}")
    # A recall through raw SQL, as the agent's own login: no Python client involved.
    with fabric.connect("mf_agent_a") as agent:
        answer = agent.execute(
            "SELECT fabric_api.recall(%s)",
            (
                Jsonb(
                    {
                        "run_id": str(run),
                        "query": "invoices",
                        "tiers": ["episodic"],
                        "correlation_id": f"corr-{CANARY}",
                    }
                ),
            ),
        ).fetchone()[0]  # type: ignore[index]
    assert [r["memory_id"] for r in answer["records"]] == [memory_id]

    maker = export(fabric, receiver)
    [span] = [
        s for s in receiver.spans if s["attrs"]["memfabric.event_type"] == "memory.recall.served"
    ]
    attrs = span["attrs"]
    assert attrs["memfabric.tenant_id"] == "acme"
    assert attrs["memfabric.agent_id"] == "com-agt-003"
    assert attrs["memfabric.run_id"] == str(run)
    assert attrs["memfabric.status"] == "served"
    assert attrs["memfabric.tiers_requested"] == ["episodic"]
    assert attrs["memfabric.tiers_served"] == ["episodic"]
    assert attrs["memfabric.record_count"] == 1
    assert attrs["memfabric.memory_ids"] == [memory_id]
    assert attrs["memfabric.duration_ms"] >= 0
    assert span["end"] >= span["start"] > 0
    # Never content, never subject or session ids, never the scope.
    wire = b"".join(receiver.raw)
    for secret in (CANARY, "invoices", "user-8842", "sess-1f9c"):
        assert secret.encode() not in wire
    # The session and user Langfuse groups by are keyed pseudonyms, never the ids.
    pseudonymous = {"session.id", "gen_ai.conversation.id", "user.id"}
    assert not any(
        "scope" in k or "subject" in k or "session" in k for k in set(attrs) - pseudonymous
    )
    assert all(str(attrs[k]).startswith("hmac:") for k in pseudonymous)
    assert maker.traced == 1 and maker.lag() == 0

    # The cursor moved: a second consumer run exports nothing again.
    before = len(receiver.spans)
    export(fabric, receiver)
    assert len(receiver.spans) == before


def test_denied_recall_and_unauthorized_tool_become_spans(
    fabric: Fabric, receiver: Receiver
) -> None:
    run_b = fabric.open_run("com-agt-004")
    denied = fabric.recall("mf_agent_b", {"run_id": str(run_b), "tiers": ["semantic"]})
    assert denied["status"] == "denied"
    run_n = fabric.open_run("com-agt-009")
    refused = fabric.recall("mf_agent_notools", {"run_id": str(run_n)})
    assert refused["status"] == "denied"

    export(fabric, receiver)
    by_run = {
        (s["attrs"]["memfabric.event_type"], s["attrs"]["memfabric.run_id"]): s
        for s in receiver.spans
    }
    tier_denial = by_run[("memory.recall.denied", str(run_b))]
    assert tier_denial["attrs"]["memfabric.tiers_denied"] == ["semantic"]
    assert tier_denial["attrs"]["memfabric.record_count"] == 0
    assert tier_denial["status"] == 2  # STATUS_CODE_ERROR
    tool = by_run[("agent.tool.unauthorized", str(run_n))]
    assert tool["attrs"]["memfabric.tool"] == "tool:memory-recall"
    assert tool["attrs"]["memfabric.agent_id"] == "com-agt-009"
    assert "tools_allowed" in tool["attrs"]["memfabric.missing_layers"]
    assert ("memory.recall.denied", str(run_n)) in by_run


def test_spans_follow_the_genai_conventions_and_carry_langfuse_trace_fields(
    fabric: Fabric, receiver: Receiver
) -> None:
    """A recall is a datastore tool call in OpenTelemetry's GenAI conventions; Langfuse reads
    its trace name, tags, session and (pseudonymous) user from the span's attributes."""
    run = fabric.open_run("com-agt-003")
    fabric.form(run, "the invoice address moved")
    fabric.recall("mf_agent_a", {"run_id": str(run), "query": "invoice", "tiers": ["episodic"]})
    again = fabric.open_run("com-agt-003")  # the same subject and session, another run
    fabric.recall("mf_agent_a", {"run_id": str(again), "query": "nothing like it"})
    other = fabric.open_run("com-agt-003", subject="user-1234", session="sess-2")
    fabric.recall("mf_agent_a", {"run_id": str(other), "tiers": ["episodic"]})
    denied = fabric.open_run("com-agt-004")
    fabric.recall("mf_agent_b", {"run_id": str(denied), "tiers": ["semantic"]})

    export(fabric, receiver)
    by_run = {s["attrs"]["memfabric.run_id"]: s for s in receiver.spans}
    span = by_run[str(run)]
    attrs = span["attrs"]
    assert span["name"] == "execute_tool tool:memory-recall"
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "tool:memory-recall"
    assert attrs["gen_ai.tool.type"] == "datastore"
    assert attrs["gen_ai.tool.call.id"] == attrs["memfabric.event_id"]
    assert attrs["gen_ai.agent.id"] == attrs["gen_ai.agent.name"] == "com-agt-003"
    assert attrs["memfabric.mode"] == "text"
    assert attrs["langfuse.trace.name"] == "memory recall"
    assert attrs["langfuse.trace.tags"] == [
        "memfabric", "tenant:acme", "outcome:served", "mode:text",
    ]  # fmt: skip
    assert attrs["session.id"] == attrs["gen_ai.conversation.id"]
    assert attrs["session.id"].startswith("hmac:") and attrs["user.id"].startswith("hmac:")
    # one subject and session: one Langfuse user and session across runs; another subject
    # is another user and session
    assert by_run[str(again)]["attrs"]["user.id"] == attrs["user.id"]
    assert by_run[str(again)]["attrs"]["session.id"] == attrs["session.id"]
    assert "outcome:empty" in by_run[str(again)]["attrs"]["langfuse.trace.tags"]
    assert by_run[str(other)]["attrs"]["user.id"] != attrs["user.id"]
    assert by_run[str(other)]["attrs"]["session.id"] != attrs["session.id"]
    refused = by_run[str(denied)]["attrs"]
    assert refused["error.type"] == refused["memfabric.reason"]
    assert "outcome:denied" in refused["langfuse.trace.tags"]
    wire = b"".join(receiver.raw)
    for secret in (b"user-8842", b"sess-1f9c", b"user-1234", b"invoice address"):
        assert secret not in wire


def test_recall_counters_per_tenant_by_outcome_and_mode(fabric: Fabric, receiver: Receiver) -> None:
    """Live recall counters from the audit: what the tracer exported, per tenant, by
    outcome (served, empty, denied) and mode, with a latency histogram per tenant."""
    run = fabric.open_run("com-agt-003")
    fabric.form(run, "the invoice address moved")
    fabric.recall("mf_agent_a", {"run_id": str(run), "query": "invoice", "tiers": ["episodic"]})
    fabric.recall("mf_agent_a", {"run_id": str(run), "query": "invoice", "tiers": ["episodic"]})
    fabric.recall("mf_agent_a", {"run_id": str(run), "query": "zebra", "tiers": ["episodic"]})
    denied = fabric.open_run("com-agt-004", tenant="globex")
    fabric.recall("mf_agent_b", {"run_id": str(denied), "tiers": ["semantic"]})
    maker = export(fabric, receiver)
    server = serve_metrics(0, {}, [maker.recalls.exposition])
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            text = r.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    samples = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert samples['memfabric_recalls_total{tenant="acme",outcome="served",mode="text"}'] == "2"
    assert samples['memfabric_recalls_total{tenant="acme",outcome="empty",mode="text"}'] == "1"
    assert samples['memfabric_recalls_total{tenant="globex",outcome="denied",mode="none"}'] == "1"
    assert samples['memfabric_recall_duration_seconds_count{tenant="acme"}'] == "3"
    assert samples['memfabric_recall_duration_seconds_bucket{tenant="acme",le="+Inf"}'] == "3"
    assert samples['memfabric_recall_duration_seconds_count{tenant="globex"}'] == "1"
    assert "# TYPE memfabric_recall_duration_seconds histogram" in text
    assert samples["memfabric_metric_read_errors"] == "0"


def test_the_console_exporter_prints_spans_and_sends_nothing(
    fabric: Fabric, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    run = fabric.open_run("com-agt-003")
    fabric.recall("mf_agent_a", {"run_id": str(run)})
    fabric.settle()
    maker = SpanMaker(tracer_url(fabric), console=True)
    with psycopg.connect(maker.conninfo, autocommit=True) as conn:
        assert maker.drain(conn) == 1
    printed = capsys.readouterr().out
    assert '"name": "execute_tool tool:memory-recall"' in printed
    assert str(run) in printed and '"gen_ai.tool.type": "datastore"' in printed
    assert receiver.spans == []


def test_a_traceparent_joins_the_callers_trace(fabric: Fabric, receiver: Receiver) -> None:
    run = fabric.open_run("com-agt-003")
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    fabric.recall("mf_agent_a", {"run_id": str(run), "traceparent": f"00-{trace_id}-{parent}-00"})
    export(fabric, receiver)
    [span] = [s for s in receiver.spans if s["attrs"]["memfabric.run_id"] == str(run)]
    assert (span["trace_id"], span["parent_span_id"]) == (trace_id, parent)


@pytest.mark.parametrize(
    "traceparent",
    [
        "not-a-traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # uppercase
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # unknown version
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",  # trailing space
        42,
    ],
)
def test_a_malformed_traceparent_is_refused_and_writes_nothing(
    fabric: Fabric, traceparent: Any
) -> None:
    run = fabric.open_run("com-agt-003")
    before = fabric.counts()
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        fabric.recall("mf_agent_a", {"run_id": str(run), "traceparent": traceparent})
    assert "traceparent" in caught.value.diag.message_primary  # type: ignore[operator]
    assert caught.value.diag.message_hint
    assert str(traceparent) not in (caught.value.diag.message_primary or "")
    assert fabric.counts() == before


def test_python_recall_opens_a_client_span_in_the_same_trace(
    fabric: Fabric, receiver: Receiver
) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    client_spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(client_spans))

    run = fabric.open_run("com-agt-003")
    with fabric.connect("mf_agent_a") as conn:
        assert recall(conn, {"run_id": str(run)})["status"] == "served"
    [client] = [s for s in client_spans.get_finished_spans() if s.name == "memfabric.recall"]
    export(fabric, receiver)
    [server] = [s for s in receiver.spans if s["attrs"]["memfabric.run_id"] == str(run)]
    assert server["trace_id"] == f"{client.context.trace_id:032x}"
    assert server["parent_span_id"] == f"{client.context.span_id:016x}"


def test_the_tracer_cannot_read_content(fabric: Fabric) -> None:
    with fabric.connect("mf_tracer") as conn:
        for query in (
            "SELECT count(*) FROM fabric.memory_records",
            "SELECT * FROM fabric_api.projection_records_v2(ARRAY[]::uuid[])",
            "SELECT * FROM fabric_api.projection_events_v2('trace')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(query)
    with fabric.connect("mf_agent_a") as agent, pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent.execute("SELECT fabric_api.trace_events(10)")


def test_an_air_gapped_instance_refuses_a_remote_otlp_endpoint(
    fabric: Fabric, receiver: Receiver
) -> None:
    fabric.session("mf_admin").execute(
        "SELECT fabric_api.configure_instance('acme', NULL, %s)",
        (Jsonb({"deployment_mode": "air-gapped"}),),
    )
    with (
        fabric.connect("mf_tracer") as conn,
        pytest.raises(psycopg.errors.CheckViolation) as caught,
    ):
        conn.execute(
            "SELECT fabric_api.check_trace_endpoint('https://cloud.langfuse.com/api/public/otel')"
        )
    assert caught.value.diag.constraint_name == "instance_config_air_gapped_is_local"
    with pytest.raises(TraceConfigError, match="refuses the OTLP endpoint"):
        SpanMaker(tracer_url(fabric), endpoint="https://cloud.langfuse.com/api/public/otel")
    SpanMaker(tracer_url(fabric), endpoint=receiver.endpoint)  # loopback is local


def test_metrics_and_health_answer_on_loopback(fabric: Fabric, receiver: Receiver) -> None:
    run = fabric.open_run("com-agt-003")
    fabric.recall("mf_agent_a", {"run_id": str(run)})
    maker = export(fabric, receiver)
    server = serve_metrics(
        0,
        {
            "memfabric_events_traced_total": ("counter", "spans", lambda: maker.traced),
            "memfabric_trace_lag": ("gauge", "waiting", maker.lag),
        },
    )
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            text = r.read().decode()
        assert "memfabric_events_traced_total 1\n" in text
        assert "memfabric_trace_lag 0\n" in text
    finally:
        server.shutdown()
        server.server_close()


def test_no_langsmith_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [
        d for extra in project.get("optional-dependencies", {}).values() for d in extra
    ]
    assert not [d for d in declared if "langsmith" in d.lower()]
    # LangGraph needs langchain-core, which requires and imports the langsmith client
    # library: it may be installed for that reason alone. memfabric never imports it, and a
    # graph run with the binding has LangSmith tracing off (nothing is sent anywhere).
    requirers = {
        (d.metadata["Name"] or "").lower()
        for d in importlib.metadata.distributions()
        if any(r.lower().startswith("langsmith") for r in d.requires or [])
    }
    assert requirers - {"langsmith"} <= {"langchain-core"}  # (its own extras name itself)
    probe = (
        "import sys, memfabric.langgraph, memfabric.tracing, memfabric.recall\n"
        "from langgraph.graph import StateGraph, START, END\n"
        "from typing import TypedDict\n"
        "class S(TypedDict):\n    x: int\n"
        "g = StateGraph(S); g.add_node('n', lambda s: {'x': s['x'] + 1})\n"
        "g.add_edge(START, 'n'); g.add_edge('n', END)\n"
        "assert g.compile().invoke({'x': 1}) == {'x': 2}\n"
        "import langsmith.utils\n"
        "print(langsmith.utils.tracing_is_enabled())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGSMITH", "LANGCHAIN"))}
    ran = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "False"
    importing = re.compile(r"^\s*(?:import|from)\s+langsmith\b", re.MULTILINE)
    own = [p for p in (ROOT / "py" / "memfabric").rglob("*.py") if importing.search(p.read_text())]
    assert own == []


def test_the_error_type_of_a_malformed_traceparent(fabric: Fabric) -> None:
    run = fabric.open_run("com-agt-003")
    with fabric.connect("mf_agent_a") as conn, pytest.raises(InvalidEnvelope):
        recall(conn, {"run_id": str(run), "traceparent": "00-zz"})


def test_the_projector_cannot_move_or_read_the_trace_cursor(fabric: Fabric) -> None:
    before = (
        fabric.session()
        .execute("SELECT last_xid::text FROM fabric.projection_cursors WHERE projection = 'trace'")
        .fetchone()
    )
    with fabric.connect("mf_projector") as conn:
        conn.execute(
            "SELECT fabric_api.set_projection_cursor('trace', '999999', gen_random_uuid(), true)"
        )
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT * FROM fabric_api.projection_events_v2('trace')")
    after = (
        fabric.session()
        .execute("SELECT last_xid::text FROM fabric.projection_cursors WHERE projection = 'trace'")
        .fetchone()
    )
    assert after == before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_trace_worker_exports_as_recalls_happen_and_serves_metrics(
    fabric: Fabric, receiver: Receiver
) -> None:
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": fabric.url,
        "MEMFABRIC_TRACER_URL": tracer_url(fabric),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint.removesuffix("/v1/traces"),
        "MEMFABRIC_METRICS_PORT": str(port),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "memfabric.cli", "worker", "trace", "--poll", "0.1"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run = fabric.open_run("com-agt-003")
        fabric.recall("mf_agent_a", {"run_id": str(run)})
        for _ in range(200):
            if receiver.spans or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert [s["attrs"]["memfabric.run_id"] for s in receiver.spans] == [str(run)]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.read() == b"ok\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            text = r.read().decode()
        assert "memfabric_events_traced_total 1\n" in text
        assert "memfabric_trace_errors_total 0\n" in text
        # the per-tenant recall counters, on the worker's own endpoint
        assert 'memfabric_recalls_total{tenant="acme",outcome="empty",mode="text"} 1\n' in text
        assert 'memfabric_recall_duration_seconds_count{tenant="acme"} 1\n' in text
    finally:
        code = stop_process(proc)
    assert code == 0, code  # SIGTERM stops the worker through its own shutdown


def test_each_model_call_of_a_consolidation_run_becomes_a_span_without_content(
    fabric: Fabric, receiver: Receiver
) -> None:
    from memfabric.consolidate import ModelConsolidator, run_consolidation
    from memfabric.llm import LLM, OpenAICompatible
    from scripted_llm import scripted_llm

    run = fabric.open_run("com-agt-003")
    fabric.form(run, f"Please invoice me in EUR. {CANARY}")
    answer = {"key": "billing.currency", "value": "EUR", "tier": "semantic",
              "decision": "new", "evidence": ["E1"], "confidence": 0.9}  # fmt: skip
    with scripted_llm([{"contains": "invoice me", "answer": {"assertions": [answer]}}]) as double:
        fabric.call("mf_admin", "SELECT fabric_api.configure_instance('acme', NULL, %s)",
                    Jsonb({"model_uri": double.url}))  # fmt: skip
        summary = run_consolidation(
            fabric.connect("mf_consolidator"), fabric.connect("mf_committer"), "acme",
            ModelConsolidator(LLM(OpenAICompatible(double.url, "scripted-oracle"))),
        )  # fmt: skip
    calls = summary.envelope["cost"]["per_call"]
    assert summary.committed == 1 and len(calls) >= 3

    export(fabric, receiver)
    [run_span] = [s for s in receiver.spans if s["name"] == "memory.consolidation.completed"]
    assert run_span["attrs"]["memfabric.workflow_event_id"] == summary.workflow_event_id
    assert run_span["attrs"]["memfabric.model_calls"] == len(calls)
    spans = [s for s in receiver.spans if s["name"].startswith("memfabric.llm.")]
    assert [s["name"] for s in spans] == [f"memfabric.llm.{c['stage']}" for c in calls]
    for span, call in zip(spans, calls, strict=True):
        assert (span["trace_id"], span["parent_span_id"]) == (
            run_span["trace_id"], run_span["span_id"]
        )  # fmt: skip
        attrs = span["attrs"]
        assert attrs["gen_ai.request.model"] == "scripted-oracle"
        assert attrs["gen_ai.system"] == "openai-compatible"
        assert attrs["memfabric.llm.prompt_sha256"] == call["prompt_sha256"]
        assert attrs["gen_ai.usage.input_tokens"] == call["prompt_tokens"] > 0
        assert attrs["gen_ai.usage.output_tokens"] == call["completion_tokens"]
        assert attrs["memfabric.llm.latency_ms"] == call["latency_ms"]
        assert attrs["memfabric.llm.outcome"] == "ok"
        assert span["end"] - span["start"] == int(call["latency_ms"] * 1_000_000)
        assert run_span["start"] <= span["start"]
    wire = b"".join(receiver.raw)
    for secret in (CANARY, b"invoice me", b"billing.currency"):
        assert (secret if isinstance(secret, bytes) else secret.encode()) not in wire


def test_a_consolidation_event_carries_only_model_call_metadata(fabric: Fabric) -> None:
    """An envelope's per-call list is the consolidator's report: the event (and so the span)
    keeps only metadata of the expected shape, whatever else the list holds."""
    wf = fabric.call("mf_consolidator", "SELECT fabric_api.start_workflow_run('acme')")
    good = {"stage": "generate", "backend": "openai-compatible", "model": "qwen2.5:7b",
            "prompt_sha256": "sha256:" + "a" * 64, "prompt_tokens": 12, "completion_tokens": 3,
            "latency_ms": 4.5, "attempts": 1, "outcome": "ok",
            "started_at": "2026-12-04T10:00:00.123456+00:00"}  # fmt: skip
    smuggled = {"stage": f"generate {CANARY}", "model": f"my model {CANARY}",
                "prompt": CANARY, "prompt_sha256": CANARY, "outcome": CANARY,
                "started_at": CANARY}  # fmt: skip
    envelope = {"counts": {}, "duration_ms": 9.0,
                "cost": {"per_call": [good, smuggled, CANARY]}}  # fmt: skip
    fabric.call("mf_consolidator",
                "SELECT fabric_api.record_consolidation_outcome('acme', %s, %s)",
                wf, Jsonb(envelope))  # fmt: skip
    (event,) = fabric.events("event_type = 'memory.consolidation.completed'")
    assert event["payload"]["model_calls"] == [good, {}]
    assert event["payload"]["duration_ms"] == 9.0
