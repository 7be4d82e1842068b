"""The single writer for a ClickHouse store: the receivers' queue drained into `otel_traces`.

The same ``IngestQueue`` as the DuckDB writer (receivers do not know which store they feed): the
thread takes what is queued (waiting briefly for the clients its last insert answered, as the
DuckDB writer does: a ClickHouse INSERT has a high fixed cost, so fewer larger ones), writes it
into `otel_traces` in the OpenTelemetry Collector clickhouse exporter's column layout and into
`spans` (``collector.clickhouse_ingest``: side by side, or through the materialized view when
`otel_traces` feeds other views), and resolves the waiting requests only after the last write
has returned. The span tree is resolved (``collector.clickhouse_resolve``) by a thread of its
own beside the inserts (``SpanResolver``): a pass starts once ``resolve_interval`` seconds went by
since the last one began and spans were inserted since, at once when ingest pauses, and at
shutdown. Its watermark is the store's `driftscope_resolve_state`, which serve's health reads to
say how far behind it is. The resolver reads the store's clock for its watermark while no insert
is under way (``inserting``), so no row stamped below the watermark is still on its way in.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from datetime import datetime

import pyarrow as pa

from collector import clickhouse_ingest
from collector.clickhouse_changes import ChangeLog
from collector.clickhouse_resolve import advance_to, resolve_spans, resolved_to, scratch_duckdb, spans_since
from collector.clickhouse_schema import qualified
from collector.clickhouse_store import ClickHouseStore, insert_otel_traces
from collector.decode import DecodedBatch
from collector.writer import IngestQueue, StoreUnavailableError

logger = logging.getLogger(__name__)


class ClickHouseWriter(threading.Thread):
    """Owns every span insert into a ClickHouse store (and the ingest counters); starts and
    stops the ``SpanResolver`` that resolves what it inserted."""

    # Waiting for the clients the last insert answered: at most this share of its time, and
    # this long (an INSERT has a fixed cost of tens of milliseconds whatever its size).
    LINGER_SHARE = 0.5
    LINGER_MAX_S = 0.05

    def __init__(
        self,
        store: ClickHouseStore,
        queue: IngestQueue,
        max_rows_per_commit: int = 50_000,
        resolve_interval: float = 2.0,
        direct: bool = True,
    ) -> None:
        super().__init__(name="driftscope-clickhouse-writer", daemon=True)
        self.store = store
        self.queue = queue
        self.max_rows_per_commit = max_rows_per_commit
        self._stop_requested = threading.Event()
        self.inserting = threading.Lock()  # held from stamping a batch until its rows are in
        self.committed_spans = 0
        self.commits = 0
        self.failed_commits = 0
        self.last_error: str | None = None
        self.healthy = True
        self.busy_seconds = 0.0
        self.insert_seconds = 0.0  # of busy_seconds, inserting spans (what ingest waits for)
        self.checkpoints = 0  # the DuckDB writer's health fields, always 0 here
        self.writes = 0
        self.failed_writes = 0
        self._answered = 0
        self._last_insert_s = 0.0
        self.direct_reason = "" if direct else "turned off"
        if direct:
            direct, self.direct_reason = clickhouse_ingest.direct_ingest_possible(store)
        self.staging = clickhouse_ingest.prepare_staging(store) if direct else None
        self.lookup = direct and store.table_exists(clickhouse_ingest.lookup_table(store.traces_table))
        if not direct:
            logger.info("inserting through the materialized views: %s", self.direct_reason)
        # direct inserts are resolved as they go in (against the stored rows of their traces);
        # the resolver then only moves the watermark past them (``SpanResolver._advance``)
        self.scratch = scratch_duckdb() if self.staging is not None else None
        # what each insert and resolve pass touched, for the findings tables (one log per process)
        self.changes = ChangeLog(store)
        self.own: collections.deque[tuple[datetime, int]] = collections.deque()  # (stamp, rows added)
        self.resolver = SpanResolver(self, resolve_interval)

    # the resolver's counters, under the names serve's health has always used
    resolve_passes = property(lambda self: self.resolver.passes)
    rewritten_spans = property(lambda self: self.resolver.rewritten)

    @property
    def resolve_interval(self) -> float:
        """Seconds from the start of one resolve pass to the next while spans keep coming."""
        return self.resolver.interval

    @resolve_interval.setter
    def resolve_interval(self, seconds: float) -> None:
        self.resolver.interval = seconds

    def start(self) -> None:
        super().start()
        self.resolver.start()

    def run(self) -> None:
        backoff = 0.05
        while True:
            linger = min(self.LINGER_MAX_S, self.LINGER_SHARE * self._last_insert_s)
            items = self.queue.take(
                self.max_rows_per_commit, timeout=0.2, expect=self._answered, linger=linger
            )
            for _, future in self.queue.take_writes():
                future.set_exception(
                    NotImplementedError(
                        "write functions run on the DuckDB store only (not on ClickHouse yet)"
                    )
                )
            if not items:
                if self._answered:
                    self.resolver.wake()  # ingest paused: resolve what came in
                self._answered = 0  # idle: the clients answered last are not sending at once
                if self._stop_requested.is_set() and len(self.queue) == 0:
                    self._drop_staging()
                    if self.scratch is not None:
                        self.scratch.close()
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
            self._last_insert_s = time.perf_counter() - started
            self._answered = len(items)
            self.busy_seconds += self._last_insert_s
            self.insert_seconds += self._last_insert_s
            backoff = 0.05
            self.healthy = True
            self.last_error = None
            self.queue.release(items)
            self.committed_spans += sum(batch.accepted for batch, _, _ in items)
            self.commits += 1
            for batch, future, _ in items:
                future.set_result(batch.accepted)

    def _insert(self, batches: list[DecodedBatch]) -> None:
        tables = [batch.table for batch in batches if batch.table.num_rows]
        if tables:
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            with self.inserting:
                if self.staging is not None:
                    stamp, added = clickhouse_ingest.insert_direct(
                        self.store,
                        table,
                        self.staging,
                        self.lookup,
                        resolver=self.scratch,
                        changes=self.changes,
                    )
                    self.own.append((stamp, added))
                else:
                    insert_otel_traces(self.store, table)
        rejected = sum(batch.rejected for batch in batches)
        if rejected:
            self.store.insert_arrow(
                "ingest_counters", pa.table({"name": ["spans_rejected"], "value": [rejected]})
            )

    def _drop_staging(self) -> None:
        if self.staging is None:
            return
        try:
            self.store.command(f"DROP TABLE IF EXISTS {qualified(self.store.database, self.staging)}")
        except Exception as exc:  # noqa: BLE001 - recreated at the next start anyway
            logger.warning("could not drop the staging table %s: %s", self.staging, exc)

    def execute_write_fn(self, fn, timeout: float | None = None):  # noqa: ARG002 - same signature as SpanWriter
        raise NotImplementedError("write functions run on the DuckDB store only (not on ClickHouse yet)")

    def submit(self, batch: DecodedBatch) -> Future:
        """Queue a decoded batch (what the receivers do); its future resolves after the insert."""
        return self.queue.submit(batch)

    def stop(self, timeout: float = 60.0) -> None:
        """Close the queue, insert what is queued, resolve it, then end both threads."""
        self.queue.close()
        self._stop_requested.set()
        self.join(timeout)
        self.resolver.stop(timeout)


class SpanResolver(threading.Thread):
    """Runs ``resolve_spans`` beside a ``ClickHouseWriter``'s inserts (chdb shares one session:
    their statements interleave; the pass's own work, in DuckDB and Arrow, runs meanwhile)."""

    def __init__(self, writer: ClickHouseWriter, interval: float) -> None:
        super().__init__(name="driftscope-clickhouse-resolver", daemon=True)
        self.writer = writer
        self.interval = interval
        self.passes = 0
        self.advances = 0  # watermark moved past resolved direct inserts, no pass needed
        self.rewritten = 0
        self.seconds_total = 0.0
        self.last_seconds = 0.0
        self.last_error: str | None = None
        self._wake = threading.Event()
        self._halt = threading.Event()

    def wake(self) -> None:
        """Start a pass now if spans came in since the last one (ingest paused)."""
        self._wake.set()

    def run(self) -> None:
        seen = 0  # the writer's committed spans the last pass started after
        last_start = 0.0
        while True:
            halting = self._halt.is_set()
            committed = self.writer.committed_spans
            due = time.monotonic() - last_start >= self.interval or self._wake.is_set() or halting
            if committed != seen and due or (halting and self.last_error is not None):
                self._wake.clear()
                last_start = time.monotonic()
                if self._advance() or self._pass():
                    seen = committed
            if halting:
                return
            self._wake.wait(0.1 if committed != seen else 0.5)

    def _advance(self) -> bool:
        """Move the watermark past the writer's direct inserts, resolved as they went in, when
        they are all the rows `spans` gained since it (no one else's rows to resolve: then a
        pass runs). Checked while no insert is under way."""
        writer = self.writer
        if writer.scratch is None:
            return False
        started = time.perf_counter()
        try:
            with writer.inserting:
                mark = resolved_to(writer.store)
                while writer.own and mark is not None and writer.own[0][0] <= mark:
                    writer.own.popleft()
                own = list(writer.own)
                rows = spans_since(writer.store, mark)
            if not own and rows == 0:
                # nothing since the mark: an earlier advance already passed this insert (it
                # counts its spans after releasing `inserting`, so the count can lag the mark)
                return True
            if not own or rows != sum(added for _, added in own):
                return False
            advance_to(writer.store, own[-1][0])
        except Exception as exc:  # noqa: BLE001 - a pass runs instead
            logger.warning("could not move the resolve watermark (a pass runs instead): %s", exc)
            return False
        self.last_seconds = time.perf_counter() - started
        self.seconds_total += self.last_seconds
        self.advances += 1
        return True

    def _pass(self) -> bool:
        started = time.perf_counter()
        try:
            self.rewritten += resolve_spans(
                self.writer.store,
                settle_seconds=0.0,
                inserting=self.writer.inserting,
                changes=self.writer.changes,
            )
        except Exception as exc:  # noqa: BLE001 - the spans are stored; the next pass tries again
            self.last_error = f"resolve: {type(exc).__name__}: {exc}"
            logger.error("resolving the span tree failed (retried on the next pass): %s", exc)
            return False
        self.last_error = None
        self.last_seconds = time.perf_counter() - started
        self.seconds_total += self.last_seconds
        self.passes += 1
        return True

    def stop(self, timeout: float = 60.0) -> None:
        """One last pass over what the writer inserted (the writer has stopped), then end."""
        self._halt.set()
        self._wake.set()
        self.join(timeout)
