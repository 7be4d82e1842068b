"""Alerts end to end: the real `driftscope serve` pages through Debian's real Prometheus Alertmanager.

A demo crew (``driftscope demo``) is sent to serve; its alert evaluator pushes to Alertmanager,
whose webhook receiver points at a local sink (a real HTTP server in this test); serve also posts
its own signed webhook and a Slack message to the sink. Checked: one notification per finding
group through Alertmanager, each firing and resolved exactly once on every receiver across a
restart of serve and an outage of the sink and Alertmanager; a healthy crew pages nobody.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from analytics.types import Window
from dashboard.datasource import HttpSource
from tests.serve_helpers import REPO, ServeProcess, free_port, wait_findings_current, wait_until

pytestmark = pytest.mark.slow

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
SECRET = "sink-secret"
# One client for every poll: each httpx.get() builds an SSL context (~30 ms of CPU), even for http.
HTTP = httpx.Client(timeout=60)


class Sink(ThreadingHTTPServer):
    """Keeps every JSON body posted to it, by path; answers 200."""

    def __init__(self, port: int = 0):
        self.messages: list[tuple[str, dict[str, str], dict]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _SinkHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self, path: str) -> list[tuple[dict[str, str], dict]]:
        with self.lock:
            return [(headers, body) for p, headers, body in self.messages if p == path]

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _SinkHandler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server naming)
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        headers = {key.lower(): value for key, value in self.headers.items()}
        if self.path == "/webhook":
            signed = headers.get("x-driftscope-timestamp", "").encode() + b"." + raw
            expected = "sha256=" + hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
            if headers.get("x-driftscope-signature") != expected:
                self.send_response(401)
                self.end_headers()
                return
        with self.server.lock:
            self.server.messages.append((self.path, headers, json.loads(raw)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        return None


class Alertmanager:
    """``prometheus-alertmanager`` on a loopback port, webhook receiver -> the sink's /am."""

    def __init__(self, workdir: Path, sink_url: str, port: int | None = None):
        self.port = port or free_port()
        self.workdir = workdir
        config = workdir / "alertmanager.yml"
        config.write_text(
            "route:\n"
            "  receiver: sink\n"
            "  group_by: ['alertname', 'run_id', 'agent']\n"
            "  group_wait: 1s\n"
            "  group_interval: 1s\n"
            "  repeat_interval: 24h\n"
            "receivers:\n"
            "  - name: sink\n"
            "    webhook_configs:\n"
            f"      - url: {sink_url}\n"
            "        send_resolved: true\n"
        )
        self.config = config
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Alertmanager:
        log = (self.workdir / "alertmanager.log").open("ab")
        self.process = subprocess.Popen(
            [
                ALERTMANAGER,
                f"--config.file={self.config}",
                f"--storage.path={self.workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.workdir / "alertmanager.log").read_text()
            try:
                if HTTP.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(
            "alertmanager did not become ready:\n" + (self.workdir / "alertmanager.log").read_text()
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(15)


@pytest.fixture
def alertmanager_binary():
    if ALERTMANAGER is None:
        pytest.skip("Debian's prometheus-alertmanager is not installed: run `make alertmanager`")
    return ALERTMANAGER


def _serve(tmp_path: Path, am: Alertmanager, sink: Sink, db: Path | None = None) -> ServeProcess:
    rules = tmp_path / "rules.toml"
    # Short windows so findings age out and their alerts resolve within the test, but not before
    # the outage below starts: the alerts fire once serve's findings tables have the demo's spans
    # (a second or two after the last span), and the firing phase takes several seconds more.
    rules.write_text('window = "20s"\n')
    return ServeProcess(
        db=db or tmp_path / "alerts.duckdb",
        http_port=free_port(),
        grpc_port=free_port(),
        auto_ports=True,
        extra_args=[
            "--alert-rules",
            str(rules),
            "--alertmanager-url",
            am.url,
            "--alert-interval",
            "1s",
            "--alert-webhook-url",
            sink.url("/webhook"),
            "--alert-webhook-secret",
            SECRET,
            "--alert-slack-url",
            sink.url("/slack"),
            "--alert-dashboard-url",
            "http://127.0.0.1:8501",
        ],  # fmt: skip
    )


def _demo(serve: ServeProcess, scenario: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "driftscope", "demo", "--scenario", scenario, "--endpoint", serve.http_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    wait_findings_current(serve)


def _finding_groups(serve: ServeProcess) -> set[tuple[str, str]]:
    """(detector, run id or agent) of every finding group the read API lists."""
    metrics = HTTP.get(f"{serve.http_url}/api/v1/metrics").json()["metrics"]
    groups = set()
    for metric in metrics:
        if not metric["findings"]:
            continue
        body = HTTP.get(f"{serve.http_url}/api/v1/metrics/{metric['name']}").json()
        for row in body["rows"]:
            flag = metric["flag_column"]
            if flag and not row.get(flag):
                continue
            key = row.get("run_id") or row.get("agent")  # rejection rates page per agent
            if key:
                groups.add((metric["name"], key))
    return groups


def _group(labels: dict) -> tuple[str, str]:
    return labels["alertname"], labels.get("run_id") or labels.get("agent", "")


def _am_alerts(sink: Sink, status: str) -> list[tuple[str, str]]:
    return [
        _group(alert["labels"])
        for _, body in sink.bodies("/am")
        for alert in body["alerts"]
        if alert["status"] == status and body["status"] == status
    ]


def _direct(sink: Sink, path: str, status: str) -> list[tuple[str, str]]:
    found = []
    for _, body in sink.bodies(path):
        if path == "/webhook":
            if body["status"] == status:
                found += [_group(a["labels"]) for a in body["alerts"]]
        else:
            prefix = "[FIRING]" if status == "firing" else "[RESOLVED]"
            if body["text"].startswith(prefix):
                found.append(body["text"])
    return found


def _alerting(serve: ServeProcess) -> dict:
    return HTTP.get(f"{serve.http_url}/api/v1/health").json()["alerting"]


def _wait(predicate, timeout: float, what: str) -> None:
    wait_until(predicate, what, timeout, poll=0.3)


def test_failing_crew_pages_once_per_finding_group_through_alertmanager_across_restarts_and_outages(
    tmp_path, alertmanager_binary
):
    sink = Sink()
    am = Alertmanager(tmp_path, sink.url("/am")).start()
    serve = _serve(tmp_path, am, sink).start()
    try:
        _demo(serve, "split_brain")
        expected = _finding_groups(serve)
        assert expected, "the unguarded split-brain crew has findings"
        # Through Alertmanager, at the sink: one notification per group, each holding one alert.
        _wait(lambda: set(_am_alerts(sink, "firing")) >= expected, 60, "firing alerts through Alertmanager")
        firing = _am_alerts(sink, "firing")
        assert sorted(firing) == sorted(expected), firing
        for _, body in sink.bodies("/am"):
            assert len(body["alerts"]) == 1
            alert = body["alerts"][0]
            assert alert["annotations"]["summary"] and alert["annotations"]["description"]
            if alert["labels"]["alertname"] == "rejection_rates":  # a rate per agent, not one run
                assert {"alertname", "severity", "agent"} <= set(alert["labels"])
                assert alert["generatorURL"] == "http://127.0.0.1:8501/rejections"
            else:
                assert {"alertname", "severity", "service", "run_id", "agent"} <= set(alert["labels"])
                assert alert["generatorURL"].startswith("http://127.0.0.1:8501/run_explorer?run=")
        _wait(lambda: sorted(_direct(sink, "/webhook", "firing")) == sorted(expected), 30, "signed webhooks")
        _wait(lambda: len(_direct(sink, "/slack", "firing")) == len(expected), 30, "Slack messages")
        for _, body in sink.bodies("/webhook"):
            assert body["version"] == "4" and body["receiver"] and body["groupKey"]
        for _, body in sink.bodies("/slack"):
            assert body["blocks"][0]["type"] == "section"
            assert "<http://127.0.0.1:8501/" in body["blocks"][0]["text"]["text"]

        # Outage: sink and Alertmanager go away and serve restarts while the alerts resolve.
        sink_port = sink.port
        sink.close()
        am.stop()
        assert serve.stop() == 0
        serve.start()
        # The findings age out of the 20s window: resolved in the store, undeliverable.
        source = HttpSource(serve.http_url)

        def resolved_in_the_store() -> bool:
            listed = source.alerts(Window())
            return sorted(listed["alertname"]) == sorted(n for n, _ in expected) and set(listed["state"]) == {
                "resolved"
            }

        _wait(resolved_in_the_store, 60, "the alerts resolved in the store during the outage")
        _wait(lambda: _alerting(serve)["receivers"]["webhook"]["failures"] > 0, 30, "a failed delivery")
        health = _alerting(serve)
        assert health["status"] == "delivery_failing"
        assert health["receivers"]["webhook"]["failures"] > 0
        assert serve.stop() == 0
        serve.start()

        sink = Sink(sink_port)
        am.start()
        _wait(
            lambda: set(_am_alerts(sink, "resolved")) >= expected, 90, "resolved alerts through Alertmanager"
        )
        _wait(
            lambda: sorted(_direct(sink, "/webhook", "resolved")) == sorted(expected), 60, "resolved webhooks"
        )
        _wait(
            lambda: len(_direct(sink, "/slack", "resolved")) == len(expected), 60, "resolved Slack messages"
        )
        time.sleep(5)  # several evaluation intervals: nothing more arrives
        assert sorted(_am_alerts(sink, "resolved")) == sorted(expected)
        assert _am_alerts(sink, "firing") == []  # no firing notification repeated after the outage
        assert _direct(sink, "/webhook", "firing") == []
        assert _direct(sink, "/slack", "firing") == []
        assert len(_direct(sink, "/webhook", "resolved")) == len(expected)
        health = _alerting(serve)
        assert health["status"] == "ok", health
        # The dashboard's HTTP source reads the episodes through /api/v1/alerts.
        listed = HttpSource(serve.http_url).alerts(Window())
        assert sorted(zip(listed["alertname"], listed["state"], strict=True)) == sorted(
            (name, "resolved") for name, _ in expected
        )
        assert set(listed["delivered_to"]) == {"alertmanager:resolved, slack:resolved, webhook:resolved"}
    finally:
        serve.stop()
        am.stop()
        sink.close()


def test_healthy_crew_pages_nobody(tmp_path, alertmanager_binary):
    sink = Sink()
    am = Alertmanager(tmp_path, sink.url("/am")).start()
    serve = _serve(tmp_path, am, sink).start()
    try:
        _demo(serve, "healthy")
        assert _finding_groups(serve) == set()

        def passes() -> int:  # evaluations, and passes skipped as nothing changed since one
            health = _alerting(serve)
            return health["evaluations"] + health["skipped_evaluations"]

        done = passes()  # every span was acknowledged: the passes after this look at all of them
        _wait(lambda: passes() >= done + 3, 30, "three passes over the whole crew")
        assert _alerting(serve)["evaluations"] >= 1
        time.sleep(3)  # past Alertmanager's group_wait
        assert sink.messages == []
    finally:
        serve.stop()
        am.stop()
        sink.close()
