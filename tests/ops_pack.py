"""The operational store the tests declare (tests/py/test_operational.py and the integration
tests of serve's socket and of the store drill): the `trd` pack's regime fingerprints,
`ops_trd_regime_fingerprints`, keyed by regime version, 4-dimensional vectors."""

from __future__ import annotations

from memfabric.operational import OpsCollection, OpsRow

DIMS = 4


def regime_fingerprints(
    rows: list[OpsRow], *, model: str = "test-static", readiness: str | None = None
) -> OpsCollection:
    """The declaration, rebuilt from `rows` (read again at every rebuild)."""
    return OpsCollection(
        pack="trd",
        store="regime_fingerprints",
        domain_key=("regime_version",),
        source="trd.regime_fingerprints",
        read_source=lambda: list(rows),
        model=model,
        model_version="1",
        dims=DIMS,
        readiness=readiness,
    )
