"""tests/budget.txt names tests that exist: `make test-budget` times them, and a renamed
test would drop out of it silently if pytest were not told (it is: an unknown node id is an
error), so a rename fails here first, naming the line to change."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_line_of_the_budget_names_a_test_module_or_function() -> None:
    lines = [
        ln.strip()
        for ln in (ROOT / "tests" / "budget.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert len(lines) > 300
    missing = []
    for line in lines:
        path, _, name = line.partition("::")
        module = ROOT / path
        defined = rf"^(async )?def {re.escape(name)}\("
        exists = path.startswith("tests/") and module.is_file()
        if not exists or (name and not re.search(defined, module.read_text(), re.M)):
            missing.append(line)
    assert not missing, f"tests/budget.txt names tests that do not exist: {missing}"
    assert len(set(lines)) == len(lines), "a line of tests/budget.txt is there twice"
