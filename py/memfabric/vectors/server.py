"""`QdrantServerStore`: a Qdrant server through qdrant-client, or its local mode (tests)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

from memfabric.constants import INDEXED_TIERS
from memfabric.vectors.filters import FilterSpec, _client_filter
from memfabric.vectors.model import (
    _SCROLL_PAGE,
    PAYLOAD_INDEXES,
    CollectionContract,
    ContractMismatch,
    _norm_id,
)
from memfabric.vectors.store import VectorStore

_CONTRACT_KEY = "memfabric_contract"


class QdrantServerStore(VectorStore):
    """The same over `qdrant-client`: a server by `url`, or the client's local mode by
    `location=":memory:"` / `path=` (brute force, payload indexes ignored: tests only).

    The contract is kept in the collection's metadata; aliases are Qdrant aliases, moved
    together in one atomic alias update.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        location: str | None = None,
        path: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        timeout: int | None = None,
        client: QdrantClient | None = None,
    ) -> None:
        super().__init__()
        given = [x is not None for x in (url, location, path, client)]
        if sum(given) != 1:
            raise ValueError("give exactly one of url, location, path or client")
        self._local = location is not None or path is not None
        if client is None:
            from qdrant_client import QdrantClient

            client = QdrantClient(
                url=url,
                location=location,
                path=None if path is None else str(path),
                api_key=api_key,
                timeout=timeout,
            )
        self.client = client

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """Local mode warns that it ignores payload indexes and search params: known."""
        if not self._local:
            yield
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(Payload indexes|Local mode).*")
            yield

    def _open_or_create(self, contract: CollectionContract) -> None:
        from qdrant_client.http import models as m

        physical = contract.physical_name
        if self.client.collection_exists(physical):
            info = self.client.get_collection(physical)
            meta = (info.config.metadata or {}).get(_CONTRACT_KEY)
            params = info.config.params.vectors
            ok = (
                isinstance(params, m.VectorParams)
                and params.size == contract.dims
                and params.distance == m.Distance.COSINE
                and (meta is None or CollectionContract.from_dict(meta) == contract)
            )
            if not ok:
                raise ContractMismatch(
                    f"{physical} exists with another contract ({meta}, {params})"
                )
            present = set(info.payload_schema or {})
        else:
            self.client.create_collection(
                physical,
                vectors_config=m.VectorParams(size=contract.dims, distance=m.Distance.COSINE),
                metadata={_CONTRACT_KEY: contract.to_dict()},
            )
            present = set()
        with self._quiet():
            for name, kind in PAYLOAD_INDEXES:
                if name not in present:
                    self.client.create_payload_index(
                        physical, name, field_schema=_client_index(kind), wait=True
                    )

    def _drop(self, physical: str) -> None:
        self.client.delete_collection(physical)

    def _alias_map(self) -> dict[str, str]:
        logical = {f"mem_{t}" for t in INDEXED_TIERS}
        return {
            a.alias_name: a.collection_name
            for a in self.client.get_aliases().aliases
            if a.alias_name in logical
        }

    def _aliased(self) -> set[str]:
        # every alias of the server counts, the fabric's logical names or any other
        return {a.collection_name for a in self.client.get_aliases().aliases}

    def _set_aliases(self, targets: Mapping[str, str]) -> None:
        from qdrant_client.http import models as m

        current = self._alias_map()
        ops: list[m.CreateAliasOperation | m.DeleteAliasOperation] = []
        for alias, physical in targets.items():
            if alias in current:
                ops.append(m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=alias)))
            ops.append(
                m.CreateAliasOperation(
                    create_alias=m.CreateAlias(collection_name=physical, alias_name=alias)
                )
            )
        self.client.update_collection_aliases(ops)

    def _contract_of(self, physical: str) -> CollectionContract | None:
        if not self.client.collection_exists(physical):
            return None
        meta = (self.client.get_collection(physical).config.metadata or {}).get(_CONTRACT_KEY)
        return None if meta is None else CollectionContract.from_dict(meta)

    def _physical_names(self) -> list[str]:
        return [
            c.name
            for c in self.client.get_collections().collections
            if c.name.startswith("mem_") and "__" in c.name
        ]

    def _upsert_raw(
        self, physical: str, rows: list[tuple[str, list[float], dict[str, Any]]]
    ) -> None:
        from qdrant_client.http import models as m

        points = [m.PointStruct(id=pid, vector=vec, payload=payload) for pid, vec, payload in rows]
        self.client.upsert(physical, points=points, wait=True)

    def _delete_raw(self, physical: str, ids: list[str]) -> None:
        from qdrant_client.http import models as m

        point_ids: list[m.ExtendedPointId] = list(ids)
        self.client.delete(physical, points_selector=m.PointIdsList(points=point_ids), wait=True)

    def _set_payload_raw(self, physical: str, ids: list[str], payload: dict[str, Any]) -> None:
        from qdrant_client.http import models as m

        # by filter: set_payload by id list fails on an id the collection does not hold
        point_ids: list[m.ExtendedPointId] = list(ids)
        selector = m.Filter(must=[m.HasIdCondition(has_id=point_ids)])
        self.client.set_payload(physical, payload=payload, points=selector, wait=True)

    def _query_raw(
        self, physical: str, vector: list[float], spec: FilterSpec, n: int, exact: bool
    ) -> list[tuple[str, float]]:
        from qdrant_client.http import models as m

        with self._quiet():
            response = self.client.query_points(
                physical,
                query=vector,
                query_filter=_client_filter(spec),
                search_params=m.SearchParams(exact=exact),
                limit=n,
                with_payload=False,
                with_vectors=False,
            )
        return [(_norm_id(p.id), float(p.score)) for p in response.points]

    def _count_raw(self, physical: str) -> int:
        return self.client.count(physical, exact=True).count

    def _scroll_raw(
        self, physical: str, offset: str | None
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        records, nxt = self.client.scroll(
            physical, limit=_SCROLL_PAGE, offset=offset, with_payload=True, with_vectors=False
        )
        page = [(_norm_id(r.id), dict(r.payload or {})) for r in records]
        return page, None if nxt is None else _norm_id(nxt)

    def _flush_raw(self) -> None:
        """Writes use wait=True: acknowledged writes are already in the server's WAL."""

    def _close_raw(self) -> None:
        self.client.close()


def _client_index(kind: str) -> Any:
    from qdrant_client.http import models as m

    if kind == "tenant":
        return m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, is_tenant=True)
    if kind == "keyword":
        return m.PayloadSchemaType.KEYWORD
    if kind == "float":
        return m.PayloadSchemaType.FLOAT
    if kind == "int_range":
        return m.IntegerIndexParams(type=m.IntegerIndexType.INTEGER, lookup=False, range=True)
    if kind == "datetime":
        return m.PayloadSchemaType.DATETIME
    raise ValueError(kind)
