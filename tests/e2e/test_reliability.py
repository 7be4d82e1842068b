"""Overload, storage failure, retention and graceful shutdown of the real `driftscope serve`."""

import os
import subprocess
import threading
import time
from pathlib import Path

import duckdb
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests.e2e.test_crash_safety import AckRecorder
from tests.otlp_builders import make_request

PB = {"Content-Type": "application/x-protobuf"}


def _payloads(
    count: int, spans_per_request: int = 512, start_ns: int | None = None
) -> list[tuple[bytes, set]]:
    """Distinct protobuf requests and the (trace, span) ids each carries."""
    out = []
    base = start_ns or time.time_ns()
    for _ in range(count):
        trace = os.urandom(16)
        specs = [
            {
                "trace_id": trace,
                "span_id": os.urandom(8),
                "start": base,
                "end": base + 1000,
                "attrs": {"gen_ai.agent.id": "loader", "gen_ai.tool.name": "t", "payload": "x" * 120},
            }
            for _ in range(spans_per_request)
        ]
        ids = {(trace.hex(), spec["span_id"].hex()) for spec in specs}
        out.append((make_request(specs).SerializeToString(), ids))
    return out


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _sdk_spans_during_overload(exporter, service: str, count: int, threads: list, stop: threading.Event):
    """Start the load ``threads``, emit ``count`` spans through a real SDK pipeline meanwhile, stop
    the load and flush. Returns the recorder of acknowledged spans and the ids of all spans sent."""
    recorder = AckRecorder(exporter)
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        BatchSpanProcessor(
            recorder, max_queue_size=50_000, max_export_batch_size=500, schedule_delay_millis=50
        )
    )
    tracer = provider.get_tracer("overload")
    for thread in threads:
        thread.start()
    sent = set()
    for index in range(count):
        with tracer.start_as_current_span(f"{service}-{index}") as span:
            context = span.get_span_context()
            sent.add((f"{context.trace_id:032x}", f"{context.span_id:016x}"))
        if index % 500 == 0:
            time.sleep(0.3)
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join(120)
    provider.force_flush(180_000)
    provider.shutdown()
    return recorder, sent


@pytest.mark.slow
def test_overload_gets_429_with_retry_after_and_sdk_retries_deliver_everything(serve_factory):
    server = serve_factory(extra_args=["--queue-max-bytes", "256KiB"]).start()
    payloads = _payloads(40)
    statuses: list[int] = []
    retry_after: set[str] = set()
    health_latencies: list[float] = []
    stop = threading.Event()

    def blast(offset: int) -> None:
        with httpx.Client(timeout=60) as client:
            index = offset
            while not stop.is_set():
                body, _ = payloads[index % len(payloads)]
                response = client.post(f"{server.http_url}/v1/traces", content=body, headers=PB)
                statuses.append(response.status_code)
                if response.status_code == 429:
                    retry_after.add(response.headers.get("retry-after", ""))
                index += 1

    def watch() -> None:
        while not stop.is_set():
            started = time.monotonic()
            response = httpx.get(f"{server.http_url}/api/v1/health", timeout=30)
            assert response.status_code == 200
            assert response.json()["queued_bytes"] <= 256 * 1024 + 200_000  # one oversized request at most
            health_latencies.append(time.monotonic() - started)
            time.sleep(0.2)

    threads = [threading.Thread(target=blast, args=(i,), daemon=True) for i in range(10)]
    threads.append(threading.Thread(target=watch, daemon=True))
    exporter = HttpExporter(endpoint=f"{server.http_url}/v1/traces", timeout=120)
    recorder, sent = _sdk_spans_during_overload(exporter, "sdk-under-overload", 5000, threads, stop)

    assert statuses.count(429) > 0, "offered load never exceeded capacity; the test proves nothing"
    assert set(statuses) <= {200, 429}, set(statuses)
    # Retry-After starts at 1 s and grows with the length of the overload (at most 30 s).
    assert "1" in retry_after and all(1 <= int(value) <= 30 for value in retry_after)
    assert health_latencies and max(health_latencies) < 30
    assert recorder.acked == sent, f"{len(sent - recorder.acked)} SDK span(s) not delivered"
    peak_kib = _rss_kib(server.process.pid)
    assert peak_kib < 1_500_000, f"serve peak RSS {peak_kib} KiB"
    server.stop()
    with duckdb.connect(str(server.db), read_only=True) as conn:
        stored = set(
            conn.execute(
                "SELECT TraceId, SpanId FROM spans WHERE ServiceName = 'sdk-under-overload'"
            ).fetchall()
        )
    assert stored == sent


@pytest.fixture
def small_filesystem(tmp_path):
    mount = tmp_path / "small-fs"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24M", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.fail(f"this test needs root to mount a small tmpfs: {result.stderr.decode()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> None:
    with path.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (1 << 20))
                handle.flush()
        except OSError:
            pass


