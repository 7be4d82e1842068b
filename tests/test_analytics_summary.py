"""Enforcement coverage and the per-run summary verdict."""

from __future__ import annotations

from analytics import run_metric
from tests.fixtures_analytics import insert_spans, make_span, new_db


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
