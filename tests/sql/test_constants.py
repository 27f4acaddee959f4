"""memfabric.constants spells the database's own definitions for the Python layer; each
constant is read back here from the migrated database (CHECK constraints, the predicate of
the live-assertion exclusion, fabric.promotion_edges, the published request schemas and
fabric_api.propose's content limits), so the two cannot drift."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from conftest import Fabric, call, episode
from memfabric import constants as c

pytestmark = pytest.mark.rollback


def constraint(conn: psycopg.Connection[Any], name: str) -> str:
    """A constraint's definition, or a row rule's condition as the one function of its
    table's `*_row_rules` constraint writes it (migration 0025: `WHEN NOT (rule) THEN
    'name'`)."""
    row = conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s", (name,)
    ).fetchone()
    if row is not None:
        return str(row[0])
    source = conn.execute(
        "SELECT string_agg(prosrc, E'\\n') FROM pg_proc WHERE pronamespace = 'fabric'::regnamespace"
        " AND proname IN ('_proposals_row_rules', '_memory_records_row_rules')"
    ).fetchone()
    assert source is not None and source[0] is not None, "no row rules"
    before, found, _ = str(source[0]).partition(f"THEN '{name}'")
    assert found, f"no constraint or row rule {name}"
    return " ".join(before.rsplit("WHEN NOT ", 1)[1].split())


def listed(definition: str) -> tuple[str, ...]:
    """The string literals of a constraint definition, in order."""
    return tuple(re.findall(r"'([^']*)'::text", definition))


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (("memory_records_tier_is_known", "proposals_tier_is_known"), c.TIERS),
        (("memory_records_visibility_is_known", "proposals_visibility_is_known"), c.VISIBILITIES),
        (("memory_records_state_is_known",), c.STATES),
        (
            ("memory_records_formation_method_is_known", "proposals_formation_method_is_known"),
            c.FORMATION_METHODS,
        ),
        (
            ("memory_records_retention_class_is_known", "proposals_retention_class_is_known"),
            c.RETENTION_CLASSES,
        ),
    ],
)
def test_enumerations_match_the_check_constraints(
    fabric: Fabric, names: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    conn = fabric.su()
    for name in names:
        assert listed(constraint(conn, name)) == expected, name


def test_ranges_and_derived_sets_match_the_database(fabric: Fabric) -> None:
    conn = fabric.su()
    assert constraint(conn, "memory_records_confidence_in_unit_interval") == (
        f"(confidence >= ({c.CONFIDENCE_MIN:g})::double precision "
        f"AND confidence <= ({c.CONFIDENCE_MAX:g})::double precision)"
    )
    live = constraint(conn, "memory_records_one_live_assertion_per_key")
    states = re.search(r"consolidation_state = ANY \(ARRAY\[([^]]*)\]", live)
    assert states is not None
    assert listed(states.group(1)) == c.LIVE_STATES
    rules = constraint(conn, "proposals_validated_obey_formation_rules")
    methods = re.search(r"formation_method = ANY \(ARRAY\[([^]]*)\]", rules)
    assert methods is not None
    assert listed(methods.group(1)) == c.PROPOSABLE_FORMATION_METHODS
    assert f"recall_max_limit <= {c.RECALL_LIMIT_CEILING}" in constraint(
        conn, "deployment_settings_limits_are_sane"
    )
    edges = conn.execute(
        "SELECT from_tier, to_tier, needs_approval FROM fabric.promotion_edges"
    ).fetchall()
    assert frozenset(edges) == c.PROMOTION_EDGES
    assert set(c.INDEXED_TIERS) < set(c.TIERS)


def test_the_request_schemas_publish_the_same_values(fabric: Fabric) -> None:
    conn = fabric.su()
    propose = call(conn, "fabric_api.request_schema", "propose")["properties"]
    assert tuple(propose["tier"]["enum"]) == c.TIERS
    assert tuple(propose["scope"]["properties"]["visibility"]["enum"]) == c.VISIBILITIES
    assert (
        tuple(propose["provenance"]["properties"]["formation_method"]["enum"])
        == c.FORMATION_METHODS
    )
    assert tuple(propose["retention_class"]["enum"]) == (*c.RETENTION_CLASSES, None)
    assert f"default {c.DEFAULT_RETENTION_CLASS}" in propose["retention_class"]["description"]
    assert (propose["confidence"]["minimum"], propose["confidence"]["maximum"]) == (
        c.CONFIDENCE_MIN,
        c.CONFIDENCE_MAX,
    )
    recall = call(conn, "fabric_api.request_schema", "recall")["properties"]
    assert tuple(recall["tiers"]["items"]["enum"]) == c.TIERS
    assert tuple(recall["scope"]["properties"]["visibility"]["anyOf"][1]["items"]["enum"]) == (
        c.VISIBILITIES
    )
    assert recall["candidates"]["maxItems"] == c.RECALL_MAX_CANDIDATES
    assert recall["filters"]["properties"]["memory_ids"]["maxItems"] == c.RECALL_MAX_MEMORY_IDS
    assert recall["query"]["maxLength"] == c.RECALL_QUERY_MAX_CHARS


def sized(n: int) -> dict[str, str]:
    """Content whose jsonb text is exactly `n` bytes ('{"t": ""}' is 9)."""
    return {"t": "x" * (n - 9)}


def nested(depth: int) -> dict[str, Any]:
    """A string inside `depth` objects: depth `depth` as propose counts it."""
    content: Any = "x"
    for _ in range(depth):
        content = {"a": content}
    return content  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("at_limit", "over_limit"),
    [
        (sized(c.CONTENT_MAX_BYTES), sized(c.CONTENT_MAX_BYTES + 1)),
        (nested(c.CONTENT_MAX_DEPTH), nested(c.CONTENT_MAX_DEPTH + 1)),
    ],
    ids=["bytes", "depth"],
)
def test_the_content_limits_are_the_ones_propose_enforces(
    fabric: Fabric, at_limit: dict[str, Any], over_limit: dict[str, Any]
) -> None:
    run = fabric.open_run()
    assert fabric.propose("mf_agent_a", episode(content=at_limit), run)["status"] == "validated"
    before = fabric.count("proposals")
    with pytest.raises(psycopg.Error) as exc:
        fabric.propose("mf_agent_a", episode(content=over_limit), run)
    assert exc.value.sqlstate == "54000"
    assert fabric.count("proposals") == before
