"""Every message and value of a request counts toward ``max_items_per_request``, on every path,
before memory is spent on it (issue 32, item 3): empty ResourceSpans and ScopeSpans, AnyValue
array items and kvlist entries at any depth, scope attributes, and every value of a JSON body.
Before issue 32 none of these counted, and one 63 KiB gzip request cost gigabytes."""

import json

import pytest

from collector import fastdecode
from collector.decode import JSON, PROTOBUF, DecodeLimits, RequestTooLargeError, decode_payload

LIMITS = DecodeLimits(max_items_per_request=1000)
N = 1001


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def _span(attrs: bytes = b"") -> bytes:
    fixed = lambda n, v: _varint(n << 3 | 1) + v.to_bytes(8, "little")  # noqa: E731
    return (
        _field(1, b"\x01" * 16) + _field(2, b"\x02" * 8) + _field(5, b"s")
        + fixed(7, 1_700_000_000_000_000_000) + fixed(8, 1_700_000_000_000_001_000) + attrs
    )  # fmt: skip


def _request(scope_spans: bytes, resource: bytes = b"") -> bytes:
    return _field(1, resource + scope_spans)


_PYTHON_PATH_KEY = _field(9, _field(1, b"k" * 70_000) + _field(2, _field(1, b"v")))


def _kv(key: bytes, any_value: bytes) -> bytes:
    return _field(1, key) + _field(2, any_value)


_NESTED_ITEMS = _field(5, _field(1, b"") * N)  # an AnyValue holding an array of N empty values
HOSTILE = {
    "empty_resource_spans": lambda extra: _request(_field(2, _field(2, _span(extra)))) + _field(1, b"") * N,
    "empty_scope_spans": lambda extra: _request(_field(2, _field(2, _span(extra))) + _field(2, b"") * N),
    "array_items": lambda extra: _request(
        _field(2, _field(2, _span(extra + _field(9, _kv(b"a", _field(5, _field(1, b"") * N))))))
    ),
    "nested_array_items": lambda extra: _request(
        _field(2, _field(2, _span(extra + _field(9, _kv(b"a", _field(5, _field(1, _NESTED_ITEMS)))))))
    ),
    "kvlist_entries": lambda extra: _request(
        _field(2, _field(2, _span(extra + _field(9, _kv(b"a", _field(6, _field(1, _kv(b"k", b"")) * N))))))
    ),
    "scope_attributes": lambda extra: _request(
        _field(2, _field(1, _field(3, _kv(b"k", b"")) * N) + _field(2, _span(extra)))
    ),
}


@pytest.mark.parametrize("path", ["compiled", "python"])
@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_every_message_and_value_counts_toward_max_items(shape, path):
    if path == "compiled" and not fastdecode.AVAILABLE:
        pytest.skip("collector._otlpfast is not built")
    payload = HOSTILE[shape](_PYTHON_PATH_KEY if path == "python" else b"")
    if path == "compiled":
        assert fastdecode.decode_fast(payload, DecodeLimits()) is not None  # really the compiled path
    else:
        assert fastdecode.decode_fast(payload, DecodeLimits()) is None
    with pytest.raises(RequestTooLargeError, match="max_items_per_request"):
        decode_payload(payload, PROTOBUF, LIMITS)
    assert decode_payload(payload, PROTOBUF, DecodeLimits()).accepted == 1  # under the default


def test_the_wire_count_and_the_compiled_decoder_agree_on_the_limit():
    for shape, build in HOSTILE.items():
        payload = build(b"")
        for limit in (N - 5, N + 10):
            limits = DecodeLimits(max_items_per_request=limit)
            compiled = wire = None
            try:
                fastdecode.decode_fast(payload, limits)
            except fastdecode.LimitExceededError as exc:
                compiled = exc.kind
            try:
                fastdecode.check_counts(payload, limits)
            except fastdecode.LimitExceededError as exc:
                wire = exc.kind
            assert compiled == wire, (shape, limit)


def _json_span(attributes: list) -> dict:
    return {"traceId": "01" * 16, "spanId": "02" * 8, "name": "s", "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000000000001000", "attributes": attributes}  # fmt: skip


def _json_request(attributes: list) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [_json_span(attributes)]}]}]}).encode()


@pytest.mark.parametrize(
    "body",
    [
        b'{"resourceSpans": [' + b",".join([b"[]"] * N) + b"]}",
        b'{"resourceSpans": [' + b",".join([b"{}"] * N) + b"]}",
        b"[" + b",".join([b"[]"] * N) + b"]",
        _json_request([{"key": "a", "value": {"arrayValue": {"values": [{}] * N}}}]),
    ],
    ids=["empty-array-items", "empty-resource-spans", "top-level-array", "anyvalue-array-items"],
)
def test_json_values_count_before_json_loads_builds_them(body):
    with pytest.raises(RequestTooLargeError, match="max_items_per_request"):
        decode_payload(body, JSON, LIMITS)


def test_commas_inside_json_strings_are_not_values():
    body = _json_request([{"key": "k", "value": {"stringValue": "," * 5000 + "[{" * 2000}}])
    assert decode_payload(body, JSON, LIMITS).accepted == 1
