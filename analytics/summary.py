"""Enforcement coverage per tool and the per-run summary with a health verdict."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics.coverage import coverage_text
from analytics.crew_limits import count_limits
from analytics.engine import is_clickhouse
from analytics.goal_refresh import rescored_runs
from analytics.goals import RUNS_PART as GOAL_COUNTS
from analytics.goals import goal_run_stats
from analytics.materialize import (
    PARTS,
    RUN_ACTORS,
    TABLE_PREFIX,
    Maintained,
    maintain,
    maintain_with,
    read_findings,
    ready,
    run_scope,
    spans_of_no_run,
    table_exists,
)
from analytics.registry import (
    METRICS,
    counted_metrics,
    finding_metrics,
    register,
    run_metric,
    whole_if_covering,
)
from analytics.sql_loader import (
    expand_fragments,
    filter_params,
    memory_cursor,
    query_df,
    quote_identifier,
    run_sql,
)
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
    """Which tools are enforced by guards and which can only be watched."""
    return run_sql(conn, "enforcement_coverage", window, filters)


# enforcement_coverage depends on every run, so it is kept whole; its first step (each run's
# calls grouped by the fields it counts: tens of rows a run) is kept per run, and the whole
# answer sums that table (with the spans of no run, if any: read at once, by their NULL run)
# instead of grouping every stored span each time it is due.
COVERAGE_RUNS = "enforcement_coverage_runs"
_COVERAGE_FROM_RUNS_SQL = """
WITH run_cells AS (
    SELECT * EXCLUDE (_pos) FROM {table}
    UNION ALL BY NAME
    -- the spans of no run (the fragment's ``spans``: these alone), with their own cells
    SELECT * FROM (WITH spans AS (SELECT * FROM main.spans WHERE run_id IS NULL)
                   SELECT * FROM ({enforcement_cells}))
),
{enforcement_per_tool}
"""


def _coverage_runs(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    return run_sql(conn, COVERAGE_RUNS, Window(), run_scope(conn, keys))


def _coverage_from_runs(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    """enforcement_coverage over every stored span from ``COVERAGE_RUNS``' table (computed from
    the spans when that table cannot answer)."""
    if is_clickhouse(conn):
        return _coverage_summed_in_clickhouse(conn)
    table = TABLE_PREFIX + COVERAGE_RUNS
    if ready(conn, COVERAGE_RUNS) is None or not table_exists(conn, table):
        return enforcement_coverage(conn, Window(), Filters(from_spans=True))
    sql = expand_fragments(_COVERAGE_FROM_RUNS_SQL.replace("{table}", quote_identifier(table)))
    return query_df(conn, sql, filter_params(Window(), Filters()))


def _coverage_summed_in_clickhouse(store) -> pd.DataFrame:
    """On ClickHouse: ``COVERAGE_RUNS``' current rows summed where they are (read out, the part
    of a store of many small runs is millions of rows: slower than a full computation). Computed
    from the spans when the table cannot answer, or when spans of no run exist (no part holds
    them; the collector gives every span a run)."""
    from analytics.findings_clickhouse import (  # noqa: PLC0415 - ClickHouse's tables
        cell_columns,
        current_rows,
    )
    from analytics.read_clickhouse import ready as table_ready  # noqa: PLC0415

    found = table_ready(store, COVERAGE_RUNS)
    if found is None or not found[1] or spans_of_no_run(store):
        return enforcement_coverage(store, Window(), run_scope(store, None))
    state, have = found
    # the part's cells: its columns but the versioning ones (as a read of it takes them)
    cells = ", ".join(quote_identifier(c) for c in cell_columns(list(have)))
    database = quote_identifier(store.database)
    current = current_rows(store, COVERAGE_RUNS, state.base, dialect="duckdb")
    sql = (
        f"WITH run_cells AS (SELECT {cells} FROM {database}.{quote_identifier(TABLE_PREFIX + COVERAGE_RUNS)} "
        f"WHERE {current}),\n"
        "{enforcement_per_tool}"
    )
    return query_df(store, expand_fragments(sql), {})


maintain(Maintained(COVERAGE_RUNS, "run_id", _coverage_runs, (("run_id", False),), "1"))
PARTS.add(COVERAGE_RUNS)
maintain_with("enforcement_coverage", _coverage_from_runs, depends=(COVERAGE_RUNS,), portable=True)


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


def _counted_flags(metric) -> dict[str, tuple[str, bool]]:
    """What is counted for ``metric`` beside its rows (``n``), by label: the boolean column and
    whether its rows that are true (else those not true: false or NULL) are counted. The one
    statement of it: pandas (``_row_counts``) and each engine's SQL (``_changed_counts``,
    ``_changed_counts_in_clickhouse``) count by it."""
    counts: dict[str, tuple[str, bool]] = {}
    if metric.failing_unless:
        counts["unrecovered"] = (metric.failing_unless, False)
    if metric.failing and metric.flag_column:
        counts["flagged"] = (metric.flag_column, True)
    return counts


def _row_counts(metric) -> dict[str, Callable[[pd.DataFrame], pd.Series]]:
    """The per-row conditions counted for ``metric`` beside its rows (``n``), by label."""
    return {
        label: (lambda f, c=column, t=when: _true(f, c) if t else ~_true(f, c))
        for label, (column, when) in _counted_flags(metric).items()
    }


# Detectors whose findings are keyed by something other than the run: run_summary recomputes
# them for the touched values of that key (the run a finding is counted in is one of several).
# Every other counted detector must find a run's findings from that run's spans alone;
# tests/analytics/test_summary.py holds the incremental summary equal to a full one.
_COUNTED_BY = {"constraint_drops": "origin_task_id"}


def _findings_per_run(
    conn: duckdb.DuckDBPyConnection, name: str, window: Window, filters: Filters
) -> pd.DataFrame:
    """Findings of detector ``name`` per run: ``n`` plus its extra counts (``run_metric``: from
    its findings table where that answers, else computed).

    Indexed by run_id; for detectors in ``_COUNTED_BY`` a plain frame with that key and run_id."""
    return _counts_per_run(name, run_metric(conn, name, window, filters))


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
    """The per-run pieces run_summary is assembled from.

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
    computed: Mapping[str, pd.DataFrame] | None = None,
) -> _Parts:
    """Every piece, for all runs the window and filters select; a detector's counts from its
    result in ``computed`` when given there (computed for the same window and filters)."""
    base = run_sql(conn, "run_summary", window, filters)
    base = base.set_index("run_id", drop=False)
    found: dict[str, pd.DataFrame] = {}
    for name in (m.name for m in _summed_metrics()):
        if computed is not None and name in computed:
            found[name] = _counts_per_run(name, computed[name])
        else:
            found[name] = _findings_per_run(conn, name, window, filters)
    goals = goal_run_stats(conn, window, filters, goal_threshold)
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
    kept="run_id",
    order=(("first_seen", False), ("run_id", False)),
)
def run_summary(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Health of every run, combining every detector's findings.

    A count above its crew's baseline-calibrated ``count_per_run:<detector>:<service>`` threshold
    (0 until calibrated; ``analytics.crew_limits``) makes the run fail. Kept as a table of its own
    (``_summary_rows``, per touched run); computed, it is assembled from the findings tables
    (``summary_from_tables``) when they answer, else from the pieces computed for this window and
    filters.
    """
    tabled = summary_from_tables(conn, window, filters)
    if tabled is not None:
        return tabled
    goal_threshold = current_threshold(conn, "goal_divergence")
    return _assemble(conn, _compute_parts(conn, window, filters, goal_threshold.value), goal_threshold)


def run_summary_of(
    conn: duckdb.DuckDBPyConnection,
    computed: Mapping[str, pd.DataFrame],
    window: Window = Window(),
    filters: Filters = Filters(),
) -> pd.DataFrame:
    """run_summary computed from the spans (as ``compute_metric`` does), taking each counted
    detector's findings from ``computed`` (its full computation for the same ``window`` and
    ``filters``) instead of computing it again; the others are computed. What a caller that
    already computed every detector (the tables' reference in the tests, a benchmark's
    ``identical_to_full``) asks, at half the cost of asking each detector twice."""
    filters = dataclasses.replace(filters, from_spans=True)
    goal_threshold = current_threshold(conn, "goal_divergence")
    parts = _compute_parts(conn, window, filters, goal_threshold.value, computed)
    frame = _assemble(conn, parts, goal_threshold)
    return frame.loc[:, list(METRICS[SUMMARY].columns)].reset_index(drop=True)


# run_summary's per-run parts, maintained as spans commit (analytics.materialize): the
# run_summary.sql row of each run and its goal statistics. The finding counts come from the
# detectors' own findings tables, so the summary is assembled from tables alone.
BASE_PART = "run_summary_base"
GOALS_PART = "run_summary_goals"


def _base_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    return run_sql(conn, "run_summary", Window(), run_scope(conn, keys))


def _actor_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    return run_sql(conn, "run_actors", Window(), run_scope(conn, keys))


# goal_run_stats per run from goal_divergence_runs' rows (the run's scored subtasks counted by
# rounded divergence): a subtask above the threshold is drifted, the highest is the worst; runs
# without a scored subtask have no row there, as in goal_run_stats.
_GOAL_ROWS_FROM_COUNTS = """
SELECT run_id::VARCHAR AS run_id,
       coalesce(sum(subtasks) FILTER (WHERE divergence > $threshold::DOUBLE), 0)::BIGINT AS drifted_subtasks,
       max(divergence)::DOUBLE AS worst_divergence
