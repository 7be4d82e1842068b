"""The hostile requests of issue 32, for ``benchmarks.hostile_requests``.

Each scenario is ``make(server) -> action``; the action sends the hostile request(s) while a
legitimate export goes over HTTP and over gRPC every second (10 s timeout each) and reports how
many of those were answered 200 / OK. ``SERVER_ARGS`` names the token and flags a scenario's
serve needs.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time

import grpc
import httpx

from benchmarks.h2_streams import EXPORT_PATH, HeaderOnlyStreams

TOKEN = "hostile-benchmark-token"
PB = {"Content-Type": "application/x-protobuf"}
SERVER_ARGS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "grpc_16_header_only_streams_with_token": (TOKEN, ()),
    "grpc_16_header_only_streams_without_token": (TOKEN, ()),
}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def legit_request() -> bytes:
    """One ordinary span in one resource, as protobuf bytes."""
    fixed = lambda n, v: _varint(n << 3 | 1) + v.to_bytes(8, "little")  # noqa: E731
    span = (
        _field(1, os.urandom(16)) + _field(2, os.urandom(8)) + _field(5, b"legit")
        + fixed(7, 1_700_000_000_000_000_000) + fixed(8, 1_700_000_000_000_001_000)
    )  # fmt: skip
    return _field(1, _field(2, _field(2, span)))


def _export_http(server) -> bool:
    try:
        response = httpx.post(
            f"{server.url}/v1/traces", content=legit_request(), headers={**PB, **server.headers}, timeout=10
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def _export_grpc(server) -> bool:
    metadata = [("authorization", f"Bearer {server.token}")] if server.token else []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT_PATH, request_serializer=None, response_deserializer=None)
        try:
            export(legit_request(), timeout=10, metadata=metadata)
        except grpc.RpcError:
            return False
    return True


def beside_legit_exports(server, hostile, min_seconds: float = 0.0) -> dict:
    """Run ``hostile()`` in a thread; meanwhile (and for at least ``min_seconds``) export one
    legitimate span over each transport every second. Returns the hostile result and the counts."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("hostile", hostile()), daemon=True)
    started = time.monotonic()
    thread.start()
    ok = {"http": [0, 0], "grpc": [0, 0]}
    while thread.is_alive() or time.monotonic() - started < min_seconds:
        for name, export in (("http", _export_http), ("grpc", _export_grpc)):
            ok[name][0] += export(server)
            ok[name][1] += 1
        time.sleep(1)
    thread.join()
    return {**result, **{f"legit_{k}_ok": f"{a}/{n}" for k, (a, n) in ok.items()}}


def _post(server, path: str, headers: dict, body: bytes):
    def send():
        try:
            response = httpx.post(
                f"{server.url}{path}", content=body, headers={**headers, **server.headers}, timeout=600
            )
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return response.status_code

    return send


def _header_only_streams(server, token: str | None, seconds: float = 15.0):
    def hold():
        held = HeaderOnlyStreams("127.0.0.1", server.grpc_port, 16, token=token)
        try:
            time.sleep(seconds)
            return {"streams_still_open_after_s": held.open_streams()}
        finally:
            held.close()

    return lambda: beside_legit_exports(server, hold)


