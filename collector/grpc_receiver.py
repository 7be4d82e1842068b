"""OTLP/gRPC receiver: ``TraceService/Export`` (gzip handled by grpcio).

The method is registered with a pass-through request deserializer, so the handler gets the
request bytes and decodes them exactly as the HTTP receiver does (``decode_payload``, with its
compiled fast path) into the same ``DecodedBatch``, submitted to the same queue; it waits for the
commit before answering. A body that is not an ``ExportTraceServiceRequest`` gets
INVALID_ARGUMENT with the reason.

grpcio counts a call against ``maximum_concurrent_rpcs`` from its HEADERS frame, message or not
(issue 32). So the method is registered as stream-unary: the handler runs as soon as the call
holds a slot, checks the token from the metadata before waiting for anything, and cancels the
call if its one message has not arrived within ``body_timeout``. One connection (one peer
address and port) may have at most ``CALLS_PER_CONNECTION`` calls in progress: past it a call
gets RESOURCE_EXHAUSTED with RetryInfo at once, which the exporters retry. (Not HTTP/2's
``grpc.max_concurrent_streams``: clients open streams before they read the server's SETTINGS,
and grpcio answers the excess REFUSED_STREAM, which clients see as UNAVAILABLE; several
channels of one process share one connection.) Connections that go idle or stop answering
keepalive pings are closed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from collector.auth import token_matches
from collector.decode import PROTOBUF, DecodeError, decode_payload
from collector.http_receiver import ReceiverConfig
from collector.ingest_guard import DecodePool, PendingBytes, PendingBytesFullError
from collector.stats import IngestStats
from collector.writer import IngestQueue, QueueFullError, ShuttingDownError, StoreUnavailableError

logger = logging.getLogger(__name__)


def _retry_metadata(seconds: int, message: str) -> tuple[tuple[str, bytes], ...]:
    """RetryInfo for RESOURCE_EXHAUSTED, as the OTLP spec asks: the OpenTelemetry SDK exporters read
    ``google.rpc.retryinfo-bin``; Collector-style clients read it from ``grpc-status-details-bin``."""
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds))
    detail = any_pb2.Any()
    detail.Pack(retry)
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message, details=[detail])
    return (
        ("google.rpc.retryinfo-bin", retry.SerializeToString()),
        ("grpc-status-details-bin", status.SerializeToString()),
    )


_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"

# Calls one connection may have in progress: a quarter of the default 16 slots, so one
# connection can never hold them all.
CALLS_PER_CONNECTION = 4


def server_options(config: ReceiverConfig) -> list[tuple[str, int]]:
    """grpcio channel arguments bounding what a connection may hold and for how long."""
    return [
        ("grpc.max_receive_message_length", config.max_body_bytes),
        ("grpc.max_send_message_length", 4 * 1024 * 1024),
        # grpc sets SO_REUSEPORT by default: a second collector on a taken port would start
        # and the kernel would split the traffic between the two. Refuse the port instead.
        ("grpc.so_reuseport", 0),
        # A connection with no call in progress for 5 minutes is closed (GOAWAY).
        ("grpc.max_connection_idle_ms", 5 * 60 * 1000),
        # The server pings a connection quiet for 60 s and closes it if no answer comes in 20 s.
        ("grpc.keepalive_time_ms", 60 * 1000),
        ("grpc.keepalive_timeout_ms", 20 * 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        # Clients may ping at most every 10 s; two pings faster than that close the connection.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10 * 1000),
        ("grpc.http2.max_ping_strikes", 2),
    ]


class GrpcBindError(OSError):
    """The gRPC port could not be bound (usually: another process listens on it)."""


class TraceServiceReceiver:
    """Implements ``opentelemetry.proto.collector.trace.v1.TraceService``."""

    def __init__(
        self,
        queue: IngestQueue,
        config: ReceiverConfig,
        stats: IngestStats,
        pool: DecodePool | None = None,
        pending: PendingBytes | None = None,
    ) -> None:
        self.queue = queue
        self.config = config
        self.stats = stats
        # Decoding runs on the pool the HTTP receiver shares: grpcio's handler threads wait on it,
        # so no more than ``config.decode_workers`` requests hold decoding memory at once.
        self.pool = pool or DecodePool(config.decode_workers)
        # Messages waiting for the pool count against the bytes HTTP bodies also count against.
        self.pending = pending or PendingBytes(config.max_pending_bytes)
        self._calls: dict[str, int] = {}  # calls in progress per connection (context.peer())
        self._calls_lock = threading.Lock()

    def Export(self, requests: Iterator[bytes], context):  # noqa: N802 - name fixed by the protocol
        metadata = dict(context.invocation_metadata())
        if not token_matches(metadata.get("authorization"), self.config.token):
            self.stats.add("grpc_unauthenticated")
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (authorization metadata)"
            )
        peer = context.peer()
        if not self._enter(peer):
            self.stats.add("grpc_connection_busy")
            message = f"this connection already has {CALLS_PER_CONNECTION} calls in progress; retry later"
            context.set_trailing_metadata(_retry_metadata(1, message))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        try:
            return self._export(requests, context)
        finally:
            self._leave(peer)

    def _enter(self, peer: str) -> bool:
        with self._calls_lock:
            held = self._calls.get(peer, 0)
            if held >= CALLS_PER_CONNECTION:
                return False
            self._calls[peer] = held + 1
            return True

    def _leave(self, peer: str) -> None:
        with self._calls_lock:
            held = self._calls.pop(peer) - 1
            if held:
                self._calls[peer] = held

    def _export(self, requests: Iterator[bytes], context):
        request = self._first_message(requests, context)
        if request is None:
            return None  # cancelled or closed without a message; nobody is waiting for an answer
        try:
            self.pending.reserve(len(request))
        except PendingBytesFullError as exc:
            self.stats.add("grpc_pending_full")
            message = f"{exc}; retry later"
            context.set_trailing_metadata(_retry_metadata(2, message))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        try:
            batch = self.pool.call(decode_payload, request, PROTOBUF, self.config.limits)
        except DecodeError as exc:
            self.stats.add("grpc_bad_requests")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # noqa: BLE001 - no request may get UNKNOWN; the log says it is a bug
            logger.exception("decoding an OTLP/gRPC request failed unexpectedly")
            self.stats.add("grpc_decode_failures")
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request could not be decoded ({type(exc).__name__}); see the serve log",
            )
        finally:
            self.pending.release(len(request))
        if batch.accepted:
            try:
                future = self.queue.submit(batch)
            except QueueFullError as exc:
                self.stats.add("grpc_throttled")
                context.set_trailing_metadata(
                    _retry_metadata(exc.retry_after, "ingest queue is full; retry later")
                )
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "ingest queue is full; retry later")
            except ShuttingDownError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            try:
                future.result()
            except StoreUnavailableError as exc:
                self.stats.add("grpc_store_unavailable")
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        self.stats.add("grpc_trace_requests")
        self.stats.add("spans_accepted", batch.accepted)
        self.stats.add("spans_rejected", batch.rejected)
        response = trace_service_pb2.ExportTraceServiceResponse()
        if batch.rejected:
            response.partial_success.rejected_spans = batch.rejected
            response.partial_success.error_message = batch.error_message
        return response

    def _first_message(self, requests: Iterator[bytes], context) -> bytes | None:
        """The call's message, or None when it did not arrive within ``body_timeout`` (the call
        is then cancelled, giving its slot back) or the client ended the call without one."""
        timer = threading.Timer(self.config.body_timeout, self._cancel_waiting, (context,))
        timer.daemon = True
        timer.start()
        try:
            return next(requests)
        except (StopIteration, grpc.RpcError):
            return None
        finally:
            timer.cancel()

    def _cancel_waiting(self, context) -> None:
        self.stats.add("grpc_message_timeout")
        logger.info(
            "cancelling a gRPC call from %s: no message within %gs (body_timeout)",
            context.peer(),
            self.config.body_timeout,
        )
        context.cancel()


def start_grpc_server(
    host: str,
    port: int,
    queue: IngestQueue,
    config: ReceiverConfig,
    stats: IngestStats,
    workers: int = 16,
    pool: DecodePool | None = None,
    pending: PendingBytes | None = None,
) -> grpc.Server:
    """Start the gRPC server on ``host:port`` and return it (already serving)."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="driftscope-grpc"),
        options=server_options(config),
        # Past this many calls in progress grpcio answers RESOURCE_EXHAUSTED instead of queueing
        # (and holding) more request messages than there are handlers.
        maximum_concurrent_rpcs=workers,
    )
    receiver = TraceServiceReceiver(queue, config, stats, pool, pending)
    # Stream-unary so the handler starts before the message arrives (see the module docstring);
    # a unary client cannot tell the difference.
    handler = grpc.stream_unary_rpc_method_handler(
        receiver.Export,
        request_deserializer=None,  # the handler decodes the raw bytes itself
        response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {"Export": handler}),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio raises RuntimeError("Failed to bind to address ...")
        bound = 0
        reason = str(exc)
    else:
        reason = "no address could be bound"
    if bound == 0:
        # The port may have been free when the CLI checked it and taken since (another process
        # bound it in between): the caller turns this into a message naming its setting.
        server.stop(None)
        raise GrpcBindError(f"could not bind the gRPC port {address}: {reason}")
    server.start()
    return server
