"""A window's result of a run-partitioned detector, derived from the whole store's kept or stored
result (analytics/window_scope.py), equals computing it for the window."""

from __future__ import annotations

import random
from datetime import timedelta

import duckdb
import pytest

from analytics import Filters, Window, kept, kept_worker, run_metric, summary
from analytics.types import direct_write
from tests.analytics.test_kept import _assert_same, _full, _loop_batch, random_store
from tests.analytics.test_summary import _random_batch
from tests.fixtures_analytics import BASE_TIME, insert_spans

PARTITIONED = sorted(name for name, column in kept.PARTITIONS.items() if column == "run_id")


def _windows(rng: random.Random) -> list[Window]:
    """Windows whose edges cut through runs, open on one side, or hold nothing."""
    at = [BASE_TIME + timedelta(seconds=s) for s in sorted(rng.sample(range(0, 50), 4))]
    return [Window(since=at[0], until=at[2]), Window(since=at[1]), Window(until=at[3]),
            Window(since=BASE_TIME + timedelta(days=1))]  # fmt: skip


def _random_store(tmp_path, seed: int) -> tuple[duckdb.DuckDBPyConnection, random.Random]:
    rng = random.Random(seed)
    conn, _ = random_store(tmp_path, rng, batches=5, most_runs=7)
    return conn, rng


@pytest.mark.parametrize(
    "seed",  # make test: one seed; make test-deep: three
    [pytest.param(0, marks=pytest.mark.slow), *(pytest.param(s, marks=pytest.mark.deep) for s in (1, 2))],
)
def test_a_window_result_derived_from_the_kept_whole_store_equals_computing_the_window(tmp_path, seed):
    conn, rng = _random_store(tmp_path, seed)
    kept.clear_cache()
    runs = (Filters(run="run-1"), Filters(run="run-1", agent="a"))  # a run filter: that run's rows
    scopes = [
        (window, filters) for window in _windows(rng) for filters in (Filters(), Filters(agent="a"), *runs)
    ]
    scopes += [(Window(), filters) for filters in runs]
    for name in PARTITIONED:  # nothing at hand: the window is computed (nothing derived)
        before = kept.stats["window_derived"]
        _assert_same(run_metric(conn, name, *scopes[0]), _full(conn, name, *scopes[0]), name)
        assert kept.stats["window_derived"] == before, name
    for filters in (Filters(), Filters(agent="a")):
        for name in PARTITIONED:
            run_metric(conn, name, Window(), filters)  # the whole store's result, kept
    before = kept.stats["window_derived"]
    for window, filters in scopes:
        for name in PARTITIONED:
            _assert_same(run_metric(conn, name, window, filters), _full(conn, name, window, filters), name)
    assert kept.stats["window_derived"] > before  # (a window without findings is computed)
    # new spans: the whole store's result is brought up to date first
    insert_spans(conn, _random_batch(rng, 5, ["run-0", "run-new"]) + _loop_batch(rng, 5, ["run-0"]))
    for window, filters in scopes:
        for name in PARTITIONED:
            _assert_same(run_metric(conn, name, window, filters), _full(conn, name, window, filters), name)


def test_a_fresh_process_derives_windows_from_the_stored_results_and_the_summary_agrees(tmp_path):
    conn, rng = _random_store(tmp_path, 7)
    kept.clear_cache()
    summary.clear_cache()
    kept_worker.refresh(conn)
    assert kept_worker.store(conn, direct_write(conn)) == len(kept.KEPT) + 1
    kept.clear_cache()  # a fresh process: the stored results, nothing kept
    summary.clear_cache()
    window = _windows(rng)[0]
    before, decoded = kept.stats["window_derived"], kept.stats["loaded_runs"]
    for name in PARTITIONED:
        _assert_same(run_metric(conn, name, window), _full(conn, name, window, Filters()), name)
    assert kept.stats["window_derived"] > before
    assert kept.stats["loaded_runs"] > decoded  # only the window's runs of a stored result decoded
    for name in PARTITIONED:  # a run filter (the run explorer): that run's stored rows
        for window_of_run in (Window(), window):
            scope = Filters(run="run-1")
            _assert_same(
                run_metric(conn, name, window_of_run, scope), _full(conn, name, window_of_run, scope), name
            )
    assert not any(kept.is_kept(conn, name, Window(), Filters()) for name in PARTITIONED)
    _assert_same(
        run_metric(conn, "run_summary", window), _full(conn, "run_summary", window, Filters()), "summary"
    )


def test_a_derived_window_is_kept_and_brought_up_to_date_by_the_runs_new_spans_touch(tmp_path):
    conn, rng = _random_store(tmp_path, 11)
    kept.clear_cache()
    window = Window(since=BASE_TIME + timedelta(seconds=20))  # open-ended: new spans land inside
    for name in PARTITIONED:
        run_metric(conn, name, Window(), Filters())  # the whole store's result, kept
    derived = {}
    for name in PARTITIONED:
        before = kept.stats["window_derived"]
        derived[name] = run_metric(conn, name, window)
        _assert_same(derived[name], _full(conn, name, window, Filters()), name)
        if kept.stats["window_derived"] == before:  # no finding in the window: computed, and kept
            continue
        # asked again (a report's page, then its run summary): the kept window, not derived again
        unchanged = kept.stats["unchanged"]
        _assert_same(run_metric(conn, name, window), derived[name], name)
        assert kept.stats["window_derived"] == before + 1, name
        assert kept.stats["unchanged"] == unchanged + 1, name
    assert any(kept.is_kept(conn, name, window, Filters()) for name in PARTITIONED)
    insert_spans(conn, _random_batch(rng, 5, ["run-0", "run-new"]) + _loop_batch(rng, 5, ["run-0"]))
    for name in PARTITIONED:
        before = kept.stats["window_derived"]
        _assert_same(run_metric(conn, name, window), _full(conn, name, window, Filters()), name)
        assert kept.stats["window_derived"] == before, name  # brought up to date, not derived
