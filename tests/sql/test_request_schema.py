"""fabric_api.request_schema publishes the JSON Schema of a request next to its plpgsql
validator; the MCP server and the docs read it. The property: on generated requests, a
request is valid per the published schema exactly when the validator does not refuse it as
malformed (22023, 22007, 22003). Other refusals (a foreign scope, a denied tool) are not
about form and do not count.

The schema leaves two things to the database, so the generators stay clear of them: whether
a calendar date exists (2026-02-30) and Unicode normalization (NFC) of identifiers.
"""

from __future__ import annotations

import uuid
from typing import Any

import jsonschema
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from conftest import Fabric, episode

pytestmark = pytest.mark.rollback

MALFORMED = {"22023", "22007", "22003"}
UUID = str(uuid.UUID(int=7))
UUID_UPPER = str(uuid.UUID(int=2**128 - 7)).upper()
Values = dict[str, st.SearchStrategy[Any]]


def timestamp(hours: tuple[int, int], seconds: tuple[int, int]) -> st.SearchStrategy[str]:
    return st.builds(
        "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}{}".format,
        st.integers(1901, 9998),
        st.integers(1, 12),
        st.integers(1, 28),
        st.integers(*hours),
        st.integers(0, 59),
        st.integers(*seconds),
        st.sampled_from(["Z", "z", "+02:00", "-05:30", ".5Z", ".123456789+00:00"]),
    )


GOOD_TIME = st.one_of(
    timestamp((0, 23), (0, 59)),
    st.sampled_from(["2026-08-16 10:00:00.123456+02:00", "9998-06-01t00:00:00z", None]),
)
BAD_TIME = st.one_of(
    timestamp((24, 25), (0, 59)),
    timestamp((0, 23), (60, 61)),
    st.sampled_from(
        [
            "2026-08-16T10:00:00",
            "now",
            "infinity",
            "1800-01-01T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-08-16T10:60:00Z",
            "",
            5,
        ]
    ),
)
GOOD_IDENT = st.one_of(
    st.sampled_from(["evt-1", "corr:9/x", "a" * 200, "ünï", None]),
    st.text(alphabet="abXY09-_:.", min_size=1, max_size=4),
)
BAD_IDENT = st.sampled_from(
    ["a" * 201, "", "has space", "zero\u200bwidth", "tab\tx", "bidi\u202e", 1, True, [], {}]
)


@st.composite
def requests(draw: st.DrawFn, good: Values, bad: Values, required: dict[str, Any]) -> Any:
    """Mostly well-formed requests: the required keys, some optional keys with good values,
    then none, one or two keys given a bad value (or a required key dropped)."""
    request = {k: draw(v) for k, v in required.items()}
    for key in draw(st.sets(st.sampled_from(sorted(good)), max_size=5)):
        request[key] = draw(good[key])
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from([*sorted(bad), "<drop>"]))
        if key == "<drop>":
            request.pop(draw(st.sampled_from(sorted(required))), None)
        else:
            request[key] = draw(bad[key])
    return request


