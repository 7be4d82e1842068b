"""no_progress (analytics/progress.py): repeated calls of one tool whose results never change."""

from __future__ import annotations

from analytics import run_metric
from analytics.progress import MIN_NO_PROGRESS_CALLS
from tests.fixtures_analytics import insert_spans, make_span, new_db, sample_traces_db

# Searches about different things (not re-wordings of one: those are repeated_calls' loops).
TOPICS = ["revenue by region", "churn impact", "pricing changes", "enterprise deals", "partner revenue",
          "refund volume", "seasonality", "marketing spend"]  # fmt: skip


def _calls(run: str, n: int, same_args: bool = False, results=None, refused: int = 0) -> list[dict]:
    rows = [
        make_span(
            i, run=run, agent_id="researcher", tool_name="search_web", outcome="ok",
            tool_args='{"q": "x"}' if same_args else f'{{"q": "{TOPICS[i]}"}}',
            tool_result=(results[i] if results else '["nothing new"]'),
        )
        for i in range(n)
    ]  # fmt: skip
    rows += [
        make_span(n + i, run=run, agent_id="researcher", tool_name="search_web", outcome="rejected")
        for i in range(refused)
    ]
    return rows


def test_different_calls_with_one_result_are_no_progress_unless_a_guard_stopped_them():
    conn = new_db()
    insert_spans(conn, _calls("run-stuck", MIN_NO_PROGRESS_CALLS))
    insert_spans(conn, _calls("run-guarded", MIN_NO_PROGRESS_CALLS, refused=1))
    insert_spans(conn, _calls("run-short", MIN_NO_PROGRESS_CALLS - 1))
    insert_spans(conn, _calls("run-identical", 6, same_args=True))  # repeated_calls' loop, not this
    answers = [f'["result {i}"]' for i in range(6)]
    insert_spans(conn, _calls("run-learning", 6, results=answers))  # each call brings something new
    found = run_metric(conn, "no_progress").set_index("run_id")
    assert sorted(found.index) == ["run-stuck"]  # run-guarded: its budget guard stopped the agent
    stuck = found.loc["run-stuck"]
    assert (stuck["agent"], stuck["tool_name"], stuck["calls"], stuck["result"]) == (
        "researcher", "search_web", MIN_NO_PROGRESS_CALLS, '["nothing new"]',
    )  # fmt: skip
    verdicts = run_metric(conn, "run_summary").set_index("run_id")["verdict"]
    assert verdicts["run-stuck"] == "failing" and verdicts["run-guarded"] == "degraded"


def test_the_sample_crews_never_converging_run_is_found_and_the_healthy_runs_stay_clear():
    """Issue 34: the unguarded step-budget run (twelve searches, one answer, no conclusion) read
    healthy. N is set on the healthy runs: none repeats one result as often as N."""
    conn = sample_traces_db()
    found = run_metric(conn, "no_progress")
    stuck = found[found["run_id"].str.startswith("run-step_budget-unguarded-")]
    assert len(stuck) == 1 and stuck["calls"].iloc[0] == 12 and stuck["agent"].iloc[0] == "researcher"
    assert not found["run_id"].str.startswith("run-healthy-").any()
    most = conn.execute(
        """SELECT max(n) FROM (SELECT count(*) AS n FROM spans
           WHERE run_id LIKE 'run-healthy-%' AND tool_name IS NOT NULL AND tool_result IS NOT NULL
           GROUP BY run_id, agent_id, tool_name, tool_result)"""
    ).fetchone()[0]
    assert most < MIN_NO_PROGRESS_CALLS
    verdict = run_metric(conn, "run_summary").set_index("run_id")["verdict"]
    assert verdict[stuck["run_id"].iloc[0]] == "failing"
