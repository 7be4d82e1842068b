"""Calibration on the shipped labelled pairs and on a healthy baseline window."""

from __future__ import annotations

import json
import logging
import pathlib
from datetime import timedelta

import numpy as np
import pytest

from analytics import Filters, Window, run_metric
from analytics.calibration import (
    auroc,
    calibrate_from_baseline,
    calibrate_from_pairs,
    choose_point,
    read_pairs,
    roc_points,
)
from analytics.goals import goal_pairs
from analytics.thresholds import current_threshold, list_thresholds, store_threshold
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, new_db

logger = logging.getLogger(__name__)

PAIRS = pathlib.Path(__file__).resolve().parents[2] / "sample_traces" / "calibration" / "goal_pairs.csv"


def test_shipped_pairs_are_enough_and_balanced():
    roots, subtasks, labels = read_pairs(PAIRS)
    assert len(labels) >= 300
    assert 0.3 < labels.mean() < 0.7
    assert len(set(zip(roots, subtasks, strict=True))) == len(labels)


def test_auroc_and_roc_on_known_scores():
    labels = np.array([0, 0, 1, 1, 0, 1], dtype=bool)
    scores = np.array([0.1, 0.2, 0.8, 0.9, 0.85, 0.3])
    assert auroc(labels, scores) == pytest.approx(7 / 9)  # 7 of 9 (drifted, on-goal) pairs ordered
    assert auroc(labels, np.where(labels, 1.0, 0.0)) == 1.0
    points = roc_points(labels, scores)
    best = choose_point(points)
    assert best.tpr - best.fpr == pytest.approx(max(p.tpr - p.fpr for p in points))
    strict = choose_point(points, target_fpr=0.0)
    assert strict.fpr == 0.0 and strict.tp == 1  # only 0.9 lies above the on-goal 0.85
    assert list(scores > strict.threshold) == [False, False, False, True, False, False]


def test_calibration_on_shipped_pairs_reaches_auroc_and_is_used_by_detector():
    conn = new_db()
    result = calibrate_from_pairs(conn, PAIRS)
    logger.warning(
        "goal_divergence calibration: AUROC %.3f threshold %.3f precision %.3f recall %.3f fpr %.3f",
        result["auroc"], result["value"], result["precision"], result["recall"], result["fpr"],
    )  # fmt: skip
    print(f"AUROC={result['auroc']:.3f} threshold={result['value']:.3f}")
    assert result["auroc"] >= 0.85
    assert result["version"] == 1 and result["method"] == "youden_j"
    assert 0.0 < result["value"] < 2.0
    info = current_threshold(conn, "goal_divergence")
    assert info.calibrated and info.version == 1 and info.value == pytest.approx(result["value"])
    provenance = json.loads(info.provenance)
    assert provenance["pairs"] >= 300 and provenance["metrics"]["auroc"] == pytest.approx(result["auroc"])
    assert provenance["model"].endswith("all-MiniLM-L6-v2") and provenance["data_sha256"]

    insert_spans(conn, [
        make_span(0, agent_id="p", op="delegate", goal_root="Close the books for October",
                  goal_text="Reconcile October bank statements", delegate_to="acct"),
        make_span(1, agent_id="p", op="delegate", goal_root="Close the books for October",
                  goal_text="Train a puppy to sit and stay", delegate_to="puppy"),
    ])  # fmt: skip
    found = run_metric(conn, "goal_divergence")  # the drifted subtask only
    assert list(found["delegate_to"]) == ["puppy"]
    assert found.iloc[0].threshold_version == 1 and bool(found.iloc[0].calibrated)
    spread = run_metric(conn, "goal_divergence_distribution")  # both subtasks, counted
    assert spread["subtasks"].sum() == 2 and (spread["threshold_version"] == 1).all()

    strict = calibrate_from_pairs(conn, PAIRS, target_fpr=0.01)
    assert strict["version"] == 2 and strict["fpr"] <= 0.01 and strict["method"] == "target_fpr"
    assert current_threshold(conn, "goal_divergence").version == 2


def test_bad_pairs_file_gives_actionable_error(tmp_path):
    bad = tmp_path / "pairs.csv"
    bad.write_text("root_goal,subtask,label\na,b,1\n")
    with pytest.raises(ValueError, match="drifted"):
        read_pairs(bad)
    bad.write_text("root_goal,subtask,drifted\na,b,maybe\n")
    with pytest.raises(ValueError, match="pairs.csv:2"):
        read_pairs(bad)


SUBTASKS = [
    "List committed payroll and rent payments for the two quarters",
    "Collect expected customer receipts for the next six months",
    "Model the cash balance month by month for the next six months",
    "Run a downside scenario where receipts arrive 30 days late",
]


def test_baseline_calibration_skips_thresholds_with_too_little_data():
    conn = new_db()
    insert_spans(conn, [make_span(0, agent_id="a", op="delegate", goal_root="Close the books",
                                  goal_text="Reconcile the bank accounts")])  # fmt: skip
    result = calibrate_from_baseline(conn, Window())
    assert result["thresholds"] == {}
    assert "need at least 20" in result["skipped"]["goal_divergence"]
    assert current_threshold(conn, "goal_divergence").version == 0


