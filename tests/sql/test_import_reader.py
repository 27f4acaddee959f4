"""fabric._import_elements: the set-based reader of import elements agrees with the element
reader fabric._import_element on every element.

fabric._import_elements reads an element of the common, valid shape with expressions of one
query and hands every other element to fabric._import_element. For a corpus of elements
(valid variants and each kind of break, alone and in pairs) the batch answer of each
position equals fabric._import_element's answer for that element, field by field; and the
valid variants are read without calling fabric._import_element (the fast path is taken, so
the comparison is not vacuous). EDGE holds the values the fast test's expressions could
misjudge (dates that do not exist, offsets, fractions, the years 1899 and 10000, numbers with
exponents or 16 digits and more, identifiers with quotes, backslashes, non-ASCII or 200
characters and more, declared entities, brackets inside strings): for those only the
agreement is asserted, whichever reader takes them; so for 400 random elements (a fixed
seed) with one or two fields at those edges.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest
from test_import import _encode, _Raw, element

from conftest import Fabric
from variants import DROP, deep, mutate


def base() -> dict[str, Any]:
    """test_import's valid element, with a content of its own (the same in every call)."""
    return element(content={"text": "asked for invoices in EUR", "turn": 3})


# (path, value): the value at the path replaced (DROP removes the key). PLAIN: the
# elements read by the set-based query.
PLAIN: list[tuple[tuple[str, ...], Any]] = [
    (("validity_interval",), DROP),
    (("validity_interval",), None),
    (("validity_interval", "valid_from"), DROP),
    (("validity_interval", "valid_until"), "2026-08-01T00:00:00+02:00"),
    (("validity_interval", "valid_from"), "2026-07-02T09:14:00.123456Z"),
    (("confidence",), 1),
    (("confidence",), 0),
    (("confidence",), 1.0),
    (("confidence",), 0.12345678901234),
    (("version",), "2.3.4"),
    (("version",), None),
    (("retention_class",), "audit"),
    (("retention_class",), None),
    (("retention_class",), DROP),
    (("compliance_labels",), []),
    (("compliance_labels",), None),
    (("compliance_labels",), DROP),
    (("compliance_labels",), ["gdpr:art-9", "a/b@c+d=e"]),
    (("scope", "visibility"), "tenant"),
    (("scope", "tenant_id"), DROP),
    (("scope", "tenant_id"), None),
    (("scope", "session_id"), None),
    (("provenance",), DROP),
    (("provenance",), {}),
    (("provenance", "formation_method"), None),
    (("provenance", "causation_id"), "msg-77"),
    (("tier",), "episodic"),
    (("derived_from",), []),
    (("supersedes",), None),
    (("business_instance_id",), "inst-1"),
    (("content",), {"a": [1, 2.5, -3, {"b": None}], "ü": "ß"}),
    (("validity_interval", "valid_from"), "2024-02-29T12:00:00Z"),
    (("validity_interval", "valid_from"), "2000-02-29T00:00:00-05:30"),
    (("validity_interval", "valid_from"), "1899-12-31T23:30:00-01:00"),
    (("validity_interval", "valid_from"), "2026-07-02T09:14:00.5+14:00"),
    (("validity_interval", "valid_until"), "9999-12-31T23:59:59.123456789Z"),
    (("confidence",), _Raw("0.50")),
    (("confidence",), _Raw("1e-1")),
    (("confidence",), _Raw("-0")),
    (("confidence",), _Raw("1E0")),
    (("scope", "subject_id"), 'a"b\\c'),
    (("scope", "agent_id"), "x" * 200),
    (("scope",), {"visibility": "tenant"}),
    (("content",), {"n": 123456789012345, "m": _Raw("1.5e3"), "z": _Raw("-0.0")}),
    (("content",), {"a": [1, 2, 3, 4, 5, 6, 7, 8], "t": "[[{{ not brackets }}]]"}),
    (("version",), "0.0.0"),
    (("version",), "999999999.0.0"),
]

