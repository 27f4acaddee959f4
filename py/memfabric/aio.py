"""The async SDK: `AsyncFabric`, the same roles and calls as `memfabric.sdk.Fabric` over
psycopg's AsyncConnectionPool (one pool per identity). Each method is one `afabric_call`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from pgvector import Vector
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from memfabric.call import Cast, afabric_call, afabric_rows, aregister_vector
from memfabric.constants import FormationMethod, Tier, Visibility
from memfabric.envelope import Envelope
from memfabric.recall import arecall
from memfabric.results import Approval, Proposal, RecallAnswer, Receipt, Record, Run
from memfabric.sdk import Id, Json, _as_run, _ttl

if TYPE_CHECKING:
    from memfabric.working import WorkingTier


class AsyncFabric:
    """The fabric at `conninfo`, async: `async with AsyncFabric(url) as fabric: ...`."""

    def __init__(self, conninfo: str, *, min_size: int = 1, max_size: int = 4) -> None:
        self.conninfo = conninfo
        self._sizes = (min_size, max_size)
        self._pools: dict[str, AsyncConnectionPool[psycopg.AsyncConnection[Any]]] = {}

    async def pool(self, login: str) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        """The pool of one identity, opened on first use."""
        if login not in self._pools:
            pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
                make_conninfo(self.conninfo, user=login),
                min_size=self._sizes[0],
                max_size=self._sizes[1],
                kwargs={"autocommit": True},
                open=False,
            )
            await pool.open()
            self._pools[login] = pool
        return self._pools[login]

    async def close(self) -> None:
        for pool in self._pools.values():
            await pool.close()
        self._pools.clear()

    async def __aenter__(self) -> AsyncFabric:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- the roles -----------------------------------------------------------------------------
    def admin(self, login: str) -> AsyncAdmin:
        return AsyncAdmin(self, login)

    def orchestrator(self, login: str) -> AsyncOrchestrator:
        return AsyncOrchestrator(self, login)

    def agent(self, login: str, run: Run | Id, *, tenant_id: str | None = None) -> AsyncAgent:
        return AsyncAgent(self, login, _as_run(run, tenant_id))

    def committer(self, login: str) -> AsyncCommitter:
        return AsyncCommitter(self, login)

    def policy(self, login: str) -> AsyncPolicy:
        return AsyncPolicy(self, login)

    def consolidator(self, login: str) -> AsyncConsolidator:
        return AsyncConsolidator(self, login)

    def auditor(self, login: str) -> AsyncAuditor:
        return AsyncAuditor(self, login)

    def projector(self, login: str) -> AsyncProjector:
        return AsyncProjector(self, login)

    def tracer(self, login: str) -> AsyncTracer:
        return AsyncTracer(self, login)

    def mcp_gateway(self, login: str) -> AsyncMcpGateway:
        return AsyncMcpGateway(self, login)

    def workflow(self, login: str) -> AsyncWorkflow:
        return AsyncWorkflow(self, login)


class _AsyncRole:
    """One identity's calls: each is one `afabric_call` on a connection of its pool."""

    def __init__(self, fabric: AsyncFabric, login: str) -> None:
        self.fabric = fabric
        self.login = login

    async def _call(self, name: str, *args: Any, **named: Any) -> Any:
        pool = await self.fabric.pool(self.login)
        async with pool.connection() as conn:
            return await afabric_call(conn, name, *args, **named)

    async def _rows(self, name: str, *args: Any, **named: Any) -> list[Json]:
        pool = await self.fabric.pool(self.login)
        async with pool.connection() as conn:
            return await afabric_rows(conn, name, *args, **named)


class AsyncAdmin(_AsyncRole):
    """fabric_admin: tenants, agents, instance and deployment configuration."""

    async def create_tenant(self, tenant_id: str) -> Json:
        return await self._call("fabric_api.create_tenant", tenant_id)  # type: ignore[no-any-return]

    async def relay_events(self) -> int:
        """On a Citus cluster, move the delegated calls' events into the outbox now (the
        feeds' consumers do it before each read); how many. 0 on plain PostgreSQL."""
        return int(await self._call("fabric_api.relay_events") or 0)

    async def register_agent(
        self,
        agent_id: str,
        login: str,
        memory_profile: Mapping[str, Any] | None = None,
        tools_allowed: Sequence[str] = (),
    ) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.register_agent", agent_id, login, memory_profile or {}, list(tools_allowed)
        )

    async def enable_agent(self, tenant_id: str, agent_id: str, tools: Sequence[str] = ()) -> Json:
        return await self._call("fabric_api.enable_agent", tenant_id, agent_id, list(tools))  # type: ignore[no-any-return]

    async def configure_instance(
        self, tenant_id: str, business_instance_id: str | None, config: Mapping[str, Any]
    ) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.configure_instance", tenant_id, business_instance_id, config
        )

    async def declare_pack_defaults(self, domain_pack_id: str, defaults: Mapping[str, Any]) -> Json:
        return await self._call("fabric_api.declare_pack_defaults", domain_pack_id, defaults)  # type: ignore[no-any-return]

    async def configure_deployment(self, settings: Mapping[str, Any]) -> Json:
        return await self._call("fabric_api.configure_deployment", settings)  # type: ignore[no-any-return]

    async def check_working_uri(self, tenant_id: str, uri: str) -> None:
        await self._call("fabric_api.check_working_uri", tenant_id, uri)


