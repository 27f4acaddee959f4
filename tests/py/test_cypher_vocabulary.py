"""Every Cypher statement lives in memfabric.graph, and uses only the clauses, keywords and
functions docs/projections.md lists (all in Neo4j 5 Community and the ArcadeDB subset):
a statement with anything else fails here until the list, and the review of it, says so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "py" / "memfabric"
GRAPH = PACKAGE / "graph.py"
DOC = ROOT / "docs" / "projections.md"

CYPHER = re.compile(
    r"\b(MATCH|MERGE)\s*\(|\bUNWIND\s+\$|\bDETACH\s+DELETE\b|\bCREATE\s+(CONSTRAINT|INDEX)\b"
)


def strings(path: Path) -> list[str]:
    """The module's string constants but its docstrings (which may name Cypher)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def statements(path: Path) -> list[str]:
    return [s for s in strings(path) if CYPHER.search(s) or s.strip() == "RETURN 1 AS n"]


def vocabulary(statement: str) -> tuple[set[str], set[str]]:
    """(keywords, functions) of a statement: upper-case words outside labels, relationship
    types, property names, parameters and string literals; and names called."""
    text = re.sub(r"'[^']*'", "''", statement)  # string literals
    # labels and relationship types (`m:Memory`, `[:FORMED]`; a map's `key: value` keeps
    # its space, so its value stays an expression)
    text = re.sub(r":[A-Za-z_][A-Za-z0-9_]*", ":", text)
    text = re.sub(r"[$.][A-Za-z_][A-Za-z0-9_]*", "", text)  # parameters, properties
    functions = set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\(", text))
    keywords = set(re.findall(r"\b[A-Z][A-Z_]+\b", text))
    return keywords, functions


def documented() -> tuple[set[str], set[str]]:
    section = DOC.read_text().split("### Cypher used", 1)[1].split("\n#", 1)[0]
    items = dict(re.findall(r"^- ([^:\n]+):(.*?)(?=^- |\Z)", section, re.M | re.S))
    keywords = set(re.findall(r"`([^`]+)`", items["Clauses and keywords"]))
    functions = {f.rstrip("()") for f in re.findall(r"`([^`]+)`", items["Functions"])}
    return {w for k in keywords for w in k.split()}, functions


def outside_the_list(statement: str) -> set[str]:
    keywords, functions = vocabulary(statement)
    allowed_keywords, allowed_functions = documented()
    return (keywords - allowed_keywords) | {f"{f}()" for f in functions - allowed_functions}


def test_every_cypher_statement_is_in_the_graph_module() -> None:
    assert len(statements(GRAPH)) >= 20
    elsewhere = {
        str(path.relative_to(ROOT)): found
        for path in PACKAGE.rglob("*.py")
        if path != GRAPH and (found := statements(path))
    }
    assert elsewhere == {}


def test_every_statement_uses_only_the_documented_cypher() -> None:
    problems = {s.strip(): bad for s in statements(GRAPH) if (bad := outside_the_list(s))}
    assert problems == {}


@pytest.mark.parametrize(
    ("statement", "flagged"),
    [
        ("MATCH (n:Memory) CALL apoc.path.expand(n) YIELD path RETURN path", {"CALL", "YIELD"}),
        ("UNWIND $xs AS x FOREACH (y IN x | SET y.a = 1)", {"FOREACH"}),
        ("MATCH (m:Memory) RETURN gds_similarity(m) AS s", {"gds_similarity()"}),
        ("MATCH p = shortestPath((a)-[*]-(b)) RETURN p", {"shortestPath()"}),
        ("CREATE FULLTEXT INDEX names FOR (e:Entity) ON EACH [e.name]", {"FULLTEXT", "EACH"}),
    ],
)
def test_the_check_flags_what_the_list_does_not_name(statement: str, flagged: set[str]) -> None:
    assert flagged <= outside_the_list(statement)


def test_the_list_names_only_what_the_module_uses() -> None:
    used_keywords: set[str] = set()
    used_functions: set[str] = set()
    for statement in statements(GRAPH):
        keywords, functions = vocabulary(statement)
        used_keywords |= keywords
        used_functions |= functions
    allowed_keywords, allowed_functions = documented()
    assert (allowed_keywords - used_keywords, allowed_functions - used_functions) == (set(), set())
