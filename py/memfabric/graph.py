"""The graph projection (R-PROJ-1): memories, their lineage and the agents that formed them,
written over Bolt with the official `neo4j` driver.

Production talks to a self-hosted Neo4j 5 (`NEO4J_URI`, database usually `neo4j`); tests
and the demo talk to the ArcadeDB server that `scripts/graph.sh` installs and starts
(database `graph`). Every statement here stays in the Cypher subset both accept, is
parameterized (inputs never reach the query text) and names the tenant in every MATCH and
MERGE; the only statements without a tenant are the whole-graph `wipe()` and
`count_memories()` of drills.

Shape:

- `(:Memory {tenant_id, memory_id, tier, consolidation_state, visibility, scope_key,
  content_hash, formation_method, formed_by, valid_from, valid_until, confidence})`, unique
  on (tenant_id, memory_id) with a composite uniqueness constraint (accepted and enforced by
  both Neo4j 5 and ArcadeDB, so no derived `key` property is stored). Timestamps are
  stored as the ISO 8601 strings they arrive as (datetimes are converted to UTC ISO
  strings), so an export compares byte for byte across servers.
- `scope_key` is the feed's: a subject's or session's is its pseudonym
  (`subject:hmac:…`), never the id in clear, so the graph holds nothing that names a
  person once the subject's key is destroyed (docs/security.md).
- `(:Agent {tenant_id, agent_id})-[:FORMED]->(:Memory)`. Agents are keyed per tenant, so
  no node is shared between tenants and no path crosses from one tenant to another.
- `(:Memory)-[:DERIVED_FROM]->(:Memory)` and `(:Memory)-[:SUPERSEDES]->(:Memory)`, always
  inside one tenant: the target is MERGEd by (row's tenant, target id), so a child may
  arrive before its parent (the parent is a bare node until its own row arrives).
- `(:Agent)-[:INFLUENCED {link_id, kind, source_event_id, correlation_id,
  outcome_envelope_id, recorded_at}]->(:Memory)`: an agent lineage link (a row of
  fabric.agent_lineage_links), one edge per link.
- `(:Entity {tenant_id, entity_id, entity_type, name | subject_ref})` and
  `(:Memory)-[:MENTIONS {source, correlation_id, valid_from, valid_until}]->(:Entity)`: the
  entities a record mentions. A person's node never carries a name (its entity id; a
  subject's person also its subject's pseudonym); a record whose content is gone mentions
  nothing, and an entity no record mentions is removed, as in PostgreSQL.
- `(:Entity)-[:SAME_AS {correlation_id}]->(:Entity)`: an applied same-as merge, from the
  merged entity to the one it was merged into (fabric.entities.merged_into); it goes with
  either node. Graph recall counts the two as one.
- Every node and edge written carries the correlation id of what it projects (the record's,
  or the link's).
- Erasure (`forget`) keeps tenant_id, memory_id, content_hash, correlation_id and the edges, sets
  consolidation_state 'tombstoned' and removes every other property. A tombstone is final:
  a later (replayed) upsert of the same memory changes nothing but a missing content_hash,
  so "forget, then replay" and "replay, then forget" end in the same graph.

Projection is idempotent (MERGE everywhere) and batched (UNWIND, `BATCH` rows per write
transaction).

ArcadeDB notes (26.10.2 over Bolt): every write runs in a managed transaction
(`execute_write`): an auto-commit UNWIND that MERGEs edges onto nodes created just before
failed there with "Record … was modified by a concurrent transaction" (TransientError).
ArcadeDB walks a MERGE pattern's edges from its first node, so relationship MERGEs are
written from the memory's side (`(m)<-[:FORMED]-(a)`: 0.08 s instead of 1.55 s for 500
existing links, since an Agent has one FORMED edge per memory it formed). Labels and
relationship types share one namespace there: no label may be called FORMED, DERIVED_FROM
or SUPERSEDES.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from types import TracebackType
from typing import Any, Final, Self, TypeVar

from neo4j import Driver, GraphDatabase, ManagedTransaction

BATCH: Final = 500
WIPE_BATCH: Final = 5_000

LOCAL_BOLT_PORT: Final = 57687
LOCAL_USER: Final = "root"
LOCAL_PASSWORD: Final = "memfabric-graph"  # noqa: S105 (the local dev server, graph.sh)
LOCAL_DATABASE: Final = "graph"
NEO4J_DEFAULT_USER: Final = "neo4j"
NEO4J_DEFAULT_DATABASE: Final = "neo4j"

TOMBSTONED: Final = "tombstoned"

#: Properties a (:Memory) node carries besides its key (tenant_id, memory_id).
MEMORY_PROPERTIES: Final = (
    "tier",
    "consolidation_state",
    "visibility",
    "scope_key",
    "content_hash",
    "formation_method",
    "formed_by",
    "valid_from",
    "valid_until",
    "confidence",
    "correlation_id",
)
#: What erasure keeps (besides consolidation_state, which becomes 'tombstoned'): identity,
#: the content hash and the provenance's correlation id, as the tombstone in PostgreSQL.
KEPT_ON_FORGET: Final = ("tenant_id", "memory_id", "content_hash", "correlation_id")
#: Keys a row given to `upsert_memories` may leave out (None).
OPTIONAL_ROW_KEYS: Final = ("correlation_id",)
#: Keys every row given to `upsert_memories` must have (others are ignored).
ROW_KEYS: Final = (
    "tenant_id",
    "memory_id",
    *(p for p in MEMORY_PROPERTIES if p not in OPTIONAL_ROW_KEYS),
    "derived_from",
    "supersedes",
)
#: The POLE+O entity types; a person's node never carries a name.
ENTITY_TYPES: Final = ("person", "organization", "location", "event", "object")

_TEXT_PROPERTIES: Final = frozenset(MEMORY_PROPERTIES) - {"valid_from", "valid_until", "confidence"}

SCHEMA: Final = (
    "CREATE CONSTRAINT memory_key IF NOT EXISTS "
    "FOR (m:Memory) REQUIRE (m.tenant_id, m.memory_id) IS UNIQUE",
    "CREATE CONSTRAINT agent_key IF NOT EXISTS "
    "FOR (a:Agent) REQUIRE (a.tenant_id, a.agent_id) IS UNIQUE",
    "CREATE CONSTRAINT entity_key IF NOT EXISTS "
    "FOR (e:Entity) REQUIRE (e.tenant_id, e.entity_id) IS UNIQUE",
    "CREATE CONSTRAINT step_key IF NOT EXISTS "
    "FOR (s:Step) REQUIRE (s.tenant_id, s.step_id) IS UNIQUE",
    # graph recall's walk from the caller's scope (`_WALK_SCOPE_MENTIONING`)
    "CREATE INDEX memory_scope IF NOT EXISTS FOR (m:Memory) ON (m.tenant_id, m.scope_key)",
)

# --- statements (all parameterized; relationship types are literals, never inputs) -------

# A tombstone is final: it only gains a content_hash it lacks (forgotten before it was
# first projected). The MERGE patterns start from the memory's side: ArcadeDB walks the
# edges of the pattern's first node, and an Agent has one FORMED edge per memory it formed.
_UPSERT_NODES: Final = """
UNWIND $rows AS r
MERGE (m:Memory {tenant_id: r.tenant_id, memory_id: r.memory_id})
SET m += CASE WHEN m.consolidation_state = 'tombstoned'
              THEN {content_hash: coalesce(m.content_hash, r.props.content_hash),
                    correlation_id: coalesce(m.correlation_id, r.props.correlation_id)}
              ELSE r.props END