class AsyncOrchestrator(_AsyncRole):
    """fabric_orchestrator: opens and closes the runs agents act in."""

    async def open_run(
        self,
        tenant_id: str,
        agent_id: str,
        subject_id: str | None,
        session_id: str | None,
        active_tool_set: Sequence[str],
        ttl: timedelta | str = timedelta(hours=1),
    ) -> Run:
        run_id = await self._call(
            "fabric_api.open_run",
            *(tenant_id, agent_id, subject_id, session_id, list(active_tool_set), _ttl(ttl)),
        )
        return Run(run_id, tenant_id, agent_id, subject_id, session_id)

    async def close_run(self, run: Run | Id) -> Json:
        """`fabric_api.close_run`; a `Run` is closed through the tenant-keyed call (on a
        Citus cluster, run on the tenant's worker)."""
        if isinstance(run, Run):
            return await self._call("fabric_api.close_run", run.tenant_id, run.run_id)  # type: ignore[no-any-return]
        return await self._call("fabric_api.close_run", run)  # type: ignore[no-any-return]

    async def issue_mcp_token(self, run: Run | Id, ttl: timedelta | str | None = None) -> str:
        """A bearer token for the MCP gateway, bound to this run (returned once, stored
        hashed; it expires with the run, or after `ttl`)."""
        run_id = run.run_id if isinstance(run, Run) else run
        args = [run_id] if ttl is None else [run_id, _ttl(ttl)]
        return await self._call("fabric_api.issue_mcp_token", *args)  # type: ignore[no-any-return]

    async def revoke_mcp_token(self, token: str) -> Json:
        return await self._call("fabric_api.revoke_mcp_token", token)  # type: ignore[no-any-return]

    async def issue_agent_token(
        self,
        tenant_id: str,
        agent_id: str,
        subject_id: str | None,
        session_id: str | None,
        active_tool_set: Sequence[str],
        run_ttl: timedelta | str = timedelta(hours=1),
        ttl: timedelta | str = timedelta(days=90),
    ) -> Json:
        """An agent token bound to a run template (`{"token", "token_id", "expires_at"}`;
        the token is returned once): `memfabric mcp stdio --token` opens and renews runs
        from it with the gateway's login."""
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.issue_agent_token",
            *(tenant_id, agent_id, subject_id, session_id, list(active_tool_set)),
            *(_ttl(run_ttl), _ttl(ttl)),
        )

    async def revoke_agent_token(self, tenant_id: str, token_id: Id) -> Json:
        """Revoke a token this login issued; its open runs are closed."""
        return await self._call("fabric_api.revoke_agent_token", tenant_id, token_id)  # type: ignore[no-any-return]

    async def request_schema(self, name: str) -> Json:
        """The JSON Schema of a request (`recall`, `propose`), as the database validates it."""
        return await self._call("fabric_api.request_schema", name)  # type: ignore[no-any-return]


