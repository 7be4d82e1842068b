"""A compiled fast path for OTLP/HTTP protobuf trace requests (``collector._otlpfast``).

``decode_fast(payload, limits)`` parses the protobuf wire format of an
``ExportTraceServiceRequest`` in C and returns the same raw columns as
``collector.decode.decode_export_request(parse_protobuf(payload), limits)`` (the OpenTelemetry
columns and the attribute (key, value) lists), or ``None`` when the request must go through the
Python path (the caller then decodes the *whole* request there). It knows no attribute
convention: ``collector.decode`` maps the coordination columns afterwards, for both paths, with
``collector.mapping_plans.map_columns`` (driven by the convention table), whose two inner loops
(``_otlpfast.group_rows``, ``_otlpfast.copy_columns``) are also compiled here, the key table
handed in by that module.

What it handles: every field of the OTLP trace protos (unknown fields of any wire type, groups
included, are skipped as upb skips them; repeated occurrences of a message field merge as upb
merges them); attribute values of every kind (strings, ints, bools, doubles, bytes, unset,
arrays and kvlists, nested, cut at ``limits.max_depth`` as ``any_value`` cuts them); span events
and links (the Events / Links JSON); strings longer than ``limits.max_attribute_bytes`` (cut as
``_truncate`` cuts them) or holding NUL; arrays, events and links beyond
``limits.max_array_items``; spans rejected by ``_check_span`` (same messages), whatever else
they carry; duplicate attribute keys (the first position and the last value, as the Python
path's dicts keep them); ``AnyValue`` nesting of any depth: past 16 levels (beyond the
``max_depth`` cut, so never built) a value is skipped unread, where upb refuses the whole request
past its recursion limit (issue 32: one deep value costs only itself).

It returns ``None`` (fall back) when:

- the payload is not a valid protobuf ``ExportTraceServiceRequest`` as upb parses it (malformed
  varint, tag, length or group; invalid UTF-8 in any string field), or is 2 GiB or larger;
- a kvlist value, or an array value with an item that is not a string, comes in more than one
  ``value`` field of its KeyValue (protobuf would merge them; the fast path does not);
- an attribute key is longer than ``limits.max_attribute_bytes`` bytes or contains NUL (the
  Python path would cut or rewrite it, and cut keys can collide);
- unknown groups nest deeper than 16 levels;
- ``limits.max_depth`` is below 1 or a limit is negative;
- the extension is not built (``AVAILABLE`` is False).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from collector import conventions
from collector.limits import DecodeLimits

logger = logging.getLogger(__name__)

try:
    from collector import _otlpfast
except ImportError as exc:  # a source checkout without `setup.py build_ext --inplace`
    _otlpfast = None
    logger.info("collector._otlpfast is not built (%s); OTLP protobuf decoding uses the Python path", exc)

AVAILABLE = _otlpfast is not None

# The OpenTelemetry columns the C decoder returns, in table order (attributes come apart).
OTEL_OUTPUT_COLUMNS = tuple(c for c in conventions.OTEL_COLUMNS if c not in conventions.ATTRIBUTE_COLUMNS)
_MAX_LIMIT = 2**62

AttributeTriple = tuple[list[int], list[str], list[str]]


class LimitExceededError(ValueError):
    """The request carries more spans (``kind`` "spans") or more spans + events + links +
    attributes (``kind`` "items") than ``DecodeLimits`` allows; the decoder stopped there."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass
class FastResult:
    """Rows of one request, column-wise (see the module docstring for what equals what).

    ``columns`` has one list per OpenTelemetry column of ``collector.decode.SPAN_COLUMNS`` except
    SpanAttributes and ResourceAttributes ("Timestamp" holds ``start_ns // 1000``);
    ``span_attributes`` / ``resource_attributes`` are ``(offsets, keys, values)``: span i's
    pairs are ``keys[offsets[i]:offsets[i + 1]]`` with the values at the same positions.
    """

    columns: dict[str, list]
    span_attributes: AttributeTriple
    resource_attributes: AttributeTriple
    accepted: int
    rejected: int
    errors: list[str]


def decode_fast(payload: bytes, limits: DecodeLimits) -> FastResult | None:
    """Decode a binary ``ExportTraceServiceRequest``, or None when the Python path must do it."""
    if _otlpfast is None:
        return None
    max_bytes, max_items, max_depth = limits.max_attribute_bytes, limits.max_array_items, limits.max_depth
    if not (0 <= max_bytes <= _MAX_LIMIT and 0 <= max_items <= _MAX_LIMIT and 1 <= max_depth <= _MAX_LIMIT):
        return None
    if type(payload) is not bytes:
        payload = bytes(payload)
    counts = (limits.max_spans_per_request, limits.max_attributes_per_span, limits.max_items_per_request)
    if not all(0 <= n <= _MAX_LIMIT for n in counts):
        return None
    out = _otlpfast.decode(payload, max_bytes, max_items, max_depth, *counts)
    if out is None:
        return None
    if type(out) is str:  # "spans" or "items": a count limit was passed while parsing
        raise LimitExceededError(out)
    otel, span_attributes, resource_attributes, accepted, rejected, errors = out
    columns = dict(zip(OTEL_OUTPUT_COLUMNS, otel, strict=True))
    return FastResult(columns, span_attributes, resource_attributes, accepted, rejected, errors)


def check_counts(payload: bytes, limits: DecodeLimits) -> None:
    """Raise ``LimitExceededError`` when the request carries more spans or items than ``limits``
    allow, counted on the wire without keeping anything (as ``check_request_counts`` counts them):
    the guard in front of upb for requests ``decode_fast`` leaves to the Python path."""
    if _otlpfast is None:
        return
    max_spans, max_items = limits.max_spans_per_request, limits.max_items_per_request
    if not (0 <= max_spans <= _MAX_LIMIT and 0 <= max_items <= _MAX_LIMIT):
        return
    kind = _otlpfast.count(payload if type(payload) is bytes else bytes(payload), max_spans, max_items)
    if kind is not None:
        raise LimitExceededError(kind)
