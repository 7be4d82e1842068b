"""What the read API asks of the store, as plain functions of a DuckDB cursor."""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pandas as pd

import analytics  # noqa: F401 - importing the package registers every detector
from analytics import browse, registry, thresholds
from analytics.types import Filters, Window


def store_health(cursor: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Span count, newest span and schema version of the store."""
    spans, newest = cursor.execute("SELECT count(*), max(Timestamp) FROM spans").fetchone()
    version = cursor.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
    embedded = cursor.execute("SELECT count(*) FROM embeddings").fetchone()[0]
    return {"spans": spans, "newest_span": newest, "schema_version": version, "embeddings": embedded}


def describe_metrics() -> list[dict[str, Any]]:
    """Every registered metric with its parameters and documented columns."""
    return [
        {
            "name": m.name,
            "description": m.description,
            "row": m.row,
            "columns": m.columns,
            "failure_mode": m.failure_mode,
            "mast_category": m.mast_category,
            "params": ["since", "until", "service", "agent", "run", "origin_task"],
        }
        for m in registry.list_metrics()
    ]


def metric_names() -> set[str]:
    return set(registry.METRICS)


def window_and_filters(params: dict) -> tuple[Window, Filters]:
    """The validated query parameters as the analytics window and filters."""
    window = Window(since=params.get("since"), until=params.get("until"))
    filters = Filters(
        service=params.get("service"),
        agent=params.get("agent"),
        run=params.get("run"),
        origin_task=params.get("origin_task"),
    )
    return window, filters


def run_metric_frame(cursor: duckdb.DuckDBPyConnection, name: str, params: dict) -> tuple[pd.DataFrame, dict]:
    window, filters = window_and_filters(params)
    return registry.run_metric(cursor, name, window, filters), {}


def list_runs(cursor: duckdb.DuckDBPyConnection, params: dict) -> pd.DataFrame:
    window, filters = window_and_filters(params)
    return browse.list_runs(cursor, window, filters, params.get("limit", 500))


# Most run ids or evidence keys one lookup request may name.
MAX_LOOKUP_ITEMS = browse.MAX_EVIDENCE_KEYS


def run_totals(cursor: duckdb.DuckDBPyConnection, params: dict) -> pd.DataFrame:
    window, filters = window_and_filters(params)
    return browse.run_totals(cursor, window, filters)


def run_details(cursor: duckdb.DuckDBPyConnection, params: dict, run_ids: list[str]) -> pd.DataFrame:
    window, filters = window_and_filters(params)
    return browse.run_details(cursor, window, filters, run_ids)


def filter_options(cursor: duckdb.DuckDBPyConnection, params: dict) -> dict:
    window, _ = window_and_filters(params)
    return browse.filter_options(cursor, window, params.get("limit", 500))


def evidence_spans(cursor: duckdb.DuckDBPyConnection, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    keys = pd.DataFrame(pairs, columns=["run_id", "span_id"])
    return browse.evidence_spans(cursor, keys)


def run_spans(cursor: duckdb.DuckDBPyConnection, run_id: str, limit: int) -> pd.DataFrame:
    return browse.run_spans(cursor, run_id, limit)


def list_thresholds(cursor: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The thresholds in force: the newest calibrated version per name, else the default."""
    frame = pd.DataFrame(thresholds.list_thresholds(cursor))
    if "provenance" in frame.columns:
        # One JSON text column keeps Arrow responses well-typed whatever each provenance holds.
        frame["provenance"] = frame["provenance"].map(
            lambda value: value if isinstance(value, str) or value is None else json.dumps(value, default=str)
        )
    return frame