WITH m, r
WHERE r.formed_by IS NOT NULL
MERGE (a:Agent {tenant_id: r.tenant_id, agent_id: r.formed_by})
MERGE (m)<-[f:FORMED]-(a)
SET f.correlation_id = r.props.correlation_id
"""

_UPSERT_DERIVED_FROM: Final = """
UNWIND $links AS l
MATCH (m:Memory {tenant_id: l.tenant_id, memory_id: l.memory_id})
MERGE (p:Memory {tenant_id: l.tenant_id, memory_id: l.target_id})
MERGE (m)-[d:DERIVED_FROM]->(p)
SET d.correlation_id = l.correlation_id
"""

_UPSERT_SUPERSEDES: Final = """
UNWIND $links AS l
MATCH (m:Memory {tenant_id: l.tenant_id, memory_id: l.memory_id})
MERGE (p:Memory {tenant_id: l.tenant_id, memory_id: l.target_id})
MERGE (m)-[s:SUPERSEDES]->(p)
SET s.correlation_id = l.correlation_id
"""

# MERGE, not MATCH: erasure may be projected before the memory itself; the tombstone then
# stops the late upsert from writing the erased properties.
_FORGET: Final = """
UNWIND $memory_ids AS id
MERGE (m:Memory {tenant_id: $tenant_id, memory_id: id})
SET m = {tenant_id: m.tenant_id, memory_id: m.memory_id, content_hash: m.content_hash,
         correlation_id: m.correlation_id, consolidation_state: 'tombstoned'}
RETURN count(m) AS n
"""

# An agent lineage link (fabric.agent_lineage_links): one INFLUENCED edge per link_id, from
# the agent to the outcome, carrying the link's kind, source event, correlation and
# Outcome Envelope. The outcome may arrive later (a bare node until its row arrives).
_UPSERT_LINKS: Final = """
UNWIND $links AS l
MERGE (m:Memory {tenant_id: l.tenant_id, memory_id: l.outcome_id})
MERGE (a:Agent {tenant_id: l.tenant_id, agent_id: l.agent_id})
MERGE (m)<-[i:INFLUENCED {link_id: l.link_id}]-(a)
SET i += l.props
"""

# A record's mentions (fabric.memory_mentions): the entity node (no name for a person; a
# subject's person carries its subject_ref) and a MENTIONS edge with the record's validity
# and correlation id.
_UPSERT_MENTIONS: Final = """
UNWIND $mentions AS x
MATCH (m:Memory {tenant_id: x.tenant_id, memory_id: x.memory_id})
MERGE (e:Entity {tenant_id: x.tenant_id, entity_id: x.entity_id})
SET e += x.entity
MERGE (m)-[r:MENTIONS]->(e)
SET r += x.props
"""

# A reasoning step (fabric.reasoning_steps): the agent that took it, and the entities it
# touched (an entity no record mentions is a bare node: it has no properties to give).
_UPSERT_STEPS: Final = """
UNWIND $steps AS x
MERGE (s:Step {tenant_id: x.tenant_id, step_id: x.step_id})
SET s += x.props
MERGE (a:Agent {tenant_id: x.tenant_id, agent_id: x.agent_id})
MERGE (s)<-[t:TOOK]-(a)
SET t.correlation_id = x.props.correlation_id
WITH s, x
UNWIND x.entity_ids AS id
MERGE (e:Entity {tenant_id: x.tenant_id, entity_id: id})
MERGE (s)-[r:TOUCHED]->(e)
SET r.correlation_id = x.props.correlation_id
"""

# An applied same-as merge (fabric.entities.merged_into): the merged entity and the one it
# was merged into, as the mentions write entity nodes (no name for a person), and a SAME_AS
# edge with the merge's correlation id. Either node may have no MENTIONS yet (an entity no
# record mentions, e.g. a subject's person before its first record).
_UPSERT_SAME_AS: Final = """
UNWIND $merges AS x
MERGE (e:Entity {tenant_id: x.tenant_id, entity_id: x.entity_id})
SET e += x.entity
MERGE (c:Entity {tenant_id: x.tenant_id, entity_id: x.into_entity_id})
SET c += x.into
MERGE (e)-[s:SAME_AS]->(c)
SET s.correlation_id = x.correlation_id
"""

# A record whose content is gone (erased, window closed) mentions nothing any more; the
# entities it mentioned are returned, to remove those no record mentions.
_DROP_MENTIONS: Final = """
UNWIND $memory_ids AS id
MATCH (m:Memory {tenant_id: $tenant_id, memory_id: id})-[r:MENTIONS]->(e:Entity)
DELETE r
RETURN DISTINCT e.entity_id AS entity_id
"""

_DROP_UNMENTIONED: Final = """
UNWIND $entity_ids AS id
MATCH (e:Entity {tenant_id: $tenant_id, entity_id: id})
OPTIONAL MATCH (e)<-[r:MENTIONS]-(:Memory)
WITH e, count(r) AS n
WHERE n = 0
DETACH DELETE e
RETURN count(*) AS n
"""

# Graph recall, one hop at a time (`walk`): the records in the caller's scope that mention
# some entities, and the entities some records mention. Only live records in the scope keys
# and tiers the database resolved are walked through; the database re-checks every
# candidate anyway. A hop is capped at $limit pairs.
_WALK_MENTIONING: Final = """
UNWIND $entity_ids AS id
MATCH (e:Entity {tenant_id: $tenant_id, entity_id: id})<-[:MENTIONS]-(m:Memory)
WHERE m.tenant_id = $tenant_id AND m.scope_key IN $scope_keys AND m.tier IN $tiers
  AND m.consolidation_state IN $live
