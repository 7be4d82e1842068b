"""collector/http_receiver.py: the OTLP/HTTP receiver's answers, in process.

The receiver runs inside serve's real composition (store, single writer) behind an ASGI client
(``in_process``): what a request gets back and what is stored. The real SDK exporters, gRPC and
socket-level behaviour are tested against a real ``serve`` (tests/driftscope/test_serve.py,
tests/e2e/)."""

import gzip
import json

from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.otlp_builders import make_request, spec_example_bytes

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def _spans(client) -> int:
    return client.get("/api/v1/health").json()["spans"]


def _stored(client, run_id):
    body = client.get(f"/api/v1/runs/{run_id}/spans").json()
    return {row["span_name"]: row for row in body["rows"]}


def _big_gzip(size: int) -> bytes:
    return gzip.compress(b"\x00" * size)


BAD_REQUESTS = [
    ("truncated protobuf", PB, make_request([{}]).SerializeToString()[:-7], 400, "Could not decode"),
    ("garbage json", JS, b"{", 400, "not valid JSON"),
    ("wrong content type", {"Content-Type": "text/plain"}, b"hello", 415, "Unsupported Content-Type"),
    ("no content type", {}, b"hello", 415, "Unsupported Content-Type"),
    ("bad gzip", {**PB, "Content-Encoding": "gzip"}, b"not gzip at all", 400, "not valid gzip"),
    ("unknown encoding", {**PB, "Content-Encoding": "br"}, b"x", 415, "Unsupported Content-Encoding"),
    ("oversized body", PB, b"\x00" * (2 * 1024 * 1024 + 10), 413, "exceeds the 2097152-byte limit"),
    ("gzip bomb", {**PB, "Content-Encoding": "gzip"}, _big_gzip(8 * 1024 * 1024), 413, "decompressed body exceeds"),
    ("all ids invalid", PB, make_request([{"trace_id": b"\x01" * 15}]).SerializeToString(), 200, "trace_id must be"),
]  # fmt: skip


def test_json_request_in_the_spec_shape_is_stored_and_answered_in_json(in_process):
    response = in_process.post("/v1/traces", content=spec_example_bytes(), headers=JS)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.json() == {}
    json_format.ParseDict(response.json(), ExportTraceServiceResponse())  # an export response
    row = _stored(in_process, "5b8efff798038103d269b633813fc60c")["I'm a server span"]
    assert row["attributes"]["my.int.attr"] == "9007199254740993" and row["status_code"] == "Error"


def test_partial_success_reports_rejected_spans_in_both_encodings(in_process):
    request = make_request([{"name": "ok"}, {"name": "bad", "span_id": b"\x01\x02"}])
    response = in_process.post("/v1/traces", content=request.SerializeToString(), headers=PB)
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "span_id must be 8 non-zero bytes" in answer.partial_success.error_message
    doc = json.loads(spec_example_bytes())
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["endTimeUnixNano"] = "1"
    response = in_process.post("/v1/traces", content=json.dumps(doc), headers=JS)
    assert response.json()["partialSuccess"]["rejectedSpans"] == "1"
    json_format.ParseDict(response.json(), ExportTraceServiceResponse())
    assert _spans(in_process) == 1  # the good protobuf span; the JSON request's only span was rejected


def test_bad_requests_get_documented_status_and_message_and_the_receiver_keeps_serving(in_process_factory):
    client = in_process_factory(max_body_bytes=2 * 1024 * 1024)
    for label, headers, body, status, message in BAD_REQUESTS:
        response = client.post("/v1/traces", content=body, headers=headers)
        assert response.status_code == status, label
        if headers.get("Content-Type") == PB["Content-Type"] and status == 200:
            text = ExportTraceServiceResponse.FromString(response.content).partial_success.error_message
        elif headers.get("Content-Type") == PB["Content-Type"]:
            text = status_pb2.Status.FromString(response.content).message
        else:
            text = response.text
        assert message in text, f"{label}: {text}"
    good = client.post("/v1/traces", content=make_request([{}]).SerializeToString(), headers=PB)
    assert good.status_code == 200
    assert _spans(client) == 1


def test_metrics_and_logs_are_accepted_and_discarded(in_process):
    for path in ("/v1/metrics", "/v1/logs"):
        for headers, expected in ((PB, b""), (JS, b"{}")):
            response = in_process.post(path, content=b"", headers=headers)
            assert (response.status_code, response.content) == (200, expected)
    health = in_process.get("/api/v1/health").json()
    assert health["counters"]["discarded_metrics_requests"] == 2
    assert health["counters"]["discarded_logs_requests"] == 2
    assert health["spans"] == 0


def test_a_token_guards_ingest_and_reads(in_process_factory):
    client = in_process_factory(token="s3cret-token")
    body = make_request([{}]).SerializeToString()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
        response = client.post("/v1/traces", content=body, headers={**PB, **headers})
        assert response.status_code == 401
        assert "bearer token" in status_pb2.Status.FromString(response.content).message
        assert client.get("/api/v1/runs", headers=headers).status_code == 401
    ok = client.post("/v1/traces", content=body, headers={**PB, "Authorization": "Bearer s3cret-token"})
    assert ok.status_code == 200
    health = client.get("/api/v1/health", headers={"Authorization": "Bearer s3cret-token"})
    assert health.json()["spans"] == 1
