"""Browsing queries (not detectors): runs, their totals, sidebar choices, spans and evidence.

Shared by the read API (``driftscope.api``) and the dashboard's offline (DuckDB file) source, so
both answer the same question the same way. They read typed columns only (never the attribute
lists, except the spans of one run) and aggregate in SQL. Window and filters mean what
``_run_scope.sql`` says: an agent or origin-task filter selects whole runs.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics.engine import is_clickhouse
from analytics.sql_loader import filter_params, load_sql, query_df
from analytics.types import Filters, Window

# Most (run_id, span_id) pairs one evidence lookup takes (a report shows 20 findings per mode
# with up to 25 spans each; the read API refuses more than this in one request).
MAX_EVIDENCE_KEYS = 10_000


def list_runs(
    conn: duckdb.DuckDBPyConnection,
    window: Window = Window(),
    filters: Filters = Filters(),
    limit: int = 500,
    runs: list[str] | None = None,
) -> pd.DataFrame:
    """Runs with spans in the window, newest first (only ``runs`` when given).

    Columns: run_id, first_seen, last_seen (UTC timestamps), spans, traces (counts), agents,
    services (sorted lists), rejected, errors (span counts), max_hop, scenario (simulator runs).
    One row = one run (``gen_ai.conversation.id``, else the trace id).
    """
    params = {
        **filter_params(window, filters),
        "limit": limit,
        "runs": list(runs) if runs is not None else None,
    }
    return query_df(conn, load_sql("list_runs"), params)


def run_details(
    conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters, run_ids: list[str]
) -> pd.DataFrame:
    """``list_runs`` rows of the given runs only (any number of them)."""
    return list_runs(conn, window, filters, limit=max(len(run_ids), 1), runs=list(run_ids))


def run_totals(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Every run in scope, newest first: run_id, spans, rejected, errors (span counts),
    first_seen, last_seen. No limit: one narrow row per run."""
    return query_df(conn, load_sql("run_totals"), filter_params(window, filters))


def filter_options(conn: duckdb.DuckDBPyConnection, window: Window, run_limit: int) -> dict:
    """Sidebar choices: sorted services and agents seen in the window, the newest ``run_limit``
    run ids (newest first)."""
    params = {**filter_params(window, Filters()), "limit": run_limit}
    row = query_df(conn, load_sql("filter_options"), params).iloc[0]
    return {key: [str(v) for v in row[key]] for key in ("services", "agents", "runs")}


def evidence_spans(conn: duckdb.DuckDBPyConnection, keys: pd.DataFrame) -> pd.DataFrame:
    """The spans named by the (run_id, span_id) pairs of ``keys``, in start order."""
    if len(keys) > MAX_EVIDENCE_KEYS:
        raise ValueError(
            f"Expected at most {MAX_EVIDENCE_KEYS} evidence keys in one lookup, got {len(keys)}; "
            "ask for fewer findings at a time"
        )
    if is_clickhouse(conn):  # the keys travel as two bound lists (no registered frame there)
        sql = load_sql("evidence_spans").replace(
            "_evidence_keys AS k",
            "(SELECT unnest($key_runs::VARCHAR[]) AS run_id, unnest($key_spans::VARCHAR[]) AS span_id) AS k",
        )
        pairs = keys[["run_id", "span_id"]].astype(str)
        return query_df(conn, sql, {"key_runs": list(pairs["run_id"]), "key_spans": list(pairs["span_id"])})
    conn.register("_evidence_keys", keys[["run_id", "span_id"]].astype(str))
    try:
        return conn.execute(load_sql("evidence_spans")).df()
    finally:
        conn.unregister("_evidence_keys")


def run_spans(
    conn: duckdb.DuckDBPyConnection, run_id: str, limit: int = 20_000, containing: list[str] | None = None
) -> pd.DataFrame:
    """Every span of ``run_id`` in start order; one row = one span (see run_spans.sql). With
    ``containing``, only spans whose tool arguments, input or goal text contain one of those texts."""
    params = {"run": run_id, "limit": limit, "containing": list(containing) if containing else None}
    frame = query_df(conn, load_sql("run_spans"), params)
    if "attributes" in frame.columns:
        frame["attributes"] = frame["attributes"].map(
            lambda entries: {e["key"]: e["value"] for e in entries} if entries is not None else {}
        )
    return frame
