"""Cost of the hostile requests of issues 12 and 32 against a real `driftscope serve`, next to an ordinary
request of the same size: status, wall time, serve CPU seconds, serve peak-RSS growth, and the
slowest /api/v1/health answer while the request was in flight.

    python -m benchmarks.hostile_requests [--repo PATH] [--only NAME ...]

``--repo`` runs another checkout's serve (e.g. the code before the fix) with this script's
requests. Every scenario gets a fresh server (peak RSS is per process). Loopback only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks import hostile_round_three as round_three

REPO = Path(__file__).resolve().parents[1]
PB = {"Content-Type": "application/x-protobuf"}
M64 = (1 << 64) - 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def _kv(key: bytes, value: bytes = b"") -> bytes:
    return _field(1, key) + _field(2, _field(1, value))


def _span(name: bytes, attrs: bytes = b"", trace: bytes = b"\x01" * 16) -> bytes:
    span_id = os.urandom(8).replace(b"\x00", b"\x01")
    fixed = lambda n, v: _varint(n << 3 | 1) + v.to_bytes(8, "little")  # noqa: E731
    return (
        _field(1, trace) + _field(2, span_id) + _field(5, name)
        + fixed(7, 1_700_000_000_000_000_000) + fixed(8, 1_700_000_000_000_001_000) + attrs
    )  # fmt: skip


def _request(spans: list[bytes]) -> bytes:
    scope = b"".join(_field(2, s) for s in spans)
    return _field(1, _field(2, scope))


def colliding_keys(count: int, table_bits: int) -> list[bytes]:
    """8-byte ASCII keys whose pre-fix (unkeyed) _otlpfast hash agrees in the low ``table_bits``
    bits: every one probes the same run of the duplicate-key table (found by inverting the hash)."""
    c1 = 0xFF51AFD7ED558CCD
    inverse = pow(c1, -1, 1 << 64)
    h0 = (0x9E3779B97F4A7C15 ^ (8 * 0xC2B2AE3D27D4EB4F)) & M64
    rng = np.random.default_rng(12)
    keys: list[bytes] = []
    with np.errstate(over="ignore"):
        while len(keys) < count:
            high = rng.integers(0, 1 << 46, size=4_000_000, dtype=np.uint64)
            x = (high << np.uint64(table_bits)) | np.uint64(12345)
            x ^= x >> np.uint64(33)
            x *= np.uint64(inverse)
            x ^= x >> np.uint64(33)
            x ^= x >> np.uint64(32)
            x *= np.uint64(inverse)
            x ^= np.uint64(h0)
            raw = x.view(np.uint8).reshape(-1, 8)
            ok = np.all((raw >= 0x20) & (raw < 0x7F), axis=1)
            keys.extend(bytes(row) for row in raw[ok])
    return keys[:count]


def scenario_bodies() -> dict[str, tuple[dict, bytes]]:
    good = _span(b"good")
    flood = b"".join(_field(9, _kv(k)) for k in colliding_keys(100_000, 18))
    ordinary = b"".join(_field(9, _kv(b"key.%05d" % i)[:]) for i in range(100_000))
    empty_spans = _request([b""] * (8 * 1024 * 1024))  # 16 MiB of 2-byte spans
    attrs = b"".join(_field(9, _kv(b"gen_ai.attr.%d" % j, b"value %d" % j)) for j in range(12))
    ordinary_spans = _request([_span(b"tool call %d" % i, attrs) for i in range(16 * 1024 * 1024 // 400)])
    return {
        "hash_flood_100k_keys": (PB, _request([good, _span(b"hostile", flood)])),
        "ordinary_100k_keys": (PB, _request([good, _span(b"many", ordinary)])),
        "empty_spans_16MiB_gzip": ({**PB, "Content-Encoding": "gzip"}, gzip.compress(empty_spans)),
        "ordinary_spans_16MiB_gzip": ({**PB, "Content-Encoding": "gzip"}, gzip.compress(ordinary_spans)),
        # A key past max_attribute_bytes sends the request to upb and the Python path first.
        "python_path_empty_spans_16MiB_gzip": (
            {**PB, "Content-Encoding": "gzip"},
            gzip.compress(_request([_span(b"x", _field(9, _kv(b"k" * 70_000)))] + [b""] * (8 * 1024 * 1024))),
        ),
        "ledger_recursion_bomb": (
            PB,
            _request(
                [good, _span(b"hostile", _field(9, _kv(b"driftscope.constraints.ledger", b"[" * 5000)))]
            ),
        ),
        "deep_json_10000": ({"Content-Type": "application/json"}, b"[" * 10_000 + b"]" * 10_000),
        "gzip_two_members": (
            {**PB, "Content-Encoding": "gzip"},
            gzip.compress(_request([_span(b"first")])) + gzip.compress(_request([_span(b"second")])),
        ),
        "gzip_trailing_garbage": (
            {**PB, "Content-Encoding": "gzip"},
            gzip.compress(_request([good])) + b"junk",
        ),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(
        self, repo: Path, workdir: Path, token: str | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        self.http_port, self.grpc_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
        if token:
            env["DRIFTSCOPE_TOKEN"] = token
        args = [sys.executable, "-m", "driftscope", "serve", "--db", str(workdir / f"{self.http_port}.duckdb"),
                "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port), "--embeddings", "false",
                *extra]  # fmt: skip
        self.process = subprocess.Popen(
            args, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(600):
            try:
                if httpx.get(f"{self.url}/api/v1/health", headers=self.headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("serve did not start")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory(self, name: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _with_health_probe(server: Server, action) -> tuple[object, float]:
    """Run ``action()`` while probing health; the slowest health answer in seconds."""
    done = threading.Event()
    slowest = [0.0]

    def probe():
        while not done.is_set():
            started = time.monotonic()
            try:
                httpx.get(f"{server.url}/api/v1/health", headers=server.headers, timeout=120)
            except httpx.HTTPError:
                pass
            slowest[0] = max(slowest[0], time.monotonic() - started)
            time.sleep(0.05)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        result = action()
    finally:
        done.set()
        thread.join()
    return result, slowest[0]


def measure(server: Server, action) -> dict:
    rss0, cpu0 = server.memory("VmRSS"), server.cpu_seconds()
    started = time.monotonic()
    result, health = _with_health_probe(server, action)
    return {
        "result": result,
        "wall_s": round(time.monotonic() - started, 2),
        "serve_cpu_s": round(server.cpu_seconds() - cpu0, 2),
        "peak_rss_growth_mib": round((server.memory("VmHWM") - rss0) / 2**20, 1),
        "slowest_health_s": round(health, 2),
    }


def _post(url: str, headers: dict, body: bytes):
    def action():
        try:
            response = httpx.post(url, content=body, headers=headers, timeout=600)
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return response.status_code

    return action


def _read_api_huge_post(url: str):
    def action():
        def chunks():
            piece = b" " * (1024 * 1024)
            for _ in range(400):
                yield piece

        try:
            return httpx.post(f"{url}/api/v1/runs/details", content=chunks(), timeout=600).status_code
        except httpx.HTTPError as exc:
            return type(exc).__name__

    return action


def _half_sent(url: str, port: int, count: int = 2100, wait: float = 12.0):
    def action():
        socks = []
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        time.sleep(1)
        during = httpx.get(f"{url}/api/v1/health", timeout=30).status_code
        time.sleep(wait)
        after = httpx.get(f"{url}/api/v1/health", timeout=30).status_code
        for sock in socks:
            sock.close()
        return {"health_after_1s": during, f"health_after_{wait + 1:g}s": after}

    return action


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repo", default=str(REPO))
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args(argv)
    bodies = scenario_bodies()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        scenarios = {
            name: (lambda s, h=h, b=b: _post(f"{s.url}/v1/traces", h, b)) for name, (h, b) in bodies.items()
        }
        scenarios["read_api_400MiB_post"] = lambda s: _read_api_huge_post(s.url)
        scenarios["read_api_since_9999999w"] = lambda s: (
            lambda: httpx.get(f"{s.url}/api/v1/runs", params={"since": "9999999w"}).status_code
        )
        scenarios["read_api_limit_superscript_2"] = lambda s: (
            lambda: httpx.get(f"{s.url}/api/v1/runs", params={"limit": "²"}).status_code
        )
        scenarios["half_sent_requests_2100"] = lambda s: _half_sent(s.url, s.http_port)
        scenarios.update(round_three.scenarios())
        for name, make in scenarios.items():
            if args.only and name not in args.only:
                continue
            token, extra = round_three.SERVER_ARGS.get(name, (None, ()))
            server = Server(Path(args.repo), Path(tmp), token, extra)
            try:
                results[name] = measure(server, make(server))
            finally:
                server.stop()
            print(json.dumps({name: results[name]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
