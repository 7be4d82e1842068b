"""Load OTLP JSON files and JSON Lines (the Collector file exporter's format) into a store.

The same decode and insert path as the receivers; used by ``driftscope ingest --db`` and by tests
and the demo to build databases from ``sample_traces/``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from collector.decode import JSON, DecodeError, decode_payload
from collector.store import TraceIndex, insert_batches, open_store

logger = logging.getLogger(__name__)


@dataclass
class IngestResult:
    requests: int = 0
    accepted: int = 0
    stored: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


def iter_file_requests(path: str | os.PathLike) -> Iterator[tuple[str, bytes]]:
    """Yield ``(where, request_bytes)`` for each ExportTraceServiceRequest in the file.

    A file holding one JSON document is one request; otherwise each non-empty line is one
    (JSON Lines, as the OpenTelemetry Collector's file exporter writes).
    """
    path = Path(path)
    with path.open("rb") as handle:
        first = handle.readline()
        rest_start = handle.tell()
        try:
            json.loads(first)
            whole_document = False
        except ValueError:
            whole_document = True
        if whole_document:
            handle.seek(0)
            yield f"{path}", handle.read()
            return
        handle.seek(rest_start)
        if first.strip():
            yield f"{path}:1", first
        for number, line in enumerate(handle, start=2):
            if line.strip():
                yield f"{path}:{number}", line


def ingest_files(
    db_path: str | os.PathLike,
    paths: list[str | os.PathLike],
    progress: Callable[[int], None] | None = None,
    conn=None,
) -> IngestResult:
    """Decode every request in ``paths`` and store it in the database at ``db_path``.

    Each request commits on its own, so a bad line never loses the good ones before it. Raises
    ``collector.store.StoreLockedError`` when a running server holds the file.
    """
    own = conn is None
    conn = open_store(db_path) if own else conn
    result = IngestResult()
    traces = TraceIndex(conn)
    try:
        for path in paths:
            for where, payload in iter_file_requests(path):
                result.requests += 1
                try:
                    batch = decode_payload(payload, JSON)
                except DecodeError as exc:
                    result.errors.append(f"{where}: {exc}")
                    continue
                conn.execute("BEGIN TRANSACTION")
                try:
                    result.stored += insert_batches(conn, [batch], traces)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                result.accepted += batch.accepted
                result.rejected += batch.rejected
                if batch.rejected:
                    result.errors.append(f"{where}: {batch.error_message}")
                if progress is not None:
                    progress(batch.accepted + batch.rejected)
    finally:
        if own:
            conn.close()
    return result
