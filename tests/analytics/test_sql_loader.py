"""Filters of the detectors: dropping unset filters from the SQL, every combination, injection.

``analytics.sql_loader.query_df`` rewrites each ``($p IS NULL OR cond)`` group to ``(TRUE)`` or
``(cond)`` before DuckDB plans the statement. These tests pin that the rewrite keeps every
detector's result (raw text against rewritten text, all 64 combinations of set/unset filters),
that a run filter returns exactly the unfiltered findings of that run, and that filter values
stay data (bound parameters) even when they look like SQL.
"""

from __future__ import annotations

import itertools
import os
import pathlib
from datetime import timedelta

import duckdb
import pandas as pd
import pytest

from analytics import Filters, Window, run_metric
from analytics.goals import SCORER, ensure_scores_table
from analytics.registry import METRICS
from analytics.sql_loader import _PARAM, filter_params, load_sql, prune_unset_filters, query_df
from tests.fixtures_analytics import sample_traces_db

SQL_DIR = pathlib.Path(__file__).resolve().parents[2] / "analytics" / "sql"
FILTER_NAMES = ("since", "until", "service", "agent", "run", "origin_task")
# Parameters some statements take besides the filters (the detectors' defaults).
EXTRA = {"similarity": 0.8, "bucket_seconds": 3600, "min_delegations": 3, "min_inferred": 3, "limit": 1000}
EXTRA["scorer"] = SCORER


@pytest.fixture(scope="module")
def scenarios() -> duckdb.DuckDBPyConnection:
    conn = sample_traces_db()
    ensure_scores_table(conn)  # goal statements read the connection's own goal_scores_local
    return conn


@pytest.fixture(scope="module")
def values(scenarios) -> dict:
    """A value for each filter that selects part of the scenario data (not all, not nothing)."""
    run, origin, agent, service, first, last = scenarios.execute(
        """SELECT run_id, any_value(origin_task_id), mode(agent_id), any_value(ServiceName),
                  min(Timestamp), max(Timestamp)
           FROM spans WHERE run_id IN (SELECT run_id FROM spans WHERE objective_id IS NOT NULL
                                       OR op = 'send')
           GROUP BY run_id ORDER BY count(*) DESC LIMIT 1"""
    ).fetchone()
    return {
        "since": first - timedelta(minutes=1),
        "until": last + timedelta(minutes=1),
        "service": service,
        "agent": agent,
        "run": run,
        "origin_task": origin,
    }


def _canonical(frame: pd.DataFrame) -> tuple[list[str], list[tuple]]:
    """Columns and rows in a fixed order; lists and arrays as tuples, NaN/NaT/None alike."""

    def cell(value):
        if isinstance(value, (list, tuple)) or hasattr(value, "tolist") and not isinstance(value, str):
            value = value.tolist() if hasattr(value, "tolist") else value
            if isinstance(value, list):
                return ("list", tuple(cell(v) for v in value))
        if value is None or (not isinstance(value, (str, bytes)) and pd.isna(value)):
            return ("null",)
        return ("v", repr(value))

    rows = [tuple(cell(v) for v in row) for row in frame.itertuples(index=False, name=None)]
    return list(frame.columns), sorted(rows)


def _flag_sets() -> list[tuple[bool, ...]]:
    """Which filters are set: every one of the 64 combinations with DRIFTSCOPE_ALL_FILTER_COMBINATIONS=1,
    else none, all, each one alone and all but each one (14; every rewrite is decided per group,
    so these set and unset every filter next to both states of the others)."""
    n = len(FILTER_NAMES)
    if os.environ.get("DRIFTSCOPE_ALL_FILTER_COMBINATIONS") == "1":
        return list(itertools.product((False, True), repeat=n))
    alone = [tuple(i == j for j in range(n)) for i in range(n)]
    return [(False,) * n, (True,) * n] + alone + [tuple(not f for f in flags) for flags in alone]


def _combinations(values: dict):
    for flags in _flag_sets():
        chosen = {name: values[name] for name, on in zip(FILTER_NAMES, flags, strict=True) if on}
        window = Window(since=chosen.pop("since", None), until=chosen.pop("until", None))
        yield window, Filters(**chosen)


DETECTOR_SQL = sorted(
    p.stem
    for p in SQL_DIR.glob("*.sql")
    # Browse and comparison reads: named runs, not a filtered window. loop_code_outputs and
    # loop_declared_tools: LLM code blocks, which the simulator's crews do not write
    # (tests/analytics/test_loops.py, test_code_actions.py).
    if not p.stem.startswith("_")
    and p.stem
    not in (
        "run_spans",
        "list_runs",
        "evidence_spans",
        "compare_steps",
        "loop_code_outputs",
        "loop_declared_tools",
    )
    and not p.stem.startswith("compare_baseline")
)


@pytest.mark.parametrize("name", DETECTOR_SQL)
def test_dropping_unset_filters_keeps_every_statements_result(scenarios, values, name):
    raw = load_sql(name)
    unknown = set(_PARAM.findall(raw)) - set(filter_params(Window(), Filters())) - set(EXTRA)
    if unknown:  # run_metric with every combination still covers it (the next test)
        pytest.skip(f"{name} takes parameters {sorted(unknown)} besides the filters")
    nonempty = 0
    for window, filters in _combinations(values):
        params = {**filter_params(window, filters), **EXTRA}
        raw_params = {key: params[key] for key in set(_PARAM.findall(raw))}
        expected = scenarios.execute(raw, raw_params).df()
        rewritten = prune_unset_filters(raw, params)
        assert "$since::TIMESTAMP IS NULL" not in rewritten
        got = query_df(scenarios, raw, params)
        assert _canonical(got) == _canonical(expected), (name, window, filters)
        nonempty += not got.empty
    assert nonempty > 0, name


