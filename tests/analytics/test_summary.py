"""Enforcement coverage and the per-run summary verdict."""

from __future__ import annotations

import random
from datetime import timedelta

import pandas as pd
import pytest

from analytics import Filters, Window, run_metric
from analytics.registry import compute_metric, counted_metrics
from analytics.summary import run_summary_of
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, new_db, trace_id


def test_enforcement_coverage_separates_enforced_partial_and_watch_only_tools():
    conn = new_db()
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", tool_name="state_write", op="write", state_key="k",
                      state_expected_version="v0", state_version="v1", outcome="ok"),
            make_span(1, agent_id="b", tool_name="state_write", op="write", state_key="k",
                      state_expected_version="v0", state_version="v2", outcome="rejected",
                      reject_reason="version_conflict"),
            make_span(2, agent_id="a", tool_name="notes_write", op="write", state_key="n", outcome="ok"),
            make_span(3, agent_id="a", tool_name="notes_write", op="write", state_key="n",
                      state_expected_version="v1", outcome="ok"),
            make_span(4, agent_id="a", tool_name="web_search", tool_args={"q": "x"}),
        ],
    )  # fmt: skip
    coverage = run_metric(conn, "enforcement_coverage").set_index("tool_name")
    assert coverage.loc["state_write", "coverage"] == "enforced"
    assert coverage.loc["state_write", "prevented"] == 1
    assert list(coverage.loc["state_write", "prevented_reasons"]) == ["version_conflict"]
    assert coverage.loc["notes_write", "coverage"] == "partial"
    assert coverage.loc["notes_write", "anti_patterns"] == 1
    assert coverage.loc["web_search", "coverage"] == "watch_only"


def test_run_summary_verdicts_failing_degraded_healthy():
    conn = new_db()
    write = dict(op="write", state_key="k", outcome="ok", tool_name="state_write")
    insert_spans(
        conn,
        [
            # run-bad: b's unversioned write clobbers a's unread write (lost update)
            make_span(0, run="run-bad", agent_id="a", state_version="v1", **write),
            make_span(1, run="run-bad", agent_id="b", state_version="v2", **write),
            # run-guarded: the guard refused a stale write
            make_span(0, run="run-guarded", agent_id="a", op="write", state_key="k", outcome="rejected",
                      reject_reason="version_conflict", state_expected_version="v0"),
            # run-ok: a clean versioned write
            make_span(0, run="run-ok", agent_id="a", state_version="v1", state_expected_version="v0",
                      **write),
        ],
    )  # fmt: skip
    summary = run_metric(conn, "run_summary").set_index("run_id")
    assert summary.loc["run-bad", "verdict"] == "failing"
    assert summary.loc["run-bad", "lost_updates_count"] == 1
    assert list(summary.loc["run-bad", "agents"]) == ["a", "b"]
    assert summary.loc["run-guarded", "verdict"] == "degraded"
    assert summary.loc["run-guarded", "rejections"] == 1
    assert summary.loc["run-ok", "verdict"] == "healthy"


# --- run_summary brought up to date incrementally equals a full recomputation -----------------

_AGENTS = ["a", "b", "c", None]
_KEYS = ["k1", "k2", "plan"]


