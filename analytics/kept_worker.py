"""Background refresh of kept detector results in ``serve``: after ingest commits, every kept
detector and ``run_summary`` of the default scope (all time, no filters: the Overview page, the
reports and alerts read it) is brought up to date, so the next request finds it ready; the
results are stored with their data version through the single writer (``analytics.kept_store``),
so a restarted ``serve`` or an offline reader of the file starts from them.

Reads never write: a request only reads kept and stored results; this worker reads on its own
cursor and hands its writes to the writer (``write``: ``SpanWriter.execute_write_fn``).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence

import duckdb

from analytics import kept, kept_store, summary
from analytics.data_version import database_identity, one_version
from analytics.registry import run_metric
from analytics.side_effects import current_side_effect_tools
from analytics.types import Filters, Window, WriteFn
from analytics.worker import _lower_thread_priority

logger = logging.getLogger(__name__)


def default_names() -> list[str]:
    """What the worker keeps fresh: every kept detector, then run_summary (it counts them)."""
    return [*sorted(kept.KEPT), "run_summary"]


def refresh(
    conn: duckdb.DuckDBPyConnection,
    names: Sequence[str] | None = None,
    stopping: threading.Event | None = None,
) -> int:
    """Bring the default scope's result of each of ``names`` up to date; results kept at one
    version are brought to the version the pass reads first for them (``one_version``: spans
    committed meanwhile are the next pass's). Return how many failed.

    Once ``stopping`` is set, the detectors not yet refreshed are left (a stopping serve waits
    for one detector, not a whole pass)."""
    failed = 0
    with one_version():  # every result of the pass at one data version, read once
        for name in names or default_names():
            if stopping is not None and stopping.is_set():
                break
            try:
                run_metric(conn, name, Window(), Filters())
            except Exception:  # noqa: BLE001 - one detector's failure must not stop the others
                failed += 1
                logger.exception("kept-result refresh of %s failed", name)
    return failed


def store(conn: duckdb.DuckDBPyConnection, write: WriteFn) -> int:
    """Store the default scope's kept results the store does not hold at their version (one
    transaction of the writer); return how many were stored."""
    identity = database_identity(conn)
    if identity is None:
        return 0
    window, filters = Window(), Filters()
    pending = kept.unstored(identity, window, filters) + summary.unstored(identity, window, filters)
    entries, done = [], []
    scope = kept_store.scope_text(window, filters, current_side_effect_tools())
    for name, version, frame in pending:
        data = kept_store.encode(frame)  # encoded here, so the writer only copies bytes
        if data is None:
            continue
        entries.append((name, scope, version, data, len(frame)))
        done.append((name, version))
    if not entries:
        return 0
    write(kept_store.store_rows(entries, summary.result_codes()))
    for name, version in done:
        if name == "run_summary":
            summary.mark_stored(identity, window, filters, version)
        else:
            kept.mark_stored(identity, name, window, filters, version)
    return len(entries)


def settle_collector() -> None:
    """After a pass: one full collection, then every object alive moved out of the collector's
    sight (``gc.freeze``), so that later collections do not walk the kept results again. At 10M
    spans of 100,000-call runs serve holds millions of tracked objects in them (lists of span ids),
    and a full collection (35-55 ms) started by the allocations of one request landed on it: a
    restarted serve's first `lost_updates` request took 0.055-0.075 s against 0.012-0.015 warm, in
    every run. Each pass first gives the objects frozen by the one before back (``gc.unfreeze``),
    so the results it replaced, and any cycle among them, are collected then."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class KeptWorker:
    """Thread that refreshes (``refresh``) and stores (``store``) the default scope's results.

    It passes once at start (a restarted serve loads the stored results and brings them up to
    date before the first request, or computes them the first time), then after ``notify()``
    (each commit), at most once per ``min_gap_s`` and only once ingest has been quiet for
    ``quiet_s`` or the refresh is ``max_defer_s`` overdue. Results are stored after commits, at
    most every ``store_every_s`` (a stored frame is rewritten whole), and when the worker stops
    (so a serve stopped cleanly restarts warm); a serve that only reads writes nothing until it
    stops. The thread runs at the lowest priority (nice 19, Linux), so ingest and requests come
    first.
    """

    def __init__(
        self,
        conn_factory: Callable[[], duckdb.DuckDBPyConnection],
        write: WriteFn,
        names: Sequence[str] | None = None,
        min_gap_s: float = 2.0,
        quiet_s: float = 1.0,
        max_defer_s: float = 30.0,
        store_every_s: float = 30.0,
        low_priority: bool = True,
    ) -> None:
        self._conn_factory = conn_factory
        self._write = write
        self._names = list(names) if names is not None else None
        self._min_gap_s = min_gap_s
        self._quiet_s = quiet_s
        self._max_defer_s = max_defer_s
        self._store_every_s = store_every_s
        self._low_priority = low_priority
        self._last_notify = float("-inf")
        self._last_store = float("-inf")
        self._dirty = True  # start with a pass
        self._committed = False  # spans committed since the last store
        self._dirty_since = time.monotonic()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.stored = 0
        self.last_error: str | None = None
        self.idle = threading.Event()  # set while nothing is pending (tests, benchmarks)

    def start(self) -> KeptWorker:
        """Start the thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="kept-results-worker", daemon=True)
            self._thread.start()
        return self

    def notify(self) -> None:
        """New spans were committed: refresh soon."""
        self._last_notify = time.monotonic()
        self._committed = True
        if not self._dirty:
            self._dirty_since = self._last_notify
        self._dirty = True
        self.idle.clear()
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread (after the detector it is computing)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _wait_for_quiet(self) -> None:
        while not self._stopping.is_set():
            now = time.monotonic()
            if now - self._last_notify >= self._quiet_s or now - self._dirty_since >= self._max_defer_s:
                return
            self._stopping.wait(min(self._quiet_s, 0.5))

    def _run(self) -> None:
        if self._low_priority:
            _lower_thread_priority()
        conn = None
        while not self._stopping.is_set():
            try:
                if conn is None:
                    conn = self._conn_factory()
                if self._dirty:
                    self._wait_for_quiet()
                    if self._stopping.is_set():
                        break
                    self._dirty = False
                    failed = refresh(conn, self._names, self._stopping)
                    settle_collector()
                    self.passes += 1
                    self.last_error = f"{failed} detector(s) failed" if failed else None
                pending = self._pending_store(conn)
                due = self._last_store + self._store_every_s - time.monotonic()
                pending = pending and self._committed
                if pending and due <= 0:
                    self._committed = False
                    self.stored += store(conn, self._write)
                    self._last_store = time.monotonic()
                    pending = False
            except Exception as error:  # noqa: BLE001 - keep serving; report and retry
                self.last_error = repr(error)
                logger.exception("kept-result worker pass failed")
                pending, due = False, 0.0
            if self._dirty:  # spans came during the pass: the next one after the gap
                self._stopping.wait(self._min_gap_s)
                continue
            if not pending:
                self.idle.set()
            self._wake.wait(max(0.05, min(due, self._store_every_s)) if pending else self._store_every_s)
            self._wake.clear()
            if not self._dirty:
                continue
            self._stopping.wait(self._min_gap_s)
        if conn is not None:
            try:
                if self._pending_store(conn):  # what the next start would compute again
                    self.stored += store(conn, self._write)
            except Exception as error:  # noqa: BLE001 - the writer may be stopping too
                logger.warning("kept results not stored at stop: %s", error)
            try:
                conn.close()
            except duckdb.Error:
                pass

    def _pending_store(self, conn: duckdb.DuckDBPyConnection) -> bool:
        identity = database_identity(conn)
        return identity is not None and bool(
            kept.unstored(identity, Window(), Filters()) or summary.unstored(identity, Window(), Filters())
        )
