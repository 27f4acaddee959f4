"""Recall tracing: outbox events become OpenTelemetry spans, exported over OTLP/HTTP.
A consolidation run's event becomes a span with one child span per model call it made.

The spans are made from the outbox by a consumer with its own cursor (a member of
fabric_tracer, which never sees content), so a recall made from psql is traced like one
made from Python. A span carries identifiers, tiers, status, record count and latency;
never content, never subject or session ids, never the recall scope. The OpenTelemetry
libraries are the optional extra `memfabric[otel]`; nothing here imports them at load.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from memfabric.call import Cast, fabric_call, relay_events
from memfabric.errors import FabricError, paused_line
from memfabric.metrics import RecallCounters
from memfabric.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

Json = dict[str, Any]
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
SERVICE_NAME = "memfabric"


class TraceConfigError(Exception):
    """Tracing cannot start: no endpoint, the extra is missing, or the database refused it."""


def tracer_conninfo(login: str | None = None) -> str:
    return Settings.from_env().conninfo("tracer", login)


def otlp_traces_endpoint() -> str:
    """The OTLP/HTTP traces URL, from the standard OpenTelemetry environment variables."""
    settings = Settings.from_env()
    if settings.otlp_traces_endpoint:
        return settings.otlp_traces_endpoint
    base = settings.otlp_endpoint
    if not base:
        raise TraceConfigError(
            "no OTLP endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT (and OTEL_EXPORTER_OTLP_HEADERS)"
        )
    return base.rstrip("/") + "/v1/traces"


def check_endpoint(conn: psycopg.Connection[Any], endpoint: str) -> None:
    """Ask the database whether spans may leave for `endpoint` (air-gapped instances)."""
    try:
        fabric_call(conn, "fabric_api.check_trace_endpoint", endpoint)
    except Exception as exc:
        hint = getattr(exc, "hint", None)
        raise TraceConfigError(
            f"the database refuses the OTLP endpoint: {exc}" + (f" ({hint})" if hint else "")
        ) from exc


def _ns(occurred_at: str) -> int:
    return int(datetime.fromisoformat(occurred_at).timestamp() * 1_000_000_000)


# The memory tool each traced event is a call of (the denial events name their own tool).
RECALL_TOOL = "tool:memory-recall"


def _tool(ev: Json) -> str:
    return str(ev.get("tool") or RECALL_TOOL)


# A consolidation run's event is a span of its own (with a child span per model call), not a
# memory tool call.
CONSOLIDATION_EVENT = "memory.consolidation.completed"


def span_name(ev: Json) -> str:
    """OpenTelemetry's GenAI convention for a tool call: `execute_tool {gen_ai.tool.name}`;
    a consolidation run keeps its event type."""
    if ev["event_type"] == CONSOLIDATION_EVENT:
        return CONSOLIDATION_EVENT
    return f"execute_tool {_tool(ev)}"


def outcome(ev: Json) -> str:
    """served, partial, empty (served or partial, no record) or denied."""
    if ev["event_type"] == "agent.tool.unauthorized" or ev.get("status") == "denied":
        return "denied"
    if not ev.get("memory_ids"):
        return "empty"
    return str(ev.get("status") or "served")


def _attributes(ev: Json) -> dict[str, Any]:
    """Span attributes: identifiers, tiers, status, counts, latency (no content); the GenAI
    tool-call attributes; the attributes Langfuse maps to its trace name, session, user and
    tags. The user and session are the event's keyed pseudonyms, never the ids."""
    attrs: dict[str, Any] = {
        "memfabric.event_id": ev["event_id"],
        "memfabric.event_type": ev["event_type"],
        "memfabric.tenant_id": ev["tenant_id"],
    }
    for key in ("agent_id", "run_id", "status", "reason", "tool", "mode"):
        if ev.get(key) is not None:
            attrs[f"memfabric.{key}"] = str(ev[key])
    for key in ("tiers_requested", "tiers_served", "tiers_denied", "missing_layers"):
        if ev.get(key) is not None:
            attrs[f"memfabric.{key}"] = [str(t) for t in ev[key]]
    if ev.get("memory_ids") is not None:
        attrs["memfabric.memory_ids"] = [str(m) for m in ev["memory_ids"]]
        attrs["memfabric.record_count"] = len(ev["memory_ids"])
    if ev.get("truncated") is not None:
        attrs["memfabric.truncated"] = bool(ev["truncated"])
    if ev.get("duration_ms") is not None:
        attrs["memfabric.duration_ms"] = float(ev["duration_ms"])
    if ev.get("workflow_event_id") is not None:
        attrs["memfabric.workflow_event_id"] = str(ev["workflow_event_id"])
    if ev.get("model_calls") is not None:
        attrs["memfabric.model_calls"] = len(ev["model_calls"])
    if ev["event_type"] != CONSOLIDATION_EVENT:
        result = outcome(ev)
        # OpenTelemetry GenAI semantic conventions: a memory read is a datastore tool call
        attrs.update(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": _tool(ev),
                "gen_ai.tool.type": "datastore",
                "gen_ai.tool.call.id": str(ev["event_id"]),
            }
        )
        if ev.get("agent_id") is not None:
            attrs["gen_ai.agent.id"] = attrs["gen_ai.agent.name"] = str(ev["agent_id"])
        session = ev.get("session_ref") or (f"run:{ev['run_id']}" if ev.get("run_id") else None)
        if session is not None:
            attrs["gen_ai.conversation.id"] = attrs["session.id"] = str(session)
        if ev.get("subject_ref") is not None:
            attrs["user.id"] = str(ev["subject_ref"])
        if result == "denied":
            attrs["error.type"] = str(ev.get("reason") or "denied")
        # Langfuse: the trace's name and tags (its session and user come from session.id, user.id)
        attrs["langfuse.trace.name"] = "memory recall" if _tool(ev) == RECALL_TOOL else _tool(ev)
        tags = ["memfabric", f"tenant:{ev['tenant_id']}", f"outcome:{result}"]
        if ev.get("mode") is not None and result != "denied":  # a denial served no mode
            tags.append(f"mode:{ev['mode']}")
        attrs["langfuse.trace.tags"] = tags
    return attrs


