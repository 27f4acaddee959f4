"""Content hashing: the Python twin of ``fabric.content_hash`` (sql/020_content_hash.sql).

``content_hash(obj)`` is ``"sha256:"`` followed by the lowercase hex SHA-256 of the
RFC 8785 (JCS) canonical JSON form of ``obj``, as produced by the ``rfc8785`` package.
The database computes the same value from the content as stored in jsonb; both sides are
checked against ``tests/vectors/content_hash.json``.

Both sides accept exactly the same content:

* a number must be exactly the shortest round-trip decimal of an IEEE double. Python
  floats always are (NaN and infinities excepted); an ``int`` beyond +-(2**53 - 1) is
  accepted only when it equals the shortest decimal of the double nearest to it (2**53
  and 10**20 are, 2**53 + 1 and 2**60 are not), and is then hashed as that double;
* a string or key must not contain U+0000 (jsonb cannot store it) nor lone surrogates.

Content that breaks these rules raises :class:`ContentError`, whose message never
includes the content itself.

``json.loads`` silently rounds a JSON number such as ``0.1234567890123456789`` to a
double, where the database refuses it: to parse JSON *text* with the database's rule,
use :func:`loads`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import rfc8785

__all__ = ["ContentError", "canonical", "content_hash", "loads"]

_SAFE_INT_MAX = 2**53 - 1
_NUMBER_MESSAGE = "content number is not exactly representable as an IEEE double"


class ContentError(ValueError):
    """Content that has no canonical form (the database refuses it too)."""


def _float_of_int(value: int) -> float:
    """The double whose shortest decimal is exactly ``value``, else ContentError."""
    try:
        as_float = float(value)
    except OverflowError:
        raise ContentError(_NUMBER_MESSAGE) from None
    if Decimal(repr(as_float)) != value:
        raise ContentError(_NUMBER_MESSAGE)
    return as_float


def _check_str(value: str) -> None:
    if "\x00" in value:
        raise ContentError("content string contains U+0000, which jsonb cannot store")


def _normalize(value: Any) -> Any:
    """Validate ``value`` and return it in the form ``rfc8785.dumps`` hashes."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        _check_str(value)
        return value
    if isinstance(value, int):
        if -_SAFE_INT_MAX <= value <= _SAFE_INT_MAX:
            return value
        return _float_of_int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ContentError("content number is NaN or infinite")
        return value
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ContentError("content object keys must be strings")
            _check_str(key)
            result[key] = _normalize(item)
        return result
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [_normalize(item) for item in value]
    raise ContentError(f"content value of type {type(value).__name__} is not JSON")


def canonical(obj: Any) -> bytes:
    """RFC 8785 canonical JSON bytes (UTF-8) of ``obj``: what :func:`content_hash` hashes."""
    normalized = _normalize(obj)
    try:
        result: bytes = rfc8785.dumps(normalized)
    except rfc8785.CanonicalizationError:
        # e.g. a lone surrogate; rfc8785's own messages may quote the content
        raise ContentError("content has no RFC 8785 canonical form") from None
    return result


def content_hash(obj: Any) -> str:
    """``"sha256:"`` + lowercase hex SHA-256 of :func:`canonical`; equals fabric.content_hash."""
    return "sha256:" + hashlib.sha256(canonical(obj)).hexdigest()


def _parse_number(text: str) -> int | float:
    exact = Decimal(text)
    if exact == 0:
        return 0
    as_float = float(exact)
    if not math.isfinite(as_float) or Decimal(repr(as_float)) != exact:
        raise ContentError(_NUMBER_MESSAGE)
    if exact == exact.to_integral_value() and abs(exact) <= _SAFE_INT_MAX:
        return int(exact)
    return as_float


def _refuse_constant(_name: str) -> Any:
    raise ContentError("content number is NaN or infinite")


def loads(text: str | bytes) -> Any:
    """Parse JSON text, refusing the numbers that the database refuses.

    Unlike ``json.loads``, a number that is not exactly the shortest round-trip decimal of
    an IEEE double (``9007199254740993``, ``0.1234567890123456789``, ``1e400``) raises
    :class:`ContentError` instead of being rounded, and ``NaN``/``Infinity`` are refused.
    """
    return json.loads(
        text,
        parse_float=_parse_number,
        parse_int=_parse_number,
        parse_constant=_refuse_constant,
    )