def _random_batch(rng: random.Random, batch: int, runs: list[str]) -> list[dict]:
    """Spans of every kind the counted detectors look at, over a few runs, traces and origin
    tasks (an origin task may span runs), some without run or agent."""
    rows = []
    for _ in range(rng.randint(1, 12)):
        run = rng.choice(runs)
        trace = trace_id(f"{run}/{rng.randint(0, 2)}")
        fields: dict = dict(
            run=run,
            TraceId=trace,
            agent_id=rng.choice(_AGENTS),
            outcome=rng.choice(["ok", "ok", "ok", "rejected", None]),
            ingested_at=BASE_TIME + timedelta(seconds=batch),
        )
        if rng.random() < 0.1:
            fields["run_id"] = trace  # no run yet: counted under its trace id
        kind = rng.choice(["read", "write", "write", "send", "delegate", "step", "call"])
        if kind in ("read", "write"):
            fields.update(op=kind, state_key=rng.choice(_KEYS), state_version=f"v{rng.randint(1, 4)}")
            if kind == "write" and rng.random() < 0.6:
                fields["state_expected_version"] = f"v{rng.randint(0, 3)}"
        elif kind == "send":
            fields.update(op="send", tool_name="send_email", side_effect=True,
                          policy_version=f"p{rng.randint(1, 3)}",
                          idempotency_key=rng.choice([None, "i1", "i2"]),
                          tool_args={"to": rng.choice(["x", "y"])})  # fmt: skip
        elif kind == "delegate":
            ledger = ["C1", "C2", "C3"]
            fields.update(op="delegate", origin_task_id=rng.choice(["t1", "t2", f"t-{run}"]),
                          hop=rng.randint(1, 3), delegate_to=rng.choice(["a", "b", "c"]),
                          constraints_carried=rng.sample(ledger, rng.randint(0, 3)))  # fmt: skip
            if rng.random() < 0.3:
                fields["constraints_ledger"] = ledger
        elif kind == "step":
            fields.update(op="step", objective_id="goal", objective_version=f"o{rng.randint(1, 3)}",
                          budget_max_steps=3, step=rng.randint(1, 5))  # fmt: skip
        else:
            fields.update(tool_name=rng.choice(["search", "fetch"]), tool_args={"q": rng.choice(["a", "b"])})
        rows.append(make_span(batch * 5 + rng.random() * 20, **fields))
    return rows


@pytest.mark.parametrize("scoped", [False, True])
def test_run_summary_of_the_detectors_full_results_is_its_full_computation(scoped):
    """``summary.run_summary_of`` (the counts taken from detector results already computed for
    the question) equals run_summary computed from the spans, whole and under a window and a
    service filter; a detector left out of the results given is computed."""
    rng = random.Random(7)
    conn = new_db()
    runs = ["run-1", "run-2", "run-3"]
    insert_spans(conn, [row for batch in range(4) for row in _random_batch(rng, batch, runs)])
    window = Window(since=BASE_TIME + timedelta(seconds=6)) if scoped else Window()
    filters = Filters(agent="a") if scoped else Filters()
    counted = [m.name for m in counted_metrics()]
    fulls = {name: compute_metric(conn, name, window, filters) for name in counted[1:]}
    want = compute_metric(conn, "run_summary", window, filters)
    assert len(want) and (want.filter(like="_count").to_numpy().sum() > 0)  # findings were counted
    pd.testing.assert_frame_equal(run_summary_of(conn, fulls, window, filters), want)


def test_a_run_whose_framework_recorded_no_arguments_or_tasks_says_so_in_coverage():
    conn = new_db()
    insert_spans(
        conn,
        [
            make_span(0, run="blind", agent_id="manager", op="delegate", delegate_to="researcher"),
            make_span(1, run="blind", agent_id="researcher", span_family="agent", hop=1,
                      ScopeName="gcp.vertex.agent"),
            make_span(2, run="blind", agent_id="researcher", tool_name="web_search"),
            make_span(3, run="blind", agent_id="researcher", tool_name="web_search", tool_args={"query": "x"}),
            make_span(5, run="seen", agent_id="researcher", tool_name="web_search", tool_args={"query": "x"}),
        ],
    )  # fmt: skip
    summary = run_metric(conn, "run_summary").set_index("run_id")
    note = summary.loc["blind", "coverage"]
    assert "repeated calls and duplicate side effects not measurable (1 of 2 calls)" in note
    assert "goal drift not measurable" in note
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY" in note
    assert summary.loc["blind", "verdict"] == "healthy"  # not a failure: unknown, and said so
    assert pd.isna(summary.loc["seen", "coverage"])
