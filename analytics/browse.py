"""Browsing queries (not detectors): the list of runs and the spans of one run.

Shared by the read API and the dashboard's offline (DuckDB file) source.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics.sql_loader import load_sql, query_df
from analytics.types import Filters, Window


def list_runs(
    conn: duckdb.DuckDBPyConnection, window: Window = Window(), filters: Filters = Filters(), limit: int = 500
) -> pd.DataFrame:
    """Runs with spans in the window, newest first.

    Columns: run_id, first_seen, last_seen (UTC timestamps), spans, traces (counts), agents,
    services (sorted lists), rejected, errors (span counts), max_hop, scenario (simulator runs).
    One row = one run (``gen_ai.conversation.id``, else the trace id).
    """
    params = {
        "since": window.since,
        "until": window.until,
        "service": filters.service,
        "agent": filters.agent,
        "run": filters.run,
        "origin_task": filters.origin_task,
        "limit": limit,
    }
    return query_df(conn, load_sql("list_runs"), params)


def run_spans(conn: duckdb.DuckDBPyConnection, run_id: str, limit: int = 20_000) -> pd.DataFrame:
    """Every span of ``run_id`` in start order; one row = one span (see run_spans.sql)."""
    frame = query_df(conn, load_sql("run_spans"), {"run": run_id, "limit": limit})
    if "attributes" in frame.columns:
        frame["attributes"] = frame["attributes"].map(
            lambda entries: {e["key"]: e["value"] for e in entries} if entries is not None else {}
        )
    return frame