class AsyncAgent(_AsyncRole):
    """An agent login acting in one run: it proposes and recalls, nothing else."""

    def __init__(self, fabric: AsyncFabric, login: str, run: Run) -> None:
        super().__init__(fabric, login)
        self.run = run

    # the fabric's functions
    async def propose(self, envelope: Envelope | Mapping[str, Any]) -> Proposal:
        body = envelope.to_json() if isinstance(envelope, Envelope) else dict(envelope)
        return Proposal.from_json(
            await self._call("fabric_api.propose", self.run.tenant_id, body, self.run.run_id)
        )

    async def propose_many(
        self, envelopes: Sequence[Envelope | Mapping[str, Any]]
    ) -> list[Proposal]:
        """`fabric_api.propose_many`: one answer per envelope, in order, as `propose` gives
        it; an envelope `propose` would refuse with an error answers status `error` (its
        `sqlstate` in `raw`)."""
        bodies = [e.to_json() if isinstance(e, Envelope) else dict(e) for e in envelopes]
        answers = await self._call(
            "fabric_api.propose_many", self.run.tenant_id, Jsonb(bodies), self.run.run_id
        )
        return [Proposal.from_json(a) for a in answers]

    async def recall_once(self, request: Mapping[str, Any]) -> RecallAnswer:
        """One `fabric_api.recall` call in this run, no broker: text mode, or a semantic
        request's resolution (status `resolved`), or its hydration (with `candidates`)."""
        body = {**request, "run_id": str(self.run.run_id)}
        return RecallAnswer.from_json(
            await self._call("fabric_api.recall", self.run.tenant_id, body)
        )

    async def recall_procedure_as_of(
        self, memory_id: Id, valid_at: datetime | str, **request: Any
    ) -> RecallAnswer:
        """`fabric_api.recall_procedure_as_of` in this run: the version of the procedure
        `memory_id` belongs to (any version of its chain) that was current at `valid_at`,
        to replay a run against it; none when no version was valid then."""
        at = valid_at.isoformat() if isinstance(valid_at, datetime) else valid_at
        body = {
            **request,
            "run_id": str(self.run.run_id),
            "memory_id": str(memory_id),
            "valid_at": at,
        }
        return RecallAnswer.from_json(await self._call("fabric_api.recall_procedure_as_of", body))

    async def read_measurements(
        self,
        series: str,
        start: datetime | str,
        end: datetime | str,
        window: str,
        aggregate: str = "avg",
        **request: Any,
    ) -> Json:
        """`fabric_api.read_measurements` in this run (tool:temporal-read): one series of
        the run's tenant and subject in [start, end), aggregated by `window` ("1 hour")."""
        body = {
            **request,
            "run_id": str(self.run.run_id),
            "series": series,
            "window": window,
            "aggregate": aggregate,
            "from": start.isoformat() if isinstance(start, datetime) else start,
            "until": end.isoformat() if isinstance(end, datetime) else end,
        }
        return await self._call("fabric_api.read_measurements", body)  # type: ignore[no-any-return]

    async def recall_request(self, request: Mapping[str, Any]) -> RecallAnswer:
        """`fabric_api.recall` with a request of your own (its run_id is this run); semantic
        and hybrid modes find the vector broker (`memfabric serve`'s socket or QDRANT_URL)."""
        body = {**request, "run_id": str(self.run.run_id)}
        pool = await self.fabric.pool(self.login)
        async with pool.connection() as conn:
            return RecallAnswer.from_json(await arecall(conn, body, tenant_id=self.run.tenant_id))

    async def handoff_items(self, items: Sequence[Mapping[str, Any]]) -> list[Json]:
        """`fabric_api.handoff`: working items proposed as raw episodes of this run."""
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.handoff", Jsonb([dict(i) for i in items]), self.run.run_id
        )

    async def working_key(self) -> Json:
        """`fabric_api.working_key`: this run's working-tier key segment
        (`{"tenant_id", "run_id", "subject_key"}`), keyed by the subject's key."""
        return await self._call("fabric_api.working_key", self.run.run_id)  # type: ignore[no-any-return]

    async def deployment_embedder(self) -> Json:
        return await self._call("fabric_api.deployment_embedder")  # type: ignore[no-any-return]

    async def schema_revision(self) -> str:
        """The database's schema revision."""
        return await self._call("fabric_api.schema_revision")  # type: ignore[no-any-return]

    async def check_working_uri(self, uri: str) -> None:
        await self._call("fabric_api.check_working_uri", self.run.tenant_id, uri)

    # the task-level verbs of the agent loop
    async def remember(
        self,
        content: Mapping[str, Any],
        *,
        source_event_id: str,
        confidence: float,
        tier: Tier = "episodic",
        visibility: Visibility = "subject",
        formation_method: FormationMethod = "extraction",
        **optional: Any,
    ) -> Proposal:
        """Propose `content` as memory caused by the event `source_event_id` (the caller names
        it; the SDK never mints one). The committer decides whether it becomes a record."""
        return await self.propose(
            Envelope(
                tier=tier,
                tenant_id=self.run.tenant_id,
                visibility=visibility,
                content=content,
                source_event_id=source_event_id,
                formation_method=formation_method,
                confidence=confidence,
                **optional,
            )
        )

    async def recall(
        self,
        query: str | None = None,
        *,
        mode: str | None = None,
        tiers: Sequence[str] | None = None,
        limit: int | None = None,
        filters: Mapping[str, Any] | None = None,
        **request: Any,
    ) -> RecallAnswer:
        """Recall in this run's scope: mode text, semantic or hybrid (omitted: hybrid when a
        broker is reachable and the query has words, else text)."""
        body: Json = dict(request)
        for key, value in (("query", query), ("mode", mode), ("limit", limit)):
            if value is not None:
                body[key] = value
        if tiers is not None:
            body["tiers"] = list(tiers)
        if filters is not None:
            body["filters"] = dict(filters)
        return await self.recall_request(body)

    async def get(self, memory_ids: Sequence[Id]) -> list[Record]:
        """The named records this run may read (others are absent, never an error)."""
        answer = await self.recall_request(
            {"filters": {"memory_ids": [str(m) for m in memory_ids]}}
        )
        return answer.records

    async def handoff(
        self,
        items: Sequence[Mapping[str, Any]] | None = None,
        tier: WorkingTier | None = None,
    ) -> list[Json]:
        """Hand working items (or, with the working `tier`, this run's session buffer) to the
        fabric as raw episodes, one `fabric_api.handoff` call."""
        if items is not None:
            return await self.handoff_items(items)
        from memfabric import working  # the optional extra memfabric[redis]

        if tier is None:
            raise ValueError("pass the items, or the working tier to read the run's turns from")
        key = await self.working_key()
        ref = working.RunRef(
            self.run.tenant_id,
            str(self.run.run_id),
            self.run.subject_id,
            self.run.session_id,
            subject_key=key["subject_key"],
        )
        items = await asyncio.to_thread(working.session_items, tier, ref)
        return await self.handoff_items(items) if items else []


