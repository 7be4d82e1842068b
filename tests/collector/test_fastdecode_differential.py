"""Differential fuzzing of the compiled decoder against upb (the protobuf runtime's parser).

Property: the compiled decoder never accepts a body upb rejects, and whenever both accept one,
it gives exactly the rows of the Python path. The generated bodies include every way of encoding
a length prefix (canonical, over-long by 1-7 bytes, past 64 bits, past INT32_MAX), which is where
the compiled decoder used to differ (issue 12 item 6). The budget is a few thousand examples
(well under a minute); ``DRIFTSCOPE_FUZZ_SCALE`` scales it (``make fuzz-sanitize`` runs it
with more examples against an AddressSanitizer + UBSan build).
"""

import os
from datetime import datetime

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.decode import (
    PROTOBUF,
    DecodeError,
    DecodeLimits,
    RequestTooLargeError,
    check_request_counts,
    decode_export_request,
    decode_payload,
    parse_protobuf,
)
from collector.fastdecode import AVAILABLE, LimitExceededError, check_counts, decode_fast
from tests.otlp_builders import set_attr

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="the compiled decoder is not built")

NOW = datetime(2026, 11, 30, 12, 0, 0)
LIMITS = DecodeLimits(max_attribute_bytes=64, max_depth=3, max_array_items=4)


def fuzz(examples: int) -> settings:
    examples = max(1, int(examples * float(os.environ.get("DRIFTSCOPE_FUZZ_SCALE", "1"))))
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


def assert_same_as_upb(payload: bytes, limits: DecodeLimits = LIMITS) -> str:
    """'rejected' (upb and the compiled decoder both refuse), 'fallback' (upb accepts, the compiled
    decoder leaves it to the Python path), 'equal' (both decode, same rows) or 'limit'."""
    try:
        request = parse_protobuf(payload)
    except DecodeError:
        request = None
    try:
        fast = decode_fast(payload, limits)
    except LimitExceededError:
        fast = "limit"
    if request is None:
        assert fast is None, f"the compiled decoder accepted a body upb rejects: {payload[:80].hex()}"
        return "rejected"
    if fast is None:
        return "fallback"
    try:
        python = decode_export_request(request, limits, NOW)
    except RequestTooLargeError:
        assert fast == "limit", "the Python path refused a request the compiled decoder took"
        return "limit"
    assert fast != "limit", "the compiled decoder refused a request the Python path takes"
    compiled = decode_payload(payload, PROTOBUF, limits, NOW)
    assert (compiled.accepted, compiled.rejected, compiled.errors) == (
        python.accepted,
        python.rejected,
        python.errors,
    )
    assert compiled.table.equals(python.table)
    return "equal"


# --- wire-level rewriting -------------------------------------------------------------------------


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_length(n: int, form: tuple[str, int]) -> bytes:
    """A length prefix for ``n`` in one of the forms upb may or may not accept."""
    kind, extra = form
    if kind == "canonical":
        return encode_varint(n)
    if kind == "overlong":  # the same value padded with ``extra`` continuation bytes
        raw = bytearray(encode_varint(n))
        raw[-1] |= 0x80
        raw += b"\x80" * (extra - 1) + b"\x00"
        return bytes(raw)
    if kind == "wrap64":  # n + 2**(63 + extra): bits past 64 that a 64-bit reader drops
        return encode_varint(n + (1 << (63 + extra)))
    if kind == "big":  # n + 2**(31 + extra): fits 64 bits, not upb's INT32_MAX
        return encode_varint(n + (1 << (31 + extra)))
    raise ValueError(kind)


LENGTH_FORMS = st.one_of(
    st.just(("canonical", 0)),
    st.tuples(st.just("overlong"), st.integers(1, 7)),
    st.tuples(st.just("wrap64"), st.integers(1, 6)),
    st.tuples(st.just("big"), st.integers(0, 3)),
)


