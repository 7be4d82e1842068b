"""End to end: the real `driftscope serve`, fed by the real OpenTelemetry SDK exporters."""

import gzip
import json
import time

import duckdb
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.otlp_builders import make_request, spec_example_bytes

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def _emit_crew(exporter, run_id: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "crew-e2e"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    agent_attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.id": "planner",
        "gen_ai.conversation.id": run_id,
    }
    with tracer.start_as_current_span("invoke_agent planner", attributes=agent_attrs):
        with tracer.start_as_current_span(
            "execute_tool write_state",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "write_state",
                "gen_ai.conversation.id": run_id,
                "driftscope.op": "write",
                "driftscope.state.key": "plan",
                "driftscope.state.version": "tok-2",
                "driftscope.state.expected_version": "tok-1",
                "driftscope.outcome": "ok",
                "driftscope.constraints.carried": ["c1", "c2"],
                "driftscope.hop": 1,
            },
        ):
            pass
    provider.shutdown()


def _stored(serve, run_id):
    body = httpx.get(f"{serve.http_url}/api/v1/runs/{run_id}/spans", timeout=30).json()
    return {row["span_name"]: row for row in body["rows"]}


@pytest.mark.parametrize("transport", ["http", "http-gzip", "grpc", "grpc-gzip"])
def test_sdk_exporters_deliver_spans_with_attributes_mapped(module_serve, transport):
    serve = module_serve
    if transport.startswith("http"):
        compression = Compression.Gzip if transport.endswith("gzip") else Compression.NoCompression
        exporter = HttpExporter(endpoint=f"{serve.http_url}/v1/traces", compression=compression)
    else:
        import grpc

        compression = grpc.Compression.Gzip if transport.endswith("gzip") else grpc.Compression.NoCompression
        exporter = GrpcExporter(endpoint=serve.grpc_endpoint, insecure=True, compression=compression)
    run_id = f"run-{transport}"
    _emit_crew(exporter, run_id)
    spans = _stored(serve, run_id)
    assert set(spans) == {"invoke_agent planner", "execute_tool write_state"}
    tool = spans["execute_tool write_state"]
    assert tool["agent_id"] == "planner" and tool["agent_source"] == "ancestor"
    assert (tool["op"], tool["state_key"], tool["state_version"], tool["state_expected_version"]) == (
        "write", "plan", "tok-2", "tok-1",
    )  # fmt: skip
    assert tool["constraints_carried"] == ["c1", "c2"] and tool["hop"] == 1
    assert tool["service"] == "crew-e2e" and tool["tool_name"] == "write_state"
    assert tool["parent_span_id"] == spans["invoke_agent planner"]["span_id"]


def test_json_request_in_the_spec_shape_is_stored_and_answered_in_json(module_serve):
    serve = module_serve
    response = httpx.post(f"{serve.http_url}/v1/traces", content=spec_example_bytes(), headers=JS)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.json() == {}
    row = _stored(serve, "5b8efff798038103d269b633813fc60c")["I'm a server span"]
    assert row["attributes"]["my.int.attr"] == "9007199254740993" and row["status_code"] == "Error"


def test_partial_success_reports_rejected_spans_in_both_encodings(module_serve):
    serve = module_serve
    before = serve.health()["spans"]
    request = make_request([{"name": "ok"}, {"name": "bad", "span_id": b"\x01\x02"}])
    response = httpx.post(f"{serve.http_url}/v1/traces", content=request.SerializeToString(), headers=PB)
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "span_id must be 8 non-zero bytes" in answer.partial_success.error_message
    doc = json.loads(spec_example_bytes())
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["endTimeUnixNano"] = "1"
    response = httpx.post(f"{serve.http_url}/v1/traces", content=json.dumps(doc), headers=JS)
    assert response.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert serve.health()["spans"] == before + 1


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
    (
        "gzip bomb",
        {**PB, "Content-Encoding": "gzip"},
        _big_gzip(8 * 1024 * 1024),
        413,
        "decompressed body exceeds",
    ),
    (
        "all ids invalid",
        PB,
        make_request([{"trace_id": b"\x01" * 15}]).SerializeToString(),
        200,
        "trace_id must be",
    ),
]


