"""Enforcement coverage per tool and the per-run summary with a health verdict."""

from __future__ import annotations

import collections
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

import analytics.kept_store as kept_store
from analytics.coverage import coverage_text
from analytics.crew_limits import count_limits
from analytics.data_version import Scope as _Scope
from analytics.data_version import Version as _Version
from analytics.data_version import database_identity as _database_identity
from analytics.data_version import one_version
from analytics.data_version import read_version as _read_version
from analytics.data_version import touched_scope as _touched_scope
from analytics.engine import is_clickhouse
from analytics.goals import goal_run_stats
from analytics.kept import KEPT, PARTITIONS, given_parts, keeps_parts, result_code
from analytics.materialize import PARTS, RUN_ACTORS, Maintained, maintain, read_findings
from analytics.registry import (
    METRICS,
    counted_metrics,
    finding_metrics,
    register,
    run_metric,
    whole_if_covering,
)
from analytics.side_effects import current_side_effect_tools
from analytics.sql_loader import filter_params, load_sql, query_arrow, query_tables, run_sql
from analytics.thresholds import ThresholdInfo, current_threshold
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)


def counted_detectors() -> list[str]:
    """The detectors whose findings run_summary counts per run (registered ``counted=True``)."""
    return [m.name for m in counted_metrics()]


