"""Search across runs (the run explorer's "Search all runs" box), as pure functions.

A trace id from a log line, a span id from an alert or an order number inside a tool argument
finds its spans in any run; each result links to the run explorer at that span.
"""

from __future__ import annotations

import pandas as pd

from dashboard.filters import run_link

# Columns shown, in order; ``open`` is the link to the run explorer.
SHOWN = ["open", "matched", "span_name", "agent_id", "service", "start", "trace_id", "span_id", "run_id"]


def search_results_table(results: pd.DataFrame) -> pd.DataFrame:
    """Search results with an ``open`` link per row: the run explorer at that run with the span
    inspected (a trace-id match also searches the trace inside the run, marking its spans)."""
    frame = results.copy()
    frame["open"] = [
        run_link(run, span=span, query=trace if matched == "trace id" else None)
        for run, span, trace, matched in zip(
            frame["run_id"], frame["span_id"], frame["trace_id"], frame["matched"], strict=True
        )
    ]
    return frame[[c for c in SHOWN if c in frame.columns]]


def describe_results(results: pd.DataFrame, text: str, limit: int) -> str:
    """``12 span(s) in 3 run(s) match 'INV-9001'`` (saying when the list stops at ``limit``)."""
    if results.empty:
        return f"No span matches {text!r}."
    runs = results["run_id"].nunique()
    more = f" (the first {limit}; narrow the window or filters for the rest)" if len(results) >= limit else ""
    return f"{len(results)} span(s) in {runs} run(s) match {text!r}{more}."
