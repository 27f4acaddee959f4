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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from conftest import Fabric, episode

MALFORMED = {"22023", "22007", "22003"}
UUID = str(uuid.UUID(int=7))

idents = st.one_of(
    st.sampled_from(
        [
            "evt-1",
            "corr:9/x",
            "a" * 200,
            "a" * 201,
            "",
            "has space",
            "zero\u200bwidth",
            "tab\tx",
            "bidi\u202e",
            "ünï",
        ]
    ),
    st.text(alphabet="abXY09-_:. ", max_size=4),
    st.sampled_from([None, 1, True, [], {}]),
)
uuids = st.sampled_from([UUID, UUID.upper(), "not-a-uuid", "", 7, None])
timestamps = st.one_of(
    st.sampled_from(
        [
            "2026-08-16T10:00:00Z",
            "2026-08-16 10:00:00.123456+02:00",
            "1999-12-31T23:59:59-05:30",
            "9998-06-01t00:00:00z",
            "2026-08-16T24:00:00Z",
            "2026-08-16T10:60:00Z",
            "2026-08-16T10:00:60Z",
            "2026-08-16T10:00:00",
            "now",
            "infinity",
            "1800-01-01T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "",
            None,
            5,
        ]
    ),
    st.builds(
        "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}Z".format,
        st.integers(1901, 9998),
        st.integers(1, 12),
        st.integers(1, 28),
        st.integers(0, 25),
        st.integers(0, 59),
        st.integers(0, 61),
    ),
)
visibilities = st.one_of(
    st.sampled_from(["session", "agent", "subject", "tenant", "global", None, 1]),
    st.lists(st.sampled_from(["subject", "tenant", "global", 1]), max_size=3),
)
scopes = st.one_of(
    st.dictionaries(
        st.sampled_from(["tenant_id", "subject_id", "session_id", "agent_id", "bogus"]),
        st.sampled_from(["acme", "globex", "user-8842", None, 1, ["acme"]]),
        max_size=3,
    ).flatmap(
        lambda d: st.fixed_dictionaries(
            d and {k: st.just(v) for k, v in d.items()}, optional={"visibility": visibilities}
        )
    ),
    st.sampled_from([None, "acme", []]),
)
queries = st.one_of(
    st.text(alphabet="ab \t\n\x01\x7f", max_size=4),
    st.sampled_from(["invoices in EUR", "x" * 1000, "x" * 1001, None, 1, ["q"]]),
)
filters = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "min_confidence": st.sampled_from(
                [0, 0.0, 0.5, 1, 1.5, -0.1, 1e-301, 1e-300, "0.5", None, True]
            ),
            "valid_at": timestamps,
            "compliance_labels_excluded": st.sampled_from([[], ["pii"], [1], "pii", None]),
            "memory_ids": st.sampled_from(
                [[], [UUID], [UUID] * 100, [UUID] * 101, ["x"], None, UUID]
            ),
            "bogus": st.just(1),
        },
    ),
    st.sampled_from([None, [], "x"]),
)
candidates = st.one_of(
    st.lists(
        st.sampled_from(
            [
                {"memory_id": UUID, "score": 0.5},
                {"memory_id": UUID},
                {"memory_id": "x", "score": 1},
                {"memory_id": UUID, "score": "1"},
                {"memory_id": UUID, "score": 1e301},
                "x",
            ]
        ),
        max_size=2,
    ),
    st.sampled_from([None, "x", {}]),
)
traceparents = st.sampled_from(
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "x",
        None,
        1,
    ]
)
recall_requests = st.fixed_dictionaries(
    {},
    optional={
        "run_id": st.just("RUN"),  # replaced by the open run (or dropped / broken below)
        "correlation_id": idents,
        "causation_id": idents,
        "requesting_agent": st.sampled_from(["com-agt-003", 1, None]),
        "tiers": st.one_of(
            st.lists(st.sampled_from(["episodic", "semantic", "working", 1]), max_size=3),
            st.sampled_from(["episodic", None]),
        ),
        "scope": scopes,
        "query": queries,
        "filters": filters,
        "limit": st.sampled_from([1, 5, 5.0, 100, 101, 0, -1, 2.5, 2**31, "5", None, True]),
        "allow_partial": st.sampled_from([True, False, None, "yes"]),
        "candidates": candidates,
        "mode": st.sampled_from(["text", "semantic", "hybrid", None, "fuzzy", 1]),
        "traceparent": traceparents,
        "bogus": st.just(1),
    },
)


def refusal(conn: psycopg.Connection[Any], call: str, *args: Any) -> str | None:
    """The SQLSTATE the call is refused with, or None if it answers."""
    try:
        conn.execute(call, args)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def schema(fabric: Fabric, name: str) -> dict[str, Any]:
    row = (
        fabric.connect("mf_agent_a")
        .execute("SELECT fabric_api.request_schema(%s)", (name,))
        .fetchone()
    )
    assert row is not None
    jsonschema.Draft202012Validator.check_schema(row[0])
    return row[0]  # type: ignore[no-any-return]


def test_the_recall_schema_and_validator_agree(fabric: Fabric) -> None:
    validator = jsonschema.Draft202012Validator(schema(fabric, "recall"))
    run = str(fabric.open_run(tools=["tool:memory-recall"]))
    conn = fabric.connect("mf_agent_a")

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
    @given(request=recall_requests, run_id=st.sampled_from([run, run.upper(), "x", 1]))
    def agree(request: dict[str, Any], run_id: Any) -> None:
        if "run_id" in request:
            request["run_id"] = run_id
        valid = validator.is_valid(request)
        state = refusal(conn, "SELECT fabric_api.recall(%s)", Jsonb(request))
        assert valid == (state not in MALFORMED), (
            request,
            state,
            [e.message for e in validator.iter_errors(request)],
        )

    agree()


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
