"""Ingest: OTLP protobuf batches from concurrent connections to a fresh `driftscope serve`.

A request counts only when the server answered success with no rejected spans; the collector
answers only after the commit, so acknowledged spans/s is the durable rate. In the same process,
after the server is stopped, the very same payloads are decoded with
``collector.decode.decode_payload`` to give the decode-only rate and the ratio between the two.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from pathlib import Path

import duckdb
import grpc
import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from benchmarks.generator import stamp, template_payloads
from benchmarks.serve_proc import ServeProcess, proc_status_kib
from collector.decode import PROTOBUF, decode_payload

logger = logging.getLogger(__name__)

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TEMPLATES = 8  # distinct template requests; each send stamps one into a fresh namespace


class LoadClient:
    """Sends stamped payloads until ``requests`` were acknowledged, from ``connections`` threads."""

    def __init__(self, serve: ServeProcess, transport: str, templates: list[bytes], requests: int):
        self.serve = serve
        self.transport = transport
        self.templates = templates
        self.requests = requests
        self._next = itertools.count()
        self._lock = threading.Lock()
        self.acked_spans = 0
        self.acked_requests = 0
        self.retries = 0
        self.errors: list[str] = []

    def payload(self, index: int) -> bytes:
        """Request ``index``: template ``index % T`` stamped into namespace ``1 + index // T``."""
        return stamp(self.templates[index % len(self.templates)], 1 + index // len(self.templates))

    def _claim(self) -> int | None:
        index = next(self._next)
        return index if index < self.requests else None

    def _record(self, spans: int) -> None:
        with self._lock:
            self.acked_spans += spans
            self.acked_requests += 1

    def _http_worker(self, spans_per: list[int]) -> None:
        url = f"{self.serve.http_url}/v1/traces"
        with httpx.Client(timeout=120, headers={"Content-Type": PROTOBUF}) as client:
            while (index := self._claim()) is not None:
                body = self.payload(index)
                while True:
                    response = client.post(url, content=body)
                    if response.status_code in (429, 503):
                        self.retries += 1
                        time.sleep(0.05)
                        continue
                    break
                answer = ExportTraceServiceResponse.FromString(response.content)
                if response.status_code != 200 or answer.partial_success.rejected_spans:
                    self.errors.append(f"HTTP {response.status_code}: {response.content[:200]!r}")
                    continue
                self._record(spans_per[index % len(spans_per)])

    def _grpc_worker(self, spans_per: list[int]) -> None:
        # A local subchannel pool gives each worker its own connection.
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 64 << 20)]
        with grpc.insecure_channel(self.serve.grpc_target, options=options) as channel:
            export = channel.unary_unary(
                EXPORT_METHOD,
                request_serializer=None,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )
            while (index := self._claim()) is not None:
                body = self.payload(index)
                while True:
                    try:
                        answer = export(body, timeout=120)
                    except grpc.RpcError as exc:
                        if exc.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                            self.retries += 1
                            time.sleep(0.05)
                            continue
                        self.errors.append(f"gRPC {exc.code()}: {exc.details()}")
                        answer = None
                    break
                if answer is None or answer.partial_success.rejected_spans:
                    continue
                self._record(spans_per[index % len(spans_per)])

    def run(self, connections: int, spans_per: list[int]) -> float:
        """Run the workers; return the elapsed seconds from first send to last acknowledgement."""
        target = self._http_worker if self.transport == "http" else self._grpc_worker
        threads = [
            threading.Thread(target=target, args=(spans_per,), daemon=True) for _ in range(connections)
        ]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - start


class RssSampler(threading.Thread):
    """Samples the server's resident memory every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            rss = proc_status_kib(self.pid, "VmRSS")
            if rss:
                self.peak_kib = max(self.peak_kib, rss)
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def decode_rate(payloads: list[bytes], spans: int) -> float:
    """Spans/s of ``decode_payload`` over ``payloads`` in this process (one thread)."""
    start = time.perf_counter()
    decoded = 0
    for payload in payloads:
        decoded += decode_payload(payload, PROTOBUF).accepted
    elapsed = time.perf_counter() - start
    assert decoded == spans, (decoded, spans)
    return spans / elapsed


def run_ingest(
    workdir: Path,
    spans: int,
    transport: str = "http",
    connections: int = 4,
    batch_size: int = 512,
    embeddings: bool = False,
    decode_sample_spans: int = 50_000,
    seed: int = 7,
) -> dict:
    """Ingest ``spans`` spans into a fresh server; return rates, memory and disk use."""
    workdir.mkdir(parents=True, exist_ok=True)
    templates = template_payloads(TEMPLATES * batch_size, seed, batch_size)
    spans_per = [batch_size] * len(templates)
    requests = -(-spans // batch_size)
    db = workdir / f"ingest-{transport}-{'emb' if embeddings else 'noemb'}-{spans}.duckdb"
    for stale in (db, Path(f"{db}.wal")):
        stale.unlink(missing_ok=True)
    serve = ServeProcess(db, embeddings=embeddings).start()
    sampler = RssSampler(serve.pid)
    sampler.start()
    try:
        client = LoadClient(serve, transport, templates, requests)
        elapsed = client.run(connections, spans_per)
        health = serve.health()
        peak_hwm = serve.peak_rss_bytes()
    finally:
        sampler.stop()
        code = serve.stop()
    if code != 0:
        raise RuntimeError(f"serve exited with {code}: {serve.log()[-2000:]}")
    with duckdb.connect(str(db), read_only=True) as conn:
        stored = conn.execute("SELECT count(*) FROM spans").fetchone()[0]
    db_bytes = db.stat().st_size + (Path(f"{db}.wal").stat().st_size if Path(f"{db}.wal").exists() else 0)
    sample_requests = min(requests, max(1, decode_sample_spans // batch_size))
    sample = [client.payload(i) for i in range(sample_requests)]
    decode_only = decode_rate(sample, sum(spans_per[i % len(spans_per)] for i in range(sample_requests)))
    acked_rate = client.acked_spans / elapsed
    result = {
        "transport": transport,
        "connections": connections,
        "batch_spans": batch_size,
        "embeddings_worker": embeddings,
        "spans_requested": requests * batch_size,
        "spans_acknowledged": client.acked_spans,
        "spans_stored": stored,
        "errors": client.errors[:5],
        "error_count": len(client.errors),
        "throttled_retries": client.retries,
        "elapsed_s": round(elapsed, 3),
        "acked_spans_per_s": round(acked_rate, 1),
        "decode_only_spans_per_s": round(decode_only, 1),
        "decode_sample_spans": sum(spans_per[i % len(spans_per)] for i in range(sample_requests)),
        "ack_to_decode_ratio": round(acked_rate / decode_only, 4),  # ~0.04 since the decode plans
        "serve_peak_rss_bytes": max(peak_hwm or 0, sampler.peak_kib * 1024),
        "db_bytes": db_bytes,
        "bytes_per_span": round(db_bytes / stored, 1) if stored else None,
        "commits": health.get("commits"),
        "writer_busy_s": health.get("writer_busy_seconds"),
        "embedded_texts": None,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    if embeddings:
        with duckdb.connect(str(db), read_only=True) as conn:
            result["embedded_texts"] = conn.execute("SELECT count(*) FROM embeddings").fetchone()[0]
    logger.info(
        "ingest %s %d spans: %.0f acked spans/s, decode-only %.0f spans/s, ratio %.3f",
        transport,
        client.acked_spans,
        acked_rate,
        decode_only,
        result["ack_to_decode_ratio"],
    )
    db.unlink(missing_ok=True)
    return result