FROM _counts
WHERE run_id IS NOT NULL AND divergence IS NOT NULL
GROUP BY run_id
ORDER BY run_id
"""


_GOAL_COUNTS_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("divergence", pa.float64()), ("subtasks", pa.int64())]
)


def _goal_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    """The part's rows of runs ``keys``: summed from goal_divergence_runs' table (brought up to
    date first in a pass), which counts the same subtasks, so a pass matches subtasks to their
    scores once, not once per result; computed from the spans when that table cannot answer."""
    threshold = current_threshold(conn, "goal_divergence").value
    counts = read_findings(conn, GOAL_COUNTS, columns=["run_id", "divergence", "subtasks"], runs=keys)
    if counts is None:
        return goal_run_stats(conn, Window(), run_scope(conn, keys), threshold).reset_index()
    with memory_cursor() as mem:
        mem.register(
            "_counts", pa.Table.from_pandas(counts, schema=_GOAL_COUNTS_SCHEMA, preserve_index=False)
        )
        return mem.execute(_GOAL_ROWS_FROM_COUNTS, {"threshold": threshold}).df()


maintain(Maintained(BASE_PART, "run_id", _base_rows, (("first_seen", False), ("run_id", False)), "2"))
# recomputed for the runs the change log names and those the worker's stored scores name
maintain(
    Maintained(
        GOALS_PART, "run_id", _goal_rows, (("run_id", False),), "2", depends=(GOAL_COUNTS,),
        extra_keys=rescored_runs(GOALS_PART), portable=True,
    )
)  # fmt: skip
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
    parts = _tabled_parts(conn, None)
    if parts is None:
        return None
    frame = _assemble(conn, parts, current_threshold(conn, "goal_divergence"))
    frame.attrs["source"] = "table"
    return frame


# run_summary itself is a table (partitioned by run): each pass assembles the touched runs' rows
# from the tables above and the summed detectors' tables, so a read is a SELECT. A run's row
# changes when its spans do (the change log names it) and when a detector's table changes its
# findings of the run without the run being touched (a constraint drop is kept by origin task,
# shared by runs; a detector kept whole, such as runaway_runs, is recomputed from every run):
# those runs are found by comparing each detector's per-run counts with the counts in the table
# (``_changed_counts``), a group-by over the findings tables, not over the spans.
SUMMARY = "run_summary"


def _summary_depends() -> tuple[str, ...]:
    return (BASE_PART, GOALS_PART, *(m.name for m in _summed_metrics()))


def _summary_rows(
    conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
) -> pd.DataFrame:
    """run_summary's rows of runs ``keys`` (every run when None), assembled from the tables; the
    runs computed from their spans when a table cannot answer."""
    threshold = current_threshold(conn, "goal_divergence")
    parts = _tabled_parts(conn, keys)
    if parts is not None:
        return _assemble(conn, parts, threshold)
    # computed for every run, then cut: a run's counts may come from other runs' spans (a
    # constraint drop is found per origin task), so the runs' own spans would not do
    frame = _assemble(conn, _compute_parts(conn, Window(), run_scope(conn, None), threshold.value), threshold)
    return frame if keys is None else frame[frame["run_id"].isin(keys)].reset_index(drop=True)


def _tabled_parts(conn: duckdb.DuckDBPyConnection, runs: list[str] | None) -> _Parts | None:
    """run_summary's pieces of ``runs`` (every run when None) read from the findings tables;
    None when one of them is not built."""
    base = read_findings(conn, BASE_PART, runs=runs)
    goals = read_findings(conn, GOALS_PART, runs=runs)
    if base is None or goals is None:
        return None
    if "run_id" not in base.columns:
        # built with no run, so no table yet (a first pass on an empty store): spans may have
        # arrived since, and the part cannot say which columns it would have
        return None
    if "run_id" not in goals.columns:  # built, no subtask in any run (ClickHouse: no columns)
        goals = pd.DataFrame({"run_id": [], "drifted_subtasks": [], "worst_divergence": []})
    found: dict[str, pd.DataFrame] = {}
    for metric in _summed_metrics():
        frame = read_findings(conn, metric.name, columns=_counted_columns(metric), runs=runs)
        if frame is None:
            return None
        found[metric.name] = _counts_per_run(metric.name, frame)
    base = base.set_index("run_id", drop=False)
    goals = goals.set_index("run_id")[["drifted_subtasks", "worst_divergence"]]
    return _Parts(base, found, goals)


def _counted_columns(metric) -> list[str]:
    """The columns of ``metric``'s findings run_summary reads: the run, its key when counted by
    another (``_COUNTED_BY``), and the columns of its per-row counts."""
    needed = ["run_id", *([_COUNTED_BY[metric.name]] if metric.name in _COUNTED_BY else [])]
    return needed + [c for c in (metric.failing_unless, metric.flag_column) if c and c not in needed]


def _changed_counts(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Runs whose counts in the run_summary table differ from the summed detectors' tables now
    (every run when a detector has no table to compare with)."""
    if ready(conn, SUMMARY) is None:
        return []  # built from nothing this pass
    summary = TABLE_PREFIX + SUMMARY
    if not table_exists(conn, summary):
        return []  # no run yet: every run there is will be a touched one
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'findings__%'"
        ).fetchall()
    }
    selects = []
    for metric in _summed_metrics():
        if ready(conn, metric.name) is None:
            return [
                row[0] for row in conn.execute(f"SELECT run_id FROM {quote_identifier(summary)}").fetchall()
            ]
        counts = {f"{metric.name}_count": "count(*)"}
        for label, (column, when) in _counted_flags(metric).items():
            counts[f"{metric.name}_{label}"] = (
                f"count(*) FILTER (WHERE {quote_identifier(column)} IS {'' if when else 'NOT '}TRUE)"
            )
        table = TABLE_PREFIX + metric.name
        if table in tables:
            found = (
                f"SELECT run_id, {', '.join(f'{expr} AS {quote_identifier(col)}' for col, expr in counts.items())} "
                f"FROM {quote_identifier(table)} WHERE run_id IS NOT NULL GROUP BY run_id"
            )
        else:  # built, no finding
            found = f"SELECT NULL::VARCHAR AS run_id, {', '.join(f'0 AS {quote_identifier(col)}' for col in counts)} WHERE false"
        differs = " OR ".join(
            f"coalesce(f.{quote_identifier(col)}, 0) <> coalesce(s.{quote_identifier(col)}, 0)"
            for col in counts
        )
        selects.append(
            f"SELECT coalesce(f.run_id, s.run_id) AS run_id FROM ({found}) f "
            f"FULL OUTER JOIN (SELECT run_id, {', '.join(quote_identifier(c) for c in counts)} "
            f"FROM {quote_identifier(summary)}) s ON s.run_id = f.run_id WHERE {differs}"
        )
    if not selects:
        return []
    return [row[0] for row in conn.execute(" UNION ".join(selects)).fetchall() if row[0] is not None]


