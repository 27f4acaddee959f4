"""The SDK's envelope speaks the database's propose schema: `fabric_api.request_schema`
is the one source, and the typed builder can neither send what the schema refuses nor miss
what it offers."""

from __future__ import annotations

from typing import Any, get_args

import jsonschema
import pytest
from psycopg.types.json import Jsonb

from conftest import Fabric
from memfabric.envelope import Envelope, FormationMethod, RetentionClass, Tier, Visibility, episode

pytestmark = pytest.mark.rollback

# What the caller may send but the builder leaves out on purpose, and why.
NOT_BUILT = {
    "content_hash": "the database computes it; a client hash is only checked",
}


def propose_schema(fabric: Fabric) -> dict[str, Any]:
    row = (
        fabric.session("mf_agent_a")
        .execute("SELECT fabric_api.request_schema('propose')")
        .fetchone()
    )
    assert row is not None
    return dict(row[0])


def paths(value: Any, prefix: str = "") -> set[str]:
    """Dotted key paths of a JSON object, one level into nested objects."""
    found = set()
    for key, inner in value.items():
        found.add(prefix + key)
        if isinstance(inner, dict) and not prefix and key != "content":
            found |= paths(inner, key + ".")
    return found


def offered(schema: dict[str, Any]) -> set[str]:
    found = set()
    for key, inner in schema["properties"].items():
        found.add(key)
        if key != "content" and isinstance(inner, dict) and "properties" in inner:
            found |= {f"{key}.{k}" for k in inner["properties"]}
    return found


def enum_of(schema: dict[str, Any], *path: str) -> set[str]:
    node: Any = schema
    for key in path:
        node = node["properties"][key]
    values = node.get("enum")
    if values is None:  # anyOf / oneOf of an enum and null
        values = [v for alt in node.get("anyOf", []) for v in alt.get("enum", [])]
    return {v for v in values if v is not None}


FULL = Envelope(
    tier="semantic",
    tenant_id="acme",
    visibility="subject",
    content={"assertion": "billing entity is Acme Logistics BV", "key": "billing-entity"},
    source_event_id="evt-schema-1",
    formation_method="extraction",
    confidence=0.9,
    subject_id="user-8842",
    session_id="sess-1f9c",
    agent_id="com-agt-003",
    correlation_id="corr-1",
    causation_id="evt-schema-0",
    derived_from=["3f0c2a1e-5b8d-4c3e-9a7f-1d2e3f4a5b6c"],
    supersedes="4f0c2a1e-5b8d-4c3e-9a7f-1d2e3f4a5b6c",
    valid_from="2026-07-02T09:14:00Z",
    valid_until="2027-07-02T09:14:00Z",
    retention_class="operational",
    compliance_labels=["pii"],
    version="1.2.0",
    business_instance_id="eu-billing",
)


def test_what_the_builder_sends_is_valid_per_the_schema(fabric: Fabric) -> None:
    validator = jsonschema.Draft202012Validator(propose_schema(fabric))
    minimal = episode({"text": "asked for invoices in EUR"}, tenant_id="acme",
                      source_event_id="evt-schema-2", confidence=0.8)  # fmt: skip
    for envelope in (minimal, FULL):
        validator.validate(envelope.to_json())


def test_the_builder_can_send_everything_the_schema_offers(fabric: Fabric) -> None:
    schema = propose_schema(fabric)
    missing = offered(schema) - paths(FULL.to_json()) - NOT_BUILT.keys()
    assert missing == set(), f"the propose schema offers {sorted(missing)}; Envelope cannot send it"
    assert paths(FULL.to_json()) <= offered(schema)


def test_the_builders_types_are_the_schemas_enumerations(fabric: Fabric) -> None:
    schema = propose_schema(fabric)
    assert set(get_args(Tier)) == enum_of(schema, "tier")
    assert set(get_args(Visibility)) == enum_of(schema, "scope", "visibility")
    assert set(get_args(FormationMethod)) == enum_of(schema, "provenance", "formation_method")
    assert set(get_args(RetentionClass)) == enum_of(schema, "retention_class")


def test_the_full_envelope_is_accepted_by_the_database_too(fabric: Fabric) -> None:
    """The schema is not the last word: the validator is. A valid-per-schema envelope that
    the database refuses would mean the two drifted (checked in depth by
    tests/sql/test_request_schema.py); here the builder's own output is tried for real."""
    run = fabric.open_run()
    ep = fabric.propose("mf_agent_a", episode({"text": "invoice to Acme Logistics BV"},
                        tenant_id="acme", source_event_id="evt-schema-3",
                        confidence=0.9).to_json(), run)  # fmt: skip
    record = fabric.commit(ep["proposal_id"])
    body = FULL.to_json()
    body["derived_from"] = [record["memory_id"]]
    del body["supersedes"], body["business_instance_id"]
    answer = (
        fabric.session("mf_agent_a")
        .execute("SELECT fabric_api.propose(%s, %s)", (Jsonb(body), run))
        .fetchone()
    )
    assert answer is not None and answer[0]["status"] == "validated", answer
