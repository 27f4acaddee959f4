"""scripts/citus.sh refuses in one line when the Citus source it is told to build from is
absent (make citus-up CITUS_SRC=...), before it starts or builds anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_citus_up_refuses_in_one_line_when_the_source_is_absent(tmp_path: Path) -> None:
    missing = tmp_path / "citus-14.0.1.tar.gz"
    done = subprocess.run(
        [str(ROOT / "scripts" / "citus.sh"), "up"],
        env={**os.environ, "CITUS_SRC": str(missing), "CITUS_PORT": "1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert str(missing) in lines[0] and "Citus" in lines[0]
