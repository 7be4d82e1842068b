"""Enforcement coverage per tool and the per-run summary with a health verdict."""

from __future__ import annotations

import collections
import logging
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import duckdb
import pandas as pd

from analytics.crew_limits import count_limits
from analytics.goals import goal_run_stats
from analytics.loops import MIN_PING_PONG_DELEGATIONS, MIN_PING_PONG_INFERRED
from analytics.registry import register, run_metric
from analytics.side_effects import current_side_effect_tools
from analytics.sql_loader import filter_params, load_sql, query_df, run_sql
from analytics.thresholds import ThresholdInfo, current_threshold
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

COUNTED_DETECTORS = (
    "divergent_reads", "lost_updates", "constraint_drops", "context_drift_holders",
    "repeated_calls", "ping_pong", "budget_exhaustion", "duplicate_side_effects", "runaway_runs",
)  # fmt: skip
# Findings that mean a coordination failure took effect. The others (divergent reads whose
# writes a guard sorted out, budgets that stopped an agent, stale holders that refreshed,
# refused calls) are warnings: the crew degraded but a guard or the agent caught it.
FAILING_DETECTORS = (
    "lost_updates", "constraint_drops", "repeated_calls", "ping_pong", "duplicate_side_effects",
    "runaway_runs",
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


# Detectors whose findings are keyed by something other than the run: run_summary recomputes
# them for the touched values of that key (the run a finding is counted in is one of several).
# Every other counted detector must find a run's findings from that run's spans alone;
# tests/test_analytics_summary.py holds the incremental summary equal to a full one.
_COUNTED_BY = {"constraint_drops": "origin_task_id"}


def _findings_per_run(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window,
    filters: Filters,
    runs: list[str] | None = None,
    origin_tasks: list[str] | None = None,
    runs_since: datetime | None = None,
) -> pd.DataFrame:
    """Findings of detector ``name`` per run: ``n`` plus its extra counts.

    Indexed by run_id; for detectors in ``_COUNTED_BY`` a plain frame with that key and run_id.
    ``runs`` / ``origin_tasks`` limit the spans (or cells) to those runs (origin tasks);
    ``runs_since`` is no later than the first span of any of those runs."""
    extra_params, extra_counts = _SQL_COUNTED[name]
    counts = "".join(f", count(*) FILTER (WHERE {cond}) AS {label}" for label, cond in extra_counts.items())
    keys = "run_id" if name not in _COUNTED_BY else f"{_COUNTED_BY[name]}, run_id"
    sql = f"SELECT {keys}, count(*) AS n{counts}\nFROM (\n{load_sql(name)}\n) findings\nGROUP BY {keys}"
    params = {**filter_params(window, filters), **extra_params}
    if name == "duplicate_side_effects":  # the process's side-effect tool pattern, read per call
        params.update(current_side_effect_tools().params())
    params.update(runs=runs, origin_tasks=origin_tasks, runs_since=runs_since)
    frame = query_df(conn, sql, params)
    return frame if name in _COUNTED_BY else frame.set_index("run_id")


@dataclass
class _Parts:
    """The per-run pieces run_summary is assembled from, kept between calls.

    ``base``: run_summary.sql rows indexed by run_id; ``found``: each counted detector's finding
    counts (indexed by run_id, or keyed as ``_COUNTED_BY`` says); ``goals``: goal_run_stats."""

    base: pd.DataFrame
    found: dict[str, pd.DataFrame]
    goals: pd.DataFrame


def _compute_parts(
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    goal_threshold: float,
    scope: _Scope | None = None,
) -> _Parts:
    """Every piece, for all runs in scope, or only for the touched runs of ``scope``."""
    runs = scope.runs if scope is not None else None
    since = scope.since if scope is not None else None
    base = run_sql(conn, "run_summary", window, filters, runs=runs, runs_since=since)
    base = base.set_index("run_id", drop=False)
    found: dict[str, pd.DataFrame] = {}
    for name in _SQL_COUNTED:
        if name in _COUNTED_BY:
            tasks = scope.origin_tasks if scope is not None else None
            found[name] = _findings_per_run(conn, name, window, filters, origin_tasks=tasks)
        else:
            found[name] = _findings_per_run(conn, name, window, filters, runs=runs, runs_since=since)
    for name in COUNTED_DETECTORS:
        if name in found:
            continue
        # Detectors with Python post-processing (repeated_calls forms loops in numpy) have no
        # run-list filter: they run once from the touched runs' first span on (every span of
        # those runs is in that window), and only the touched runs' counts are kept.
        if scope is None:
            frames = [run_metric(conn, name, window, filters)]
        else:
            frame = run_metric(conn, name, _window_from(window, scope.since), filters)
            frames = [frame[frame["run_id"].isin(scope.runs)]]
        counts = [_counts_by_run(frame) for frame in frames if not frame.empty]
        found[name] = (
            pd.concat(counts).to_frame("n") if counts else pd.DataFrame({"n": pd.Series(dtype="int64")})
        )
    goals = goal_run_stats(conn, window, filters, goal_threshold, runs=runs, runs_since=since)
    return _Parts(base, found, goals)


def _window_from(window: Window, first: datetime | None) -> Window:
    """``window`` starting no earlier than ``first`` (a run's first span: its spans are the same)."""
    if first is None or (window.since is not None and window.since >= first):
        return window
    return Window(since=first, until=window.until)


def _replace_rows(old: pd.DataFrame, new: pd.DataFrame, drop: pd.Series) -> pd.DataFrame:
    """``old`` without the rows where ``drop`` holds, plus ``new`` (dtypes of the non-empty)."""
    kept = old[~drop]
    if new.empty:
        return kept
    if kept.empty:
        return new
    return pd.concat([kept, new])


def _merge_parts(old: _Parts, new: _Parts, scope: _Scope) -> _Parts:
    """``old`` with the pieces of the scope's runs / origin tasks replaced by ``new``'s."""
    runs, origin_tasks = scope.runs, scope.origin_tasks
    base = _replace_rows(old.base, new.base, old.base.index.isin(runs))
    base = base.reset_index(drop=True).sort_values(["first_seen", "run_id"], kind="stable")
    base = base.set_index("run_id", drop=False)
    found = {}
    for name, frame in old.found.items():
        if name in _COUNTED_BY:
            drop = frame[_COUNTED_BY[name]].isin(origin_tasks)
        else:
            drop = frame.index.isin(runs)
        found[name] = _replace_rows(frame, new.found[name], drop)
    goals = _replace_rows(old.goals, new.goals, old.goals.index.isin(runs))
    return _Parts(base, found, goals)


def _assemble(conn: duckdb.DuckDBPyConnection, parts: _Parts, goal_threshold: ThresholdInfo) -> pd.DataFrame:
    """The run_summary frame (counts, verdicts) from its pieces."""
    base = parts.base.copy()
    allowed = count_limits(conn, base.index)  # per detector: each run's crew's calibrated count
    failing = pd.Series(False, index=base.index)
    degraded = base["rejections"] > 0

    def per_run(counts: pd.Series) -> pd.Series:
        return counts.reindex(base.index, fill_value=0).astype("int64")

    found = {}
    for name, frame in parts.found.items():
        if name in _COUNTED_BY:  # one row per (key, run): sum per run
            frame = frame.drop(columns=_COUNTED_BY[name]).groupby("run_id").sum()
        found[name] = frame
    for name in COUNTED_DETECTORS:
        base[f"{name}_count"] = per_run(found[name]["n"])
        over = base[f"{name}_count"] > allowed.get(name, 0.0)
        if name in FAILING_DETECTORS:
            failing |= over
        else:
            degraded |= over
    base["stale_holders_unrefreshed"] = per_run(found["context_drift_holders"]["unrefreshed"])
    base["stale_policy_sends_count"] = per_run(found["stale_policy_sends"]["n"])
    base["stale_sends_allowed"] = per_run(found["stale_policy_sends"]["allowed"])
    # Goal columns from one SQL aggregate over the subtasks (no row per subtask).
    goals = parts.goals
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


# run_summary is kept per database file, window and filters, and brought up to date on each
# call: the runs that new spans touched are recomputed and merged with the kept pieces of the
# others, so a call after an ingest costs the touched runs, not every detector over every run.
# Spans are only inserted, except for retention's deletes; the collector fills inherited fields
# (agent, run) of earlier spans only in traces that get new spans in the same commit. So the
# touched runs are the runs of the traces whose spans changed. Those traces are found among the
# spans ingested from ``_SLACK`` before the newest one seen last time (a batch decoded earlier
# than that but committed later, or a delete, changes the total count differently from the
# counts of those recent spans, and everything is recomputed). A change of thresholds also
# recomputes everything. In-memory databases are not cached (they have no stable identity).
_CACHE_SIZE = 32
_SLACK = timedelta(seconds=10)
# Past this share of the kept runs (or this many runs), one full recomputation is cheaper than
# filtered ones (each filtered scan compares every span's run with the list).
_MAX_TOUCHED_SHARE = 0.25
_MAX_TOUCHED = 200


@dataclass
class _Version:
    """What a kept summary was computed from: spans, the newest ingested_at, the recent spans
    per trace (ingested from ``newest - _SLACK`` on) and the thresholds in force."""

    spans: int
    newest: datetime | None
    recent: dict[str, int]
    thresholds: tuple

    @property
    def bound(self) -> datetime | None:
        return None if self.newest is None else self.newest - _SLACK


@dataclass
class _Kept:
    version: _Version
    parts: _Parts
    summary: pd.DataFrame


_cache: collections.OrderedDict[tuple, _Kept] = collections.OrderedDict()
_cache_lock = threading.Lock()


def _database_identity(conn: duckdb.DuckDBPyConnection) -> tuple | None:
    """Identity of the database file behind ``conn``; None when it must not be cached."""
    (path,) = conn.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    if not path or path == ":memory:":
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (path, stat.st_dev, stat.st_ino)


def _recent_counts(
    conn: duckdb.DuckDBPyConnection, since: datetime, bound: datetime
) -> tuple[dict[str, int], dict[str, int]]:
    """Spans per trace ingested at or after ``since``, and at or after ``bound`` (>= since)."""
    rows = conn.execute(
        "SELECT TraceId, count(*), count(*) FILTER (WHERE ingested_at >= $bound) FROM spans "
        "WHERE ingested_at >= $since GROUP BY TraceId",
        {"since": since, "bound": bound},
    ).fetchall()
    return {t: n for t, n, _ in rows}, {t: m for t, _, m in rows if m}


def _read_version(
    conn: duckdb.DuckDBPyConnection, previous: _Version | None
) -> tuple[_Version, set[str] | None]:
    """The current version, and the traces changed since ``previous`` (None: recompute all)."""
    spans, newest, thresholds, newest_threshold = conn.execute(
        "SELECT (SELECT count(*) FROM spans), (SELECT max(ingested_at) FROM spans), "
        "(SELECT count(*) FROM thresholds), (SELECT max(created_at) FROM thresholds)"
    ).fetchone()
    bound = None if newest is None else newest - _SLACK
    if previous is None or previous.bound is None or newest is None or newest < previous.newest:
        recent = _recent_counts(conn, bound, bound)[1] if bound is not None else {}
        return _Version(spans, newest, recent, (thresholds, newest_threshold)), None
    since_previous, recent = _recent_counts(conn, previous.bound, bound)
    version = _Version(spans, newest, recent, (thresholds, newest_threshold))
    if version.thresholds != previous.thresholds:
        return version, None
    # Spans ingested before the previous bound cannot have changed (no delete, no late batch)
    # when the count grew by exactly the growth of the recent spans, and no recent trace shrank.
    if spans - previous.spans != sum(since_previous.values()) - sum(previous.recent.values()):
        return version, None
    touched = set()
    for trace, count in since_previous.items():
        before = previous.recent.get(trace, 0)
        if count < before:
            return version, None
        if count > before:
            touched.add(trace)
    if any(trace not in since_previous for trace in previous.recent):
        return version, None
    return version, touched


@dataclass
class _Scope:
    """The runs (and origin tasks) to recompute, and the first span of each of those runs."""

    runs: list[str]
    origin_tasks: list[str]
    first_seen: dict[str, datetime]

    @property
    def since(self) -> datetime | None:
        """No span of these runs starts earlier (older row groups can be skipped)."""
        return min(self.first_seen.values()) if self.first_seen else None


def _touched_scope(conn: duckdb.DuckDBPyConnection, traces: set[str], kept_runs: pd.Index) -> _Scope:
    """Runs and origin tasks whose pieces may have changed with the spans of ``traces``.

    The runs with a span in those traces (and those of the traces' own ids that are kept runs: a
    span without a run counts under its trace id until a parent gives it one, and that run then
    loses it), their origin tasks, and every run working on one of those origin tasks (its goal
    root or constraint ledger may come from them)."""
    rows = conn.execute(
        "SELECT DISTINCT run_id FROM spans WHERE TraceId = ANY($traces::VARCHAR[]) AND run_id IS NOT NULL",
        {"traces": sorted(traces)},
    ).fetchall()
    runs = {run for (run,) in rows} | set(kept_runs.intersection(list(traces)))
    rows = conn.execute(
        "SELECT DISTINCT origin_task_id FROM spans WHERE run_id = ANY($runs::VARCHAR[]) "
        "AND origin_task_id IS NOT NULL",
        {"runs": sorted(runs)},
    ).fetchall()
    tasks = sorted(task for (task,) in rows)
    if tasks:
        rows = conn.execute(
            "SELECT DISTINCT run_id FROM spans WHERE origin_task_id = ANY($tasks::VARCHAR[]) AND run_id IS NOT NULL",
            {"tasks": tasks},
        ).fetchall()
        runs |= {run for (run,) in rows}
    first = conn.execute(
        "SELECT run_id, min(Timestamp) FROM spans WHERE run_id = ANY($runs::VARCHAR[]) GROUP BY run_id",
        {"runs": sorted(runs)},
    ).fetchall()
    return _Scope(sorted(runs), tasks, dict(first))


def clear_cache() -> None:
    """Forget every kept run summary."""
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
        "verdict": "'failing' (lost update, dropped constraint, loop, runaway run, ping-pong, duplicate side effect, "
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

    A count above its crew's baseline-calibrated ``count_per_run:<detector>:<service>`` threshold
    (0 until calibrated; ``analytics.crew_limits``) makes the run fail. Results are kept per
    database file, window and filters; after new spans only the runs they touched are recomputed
    (see ``_read_version``).
    """
    identity = _database_identity(conn)
    goal_threshold = current_threshold(conn, "goal_divergence")
    if identity is None:
        return _assemble(conn, _compute_parts(conn, window, filters, goal_threshold.value), goal_threshold)
    key = (identity, window, filters, current_side_effect_tools())  # a changed pattern: other findings
    with _cache_lock:
        kept = _cache.get(key)
    version, touched = _read_version(conn, kept.version if kept is not None else None)
    if kept is not None and touched is not None and not touched and version.spans == kept.version.spans:
        with _cache_lock:
            _cache[key] = _Kept(version, kept.parts, kept.summary)
            _cache.move_to_end(key)
        return kept.summary.copy()
    parts = None
    if kept is not None and touched is not None:
        scope = _touched_scope(conn, touched, kept.parts.base.index)
        if len(scope.runs) <= min(_MAX_TOUCHED, max(8, _MAX_TOUCHED_SHARE * len(kept.parts.base))):
            fresh = _compute_parts(conn, window, filters, goal_threshold.value, scope)
            parts = _merge_parts(kept.parts, fresh, scope)
    if parts is None:
        parts = _compute_parts(conn, window, filters, goal_threshold.value)
    summary = _assemble(conn, parts, goal_threshold)
    with _cache_lock:
        _cache[key] = _Kept(version, parts, summary.copy())
        _cache.move_to_end(key)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return summary
