"""The compiled decoder (collector.fastdecode / collector._otlpfast) against the Python path.

Invariant everywhere: ``decode_fast(payload, limits)`` is either None (the caller falls back to
the Python path) or exactly the raw columns ``decode_export_request(parse_protobuf(payload),
limits)`` produces (OpenTelemetry columns and attribute lists: same values, same Python types,
same errors); for payloads the Python path cannot parse it is None. The coordination columns
are mapped from those raw columns by one function for both paths (collector.conventions), so
they are not compared here (tests/collector/test_conventions.py tests the mapping). Where the fast path is expected to handle a payload, tests also assert it did
not fall back.
"""

from __future__ import annotations

import glob
import json
import math
import pathlib
import random
import struct
import subprocess
import sys
import threading
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from benchmarks.generator import template_payloads
from collector import fastdecode
from collector.conventions import (
    _DRIFTSCOPE_FIELDS,
    COORDINATION_COLUMNS,
)
from collector.decode import (
    PROTOBUF,
    SPAN_COLUMNS,
    DecodeError,
    DecodeLimits,
    decode_export_request,
    decode_payload,
    parse_json,
    parse_protobuf,
)
from collector.fastdecode import decode_fast
from tests.collector.test_decode_fuzz import LIMITS as FUZZ_LIMITS
from tests.collector.test_decode_fuzz import _request, span_specs
from tests.otlp_builders import BASE_NS, make_request, set_attr

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "sample_traces"
DEFAULT = DecodeLimits()
EPOCH = datetime(1970, 1, 1)
ATTRIBUTE_COLUMNS = ("SpanAttributes", "ResourceAttributes")
OUTPUT_COLUMNS = [
    c for c in SPAN_COLUMNS if c not in ATTRIBUTE_COLUMNS + COORDINATION_COLUMNS + ("ingested_at",)
]