@pytest.mark.parametrize("name", sorted(METRICS))
def test_every_detector_runs_with_every_combination_of_filters(scenarios, values, name):
    columns = set(METRICS[name].columns)
    for window, filters in _combinations(values):
        frame = run_metric(scenarios, name, window, filters)
        assert set(frame.columns) >= columns - {"threshold", "threshold_version"}, (name, filters)
        if filters.run is not None and "run_id" in frame.columns:
            assert set(frame["run_id"].dropna()) <= {filters.run}, (name, window, filters)


# runaway_runs has no finding on the sample traces by design (the unguarded step-budget run is
# healthy); its run filter is held to the same property in tests/analytics/test_runaway.py.
RUN_SCOPED = sorted(
    name for name, metric in METRICS.items() if "run_id" in metric.columns and name != "runaway_runs"
)


@pytest.mark.parametrize("name", RUN_SCOPED)
def test_run_filter_equals_the_unfiltered_findings_of_that_run(scenarios, name):
    everything = run_metric(scenarios, name)
    assert not everything.empty, name
    runs = [
        r
        for (r,) in scenarios.execute("SELECT DISTINCT run_id FROM spans WHERE run_id IS NOT NULL").fetchall()
    ]
    if name == "run_summary":  # one row per run, slow; its run filter has tests of its own
        runs = sorted(set(everything["run_id"]))[:3]
    for run in sorted(runs):
        filtered = run_metric(scenarios, name, filters=Filters(run=run))
        restricted = everything[everything["run_id"] == run]
        assert _canonical(filtered) == _canonical(restricted), (name, run)


@pytest.mark.parametrize("name", ["context_drift_holders", "stale_policy_sends"])
def test_agent_filter_equals_the_unfiltered_findings_of_that_agent(scenarios, name):
    everything = run_metric(scenarios, name)
    for agent in sorted(set(everything["agent"])):
        filtered = run_metric(scenarios, name, filters=Filters(agent=agent))
        assert _canonical(filtered) == _canonical(everything[everything["agent"] == agent]), (name, agent)


INJECTIONS = [
    "x' OR '1'='1",
    pytest.param("'; DROP TABLE spans; --", marks=pytest.mark.slow),  # make test; the others: test-fast too
    ") OR ($run IS NULL OR TRUE",  # our own rewrite's text inside a value
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_sql_in_a_filter_value_is_only_a_value(scenarios, text):
    stored = scenarios.execute("SELECT count(*) FROM spans").fetchone()[0]
    for name in sorted(METRICS):
        for field in ("service", "agent", "run", "origin_task"):
            frame = run_metric(scenarios, name, filters=Filters(**{field: text}))
            if name == "run_summary" and field == "agent":
                continue  # one row per run in scope, whatever the agent
            assert frame.empty, (name, field, text)
    assert scenarios.execute("SELECT count(*) FROM spans").fetchone()[0] == stored


def test_prune_drops_unset_groups_and_keeps_set_conditions():
    sql = "SELECT * FROM t WHERE ($a::VARCHAR IS NULL OR x = $a::VARCHAR)\n  AND ($b IS NULL OR y IN (SELECT y FROM u WHERE z = $b))"
    assert prune_unset_filters(sql, {"a": None, "b": None}) == "SELECT * FROM t WHERE (TRUE)\n  AND (TRUE)"
    assert (
        prune_unset_filters(sql, {"a": "v", "b": None})
        == "SELECT * FROM t WHERE (x = $a::VARCHAR)\n  AND (TRUE)"
    )
    assert prune_unset_filters(sql, {"a": None, "b": 2}).endswith("AND (y IN (SELECT y FROM u WHERE z = $b))")


def test_prune_leaves_literals_comments_argument_lists_and_unknown_parameters_alone():
    sql = (
        "SELECT '($a IS NULL OR x)', coalesce($a IS NULL OR y, z) -- ($a IS NULL OR w)\n"
        "FROM t WHERE ($c IS NULL OR v) AND ($a IS NULL OR (p -- ) in a comment\n))"
    )
    pruned = prune_unset_filters(sql, {"a": None})
    assert pruned == (
        "SELECT '($a IS NULL OR x)', coalesce($a IS NULL OR y, z) -- ($a IS NULL OR w)\n"
        "FROM t WHERE ($c IS NULL OR v) AND (TRUE)"
    )
    kept = prune_unset_filters(sql, {"a": 1})
    assert kept.endswith("AND ((p -- ) in a comment\n))")


def test_query_df_binds_values_and_skips_parameters_only_named_in_comments():
    conn = duckdb.connect(":memory:")
    sql = "-- $ghost is documented here only\nSELECT 1 AS one WHERE ($v::VARCHAR IS NULL OR $v::VARCHAR = 'a''b')"
    assert len(query_df(conn, sql, {"v": None})) == 1
    assert len(query_df(conn, sql, {"v": "a'b"})) == 1
    assert query_df(conn, sql, {"v": "a' OR '1'='1"}).empty
    with pytest.raises(KeyError, match="v"):
        query_df(conn, sql.replace("($v::VARCHAR IS NULL OR ", "(").replace("'a''b')", "'x')"), {})
