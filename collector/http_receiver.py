"""OTLP/HTTP receiver: POST /v1/traces (protobuf + JSON, gzip), /v1/metrics and /v1/logs.

Decodes into the shared ``DecodedBatch`` form and hands it to the same ``IngestQueue.submit``
the gRPC receiver uses; it never touches storage. Answers only after the writer has committed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from dataclasses import dataclass

from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from collector.auth import token_matches
from collector.decode import (
    JSON,
    PROTOBUF,
    DecodedBatch,
    DecodeError,
    DecodeLimits,
    RequestTooLargeError,
    decode_payload,
)
from collector.ingest_guard import DecodePool, PendingBytes, PendingBytesFullError
from collector.stats import IngestStats
from collector.writer import IngestQueue, QueueFullError, ShuttingDownError, StoreUnavailableError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverConfig:
    """What both receivers need to know: limits, timeouts and the optional token."""

    max_body_bytes: int = 64 * 1024 * 1024
    token: str | None = None
    limits: DecodeLimits = DecodeLimits()
    # Seconds a client may take to send its request line and headers / its whole body.
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    # Bytes all unfinished HTTP request bodies (read, not yet decoded) may hold together.
    max_pending_bytes: int = 256 * 1024 * 1024
    # Threads decoding request bodies (HTTP and gRPC share them): at most this many decode at once.
    decode_workers: int = 2


class BodyTooLargeError(ValueError):
    """The body, or its gzip-decompressed form, is over the configured limit (413)."""


def _status_body(content_type: str, code: int, message: str) -> bytes:
    """A google.rpc.Status body in the request's encoding, as OTLP/HTTP asks for errors."""
    status = status_pb2.Status(code=code, message=message)
    if content_type == PROTOBUF:
        return status.SerializeToString()
    return json.dumps({"code": code, "message": message}).encode()


def _error(content_type: str, http_status: int, grpc_code: int, message: str, headers=None) -> Response:
    media = PROTOBUF if content_type == PROTOBUF else JSON
    return Response(
        _status_body(media, grpc_code, message), status_code=http_status, media_type=media, headers=headers
    )


_FIRST_FEED = 256  # input bytes handed to a new gzip member first; doubled while it lasts
_MAX_FEED = 1024 * 1024


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """Decompress gzip ``data`` as gzip readers do: every member of a multi-member stream, zero
    padding after the last one allowed. ``DecodeError`` for anything else after a member or a
    truncated stream; ``BodyTooLargeError`` once the output of all members passes ``limit``.

    Linear in the body: each member is fed slices of a memoryview, small first and doubling, so
    zlib's ``unused_data`` (a copy of what it was given past the member's end) never copies more
    than the member's own size plus a few hundred bytes (issue 32: copying the rest of the body
    once per member made a body of empty 20-byte members quadratic)."""
    out: list[bytes] = []
    size = 0
    view = memoryview(data)
    offset, end = 0, len(data)
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        feed = _FIRST_FEED
        while not inflater.eof and offset < end:
            piece = view[offset : offset + feed]
            try:
                chunk = inflater.decompress(piece, limit - size + 1)
            except zlib.error as exc:
                raise DecodeError(f"Content-Encoding is gzip but the body is not valid gzip: {exc}") from exc
            size += len(chunk)
            if size > limit or inflater.unconsumed_tail:
                raise BodyTooLargeError(f"decompressed body exceeds the {limit}-byte limit")
            out.append(chunk)
            offset += len(piece) - len(inflater.unused_data)
            feed = min(feed * 2, _MAX_FEED)
        if not inflater.eof:
            raise DecodeError("Content-Encoding is gzip but the gzip stream is truncated")
        tail = inflater.flush()
        size += len(tail)
        if size > limit:
            raise BodyTooLargeError(f"decompressed body exceeds the {limit}-byte limit")
        out.append(tail)
        if offset == end or (data[offset] == 0 and not view[offset:].tobytes().strip(b"\x00")):
            return b"".join(out)
        if data[offset : offset + 2] != b"\x1f\x8b":
            raise DecodeError(
                f"Content-Encoding is gzip but {end - offset} byte(s) after the gzip stream are not another "
                "gzip member; send only the compressed body"
            )


class BodyTimeoutError(ValueError):
    """The body did not arrive within ``body_timeout`` seconds (408)."""