def _call_attributes(ev: Json, call: Json) -> dict[str, Any]:
    """A model call's span attributes: the model, the prompt's hash, token counts, latency,
    attempts, outcome (OpenTelemetry's gen_ai names where they exist); never content."""
    attrs: dict[str, Any] = {
        "memfabric.tenant_id": ev["tenant_id"],
        "memfabric.workflow_event_id": str(ev.get("workflow_event_id") or ""),
        "gen_ai.operation.name": "chat",
    }
    named = {
        "stage": "memfabric.llm.stage",
        "backend": "gen_ai.system",
        "model": "gen_ai.request.model",
        "prompt_sha256": "memfabric.llm.prompt_sha256",
        "outcome": "memfabric.llm.outcome",
    }
    for key, attr in named.items():
        if call.get(key) is not None:
            attrs[attr] = str(call[key])
    counted = {
        "prompt_tokens": "gen_ai.usage.input_tokens",
        "completion_tokens": "gen_ai.usage.output_tokens",
        "attempts": "memfabric.llm.attempts",
    }
    for key, attr in counted.items():
        if call.get(key) is not None:
            attrs[attr] = int(call[key])
    if call.get("latency_ms") is not None:
        attrs["memfabric.llm.latency_ms"] = float(call["latency_ms"])
    return attrs


