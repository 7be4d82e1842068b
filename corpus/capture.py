"""A loopback OTLP/HTTP capture server and the tracer set-up every generator uses.

The real OTLP/HTTP protobuf exporter (opentelemetry-exporter-otlp-proto-http) sends to a small
HTTP server on 127.0.0.1 that stores each request body byte for byte with its content type and
encoding, so the corpus holds exactly what a collector would have received.

Imports only the standard library at module level; the OpenTelemetry SDK is imported by
``start_tracing`` (it runs in the framework venv).
"""

from __future__ import annotations

import base64
import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class CapturedRequest:
    path: str
    content_type: str
    content_encoding: str | None
    body: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "body_b64": base64.b64encode(self.body).decode("ascii"),
        }


@dataclass
class CaptureServer:
    """HTTP server on a free loopback port that answers every OTLP POST with 200 and keeps it."""

    requests: list[CapturedRequest] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> CaptureServer:
        captured = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with captured._lock:
                    captured.requests.append(
                        CapturedRequest(
                            path=self.path,
                            content_type=self.headers.get("Content-Type", ""),
                            content_encoding=self.headers.get("Content-Encoding"),
                            body=body,
                        )
                    )
                # An empty ExportTraceServiceResponse: full success.
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() the capture server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def write_jsonl(self, path: Path) -> int:
        """Write every captured request as one JSON line; returns the number of requests."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, path.open("w") as out:
            for request in self.requests:
                out.write(json.dumps(request.to_json(), sort_keys=True) + "\n")
            return len(self.requests)


# Attributes frameworks use for a conversation / session id (what a collector may take as the run).
RUN_ID_KEYS = (
    "session.id",
    "gen_ai.conversation.id",
    "traceloop.association.properties.session_id",
    "traceloop.association.properties.thread_id",
    "traceloop.association.properties.conversation_id",
)


class RunRecorder:
    """A span processor that notes the trace ids of the root spans started during each labelled run.

    It only observes (it adds no span and no attribute), so the captured OTLP is exactly what the
    framework's instrumentation emits; the ground truth can then name each run's traces.
    """

    def __init__(self) -> None:
        self.current: str | None = None
        self.traces: dict[str, list[str]] = {}
        self.span_counts: dict[str, int] = {}
        # Conversation ids the framework itself put on the spans of each run (some frameworks give
        # a delegated sub-run an id of its own).
        self.emitted_ids: dict[str, list[str]] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.current is None:
            return
        self.span_counts[self.current] = self.span_counts.get(self.current, 0) + 1
        if span.parent is None:
            trace_id = format(span.context.trace_id, "032x")
            runs = self.traces.setdefault(self.current, [])
            if trace_id not in runs:
                runs.append(trace_id)

    def _on_ending(self, span: Any) -> None:
        return

    def on_end(self, span: Any) -> None:
        if self.current is None:
            return
        for key in RUN_ID_KEYS:
            value = (span.attributes or {}).get(key)
            if isinstance(value, str) and value:
                ids = self.emitted_ids.setdefault(self.current, [])
                if value not in ids:
                    ids.append(value)

    def shutdown(self) -> None:
        return

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    @contextmanager
    def run(self, label: str):
        self.current = label
        try:
            yield
        finally:
            self.current = None


@dataclass
class Tracing:
    provider: Any
    recorder: RunRecorder
    server: CaptureServer

    def flush(self) -> None:
        self.provider.force_flush()

    def finish(self, out_path: Path) -> int:
        self.provider.force_flush()
        self.provider.shutdown()
        count = self.server.write_jsonl(out_path)
        self.server.stop()
        return count


def start_tracing(service_name: str, set_global: bool = True) -> Tracing:
    """A TracerProvider exporting with the real OTLP/HTTP protobuf exporter to a capture server."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    server = CaptureServer().start()
    recorder = RunRecorder()
    # gzip, as most deployments send (the exporter's own compression option): it keeps the corpus
    # small, and the collector must decompress what real exporters send.
    exporter = OTLPSpanExporter(endpoint=server.endpoint, compression=Compression.Gzip)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(recorder)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if set_global:
        trace.set_tracer_provider(provider)
    return Tracing(provider=provider, recorder=recorder, server=server)
