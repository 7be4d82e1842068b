"""A fresh `driftscope serve` subprocess on free loopback ports, and its memory use from /proc."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago (each socket is held
    until all are chosen: two separate probes can be handed the same port)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def proc_status_kib(pid: int, field: str) -> int | None:
    """A ``/proc/<pid>/status`` field in KiB (``VmRSS`` now, ``VmHWM`` peak), None if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# What serve prints when a port it was given is taken (driftscope.checks, driftscope.serve).
_PORT_TAKEN = ("is already in use: another", "another process took the port")


class _PortTaken(RuntimeError):
    """serve exited because a port chosen for it was bound by another process meanwhile."""


class ServeProcess:
    """`python -m driftscope serve` on 127.0.0.1 with its own database; use as a context manager."""

    def __init__(
        self,
        db: Path,
        embeddings: bool = False,
        extra_args: list[str] | None = None,
        repo: Path | None = None,
    ) -> None:
        self.db = Path(db)
        self.repo = Path(repo) if repo is not None else REPO  # the tree whose serve runs (A/B runs)
        self.embeddings = embeddings
        self.extra_args = extra_args or []
        self.http_port, self.grpc_port = free_ports(2)
        self.process: subprocess.Popen | None = None
        self.log_path = self.db.with_suffix(".serve.log")

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 120.0) -> ServeProcess:
        for attempt in range(5):
            try:
                return self._start(timeout)
            except _PortTaken:
                # Another process (a parallel test worker) bound a chosen port after the probe.
                if attempt == 4:
                    raise
                self.http_port, self.grpc_port = free_ports(2)
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> ServeProcess:
        args = [
            sys.executable, "-m", "driftscope", "serve",
            "--db", str(self.db),
            "--host", "127.0.0.1",
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--embeddings", "true" if self.embeddings else "false",
            *self.extra_args,
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if self.repo != REPO:
            env["PYTHONPATH"] = str(self.repo)
        log = self.log_path.open("ab")
        log_start = log.tell()
        self.process = subprocess.Popen(args, cwd=self.repo, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        # One client for the polls: each httpx.get() builds an SSL context (loads the CA bundle,
        # ~30 ms of CPU) even for http:// URLs.
        with httpx.Client(timeout=2) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    if any(marker in self.log()[log_start:] for marker in _PORT_TAKEN):
                        raise _PortTaken(self.log()[-2000:])
                    raise RuntimeError(f"serve exited with {self.process.returncode}: {self.log()[-2000:]}")
                try:
                    if client.get(f"{self.http_url}/api/v1/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"serve did not become healthy: {self.log()[-2000:]}")

    def health(self) -> dict:
        return httpx.get(f"{self.http_url}/api/v1/health", timeout=60).json()

    def rss_bytes(self) -> int | None:
        kib = proc_status_kib(self.pid, "VmRSS")
        return kib * 1024 if kib is not None else None

    def peak_rss_bytes(self) -> int | None:
        kib = proc_status_kib(self.pid, "VmHWM")
        return kib * 1024 if kib is not None else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 120.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("serve did not stop within %ss; killing it", timeout)
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