# Elements read one by one: breaking a rule, or valid in a shape the fast test leaves out.
SLOW: list[tuple[tuple[str, ...], Any]] = [
    (("validity_interval", "valid_until"), "2026-07-01T00:00:00Z"),
    (("validity_interval", "valid_from"), "1900-01-01T00:30:00+01:00"),
    (("validity_interval", "valid_from"), "2026-02-30T00:00:00Z"),
    (("validity_interval", "valid_from"), "2026-07-02t09:14:00z"),
    (("validity_interval", "valid_from"), "2026-07-02 09:14:00Z"),
    (("validity_interval", "valid_from"), "2026-07-02T24:00:00Z"),
    (("validity_interval", "valid_from"), "now"),
    (("validity_interval", "valid_from"), 5),
    (("validity_interval", "extra"), 1),
    (("validity_interval",), []),
    (("confidence",), 1.5),
    (("confidence",), 0.123456789012345),
    (("confidence",), -0.1),
    (("confidence",), "0.9"),
    (("confidence",), None),
    (("confidence",), DROP),
    (("version",), "1.0.0-rc.1"),
    (("version",), "01.0.0"),
    (("version",), "99999999999.0.0"),
    (("version",), 5),
    (("version",), "1.0"),
    (("retention_class",), "ephemeral"),
    (("retention_class",), "bogus"),
    (("retention_class",), 3),
    (("compliance_labels",), ["a b"]),
    (("compliance_labels",), ["x"] * 65),
    (("compliance_labels",), [1]),
    (("compliance_labels",), ["Ünï"]),
    (("compliance_labels",), "pii"),
    (("scope", "visibility"), "agent"),
    (("scope", "visibility"), "session"),
    (("scope", "visibility"), "world"),
    (("scope", "visibility"), None),
    (("scope", "subject_id"), None),
    (("scope", "subject_id"), ""),
    (("scope", "subject_id"), "user 8842"),
    (("scope", "subject_id"), 8842),
    (("scope", "agent_id"), "a\u200bb"),
    (("scope", "tenant_id"), "globex"),
    (("scope", "extra"), "x"),
    (("scope",), DROP),
    (("scope",), "acme"),
    (("provenance",), None),
    (("provenance", "formation_method"), "extraction"),
    (("provenance", "source_event_id"), "evt-1"),
    (("provenance", "source_event_id"), None),
    (("provenance", "correlation_id"), ["x"]),
    (("tier",), "semantic"),
    (("tier",), None),
    (("derived_from",), None),
    (("derived_from",), ["7f1f5c7e-0000-4000-8000-000000000001"]),
    (("derived_from",), "x"),
    (("supersedes",), "7f1f5c7e-0000-4000-8000-000000000001"),
    (("business_instance_id",), "inst 1"),
    (("content",), {"n": 12345678901234567}),
    (("content",), {"n": 0.1234567890123456789}),
    (("content",), {"n": 1e300}),
    (("content",), "text"),
    (("content",), DROP),
    (("content",), {"t": "x" * 70000}),
    (("content_hash",), "sha256:00"),
    (("content_hash",), None),
    (("extra",), 1),
]


_TS = ("validity_interval", "valid_from")
_UNTIL = ("validity_interval", "valid_until")

