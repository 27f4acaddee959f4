"""Hostile and malformed envelopes, generated (hypothesis).

Every malformed envelope is an error (a psycopg exception, never a status) and leaves no
row anywhere. SQL text inside values and keys is data: inside content it is stored
verbatim; anywhere else it is just another malformed value.

One database per test function: hypothesis reruns the body, not the fixture, hence the
suppressed function_scoped_fixture health check.
"""

from __future__ import annotations

import copy
import json
import unicodedata
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from conftest import Fabric, episode
from memfabric.hashing import content_hash

pytestmark = pytest.mark.rollback

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)

SQL_FRAGMENTS = [
    "'); DROP TABLE fabric.events; --",
    "x'); DELETE FROM fabric.memory_records; --",
    "' OR '1'='1",
    "1; TRUNCATE fabric.proposals CASCADE",
    "$$; SELECT pg_sleep(10); $$",
    "\\'; UPDATE fabric.agents SET tools_allowed = '{tool:audit-lineage}'; --",
    "Robert'); DROP TABLE students; --",
    "acme' UNION SELECT content FROM fabric.memory_records --",
    "*/ SELECT set_config('fabric.tenant_id', 'globex', false); /*",
    "\"; COPY fabric.events TO PROGRAM 'id'; --",
]

TOP_KEYS = {
    "tier",
    "scope",
    "content",
    "content_hash",
    "provenance",
    "derived_from",
    "confidence",
    "validity_interval",
    "retention_class",
    "compliance_labels",
    "version",
    "supersedes",
    "business_instance_id",
}
SCOPE_KEYS = {"tenant_id", "subject_id", "agent_id", "session_id", "visibility"}
PROVENANCE_KEYS = {"source_event_id", "correlation_id", "causation_id", "formation_method"}
VALIDITY_KEYS = {"valid_from", "valid_until"}
TIERS = {"episodic", "semantic", "procedural", "profile", "relational"}
VISIBILITIES = {"session", "agent", "subject", "tenant"}
RETENTIONS = {"ephemeral", "operational", "durable", "audit", "regulated"}
METHODS = {"extraction", "declaration", "consolidation", "reflection", "import"}

# --- strategies ---------------------------------------------------------------------------

no_nul_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
sql_text = st.one_of(
    st.sampled_from(SQL_FRAGMENTS),
    st.builds(lambda a, f, b: a + f + b, no_nul_text, st.sampled_from(SQL_FRAGMENTS), no_nul_text),
)
hostile_text = st.one_of(no_nul_text, sql_text)
# Characters an identifier never holds: controls, separators (every space), format
# characters (bidi overrides and isolates, zero-width, BOM, tags), private use.
NOT_IN_IDENTIFIERS = ("Cc", "Cf", "Co", "Zs", "Zl", "Zp")
not_in_identifiers = st.characters(categories=NOT_IN_IDENTIFIERS, exclude_characters="\x00")
# assigned code points (by this Python's Unicode, which the database's Unicode contains)
assigned = st.characters(exclude_categories=("Cs", "Cn"), exclude_characters="\x00")


def is_identifier(text: str) -> bool:
    """The identifier rule: 1-200 assigned, printable code points, none of the above, NFC."""
    return (
        1 <= len(text) <= 200
        and unicodedata.is_normalized("NFC", text)
        and all(unicodedata.category(c) not in (*NOT_IN_IDENTIFIERS, "Cn", "Cs") for c in text)
    )


# text that is not a valid identifier: empty, with a space, control or format character,
# not in NFC, or too long
bad_ident = st.one_of(
    st.just(""),
    sql_text,
    st.builds(
        lambda a, c, b: a + c + b,
        no_nul_text,
        st.one_of(st.sampled_from([" ", "\t", "\n", "\x7f"]), not_in_identifiers),
        no_nul_text,
    ),
    st.builds(lambda a, b: a + "e\u0301" + b, no_nul_text, no_nul_text),  # NFC is U+00E9
    st.text(alphabet="abc-", min_size=201, max_size=260),
)
safe_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    hostile_text,
)
json_value = st.recursive(
    safe_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(hostile_text, inner, max_size=3)
    ),
    max_leaves=8,
)
non_string = json_value.filter(lambda v: not isinstance(v, str))
non_string_non_null = non_string.filter(lambda v: v is not None)
non_object = json_value.filter(lambda v: not isinstance(v, dict))
non_array_non_null = json_value.filter(lambda v: v is not None and not isinstance(v, list))
non_number = json_value.filter(lambda v: isinstance(v, bool) or not isinstance(v, int | float))