RETURN e.entity_id AS entity_id, m.memory_id AS memory_id
LIMIT $limit
"""
# The same pairs, found from the other end: the records of the caller's scope keys (the
# memory_scope index) and the entities they mention. An entity many records of the whole
# tenant mention (a city) costs the walk above one edge read per record; this one reads the
# scope's records and their MENTIONS, whatever the entities' degree. After the first hop
# (the seeds), `walk` takes the cheaper of the two (`_DEGREE`, `_SCOPE_SIZE`); both give
# the same pairs.
_WALK_SCOPE_MENTIONING: Final = """
UNWIND $scope_keys AS k
MATCH (m:Memory {tenant_id: $tenant_id, scope_key: k})-[:MENTIONS]->(e:Entity)
WHERE m.tier IN $tiers AND m.consolidation_state IN $live AND e.entity_id IN $entity_ids
RETURN e.entity_id AS entity_id, m.memory_id AS memory_id
LIMIT $limit
"""
# How many MENTIONS edges the entities have (tenant-wide: what the walk above reads), and
# how many records the caller's scope keys hold (what the walk from the scope reads).
_DEGREE: Final = """
UNWIND $entity_ids AS id
MATCH (e:Entity {tenant_id: $tenant_id, entity_id: id})
RETURN COUNT { (e)<-[:MENTIONS]-() } AS n
"""
_SCOPE_SIZE: Final = """
UNWIND $scope_keys AS k
MATCH (m:Memory {tenant_id: $tenant_id, scope_key: k})
RETURN count(m) AS n
"""

# A subject's person is in every record of the subject: the walk starts there when the
# query names no entity, and never passes through it (it links by scope, not by meaning).
# An entity merged into another (SAME_AS) is that other: the two are one entity, whose
# records the other's MENTIONS reach (a merge gives them the other's mention too); a
# subject's person merged with another leaves both out.
_WALK_MENTIONED: Final = """
UNWIND $memory_ids AS id
MATCH (m:Memory {tenant_id: $tenant_id, memory_id: id})-[:MENTIONS]->(e:Entity)
OPTIONAL MATCH (e)-[:SAME_AS]->(c:Entity)
WITH coalesce(c.entity_id, e.entity_id) AS entity_id,
     coalesce(c.subject_ref, e.subject_ref) AS subject_ref
WHERE subject_ref IS NULL
RETURN DISTINCT entity_id
"""

# The hops after the first follow the edge kinds recall's expand.via names, from the records
# the last hop reached to the live records in scope they link to: DERIVED_FROM and
# SUPERSEDES either way, INFLUENCED through the agents that influenced them. Each pair is
# (what links them, the record reached), ranked by `rank_walk` as an entity's pairs are.
_WALK_DERIVED_FROM: Final = """
UNWIND $memory_ids AS id
MATCH (m:Memory {tenant_id: $tenant_id, memory_id: id})-[:DERIVED_FROM]-(n:Memory)
WHERE n.tenant_id = $tenant_id AND n.scope_key IN $scope_keys AND n.tier IN $tiers
  AND n.consolidation_state IN $live
RETURN m.memory_id AS via_id, n.memory_id AS memory_id
LIMIT $limit
"""
_WALK_SUPERSEDES: Final = """
UNWIND $memory_ids AS id
MATCH (m:Memory {tenant_id: $tenant_id, memory_id: id})-[:SUPERSEDES]-(n:Memory)
WHERE n.tenant_id = $tenant_id AND n.scope_key IN $scope_keys AND n.tier IN $tiers
  AND n.consolidation_state IN $live
RETURN m.memory_id AS via_id, n.memory_id AS memory_id
LIMIT $limit
"""
_WALK_INFLUENCED: Final = """
UNWIND $memory_ids AS id
MATCH (m:Memory {tenant_id: $tenant_id, memory_id: id})<-[:INFLUENCED]-(a:Agent)
MATCH (a)-[:INFLUENCED]->(n:Memory)
WHERE n.tenant_id = $tenant_id AND n.scope_key IN $scope_keys AND n.tier IN $tiers
  AND n.consolidation_state IN $live
