"""No tracked file points to a document outside the repository.

Rules are explained in the project's own words in docs/ and cited by their ids in
docs/architecture.md (`R-…`), never as sections of design notes, specifications or guides
that a reader of the repository cannot open. CHANGELOG.md is history and is not read.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The names of the planning documents that stay outside the repository, spelled so that this
# file does not cite them itself.
DOCS = ("DE" + "SIGN", "IN" + "FRA", "ST" + "YLE")
OUTSIDE = re.compile(
    "|".join(
        [
            *(rf"{d}\.md" for d in DOCS),
            rf"{DOCS[0]} §",
            *("spec §", "spec section", "spec invariant", "guide §"),
        ]
    ),
    re.IGNORECASE,
)
# The outside documents by their capitalised names ("the Spec lists", "the Guide's fields")
# and "what the spec leaves/says"; case matters here: "the spec object" in code is not one.
NAMED = re.compile(
    r"\bthe (?:Spec|Guide|Design)\b|\bwhat the spec (?:leaves|says|requires|lists)\b"
)
NOT_READ = {"CHANGELOG.md", "tests/py/test_no_outside_citations.py"}


def outside_citations(text: str) -> list[str]:
    return [m.group(0) for pattern in (OUTSIDE, NAMED) for m in pattern.finditer(text)]


def test_the_pattern_finds_every_form_of_outside_citation() -> None:
    for cited in [
        f"see {DOCS[0]}.md §7",
        f"({DOCS[0]} §8)",
        f"{DOCS[1]}.md: optimize()",
        f"Prints, never asserts ({DOCS[2]}.md)",
        "spec §4's envelope",
        "Spec section 6.2",
        "spec invariant 6",
        "the Guide §2.3 payload",
        "the Guide's required payload fields",
        "what the Spec lists",
        "what the spec leaves to the deployment",
    ]:
        assert outside_citations(cited), cited
    for own in [
        "R-LIFE-1",
        "see docs/sql.md, Recall",
        "the design of the index",
        "spec.md",
        "reused while the spec object is the same",
        "steps for k, n (= e) as in the spec",
    ]:
        assert not outside_citations(own), own


def test_no_tracked_file_cites_a_document_outside_the_repository() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    found = []
    for name in listed:
        path = ROOT / name
        if not name or name in NOT_READ or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (e.g. the release fixture)
            continue
        for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            if outside_citations(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not found, "cite docs/ or a rule id of docs/architecture.md instead:\n" + "\n".join(
        found
    )
