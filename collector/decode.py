"""Decode OTLP trace payloads (protobuf or OTLP JSON) into storage rows.

Pure functions: bytes or a parsed ``ExportTraceServiceRequest`` in, a ``DecodedBatch`` out. No I/O.
Spans that fail validation inside an otherwise good request are counted as rejected with a
message (OTLP ``partial_success``); a payload that cannot be decoded at all raises
``DecodeError`` (HTTP 400 / gRPC INVALID_ARGUMENT).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.message import DecodeError as _ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.conventions import ATTRIBUTE_COLUMNS, COORDINATION_COLUMNS, OTEL_COLUMNS
from collector.fastdecode import FastResult, LimitExceededError, _otlpfast, check_counts, decode_fast
from collector.json_salvage import PARSE_ERRORS, SURROGATE_ESCAPE, replace_lone_surrogates, salvage_spans
from collector.limits import DecodeLimits
from collector.mapping_plans import map_columns

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

SPAN_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
STATUS_CODES = ("Unset", "Ok", "Error")

SPAN_COLUMNS = OTEL_COLUMNS + COORDINATION_COLUMNS + ("ingested_at",)

# Arrow types of the `spans` columns (VARCHAR unless listed); attribute lists are
# STRUCT(key, value)[] in DuckDB (collector/migrations/0003_attribute_lists.sql).
KEY_VALUE = pa.struct([("key", pa.string()), ("value", pa.string())])
_STR_LIST = pa.list_(pa.string())
_TYPES = {
    "Timestamp": pa.timestamp("us"),
    "ResourceAttributes": pa.list_(KEY_VALUE),
    "SpanAttributes": pa.list_(KEY_VALUE),
    "Duration": pa.int64(),
    "start_ns": pa.int64(),
    "end_ns": pa.int64(),
    "hop": pa.int32(),
    "step": pa.int32(),
    "budget_max_steps": pa.int32(),
    "objective_superseded": pa.bool_(),
    "side_effect": pa.bool_(),
    "constraints_ledger": _STR_LIST,
    "constraints_carried": _STR_LIST,
    "constraints_waived": _STR_LIST,
    "waiver_reasons": _STR_LIST,
    "acceptance_constraint_ids": _STR_LIST,
    "ingested_at": pa.timestamp("us"),
}
SPAN_SCHEMA = pa.schema([(name, _TYPES.get(name, pa.string())) for name in SPAN_COLUMNS])
EMPTY_TABLE = SPAN_SCHEMA.empty_table()

_MAX_NS = 2**63 - 1
_ZERO_TRACE = b"\x00" * 16
_ZERO_SPAN = b"\x00" * 8
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
_json_string = json.encoder.encode_basestring  # JSON string literal, as ensure_ascii=False writes it


class DecodeError(ValueError):
    """The payload as a whole could not be decoded; the message says what was wrong."""


class RequestTooLargeError(DecodeError):
    """The request carries more spans or items than the limits allow (HTTP 413)."""

    def __init__(self, kind: str, limits: DecodeLimits) -> None:
        if kind == "spans":
            text = f"more than {limits.max_spans_per_request} spans (max_spans_per_request)"
        elif kind == "json":
            text = (
                f"more than {limits.max_items_per_request} JSON values (max_items_per_request counts every "
                "object, array, string and number of an OTLP JSON body; protobuf carries more per item)"
            )
        else:
            text = (
                f"more than {limits.max_items_per_request} spans, events, links and attributes together "
                "(max_items_per_request)"
            )
        super().__init__(f"request carries {text}; split the export into smaller batches")


def _value_items(value) -> int:
    """AnyValue array items and kvlist entries inside ``value``, at any depth."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        items = value.array_value.values
        return len(items) + sum(_value_items(v) for v in items)
    if kind == "kvlist_value":
        entries = value.kvlist_value.values
        return len(entries) + sum(_value_items(kv.value) for kv in entries)
    return 0


def _attribute_items(key_values) -> int:
    """The KeyValues and every item inside their values (array items, kvlist entries)."""
    total = len(key_values)
    for kv in key_values:
        if kv.value.WhichOneof("value") in ("array_value", "kvlist_value"):
            total += _value_items(kv.value)
    return total


