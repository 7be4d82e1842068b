"""Alert delivery in ``serve``: the evaluator thread and the receivers it notifies.

Every ``interval`` the ``AlertService`` thread evaluates the rules (``analytics.alerts``) on a
read cursor, hands the state changes to the single writer, and queues what each receiver has
not acknowledged yet. Each receiver has a bounded queue and a delivery thread that posts with
exponential backoff and, after a success, records the acknowledgement through the writer. The
store is the outbox: a notification dropped from a full queue, or lost with a restart, is still
unacknowledged there and is queued again at the next evaluation; an acknowledged one is never
sent again (except that Alertmanager gets firing alerts re-sent, as Prometheus does, and dedups).

Receivers: Prometheus Alertmanager (``POST /api/v2/alerts``), a webhook in Alertmanager's webhook
JSON (version 4) signed with HMAC-SHA256 (``X-Driftscope-Signature: sha256=<hex>``), and a Slack
incoming webhook.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import httpx

from analytics import alerts as alert_state
from analytics.alert_rules import AlertRule, render, sample_fields
from analytics.read import data_version

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Driftscope-Signature"
QUEUE_SIZE = 1000
BATCH = 64
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# Firing alerts are re-sent to Alertmanager this often, each with endsAt this far ahead, so
# Alertmanager resolves them by itself only if driftscope stops re-sending (as Prometheus does).
AM_RESEND = timedelta(minutes=1)
AM_ENDS_AHEAD_FACTOR = 4


def iso(value: datetime | None) -> str | None:
    """RFC 3339 UTC text of a naive UTC datetime."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Notification:
    """One alert episode in the state a receiver is told about."""

    alert_id: str
    state: str  # firing / resolved
    labels: dict[str, str]
    summary: str
    description: str
    starts_at: datetime
    ends_at: datetime | None
    generator_url: str
    findings: int = 0

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.labels, sort_keys=True).encode()).hexdigest()[:16]

    def alertmanager_alert(self, now: datetime, interval: timedelta) -> dict:
        ends = (
            self.ends_at
            if self.state == "resolved"
            else now + AM_ENDS_AHEAD_FACTOR * max(interval, AM_RESEND)
        )
        return {
            "labels": self.labels,
            "annotations": {"summary": self.summary, "description": self.description},
            "startsAt": iso(self.starts_at),
            "endsAt": iso(ends),
            "generatorURL": self.generator_url,
        }

    def webhook_alert(self) -> dict:
        return {
            "status": self.state,
            "labels": self.labels,
            "annotations": {"summary": self.summary, "description": self.description},
            "startsAt": iso(self.starts_at),
            "endsAt": iso(self.ends_at) if self.state == "resolved" else "0001-01-01T00:00:00Z",
            "generatorURL": self.generator_url,
            "fingerprint": self.fingerprint,
        }


def finding_url(dashboard_url: str, row: dict) -> str:
    """The dashboard page showing the alert's finding: the run explorer at its evidence span, or
    the detector's page for alerts that are not about one run."""
    base = dashboard_url.rstrip("/")
    if row.get("run_id"):
        link = f"{base}/run_explorer?run={quote(str(row['run_id']), safe='')}"
        if row.get("evidence_span"):
            link += f"&span={quote(str(row['evidence_span']), safe='')}"
        return link
    from analytics import registry

    metric = registry.METRICS.get(row.get("alertname") or "")
    return f"{base}/{(metric.page if metric else None) or 'findings'}"


def notification_from_row(row: dict, dashboard_url: str) -> Notification:
    plain = {key: alert_state._plain(value) for key, value in row.items()}
    return Notification(
        alert_id=plain["alert_id"],
        state=plain["state"],
        labels=json.loads(plain["labels"]),
        summary=plain["summary"],
        description=plain["description"],
        starts_at=plain["starts_at"] or plain["active_since"],
        ends_at=plain["ends_at"],
        generator_url=finding_url(dashboard_url, plain),
        findings=int(plain["findings"] or 0),
    )


class DeliveryError(RuntimeError):
    """A receiver did not accept a notification (connection failed or a non-2xx answer)."""


def _post(client: httpx.Client, url: str, body: bytes, headers: dict[str, str]) -> None:
    try:
        response = client.post(url, content=body, headers={"Content-Type": "application/json", **headers})
    except httpx.HTTPError as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code >= 300:
        raise DeliveryError(f"HTTP {response.status_code}: {response.text[:200]}")


class Receiver:
    """Where notifications go; ``send`` raises ``DeliveryError`` unless all were accepted."""

    name = "receiver"
    resend_after: timedelta | None = None

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.client = httpx.Client(timeout=timeout)

    def send(self, notifications: list[Notification], now: datetime, interval: timedelta) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.client.close()


class AlertmanagerReceiver(Receiver):
    """Prometheus Alertmanager's API v2: all alerts of a batch in one POST."""

    name = "alertmanager"
    resend_after = AM_RESEND

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        base = url.rstrip("/")
        super().__init__(base if base.endswith("/api/v2/alerts") else f"{base}/api/v2/alerts", timeout)

    def send(self, notifications, now, interval) -> None:
        body = json.dumps([n.alertmanager_alert(now, interval) for n in notifications]).encode()
        _post(self.client, self.url, body, {})


