"""The DuckDB file the dashboard, report and browser tests read, and checks that it is what they expect.

It is built with the real schema and plain INSERTs (tests.fixtures_analytics): one crew run
(``run-crew``) with a split-brain on key ``plan``, a dropped and a waived constraint, a looping
search, a duplicated side effect and a send under a superseded policy; and a second run
(``run-bounce``) with ping-pong delegation and a step budget exhausted. Span text carries an XSS
payload so every renderer's escaping is exercised.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from collector.migrations_runner import apply_migrations
from tests.fixtures_analytics import insert_spans, make_span

XSS = '<script>alert("driftscope-xss")</script><img src=x onerror=alert(1)>'
CREW_RUN = "run-crew"
BOUNCE_RUN = "run-bounce"

# Failure modes (detector names) injected per run: the ground truth of this database.
EXPECTED = {
    CREW_RUN: {
        "divergent_reads",
        "constraint_drops",
        "repeated_calls",
        "duplicate_side_effects",
        "stale_policy_sends",
        "lost_updates",
        "context_drift_holders",
        "goal_divergence",
    },
    BOUNCE_RUN: {"ping_pong", "budget_exhaustion"},
}


def _crew_rows() -> list[dict]:
    run = CREW_RUN
    read = dict(op="read", tool_name="state_read", state_key="plan", outcome="ok", run=run)
    write = dict(op="write", tool_name="state_write", state_key="plan", outcome="ok", run=run)
    ledger = ["budget<=100", "deadline=friday", "cite-sources"]
    rows = [
        make_span(0, run=run, agent_id="planner", op="delegate", delegate_to="researcher", hop=1, task_id="t1",
                  origin_task_id="task-report", constraints_ledger=ledger, constraints_carried=ledger[:2],
                  goal_root="Write the quarterly report", goal_text="Research figures " + XSS),
        make_span(0.5, run=run, agent_id="researcher", op="delegate", delegate_to="writer", hop=2, task_id="t2",
                  origin_task_id="task-report", constraints_ledger=ledger, constraints_carried=ledger[:1],
                  constraints_waived=[ledger[1]], waiver_reasons=["deadline moved " + XSS]),
        make_span(1, agent_id="planner", state_version="v1", **read),
        make_span(1.2, agent_id="researcher", state_version="v1", **read),
        make_span(2, agent_id="researcher", state_version="v2", state_expected_version="v1", **write),
        make_span(3, agent_id="writer", state_version="v2", **read),
        make_span(4, agent_id="planner", state_version="v3", tool_result=XSS, **write),
        make_span(4.5, run=run, agent_id="planner", op="write", tool_name="state_write", state_key="plan",
                  state_version="v1", state_expected_version="v1", outcome="rejected",
                  reject_reason="version_conflict"),
        make_span(6, run=run, agent_id="writer", op="step"),
        make_span(7, run=run, agent_id="planner", op="write", state_key="budget", state_version="b1",
                  state_expected_version="b0", outcome="ok"),
        make_span(7.5, run=run, agent_id="writer", op="write", state_key="budget", state_version="b2",
                  outcome="ok"),
        make_span(8, run=run, agent_id="researcher", op="read", state_key="budget", state_version="b2"),
        make_span(30, run=run, agent_id="planner", op="objective", objective_id="O", objective_version="1"),
        make_span(31, run=run, agent_id="writer", op="objective", objective_id="O", objective_version="1"),
        make_span(35, run=run, agent_id="planner", op="objective", objective_id="O", objective_version="2"),
        make_span(38, run=run, agent_id="writer", op="step", objective_id="O", objective_version="1"),
        make_span(42, run=run, agent_id="writer", op="objective", objective_id="O", objective_version="2"),
    ]  # fmt: skip
    for i in range(4):
        rows.append(
            make_span(10 + i, run=run, agent_id="writer", tool_name="search", tool_args={"q": "same query " + XSS},
                      outcome="error", StatusCode="Error")
        )  # fmt: skip
    for i in range(2):
        rows.append(
            make_span(20 + i, run=run, agent_id="writer", tool_name="send_email", side_effect=True,
                      idempotency_key="mail-1", tool_args={"to": "cfo"}, outcome="ok")
        )  # fmt: skip
    rows.append(
        make_span(25, run=run, agent_id="writer", op="send", tool_name="send_email", policy_version="p1",
                  attrs={"driftscope.policy.current_version": "p2"}, outcome="ok")
    )  # fmt: skip
    return rows


def _bounce_rows() -> list[dict]:
    run = BOUNCE_RUN
    rows = [
        make_span(50 + i, run=run, agent_id="alice" if i % 2 == 0 else "bob", op="delegate",
                  delegate_to="bob" if i % 2 == 0 else "alice", hop=i + 1, origin_task_id="task-bounce")
        for i in range(6)
    ]  # fmt: skip
    rows += [
        make_span(60 + i, run=run, agent_id="alice", op="step", step=i + 1, budget_max_steps=3,
                  outcome="rejected" if i >= 3 else "ok", reject_reason="step_budget" if i >= 3 else None)
        for i in range(5)
    ]  # fmt: skip
    return rows


def build_dashboard_db(path: Path) -> Path:
    """Write the test database to ``path`` (a new file) and return it."""
    conn = duckdb.connect(str(path))
    try:
        apply_migrations(conn)
        insert_spans(conn, _crew_rows() + _bounce_rows())
    finally:
        conn.close()
    return path


def test_built_database_holds_both_runs(tmp_path):
    path = build_dashboard_db(tmp_path / "d.duckdb")
    conn = duckdb.connect(str(path), read_only=True)
    runs = {r[0] for r in conn.execute("SELECT DISTINCT run_id FROM spans").fetchall()}
    assert runs == set(EXPECTED)