RETURN a.agent_id AS via_id, n.memory_id AS memory_id
LIMIT $limit
"""
_WALK_EDGES: Final = {
    "DERIVED_FROM": _WALK_DERIVED_FROM,
    "SUPERSEDES": _WALK_SUPERSEDES,
    "INFLUENCED": _WALK_INFLUENCED,
}
#: The edge kinds a walk may follow after its first hop (recall's expand.via).
WALK_KINDS: Final = ("MENTIONS", "DERIVED_FROM", "SUPERSEDES", "INFLUENCED")

_WIPE_MEMORIES: Final = "MATCH (n:Memory) WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS n"
_WIPE_AGENTS: Final = "MATCH (n:Agent) WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS n"
_WIPE_ENTITIES: Final = "MATCH (n:Entity) WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS n"
_WIPE_STEPS: Final = "MATCH (n:Step) WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS n"
_WIPE_TENANT_MEMORIES: Final = """
MATCH (n:Memory {tenant_id: $tenant_id}) WITH n LIMIT $limit DETACH DELETE n
RETURN count(*) AS n
"""
_WIPE_TENANT_AGENTS: Final = """
MATCH (n:Agent {tenant_id: $tenant_id}) WITH n LIMIT $limit DETACH DELETE n
RETURN count(*) AS n
"""
_WIPE_TENANT_ENTITIES: Final = """
MATCH (n:Entity {tenant_id: $tenant_id}) WITH n LIMIT $limit DETACH DELETE n
RETURN count(*) AS n
"""
_WIPE_TENANT_STEPS: Final = """
MATCH (n:Step {tenant_id: $tenant_id}) WITH n LIMIT $limit DETACH DELETE n
RETURN count(*) AS n
"""

_COUNT_ALL: Final = "MATCH (m:Memory) RETURN count(m) AS n"
_COUNT_TENANT: Final = "MATCH (m:Memory {tenant_id: $tenant_id}) RETURN count(m) AS n"

_EXPORT_MEMORIES: Final = """
MATCH (m:Memory {tenant_id: $tenant_id}) RETURN m.memory_id AS id, properties(m) AS props
"""
_EXPORT_AGENTS: Final = """
MATCH (a:Agent {tenant_id: $tenant_id}) RETURN a.agent_id AS id, properties(a) AS props
"""
_EXPORT_ENTITIES: Final = """
MATCH (e:Entity {tenant_id: $tenant_id}) RETURN e.entity_id AS id, properties(e) AS props
"""
_EXPORT_STEPS: Final = """
MATCH (s:Step {tenant_id: $tenant_id}) RETURN s.step_id AS id, properties(s) AS props
"""
# One row per relationship (duplicates would show: MERGE must never make them).
_EXPORT_EDGES: Final = (
    (
        "FORMED",
        "MATCH (a:Agent {tenant_id: $tenant_id})-[:FORMED]->(m:Memory {tenant_id: $tenant_id}) "
        "RETURN a.agent_id AS src, m.memory_id AS dst",
    ),
    (
        "DERIVED_FROM",
        "MATCH (m:Memory {tenant_id: $tenant_id})-[:DERIVED_FROM]->"
        "(p:Memory {tenant_id: $tenant_id}) RETURN m.memory_id AS src, p.memory_id AS dst",
    ),
    (
        "SUPERSEDES",
        "MATCH (m:Memory {tenant_id: $tenant_id})-[:SUPERSEDES]->"
        "(p:Memory {tenant_id: $tenant_id}) RETURN m.memory_id AS src, p.memory_id AS dst",
    ),
    (
        "INFLUENCED",
        "MATCH (a:Agent {tenant_id: $tenant_id})-[:INFLUENCED]->(m:Memory {tenant_id: $tenant_id}) "
        "RETURN a.agent_id AS src, m.memory_id AS dst",
    ),
    (
        "MENTIONS",
        "MATCH (m:Memory {tenant_id: $tenant_id})-[:MENTIONS]->(e:Entity {tenant_id: $tenant_id}) "
        "RETURN m.memory_id AS src, e.entity_id AS dst",
    ),
    (
        "SAME_AS",
        "MATCH (e:Entity {tenant_id: $tenant_id})-[:SAME_AS]->(c:Entity {tenant_id: $tenant_id}) "
        "RETURN e.entity_id AS src, c.entity_id AS dst",
    ),
    (
        "TOOK",
        "MATCH (a:Agent {tenant_id: $tenant_id})-[:TOOK]->(s:Step {tenant_id: $tenant_id}) "
        "RETURN a.agent_id AS src, s.step_id AS dst",
    ),
    (
        "TOUCHED",
        "MATCH (s:Step {tenant_id: $tenant_id})-[:TOUCHED]->(e:Entity {tenant_id: $tenant_id}) "
        "RETURN s.step_id AS src, e.entity_id AS dst",
    ),
)


# One level of lineage; `lineage` walks it breadth first (a variable-length bound cannot
# be a parameter, and level by level stays linear on wide DAGs).
_PARENTS: Final = """
UNWIND $ids AS id
MATCH (:Memory {tenant_id: $tenant_id, memory_id: id})-[:DERIVED_FROM]->
      (p:Memory {tenant_id: $tenant_id})
