"""docs/architecture.md cannot drift from the code.

Every rule (`### \\`R-…\\``) names the files and database objects that enforce it and the tests
that try to break it. Each named file and test exists; each object exists in a freshly
migrated database and is defined in one of the files its rule names; every rule id cited
anywhere in the repository is defined on the page.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
RULE_ID = re.compile(r"\bR-[A-Z]+-\d+\b")
HEADING = re.compile(r"^### `(R-[A-Z]+-\d+)` \S")
TICKED = re.compile(r"`([^`]+)`")
KINDS = ("constraint", "trigger", "function", "policy", "table", "index", "domain", "role")


@dataclass
class Rule:
    rule_id: str
    files: list[str] = field(default_factory=list)
    objects: list[tuple[str, str]] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)


def rules(text: str) -> list[Rule]:
    """The rules of the page: the backticked names of each rule's Enforced and Tested items
    (an item runs until the next item or heading)."""
    found: list[Rule] = []
    section = ""
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading:
            found.append(Rule(heading.group(1)))
            section = ""
            continue
        if line.startswith("#"):
            section = ""
            continue
        if line.startswith("- **Enforced:**"):
            section = "enforced"
        elif line.startswith("- **Tested:**"):
            section = "tested"
        elif not line.startswith("  "):
            section = ""
        if not section or not found:
            continue
        for name in TICKED.findall(line):
            kind, _, rest = name.partition(" ")
            if section == "tested":
                found[-1].tests.append(name)
            elif kind in (*KINDS, "setting") and rest:
                found[-1].objects.append((kind, rest))
            else:
                found[-1].files.append(name)
    return found


RULES = rules(PAGE.read_text())


def test_the_page_defines_rules_each_with_files_objects_and_tests() -> None:
    ids = [r.rule_id for r in RULES]
    assert len(ids) >= 30, ids
    assert len(ids) == len(set(ids)), "a rule id is defined twice"
    for rule in RULES:
        assert rule.files, f"{rule.rule_id} names no file"
        assert rule.objects, f"{rule.rule_id} names no database object"
        assert rule.tests, f"{rule.rule_id} names no test"


def test_the_parser_reads_kinds_files_and_tests() -> None:
    sample = (
        "### `R-X-1` A rule\nText with `fabric.ignored`.\n"
        "- **Enforced:** `sql/a.sql`: `trigger fabric.t._1`,\n"
        "  `function fabric.f`\n"
        "- **Tested:** `tests/sql/test_a.py::test_b`\n"
        "Prose `function fabric.not_an_item`.\n"
    )
    [rule] = rules(sample)
    assert rule.files == ["sql/a.sql"]
    assert rule.objects == [("trigger", "fabric.t._1"), ("function", "fabric.f")]
    assert rule.tests == ["tests/sql/test_a.py::test_b"]


def test_every_named_file_and_test_exists() -> None:
    missing = []
    for rule in RULES:
        for name in rule.files:
            if not (ROOT / name).is_file():
                missing.append(f"{rule.rule_id}: file {name}")
        for name in rule.tests:
            path, _, test = name.partition("::")
            source = ROOT / path
            defined = source.is_file() and re.search(
                rf"^(async )?def {re.escape(test)}\(", source.read_text(), re.M
            )
            if not test or not defined:
                missing.append(f"{rule.rule_id}: test {name}")
    assert not missing, missing


def test_every_object_is_defined_in_a_file_of_its_rule() -> None:
    missing = []
    for rule in RULES:
        sources = "\n".join((ROOT / f).read_text() for f in rule.files if (ROOT / f).is_file())
        for kind, name in rule.objects:
            short = name.split("=")[0].rsplit(".", 1)[-1]
            if not re.search(rf"(?<![\w]){re.escape(short)}(?![\w])", sources):
                missing.append(f"{rule.rule_id}: {kind} {name}")
    assert not missing, missing


CATALOG = {
    "constraint": "SELECT 1 FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
    "JOIN pg_namespace n ON n.oid = t.relnamespace "
    "WHERE n.nspname = %s AND t.relname = %s AND c.conname = %s",
    "trigger": "SELECT 1 FROM pg_trigger g JOIN pg_class t ON t.oid = g.tgrelid "
    "JOIN pg_namespace n ON n.oid = t.relnamespace "
    "WHERE NOT g.tgisinternal AND n.nspname = %s AND t.relname = %s AND g.tgname = %s",
    "policy": "SELECT 1 FROM pg_policy p JOIN pg_class t ON t.oid = p.polrelid "
    "JOIN pg_namespace n ON n.oid = t.relnamespace "
    "WHERE n.nspname = %s AND t.relname = %s AND p.polname = %s",
    "function": "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname = %s AND p.proname = %s",
    "table": "SELECT 1 FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace "
    "WHERE n.nspname = %s AND t.relname = %s AND t.relkind IN ('r', 'p')",
    "index": "SELECT 1 FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace "
    "WHERE n.nspname = %s AND t.relname = %s AND t.relkind IN ('i', 'I')",
    "domain": "SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
    "WHERE n.nspname = %s AND t.typname = %s AND t.typtype = 'd'",
    "role": "SELECT 1 FROM pg_roles WHERE rolname = %s",
    "setting": "SELECT 1 WHERE pg_catalog.current_setting(%s) = %s",
}
ARITY = {"constraint": 3, "trigger": 3, "policy": 3, "role": 1}


def _args(kind: str, name: str) -> tuple[str, ...]:
    if kind == "setting":
        setting, _, value = name.partition("=")
        return (setting, value)
    parts = tuple(name.split("."))
    assert len(parts) == ARITY.get(kind, 2), f"{kind} {name}: expected {ARITY.get(kind, 2)} parts"
    return parts


def test_every_named_object_exists_in_a_migrated_database(
    db_conn: psycopg.Connection[Any],
) -> None:
    missing = [
        f"{rule.rule_id}: {kind} {name}"
        for rule in RULES
        for kind, name in rule.objects
        if db_conn.execute(CATALOG[kind], _args(kind, name)).fetchone() is None  # type: ignore[arg-type]
    ]
    assert not missing, missing


def test_a_missing_object_is_noticed(db_conn: psycopg.Connection[Any]) -> None:
    for kind, name in [
        ("constraint", "fabric.memory_records.no_such_constraint"),
        ("trigger", "fabric.memory_records._999_none"),
        ("function", "fabric._no_such_function"),
        ("setting", "log_min_error_statement=debug5"),
    ]:
        assert db_conn.execute(CATALOG[kind], _args(kind, name)).fetchone() is None  # type: ignore[arg-type]


def tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    suffixes = {".py", ".sql", ".md", ".sh", ".toml", ".ini", ".mako"}
    return [
        ROOT / p
        for p in out.stdout.split("\0")
        if p and (Path(p).suffix in suffixes or Path(p).name == "Makefile")
    ]


def test_every_cited_rule_id_is_defined() -> None:
    defined = {r.rule_id for r in RULES}
    undefined = sorted(
        f"{path.relative_to(ROOT)}: {rule_id}"
        for path in tracked_text_files()
        if path.is_file()
        for rule_id in set(RULE_ID.findall(path.read_text(errors="replace")))
        if rule_id not in defined and rule_id != "R-X-1"
    )
    assert not undefined, undefined


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.rule_id)
def test_each_rule_has_a_sentence(rule: Rule) -> None:
    text = PAGE.read_text()
    block = text.split(f"### `{rule.rule_id}`", 1)[1].split("\n- **Enforced:**", 1)[0]
    assert len(block.split()) >= 8, f"{rule.rule_id} does not restate its rule"
