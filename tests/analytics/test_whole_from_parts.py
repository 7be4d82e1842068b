"""A result that depends on every run (enforcement_coverage's totals per tool, the goal
divergence distribution) is kept whole, summed from per-run parts the materializer keeps by run:
after every pass it equals a full computation, spans of no run included, after later batches and
after a delete."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pandas as pd
import pytest

from analytics import goals, materialize, materialize_clickhouse, run_metric, summary
from analytics.registry import compute_metric
from collector.store import delete_expired
from tests.analytics.test_materialize import _canonical, _commit, _pass, _store
from tests.fixtures_analytics import BASE_TIME, make_span

WHOLE = {"enforcement_coverage": summary.COVERAGE_RUNS, "goal_divergence_distribution": goals.RUNS_PART}
_ROOT = "Plan a three-day team offsite in Lisbon for 25 people under a 20,000 EUR budget"
_SUBTASKS = [
    "Find venues in Lisbon that can host 25 people for three days",
    "Book flights to Lisbon for 25 people within the budget",
    "Write a blog post about the history of Portuguese tiles",
]


def _guarded(rng: random.Random, start: float, seconds: float, runs: list, count: int) -> list[dict]:
    """``count`` calls from ``start`` over ``seconds`` (seconds after BASE_TIME) in ``runs`` (a
    None among them: spans of no run), guarded or not, refused, failed or through."""
    rows = []
    for _ in range(count):
        run = rng.choice(runs)
        fields = {
            "agent_id": rng.choice(["a", "b"]),
            "tool_name": rng.choice(["write_state", "send_email", None]),
            "op": rng.choice(["write", "send", "delegate", None]),
            "state_key": rng.choice(["plan", None]),
            "outcome": rng.choice(["ok", "rejected", "error", None]),
            "reject_reason": rng.choice(["stale version", None]),
            "side_effect": rng.choice([True, False, None]),
            "idempotency_key": rng.choice(["k1", None]),
            "policy_version": rng.choice(["p2", None]),
            "state_expected_version": rng.choice(["v1", None]),
        }
        if fields["tool_name"] is None and fields["op"] is None:
            fields["op"] = "read"
        span = make_span(start + rng.random() * seconds, run=run or "none", **fields)
        if run is None:
            span["run_id"] = None
        rows.append(span)
    return rows


def _goals(rng: random.Random, start: float, seconds: float, runs: list, count: int) -> list[dict]:
    """``count`` delegations with subtask statements in ``runs`` (None: of no run), each run's
    origin task holding the root goal on an objective span (some runs' statements carry it
    themselves), at hops 1-2: several subtasks per run, the same statement in several runs."""
    rows = []
    for _ in range(count):
        run = rng.choice(runs)
        task = f"T-{run or 'loose'}-{rng.randint(1, 2)}"
        at = start + rng.random() * seconds
        spans = [
            make_span(at, run=run or "none", agent_id="planner", op="objective", origin_task_id=task,
                      goal_root=_ROOT, hop=0),
            make_span(at + 1, run=run or "none", agent_id=rng.choice(["planner", "venues"]), op="delegate",
                      delegate_to=rng.choice(["venues", "writer"]), origin_task_id=task, hop=rng.choice([1, 2]),
                      goal_text=rng.choice(_SUBTASKS), goal_root=rng.choice([None, _ROOT]),
                      outcome=rng.choice(["ok", "ok", "rejected"])),
        ]  # fmt: skip
        for span in spans:
            if run is None:
                span["run_id"] = None
        rows += spans
    return rows


def _assert_whole_from_parts(conn) -> None:
    for name, part in WHOLE.items():
        assert materialize.ready(conn, part) is not None, part
        assert materialize.table_exists(conn, materialize.TABLE_PREFIX + part), part
        got, full = run_metric(conn, name), compute_metric(conn, name)
        assert got.attrs.get("source") == "table", name
        assert list(got.columns) == list(full.columns), name
        assert len(full) > 0, name
        pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=name)


@pytest.mark.parametrize("seed", range(3))
def test_whole_results_summed_from_run_parts_equal_a_full_computation(tmp_path, seed):
    rng = random.Random(seed)
    conn = _store(tmp_path)
    runs = ["run-1", "run-2", "run-3", None]
    names = list(WHOLE)
    _commit(conn, _guarded(rng, 0, 600, runs, 80) + _goals(rng, 0, 600, runs, 20))
    assert not _pass(conn, names).failed
    _assert_whole_from_parts(conn)
    for hours in (1, 30):  # later batches, of two of the runs and of no run
        later = runs[:2] + [None]
        _commit(conn, _guarded(rng, hours * 3600, 600, later, 40) + _goals(rng, hours * 3600, 600, later, 10))
        report = _pass(conn, names)
        assert not report.failed
        _assert_whole_from_parts(conn)
        for part in WHOLE.values():  # the touched runs' parts alone
            assert report.recomputed[part] == 2, part
    # retention: the first batch's spans go, with their runs' parts
    cutoff = int((BASE_TIME + timedelta(seconds=1800) - datetime(1970, 1, 1)).total_seconds()) * 10**9
    conn.execute("BEGIN TRANSACTION")
    assert delete_expired(conn, cutoff, 10_000) > 0
    conn.execute("COMMIT")
    assert not _pass(conn, names).failed
    _assert_whole_from_parts(conn)


def test_clickhouse_keeps_the_same_parts_and_sums_them():
    """ClickHouse keeps the sums from the same parts too, not from every span (the goal
    distribution reads its part through read_findings, enforcement_coverage sums its part where
    it is; tests/analytics/test_clickhouse_findings.py holds their tables to DuckDB's full
    computation after every batch)."""
    kept = materialize_clickhouse.maintained()
    for name, part in WHOLE.items():
        assert part in kept and kept[name].depends == (part,), name
