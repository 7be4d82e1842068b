"""Enforcement coverage per tool and the per-run summary with a health verdict."""

from __future__ import annotations

import collections
import logging
import os
import threading
from typing import Any

import duckdb
import pandas as pd

from analytics.goals import goal_run_stats
from analytics.loops import MIN_PING_PONG_DELEGATIONS, MIN_PING_PONG_INFERRED
from analytics.registry import register, run_metric
from analytics.sql_loader import filter_params, load_sql, query_df, run_sql
from analytics.thresholds import current_threshold
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

COUNTED_DETECTORS = (
    "divergent_reads", "lost_updates", "constraint_drops", "context_drift_holders",
    "repeated_calls", "ping_pong", "budget_exhaustion", "duplicate_side_effects",
)  # fmt: skip
# Findings that mean a coordination failure took effect. The others (divergent reads whose
# writes a guard sorted out, budgets that stopped an agent, stale holders that refreshed,
# refused calls) are warnings: the crew degraded but a guard or the agent caught it.
FAILING_DETECTORS = (
    "lost_updates", "constraint_drops", "repeated_calls", "ping_pong", "duplicate_side_effects",
)  # fmt: skip


@register(
    "enforcement_coverage",
    description="Per tool: calls carrying guard fields vs unguarded anti-patterns; prevented failures.",
    columns={
        "service": "ServiceName",
        "tool_name": "tool (or 'op:<driftscope.op>' for guard spans without a tool name)",
        "calls": "calls in the window",
        "guarded_calls": "calls with driftscope.outcome or driftscope.guard (went through a guard)",
        "prevented": "calls a guard refused (outcome = rejected)",
        "prevented_reasons": "distinct reject reasons",
        "writes": "state writes",
        "versioned_writes": "writes with an expected version",
        "delegations": "delegations",
        "structured_delegations": "delegations with task id, origin task and carried constraints",
        "sends": "outbound sends",
        "sends_with_policy": "sends with a policy version",
        "side_effects": "side-effecting calls",
        "side_effects_with_key": "side-effecting calls with an idempotency key",
        "anti_patterns": "unversioned writes + unstructured delegations + sends without policy + side effects without key",
        "coverage": "'enforced' (all guarded, no anti-pattern), 'partial', or 'watch_only' (never guarded)",
        "agents": "agents that called the tool",
        "first_seen": "first call (naive UTC)",
        "last_seen": "last call (naive UTC)",
    },  # fmt: skip
    row="one tool of one service",
    failure_mode=None,
    mast_category=None,
)
def enforcement_coverage(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Which tools are enforced by guards and which can only be watched."""
    return run_sql(conn, "enforcement_coverage", window, filters)


def _count_thresholds(conn: duckdb.DuckDBPyConnection) -> dict[str, float]:
    rows = conn.execute(
        "SELECT arg_max(name, version), arg_max(value, version) FROM thresholds "
        "WHERE name LIKE 'count_per_run:%' GROUP BY name"
    ).fetchall()
    return {name.split(":", 1)[1]: float(value) for name, value in rows}


def _counts_by_run(frame: pd.DataFrame) -> pd.Series:
    if frame.empty:
        return pd.Series(dtype="int64")
    return frame.groupby("run_id").size()


# Detectors whose registered function returns the rows of its SQL unchanged (analytics/sql/<name>.sql
# with the standard filters plus these parameters): run_summary counts their findings per run in
# SQL around that same statement, so no finding row is built in pandas (and DuckDB drops the
# evidence lists it does not need). Extra named counts per run, as SQL conditions on a finding row.
# tests/test_analytics_perf_loops.py checks these counts against run_metric of each detector.
_SQL_COUNTED: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "divergent_reads": ({}, {}),
    "lost_updates": ({}, {}),
    "constraint_drops": ({}, {}),
    "context_drift_holders": ({}, {"unrefreshed": "refreshed IS NOT TRUE"}),
    "ping_pong": (
        {"min_delegations": MIN_PING_PONG_DELEGATIONS, "min_inferred": MIN_PING_PONG_INFERRED},
        {},
    ),
    "budget_exhaustion": ({}, {}),
    "duplicate_side_effects": ({}, {}),
    "stale_policy_sends": ({}, {"allowed": "allowed IS TRUE"}),
}


def _findings_per_run(
    conn: duckdb.DuckDBPyConnection, name: str, window: Window, filters: Filters
) -> pd.DataFrame:
    """Findings of detector ``name`` per run: ``n`` plus its extra counts, indexed by run_id."""
    extra_params, extra_counts = _SQL_COUNTED[name]
    counts = "".join(f", count(*) FILTER (WHERE {cond}) AS {label}" for label, cond in extra_counts.items())
    sql = f"SELECT run_id, count(*) AS n{counts}\nFROM (\n{load_sql(name)}\n) findings\nGROUP BY run_id"
    params = {**filter_params(window, filters), **extra_params}
    return query_df(conn, sql, params).set_index("run_id")


# run_summary results are kept per database file and data version, so a repeated call (a
# dashboard re-render, the report after the overview) does not run every detector again. The
# version is the number of spans, the newest ingested_at and the thresholds in force: spans are
# only inserted (the collector fills inherited fields in the same commit that inserts the spans
# that caused it), so a change of stored spans changes the count or the newest ingested_at.
# In-memory databases are not cached (they have no stable identity).
_CACHE_SIZE = 32
_cache: collections.OrderedDict[tuple, pd.DataFrame] = collections.OrderedDict()
_cache_lock = threading.Lock()


def _data_version(conn: duckdb.DuckDBPyConnection) -> tuple | None:
    """Identity and version of the database behind ``conn``; None when it must not be cached."""
    path, spans, newest, thresholds, newest_threshold = conn.execute(
        "SELECT (SELECT path FROM duckdb_databases() WHERE database_name = current_database()), "
        "(SELECT count(*) FROM spans), (SELECT max(ingested_at) FROM spans), "
        "(SELECT count(*) FROM thresholds), (SELECT max(created_at) FROM thresholds)"
    ).fetchone()
    if not path or path == ":memory:":
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (path, stat.st_dev, stat.st_ino, spans, newest, thresholds, newest_threshold)


def clear_cache() -> None:
    """Forget every cached run summary."""
    with _cache_lock:
        _cache.clear()


@register(
    "run_summary",
    description="Per run: agents, hops, spans, each detector's finding count, worst divergence, verdict.",
    columns={
        "run_id": "run (conversation id)",
        "trace_id": "first trace of the run",
        "agents": "agents seen in the run",
        "hops": "deepest delegation hop",
        "spans": "spans in the run",
        "traces": "traces in the run",
        "errors": "spans that failed (outcome error or status Error)",
        "rejections": "calls refused by a guard (failures prevented)",
        **{f"{name}_count": f"{name} findings in the run" for name in COUNTED_DETECTORS},
        "stale_holders_unrefreshed": "context_drift_holders that never refreshed",
        "stale_policy_sends_count": "sends against a superseded policy (refused or allowed)",
        "stale_sends_allowed": "stale-policy sends that went out",
        "drifted_subtasks": "subtasks over the goal-divergence threshold",
        "worst_divergence": "highest goal divergence in the run (1 - cosine), None without subtasks",
        "verdict": "'failing' (lost update, dropped constraint, loop, ping-pong, duplicate side effect, "
        "drifted subtask under a calibrated threshold, unrefreshed stale holder or allowed stale send), "
        "'to review' (otherwise failing only by subtasks over the uncalibrated default goal-divergence "
        "threshold), 'degraded' (only refused calls, divergent reads, budget stops, refreshed holders), "
        "or 'healthy'",
        "first_seen": "first span (naive UTC)",
        "last_seen": "last span (naive UTC)",
    },  # fmt: skip
    row="one run (conversation id)",
    failure_mode=None,
    mast_category=None,
)
def run_summary(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Health of every run, combining every detector's findings.

    A count above its baseline-calibrated ``count_per_run:<detector>`` threshold (0 until
    calibrated) makes the run fail. Results are cached per database file and data version.
    """
    version = _data_version(conn)
    key = None if version is None else (version, window, filters)
    if key is not None:
        with _cache_lock:
            cached = _cache.get(key)
            if cached is not None:
                _cache.move_to_end(key)
                return cached.copy()
    summary = _run_summary(conn, window, filters)
    if key is not None:
        with _cache_lock:
            _cache[key] = summary.copy()
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    return summary


def _run_summary(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    base = run_sql(conn, "run_summary", window, filters).set_index("run_id", drop=False)
    allowed = _count_thresholds(conn)
    failing = pd.Series(False, index=base.index)
    degraded = base["rejections"] > 0

    def per_run(counts: pd.Series) -> pd.Series:
        return counts.reindex(base.index, fill_value=0).astype("int64")

    found = {name: _findings_per_run(conn, name, window, filters) for name in _SQL_COUNTED}
    for name in COUNTED_DETECTORS:
        if name in found:
            base[f"{name}_count"] = per_run(found[name]["n"])
        else:  # detectors with Python post-processing (repeated_calls forms loops in numpy)
            base[f"{name}_count"] = per_run(_counts_by_run(run_metric(conn, name, window, filters)))
        over = base[f"{name}_count"] > allowed.get(name, 0.0)
        if name in FAILING_DETECTORS:
            failing |= over
        else:
            degraded |= over
    base["stale_holders_unrefreshed"] = per_run(found["context_drift_holders"]["unrefreshed"])
    base["stale_policy_sends_count"] = per_run(found["stale_policy_sends"]["n"])
    base["stale_sends_allowed"] = per_run(found["stale_policy_sends"]["allowed"])
    # Goal columns from one SQL aggregate over the subtasks (no row per subtask).
    goal_threshold = current_threshold(conn, "goal_divergence")
    goals = goal_run_stats(conn, window, filters, goal_threshold.value)
    base["drifted_subtasks"] = per_run(goals["drifted_subtasks"])
    base["worst_divergence"] = goals["worst_divergence"].astype("float64").reindex(base.index)
    # Over the uncalibrated default, a divergence is a question for a person, not a failure:
    # ordinary decompositions of a goal can score past it until the threshold is calibrated.
    drifted = base["drifted_subtasks"] > 0
    review = drifted if not goal_threshold.calibrated else pd.Series(False, index=base.index)
    failing |= drifted & goal_threshold.calibrated
    failing |= (base["stale_sends_allowed"] > 0) | (base["stale_holders_unrefreshed"] > 0)
    degraded |= base["stale_policy_sends_count"] > 0
    base["verdict"] = "healthy"
    base.loc[degraded, "verdict"] = "degraded"
    base.loc[review, "verdict"] = "to review"
    base.loc[failing, "verdict"] = "failing"
    return base.reset_index(drop=True)
