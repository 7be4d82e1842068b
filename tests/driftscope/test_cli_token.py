"""`driftscope up` never puts a secret on a command line another local user can read: the token,
the Slack incoming-webhook URL and the webhook URL (they carry keys; issue 32, item 6)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.serve_helpers import free_port

TOKEN = "tok-4f1d9c2e-never-on-a-command-line"
# Loopback ports nothing listens on: the URLs are only carried, never reached in this test.
SLACK_URL = "http://127.0.0.1:9/services/T000/B000/slack-key-never-on-a-command-line"
WEBHOOK_URL = "http://127.0.0.1:9/hook?key=webhook-key-never-on-a-command-line"
SECRETS = (TOKEN, "slack-key-never-on-a-command-line", "webhook-key-never-on-a-command-line")


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc, as another local user could)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_up_passes_secrets_to_its_children_by_environment_not_argv(tmp_path):
    http_port, grpc_port, dash_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "DRIFTSCOPE_TOKEN"}
    env["DRIFTSCOPE_EMBEDDINGS"] = "false"
    process = subprocess.Popen(
        [sys.executable, "-m", "driftscope", "up", "--db", str(tmp_path / "up.duckdb"), "--token", TOKEN,
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--dashboard-port", str(dash_port),
         "--alert-slack-url", SLACK_URL, "--alert-webhook-url", WEBHOOK_URL],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{http_port}/api/v1/health"
    try:
        deadline = time.monotonic() + 90
        healthy = False
        while time.monotonic() < deadline and not healthy:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                healthy = (
                    httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2).status_code == 200
                )
            except httpx.HTTPError:
                time.sleep(0.2)
        assert healthy, "the collector never answered with the token"
        # The serve child got the token (it refuses requests without it) and both receivers ...
        assert httpx.get(url, timeout=5).status_code == 401
        health = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
        assert set(health["alerting"]["receivers"]) == {"slack", "webhook"}, health["alerting"]
        # ... and no descendant of `up` shows it in its command line.
        children = _descendants(process.pid)
        assert children
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            for secret in SECRETS:
                assert secret.encode() not in cmdline, cmdline.replace(b"\0", b" ")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=90)
