"""Hostile OTLP requests against the real `driftscope serve`: one bad value never costs the batch,
counts are bounded per request, gzip is read as gzip readers read it, and a request being
decoded never stops health and reads from answering (issue 12)."""

import gzip
import json
import os
import threading

import grpc
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from collector.decode import encode_hex_ids
from tests.otlp_builders import make_request, set_attr
from tests.serve_helpers import new_serve

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
HOSTILE = "[" * 5000  # json.loads of it raised RecursionError in the convention mapping

# Limits small enough to reach with small bodies.
MAX_SPANS, MAX_ATTRS, MAX_ITEMS = 200, 64, 3000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = new_serve(
        tmp_path_factory.mktemp("ingest"),
        extra_args=[
            "--max-spans-per-request", str(MAX_SPANS),
            "--max-attributes-per-span", str(MAX_ATTRS),
            "--max-items-per-request", str(MAX_ITEMS),
            "--max-body-bytes", "1MiB",
        ],
    ).start()  # fmt: skip
    yield process
    process.stop()


def _spans(server, run_id: str) -> dict[str, dict]:
    response = httpx.get(f"{server.http_url}/api/v1/runs/{run_id}/spans", timeout=30)
    if response.status_code == 404:
        return {}
    return {row["span_name"]: row for row in response.json()["rows"]}


def _pair(run_id: str, **hostile_attrs) -> ExportTraceServiceRequest:
    """A good span and a span carrying ``hostile_attrs``, in one request of one run."""
    base = {"gen_ai.conversation.id": run_id}
    return make_request(
        [{"name": "good", "attrs": base}, {"name": "hostile", "attrs": {**base, **hostile_attrs}}]
    )


def _grpc_export(server, body: bytes):
    with grpc.insecure_channel(server.grpc_endpoint) as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        return ExportTraceServiceResponse.FromString(export(body, timeout=30))


@pytest.mark.parametrize(
    "key", ["driftscope.constraints.ledger", "driftscope.constraints.carried", "metadata"]
)
@pytest.mark.parametrize("transport", ["http-protobuf", "http-json", "grpc"])
def test_a_recursion_bomb_value_beside_a_good_span_costs_nothing(server, transport, key):
    run_id = f"bomb-{transport}-{key}"
    value = HOSTILE if key != "metadata" else '{"langgraph_node": ' + "[" * 5000
    request = _pair(run_id, **{key: value})
    if transport == "http-protobuf":
        response = httpx.post(f"{server.http_url}/v1/traces", content=request.SerializeToString(), headers=PB)
        assert response.status_code == 200, response.text
    elif transport == "http-json":
        from google.protobuf import json_format

        document = encode_hex_ids(json_format.MessageToDict(request))
        response = httpx.post(f"{server.http_url}/v1/traces", content=json.dumps(document), headers=JS)
        assert response.status_code == 200, response.text
    else:
        _grpc_export(server, request.SerializeToString())
    spans = _spans(server, run_id)
    assert set(spans) == {"good", "hostile"}
    if key == "driftscope.constraints.ledger":
        assert spans["hostile"]["constraints_ledger"] == [HOSTILE]  # kept as text


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_sdk_exporters_deliver_a_span_with_a_recursion_bomb(server, transport):
    if transport == "http":
        exporter = HttpExporter(endpoint=f"{server.http_url}/v1/traces")
    else:
        exporter = GrpcExporter(endpoint=server.grpc_endpoint, insecure=True)
    results = []

    class Recording(SimpleSpanProcessor):
        def on_end(self, span):
            results.append(self.span_exporter.export((span,)))

    provider = TracerProvider(resource=Resource.create({"service.name": "bomb"}))
    provider.add_span_processor(Recording(exporter))
    tracer = provider.get_tracer("tests")
    run_id = f"sdk-bomb-{transport}"
    with tracer.start_as_current_span("hostile", attributes={"gen_ai.conversation.id": run_id}) as span:
        span.set_attribute("driftscope.constraints.ledger", HOSTILE)
    provider.shutdown()
    assert results == [SpanExportResult.SUCCESS]
    assert set(_spans(server, run_id)) == {"hostile"}


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 10_000 + b"]" * 10_000,
        b'{"resourceSpans": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    ],
    ids=["bare", "resource-spans"],
)
def test_a_deeply_nested_json_body_is_400_with_the_reason(default_server, body):
    # The default item limit: under this module's 3,000 the 10,000 brackets are 413 (JSON values).
    response = httpx.post(f"{default_server.http_url}/v1/traces", content=body, headers=JS, timeout=30)
    assert response.status_code == 400, response.text
    assert "deep" in response.json()["message"]


