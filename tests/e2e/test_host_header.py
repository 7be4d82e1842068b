"""DNS rebinding (issue 32, item 4): a page that re-points its name at 127.0.0.1 reaches serve
with its own name in Host. serve answers loopback names, its bound address and --allowed-hosts
only, on every HTTP endpoint. Before issue 32 `Host: evil.example.com` got 200 everywhere."""

import json

import httpx
import pytest

from tests.otlp_builders import make_request
from tests.serve_helpers import new_serve

PB = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = new_serve(
        tmp_path_factory.mktemp("hosts"), extra_args=["--allowed-hosts", "collector.internal"]
    ).start()
    yield process
    process.stop()


def _requests(server):
    body = make_request(
        [{"name": "s", "attrs": {"gen_ai.conversation.id": "host-check"}}]
    ).SerializeToString()
    return [
        ("GET", "/api/v1/health", {}, None),
        ("GET", "/api/v1/runs", {}, None),
        ("POST", "/v1/traces", PB, body),
        ("POST", "/v1/metrics", PB, b""),
        ("POST", "/api/v1/calibrate", {"Content-Type": "application/json"}, json.dumps({}).encode()),
        ("GET", "/no/such/path", {}, None),
    ]


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:4318", "127.0.0.1.nip.example"])
def test_a_foreign_host_header_is_refused_on_every_endpoint(server, host):
    for method, path, headers, body in _requests(server):
        response = httpx.request(
            method, f"{server.http_url}{path}", headers={**headers, "Host": host}, content=body, timeout=30
        )
        assert response.status_code == 400, (path, response.status_code, response.text)
        assert "--allowed-hosts" in response.json()["error"]


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "collector.internal:{port}"])
def test_loopback_names_and_allowed_hosts_are_answered(server, host):
    headers = {"Host": host.format(port=server.http_port)}
    assert httpx.get(f"{server.http_url}/api/v1/runs", headers=headers, timeout=30).status_code == 200
    body = make_request([{"name": "s", "attrs": {"gen_ai.conversation.id": "host-ok"}}]).SerializeToString()
    response = httpx.post(f"{server.http_url}/v1/traces", content=body, headers={**PB, **headers}, timeout=30)
    assert response.status_code == 200
