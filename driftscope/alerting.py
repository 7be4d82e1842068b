"""Alert delivery in ``serve``: the evaluator thread and the receivers it notifies.

Every ``interval`` the ``AlertService`` thread evaluates the rules (``analytics.alerts``) on a
read cursor, hands the state changes to the single writer, and queues what each receiver has
not acknowledged yet. Each receiver has a bounded queue and a delivery thread that posts with
exponential backoff and, after a success, records the acknowledgement through the writer. The
store is the outbox: a notification dropped from a full queue, or lost with a restart, is still
unacknowledged there and is queued again at the next evaluation; an acknowledged one is never
sent again (except that Alertmanager gets firing alerts re-sent, as Prometheus does, and dedups).

With ``serve --store`` (ClickHouse) the detectors read the store, one read turn per rule, and the
alert state lives in an ``AlertStateFile`` (a DuckDB file beside the serve) with its own writer.

Receivers and message formats: ``driftscope.alert_receivers``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import duckdb

from analytics import alerts as alert_state
from analytics.alert_rules import AlertRule, RuleError, load_rules
from analytics.read import data_version
from analytics.types import direct_write
from collector.migrations_runner import apply_migrations
from driftscope.alert_receivers import (
    AlertmanagerReceiver,
    Receiver,
    SlackReceiver,
    WebhookReceiver,
    iso,
    notification_from_row,
)
from driftscope.settings import ConfigError

logger = logging.getLogger(__name__)

QUEUE_SIZE = 1000
BATCH = 64
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# Evaluations wait until no span was committed for this long (ingest first) ...
QUIET_S = 1.0
# ... but never longer than this (or two intervals) under sustained ingest.
MIN_MAX_DEFER_S = 60.0


@dataclass
class ReceiverStatus:
    """Delivery counters of one receiver, for /api/v1/health and the dashboard."""

    sent: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    dropped: int = 0
    last_error: str | None = None
    last_error_at: str | None = None
    last_success_at: str | None = None
    queued: int = 0


@dataclass
class _Channel:
    receiver: Receiver
    queue: queue.Queue = field(default_factory=lambda: queue.Queue(maxsize=QUEUE_SIZE))
    status: ReceiverStatus = field(default_factory=ReceiverStatus)
    # (alert_id, state, due generation) queued or in flight: not queued twice.
    inflight: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None


class AlertStateFile:
    """Alert state in a DuckDB file of its own, for a store that keeps only spans (``serve
    --store``: the detectors read ClickHouse, the episodes and acknowledgements live here).

    The file holds analytics' tables (its migrations; ``alerts`` and ``alert_deliveries`` are the
    ones used) and nothing else. ``write`` is its single writer: it runs each write function in
    a transaction of its own, one at a time, like the span writer's ``execute_write_fn``;
    ``cursor`` reads. One serve per store evaluates alerts (DuckDB lets one process open the file).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self._conn = duckdb.connect(self.path)
        apply_migrations(self._conn, "analytics")
        self._lock = threading.Lock()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A read cursor on the state file."""
        return self._conn.cursor()

    def write(self, fn: Callable[[duckdb.DuckDBPyConnection], object]) -> object:
        """Run ``fn(conn)`` in a transaction of its own and return its result once committed."""
        with self._lock:
            conn = self._conn.cursor()
            try:
                return direct_write(conn)(fn)
            finally:
                conn.close()

    def close(self) -> None:
        """Checkpoint and close the file (after the ``AlertService`` using it has stopped)."""
        with self._lock:
            try:
                self._conn.execute("CHECKPOINT")
            except duckdb.Error as exc:  # the WAL replays on the next open anyway
                logger.warning("alert state checkpoint failed (the WAL will replay): %s", exc)
            self._conn.close()


def build_receivers(
    alertmanager_url: str | None,
    webhook_url: str | None,
    webhook_secret: str | None,
    slack_url: str | None,
    dashboard_url: str = "",
) -> list[Receiver]:
    """The receivers the settings configure (none configured: an empty list)."""
    receivers: list[Receiver] = []
    if alertmanager_url:
        receivers.append(AlertmanagerReceiver(alertmanager_url))
    if webhook_url:
        receivers.append(WebhookReceiver(webhook_url, webhook_secret, external_url=dashboard_url))
    if slack_url:
        receivers.append(SlackReceiver(slack_url))
    return receivers


def load_alert_rules(config) -> list[AlertRule]:
    """The alert rules in force for serve's ``config``: its rules file, else the default rules
    (one per finding detector). Rules are evaluated whenever serve runs, so the dashboard's Alerts
    page shows their state; only delivery needs a receiver. A bad rules file is a ``ConfigError``
    naming the file and line."""
    try:
        return load_rules(config.alert_rules)
    except RuleError as exc:
        raise ConfigError(f"{exc} (check it with `driftscope alerts check FILE`)") from None


def start_alerting(config, rules, cursor, write, **store_options):
    """The alert evaluator and its receivers (those configured: none keeps the state for the
    dashboard only), started for serve's ``config``. ``cursor``, ``write`` and the
    ``store_options`` (``state_cursor``, ``commits``, ``turn``, ``wait_for_tables``) as
    ``AlertService`` takes them."""
    receivers = build_receivers(
        config.alertmanager_url,
        config.alert_webhook_url,
        config.alert_webhook_secret,
        config.alert_slack_url,
        config.alert_dashboard_url,
    )
    service = AlertService(
        cursor,
        write,
        rules,
        receivers,
        config.alert_interval,
        config.alert_dashboard_url,
        **store_options,
    )
    service.start()
    logger.info(
        "alerting: %d rule(s) every %gs, receivers: %s",
        len(rules),
        config.alert_interval,
        ", ".join(r.name for r in receivers) or "none (state kept for the dashboard)",
    )
    return service


class AlertService:
    """The alert evaluator and delivery threads of ``serve``.

    ``cursor`` returns a read cursor on the store; ``write`` is the single writer's
    ``execute_write_fn``. Evaluation reads on its own low-priority thread and writes only small
    state rows through the writer, so ingest is not held up. ``state_cursor`` (default: the
    store's ``cursor``) reads the alert tables when they live elsewhere than the spans
    (``serve --store``: an ``AlertStateFile`` beside the serve, whose ``write`` is then ``write``).
    ``commits`` is a commit counter the evaluator polls where the writer does not call
    ``notify()`` (the ClickHouse writer): a change counts as a commit. ``turn``, when given, is
    held around each read of ``cursor``'s store (one per rule), so other reads go in between.
    """

    def __init__(
        self,
        cursor: Callable,
        write: Callable,
        rules: list[AlertRule],
        receivers: list[Receiver],
        interval_s: float = 30.0,
        dashboard_url: str = "http://127.0.0.1:8501",
        quiet_s: float = QUIET_S,
        max_defer_s: float | None = None,
        state_cursor: Callable | None = None,
        commits: Callable[[], int] | None = None,
        turn: Callable[[], AbstractContextManager] | None = None,
        wait_for_tables: bool = False,
    ) -> None:
        self.cursor = cursor
        self.wait_for_tables = wait_for_tables  # alerts.evaluate: no full computation on a build
        self.turn = turn
        self.state_cursor = state_cursor
        self.commits = commits
        self._commits_seen = commits() if commits is not None else None
        self.quiet_s = quiet_s
        self.max_defer_s = max_defer_s if max_defer_s is not None else max(MIN_MAX_DEFER_S, 2 * interval_s)
        self.deferred = 0
        self._deferring = False
        self._last_commit = float("-inf")
        self.write = write
        self.rules = rules
        self.interval = timedelta(seconds=interval_s)
        self.dashboard_url = dashboard_url
        self.channels = [_Channel(receiver) for receiver in receivers]
        # Detectors run over the evaluator's anchor window: the findings tables answer the runs
        # it holds whole (``registry.run_metric``); the rule's window is applied to the rows.
        self.since: datetime | None = None
        self.evaluations = 0
        self.skipped = 0
        self.last_evaluation_at: str | None = None
        self.last_error: str | None = None
        self.rule_errors: dict[str, str] = {}
        self._seen_version: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="driftscope-alerts", daemon=True)

    # --- evaluation -----------------------------------------------------------------------
    def evaluate_once(self, now: datetime | None = None) -> alert_state.Evaluation | None:
        """One evaluation: skipped when no span arrived and no alert is pending or firing."""
        now = now or alert_state.utcnow()
        conn = self.cursor()
        state = self.state_cursor() if self.state_cursor is not None else conn
        try:
            with self.turn() if self.turn is not None else nullcontext():
                version = data_version(conn)
            if version == self._seen_version and not alert_state.has_active(state):
                self.skipped += 1
                return None
            evaluation = alert_state.evaluate(
                conn,
                self.rules,
                now,
                since=self.since,
                state=state,
                turn=self._next_turn if self.turn is not None else None,
                wait_for_tables=self.wait_for_tables,
            )
        finally:
            if state is not conn:
                state.close()
            conn.close()
        if evaluation.changes:
            self.write(alert_state.store_changes(evaluation.changes))
            for change in evaluation.changes:
                logger.info(
                    "alert %s: %s",
                    change.row["alert_id"],
                    "dropped" if change.delete else change.row["state"],
                )
        self._seen_version = version
        self.rule_errors = evaluation.errors
        self.evaluations += 1
        self.last_evaluation_at = iso(now)
        return evaluation

    def _next_turn(self) -> AbstractContextManager:
        """The next rule's read turn; none once serve is stopping (the store may be closed by
        then: the rules left fail and keep their alerts as they are)."""
        if self._stop.is_set():
            raise RuntimeError("serve is stopping")
        return self.turn()

    def queue_due(self, now: datetime | None = None) -> int:
        """Queue every notification a receiver has not acknowledged; returns how many were queued."""
        now = now or alert_state.utcnow()
        queued = 0
        for channel in self.channels:
            # Under the lock a delivery's acknowledgement is either read here or its alert is
            # still in flight: never both missed, so nothing is queued twice.
            with channel.lock:
                conn = (self.state_cursor or self.cursor)()
                try:
                    due = alert_state.due_notifications(
                        conn, channel.receiver.name, now, channel.receiver.resend_after
                    )
                finally:
                    conn.close()
                for row in due.to_dict("records"):
                    key = (row["alert_id"], row["state"])
                    if key in channel.inflight:
                        continue
                    try:
                        channel.queue.put_nowait(notification_from_row(row, self.dashboard_url))
                    except queue.Full:
                        # Still unacknowledged in the store: queued again at the next evaluation.
                        channel.status.dropped += 1
                        continue
                    channel.inflight.add(key)
                    queued += 1
            channel.status.queued = channel.queue.qsize()
        return queued

    def notify(self) -> None:
        """Spans were committed (serve's writer calls this): evaluations wait for a quiet moment."""
        self._last_commit = time.monotonic()

    def _due(self, last: float) -> bool:
        """An evaluation is due once per interval, when ingest has been quiet for ``quiet_s``
        (detector scans during a burst would take CPU from the writer), or regardless once it is
        ``max_defer_s`` late under sustained ingest."""
        now = time.monotonic()
        if self.commits is not None and (count := self.commits()) != self._commits_seen:
            self._commits_seen = count
            self._last_commit = now
        if now - last < self.interval.total_seconds():
            return False
        if now - self._last_commit >= self.quiet_s or now - last >= self.max_defer_s:
            self._deferring = False
            return True
        if not self._deferring:  # count evaluations held back, not polls
            self._deferring = True
            self.deferred += 1
        return False

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        last = float("-inf")
        while not self._stop.is_set():
            if self._due(last):
                last = time.monotonic()
                try:
                    self.evaluate_once()
                    self.queue_due()
                    self.last_error = None
                except Exception as exc:  # noqa: BLE001 - the evaluator must never take serve down
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    logger.warning("alert evaluation failed (will retry): %s", self.last_error)
            self._stop.wait(min(0.25, self.interval.total_seconds()))

    # --- delivery -------------------------------------------------------------------------
    def _deliver(self, channel: _Channel) -> None:
        backoff = BACKOFF_START_S
        while not self._stop.is_set():
            try:
                first = channel.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < BATCH:
                try:
                    batch.append(channel.queue.get_nowait())
                except queue.Empty:
                    break
            while not self._stop.is_set():
                now = alert_state.utcnow()
                try:
                    channel.receiver.send(batch, now, self.interval)
                    with channel.lock:
                        self.write(
                            alert_state.mark_delivered(
                                channel.receiver.name, [(n.alert_id, n.state) for n in batch], now
                            )
                        )
                        for n in batch:
                            channel.inflight.discard((n.alert_id, n.state))
                except Exception as exc:  # noqa: BLE001 - retried with backoff; the store keeps it due
                    status = channel.status
                    status.failures += 1
                    status.consecutive_failures += 1
                    status.last_error = f"{type(exc).__name__}: {exc}"
                    status.last_error_at = iso(alert_state.utcnow())
                    logger.warning(
                        "alert delivery to %s failed (retry in %.1fs): %s",
                        channel.receiver.name,
                        backoff,
                        status.last_error,
                    )
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
                channel.status.sent += len(batch)
                channel.status.consecutive_failures = 0
                channel.status.last_success_at = iso(now)
                backoff = BACKOFF_START_S
                break
            channel.status.queued = channel.queue.qsize()

    # --- lifecycle ------------------------------------------------------------------------
    def start(self, evaluate: bool = True) -> None:
        """Start the delivery threads and (``evaluate``) the evaluator thread."""
        for channel in self.channels:
            channel.thread = threading.Thread(
                target=self._deliver,
                args=(channel,),
                name=f"driftscope-alerts-{channel.receiver.name}",
                daemon=True,
            )
            channel.thread.start()
        if evaluate:
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop evaluating and delivering (before the writer stops: both write through it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for channel in self.channels:
            if channel.thread is not None:
                channel.thread.join(timeout)
            channel.receiver.close()

    def health(self) -> dict:
        """Evaluator and per-receiver delivery state for /api/v1/health."""
        receivers = {}
        for channel in self.channels:
            channel.status.queued = channel.queue.qsize()
            receivers[channel.receiver.name] = dict(channel.status.__dict__)
        failing = [name for name, status in receivers.items() if status["consecutive_failures"]]
        return {
            "enabled": True,
            "status": "delivery_failing" if failing else ("evaluation_failing" if self.last_error else "ok"),
            "rules": len(self.rules),
            "rule_list": [
                {"name": r.name, "detector": r.detector, "severity": r.severity, "window_seconds": r.window_s}
                for r in self.rules
            ],
            "interval_seconds": self.interval.total_seconds(),
            "evaluations": self.evaluations,
            "skipped_evaluations": self.skipped,
            "deferred_for_ingest": self.deferred,
            "last_evaluation_at": self.last_evaluation_at,
            "last_error": self.last_error,
            "rule_errors": dict(self.rule_errors),
            "receivers": receivers,
        }
