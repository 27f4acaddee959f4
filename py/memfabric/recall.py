"""Recall from Python: text recall is one database call; semantic and hybrid recall are the
database's resolution, a broker search with exactly that filter, and the database's re-check
and hydration of the candidates (it never trusts the projection)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from memfabric.broker import Broker, hits_as_candidates
from memfabric.errors import mapped
from memfabric.tracing import client_span

Json = dict[str, Any]
CANDIDATE_FACTOR = 4  # vector candidates fetched per record asked for


def _recall(conn: psycopg.Connection[Any], request: Json) -> Json:
    with mapped():
        row = conn.execute("SELECT fabric_api.recall(%s)", (Jsonb(request),)).fetchone()
    assert row is not None
    answer: Json = row[0]
    return answer


def recall(
    conn: psycopg.Connection[Any],
    request: Json,
    broker: Broker | None = None,
    *,
    exact: bool = False,
) -> Json:
    """`conn` is the agent's own connection (its login is its identity). With an
    OpenTelemetry tracer provider configured, the call is a client span and the request
    carries its traceparent, so the span made from the outbox joins the same trace."""
    with client_span(request) as traced:
        return _recall_modes(conn, traced, broker, exact=exact)


def _recall_modes(
    conn: psycopg.Connection[Any],
    request: Json,
    broker: Broker | None = None,
    *,
    exact: bool = False,
) -> Json:
    mode = request.get("mode", "text")
    if mode == "text":
        return _recall(conn, request)
    if broker is None:
        raise ValueError("semantic and hybrid recall need a vector broker")
    resolved = _recall(conn, {k: v for k, v in request.items() if k != "candidates"})
    if resolved["status"] != "resolved":
        return resolved  # denied, and audited as such
    flt = resolved["filter"]
    limit = min(1000, max(1, int(flt["limit"])) * CANDIDATE_FACTOR)
    hits = broker.search(flt, request["query"], limit, exact=exact)
    return _recall(conn, {**request, "candidates": hits_as_candidates(hits)})