def failing_detectors() -> list[str]:
    """Counted detectors whose findings mean a coordination failure took effect (``failing=True``).

    The others (divergent reads whose writes a guard sorted out, budgets that stopped an agent,
    stale holders, refused calls) are warnings: the crew degraded but a guard or the agent caught
    it."""
    return [m.name for m in counted_metrics() if m.failing]


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
    kept="whole",
)
def enforcement_coverage(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Which tools are enforced by guards and which can only be watched.

    After a batch, summed from the counts per run kept with the result (``_coverage_parts``), the
    touched runs counted again (``analytics.kept.keeps_parts``)."""
    parts = given_parts("enforcement_coverage")
    if parts is None:
        return run_sql(conn, "enforcement_coverage", window, filters)
    return query_tables("_enforcement_coverage_tools", {"parts": parts}, {})


def _coverage_parts(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pa.Table:
    """Per run, service and tool: enforcement_coverage's counts (``enforcement_coverage_runs.sql``)."""
    return query_arrow(conn, load_sql("enforcement_coverage_runs"), filter_params(window, filters))


# At 1M spans of 10-call runs (52,700 runs) there are 333,000 rows (0.19 CPU-s to sum, about what
# computing the result costs; counting them 2-3 CPU-s): such results are computed in full. At 1M
# of 100,000-call runs a few hundred.
COVERAGE_PART_ROWS = 100_000
COVERAGE_PART_RUNS = 10_000
keeps_parts("enforcement_coverage", _coverage_parts, max_rows=COVERAGE_PART_ROWS, max_runs=COVERAGE_PART_RUNS)


def _summed_metrics() -> list:
    """Finding metrics run_summary counts per run: the counted ones, plus those whose rows say
    per row whether a failure took effect (a flag column on a failing metric, or a column that
    clears a row: ``failing_unless``). goal_divergence is summed by its own SQL aggregate
    (``goal_run_stats``: one row per run, not per subtask)."""
    return [
        m
        for m in finding_metrics()
        if m.name != "goal_divergence" and (m.counted or m.failing_unless or (m.failing and m.flag_column))
    ]


def _true(frame: pd.DataFrame, column: str) -> pd.Series:
    return frame[column].eq(True).fillna(False).astype(bool)


def _row_counts(metric) -> dict[str, Callable[[pd.DataFrame], pd.Series]]:
    """The per-row conditions counted for ``metric`` beside its rows (``n``), by label."""
    counts: dict[str, Callable[[pd.DataFrame], pd.Series]] = {}
    if metric.failing_unless:
        counts["unrecovered"] = lambda f, c=metric.failing_unless: ~_true(f, c)
    if metric.failing and metric.flag_column:
        counts["flagged"] = lambda f, c=metric.flag_column: _true(f, c)
    return counts


# Detectors whose findings are keyed by something other than the run: run_summary recomputes
# them for the touched values of that key (the run a finding is counted in is one of several).
# Every other counted detector must find a run's findings from that run's spans alone;
# tests/analytics/test_summary.py holds the incremental summary equal to a full one.
_COUNTED_BY = {"constraint_drops": "origin_task_id"}


def _findings_per_run(
    conn: duckdb.DuckDBPyConnection, name: str, window: Window, filters: Filters, scope: _Scope | None = None
) -> pd.DataFrame:
    """Findings of detector ``name`` per run: ``n`` plus its extra counts, from its result kept by
    data version (``analytics.kept``: after new spans only the touched runs were recomputed).

    Indexed by run_id; for detectors in ``_COUNTED_BY`` a plain frame with that key and run_id.
    With ``scope`` only the scope's runs (origin tasks) are counted, except for a detector kept
    whole (its findings depend on every run: all are counted)."""
    frame = run_metric(conn, name, window, filters)
    if scope is not None and name in PARTITIONS:
        column = PARTITIONS[name]
        frame = frame[frame[column].isin(scope.origin_tasks if column == "origin_task_id" else scope.runs)]
    return _counts_per_run(name, frame)


def _counts_per_run(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """``_findings_per_run``'s counts of the findings ``frame`` of detector ``name``."""
    keys = ["run_id"] if name not in _COUNTED_BY else [_COUNTED_BY[name], "run_id"]
    extra = _row_counts(METRICS[name])
    columns = {"n": pd.Series(1, index=frame.index, dtype="int64")}
    columns.update({label: condition(frame).astype("int64") for label, condition in extra.items()})
    counts = pd.DataFrame({**{key: frame[key] for key in keys}, **columns})
    counts = counts.groupby(keys, dropna=False, sort=False).sum().reset_index()
    return counts if name in _COUNTED_BY else counts.set_index("run_id")


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
    for name in (m.name for m in _summed_metrics()):
        found[name] = _findings_per_run(conn, name, window, filters, scope)
    goals = goal_run_stats(conn, window, filters, goal_threshold, runs=runs, runs_since=since)
    return _Parts(base, found, goals)


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
        if name not in PARTITIONS:  # kept whole: counted for every run every time
            drop = pd.Series(True, index=frame.index)
        elif name in _COUNTED_BY:
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

    def per_run(counts: pd.Series, fill=0, dtype="int64") -> pd.Series:
        # counts.reindex(base.index, fill_value=fill).astype(dtype), placed by the positions of
        # the few runs with findings in the run index (its hash table built once for every
        # detector), not by looking each of the runs up in each detector's counts: 42 lookups
        # of 1M run ids cost 2.2 of run_summary's 4.0 s after a batch at 10M of 10-call runs
        positions = base.index.get_indexer(counts.index)
        found = positions >= 0
        values = np.full(len(base), fill, dtype=dtype)
        values[positions[found]] = counts.to_numpy(dtype=dtype)[found]
        return pd.Series(values, index=base.index)

    found = {}
    for name, frame in parts.found.items():
        if name in _COUNTED_BY:  # one row per (key, run): sum per run
            frame = frame.drop(columns=_COUNTED_BY[name]).groupby("run_id").sum()
        found[name] = frame
    for metric in _summed_metrics():
        name = metric.name
        base[f"{name}_count"] = per_run(found[name]["n"])
        if metric.counted:  # over the crew's calibrated count: failing, or a warning
            over = base[f"{name}_count"] > allowed.get(name, 0.0)
        else:  # every row is at least a warning (a guard refused it)
            over = base[f"{name}_count"] > 0
        if metric.failing and not metric.flag_column:
            failing |= over
        else:
            degraded |= over
        for label in _row_counts(metric):  # rows that took effect: failing whatever the count
            base[f"{name}_{label}"] = per_run(found[name][label])
            failing |= base[f"{name}_{label}"] > 0
    # Goal columns from one SQL aggregate over the subtasks (no row per subtask).
    goals = parts.goals
    base["drifted_subtasks"] = per_run(goals["drifted_subtasks"])
    base["worst_divergence"] = per_run(goals["worst_divergence"].astype("float64"), np.nan, "float64")
    # Over the uncalibrated default, a divergence is a question for a person, not a failure:
    # ordinary decompositions of a goal can score past it until the threshold is calibrated.
    drifted = base["drifted_subtasks"] > 0
    review = drifted if not goal_threshold.calibrated else pd.Series(False, index=base.index)
    failing |= drifted & goal_threshold.calibrated
    base["coverage"] = [
        coverage_text(*counts)
        for counts in zip(
            base["tool_calls"], base["tool_calls_unrecorded"], base["tasks_unrecorded"],
            base["unrecorded_scope"], strict=True,
        )
    ]  # fmt: skip
    base = base.drop(columns=["tool_calls", "tool_calls_unrecorded", "tasks_unrecorded", "unrecorded_scope"])
    base["verdict"] = "healthy"
    base.loc[degraded, "verdict"] = "degraded"
    base.loc[review, "verdict"] = "to review"
    base.loc[failing, "verdict"] = "failing"
    return base.reset_index(drop=True)


# run_summary is kept per database file, window and filters, and brought up to date on each
# call: the runs that new spans touched (analytics.data_version) are recomputed and merged with
# the kept pieces of the others, so a call after an ingest costs the touched runs, not every
# detector over every run. In-memory databases are not cached (they have no stable identity).
_CACHE_SIZE = 32
# Past this share of the kept runs (or this many runs), one full recomputation is cheaper than
# filtered ones (each filtered scan compares every span's run with the list).
_MAX_TOUCHED_SHARE = 0.25
_MAX_TOUCHED = 200


@dataclass
class _Kept:
    version: _Version
    parts: _Parts | None  # None: the summary was read from the store (analytics.kept_store)
    summary: pd.DataFrame
    stored: bool = False  # the store holds this summary at this version


_cache: collections.OrderedDict[tuple, _Kept] = collections.OrderedDict()
_cache_lock = threading.Lock()


def clear_cache() -> None:
    """Forget every kept run summary."""
    with _cache_lock:
        _cache.clear()
    kept_store.forget_fetched()


def _summary_columns() -> dict[str, str]:
    """run_summary's columns: the counts of each summed detector, so they follow the registry."""
    counts: dict[str, str] = {}
    failing: list[str] = []
    failing_any: list[str] = []
    warnings: list[str] = ["refused calls"]
    for m in _summed_metrics():
        label = m.title or m.name
        if m.counted:
            counts[f"{m.name}_count"] = f"{m.name} findings in the run"
        else:
            counts[f"{m.name}_count"] = f"{m.name} rows in the run (those a guard refused included)"
        (failing if m.failing and not m.flag_column else warnings).append(label)
        if m.failing_unless:
            counts[f"{m.name}_unrecovered"] = f"{m.name} findings whose {m.failing_unless} is not true"
            failing_any.append(f"{label} without {m.failing_unless}")
        if m.failing and m.flag_column:
            counts[f"{m.name}_flagged"] = f"{m.name} rows whose {m.flag_column} is true (went through)"
            failing_any.append(f"{label} with {m.flag_column}")
    return {
        "run_id": "run (conversation id)",
        "trace_id": "first trace of the run",
        "agents": "agents seen in the run",
        "hops": "deepest delegation hop",
        "spans": "spans in the run",
        "traces": "traces in the run",
        "errors": "spans that failed (outcome error or status Error)",
        "rejections": "calls refused by a guard (failures prevented)",
        **counts,
        "drifted_subtasks": "subtasks over the goal-divergence threshold",
        "worst_divergence": "highest goal divergence in the run (1 - cosine), None without subtasks",
        "verdict": f"'failing' (more findings than the crew's calibrated count, 0 by default, of: "
        f"{'; '.join(failing)}; any {'; any '.join(failing_any)}; or a drifted subtask under a "
        "calibrated goal threshold), "
        "'to review' (otherwise failing only by subtasks over the uncalibrated default goal-divergence "
        f"threshold), 'degraded' (only {'; '.join(warnings)}), or 'healthy'",
        "coverage": "what the run's telemetry did not record, the detectors that therefore cannot see it "
        "and the setting that turns content capture on ('repeated calls not measurable: ... tool "
        "arguments', 'goal drift not measurable: ... task text'); None when nothing is missing",
        "first_seen": "first span (naive UTC)",
        "last_seen": "last span (naive UTC)",
    }  # fmt: skip


@register(
    "run_summary",
    description="Per run: agents, hops, spans, each detector's finding count, worst divergence, verdict.",
    columns=_summary_columns,
    row="one run (conversation id)",
    failure_mode=None,
    mast_category=None,
)
def run_summary(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Health of every run, combining every detector's findings.

    A count above its crew's baseline-calibrated ``count_per_run:<detector>:<service>`` threshold
    (0 until calibrated; ``analytics.crew_limits``) makes the run fail. Results are kept per
    database file, window and filters; after new spans only the runs they touched are recomputed
    (see ``_read_version``); the detectors it counts are read at the data version it reads
    (``one_version``: one read of it, not one per detector).
    """
    with one_version():
        return _run_summary(conn, window, filters)


def _run_summary(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    tabled = summary_from_tables(conn, window, filters)
    if tabled is not None:
        return tabled
    identity = _database_identity(conn)
    goal_threshold = current_threshold(conn, "goal_divergence")
    if identity is None:
        return _assemble(conn, _compute_parts(conn, window, filters, goal_threshold.value), goal_threshold)
    # A changed pattern or set of counted detectors: other findings.
    key = (
        identity,
        window,
        filters,
        current_side_effect_tools(),
        tuple(counted_detectors()),
        tuple(failing_detectors()),
        tuple(m.name for m in _summed_metrics()),
    )
    with _cache_lock:
        kept = _cache.get(key)
    if kept is None:  # not kept in this process: the stored summary, if any (used while unchanged)
        stored_scope = kept_store.scope_text(window, filters, key[3])
        loaded = kept_store.load(conn, "run_summary", stored_scope, result_codes()["run_summary"])
        if loaded is not None:
            kept = _Kept(loaded[0], None, loaded[1], stored=True)
    version, touched = _read_version(conn, kept.version if kept is not None else None)
    if kept is not None and touched is not None and not touched and version.spans == kept.version.spans:
        with _cache_lock:
            _cache[key] = _Kept(version, kept.parts, kept.summary, kept.stored)
            _cache.move_to_end(key)
        return kept.summary.copy()
    parts = None
    if kept is not None and kept.parts is not None and touched is not None:
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


# run_summary's per-run parts, maintained as spans commit (analytics.materialize): the
# run_summary.sql row of each run and its goal statistics. The finding counts come from the
# detectors' own findings tables, so the summary is assembled from tables alone.
BASE_PART = "run_summary_base"
GOALS_PART = "run_summary_goals"


def _base_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    return run_sql(conn, "run_summary", Window(), Filters(), runs=keys)


def _actor_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    return run_sql(conn, "run_actors", Window(), Filters(), runs=keys)


def _goal_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    threshold = current_threshold(conn, "goal_divergence").value
    return goal_run_stats(conn, Window(), Filters(), threshold, runs=keys).reset_index()


maintain(Maintained(BASE_PART, "run_id", _base_rows, (("first_seen", False), ("run_id", False)), "2"))
maintain(Maintained(GOALS_PART, "run_id", _goal_rows, (("run_id", False),), "1"))
maintain(
    Maintained(RUN_ACTORS, "run_id", _actor_rows, (("run_id", False), ("kind", False), ("name", False)), "1")
)
PARTS.update({BASE_PART, GOALS_PART, RUN_ACTORS})


def summary_from_tables(
    conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters
) -> pd.DataFrame | None:
    """run_summary assembled from the findings tables (no detector computed), or None when they
    cannot answer: a window or filter, or a part not built yet (``analytics.materialize``)."""
    if is_clickhouse(conn):
        return None
    window = whole_if_covering(conn, window)
    if window != Window() or filters != Filters():
        return None
    base = read_findings(conn, BASE_PART)
    goals = read_findings(conn, GOALS_PART)
    if base is None or goals is None:
        return None
    found: dict[str, pd.DataFrame] = {}
    for metric in _summed_metrics():
        needed = ["run_id", *([_COUNTED_BY[metric.name]] if metric.name in _COUNTED_BY else [])]
        needed += [c for c in (metric.failing_unless, metric.flag_column) if c and c not in needed]
        frame = read_findings(conn, metric.name, columns=needed)
        if frame is None:
            return None
        found[metric.name] = _counts_per_run(metric.name, frame)
    base = base.set_index("run_id", drop=False)
    goals = goals.set_index("run_id")[["drifted_subtasks", "worst_divergence"]]
    frame = _assemble(conn, _Parts(base, found, goals), current_threshold(conn, "goal_divergence"))
    frame.attrs["source"] = "table"
    return frame


def result_codes() -> dict[str, str]:
    """The code hash of every registered metric's stored results (``analytics.kept.result_code``);
    run_summary's covers every kept detector's sources too (it is assembled from their results)."""
    codes = {name: result_code(metric.func) for name, metric in METRICS.items()}
    modules = {inspect.unwrap(METRICS[name].func).__module__ for name in KEPT} | {__name__}
    codes["run_summary"] = kept_store.code_fingerprint(frozenset(modules))
    return codes


def unstored(identity: tuple, window: Window, filters: Filters) -> list[tuple[str, _Version, pd.DataFrame]]:
    """("run_summary", version, summary) kept for the database ``identity`` and this scope (under
    the side-effect tool pattern in force) when the store does not hold it at its version."""
    tools = current_side_effect_tools()
    with _cache_lock:
        return [
            ("run_summary", entry.version, entry.summary)
            for key, entry in _cache.items()
            if key[:4] == (identity, window, filters, tools) and not entry.stored
        ]


def mark_stored(identity: tuple, window: Window, filters: Filters, version: _Version) -> None:
    """Record that the store now holds the summary kept at ``version`` (unless it moved on)."""
    tools = current_side_effect_tools()
    with _cache_lock:
        for key, entry in _cache.items():
            if key[:4] == (identity, window, filters, tools) and entry.version is version:
                entry.stored = True
