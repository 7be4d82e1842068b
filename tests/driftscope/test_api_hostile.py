"""Hostile read-API requests get a 400 that says what to send, early, and never a 500.

Parameter and body checks run in process (``in_process``: serve's composition behind an ASGI
client); what depends on the HTTP server itself (a declared huge body, a body that never ends,
a lying Content-Length) is sent over a raw socket to a real ``serve``."""

import json
import socket

import httpx
import pytest

from driftscope.api import MAX_LOOKUP_BODY
from driftscope.timeparse import parse_instant
from tests.serve_helpers import new_serve


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = new_serve(tmp_path_factory.mktemp("readapi")).start()
    yield process
    process.stop()


@pytest.mark.parametrize(
    "params",
    [
        {"since": "9999999w"},
        {"until": "9999999d"},
        {"since": "9999999w", "until": "9999999d"},
        {"limit": "²"},
        {"limit": "٣"},
        {"limit": "1" * 400},
        {"since": "٣h"},
    ],
)
def test_out_of_range_and_unicode_digit_parameters_are_400_with_what_to_send(in_process, params):
    response = in_process.get("/api/v1/runs", params=params)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "Expected" in error or "limit must be" in error


@pytest.mark.parametrize("raw", ["9999999w", "9999999d", "9999999s", "0w", "1" * 7 + "h"])
def test_parse_instant_raises_only_value_error(raw):
    try:
        parse_instant("since", raw)
    except ValueError as exc:
        assert "since" in str(exc)


@pytest.mark.parametrize(
    ("path", "key"), [("/api/v1/runs/details", "run_ids"), ("/api/v1/evidence-spans", "keys")]
)
@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_deep_json_lookup_bodies_are_400(in_process, path, key, depth):
    body = '{"' + key + '": ' + "[" * depth + "]" * depth + "}"
    response = in_process.post(path, content=body.encode())
    assert response.status_code == 400, response.text
    assert key in response.json()["error"]
    assert in_process.get("/api/v1/health").status_code == 200


def _raw_request(port: int, head: bytes, body_part: bytes, timeout: float = 10.0) -> bytes:
    """Send ``head`` and only ``body_part`` of the body, then read what the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body_part)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except (TimeoutError, ConnectionResetError):
            pass
        return answer


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


@pytest.mark.parametrize("path", ["/api/v1/runs/details", "/api/v1/evidence-spans"])
def test_a_declared_huge_body_is_refused_before_it_is_sent(server, path):
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {400 * 1024 * 1024}\r\n\r\n"
    ).encode()
    answer = _raw_request(server.http_port, head, b'{"run_ids": [')
    # The 400 comes while 400 MiB are still unsent: the server did not wait to buffer them.
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"over" in answer and str(MAX_LOOKUP_BODY).encode() in answer


def test_a_chunked_body_past_the_cap_is_refused_while_streaming(server):
    head = (
        b"POST /api/v1/runs/details HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(MAX_LOOKUP_BODY // len(piece) + 2))
    # No terminating chunk: the body never ends, so only a streaming cap can answer.
    answer = _raw_request(server.http_port, head, chunks)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


def test_a_bad_content_length_on_a_lookup_is_400(server):
    head = (
        b"POST /api/v1/runs/details HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 12\r\n\r\n"
    )
    answer = _raw_request(server.http_port, head, b'{"run_ids":[]}'[:12])
    assert not answer.startswith(b"HTTP/1.1 500")
    ok = httpx.post(
        f"{server.http_url}/api/v1/runs/details", content=json.dumps({"run_ids": ["r"]}), timeout=10
    )
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/runs/details", '{"run_ids": ["ok", "\\ud800"]}'),
        ("/api/v1/evidence-spans", '{"keys": [["\\udfff", "ab12"]]}'),
        ("/api/v1/calibrate", '{"baseline_since": "\\ud83d", "dry_run": true}'),
        ("/api/v1/calibrate", '{"pairs_csv": "a,b\\n\\ud800,1\\n", "dry_run": true}'),
    ],
)
def test_a_lone_surrogate_in_a_body_is_400_not_500(in_process, path, body):
    """Issue 32: JSON's "\\ud800" decodes to a str DuckDB cannot bind (UnicodeEncodeError, 500)."""
    response = in_process.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert "surrogate" in response.json()["error"]