def rewrite_lengths(data: bytes, descriptor, forms: list, counter: list[int]) -> bytes:
    """Re-encode every length prefix of a valid message (descending into sub-messages by their
    descriptors), taking the next form from ``forms`` each time (cycling)."""
    out = bytearray()
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        out += encode_varint(tag)
        if wire == 0:
            _, end = _read_varint(data, pos)
        elif wire == 1:
            end = pos + 8
        elif wire == 5:
            end = pos + 4
        if wire != 2:
            out += data[pos:end]
            pos = end
            continue
        n, pos = _read_varint(data, pos)
        body = data[pos : pos + n]
        pos += n
        field = descriptor.fields_by_number.get(number)
        if field is not None and field.type == field.TYPE_MESSAGE:
            body = rewrite_lengths(body, field.message_type, forms, counter)
        form = forms[counter[0] % len(forms)]
        counter[0] += 1
        out += encode_length(len(body), form) + body
    return bytes(out)


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
scalars = st.one_of(text, st.integers(-(2**63), 2**63 - 1), st.booleans(), st.binary(max_size=6))
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(text, children, max_size=3)),
    max_leaves=6,
)
# Resource attributes: any kind of value, service.name among the keys (issue 32: a double, bytes
# or array service.name named the service on the Python path, not on the compiled one).
resources = st.dictionaries(
    st.one_of(text, st.just("service.name")), st.one_of(scalars, st.floats(), values), max_size=3
)
span_specs = st.fixed_dictionaries(
    {
        "trace_id": st.one_of(st.just(b"\x01" * 16), st.binary(min_size=15, max_size=17)),
        "span_id": st.one_of(st.just(b"\x02" * 8), st.binary(max_size=9)),
        "start": st.integers(0, 2**64 - 1),
        "attrs": st.dictionaries(text, values, max_size=4),
        "events": st.lists(st.dictionaries(text, scalars, max_size=2), max_size=2),
        "links": st.integers(0, 2),
    }
)


def build_request(specs: list[dict], resource: dict) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    for key, value in resource.items():
        set_attr(rs.resource.attributes, key, value)
    scope = rs.scope_spans.add()
    scope.scope.name = "fuzz"
    for index, spec in enumerate(specs):
        span = scope.spans.add(
            trace_id=spec["trace_id"],
            span_id=spec["span_id"],
            name=f"s{index}",
            start_time_unix_nano=spec["start"],
            end_time_unix_nano=spec["start"],
        )
        for key, value in spec["attrs"].items():
            set_attr(span.attributes, key, value)
        for attrs in spec["events"]:
            event = span.events.add(name="e", time_unix_nano=7)
            for key, value in attrs.items():
                set_attr(event.attributes, key, value)
        for _ in range(spec["links"]):
            span.links.add(trace_id=b"\x03" * 16, span_id=b"\x04" * 8, trace_state="t")
    return request


@fuzz(800)
@given(
    st.lists(span_specs, min_size=1, max_size=3),
    resources,
    st.lists(LENGTH_FORMS, min_size=1, max_size=6),
)
@pytest.mark.slow
def test_length_prefixes_in_every_encoding_are_read_as_upb_reads_them(specs, resource, forms):
    canonical = build_request(specs, resource).SerializeToString()
    rewritten = rewrite_lengths(canonical, ExportTraceServiceRequest.DESCRIPTOR, forms, [0])
    outcome = assert_same_as_upb(rewritten)
    event(f"rewritten: {outcome}")
    if assert_same_as_upb(canonical) == "equal" and outcome != "rejected":
        # Only the length encodings differ: the compiled decoder takes it and gives the same rows.
        assert outcome == "equal"


@fuzz(3000)
@given(st.binary(max_size=200))
def test_random_bodies_are_never_accepted_when_upb_rejects_them(payload):
    assert_same_as_upb(payload)


@fuzz(800)
@given(st.lists(span_specs, min_size=1, max_size=2), st.data())
@pytest.mark.slow
def test_single_byte_mutations_of_valid_bodies_agree_with_upb(specs, data):
    body = bytearray(build_request(specs, {}).SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, len(body) - 1))
        body[position] = data.draw(st.integers(0, 255))
    event(f"mutated: {assert_same_as_upb(bytes(body))}")


@pytest.mark.parametrize(
    ("form", "upb_accepts"),
    [
        (("canonical", 0), True),
        (("overlong", 1), True),
        (("overlong", 4), True),  # 5 bytes: the most upb reads
        (("overlong", 5), False),
        (("overlong", 9), False),
        (("wrap64", 1), False),  # 2**64 + n: read as n by a reader that drops bits past 64
        (("big", 0), False),  # 2**31 + n
    ],
)
def test_the_audits_length_encodings(form, upb_accepts):
    inner = build_request([{"trace_id": b"\x01" * 16, "span_id": b"\x02" * 8, "start": 5, "attrs": {},
                            "events": [], "links": 0}], {}).resource_spans[0].SerializeToString()  # fmt: skip
    payload = b"\x0a" + encode_length(len(inner), form) + inner
    assert assert_same_as_upb(payload) == ("equal" if upb_accepts else "rejected")


