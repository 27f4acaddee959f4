"""Where local state lives by default (memfabric.settings.local_state): `.local/` of the
checkout the package runs from; installed from a wheel, the user's state directory
(tests/integration/test_wheel.py runs that case from a real installation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfabric import settings
from memfabric.settings import Settings


def test_in_a_checkout_local_state_is_its_dot_local() -> None:
    s = Settings.from_env({"XDG_STATE_HOME": "/elsewhere"})
    local = settings.ROOT / ".local"
    assert (s.socket, s.vector_dir, s.redis_dir) == (
        local / "run" / "memfabric.sock",
        local / "qdrant",
        local / "redis",
    )


def test_outside_a_checkout_it_is_the_users_state_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(settings, "ROOT", tmp_path / "lib" / "python3.11")  # site-packages' parent
    assert settings.local_state({"XDG_STATE_HOME": "/srv/state"}) == Path("/srv/state/memfabric")
    assert settings.local_state({}) == Path.home() / ".local" / "state" / "memfabric"
    s = Settings.from_env({"XDG_STATE_HOME": str(tmp_path), "MEMFABRIC_SOCKET": "/run/mf.sock"})
    assert s.socket == Path("/run/mf.sock")  # a variable still wins
    assert s.vector_dir == tmp_path / "memfabric" / "qdrant"