def quick(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


def _micros(value):
    """Timestamp as int microseconds (the Python path may hand back a datetime)."""
    return (value - EPOCH) // timedelta(microseconds=1) if isinstance(value, datetime) else value


def _pairs_per_span(offsets, keys, values):
    return [
        list(zip(keys[offsets[i] : offsets[i + 1]], values[offsets[i] : offsets[i + 1]], strict=True))
        for i in range(len(offsets) - 1)
    ]


def _normalise_pairs(per_span):
    return [[tuple(pair) for pair in pairs] for pairs in per_span]


def check_equivalent(payload: bytes, limits: DecodeLimits = DEFAULT) -> bool:
    """Assert the fast result is None or equals the Python path; True when it was not None."""
    fast = decode_fast(payload, limits)
    try:
        request = parse_protobuf(payload)
    except DecodeError:
        assert fast is None, "the Python path rejects this payload, the fast path must not decode it"
        return False
    if fast is None:
        return False
    batch = decode_export_request(request, limits)
    assert (fast.accepted, fast.rejected) == (batch.accepted, batch.rejected)
    assert fast.errors == batch.errors
    reference = batch.columns
    assert list(fast.columns) == OUTPUT_COLUMNS
    for name in OUTPUT_COLUMNS:
        expected = reference[name]
        got = fast.columns[name]
        if name == "Timestamp":
            expected = [_micros(v) for v in expected]
        assert len(got) == len(expected) == fast.accepted, name
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            same = a == b or (
                isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
            )
            assert same and type(a) is type(b), f"{name}[{index}]: fast {a!r}, python {b!r}"
            if isinstance(a, list):
                assert [type(x) for x in a] == [type(x) for x in b], f"{name}[{index}] item types"
    for name, triple in (
        ("SpanAttributes", fast.span_attributes),
        ("ResourceAttributes", fast.resource_attributes),
    ):
        offsets, keys, values = triple
        assert len(offsets) == fast.accepted + 1 and offsets[0] == 0
        assert all(type(k) is str for k in keys) and all(type(v) is str for v in values)
        assert _pairs_per_span(offsets, keys, values) == _normalise_pairs(reference[name]), name
    return True


def _payload(spans: list[dict], **kwargs) -> bytes:
    return make_request(spans, **kwargs).SerializeToString()


def _ids(index: int) -> dict:
    return {"trace_id": bytes([1 + index % 200]) * 16, "span_id": (index + 1).to_bytes(8, "big")}


# --- wire helpers for hand-built payloads ------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _len_field(field: int, body: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(body)) + body


def _wrap_span(span_body: bytes, resource: bytes = b"", scope: bytes = b"") -> bytes:
    """ExportTraceServiceRequest{resource_spans{resource, scope_spans{scope, spans}}} around a span."""
    scope_spans = (_len_field(1, scope) if scope else b"") + _len_field(2, span_body)
    resource_spans = (_len_field(1, resource) if resource else b"") + _len_field(2, scope_spans)
    return _len_field(1, resource_spans)


def _good_span_body(name: bytes = b"s") -> bytes:
    return (
        _len_field(1, b"\x01" * 16)
        + _len_field(2, b"\x02" * 8)
        + _len_field(5, name)
        + _tag(7, 1)
        + struct.pack("<Q", BASE_NS)
        + _tag(8, 1)
        + struct.pack("<Q", BASE_NS + 10)
    )


def _kv(key: bytes, any_value: bytes) -> bytes:
    return _len_field(1, key) + _len_field(2, any_value)


# --- the module itself -------------------------------------------------------------------------


def test_extension_is_built():
    assert fastdecode.AVAILABLE, "build it: .venv/bin/python setup.py build_ext --inplace"
    assert list(fastdecode.OTEL_OUTPUT_COLUMNS) == OUTPUT_COLUMNS


def test_empty_request_decodes_to_no_rows():
    fast = decode_fast(b"", DEFAULT)
    assert fast is not None and (fast.accepted, fast.rejected, fast.errors) == (0, 0, [])
    assert all(column == [] for column in fast.columns.values())
    assert fast.span_attributes == ([0], [], []) and fast.resource_attributes == ([0], [], [])
    assert check_equivalent(b"")


# --- equivalence on real payloads --------------------------------------------------------------


@pytest.mark.parametrize("seed", [7, 11])
def test_generator_payloads_equal_the_python_path(seed):
    payloads = template_payloads(2048, seed=seed)
    assert payloads
    for payload in payloads:
        assert check_equivalent(payload), "a generator payload fell back to the Python path"


def _sample_files():
    return sorted(p for p in glob.glob(str(SAMPLES / "*.json")) if not p.endswith(".truth.json"))


def test_sample_traces_equal_the_python_path():
    files = _sample_files()
    assert len(files) >= 10, "sample_traces/ is missing: run `python -m guards.simulator regenerate`"
    for path in files:
        request, id_errors = parse_json(pathlib.Path(path).read_bytes())
        assert not id_errors
        has_events = any(
            span.events or span.links
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        )
        decoded = check_equivalent(request.SerializeToString())
        assert decoded or has_events, f"{path} fell back to the Python path"


BUILDER_CASES = {
    "every value kind": {
        "s": "text",
        "i": -(2**63),
        "big": 2**63 - 1,
        "b": True,
        "f": False,
        "d": 1.5,
        "d_int": 3.0,
        "d_tiny": 5e-324,
        "d_neg_zero": -0.0,
        "nan": float("nan"),
        "inf": float("inf"),
        "ninf": float("-inf"),
        "bytes": b"\x00\xffabc",
        "empty_bytes": b"",
        "list": ["a", 'q"uote', "back\\slash", "ctl\x01\n\t\x1f", "ünï\u2028", ""],
        "empty_list": [],
        "empty_str": "",
    },
    "genai tool span": {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.id": "call-1",
        "gen_ai.tool.call.arguments": '{"q": 1}',
        "gen_ai.tool.call.result": "found",
        "gen_ai.agent.id": "researcher",
        "gen_ai.conversation.id": "run-1",
    },
    "openinference agent with langgraph node": {
        "openinference.span.kind": "agent",
        "metadata": json.dumps({"langgraph_node": "planner", "x": 1}),
        "input.value": "in",
        "output.value": "out",
        "session.id": "sess",
    },
    "openinference tool, non-ascii kind": {"openinference.span.kind": "t\u0131ol", "tool.name": 5},
    "openinference chain with dotless i": {"openinference.span.kind": "cha\u0131n"},
    "traceloop task with kelvin sign": {
        "traceloop.span.kind": "tas\u212a",
        "traceloop.entity.name": "",
        "traceloop.entity.input": "tin",
        "traceloop.association.properties.session_id": "tl-sess",
    },
    "traceloop tool with entity name": {
        "traceloop.span.kind": "TOOL",
        "traceloop.entity.name": "calc",
        "traceloop.entity.input": "1+1",
        "traceloop.entity.output": "2",
    },
    "traceloop agent": {"traceloop.span.kind": "agent", "traceloop.entity.name": "boss", "agent.name": ""},
    "graph node ids": {
        "graph.node.id": "n1",
        "graph.node.parent_id": "n0",
        "metadata": "not json langgraph_node",
    },
    "empty graph node falls to metadata": {
        "graph.node.id": "",
        "metadata": '{"langgraph_node": ""}',
        "openinference.span.kind": "AGENT",
    },
    "driftscope op alone makes a tool": {"driftscope.op": "write", "driftscope.state.key": "plan"},
    "coercions from strings": {
        "driftscope.hop": " 12 ",
        "driftscope.step": "1_000",
        "driftscope.budget.max_steps": "99999999999",
        "driftscope.side_effect": " YES ",
        "driftscope.objective.superseded": "0",
        "driftscope.constraints.ledger": '["C1", 2, null, {"a": [1]}]',
        "driftscope.constraints.carried": "C3",
        "driftscope.constraints.waived": "[not json",
        "driftscope.acceptance.constraint_ids": "  ",
    },
    "coercions from numbers and bools": {
        "driftscope.hop": 2.0,
        "driftscope.step": True,
        "driftscope.budget.max_steps": 2**31,
        "driftscope.side_effect": 0,
        "driftscope.objective.superseded": 1.5,
        "driftscope.constraints.ledger": 7,
        "driftscope.constraints.carried": False,
        "driftscope.state.version": 3,
        "driftscope.outcome": 2.5,
        "driftscope.goal.text": ["a", "b"],
        "driftscope.policy.version": b"\x01",
        "gen_ai.operation.name": float("nan"),
        "gen_ai.conversation.id": 42,
    },
    "nested values": {
        "kv": {"a": "b", "n": 1, "f": 2.5, "nan": float("nan"), "b": b"\x00\x01", "l": [1, "x", None]},
        "ints": [1, 2, -(2**63)],
        "mixed": ["a", 2.5, True, b"z", {"k": ["v"]}, [[["deep"]]]],
        "nested": [["a"], []],
        "empty_kv": {},
        "metadata": {"langgraph_node": "planner"},
        "driftscope.constraints.ledger": ["C1", 2, {"x": 1}],
        "driftscope.hop": [3],
        "gen_ai.conversation.id": {"id": "r"},
        "input.value": [1.5, "t"],
    },
    "empty operation name uses the family": {"gen_ai.operation.name": "", "openinference.span.kind": "TOOL"},
    "unknown operation name": {"gen_ai.operation.name": "chat", "gen_ai.agent.name": "bot"},
}


@pytest.mark.parametrize("attrs", list(BUILDER_CASES.values()), ids=list(BUILDER_CASES))
def test_builder_payloads_equal_the_python_path(attrs):
    payload = _payload([{"attrs": attrs, **_ids(0)}, {"attrs": {}, **_ids(1)}])
    assert check_equivalent(payload)


def _add_event(span, name: str, time: int, attrs: dict) -> None:
    event = span.events.add(name=name, time_unix_nano=time)
    for key, value in attrs.items():
        set_attr(event.attributes, key, value)


def _add_link(span, trace_id: bytes, span_id: bytes, trace_state: str, attrs: dict) -> None:
    link = span.links.add(trace_id=trace_id, span_id=span_id, trace_state=trace_state)
    for key, value in attrs.items():
        set_attr(link.attributes, key, value)


def test_events_and_links_equal_the_python_path():
    request = make_request([{"attrs": {"k": "v"}, **_ids(i)} for i in range(4)])
    spans = request.resource_spans[0].scope_spans[0].spans
    kinds = BUILDER_CASES["every value kind"]
    _add_event(spans[0], "exception", BASE_NS + 5, {"exception.type": "ValueError", **kinds})
    _add_event(spans[0], 'n\x00ame "quoted" \u00e9' + "x" * 40, 2**64 - 1, {})
    _add_link(spans[0], b"\x01" * 16, b"\x02" * 8, 'a=b,c=\x00"d"', {"link.kind": "follows", "n": 3})
    _add_link(spans[1], b"\xab\xcd", b"", "", {})  # ids of any length are written as they are
    _add_event(spans[2], "", 0, {"list": ["x" * 50, "y"], "z": 0.1})
    for index in range(5):
        _add_event(spans[3], f"e{index}", BASE_NS + index, {"i": index})
        _add_link(spans[3], bytes([index + 1]) * 16, bytes([index + 1]) * 8, "", {"i": index})
    payload = request.SerializeToString()
    for limits in (DEFAULT, DecodeLimits(max_attribute_bytes=32, max_array_items=2), DecodeLimits(20, 1, 0)):
        assert check_equivalent(payload, limits), limits
    fast = decode_fast(payload, DEFAULT)
    assert json.loads(fast.columns["Events"][0])[0]["Attributes"]["exception.type"] == "ValueError"
    assert fast.columns["Links"][2] == "[]" and fast.columns["Events"][1] == "[]"


def test_resource_attributes_service_and_run_fallback():
    """Raw columns equal; the run falls back to a resource's session, then the trace id, on both
    paths alike (the mapping is shared)."""
    request = make_request([{"attrs": {"x": 1}, **_ids(0)}, {"attrs": {"session.id": ""}, **_ids(1)}])
    resource = request.resource_spans[0].resource
    set_attr(resource.attributes, "session.id", "res-session")
    set_attr(resource.attributes, "host", ["a", "b"])
    second = request.resource_spans.add()
    set_attr(second.resource.attributes, "service.name", "")
    second.scope_spans.add().spans.add(
        trace_id=b"\x05" * 16, span_id=b"\x06" * 8, start_time_unix_nano=BASE_NS, end_time_unix_nano=BASE_NS
    )
    third = request.resource_spans.add()
    set_attr(third.resource.attributes, "service.name", 12)
    third.scope_spans.add().spans.add(
        trace_id=b"\x07" * 16, span_id=b"\x08" * 8, start_time_unix_nano=BASE_NS, end_time_unix_nano=BASE_NS
    )
    payload = request.SerializeToString()
    assert check_equivalent(payload)
    fast = decode_fast(payload, DEFAULT)
    assert fast.columns["ServiceName"] == ["crew", "crew", "unknown_service", "unknown_service"]
    for batch in (decode_payload(payload, PROTOBUF), decode_export_request(parse_protobuf(payload))):
        assert batch.columns["run_id"][:2] == ["res-session", "res-session"]
        assert batch.columns["run_id"][2] == (b"\x05" * 16).hex()  # no run attribute: the trace id


def test_limits_truncate_strings_and_arrays_like_the_python_path():
    limits = DecodeLimits(max_attribute_bytes=32, max_depth=2, max_array_items=3)
    attrs = {
        "short": "abc",
        "nul": "a\x00b",
        "long": "x" * 70,
        "long_multibyte": "é" * 20,  # 40 bytes, cut inside a character
        "long_4byte": "\U0001f600" * 9,
        "long_with_nul": "\x00" * 40,
        "exactly": "y" * 32,
        "list": ["a", "b", "c", "d", "e"],
        "list_long_items": ["z" * 40, "ok", "\x00"],
        "bytes": b"\x01" * 40,
        "driftscope.goal.text": "g" * 50,
        "driftscope.constraints.carried": ["C" * 40] * 5,
    }
    payload = _payload([{"attrs": attrs, "name": "n" * 70, **_ids(0)}], service="s" * 40)
    assert check_equivalent(payload, limits)
    short_keys = {chr(ord("a") + i): value for i, value in enumerate(attrs.values())}
    payload = _payload([{"attrs": short_keys, "name": "\x00é" * 5, **_ids(0)}], service="s" * 40)
    # "service.name" (12 bytes) is the longest key: keys over the limit fall back
    for tiny in (
        DecodeLimits(12, 1, 0),
        DecodeLimits(13, 1, 1),
        DecodeLimits(14, 8, 2),
        DecodeLimits(15, 8, 0),
    ):
        assert check_equivalent(payload, tiny), tiny


def test_rejected_spans_give_the_same_errors_and_the_rest_is_kept():
    bad = [
        {"trace_id": b"\x01" * 8},
        {"trace_id": b"\x00" * 16},
        {"trace_id": b""},
        {"span_id": b"\x01" * 4},
        {"span_id": b"\x00" * 8},
        {"parent": b"\x01" * 3},
        {"start": BASE_NS, "end": BASE_NS - 1},
        {"start": 0, "end": 0},
        {"start": 2**63, "end": 2**63 + 1},
        {"start": BASE_NS, "end": 2**64 - 1},
        {"start": 2**64 - 2, "end": 2**64 - 1},
    ]
    spans = [{"name": "good", **_ids(0)}]
    for index, problem in enumerate(bad):
        name = "bad 'quoted' \x00 ünicode " * (3 if index % 2 else 1)
        spans.append({**_ids(index + 1), "name": name, **problem, "attrs": {"kv": {"a": 1}}})
    payload = _payload(spans)
    assert check_equivalent(payload)
    fast = decode_fast(payload, DEFAULT)
    assert (fast.accepted, fast.rejected) == (1, len(bad))
    assert fast.columns["SpanName"] == ["good"]


# --- protobuf wire semantics -------------------------------------------------------------------


UNKNOWN_FIELDS = (
    _tag(100, 0)
    + _varint(2**64 - 1)
    + _tag(101, 1)
    + b"\x00" * 8
    + _len_field(102, b"\xff\xfe")
    + _tag(103, 5)
    + b"\x00" * 4
    + _tag(104, 3)
    + _tag(1, 0)
    + b"\x01"
    + _tag(105, 3)
    + _len_field(106, b"in a nested group")
    + _tag(105, 4)
    + _tag(104, 4)
)


def test_unknown_fields_of_every_wire_type_are_skipped():
    body = _good_span_body() + UNKNOWN_FIELDS + _len_field(9, _kv(b"k", _len_field(1, b"v") + UNKNOWN_FIELDS))
    resource = _len_field(1, _kv(b"service.name", _len_field(1, b"svc"))) + UNKNOWN_FIELDS
    payload = UNKNOWN_FIELDS + _wrap_span(
        body, resource=resource, scope=_len_field(1, b"sc") + UNKNOWN_FIELDS
    )
    parse_protobuf(payload)
    assert check_equivalent(payload)
    # known field numbers with the wrong wire type are unknown fields too
    wrong = _tag(1, 0) + b"\x05" + _tag(5, 5) + b"abcd" + _tag(7, 0) + b"\x01" + _tag(9, 0) + b"\x01"
    assert check_equivalent(_wrap_span(_good_span_body() + wrong))


def test_repeated_message_fields_merge_like_upb():
    # Status split over two occurrences; the AnyValue oneof: the last member wins, and two
    # array_value occurrences in a row append.
    array_a = _len_field(5, _len_field(1, _len_field(1, b"a")))
    array_b = _len_field(5, _len_field(1, _len_field(1, b"b")))
    attrs = (
        _len_field(9, _kv(b"merged", array_a + array_b))
        + _len_field(9, _kv(b"reset", array_a + _len_field(1, b"x") + array_b))
        + _len_field(9, _kv(b"last", _len_field(1, b"x") + _tag(3, 0) + b"\x07"))
        + _len_field(
            9, _len_field(1, b"two_values") + _len_field(2, _tag(2, 0) + b"\x01") + _len_field(2, b"")
        )
        + _len_field(
            9, _len_field(1, b"strindex") + _len_field(2, _len_field(1, b"x") + _tag(8, 0) + b"\x03")
        )
    )
    status = _len_field(15, _len_field(2, b"first")) + _len_field(15, _tag(3, 0) + b"\x02")
    payload = _wrap_span(_good_span_body() + attrs + status)
    assert check_equivalent(payload)
    fast = decode_fast(payload, DEFAULT)
    offsets, keys, values = fast.span_attributes
    assert dict(zip(keys, values, strict=True))["merged"] == '["a","b"]'
    assert fast.columns["StatusMessage"] == ["first"] and fast.columns["StatusCode"] == ["Error"]


def test_resource_and_scope_after_their_spans_and_repeated_merge():
    span = _good_span_body() + _len_field(9, _kv(b"a", _len_field(1, b"1")))
    scope_spans = (
        _len_field(2, span)
        + _len_field(1, _len_field(1, b"late-scope"))
        + _len_field(1, _len_field(2, b"v2"))
    )
    resource_one = _len_field(1, _kv(b"service.name", _len_field(1, b"svc")))
    resource_two = _len_field(1, _kv(b"session.id", _len_field(1, b"sess")))
    resource_spans = _len_field(1, resource_one) + _len_field(2, scope_spans) + _len_field(1, resource_two)
    payload = _len_field(1, resource_spans) + _len_field(1, resource_spans)
    assert check_equivalent(payload)
    fast = decode_fast(payload, DEFAULT)
    assert fast.columns["ScopeName"] == ["late-scope"] * 2 and fast.columns["ScopeVersion"] == ["v2"] * 2
    assert fast.columns["ServiceName"] == ["svc"] * 2
    assert decode_payload(payload, PROTOBUF).columns["run_id"] == ["sess"] * 2


def test_many_attributes_and_many_distinct_strings():
    wide = {f"key.{i}": f"value {i}" for i in range(300)}
    spans = [{"attrs": wide, **_ids(0)}]
    spans += [{"attrs": {f"k{i % 7}": f"distinct {i}", "n": i}, **_ids(i + 1)} for i in range(3000)]
    assert check_equivalent(_payload(spans))


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0a\xff\xff\xff",  # length past the end
        _tag(1, 2) + _varint(2**31) + b"x",  # huge length
        b"\x00",  # field number 0
        _tag(1, 6),  # wire type 6
        _tag(1, 4),  # stray end group
        _tag(9, 3) + _tag(1, 0) + b"\x01" + _tag(8, 4),  # mismatched end group
        _tag(9, 3),  # unterminated group
        _tag(2, 0) + b"\xff" * 10 + b"\x01",  # varint over 10 bytes
        b"\xf8\xff\xff\xff\x1f\x01",  # tag over 32 bits
        _wrap_span(_good_span_body(name=b"\xc3\x28")),  # invalid UTF-8 in a string field
        _wrap_span(_good_span_body(name=b"\xed\xa0\x80")),  # UTF-16 surrogate
        _wrap_span(_good_span_body(name=b"\xc0\x80")),  # overlong encoding
        _wrap_span(_good_span_body() + _len_field(3, b"\xff")),  # bad UTF-8 in trace_state
        _wrap_span(_good_span_body(), scope=_len_field(2, b"\x80")),  # ... in the scope version
        _wrap_span(_good_span_body() + _len_field(9, _kv(b"k", _len_field(1, b"\xfe")))),
    ],
)
def test_malformed_payloads_are_left_to_the_python_path(payload):
    with pytest.raises(DecodeError):
        parse_protobuf(payload)
    assert decode_fast(payload, DEFAULT) is None