def empty_gzip_members(total_bytes: int) -> bytes:
    """``total_bytes`` of empty gzip members (20 bytes each): one gzip body, nothing inside."""
    member = gzip.compress(b"", mtime=0)
    return member * (total_bytes // len(member))


def uncounted_parts(mib: int) -> dict[str, tuple[dict, bytes]]:
    """Bodies of ``mib`` MiB (gzip: a few KiB to 64 KiB on the wire) made of what no limit counted
    before issue 32: empty ResourceSpans, AnyValue array items, JSON values."""
    n = mib * 1024 * 1024
    gz = {**PB, "Content-Encoding": "gzip"}
    js = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    fixed = lambda f, v: _varint(f << 3 | 1) + v.to_bytes(8, "little")  # noqa: E731
    span = (
        _field(1, b"\x01" * 16) + _field(2, b"\x02" * 8) + _field(5, b"s")
        + fixed(7, 1_700_000_000_000_000_000) + fixed(8, 1_700_000_000_000_001_000)
    )  # fmt: skip
    long_key = _field(9, _field(1, b"k" * 70_000) + _field(2, _field(1, b"v")))  # to upb + Python
    items = n // 2 - 16
    array = _field(9, _field(1, b"a") + _field(2, _field(5, b"\x0a\x00" * items)))
    return {
        f"empty_resource_spans_{mib}MiB_gzip": (
            gz,
            gzip.compress(_field(1, _field(2, _field(2, span))) + b"\x0a\x00" * (n // 2)),
        ),
        f"anyvalue_array_items_{mib}MiB_gzip": (
            gz,
            gzip.compress(_field(1, _field(2, _field(2, span + array)))),
        ),
        f"python_path_empty_scope_spans_{mib}MiB_gzip": (
            gz,
            gzip.compress(_field(1, _field(2, _field(2, span + long_key)) + b"\x12\x00" * (n // 2))),
        ),
        f"json_empty_arrays_{mib}MiB_gzip": (js, gzip.compress(b"[" + b"[]," * (n // 3) + b"[]]")),
        f"json_empty_objects_{mib}MiB_gzip": (
            js,
            gzip.compress(b'{"resourceSpans": [' + b"{}," * (n // 3) + b"{}]}"),
        ),
    }


def _run_spans(server, run_id: str) -> list[dict]:
    response = httpx.get(f"{server.url}/api/v1/runs/{run_id}/spans", headers=server.headers, timeout=30)
    return response.json()["rows"] if response.status_code == 200 else []


def _json_span(name: str, run_id: str, **fields) -> dict:
    span = {
        "traceId": os.urandom(16).hex(),
        "spanId": os.urandom(8).hex(),
        "name": name,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000000001000",
        "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": run_id}}],
    }
    return {**span, **fields}


def _nested_any_value(levels: int) -> bytes:
    value = _field(1, b"leaf")
    for _ in range(levels):
        value = _field(6, _field(1, _field(1, b"k") + _field(2, value)))
    return value


def _pb_span(name: bytes, run_id: bytes, extra: bytes = b"") -> bytes:
    fixed = lambda n, v: _varint(n << 3 | 1) + v.to_bytes(8, "little")  # noqa: E731
    run = _field(9, _field(1, b"gen_ai.conversation.id") + _field(2, _field(1, run_id)))
    return (
        _field(1, os.urandom(16)) + _field(2, os.urandom(8)) + _field(5, name)
        + fixed(7, 1_700_000_000_000_000_000) + fixed(8, 1_700_000_000_000_001_000) + run + extra
    )  # fmt: skip


def _one_bad_value(server, case: str):
    """A good span and a span carrying one bad value, in one request: the status and whether the
    good span was stored (item 5)."""
    run_id = f"bad-value-{case}"
    attribute = lambda value: [{"key": "k", "value": value}]  # noqa: E731
    bad = {
        "json_int_past_int64": {"attributes": attribute({"intValue": "9223372036854775808"})},
        "json_time_2_64": {"startTimeUnixNano": str(2**64)},
        "json_attributes_as_object": {"attributes": {"k": "v"}},
        "json_lone_surrogate": {"attributes": attribute({"stringValue": "SURROGATE"})},
    }
    if case == "protobuf_kvlist_nested_40":
        deep = _field(9, _field(1, b"deep") + _field(2, _nested_any_value(40)))
        scope = _field(2, _pb_span(b"good", run_id.encode())) + _field(
            2, _pb_span(b"bad", run_id.encode(), deep)
        )
        headers, body = PB, _field(1, _field(2, scope))
    else:
        fields = bad[case]
        if case != "json_attributes_as_object":
            fields = {
                **fields,
                "attributes": fields.get("attributes", []) + _json_span("", run_id)["attributes"],
            }
        spans = [_json_span("good", run_id), _json_span("bad", run_id, **fields)]
        body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()
        headers, body = {"Content-Type": "application/json"}, body.replace(b"SURROGATE", b"cut \\ud83d")

    def send():
        status = _post(server, "/v1/traces", headers, body)()
        names = sorted(row["span_name"] for row in _run_spans(server, run_id))
        return {"status": status, "stored": names}

    return send


def _service_name_on_both_paths(server):
    """A double service.name (inf) on the compiled path and on the upb + Python path (item 9)."""
    resource = _field(
        1, _field(1, _field(1, b"service.name") + _field(2, _varint(4 << 3 | 1) + b"\x00" * 6 + b"\xf0\x7f"))
    )
    long_key = _field(9, _field(1, b"k" * 70_000) + _field(2, _field(1, b"v")))

    def send():
        out = {}
        for path, extra in (("compiled", b""), ("python", long_key)):
            run_id = f"service-{path}"
            body = _field(1, resource + _field(2, _field(2, _pb_span(b"s", run_id.encode(), extra))))
            _post(server, "/v1/traces", PB, body)()
            out[path] = [row["service"] for row in _run_spans(server, run_id)]
        return out

    return send


def _read_api_surrogates(server):
    """A lone surrogate in each lookup / calibration body, and a float enum in OTLP JSON (item 8)."""
    js = {"Content-Type": "application/json"}
    enum = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [_json_span("s", "enum", kind=0)]}]}]})

    def send():
        return {
            path: _post(server, path, js, body.encode())()
            for path, body in (
                ("/api/v1/runs/details", '{"run_ids": ["\\ud800"]}'),
                ("/api/v1/evidence-spans", '{"keys": [["\\udfff", "ab"]]}'),
                ("/api/v1/calibrate", '{"baseline_since": "\\ud83d", "dry_run": true}'),
                ("/v1/traces", enum.replace('"kind": 0', '"kind": 1e400')),
            )
        }

    return send


def _grpc_gzip(server, body: bytes):
    """``body`` as one OTLP/gRPC message, gzip-compressed on the wire (grpc-encoding: gzip)."""
    metadata = [("authorization", f"Bearer {server.token}")] if server.token else []

    def send():
        with grpc.insecure_channel(
            f"127.0.0.1:{server.grpc_port}", compression=grpc.Compression.Gzip
        ) as channel:
            export = channel.unary_unary(EXPORT_PATH, request_serializer=None, response_deserializer=None)
            try:
                export(body, timeout=600, metadata=metadata)
            except grpc.RpcError as exc:
                return exc.code().name
        return "OK"

    return lambda: beside_legit_exports(server, send)


def _foreign_host(server):
    """Every kind of endpoint with ``Host: evil.example.com`` (item 4: DNS rebinding)."""

    def send():
        out = {}
        for method, path, headers, body in (
            ("GET", "/api/v1/health", {}, None),
            ("GET", "/api/v1/runs", {}, None),
            ("POST", "/v1/traces", PB, legit_request()),
            ("POST", "/api/v1/calibrate", {"Content-Type": "application/json"}, b'{"dry_run": true}'),
        ):
            headers = {**headers, **server.headers, "Host": "evil.example.com"}
            out[f"{method} {path}"] = httpx.request(
                method, f"{server.url}{path}", headers=headers, content=body, timeout=60
            ).status_code
        return out

    return send


def scenarios() -> dict:
    """name -> make(server) -> action, for issue 32's items."""
    gz = {**PB, "Content-Encoding": "gzip"}
    members = empty_gzip_members(2 * 1024 * 1024)
    out = {
        name: (lambda s, h=h, b=b: lambda: beside_legit_exports(s, _post(s, "/v1/traces", h, b)))
        for mib in (8, 64)
        for name, (h, b) in uncounted_parts(mib).items()
    }
    return (
        out
        | {
            "grpc_16_header_only_streams_with_token": lambda s: _header_only_streams(s, TOKEN),
            "grpc_16_header_only_streams_without_token": lambda s: _header_only_streams(s, None),
            "gzip_empty_members_2MiB": lambda s: (
                lambda: beside_legit_exports(s, _post(s, "/v1/traces", gz, members))
            ),
            "gzip_empty_members_2MiB_metrics": lambda s: (
                lambda: beside_legit_exports(s, _post(s, "/v1/metrics", gz, members))
            ),
            "dns_rebinding_host_evil_example_com": _foreign_host,
            **{
                f"grpc_empty_resource_spans_{mib}MiB_gzip": lambda s, mib=mib: _grpc_gzip(
                    s, gzip.decompress(uncounted_parts(mib)[f"empty_resource_spans_{mib}MiB_gzip"][1])
                )
                for mib in (8, 64)
            },
            "lone_surrogates_and_float_enum": _read_api_surrogates,
            "service_name_double_inf_both_paths": _service_name_on_both_paths,
        }
        | {
            f"one_bad_value_{case}": lambda s, case=case: _one_bad_value(s, case)
            for case in (
                "json_int_past_int64",
                "json_time_2_64",
                "json_attributes_as_object",
                "json_lone_surrogate",
                "protobuf_kvlist_nested_40",
            )
        }
    )
