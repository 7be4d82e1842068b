"""``guards.demo.run_demo`` streams scenarios over OTLP/HTTP (real exporter, real loopback receiver)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from guards.demo import run_demo, traces_url

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


class OtlpReceiver(ThreadingHTTPServer):
    """A minimal OTLP/HTTP protobuf receiver on loopback that keeps every request it decodes."""

    def __init__(self):
        self.requests: list[tuple[str, dict[str, str], ExportTraceServiceRequest]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self):
        return [
            (span, resource_spans.resource)
            for _, _, request in self.requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.requests.append((self.path, dict(self.headers), request))
        payload = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        return None


@pytest.fixture
def receiver():
    server = OtlpReceiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def attrs(span) -> dict:
    return {kv.key: kv.value.string_value for kv in span.attributes}


def truth_total(scenario: str) -> int:
    return sum(
        json.loads((SAMPLES / f"{scenario}_{variant}.truth.json").read_text())["span_counts"]["total"]
        for variant in ("unguarded", "guarded")
    )


def test_traces_url_appends_the_otlp_path():
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://127.0.0.1:9/v1/traces") == "http://127.0.0.1:9/v1/traces"


def test_demo_sends_both_variants_with_fresh_ids_and_current_time(receiver):
    started = time.time_ns()
    assert run_demo(receiver.url, "split_brain", live=False, token="s3cret", healthy_runs=0) == 0
    assert len(receiver.requests) == 2  # one request per run
    assert {path for path, _, _ in receiver.requests} == {"/v1/traces"}
    assert [h.get("Authorization", h.get("authorization")) for _, h, _ in receiver.requests] == [
        "Bearer s3cret"
    ] * 2
    spans = receiver.spans()
    assert len(spans) == truth_total("split_brain")
    runs = {attrs(span)["gen_ai.conversation.id"] for span, _ in spans}
    assert len(runs) == 2
    sample_runs = {
        json.loads((SAMPLES / f"split_brain_{v}.truth.json").read_text())["run_id"]
        for v in ("unguarded", "guarded")
    }
    assert not runs & sample_runs  # fresh ids, so a demo never collides with ingested sample traces
    assert all(span.start_time_unix_nano >= started for span, _ in spans)
    assert {attrs(span)["driftscope.variant"] for span, _ in spans} == {"unguarded", "guarded"}
    assert {r.attributes[0].value.string_value for _, r in spans} == {"crew-sim"}


def test_live_demo_streams_span_by_span(receiver):
    started = time.time_ns()
    assert run_demo(receiver.url, "recursion_loop", live=True, pace_s=0.01, healthy_runs=0) == 0
    spans = receiver.spans()
    assert len(spans) == truth_total("recursion_loop")
    assert len(receiver.requests) == len(spans)  # exported as each span ends
    ends = [span.end_time_unix_nano for _, _, request in receiver.requests for span in _all(request)]
    assert ends == sorted(ends) and ends[0] >= started
    assert ends[-1] - ends[0] > 10 * 10_000_000  # paced: at least ten 10 ms ticks apart


def test_each_scenario_goes_out_after_healthy_runs_of_its_crew(receiver):
    started = time.time_ns()
    assert run_demo(receiver.url, "ping_pong", live=False, healthy_runs=3) == 0
    assert len(receiver.requests) == 4  # per variant: the crew's history, then the scenario's run
    runs: dict[str, list] = {}
    for span, _ in receiver.spans():
        runs.setdefault(attrs(span)["gen_ai.conversation.id"], []).append(span)
    history = {run: spans for run, spans in runs.items() if "-ok-" in run}
    failing = {run: spans for run, spans in runs.items() if "-ok-" not in run}
    assert len(history) == 6 and len(failing) == 2
    assert sum(len(spans) for spans in failing.values()) == truth_total("ping_pong")
    for spans in history.values():
        assert {attrs(s)["driftscope.scenario"] for s in spans} == {"ping_pong"}
        assert max(s.end_time_unix_nano for s in spans) < started  # earlier runs of the crew
        assert not any(attrs(s).get("driftscope.outcome") in ("rejected", "error") for s in spans)
        bounced = [
            s
            for s in spans
            if attrs(s).get("driftscope.delegate.to") and attrs(s).get("gen_ai.agent.id") == "worker"
        ]
        assert bounced == []  # the worker does the task instead of handing it back


def _all(request):
    return [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]


def test_demo_reports_failure_when_no_collector_listens():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert run_demo(f"http://127.0.0.1:{port}", "ping_pong", live=False, timeout_s=1) == 1


def test_unknown_scenario_names_the_known_ones():
    with pytest.raises(ValueError, match="split_brain"):
        run_demo("http://127.0.0.1:1", "no_such_scenario", live=False)
