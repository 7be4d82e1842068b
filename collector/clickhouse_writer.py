"""The single writer for a ClickHouse store: the receivers' queue drained into `otel_traces`.

The same ``IngestQueue`` as the DuckDB writer (receivers do not know which store they feed): the
thread takes what is queued, inserts it into `otel_traces` in the OpenTelemetry Collector
clickhouse exporter's column layout (one INSERT per group, the materialized view filling `spans`
in it), and resolves the waiting requests only after the INSERT has returned. The span tree is
resolved (``collector.clickhouse_resolve``) when ingest pauses and at least every
``resolve_interval`` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

import pyarrow as pa

from collector.clickhouse_resolve import resolve_spans
from collector.clickhouse_store import ClickHouseStore, insert_otel_traces
from collector.decode import DecodedBatch
from collector.writer import IngestQueue, StoreUnavailableError

logger = logging.getLogger(__name__)


class ClickHouseWriter(threading.Thread):
    """Owns every write to a ClickHouse store: span inserts, the resolve pass, ingest counters."""

    def __init__(
        self,
        store: ClickHouseStore,
        queue: IngestQueue,
        max_rows_per_commit: int = 50_000,
        resolve_interval: float = 5.0,
    ) -> None:
        super().__init__(name="driftscope-clickhouse-writer", daemon=True)
        self.store = store
        self.queue = queue
        self.max_rows_per_commit = max_rows_per_commit
        self.resolve_interval = resolve_interval
        self._stop_requested = threading.Event()
        self.committed_spans = 0
        self.commits = 0
        self.failed_commits = 0
        self.resolve_passes = 0
        self.rewritten_spans = 0
        self.last_error: str | None = None
        self.healthy = True
        self.busy_seconds = 0.0
        self.checkpoints = 0  # the DuckDB writer's health fields, always 0 here
        self.writes = 0
        self.failed_writes = 0

    def run(self) -> None:
        backoff = 0.05
        unresolved = False
        last_resolve = time.monotonic()
        while True:
            items = self.queue.take(self.max_rows_per_commit, timeout=0.2)
            for _, future in self.queue.take_writes():
                future.set_exception(
                    NotImplementedError(
                        "write functions run on the DuckDB store only (not on ClickHouse yet)"
                    )
                )
            if not items:
                if unresolved and (
                    self._stop_requested.is_set() or time.monotonic() - last_resolve >= self.resolve_interval
                ):
                    unresolved = not self._resolve(settle_seconds=0.0)
                    last_resolve = time.monotonic()
                if self._stop_requested.is_set() and len(self.queue) == 0:
                    return
                continue
            started = time.perf_counter()
            try:
                self._insert([batch for batch, _, _ in items])
            except Exception as exc:  # noqa: BLE001 - every waiting request must be answered
                self.failed_commits += 1
                self.healthy = False
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.error(
                    "ClickHouse insert failed, %d request(s) answered 503: %s", len(items), self.last_error
                )
                error = StoreUnavailableError(f"the span store could not insert: {self.last_error}")
                for _, future, _ in items:
                    future.set_exception(error)
                self.queue.release(items)
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self.busy_seconds += time.perf_counter() - started
            backoff = 0.05
            self.healthy = True
            self.last_error = None
            self.queue.release(items)
            stored = sum(batch.accepted for batch, _, _ in items)
            self.committed_spans += stored
            self.commits += 1
            unresolved = unresolved or stored > 0
            for batch, future, _ in items:
                future.set_result(batch.accepted)
            if unresolved and time.monotonic() - last_resolve >= self.resolve_interval:
                # this writer is the only one inserting: nothing is in flight behind it
                unresolved = not self._resolve(settle_seconds=0.0)
                last_resolve = time.monotonic()

    def _insert(self, batches: list[DecodedBatch]) -> None:
        tables = [batch.table for batch in batches if batch.table.num_rows]
        if tables:
            insert_otel_traces(self.store, tables[0] if len(tables) == 1 else pa.concat_tables(tables))
        rejected = sum(batch.rejected for batch in batches)
        if rejected:
            self.store.insert_arrow(
                "ingest_counters", pa.table({"name": ["spans_rejected"], "value": [rejected]})
            )

    def _resolve(self, settle_seconds: float) -> bool:
        started = time.perf_counter()
        try:
            self.rewritten_spans += resolve_spans(self.store, settle_seconds=settle_seconds)
        except Exception as exc:  # noqa: BLE001 - the spans are stored; the next pass tries again
            self.last_error = f"resolve: {type(exc).__name__}: {exc}"
            logger.error("resolving the span tree failed (retried on the next pass): %s", exc)
            return False
        self.busy_seconds += time.perf_counter() - started
        self.resolve_passes += 1
        return True

    def execute_write_fn(self, fn, timeout: float | None = None):  # noqa: ARG002 - same signature as SpanWriter
        raise NotImplementedError("write functions run on the DuckDB store only (not on ClickHouse yet)")

    def submit(self, batch: DecodedBatch) -> Future:
        """Queue a decoded batch (what the receivers do); its future resolves after the insert."""
        return self.queue.submit(batch)

    def stop(self, timeout: float = 60.0) -> None:
        """Close the queue, insert what is queued, resolve it, then end the thread."""
        self.queue.close()
        self._stop_requested.set()
        self.join(timeout)