# --- fallbacks ---------------------------------------------------------------------------------


def _with_event(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    event = request.resource_spans[0].scope_spans[0].spans[0].events.add(name="e", time_unix_nano=BASE_NS)
    set_attr(event.attributes, "k", {"a": 1})
    set_attr(event.attributes, "k", [1])
    return request


def _with_link(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    link = (
        request.resource_spans[0]
        .scope_spans[0]
        .spans[0]
        .links.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    )
    set_attr(link.attributes, "k", "v")
    set_attr(link.attributes, "k", "w")
    return request


def _with_duplicate_key(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    set_attr(request.resource_spans[0].scope_spans[0].spans[0].attributes, "k", "second")
    return request


def _with_duplicate_resource_key(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    set_attr(request.resource_spans[0].resource.attributes, "service.name", "again")
    return request


DUPLICATES = {
    "in an event": _with_event,
    "in a link": _with_link,
    "in span attributes": _with_duplicate_key,
    "in resource attributes": _with_duplicate_resource_key,
}


@pytest.mark.parametrize("name", list(DUPLICATES))
def test_duplicate_keys_keep_the_first_position_and_the_last_value(name):
    request = DUPLICATES[name](make_request([{"attrs": {"k": "first", "other": 1}, **_ids(0)}]))
    attrs = request.resource_spans[0].scope_spans[0].spans[0].attributes
    set_attr(attrs, "other", [1, 2])
    set_attr(attrs, "driftscope.hop", 3)
    set_attr(attrs, "driftscope.hop", "4")
    assert check_equivalent(request.SerializeToString())
    wide = make_request([{"attrs": {f"key.{i}": i for i in range(40)}, **_ids(0)}])
    set_attr(wide.resource_spans[0].scope_spans[0].spans[0].attributes, "key.7", "again")
    assert check_equivalent(wide.SerializeToString())  # over 32 attributes: the hashed path


FALLBACKS = {
    "key with NUL": (None, {"k\x00": "v"}, DEFAULT),
    "key longer than the limit": (None, {"k" * 20: "v"}, DecodeLimits(max_attribute_bytes=16)),
    "max_depth below 1": (None, {"k": "v"}, DecodeLimits(max_depth=0)),
}


@pytest.mark.parametrize("name", list(FALLBACKS))
def test_unsupported_requests_fall_back(name):
    modify, attrs, limits = FALLBACKS[name]
    request = make_request([{"attrs": attrs, **_ids(0)}])
    if modify:
        request = modify(request)
    payload = request.SerializeToString()
    assert decode_fast(payload, limits) is None
    # the Python path decodes it
    assert decode_export_request(parse_protobuf(payload), limits).accepted == 1


def test_a_kvlist_split_over_two_value_fields_falls_back():
    kvlist = _len_field(6, _len_field(1, _kv(b"a", _len_field(1, b"b"))))
    attribute = _len_field(9, _len_field(1, b"split") + _len_field(2, kvlist) + _len_field(2, kvlist))
    payload = _wrap_span(_good_span_body() + attribute)
    assert decode_export_request(parse_protobuf(payload), DEFAULT).accepted == 1
    assert decode_fast(payload, DEFAULT) is None
    # the same value in one field decodes
    single = _wrap_span(_good_span_body() + _len_field(9, _len_field(1, b"one") + _len_field(2, kvlist)))
    assert check_equivalent(single)


def test_unsupported_values_in_rejected_spans_do_not_force_a_fallback():
    request = make_request(
        [
            {"attrs": {"k": {"nested": [1, {"x": b"y"}]}, "d": "1", "d2": "2"}, "trace_id": b"\x00" * 16},
            {"attrs": {"k": "v"}, **_ids(1)},
        ]
    )
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].events.add(name="e")
    spans[0].links.add(trace_id=b"\x01" * 16)
    set_attr(spans[0].attributes, "d", "dup")
    payload = request.SerializeToString()
    assert check_equivalent(payload)


def test_nesting_is_cut_at_max_depth_and_deep_nesting_is_skipped():
    value = "leaf"
    for depth in range(1, 13):
        value = [value] if depth % 2 else {"k": value, "n": depth}
        payload = _payload([{"attrs": {"deep": value}, **_ids(0)}])
        for limits in (DEFAULT, DecodeLimits(max_depth=1), DecodeLimits(max_depth=3, max_array_items=1)):
            assert check_equivalent(payload, limits), (depth, limits)
    for _ in range(40):
        value = [value]
    # Past upb's recursion limit: the compiled decoder cuts the value (issue 32), the span is kept.
    request = make_request([{"attrs": {"deep": value, "k": "v"}, **_ids(0)}])
    with pytest.raises(DecodeError):
        parse_protobuf(request.SerializeToString())
    fast = decode_fast(request.SerializeToString(), DEFAULT)
    assert fast is not None and fast.accepted == 1
    _, keys, values = fast.span_attributes
    assert (
        dict(zip(keys, values, strict=True))["deep"]
        == "[" * 8 + '"[truncated: nesting deeper than 8]"' + "]" * 8
    )
    group = _tag(200, 3) * 40 + _tag(200, 4) * 40
    payload = _wrap_span(_good_span_body() + group)
    parse_protobuf(payload)  # upb accepts 40 nested groups
    assert decode_fast(payload, DEFAULT) is None


# --- properties --------------------------------------------------------------------------------

convention_keys = st.sampled_from(
    sorted(_DRIFTSCOPE_FIELDS)
    + [
        "openinference.span.kind",
        "traceloop.span.kind",
        "gen_ai.operation.name",
        "traceloop.entity.name",
        "input.value",
        "traceloop.entity.input",
        "output.value",
        "traceloop.entity.output",
        "graph.node.id",
        "metadata",
        "graph.node.parent_id",
        "gen_ai.agent.name",
        "agent.name",
        "gen_ai.agent.id",
        "gen_ai.tool.name",
        "tool.name",
        "gen_ai.tool.call.id",
        "tool_call.id",
        "gen_ai.tool.call.arguments",
        "tool.parameters",
        "gen_ai.tool.call.result",
        "gen_ai.conversation.id",
        "session.id",
        "traceloop.association.properties.session_id",
        "traceloop.association.properties.conversation_id",
    ]
)
plain_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
convention_text = st.one_of(
    plain_text,
    st.sampled_from(
        ["", "AGENT", "agent", "Tool", "chain", "LLM", "invoke_agent", "execute_tool", "workflow", "task",
         " 7 ", "-3", "2147483648", "true", " No ", "1", '["a", 1]', "[", '{"langgraph_node": "n"}',
         "langgraph_node", "\x00"]
    ),
)  # fmt: skip
supported_scalars = st.one_of(
    convention_text,
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=6),
)
supported_values = st.one_of(
    supported_scalars,
    st.lists(convention_text, max_size=4),
    st.recursive(
        supported_scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=3), st.dictionaries(plain_text, children, max_size=3)
        ),
        max_leaves=6,
    ),
)
supported_attrs = st.dictionaries(st.one_of(convention_keys, plain_text), supported_values, max_size=8)


