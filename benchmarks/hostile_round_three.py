"""The hostile requests of issue 32, for ``benchmarks.hostile_requests``.

Each scenario is ``make(server) -> action``; the action sends the hostile request(s) while a
legitimate export goes over HTTP and over gRPC every second (10 s timeout each) and reports how
many of those were answered 200 / OK. ``SERVER_ARGS`` names the token and flags a scenario's
serve needs.
"""

from __future__ import annotations

import gzip
import os
import threading
import time

import grpc
import httpx

from benchmarks.h2_streams import EXPORT_PATH, HeaderOnlyStreams

TOKEN = "hostile-benchmark-token"
PB = {"Content-Type": "application/x-protobuf"}
SERVER_ARGS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "grpc_16_header_only_streams_with_token": (TOKEN, ()),
    "grpc_16_header_only_streams_without_token": (TOKEN, ()),
}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def legit_request() -> bytes:
    """One ordinary span in one resource, as protobuf bytes."""
    fixed = lambda n, v: _varint(n << 3 | 1) + v.to_bytes(8, "little")  # noqa: E731
    span = (
        _field(1, os.urandom(16)) + _field(2, os.urandom(8)) + _field(5, b"legit")
        + fixed(7, 1_700_000_000_000_000_000) + fixed(8, 1_700_000_000_000_001_000)
    )  # fmt: skip
    return _field(1, _field(2, _field(2, span)))


def _export_http(server) -> bool:
    try:
        response = httpx.post(
            f"{server.url}/v1/traces", content=legit_request(), headers={**PB, **server.headers}, timeout=10
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def _export_grpc(server) -> bool:
    metadata = [("authorization", f"Bearer {server.token}")] if server.token else []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT_PATH, request_serializer=None, response_deserializer=None)
        try:
            export(legit_request(), timeout=10, metadata=metadata)
        except grpc.RpcError:
            return False
    return True


def beside_legit_exports(server, hostile, min_seconds: float = 0.0) -> dict:
    """Run ``hostile()`` in a thread; meanwhile (and for at least ``min_seconds``) export one
    legitimate span over each transport every second. Returns the hostile result and the counts."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("hostile", hostile()), daemon=True)
    started = time.monotonic()
    thread.start()
    ok = {"http": [0, 0], "grpc": [0, 0]}
    while thread.is_alive() or time.monotonic() - started < min_seconds:
        for name, export in (("http", _export_http), ("grpc", _export_grpc)):
            ok[name][0] += export(server)
            ok[name][1] += 1
        time.sleep(1)
    thread.join()
    return {**result, **{f"legit_{k}_ok": f"{a}/{n}" for k, (a, n) in ok.items()}}


def _post(server, path: str, headers: dict, body: bytes):
    def send():
        try:
            response = httpx.post(
                f"{server.url}{path}", content=body, headers={**headers, **server.headers}, timeout=600
            )
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return response.status_code

    return send


def _header_only_streams(server, token: str | None, seconds: float = 15.0):
    def hold():
        held = HeaderOnlyStreams("127.0.0.1", server.grpc_port, 16, token=token)
        try:
            time.sleep(seconds)
            return {"streams_still_open_after_s": held.open_streams()}
        finally:
            held.close()

    return lambda: beside_legit_exports(server, hold)


def empty_gzip_members(total_bytes: int) -> bytes:
    """``total_bytes`` of empty gzip members (20 bytes each): one gzip body, nothing inside."""
    member = gzip.compress(b"", mtime=0)
    return member * (total_bytes // len(member))


def scenarios() -> dict:
    """name -> make(server) -> action, for issue 32's items."""
    gz = {**PB, "Content-Encoding": "gzip"}
    members = empty_gzip_members(2 * 1024 * 1024)
    return {
        "grpc_16_header_only_streams_with_token": lambda s: _header_only_streams(s, TOKEN),
        "grpc_16_header_only_streams_without_token": lambda s: _header_only_streams(s, None),
        "gzip_empty_members_2MiB": lambda s: (
            lambda: beside_legit_exports(s, _post(s, "/v1/traces", gz, members))
        ),
        "gzip_empty_members_2MiB_metrics": lambda s: (
            lambda: beside_legit_exports(s, _post(s, "/v1/metrics", gz, members))
        ),
    }