async def _read_body(
    request: Request, limit: int, pending: PendingBytes, timeout: float
) -> tuple[bytes, int]:
    """The body, at most ``limit`` bytes, within ``timeout`` seconds; every byte held counts
    against ``pending`` (the caller releases the returned count once the body is decoded)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"body of {declared} bytes exceeds the {limit}-byte limit")
    chunks = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                if size + len(chunk) > limit:
                    raise BodyTooLargeError(f"body exceeds the {limit}-byte limit")
                pending.reserve(len(chunk))
                size += len(chunk)
                chunks.append(chunk)
    except BaseException as exc:
        pending.release(size)
        if isinstance(exc, TimeoutError):
            raise BodyTimeoutError(
                f"request body not received within {timeout:g}s (body_timeout); send faster or smaller batches"
            ) from None
        raise
    return b"".join(chunks), size


def _gunzip_and_decode(body: bytes, encoding: str, media: str, config: ReceiverConfig) -> DecodedBatch:
    """What runs on the decode pool: gunzip (bounded) and decode."""
    if encoding == "gzip":
        body = gunzip_bounded(body, config.max_body_bytes)
    return decode_payload(body, media, config.limits)


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def build_ingest_routes(
    queue: IngestQueue,
    config: ReceiverConfig,
    stats: IngestStats,
    pool: DecodePool | None = None,
    pending: PendingBytes | None = None,
) -> list[Route]:
    """Starlette routes for the OTLP/HTTP endpoints, bound to ``queue``. Bodies are decoded on
    ``pool`` (never on the event loop) and held against ``pending`` until decoded."""
    pool = pool or DecodePool(config.decode_workers)
    pending = pending or PendingBytes(config.max_pending_bytes)
    closing = {"Connection": "close"}

    async def receive(request: Request) -> tuple[str, str, bytes, int] | Response:
        media = _media_type(request)
        if not token_matches(request.headers.get("authorization"), config.token):
            stats.add("http_unauthenticated")
            return _error(media, 401, 16, "missing or wrong bearer token (Authorization: Bearer <token>)")
        if media not in (PROTOBUF, JSON):
            stats.add("http_unsupported_media")
            return Response(
                f"Unsupported Content-Type {media or '(none)'!r}; send {PROTOBUF} or {JSON}".encode(),
                status_code=415,
                media_type="text/plain",
            )
        encoding = request.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity", "gzip"):
            return _error(media, 415, 3, f"Unsupported Content-Encoding {encoding!r}; use gzip or none")
        try:
            body, held = await _read_body(request, config.max_body_bytes, pending, config.body_timeout)
        except BodyTooLargeError as exc:
            stats.add("http_too_large")
            return _error(
                media, 413, 8, f"Request too large: {exc}; split the export into smaller batches", closing
            )
        except BodyTimeoutError as exc:
            stats.add("http_body_timeout")
            return _error(media, 408, 4, str(exc), closing)
        except PendingBytesFullError as exc:
            stats.add("http_pending_full")
            return _error(media, 503, 8, f"{exc}; retry later", {"Retry-After": "2", **closing})
        except ClientDisconnect:
            return Response(status_code=400)
        return media, encoding, body, held

    async def traces(request: Request) -> Response:
        received = await receive(request)
        if isinstance(received, Response):
            return received
        media, encoding, body, held = received
        try:
            batch = await pool.run(_gunzip_and_decode, body, encoding, media, config)
        except (BodyTooLargeError, RequestTooLargeError) as exc:
            stats.add("http_too_large")
            return _error(media, 413, 8, f"Request too large: {exc}; split the export into smaller batches")
        except DecodeError as exc:
            stats.add("http_bad_request")
            return _error(media, 400, 3, str(exc))
        except Exception as exc:  # noqa: BLE001 - no body may get a 5xx; the log says it is a bug
            logger.exception("decoding an OTLP/HTTP body failed unexpectedly")
            stats.add("http_decode_failures")
            return _error(
                media, 400, 3, f"the body could not be decoded ({type(exc).__name__}); see the serve log"
            )
        finally:
            del body
            pending.release(held)
        if batch.accepted:
            try:
                future = queue.submit(batch)
            except QueueFullError as exc:
                stats.add("http_throttled")
                return _error(
                    media,
                    429,
                    8,
                    "ingest queue is full; retry later",
                    headers={"Retry-After": str(exc.retry_after)},
                )
            except ShuttingDownError as exc:
                return _error(media, 503, 14, str(exc), headers={"Retry-After": "5"})
            try:
                await asyncio.wrap_future(future)
            except StoreUnavailableError as exc:
                stats.add("http_store_unavailable")
                return _error(media, 503, 14, str(exc), headers={"Retry-After": "2"})
        stats.add("http_trace_requests")
        stats.add("spans_accepted", batch.accepted)
        stats.add("spans_rejected", batch.rejected)
        return _success(media, batch)

    async def discard(request: Request) -> Response:
        received = await receive(request)
        if isinstance(received, Response):
            return received
        media, encoding, body, held = received
        try:
            if encoding == "gzip":
                # Still checked, so a bad body gets the same answer on every endpoint.
                await pool.run(gunzip_bounded, body, config.max_body_bytes)
        except BodyTooLargeError as exc:
            stats.add("http_too_large")
            return _error(media, 413, 8, f"Request too large: {exc}; split the export into smaller batches")
        except DecodeError as exc:
            stats.add("http_bad_request")
            return _error(media, 400, 3, str(exc))
        finally:
            del body
            pending.release(held)
        stats.add(f"discarded_{request.url.path.rsplit('/', 1)[-1]}_requests")
        # Empty Export*ServiceResponse: no fields set, identical bytes for metrics and logs.
        return Response(b"" if media == PROTOBUF else b"{}", media_type=media)

    return [
        Route("/v1/traces", traces, methods=["POST"]),
        Route("/v1/metrics", discard, methods=["POST"]),
        Route("/v1/logs", discard, methods=["POST"]),
    ]


def _success(media: str, batch: DecodedBatch) -> Response:
    response = ExportTraceServiceResponse()
    if batch.rejected:
        response.partial_success.rejected_spans = batch.rejected
        response.partial_success.error_message = batch.error_message
    if media == PROTOBUF:
        return Response(response.SerializeToString(), media_type=PROTOBUF)
    payload = json_format.MessageToDict(response)
    return Response(json.dumps(payload).encode(), media_type=JSON)