class AsyncCommitter(_AsyncRole):
    """fabric_committer (os-agt-010): the only writer of durable memory."""

    async def commit(self, proposal_id: Id, tenant_id: str | None = None) -> Record:
        """`fabric_api.commit`; with the proposal's `tenant_id`, the tenant-keyed call (on a
        Citus cluster, run on the tenant's worker)."""
        if tenant_id is not None:
            return Record.from_json(await self._call("fabric_api.commit", tenant_id, proposal_id))
        return Record.from_json(await self._call("fabric_api.commit", proposal_id))

    async def commit_many(self, proposal_ids: Sequence[Id]) -> list[Record]:
        """`fabric_api.commit_many`: the records, in order; all or none."""
        records = await self._call("fabric_api.commit_many", [UUID(str(i)) for i in proposal_ids])
        return [Record.from_json(r) for r in records]

    async def commit_pending(self, limit: int = 100) -> Json:
        return await self._call("fabric_api.commit_pending", limit)  # type: ignore[no-any-return]

    async def request_approval(
        self,
        memory_id: Id,
        action: str,
        target: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> Approval:
        return Approval.from_json(
            await self._call("fabric_api.request_approval", memory_id, action, target or {}, reason)
        )

    async def promote(
        self,
        memory_id: Id,
        target_tier: str,
        approval_id: Id | None = None,
        supersedes: Id | None = None,
    ) -> Record:
        return Record.from_json(
            await self._call("fabric_api.promote", memory_id, target_tier, approval_id, supersedes)
        )

    async def demote(self, memory_id: Id, target_tier: str) -> Record:
        return Record.from_json(await self._call("fabric_api.demote", memory_id, target_tier))

    async def supersede(
        self, old_memory_id: Id, proposal_id: Id, approval_id: Id | None = None
    ) -> Record:
        return Record.from_json(
            await self._call("fabric_api.supersede", old_memory_id, proposal_id, approval_id)
        )

    async def awaiting_recommendations(self, tenant_id: str) -> list[Json]:
        return await self._call("fabric_api.awaiting_recommendations", tenant_id)  # type: ignore[no-any-return]

    async def commit_recommendation(
        self, recommendation_id: Id, approval_id: Id | None = None
    ) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.commit_recommendation", recommendation_id, approval_id
        )

    async def run_decay(self, now: datetime | None = None, batch: int = 1000) -> Json:
        at = {} if now is None else {"p_now": now}
        return await self._call("fabric_api.run_decay", p_batch=batch, **at)  # type: ignore[no-any-return]

    async def run_temporal_retention(self, now: datetime | None = None, batch: int = 10000) -> int:
        """Remove the temporal tier's operational points past their instance's window (whole
        past months at once where every point is due), after making its monthly partitions."""
        at = {} if now is None else {"p_now": now}
        return await self._call("fabric_api.run_temporal_retention", p_batch=batch, **at)  # type: ignore[no-any-return]

    async def request_erasure(self, memory_id: Id, reason: str, legal: bool = False) -> Approval:
        return Approval.from_json(
            await self._call("fabric_api.request_erasure", memory_id, reason, legal)
        )

    async def request_subject_erasure(
        self, tenant_id: str, subject_id: str, reason: str, legal: bool = False
    ) -> Approval:
        return Approval.from_json(
            await self._call(
                "fabric_api.request_subject_erasure", tenant_id, subject_id, reason, legal
            )
        )

    async def erase(self, approval_id: Id) -> Receipt:
        """Execute an approved erasure (`memfabric erase` also VACUUMs what it rewrote)."""
        return Receipt.from_json(await self._call("fabric_api.erase", approval_id))

    async def compact_search_stats(self, limit: int = 100) -> Json:
        return await self._call("fabric_api.compact_search_stats", limit)  # type: ignore[no-any-return]

    async def import_records(
        self, tenant_id: str, import_id: str, records: Sequence[Mapping[str, Any]]
    ) -> Json:
        """`fabric_api.import_records`: up to 10,000 episodic envelopes with their full scope
        formed as raw records of one import event; idempotent on (tenant, import id)."""
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.import_records", tenant_id, import_id, Jsonb([dict(r) for r in records])
        )

    async def seal_events(self, limit: int = 10000) -> Json:
        return await self._call("fabric_api.seal_events", limit)  # type: ignore[no-any-return]

    async def sealing_lag(self) -> Json:
        """Events not sealed yet and the age of the oldest (the sealing metrics)."""
        return await self._call("fabric_api.sealing_lag")  # type: ignore[no-any-return]

    async def working_erasure_scope(self, approval_id: Id) -> Json | None:
        return await self._call("fabric_api.working_erasure_scope", approval_id)  # type: ignore[no-any-return]

    async def record_working_erasure(
        self, approval_id: Id, keys_deleted: int, patterns: Sequence[str]
    ) -> UUID:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.record_working_erasure", approval_id, keys_deleted, list(patterns)
        )

    async def check_working_uri(self, tenant_id: str, uri: str) -> None:
        await self._call("fabric_api.check_working_uri", tenant_id, uri)


