"""Acknowledged means committed: SIGKILL `serve` during sustained ingest, restart, count."""

import random
import threading
import time

import duckdb
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class AckRecorder(SpanExporter):
    """Delegates to a real OTLP exporter and remembers the spans whose export was acknowledged."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.acked: set[tuple[str, str]] = set()
        self.failed = 0
        self._lock = threading.Lock()

    def export(self, spans):
        result = self.inner.export(spans)
        with self._lock:
            if result == SpanExportResult.SUCCESS:
                self.acked.update((f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in spans)
            else:
                self.failed += len(spans)
        return result

    def shutdown(self):
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _producer(recorder: AckRecorder, stop: threading.Event, name: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(
        BatchSpanProcessor(
            recorder, max_queue_size=20_000, max_export_batch_size=200, schedule_delay_millis=20
        )
    )
    tracer = provider.get_tracer("crash")
    index = 0
    while not stop.is_set():
        with tracer.start_as_current_span(
            f"{name}-{index}", attributes={"gen_ai.agent.id": name, "i": index}
        ):
            pass
        index += 1
        if index % 100 == 0:
            time.sleep(0.05)  # about 2,000 spans/s per producer: sustained, not a flood
    provider.force_flush(60_000)
    provider.shutdown()


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_acknowledged_span(serve_factory):
    rng = random.Random(20261130)
    server = serve_factory().start()
    recorders = [
        AckRecorder(HttpExporter(endpoint=f"{server.http_url}/v1/traces", timeout=5)),
        AckRecorder(GrpcExporter(endpoint=server.grpc_endpoint, insecure=True, timeout=5)),
    ]
    stop = threading.Event()
    threads = [
        threading.Thread(target=_producer, args=(recorder, stop, f"agent-{i}"), daemon=True)
        for i, recorder in enumerate(recorders)
    ]
    for thread in threads:
        thread.start()
    for _ in range(10):
        time.sleep(rng.uniform(0.3, 1.5))
        server.kill()
        time.sleep(rng.uniform(0.0, 0.3))
        server.start()
    time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(120)
    assert server.stop() == 0
    print(f"acked {sum(len(r.acked) for r in recorders)} failed {sum(r.failed for r in recorders)}")
    acked = set().union(*(r.acked for r in recorders))
    with duckdb.connect(str(server.db), read_only=True) as conn:
        stored = conn.execute(
            "SELECT TraceId, SpanId, count(*) OVER (PARTITION BY TraceId, SpanId) FROM spans"
        ).fetchall()
    stored_ids = {(t, s) for t, s, _ in stored}
    assert all(copies == 1 for _, _, copies in stored)
    assert len(acked) > 1000, "the test produced too little load to mean anything"
    missing = acked - stored_ids
    assert not missing, f"{len(missing)} acknowledged span(s) lost, e.g. {sorted(missing)[:3]}"