def test_a_length_past_64_bits_is_400_from_the_real_server(serve):
    inner = build_request([{"trace_id": b"\x01" * 16, "span_id": b"\x02" * 8, "start": 5, "attrs": {},
                            "events": [], "links": 0}], {}).resource_spans[0].SerializeToString()  # fmt: skip
    payload = b"\x0a" + encode_length(len(inner), ("wrap64", 1)) + inner
    response = httpx.post(f"{serve.http_url}/v1/traces", content=payload, headers={"Content-Type": PROTOBUF})
    assert response.status_code == 400
    assert serve.health()["spans"] == 0


def test_missing_keys_and_empty_scope_fields_decode_like_upb():
    """Two attributes without a key and a scope without name or version: the compiled decoder
    compared a NULL key (memcmp(NULL, .., 0), undefined behaviour UBSan reports under
    `make fuzz-sanitize`); now it must decode them like the Python path."""
    request = build_request(
        [
            {
                "trace_id": b"\x01" * 16,
                "span_id": b"\x02" * 8,
                "start": 5,
                "attrs": {},
                "events": [],
                "links": 0,
            }
        ],
        {},
    )
    scope_spans = request.resource_spans[0].scope_spans[0]
    scope_spans.scope.Clear()
    span = scope_spans.spans[0]
    span.attributes.add().value.string_value = "a"
    span.attributes.add().value.string_value = "b"
    request.resource_spans[0].resource.attributes.add()
    request.resource_spans[0].resource.attributes.add()
    assert assert_same_as_upb(request.SerializeToString(), DecodeLimits()) == "equal"


COUNT_LIMITS = DecodeLimits(max_spans_per_request=2, max_items_per_request=9, max_attributes_per_span=3)


@fuzz(600)
@given(st.lists(span_specs, min_size=1, max_size=4), resources)
@pytest.mark.slow
def test_the_wire_count_agrees_with_the_python_count(specs, resource):
    """fastdecode.check_counts (C, on the wire, keeping nothing) refuses exactly the requests
    check_request_counts (Python, on the parsed message) refuses, for the same reason."""
    payload = build_request(specs, resource).SerializeToString()
    try:
        check_counts(payload, COUNT_LIMITS)
        wire = None
    except LimitExceededError as exc:
        wire = exc.kind
    try:
        check_request_counts(parse_protobuf(payload), COUNT_LIMITS)
        python = None
    except RequestTooLargeError as exc:
        python = "spans" if "max_spans_per_request" in str(exc) else "items"
    assert (wire is None) == (python is None), (wire, python)
    event(f"counts: {wire}")


@pytest.mark.parametrize(
    "service",
    [float("inf"), float("-inf"), float("nan"), 1.5, b"svc", 7, True, ["svc"], {"k": "svc"}, ""],
    ids=repr,
)
def test_a_non_string_service_name_is_unknown_service_on_both_paths(service):
    """Issue 32: the Python path took the text of a double or bytes service.name (``inf``, base64),
    the compiled one ``unknown_service``; a span's service depended on the path it took."""
    request = build_request([{"trace_id": b"\x01" * 16, "span_id": b"\x02" * 8, "start": 5, "attrs": {},
                              "events": [], "links": 0}], {"service.name": service})  # fmt: skip
    assert assert_same_as_upb(request.SerializeToString(), DecodeLimits()) == "equal"
    python = decode_export_request(request, DecodeLimits(), NOW)
    assert python.columns["ServiceName"] == ["unknown_service"]


def test_counts_are_checked_before_upb_builds_a_request_the_compiled_decoder_leaves_to_it():
    """A key longer than max_attribute_bytes sends the request to the Python path; 8 million
    empty spans after it must be refused from the wire count (413), not built by upb first (the
    trailing malformed byte would make upb answer 400 only after building them all)."""
    spans = ExportTraceServiceRequest()
    scope = spans.resource_spans.add().scope_spans.add()
    first = scope.spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=5, end_time_unix_nano=6
    )
    set_attr(first.attributes, "k" * 70_000, "v")
    body = spans.SerializeToString()
    scope_body = spans.resource_spans[0].scope_spans[0].SerializeToString() + b"\x12\x00" * 8_000_000
    resource_spans = b"\x12" + encode_varint(len(scope_body)) + scope_body
    payload = b"\x0a" + encode_varint(len(resource_spans)) + resource_spans + b"\xff"
    assert decode_fast(body, DecodeLimits()) is None  # the long key: Python path
    with pytest.raises(RequestTooLargeError, match="max_spans_per_request"):
        decode_payload(payload, PROTOBUF, DecodeLimits())