def webhook_payload(notification: Notification, receiver: str = "driftscope", external_url: str = "") -> dict:
    """Alertmanager's webhook JSON (version 4) for one alert."""
    group_labels = {"alertname": notification.labels.get("alertname", "")}
    return {
        "version": "4",
        "groupKey": f"{{}}:{json.dumps(notification.labels, sort_keys=True)}",
        "truncatedAlerts": 0,
        "status": notification.state,
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": notification.labels,
        "commonAnnotations": {"summary": notification.summary, "description": notification.description},
        "externalURL": external_url,
        "alerts": [notification.webhook_alert()],
    }


def sign(secret: str, body: bytes) -> str:
    """The signature header value: ``sha256=`` and the HMAC-SHA256 of the body, hex."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookReceiver(Receiver):
    """A plain webhook: one Alertmanager-format (v4) message per alert, HMAC-signed."""

    name = "webhook"

    def __init__(self, url: str, secret: str | None, external_url: str = "", timeout: float = 10.0) -> None:
        super().__init__(url, timeout)
        self.secret = secret
        self.external_url = external_url

    def send(self, notifications, now, interval) -> None:
        for notification in notifications:
            body = json.dumps(webhook_payload(notification, external_url=self.external_url)).encode()
            headers = {SIGNATURE_HEADER: sign(self.secret, body)} if self.secret else {}
            _post(self.client, self.url, body, headers)


def slack_message(notification: Notification) -> dict:
    """A Slack incoming-webhook message: ``text`` (notifications) and a section block."""
    labels = notification.labels
    status = "FIRING" if notification.state == "firing" else "RESOLVED"
    head = f"[{status}] {labels.get('alertname', '')} ({labels.get('severity', '')})"
    text = f"{head}: {notification.summary}"
    where = ", ".join(f"{key}={labels[key]}" for key in ("service", "run_id", "agent") if labels.get(key))
    body = f"*{head}*\n{notification.summary}\n{notification.description}"
    if where:
        body += f"\n{where}"
    body += f"\n<{notification.generator_url}|Open the finding in driftscope>"
    return {"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": body[:2900]}}]}


class SlackReceiver(Receiver):
    """A Slack incoming webhook: one message per alert."""

    name = "slack"

    def send(self, notifications, now, interval) -> None:
        for notification in notifications:
            _post(self.client, self.url, json.dumps(slack_message(notification)).encode(), {})


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


class AlertService:
    """The alert evaluator and delivery threads of ``serve``.

    ``cursor`` returns a read cursor on the store; ``write`` is the single writer's
    ``execute_write_fn``. Evaluation reads on its own low-priority thread and writes only small
    state rows through the writer, so ingest is not held up.
    """

    def __init__(
        self,
        cursor: Callable,
        write: Callable,
        rules: list[AlertRule],
        receivers: list[Receiver],
        interval_s: float = 30.0,
        dashboard_url: str = "http://127.0.0.1:8501",
    ) -> None:
        self.cursor = cursor
        self.write = write
        self.rules = rules
        self.interval = timedelta(seconds=interval_s)
        self.dashboard_url = dashboard_url
        self.channels = [_Channel(receiver) for receiver in receivers]
        # Detectors run over the default scope (every span): the results the kept-results worker
        # keeps up to date (and stores) after each commit, so a rule without filters costs no
        # detector run of its own; the rule's window is applied to the finding rows.
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
        try:
            version = data_version(conn)
            if version == self._seen_version and not alert_state.has_active(conn):
                self.skipped += 1
                return None
            evaluation = alert_state.evaluate(conn, self.rules, now, since=self.since)
        finally:
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

    def queue_due(self, now: datetime | None = None) -> int:
        """Queue every notification a receiver has not acknowledged; returns how many were queued."""
        now = now or alert_state.utcnow()
        queued = 0
        for channel in self.channels:
            # Under the lock a delivery's acknowledgement is either read here or its alert is
            # still in flight: never both missed, so nothing is queued twice.
            with channel.lock:
                conn = self.cursor()
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

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while not self._stop.is_set():
            try:
                self.evaluate_once()
                self.queue_due()
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - the evaluator must never take serve down
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("alert evaluation failed (will retry): %s", self.last_error)
            self._stop.wait(self.interval.total_seconds())

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
            "interval_seconds": self.interval.total_seconds(),
            "evaluations": self.evaluations,
            "skipped_evaluations": self.skipped,
            "last_evaluation_at": self.last_evaluation_at,
            "last_error": self.last_error,
            "rule_errors": dict(self.rule_errors),
            "receivers": receivers,
        }


def sample_notification(rule: AlertRule, dashboard_url: str, now: datetime | None = None) -> Notification:
    """A sample firing alert of ``rule`` (``driftscope alerts test``), labelled test=true."""
    now = now or alert_state.utcnow()
    fields = sample_fields(rule)
    labels = {
        "alertname": rule.detector,
        "severity": rule.severity,
        "service": str(fields["service"]),
        "run_id": str(fields["run_id"]),
        "agent": str(fields["agent"]),
        **rule.labels,
        "test": "true",
    }
    if rule.name != rule.detector:
        labels["rule"] = rule.name
    return Notification(
        alert_id=f"{rule.name}/test/{int(now.timestamp())}",
        state="firing",
        labels=labels,
        summary=render(rule.summary, fields),
        description=render(rule.description, fields),
        starts_at=now,
        ends_at=None,
        generator_url=finding_url(dashboard_url, {"run_id": fields["run_id"]}),
        findings=1,
    )