def test_baseline_calibration_stores_quantile_thresholds_with_window():
    conn = new_db()
    rows = []
    for run in range(24):
        label = f"base-{run}"
        rows += [
            make_span(run * 100 + 0, run=label, agent_id="a", op="delegate", delegate_to="b",
                      goal_root="Prepare a cash-flow forecast for the next two quarters",
                      goal_text=SUBTASKS[run % len(SUBTASKS)]),
            make_span(run * 100 + 1, run=label, agent_id="b", tool_name="state_write", op="write",
                      state_key="k", state_version="v1", state_expected_version="v0",
                      outcome="ok" if run else "rejected", tool_args={"key": "k", "value": run}),
            make_span(run * 100 + 2, run=label, agent_id="b", tool_name="state_write", op="write",
                      state_key="k", state_version="v2", state_expected_version="v1", outcome="ok",
                      tool_args={"key": "k", "value": run + 10}),
        ]  # fmt: skip
    insert_spans(conn, rows)
    window = Window(since=BASE_TIME, until=BASE_TIME + timedelta(minutes=41))  # 1-minute buckets
    result = calibrate_from_baseline(conn, window, quantile=0.9)
    stored = result["thresholds"]
    assert {"goal_divergence", "rejection_rate", "near_duplicate_similarity"} <= set(stored)
    assert stored["goal_divergence"]["method"] == "quantile"
    info = current_threshold(conn, "goal_divergence")
    assert json.loads(info.provenance)["window"]["since"] == BASE_TIME.isoformat()
    assert 0.0 <= current_threshold(conn, "rejection_rate").value <= 1.0
    assert 0.5 <= current_threshold(conn, "near_duplicate_similarity").value <= 1.0
    assert current_threshold(conn, "count_per_run:lost_updates:crew").value == 0.0  # per crew
    divergences = goal_pairs(conn, window, Filters())["divergence"]  # every subtask's score
    assert stored["goal_divergence"]["value"] == pytest.approx(np.quantile(divergences, 0.9), abs=1e-4)
    assert stored["goal_divergence"]["n"] == 24
    above = int((divergences.round(4) > stored["goal_divergence"]["value"]).sum())
    assert above < 24 and len(run_metric(conn, "goal_divergence", window)) == above
    sigma = calibrate_from_baseline(conn, window, k_sigma=3.0)
    assert sigma["thresholds"]["goal_divergence"]["method"] == "mean_k_sigma"
    assert sigma["thresholds"]["goal_divergence"]["version"] == 2


def _loop_run(t: float, run: str, crew: str, loop: bool) -> list[dict]:
    """A run of crew ``crew``: one search, or the same search three times (a repeated_calls loop)."""
    searches = 3 if loop else 1
    return [make_span(t + i, run=run, ServiceName=crew, agent_id="researcher", tool_name="web_search",
                      tool_args={"query": f"{run} revenue 2024"}) for i in range(searches)]  # fmt: skip


def test_counts_calibrated_with_findings_are_per_crew():
    # A baseline where one crew's runs all hold a (false) loop: that crew may have one loop per
    # run afterwards; another crew's runs still fail on their first loop.
    conn = new_db()
    rows = []
    for i in range(12):
        rows += _loop_run(i * 10, f"noisy-{i}", "noisy", loop=True)
        rows += _loop_run(i * 10 + 5, f"quiet-{i}", "quiet", loop=False)
    insert_spans(conn, rows)
    window = Window(since=BASE_TIME, until=BASE_TIME + timedelta(minutes=5))
    result = calibrate_from_baseline(conn, window)
    assert result["thresholds"]["count_per_run:repeated_calls:noisy"]["value"] == 1.0
    assert result["thresholds"]["count_per_run:repeated_calls:quiet"]["value"] == 0.0
    assert not any(name == "count_per_run:repeated_calls" for name in result["thresholds"])
    later = _loop_run(3600, "noisy-new", "noisy", loop=True) + _loop_run(
        3700, "quiet-new", "quiet", loop=True
    )
    insert_spans(conn, later)
    after = Window(since=BASE_TIME + timedelta(minutes=30))
    verdicts = run_metric(conn, "run_summary", after).set_index("run_id")["verdict"].to_dict()
    assert verdicts == {"noisy-new": "healthy", "quiet-new": "failing"}
    # a crew with too few baseline runs gets no limit of its own (any finding counts)
    conn = new_db()
    insert_spans(conn, [span for i in range(4) for span in _loop_run(i * 10, f"few-{i}", "few", loop=True)])
    result = calibrate_from_baseline(conn, Window())
    assert "need at least 10" in result["skipped"]["count_per_run:repeated_calls:few"]
    assert run_metric(conn, "run_summary").set_index("run_id")["verdict"].eq("failing").all()


def test_thresholds_are_versioned_and_listed():
    conn = new_db()
    assert current_threshold(conn, "goal_divergence").version == 0
    store_threshold(conn, "rejection_rate", 0.3, "quantile", {"data": "x"})
    store_threshold(conn, "rejection_rate", 0.35, "quantile", {"data": "y"})
    listed = {row["name"]: row for row in list_thresholds(conn)}
    assert listed["rejection_rate"]["version"] == 2 and listed["rejection_rate"]["value"] == 0.35
    assert listed["goal_divergence"]["calibrated"] is False
    assert "uncalibrated" in listed["goal_divergence"]["provenance"]
