"""The identifier domains accept and refuse exactly what their checks of revision 0051 did
(migration 0052 wrote them in a cheaper form): every ASCII code point alone and inside an
identifier, the length limits, and the Unicode cases the identifier rule names."""

from __future__ import annotations

import pytest

from conftest import Fabric

pytestmark = pytest.mark.rollback

# The checks as revision 0051 had them (0002_core_tables, 0010_input_hardening).
TENANT_0051 = r"(v ~ '^[a-z0-9][a-z0-9_-]{0,62}$' AND v <> 'platform')"
IDENT_0051 = (
    r"(v ~ '^[^\u0001-\u0020\u007F-\u00A0\u00AD\u0600-\u0605\u061C\u06DD\u070F\u0890-\u0891"
    r"\u08E2\u1680\u180E\u2000-\u200F\u2028-\u202F\u205F-\u206F\u3000\uE000-\uF8FF\uFEFF"
    r"\uFFF9-\uFFFB\U000110BD\U000110CD\U00013430-\U0001343F\U0001BCA0-\U0001BCA3"
    r"\U0001D173-\U0001D17A\U000E0001\U000E0020-\U000E007F\U000F0000-\U0010FFFF]+$'"
    " AND length(v) <= 200 AND v IS NFC NORMALIZED AND unicode_assigned(v))"
)


def values() -> list[str]:
    ascii_ = [chr(c) for c in range(1, 128)]
    out = ascii_ + [f"a{c}b" for c in ascii_] + [f"{c}tenant" for c in ascii_]
    out += ["a" * n for n in (1, 62, 63, 64, 199, 200, 201)]
    out += ["a" + "-" * 62, "a" + "_" * 63, "0" * 63, "9" + "z" * 62, "platform", "Platform"]
    out += ["user-8842", "crm:4711", "sess-1f9c", "é", "e\u0301", "ü" * 200, "ü" * 201]
    out += ["\u202e", "a\u200bb", "\ufeff", "\u00a0", "\u3000", "\ue000", "\u0378", "日本"]
    out += ["\U0001f600", "a\U000e0041", "x" * 199 + "é", "\u00ad", "ok\u2028"]
    return out


@pytest.mark.parametrize(
    ("domain", "rule"), [("fabric.tenant_ident", TENANT_0051), ("fabric.ident", IDENT_0051)]
)
def test_domain_check_agrees_with_revision_0051(fabric: Fabric, domain: str, rule: str) -> None:
    conn = fabric.session(None)
    sample = values()
    differ = conn.execute(
        f"SELECT v, pg_input_is_valid(v, '{domain}'), {rule}"  # noqa: S608 - constants
        " FROM unnest(%s::text[]) AS t(v)"
        f" WHERE pg_input_is_valid(v, '{domain}') IS DISTINCT FROM {rule}",
        (sample,),
    ).fetchall()
    assert differ == []
    accepted = conn.execute(
        f"SELECT count(*) FROM unnest(%s::text[]) AS t(v) WHERE {rule}",  # noqa: S608
        (sample,),
    ).fetchone()
    assert accepted is not None and 0 < accepted[0] < len(sample)


def test_domain_checks_keep_their_names(fabric: Fabric) -> None:
    names = (
        fabric.session(None)
        .execute(
            "SELECT contypid::regtype::text, conname FROM pg_constraint WHERE contypid IN"
            " ('fabric.ident'::regtype, 'fabric.tenant_ident'::regtype) ORDER BY 1, 2"
        )
        .fetchall()
    )
    assert names == [
        ("fabric.ident", "ident_is_short_and_printable"),
        ("fabric.tenant_ident", "tenant_id_is_lowercase_slug"),
        ("fabric.tenant_ident", "tenant_id_is_not_platform"),
    ]
