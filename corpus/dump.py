"""Print the spans of a captured ``otlp.jsonl`` as a tree: ``python -m corpus.dump <file> [--attrs]``.

Needs opentelemetry-proto (in both the project venv and the framework venv).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read_requests(path: Path) -> Iterator[dict[str, Any]]:
    """The captured requests of ``path``, each with its raw ``body`` bytes."""
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                record["body"] = base64.b64decode(record.pop("body_b64"))
            except (ValueError, KeyError) as exc:
                raise ValueError(f"{path}:{number}: not a captured request line ({exc})") from None
            yield record


def request_bodies(path: Path) -> Iterator[tuple[bytes, str]]:
    """Each captured request of ``path`` as it reached the collector's decoder: its body (gzip
    undone) and its content type."""
    for record in read_requests(path):
        body = record["body"]
        if record.get("content_encoding") == "gzip":
            body = gzip.decompress(body)
        yield body, record["content_type"]


def decode_spans(path: Path) -> list[dict[str, Any]]:
    """Every span of the captured protobuf requests as a flat dict (ids hex, attributes as values)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans = []
    for record in read_requests(path):
        body = record["body"]
        if record.get("content_encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attrs = {}
                    for kv in span.attributes:
                        value = MessageToDict(kv.value)
                        attrs[kv.key] = next(iter(value.values())) if value else None
                    spans.append(
                        {
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "scope": scope_spans.scope.name,
                            "start": span.start_time_unix_nano,
                            "status": span.status.code,
                            "attributes": attrs,
                        }
                    )
    return spans


def print_tree(spans: list[dict[str, Any]], show_attrs: bool, width: int) -> None:
    children: dict[str, list[dict[str, Any]]] = {}
    ids = {s["span_id"] for s in spans}
    for span in sorted(spans, key=lambda s: s["start"]):
        parent = span["parent_span_id"] if span["parent_span_id"] in ids else ""
        children.setdefault(parent, []).append(span)

    def walk(parent: str, depth: int) -> None:
        for span in children.get(parent, []):
            kind = (
                span["attributes"].get("openinference.span.kind")
                or span["attributes"].get("gen_ai.operation.name")
                or span["attributes"].get("traceloop.span.kind")
                or ""
            )
            print(f"{'  ' * depth}{span['name']} [{kind}] status={span['status']}")
            if show_attrs:
                for key, value in span["attributes"].items():
                    text = str(value).replace("\n", "\\n")
                    print(f"{'  ' * depth}    {key} = {text[:width]}")
            walk(span["span_id"], depth + 1)

    walk("", 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--attrs", action="store_true", help="print attributes too")
    parser.add_argument("--trace", help="only this trace id")
    parser.add_argument("--width", type=int, default=160)
    args = parser.parse_args(argv)
    spans = decode_spans(args.file)
    if args.trace:
        spans = [s for s in spans if s["trace_id"] == args.trace]
    print_tree(spans, args.attrs, args.width)
    return 0


if __name__ == "__main__":
    sys.exit(main())
