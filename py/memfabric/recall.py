"""Recall from Python: text recall is one database call; semantic and hybrid recall are the
database's resolution, a broker search with exactly that filter, and the database's re-check,
fusion and hydration of the candidates (it never trusts the projection).

A request without `mode` is served `hybrid` when a vector broker is reachable (the
`memfabric serve` socket or QDRANT_URL) and has a query with words, otherwise `text`; the
answer's `mode_served` says which."""

from __future__ import annotations

from typing import Any

import psycopg

from memfabric.broker import Broker, find_broker, hits_as_candidates
from memfabric.call import fabric_call
from memfabric.tracing import client_span

Json = dict[str, Any]
CANDIDATE_FACTOR = 4  # vector candidates fetched per record asked for
MIN_CANDIDATES = 50  # and never fewer: fusion needs depth (the lexical list is as deep)


def _recall(conn: psycopg.Connection[Any], request: Json) -> Json:
    answer: Json = fabric_call(conn, "fabric_api.recall", request)
    return answer


def _has_words(query: Any) -> bool:
    return isinstance(query, str) and any(c.isalnum() for c in query)


def recall(
    conn: psycopg.Connection[Any],
    request: Json,
    broker: Broker | None = None,
    *,
    exact: bool = False,
) -> Json:
    """`conn` is the agent's own connection (its login is its identity). With broker=None
    the broker is found from the environment when one is needed. With an
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
    defaulted = "mode" not in request and "candidates" not in request
    if defaulted:
        if not _has_words(request.get("query")):
            return _recall(conn, request)
        broker = broker or find_broker(conn)
        if broker is None:
            return _recall(conn, request)
        request = {**request, "mode": "hybrid"}
    if request.get("mode", "text") == "text" or "candidates" in request:
        return _recall(conn, request)
    broker = broker or find_broker(conn)
    if broker is None:
        raise ValueError(
            "semantic and hybrid recall need a vector broker: run `memfabric serve` or set "
            "QDRANT_URL (or omit mode to be served text)"
        )
    resolved = _recall(conn, request)
    if resolved["status"] != "resolved":
        return resolved  # malformed or denied, and audited as such
    flt = resolved["filter"]
    hits: list[tuple[str, float]] = []
    if flt["tiers"] and flt["scope_keys"]:
        limit = min(1000, max(MIN_CANDIDATES, int(flt["limit"]) * CANDIDATE_FACTOR))
        try:
            hits = broker.search(flt, request["query"], limit, exact=exact)
        except (OSError, RuntimeError):
            if not defaulted:
                raise
            # The broker went away between finding it and asking it: serve text instead.
            return _recall(conn, {k: v for k, v in request.items() if k != "mode"})
    return _recall(conn, {**request, "candidates": hits_as_candidates(hits)})
