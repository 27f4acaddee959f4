"""docs/quickstart.md's first example runs as written: Memory() from DATABASE_URL on a
migrated database, provisioning its identities, and prints the recalled memory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import Fabric

DOC = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_quickstart_recalls_the_memory_it_added(
    fabric: Fabric,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = BLOCK.findall(DOC.read_text())[0]
    assert len([line for line in first.splitlines() if line.strip()]) <= 5
    monkeypatch.setenv("DATABASE_URL", fabric.url)
    # the deployment names its own broker (none here): text recall, no broker started
    monkeypatch.setenv("MEMFABRIC_SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.delenv("QDRANT_URL", raising=False)
    namespace: dict[str, object] = {"__name__": "quickstart_md"}
    exec(compile(first, str(DOC), "exec"), namespace)  # noqa: S102 - the doc's own code
    namespace["m"].close()  # type: ignore[attr-defined]
    assert capsys.readouterr().out.strip() == "I live in Rotterdam and I prefer tea"