# Values either reader may take; only their agreement is asserted.
EDGE: list[tuple[tuple[str, ...], Any]] = [
    *[
        (_TS, ts)
        for ts in [
            "2026-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-00-10T00:00:00Z",
            "2026-07-00T00:00:00Z",
            "10000-01-01T00:00:00Z",
            "0000-01-01T00:00:00Z",
            "1899-12-31T23:59:59Z",
            "1900-01-01T00:00:00Z",
            "1900-01-01T00:59:59+01:00",
            "9999-12-31T23:30:00-01:00",
            "2026-07-02T09:14:00+15:59",
            "2026-07-02T09:14:00+16:00",
            "2026-07-02T09:14:00+05:60",
            "2026-07-02T09:14:00-00:00",
            "2026-07-02T09:60:00Z",
            "2026-07-02T09:14:60Z",
            "2026-07-02T09:14:00.Z",
            "2026-07-02T09:14:00.1234567890Z",
            "2026-07-02T09:14:00.000000000-00:00",
            "\uff12\uff10\uff12\uff16-07-02T09:14:00Z",
            "2026-7-02T09:14:00Z",
            "2026-07-02T09:14:00",
            "2026-07-02T09:14:00+0530",
            " 2026-07-02T09:14:00Z",
            "2026-07-02T09:14:00Z ",
            "2026-07-02T09:14:00ZZ",
            "infinity",
        ]
    ],
    (_UNTIL, "2026-07-02T09:14:00Z"),
    (_UNTIL, "9999-12-31T23:59:59.9999999Z"),
    (_UNTIL, "2026-07-02T09:14:00.000001Z"),
    *[
        (("confidence",), _Raw(c))
        for c in [
            "1.0000000000000001",
            "0.000000000000001",
            "0.123456789012345",
            "0.1234567890123456",
            "1e-400",
            "1.00",
            "-0.5",
            "-0.0",
            "0e0",
            "1e2",
            "1.5",
        ]
    ],
    *[
        (("content",), {"n": _Raw(n)})
        for n in [
            "1e300",
            "1234567890123456",
            "123456789012345.6",
            "0.1234567890123456789",
            "1E-7",
            "-12345678901234567",
            "100000000000000000000.0",
        ]
    ],
    (("content",), {"a": [1, 2, 3], "b": _Raw("12345678901234567")}),
    (("content",), {"a": list(range(20)), "b": 0.30000000000000004}),
    (("content",), deep(32)),
    (("content",), deep(33)),
    (("content",), {"t": "[" * 40}),
    (("content",), {"t": "{" * 33, "n": deep(2)}),
    (("content", "entities"), []),
    (("content", "entities"), [{"type": "organization", "name": "Acme GmbH", "id": "crm:4711"}]),
    (("content", "entities"), "Acme GmbH"),
    (("content", "entities"), [{"type": "alien", "name": "x"}]),
    *[
        (path, v)
        for path in [("scope", "subject_id"), ("provenance", "correlation_id")]
        for v in ["ünï", "a\tb", "", "x" * 201, "a\\b", "\u00a0", ["x"], {"a": 1}, True, 5]
    ],
    (("scope", "tenant_id"), 5),
    (("scope", "tenant_id"), "acme "),
    (("provenance", "formation_method"), 5),
    (("provenance", "causation_id"), "x" * 200),
    (("business_instance_id",), 5),
    (("business_instance_id",), ""),
    (("business_instance_id",), "ünï"),
    (("business_instance_id",), "x" * 201),
    *[
        (("compliance_labels",), labels)
        for labels in [
            ['a"b'],
            ["a\\b"],
            [""],
            ["a,b"],
            ["a", None],
            ["x"] * 64,
            ["ab"] * 41,
            ["é"],
            ["[x]"],
        ]
    ],
    *[
        (("version",), v)
        for v in [
            "1.2.3-rc.1",
            "1000000000.0.0",
            "2147483647.0.0",
            "2147483648.0.0",
            "1.2",
            "01.2.3",
            "1.2.3+build.5",
            "",
            "1." + "0" * 62 + ".0",
        ]
    ],
    (("retention_class",), "Durable"),
    (("retention_class",), ""),
    (("tier",), "episodic "),
    (("supersedes",), []),
]


def corpus() -> tuple[list[Any], list[Any]]:
    """(plain elements, all elements): single mutations, pairs, and a few odd ones."""
    plain = [base()] + [mutate(base(), p, v) for p, v in PLAIN]
    rng = random.Random(13)
    mutations = PLAIN + SLOW
    pairs = [
        mutate(mutate(base(), *rng.choice(mutations)), *rng.choice(mutations)) for _ in range(150)
    ]
    odd = [None, [], "x", 5, {}, mutate(base(), ("content",), deep(31))]
    odd += [mutate(base(), ("content",), deep(40))]
    broken = [mutate(base(), p, v) for p, v in SLOW + EDGE]
    return plain, plain + broken + pairs + odd