def test_bad_requests_get_documented_status_and_message_and_server_keeps_serving(serve_factory):
    server = serve_factory(extra_args=["--max-body-bytes", "2MiB"]).start()
    for label, headers, body, status, message in BAD_REQUESTS:
        response = httpx.post(f"{server.http_url}/v1/traces", content=body, headers=headers, timeout=30)
        assert response.status_code == status, label
        if headers.get("Content-Type") == PB["Content-Type"] and status == 200:
            text = ExportTraceServiceResponse.FromString(response.content).partial_success.error_message
        elif headers.get("Content-Type") == PB["Content-Type"]:
            text = status_pb2.Status.FromString(response.content).message
        else:
            text = response.text
        assert message in text, f"{label}: {text}"
    good = httpx.post(
        f"{server.http_url}/v1/traces", content=make_request([{}]).SerializeToString(), headers=PB
    )
    assert good.status_code == 200
    assert server.health()["spans"] == 1


def test_grpc_body_that_is_not_an_export_request_gets_invalid_argument(module_serve):
    import grpc

    serve = module_serve
    before = serve.health()["spans"]
    method = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
    with grpc.insecure_channel(serve.grpc_endpoint) as channel:
        export = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            export(b"\x0a\xff\xff\xff\xff\x0f", timeout=30)  # a length running past the end
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ExportTraceServiceRequest" in info.value.details()
        reply = export(make_request([{}]).SerializeToString(), timeout=30)
    assert ExportTraceServiceResponse.FromString(reply).partial_success.rejected_spans == 0
    assert serve.health()["spans"] == before + 1


