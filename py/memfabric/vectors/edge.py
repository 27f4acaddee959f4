"""`EdgeVectorStore`: Qdrant Edge in process, one shard directory per physical
collection, the data directory locked to one process."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import qdrant_edge

from memfabric.vectors.filters import FilterSpec, _edge_filter
from memfabric.vectors.model import (
    _SCROLL_PAGE,
    PAYLOAD_INDEXES,
    CollectionContract,
    ContractMismatch,
    NotBound,
    VectorStoreError,
    VectorStoreLocked,
)
from memfabric.vectors.store import _StoreBase

_MANIFEST_FORMAT = "memfabric.vectors.edge/1"


class EdgeVectorStore(_StoreBase):
    """Qdrant Edge in process: `<path>/shards/<physical>/` per collection, `<path>/manifest.json`
    for aliases and contracts, `<path>/.lock` held (flock, exclusive) while open.

    One process per data directory: Qdrant allows a single open EdgeShard per directory,
    so the embedded deployment has one owner process (`memfabric serve`) and everything
    else talks to it. A second opener gets `VectorStoreLocked` at once.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _take_lock(self.root / ".lock")
        try:
            self._manifest = self._read_manifest()
        except BaseException:
            _release_lock(self._lock_fd)
            raise
        self._shards: dict[str, qdrant_edge.EdgeShard] = {}

    # manifest --------------------------------------------------------------------------
    @property
    def _manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def _read_manifest(self) -> dict[str, Any]:
        if not self._manifest_path.exists():
            return {"format": _MANIFEST_FORMAT, "collections": {}, "aliases": {}}
        data: dict[str, Any] = json.loads(self._manifest_path.read_text())
        if data.get("format") != _MANIFEST_FORMAT:
            raise VectorStoreError(f"{self._manifest_path}: unknown format {data.get('format')!r}")
        return data

    def _write_manifest(self) -> None:
        tmp = self._manifest_path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(self._manifest, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._manifest_path)
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _shard_dir(self, physical: str) -> Path:
        return self.root / "shards" / physical

    # primitives --------------------------------------------------------------------------
    def _open_or_create(self, contract: CollectionContract) -> None:
        import qdrant_edge as qe

        physical = contract.physical_name
        known = self._manifest["collections"].get(physical)
        if known is not None and CollectionContract.from_dict(known["contract"]) != contract:
            raise ContractMismatch(f"{physical} is recorded with another contract: {known}")
        if physical not in self._shards:
            config = qe.EdgeConfig(
                vectors=qe.EdgeVectorParams(size=contract.dims, distance=qe.Distance.Cosine)
            )
            directory = self._shard_dir(physical)
            try:
                if (directory / "edge_config.json").exists():
                    # config given: the engine checks the shard is compatible with it
                    shard = qe.EdgeShard.load(str(directory), config)
                else:
                    directory.mkdir(parents=True, exist_ok=True)
                    shard = qe.EdgeShard.create(str(directory), config)
            except Exception as exc:  # the engine raises a bare Exception
                raise VectorStoreError(f"cannot open {directory} as {contract}: {exc}") from exc
            self._shards[physical] = shard
        shard = self._shards[physical]
        present = set(shard.info().payload_schema)
        for name, kind in PAYLOAD_INDEXES:
            if name not in present:
                shard.update(qe.UpdateOperation.create_field_index(name, _edge_index(kind)))
        shard.flush()
        if known is None:
            self._manifest["collections"][physical] = {
                "contract": contract.to_dict(),
                "dir": f"shards/{physical}",
            }
            self._write_manifest()

    def _drop(self, physical: str) -> None:
        shard = self._shards.pop(physical, None)
        if shard is not None:
            shard.close()
        # the manifest keeps the entry: wipe() recreates the shard under the same contract
        shutil.rmtree(self._shard_dir(physical), ignore_errors=True)

    def _alias_map(self) -> dict[str, str]:
        return dict(self._manifest["aliases"])

    def _set_aliases(self, targets: Mapping[str, str]) -> None:
        for physical in targets.values():
            if physical not in self._manifest["collections"]:
                raise VectorStoreError(f"alias target {physical} does not exist")
        self._manifest["aliases"].update(targets)
        self._write_manifest()  # one atomic rename moves every alias together

    def _contract_of(self, physical: str) -> CollectionContract | None:
        known = self._manifest["collections"].get(physical)
        return None if known is None else CollectionContract.from_dict(known["contract"])

    def _physical_names(self) -> list[str]:
        return list(self._manifest["collections"])

    def _shard(self, physical: str) -> qdrant_edge.EdgeShard:
        self._check_open()
        shard = self._shards.get(physical)
        if shard is None:
            raise NotBound(f"{physical} is not open")
        return shard

    def _upsert_raw(
        self, physical: str, rows: list[tuple[str, list[float], dict[str, Any]]]
    ) -> None:
        import qdrant_edge as qe

        points = [qe.Point(pid, vec, payload) for pid, vec, payload in rows]
        self._shard(physical).update(qe.UpdateOperation.upsert_points(points))

    def _delete_raw(self, physical: str, ids: list[str]) -> None:
        import qdrant_edge as qe

        point_ids: list[qe.PointId] = list(ids)
        self._shard(physical).update(qe.UpdateOperation.delete_points(point_ids))

    def _set_payload_raw(self, physical: str, ids: list[str], payload: dict[str, Any]) -> None:
        import qdrant_edge as qe

        # by filter: set_payload by id list fails on an id the shard does not hold
        has_id = qe.HasIdCondition(set(ids))
        self._shard(physical).update(
            qe.UpdateOperation.set_payload_by_filter(qe.Filter(must=[has_id]), payload)
        )

    def _query_raw(
        self, physical: str, vector: list[float], spec: FilterSpec, n: int, exact: bool
    ) -> list[tuple[str, float]]:
        import qdrant_edge as qe

        request = qe.QueryRequest(
            limit=n,
            query=qe.Query.Nearest(vector),
            filter=_edge_filter(spec),
            with_payload=False,
            with_vector=False,
            params=qe.SearchParams(exact=exact),
        )
        return [(str(p.id), float(p.score)) for p in self._shard(physical).query(request)]

    def _count_raw(self, physical: str) -> int:
        import qdrant_edge as qe

        return self._shard(physical).count(qe.CountRequest(exact=True))

    def _scroll_raw(
        self, physical: str, offset: str | None
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        import qdrant_edge as qe

        records, nxt = self._shard(physical).scroll(
            qe.ScrollRequest(
                offset=offset, limit=_SCROLL_PAGE, with_payload=True, with_vector=False
            )
        )
        page = [(str(r.id), dict(r.payload or {})) for r in records]
        return page, None if nxt is None else str(nxt)

    def _flush_raw(self) -> None:
        for shard in self._shards.values():
            shard.flush()

    def _release_unbound(self) -> None:
        bound = {c.physical_name for c in (self._bound or {}).values()}
        for physical in [p for p in self._shards if p not in bound]:
            shard = self._shards.pop(physical)
            shard.flush()
            shard.close()

    def _close_raw(self) -> None:
        try:
            for shard in self._shards.values():
                with contextlib.suppress(Exception):
                    shard.flush()
                shard.close()
            self._shards.clear()
        finally:
            _release_lock(self._lock_fd)


def _edge_index(kind: str) -> Any:
    import qdrant_edge as qe

    if kind == "tenant":
        return qe.KeywordIndexParams(is_tenant=True)
    if kind == "keyword":
        return qe.PayloadSchemaType.Keyword
    if kind == "float":
        return qe.PayloadSchemaType.Float
    if kind == "int_range":
        return qe.IntegerIndexParams(lookup=False, range=True)
    if kind == "datetime":
        return qe.PayloadSchemaType.Datetime
    raise ValueError(kind)


def _take_lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, 64, 0).decode().strip()
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise VectorStoreLocked(
                f"{path.parent} is open in another process{f' (pid {holder})' if holder else ''}: "
                "a Qdrant Edge data directory has one owner process; query it through "
                "`memfabric serve` or stop that process first"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _release_lock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)
