"""runaway_runs: runs (and agents) far over their crew's usual span count, without a budget."""

from __future__ import annotations

import random
from datetime import timedelta

import duckdb
import numpy as np
import pandas as pd
import pytest

from analytics import Filters, Window, run_metric
from analytics.calibration import calibrate_from_baseline
from analytics.runaway import (
    AGENT_THRESHOLD,
    MEDIAN_MIN_SPANS,
    RUN_THRESHOLD,
    UNCALIBRATED_FACTOR,
    UNCALIBRATED_FLOOR,
    UNCALIBRATED_MIN_RUNS,
    _limits,
)
from analytics.thresholds import current_threshold
from driftscope.database import migrate
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, new_db


def _run(run: str, t0: float, calls: int, agent: str = "researcher", **fields) -> list[dict]:
    return [
        make_span(t0 + i * 0.01, run=run, agent_id=agent, tool_name="search_web",
                  tool_args={"query": f"topic {i}"}, outcome="ok", **fields)
        for i in range(calls)
    ]  # fmt: skip


def _crew(runaway_calls: int, budget: bool = False) -> list[dict]:
    rows = []
    for k in range(8):
        rows += _run(f"run-{k}", k * 100, 20)
    extra = dict(budget_max_steps=500, step=1) if budget else {}
    rows += _run("run-runaway", 900, runaway_calls, **extra)
    return rows


def test_a_run_far_over_its_crews_median_is_a_runaway_uncalibrated():
    conn = new_db()
    insert_spans(conn, _crew(300))
    found = run_metric(conn, "runaway_runs")
    assert list(found["run_id"]) == ["run-runaway", "run-runaway"]  # the run and its agent
    whole = found[found["agent"].isna()].iloc[0]
    assert (
        whole.spans == 300 and whole.limit == UNCALIBRATED_FACTOR * 20 and whole.baseline == "window_median"
    )
    assert not whole.calibrated and len(whole.span_ids) == 20 and whole.ratio == 300 / 80
    assert set(found["agent"].dropna()) == {"researcher"}
    # the filters select findings, never what counts as usual
    for run in ["run-runaway", *(f"run-{k}" for k in range(8))]:
        filtered = run_metric(conn, "runaway_runs", filters=Filters(run=run))
        restricted = found[found["run_id"] == run]
        assert filtered.to_dict("records") == restricted.to_dict("records"), run
    assert len(run_metric(conn, "runaway_runs", filters=Filters(agent="researcher"))) == 1


def test_a_run_with_a_step_budget_or_a_crew_with_few_runs_is_no_runaway():
    conn = new_db()
    insert_spans(conn, _crew(300, budget=True))
    assert run_metric(conn, "runaway_runs").empty
    conn = new_db()
    insert_spans(conn, _run("run-a", 0, 20) + _run("run-b", 100, 400))  # two runs: nothing is usual
    assert run_metric(conn, "runaway_runs").empty
    conn = new_db()
    small = [row for k in range(8) for row in _run(f"run-{k}", k * 100, 5)]
    insert_spans(conn, small + _run("run-long", 900, 24))  # under the floor of 25 spans
    assert run_metric(conn, "runaway_runs").empty


def test_calibrated_limit_from_a_healthy_baseline_and_the_run_verdict():
    conn = new_db()
    healthy = []
    for k in range(12):
        healthy += _run(f"base-{k}", k * 100, 10 + k)
    insert_spans(conn, healthy)
    end = BASE_TIME + timedelta(seconds=1200)
    result = calibrate_from_baseline(conn, Window(until=end))
    name = f"{RUN_THRESHOLD}:crew"
    assert name in result["thresholds"]
    limit = current_threshold(conn, name).value
    assert 40 < limit < 50  # 2 x the 0.99 quantile of 10..21 spans
    insert_spans(conn, _run("later-ok", 1500, 40) + _run("later-runaway", 1600, 60))
    found = run_metric(conn, "runaway_runs", Window(since=end))
    assert set(found["run_id"]) == {"later-runaway"} and found["calibrated"].all()
    verdicts = run_metric(conn, "run_summary", Window(since=end)).set_index("run_id")["verdict"]
    assert verdicts["later-runaway"] == "failing" and verdicts["later-ok"] == "healthy"


def _limits_row_by_row(counts: pd.DataFrame, calibrated: dict) -> pd.DataFrame:
    """The crew limits as their definition reads, one row at a time (the reference)."""
    out = counts.copy()
    rows = list(out.itertuples(index=False))
    typical = [r for r in rows if r.spans >= MEDIAN_MIN_SPANS and isinstance(r.service, str)]

    def median(crew, whole):
        values = [r.spans for r in typical if r.service == crew and r.whole_run == whole]
        return float(np.median(values)) if values else np.nan

    limits, baselines, versions = [], [], []
    for r in rows:
        runs = sum(1 for t in typical if t.service == r.service and t.whole_run)
        enough = isinstance(r.service, str) and runs >= UNCALIBRATED_MIN_RUNS
        limit = max(UNCALIBRATED_FACTOR * median(r.service, r.whole_run), UNCALIBRATED_FLOOR)
        limit, baseline, version = (limit, "window_median", 0) if enough else (np.inf, "none", 0)
        name = f"{RUN_THRESHOLD if r.whole_run else AGENT_THRESHOLD}:{r.service}"
        if name in calibrated:
            (limit, version), baseline = calibrated[name], "calibrated"
        limits.append(float(limit))
        baselines.append(baseline)
        versions.append(version)
    out["limit"], out["baseline"], out["threshold_version"] = limits, baselines, versions
    return out