@pytest.mark.slow
def test_disk_full_answers_503_stays_up_and_resumes_by_itself(serve_factory, small_filesystem, tmp_path):
    server = serve_factory(db=small_filesystem / "driftscope.duckdb", log_dir=tmp_path).start()
    first, first_ids = _payloads(1, 50)[0]
    assert httpx.post(f"{server.http_url}/v1/traces", content=first, headers=PB).status_code == 200
    filler = small_filesystem / "filler"
    _fill(filler)
    refused = []
    for body, ids in _payloads(5, 512):
        response = httpx.post(f"{server.http_url}/v1/traces", content=body, headers=PB, timeout=30)
        if response.status_code == 503:
            refused.append(ids)
            assert response.headers.get("retry-after")
        else:
            assert response.status_code == 200
    assert refused, "no commit failed although the filesystem was full"
    health = server.health()
    assert health["status"] == "store_unavailable" and "No space left" in health["writer_error"]
    filler.unlink()
    later, later_ids = _payloads(1, 100)[0]
    deadline = time.monotonic() + 30
    while True:
        response = httpx.post(f"{server.http_url}/v1/traces", content=later, headers=PB, timeout=30)
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert response.status_code == 200
    assert server.health()["status"] == "ok"
    assert server.stop() == 0
    with duckdb.connect(str(server.db), read_only=True) as conn:
        stored = set(conn.execute("SELECT TraceId, SpanId FROM spans").fetchall())
    assert first_ids | later_ids <= stored
    assert not any(ids & stored for ids in refused), "a request answered 503 was stored anyway"


@pytest.mark.slow
def test_retention_deletes_expired_spans_in_the_background(serve_factory):
    server = serve_factory(extra_args=["--retention", "1h", "--retention-interval", "1s"]).start()
    old_ns = time.time_ns() - 3 * 3600 * 10**9
    old, old_ids = _payloads(1, 300, start_ns=old_ns)[0]
    new, new_ids = _payloads(1, 300)[0]
    assert httpx.post(f"{server.http_url}/v1/traces", content=old, headers=PB).status_code == 200
    assert httpx.post(f"{server.http_url}/v1/traces", content=new, headers=PB).status_code == 200
    deadline = time.monotonic() + 30
    while server.health()["retention_deleted"] < 300 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert server.health()["retention_deleted"] == 300
    assert server.health()["spans"] == 300
    assert server.stop() == 0
    with duckdb.connect(str(server.db), read_only=True) as conn:
        assert set(conn.execute("SELECT TraceId, SpanId FROM spans").fetchall()) == new_ids


@pytest.mark.slow
def test_sigterm_drains_and_commits_every_acknowledged_request(serve_factory):
    server = serve_factory().start()
    payloads = _payloads(60, 512)
    acked: list[set] = []
    errors: list[str] = []

    def send(chunk):
        with httpx.Client(timeout=60) as client:
            for body, ids in chunk:
                try:
                    response = client.post(f"{server.http_url}/v1/traces", content=body, headers=PB)
                except httpx.HTTPError as exc:
                    errors.append(type(exc).__name__)
                    return
                if response.status_code == 200:
                    acked.append(ids)

    threads = [threading.Thread(target=send, args=(payloads[i::6],)) for i in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    assert server.stop(timeout=60) == 0
    for thread in threads:
        thread.join(60)
    assert acked, "nothing was acknowledged before SIGTERM"
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{server.http_url}/v1/traces", content=payloads[0][0], headers=PB)
    with duckdb.connect(str(server.db), read_only=True) as conn:
        stored = set(conn.execute("SELECT TraceId, SpanId FROM spans").fetchall())
    for ids in acked:
        assert ids <= stored
    assert "driftscope serve stopped" in server.log()


@pytest.mark.slow
def test_grpc_overload_gets_resource_exhausted_with_retry_info_and_sdk_retries_deliver(serve_factory):
    import grpc
    from google.rpc import error_details_pb2
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    server = serve_factory(extra_args=["--queue-max-bytes", "256KiB"]).start()
    requests = [ExportTraceServiceRequest.FromString(body) for body, _ in _payloads(30)]
    codes: list = []
    retry_delays: set[int] = set()
    stop = threading.Event()

    def blast(offset: int) -> None:
        with grpc.insecure_channel(server.grpc_endpoint) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            index = offset
            while not stop.is_set():
                try:
                    stub.Export(requests[index % len(requests)], timeout=60)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as error:
                    codes.append(error.code())
                    info = dict(error.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
                    if info is not None:
                        retry_delays.add(error_details_pb2.RetryInfo.FromString(info).retry_delay.seconds)
                index += 1

    threads = [threading.Thread(target=blast, args=(i,), daemon=True) for i in range(8)]
    exporter = GrpcExporter(endpoint=server.grpc_endpoint, insecure=True, timeout=120)
    recorder, sent = _sdk_spans_during_overload(exporter, "grpc-sdk-under-overload", 3000, threads, stop)
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes, "offered load never exceeded capacity"
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert 1 in retry_delays and all(1 <= delay <= 30 for delay in retry_delays)
    assert recorder.acked == sent