class AsyncPolicy(_AsyncRole):
    """fabric_policy (os-agt-002): decides approvals."""

    async def decide_approval(
        self, approval_id: Id, decision: str, reason: str | None = None
    ) -> Approval:
        return Approval.from_json(
            await self._call("fabric_api.decide_approval", approval_id, decision, reason)
        )

    async def entity_merge_proposals(
        self, tenant_id: str, status: str | None = "pending"
    ) -> list[Json]:
        """The tenant's same-as merge proposals of `status` (None: all), newest first, with
        both entities' type and name: what `decide_entity_merge` decides."""
        return await self._rows("fabric_api.entity_merge_proposals", tenant_id, status)

    async def decide_entity_merge(
        self, approval_id: Id, decision: str, reason: str | None = None
    ) -> Approval:
        """Approve or deny a same-as merge proposal (any other approval is refused)."""
        return Approval.from_json(
            await self._call("fabric_api.decide_entity_merge", approval_id, decision, reason)
        )


class AsyncConsolidator(_AsyncRole):
    """fabric_consolidator (os-agt-011): reads candidates, files recommendations, reviews."""

    async def start_workflow_run(
        self, tenant_id: str, workflow: str = "WF-OS-MEMORY-CONSOLIDATE"
    ) -> UUID:
        return await self._call("fabric_api.start_workflow_run", tenant_id, workflow)  # type: ignore[no-any-return]

    async def consolidation_candidates(
        self,
        tenant_id: str,
        workflow_event_id: Id,
        subject_id: str | None = None,
        limit: int = 1000,
    ) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.consolidation_candidates", tenant_id, workflow_event_id, subject_id, limit
        )

    async def recommend(self, recommendation: Mapping[str, Any]) -> Json:
        return await self._call("fabric_api.recommend", recommendation)  # type: ignore[no-any-return]

    async def review_queue(self, tenant_id: str) -> list[Json]:
        return await self._call("fabric_api.review_queue", tenant_id)  # type: ignore[no-any-return]

    async def resolve_review_flag(self, flag_id: Id, decision: str, reason: str) -> Json:
        return await self._call("fabric_api.resolve_review_flag", flag_id, decision, reason)  # type: ignore[no-any-return]

    async def contradiction_queue(self, tenant_id: str) -> list[Json]:
        return await self._call("fabric_api.contradiction_queue", tenant_id)  # type: ignore[no-any-return]

    async def resolve_contradiction_flag(self, flag_id: Id, decision: str, reason: str) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.resolve_contradiction_flag", flag_id, decision, reason
        )

    async def propose_entity_merge(
        self, tenant_id: str, entity_id: Id, into_entity_id: Id, reason: str
    ) -> Json:
        """Propose that two entities are the same: a merge_entities approval policy decides."""
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.propose_entity_merge", tenant_id, entity_id, into_entity_id, reason
        )

    async def merge_entities(self, approval_id: Id) -> Json:
        """Apply an approved entity merge (once)."""
        return await self._call("fabric_api.merge_entities", approval_id)  # type: ignore[no-any-return]

    async def consolidation_cursor(self, tenant_id: str) -> Json | None:
        return await self._call("fabric_api.consolidation_cursor", tenant_id)  # type: ignore[no-any-return]

    async def consolidation_settings(
        self, tenant_id: str, business_instance_id: str | None = None
    ) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.consolidation_settings", tenant_id, business_instance_id
        )

    async def record_consolidation_outcome(
        self,
        tenant_id: str,
        workflow_event_id: Id,
        envelope: Mapping[str, Any],
        through_recorded_at: datetime | None = None,
        through_memory_id: Id | None = None,
    ) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.record_consolidation_outcome",
            tenant_id,
            workflow_event_id,
            envelope,
            Cast(through_recorded_at, "timestamptz"),
            Cast(through_memory_id, "uuid"),
        )


