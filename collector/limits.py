"""Bounds on what one OTLP request may cost to decode, shared by both decoders.

``collector.decode`` (the Python path) and ``collector.fastdecode`` (the compiled path) both take
a ``DecodeLimits``; it lives here so neither decoder module imports the other's caller.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeLimits:
    """Bounds on hostile values and on the work one request may cost (issue 12)."""

    max_attribute_bytes: int = 64 * 1024
    max_depth: int = 8
    max_array_items: int = 1000
    # Counted while decoding: past either the whole request is refused (RequestTooLargeError).
    max_spans_per_request: int = 100_000
    max_items_per_request: int = 2_000_000  # spans + events + links + attributes
    # A span whose attributes, or whose kept events' / links' / resource's, pass it is rejected.
    max_attributes_per_span: int = 1024
