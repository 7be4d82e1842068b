"""Alert delivery (driftscope.alerting, driftscope.alert_receivers): message formats checked by a real local HTTP sink, and the
AlertService on a DuckDB file with the real single writer (retries, bounded queue, restarts)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from analytics.alert_rules import default_rules, parse_rules
from collector.files import ingest_files
from collector.writer import IngestQueue, SpanWriter
from driftscope import alerting
from driftscope.alert_receivers import (
    SIGNATURE_TOLERANCE_SECONDS,
    AlertmanagerReceiver,
    DeliveryError,
    Notification,
    SlackReceiver,
    WebhookReceiver,
    sample_notification,
    verify_signature,
)
from driftscope.alerting import AlertService
from driftscope.database import open_database
from tests.serve_helpers import free_port, wait_until

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
SECRET = "s3cret"


class Sink(ThreadingHTTPServer):
    """Keeps every JSON body posted to it; answers ``self.status`` (200 unless a test fails it)."""

    def __init__(self, port: int = 0):
        self.messages: list[tuple[str, dict, bytes]] = []
        self.status = 200
        super().__init__(("127.0.0.1", port), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    def bodies(self, path: str) -> list:
        return [json.loads(raw) for p, _, raw in self.messages if p == path]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server naming)
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        if self.server.status == 200:
            self.server.messages.append((self.path, {k.lower(): v for k, v in self.headers.items()}, raw))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        return None


def _notification(state: str = "firing") -> Notification:
    start = datetime(2026, 1, 2, 3, 4, 5)
    return Notification(
        alert_id="lost_updates/run-1/1",
        state=state,
        labels={
            "alertname": "lost_updates",
            "severity": "critical",
            "service": "crew",
            "run_id": "run-1",
            "agent": "a,b",
        },
        summary="lost updates (split-brain): 2 finding(s) in run run-1 of crew",
        description="A write clobbered another agent's.",
        starts_at=start,
        ends_at=start + timedelta(minutes=5) if state == "resolved" else None,
        generator_url="http://127.0.0.1:8501/run_explorer?run=run-1&span=abc",
    )


def test_webhook_is_alertmanager_v4_json_signed_with_hmac_sha256(sink):
    receiver = WebhookReceiver(sink.url("/hook"), SECRET)
    receiver.send(
        [_notification("firing"), _notification("resolved")], datetime(2026, 1, 2), timedelta(seconds=30)
    )
    assert len(sink.messages) == 2
    for (_, headers, raw), status in zip(sink.messages, ("firing", "resolved"), strict=True):
        timestamp = headers["x-driftscope-timestamp"]
        assert abs(int(timestamp) - time.time()) < 60
        signed = timestamp.encode() + b"." + raw
        expected = "sha256=" + hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
        assert headers["x-driftscope-signature"] == expected
        body = json.loads(raw)
        assert body["version"] == "4" and body["status"] == status and body["truncatedAlerts"] == 0
        assert body["groupLabels"] == {"alertname": "lost_updates"}
        (alert,) = body["alerts"]
        assert alert["labels"]["run_id"] == "run-1" and alert["status"] == status
        assert alert["annotations"]["summary"].startswith("lost updates")
        assert alert["startsAt"] == "2026-01-02T03:04:05Z"
        assert alert["endsAt"] == ("0001-01-01T00:00:00Z" if status == "firing" else "2026-01-02T03:09:05Z")
        assert alert["generatorURL"].endswith("run=run-1&span=abc") and alert["fingerprint"]


def test_webhook_without_a_secret_is_unsigned(sink):
    WebhookReceiver(sink.url("/hook"), None).send(
        [_notification()], datetime(2026, 1, 2), timedelta(seconds=30)
    )
    assert "x-driftscope-signature" not in sink.messages[0][1]


def test_a_replayed_or_altered_webhook_fails_verification(sink):
    """Issue 32: the HMAC covered the body only, so a captured request verified forever. The
    signature now covers ``timestamp.body`` and a receiver refuses timestamps past the tolerance."""
    WebhookReceiver(sink.url("/hook"), SECRET).send(
        [_notification()], datetime(2026, 1, 2), timedelta(seconds=30)
    )
    _, headers, raw = sink.messages[0]
    timestamp, signature = headers["x-driftscope-timestamp"], headers["x-driftscope-signature"]
    sent = int(timestamp)
    assert verify_signature(SECRET, raw, timestamp, signature, now=sent + 10)
    assert not verify_signature(SECRET, raw, timestamp, signature, now=sent + SIGNATURE_TOLERANCE_SECONDS + 1)
    assert not verify_signature(SECRET, raw, str(sent + 3600), signature, now=sent + 3600)  # re-dated
    assert not verify_signature(SECRET, raw + b" ", timestamp, signature, now=sent)
    assert not verify_signature(SECRET, raw, None, signature, now=sent)


def test_slack_message_has_text_and_a_section_linking_the_finding(sink):
    SlackReceiver(sink.url("/slack")).send(
        [_notification("resolved")], datetime(2026, 1, 2), timedelta(seconds=30)
    )
    (body,) = sink.bodies("/slack")
    assert body["text"].startswith("[RESOLVED] lost_updates (critical): lost updates")
    (block,) = body["blocks"]
    assert block["type"] == "section" and block["text"]["type"] == "mrkdwn"
    assert (
        "<http://127.0.0.1:8501/run_explorer?run=run-1&span=abc|Open the finding in driftscope>"
        in block["text"]["text"]
    )


def test_alertmanager_gets_a_list_with_ends_at_ahead_while_firing_and_past_once_resolved(sink):
    receiver = AlertmanagerReceiver(sink.url(""))
    now = datetime(2026, 1, 2, 3, 10)
    receiver.send([_notification("firing"), _notification("resolved")], now, timedelta(seconds=30))
    assert sink.messages[0][0] == "/api/v2/alerts"
    firing, resolved = sink.bodies("/api/v2/alerts")[0]
    assert firing["labels"]["alertname"] == "lost_updates" and set(firing["annotations"]) == {
        "summary",
        "description",
    }
    assert firing["endsAt"] == "2026-01-02T03:14:00Z"  # four re-send periods ahead
    assert resolved["endsAt"] == "2026-01-02T03:09:05Z"


def test_a_refusing_receiver_raises_delivery_error(sink):
    sink.status = 500
    with pytest.raises(DeliveryError, match="HTTP 500"):
        SlackReceiver(sink.url("/slack")).send([_notification()], datetime(2026, 1, 2), timedelta(seconds=30))
    with pytest.raises(DeliveryError, match="Connect"):
        SlackReceiver(f"http://127.0.0.1:{free_port()}/x").send(
            [_notification()], datetime(2026, 1, 2), timedelta(1)
        )


def test_sample_alert_of_a_rule_is_labelled_as_a_test():
    rule = next(r for r in default_rules() if r.name == "lost_updates")
    notification = sample_notification(rule, "http://127.0.0.1:8501")
    assert notification.labels["alertname"] == "lost_updates" and notification.labels["test"] == "true"
    assert "sample-run" in notification.summary


# --- the service, on a DuckDB file with the real writer ------------------------------------


class Store:
    """A DuckDB file of sample crews opened as serve opens it, with the single writer running."""

    def __init__(self, path: Path, *samples: str):
        self.conn = open_database(path)
        result = ingest_files(None, [SAMPLES / f"{name}.json" for name in samples], conn=self.conn)
        assert not result.errors and result.rejected == 0
        self.newest = self.conn.execute("SELECT max(Timestamp) FROM spans").fetchone()[0]
        self.queue = IngestQueue(64 * 1024**2)
        self.writer = SpanWriter(self.conn.cursor(), self.queue)
        self.writer.start()

    def close(self) -> None:
        self.writer.stop()
        self.conn.close()


def _service(store: Store, sink: Sink, rules) -> AlertService:
    service = AlertService(
        store.conn.cursor,
        store.writer.execute_write_fn,
        rules,
        [WebhookReceiver(sink.url("/hook"), SECRET), SlackReceiver(sink.url("/slack"))],
        interval_s=0.2,
    )
    service.since = None
    return service


def _wait(predicate, what: str, timeout: float = 20) -> None:
    wait_until(predicate, what, timeout)


def test_service_retries_a_failing_receiver_and_delivers_each_state_once_across_a_restart(tmp_path, sink):
    store = Store(tmp_path / "a.duckdb", "split_brain_unguarded")
    newest = store.newest
    try:
        rules = parse_rules('defaults = false\n[[rule]]\ndetector = "lost_updates"\nwindow = "10m"\n')
        sink.status = 503
        service = _service(store, sink, rules)
        service.evaluate_once(newest + timedelta(seconds=1))
        service.queue_due(newest + timedelta(seconds=1))
        service.start(evaluate=False)  # delivery only: this test evaluates at chosen times
        _wait(lambda: service.health()["receivers"]["webhook"]["failures"] >= 2, "failed deliveries")
        health = service.health()
        assert health["status"] == "delivery_failing"
        assert "HTTP 503" in health["receivers"]["webhook"]["last_error"]
        sink.status = 200
        _wait(
            lambda: len(sink.bodies("/hook")) == 1 and len(sink.bodies("/slack")) == 1,
            "delivery after recovery",
            60,
        )
        _wait(lambda: service.health()["status"] == "ok", "health back to ok")
        service.queue_due(newest + timedelta(seconds=2))  # acknowledged: nothing queued again
        time.sleep(0.5)
        service.stop()
        assert len(sink.bodies("/hook")) == 1

        # A new service on the same store (a restarted serve) sends nothing already acknowledged,
        # then the resolution once.
        again = _service(store, sink, rules)
        assert again.evaluate_once(newest + timedelta(seconds=3)) is not None
        assert again.queue_due(newest + timedelta(seconds=3)) == 0
        again.evaluate_once(newest + timedelta(minutes=11))
        assert again.queue_due(newest + timedelta(minutes=11)) == 2  # webhook and Slack
        again.start(evaluate=False)
        _wait(lambda: len(sink.bodies("/hook")) == 2, "resolved webhook")
        again.stop()
        statuses = [body["status"] for body in sink.bodies("/hook")]
        assert statuses == ["firing", "resolved"]
        assert [body["text"][:10] for body in sink.bodies("/slack")] == ["[FIRING] l", "[RESOLVED]"]
    finally:
        store.close()


def test_a_full_queue_drops_from_memory_only_and_the_store_queues_them_again(tmp_path, sink, monkeypatch):
    monkeypatch.setattr(alerting, "QUEUE_SIZE", 1)
    store = Store(tmp_path / "b.duckdb", "split_brain_unguarded")
    newest = store.newest
    try:
        service = _service(store, sink, default_rules())
        now = newest + timedelta(seconds=1)
        service.evaluate_once(now)
        assert service.queue_due(now) == 2  # one per receiver; the second alert of each is dropped
        assert service.health()["receivers"]["webhook"]["dropped"] == 1
        service.start(evaluate=False)  # delivery only: this test evaluates at chosen times
        _wait(lambda: len(sink.bodies("/hook")) == 1, "first webhook")
        _wait(lambda: service.queue_due(now) >= 1 or len(sink.bodies("/hook")) == 2, "re-queued")
        _wait(lambda: len(sink.bodies("/hook")) == 2, "second webhook")
        service.stop()
        runs = sorted(body["alerts"][0]["labels"]["alertname"] for body in sink.bodies("/hook"))
        assert runs == ["divergent_reads", "lost_updates"]
    finally:
        store.close()


# --- the alerts command ----------------------------------------------------------------------


def _cli(*args: str, env: dict | None = None):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "driftscope", "alerts", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def test_alerts_check_prints_the_rules_or_the_wrong_line(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('defaults = false\n[[rule]]\ndetector = "lost_updates"\nthreshold = 2\nwindow = "5m"\n')
    result = _cli("check", str(good))
    assert result.returncode == 0, result.stderr
    assert "1 rule(s) in force" in result.stdout and "lost_updates >= 2 finding(s) in 300s" in result.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\ndetector = "lost_updates"\n\n[[rule]]\ndetector = "ping_pong"\nfor = "often"\n')
    result = _cli("check", str(bad))
    assert result.returncode == 1
    assert f"{bad}, line 6: rule 'ping_pong': for: expected a duration such as 30s" in result.stderr
    assert "Traceback" not in result.stderr
    missing = _cli("check", str(tmp_path / "nope.toml"))
    assert missing.returncode == 1 and "cannot read it" in missing.stderr


def test_alerts_test_sends_a_signed_sample_to_each_receiver(sink):
    result = _cli(
        "test",
        "lost_updates",
        env={
            "DRIFTSCOPE_ALERT_WEBHOOK_URL": sink.url("/hook"),
            "DRIFTSCOPE_ALERT_WEBHOOK_SECRET": SECRET,
            "DRIFTSCOPE_ALERT_SLACK_URL": sink.url("/slack"),
        },
    )
    assert result.returncode == 0, result.stderr
    (hook,) = [m for m in sink.messages if m[0] == "/hook"]
    headers = hook[1]
    assert verify_signature(
        SECRET, hook[2], headers["x-driftscope-timestamp"], headers["x-driftscope-signature"], time.time()
    )
    alert = json.loads(hook[2])["alerts"][0]
    assert alert["labels"]["alertname"] == "lost_updates" and alert["labels"]["test"] == "true"
    assert sink.bodies("/slack")[0]["text"].startswith("[FIRING] lost_updates (critical)")
    unknown = _cli("test", "no_such_rule", env={"DRIFTSCOPE_ALERT_WEBHOOK_URL": sink.url("/hook")})
    assert unknown.returncode == 2 and "No rule named 'no_such_rule'" in unknown.stderr
    nowhere = _cli("test", "lost_updates")
    assert nowhere.returncode == 2 and "No receiver is configured" in nowhere.stderr
    sink.status = 500
    refused = _cli("test", "lost_updates", env={"DRIFTSCOPE_ALERT_SLACK_URL": sink.url("/slack")})
    assert refused.returncode == 1 and "did not accept it: HTTP 500" in refused.stderr


def test_evaluation_waits_for_ingest_to_pause_but_not_past_max_defer(tmp_path):
    store = Store(tmp_path / "c.duckdb", "healthy_unguarded")
    try:
        service = AlertService(
            store.conn.cursor, store.writer.execute_write_fn, default_rules(), [], interval_s=5
        )
        assert service.max_defer_s == 60  # at least a minute, or two intervals
        now = time.monotonic()
        assert service._due(float("-inf"))  # nothing committed yet: the first evaluation runs at once
        assert not service._due(now - 1)  # within the interval
        service.notify()  # a commit just now: ingest first
        assert not service._due(now - 10) and not service._due(now - 20)
        assert service.health()["deferred_for_ingest"] == 1  # one evaluation held back, polled twice
        assert service._due(now - 61)  # past max_defer it runs under sustained ingest too
        service._last_commit = time.monotonic() - 2  # ingest paused for longer than quiet_s
        assert service._due(now - 10)
    finally:
        store.close()