VISIBILITY = ["session", "agent", "subject", "tenant"]
RECALL_GOOD: Values = {
    "correlation_id": GOOD_IDENT,
    "causation_id": GOOD_IDENT,
    "requesting_agent": st.just("com-agt-003"),
    "tiers": st.lists(st.sampled_from(["episodic", "semantic", "profile", "relational"])),
    "scope": st.fixed_dictionaries(
        {},
        optional={
            "tenant_id": st.sampled_from(["acme", None]),
            "subject_id": st.sampled_from(["user-8842", None]),
            "session_id": st.sampled_from(["sess-1f9c", None]),
            "agent_id": st.sampled_from(["com-agt-003", None]),
            "visibility": st.one_of(
                st.sampled_from([*VISIBILITY, None]),
                st.lists(st.sampled_from(VISIBILITY), max_size=2),
            ),
        },
    ),
    "query": st.one_of(
        st.text(alphabet="ab \t\n\x01\x7f", max_size=4),
        st.sampled_from(["invoices in EUR", "x" * 1000, None]),
    ),
    "filters": st.fixed_dictionaries(
        {},
        optional={
            "min_confidence": st.sampled_from([0, 0.0, 0.5, 1, 1e-300]),
            "valid_at": GOOD_TIME,
            "compliance_labels_excluded": st.sampled_from([[], ["pii"]]),
            "memory_ids": st.sampled_from([[UUID], [UUID.upper()] * 100]),
        },
    ),
    "limit": st.sampled_from([1, 5, 5.0, 100]),
    "allow_partial": st.booleans(),
    "candidates": st.sampled_from(
        [[], [{"memory_id": UUID, "score": -0.5}], [{"memory_id": UUID_UPPER, "score": 1}]]
    ),
    "mode": st.sampled_from(["text", "semantic", "hybrid", "graph", None]),
    "traceparent": st.sampled_from(
        ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None]
    ),
    "expand": st.sampled_from([{"hops": 1}, {"hops": 2.0}, {"hops": 3}]),
    "neighbours": st.sampled_from(
        [{}, {"turns": 1}, {"turns": 3.0, "of": 10}, {"of": 1}, {"turns": 2, "of": 5.0}]
    ),
    "graph_candidates": st.sampled_from([[], [{"memory_id": UUID, "score": 2}]]),
}
RECALL_BAD: Values = {
    "run_id": st.sampled_from(["x", 1, None]),
    "correlation_id": BAD_IDENT,
    "causation_id": BAD_IDENT,
    "requesting_agent": st.sampled_from([1, None]),
    "tiers": st.sampled_from([["working"], [1], "episodic", None]),
    "scope": st.sampled_from(
        [
            {"bogus": 1},
            {"tenant_id": 1},
            {"visibility": "global"},
            {"visibility": ["global"]},
            {"visibility": 1},
            {"visibility": [None]},
            None,
            "acme",
            [],
        ]
    ),
    "query": st.sampled_from(["x" * 1001, 1, ["q"]]),
    "filters": st.one_of(
        st.sampled_from(
            [
                {"bogus": 1},
                {"min_confidence": 1.5},
                {"min_confidence": -0.1},
                {"min_confidence": 1e-301},
                {"min_confidence": "0.5"},
                {"min_confidence": None},
                {"compliance_labels_excluded": [1]},
                {"compliance_labels_excluded": None},
                {"memory_ids": []},
                {"memory_ids": [UUID] * 101},
                {"memory_ids": ["x"]},
                {"memory_ids": None},
                None,
                [],
                "x",
            ]
        ),
        st.builds(lambda t: {"valid_at": t}, BAD_TIME),
    ),
    "limit": st.sampled_from([101, 0, -1, 2.5, 2**31, "5", None, True]),
    "allow_partial": st.sampled_from([None, "yes"]),
    "candidates": st.sampled_from(
        [
            [{"memory_id": UUID}],
            [{"memory_id": "x", "score": 1}],
            # near-uuids: the validator checks the canonical form without a regex
            [{"memory_id": "{" + UUID + "}", "score": 1}],
            [{"memory_id": UUID.replace("-", ""), "score": 1}],
            [{"memory_id": "0000-0000-0000-0000-0000000000000007", "score": 1}],
            [{"memory_id": UUID[:-1] + "g", "score": 1}],
            [{"memory_id": UUID + " ", "score": 1}],
            [{"memory_id": UUID, "score": "1"}],
            [{"memory_id": UUID, "score": 1e301}],
            ["x"],
            [UUID] * 1001,
            None,
            "x",
            {},
        ]
    ),
    "mode": st.sampled_from(["fuzzy", 1]),
    "expand": st.sampled_from([{}, {"hops": 0}, {"hops": 4}, {"hops": "2"}, {"via": []}, [], None]),
    "neighbours": st.sampled_from(
        [
            {"turns": 0},
            {"turns": 4},
            {"turns": "1"},
            {"turns": None},
            {"of": 0},
            {"of": 11},
            {"of": 2.5},
            {"of": "3"},
            {"hops": 1},
            [],
            None,
        ]
    ),
    "graph_candidates": st.sampled_from([[{"memory_id": "x", "score": 1}], {}, None]),
    "traceparent": st.sampled_from(
        [
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "x",
            1,
        ]
    ),
    "bogus": st.just(1),
}