class AsyncAuditor(_AsyncRole):
    """fabric_auditor (os-agt-008): read-only reconstruction of the past and of erasures."""

    async def records_as_of(
        self, tenant_id: str, valid_at: datetime, known_at: datetime | None = None
    ) -> list[Json]:
        known = {} if known_at is None else {"p_known_at": known_at}
        return await self._rows("fabric_audit.records_as_of", tenant_id, valid_at, **known)

    async def lineage(self, tenant_id: str, memory_id: Id) -> list[Json]:
        return await self._rows("fabric_audit.lineage", tenant_id, memory_id)

    async def recalls(self, tenant_id: str, start: datetime, end: datetime) -> list[Json]:
        return await self._rows("fabric_audit.recalls", tenant_id, start, end)

    async def profile_at(
        self, tenant_id: str, subject_id: str, at: datetime, known_at: datetime | None = None
    ) -> list[Json]:
        known = {} if known_at is None else {"p_known_at": known_at}
        return await self._rows("fabric_audit.profile_at", tenant_id, subject_id, at, **known)

    async def subject_events(
        self, tenant_id: str, subject_id: str, start: datetime, end: datetime
    ) -> list[Json]:
        return await self._rows("fabric_audit.subject_events", tenant_id, subject_id, start, end)

    async def verify_tombstone(self, memory_id: Id, claimed_content: Mapping[str, Any]) -> bool:
        return bool(await self._call("fabric_audit.verify_tombstone", memory_id, claimed_content))

    async def erasure_receipt(self, memory_id: Id) -> Receipt | None:
        raw = await self._call("fabric_audit.erasure_receipt", memory_id)
        return None if raw is None else Receipt.from_json(raw)

    async def consolidation_outcomes(
        self, tenant_id: str, since: datetime | None = None
    ) -> list[Json]:
        at = {} if since is None else {"p_since": since}
        return await self._rows("fabric_audit.consolidation_outcomes", tenant_id, **at)

    async def verify_event_chain(
        self, tenant_id: str | None = None, expected_head: Json | None = None
    ) -> Json:
        """Recompute the chain (one tenant or all); with `expected_head` (a `chain_head` kept
        outside the database) also report a tail truncated or rewritten behind it."""
        if expected_head is not None:
            return await self._call(  # type: ignore[no-any-return]
                "fabric_audit.verify_event_chain", tenant_id, expected_head
            )
        return await self._call("fabric_audit.verify_event_chain", tenant_id)  # type: ignore[no-any-return]

    async def chain_head(self, tenant_id: str) -> Json:
        """The tenant's chain head to keep outside the database: last sealed event, link, seq."""
        return await self._call("fabric_audit.chain_head", tenant_id)  # type: ignore[no-any-return]

    # the relations (RETURNS TABLE): they compose with SQL; docs/audit.md is the cookbook
    async def events(self, tenant_id: str, start: datetime, end: datetime) -> list[Json]:
        return await self._rows("fabric_audit.events", tenant_id, start, end)

    async def record_history(self, tenant_id: str, memory_id: Id) -> list[Json]:
        return await self._rows("fabric_audit.record_history", tenant_id, memory_id)

    async def approvals(self, tenant_id: str, start: datetime, end: datetime) -> list[Json]:
        return await self._rows("fabric_audit.approvals", tenant_id, start, end)

    async def erasures(self, tenant_id: str, start: datetime, end: datetime) -> list[Json]:
        return await self._rows("fabric_audit.erasures", tenant_id, start, end)

    async def tool_denials(self, tenant_id: str, start: datetime, end: datetime) -> list[Json]:
        return await self._rows("fabric_audit.tool_denials", tenant_id, start, end)

    async def recall_history(self, tenant_id: str, start: datetime, end: datetime) -> list[Json]:
        return await self._rows("fabric_audit.recall_history", tenant_id, start, end)

    async def recalled_records(self, tenant_id: str, start: datetime, end: datetime) -> list[Json]:
        return await self._rows("fabric_audit.recalled_records", tenant_id, start, end)

    async def agent_links(
        self, tenant_id: str, start: datetime | None = None, end: datetime | None = None
    ) -> list[Json]:
        """Which agent caused or contributed to which outcome (recorded in [start, end))."""
        window = {k: v for k, v in (("p_from", start), ("p_to", end)) if v is not None}
        return await self._rows("fabric_audit.agent_links", tenant_id, **window)

    async def entity_touches(self, tenant_id: str, entity_id: Id) -> list[Json]:
        """Which agent step touched an entity, and the outcomes that followed."""
        return await self._rows(
            "fabric_audit.entity_touches", tenant_id, Cast(str(entity_id), "uuid")
        )