def test_anyvalue_nesting_too_deep_for_protobuf_rejects_only_its_span(default_server):
    """Issue 32: it was a 400 for the whole body; now the span is rejected in partial_success.
    200 levels: past protobuf's recursion limit (100), well within json.loads' (~1,000 JSON levels)."""
    body = (
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "deep", "attributes": [{"key": "k", "value": '
        + b'{"arrayValue": {"values": [' * 200
        + b"]}}" * 200
        + b"}]}]}]}]}"
    )
    response = httpx.post(f"{default_server.http_url}/v1/traces", content=body, headers=JS, timeout=30)
    assert response.status_code == 200, response.text
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "could not be decoded" in partial["errorMessage"]


def test_concatenated_gzip_members_are_all_decoded(server):
    first = make_request([{"name": "first", "attrs": {"gen_ai.conversation.id": "gzip-members"}}])
    second = make_request([{"name": "second", "attrs": {"gen_ai.conversation.id": "gzip-members"}}])
    # Two serialized requests concatenated are one request with both resource spans (protobuf
    # merges repeated fields), so a gzip reader that stops after the first member loses "second".
    body = gzip.compress(first.SerializeToString()) + gzip.compress(second.SerializeToString())
    response = httpx.post(
        f"{server.http_url}/v1/traces", content=body, headers={**PB, "Content-Encoding": "gzip"}
    )
    assert response.status_code == 200, response.text
    assert set(_spans(server, "gzip-members")) == {"first", "second"}


@pytest.mark.parametrize("trailer", [b"garbage", b"\x1f\x8b\x08\x00junk", b"\x00\x00\x01"])
def test_trailing_bytes_after_a_gzip_stream_are_400(server, trailer):
    body = gzip.compress(make_request([{"name": "x"}]).SerializeToString()) + trailer
    response = httpx.post(
        f"{server.http_url}/v1/traces", content=body, headers={**PB, "Content-Encoding": "gzip"}
    )
    assert response.status_code == 400, response.text
    assert "gzip" in status_pb2.Status.FromString(response.content).message


def test_the_decompressed_limit_holds_across_gzip_members(server):
    member = gzip.compress(b"\x00" * (600 * 1024))  # each under the 1 MiB limit, together over it
    response = httpx.post(
        f"{server.http_url}/v1/traces", content=member * 2, headers={**PB, "Content-Encoding": "gzip"}
    )
    assert response.status_code == 413
    assert "decompressed body exceeds" in status_pb2.Status.FromString(response.content).message


def _many_spans(n: int, run_id: str) -> ExportTraceServiceRequest:
    return make_request([{"name": f"s{i}", "attrs": {"gen_ai.conversation.id": run_id}} for i in range(n)])


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_a_request_past_max_spans_per_request_is_413_and_stores_nothing(server, encoding):
    request = _many_spans(MAX_SPANS + 1, f"too-many-{encoding}")
    if encoding == "protobuf":
        response = httpx.post(f"{server.http_url}/v1/traces", content=request.SerializeToString(), headers=PB)
        message = status_pb2.Status.FromString(response.content).message
    else:
        from google.protobuf import json_format

        document = encode_hex_ids(json_format.MessageToDict(request))
        response = httpx.post(f"{server.http_url}/v1/traces", content=json.dumps(document), headers=JS)
        message = response.json()["message"]
    assert response.status_code == 413
    assert f"more than {MAX_SPANS} spans (max_spans_per_request)" in message
    assert _spans(server, f"too-many-{encoding}") == {}
    exactly = _many_spans(MAX_SPANS, f"at-limit-{encoding}")
    response = httpx.post(f"{server.http_url}/v1/traces", content=exactly.SerializeToString(), headers=PB)
    assert response.status_code == 200 and len(_spans(server, f"at-limit-{encoding}")) == MAX_SPANS


def test_a_request_past_max_spans_per_request_is_invalid_argument_over_grpc(server):
    with pytest.raises(grpc.RpcError) as info:
        _grpc_export(server, _many_spans(MAX_SPANS + 1, "too-many-grpc").SerializeToString())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_spans_per_request" in info.value.details()


def test_a_request_past_max_items_per_request_is_413(server):
    # 100 spans of 40 attributes: under both per-span and per-request span counts, over the items.
    request = make_request(
        [{"name": f"s{i}", "attrs": {f"k{j}": "v" for j in range(40)}} for i in range(100)]
    )
    response = httpx.post(f"{server.http_url}/v1/traces", content=request.SerializeToString(), headers=PB)
    assert response.status_code == 413
    assert "max_items_per_request" in status_pb2.Status.FromString(response.content).message


def _with_extra_attributes(request: ExportTraceServiceRequest, where: str, n: int) -> None:
    span = request.resource_spans[0].scope_spans[0].spans[1]
    if where == "span":
        target = span.attributes
    elif where == "event":
        event = span.events.add(name="e", time_unix_nano=span.start_time_unix_nano)
        target = event.attributes
    elif where == "link":
        link = span.links.add(trace_id=b"\x02" * 16, span_id=b"\x03" * 8)
        target = link.attributes
    for i in range(n):
        set_attr(target, f"extra.{i}", "v")


@pytest.mark.parametrize("where", ["span", "event", "link"])
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_span_past_max_attributes_per_span_is_rejected_in_partial_success(server, where, transport):
    run_id = f"attrs-{where}-{transport}"
    request = _pair(run_id)
    _with_extra_attributes(request, where, MAX_ATTRS + 1)
    if transport == "http":
        response = httpx.post(f"{server.http_url}/v1/traces", content=request.SerializeToString(), headers=PB)
        assert response.status_code == 200
        answer = ExportTraceServiceResponse.FromString(response.content)
    else:
        answer = _grpc_export(server, request.SerializeToString())
    assert answer.partial_success.rejected_spans == 1
    assert f"more than {MAX_ATTRS} attributes" in answer.partial_success.error_message
    assert "max_attributes_per_span" in answer.partial_success.error_message
    assert set(_spans(server, run_id)) == {"good"}


def test_spans_under_a_resource_past_max_attributes_per_span_are_rejected(server):
    request = _pair("attrs-resource")
    good = make_request([{"name": "other", "attrs": {"gen_ai.conversation.id": "attrs-resource"}}])
    for i in range(MAX_ATTRS + 1):
        set_attr(request.resource_spans[0].resource.attributes, f"r.{i}", "v")
    request.resource_spans.append(good.resource_spans[0])
    response = httpx.post(f"{server.http_url}/v1/traces", content=request.SerializeToString(), headers=PB)
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 2
    assert set(_spans(server, "attrs-resource")) == {"other"}


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    process = new_serve(tmp_path_factory.mktemp("ingest-default")).start()
    yield process
    process.stop()


@pytest.mark.slow  # over 5 s on an idle machine (make test runs it)
def test_health_and_reads_answer_while_a_big_request_decodes(default_server):
    """The body decodes on the decode pool, not on the event loop: health answers many times
    before the ingest answer comes back (all its spans are rejected, so no commit wait)."""
    spans = [
        {
            "traceId": "00" * 16,  # all-zero ids: every span is rejected after decoding
            "spanId": os.urandom(8).hex(),
            "name": f"s{i}",
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2",
            "attributes": [{"key": f"k{j}", "value": {"stringValue": "v"}} for j in range(5)],
        }
        for i in range(25_000)
    ]
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()
    done = threading.Event()
    result = {}

    def ingest():
        result["response"] = httpx.post(
            f"{default_server.http_url}/v1/traces", content=body, headers=JS, timeout=120
        )
        done.set()

    health_during = 0
    reads_during = 0
    thread = threading.Thread(target=ingest)
    thread.start()
    with httpx.Client(timeout=120) as client:
        while not done.is_set():
            answered = client.get(f"{default_server.http_url}/api/v1/health").status_code == 200
            runs = client.get(f"{default_server.http_url}/api/v1/runs", params={"limit": "5"}).status_code
            if not done.is_set():
                health_during += answered
                reads_during += runs == 200
    thread.join()
    assert result["response"].status_code == 200
    assert result["response"].json()["partialSuccess"]["rejectedSpans"] == "25000"
    assert health_during >= 3 and reads_during >= 3, (health_during, reads_during)


def test_colliding_attribute_keys_are_bounded_by_the_per_span_cap(default_server):
    """The audit's hash flood: 100,000 keys (chosen to collide under the old unkeyed hash) on one
    span. Whatever the keys, the span is rejected for its attribute count (default cap 1,024)
    before duplicate detection, and the good span beside it is stored."""
    request = _pair("flood")
    span = request.resource_spans[0].scope_spans[0].spans[1]
    for i in range(100_000):
        set_attr(span.attributes, i.to_bytes(8, "little").decode("latin-1"), "")
    response = httpx.post(
        f"{default_server.http_url}/v1/traces", content=request.SerializeToString(), headers=PB, timeout=60
    )
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "more than 1024 attributes" in answer.partial_success.error_message
    assert set(_spans(default_server, "flood")) == {"good"}
