"""Start the real `driftscope serve` as a subprocess on free loopback ports, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


# What serve prints when a port it was given is taken (driftscope.checks, driftscope.serve).
_PORT_TAKEN = ("is already in use: another", "another process took the port")


class PortTakenError(RuntimeError):
    """serve exited because a port chosen for it was bound by another process meanwhile."""


def wait_until(predicate, what: str, timeout: float = 20, poll: float = 0.05) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServeProcess:
    db: Path
    http_port: int
    grpc_port: int
    token: str | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    log_dir: Path | None = None
    # Ports chosen by free_port(): another process (a parallel test worker, another checkout's
    # tests) can bind one between the probe and serve's bind; the first start then moves to new ones.
    auto_ports: bool = False
    started_once: bool = False

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def start(self, timeout: float = 60.0) -> ServeProcess:
        for attempt in range(5):
            try:
                return self._start(timeout)
            except PortTakenError:
                if not self.auto_ports or self.started_once or attempt == 4:
                    raise
                self.http_port, self.grpc_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> ServeProcess:
        args = [
            sys.executable, "-m", "driftscope", "serve",
            "--db", str(self.db),
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--embeddings", "false",
            *self.extra_args,
        ]  # fmt: skip
        if self.token:
            args += ["--token", self.token]
        self.log_path = (self.log_dir or self.db.parent) / f"serve-{self.http_port}.log"
        log = self.log_path.open("ab")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **self.env}
        self.process = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        # One client for the polls: each httpx.get() builds an SSL context (loads the CA bundle,
        # ~30 ms of CPU) even for http:// URLs.
        with httpx.Client(headers=self.headers, timeout=2) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    log = self.log()
                    if any(marker in log for marker in _PORT_TAKEN):
                        raise PortTakenError(log)
                    raise RuntimeError(f"serve exited with {self.process.returncode}:\n{log}")
                try:
                    if client.get(f"{self.http_url}/api/v1/health").status_code == 200:
                        self.started_once = True
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"serve did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout: float = 40.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def health(self) -> dict:
        return httpx.get(f"{self.http_url}/api/v1/health", headers=self.headers, timeout=10).json()


def new_serve(tmp_path: Path, db: Path | None = None, **kwargs) -> ServeProcess:
    return ServeProcess(
        db=db or tmp_path / "driftscope.duckdb",
        http_port=free_port(),
        grpc_port=free_port(),
        auto_ports=True,
        **kwargs,
    )


def wait_findings_current(server: ServeProcess, timeout: float = 120) -> None:
    """Wait until serve's findings tables reflect every committed change (reads are SELECTs over
    them, answered at once with how far behind they are): for a test that reads findings right
    after sending spans."""

    def current() -> bool:
        findings = server.health().get("findings", {})
        return findings.get("behind_changes") == 0 and findings.get("findings_as_of") is not None

    wait_until(current, "the findings tables to reflect every commit", timeout, poll=0.2)
