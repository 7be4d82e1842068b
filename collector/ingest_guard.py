"""What keeps one hostile client from stalling or bloating the collector (issue 12).

- ``DecodePool``: every OTLP body (HTTP and gRPC) is gunzipped and decoded on a small, bounded
  thread pool, never on the event loop, so /api/v1/health and reads keep answering while a big
  request decodes, and at most ``workers`` decodes hold their working memory at once.
- ``PendingBytes``: a total bound on the bytes of HTTP request bodies read but not yet decoded
  (slow or stalled uploads); past it a request gets 503 with Retry-After instead of memory.
- ``guarded_h11_protocol``: uvicorn's HTTP/1.1 protocol with the timeouts uvicorn lacks: a
  connection must finish its request line and headers within ``header_timeout`` seconds (from
  its first byte, or from opening the connection), and a request body must arrive within
  ``body_timeout`` seconds of its headers; a connection past either is closed. Without it, idle
  or byte-a-second connections count against uvicorn's ``limit_concurrency`` forever and every
  other client gets 503.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DecodePool:
    """A bounded thread pool for decoding request bodies (shared by both receivers)."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="driftscope-decode")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the pool from the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the pool from a plain thread (a gRPC handler) and wait for it."""
        return self._executor.submit(fn, *args).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


class PendingBytesFullError(RuntimeError):
    """Unfinished request bodies already hold the configured number of bytes (503, retry)."""


class PendingBytes:
    """A thread-safe running total of body bytes held by requests that are not decoded yet."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> None:
        with self._lock:
            if self.held + n > self.limit:
                raise PendingBytesFullError(
                    f"unfinished requests already hold {self.held} of {self.limit} bytes (max_pending_bytes)"
                )
            self.held += n
            self.peak = max(self.peak, self.held)

    def release(self, n: int) -> None:
        with self._lock:
            self.held -= n


_TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"


def guarded_h11_protocol(header_timeout: float, body_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with header and body deadlines (pass as ``Config(http=...)``)."""

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _waiting_for: str | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm("headers", header_timeout)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._check_state()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._check_state()

        def _check_state(self) -> None:
            if self.transport is None or self.transport.is_closing():
                self._disarm()
                return
            theirs = self.conn.their_state
            if theirs is h11.IDLE:
                # Bytes of a request line or headers have arrived (idle keep-alive connections with
                # nothing received are uvicorn's keep-alive timeout's business).
                if self.conn.trailing_data[0] or self._waiting_for == "headers":
                    self._arm("headers", header_timeout)
                else:
                    self._disarm()
            elif theirs is h11.SEND_BODY:
                # A few seconds past the receiver's own body deadline, which answers 408 itself;
                # this one catches bodies no handler reads.
                self._arm("body", body_timeout + 5)
            else:
                self._disarm()

        def _arm(self, what: str, seconds: float) -> None:
            if self._waiting_for == what:
                return  # the deadline runs from the first byte, not the latest one
            self._disarm()
            self._waiting_for = what
            self._deadline = self.loop.call_later(seconds, self._timed_out, what, seconds)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = None
            self._waiting_for = None

        def _timed_out(self, what: str, seconds: float) -> None:
            self._deadline = None
            self._waiting_for = None
            if self.transport is None or self.transport.is_closing():
                return
            logger.info("closing %s: request %s not received within %gs", self.client, what, seconds)
            if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
                if what == "headers":
                    message = f"request headers not received within {seconds:g}s".encode()
                    self.transport.write(_TIMEOUT_RESPONSE % (len(message), message))
            self.transport.close()

    return GuardedH11Protocol
