"""The fabric's domain constants, once: tiers, visibility levels, consolidation states,
formation methods, retention classes, the confidence range, content and recall limits.

The database is their source: the CHECK constraints of `fabric.memory_records` and
`fabric.deployment_settings`, the rows of `fabric.promotion_edges` and the request schemas
`fabric_api.request_schema('recall' | 'propose')` publishes. This module spells them for
the Python layer; tests/sql/test_constants.py reads each back from a migrated database so
the two cannot drift. Change the database first, then this module.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Tier = Literal["episodic", "semantic", "procedural", "profile", "relational"]
Visibility = Literal["session", "agent", "subject", "tenant"]
ConsolidationState = Literal[
    "raw", "consolidated", "reflected", "superseded", "expired", "tombstoned"
]
FormationMethod = Literal["extraction", "declaration", "consolidation", "reflection", "import"]
RetentionClass = Literal["ephemeral", "operational", "durable", "audit", "regulated"]

# memory_records_tier_is_known (and proposals_tier_is_known; the request schemas' enum).
TIERS: Final[tuple[Tier, ...]] = get_args(Tier)
# The tiers with a vector collection: every tier but relational, whose records are edges
# between entities (the graph projection), not text to embed.
INDEXED_TIERS: Final[tuple[Tier, ...]] = tuple(t for t in TIERS if t != "relational")
# memory_records_visibility_is_known, in widening order.
VISIBILITIES: Final[tuple[Visibility, ...]] = get_args(Visibility)
# memory_records_state_is_known.
STATES: Final[tuple[ConsolidationState, ...]] = get_args(ConsolidationState)
# The states a recall serves (memory_records_one_live_assertion_per_key's predicate).
LIVE_STATES: Final[tuple[ConsolidationState, ...]] = ("raw", "consolidated", "reflected")
# memory_records_formation_method_is_known.
FORMATION_METHODS: Final[tuple[FormationMethod, ...]] = get_args(FormationMethod)
# What an agent may propose (proposals_validated_obey_formation_rules); the others are the
# consolidator's.
PROPOSABLE_FORMATION_METHODS: Final[tuple[FormationMethod, ...]] = (
    "extraction",
    "declaration",
    "import",
)
# memory_records_retention_class_is_known; the default is the request schema's.
RETENTION_CLASSES: Final[tuple[RetentionClass, ...]] = get_args(RetentionClass)
DEFAULT_RETENTION_CLASS: Final[RetentionClass] = "durable"

# memory_records_confidence_in_unit_interval: confidence BETWEEN 0 AND 1.
CONFIDENCE_MIN: Final = 0.0
CONFIDENCE_MAX: Final = 1.0

# fabric_api.propose refuses content over this many bytes (as jsonb text) or nested deeper
# (54000, program_limit_exceeded).
CONTENT_MAX_BYTES: Final = 65536
CONTENT_MAX_DEPTH: Final = 32

# deployment_settings_limits_are_sane: recall_max_limit is at most this.
RECALL_LIMIT_CEILING: Final = 1000
# The recall request schema: at most this many vector candidates, memory ids and query
# characters.
RECALL_MAX_CANDIDATES: Final = 1000
RECALL_MAX_MEMORY_IDS: Final = 100
RECALL_QUERY_MAX_CHARS: Final = 1000

# fabric.promotion_edges: (from tier, to tier, needs approval).
PROMOTION_EDGES: Final[frozenset[tuple[Tier, Tier, bool]]] = frozenset(
    {
        ("semantic", "profile", False),
        ("semantic", "procedural", False),
        ("episodic", "relational", True),
        ("semantic", "relational", True),
        ("procedural", "relational", True),
        ("profile", "relational", True),
    }
)


def confidence_in_range(value: float) -> bool:
    """True when `value` is a finite number in [CONFIDENCE_MIN, CONFIDENCE_MAX]."""
    return CONFIDENCE_MIN <= value <= CONFIDENCE_MAX  # NaN compares false; inf is outside
