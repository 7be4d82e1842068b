"""OTLP JSON encoding of finished SDK spans (one ExportTraceServiceRequest per file).

The protobuf message is built by the OTLP exporter's own encoder, then rendered with the OTLP
JSON rules: lowerCamelCase field names, enums as integers, 64-bit integers as strings, and trace
and span ids as lower-case hex (protobuf's JSON mapping would give base64).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan

_ID_FIELDS = {"traceId", "spanId", "parentSpanId"}


def _hex_ids(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                out[key] = base64.b64decode(value).hex()
            else:
                out[key] = _hex_ids(value)
        return out
    if isinstance(node, list):
        return [_hex_ids(item) for item in node]
    return node


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The ExportTraceServiceRequest for ``spans`` as an OTLP JSON object."""
    request = encode_spans(list(spans))
    return _hex_ids(MessageToDict(request, use_integers_for_enums=True))


def write_otlp_json(spans: Sequence[ReadableSpan], path: Path) -> None:
    """Write ``spans`` to ``path`` as one OTLP JSON request, byte-stable for the same spans."""
    text = json.dumps(spans_to_otlp_json(spans), indent=1, ensure_ascii=False)
    Path(path).write_text(text + "\n", encoding="utf-8")
