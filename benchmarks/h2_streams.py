"""A minimal HTTP/2 client that opens gRPC streams and never sends their message (issue 32).

It writes the connection preface and one HEADERS frame per stream (no DATA, no END_STREAM),
acknowledges the server's SETTINGS and PINGs so the connection stays healthy, and records the
streams the server resets. Used by the hostile-request benchmark and the gRPC slot test; no
third-party HTTP/2 library is needed for this little.
"""

from __future__ import annotations

import socket
import struct
import threading

EXPORT_PATH = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
_END_HEADERS, _ACK = 0x4, 0x1


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _hpack_int(value: int, prefix_bits: int = 7) -> bytes:
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([value])
    out = bytearray([top])
    value -= top
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman coding."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(raw_name)) + raw_name + _hpack_int(len(raw_value)) + raw_value


class HeaderOnlyStreams:
    """One TCP connection holding ``count`` gRPC Export streams that sent headers and nothing else."""

    def __init__(self, host: str, port: int, count: int, token: str | None = None) -> None:
        self.sock = socket.create_connection((host, port))
        self.reset: set[int] = set()
        self.goaway = False
        self.closed = threading.Event()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", EXPORT_PATH),
            (":authority", f"{host}:{port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        if token:
            headers.append(("authorization", f"Bearer {token}"))
        block = b"".join(_literal(name, value) for name, value in headers)
        frames = [_PREFACE, _frame(_SETTINGS, 0, 0)]
        self.streams = [1 + 2 * i for i in range(count)]
        frames += [_frame(_HEADERS, _END_HEADERS, stream, block) for stream in self.streams]
        self._lock = threading.Lock()
        self.sock.sendall(b"".join(frames))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def open_streams(self) -> int:
        """Streams the server has not reset (the ones still holding whatever they hold)."""
        return len(self.streams) - len(self.reset)

    def _recv_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def _send(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def _read(self) -> None:
        try:
            while True:
                head = self._recv_exact(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = self._recv_exact(length) if length else b""
                if kind == _SETTINGS and not flags & _ACK:
                    self._send(_frame(_SETTINGS, _ACK, 0))
                elif kind == _PING and not flags & _ACK:
                    self._send(_frame(_PING, _ACK, 0, payload))
                elif kind == _RST_STREAM or (kind == _HEADERS and stream and flags & 0x1):
                    self.reset.add(stream)
                elif kind == _GOAWAY:
                    self.goaway = True
        except OSError:
            pass
        finally:
            self.closed.set()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
