"""Behaviour the faster loop, side-effect, ping-pong and run-summary SQL must keep.

The rewrites prune candidates early (groups of 3+ calls, runs where a pair of agents hands off
often enough, repeated keys found by hash) and run_summary counts findings in SQL and caches
its result per database file and data version; these tests pin the edge cases of each.
"""

from __future__ import annotations

import duckdb
import pytest

from analytics import Filters, run_metric, summary
from driftscope.database import migrate
from tests.fixtures_analytics import insert_spans, make_span, new_db, sample_traces_db


@pytest.fixture(scope="module")
def scenarios() -> duckdb.DuckDBPyConnection:
    return sample_traces_db()


def _per_run(frame) -> dict:
    return frame.groupby("run_id").size().to_dict() if not frame.empty else {}


@pytest.mark.parametrize("run", [None, "first", "last"])
def test_run_summary_counts_equal_each_detectors_findings_per_run(scenarios, run):
    runs = [r for (r,) in scenarios.execute("SELECT DISTINCT run_id FROM spans ORDER BY 1").fetchall()]
    filters = Filters(run={"first": runs[0], "last": runs[-1]}.get(run))
    rows = run_metric(scenarios, "run_summary", filters=filters).set_index("run_id")
    assert len(rows) > 0
    for name in summary.counted_detectors():
        expected = _per_run(run_metric(scenarios, name, filters=filters))
        got = {run_id: n for run_id, n in rows[f"{name}_count"].items() if n}
        assert got == {k: v for k, v in expected.items() if k in rows.index}, name
    holders = run_metric(scenarios, "context_drift_holders", filters=filters)
    unrefreshed = _per_run(holders[~holders["refreshed"].astype(bool)]) if not holders.empty else {}
    assert {k: v for k, v in rows["context_drift_holders_unrecovered"].items() if v} == unrefreshed
    sends = run_metric(scenarios, "stale_policy_sends", filters=filters)
    assert {k: v for k, v in rows["stale_policy_sends_count"].items() if v} == _per_run(sends)
    allowed = _per_run(sends[sends["allowed"].astype(bool)]) if not sends.empty else {}
    assert {k: v for k, v in rows["stale_policy_sends_flagged"].items() if v} == allowed


def test_scenario_database_has_findings_of_every_sql_counted_detector(scenarios):
    # Otherwise the equality test above would compare zeros with zeros for that detector.
    rows = run_metric(scenarios, "run_summary")
    for name in ("divergent_reads", "lost_updates", "constraint_drops", "context_drift_holders",
                 "ping_pong", "budget_exhaustion", "duplicate_side_effects", "repeated_calls"):  # fmt: skip
        assert rows[f"{name}_count"].sum() > 0, name
    assert rows["stale_policy_sends_count"].sum() > 0


def _write_run(run: str, t0: float) -> list[dict]:
    write = dict(op="write", state_key="k", outcome="ok", tool_name="state_write")
    return [
        make_span(t0, run=run, agent_id="a", state_version="v1", **write),
        make_span(t0 + 1, run=run, agent_id="b", state_version="v2", **write),
    ]


def test_run_summary_follows_new_spans_and_thresholds(tmp_path):
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    insert_spans(conn, _write_run("run-1", 0))
    first = run_metric(conn, "run_summary")
    again = run_metric(conn, "run_summary")
    assert first.equals(again) and list(first["run_id"]) == ["run-1"]
    assert first.loc[0, "verdict"] == "failing"
    insert_spans(conn, _write_run("run-2", 10))  # new spans: counted
    assert sorted(run_metric(conn, "run_summary")["run_id"]) == ["run-1", "run-2"]
    conn.execute(
        "INSERT INTO thresholds VALUES ('count_per_run:lost_updates', 1, 5, 'quantile', '{}', now())"
    )
    assert set(run_metric(conn, "run_summary")["verdict"]) == {"healthy"}  # a new threshold counts too
    cursor = conn.cursor()  # another cursor on the same file: the same answer
    assert set(run_metric(cursor, "run_summary")["verdict"]) == {"healthy"}