def _changed_counts_in_clickhouse(store) -> list[str]:
    """``_changed_counts`` on ClickHouse, inside it: per run and count column, each summed
    detector's current rows counted minus the run_summary table's count (only its runs with one
    not 0); a run with a difference not 0 changed. Every run of the table when a detector's
    table is not built."""
    from analytics.findings_clickhouse import current_rows, qualified  # noqa: PLC0415
    from analytics.read_clickhouse import ready as table_ready  # noqa: PLC0415

    found = table_ready(store, SUMMARY)
    if found is None or not found[1]:
        return []  # built from nothing this pass, or no run yet: every run is a touched one
    summary_state, _ = found
    summary = qualified(store, TABLE_PREFIX + SUMMARY)

    in_summary = current_rows(store, SUMMARY, summary_state.base)
    branches, columns = [], []
    for metric in _summed_metrics():
        got = table_ready(store, metric.name)
        if got is None:
            rows = store.execute(
                f"SELECT DISTINCT run_id FROM {summary} WHERE {in_summary} AND run_id IS NOT NULL"
            )
            return [run for run in rows.column("run_id").to_pylist() if run is not None]
        counts = {f"{metric.name}_count": "count()"}
        for label, (column, when) in _counted_flags(metric).items():
            counts[f"{metric.name}_{label}"] = f"countIf({'' if when else 'NOT '}ifNull(`{column}`, false))"
        columns += counts
        state, have = got
        if have:  # a table with rows (without: built, no finding)
            named = ", ".join(f"toInt64({expr}) AS `{column}`" for column, expr in counts.items())
            pairs = ", ".join(f"('{column}', `{column}`)" for column in counts)
            branches.append(
                f"SELECT run_id, kv.1 AS c, kv.2 AS n FROM (SELECT run_id, {named} "
                f"FROM {qualified(store, TABLE_PREFIX + metric.name)} "
                f"WHERE {current_rows(store, metric.name, state.base)} AND run_id IS NOT NULL GROUP BY run_id) "
                f"ARRAY JOIN [{pairs}] AS kv"
            )
    # the table's counts not 0, each run's row read once
    pairs = ", ".join(f"('{column}', -toInt64(ifNull(`{column}`, 0)))" for column in columns)
    branches.append(
        f"SELECT run_id, kv.1 AS c, kv.2 AS n FROM {summary} "
        f"ARRAY JOIN arrayFilter(x -> x.2 != 0, [{pairs}]) AS kv WHERE {in_summary}"
    )
    rows = store.execute(
        "SELECT DISTINCT run_id FROM (SELECT run_id, c, sum(n) AS d FROM ("
        + " UNION ALL ".join(branches)
        + ") GROUP BY run_id, c HAVING d != 0)"
    )
    return [run for run in rows.column("run_id").to_pylist() if run is not None]


def _summary_extra_keys(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Runs whose detector counts changed without their spans, and runs whose goal statistics
    (run_summary_goals) changed with stored scores (on ClickHouse a change of the scores
    rebuilds every table: the counts alone)."""
    if is_clickhouse(conn):
        return _changed_counts_in_clickhouse(conn)
    return list(dict.fromkeys([*_changed_counts(conn), *rescored_runs(SUMMARY)(conn)]))


maintain_with(
    SUMMARY, _summary_rows, depends=_summary_depends, extra_keys=_summary_extra_keys, run_local=False
)
