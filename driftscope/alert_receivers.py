"""Alert notifications and the receivers that take them: Prometheus Alertmanager, a signed webhook, Slack.

A ``Notification`` is one alert episode in the state a receiver is told about. Formats:
Alertmanager's API v2 (``POST /api/v2/alerts``, one list per batch, ``endsAt`` ahead while firing),
Alertmanager's webhook JSON (version 4, one message per alert) signed with HMAC-SHA256
(``X-Driftscope-Signature: sha256=<hex>``), and a Slack incoming-webhook message. ``send`` raises
``DeliveryError`` unless the receiver accepted everything; ``driftscope.alerting`` retries.
"""

from __future__ import annotations

import abc
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import httpx

from analytics import alerts as alert_state
from analytics.alert_rules import AlertRule, render, sample_fields

SIGNATURE_HEADER = "X-Driftscope-Signature"
TIMESTAMP_HEADER = "X-Driftscope-Timestamp"
# How old (or how far ahead) a signed timestamp a receiver should accept, in seconds (docs/alerts.md).
SIGNATURE_TOLERANCE_SECONDS = 300
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


class Receiver(abc.ABC):
    """Where notifications go; ``send`` raises ``DeliveryError`` unless all were accepted."""

    name = "receiver"
    resend_after: timedelta | None = None

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.client = httpx.Client(timeout=timeout)

    @abc.abstractmethod
    def send(self, notifications: list[Notification], now: datetime, interval: timedelta) -> None:
        """Deliver ``notifications``; raise ``DeliveryError`` unless the receiver accepted all."""

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


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header value: ``sha256=`` and the hex HMAC-SHA256 of ``<timestamp>.<body>``
    (the timestamp in Unix seconds, sent in ``X-Driftscope-Timestamp``). Signing the time with
    the body lets a receiver refuse a captured request replayed later."""
    signed = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    now: float,
    tolerance: float = SIGNATURE_TOLERANCE_SECONDS,
) -> bool:
    """What a webhook receiver checks (docs/alerts.md): the timestamp is within ``tolerance``
    seconds of ``now`` and the signature is ``sign(secret, timestamp, body)`` (constant time)."""
    if not timestamp or not signature or not (timestamp.isascii() and timestamp.isdigit()):
        return False
    if abs(now - int(timestamp)) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, int(timestamp), body), signature)


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
            headers = {}
            if self.secret:
                timestamp = int(time.time())
                headers = {
                    TIMESTAMP_HEADER: str(timestamp),
                    SIGNATURE_HEADER: sign(self.secret, timestamp, body),
                }
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