def anything_but(*valid: Any) -> st.SearchStrategy[Any]:
    return json_value.filter(lambda v: v not in valid)


uuid_text = st.uuids().map(str)
bad_derived_item = st.one_of(
    non_string,
    bad_ident,
    # no U+0000 (jsonb cannot hold it) and no lone surrogate (not UTF-8): PostgreSQL refuses
    # those itself, before the fabric's checks this test is about
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(
        lambda s: "\x00" not in s and not _is_uuid(s)
    ),
)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return len(text) == 36


offsetless_timestamp = st.one_of(
    st.datetimes().map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat(sep=" ")),
    st.dates().map(lambda d: d.isoformat()),
    st.times().map(lambda t: t.isoformat()),
    st.sampled_from(
        [
            "now",
            "today",
            "yesterday",
            "tomorrow",
            "infinity",
            "-infinity",
            "epoch",
            "allballs",
            "2026-07-02T09:14:00 UTC",
            "2026-07-02T09:14:00 PST",
        ]
    ),
)

# (path, strategy of values that make the envelope malformed at that path)
MALFORMED_AT: list[tuple[tuple[str, ...], st.SearchStrategy[Any]]] = [
    (("tier",), anything_but(*TIERS)),
    (("scope",), non_object),
    (("content",), non_object),
    (("content_hash",), json_value.filter(lambda v: v is not None)),
    (("provenance",), non_object),
    (("derived_from",), non_array_non_null),
    (("derived_from",), st.lists(st.one_of(bad_derived_item, uuid_text), min_size=1, max_size=4)),
    (("confidence",), non_number),
    (("validity_interval",), non_object),
    (("validity_interval", "valid_from"), st.one_of(non_string_non_null, hostile_text)),
    (("validity_interval", "valid_until"), st.one_of(non_string_non_null, hostile_text)),
    (("retention_class",), anything_but(None, *RETENTIONS)),
    (("compliance_labels",), non_array_non_null),
    (("compliance_labels",), st.lists(st.one_of(non_string, bad_ident), min_size=1, max_size=3)),
    (
        ("version",),
        st.one_of(
            non_string_non_null,
            bad_ident,
            st.text(alphabet="0123456789.", min_size=65, max_size=80),
        ),
    ),
    (("supersedes",), non_string_non_null),
    (("business_instance_id",), st.one_of(non_string_non_null, bad_ident)),
    (("scope", "tenant_id"), anything_but("acme")),
    (("scope", "visibility"), anything_but(*VISIBILITIES)),
    (("scope", "subject_id"), anything_but(None, "user-8842")),
    (("scope", "session_id"), anything_but(None, "sess-1f9c")),
    (("scope", "agent_id"), anything_but(None, "com-agt-003")),
    (("provenance", "formation_method"), anything_but(*METHODS)),
    (("provenance", "source_event_id"), st.one_of(non_string_non_null, bad_ident)),
    (("provenance", "correlation_id"), st.one_of(non_string_non_null, bad_ident)),
    (("provenance", "causation_id"), st.one_of(non_string_non_null, bad_ident)),
]


