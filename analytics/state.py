"""Shared-state detectors: divergent reads, lost updates, rejection rates."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analytics._evidence import EVIDENCE, THRESHOLD, TIMES
from analytics.data_version import Scope
from analytics.kept import (
    carry_parts,
    concat_as_computed,
    given_parts,
    keeps_parts,
    refines,
    stats,
    update_from_parts,
)
from analytics.registry import register
from analytics.sql_loader import (
    filter_params,
    load_sql,
    query_arrow,
    query_df,
    query_tables,
    run_scope,
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
    parts = given_parts("rejection_rates")  # after a batch: counts per run, the touched ones new
    if parts is None:
        frame = run_sql(
            conn,
            "rejection_rates",
            window,
            filters,
            bucket_seconds=bucket_seconds,
            buckets=None,
            buckets_from=None,
            buckets_until=None,
        )
    else:
        frame = query_tables("_rejection_rates_buckets", {"parts": parts}, {"bucket_seconds": bucket_seconds})
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


def _bucket_width(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> int:
    """``choose_bucket_seconds`` over the whole window, also inside a run scope (the counts of
    the touched runs are bucketed as every run's are)."""
    with run_scope():
        return choose_bucket_seconds(conn, window, filters)


def _rejection_parts(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pa.Table:
    """Per run, time bucket, tool, key and agent: rejection_rates' counts (``rejection_rates_runs.sql``)."""
    params = filter_params(window, filters)
    params["bucket_seconds"] = _bucket_width(conn, window, filters)
    return query_arrow(conn, load_sql("rejection_rates_runs"), params)


# Kept while the bucket width stays (a window growing past 48 buckets widens them: every run is
# counted again). At 1M spans of 10-call runs there is about a row per guarded call (525,000):
# summing them costs what computing the result does, so such results are computed in full.
REJECTION_PART_ROWS = 100_000
REJECTION_PART_RUNS = 10_000
keeps_parts(
    "rejection_rates",
    _rejection_parts,
    max_rows=REJECTION_PART_ROWS,
    depends=_bucket_width,
    max_runs=REJECTION_PART_RUNS,
)


# After a batch the rows of the time buckets holding the touched traces' guarded calls are counted
# again from every run's spans in those buckets (_rejection_rates_touched.sql, then
# rejection_rates.sql over those buckets alone); the other buckets' rows stay, and the rates and
# each tool x key x agent's trend are formed again over all rows (_rejection_trend.sql). A batch
# into the newest runs touches a bucket or two of up to 48, where the per-run parts are more rows
# than the result at 1,000-call runs (10M spans: ~10,000 runs, computed in full after each batch).
# Past this share of the buckets (runs as long as the window), the per-run parts or a full
# computation bring it up to date instead.
REJECTION_BUCKET_SHARE = 0.25
_BUCKET_ORIGIN = datetime(2000, 1, 3)  # time_bucket's default origin, as the SQL counts buckets
_RATE_COLUMNS = ("rejection_rate", "error_rate", "trend_per_hour")


@refines("rejection_rates")
def _refine_rejections(
    conn: duckdb.DuckDBPyConnection,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    window: Window,
    filters: Filters,
    old: pd.DataFrame,
    traces: set[str],
    scope: Scope,
) -> pd.DataFrame | None:
    """``old`` brought up to date after spans of ``traces`` came, bucket by bucket; else from the
    per-run parts (``analytics.kept.update_from_parts``), or None (a full computation)."""
    frame = _rejections_by_bucket(conn, window, filters, old, traces)
    if frame is None:
        return update_from_parts("rejection_rates", conn, compute, window, filters, old, traces, scope)
    carry_parts("rejection_rates", conn, window, filters, old, frame, traces, scope)
    return frame


def _rejections_by_bucket(
    conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters, old: pd.DataFrame, traces: set[str]
) -> pd.DataFrame | None:
    """``old`` with the rows of the buckets ``traces``' guarded calls fall in counted again, or
    None when the bucket width changed or too many buckets were touched."""
    if old is None or old.empty or not traces:
        return None
    bucket_seconds = int(old["bucket_seconds"].iloc[0])
    params = filter_params(window, filters)
    params.update(bucket_seconds=bucket_seconds, traces=sorted(traces))
    touched = query_arrow(conn, load_sql("_rejection_rates_touched"), params)
    if filters.agent is None and filters.run is None and filters.origin_task is None:
        # The guarded calls' first and last times: the kept rows' and the touched traces' (a
        # batch adds calls, and moves none out of these filters). A scan less at 10M spans.
        first, last = old["first_seen"].min(), old["last_seen"].max()
        if touched.num_rows:
            first = min(first, pd.Timestamp(pc.min(touched.column("first_seen")).as_py()))
            last = max(last, pd.Timestamp(pc.max(touched.column("last_seen")).as_py()))
        width = _bucket_seconds_over(window, first, last)
    else:  # the agent filter narrows the rows, not the calls bucketed; runs can join a run filter
        width = choose_bucket_seconds(conn, window, filters)
    if width != bucket_seconds:
        return None
    buckets = touched.column("bucket").to_pylist()
    if not buckets:  # no guarded call in the touched traces: no row changed
        return old
    if len(buckets) > REJECTION_BUCKET_SHARE * old["bucket_start"].nunique():
        return None
    starts = [_BUCKET_ORIGIN + timedelta(seconds=b * bucket_seconds) for b in buckets]
    params.update(
        buckets=buckets, buckets_from=starts[0], buckets_until=starts[-1] + timedelta(seconds=bucket_seconds)
    )
    fresh = query_df(conn, load_sql("rejection_rates"), params)
    columns = [c for c in fresh.columns if c not in _RATE_COLUMNS]
    keep = old.loc[~old["bucket_start"].isin(pd.to_datetime(starts)), columns]
    rows = concat_as_computed(keep, fresh[columns]) if not keep.empty else fresh[columns]
    if rows.empty:
        return None
    rows = rows.reset_index(drop=True)
    narrow = pa.Table.from_pandas(
        rows[["bucket_start", "tool_name", "state_key", "agent", "attempts", "rejections", "errors"]],
        preserve_index=False,
    ).append_column("i", pa.array(np.arange(len(rows))))
    rates = query_tables("_rejection_trend", {"buckets": narrow}, {})
    frame = rows.take(rates["i"].to_numpy()).reset_index(drop=True)
    for column in _RATE_COLUMNS:
        frame[column] = rates[column].to_numpy()
    stats["rejection_buckets"] += 1
    return _with_threshold(conn, frame, bucket_seconds).loc[:, list(old.columns)]  # the registered order
