"""Pure functions behind the pages: figures (and their escaping), windows, tiles, thresholds, ROC."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
import pytest

from analytics.read import describe_metrics
from analytics.types import Window
from dashboard.calibration import roc_points
from dashboard.figures import (
    constraint_heatmap_figure,
    divergence_histogram_figure,
    goal_divergence_figure,
    rejection_rate_figure,
    roc_figure,
)
from dashboard.figures_run import (
    delegation_graph_figure,
    delegation_levels,
    version_timeline_figure,
    waterfall_figure,
)
from dashboard.filters import describe_window, run_link, window_for
from dashboard.findings import findings_from_frame

XSS = "<script>alert(1)</script>"
# The registry's metric descriptions, as the read API serves them.
DESCRIBED = {m["name"]: m for m in describe_metrics()}
T0 = datetime(2026, 1, 15, 9)


def _spans() -> pd.DataFrame:
    rows = []
    for i, (agent, op, to, outcome) in enumerate(
        [
            (XSS, "delegate", "bob", "ok"),
            ("bob", "delegate", "carol", "rejected"),
            ("carol", "read", None, "ok"),
        ]
    ):
        start = 1_768_467_600_000_000_000 + i * 1_000_000_000
        rows.append(
            {
                "span_id": f"{i:016x}", "span_name": f"tool {XSS}", "agent_id": agent, "op": op,
                "delegate_to": to, "hop": i + 1, "outcome": outcome, "status_code": "Unset", "tool_name": XSS,
                "reject_reason": None, "start_ns": start, "end_ns": start + 500_000_000,
                "Timestamp": T0 + timedelta(seconds=i), "state_key": "k" if op == "read" else None,
                "state_version": XSS, "state_expected_version": None,
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


def test_run_figures_escape_span_text():
    spans = _spans()
    figures = [
        waterfall_figure(spans, {"0000000000000000"}),
        delegation_graph_figure(spans, {"bob"}),
        version_timeline_figure(spans, "k"),
    ]
    for fig in figures:
        text = fig.to_json()
        assert "<script>" not in text
        assert "&lt;script&gt;" in text


def test_waterfall_marks_failed_spans_red_and_evidence_orange():
    fig = waterfall_figure(_spans(), {"0000000000000000"})
    assert list(fig.data[0].marker.color) == ["#ff7f0e", "#d62728", "#1f77b4"]
    assert list(fig.data[0].base) == [0.0, 1000.0, 2000.0]


def test_delegation_levels_layer_chains_and_survive_cycles():
    assert delegation_levels([("a", "b"), ("b", "c")], ["a", "b", "c"]) == {"a": 0, "b": 1, "c": 2}
    assert delegation_levels([("a", "b"), ("b", "a")], ["a", "b"]) == {"a": 0, "b": 1}


def test_rejection_rate_figure_draws_threshold_and_only_refusing_series():
    frame = pd.DataFrame(
        {
            "bucket_start": [T0, T0, T0 + timedelta(hours=1)],
            "tool_name": ["write_state", "read_state", "write_state"],
            "attempts": [4, 5, 2], "rejections": [1, 0, 2],
            "threshold": 0.25, "calibrated": False, "threshold_version": 0,
        }
    )  # fmt: skip
    fig = rejection_rate_figure(frame)
    assert [t.name for t in fig.data] == ["write_state"]
    assert list(fig.data[0].y) == [0.25, 1.0] and fig.data[0].type == "bar"  # a rate per bucket, no diagonal
    assert fig.layout.shapes[0].y0 == 0.25
    assert "uncalibrated default" in fig.layout.annotations[0].text


def test_constraint_heatmap_codes_statuses_and_escapes_reasons():
    ledger = pd.DataFrame(
        {
            "origin_task_id": "T", "constraint_id": ["C1", "C1", "C2", "C2"], "hop": [1, 2, 1, 2],
            "status": ["carried", "waived", "carried", "missing"], "waiver_reason": [None, XSS, None, None],
        }
    )  # fmt: skip
    fig = constraint_heatmap_figure(ledger, "T")
    assert [list(row) for row in fig.data[0].z] == [[0, 1], [0, 3]]
    assert "<script>" not in fig.to_json()


def test_goal_and_histogram_figures_carry_the_threshold():
    frame = pd.DataFrame(
        {"origin_task_id": ["T", "T"], "run_id": "r", "hop": [1, 2], "divergence": [0.2, 0.8], "subtask": [XSS, "b"],
         "threshold": 0.45, "calibrated": True, "threshold_version": 3}
    )  # fmt: skip
    fig = goal_divergence_figure(frame)
    assert fig.layout.shapes[-1].y0 == 0.45 and "calibrated v3" in fig.layout.annotations[0].text
    assert "<script>" not in fig.to_json()
    hist = divergence_histogram_figure(frame["divergence"], 0.45, "t")
    assert [list(t.y) for t in hist.data] == [[1], [1]]  # one subtask on each side, as bin counts
    assert [t.name for t in hist.data] == ["at or below threshold", "above threshold"]
    assert abs(hist.data[0].x[0] - 0.21) < 1e-9 and abs(hist.data[1].x[0] - 0.81) < 1e-9


def test_window_presets_round_now_and_all_time_is_open():
    now = datetime(2026, 1, 15, 9, 30, 17, 500)
    assert window_for("Last 15 min", now) == Window(since=datetime(2026, 1, 15, 9, 15, 10))
    assert window_for("Last 24 h", now).since == datetime(2026, 1, 14, 9, 30, 10)
    assert window_for("All time", now) == Window()
    assert window_for("Custom", now, T0, T0 + timedelta(hours=1)) == Window(T0, T0 + timedelta(hours=1))
    assert describe_window(Window()) == "all time"
    with pytest.raises(ValueError, match="Last 1 h"):
        window_for("yesterday", now)


def test_run_link_quotes_the_run_id():
    assert run_link("run a/b?c") == "run_explorer?run=run%20a%2Fb%3Fc"
    assert run_link(None) is None


def test_flagged_detectors_only_report_flagged_rows():
    frame = pd.DataFrame(
        {"run_id": ["r1", "r2"], "span_ids": [["a"], ["b"]], "agent": ["x", "y"], "allowed": [True, False]}
    )
    found = findings_from_frame(DESCRIBED["stale_policy_sends"], frame)
    assert [(f.run_id, f.agents, f.span_ids, f.status) for f in found] == [("r1", ["x"], ["a"], "failure")]
    budget = findings_from_frame(DESCRIBED["budget_exhaustion"], frame)
    assert len(budget) == 2 and budget[0].mast_category == "specification"
    assert {f.status for f in budget} == {"warning"}  # a budget stop is caught, not a failure


def test_finding_status_follows_the_metric_record():
    holders = pd.DataFrame({"run_id": ["r1", "r2"], "span_ids": [["a"], ["b"]], "refreshed": [True, False]})
    found = findings_from_frame(DESCRIBED["context_drift_holders"], holders)
    assert [f.status for f in found] == ["warning", "failure"]  # failing unless refreshed
    drift = pd.DataFrame(
        {"run_id": ["r1", "r2", "r3"], "span_ids": [["a"], ["b"], ["c"]], "drifted": [True, True, False],
         "calibrated": [False, True, True]}
    )  # fmt: skip
    found = findings_from_frame(DESCRIBED["goal_divergence"], drift)
    assert [f.status for f in found] == ["to review (threshold not calibrated)", "failure"]


def test_roc_points_from_provenance():
    points, auc = roc_points(
        {"metrics": {"roc": {"fpr": [0, 0.1, 1], "tpr": [0, 0.8, 1], "thresholds": [1, 0.4, 0]}, "auc": 0.93}}
    )
    assert list(points["tpr"]) == [0, 0.8, 1] and auc == 0.93
    assert roc_points({"note": "default"}) == (None, None)
    fig = roc_figure(points, 0.4, auc)
    assert list(fig.data[-1].x) == [0.1] and "0.930" in fig.layout.title.text


def test_figures_of_large_frames_are_aggregated():
    """Many chains, scores or holds: figures carry aggregates, not a trace or bar per row."""
    from dashboard.figures import holders_figure

    n = 20_000
    frame = pd.DataFrame(
        {"origin_task_id": [f"T{i // 4}" for i in range(n)], "run_id": "r", "hop": [i % 4 for i in range(n)],
         "divergence": [(i % 100) / 100 for i in range(n)], "subtask": XSS, "threshold": 0.45,
         "calibrated": False, "threshold_version": 0}
    )  # fmt: skip
    fig = goal_divergence_figure(frame)
    assert [t.name for t in fig.data] == ["median", "p90", "max"] and list(fig.data[2].x) == [0, 1, 2, 3]
    assert "5,000 chains" in fig.layout.title.text
    hist = divergence_histogram_figure(frame["divergence"], 0.45, "t")
    assert sum(sum(t.y) for t in hist.data) == n and sum(len(t.x) for t in hist.data) <= 60
    holders = pd.DataFrame(
        {"run_id": "r", "agent": [f"a{i}" for i in range(500)], "objective_id": "o", "held_version": "1",
         "superseded_by": "2", "held_from": T0, "held_until": [T0 + timedelta(seconds=i) for i in range(500)]}
    )  # fmt: skip
    bars = holders_figure(holders, limit=40)
    assert len(bars.data[0].y) == 40 and "40 longest of 500" in bars.layout.title.text
    assert "a499" in bars.data[0].y[0]  # the longest hold first


def test_incident_runs_list_failing_then_to_review_then_degraded_newest_first():
    from dashboard.findings import FindingSet, metric_findings
    from dashboard.overview import age_text, incident_runs, verdict_counts

    summary = pd.DataFrame(
        {"run_id": ["ok", "guarded", "old-fail", "new-fail", "drift"],
         "verdict": ["healthy", "degraded", "failing", "failing", "to review"],
         "agents": [["a"], ["b"], ["c", "d"], ["e"], ["f"]], "rejections": [0, 2, 0, 0, 0], "errors": 0,
         "last_seen": [T0 + timedelta(seconds=s) for s in (50, 40, 10, 20, 30)]}
    )  # fmt: skip
    frames = {
        "ping_pong": pd.DataFrame({"run_id": ["old-fail", "new-fail"], "span_ids": [["a"], ["b"]]}),
        "lost_updates": pd.DataFrame({"run_id": ["new-fail"], "span_ids": [["c"]]}),
        "goal_divergence": pd.DataFrame({"run_id": ["drift"], "span_ids": [["d"]], "drifted": True}),
    }
    # In catalogue order, as gather_findings builds it.
    found = FindingSet(
        {name: metric_findings(DESCRIBED[name], frames[name]) for name in DESCRIBED if name in frames}, {}
    )
    now = T0 + timedelta(seconds=24)
    incidents = incident_runs(summary, found, now)
    assert list(incidents["run_id"]) == ["new-fail", "old-fail", "drift", "guarded"]  # healthy left out
    # both make a run failing; lost updates come first in the catalogue, so they name new-fail
    modes = {name: DESCRIBED[name]["failure_mode"] for name in frames}
    assert list(incidents["worst_failure_mode"]) == [
        modes["lost_updates"], modes["ping_pong"],
        f"{modes['goal_divergence']} — to review (threshold not calibrated)", "refused calls only",
    ]  # fmt: skip
    assert incidents["last_span"][0].endswith("UTC (4 s ago)") and list(incidents["findings"]) == [2, 1, 1, 0]
    assert incidents["agents"][1] == ["c", "d"]
    assert verdict_counts(summary) == {"failing": 2, "to review": 1, "degraded": 1, "healthy": 1}
    assert [age_text(s) for s in (3, 125, 7300, 90000, None)] == [
        "3 s ago", "2 min ago", "2 h ago", "1 d ago", "unknown",
    ]  # fmt: skip


def test_runs_whose_telemetry_left_a_detector_blind_are_listed_with_their_coverage():
    from dashboard.findings import FindingSet
    from dashboard.overview import incident_runs, unmeasured_runs

    note = (
        "goal drift not measurable: ...; enable OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY"
    )
    summary = pd.DataFrame(
        {"run_id": ["seen", "blind"], "verdict": ["healthy", "healthy"], "agents": [["a"], ["b"]],
         "rejections": 0, "errors": 0, "coverage": [None, note],
         "last_seen": [T0, T0 + timedelta(seconds=1)]}
    )  # fmt: skip
    assert list(unmeasured_runs(summary)["run_id"]) == ["blind"]
    assert unmeasured_runs(summary)["coverage"][0] == note
    listed = incident_runs(summary, FindingSet({}, {}), T0, include_healthy=True).set_index("run_id")
    assert listed.loc["blind", "coverage"] == note and listed.loc["seen", "coverage"] == ""
    assert unmeasured_runs(summary.drop(columns="coverage")).empty


def test_long_tables_are_paginated():
    from streamlit.testing.v1 import AppTest

    def page() -> None:
        import pandas as pd

        from dashboard import ui

        ui.table(pd.DataFrame({"run_id": [f"r{i}" for i in range(1200)], "n": range(1200)}), key="t")

    at = AppTest.from_function(page).run()
    assert len(at.dataframe[0].value) == 500 and "Rows 1-500 of 1,200 (3 pages)" in at.caption[0].value
    at.number_input(key="t_page").set_value(3).run()
    assert list(at.dataframe[0].value["n"]) == list(range(1000, 1200))


def test_trace_rows_nest_spans_by_parent_depth_first_in_start_order():
    from dashboard.trace import ancestors, search_spans, span_io, trace_rows

    spans = pd.DataFrame(
        {"trace_id": ["t"] * 5 + ["u"], "span_id": ["root", "b", "a", "a1", "loop", "root"],
         "parent_span_id": [None, "root", "root", "a", "loop", "missing"],
         "start_ns": [0, 20, 10, 15, 5, 1], "end_ns": 30, "span_name": "s",
         "tool_args": [None, None, '{"q": 1}', None, None, None], "tool_result": [None, None, "ok", None, None, None],
         "attributes": [{}, {}, {"gen_ai.agent.id": "Needle-Agent"}, {}, {}, {}]}
    )  # fmt: skip
    rows = trace_rows(spans)
    # roots by start (t/root, then u/root whose parent is not in the run, then the self-parented span)
    assert [(spans["span_id"][r.position], spans["trace_id"][r.position], r.depth) for r in rows] == [
        ("root", "t", 0),
        ("a", "t", 1),
        ("a1", "t", 2),
        ("b", "t", 1),
        ("root", "u", 0),
        ("loop", "t", 0),
    ]
    assert rows[0].children == (1, 3) and rows[2].parent == 1
    assert ancestors(rows, {2}) == {0, 1}
    assert search_spans(spans, "needle-agent") == {"a"}  # attribute values, case-insensitive
    assert search_spans(spans, "u") >= {"root"} and search_spans(spans, "") == set()
    assert span_io(spans.iloc[2]) == ({"tool_args": '{"q": 1}'}, {"tool_result": "ok"})


def test_agent_graph_links_agents_by_delegation_handoff_and_shared_keys_with_conflicts_red():
    from dashboard.figures_run import interaction_edges

    rows = [
        # root invokes a and b (handoffs), a and b both write "plan" (b's write is finding evidence),
        # c reads it; a delegates to c
        {"span_id": "r", "parent_span_id": None, "agent_id": None},
        {"span_id": "ia", "parent_span_id": "r", "agent_id": "a"},
        {"span_id": "wa", "parent_span_id": "ia", "agent_id": "a", "op": "write", "state_key": "plan"},
        {"span_id": "ib", "parent_span_id": "ia", "agent_id": "b"},
        {"span_id": "wb", "parent_span_id": "ib", "agent_id": "b", "op": "write", "state_key": "plan"},
        {"span_id": "rc", "parent_span_id": None, "agent_id": "c", "op": "read", "state_key": "plan"},
        {"span_id": "d", "parent_span_id": None, "agent_id": "a", "op": "delegate", "delegate_to": "c", "hop": 1},
    ]  # fmt: skip
    spans = pd.DataFrame(
        [{"trace_id": "t", "start_ns": i, "end_ns": i + 1, "span_name": "s", "outcome": "ok", "status_code": "Unset",
          "op": None, "state_key": None, "delegate_to": None, "hop": None, **r} for i, r in enumerate(rows)]
    )  # fmt: skip
    from dashboard.figures_run import span_records

    edges = {(e["kind"], e["source"], e["target"]): e for e in interaction_edges(span_records(spans), {"wb"})}
    assert set(edges) == {
        ("handoff", "a", "b"), ("delegation", "a", "c"),
        ("shared key", "a", "b"), ("shared key", "a", "c"), ("shared key", "b", "c"),
    }  # fmt: skip
    assert (
        edges[("shared key", "a", "b")]["labels"] == ["plan"] and edges[("shared key", "a", "b")]["conflict"]
    )
    assert edges[("shared key", "b", "c")]["conflict"] and not edges[("shared key", "a", "c")]["conflict"]
    assert edges[("delegation", "a", "c")]["labels"] == ["hop 1"]
    fig = delegation_graph_figure(spans, set(), {"wb"})
    red = [t for t in fig.data if t.mode == "lines" and t.line.color == "#d62728"]
    assert len(red) == 2  # the two shared-key edges through b's clobbering write


def _edges_by_every_pair(records: list[dict], conflict_spans: set[str]) -> list[dict]:
    """The agent graph's edges by their definition: every pair of spans behind an edge listed
    (quadratic in a key's spans; ``interaction_edges`` must give the same edges, in order)."""
    from dashboard.figures_run import _failed

    edges: dict[tuple[str, str, str], dict] = {}

    def add(kind, source, target, label, spans):
        if not source or not target or source == target:
            return
        edge = edges.setdefault(
            (kind, source, target),
            {"kind": kind, "source": source, "target": target, "labels": [], "conflict": False},
        )
        if label and label not in edge["labels"]:
            edge["labels"].append(label)
        edge["conflict"] |= any(_failed(r) or r.get("span_id") in conflict_spans for r in spans)

    for r in records:
        if r.get("op") == "delegate" and r.get("agent_id") and r.get("delegate_to"):
            hop = r.get("hop")
            add("delegation", r["agent_id"], r["delegate_to"], "" if hop is None else f"hop {int(hop)}", [r])
    by_id = {(r.get("trace_id"), r.get("span_id")): r for r in records}
    for r in records:
        parent = by_id.get((r.get("trace_id"), r.get("parent_span_id")))
        if parent is not None and r.get("op") != "delegate":
            add("handoff", parent.get("agent_id"), r.get("agent_id"), "", [r])
    keys: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        if r.get("state_key") and r.get("op") in ("read", "write") and r.get("agent_id"):
            keys.setdefault(r["state_key"], {"read": [], "write": []})[r["op"]].append(r)
    for key, ops in keys.items():
        for w in ops["write"]:
            for other in ops["read"] + ops["write"]:
                if other is w or other.get("agent_id") == w.get("agent_id"):
                    continue
                if other["op"] == "write" and other["agent_id"] < w["agent_id"]:
                    continue
                add("shared key", w["agent_id"], other["agent_id"], key, [w, other])
    return list(edges.values())


@pytest.mark.parametrize("seed", range(6))
def test_agent_graph_edges_equal_their_every_pair_definition_on_random_runs(seed):
    import random

    from dashboard.figures_run import interaction_edges

    rng = random.Random(seed)
    agents = [None, "a", "b", "c", "d", "e"][: rng.randint(3, 6)]
    records = []
    for i in range(rng.randint(0, 300)):
        op = rng.choice([None, "read", "write", "write", "delegate", "send"])
        records.append(
            {
                "trace_id": f"t{rng.randint(0, 2)}",
                "span_id": f"s{i}",
                "parent_span_id": f"s{rng.randint(0, i)}" if i and rng.random() < 0.7 else None,
                "agent_id": rng.choice(agents),
                "op": op,
                "delegate_to": rng.choice(agents) if op == "delegate" else None,
                "hop": rng.choice([None, 1, 2]) if op == "delegate" else None,
                "state_key": rng.choice([None, "k1", "k2", "k3", "k4"]),
                "outcome": rng.choice(["ok", "ok", "ok", "rejected", "error"]),
                "status_code": rng.choice(["Unset", "Unset", "Error"]),
            }
        )
    conflict = {f"s{i}" for i in rng.sample(range(len(records)), min(len(records), rng.randint(0, 20)))}
    assert interaction_edges(records, conflict) == _edges_by_every_pair(records, conflict)


def test_tables_show_arrow_lists_as_text():
    from analytics.text_lists import as_text_lists
    from dashboard.ui import _plain_cells, with_run_links

    frame = pd.DataFrame({"constraint_id": ["C1"], "agents": [["a", "b"]], "delegate_to": [[]]})
    shown, _ = with_run_links(_plain_cells(as_text_lists(frame, ("agents", "delegate_to"))))
    assert shown["agents"].tolist() == ["a, b"] and shown["delegate_to"].tolist() == [""]