def test_token_guards_ingest_and_read_api_on_both_transports(serve_factory):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    server = serve_factory(token="s3cret-token").start()
    body = make_request([{}]).SerializeToString()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
        response = httpx.post(f"{server.http_url}/v1/traces", content=body, headers={**PB, **headers})
        assert response.status_code == 401
        assert "bearer token" in status_pb2.Status.FromString(response.content).message
        assert httpx.get(f"{server.http_url}/api/v1/runs", headers=headers).status_code == 401
    ok = httpx.post(
        f"{server.http_url}/v1/traces", content=body, headers={**PB, "Authorization": "Bearer s3cret-token"}
    )
    assert ok.status_code == 200
    with grpc.insecure_channel(server.grpc_endpoint) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Export(make_request([{}]), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stub.Export(make_request([{}]), timeout=10, metadata=[("authorization", "Bearer s3cret-token")])
    assert server.health()["spans"] == 2
    assert "s3cret-token" not in server.log()


def test_metrics_and_logs_are_accepted_and_discarded(module_serve):
    serve = module_serve
    before = serve.health()["counters"]
    for path in ("/v1/metrics", "/v1/logs"):
        for headers, expected in ((PB, b""), (JS, b"{}")):
            response = httpx.post(f"{serve.http_url}{path}", content=b"", headers=headers)
            assert (response.status_code, response.content) == (200, expected)
    counters = serve.health()["counters"]
    # A counter appears in health once it first counts.
    assert counters["discarded_metrics_requests"] == before.get("discarded_metrics_requests", 0) + 2
    assert counters["discarded_logs_requests"] == before.get("discarded_logs_requests", 0) + 2


def test_read_api_lists_metrics_and_serves_arrow(serve):
    import pyarrow as pa

    _emit_crew(HttpExporter(endpoint=f"{serve.http_url}/v1/traces"), "run-arrow")
    metrics = httpx.get(f"{serve.http_url}/api/v1/metrics").json()["metrics"]
    assert metrics and all({"name", "description", "columns", "params"} <= set(m) for m in metrics)
    response = httpx.get(
        f"{serve.http_url}/api/v1/runs", headers={"Accept": "application/vnd.apache.arrow.stream"}
    )
    table = pa.ipc.open_stream(response.content).read_all()
    assert table.column("run_id").to_pylist() == ["run-arrow"]
    for metric in metrics:
        answer = httpx.get(
            f"{serve.http_url}/api/v1/metrics/{metric['name']}", params={"since": "24h"}, timeout=120
        )
        assert answer.status_code == 200, (metric["name"], answer.text)
        assert answer.json()["columns"] == list(metric["columns"])


def test_read_api_rejects_bad_parameters(module_serve):
    base = module_serve.http_url
    assert httpx.get(f"{base}/api/v1/runs", params={"since": "yesterday-ish"}).status_code == 400
    assert "unknown parameter" in httpx.get(f"{base}/api/v1/runs", params={"sql": "select 1"}).json()["error"]
    assert httpx.get(f"{base}/api/v1/metrics/no_such_metric").status_code == 404
    assert httpx.get(f"{base}/api/v1/runs", params={"limit": "-1"}).status_code == 400


def test_serve_leaves_a_database_duckdb_can_open_after_sigterm(serve):
    _emit_crew(HttpExporter(endpoint=f"{serve.http_url}/v1/traces"), "run-close")
    assert serve.stop() == 0
    with duckdb.connect(str(serve.db), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 2
    assert "driftscope serve stopped" in serve.log()


def test_json_response_body_is_an_export_response(module_serve):
    response = httpx.post(f"{module_serve.http_url}/v1/traces", content=spec_example_bytes(), headers=JS)
    json_format.ParseDict(response.json(), ExportTraceServiceResponse())


def test_thresholds_endpoint_lists_what_is_in_force(module_serve):
    rows = httpx.get(f"{module_serve.http_url}/api/v1/thresholds").json()["rows"]
    by_name = {row["name"]: row for row in rows}
    assert by_name["goal_divergence"]["value"] == 0.80 and by_name["goal_divergence"]["calibrated"] is False
    assert all({"value", "version", "method", "provenance", "calibrated"} <= set(row) for row in rows)


def test_embedding_worker_embeds_goal_texts_in_the_background(serve_factory):
    server = serve_factory(extra_args=["--embeddings", "true"]).start()
    body = make_request(
        [
            {"attrs": {"gen_ai.agent.id": "planner", "driftscope.op": "delegate",
                       "driftscope.goal.root": "Analyze Q3 revenue trends",
                       "driftscope.goal.text": "Summarise the history of foreign-exchange markets"}},
        ]
    ).SerializeToString()  # fmt: skip
    assert httpx.post(f"{server.http_url}/v1/traces", content=body, headers=PB).status_code == 200
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        health = server.health()
        if health["embeddings"] >= 2:
            break
        time.sleep(0.5)
    assert health["embeddings"] >= 2, health
    assert health["embedding_worker"]["enabled"] and health["embedding_worker"]["last_error"] is None


@pytest.mark.parametrize("taken", ["grpc_port", "http_port"])
def test_a_port_taken_after_the_cli_checked_it_is_a_clean_error_naming_flag_and_variable(tmp_path, taken):
    """The CLI probes both ports first; a process binding one in between (the race) must still get a
    message naming the setting, not a traceback, and the database must be released."""
    import socket

    from driftscope.serve import ServeConfig, run_serve
    from driftscope.settings import BY_NAME, ConfigError
    from tests.serve_helpers import free_port

    db = tmp_path / "race.duckdb"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        ports = {"http_port": free_port(), "grpc_port": free_port(), taken: holder.getsockname()[1]}
        with pytest.raises(ConfigError) as error:
            run_serve(ServeConfig(db=str(db), embeddings=False, **ports))
    setting = BY_NAME[taken]
    message = str(error.value)
    assert f"127.0.0.1:{ports[taken]} ({setting.flag}): another process took the port" in message
    assert f"{setting.flag} PORT or {setting.env}=PORT" in message
    duckdb.connect(str(db)).close()  # the writer drained and closed the file
