"""Shared-state detectors: divergent reads, lost updates, rejection rates."""

from __future__ import annotations

import logging

import duckdb
import pandas as pd

from analytics._evidence import EVIDENCE, THRESHOLD, TIMES
from analytics.registry import register
from analytics.sql_loader import (
    filter_params,
    load_sql,
    query_df,
    run_sql,
)
from analytics.thresholds import current_threshold
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

_BUCKETS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
_MAX_BUCKETS = 48


@register(
    "divergent_reads",
    description="Split brain: two agents read the same version and both wrote before seeing the other's write.",
    columns={
        **EVIDENCE,
        "agents": "the two agents, sorted",
        "state_key": "shared-state key (driftscope.state.key)",
        "version": "version both agents read",
        "read_span_ids": "the two reads",
        "write_span_ids": "the write each reader then attempted (ok, rejected or failed)",
        **TIMES,
    },
    row="one pair of agents x one version of one key in one run",
    failure_mode="acting on stale or inconsistent shared state",
    mast_category="inter-agent misalignment",
    title="divergent reads (split-brain)",
    findings=True,
    needs=(
        "reads and writes of shared state by two or more agents of a run: spans with "
        "`driftscope.state.key`, `driftscope.op` (read or write) and `driftscope.state.version`"
    ),
    counted=True,
    page="split_brain",
    kept="run_id",
    order=[("first_seen", False), ("state_key", False), ("agents", False)],  # fmt: skip
)
def divergent_reads(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Pairs of agents whose views of a key diverged: same version read, both wrote on it."""
    return run_sql(conn, "divergent_reads", window, filters)


@register(
    "lost_updates",
    description="Writes that silently replaced another agent's unread write.",
    columns={
        **EVIDENCE,
        "agents": "[clobbered writer, clobbering writer]",
        "state_key": "shared-state key",
        "agent": "agent whose write clobbered the other",
        "written_version": "version token after the clobbering write",
        "expected_version": "base version of the clobbering write (None = unversioned)",
        "kind": "'unversioned' or 'stale_base' (based on a superseded version)",
        "clobbered_agent": "agent whose write was lost",
        "clobbered_version": "version that was lost",
        **TIMES,
    },
    row="one clobbering write (and the write it replaced)",
    failure_mode="lost update: concurrent writes without version check",
    mast_category="inter-agent misalignment",
    title="lost updates (split-brain)",
    findings=True,
    needs=(
        "writes to shared state by two or more agents of a run: spans with `driftscope.state.key`, "
        "`driftscope.op` = write and `driftscope.state.version` (and "
        "`driftscope.state.expected_version` on a versioned write)"
    ),
    counted=True,
    failing=True,
    page="split_brain",
    kept="run_id",
    order=[
        ("first_seen", False),
        ("state_key", False),
        ("run_id", False),
        ("last_seen", False),
        ("span_ids", False),
    ],  # fmt: skip
)
def lost_updates(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Unversioned or stale-based writes that replaced another agent's write nobody read."""
    return run_sql(conn, "lost_updates", window, filters)


def choose_bucket_seconds(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> int:
    """Smallest standard bucket (1 min .. 1 week) giving at most 48 buckets over the data."""
    params = filter_params(window, filters)
    sql = "SELECT min(Timestamp), max(Timestamp) FROM spans WHERE {span_filter} AND outcome IS NOT NULL"
    sql = sql.replace("{span_filter}", "(" + load_sql("_span_filter") + "\n)")
    frame = query_df(conn, sql, params)
    return _bucket_seconds_over(window, frame.iloc[0, 0], frame.iloc[0, 1])


def _bucket_seconds_over(window: Window, first, last) -> int:
    """``choose_bucket_seconds`` for guarded calls from ``first`` to ``last`` (None: none)."""
    start = window.since if window.since is not None else first
    end = window.until if window.until is not None else last
    if start is None or end is None or pd.isna(start) or pd.isna(end):
        return _BUCKETS_S[0]
    span_s = max((pd.Timestamp(end) - pd.Timestamp(start)).total_seconds(), 1.0)
    for seconds in _BUCKETS_S:
        if span_s / seconds <= _MAX_BUCKETS:
            return seconds
    return _BUCKETS_S[-1]


@register(
    "rejection_rates",
    description="Guarded-call rejections / attempts by tool, key, agent and time bucket, with trend.",
    columns={
        "bucket_start": "start of the time bucket (naive UTC)",
        "bucket_seconds": "bucket width, seconds",
        "tool_name": "tool (or span name) of the guarded call",
        "state_key": "state key of the call, None if not a state operation",
        "agent": "calling agent",
        "attempts": "guarded calls in the bucket (spans with driftscope.outcome)",
        "rejections": "calls a guard refused (outcome = rejected)",
        "errors": "calls where the tool failed (outcome = error); not rejections",
        "rejection_rate": "rejections / attempts, 0..1",
        "error_rate": "errors / attempts, 0..1",
        "trend_per_hour": "least-squares slope of rejection_rate over the buckets, per hour",
        **THRESHOLD,
        "over_threshold": "rejection_rate above the threshold",
        "span_ids": "SpanId of the rejected calls",
        "run_ids": "runs with a refused call in the bucket",
        **TIMES,
    },
    row="one tool x key x agent x time bucket",
    failure_mode="guards refusing calls: agents repeatedly act on stale or invalid state",
    mast_category="inter-agent misalignment",
    title="rejection rate over threshold",
    findings=True,
    needs=(
        "guarded calls (spans with `driftscope.outcome`: ok, rejected or error) refused more often "
        "than its threshold in a time bucket"
    ),
    flag_column="over_threshold",
    rank_column="rejection_rate",
    page="rejections",
    kept="whole",
    window_bounds=True,  # its buckets are laid over the window (choose_bucket_seconds)
)
def rejection_rates(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Rejection and error rates of guarded calls per bucket, flagged against the threshold."""
    bucket_seconds = choose_bucket_seconds(conn, window, filters)
    frame = run_sql(
        conn,
        "rejection_rates",
        window,
        filters,
        bucket_seconds=bucket_seconds,
    )
    return _with_threshold(conn, frame, bucket_seconds)


def _with_threshold(
    conn: duckdb.DuckDBPyConnection, frame: pd.DataFrame, bucket_seconds: int
) -> pd.DataFrame:
    """``frame`` (rejection_rates.sql's rows) with the bucket width and the threshold columns."""
    info = current_threshold(conn, "rejection_rate")
    frame["bucket_seconds"] = bucket_seconds
    frame["threshold"] = info.value
    frame["threshold_version"] = info.version
    frame["calibrated"] = info.calibrated
    frame["over_threshold"] = frame["rejection_rate"] > info.value
    return frame
