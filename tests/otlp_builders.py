"""Build OTLP requests for tests: protobuf messages and the spec's JSON shapes."""

from __future__ import annotations

import json
import os

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

BASE_NS = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z


def set_attr(attrs, key, value) -> None:
    """Append ``key=value`` to a repeated KeyValue, choosing the AnyValue kind by Python type."""
    kv = attrs.add(key=key)
    _fill(kv.value, value)


def _fill(target: AnyValue, value) -> None:
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, bytes):
        target.bytes_value = value
    elif isinstance(value, (list, tuple)):
        for item in value:
            _fill(target.array_value.values.add(), item)
    elif isinstance(value, dict):
        for k, v in value.items():
            _fill(target.kvlist_value.values.add(key=k).value, v)
    else:
        target.string_value = str(value)


def make_request(spans: list[dict], service: str = "crew") -> ExportTraceServiceRequest:
    """One resource, one scope, a span per dict (keys: name, trace_id, span_id, parent, start,
    end, attrs, kind, status)."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    set_attr(rs.resource.attributes, "service.name", service)
    ss = rs.scope_spans.add()
    ss.scope.name = "tests"
    ss.scope.version = "1.0"
    for index, spec in enumerate(spans):
        span = ss.spans.add()
        span.trace_id = spec.get("trace_id", b"\x01" * 16)
        span.span_id = spec.get("span_id", os.urandom(8))
        span.parent_span_id = spec.get("parent", b"")
        span.name = spec.get("name", f"span-{index}")
        span.kind = spec.get("kind", 1)
        span.start_time_unix_nano = spec.get("start", BASE_NS + index * 1000)
        span.end_time_unix_nano = spec.get("end", BASE_NS + index * 1000 + 500)
        if "status" in spec:
            span.status.code = spec["status"]
        for key, value in spec.get("attrs", {}).items():
            set_attr(span.attributes, key, value)
    return request


# The example from the OTLP specification repository (examples/trace.json), verbatim in shape.
SPEC_EXAMPLE_JSON = {
    "resourceSpans": [
        {
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "my.service"}}]},
            "scopeSpans": [
                {
                    "scope": {
                        "name": "my.library",
                        "version": "1.0.0",
                        "attributes": [
                            {"key": "my.scope.attribute", "value": {"stringValue": "some scope attribute"}}
                        ],
                    },
                    "spans": [
                        {
                            "traceId": "5B8EFFF798038103D269B633813FC60C",
                            "spanId": "EEE19B7EC3C1B174",
                            "parentSpanId": "EEE19B7EC3C1B173",
                            "name": "I'm a server span",
                            "startTimeUnixNano": "1544712660000000000",
                            "endTimeUnixNano": "1544712661000000000",
                            "kind": 2,
                            "attributes": [
                                {"key": "my.span.attr", "value": {"stringValue": "some value"}},
                                {"key": "my.int.attr", "value": {"intValue": "9007199254740993"}},
                                {
                                    "key": "my.array",
                                    "value": {
                                        "arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "2"}]}
                                    },
                                },
                            ],
                            "status": {"code": 2, "message": "it broke"},
                            "unknownFieldFromTheFuture": {"x": 1},
                        }
                    ],
                }
            ],
        }
    ]
}


def spec_example_bytes() -> bytes:
    return json.dumps(SPEC_EXAMPLE_JSON).encode()
