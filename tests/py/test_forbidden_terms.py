"""The umbrella term is "memory fabric": no doc, message, comment or name calls it a memory
layer, data layer, storage layer or database layer (each word pair, spaced, hyphenated or
joined, any case). The fabric is a control plane over several stores, not a layer of a
stack, and one word keeps the docs, the errors and the code saying the same thing.

Every tracked text file is read (docs, README, SQL messages and comments, Python, the n8n
workflow), except this test, which has to spell the words, and CHANGELOG.md (history).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = re.compile(r"\b(memory|data|storage|database)[\s_-]*layers?\b", re.IGNORECASE)
NOT_READ = {"CHANGELOG.md", "tests/py/test_forbidden_terms.py"}


def forbidden_terms(text: str) -> list[str]:
    return [m.group(0) for m in FORBIDDEN.finditer(text)]


def test_the_pattern_finds_every_spelling() -> None:
    for said in [
        "the memory layer",
        "a Data Layer",
        "storage-layer",
        "DATABASE_LAYER",
        "database\nlayer",
        "the storage layers",
        "memorylayer",
    ]:
        assert forbidden_terms(said), said
    for fine in [
        "the memory fabric",
        "a layer of tools",
        "data, layered",
        "the database's layout",
        "metadata layer",  # a word that only ends in 'data'
    ]:
        assert not forbidden_terms(fine), fine


def test_no_tracked_file_uses_a_forbidden_term() -> None:
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
        text = data.decode(errors="replace")
        for m in FORBIDDEN.finditer(text):
            number = text.count("\n", 0, m.start()) + 1
            found.append(f"{name}:{number}: {m.group(0)!r}")
    assert not found, "say 'memory fabric' (or name the store):\n" + "\n".join(found)
