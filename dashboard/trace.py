"""A run's spans as a trace tree: parent/child nesting, search, inputs and outputs (no Streamlit).

Spans are nested by (trace id, parent span id), as Jaeger, Phoenix and Langfuse show them. A span
whose parent is not in the run (another service's span, or a trace root) is a root. Roots and
siblings are ordered by start time, so a depth-first walk is the order a trace view lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# Span texts shown as a span's inputs and outputs, in this order (run_spans column names).
INPUT_COLUMNS = ("goal_root", "goal_text", "input_text", "tool_args")
OUTPUT_COLUMNS = ("output_text", "tool_result", "status_message")
# Columns a search compares with the query (besides every attribute value).
SEARCH_COLUMNS = (
    "trace_id",
    "span_id",
    "span_name",
    "agent_id",
    "tool_name",
    *INPUT_COLUMNS,
    *OUTPUT_COLUMNS,
)


@dataclass(frozen=True)
class TraceRow:
    """One span in depth-first order: its position in ``spans``, depth and children."""

    position: int
    span_id: str
    parent: int | None
    depth: int
    children: tuple[int, ...]


def _text(value) -> str | None:
    """A span cell as text, or None when missing or empty."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, list | tuple):
        value = ", ".join(map(str, value))
    text = str(value)
    return text if text and text not in ("nan", "None", "NaT", "<NA>") else None


def trace_rows(spans: pd.DataFrame) -> list[TraceRow]:
    """The spans of ``spans`` in depth-first order (roots and siblings by start time).

    Each row's ``children`` are positions in the returned list. Cycles in corrupt parent ids are
    broken: a span is listed once, under the first parent reached.
    """
    if spans is None or spans.empty:
        return []
    traces = spans["trace_id"].astype(str).tolist()
    ids = spans["span_id"].astype(str).tolist()
    parents = [_text(p) for p in spans["parent_span_id"]] if "parent_span_id" in spans else [None] * len(ids)
    starts = pd.to_numeric(spans["start_ns"], errors="coerce").fillna(0).tolist()
    where = {(t, s): i for i, (t, s) in enumerate(zip(traces, ids, strict=True))}
    kids: dict[int, list[int]] = {}
    roots = []
    for i, (trace, parent) in enumerate(zip(traces, parents, strict=True)):
        up = where.get((trace, parent)) if parent else None
        if up is None or up == i:
            roots.append(i)
        else:
            kids.setdefault(up, []).append(i)
    order = sorted(range(len(ids)), key=lambda i: (starts[i], ids[i]))
    rank = {i: r for r, i in enumerate(order)}
    roots.sort(key=rank.__getitem__)
    seen: set[int] = set()
    walked: list[tuple[int, int | None, int]] = []  # (span position, parent list index, depth)
    stack = [(r, None, 0) for r in reversed(roots)]
    while stack:
        i, parent_index, depth = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        walked.append((i, parent_index, depth))
        here = len(walked) - 1
        for child in sorted(kids.get(i, []), key=rank.__getitem__, reverse=True):
            stack.append((child, here, depth + 1))
    # Spans only reachable through a cycle: listed as roots at the end.
    for i in order:
        if i not in seen:
            seen.add(i)
            walked.append((i, None, 0))
    children: dict[int, list[int]] = {}
    for index, (_, parent_index, _) in enumerate(walked):
        if parent_index is not None:
            children.setdefault(parent_index, []).append(index)
    return [
        TraceRow(i, ids[i], parent_index, depth, tuple(children.get(index, ())))
        for index, (i, parent_index, depth) in enumerate(walked)
    ]


def ancestors(rows: list[TraceRow], wanted: set[int]) -> set[int]:
    """List indexes of every ancestor of the rows at ``wanted`` (the rows themselves excluded)."""
    found: set[int] = set()
    for index in wanted:
        parent = rows[index].parent
        while parent is not None and parent not in found:
            found.add(parent)
            parent = rows[parent].parent
    return found


def search_spans(spans: pd.DataFrame, query: str) -> set[str]:
    """Span ids whose trace id, span id, name, agent, tool, texts or any attribute value contain
    ``query`` (case-insensitive). An empty query matches nothing."""
    needle = (query or "").strip().lower()
    if not needle or spans is None or spans.empty:
        return set()
    hits = pd.Series(False, index=spans.index)
    for column in SEARCH_COLUMNS:
        if column in spans.columns:
            hits |= spans[column].astype(str).str.lower().str.contains(needle, regex=False, na=False)
    if "attributes" in spans.columns:
        hits |= spans["attributes"].map(
            lambda attrs: isinstance(attrs, dict) and any(needle in str(v).lower() for v in attrs.values())
        )
    return set(spans.loc[hits, "span_id"].astype(str))


def span_io(span: pd.Series) -> tuple[dict[str, str], dict[str, str]]:
    """(inputs, outputs) of a span: its non-empty goal, input and argument texts; output, result
    and status message texts."""
    inputs = {c: t for c in INPUT_COLUMNS if (t := _text(span.get(c))) is not None}
    outputs = {c: t for c in OUTPUT_COLUMNS if (t := _text(span.get(c))) is not None}
    return inputs, outputs


def duration_text(span: pd.Series) -> str:
    """``12.5 ms`` / ``3.2 s`` from the span's start and end."""
    try:
        nanos = int(span["end_ns"]) - int(span["start_ns"])
    except (KeyError, TypeError, ValueError):
        return "?"
    if nanos >= 1_000_000_000:
        return f"{nanos / 1e9:.1f} s"
    return f"{nanos / 1e6:.1f} ms"


def failed(span: pd.Series) -> bool:
    """Whether a guard refused the span's call or the span failed."""
    return span.get("outcome") in ("rejected", "error") or span.get("status_code") == "Error"