def check_request_counts(request: ExportTraceServiceRequest, limits: DecodeLimits) -> None:
    """Raise ``RequestTooLargeError`` for a request past the per-request counts, counted as the
    compiled decoder and ``_otlpfast.count`` count them: every ResourceSpans, ScopeSpans, span,
    event and link, every attribute (of resources, scopes, spans, events and links) and every
    AnyValue array item and kvlist entry inside them."""
    max_spans, max_items = limits.max_spans_per_request, limits.max_items_per_request
    spans = items = 0
    for resource_spans in request.resource_spans:
        items += 1 + _attribute_items(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            spans += len(scope_spans.spans)
            if spans > max_spans:
                raise RequestTooLargeError("spans", limits)
            items += 1 + _attribute_items(scope_spans.scope.attributes)
            for span in scope_spans.spans:
                items += 1 + _attribute_items(span.attributes) + len(span.events) + len(span.links)
                for event in span.events:
                    items += _attribute_items(event.attributes)
                for link in span.links:
                    items += _attribute_items(link.attributes)
                if items > max_items:
                    raise RequestTooLargeError("items", limits)
            if items > max_items:
                raise RequestTooLargeError("items", limits)
        if items > max_items:
            raise RequestTooLargeError("items", limits)


def _check_attribute_counts(span, resource_attributes: int, limits: DecodeLimits) -> str | None:
    cap, kept = limits.max_attributes_per_span, limits.max_array_items
    if (
        resource_attributes > cap
        or len(span.attributes) > cap
        or any(len(event.attributes) > cap for event in span.events[:kept])
        or any(len(link.attributes) > cap for link in span.links[:kept])
    ):
        return (
            f"span {span.name[:60]!r}: more than {cap} attributes on the span, one of its events or links, "
            "or its resource (max_attributes_per_span)"
        )
    return None


@dataclass
class DecodedBatch:
    """Rows of one request as an Arrow table with the `spans` schema, plus what was rejected
    and why. The table is built by the decoder (on the receiving thread), so the writer thread
    only concatenates and inserts."""

    # Arrow tables are immutable: every batch without rows shares one (building an empty table
    # of the 62 columns costs more than decoding a few hundred spans).
    table: pa.Table = field(default_factory=lambda: EMPTY_TABLE)
    accepted: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)
    payload_bytes: int = 0

    @property
    def columns(self) -> dict[str, list]:
        """The rows column-wise as Python values (for tests and diagnostics; attribute lists
        come back as lists of (key, value) tuples)."""
        out = {name: self.table.column(name).to_pylist() for name in SPAN_COLUMNS}
        for name in ATTRIBUTE_COLUMNS:
            out[name] = [[(e["key"], e["value"]) for e in entries] for entries in out[name]]
        return out

    @property
    def error_message(self) -> str:
        """One message for ``partial_success.error_message``: the first few distinct reasons."""
        if not self.errors:
            return ""
        distinct = list(dict.fromkeys(self.errors))
        more = len(self.errors) - 5 if len(distinct) > 5 else 0
        text = "; ".join(distinct[:5])
        return f"{self.rejected} span(s) rejected: {text}" + (f" (and {more} more)" if more else "")


