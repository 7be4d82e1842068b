"""Slow and stalled HTTP clients against the real `driftscope serve`, over real sockets: header
and body deadlines close them, unfinished bodies hold a bounded number of bytes, and health,
reads and ingest keep answering meanwhile (issue 12 item 3)."""

import select
import socket
import time

import httpx
import pytest

from tests.otlp_builders import make_request
from tests.serve_helpers import new_serve

HEADER_TIMEOUT, BODY_TIMEOUT = 1.5, 2.0
PB = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = new_serve(
        tmp_path_factory.mktemp("slow"),
        extra_args=[
            "--header-timeout", f"{HEADER_TIMEOUT}s",
            "--body-timeout", f"{BODY_TIMEOUT}s",
            "--max-pending-bytes", "1MiB",
        ],
    ).start()  # fmt: skip
    yield process
    process.stop()


def _connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.settimeout(30)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open
    after 30 s (the server's deadlines here are a few seconds)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open; got {data[:100]!r}")
    return data


def _serving(server) -> bool:
    health = httpx.get(f"{server.http_url}/api/v1/health", timeout=10)
    runs = httpx.get(f"{server.http_url}/api/v1/runs", timeout=10)
    body = make_request([{"name": "ok"}]).SerializeToString()
    ingest = httpx.post(f"{server.http_url}/v1/traces", content=body, headers=PB, timeout=10)
    return health.status_code == runs.status_code == ingest.status_code == 200


def test_connections_that_never_finish_their_headers_are_closed(server):
    silent = [_connect(server) for _ in range(20)]  # connected, nothing sent
    partial = [_connect(server) for _ in range(20)]
    for sock in partial:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # headers never end
    assert _serving(server)  # the stalled ones do not block anyone meanwhile
    for sock in silent + partial:
        answer = _read_until_closed(sock)  # closed by the server's header deadline
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:100]
        sock.close()
    assert _serving(server)


def test_a_client_sending_its_headers_a_byte_at_a_time_is_cut_off(server):
    sock = _connect(server)
    request = b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    sent = 0
    closed = False
    try:
        for byte in request:
            sock.sendall(bytes([byte]))
            sent += 1
            time.sleep(0.1)  # 10 bytes a second: the whole request would take over 20 s
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    if not closed:
        answer = _read_until_closed(sock)
        closed = not answer.startswith(b"HTTP/1.1 200")
    sock.close()
    assert closed and sent < len(request)


def test_a_body_that_stops_arriving_gets_408_and_the_connection_is_closed(server):
    sock = _connect(server)
    sock.sendall(
        b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
        b"Content-Length: 100000\r\n\r\n" + b"\x0a" * 10
    )
    answer = _read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"body_timeout" in answer and b"connection: close" in answer.lower()


@pytest.mark.slow  # over 5 s on an idle machine (make test runs it)
def test_a_body_nobody_reads_does_not_keep_the_connection(server):
    """A 404 is answered without reading the body; a client that keeps trickling it is still
    closed after the body deadline (plus grace)."""
    sock = _connect(server)
    sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n")
    closed = False
    deadline = time.monotonic() + BODY_TIMEOUT + 15
    try:
        while time.monotonic() < deadline:
            sock.sendall(b"x")
            time.sleep(0.2)
            sock.setblocking(False)
            try:
                if sock.recv(65536) == b"":
                    closed = True
                    break
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    sock.close()
    assert closed


def test_stalled_uploads_hold_at_most_max_pending_bytes(server):
    """Each stalled upload is under the body limit; together they would pass max_pending_bytes
    (1 MiB), so once the held bytes reach it further uploads are refused with 503 + Retry-After."""
    socks = []
    statuses = []
    piece = b"\x0a" * (300 * 1024)
    for _ in range(6):
        sock = _connect(server)
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 2000000\r\n\r\n" + piece
        )
        socks.append(sock)
    select.select(socks, [], [], 10)  # the first refusal
    time.sleep(0.5)
    for sock in socks:
        sock.setblocking(False)
        try:
            statuses.append(sock.recv(65536)[:12])
        except BlockingIOError:
            statuses.append(b"")
        sock.setblocking(True)
    refused = [s for s in statuses if s.startswith(b"HTTP/1.1 503")]
    assert refused, statuses  # 6 x 300 KiB > 1 MiB: some were refused instead of buffered
    assert len(refused) < len(socks)  # ... but not all: the bound is on bytes, not requests
    health = httpx.get(f"{server.http_url}/api/v1/health", timeout=10).json()
    assert health["counters"].get("http_pending_full", 0) >= len(refused)
    for sock in socks:
        sock.close()
    assert _serving(server)


def test_grpc_messages_count_against_the_same_pending_bytes(server):
    """A gRPC message waiting for the decode pool holds bytes like an HTTP body: one over
    max_pending_bytes (1 MiB here) gets RESOURCE_EXHAUSTED with RetryInfo; a small one passes."""
    import grpc
    from google.rpc import error_details_pb2

    method = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
    big = make_request([{"name": "big", "attrs": {"blob": "x" * (1200 * 1024)}}]).SerializeToString()
    small = make_request([{"name": "small"}]).SerializeToString()
    with grpc.insecure_channel(server.grpc_endpoint) as channel:
        export = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            export(big, timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_pending_bytes" in info.value.details()
        retry = dict(info.value.trailing_metadata())["google.rpc.retryinfo-bin"]
        assert error_details_pb2.RetryInfo.FromString(retry).retry_delay.seconds >= 1
        export(small, timeout=30)
