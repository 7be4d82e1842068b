"""Run comparison on the simulator's crews (issue 35): a scenario's failure run beside the healthy
runs of its own crew (sample_traces/crews/), not beside another crew's."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from analytics.compare import compare_run
from analytics.registry import run_metric
from analytics.types import Filters, Window
from collector.files import ingest_files
from driftscope.database import migrate

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
CREWS = SAMPLES / "crews"
SCENARIOS = ("recursion_loop", "ping_pong")


def _truth(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.truth.json").read_text())


def _crew(name: str) -> list[dict]:
    return json.loads((CREWS / f"{name}.truth.json").read_text())


@pytest.fixture(scope="module")
def db() -> duckdb.DuckDBPyConnection:
    """Two scenarios' failure runs with their crews' healthy runs, and the healthy script's runs."""
    names = [f"{s}_{v}" for s in (*SCENARIOS, "healthy") for v in ("unguarded", "guarded")]
    paths = [SAMPLES / f"{n}.json" for n in names]
    paths += [CREWS / f"{n}.jsonl" for n in names if not n.startswith("healthy")]
    conn = duckdb.connect(":memory:")
    migrate(conn)
    result = ingest_files(None, paths, conn=conn)
    assert not result.errors and result.rejected == 0
    return conn


def test_the_crews_runs_are_healthy(db):
    verdicts = run_metric(db, "run_summary", Window(), Filters(), ["run_id", "verdict"])
    ok = verdicts[verdicts["run_id"].str.contains("-ok-")]
    assert len(ok) == 8 * 2 * len(SCENARIOS)
    assert set(ok["verdict"]) == {"healthy"}


def test_a_retry_loop_departs_at_its_first_failing_call_against_its_crew(db):
    truth = _truth("recursion_loop_unguarded")
    answer = compare_run(db, truth["run_id"])
    # its crew's unguarded runs (the same calls), not the guarded ones (a check before each)
    assert answer["baseline"]["closest_run"] in {t["run_id"] for t in _crew("recursion_loop_unguarded")}
    departure = answer["departure"]
    assert departure["agent"] == "analyst" and departure["status"] == "error"
    assert departure["span_id"] == truth["looped_calls"][0]["span_ids"][0]


def test_a_ping_pong_departs_where_the_worker_hands_the_task_back(db):
    truth = _truth("ping_pong_unguarded")
    answer = compare_run(db, truth["run_id"])
    assert answer["baseline"]["closest_run"] in {t["run_id"] for t in _crew("ping_pong_unguarded")}
    departure = answer["departure"]
    assert departure["agent"] == "worker" and departure["tool"] == "delegate -> planner"
    assert departure["span_id"] == truth["ping_pong"][0]["span_ids"][1]


@pytest.mark.parametrize("name", [f"{s}_{v}" for s in SCENARIOS for v in ("unguarded", "guarded")])
def test_a_healthy_run_of_a_crew_does_not_depart_from_its_others(db, name):
    run_id = _crew(name)[-1]["run_id"]
    answer = compare_run(db, run_id)
    assert run_id not in answer["baseline"]["run_ids"]
    assert answer["departure"] is None