def parse_protobuf(payload: bytes) -> ExportTraceServiceRequest:
    """Parse a binary ``ExportTraceServiceRequest``; raise ``DecodeError`` saying why not."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(payload)
    except (_ProtoDecodeError, RuntimeError, ValueError) as exc:
        raise DecodeError(
            f"Could not decode the body as an OTLP ExportTraceServiceRequest protobuf ({exc}); "
            "check that Content-Type matches the encoding and the body is not truncated"
        ) from exc
    return request


def _json_len(value: Any) -> int:
    return len(value) if isinstance(value, list) else 0


def _hex_to_b64(value: Any, where: str, bad: list[str]) -> str:
    if not isinstance(value, str):
        bad.append(f"{where} must be a hex string, got {type(value).__name__}")
        return ""
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        bad.append(f"{where} {value[:40]!r} is not hex")
        return base64.b64encode(b"\xff").decode()  # fails the length check below
    return base64.b64encode(raw).decode()


def _rewrite_ids(node: dict, where: str, bad: list[str]) -> None:
    for key in _ID_FIELDS:
        if key in node and node[key] is not None:
            node[key] = _hex_to_b64(node[key], f"{where}.{key}", bad)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def check_json_values(payload: bytes, limits: DecodeLimits) -> None:
    """Raise ``RequestTooLargeError`` when a JSON body holds more values than
    ``max_items_per_request``, counted on the bytes before ``json.loads`` builds any of them: a
    value is the first in its array or object or follows a comma, so commas plus brackets plus
    one bound the values; strings are taken out first only when the raw count is over."""
    limit = limits.max_items_per_request
    if payload.count(b",") + payload.count(b"[") + payload.count(b"{") + 1 <= limit:
        return
    stripped = _JSON_STRING.sub(b"", payload)
    if stripped.count(b",") + stripped.count(b"[") + stripped.count(b"{") + 1 > limit:
        raise RequestTooLargeError("json", limits)


def _json_value_items(value: Any) -> int:
    """Array items and kvlist entries inside an OTLP JSON AnyValue, at any depth."""
    if not isinstance(value, dict):
        return 0
    array = value.get("arrayValue", value.get("array_value"))
    if isinstance(array, dict) and isinstance(values := array.get("values"), list):
        return len(values) + sum(_json_value_items(v) for v in values)
    kvlist = value.get("kvlistValue", value.get("kvlist_value"))
    if isinstance(kvlist, dict) and isinstance(entries := kvlist.get("values"), list):
        return _json_attribute_items(entries)
    return 0


def _json_attribute_items(attributes: Any) -> int:
    """The KeyValues of an OTLP JSON attribute list and every item inside their values."""
    if not isinstance(attributes, list):
        return 0
    return len(attributes) + sum(
        _json_value_items(kv.get("value")) for kv in attributes if isinstance(kv, dict)
    )


def parse_json(
    payload: bytes, limits: DecodeLimits | None = None
) -> tuple[ExportTraceServiceRequest, list[str]]:
    """Parse an OTLP JSON ``ExportTraceServiceRequest`` (hex ids, lowerCamelCase, int enums).

    Returns the message and the id problems found (those spans are rejected later, the rest
    kept). Raises ``DecodeError`` for a body that is not OTLP JSON, ``RequestTooLargeError`` for
    one past ``limits``' counts (checked on the JSON document, before protobuf builds anything).
    """
    limits = limits or DecodeLimits()
    check_json_values(payload, limits)
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError(f"Body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise DecodeError(
            "Body nests JSON arrays/objects too deeply to decode; OTLP JSON needs only a few levels "
            "(AnyValue nesting past 8 levels is cut anyway)"
        ) from None
    if not isinstance(document, dict):
        raise DecodeError(
            f"Expected a JSON object (an ExportTraceServiceRequest), got {type(document).__name__}"
        )
    if SURROGATE_ESCAPE.search(payload):
        replace_lone_surrogates(document)
    bad: list[str] = []
    resource_spans = document.get("resourceSpans", document.get("resource_spans")) or []
    if not isinstance(resource_spans, list):
        raise DecodeError("resourceSpans must be a JSON array")
    spans = items = 0
    for r_index, rs in enumerate(resource_spans):
        items += 1
        if not isinstance(rs, dict):
            continue
        resource = rs.get("resource")
        items += _json_attribute_items(resource.get("attributes")) if isinstance(resource, dict) else 0
        scope_spans = rs.get("scopeSpans", rs.get("scope_spans"))
        for s_index, ss in enumerate(scope_spans if isinstance(scope_spans, list) else ()):
            items += 1
            if not isinstance(ss, dict):
                continue
            scope = ss.get("scope")
            items += _json_attribute_items(scope.get("attributes")) if isinstance(scope, dict) else 0
            spans += _json_len(ss.get("spans"))
            if spans > limits.max_spans_per_request:
                raise RequestTooLargeError("spans", limits)
            listed = ss.get("spans")
            for p_index, span in enumerate(listed if isinstance(listed, list) else ()):
                if not isinstance(span, dict):
                    continue
                items += 1 + _json_attribute_items(span.get("attributes"))
                for key in ("events", "links"):
                    nested = span.get(key)
                    items += _json_len(nested)
                    for entry in nested if isinstance(nested, list) else ():
                        items += (
                            _json_attribute_items(entry.get("attributes")) if isinstance(entry, dict) else 0
                        )
                if items > limits.max_items_per_request:
                    raise RequestTooLargeError("items", limits)
                where = f"resourceSpans[{r_index}].scopeSpans[{s_index}].spans[{p_index}]"
                _rewrite_ids(span, where, bad)
                for link in span.get("links") or []:
                    if isinstance(link, dict):
                        _rewrite_ids(link, f"{where}.links", bad)
    if items > limits.max_items_per_request:  # resources and scopes without spans
        raise RequestTooLargeError("items", limits)
    try:
        request = json_format.ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except PARSE_ERRORS:
        # One value ParseDict cannot take (an int past int64, a time of 1e30, attributes as an
        # object, nesting past its recursion limit) costs only its span (issue 32).
        salvage_spans(document, bad)
        request = None
    if request is None:
        request = _parse_salvaged(document)
    return request, bad


def _parse_salvaged(document: dict) -> ExportTraceServiceRequest:
    """ParseDict of a document ``salvage_spans`` went over: what still fails is the envelope."""
    try:
        return json_format.ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        # OverflowError: an enum or integer field given as a float past int range (1e400)
        reason = str(exc)
        reason = reason if len(reason) <= 300 else reason[:150] + " ... " + reason[-150:]
        raise DecodeError(f"Body is not a valid OTLP JSON ExportTraceServiceRequest: {reason}") from exc
    except RecursionError:
        raise DecodeError(
            "Body nests AnyValue arrays/kvlists too deeply to decode; send at most a few dozen levels "
            "(nesting past 8 levels is cut anyway)"
        ) from None


def _truncate(text: str, limits: DecodeLimits) -> str:
    # Fast path: a UTF-8 character is at most 4 bytes, so short texts cannot exceed the limit.
    if len(text) <= limits.max_attribute_bytes >> 2:
        return text.replace("\x00", "\ufffd") if "\x00" in text else text
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limits.max_attribute_bytes:
        return text.replace("\x00", "\ufffd") if "\x00" in text else text
    cut = encoded[: limits.max_attribute_bytes].decode("utf-8", "ignore")
    return cut.replace("\x00", "\ufffd") + f"...[truncated {len(encoded) - len(cut.encode())} bytes]"


def any_value(value, limits: DecodeLimits, depth: int = 0) -> Any:
    """Convert an OTLP ``AnyValue`` to a Python value, cutting depth, size and array length."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return _truncate(value.string_value, limits)
    if kind == "int_value":
        return value.int_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "double_value":
        number = value.double_value
        return number if math.isfinite(number) else str(number)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value[: limits.max_attribute_bytes]).decode()
    if kind in ("array_value", "kvlist_value"):
        if depth >= limits.max_depth:
            return f"[truncated: nesting deeper than {limits.max_depth}]"
        if kind == "array_value":
            items = value.array_value.values
            out = [any_value(v, limits, depth + 1) for v in items[: limits.max_array_items]]
            if len(items) > limits.max_array_items:
                out.append(f"[truncated {len(items) - limits.max_array_items} items]")
            return out
        return {
            _truncate(kv.key, limits): any_value(kv.value, limits, depth + 1)
            for kv in value.kvlist_value.values[: limits.max_array_items]
        }
    return None


