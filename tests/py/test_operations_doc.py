"""docs/operations.md cannot rot: its table of environment variables is generated from
memfabric.settings.ENVIRONMENT, every other variable the package reads is named in it, and
the extensions it lists are the ones migrate creates.

After an intended change to ENVIRONMENT regenerate the table with
    MEMFABRIC_UPDATE_DOCS=1 .venv/bin/pytest tests/py/test_operations_doc.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memfabric import db as mfdb
from memfabric.settings import ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
BEGIN = "<!-- environment: generated from memfabric.settings.ENVIRONMENT; do not edit -->"
END = "<!-- environment: end -->"
# os.environ.get("X"), os.environ["X"], typer's envvar="X"
READS = re.compile(r'(?:environ(?:\.get)?[(\[]\s*|envvar=)"([A-Z][A-Z0-9_]+)"')


def table() -> str:
    rows = [f"| `{name}` | {text} |" for name, text in ENVIRONMENT.items()]
    return "\n".join([BEGIN, "| Variable | What it sets |", "|---|---|", *rows, END])


def test_the_environment_table_is_generated_from_settings() -> None:
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    if os.environ.get("MEMFABRIC_UPDATE_DOCS") == "1":
        text = text[:start] + table() + text[end:]
        DOC.write_text(text)
    assert text[start : text.index(END) + len(END)] == table(), (
        "docs/operations.md's environment table is stale: regenerate with MEMFABRIC_UPDATE_DOCS=1"
    )


def test_every_variable_the_package_reads_is_documented() -> None:
    read = {
        name
        for path in sorted((ROOT / "py" / "memfabric").glob("*.py"))
        for name in READS.findall(path.read_text())
    }
    # every other module reads the environment through Settings (typer's envvar= aside)
    assert read <= set(ENVIRONMENT), sorted(read - set(ENVIRONMENT))
    text = DOC.read_text()
    assert sorted(name for name in read | set(ENVIRONMENT) if f"`{name}`" not in text) == []


def test_the_required_extensions_are_the_ones_migrate_creates() -> None:
    text = DOC.read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("Required extensions:")]
    assert set(re.findall(r"`([a-z_0-9]+)`", line)) == set(mfdb.EXTENSIONS)
