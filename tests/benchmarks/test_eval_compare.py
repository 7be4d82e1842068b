"""benchmarks/eval_compare.py: the ground truth it scores departures against, and its section of
docs/detection-quality.md kept when eval_frameworks rewrites the file."""

from __future__ import annotations

import json
from pathlib import Path

from analytics import read
from benchmarks.eval_compare import (
    BEGIN,
    END,
    Case,
    framework_truth,
    render_section,
    simulator_truth,
    simulator_truths,
    write_section,
)
from benchmarks.eval_frameworks import kept_sections
from corpus.truth import RunTruth, Subtask
from tests.fixtures_analytics import sample_traces_db

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_simulator_truth_is_the_first_failure_span_and_the_agents_it_names():
    truth = json.loads((SAMPLES / "ping_pong_unguarded.truth.json").read_text())
    conn = sample_traces_db(["ping_pong_unguarded"])
    spans = read.run_spans(conn, truth["run_id"]).to_dict("records")
    pos, agents = simulator_truth(truth, spans)
    first = truth["ping_pong"][0]["span_ids"]
    assert spans[pos]["span_id"] in first and all(s["span_id"] not in first for s in spans[:pos])
    assert agents == ["planner", "worker"]


def test_a_record_naming_no_span_starts_at_its_agents_first_call_of_its_tool():
    truth = {"runaway_steps": [{"agent": "researcher", "tool": "search_web", "steps": 12}], "waivers": []}
    spans = [
        {"span_id": "a", "agent_id": None, "tool_name": None},
        {"span_id": "b", "agent_id": "researcher", "tool_name": None},
        {"span_id": "c", "agent_id": "writer", "tool_name": "search_web"},
        {"span_id": "d", "agent_id": "researcher", "tool_name": "search_web"},
    ]
    assert simulator_truth(truth, spans) == (3, ["researcher"])


def test_the_simulator_runs_are_the_scenarios_and_their_crews_healthy_runs():
    truths = simulator_truths()
    scenarios = [t for t in truths if "failure_injected" not in t]
    crews = [t for t in truths if t.get("failure_injected") is False]
    assert len(scenarios) == 18 and len(crews) == 8 * 18 and len(truths) == len(scenarios) + len(crews)
    assert {(t["scenario"], t["variant"]) for t in crews} == {
        (t["scenario"], t["variant"]) for t in scenarios
    }


def test_framework_truth_by_failure():
    spans = [
        {"agent_id": "manager", "tool_name": None},
        {"agent_id": "manager", "tool_name": "ask"},
        {"agent_id": "researcher", "tool_name": None},
        {"agent_id": "researcher", "tool_name": "web_search"},
        {"agent_id": "graph", "tool_name": None},  # not a crew agent: does not break a turn
        {"agent_id": "manager", "tool_name": "ask"},
        {"agent_id": "researcher", "tool_name": None},
    ]
    crew = ["manager", "researcher", "analyst"]
    task = [Subtask("researcher", "find it")]
    assert framework_truth(RunTruth("r", "retry_loop", "t", subtasks=task), spans, crew) == (
        3,
        ["researcher"],
    )
    assert framework_truth(RunTruth("r", "redelegation", "t", subtasks=task), spans, crew) == (
        6,
        ["manager", "researcher"],
    )
    assert framework_truth(RunTruth("r", "ping_pong", "t", subtasks=task), spans, crew)[0] == 2
    off = [Subtask("researcher", "pizza", off_topic=True)]
    assert framework_truth(RunTruth("r", "off_topic_task", "t", subtasks=off), spans, crew) == (
        2,
        ["manager", "researcher"],
    )


def test_the_section_replaces_its_markers_and_eval_frameworks_keeps_it(tmp_path):
    report = tmp_path / "detection-quality.md"
    report.write_text("# Detection quality\n\nframeworks\n")
    cases = [
        Case("crewai", "retry-loop", "r1", "retry_loop", ["Researcher"], 4, 4, "Researcher", "step", 11, 2)
    ]
    write_section(report, render_section(cases))
    write_section(report, render_section(cases))  # replaced, not appended twice
    text = report.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.startswith("# Detection quality")
    assert "| crewai | 1 | 1/1 (100%) | 1/1 (100%) | - | 11 |" in text
    kept = kept_sections(report)
    assert kept.strip().startswith(BEGIN) and kept.strip().endswith(END)