@quick(150)
@given(
    st.lists(st.tuples(supported_attrs, st.booleans()), min_size=1, max_size=4),
    supported_attrs,
    st.lists(st.tuples(st.integers(0, 3), st.booleans(), plain_text, supported_attrs), max_size=3),
    st.lists(st.tuples(convention_keys, supported_values), max_size=4),
)
def test_random_supported_requests_equal_the_python_path(spans, resource_attrs, events, repeated):
    request = make_request([{"attrs": attrs, **_ids(i)} for i, (attrs, _) in enumerate(spans)])
    proto_spans = request.resource_spans[0].scope_spans[0].spans
    for key, value in repeated:  # keys that may repeat ones already there
        set_attr(proto_spans[0].attributes, key, value)
    for index, is_link, text, attrs in events:
        span = proto_spans[index % len(proto_spans)]
        if is_link:
            _add_link(span, text.encode()[:16], b"\x07" * 8, text, attrs)
        else:
            _add_event(span, text, BASE_NS + index, attrs)
    for key, value in resource_attrs.items():
        if key != "service.name":
            set_attr(request.resource_spans[0].resource.attributes, key, value)
    for span, (_, reject) in zip(request.resource_spans[0].scope_spans[0].spans, spans, strict=True):
        if reject:
            span.start_time_unix_nano = 0
    keys = [key for attrs, _ in spans for key in attrs] + list(resource_attrs) + ["service.name"]
    keys += [key for _, _, _, attrs in events for key in attrs] + [key for key, _ in repeated]
    for limits in (DEFAULT, DecodeLimits(max_attribute_bytes=16, max_array_items=2)):
        decoded = check_equivalent(request.SerializeToString(), limits)
        # keys over the limit or with NUL are a documented fallback; nothing else here is
        fast_keys = all(len(k.encode()) <= limits.max_attribute_bytes and "\x00" not in k for k in keys)
        assert decoded or not fast_keys


