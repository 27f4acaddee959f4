"""Bulk import: stream a JSON-lines file through `fabric_api.import_records` in batches.

Every rule is the database's; this module only reads lines, cuts batches and adds up the
answers. Each batch is one call (one transaction) under its own import id,
`<import id>-b<batch number>`, so running the same file again with the same --batch
replays every batch (nothing is formed twice) and a run cut short resumes where it stopped.
A line that is not JSON is sent as null, which the database refuses for its position like
any other malformed element. With `jobs` > 1, that many batches are in flight at once, each
on its own connection (batches are independent transactions); answers are added up in file
order. A failed batch stops the import (a refusal of the whole call, e.g. an unknown tenant
or a login that is not a committer, raises its `memfabric.errors.FabricError`); the batches
already committed stay, and running the file again replays them.
"""

from __future__ import annotations

import hashlib
import json
import queue
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from memfabric.call import fabric_call

IMPORT = "fabric_api.import_records"


@dataclass(frozen=True)
class Refusal:
    """One refused line of the file (1-based), with the database's SQLSTATE and reason."""

    line: int
    sqlstate: str | None
    reason: str


@dataclass
class ImportSummary:
    """What an import formed and refused, over all its batches. `formed` counts the records
    this run formed; a batch imported before (`replayed`) writes nothing again, and the
    records it formed then are counted in `formed_before`."""

    import_id: str
    records: int = 0
    formed: int = 0
    refused: int = 0
    batches: int = 0
    replayed: int = 0
    formed_before: int = 0
    refusals: list[Refusal] = field(default_factory=list)


def default_import_id(path: Path) -> str:
    """An import id derived from the file's bytes: the same file is the same import."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return f"file-{digest.hexdigest()[:32]}"


def read_batches(path: Path, size: int) -> Iterator[tuple[list[int], list[Any], int]]:
    """(line numbers, elements, bytes read so far) per batch; blank lines are skipped."""
    lines: list[int] = []
    elements: list[Any] = []
    done = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            done += len(raw)
            if not raw.strip():
                continue
            try:
                elements.append(json.loads(raw))
            except ValueError:
                elements.append(None)
            lines.append(number)
            if len(elements) == size:
                yield lines, elements, done
                lines, elements = [], []
    if elements:
        yield lines, elements, done


def import_file(
    conninfo: str,
    tenant: str,
    path: Path,
    import_id: str,
    batch: int = 1000,
    progress: Callable[[int, ImportSummary], None] | None = None,
    keep_refusals: int = 1000,
    jobs: int = 1,
) -> ImportSummary:
    """Import the file batch by batch on `jobs` connections (each batch its own call and
    transaction); `progress(bytes read, summary)` after each batch, in file order."""
    summary = ImportSummary(import_id)
    conns = [psycopg.connect(conninfo, autocommit=True) for _ in range(max(jobs, 1))]
    free: queue.SimpleQueue[psycopg.Connection[Any]] = queue.SimpleQueue()
    for conn in conns:
        free.put(conn)

    def send(number: int, elements: list[Any]) -> dict[str, Any]:
        conn = free.get()
        try:
            answer: dict[str, Any] = fabric_call(
                conn, IMPORT, tenant, f"{import_id}-b{number:06d}", Jsonb(elements)
            )
        finally:
            free.put(conn)
        return answer

    def add(lines: list[int], done: int, answer: dict[str, Any]) -> None:
        summary.batches += 1
        summary.records += int(answer["records"])
        if answer["replayed"]:
            summary.replayed += 1
            summary.formed_before += int(answer["formed"])
        else:
            summary.formed += int(answer["formed"])
        summary.refused += int(answer["refused"])
        for r in answer["refusals"]:
            if len(summary.refusals) < keep_refusals:
                summary.refusals.append(
                    Refusal(lines[int(r["position"])], r["sqlstate"], str(r["reason"]))
                )
        if progress is not None:
            progress(done, summary)

    try:
        with ThreadPoolExecutor(max_workers=len(conns)) as pool:
            pending: deque[tuple[list[int], int, Future[dict[str, Any]]]] = deque()
            for number, (lines, elements, done) in enumerate(read_batches(path, batch), 1):
                pending.append((lines, done, pool.submit(send, number, elements)))
                while len(pending) > len(conns) or (pending and pending[0][2].done()):
                    first_lines, first_done, future = pending.popleft()
                    add(first_lines, first_done, future.result())
            while pending:
                first_lines, first_done, future = pending.popleft()
                add(first_lines, first_done, future.result())
    finally:
        for conn in conns:
            conn.close()
    return summary