def refusal(conn: psycopg.Connection[Any], call: str, *args: Any) -> str | None:
    """The SQLSTATE the call is refused with, or None if it answers."""
    try:
        conn.execute(call, args)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def schema(fabric: Fabric, name: str) -> dict[str, Any]:
    row = (
        fabric.session("mf_agent_a")
        .execute("SELECT fabric_api.request_schema(%s)", (name,))
        .fetchone()
    )
    assert row is not None
    jsonschema.Draft202012Validator.check_schema(row[0])
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.slow
def test_the_recall_schema_and_validator_agree(fabric: Fabric) -> None:
    validator = jsonschema.Draft202012Validator(schema(fabric, "recall"))
    run = str(fabric.open_run(tools=["tool:memory-recall"]))
    conn = fabric.connect("mf_agent_a")

    strategy = requests(RECALL_GOOD, RECALL_BAD, {"run_id": st.sampled_from([run, run.upper()])})
    seen = {True: 0, False: 0}

    # (800: the options that need a query with words, expand and neighbours, leave fewer
    # well-formed requests than before; both sides stay above 100)
    @settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
    @given(request=strategy)
    def agree(request: dict[str, Any]) -> None:
        valid = validator.is_valid(request)
        state = refusal(conn, "SELECT fabric_api.recall(%s)", Jsonb(request))
        assert valid == (state not in MALFORMED), (
            request,
            state,
            [e.message for e in validator.iter_errors(request)],
        )

        seen[valid] += 1

    agree()
    assert min(seen.values()) > 100, seen  # both sides are exercised


def test_an_unknown_schema_name_is_refused(fabric: Fabric) -> None:
    conn = fabric.connect("mf_agent_a")
    assert refusal(conn, "SELECT fabric_api.request_schema('commit')") == "22023"


def test_only_api_callers_read_schemas(fabric: Fabric) -> None:
    assert (
        refusal(fabric.connect("mf_stranger"), "SELECT fabric_api.request_schema('recall')")
        == "42501"
    )


def test_the_recall_schema_carries_the_deployments_limit(fabric: Fabric) -> None:
    assert schema(fabric, "recall")["properties"]["limit"]["maximum"] == 100


def test_the_minimal_envelope_is_valid_per_the_propose_schema(fabric: Fabric) -> None:
    validator = jsonschema.Draft202012Validator(schema(fabric, "propose"))
    envelope = episode("asked for invoices in EUR")
    assert validator.is_valid(envelope), list(validator.iter_errors(envelope))
    assert not validator.is_valid({**envelope, "memory_id": UUID})


