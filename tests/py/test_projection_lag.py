"""`ops.projection_lag` (the serve metric memfabric_projection_lag): outbox events the slower
projection has not applied, read through fabric_rows, so a refusal arrives mapped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from conftest import Fabric, episode
from memfabric import errors, ops
from memfabric.db import url_for


def projector_of(fabric: Fabric, login: str) -> Any:
    return SimpleNamespace(conninfo=url_for(fabric.url, login))  # all projection_lag reads


def test_the_lag_counts_the_events_not_yet_projected(fabric: Fabric) -> None:
    projector = projector_of(fabric, "mf_projector")
    before = ops.projection_lag(projector)
    run = fabric.open_run()
    fabric.commit(fabric.propose("mf_agent_a", episode(), run)["proposal_id"])
    assert ops.projection_lag(projector) > before


def test_a_login_that_is_not_the_projector_is_refused_mapped(fabric: Fabric) -> None:
    with pytest.raises(errors.NotAuthorized) as caught:
        ops.projection_lag(projector_of(fabric, "mf_agent_a"))
    assert caught.value.sqlstate == "42501"
