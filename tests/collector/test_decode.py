import json

import pytest
from google.protobuf import json_format

from collector.decode import (
    JSON,
    PROTOBUF,
    DecodeError,
    DecodeLimits,
    decode_payload,
    encode_hex_ids,
    timestamp_of,
)
from tests.otlp_builders import BASE_NS, make_request, spec_example_bytes


def _rows(batch):
    names = list(batch.columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*batch.columns.values(), strict=True)]


def test_protobuf_round_trip_keeps_every_field():
    request = make_request(
        [
            {
                "name": "write shared",
                "trace_id": bytes(range(1, 17)),
                "span_id": bytes(range(1, 9)),
                "parent": bytes(range(9, 17)),
                "kind": 3,
                "status": 2,
                "attrs": {
                    "gen_ai.agent.id": "writer",
                    "driftscope.hop": 2,
                    "x.float": 1.5,
                    "x.list": ["a", "b"],
                },
            }
        ]
    )
    batch = decode_payload(request.SerializeToString(), PROTOBUF)
    assert (batch.accepted, batch.rejected) == (1, 0)
    row = _rows(batch)[0]
    assert row["TraceId"] == bytes(range(1, 17)).hex()
    assert row["SpanId"] == "0102030405060708"
    assert row["ParentSpanId"] == bytes(range(9, 17)).hex()
    assert row["SpanKind"] == "Client"
    assert row["StatusCode"] == "Error"
    assert row["ServiceName"] == "crew"
    assert row["ScopeName"] == "tests" and row["ScopeVersion"] == "1.0"
    assert row["Duration"] == 500
    assert row["start_ns"] == BASE_NS and row["Timestamp"] == timestamp_of(BASE_NS)
    attrs = dict(row["SpanAttributes"])
    assert attrs == {
        "gen_ai.agent.id": "writer",
        "driftscope.hop": "2",
        "x.float": "1.5",
        "x.list": '["a","b"]',
    }
    assert row["agent_id"] == "writer" and row["hop"] == 2


def test_json_round_trip_equals_protobuf():
    request = make_request([{"attrs": {"gen_ai.tool.name": "search", "driftscope.step": 3}}])
    as_json = json.dumps(encode_hex_ids(json_format.MessageToDict(request))).encode()
    from_json = _rows(decode_payload(as_json, JSON))
    from_proto = _rows(decode_payload(request.SerializeToString(), PROTOBUF))
    for row in from_json + from_proto:
        row.pop("ingested_at")
    assert from_json == from_proto


def test_spec_example_shapes_decode():
    batch = decode_payload(spec_example_bytes(), JSON)
    row = _rows(batch)[0]
    assert row["TraceId"] == "5b8efff798038103d269b633813fc60c"
    assert row["SpanId"] == "eee19b7ec3c1b174"
    assert row["SpanKind"] == "Server"
    assert row["StatusCode"] == "Error" and row["StatusMessage"] == "it broke"
    attrs = dict(row["SpanAttributes"])
    assert attrs["my.int.attr"] == "9007199254740993"  # 64-bit int sent as a string, kept exact
    assert attrs["my.array"] == '["a",2]'
    assert row["Duration"] == 1_000_000_000


@pytest.mark.parametrize(
    "span, expected",
    [
        ({"trace_id": b"\x01" * 8}, "trace_id must be 16 non-zero bytes"),
        ({"trace_id": b"\x00" * 16}, "trace_id must be 16 non-zero bytes"),
        ({"span_id": b"\x01" * 4}, "span_id must be 8 non-zero bytes"),
        ({"parent": b"\x01" * 3}, "parent_span_id must be empty or 8 bytes"),
        ({"start": BASE_NS, "end": BASE_NS - 1}, "is before start_time_unix_nano"),
        ({"start": 0, "end": 0}, "start_time_unix_nano is 0"),
        ({"start": 2**64 - 2, "end": 2**64 - 1}, "overflow"),
    ],
)
def test_invalid_spans_are_rejected_and_the_rest_kept(span, expected):
    request = make_request([{"name": "good"}, {"name": "bad", **span}])
    batch = decode_payload(request.SerializeToString(), PROTOBUF)
    assert (batch.accepted, batch.rejected) == (1, 1)
    assert expected in batch.error_message
    assert batch.columns["SpanName"] == ["good"]


def test_json_non_hex_id_is_rejected_with_its_cause():
    doc = json.loads(spec_example_bytes())
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "not-hex-at-all"
    batch = decode_payload(json.dumps(doc).encode(), JSON)
    assert batch.rejected == 1 and batch.accepted == 0
    assert "is not hex" in batch.error_message


@pytest.mark.parametrize(
    "payload, content_type, message",
    [
        (b"\x0a\xff\xff\xff", PROTOBUF, "Could not decode the body as an OTLP ExportTraceServiceRequest"),
        (b"{not json", JSON, "Body is not valid JSON"),
        (b"[1, 2]", JSON, "Expected a JSON object"),
        (b'{"resourceSpans": {"a": 1}}', JSON, "resourceSpans must be a JSON array"),
        (b'{"resourceSpans": [{"scopeSpans": "x"}]}', JSON, "not a valid OTLP JSON"),
    ],
)
def test_undecodable_payloads_raise_with_a_reason(payload, content_type, message):
    with pytest.raises(DecodeError, match=message):
        decode_payload(payload, content_type)


def test_hostile_values_are_bounded():
    limits = DecodeLimits(max_attribute_bytes=100, max_depth=3, max_array_items=10)
    nested = {"a": {"b": {"c": {"d": "deep"}}}}
    request = make_request(
        [{"attrs": {"big": "x" * 1000, "nul": "a\x00b", "nested": nested, "huge": list(range(50))}}]
    )
    batch = decode_payload(request.SerializeToString(), PROTOBUF, limits)
    attrs = dict(batch.columns["SpanAttributes"][0])
    assert attrs["big"].startswith("x" * 100) and attrs["big"].endswith("[truncated 900 bytes]")
    assert attrs["nul"] == "a\ufffdb"
    assert "nesting deeper than 3" in attrs["nested"]
    huge = json.loads(attrs["huge"])
    assert len(huge) == 11 and huge[-1] == "[truncated 40 items]"


@pytest.mark.parametrize(
    "field", ['"kind": 1e400', '"status": {"code": 1e400}', '"kind": -1e400', '"startTimeUnixNano": "abc"']
)
def test_a_json_value_protobuf_cannot_take_rejects_its_span_with_the_reason(field):
    """Issue 32: a float enum past int range raised OverflowError, logged as a bug with a
    60-line traceback for a 100-byte body; now its span is rejected in partial_success."""
    body = (
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "01010101010101010101010101010101", '
        '"spanId": "0202020202020202", "name": "s", "startTimeUnixNano": "1", "endTimeUnixNano": "2", '
        + field
        + "}]}]}]}"
    ).encode()
    batch = decode_payload(body, JSON)
    assert (batch.accepted, batch.rejected) == (0, 1)
    assert "the span could not be decoded" in batch.error_message