RETURN DISTINCT p.memory_id AS id
"""


@dataclass(frozen=True)
class GraphExport:
    """One tenant's projection in canonical order, for drills and verification.

    nodes: (label, key, properties) sorted by label then key; key is `tenant_id:memory_id`
    for a Memory, `tenant_id:agent_id` for an Agent and `tenant_id:entity_id` for an
    Entity; properties with sorted keys.
    edges: (type, from key, to key), sorted, one entry per relationship. FORMED and
    INFLUENCED go from an Agent key to a Memory key, DERIVED_FROM and SUPERSEDES from
    Memory to Memory, MENTIONS from Memory to Entity, SAME_AS from Entity to Entity.
    """

    nodes: list[tuple[str, str, dict[str, Any]]]
    edges: list[tuple[str, str, str]]

    def as_json(self) -> str:
        """Canonical JSON text (sorted keys, no whitespace), e.g. to hash or diff."""
        return json.dumps(
            {"nodes": self.nodes, "edges": self.edges},
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )


def _key(tenant_id: str, ident: str) -> str:
    return f"{tenant_id}:{ident}"


def _key_text(row: Mapping[str, Any], name: str) -> str:
    value = row[name]
    if not isinstance(value, str) or not value:
        raise ValueError(f"graph row: {name} must be a non-empty string")
    return value


def _text(row: Mapping[str, Any], name: str) -> str | None:
    value = row.get(name) if name in OPTIONAL_ROW_KEYS else row[name]
    if value is not None and not isinstance(value, str):
        raise ValueError(f"graph row: {name} must be a string or None")
    return value


def _timestamp(row: Mapping[str, Any], name: str) -> str | None:
    value = row[name]
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"graph row: {name} is a naive datetime")
        return value.astimezone(UTC).isoformat()
    raise ValueError(f"graph row: {name} must be an ISO string, a datetime or None")


def _confidence(row: Mapping[str, Any]) -> float | None:
    value = row["confidence"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError("graph row: confidence must be a number or None")
    return float(value)


@dataclass(frozen=True)
class _Row:
    tenant_id: str
    memory_id: str
    props: dict[str, Any]
    formed_by: str | None
    derived_from: tuple[str, ...]
    supersedes: str | None


def _normalize(row: Mapping[str, Any]) -> _Row:
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise ValueError(f"graph row: missing keys {missing}")
    props: dict[str, Any] = {name: _text(row, name) for name in sorted(_TEXT_PROPERTIES)}
    props["valid_from"] = _timestamp(row, "valid_from")
    props["valid_until"] = _timestamp(row, "valid_until")
    props["confidence"] = _confidence(row)
    if props["consolidation_state"] == TOMBSTONED:
        # An erased record: only what erasure keeps (None removes a property on SET +=).
        props = {name: None for name in MEMORY_PROPERTIES} | {
            "content_hash": props["content_hash"],
            "correlation_id": props["correlation_id"],
            "consolidation_state": TOMBSTONED,
        }
    derived = row["derived_from"]
    if derived is None:
        derived = ()
    if isinstance(derived, str | bytes) or not isinstance(derived, Iterable):
        raise ValueError("graph row: derived_from must be a list of memory ids")
    parents = tuple(derived)
    if not all(isinstance(p, str) and p for p in parents):
        raise ValueError("graph row: derived_from must hold non-empty strings")
    return _Row(
        tenant_id=_key_text(row, "tenant_id"),
        memory_id=_key_text(row, "memory_id"),
        props=props,
        formed_by=_text(row, "formed_by"),
        derived_from=parents,
        supersedes=_text(row, "supersedes"),
    )


T = TypeVar("T")


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _write_batch(tx: ManagedTransaction, batch: Sequence[_Row]) -> None:
    rows = [
        {
            "tenant_id": r.tenant_id,
            "memory_id": r.memory_id,
            "props": r.props,
            "formed_by": r.formed_by,
        }
        for r in batch
    ]
    tx.run(_UPSERT_NODES, rows=rows).consume()
    derived = [
        {
            "tenant_id": r.tenant_id,
            "memory_id": r.memory_id,
            "target_id": parent,
            "correlation_id": r.props["correlation_id"],
        }
        for r in batch
        for parent in r.derived_from
    ]
    if derived:
        tx.run(_UPSERT_DERIVED_FROM, links=derived).consume()
    supersedes = [
        {
            "tenant_id": r.tenant_id,
            "memory_id": r.memory_id,
            "target_id": r.supersedes,
            "correlation_id": r.props["correlation_id"],
        }
        for r in batch
        if r.supersedes is not None
    ]
    if supersedes:
        tx.run(_UPSERT_SUPERSEDES, links=supersedes).consume()


def _string(value: Any) -> str | None:
    """An id as the graph keeps it: a string (uuids as their text), or None."""
    return None if value is None else str(value)


def _link_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of fabric_api.projection_agent_links as an INFLUENCED edge."""
    return {
        "tenant_id": _key_text(row, "tenant_id"),
        "outcome_id": _string(row["outcome_id"]),
        "agent_id": _key_text(row, "agent_id"),
        "link_id": _string(row["link_id"]),
        "props": {
            "kind": row["link_kind"],
            "source_event_id": _string(row["source_event_id"]),
            "correlation_id": _text(row, "correlation_id"),
            "outcome_envelope_id": _string(row["outcome_envelope_id"]),
            "recorded_at": _timestamp(row, "recorded_at"),
        },
    }


def _mention_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of fabric_api.projection_mentions as an Entity node and a MENTIONS edge. A
    person's node carries no name whatever the row says (the feed sends none)."""
    return {
        "tenant_id": _key_text(row, "tenant_id"),
        "memory_id": _string(row["memory_id"]),
        "entity_id": _string(row["entity_id"]),
        "entity": _entity_props(row["entity_type"], row["name"], row["subject_ref"]),
        "props": {
            "source": row["source"],
            "correlation_id": _text(row, "correlation_id"),
            "valid_from": _timestamp(row, "valid_from"),
            "valid_until": _timestamp(row, "valid_until"),
        },
    }


def _entity_props(entity_type: Any, name: Any, subject_ref: Any) -> dict[str, Any]:
    """An Entity node's properties: a person never carries a name (whatever the row says),
    and only a person a subject_ref."""
    if entity_type not in ENTITY_TYPES:
        raise ValueError("graph entity: entity_type must be a POLE+O type")
    person = entity_type == "person"
    for value in (name, subject_ref):
        if value is not None and not isinstance(value, str):
            raise ValueError("graph entity: name and subject_ref must be strings or None")
    return {
        "entity_type": entity_type,
        "name": None if person else name,
        "subject_ref": subject_ref if person else None,
    }


def _same_as_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of fabric_api.projection_same_as as two Entity nodes and a SAME_AS edge (a
    merge joins entities of one type)."""
    return {
        "tenant_id": _key_text(row, "tenant_id"),
        "entity_id": _string(row["entity_id"]),
        "into_entity_id": _string(row["into_entity_id"]),
        "entity": _entity_props(row["entity_type"], row["name"], row["subject_ref"]),
        "into": _entity_props(row["entity_type"], row["into_name"], row["into_subject_ref"]),
        "correlation_id": _text(row, "correlation_id"),
    }


def _step_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of fabric_api.projection_steps as a Step node, its TOOK and TOUCHED edges."""
    return {
        "tenant_id": _key_text(row, "tenant_id"),
        "step_id": _string(row["step_id"]),
        "agent_id": _key_text(row, "agent_id"),
        "entity_ids": [str(e) for e in row["entity_ids"] or ()],
        "props": {
            "run_id": _string(row["run_id"]),
            "correlation_id": _text(row, "correlation_id"),
            "outcome_envelope_id": _string(row["outcome_envelope_id"]),
            "recorded_at": _timestamp(row, "recorded_at"),
        },
    }


