"""fabric.content_hash (sql/020_content_hash.sql) against its Python twin and the vectors.

Needs the ``db`` fixture: a psycopg 3 autocommit connection to a database where
sql/020_content_hash.sql is installed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfabric.hashing import ContentError, canonical, content_hash, loads

pytestmark = pytest.mark.rollback

VECTORS_FILE = Path(__file__).resolve().parents[1] / "vectors" / "content_hash.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))
ACCEPTED: list[dict[str, str]] = VECTORS["vectors"]
REFUSED: list[dict[str, str]] = VECTORS["refused"]

REFUSAL_MESSAGE = "content number is not exactly representable as an IEEE double"
REFUSAL_HINT = "send it as a string, or round it to at most 15-17 significant digits"

# characters where JCS and a naive JSON encoder could disagree, and around UTF-16 ordering
TRICKY_CHARS = [
    *(chr(i) for i in range(1, 0x80)),
    "\u0080",
    "\u00a0",
    "\u2028",
    "\u2029",
    "\ud7ff",
    "\ue000",
    "\ufb33",
    "\ufeff",
    "\ufffd",
    "\uffff",
    "\U00010000",
    "\U0001f600",
    "\U0010ffff",
]


def _ids(rows: list[dict[str, str]]) -> list[str]:
    return [row["name"] for row in rows]


def _db_hash(db: psycopg.Connection[Any], content: str) -> tuple[str, str]:
    row = db.execute(
        "SELECT fabric.jcs_canonical(c), fabric.content_hash(c) FROM (SELECT %s::jsonb AS c) s",
        (content,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_vector_file_is_consistent() -> None:
    names = _ids(ACCEPTED) + _ids(REFUSED)
    assert len(names) == len(set(names))
    for vector in ACCEPTED:
        digest = hashlib.sha256(vector["canonical"].encode("utf-8")).hexdigest()
        assert vector["hash"] == "sha256:" + digest, vector["name"]


# The database tests loop over the vectors inside one test (the `db` fixture may be a
# fresh database per test, too costly per vector) and report every failing name at once.


def test_vectors_db(db: psycopg.Connection[Any]) -> None:
    wrong = []
    for vector in ACCEPTED:
        got = _db_hash(db, vector["content"])
        if got != (vector["canonical"], vector["hash"]):
            wrong.append((vector["name"], got[0], vector["canonical"]))
    assert wrong == []


@pytest.mark.parametrize("vector", ACCEPTED, ids=_ids(ACCEPTED))
def test_vector_python(vector: dict[str, str]) -> None:
    value = json.loads(vector["content"])
    assert canonical(value) == vector["canonical"].encode("utf-8")
    assert content_hash(value) == vector["hash"]
    # the strict parser takes the same text to the same hash
    assert content_hash(loads(vector["content"])) == vector["hash"]


def _number_spellings(content: str) -> set[str]:
    """Forms in which a refused number could leak into an error text."""
    found: list[str] = []
    json.loads(content, parse_int=found.append, parse_float=found.append)
    forms: set[str] = set()
    for token in found:
        forms.add(token)
        exact = Decimal(token)
        forms.add(str(exact))
        forms.add(format(exact, "f"))
        digits = re.sub(r"[^0-9]", "", token.lower().split("e")[0]).strip("0")
        if len(digits) >= 5:  # short digit runs such as "1" also occur in "line 21"
            forms.add(digits)
    return {form for form in forms if len(form) >= 4}


def test_refused_db(db: psycopg.Connection[Any]) -> None:
    for vector in REFUSED:
        with pytest.raises(psycopg.errors.NumericValueOutOfRange) as caught:
            _db_hash(db, vector["content"])
        diag = caught.value.diag
        assert diag.sqlstate == "22003", vector["name"]
        assert diag.message_primary == REFUSAL_MESSAGE, vector["name"]
        assert diag.message_hint == REFUSAL_HINT, vector["name"]
        texts = [diag.message_primary, diag.message_detail, diag.message_hint, diag.context]
        error_text = "\n".join(text for text in texts if text)
        for form in _number_spellings(vector["content"]):
            assert form not in error_text, vector["name"]
    assert db.execute("SELECT 1").fetchone() == (1,)  # connection still usable


@pytest.mark.parametrize("vector", REFUSED, ids=_ids(REFUSED))
def test_refused_python(vector: dict[str, str]) -> None:
    with pytest.raises(ContentError) as caught:
        loads(vector["content"])
    for form in _number_spellings(vector["content"]):
        assert form not in str(caught.value)


def test_python_refuses_what_jsonb_cannot_hold() -> None:
    for bad in (
        2**53 + 1,
        -(2**53) - 1,
        2**60,
        10**400,
        float("nan"),
        float("inf"),
        "a\x00b",
        {"k\x00": 1},
        {1: "non-string key"},
        "\ud800",
        b"bytes",
    ):
        with pytest.raises(ContentError):
            content_hash(bad)
    # exact doubles beyond the safe-integer range are accepted, as in the database
    assert canonical(2**53) == b"9007199254740992"
    assert canonical(10**20) == b"100000000000000000000"
    assert canonical(-(10**21)) == b"-1e+21"
    assert canonical((1, (2.0, {"b": None, "a": True}))) == b'[1,[2,{"a":true,"b":null}]]'


def test_pg_string_escaping_is_jcs(db: psycopg.Connection[Any]) -> None:
    """to_jsonb(text)::text and jsonb output escape exactly as RFC 8785 does."""
    strings = [f"a{ch}b" for ch in TRICKY_CHARS]
    rows = db.execute(
        "SELECT to_jsonb(s)::text, (to_jsonb(s)::text)::jsonb::text"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS u(s, i) ORDER BY i",
        (strings,),
    ).fetchall()
    for text, (from_text, from_jsonb) in zip(strings, rows, strict=True):
        expected = rfc8785.dumps(text).decode("utf-8")
        assert from_text == expected, hex(ord(text[1]))
        assert from_jsonb == expected, hex(ord(text[1]))


@pytest.mark.clone
def test_hash_ignores_session_float_settings(db: psycopg.Connection[Any]) -> None:
    vector = next(v for v in ACCEPTED if v["name"] == "number_fractions")
    db.execute("SET extra_float_digits = 0")
    try:
        assert _db_hash(db, vector["content"]) == (vector["canonical"], vector["hash"])
        db.execute("SET extra_float_digits = -15")
        assert _db_hash(db, vector["content"]) == (vector["canonical"], vector["hash"])
    finally:
        db.execute("RESET extra_float_digits")


def test_function_attributes(db: psycopg.Connection[Any]) -> None:
    rows = db.execute(
        """
        SELECT p.proname, p.provolatile, p.proparallel, p.proisstrict, p.proconfig
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'fabric'
           AND p.proname IN ('_jcs_number', '_jcs_key_order', 'jcs_canonical', 'content_hash')
        """
    ).fetchall()
    assert len(rows) == 4
    for name, volatile, parallel, strict, config in rows:
        assert (volatile, parallel, strict) == ("i", "s", True), name
        assert "search_path=pg_catalog, pg_temp" in config, name


def test_null_in_null_out(db: psycopg.Connection[Any]) -> None:
    row = db.execute("SELECT fabric.content_hash(NULL), fabric.content_hash('null')").fetchone()
    assert row is not None
    assert row[0] is None
    assert row[1] == "sha256:" + hashlib.sha256(b"null").hexdigest()


def test_number_refusal_of_non_finite_numeric(db: psycopg.Connection[Any]) -> None:
    for special in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            db.execute("SELECT fabric._jcs_number(%s::numeric)", (special,))


def _sample_doubles(rng: random.Random) -> list[float]:
    values: list[float] = []
    while len(values) < 1500:  # uniformly random bit patterns
        (value,) = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))
        if math.isfinite(value):
            values.append(value)
    # short decimals at and above 2^53, where the shortest form may sit on a rounding
    # boundary (1e23, 5e22, 3.82201e20): PostgreSQL's float8out is longer there
    values += [float(f"{rng.randint(1, 99999)}e{rng.randint(12, 300)}") for _ in range(1500)]
    values += [float(rng.randint(2**53, 2**70)) for _ in range(500)]
    values += [float(f"{rng.randint(1, 99)}e{rng.randint(-324, -300)}") for _ in range(300)]
    return [value for value in values if math.isfinite(value)]


def test_number_text_sample_matches_rfc8785(db: psycopg.Connection[Any]) -> None:
    numbers = _sample_doubles(random.Random(20240501))
    rows = db.execute(
        "SELECT fabric._jcs_number(n) FROM unnest(%s::text[]::numeric[])"
        " WITH ORDINALITY AS u(n, i) ORDER BY i",
        ([repr(number) for number in numbers],),
    ).fetchall()
    expected = [rfc8785.dumps(number).decode() for number in numbers]
    mismatches = [(e, r[0]) for e, r in zip(expected, rows, strict=True) if e != r[0]]
    assert mismatches == []


def _python_accepts(text: str) -> bool:
    try:
        loads(text)
    except ContentError:
        return False
    return True


@pytest.mark.clone
def test_number_refusal_sample_matches_python(db: psycopg.Connection[Any]) -> None:
    db.execute(
        """
        CREATE OR REPLACE FUNCTION pg_temp.accepts(t text) RETURNS boolean
        LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM fabric._jcs_number(t::numeric);
          RETURN true;
        EXCEPTION WHEN numeric_value_out_of_range THEN
          RETURN false;
        END $$
        """
    )
    rng = random.Random(7)

    def digits(count: int) -> str:
        return str(rng.randint(10 ** (count - 1), 10**count - 1))

    texts = [f"{digits(rng.randint(14, 18))}e{rng.randint(-340, 300)}" for _ in range(1500)]
    texts += [digits(rng.randint(15, 24)) for _ in range(1000)]
    texts += [f"{rng.randint(1, 99999)}e{rng.randint(10, 310)}" for _ in range(1000)]
    texts += [f"{rng.randint(1, 99)}e{rng.randint(-330, -300)}" for _ in range(500)]
    texts += ["99999999999999990000000", "100000000000000000000000", "1e23", "5e-324"]
    rows = db.execute(
        "SELECT pg_temp.accepts(t) FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, i) ORDER BY i",
        (texts,),
    ).fetchall()
    mismatches = [
        (text, row[0])
        for text, row in zip(texts, rows, strict=True)
        if row[0] != _python_accepts(text)
    ]
    assert mismatches == []
    accepted = sum(1 for row in rows if row[0])
    assert 0 < accepted < len(texts)  # the sample exercises both outcomes


# --------------------------------------------------------------------------- properties

_char = st.one_of(
    st.characters(codec="utf-8", exclude_characters="\x00"),
    st.sampled_from(TRICKY_CHARS),
)
_text = st.text(alphabet=_char, max_size=12)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_json = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(_text, children, max_size=6),
    ),
    max_leaves=30,
)

_PROPERTY_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_PROPERTY_SETTINGS
@given(value=_json)
@pytest.mark.clone
@pytest.mark.slow  # hypothesis: 5-6 s on this machine
def test_property_db_hash_equals_python(db: psycopg.Connection[Any], value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    canonical_text, hashed = _db_hash(db, text)
    assert canonical_text.encode("utf-8") == canonical(value)
    assert hashed == content_hash(value)


@_PROPERTY_SETTINGS
@given(keys=st.lists(_text, max_size=20, unique=True))
@pytest.mark.clone
def test_property_key_order_is_utf16(db: psycopg.Connection[Any], keys: list[str]) -> None:
    row = db.execute(
        "SELECT coalesce(array_agg(k ORDER BY fabric._jcs_key_order(k)), '{}')"
        " FROM unnest(%s::text[]) AS k",
        (keys,),
    ).fetchone()
    assert row is not None
    assert row[0] == sorted(keys, key=lambda key: key.encode("utf-16-be"))


@_PROPERTY_SETTINGS
@given(numbers=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=20))
@pytest.mark.clone
def test_property_number_text_is_ecmascript(
    db: psycopg.Connection[Any], numbers: list[float]
) -> None:
    rows = db.execute(
        "SELECT fabric._jcs_number(n) FROM unnest(%s::text[]::numeric[])"
        " WITH ORDINALITY AS u(n, i) ORDER BY i",
        ([repr(number) for number in numbers],),
    ).fetchall()
    assert [row[0] for row in rows] == [rfc8785.dumps(number).decode() for number in numbers]
