"""Detector findings as evidence of where a run departs (issue 35, analytics.compare_findings):
a failure in a span's contents (a dropped constraint, a drifted subtask) takes the same step as a
healthy run, and the detectors' findings place the departure there; a finding after the first
step no healthy run takes, or one over several spans, does not move it."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from analytics import compare_findings
from analytics.compare import compare_run
from collector.files import ingest_files
from driftscope.database import migrate

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
CREWS = SAMPLES / "crews"
SCENARIOS = ("constraint_drop", "goal_drift", "context_drift", "ping_pong")


def _truth(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.truth.json").read_text())


@pytest.fixture(scope="module")
def db() -> duckdb.DuckDBPyConnection:
    """The unguarded failure runs of four scenarios with their crews' healthy runs."""
    names = [f"{s}_unguarded" for s in SCENARIOS]
    paths = [SAMPLES / f"{n}.json" for n in names] + [CREWS / f"{n}.jsonl" for n in names]
    conn = duckdb.connect(":memory:")
    migrate(conn)
    result = ingest_files(None, paths, conn=conn)
    assert not result.errors and result.rejected == 0
    return conn


def test_a_dropped_constraint_departs_at_the_hand_off_that_dropped_it(db):
    truth = _truth("constraint_drop_unguarded")
    answer = compare_run(db, truth["run_id"])
    departure = answer["departure"]
    dropped = truth["constraint_drops"][0]
    assert departure["span_id"] == dropped["span_id"] and departure["agent"] == dropped["from_agent"]
    assert departure["evidence"] == "finding" and departure["metric"] == "constraint_drops"
    # no step departs: the hand-off is the step every healthy run takes there
    assert departure["step_departure"] is None and departure["expected"] == [departure["step"]]
    finding = [d for d in answer["differences"] if d["kind"] == "finding"]
    assert [(d["agent"], d["span_ids"]) for d in finding] == [(dropped["from_agent"], [dropped["span_id"]])]


def test_a_drifted_subtask_departs_at_the_first_drifted_hand_off(db):
    truth = _truth("goal_drift_unguarded")
    answer = compare_run(db, truth["run_id"])
    first = truth["drifted_subtasks"][0]
    assert answer["departure"]["span_id"] == first["span_id"]
    assert answer["departure"]["agent"] == first["agent"]
    assert answer["departure"]["metric"] == "goal_divergence"
    named = {s for d in answer["differences"] if d["kind"] == "finding" for s in d["span_ids"]}
    assert named == {d["span_id"] for d in truth["drifted_subtasks"]}


def test_a_finding_after_the_first_step_no_healthy_run_takes_does_not_move_the_departure(db):
    truth = _truth("context_drift_unguarded")
    answer = compare_run(db, truth["run_id"])
    departure = answer["departure"]
    # The manager changes the policy mid-run, which no healthy run does, before the stale send.
    assert departure["evidence"] == "step" and departure["agent"] == "manager"
    send = truth["stale_policy_sends"][0]
    stale = [d for d in answer["differences"] if d["kind"] == "finding"]
    assert [(d["agent"], d["span_ids"]) for d in stale] == [(send["agent"], [send["span_id"]])]


def test_a_finding_over_several_spans_leaves_the_departure_at_the_step(db):
    truth = _truth("ping_pong_unguarded")
    answer = compare_run(db, truth["run_id"])
    # ping_pong names every hand-off of the exchange; the first is one healthy runs make too
    assert answer["departure"]["evidence"] == "step"
    assert answer["departure"]["span_id"] == truth["ping_pong"][0]["span_ids"][1]
    assert any(d["kind"] == "finding" and d["span_ids"][0] == truth["ping_pong"][0]["span_ids"][0]
               for d in answer["differences"])  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_failing_run_compared_with_itself_has_no_differences(db, scenario):
    run = _truth(f"{scenario}_unguarded")["run_id"]
    answer = compare_run(db, run, baseline=run)
    assert answer["departure"] is None and answer["differences"] == []


def test_the_departure_is_the_earlier_of_the_step_and_a_one_span_finding():
    found = pd.DataFrame(
        {
            "metric": ["constraint_drops"],
            "title": ["t"],
            "failure_mode": ["m"],
            "pos": [2],
            "span_ids": [["s2"]],
            "review": [False],
        }
    )
    steps = pd.DataFrame({
        "pos": [0, 1, 2], "span_id": ["s0", "s1", "s2"], "trace_id": ["t"] * 3, "agent": ["a", "a", "b"],
        "operation": ["x"] * 3, "tool": ["", "", "hand"], "arg_shape": [""] * 3, "status": [""] * 3,
    })  # fmt: skip
    step = {"pos": 1, "span_id": "s1", "step": "a · x", "reason": "r", "covered_by": 3}
    assert compare_findings.earliest(step, found, steps, 3)["evidence"] == "step"
    later = {**step, "pos": 2, "span_id": "s2"}
    moved = compare_findings.earliest(later, found.assign(pos=1, span_ids=[["s1"]]), steps, 3)
    assert moved["span_id"] == "s1" and moved["evidence"] == "finding"
    assert moved["step_departure"]["span_id"] == "s2" and moved["covered_by"] == 3
    # a finding over several spans does not place it
    several = found.assign(pos=1, span_ids=[["s1", "s2"]])
    assert compare_findings.earliest(later, several, steps, 3)["evidence"] == "step"
    assert compare_findings.earliest(None, several, steps, 3) is None
    assert compare_findings.earliest(None, found.iloc[:0], steps, 3) is None


def test_healthy_runs_carry_findings_only_under_a_crews_calibrated_count():
    counted = compare_findings.count_columns(["repeated_calls_count", "goal_divergence_count", "x"])
    assert counted == {"repeated_calls": "repeated_calls_count"}  # goal_divergence is not counted
    healthy = pd.DataFrame({"run_id": ["a", "b"], "repeated_calls_count": [0, 2]})
    assert compare_findings.baseline_detectors(healthy) == {"repeated_calls"}
    assert compare_findings.baseline_detectors(healthy.assign(repeated_calls_count=0)) == set()
