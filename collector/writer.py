"""The single writer: a byte-bounded ingest queue and the thread that group-commits it.

Receivers call ``IngestQueue.submit`` and wait on the returned future; the ``SpanWriter`` thread
drains whatever is queued, inserts it in one transaction, commits, and only then resolves the
futures. A request is therefore acknowledged only after its spans are durable.

Every other write of the process (retention deletes, embeddings, goal scores, thresholds) is a
function handed to the same thread with ``SpanWriter.execute_write_fn`` (datasette's
``execute_write_fn``): it runs on the writer's connection in a transaction of its own, between
span commits, so no second cursor ever writes the file.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import duckdb

from collector.decode import DecodedBatch
from collector.store import TraceIndex, bump_counter, insert_batches

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The ingest queue is at its byte limit; the client should retry later (429)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"ingest queue full, retry after {retry_after}s")
        self.retry_after = retry_after


class StoreUnavailableError(RuntimeError):
    """A commit failed (disk full, file not writable); nothing of the request was stored (503)."""


class ShuttingDownError(RuntimeError):
    """The server is stopping and accepts no new spans (503)."""


WriteFn = Callable[[duckdb.DuckDBPyConnection], Any]


class IngestQueue:
    """A FIFO of (batch, future) bounded by total payload bytes, not by item count."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: deque[tuple[DecodedBatch, Future, int]] = deque()
        self._writes: deque[tuple[WriteFn, Future]] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._closed = False
        self._overloaded_since: float | None = None
        self._lingering = False  # take() is waiting for expected requests, holding what it took

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def submit(self, batch: DecodedBatch) -> Future:
        """Queue a batch; return a future resolved with the rows stored, after commit."""
        size = max(batch.payload_bytes, 1)
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise ShuttingDownError("driftscope is shutting down and accepts no new spans")
            # One oversized request still gets in when the queue is empty, so a body under the
            # body limit but over the queue limit is never refused forever.
            # (While the writer lingers for more requests, what it took is still queued bytes.)
            if (self._items or self._lingering) and self._bytes + size > self.max_bytes:
                raise QueueFullError(retry_after=self._retry_after())
            if self._bytes + size <= self.max_bytes // 2:
                self._overloaded_since = None  # the queue has drained: the overload is over
            self._items.append((batch, future, size))
            self._bytes += size
            self._cond.notify()
        return future

    def submit_write(self, fn: WriteFn) -> Future:
        """Queue a write function; return a future resolved with its result after its commit."""
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise ShuttingDownError("driftscope is shutting down and accepts no new writes")
            self._writes.append((fn, future))
            self._cond.notify()
        return future

    @property
    def pending_writes(self) -> int:
        return len(self._writes)

    def take_writes(self) -> list[tuple[WriteFn, Future]]:
        """Take every queued write function (the writer runs them after the span batches)."""
        with self._cond:
            jobs = list(self._writes)
            self._writes.clear()
            return jobs

    def _retry_after(self) -> int:
        """Seconds a refused client should wait: 1 at first, growing with how long the overload
        has lasted (up to 30). The OTLP SDK exporters honour Retry-After but give up after six
        tries, so a fixed short delay would turn a long overload into lost spans at the client."""
        now = time.monotonic()
        if self._overloaded_since is None:
            self._overloaded_since = now
        return int(min(30, max(1, math.ceil(now - self._overloaded_since))))

    def take(
        self, max_rows: int, timeout: float, expect: int = 0, linger: float = 0.0
    ) -> list[tuple[DecodedBatch, Future, int]]:
        """Block up to ``timeout`` for work, then take queued items up to ``max_rows`` rows.

        With ``expect``, keep taking for up to ``linger`` seconds until ``expect`` items more than
        were queued at the call have arrived (the writer passes the requests its last commit
        answered: their clients usually send again at once), so a few busy connections share
        one commit instead of taking turns.
        """
        with self._cond:
            wanted = len(self._items) + expect  # counted before waiting: arrivals are the expected
            if not self._items and not self._writes:
                self._cond.wait(timeout)
            taken: list[tuple[DecodedBatch, Future, int]] = []
            rows = 0
            deadline = time.monotonic() + linger
            while True:
                while self._items and (not taken or rows + self._items[0][0].accepted <= max_rows):
                    item = self._items.popleft()
                    taken.append(item)
                    rows += item[0].accepted
                if not taken or len(taken) >= wanted or self._items or self._closed:
                    return taken  # nothing to wait with, all expected, full, or stopping
                left = deadline - time.monotonic()
                if left <= 0:
                    return taken
                self._lingering = True
                try:
                    self._cond.wait(left)
                finally:
                    self._lingering = False

    def release(self, items: list[tuple[DecodedBatch, Future, int]]) -> None:
        """Give back the bytes of items that were committed or failed."""
        with self._cond:
            self._bytes -= sum(size for _, _, size in items)

    def close(self) -> None:
        """Refuse new submissions; queued items are still drained by the writer."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class SpanWriter(threading.Thread):
    """The one thread that owns the write connection and group-commits queued batches."""

    # A commit costs a large fixed part (its statements, the WAL's sync) besides its rows, so a
    # writer kept busy by a few connections gathers the requests its last commit answered
    # before committing again: at most this share of that commit's time, and this long.
    LINGER_SHARE = 0.25
    LINGER_MAX_S = 0.02

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        queue: IngestQueue,
        max_rows_per_commit: int = 50_000,
        on_commit: Callable[[int], None] | None = None,
        fault: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="driftscope-writer", daemon=True)
        self.conn = conn
        self.queue = queue
        self.max_rows_per_commit = max_rows_per_commit
        self.on_commit = on_commit
        self._fault = fault
        self._stop_requested = threading.Event()
        self.committed_spans = 0
        self.commits = 0
        self.failed_commits = 0
        self.last_error: str | None = None
        self.healthy = True
        self.checkpoints = 0
        # the idle checkpoints' time (not part of busy_seconds), and the longest: ingest and the
        # materializer's writes wait for one
        self.checkpoint_seconds = 0.0
        self.longest_checkpoint_seconds = 0.0
        self.busy_seconds = 0.0  # time spent in successful commits (insert + COMMIT) and writes
        self.span_commit_seconds = 0.0  # of it, committing spans (what ingest waits for)
        # Of the busy time: in COMMIT statements (span commits and writes), and in the COMMITs
        # that took the WAL past the checkpoint threshold, so checkpointed inside them (seen as
        # the WAL file shrinking across the COMMIT: DuckDB does not say).
        self.commit_seconds = 0.0
        self.auto_checkpoints = 0
        self.auto_checkpoint_seconds = 0.0
        self._wal = _wal_path(conn)
        self.writes = 0  # write functions committed (execute_write_fn)
        self.longest_write: tuple[float, str] = (0.0, "")  # (seconds, the function's name)
        self.failed_writes = 0
        self.traces = TraceIndex(conn)
        self._answered = 0  # requests the last span commit answered (0 once the queue idled)
        self._last_commit_s = 0.0
        # (monotonic end, seconds) of the recent span commits: span_commit_share
        self._recent_commits: deque[tuple[float, float]] = deque(maxlen=4096)

    def span_commit_share(self, window_s: float) -> float:
        """The share of the last ``window_s`` seconds this writer spent committing spans (what
        ingest waits for; not the other writes it runs): near 1 when ingest saturates it."""
        since = time.monotonic() - window_s
        recent = tuple(self._recent_commits)  # one copy under the GIL while the writer appends
        return sum(seconds for end, seconds in recent if end >= since) / window_s

    def run(self) -> None:
        backoff = 0.05
        dirty = False  # committed since the last checkpoint
        idle_since = time.monotonic()
        while True:
            linger = min(self.LINGER_MAX_S, self.LINGER_SHARE * self._last_commit_s)
            items = self.queue.take(
                self.max_rows_per_commit, timeout=0.2, expect=self._answered, linger=linger
            )
            jobs = self.queue.take_writes()
            if jobs:
                dirty = True
                self._run_writes(jobs)
                idle_since = time.monotonic()
            if not items:
                self._answered = 0  # idle: the clients answered last are not sending at once
                if self._stop_requested.is_set() and len(self.queue) == 0 and not self.queue.pending_writes:
                    return
                if dirty and time.monotonic() - idle_since >= self.IDLE_CHECKPOINT_S:
                    dirty = not self._checkpoint()
                continue
            dirty = True
            started = time.perf_counter()
            try:
                stored = self._commit([batch for batch, _, _ in items])
            except Exception as exc:  # noqa: BLE001 - any store failure must be answered, not crash the thread
                self.failed_commits += 1
                self.healthy = False
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.error("commit failed, %d request(s) answered 503: %s", len(items), self.last_error)
                error = StoreUnavailableError(f"the span store could not commit: {self.last_error}")
                for _, future, _ in items:
                    future.set_exception(error)
                self.queue.release(items)
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self._last_commit_s = time.perf_counter() - started
            self._answered = len(items)
            self.busy_seconds += self._last_commit_s
            self.span_commit_seconds += self._last_commit_s
            self._recent_commits.append((time.monotonic(), self._last_commit_s))
            backoff = 0.05
            self.healthy = True
            self.last_error = None
            self.queue.release(items)
            self.committed_spans += stored
            self.commits += 1
            for batch, future, _ in items:
                future.set_result(batch.accepted)
            if self.on_commit is not None and stored:
                self.on_commit(stored)
            idle_since = time.monotonic()

    def execute_write_fn(self, fn: WriteFn, timeout: float | None = None) -> Any:
        """Run ``fn(conn)`` on the writer's connection, in a transaction of its own, and return
        its result once committed (its exception is raised here, after a rollback).

        Called from any thread but the writer's own; blocks until the writer has run it.
        """
        if threading.current_thread() is self:
            raise RuntimeError("execute_write_fn called from the writer thread itself")
        return self.queue.submit_write(fn).result(timeout)

    def _run_writes(self, jobs: list[tuple[WriteFn, Future]]) -> None:
        for fn, future in jobs:
            if not future.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            try:
                result = self._transaction(lambda conn, fn=fn: fn(conn))
            except BaseException as exc:  # noqa: BLE001 - the caller gets it; the writer goes on
                self.failed_writes += 1
                future.set_exception(exc)
                continue
            spent = time.perf_counter() - started
            self.busy_seconds += spent
            self.writes += 1
            if spent > self.longest_write[0]:  # what ingest waited for longest, and whose it was
                self.longest_write = (spent, _write_name(fn))
            future.set_result(result)

    # Seconds without work after which committed data is checkpointed into the file, so readers
    # scan compressed row groups and a restart replays little WAL.
    IDLE_CHECKPOINT_S = 1.0

    def _checkpoint(self) -> bool:
        started = time.perf_counter()
        try:
            self.conn.execute("CHECKPOINT")
        except duckdb.Error as exc:  # e.g. a reader's transaction is open; try again next idle
            logger.debug("idle checkpoint skipped: %s", exc)
            return False
        spent = time.perf_counter() - started
        self.checkpoints += 1
        self.checkpoint_seconds += spent
        self.longest_checkpoint_seconds = max(self.longest_checkpoint_seconds, spent)
        return True

    def _commit(self, batches: list[DecodedBatch]) -> int:
        def insert(conn: duckdb.DuckDBPyConnection) -> int:
            if self._fault is not None:
                self._fault()
            stored = insert_batches(conn, batches, self.traces)
            rejected = sum(b.rejected for b in batches)
            if rejected:
                bump_counter(conn, "spans_rejected", rejected)
            return stored

        return self._transaction(insert)

    def _transaction(self, fn: WriteFn) -> Any:
        conn = self.conn
        conn.execute("BEGIN TRANSACTION")
        try:
            result = fn(conn)
            wal_before = _size(self._wal)
            started = time.perf_counter()
            conn.execute("COMMIT")
            took = time.perf_counter() - started
            self.commit_seconds += took
            if wal_before and _size(self._wal) < wal_before:
                self.auto_checkpoints += 1
                self.auto_checkpoint_seconds += took
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except duckdb.Error:
                pass
            raise
        return result

    def stop(self, timeout: float = 30.0) -> None:
        """Close the queue, drain and commit what is queued, then end the thread."""
        self.queue.close()
        self._stop_requested.set()
        self.join(timeout)


def _wal_path(conn: duckdb.DuckDBPyConnection) -> str | None:
    """The write-ahead log of ``conn``'s database file (None in memory)."""
    try:
        rows = conn.execute(
            "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
        ).fetchall()
    except duckdb.Error:
        return None
    return f"{rows[0][0]}.wal" if rows and rows[0][0] else None


def _size(path: str | None) -> int:
    if path is None:
        return 0
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _write_name(fn: WriteFn) -> str:
    """A write function's name for health: its qualified name (a lambda names where it was
    made), or a partial's function's."""
    target = getattr(fn, "func", fn)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__name__)}"
