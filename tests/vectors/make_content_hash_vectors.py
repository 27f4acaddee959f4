"""Regenerate tests/vectors/content_hash.json, the shared content-hash test vectors.

Usage (from the repository root, with the ``rfc8785`` package installed)::

    python tests/vectors/make_content_hash_vectors.py           # rewrite the file
    python tests/vectors/make_content_hash_vectors.py --check   # exit 1 if it is stale

Each accepted vector is ``{"name", "content", "canonical", "hash"}``: ``content`` is JSON
*text* (so spellings such as ``1.0``, ``1.50`` and ``1e20`` survive), which the database
parses with ``content::jsonb`` and Python with ``json.loads``; ``canonical`` is
``rfc8785.dumps`` of the parsed value and ``hash`` is ``"sha256:"`` + the hex SHA-256 of
it. This script deliberately does not import ``memfabric.hashing``, so that the vectors
are an independent check of both the SQL function and the Python twin.

The only adjustment made to ``json.loads`` output: ``rfc8785`` refuses integers beyond
+-(2**53 - 1), while the content-hash rule accepts any number that is exactly the
shortest round-trip decimal of a double, so such an integer (2**53, 10**20) is handed to
``rfc8785`` as that double. Every number of an accepted vector is checked against the rule
here; every ``refused`` vector must contain a number that breaks it (the database raises
SQLSTATE 22003 for those).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import rfc8785

OUT = Path(__file__).with_name("content_hash.json")

_SAFE_INT_MAX = 2**53 - 1

# The RFC 8785 section 3.2.3 sorting example, plus keys around the UTF-16 surrogate range.
_RFC_SORT_EXAMPLE = (
    r'{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With '
    r'Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control",'
    r'"\u00f6":"Latin Small Letter O With Diaeresis"}'
)

_ALL_CONTROL = '"' + "".join(f"\\u{i:04x}" for i in range(1, 0x20)) + '"'
_ALL_ASCII = json.dumps("".join(chr(i) for i in range(1, 0x80)))

_TYPICAL = json.dumps(
    {
        "kind": "observation",
        "agent": "planner-7",
        "text": (
            "The deploy on 2024-05-01 failed because the migration 020 timed out; "
            "retrying with lock_timeout = '5s' fixed it. Owner: ops@example.org."
        ),
        "tags": ["deploy", "postgres", "migration", "incident"],
        "confidence": 0.87,
        "importance": 3,
        "source": {
            "tool": "shell",
            "command": "psql -c 'SELECT 1'",
            "exit_code": 0,
            "duration_ms": 1532.25,
        },
        "entities": [
            {"name": "migration 020", "type": "artifact", "salience": 0.9},
            {"name": "ops team", "type": "group", "salience": 0.35},
            {"name": "Zürich", "type": "place", "salience": 0.1},
        ],
        "links": {"supersedes": None, "caused_by": ["mem_01HX", "mem_01HY"]},
        "flags": {"pinned": False, "private": True},
        "created": "2024-05-01T12:34:56.789Z",
        "note": 'emoji 😀 and CJK 記憶 and a quote " and a backslash \\ stay',
        "vector_hint": [0.125, -0.5, 1e-7, 12345.678],
    },
    ensure_ascii=False,
    indent=2,
)

ACCEPTED: list[tuple[str, str]] = [
    # literals and empties
    ("empty_object", "{}"),
    ("empty_array", "[]"),
    ("true", "true"),
    ("false", "false"),
    ("null", "null"),
    ("literals_in_array", "[true,false,null]"),
    ("empty_string", '""'),
    ("plain_string", '"hello, memory"'),
    ("whitespace_is_dropped", ' { "b" : [ 1 , 2 ] ,\n\t"a" : { } } '),
    ("duplicate_key_last_wins", '{"a":1,"a":2}'),
    # nesting
    ("nested", '{"z":{"y":[1,{"x":[],"w":{}}],"b":[[[]]]},"a":[{"c":1,"b":2},[3,[4]]]}'),
    ("array_keeps_order", '[3,1,2,"b","a",{"b":1,"a":2}]'),
    ("deep_array", "[" * 40 + "1" + "]" * 40),
    # key order: UTF-16 code units, not code points or UTF-8 bytes
    ("keys_rfc8785_sort_example", _RFC_SORT_EXAMPLE),
    ("keys_ascii_and_prefixes", '{"b":1,"a":2,"ab":3,"":4,"A":5,"aa":6,"_":7,"1":8}'),
    (
        "keys_supplementary_before_e000_ffff",
        r'{"\uffff":1,"\ue000":2,"\ud800\udc00":3,"\udbff\udfff":4,"\ud7ff":5,"z":6}',
    ),
    (
        "keys_u10ffff_prefixes",
        r'{"\udbff\udfff\uffff":1,"\ue000":2,"\udbff\udfff":3,"\udbff\udfffa":4,'
        r'"\udbff\udfff\ue000":5,"\ud83d\ude00":6,"\uffff":7,"\ufffd":8}',
    ),
    ("keys_emoji_vs_private_use", '{"\ue001":"private use","😀":"emoji","\u00e9":"e acute"}'),
    ("keys_needing_escapes", r'{"\n":1,"\"":2,"\\":3,"\u001f":4,"/":5,"\u007f":6}'),
    # string escaping
    ("string_all_control_chars", _ALL_CONTROL),
    ("string_short_escapes", r'"\b\t\n\f\r"'),
    ("string_quote_backslash", r'"say \"hi\" \\ C:\\path"'),
    ("string_slash_escaped_in_input", r'"a\/b"'),
    ("string_slash_literal", '"a/b</script>"'),
    ("string_u007f", r'"del:\u007f"'),
    ("string_u2028_u2029", r'"ls:\u2028 ps:\u2029"'),
    ("string_all_ascii", _ALL_ASCII),
    ("string_latin1_and_bom", r'"\u0080\u00a0\u00e9\u00ff\ufeff"'),
    ("string_emoji_literal", '"😀👍🏽 family 👨‍👩‍👧"'),
    ("string_emoji_escaped_pair", r'"\ud83d\ude00"'),
    ("string_non_bmp_extremes", r'"\ud800\udc00 \udbff\udfff \uffff \ue000"'),
    ("string_cjk_rtl", '"記憶 память ذاكرة"'),
    ("string_uppercase_hex_escape", r'"\u00E9\u001F"'),
    # strings that look like SQL (must be plain data everywhere)
    ("sql_injection_text", '"\'; DROP TABLE fabric.memory; --"'),
    (
        "sql_fragments",
        r'["$$","$fn$ BEGIN","E\u0027\\x00\u0027","%s","%(x)s","\\\\","-- c","/* c */"]',
    ),
    ("sql_fragment_keys", '{"\'; DELETE FROM x; --":"$1","$$":"::jsonb","%s":"{}"}'),
    # numbers
    ("int_zero", "0"),
    ("int_small", "[1,-1,42,-42,100]"),
    ("number_1_0", "1.0"),
    ("number_1_50", "1.50"),
    ("number_1e20", "1e20"),
    ("number_1e21", "1e21"),
    ("number_1E_plus_2", "1E+2"),
    ("number_minus_zero", "-0"),
    ("number_minus_zero_float", "-0.0"),
    ("number_2_pow_53", "9007199254740992"),
    ("number_minus_2_pow_53", "-9007199254740992"),
    ("number_safe_int_max", "9007199254740991"),
    ("number_1e_minus_7", "1e-7"),
    ("number_0_000001", "0.000001"),
    ("number_123e_minus_20", "123e-20"),
    ("number_min_subnormal", "5e-324"),
    ("number_min_normal", "2.2250738585072014e-308"),
    ("number_max_double", "1.7976931348623157e308"),
    ("number_minus_max_double", "-1.7976931348623157e308"),
    # shortest decimals on the rounding boundary (PostgreSQL's float8out misses these)
    ("number_1e23", "1e23"),
    ("number_boundary_shortest", "[382201000000000000000,5e22,-7e22,4.2e22,5.299064834871378e16]"),
    ("number_point_1_plus_point_2", "0.30000000000000004"),
    ("number_fixed_to_exponent_edges", "[1e-6,1e-7,123456789012345680000,1.2345678901234568e21]"),
    ("number_negatives", "[-1.5,-0.001,-1e-7,-123.456e5,-5e-324,-1e21]"),
    ("number_fractions", "[0.1,0.5,2.5,3.14159,1.0000000000000002,4.35,0.0001]"),
    ("number_exponent_forms", "[1e16,1.5e16,1e300,1.5e-300,12e-1,100e-2]"),
    ("numbers_in_object", '{"n":1.10,"m":-0,"big":1e20,"bigger":1e22,"tiny":1E-10}'),
    # a typical memory object, about 1 KB
    ("typical_memory_1kb", _TYPICAL),
]

REFUSED: list[tuple[str, str]] = [
    ("int_2_pow_53_plus_1", "9007199254740993"),
    ("too_many_digits", "0.1234567890123456789"),
    ("overflow_1e400", "1e400"),
    ("big_int_30_digits", "123456789012345678901234567890"),
    ("int_2_pow_60_exact_double_not_shortest", "1152921504606846976"),
    ("rfc8785_example_333333333_33333329", "333333333.33333329"),
    ("underflow_1e_minus_400", "1e-400"),
    ("pg_float8out_spelling_of_1e23", "99999999999999990000000"),
    ("pg_float8out_spelling_of_5e22", "4.9999999999999996e22"),
    ("below_min_subnormal", "4.9e-324"),
    ("just_above_max_double", "1.7976931348623159e308"),
    ("nested_in_object", '{"ok":1.5,"deep":{"list":[1,2,{"n":9007199254740993}]}}'),
    ("negative_in_array", '["fine",-123456789012345678901234567890]'),
]


def _exact_double_text(text: str) -> bool:
    """True when the JSON number ``text`` is exactly the shortest decimal of a double."""
    exact = Decimal(text)
    if exact == 0:
        return True
    as_float = float(exact)
    return math.isfinite(as_float) and Decimal(repr(as_float)) == exact


def _parse_number(text: str) -> int | float:
    if not _exact_double_text(text):
        raise ValueError("accepted vector holds a number the database refuses")
    exact = Decimal(text)
    if exact == exact.to_integral_value() and "." not in text and "e" not in text.lower():
        value = int(text)
        return value if abs(value) <= _SAFE_INT_MAX else float(value)
    return float(text)


def _numbers(text: str) -> list[str]:
    found: list[str] = []
    json.loads(text, parse_int=lambda s: found.append(s), parse_float=lambda s: found.append(s))
    return found


def build() -> dict[str, Any]:
    vectors = []
    names: set[str] = set()
    for name, content in ACCEPTED:
        assert name not in names, name
        names.add(name)
        value = json.loads(content, parse_int=_parse_number, parse_float=_parse_number)
        canonical = rfc8785.dumps(value)
        vectors.append(
            {
                "name": name,
                "content": content,
                "canonical": canonical.decode("utf-8"),
                "hash": "sha256:" + hashlib.sha256(canonical).hexdigest(),
            }
        )
    refused = []
    for name, content in REFUSED:
        assert name not in names, name
        names.add(name)
        numbers = _numbers(content)
        assert any(not _exact_double_text(n) for n in numbers), name
        refused.append({"name": name, "content": content})
    return {
        "description": (
            "content_hash vectors: hash = 'sha256:' + hex SHA-256 of the RFC 8785 canonical "
            "form (UTF-8) of content parsed as JSON. 'refused' contents hold a number that "
            "is not exactly the shortest round-trip decimal of an IEEE double; the database "
            "raises SQLSTATE 22003 for them. Regenerate with "
            "tests/vectors/make_content_hash_vectors.py."
        ),
        "vectors": vectors,
        "refused": refused,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: rerun {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(ACCEPTED)} vectors, {len(REFUSED)} refused)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
