"""docs/errors.md lists exactly the SQLSTATEs the fabric's SQL raises, and memfabric.errors maps
each of them to a named exception.

Every RAISE EXCEPTION in sql/, rls/ and migrations/ is read: its ERRCODE (a condition name
or a five-character code), else `RAISE SQLSTATE '<code>'`, else P0001 (PostgreSQL's default
for a RAISE without one). A re-raise (`RAISE;`) adds nothing. A call of fabric._raise_rule
raises its first argument, which must be a literal; the RAISE inside fabric._raise_rule
(`ERRCODE = p_errcode`) is that function passing its argument on, not a code of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg.errors

from memfabric import errors

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "errors.md"
SOURCES = [
    *sorted((ROOT / "sql").glob("*.sql")),
    *sorted((ROOT / "rls").glob("*.sql")),
    *sorted((ROOT / "migrations").rglob("*.py")),
    *sorted((ROOT / "migrations").rglob("*.sql")),
]
CODE = re.compile(r"^[0-9A-Z]{5}$")


def statements(text: str, python: bool = False) -> list[str]:
    """RAISE statements up to their terminating semicolon, outside string literals and
    comments. In Python files (migrations) only the SQL keyword in capitals counts, so
    Python's own `raise` is not read as SQL."""
    text = re.sub(r"(?m)(^|\s)--[^\n]*", r"\1", text)
    found = []
    for match in re.finditer(r"\bRAISE\b", text, flags=0 if python else re.IGNORECASE):
        i, quoted = match.start(), False
        while i < len(text):
            ch = text[i]
            if ch == "'":
                quoted = not quoted
            elif ch == ";" and not quoted:
                break
            i += 1
        found.append(text[match.start() : i])
    for call in re.finditer(r"\b(?:PERFORM|SELECT)\s+fabric\._raise_rule\(\s*([^,)]*)", text):
        code = call.group(1).strip()
        assert re.fullmatch(r"'[A-Za-z0-9_]+'", code), (
            f"fabric._raise_rule's errcode must be a literal so the error table can be checked: "
            f"{call.group(0)[:120]}"
        )
        found.append(f"RAISE EXCEPTION USING ERRCODE = {code}")
    return found


def sqlstate_of(raise_statement: str) -> str | None:
    body = " ".join(raise_statement.split())
    level = re.match(r"RAISE\s*(\w*)", body, flags=re.IGNORECASE)
    assert level is not None
    word = level.group(1).upper()
    if word in ("NOTICE", "WARNING", "INFO", "LOG", "DEBUG") or body.upper() == "RAISE":
        return None
    if re.search(r"\bERRCODE\s*=\s*p_errcode\b", body):  # inside fabric._raise_rule
        return None
    explicit = re.search(r"\bERRCODE\s*=\s*'([A-Za-z0-9_]+)'", body, flags=re.IGNORECASE)
    if explicit:
        name = explicit.group(1)
    else:
        assert not re.search(r"\bERRCODE\s*=", body, flags=re.IGNORECASE), (
            f"ERRCODE must be a literal so the error table can be checked: {body[:120]}"
        )
        direct = re.match(r"RAISE\s+SQLSTATE\s+'([0-9A-Z]{5})'", body, flags=re.IGNORECASE)
        name = direct.group(1) if direct else "P0001"
    if CODE.match(name):
        return name
    return str(psycopg.errors.lookup(name.upper()).sqlstate)


def raised() -> dict[str, set[str]]:
    """SQLSTATE -> the files that raise it."""
    codes: dict[str, set[str]] = {}
    for path in SOURCES:
        for stmt in statements(path.read_text(), python=path.suffix == ".py"):
            code = sqlstate_of(stmt)
            if code is not None:
                codes.setdefault(code, set()).add(str(path.relative_to(ROOT)))
    return codes


def documented() -> dict[str, str]:
    """SQLSTATE -> the exception class the table names."""
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`[0-9A-Z]{5}`", cells[0]):
            rows[cells[0].strip("`")] = cells[2].strip("`")
    return rows


def test_the_scanner_reads_every_form_of_raise() -> None:
    text = (
        "RAISE EXCEPTION USING ERRCODE = 'MF005', MESSAGE = 'a; b', HINT = 'x';\n"
        "RAISE EXCEPTION USING\n  ERRCODE = 'invalid_parameter_value', MESSAGE = 'm';\n"
        "RAISE EXCEPTION 'plain %', 1;\n"
        "RAISE SQLSTATE '22P02';\n"
        "RAISE NOTICE 'hello';\n"
        "RAISE;\n"
        "-- a comment that says raise proves nothing;\n"
        "PERFORM fabric._raise_rule('MF004', 'm', 'h');\n"
        "RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message;\n"
    )
    assert [sqlstate_of(s) for s in statements(text)] == [
        "MF005",
        "22023",
        "P0001",
        "22P02",
        None,
        None,
        None,
        "MF004",
    ]
    assert statements("x = 1\nraise SystemExit('no')\n", python=True) == []


def test_every_raised_sqlstate_is_documented_and_nothing_else() -> None:
    live, table = raised(), documented()
    missing = {code: sorted(files) for code, files in live.items() if code not in table}
    assert not missing, f"raised but not in docs/errors.md: {missing}"
    never = sorted(set(table) - set(live))
    assert not never, f"docs/errors.md lists SQLSTATEs nothing raises: {never}"
    assert "MF005" in table  # the approval refusal, named by the issue that found it missing


def test_memfabric_errors_maps_every_raised_sqlstate() -> None:
    table = documented()
    for code in raised():
        cls = errors.from_sqlstate(code)
        assert cls is not errors.FabricError, f"{code} has no exception class in memfabric.errors"
        assert cls.__name__ == table[code], (code, cls.__name__, table[code])
