"""End to end: the real `driftscope serve`, fed by the real OpenTelemetry SDK exporters.

What needs the process: the SDK exporters over HTTP and gRPC, gRPC itself, SIGTERM, the
embedding worker, ports. Request/response behaviour of the receiver and the read API runs in
process (tests/collector/test_http_receiver.py, tests/driftscope/test_api.py)."""

import time

import duckdb
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.otlp_builders import make_request

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


def test_serve_leaves_a_database_duckdb_can_open_after_sigterm(serve):
    _emit_crew(HttpExporter(endpoint=f"{serve.http_url}/v1/traces"), "run-close")
    assert serve.stop() == 0
    with duckdb.connect(str(serve.db), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 2
    assert "driftscope serve stopped" in serve.log()


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


def test_findings_take_in_the_goal_texts_the_embedding_worker_scores(serve_factory):
    """With the worker on, the materializer reads stored scores only: a drifted subtask of new
    texts reaches the findings tables once the worker has scored it (its write names the run)."""
    server = serve_factory(extra_args=["--embeddings", "true"]).start()
    run = "run-goal-refresh"
    common = {
        "gen_ai.agent.id": "planner",
        "driftscope.op": "delegate",
        "gen_ai.conversation.id": run,
        "driftscope.goal.root": "Plan a three-day team offsite in Lisbon for 25 people",
    }
    body = make_request(
        [
            {"attrs": {**common, "driftscope.goal.text": "Find venues in Lisbon for 25 people"}},
            {"attrs": {**common, "driftscope.goal.text": "Summarise the history of foreign-exchange markets"}},
        ]
    ).SerializeToString()  # fmt: skip
    assert httpx.post(f"{server.http_url}/v1/traces", content=body, headers=PB).status_code == 200
    deadline = time.monotonic() + 120
    drifted, summed = [], []
    while time.monotonic() < deadline:  # a pass brings goal_divergence, then run_summary up to date
        found = httpx.get(f"{server.http_url}/api/v1/metrics/goal_divergence", timeout=30).json()
        summary = httpx.get(f"{server.http_url}/api/v1/metrics/run_summary", timeout=30).json()
        drifted = [row for row in found["rows"] if row["run_id"] == run]
        summed = [row for row in summary["rows"] if row["run_id"] == run and row["drifted_subtasks"]]
        if drifted and summed:
            break
        time.sleep(0.5)
    assert found["source"] == summary["source"] == "table"
    assert [row["subtask"] for row in drifted] == ["Summarise the history of foreign-exchange markets"], found
    assert summed and summed[0]["drifted_subtasks"] == 1 and summed[0]["worst_divergence"] > 0.45, summary


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


def test_serve_evaluates_the_default_rules_without_any_alert_setting(serve_factory, monkeypatch):
    """Issue 34: `up` evaluated no rule unless a receiver or rules file was given, so the Alerts
    page said "No alert is firing" in green while runs failed. Rules are evaluated whenever serve
    runs; the page shows their state and that no receiver is configured (nothing is sent)."""
    from streamlit.testing.v1 import AppTest

    from analytics.read import describe_metrics
    from dashboard import app_main
    from dashboard.launch import SOURCE_ENV

    server = serve_factory(extra_args=["--alert-interval", "1s"]).start()
    body = make_request([{"attrs": {"gen_ai.agent.id": "planner"}}]).SerializeToString()
    assert httpx.post(f"{server.http_url}/v1/traces", content=body, headers=PB).status_code == 200
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not server.health()["alerting"].get("last_evaluation_at"):
        time.sleep(0.3)
    alerting = server.health()["alerting"]
    assert alerting["enabled"] and alerting["receivers"] == {} and alerting["last_evaluation_at"]
    detectors = [m["name"] for m in describe_metrics() if m["findings"]]
    assert [r["detector"] for r in alerting["rule_list"]] == detectors
    monkeypatch.setenv(SOURCE_ENV, server.http_url)
    at = AppTest.from_file(app_main, default_timeout=120)
    at.run()
    at.switch_page("views/alerts.py").run()
    assert not at.exception and not at.success  # nothing green while nothing is delivered
    assert any("No receiver is configured" in w.value for w in at.warning)
    rules = next(df.value for df in at.dataframe if "rule" in df.value.columns)
    assert list(rules["rule"]) == detectors and set(rules["state"]) == {"not firing"}
