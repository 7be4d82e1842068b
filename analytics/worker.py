"""The embedding worker: embeds pending goal texts and scores goal pairs in the background of
``serve``, writing what it computed only through the single writer (a ``WriteFn``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import duckdb

from analytics.embeddings import BATCH_SIZE
from analytics.goals import score_pending_pairs
from analytics.types import WriteFn, direct_write

logger = logging.getLogger(__name__)

WATERMARK_MARGIN = timedelta(seconds=60)


def embed_pending(
    conn: duckdb.DuckDBPyConnection,
    batch_size: int = BATCH_SIZE,
    limit: int = 2048,
    ingested_after: datetime | None = None,
    threads: int | None = None,
    write: WriteFn | None = None,
) -> tuple[int, int]:
    """Score up to ``limit`` unscored goal pairs of stored spans; return (pairs, texts embedded).

    Embeds the pairs' task statements that have no cached vector (each distinct text once) and
    stores vectors and pair scores (``analytics.goals``) through ``write`` (default: directly on
    ``conn``, for a process that is the file's only writer). ``ingested_after`` restricts the search to
    subtask spans stored since then.
    """
    write = write or direct_write(conn)
    pairs, embedded = score_pending_pairs(conn, limit, ingested_after, batch_size, threads, write)
    if pairs:
        logger.info("scored %d goal pairs, embedded %d new texts", pairs, embedded)
    return pairs, embedded


def _lower_thread_priority() -> None:
    """Make the calling thread the last to get a CPU (Linux: nice 19 for this thread only)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError) as error:  # not Linux, or not permitted
        logger.debug("could not lower the embedding worker's priority: %s", error)


class EmbeddingWorker:
    """Background thread that embeds pending texts and scores goal pairs in batches.

    ``conn_factory`` returns a DuckDB connection (or cursor) to the serve database; it is called
    in the worker thread. The worker wakes every ``interval_s`` seconds or on ``notify()`` (at
    most one pass per ``min_gap_s``, so a busy writer notifying on every commit does not keep it
    scanning), and only looks at spans ingested since its last complete pass.

    It must not slow ingest. Commits call ``notify()``; while one came less than ``quiet_s`` ago
    ingest is active and the worker waits, except that work deferred for ``max_defer_s`` gets one
    chunk (``batch_size * 8`` pairs) done anyway, so embeddings still progress under sustained
    ingest (slowly; a detector call embeds what is still missing on demand). The thread runs at
    the lowest priority (nice 19, Linux) and, with the ONNX runtime, the model runs
    single-threaded on that thread, so it uses CPU that the decoder and writer leave idle
    (``threads`` overrides the model's thread count).

    ``conn_factory``'s connection is only read; vectors and scores are stored through ``write``
    (``serve`` passes its writer's ``execute_write_fn``). Without ``write`` the worker writes on
    its own connection, for a process that is the file's only writer.
    """

    def __init__(
        self,
        conn_factory: Callable[[], duckdb.DuckDBPyConnection],
        write: WriteFn | None = None,
        interval_s: float = 5.0,
        batch_size: int = BATCH_SIZE,
        min_gap_s: float = 1.0,
        threads: int = 1,
        low_priority: bool = True,
        quiet_s: float = 2.0,
        max_defer_s: float = 30.0,
    ) -> None:
        self._conn_factory = conn_factory
        self._write = write
        self._interval_s = interval_s
        self._batch_size = batch_size
        self._min_gap_s = min_gap_s
        self._threads = threads
        self._low_priority = low_priority
        self._quiet_s = quiet_s
        self._max_defer_s = max_defer_s
        self._last_notify = float("-inf")
        self._deferred_since: float | None = None
        self._watermark: datetime | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.embedded = 0
        self.scored_pairs = 0
        self.last_error: str | None = None
        self._notified = 0  # commits notified so far
        self._caught_up_to = -1  # notifications before the start of the last complete pass

    @property
    def caught_up(self) -> bool:
        """Whether the last pass ran to the end (nothing stored left unscored) and started after
        the last commit notification: everything committed before that is scored."""
        return self._caught_up_to == self._notified

    def start(self) -> EmbeddingWorker:
        """Start the thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="embedding-worker", daemon=True)
            self._thread.start()
        return self

    def notify(self) -> None:
        """Ask for a pass soon (after a batch of spans was committed: ingest is active)."""
        self._last_notify = time.monotonic()
        self._notified += 1
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread and wait for the current batch to finish."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _should_defer(self) -> bool:
        """True while ingest is active and the deferred work is not yet overdue."""
        now = time.monotonic()
        if now - self._last_notify >= self._quiet_s:
            return False
        if self._deferred_since is None:
            self._deferred_since = now
        return now - self._deferred_since < self._max_defer_s

    def _pass(self, conn: duckdb.DuckDBPyConnection) -> bool:
        """Score pending goal pairs among spans stored since the watermark, one chunk at a time;
        return True when it stopped early because ingest is active."""
        if self._should_defer():
            return True
        (newest,) = conn.execute("SELECT max(ingested_at) FROM spans").fetchone()
        if newest is None or newest == self._watermark:
            return False
        while not self._stopping.is_set():
            # A batch decoded before `newest` may commit after it: look back a margin.
            since = None if self._watermark is None else self._watermark - WATERMARK_MARGIN
            pairs, embedded = embed_pending(
                conn,
                self._batch_size,
                limit=self._batch_size * 8,
                ingested_after=since,
                threads=self._threads,
                write=self._write or direct_write(conn),
            )
            self._deferred_since = None
            self.embedded += embedded
            self.scored_pairs += pairs
            if pairs == 0:
                self._watermark = newest  # everything stored up to `newest` is scored
                return False
            if self._should_defer():
                return True
        return False

    def _run(self) -> None:
        if self._low_priority:
            _lower_thread_priority()
        conn = None
        while not self._stopping.is_set():
            deferred = False
            notified = self._notified
            try:
                if conn is None:
                    conn = self._conn_factory()
                deferred = self._pass(conn)
                if not deferred and not self._stopping.is_set():
                    self._caught_up_to = notified
            except Exception as error:  # keep serving; report and retry on the next pass
                self.last_error = repr(error)
                logger.exception("embedding worker pass failed")
            if deferred:  # ingest is active: look again once it may have gone quiet
                self._stopping.wait(self._quiet_s)
                continue
            self._stopping.wait(self._min_gap_s)
            self._wake.wait(self._interval_s)
            self._wake.clear()
        if conn is not None:
            try:
                conn.close()
            except duckdb.Error:
                pass