# The envelope generator leaves out what the propose schema cannot say or says more
# strictly: a well-formed content_hash that does not match, numbers that are not exactly
# doubles, oversized or deep content, version components above 2147483647, a configured
# business instance, and confidence outside [0, 1] (the schema bounds it; the database
# answers a rejected proposal, which is governance, not form).
SCOPE = {"tenant_id": "acme", "visibility": "subject"}
PROPOSE_REQUIRED: dict[str, Any] = {
    "tier": st.sampled_from(["episodic", "semantic", "procedural", "profile", "relational"]),
    "scope": st.fixed_dictionaries(
        {
            "tenant_id": st.sampled_from(["acme", "globex"]),
            "visibility": st.sampled_from(VISIBILITY),
        },
        optional={
            "subject_id": st.sampled_from(["user-8842", "user-1", None]),
            "session_id": st.sampled_from(["sess-1f9c", None]),
            "agent_id": st.sampled_from(["com-agt-003", None]),
        },
    ),
    "content": st.dictionaries(
        st.sampled_from(["text", "assertion", "n"]),
        # jsonb cannot hold U+0000 (22P05) and a str with a lone surrogate is no UTF-8 at
        # all (22P02): PostgreSQL refuses both before any validator, and a JSON Schema
        # string cannot say so, so the generator leaves them out.
        st.one_of(
            st.text(
                st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=5,
            ),
            st.integers(-(2**53), 2**53),
            st.booleans(),
            st.none(),
        ),
        max_size=2,
    ),
    "provenance": st.fixed_dictionaries(
        {
            "formation_method": st.sampled_from(
                ["extraction", "declaration", "consolidation", "reflection", "import"]
            )
        },
        optional={
            "source_event_id": GOOD_IDENT,
            "correlation_id": GOOD_IDENT,
            "causation_id": GOOD_IDENT,
        },
    ),
    "confidence": st.sampled_from([0, 0.5, 1, 1.0]),
}
PROPOSE_GOOD: Values = {
    "content_hash": st.none(),
    "derived_from": st.sampled_from([None, [], [UUID]]),
    "validity_interval": st.fixed_dictionaries(
        {}, optional={"valid_from": GOOD_TIME, "valid_until": GOOD_TIME}
    ),
    "retention_class": st.sampled_from(["durable", "ephemeral", "operational", None]),
    "compliance_labels": st.sampled_from([None, [], ["pii"], ["x"] * 64]),
    "version": st.sampled_from(["1.0.0", "2", "x" * 64, None]),
    "supersedes": st.sampled_from([None, UUID]),
    "business_instance_id": st.none(),
}
PROPOSE_BAD: Values = {
    "tier": st.sampled_from(["working", None, 1]),
    "scope": st.sampled_from(
        [
            None,
            "acme",
            {"tenant_id": "acme"},
            {"visibility": "subject"},
            {**SCOPE, "visibility": "global"},
            {**SCOPE, "tenant_id": "a b"},
            {**SCOPE, "bogus": 1},
            {**SCOPE, "tenant_id": 1},
            {**SCOPE, "subject_id": 1},
            {**SCOPE, "tenant_id": None},
        ]
    ),
    "content": st.sampled_from([None, "text", [1]]),
    "content_hash": st.sampled_from(["md5:x", 1]),
    "provenance": st.sampled_from(
        [
            None,
            "evt-1",
            {},
            {"formation_method": "invented"},
            {"formation_method": "extraction", "formed_by": "os-agt-010"},
            {"formation_method": "extraction", "source_event_id": "a b"},
            {"formation_method": "extraction", "correlation_id": 1},
        ]
    ),
    "derived_from": st.sampled_from([["x"], [UUID] * 257, UUID, [1]]),
    "confidence": st.sampled_from(["0.9", None, True]),
    "validity_interval": st.one_of(
        st.sampled_from([None, "2026-08-16T10:00:00Z", {"x": 1}]),
        st.builds(lambda t: {"valid_from": t}, BAD_TIME),
        st.builds(lambda t: {"valid_until": t}, BAD_TIME),
    ),
    "retention_class": st.sampled_from(["forever", 1]),
    "compliance_labels": st.sampled_from([["a b"], [None], ["x"] * 65, "pii"]),
    "version": st.sampled_from(["x" * 65, "", 1]),
    "supersedes": st.sampled_from([1, ["x"]]),
    "business_instance_id": st.sampled_from([1, "a b"]),
    "memory_id": st.just(UUID),
}


@pytest.mark.slow
def test_the_propose_schema_and_validator_agree(fabric: Fabric) -> None:
    validator = jsonschema.Draft202012Validator(schema(fabric, "propose"))
    run = fabric.open_run()
    conn = fabric.connect("mf_agent_a")
    seen = {True: 0, False: 0}

    @settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
    @given(envelope=requests(PROPOSE_GOOD, PROPOSE_BAD, PROPOSE_REQUIRED))
    def agree(envelope: dict[str, Any]) -> None:
        valid = validator.is_valid(envelope)
        state = refusal(conn, "SELECT fabric_api.propose(%s, %s)", Jsonb(envelope), run)
        assert valid == (state not in MALFORMED | {"54000"}), (
            envelope,
            state,
            [e.message for e in validator.iter_errors(envelope)],
        )
        seen[valid] += 1

    agree()
    assert min(seen.values()) > 100, seen