def attributes_to_dict(key_values, limits: DecodeLimits) -> dict[str, Any]:
    """Convert repeated ``KeyValue`` to a dict (last duplicate key wins, as in the SDKs)."""
    # Same result as ``{_truncate(k): any_value(v)}``, with short strings (nearly every key and
    # value) handled inline: this loop runs for every attribute of every span.
    out: dict[str, Any] = {}
    short = limits.max_attribute_bytes >> 2
    for kv in key_values:
        key = kv.key
        if len(key) > short or "\x00" in key:
            key = _truncate(key, limits)
        value = kv.value
        if value.WhichOneof("value") == "string_value":
            text = value.string_value
            out[key] = text if len(text) <= short and "\x00" not in text else _truncate(text, limits)
        else:
            out[key] = any_value(value, limits)
    return out


def _attributes_and_map(key_values, limits: DecodeLimits) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``attributes_to_dict`` and ``_as_string_map`` of it, in one pass over the attributes."""
    out: dict[str, Any] = {}
    pairs: list[tuple[str, str]] = []
    short = limits.max_attribute_bytes >> 2
    for kv in key_values:
        key = kv.key
        if len(key) > short or "\x00" in key:
            key = _truncate(key, limits)
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "string_value":
            text = value.string_value
            if len(text) > short or "\x00" in text:
                text = _truncate(text, limits)
            out[key] = text
            pairs.append((key, text))
        elif kind == "array_value" and len(items := value.array_value.values) <= limits.max_array_items:
            strings = [item.string_value for item in items if item.WhichOneof("value") == "string_value"]
            if len(strings) == len(items) and all(len(t) <= short and "\x00" not in t for t in strings):
                # An array of short strings (constraint ids): the JSON text is built directly,
                # identical to json.dumps(..., ensure_ascii=False, separators=(",", ":")).
                out[key] = strings
                pairs.append((key, "[" + ",".join(map(_json_string, strings)) + "]"))
            else:
                converted = any_value(value, limits)
                out[key] = converted
                pairs.extend(_as_string_map({key: converted}))
        else:
            converted = any_value(value, limits)
            out[key] = converted
            pairs.extend(_as_string_map({key: converted}))
    if len(pairs) != len(out):  # a repeated key: the last one wins, as in attributes_to_dict
        pairs = _as_string_map(out)
    return out, pairs


def _as_string_map(attrs: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for key, value in attrs.items():
        if type(value) is str:
            out.append((key, value))
        elif isinstance(value, bool):
            out.append((key, "true" if value else "false"))
        elif value is None:
            out.append((key, ""))
        else:
            out.append((key, json.dumps(value, ensure_ascii=False, separators=(",", ":"))))
    return out


def _check_span(span) -> str | None:
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        return f"span {span.name[:60]!r}: trace_id must be 16 non-zero bytes, got {len(trace_id)} bytes"
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return f"span {span.name[:60]!r}: span_id must be 8 non-zero bytes, got {len(span_id)} bytes"
    if len(parent) not in (0, 8):
        return f"span {span.name[:60]!r}: parent_span_id must be empty or 8 bytes, got {len(parent)} bytes"
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start == 0:
        return f"span {span.name[:60]!r}: start_time_unix_nano is 0 (unset)"
    if start > _MAX_NS or end > _MAX_NS:
        return f"span {span.name[:60]!r}: timestamp beyond year 2262 (nanoseconds overflow int64)"
    if end < start:
        return f"span {span.name[:60]!r}: end_time_unix_nano {end} is before start_time_unix_nano {start}"
    return None


def _events_json(span, limits: DecodeLimits) -> str:
    if not span.events:
        return "[]"
    events = [
        {
            "Timestamp": e.time_unix_nano,
            "Name": _truncate(e.name, limits),
            "Attributes": attributes_to_dict(e.attributes, limits),
        }
        for e in span.events[: limits.max_array_items]
    ]
    return json.dumps(events, ensure_ascii=False, separators=(",", ":"))


def _links_json(span, limits: DecodeLimits) -> str:
    if not span.links:
        return "[]"
    links = [
        {
            "TraceId": link.trace_id.hex(),
            "SpanId": link.span_id.hex(),
            "TraceState": link.trace_state,
            "Attributes": attributes_to_dict(link.attributes, limits),
        }
        for link in span.links[: limits.max_array_items]
    ]
    return json.dumps(links, ensure_ascii=False, separators=(",", ":"))


def _service_name(key_values, resource: dict[str, Any]) -> str:
    """The ``service.name`` string of a resource, else ``unknown_service``: only a string value
    names a service (a double, bytes or array does not, though ``resource`` holds it as text),
    as the compiled decoder decides; the last of repeated keys wins, as in the dict."""
    service = resource.get("service.name")
    if not (isinstance(service, str) and service):
        return "unknown_service"
    for kv in reversed(key_values):
        if kv.key == "service.name":
            return service if kv.value.WhichOneof("value") == "string_value" else "unknown_service"
    return "unknown_service"


def decode_export_request(
    request: ExportTraceServiceRequest,
    limits: DecodeLimits = DecodeLimits(),
    now: datetime | None = None,
    id_errors: list[str] | None = None,
) -> DecodedBatch:
    """Turn a parsed request into column-wise rows for `spans` (validated, mapped, bounded)."""
    batch = DecodedBatch()
    ingested_at = (now or datetime.now(UTC)).replace(tzinfo=None)
    # Rows are gathered as tuples and transposed once at the end: far fewer Python operations per
    # span than appending to ~60 column lists one value at a time.
    otel_rows: list[tuple] = []
    events_json, links_json = _events_json, _links_json
    check_request_counts(request, limits)
    for resource_spans in request.resource_spans:
        resource_attributes = len(resource_spans.resource.attributes)
        if resource_attributes > limits.max_attributes_per_span:
            resource = {}  # every span under it is rejected below; nothing of it is kept
        else:
            resource = attributes_to_dict(resource_spans.resource.attributes, limits)
        service = _service_name(resource_spans.resource.attributes, resource)
        resource_map = _as_string_map(resource)
        for scope_spans in resource_spans.scope_spans:
            scope_name = _truncate(scope_spans.scope.name, limits)
            scope_version = _truncate(scope_spans.scope.version, limits)
            for span in scope_spans.spans:
                problem = _check_span(span) or _check_attribute_counts(span, resource_attributes, limits)
                if problem:
                    batch.rejected += 1
                    batch.errors.append(problem)
                    continue
                _, attribute_map = _attributes_and_map(span.attributes, limits)
                start, end = span.start_time_unix_nano, span.end_time_unix_nano
                trace_hex = span.trace_id.hex()
                kind = span.kind
                status = span.status
                code = status.code
                otel_rows.append(
                    (
                        start // 1000,
                        trace_hex,
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        span.trace_state,
                        _truncate(span.name, limits),
                        SPAN_KINDS[kind] if 0 <= kind < len(SPAN_KINDS) else "Unspecified",
                        service,
                        resource_map,
                        scope_name,
                        scope_version,
                        attribute_map,
                        end - start,
                        STATUS_CODES[code] if 0 <= code < 3 else "Unset",
                        _truncate(status.message, limits),
                        events_json(span, limits) if span.events else "[]",
                        links_json(span, limits) if span.links else "[]",
                        start,
                        end,
                    )
                )
    if otel_rows:
        cols: dict[str, Any] = {}
        for name, values in zip(OTEL_COLUMNS, zip(*otel_rows, strict=True), strict=True):
            cols[name] = values
        for name in ATTRIBUTE_COLUMNS:
            cols[name] = flatten_pairs(cols[name])
        cols.update(_coordination(cols))
        batch.table = build_table(cols, len(otel_rows), ingested_at)
        batch.accepted = len(otel_rows)
    if id_errors:
        # JSON ids that were not hex fail the length check above; say the real cause first.
        batch.errors = id_errors + batch.errors
    return batch


def flatten_pairs(per_row: Any) -> tuple[list[int], list[str], list[str]]:
    """Lists of (key, value) pairs per row -> (offsets, keys, values), as Arrow lists want."""
    offsets = [0]
    total = 0
    keys: list[str] = []
    values: list[str] = []
    for pairs in per_row:
        total += len(pairs)
        offsets.append(total)
        for key, value in pairs:
            keys.append(key)
            values.append(value)
    return offsets, keys, values


def build_table(columns: dict[str, Any], rows: int, ingested_at: datetime) -> pa.Table:
    """An Arrow table with the `spans` schema from column values: a sequence per column, and
    for the attribute columns an (offsets, keys, values) triple (``flatten_pairs``)."""
    arrays = []
    for f in SPAN_SCHEMA:
        name = f.name
        if name == "ingested_at":
            micros = pa.scalar(ingested_at, type=f.type).value  # one value on every row
            arrays.append(
                pa.Array.from_buffers(f.type, rows, [None, pa.py_buffer(np.full(rows, micros, np.int64))])
            )
        elif name in ATTRIBUTE_COLUMNS:
            offsets, keys, values = columns[name]
            entries = pa.StructArray.from_arrays(
                [string_array(keys), string_array(values)], fields=list(KEY_VALUE)
            )
            arrays.append(pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), entries, type=f.type))
        else:
            arrays.append(_column_array(columns[name], rows, f.type))
    return pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)


def _column_array(values: Any, rows: int, kind: pa.DataType) -> pa.Array:
    """``pa.array(values, type=kind)``, cheaper for a column that holds one value on every row:
    a batch's scope, service, status and empty events, and the coordination columns its spans'
    conventions never fill, are such columns (a str column is laid out from its one value's bytes
    instead of converting each row's)."""
    if rows:
        first = values[0]
        last = values[-1]
        if first is None:
            if last is None and values.count(None) == rows:
                return pa.nulls(rows, kind)
        elif first.__class__ is str and (last is first or last == first) and kind.id == _STRING_ID:
            if values.count(first) == rows:
                return _repeated_string(first, values, rows, kind)
    if kind.id == _STRING_ID:
        return string_array(values)
    return pa.array(values, type=kind)


_STRING_ID = pa.string().id
_utf8_column = getattr(_otlpfast, "utf8_column", None)


def string_array(values: Any) -> pa.Array:
    """``pa.array(values, type=pa.string())`` for str / None values, its buffers laid out by the
    compiled decoder's ``utf8_column`` (3-4x faster than pyarrow's per-item conversion) when it is
    built and takes them (exact str and None only; anything else goes to pa.array as before)."""
    buffers = _utf8_column(values) if _utf8_column is not None else None
    if buffers is None:
        return pa.array(values, type=pa.string())
    offsets, data, validity, nulls = buffers
    validity = None if validity is None else pa.py_buffer(validity)
    return pa.Array.from_buffers(
        pa.string(), len(values), [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
    )


def _repeated_string(text: str, values: Any, rows: int, kind: pa.DataType) -> pa.Array:
    try:
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: let pa.array say so, as for any row
        return pa.array(values, type=kind)
    if len(data) * rows >= 2**31:
        return pa.array(values, type=kind)
    offsets = (
        np.arange(0, (rows + 1) * len(data), len(data), dtype=np.int32)
        if data
        else np.zeros(rows + 1, np.int32)
    )
    return pa.Array.from_buffers(kind, rows, [None, pa.py_buffer(offsets), pa.py_buffer(data * rows)])


def _coordination(columns: dict[str, Any]) -> dict[str, list]:
    """The coordination columns, mapped by the convention table from the raw columns (the
    same for both decoders: from the attribute string maps, span names and scopes)."""
    return map_columns(
        columns["SpanAttributes"],
        columns["ResourceAttributes"],
        columns["SpanName"],
        columns["ScopeName"],
        columns["TraceId"],
        columns["Events"],
    )


def _fast_batch(fast: FastResult, now: datetime | None) -> DecodedBatch:
    batch = DecodedBatch(accepted=fast.accepted, rejected=fast.rejected, errors=fast.errors)
    if fast.accepted:
        columns = fast.columns
        columns["SpanAttributes"] = fast.span_attributes
        columns["ResourceAttributes"] = fast.resource_attributes
        columns.update(_coordination(columns))
        ingested_at = (now or datetime.now(UTC)).replace(tzinfo=None)
        batch.table = build_table(columns, fast.accepted, ingested_at)
    return batch


def decode_payload(
    payload: bytes, content_type: str, limits: DecodeLimits = DecodeLimits(), now: datetime | None = None
) -> DecodedBatch:
    """Decode an OTLP/HTTP trace body by content type (``PROTOBUF`` or ``JSON``).

    Protobuf goes through the compiled decoder (``collector.fastdecode``) when it can take the
    request, else through upb and ``decode_export_request``; both give the same rows
    (tests/collector/test_fastdecode.py).
    """
    if content_type == PROTOBUF:
        try:
            fast = decode_fast(payload, limits)
        except LimitExceededError as exc:
            raise RequestTooLargeError(exc.kind, limits) from None
        if fast is not None:
            batch = _fast_batch(fast, now)
        else:
            try:  # counted on the wire first: upb would build every span before the Python check
                check_counts(payload, limits)
            except LimitExceededError as exc:
                raise RequestTooLargeError(exc.kind, limits) from None
            batch = decode_export_request(parse_protobuf(payload), limits, now)
    elif content_type == JSON:
        request, id_errors = parse_json(payload, limits)
        batch = decode_export_request(request, limits, now, id_errors)
    else:
        raise DecodeError(f"Unsupported content type {content_type!r}; use {PROTOBUF} or {JSON}")
    batch.payload_bytes = len(payload)
    return batch


def encode_hex_ids(document: dict) -> dict:
    """Rewrite base64 ids of a ``MessageToDict`` result to OTLP JSON's hex (for writers/tests)."""

    def fix(node: dict) -> None:
        for key in _ID_FIELDS:
            if node.get(key):
                try:
                    node[key] = base64.b64decode(node[key]).hex()
                except (binascii.Error, ValueError):
                    pass

    for rs in document.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                fix(span)
                for link in span.get("links", []):
                    fix(link)
    return document


def timestamp_of(start_ns: int) -> datetime:
    """The `Timestamp` column value for a start time in ns (naive UTC, microseconds)."""
    return datetime.fromtimestamp(start_ns / 1e9, UTC).replace(tzinfo=None)