@quick(100)
@given(st.lists(span_specs, min_size=1, max_size=4))
def test_fuzz_requests_fall_back_or_equal_the_python_path(specs):
    payload = _request(specs).SerializeToString()
    check_equivalent(payload, FUZZ_LIMITS)
    check_equivalent(payload, DEFAULT)


@quick(400)
@given(st.binary(max_size=300))
def test_random_bytes_fall_back_or_equal_the_python_path(payload):
    check_equivalent(payload)


def _mutations(payload: bytes, rng: random.Random, count: int):
    for _ in range(count):
        yield payload[: rng.randrange(len(payload))]
        flipped = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        yield bytes(flipped)
        spliced = bytearray(payload)
        at = rng.randrange(len(spliced))
        spliced[at : at + rng.randint(0, 4)] = rng.randbytes(rng.randint(0, 4))
        yield bytes(spliced)


def test_truncated_and_bit_flipped_payloads_fall_back_or_equal_the_python_path():
    rng = random.Random(5)
    small = ExportTraceServiceRequest()
    small.CopyFrom(make_request([{"attrs": BUILDER_CASES["genai tool span"], **_ids(0)}]))
    span = Span(
        trace_id=b"\x03" * 16, span_id=b"\x04" * 8, start_time_unix_nano=BASE_NS, end_time_unix_nano=BASE_NS
    )
    small.resource_spans[0].scope_spans[0].spans.append(span)
    sources = [small.SerializeToString(), _wrap_span(_good_span_body() + UNKNOWN_FIELDS)]
    decoded = 0
    for source in sources:
        for mutated in _mutations(source, rng, 300):
            decoded += check_equivalent(mutated)
    big = template_payloads(64)[0]
    for mutated in _mutations(big, rng, 20):
        decoded += check_equivalent(mutated)
    assert decoded > 100, "almost every mutation fell back; the comparison proved little"


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """(field, wire type, body) of a message without groups; ValueError if it is not one."""
    out, at = [], 0
    try:
        while at < len(data):
            tag, at = _read_varint(data, at)
            field, wire_type = tag >> 3, tag & 7
            if wire_type == 0:
                _, end = _read_varint(data, at)
            elif wire_type in (1, 5):
                end = at + (8 if wire_type == 1 else 4)
            elif wire_type == 2:
                size, at = _read_varint(data, at)
                end = at + size
            else:
                raise ValueError("group")
            if end > len(data) or field == 0:
                raise ValueError("truncated")
            out.append((field, wire_type, data[at:end]))
            at = end
    except IndexError as exc:
        raise ValueError("truncated") from exc
    return out