@pytest.mark.parametrize("seed", range(6))
def test_crew_limits_equal_their_row_by_row_definition(seed):
    """``_limits`` works on crew codes (fast at 500,000 rows); it must equal the plain reading:
    medians of typical runs and agents per crew, enough runs, calibrated names, rows without crew."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    crews = ["crew-a", "crew-b", "crew-c", None][: int(rng.integers(1, 5))]
    counts = pd.DataFrame(
        {
            "run_id": [f"run-{i // 3}" for i in range(n)],
            "service": pd.array([crews[i] for i in rng.integers(0, len(crews), n)], dtype="str"),
            "spans": rng.integers(1, 60, n),
            "whole_run": rng.random(n) < 0.4,
        }
    )
    calibrated = {}
    for crew in ["crew-a", "crew-c", "nan"]:
        if rng.random() < 0.5:
            calibrated[f"{RUN_THRESHOLD}:{crew}"] = (float(rng.integers(5, 50)), int(rng.integers(1, 9)))
        if rng.random() < 0.5:
            calibrated[f"{AGENT_THRESHOLD}:{crew}"] = (float(rng.integers(5, 50)), int(rng.integers(1, 9)))
    pd.testing.assert_frame_equal(_limits(counts, calibrated), _limits_row_by_row(counts, calibrated))


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_the_findings_table_after_every_batch_equals_a_full_recomputation(tmp_path, seed, monkeypatch):
    """Batches grow runs past their crew's limit, start new runs (moving the median), add agents
    and runs with a budget, and some bring spans older than a run's evidence (late exporters):
    after each one, the materializer's table (and a read under a window or filter) equals
    counting every run again. Evidence the table holds is taken again where no new span of its
    run starts before its end (it was every flagged run's spans numbered again each time)."""
    from analytics import materialize, runaway
    from analytics.registry import compute_metric
    from analytics.types import direct_write
    from tests.analytics.test_materialize import _commit

    kept_evidence = runaway._kept_evidence
    reused: list[int] = []

    def counting(conn):
        kept = kept_evidence(conn)
        reused.append(len(kept))
        return kept

    monkeypatch.setattr(runaway, "_kept_evidence", counting)
    rng = random.Random(seed)
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    scopes = [(Window(), Filters()), (Window(since=BASE_TIME + timedelta(seconds=300)), Filters()),
              (Window(), Filters(agent="coder")), (Window(), Filters(run="run-2"))]  # fmt: skip
    runs = [f"run-{k}" for k in range(6)]
    _commit(conn, [s for k, run in enumerate(runs) for s in _run(run, k * 100, 20)])
    found = 0
    for batch in range(7):
        if rng.random() < 0.3:
            runs.append(f"run-{len(runs)}")
        rows = []
        if batch == 6:  # last: a new short run after the others: every flagged run's evidence holds
            rows += _run(f"run-{len(runs)}", 5000, 3)
        for _ in range(rng.randint(1, 3) if batch < 6 else 0):
            run = rng.choice(runs)
            budget = dict(budget_max_steps=500, step=1) if rng.random() < 0.1 else {}
            agent = rng.choice(["researcher", "coder"])
            t0 = 1000 + batch * 100 + rng.random() * 50
            if batch and rng.random() < 0.3:  # a late exporter: before the runs' evidence
                t0 = rng.random() * 600
            rows += _run(run, t0, rng.choice([3, 10, 40, 150]), agent=agent, **budget)
        _commit(conn, rows)
        cursor = conn.cursor()
        materialize.bring_up_to_date(cursor, direct_write(conn), ["runaway_runs"])
        cursor.close()
        assert run_metric(conn, "runaway_runs").attrs.get("source") == "table"
        for window, filters in scopes:
            got = run_metric(conn, "runaway_runs", window, filters)
            full = compute_metric(conn, "runaway_runs", window, filters)
            # values compared (a table's text and count columns type otherwise than a frame's)
            pd.testing.assert_frame_equal(
                _canonical(got).astype(object), _canonical(full).astype(object), obj=f"batch {batch}"
            )
            found += len(full)
    assert found  # the batches make runaway runs: equality is about rows, not two empty tables
    assert reused[-1]  # and the last batch took their evidence from the table


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out["span_ids"] = [repr(list(v)) for v in out["span_ids"]]
    return out.sort_values(["first_seen", "run_id", "agent"], na_position="first").reset_index(drop=True)
