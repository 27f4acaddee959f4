"""Operational stores: point identity, names, the mandatory scope filter, idempotent upserts,
readiness flags, the per-login collection allowlist (Qdrant Edge) and the collection-scoped
credential (Qdrant server), on a real Qdrant Edge shard."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memfabric.operational import (
    OPS_NS,
    CollectionNotAllowed,
    EdgeOperationalStore,
    GraphQuery,
    NotReady,
    OperationalError,
    OperationalStore,
    OpsBroker,
    OpsCollection,
    OpsRow,
    ScopeRequired,
    ServerOperationalStore,
    collection_jwt,
    collection_name,
    drill,
    ops_dir,
    point_id,
)
from memfabric.operational import declared as declared_from
from ops_pack import regime_fingerprints

# uuid5(NAMESPACE_URL, "https://synedrix.io/ns/operational-point-id/v1") and points under it,
# computed once with Python's uuid module from the joined names shown
VECTORS = [
    (("acme", "", ["v3"]), "dfe5395d-e837-5aba-a45f-a17018dd54bb"),  # tenant-level
    (("acme", None, ["v3"]), "dfe5395d-e837-5aba-a45f-a17018dd54bb"),  # None is ''
    (("acme", "bi-eu", ["v3"]), "6e6a402c-3f4a-5b62-9c74-16daa57c2621"),
    (("globex", "bi-eu", ["v3"]), "cad5581e-5078-5cd6-a52c-2b4c6941f44d"),
    (("acme", "bi-eu", [42, "caf\u00e9"]), "f76bb68d-4202-51cb-83ce-d48147f86449"),
    (("acme", "bi-eu", [42, "cafe\u0301"]), "f76bb68d-4202-51cb-83ce-d48147f86449"),  # NFC
]


def test_the_namespace_is_the_guides() -> None:
    assert str(OPS_NS) == "8222658f-3633-5d3a-8903-20ae4fa34c44"


@pytest.mark.parametrize(("args", "expected"), VECTORS)
def test_point_ids_match_the_vectors(
    args: tuple[str, str | None, list[str | int]], expected: str
) -> None:
    tenant, instance, key = args
    assert point_id(tenant, instance, key) == expected
    assert point_id(tenant, instance, key) != str(uuid.UUID(int=0))


@pytest.mark.parametrize(
    ("tenant", "instance", "key", "error"),
    [
        ("acme", "", ["v\x1f3"], OperationalError),  # the separator inside a component
        ("acme", "bi\x1feu", ["v3"], OperationalError),
        ("acme", "", [True], OperationalError),  # a boolean is not an integer
        ("acme", "", [1.5], OperationalError),
        ("acme", "", [], OperationalError),
        ("", "", ["v3"], ScopeRequired),
    ],
)
def test_a_bad_component_is_refused(
    tenant: str, instance: str, key: list[object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        point_id(tenant, instance, key)  # type: ignore[arg-type]


def test_integers_are_decimal_without_leading_zeros() -> None:
    assert point_id("acme", "", [7]) == str(uuid.uuid5(OPS_NS, "acme\x1f\x1f7"))
    assert point_id("acme", "", [7]) != point_id("acme", "", ["007"])


def test_collection_names_are_ops_pack_store_never_mem() -> None:
    assert collection_name("trd", "regime_fingerprints") == "ops_trd_regime_fingerprints"
    for pack, store in [("trd_x", "a"), ("Trd", "a"), ("trd", "A"), ("", "a"), ("trd", "")]:
        with pytest.raises(OperationalError):
            collection_name(pack, store)


SOURCE: list[OpsRow] = [
    OpsRow("acme", "bi-eu", ("v1",), [1, 0, 0, 0], {"label": "calm"}),
    OpsRow("acme", "bi-eu", ("v2",), [0.9, 0.1, 0, 0], {"label": "trend"}),
    OpsRow("acme", "bi-us", ("v1",), [1, 0, 0, 0], {"label": "us calm"}),
    OpsRow("globex", "bi-eu", ("v1",), [1, 0, 0, 0], {"label": "globex calm"}),
]


def declared(rows: list[OpsRow]) -> OpsCollection:
    return regime_fingerprints(rows, readiness="scenario_vectors_ready:{regime_version}")


@pytest.fixture(params=["edge", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OperationalStore]:
    """The collection on Qdrant Edge, or through qdrant-client (its local mode: the same
    client calls a server receives)."""
    s: OperationalStore
    if request.param == "edge":
        s = EdgeOperationalStore(tmp_path / "ops", declared(SOURCE))
    else:
        server = ServerOperationalStore(declared(SOURCE), tmp_path / "flags", location=":memory:")
        server.ensure()
        s = server
    s.rebuild()
    yield s
    s.close()


def test_every_query_is_scoped_to_its_tenant_and_instance(store: OperationalStore) -> None:
    hits = store.search("acme", "bi-eu", [1, 0, 0, 0])
    assert [h[2]["label"] for h in hits] == ["calm", "trend"]
    assert {h[2]["tenant_id"] for h in hits} == {"acme"}
    assert [h[2]["label"] for h in store.search("globex", "bi-eu", [1, 0, 0, 0])] == ["globex calm"]
    assert store.search("initech", "bi-eu", [1, 0, 0, 0]) == []


@pytest.mark.parametrize(("tenant", "instance"), [(None, "bi-eu"), ("", "bi-eu"), ("acme", None)])
def test_a_query_or_write_without_its_scope_fails_closed(
    store: OperationalStore, tenant: str | None, instance: str | None
) -> None:
    with pytest.raises(ScopeRequired):
        store.search(tenant, instance, [1, 0, 0, 0])
    before = store.count()
    with pytest.raises(ScopeRequired):
        store.upsert([OpsRow(tenant or "", instance, ("v9",), [0, 1, 0, 0])])  # type: ignore[arg-type]
    assert store.count() == before


def test_upserts_are_idempotent_on_the_point_id(store: OperationalStore) -> None:
    before = store.count()
    ids = store.upsert([OpsRow("acme", "bi-eu", ("v1",), [0, 0, 1, 0], {"label": "calm 2"})])
    assert ids == [point_id("acme", "bi-eu", ["v1"])]
    assert store.count() == before
    (top,) = store.search("acme", "bi-eu", [0, 0, 1, 0], 1)
    assert top[0] == ids[0] and top[2]["label"] == "calm 2"


def test_readiness_flags_are_cleared_during_a_rebuild_and_restored_after(
    tmp_path: Path,
) -> None:
    seen: list[set[str]] = []
    holder: dict[str, EdgeOperationalStore] = {}

    def source() -> list[OpsRow]:
        if "store" in holder:
            seen.append(holder["store"].flags())
        return list(SOURCE)

    collection = declared(SOURCE)
    collection = OpsCollection(**{**collection.__dict__, "read_source": source})
    s = EdgeOperationalStore(tmp_path / "ops", collection)
    holder["store"] = s
    s.rebuild()
    assert s.flags() == {"scenario_vectors_ready:v1", "scenario_vectors_ready:v2"}
    s.search("acme", "bi-eu", [1, 0, 0, 0], ready="scenario_vectors_ready:v2")
    # a rebuild that dies after its wipe leaves the flags cleared: gated reads refuse
    s.clear_ready(s.flags())
    s.wipe()
    with pytest.raises(NotReady):
        s.search("acme", "bi-eu", [1, 0, 0, 0], ready="scenario_vectors_ready:v2")
    s.rebuild()
    assert "scenario_vectors_ready:v2" in s.flags()


def test_the_drill_rebuilds_from_the_declared_source_with_identical_answers(
    store: OperationalStore,
) -> None:
    # a point the source does not hold (written around the source) is gone after the drill
    store.upsert([OpsRow("acme", "bi-eu", ("stray",), [0, 1, 0, 0])])
    (result,) = drill([store])
    assert result["collection"] == "ops_trd_regime_fingerprints"
    assert result["source"] == "trd.regime_fingerprints"
    assert result["points"] == len(SOURCE)
    assert result["identical"] is False  # the stray point answered before, not after
    (again,) = drill([store])
    assert again["identical"] is True and again["points"] == len(SOURCE)


def test_the_broker_serves_a_login_only_its_allowlisted_collections(
    store: OperationalStore,
) -> None:
    name = store.collection.name
    broker = OpsBroker([store], {"wf_trd_writer": {name: "rw"}, "trd_reader": {name: "r"}})
    assert broker.search("trd_reader", name, "acme", "bi-eu", [1, 0, 0, 0])
    before = store.count()
    with pytest.raises(CollectionNotAllowed):
        broker.upsert("trd_reader", name, [OpsRow("acme", "bi-eu", ("v7",), [0, 1, 0, 0])])
    with pytest.raises(CollectionNotAllowed):
        broker.search("stranger", name, "acme", "bi-eu", [1, 0, 0, 0])
    assert store.count() == before
    broker.upsert("wf_trd_writer", name, [OpsRow("acme", "bi-eu", ("v7",), [0, 1, 0, 0])])
    assert store.count() == before + 1
    with pytest.raises(OperationalError):  # one login, an ops and a mem_* collection
        OpsBroker([store], {"agent": {name: "r", "mem_semantic": "r"}})


def b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_a_server_credential_is_scoped_to_its_collections() -> None:
    token = collection_jwt("server-key", {"ops_trd_regime_fingerprints": "rw"}, ttl_s=60, now=1000)
    header, body, signature = token.split(".")
    assert json.loads(b64decode(header)) == {"alg": "HS256", "typ": "JWT"}
    assert json.loads(b64decode(body)) == {
        "exp": 1060,
        "access": [{"collection": "ops_trd_regime_fingerprints", "access": "rw"}],
    }
    expected = hmac.new(b"server-key", f"{header}.{body}".encode(), hashlib.sha256).digest()
    assert b64decode(signature) == expected
    with pytest.raises(OperationalError):
        collection_jwt("k", {"ops_trd_regime_fingerprints": "r", "mem_semantic": "r"})
    with pytest.raises(OperationalError):
        collection_jwt("k", {"ops_trd_regime_fingerprints": "m"})


# Qdrant's JWT RBAC (qdrant.tech/documentation/guides/security, "Granular access control
# with JWT"): HS256 over the server's API key; `exp` in seconds since the epoch; `access` a
# list of {"collection": name, "access": "r" | "rw"} (a bare "r" or "m" would be global).
QDRANT_CLAIMS = {"exp", "access"}
QDRANT_COLLECTION_ACCESS = {"r", "rw"}
API_KEY = "a-qdrant-server-api-key-of-32-bytes-or-more"


def qdrant_claims(token: str, api_key: str) -> dict[str, object]:
    """The token's claims, verified the way a Qdrant server does, by an independent decoder:
    PyJWT when installed, else HMAC-SHA256 by hand."""
    try:
        import jwt
    except ImportError:  # pragma: no cover - PyJWT comes with the mcp package
        header, body, signature = token.split(".")
        if json.loads(b64decode(header)).get("alg") != "HS256":
            raise ValueError("not HS256") from None
        mac = hmac.new(api_key.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(mac, b64decode(signature)):
            raise ValueError("bad signature") from None
        claims: dict[str, object] = json.loads(b64decode(body))
        if float(claims["exp"]) <= time.time():  # type: ignore[arg-type]
            raise ValueError("expired") from None
        return claims
    decoded: dict[str, object] = jwt.decode(
        token, api_key, algorithms=["HS256"], options={"require": ["exp"]}
    )
    return decoded


def test_a_minted_credential_is_a_jwt_a_qdrant_server_accepts() -> None:
    grants = {"ops_trd_regime_fingerprints": "rw", "ops_trd_scenarios": "r"}
    token = collection_jwt(API_KEY, grants, ttl_s=600)
    claims = qdrant_claims(token, API_KEY)
    assert set(claims) == QDRANT_CLAIMS
    assert isinstance(claims["exp"], int) and claims["exp"] > time.time()
    access = claims["access"]
    assert isinstance(access, list)
    for entry in access:
        assert set(entry) == {"collection", "access"}
        assert entry["access"] in QDRANT_COLLECTION_ACCESS
    assert {e["collection"]: e["access"] for e in access} == grants
    with pytest.raises(Exception, match=r"(?i)signature"):
        qdrant_claims(token, "another-" + API_KEY)  # signed with the server's key, nothing else
    expired = collection_jwt(API_KEY, grants, ttl_s=60, now=time.time() - 120)
    with pytest.raises(Exception, match=r"(?i)expired"):
        qdrant_claims(expired, API_KEY)


def test_graph_queries_must_scope_and_only_read() -> None:
    with pytest.raises(OperationalError):
        GraphQuery("MATCH (r:TrdRegime) RETURN r.name")  # no tenant filter
    with pytest.raises(OperationalError):
        GraphQuery("MATCH (r:TrdRegime {tenant_id: $tenant_id}) DETACH DELETE r")
    with pytest.raises(OperationalError):
        GraphQuery("MATCH (r:TrdRegime {tenant_id: $tenant_id}) RETURN r", params=("tenant_id",))


declared_collection = declared(SOURCE)
PACK = [declared_collection]


def test_packs_declare_their_collections_through_the_environment(tmp_path: Path) -> None:
    env = {"MEMFABRIC_OPS_PACKS": f"{__name__}:PACK", "MEMFABRIC_OPS_DIR": str(tmp_path)}
    assert [c.name for c in declared_from(env)] == ["ops_trd_regime_fingerprints"]
    assert ops_dir(env) == tmp_path
    assert declared_from({}) == []
    with pytest.raises(OperationalError):
        declared_from({"MEMFABRIC_OPS_PACKS": "no_attribute_here"})
    with pytest.raises(OperationalError):  # one collection declared twice
        declared_from({"MEMFABRIC_OPS_PACKS": f"{__name__}:PACK,{__name__}:PACK"})
    assert declared_collection.name == "ops_trd_regime_fingerprints"


def test_a_changed_embedding_contract_is_never_searched_until_rebuilt(tmp_path: Path) -> None:
    with EdgeOperationalStore(tmp_path / "ops", declared(SOURCE)) as s:
        s.rebuild()
        assert s.count() == len(SOURCE) and not s.contract_changed
    with EdgeOperationalStore(tmp_path / "ops", declared(SOURCE)) as s:  # same contract
        assert s.count() == len(SOURCE) and not s.contract_changed
    upgraded = OpsCollection(**{**declared(SOURCE).__dict__, "model_version": "2"})
    with EdgeOperationalStore(tmp_path / "ops", upgraded) as s:
        assert s.contract_changed and s.count() == 0 and s.flags() == set()
        with pytest.raises(NotReady):
            s.search("acme", "bi-eu", [1, 0, 0, 0], ready="scenario_vectors_ready:v1")
        s.rebuild()
        assert s.count() == len(SOURCE) and "scenario_vectors_ready:v1" in s.flags()
