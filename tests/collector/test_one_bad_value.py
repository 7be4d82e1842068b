"""One bad value costs only itself, never the request (issue 32, item 5). Before issue 32 each of
these answered 400 and lost the good span beside it."""

import json

import pytest
from google.protobuf.internal import encoder as _encoder

from collector.decode import JSON, PROTOBUF, decode_payload
from tests.otlp_builders import make_request


def _json_span(name: str, **fields) -> dict:
    span = {
        "traceId": "01" * 16,
        "spanId": "02" * 8 if name == "good" else "03" * 8,
        "name": name,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000000001000",
        "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": "r"}}],
    }
    return {**span, **fields}


def _beside_a_good_span(bad: dict) -> bytes:
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [_json_span("good"), bad]}]}]}
    return json.dumps(document).encode()


def _attribute(value: dict) -> list:
    return [{"key": "k", "value": value}]


def _deep(kind: str, levels: int) -> dict:
    value = {"stringValue": "leaf"}
    for _ in range(levels):
        if kind == "kvlist":
            value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
        else:
            value = {"arrayValue": {"values": [value]}}
    return value


REJECTED = {
    "int_value_past_int64": _json_span("bad", attributes=_attribute({"intValue": "9223372036854775808"})),
    "double_value_1e400": _json_span("bad", attributes=_attribute({"doubleValue": "__1e400__"})),
    "start_time_1e30": _json_span("bad", startTimeUnixNano=1e30),
    "start_time_2_64": _json_span("bad", startTimeUnixNano=str(2**64)),
    "attributes_as_object": _json_span("bad", attributes={"k": "v"}),
    "kvlist_nested_120": _json_span("bad", attributes=_attribute(_deep("kvlist", 120))),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_a_json_span_with_a_value_protobuf_cannot_take_is_rejected_alone(case):
    body = _beside_a_good_span(REJECTED[case]).replace(b'"__1e400__"', b"1e400")
    batch = decode_payload(body, JSON)
    assert (batch.accepted, batch.rejected) == (1, 1), batch.errors
    assert batch.columns["SpanName"] == ["good"]
    assert "spans[1]: the span could not be decoded" in batch.error_message


def test_a_lone_surrogate_in_a_json_string_is_replaced_and_the_span_kept():
    bad = _json_span("bad", attributes=_attribute({"stringValue": "cut mid-pair SURROGATE"}))
    body = _beside_a_good_span(bad).replace(b"SURROGATE", b"\\ud83d")
    body = body.replace(b'"name": "bad"', b'"name": "bad \\udc00"')
    batch = decode_payload(body, JSON)
    assert (batch.accepted, batch.rejected) == (2, 0), batch.errors
    assert sorted(batch.columns["SpanName"]) == ["bad \ufffd", "good"]
    attributes = dict(batch.columns["SpanAttributes"][batch.columns["SpanName"].index("bad \ufffd")])
    assert attributes["k"] == "cut mid-pair \ufffd"


def _field(number: int, body: bytes) -> bytes:
    return _encoder._VarintBytes(number << 3 | 2) + _encoder._VarintBytes(len(body)) + body


def _nested_any_value(kind: str, levels: int) -> bytes:
    """An AnyValue nesting ``levels`` arrays or kvlists around a string, built on the wire (the
    protobuf runtime cannot build or parse it past its recursion limit)."""
    value = _field(1, b"leaf")
    for _ in range(levels):
        value = (
            _field(5, _field(1, value))
            if kind == "array"
            else _field(6, _field(1, _field(1, b"k") + _field(2, value)))
        )
    return value


@pytest.mark.parametrize(("kind", "levels"), [("kvlist", 40), ("array", 60), ("array", 5000)])
def test_protobuf_nesting_past_upbs_limit_is_cut_not_the_request(kind, levels):
    request = make_request(
        [
            {"name": "good", "attrs": {"gen_ai.conversation.id": "r"}},
            {"name": "deep", "attrs": {"gen_ai.conversation.id": "r"}},
        ]
    )
    good, deep = request.resource_spans[0].scope_spans[0].spans
    deep_bytes = deep.SerializeToString() + _field(
        9, _field(1, b"deep") + _field(2, _nested_any_value(kind, levels))
    )
    scope = _field(2, good.SerializeToString()) + _field(2, deep_bytes)
    payload = _field(1, _field(2, scope))
    batch = decode_payload(payload, PROTOBUF)
    assert (batch.accepted, batch.rejected) == (2, 0), batch.errors
    value = dict(batch.columns["SpanAttributes"][batch.columns["SpanName"].index("deep")])["deep"]
    assert "[truncated: nesting deeper than 8]" in value