def _encode(fields: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(
        _tag(field, wire_type) + (_varint(len(body)) + body if wire_type == 2 else body)
        for field, wire_type, body in fields
    )


def _rewrite(data: bytes, rng: random.Random, depth: int = 0) -> bytes:
    """Re-encode a message with one protobuf-level change somewhere: fields reordered, a field
    repeated, a message field split in two occurrences (which merge back), or an unknown field."""
    try:
        fields = _fields(data)
    except ValueError:
        return data
    out = []
    for field, wire_type, body in fields:
        if wire_type == 2 and depth < 7 and rng.random() < 0.6:
            body = _rewrite(body, rng, depth + 1)  # may be a string: then the result is often invalid
        out.append((field, wire_type, body))
    choice = rng.randrange(4)
    if choice == 0 and len(out) > 1:
        rng.shuffle(out)
    elif choice == 1 and out:
        at = rng.randrange(len(out))
        out.insert(at, out[at])
    elif choice == 2 and out:
        at = rng.randrange(len(out))
        field, wire_type, body = out[at]
        try:
            parts = _fields(body) if wire_type == 2 else []
        except ValueError:
            parts = []
        if parts:
            cut = rng.randrange(len(parts) + 1)
            out[at : at + 1] = [(field, 2, _encode(parts[:cut])), (field, 2, _encode(parts[cut:]))]
    else:
        unknown = rng.choice([(99, 0, _varint(7)), (98, 2, b"\xff"), (97, 5, b"\0" * 4), (1, 5, b"abcd")])
        out.insert(rng.randrange(len(out) + 1), unknown)
    return _encode(out)


def test_protobuf_level_rewrites_fall_back_or_equal_the_python_path():
    rng = random.Random(11)
    sources = [_payload([{"attrs": attrs, **_ids(i)} for i, attrs in enumerate(BUILDER_CASES.values())])]
    sources += template_payloads(16)
    decoded = 0
    for _ in range(150):
        payload = rng.choice(sources)
        for _ in range(rng.randint(1, 3)):
            payload = _rewrite(payload, rng)
        decoded += check_equivalent(payload)
    assert decoded > 30, "almost every rewrite fell back; the comparison proved little"


# --- resources ---------------------------------------------------------------------------------


# Run in a fresh interpreter: in the suite's process, threads other tests left behind (servers,
# workers, pools) allocate while the loop runs and their growth would be counted as the decoder's.
_LEAK_PROBE = """
import pathlib, sys
sys.path.insert(0, sys.argv[1])
from benchmarks.generator import template_payloads
from collector.fastdecode import decode_fast
from tests.collector.test_fastdecode import BUILDER_CASES, DEFAULT, _ids, _payload


def rss_kib():
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


payloads = [
    _payload([{"attrs": BUILDER_CASES["every value kind"], **_ids(i)} for i in range(4)]),
    _payload([{"attrs": BUILDER_CASES["coercions from strings"], **_ids(0)}, {"start": 0}]),
    _payload([{"attrs": {"k": {"a": 1}}, **_ids(0)}]),  # falls back
    b"\\x0a\\x05\\x12\\x03\\x12\\x01",  # truncated
    template_payloads(16)[0],
]
for payload in payloads * 200:  # warm up allocator pools and caches
    decode_fast(payload, DEFAULT)
before = rss_kib()
for index in range(20_000):
    decode_fast(payloads[index % len(payloads)], DEFAULT)
print(rss_kib() - before)
"""


def test_twenty_thousand_decodes_do_not_grow_memory():
    repo = pathlib.Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", _LEAK_PROBE, str(repo)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    grown = int(run.stdout.split()[-1])
    assert grown < 4096, f"RSS grew by {grown} KiB over 20,000 decodes"


def test_threads_decode_concurrently_with_the_same_results():
    payloads = template_payloads(1024)
    expected = [decode_fast(p, DEFAULT) for p in payloads]
    failures: list[str] = []

    def work():
        for _ in range(5):
            for payload, want in zip(payloads, expected, strict=True):
                got = decode_fast(payload, DEFAULT)
                if got != want:
                    failures.append("different result")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