def set_path(env: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    env = copy.deepcopy(env)
    target = env
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return env


def base_envelope() -> dict[str, Any]:
    env = episode()
    env["scope"]["subject_id"] = "user-8842"
    env["scope"]["session_id"] = "sess-1f9c"
    return env


@st.composite
def malformed_envelopes(draw: st.DrawFn) -> dict[str, Any]:
    path, values = draw(st.sampled_from(MALFORMED_AT))
    return set_path(base_envelope(), path, draw(values))


@st.composite
def envelopes_with_unknown_keys(draw: st.DrawFn) -> dict[str, Any]:
    env = base_envelope()
    where, allowed = draw(
        st.sampled_from(
            [
                ((), TOP_KEYS),
                (("scope",), SCOPE_KEYS),
                (("provenance",), PROVENANCE_KEYS),
                (("validity_interval",), VALIDITY_KEYS),
            ]
        )
    )
    key = draw(hostile_text.filter(lambda k: k not in allowed))
    return set_path(env, (*where, key), draw(json_value))


def nested(depth: int, leaf: Any, kinds: list[bool]) -> Any:
    value = leaf
    for as_list in kinds[:depth]:
        value = [value] if as_list else {"k": value}
    return value


# --- the harness --------------------------------------------------------------------------


class Harness:
    """One database, one run, one connection per identity, and a one-query row count."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.run = fabric.open_run()
        self.agent = fabric.connect("mf_agent_a")
        self.committer = fabric.connect("mf_committer")
        self.su = fabric.su()

    def rows(self) -> tuple[int, ...]:
        row = self.su.execute(
            "SELECT (SELECT count(*) FROM fabric.proposals),"
            " (SELECT count(*) FROM fabric.memory_records),"
            " (SELECT count(*) FROM fabric.memory_lineage),"
            " (SELECT count(*) FROM fabric.memory_record_versions),"
            " (SELECT count(*) FROM fabric.events),"
            " (SELECT count(*) FROM fabric.runs)"
        ).fetchone()
        assert row is not None
        return tuple(row)

    def refused(self, send: Callable[[], Any]) -> psycopg.Error:
        before = self.rows()
        with pytest.raises(psycopg.Error) as info:
            send()
        assert self.rows() == before, "a refused envelope wrote a row"
        return info.value

    def propose(self, envelope: Any) -> Any:
        row = self.agent.execute(
            "SELECT fabric_api.propose(%s, %s)", (Jsonb(envelope), self.run)
        ).fetchone()
        return None if row is None else row[0]

    def propose_text(self, text: str) -> Any:
        row = self.agent.execute(
            "SELECT fabric_api.propose(%s::jsonb, %s)", (text, self.run)
        ).fetchone()
        return None if row is None else row[0]


def assert_fabric_error(exc: psycopg.Error) -> None:
    """A refusal with a stable SQLSTATE of the fabric: data (22), integrity (23), authority
    (42501) or a limit (54000) -- never an internal error or an unnamed RAISE (P0001)."""
    assert exc.sqlstate is not None
    assert exc.sqlstate[:2] in {"22", "23"} or exc.sqlstate in {"42501", "54000"}, exc.sqlstate


@pytest.fixture
def harness(fabric: Fabric) -> Harness:
    h = Harness(fabric)
    # the control: the base envelope is valid, so every refusal below is the mutation's
    assert h.propose(base_envelope())["status"] == "validated"
    return h


# --- malformed envelopes are errors that write nothing ------------------------------------


@SETTINGS
@given(envelope=malformed_envelopes())
def test_a_malformed_value_anywhere_is_an_error(harness: Harness, envelope: dict[str, Any]) -> None:
    exc = harness.refused(lambda: harness.propose(envelope))
    assert_fabric_error(exc)


@SETTINGS
@given(envelope=envelopes_with_unknown_keys())
def test_an_unknown_key_anywhere_is_an_error(harness: Harness, envelope: dict[str, Any]) -> None:
    exc = harness.refused(lambda: harness.propose(envelope))
    assert exc.sqlstate == "22023"


@SETTINGS
@given(
    size=st.integers(65537, 300_000),
    filler=st.sampled_from(["x", "é", "'", "\\", '"', "€", "😀", SQL_FRAGMENTS[0]]),
    split=st.integers(1, 50),
)
def test_content_over_64_kib_is_an_error(
    harness: Harness, size: int, filler: str, split: int
) -> None:
    text = filler * (size // len(filler.encode()) + 1)
    chunk = max(1, len(text) // split)
    content = {f"k{i}": text[i * chunk : (i + 1) * chunk] for i in range(split)}
    assume(len(json.dumps(content, ensure_ascii=False).encode()) > 65536 + 100)
    exc = harness.refused(lambda: harness.propose(base_envelope() | {"content": content}))
    assert exc.sqlstate == "54000"


@SETTINGS
@given(
    depth=st.integers(33, 200),
    kinds=st.lists(st.booleans(), min_size=200, max_size=200),
    leaf=hostile_text,
)
@pytest.mark.slow
def test_content_nested_deeper_than_32_is_an_error(
    harness: Harness, depth: int, kinds: list[bool], leaf: str
) -> None:
    content = {"k": nested(depth - 1, leaf, kinds)}
    exc = harness.refused(lambda: harness.propose(base_envelope() | {"content": content}))
    assert exc.sqlstate == "54000"


@SETTINGS
@given(
    path=st.sampled_from(
        [p for p, _ in MALFORMED_AT if p != ("content",)]
        + [("validity_interval", "valid_from"), ("derived_from",)]
    ),
    fragment=sql_text,
    as_list=st.booleans(),
)
def test_sql_fragments_outside_content_are_just_malformed_values(
    harness: Harness, path: tuple[str, ...], fragment: str, as_list: bool
) -> None:
    value: Any = (
        [fragment] if as_list and path in {("derived_from",), ("compliance_labels",)} else fragment
    )
    if path == ("supersedes",):
        value = {"id": fragment}  # a string here is a governance rejection, not an error
    exc = harness.refused(lambda: harness.propose(set_path(base_envelope(), path, value)))
    assert_fabric_error(exc)
    assert harness.su.execute("SELECT to_regclass('fabric.events') IS NOT NULL").fetchone() == (
        True,
    )


def _not_a_double(text: str) -> bool:
    exact = Decimal(text)
    as_float = float(exact)
    return (
        as_float in (float("inf"), float("-inf"))
        or Decimal(repr(as_float)) != exact
        or (exact != 0 and as_float == 0.0)
    )


non_double_number = st.one_of(
    st.sampled_from(
        [
            str(2**53 + 1),
            str(-(2**53) - 1),
            str(2**60),
            str(10**30 + 1),
            "1e400",
            "-1e400",
            "1e-400",
            "0.1234567890123456789012",
            "3.141592653589793238462643383279",
        ]
    ),
    st.integers(2**53 + 1, 10**40).map(str),
    st.integers(-(10**40), -(2**53) - 1).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=22).map(lambda d: format(d, "f")),
).filter(_not_a_double)


@SETTINGS
@given(number=non_double_number, neighbour=hostile_text, in_list=st.booleans())
def test_a_number_that_is_not_a_double_is_an_error(
    harness: Harness, number: str, neighbour: str, in_list: bool
) -> None:
    marker = "__NUMBER_" + uuid.uuid4().hex + "__"
    content = {"note": neighbour, "n": [1, marker] if in_list else marker}
    text = json.dumps(base_envelope() | {"content": content}).replace(f'"{marker}"', number)
    assert number in text
    exc = harness.refused(lambda: harness.propose_text(text))
    assert exc.sqlstate == "22003"


@SETTINGS
@given(
    path=st.sampled_from(
        [
            ("content", "text"),
            ("content", "\x00key"),
            ("tier",),
            ("scope", "subject_id"),
            ("provenance", "source_event_id"),
            ("validity_interval", "valid_from"),
            ("version",),
        ]
    ),
    before=no_nul_text,
    after=no_nul_text,
)
def test_nul_characters_are_refused(
    harness: Harness, path: tuple[str, ...], before: str, after: str
) -> None:
    value = before + "\x00" + after
    envelope = set_path(base_envelope(), path, value)
    harness.refused(lambda: harness.propose(envelope))


@SETTINGS
@given(field=st.sampled_from(["valid_from", "valid_until"]), timestamp=offsetless_timestamp)
def test_timestamps_without_an_offset_are_an_error(
    harness: Harness, field: str, timestamp: str
) -> None:
    validity = {"valid_from": "2026-07-02T09:14:00Z", "valid_until": None, field: timestamp}
    exc = harness.refused(
        lambda: harness.propose(base_envelope() | {"validity_interval": validity})
    )
    assert exc.sqlstate == "22007"


# --- identifiers: the database accepts exactly what the rule accepts ----------------------

identifier_candidates = st.one_of(
    st.text(alphabet=assigned, min_size=1, max_size=12),
    st.builds(
        lambda a, c, b: a + c + b,
        st.text(alphabet=assigned, max_size=8),
        not_in_identifiers,
        st.text(alphabet=assigned, max_size=8),
    ),
    st.builds(
        lambda a, m: a + m,
        st.text(alphabet="aeiouAEIOU", min_size=1, max_size=4),
        st.sampled_from(["\u0301", "\u0308", "\u0327", "\u030a"]),  # composes under NFC
    ),
    st.text(alphabet=assigned, min_size=195, max_size=205),
)


@SETTINGS
@given(
    path=st.sampled_from(
        [
            ("provenance", "source_event_id"),
            ("provenance", "correlation_id"),
            ("provenance", "causation_id"),
            ("compliance_labels",),
        ]
    ),
    text=identifier_candidates,
)
def test_an_identifier_is_accepted_exactly_when_it_is_printable_nfc_without_format_characters(
    harness: Harness, path: tuple[str, ...], text: str
) -> None:
    value: Any = [text] if path == ("compliance_labels",) else text
    envelope = set_path(base_envelope(), path, value)
    if is_identifier(text):
        assert harness.propose(envelope)["status"] == "validated"
    else:
        exc = harness.refused(lambda: harness.propose(envelope))
        assert exc.sqlstate == "22023"
        assert exc.diag.message_primary is not None
        assert exc.diag.message_primary.startswith(".".join(path))


timestamp_text = st.builds(
    lambda y, mo, d, h, mi, s, off: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{off}",
    st.integers(0, 9999),
    st.integers(1, 12),
    st.integers(1, 28),
    st.integers(0, 24),
    st.integers(0, 59),
    st.integers(0, 60),
    st.sampled_from(["Z", "+00:00", "+14:00", "-12:00", "+05:30"]),
)


def names_an_instant_in_range(text: str) -> bool:
    """No 24:00 or leap second, and the instant is in the years 1900-9999 in UTC."""
    if int(text[11:13]) > 23 or int(text[17:19]) > 59 or int(text[:4]) == 0:
        return False
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except OverflowError:  # the offset moves it past year 1 or 9999
        return False
    return 1900 <= at.year <= 9999


@SETTINGS
@given(field=st.sampled_from(["valid_from", "valid_until"]), stamp=timestamp_text)
def test_a_timestamp_is_accepted_exactly_when_it_names_an_instant_in_range(
    harness: Harness, field: str, stamp: str
) -> None:
    other = "1900-01-01T00:00:00Z" if field == "valid_until" else None
    validity = {"valid_from": other, "valid_until": None, field: stamp}
    envelope = base_envelope() | {"validity_interval": validity}
    if names_an_instant_in_range(stamp):  # accepted; valid_until may still precede valid_from
        assert harness.propose(envelope)["status"] in {"validated", "rejected"}
    else:
        exc = harness.refused(lambda: harness.propose(envelope))
        assert exc.sqlstate == "22007"


# --- SQL inside content is data -----------------------------------------------------------

content_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53) + 1, 2**53 - 1), hostile_text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(hostile_text, inner, max_size=3)
    ),
    max_leaves=10,
)


@pytest.mark.slow
@SETTINGS
@given(content=st.dictionaries(hostile_text, content_value, max_size=6), text=sql_text)
def test_hostile_strings_in_content_are_stored_verbatim(
    harness: Harness, content: dict[str, Any], text: str
) -> None:
    content = content | {text: text}
    result = harness.propose(base_envelope() | {"content": content})
    assert result["status"] == "validated", result
    row = harness.committer.execute("SELECT fabric_api.commit(%s)", (result["proposal_id"],))
    record = row.fetchone()[0]  # type: ignore[index]
    assert record["content"] == content
    assert record["content_hash"] == content_hash(content)
    stored = harness.su.execute(
        "SELECT content, content = %s FROM fabric.memory_records WHERE memory_id = %s",
        (Jsonb(content), record["memory_id"]),
    ).fetchone()
    assert stored == (content, True)
    assert harness.su.execute("SELECT to_regclass('fabric.events') IS NOT NULL").fetchone() == (
        True,
    )
