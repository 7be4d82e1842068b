"""gRPC call slots against streams that send headers and never a message (issue 32, item 1).

grpcio's ``maximum_concurrent_rpcs`` counts a call from its HEADERS; before issue 32 one TCP
connection holding 16 such streams made every export RESOURCE_EXHAUSTED for as long as it stayed
open, with or without ``--token``.
"""

import time

import grpc
import httpx
import pytest

from benchmarks.h2_streams import EXPORT_PATH, HeaderOnlyStreams
from tests.otlp_builders import make_request
from tests.serve_helpers import new_serve, wait_until

TOKEN = "slot-test-token"
AUTH = [("authorization", f"Bearer {TOKEN}")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = new_serve(
        tmp_path_factory.mktemp("grpc-slots"), token=TOKEN, extra_args=["--body-timeout", "3s"]
    ).start()
    yield process
    process.stop()


def _export(server, run_id: str) -> None:
    request = make_request([{"name": "legit", "attrs": {"gen_ai.conversation.id": run_id}}])
    with grpc.insecure_channel(server.grpc_endpoint) as channel:
        export = channel.unary_unary(EXPORT_PATH, request_serializer=None, response_deserializer=None)
        export(request.SerializeToString(), timeout=10, metadata=AUTH)


def _stored(server, run_id: str) -> bool:
    response = httpx.get(f"{server.http_url}/api/v1/runs/{run_id}/spans", headers=server.headers, timeout=10)
    return response.status_code == 200 and len(response.json()["rows"]) == 1


@pytest.mark.parametrize("attacker_token", [TOKEN, None], ids=["with-token", "without-token"])
def test_header_only_streams_do_not_shut_out_an_authenticated_export(server, attacker_token):
    held = HeaderOnlyStreams("127.0.0.1", server.grpc_port, 16, token=attacker_token)
    try:
        time.sleep(0.5)  # the streams reach the server and take whatever they can take
        run_id = f"slots-{attacker_token is not None}"
        _export(server, run_id)
        assert _stored(server, run_id)
    finally:
        held.close()


def test_a_call_without_its_message_is_cancelled_after_body_timeout(server):
    held = HeaderOnlyStreams("127.0.0.1", server.grpc_port, 4, token=TOKEN)
    try:
        time.sleep(1)
        assert held.open_streams() > 0, "the streams should be held until the deadline"
        wait_until(lambda: held.open_streams() == 0, "the server to cancel every message-less call", 15)
    finally:
        held.close()
    _export(server, "after-deadline")


def test_unauthenticated_header_only_streams_are_refused_at_once(server):
    held = HeaderOnlyStreams("127.0.0.1", server.grpc_port, 4)
    try:
        wait_until(lambda: held.open_streams() == 0, "every token-less stream to be answered", 2)
    finally:
        held.close()
