"""`memfabric import FILE.jsonl --tenant T`: streams the file through
fabric_api.import_records in batches, prints a summary naming refused lines, exits 2 when
any line was refused and 1 (one line) when the database refuses the call; the same file
again forms nothing twice."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from conftest import Fabric
from memfabric import errors
from memfabric.cli import app
from memfabric.db import url_for
from memfabric.importer import import_file

FOREIGN = ("DATABASE_URL", "PGPORT", "MEMFABRIC_", "QDRANT_", "NEO4J_", "GRAPH_")


def invoke(fabric: Fabric, *args: str, login: str = "mf_committer") -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(FOREIGN)}
    env.update(DATABASE_URL=fabric.url, MEMFABRIC_COMMITTER_LOGIN=login, COLUMNS="200")
    return CliRunner().invoke(app, ["import", *args], env=env)


def line(i: int, **overrides: Any) -> str:
    el: dict[str, Any] = {
        "scope": {"subject_id": "user-8842", "visibility": "subject"},
        "content": {"text": f"chat turn {i}"},
        "confidence": 0.8,
        "validity_interval": {"valid_from": "2026-07-02T09:14:00Z"},
    }
    el.update(overrides)
    return json.dumps(el)


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "history.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_clean_file_is_imported_in_batches(fabric: Fabric, tmp_path: Path) -> None:
    path = write(tmp_path, [line(i) for i in range(25)])
    result = invoke(fabric, str(path), "--tenant", "acme", "--batch", "10", "--import-id", "chat-1")
    assert result.exit_code == 0, result.output
    assert "chat-1: 25 records in 3 batches: 25 formed, 0 refused" in result.output
    assert fabric.count("memory_records", "formation_method = 'import'") == 25
    assert fabric.count("events", "event_type = 'memory.import.completed'") == 3


@pytest.mark.parametrize("jobs", ["1", "3"])
def test_refused_lines_are_named_and_the_exit_status_is_2(
    fabric: Fabric, tmp_path: Path, jobs: str
) -> None:
    lines = [line(0), line(1, confidence=1.5), "not json", "", line(4, tier="semantic")]
    path = write(tmp_path, lines)
    result = invoke(fabric, str(path), "--tenant", "acme", "--batch", "2", "--jobs", jobs)
    assert result.exit_code == 2, result.output
    assert "4 records in 2 batches: 1 formed, 3 refused" in result.output
    assert "line 2: refused (rule): confidence must lie in [0, 1]" in result.output
    assert "line 3: refused (22023): an import element must be a JSON object" in result.output
    assert "line 5: refused (rule): an import forms only episodic records" in result.output
    assert fabric.count("memory_records") == 1


def test_the_same_file_again_forms_nothing_twice(fabric: Fabric, tmp_path: Path) -> None:
    path = write(tmp_path, [line(i) for i in range(5)])
    first = invoke(fabric, str(path), "--tenant", "acme", "--batch", "2")
    assert first.exit_code == 0, first.output
    before = fabric.counts()
    again = invoke(fabric, str(path), "--tenant", "acme", "--batch", "2")
    assert again.exit_code == 0, again.output
    assert (
        "5 records in 3 batches: 0 formed, 0 refused; 3 batches imported before "
        "(5 formed then, nothing written again)"
    ) in again.output
    assert fabric.counts() == before


def test_a_resumed_import_counts_what_it_formed_apart_from_what_was_formed_before(
    fabric: Fabric, tmp_path: Path
) -> None:
    """A run cut short after its first batch, then the whole file: the first batch is
    replayed (formed before), the other two are formed now."""
    lines = [line(i) for i in range(5)]
    first = invoke(
        fabric, str(write(tmp_path, lines[:2])), "--tenant", "acme", "--batch", "2",
        "--import-id", "resumed",
    )  # fmt: skip
    assert first.exit_code == 0, first.output
    again = invoke(
        fabric, str(write(tmp_path, lines)), "--tenant", "acme", "--batch", "2",
        "--import-id", "resumed",
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert (
        "resumed: 5 records in 3 batches: 3 formed, 0 refused; 1 batch imported before "
        "(2 formed then, nothing written again)"
    ) in again.output
    assert fabric.count("memory_records", "formation_method = 'import'") == 5


def test_a_refused_call_is_one_line_and_exit_1(fabric: Fabric, tmp_path: Path) -> None:
    path = write(tmp_path, [line(0)])
    result = invoke(fabric, str(path), "--tenant", "acme", login="mf_agent_a")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "42501" in lines[0], lines
    assert fabric.count("memory_records") == 0


@pytest.mark.parametrize(
    ("tenant", "login", "refusal", "sqlstate"),
    [
        ("acme", "mf_agent_a", errors.NotAuthorized, "42501"),  # not a committer
        ("nowhere", "mf_committer", errors.NotFound, "P0002"),  # an unknown tenant
    ],
    ids=["not a committer", "unknown tenant"],
)
def test_the_importer_raises_the_mapped_refusal(
    fabric: Fabric,
    tmp_path: Path,
    tenant: str,
    login: str,
    refusal: type[errors.FabricError],
    sqlstate: str,
) -> None:
    """A refusal of the whole call arrives as its memfabric exception, not a psycopg error."""
    path = write(tmp_path, [line(0)])
    with pytest.raises(refusal) as caught:
        import_file(url_for(fabric.url, login), tenant, path, "refused-1")
    assert caught.value.sqlstate == sqlstate
    assert fabric.count("memory_records") == 0