def _drop_mentions(tx: ManagedTransaction, tenant_id: str, memory_ids: list[str]) -> int:
    gone = [
        str(r["entity_id"])
        for r in tx.run(_DROP_MENTIONS, tenant_id=tenant_id, memory_ids=memory_ids)
    ]
    if not gone:
        return 0
    return _single_int(tx, _DROP_UNMENTIONED, tenant_id=tenant_id, entity_ids=gone)


def _run_write(tx: ManagedTransaction, query: str, /, **params: Any) -> None:
    tx.run(query, params).consume()


def _single_int(tx: ManagedTransaction, query: str, /, **params: Any) -> int:
    record = tx.run(query, params).single(strict=True)
    return int(record["n"])


class GraphStore:
    """The (:Memory)/(:Agent) projection in one Neo4j-compatible database over Bolt."""

    def __init__(
        self,
        uri: str,
        user: str,
        password: str,
        database: str = LOCAL_DATABASE,
        *,
        batch_size: int = BATCH,
        retry_seconds: float = 30.0,
    ) -> None:
        """`retry_seconds`: how long a write transaction is retried while the server is
        unreachable before the driver's error reaches the caller (the driver's default)."""
        if batch_size < 1:
            raise ValueError("batch_size must be positive")
        if retry_seconds < 0:
            raise ValueError("retry_seconds must not be negative")
        self.uri = uri
        self.database = database
        self.batch_size = batch_size
        self._driver: Driver = GraphDatabase.driver(
            uri,
            auth=(user, password),
            max_connection_pool_size=10,
            connection_timeout=15.0,
            max_transaction_retry_time=retry_seconds,
        )

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self._driver.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def verify(self) -> None:
        """Raise unless the server answers a query in our database."""
        with self._driver.session(database=self.database) as session:
            session.run("RETURN 1 AS n").consume()

    # -- schema ----------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Composite uniqueness on each label's key ((:Memory) (tenant_id, memory_id),
        (:Agent), (:Entity), (:Step)), and the range index `memory_scope` on (:Memory)
        (tenant_id, scope_key) that graph recall's walk from a scope reads. Idempotent (IF
        NOT EXISTS). Each constraint is backed by an index, which is what makes MERGE on the
        key fast."""
        with self._driver.session(database=self.database) as session:
            for statement in SCHEMA:
                session.run(statement).consume()

    # -- writes ----------------------------------------------------------------------------

    def upsert_memories(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Project memory rows (keys: ROW_KEYS); returns the number of rows written.

        Every row is validated before anything is written. Each batch of `batch_size`
        rows is one write transaction: nodes, then FORMED, DERIVED_FROM and SUPERSEDES
        edges, all MERGEd, so re-running a batch (at-least-once delivery) is a no-op.
        """
        normalized = [_normalize(row) for row in rows]
        with self._driver.session(database=self.database) as session:
            for batch in _chunks(normalized, self.batch_size):
                session.execute_write(_write_batch, batch)
        return len(normalized)

    def upsert_links(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Project agent lineage links (rows of fabric_api.projection_agent_links) as
        `(:Agent)-[:INFLUENCED {link_id, kind, source_event_id, correlation_id,
        outcome_envelope_id, recorded_at}]->(:Memory)`, one edge per link (MERGE on
        link_id). Returns the number of links written."""
        links = [_link_row(r) for r in rows]
        with self._driver.session(database=self.database) as session:
            for chunk in _chunks(links, self.batch_size):
                session.execute_write(_run_write, _UPSERT_LINKS, links=list(chunk))
        return len(links)

    def upsert_mentions(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Project mentions (rows of fabric_api.projection_mentions): `(:Entity {tenant_id,
        entity_id, entity_type, name | subject_ref})` and `(:Memory)-[:MENTIONS {source,
        correlation_id, valid_from, valid_until}]->(:Entity)`. The memory must be
        projected first (`upsert_memories`). Returns the number of mentions written."""
        mentions = [_mention_row(r) for r in rows]
        with self._driver.session(database=self.database) as session:
            for chunk in _chunks(mentions, self.batch_size):
                session.execute_write(_run_write, _UPSERT_MENTIONS, mentions=list(chunk))
        return len(mentions)

    def upsert_steps(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Project reasoning steps (rows of fabric_api.projection_steps): `(:Agent)-[:TOOK]->
        (:Step {tenant_id, step_id, run_id, correlation_id, outcome_envelope_id,
        recorded_at})-[:TOUCHED]->(:Entity)`. Returns the number of steps written."""
        steps = [_step_row(r) for r in rows]
        with self._driver.session(database=self.database) as session:
            for chunk in _chunks(steps, self.batch_size):
                session.execute_write(_run_write, _UPSERT_STEPS, steps=list(chunk))
        return len(steps)

    def upsert_same_as(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Project applied same-as merges (rows of fabric_api.projection_same_as):
        `(:Entity)-[:SAME_AS {correlation_id}]->(:Entity)`, from the merged entity to the one
        it was merged into, both nodes as `upsert_mentions` writes them. Returns the number
        of merges written."""
        merges = [_same_as_row(r) for r in rows]
        with self._driver.session(database=self.database) as session:
            for chunk in _chunks(merges, self.batch_size):
                session.execute_write(_run_write, _UPSERT_SAME_AS, merges=list(chunk))
        return len(merges)

    def drop_mentions(self, tenant_id: str, memory_ids: Sequence[str]) -> int:
        """Records whose content is gone mention nothing: their MENTIONS edges go, and so
        does every entity they mentioned that no record mentions any more (as in
        PostgreSQL). Returns the number of entity nodes removed."""
        if not tenant_id:
            raise ValueError("tenant_id is required")
        ids = [str(i) for i in dict.fromkeys(memory_ids)]
        total = 0
        with self._driver.session(database=self.database) as session:
            for chunk in _chunks(ids, self.batch_size):
                total += session.execute_write(_drop_mentions, tenant_id, list(chunk))
        return total

    def forget(self, tenant_id: str, memory_ids: Sequence[str]) -> int:
        """Erasure: keep tenant_id, memory_id, content_hash and every edge; set
        consolidation_state 'tombstoned'; remove every other property. Returns the number
        of nodes tombstoned (a memory not projected yet becomes a bare tombstone)."""
        if not tenant_id:
            raise ValueError("tenant_id is required")
        ids = list(dict.fromkeys(memory_ids))
        if not all(isinstance(i, str) and i for i in ids):
            raise ValueError("memory_ids must be non-empty strings")
        total = 0
        with self._driver.session(database=self.database) as session:
            for chunk in _chunks(ids, self.batch_size):
                total += session.execute_write(
                    _single_int, _FORGET, tenant_id=tenant_id, memory_ids=list(chunk)
                )
        return total

    def wipe(self, tenant_id: str | None = None) -> int:
        """Delete the projection (every :Memory, :Agent and :Entity node and their edges; with
        tenant_id, only that tenant's) in batches of DETACH DELETE. Returns nodes deleted.
        Other labels in the database are left alone."""
        if tenant_id is None:
            statements = (_WIPE_MEMORIES, _WIPE_AGENTS, _WIPE_ENTITIES, _WIPE_STEPS)
            params: dict[str, Any] = {}
        else:
            statements = (
                _WIPE_TENANT_MEMORIES,
                _WIPE_TENANT_AGENTS,
                _WIPE_TENANT_ENTITIES,
                _WIPE_TENANT_STEPS,
            )
            params = {"tenant_id": tenant_id}
        total = 0
        with self._driver.session(database=self.database) as session:
            for statement in statements:
                while True:
                    n = session.execute_write(_single_int, statement, limit=WIPE_BATCH, **params)
                    total += n
                    if n == 0:
                        break
        return total

    # -- reads -----------------------------------------------------------------------------

    def count_memories(self, tenant_id: str | None = None) -> int:
        """(:Memory) nodes, of one tenant or all (bare parent nodes and tombstones count)."""
        with self._driver.session(database=self.database) as session:
            if tenant_id is None:
                return session.execute_read(_single_int, _COUNT_ALL)
            return session.execute_read(_single_int, _COUNT_TENANT, tenant_id=tenant_id)

    def export(self, tenant_id: str) -> GraphExport:
        """The tenant's nodes and edges in canonical order (see GraphExport)."""

        def read(tx: ManagedTransaction) -> GraphExport:
            nodes: list[tuple[str, str, dict[str, Any]]] = []
            for label, query in (
                ("Agent", _EXPORT_AGENTS),
                ("Entity", _EXPORT_ENTITIES),
                ("Memory", _EXPORT_MEMORIES),
                ("Step", _EXPORT_STEPS),
            ):
                for record in tx.run(query, tenant_id=tenant_id):
                    props = dict(sorted(dict(record["props"]).items()))
                    nodes.append((label, _key(tenant_id, record["id"]), props))
            edges: list[tuple[str, str, str]] = []
            for rel_type, query in _EXPORT_EDGES:
                for record in tx.run(query, tenant_id=tenant_id):
                    edges.append(
                        (rel_type, _key(tenant_id, record["src"]), _key(tenant_id, record["dst"]))
                    )
            nodes.sort(key=lambda node: (node[0], node[1]))
            edges.sort()
            return GraphExport(nodes=nodes, edges=edges)

        with self._driver.session(database=self.database) as session:
            return session.execute_read(read)

    def walk(
        self,
        tenant_id: str,
        seeds: Sequence[str],
        hops: int,
        scope_keys: Sequence[str],
        tiers: Sequence[str],
        limit: int = 1000,
        via: Sequence[str] = ("MENTIONS",),
    ) -> list[tuple[str, float]]:
        """Graph recall's candidates: from the seed entities to the records that mention
        them (live, in `scope_keys` and `tiers`), then `hops` - 1 more hops along the edge
        kinds of `via` (MENTIONS: the records mentioning the entities those mention;
        DERIVED_FROM, SUPERSEDES: the records linked either way; INFLUENCED: the other
        outcomes of their agents), inside the tenant; at most `limit` (memory_id, score)
        pairs, best first (`rank_walk`). Only records the caller may read are walked
        through; the database re-checks every candidate."""
        if isinstance(hops, bool) or not isinstance(hops, int) or not 1 <= hops <= 3:
            raise ValueError("hops must be 1, 2 or 3")
        kinds = set(via)
        if not kinds or not kinds <= set(WALK_KINDS):
            raise ValueError(f"via must name edge kinds of {', '.join(WALK_KINDS)}")
        scope: dict[str, Any] = {
            "scope_keys": list(scope_keys),
            "tiers": list(tiers),
            "live": list(LIVE_STATES),
        }

        scope_size: list[int] = []  # counted once, when a hop first asks

        def from_scope(tx: ManagedTransaction, entity_ids: list[str]) -> bool:
            """Is reading the scope's records cheaper than the entities' edges? Asked only
            when the edges are many (SCOPE_WALK_EDGES): the scope is counted then, once."""
            edges = sum(
                int(r["n"]) for r in tx.run(_DEGREE, tenant_id=tenant_id, entity_ids=entity_ids)
            )
            if edges < SCOPE_WALK_EDGES:
                return False
            if not scope_size:
                scope_size.append(
                    _single_int(
                        tx, _SCOPE_SIZE, tenant_id=tenant_id, scope_keys=scope["scope_keys"]
                    )
                )
            return scope_size[0] * SCOPE_READ_COST < edges

        def mentioning(
            tx: ManagedTransaction, entity_ids: list[str], choose: bool = True
        ) -> list[tuple[str, str]]:
            """The pairs of a hop; from the scope's end when `choose` finds it cheaper (not
            for the seeds: the query's own few entities, read from their edges at once)."""
            if not entity_ids:
                return []
            scoped = choose and from_scope(tx, entity_ids)
            query = _WALK_SCOPE_MENTIONING if scoped else _WALK_MENTIONING
            return [
                (str(r["entity_id"]), str(r["memory_id"]))
                for r in tx.run(
                    query,
                    tenant_id=tenant_id,
                    entity_ids=entity_ids,
                    limit=WALK_PAIRS,
                    **scope,
                )
            ]

        def read(tx: ManagedTransaction) -> list[tuple[str, float]]:
            seen = set(seeds)
            reached: set[str] = set()
            levels: list[list[tuple[str, str]]] = []
            pairs = sorted(mentioning(tx, sorted(seen), choose=False))
            for level in range(1, hops + 1):
                levels.append(pairs)
                new = sorted({m for _, m in pairs} - reached)
                reached.update(new)
                if level == hops or not new:
                    break
                pairs = []
                if "MENTIONS" in kinds:
                    found = {
                        str(r["entity_id"])
                        for r in tx.run(_WALK_MENTIONED, tenant_id=tenant_id, memory_ids=new)
                    }
                    frontier = sorted(found - seen)
                    seen.update(frontier)
                    pairs.extend(mentioning(tx, frontier))
                for kind in sorted(kinds - {"MENTIONS"}):
                    pairs.extend(
                        (f"{kind}:{r['via_id']}", str(r["memory_id"]))
                        for r in tx.run(
                            _WALK_EDGES[kind],
                            tenant_id=tenant_id,
                            memory_ids=new,
                            limit=WALK_PAIRS,
                            **scope,
                        )
                    )
                pairs = sorted(set(pairs))
            return rank_walk(levels)[:limit]

        with self._driver.session(database=self.database) as session:
            return session.execute_read(read)

    def lineage(self, tenant_id: str, memory_id: str, depth: int) -> list[str]:
        """Ancestors of a memory through DERIVED_FROM, up to `depth` hops, inside the
        tenant: nearest first, then by memory id; each ancestor once (at its shortest
        distance); the memory itself is never listed."""
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError("depth must be a non-negative integer")

        def read(tx: ManagedTransaction) -> list[str]:
            seen = {memory_id}
            frontier = [memory_id]
            found: list[str] = []
            for _ in range(depth):
                if not frontier:
                    break
                result = tx.run(_PARENTS, tenant_id=tenant_id, ids=frontier)
                level = sorted({str(r["id"]) for r in result} - seen)
                seen.update(level)
                found.extend(level)
                frontier = level
            return found

        with self._driver.session(database=self.database) as session:
            return session.execute_read(read)


#: The states a graph walk passes through (live records; the database re-checks).
LIVE_STATES: Final = ("raw", "consolidated", "reflected")
#: Pairs (entity, record) read per hop at most.
WALK_PAIRS: Final = 5_000
#: A walk's hop reads the caller's scope instead of the entities' MENTIONS edges when the
#: scope holds fewer records than the edges over this: a record read from the scope (with
#: its MENTIONS and their entities' ids) costs about as much as this many edges followed
#: from an entity (measured on ArcadeDB 26.10, `make bench-graph`). Either way gives the
#: same pairs; only the cost differs.
SCOPE_READ_COST: Final = 15
#: ... and only when the entities have at least this many MENTIONS edges (fewer are read
#: faster than the scope is counted).
SCOPE_WALK_EDGES: Final = 5_000


def rank_walk(levels: Sequence[Sequence[tuple[str, str]]]) -> list[tuple[str, float]]:
    """Graph recall's order, from the (entity, record) pairs found at each hop: a record
    counts at the first hop that reaches it; nearer hops first; within a hop, records linked
    by more and rarer entities first (each link weighs 1 / (1 + ln d), d the number of
    records the entity reached on that hop), then by memory id. Scores fall from the number
    of records to 1, so a larger score is a better candidate."""
    import math

    found: dict[str, tuple[int, float]] = {}
    for level, pairs in enumerate(levels, start=1):
        degree: dict[str, int] = {}
        for entity, _ in pairs:
            degree[entity] = degree.get(entity, 0) + 1
        weight: dict[str, float] = {}
        for entity, memory in pairs:
            if memory in found:
                continue
            weight[memory] = weight.get(memory, 0.0) + 1.0 / (1.0 + math.log(degree[entity]))
        for memory, w in weight.items():
            found[memory] = (level, w)
    ranked = sorted(found, key=lambda m: (found[m][0], -found[m][1], m))
    return [(m, float(len(ranked) - i)) for i, m in enumerate(ranked)]


def graph_from_env() -> GraphStore:
    """NEO4J_URI / NEO4J_USER / NEO4J_PASSWORD / NEO4J_DATABASE.

    Without NEO4J_URI: the local ArcadeDB of scripts/graph.sh (bolt://127.0.0.1:57687 or
    GRAPH_BOLT_PORT, user root, password GRAPH_PASSWORD or memfabric-graph, database
    `graph`). With NEO4J_URI (a real Neo4j 5): user `neo4j` and database `neo4j` unless
    named, and NEO4J_PASSWORD is required.
    """
    from memfabric.errors import Misconfigured
    from memfabric.settings import Settings

    s = Settings.from_env()
    if s.neo4j_uri:
        if s.neo4j_password is None:
            raise Misconfigured(
                "NEO4J_URI is set but NEO4J_PASSWORD is not",
                hint="set NEO4J_PASSWORD (and NEO4J_USER unless it is neo4j)",
            )
        return GraphStore(
            s.neo4j_uri,
            s.neo4j_user or NEO4J_DEFAULT_USER,
            s.neo4j_password,
            s.neo4j_database or NEO4J_DEFAULT_DATABASE,
        )
    return GraphStore(
        s.graph_uri,
        s.neo4j_user or LOCAL_USER,
        s.neo4j_password or s.graph_password or LOCAL_PASSWORD,
        s.neo4j_database or LOCAL_DATABASE,
    )
