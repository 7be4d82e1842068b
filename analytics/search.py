"""Search spans across runs: by trace id, span id, run id, span name or any attribute value.

What an on-call engineer pastes from a log line or an alert (a trace id, an order number in a
tool argument) finds the spans that hold it, each with its run, so the run explorer can open
there. A browsing query like those of ``analytics.browse`` (window and filters as
``_run_scope.sql`` says), shared by the read API and the dashboard's offline source.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics.sql_loader import filter_params, load_sql, query_df
from analytics.types import Filters, Window

# Shortest text searched as a substring: one or two characters match nearly every span.
MIN_SEARCH_CHARS = 3
MAX_SEARCH_CHARS = 512
DEFAULT_SEARCH_LIMIT = 100


def search_spans(
    conn: duckdb.DuckDBPyConnection,
    text: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    limit: int = DEFAULT_SEARCH_LIMIT,
) -> pd.DataFrame:
    """Spans matching ``text``: id matches first, then the newest, at most ``limit``.

    Columns: run_id, trace_id, span_id, span_name, agent_id, service, start (naive UTC),
    matched ('trace id', 'span id', 'run id', 'span name' or the attribute key that matched).
    Raises ``ValueError`` for text shorter than ``MIN_SEARCH_CHARS`` or longer than
    ``MAX_SEARCH_CHARS`` characters (after trimming spaces).
    """
    text = text.strip()
    if len(text) < MIN_SEARCH_CHARS:
        raise ValueError(
            f"Search text must be at least {MIN_SEARCH_CHARS} characters (a trace id, span id or value), "
            f"got {text!r}"
        )
    if len(text) > MAX_SEARCH_CHARS:
        raise ValueError(f"Search text must be at most {MAX_SEARCH_CHARS} characters, got {len(text)}")
    params = {
        **filter_params(window, filters),
        "id": text.lower(),
        "text": text,
        "needle": text.lower(),
        "limit": int(limit),
    }
    return query_df(conn, load_sql("search_spans"), params)