class SpanMaker:
    """Reads the trace feed after its cursor and exports one span per event, then advances
    the cursor; a failed export leaves the cursor where it was (the batch is retried)."""

    def __init__(
        self,
        conninfo: str,
        *,
        endpoint: str | None = None,
        exporter: SpanExporter | None = None,
        progress: Callable[[str], None] = lambda _line: None,
        console: bool = False,
    ) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        except ImportError as exc:
            raise TraceConfigError(
                "tracing needs the extra: pip install 'memfabric[otel]'"
            ) from exc
        self.conninfo = conninfo
        self.progress = progress
        if console:
            # spans printed as JSON on standard output: nothing leaves the machine
            import sys

            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            self.endpoint = "console"
            exporter = ConsoleSpanExporter(out=sys.stdout)
        else:
            self.endpoint = endpoint or otlp_traces_endpoint()
            with psycopg.connect(conninfo, autocommit=True) as conn:
                check_endpoint(conn, self.endpoint)
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=self.endpoint)
        self.exporter = exporter
        # Ended spans wait here until the batch is exported, so that a refused export
        # leaves the cursor where it was.
        self._collect = InMemorySpanExporter()
        # ALWAYS_ON: the database already decided to audit the recall; a caller's unsampled
        # traceparent does not drop its span.
        provider = TracerProvider(
            sampler=ALWAYS_ON, resource=Resource.create({"service.name": SERVICE_NAME})
        )
        provider.add_span_processor(SimpleSpanProcessor(self._collect))
        self._tracer = provider.get_tracer("memfabric.trace")
        self.traced = 0
        self.errors = 0
        self.recalls = RecallCounters()

    def _span(self, ev: Json) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        context = None
        m = TRACEPARENT.match(str(ev.get("traceparent") or ""))
        if m:
            parent = SpanContext(
                trace_id=int(m[1], 16),
                span_id=int(m[2], 16),
                is_remote=True,
                trace_flags=TraceFlags(int(m[3], 16)),
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        length = int(float(ev.get("duration_ms") or 0) * 1_000_000)
        start = _ns(ev["occurred_at"])
        if ev["event_type"] == "memory.consolidation.completed":
            start -= length  # recorded when the run ended
        span = self._tracer.start_span(
            span_name(ev),
            context=context,
            kind=SpanKind.SERVER,
            attributes=_attributes(ev),
            start_time=start,
        )
        if ev.get("status") == "denied" or ev["event_type"] == "agent.tool.unauthorized":
            span.set_status(Status(StatusCode.ERROR, "denied"))
        if ev["event_type"] == "memory.consolidation.completed":
            self._model_calls(ev, span)
        span.end(end_time=start + length)

    def _model_calls(self, ev: Json, run_span: Any) -> None:
        """One child span of the consolidation run's span per model call it made."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        context = trace.set_span_in_context(run_span)
        fallback = _ns(ev["occurred_at"])
        for call in ev.get("model_calls") or []:
            start = _ns(call["started_at"]) if call.get("started_at") else fallback
            span = self._tracer.start_span(
                f"memfabric.llm.{call.get('stage') or 'call'}",
                context=context,
                kind=SpanKind.CLIENT,
                attributes=_call_attributes(ev, call),
                start_time=start,
            )
            if call.get("outcome") not in (None, "ok"):
                span.set_status(Status(StatusCode.ERROR, str(call["outcome"])))
            span.end(end_time=start + int(float(call.get("latency_ms") or 0) * 1_000_000))

    def drain_once(self, conn: psycopg.Connection[Any], limit: int = 500) -> int:
        """Export the next batch; returns how many events it traced."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        relay_events(conn)  # a Citus cluster's delegated calls' events, into the outbox
        events: list[Json] = fabric_call(conn, "fabric_api.trace_events", limit) or []
        if not events:
            return 0
        for ev in events:
            self._span(ev)
        spans = self._collect.get_finished_spans()
        self._collect.clear()
        if self.exporter.export(spans) is not SpanExportResult.SUCCESS:
            self.errors += 1
            raise TraceConfigError(f"the OTLP endpoint did not accept the spans ({self.endpoint})")
        last = events[-1]
        fabric_call(
            conn,
            "fabric_api.set_trace_cursor",
            Cast(last["xid"], "xid8"),
            Cast(last["event_id"], "uuid"),
        )
        self.traced += len(events)
        for ev in events:  # counted once, after the receiver accepted them
            if ev["event_type"].startswith("memory.recall."):
                result = outcome(ev)
                mode = "none" if result == "denied" else str(ev.get("mode") or "none")
                self.recalls.observe(str(ev["tenant_id"]), result, mode, ev.get("duration_ms"))
        return len(events)

    def drain(self, conn: psycopg.Connection[Any], limit: int = 500) -> int:
        total = 0
        while n := self.drain_once(conn, limit):
            total += n
        return total

    def lag(self) -> int:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            lag = fabric_call(conn, "fabric_api.trace_lag")
        return int(lag) if lag is not None else 0

    def run(
        self, *, poll_seconds: float = 1.0, should_stop: Callable[[], bool] = lambda: False
    ) -> None:
        """Poll the feed; on a lost connection or a refused export, back off and retry from
        the cursor (capped)."""
        backoff = 0.5
        while not should_stop():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    while not should_stop():
                        n = self.drain(conn)
                        if n:
                            self.progress(f"traced {n} events")
                        backoff = 0.5
                        time.sleep(poll_seconds)
            except (psycopg.Error, FabricError, TraceConfigError) as exc:
                self.errors += 1
                why = paused_line(exc, self.conninfo)
                self.progress(f"trace paused ({why}); retrying in {backoff:.1f}s")
                time.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def shutdown(self) -> None:
        self.exporter.shutdown()


@contextmanager
def client_span(request: Json) -> Iterator[Json]:
    """Around a Python-side recall: when an OpenTelemetry SDK tracer provider is configured,
    open a client span and put its traceparent into the request, so the span made from the
    outbox joins the same trace. Otherwise the request goes unchanged."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        yield request
        return
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider) or "traceparent" in request:
        yield request
        return
    tracer = provider.get_tracer("memfabric.recall")
    with tracer.start_as_current_span("memfabric.recall", kind=trace.SpanKind.CLIENT) as span:
        ctx = span.get_span_context()
        span.set_attribute("memfabric.run_id", str(request.get("run_id", "")))
        yield {
            **request,
            "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}",
        }