class AsyncProjector(_AsyncRole):
    """fabric_projector: reads the outbox and records for the vector and graph projections."""

    async def projection_agent_links(self, memory_ids: Sequence[Id]) -> list[Json]:
        """The agent lineage links whose outcome is one of these records (the graph tier)."""
        ids = Cast([str(i) for i in memory_ids], "uuid[]")
        return await self._rows("fabric_api.projection_agent_links", ids)

    async def projection_mentions(self, memory_ids: Sequence[Id]) -> list[Json]:
        """The entities these records mention (persons without names)."""
        ids = Cast([str(i) for i in memory_ids], "uuid[]")
        return await self._rows("fabric_api.projection_mentions", ids)

    async def projection_steps(self, event_ids: Sequence[Id]) -> list[Json]:
        """The reasoning steps these events recorded, with the entities each touched."""
        ids = Cast([str(i) for i in event_ids], "uuid[]")
        return await self._rows("fabric_api.projection_steps", ids)

    async def projection_steps_snapshot(
        self, after_tenant: str | None = None, after_step: Id | None = None, limit: int = 1000
    ) -> list[Json]:
        after = Cast(None if after_step is None else str(after_step), "uuid")
        return await self._rows("fabric_api.projection_steps_snapshot", after_tenant, after, limit)

    async def projection_same_as(self, event_ids: Sequence[Id]) -> list[Json]:
        """The same-as merges these memory.entity.merged events applied, as they stand now."""
        ids = Cast([str(i) for i in event_ids], "uuid[]")
        return await self._rows("fabric_api.projection_same_as", ids)

    async def projection_same_as_snapshot(
        self, after_tenant: str | None = None, after_entity: Id | None = None, limit: int = 1000
    ) -> list[Json]:
        after = Cast(None if after_entity is None else str(after_entity), "uuid")
        return await self._rows(
            "fabric_api.projection_same_as_snapshot", after_tenant, after, limit
        )

    async def store_embedding(
        self,
        memory_id: Id,
        model: str,
        model_version: str,
        embedding: Sequence[float],
        content_hash: str,
    ) -> bool:
        vector = Vector([float(x) for x in embedding])
        pool = await self.fabric.pool(self.login)
        async with pool.connection() as conn:
            await aregister_vector(conn)
            stored = await afabric_call(
                conn,
                "fabric_api.store_embedding",
                memory_id,
                model,
                model_version,
                vector,
                content_hash,
            )
        return bool(stored)

    async def set_projection_cursor(
        self, projection: str, xid: int | str, event_id: Id, rewind: bool = False
    ) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.set_projection_cursor",
            *(projection, Cast(str(xid), "xid8"), event_id, rewind),
        )

    async def begin_projection_rebuild(self, projection: str) -> Json:
        """Note that a rebuild of `projection` begins (before its wipe); the rewind of
        `set_projection_cursor` that ends it clears the note."""
        return await self._call("fabric_api.begin_projection_rebuild", projection)  # type: ignore[no-any-return]

    async def unfinished_projection_rebuild(self, projection: str) -> datetime | None:
        """When a rebuild of `projection` began that has not ended, or None."""
        return await self._call("fabric_api.unfinished_projection_rebuild", projection)  # type: ignore[no-any-return]

    async def projection_horizon(self) -> int:
        return int(await self._call("fabric_api.projection_horizon"))

    # rows (0.4): a page streams as rows; embeddings are pgvector.Vector (binary)
    async def projection_events_v2(self, projection: str, limit: int = 500) -> list[Json]:
        return await self._rows("fabric_api.projection_events_v2", projection, limit)

    async def projection_records_v2(
        self, memory_ids: Sequence[Id], model: str | None = None, model_version: str | None = None
    ) -> list[Json]:
        ids = Cast([str(m) for m in memory_ids], "uuid[]")
        return await self._vector_rows(
            "fabric_api.projection_records_v2", ids, model, model_version
        )

    async def projection_snapshot_v2(
        self,
        after_tenant: str | None = None,
        after_memory: Id | None = None,
        limit: int = 1000,
        model: str | None = None,
        model_version: str | None = None,
    ) -> list[Json]:
        return await self._vector_rows(
            "fabric_api.projection_snapshot_v2",
            *(after_tenant, Cast(after_memory, "uuid"), limit, model, model_version),
        )

    async def store_embeddings(
        self,
        memory_ids: Sequence[Id],
        model: str,
        model_version: str,
        embeddings: Sequence[Sequence[float]],
        content_hashes: Sequence[str],
    ) -> list[Json]:
        """One row per record: `stored` is false for an erased, content-less or re-hashed one."""
        vectors = [Vector([float(x) for x in e]) for e in embeddings]
        ids = Cast([str(m) for m in memory_ids], "uuid[]")
        return await self._vector_rows(
            "fabric_api.store_embeddings", ids, model, model_version, vectors, list(content_hashes)
        )

    async def _vector_rows(self, name: str, *args: Any) -> list[Json]:
        pool = await self.fabric.pool(self.login)
        async with pool.connection() as conn:
            await aregister_vector(conn)
            return await afabric_rows(conn, name, *args, binary=True)

    async def deployment_embedder(self) -> Json:
        return await self._call("fabric_api.deployment_embedder")  # type: ignore[no-any-return]