def element_calls(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT coalesce(pg_stat_get_xact_function_calls("
        "'fabric._import_element(jsonb, text)'::regprocedure), 0)"
    ).fetchone()
    assert row is not None
    return int(row[0])


def batch(
    conn: psycopg.Connection[Any], elements: list[Any], tenant: str = "acme"
) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT * FROM fabric._import_elements(%s::jsonb, %s) ORDER BY o_position",
        (_encode(elements), tenant),
    ).fetchall()
    assert [r[0] for r in rows] == list(range(len(elements)))
    return [tuple(r[1:]) for r in rows]


def one(conn: psycopg.Connection[Any], el: Any, tenant: str = "acme") -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT * FROM fabric._import_element(%s::jsonb, %s)", (_encode([el])[1:-1], tenant)
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_batch_reader_equals_element_reader(fabric: Fabric) -> None:
    _plain, elements = corpus()
    with fabric.connect(autocommit=False) as conn:  # one transaction: one now()
        conn.execute("SET LOCAL track_functions = 'all'")
        got = batch(conn, elements)
        for i, el in enumerate(elements):
            want = one(conn, el)
            assert got[i] == want, (i, el)
        # the corpus is not vacuous: valid and refused elements both occur
        assert any(r[0] is None and r[1] is None for r in got)
        assert any(r[0] is not None for r in got) and any(
            r[0] is None and r[1] is not None for r in got
        )


def test_plain_elements_take_the_set_based_path(fabric: Fabric) -> None:
    plain, _ = corpus()
    with fabric.connect(autocommit=False) as conn:
        conn.execute("SET LOCAL track_functions = 'all'")
        before = element_calls(conn)
        rows = batch(conn, plain)
        assert element_calls(conn) == before  # none read one by one
        assert all(r[0] is None and r[1] is None for r in rows)
        batch(conn, [mutate(base(), ("confidence",), 1.5)])
        assert element_calls(conn) == before + 1  # the counter counts


@pytest.mark.parametrize("path, value", SLOW[:12])
def test_a_broken_element_is_read_one_by_one(fabric: Fabric, path: Any, value: Any) -> None:
    with fabric.connect(autocommit=False) as conn:
        conn.execute("SET LOCAL track_functions = 'all'")
        before = element_calls(conn)
        batch(conn, [base(), mutate(base(), path, value)])
        assert element_calls(conn) == before + 1


def test_a_tenant_id_that_is_not_a_string_is_refused_by_both_readers(fabric: Fabric) -> None:
    """A tenant id that reads as a number: scope.tenant_id 5 is not the string "5"."""
    els = [
        mutate(base(), ("scope", "tenant_id"), "5"),
        mutate(base(), ("scope", "tenant_id"), 5),
        mutate(base(), ("scope", "tenant_id"), True),
    ]
    with fabric.connect(autocommit=False) as conn:
        got = batch(conn, els, tenant="5")
        assert got == [one(conn, el, tenant="5") for el in els]
        assert got[0][0] is None and got[0][1] is None  # the string is the tenant's id
        assert got[1][0] == "22023" and got[2][0] == "22023"


def _random_value(rng: random.Random) -> tuple[tuple[str, ...], Any]:
    """A (path, value) drawn near the edges of the fast test: timestamps of every field in
    and out of range, confidence and content numbers as JSON text, identifiers of a few
    kinds of characters and of lengths around 200, labels and versions."""
    kind = rng.choice(["ts", "ts", "ts", "conf", "number", "ident", "labels", "version"])
    if kind == "ts":
        # a valid instant, then one or two of its fields at an edge
        parts: dict[str, Any] = {"year": 2026, "month": 7, "day": 2, "sep": "T", "hour": 9,
                                 "minute": 14, "second": 0, "frac": "", "tz": "Z"}  # fmt: skip
        edges: dict[str, list[Any]] = {
            "year": [0, 1, 1899, 1900, 1901, 2000, 2023, 2024, 2100, 9999, 10000],
            "month": [0, 1, 2, 4, 12, 13],
            "day": [0, 1, 28, 29, 30, 31, 32],
            "sep": ["t", " ", "TT"],
            "hour": [0, 23, 24],
            "minute": [0, 59, 60],
            "second": [0, 59, 60],
            "frac": ["."] + ["." + "7" * n for n in (1, 3, 6, 9, 10)],
            "tz": ["z", "+00:00", "-00:00", "+14:00", "-12:30", "+15:59", "+16:00", "+01:60",
                   "+0100", ""],
        }  # fmt: skip
        for field in rng.sample(sorted(edges), rng.choice([1, 1, 2])):
            parts[field] = rng.choice(edges[field])
        ts = "{:04d}-{:02d}-{:02d}{}{:02d}:{:02d}:{:02d}{}{}".format(
            parts["year"], parts["month"], parts["day"], parts["sep"], parts["hour"],
            parts["minute"], parts["second"], parts["frac"], parts["tz"],
        )  # fmt: skip
        return (rng.choice([_TS, _TS, _UNTIL]), ts)
    if kind == "conf":
        text = rng.choice(["0", "1", "-0", "2"])
        if rng.random() < 0.8:
            text += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 17)))
        if rng.random() < 0.2:
            text += rng.choice(["e0", "e-1", "E+1", "e-400"])
        return (("confidence",), _Raw(text))
    if kind == "number":
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))
        digits = digits.lstrip("0") or "0"
        point = rng.randint(0, len(digits))
        text = digits if point in (0, len(digits)) else f"{digits[:point]}.{digits[point:]}"
        if digits[0] == "0" and point not in (0, len(digits)):
            text = "0." + digits[1:]
        text = rng.choice(["", "-"]) + text + rng.choice(["", "", "e2", "e-5", "E20"])
        return (("content",), {"text": "n", "n": _Raw(text), "m": [1, 2, 3]})
    if kind == "ident":
        pool = rng.choice(["ab-1", 'a"\\b', "a b", "ü", "\t", "x"])
        value = "".join(rng.choice(pool) for _ in range(rng.choice([0, 1, 3, 199, 200, 201])))
        path = rng.choice(
            [("scope", "subject_id"), ("scope", "agent_id"), ("scope", "session_id"),
             ("provenance", "correlation_id"), ("provenance", "causation_id"),
             ("business_instance_id",)]
        )  # fmt: skip
        return (path, value)
    if kind == "labels":
        pool = rng.choice(["pii", "a:b/c", 'q"', "a b", "é", "", "[x]"])
        return (("compliance_labels",), [pool] * rng.choice([1, 2, 40, 64, 65]))
    major = rng.choice(["0", "1", "01", "999999999", "1000000000", "2147483648"])
    return (("version",), major + rng.choice([".0.0", ".2.3", ".2", ".2.3-rc.1", ".2.3+b5"]))


def test_random_elements_near_the_edges_get_the_same_answer_from_both_readers(
    fabric: Fabric,
) -> None:
    rng = random.Random(40)
    elements = []
    for _ in range(400):
        el = base()
        for _ in range(rng.choice([1, 1, 2])):
            el = mutate(el, *_random_value(rng))
        elements.append(el)
    with fabric.connect(autocommit=False) as conn:  # one transaction: one now()
        got = batch(conn, elements)
        for i, el in enumerate(elements):
            assert got[i] == one(conn, el), (i, el)
    read = [r for r in got if r[0] is None and r[1] is None]
    assert len(read) > 40 and len(got) - len(read) > 40  # both answers occur
