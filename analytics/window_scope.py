"""A window's result of a run-partitioned detector, derived from the whole store's result.

A page, report or alert over a window (the last hours of a store that holds weeks) is another
scope than the one serve keeps up to date and stores (all time, ``analytics.kept_worker``). For a
detector partitioned by run (``analytics.kept.PARTITIONS``: each finding is derived from one run's
spans alone), a run whose every span starts inside the window has the same rows in both scopes,
and a run with no span in the window has none. So the window's result is the whole store's rows
of the runs inside it, plus the rows of the runs its edges cut through, computed for the window
and limited to those runs (``analytics.sql_loader.run_scope``), in the detector's order.

The derived result is then kept for the window like any kept result (``analytics.kept.seed``),
so later calls bring it up to date instead of deriving it again. A run filter (the run explorer,
a run's report) is the same derivation limited to that run: its rows of the unfiltered result.
A window without findings is the window's computation limited to the runs its edges cut (or to
none): an empty frame typed as the window's own computation types it, never computed over every
span of the window.

Only when the whole store's result is at hand (kept in this process, or stored for this code):
computing it from nothing would cost more than the window's own computation. Spans without a run
id (no partition to copy) fall back to the window's own computation too.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import duckdb
import numpy as np
import pandas as pd

import analytics.kept as kept
from analytics.data_version import database_identity
from analytics.sql_loader import run_scope
from analytics.types import Filters, Window

Compute = Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame]

# The runs' time ranges at the last data version read (one GROUP BY over every span): a page or
# report asks for each run-partitioned detector in turn over the same window.
_ranges_lock = threading.Lock()
_ranges: dict[tuple, pd.DataFrame] = {}


def _run_ranges(conn: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """run_id, first and last span start of every run (a NULL run_id row for spans without one)."""
    count, newest = conn.execute("SELECT count(*), max(ingested_at) FROM spans").fetchone()
    key = (database_identity(conn), count, newest)
    with _ranges_lock:
        ranges = _ranges.get(key)
    if ranges is None:
        ranges = conn.execute(
            "SELECT run_id, min(Timestamp) AS first, max(Timestamp) AS last FROM spans GROUP BY run_id"
        ).df()
        with _ranges_lock:
            _ranges.clear()
            _ranges[key] = ranges
    return ranges


def derived(
    conn: duckdb.DuckDBPyConnection, name: str, compute: Compute, window: Window, filters: Filters
) -> pd.DataFrame | None:
    """``name``'s result over ``window`` (equal to computing it for the window), derived from the
    whole store's result; None where it cannot be (then compute the window's own)."""
    if kept.PARTITIONS.get(name) != "run_id" or (window == Window() and filters.run is None):
        return None
    base = dataclasses.replace(filters, run=None)  # a run filter keeps that run's rows
    if not kept.has_result(conn, name, compute, Window(), base):
        return None
    ranges = _run_ranges(conn)
    if ranges["run_id"].isna().any():
        return None
    within = pd.Series(True, index=ranges.index)  # every span of the run starts in the window
    touching = pd.Series(True, index=ranges.index)  # some span of the run does
    if filters.run is not None:
        within &= ranges["run_id"] == filters.run
        touching &= ranges["run_id"] == filters.run
    if window.since is not None:
        within &= ranges["first"] >= window.since
        touching &= ranges["last"] >= window.since
    if window.until is not None:
        within &= ranges["last"] < window.until
        touching &= ranges["first"] < window.until
    inside, cut = ranges[within], ranges[touching & ~within]
    runs = set(inside["run_id"])
    got = kept.stored_runs(conn, name, compute, base, runs)  # up to date, only those runs decoded
    if got is not None:
        version, whole = got
        keep = np.ones(len(whole), dtype=bool)
    else:
        version, whole = kept.kept_result_at(conn, name, compute, Window(), base)  # brought up to date
        if version is None or whole["run_id"].isna().any():
            return None
        keep = whole["run_id"].isin(runs).to_numpy()
    if cut.empty:
        fresh = whole.iloc[0:0]
    else:
        with run_scope(runs=list(cut["run_id"]), runs_since=cut["first"].min()):
            fresh = compute(conn, window, filters)
    if not keep.any() and fresh.empty:
        # No finding in the window: the column types of an empty result are those the window's
        # own computation gives (DuckDB types an empty or all-NULL column by what it filtered,
        # not as the whole store's rows are typed): the window's computation over no run.
        if not cut.empty:
            result = fresh
        else:
            with run_scope(runs=[], runs_since=window.since):
                result = compute(conn, window, filters)
        kept.stats["window_derived"] += 1
        kept.seed(conn, name, window, filters, version, result)
        return kept.project(result, None)
    kept.stats["window_derived"] += 1
    result = kept.merge_rows(whole, keep, fresh, name)
    # Kept for the window at the whole result's version (the cut runs were computed later, from
    # data at least as new): the next call for this window (a report asks once for the page and
    # once through run_summary) reuses it, or recomputes only the runs new spans touched.
    kept.seed(conn, name, window, filters, version, result)
    return kept.project(result, None)