class AsyncTracer(_AsyncRole):
    """fabric_tracer: the content-free feed that recall spans are made from."""

    async def trace_events(self, limit: int = 500) -> list[Json]:
        return await self._call("fabric_api.trace_events", limit)  # type: ignore[no-any-return]

    async def set_trace_cursor(self, xid: int | str, event_id: Id) -> Json:
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.set_trace_cursor", Cast(str(xid), "xid8"), Cast(str(event_id), "uuid")
        )

    async def trace_lag(self) -> int:
        return int(await self._call("fabric_api.trace_lag"))

    async def check_trace_endpoint(self, endpoint: str) -> bool:
        return bool(await self._call("fabric_api.check_trace_endpoint", endpoint))


class AsyncMcpGateway(_AsyncRole):
    """fabric_mcp_gateway: resolves a bearer token to the agent login and run it stands for."""

    async def resolve_mcp_token(self, token: str) -> Json:
        return await self._call("fabric_api.resolve_mcp_token", token)  # type: ignore[no-any-return]

    async def open_token_run(self, token: str) -> Json:
        """A run from an agent token's template: `{"run_id", "login", "tenant_id",
        "agent_id", "expires_at", "token_id"}`."""
        return await self._call("fabric_api.open_token_run", token)  # type: ignore[no-any-return]


class AsyncWorkflow(_AsyncRole):
    """fabric_workflow: a domain workflow's records of the graph tier (agent lineage links,
    reasoning steps), never memory."""

    async def record_agent_link(
        self,
        tenant_id: str,
        agent_id: str,
        outcome_id: Id,
        kind: str,
        source_event_id: Id,
        correlation_id: str,
        outcome_envelope_id: Id | None = None,
    ) -> Json:
        """That `agent_id` caused or contributed to the record `outcome_id`, learnt from the
        event `source_event_id`; {"link_id", "recorded"}."""
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.record_agent_link",
            tenant_id,
            agent_id,
            Cast(str(outcome_id), "uuid"),
            kind,
            Cast(str(source_event_id), "uuid"),
            correlation_id,
            Cast(None if outcome_envelope_id is None else str(outcome_envelope_id), "uuid"),
        )

    async def record_measurements(self, tenant_id: str, points: Sequence[Mapping[str, Any]]) -> int:
        """Time-series points of the tenant (the temporal tier), all or nothing: each
        {"series", "at", "value"} and optionally subject_id, business_instance_id,
        retention_class; the number written."""
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.record_measurements", tenant_id, Jsonb([dict(p) for p in points])
        )

    async def record_step(
        self,
        run: Run | Id,
        correlation_id: str,
        entity_ids: Sequence[Id],
        outcome_envelope_id: Id | None = None,
    ) -> Json:
        """A reasoning step of `run` and the entities it touched; {"step_id", "event_id"}."""
        run_id = run.run_id if isinstance(run, Run) else run
        return await self._call(  # type: ignore[no-any-return]
            "fabric_api.record_step",
            Cast(str(run_id), "uuid"),
            correlation_id,
            Cast([str(i) for i in entity_ids], "uuid[]"),
            Cast(None if outcome_envelope_id is None else str(outcome_envelope_id), "uuid"),
        )


ROLES: dict[str, type[_AsyncRole]] = {
    "admin": AsyncAdmin,
    "orchestrator": AsyncOrchestrator,
    "agent": AsyncAgent,
    "committer": AsyncCommitter,
    "policy": AsyncPolicy,
    "consolidator": AsyncConsolidator,
    "auditor": AsyncAuditor,
    "projector": AsyncProjector,
    "tracer": AsyncTracer,
    "mcp_gateway": AsyncMcpGateway,
    "workflow": AsyncWorkflow,
}