def test_two_in_memory_databases_each_answer_for_their_own_spans():
    failing, healthy = new_db(), new_db()
    insert_spans(failing, _write_run("run-1", 0))
    ok = dict(op="write", state_key="k", outcome="ok", tool_name="state_write", state_expected_version="v0")
    insert_spans(healthy, [make_span(0, run="run-1", agent_id="a", state_version="v1", **ok),
                           make_span(1, run="run-1", agent_id="b", tool_name="web_search")])  # fmt: skip
    # Same span count and ingested_at: only the identity of the database tells them apart.
    assert run_metric(failing, "run_summary").loc[0, "verdict"] == "failing"
    assert run_metric(healthy, "run_summary").loc[0, "verdict"] == "healthy"


def test_repeated_calls_group_errors_and_successes_and_need_three_calls():
    conn = new_db()
    call = dict(agent_id="a", tool_name="search", tool_args={"q": "same"})
    insert_spans(
        conn,
        [
            make_span(0, outcome="error", **call),
            make_span(1, outcome="error", **call),
            make_span(2, outcome="ok", **call),  # a retry loop ends in a success: one loop
            make_span(3, run="run-2", outcome="error", **call),
            make_span(4, run="run-2", outcome="ok", **call),  # one retry after an error: normal
            make_span(5, run="run-2", agent_id="b", tool_name="search", tool_args={"q": "same"}),
        ],
    )  # fmt: skip
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["run_id"]) == ["run-1"]
    assert loops.loc[0, "calls"] == 3 and loops.loc[0, "failed"] == 2 and not loops.loc[0, "failing"]


def test_repeated_calls_stored_out_of_time_order_form_one_loop_listed_by_start():
    # calls are identified by their rowid, which follows storage, not time
    conn = new_db()
    call = dict(agent_id="a", tool_name="search", tool_args={"q": "weather in paris"})
    rows = [make_span(t, **call) for t in (30, 10, 20)]
    rows.insert(1, make_span(15, agent_id="a", tool_name="fetch", tool_args={"url": "x"}))
    rows.insert(0, make_span(5, agent_id="b", tool_name="search", tool_args={"q": "weather in paris"}))
    insert_spans(conn, rows)
    loops = run_metric(conn, "repeated_calls")
    assert len(loops) == 1 and loops.loc[0, "calls"] == 3 and loops.loc[0, "kind"] == "exact"
    assert list(loops.loc[0, "span_ids"]) == [rows[3]["SpanId"], rows[4]["SpanId"], rows[1]["SpanId"]]


def test_repeated_calls_without_a_run_are_not_a_loop():
    conn = new_db()
    call = dict(agent_id="a", tool_name="search", tool_args={"q": "same"}, run_id=None)
    insert_spans(conn, [make_span(t, **call) for t in range(4)])
    assert run_metric(conn, "repeated_calls").empty


def test_duplicate_side_effect_spellings_count_each_execution_once():
    conn = new_db()
    send = dict(agent_id="a", tool_name="send_email", side_effect=True, outcome="ok")
    insert_spans(
        conn,
        [
            make_span(0, tool_args='{"to": "x", "body": "hi"}', **send),
            make_span(1, tool_args='{"to":"x","body":"hi"}', **send),
            make_span(2, tool_args=' {"to": "X" , "body": "HI"} ', **send),
        ],
    )  # fmt: skip
    found = run_metric(conn, "duplicate_side_effects")
    assert list(found["matched_by"]) == ["arguments"]
    assert found.loc[0, "executions"] == 3 and len(found.loc[0, "span_ids"]) == 3
    assert found.loc[0, "arguments"] == '{"to":"x","body":"hi"}'


def test_ping_pong_cycle_in_a_run_with_other_hand_offs_and_a_second_pair():
    conn = new_db()
    hand = dict(op="delegate", outcome="ok")
    pairs = [("a", "b"), ("b", "a"), ("a", "b"), ("c", "a"), ("b", "a"), ("a", "b"), ("b", "a"), ("a", "b")]
    insert_spans(conn, [make_span(i, agent_id=s, delegate_to=d, **hand) for i, (s, d) in enumerate(pairs)])
    found = run_metric(conn, "ping_pong")
    # c -> a breaks the first bounce after three hand-offs; the next four form one cycle.
    assert list(found["delegations"]) == [4]
    assert list(found.loc[0, "agents"]) == ["a", "b"]


def test_ping_pong_one_way_hand_offs_are_not_a_cycle():
    conn = new_db()
    insert_spans(conn, [make_span(i, agent_id="a", delegate_to="b", op="delegate", outcome="ok")
                        for i in range(6)])  # fmt: skip
    assert run_metric(conn, "ping_pong").empty
