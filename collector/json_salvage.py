"""One bad value in an OTLP JSON body costs only itself (issue 32).

``json_format.ParseDict`` refuses a whole request for one value it cannot take: an ``intValue``
past int64, a time of ``1e30`` or 2^64, ``attributes`` sent as an object, AnyValue nesting past
protobuf's recursion limit. ``salvage_spans`` parses each span on its own and turns the ones that
fail into placeholders the span check rejects (``partial_success``), with the reason; the spans
beside them are stored. ``replace_lone_surrogates`` replaces lone UTF-16 surrogates (JavaScript
exporters cut strings mid-pair; ``json.loads`` keeps them, no UTF-8 encoder takes them) with
U+FFFD before anything else sees the document.
"""

from __future__ import annotations

import re
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

# A \uD800-\uDFFF escape in the raw body: only then can json.loads produce a lone surrogate.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
PARSE_ERRORS = (json_format.ParseError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def _clean(text: str) -> str:
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def replace_lone_surrogates(document: Any) -> Any:
    """``document`` with every lone surrogate in its strings and keys replaced by U+FFFD (in place
    for containers; iterative, so any depth json.loads built is walked)."""
    if isinstance(document, str):
        return _clean(document)
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in list(node):
                value = node[key]
                if isinstance(value, str):
                    node[key] = _clean(value)
                elif isinstance(value, dict | list):
                    stack.append(value)
                if isinstance(key, str) and _SURROGATE.search(key):
                    node[_clean(key)] = node.pop(key)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                if isinstance(value, str):
                    node[index] = _clean(value)
                elif isinstance(value, dict | list):
                    stack.append(value)
    return document


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "AnyValue arrays/kvlists nested too deeply to decode"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:100] + " ... " + text[-100:]


def _parses(node: Any, message) -> BaseException | None:
    try:
        json_format.ParseDict(node, message, ignore_unknown_fields=True)
    except PARSE_ERRORS as exc:
        return exc
    return None


def _placeholder(span: Any) -> dict:
    """What stands in for a span that cannot be parsed: its name, no ids, so the span check
    rejects it (counted in partial_success) and the reason comes from the caller's message."""
    name = span.get("name") if isinstance(span, dict) else None
    return {"name": name[:200]} if isinstance(name, str) else {}


def salvage_spans(document: dict, errors: list[str]) -> None:
    """Replace every span (and every span under a resource or scope) that ``ParseDict`` cannot
    take by a placeholder the span check rejects, appending the reason to ``errors``."""
    resource_spans = document.get("resourceSpans", document.get("resource_spans"))
    for r_index, rs in enumerate(resource_spans if isinstance(resource_spans, list) else ()):
        if not isinstance(rs, dict):
            continue
        scope_key = "scopeSpans" if "scopeSpans" in rs else "scope_spans"
        scope_spans = rs.get(scope_key)
        envelope = {k: v for k, v in rs.items() if k != scope_key}
        broken_resource = _parses(envelope, ResourceSpans())
        for s_index, ss in enumerate(scope_spans if isinstance(scope_spans, list) else ()):
            if not isinstance(ss, dict):
                continue
            broken_scope = broken_resource or _parses(
                {k: v for k, v in ss.items() if k != "spans"}, ScopeSpans()
            )
            spans = ss.get("spans")
            for p_index, span in enumerate(spans if isinstance(spans, list) else ()):
                where = f"resourceSpans[{r_index}].scopeSpans[{s_index}].spans[{p_index}]"
                broken = broken_scope or _parses(span, Span())
                if broken is not None:
                    part = (
                        "its resource" if broken_resource else ("its scope" if broken_scope else "the span")
                    )
                    errors.append(f"{where}: {part} could not be decoded ({_reason(broken)})")
                    spans[p_index] = _placeholder(span)
            if broken_scope is not None:
                for key in [k for k in ss if k != "spans"]:
                    del ss[key]
        if broken_resource is not None:
            for key in list(envelope):
                del rs[key]
