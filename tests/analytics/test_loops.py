"""Constraint, loop, side-effect and context-drift detectors on fixture rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analytics import run_metric
from analytics.loops import connected_components
from tests.fixtures_analytics import insert_spans, make_span, new_db


def test_constraint_ledger_marks_carried_waived_and_unwaived_drop():
    conn = new_db()
    deleg = dict(op="delegate", origin_task_id="T1")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="planner", op="objective", origin_task_id="T1", hop=0,
                      constraints_ledger=["C1", "C2", "C3"]),
            make_span(1, agent_id="planner", hop=1, delegate_to="res",
                      constraints_carried=["C1", "C2", "C3"], **deleg),
            make_span(2, agent_id="res", hop=2, delegate_to="wri", constraints_carried=["C1"],
                      constraints_waived=["C3"], waiver_reasons=["not applicable"], **deleg),
            make_span(3, agent_id="wri", hop=3, delegate_to="rev", constraints_carried=[], **deleg),
        ],
    )  # fmt: skip
    ledger = run_metric(conn, "constraint_ledger").set_index(["constraint_id", "hop"])
    assert ledger.loc[("C3", 2), "status"] == "waived"
    assert ledger.loc[("C3", 2), "waiver_reason"] == "not applicable"
    assert ledger.loc[("C3", 3), "status"] == "missing_after_waiver"
    assert ledger.loc[("C2", 2), "status"] == "missing"
    assert ledger.loc[("C1", 3), "last_hop_seen"] == 2
    drops = run_metric(conn, "constraint_drops").set_index("constraint_id")
    assert sorted(drops.index) == ["C1", "C2"]
    assert (drops.loc["C2", "hop"], drops.loc["C2", "agent"]) == (2, "res")
    assert list(drops.loc["C1", "delegate_to"]) == ["rev"]


def test_repeated_calls_groups_case_whitespace_and_near_duplicate_variants_into_one_loop():
    conn = new_db()
    search = dict(agent_id="a", tool_name="search", outcome="error")
    insert_spans(
        conn,
        [
            make_span(0, tool_args={"q": "current weather in Paris France"}, **search),
            make_span(1, tool_args='{"q": "Current weather  in paris france"}', **search),
            make_span(2, agent_id="a", tool_name="fetch", tool_args={"url": "x"}, outcome="ok"),
            make_span(3, tool_args={"q": "current weather in paris france today"}, **search),
            make_span(4, tool_args={"q": "stock prices"}, **search),
        ],
    )
    loops = run_metric(conn, "repeated_calls")
    assert len(loops) == 1
    loop = loops.iloc[0]
    assert loop.kind == "near_duplicate" and loop.calls == 3 and bool(loop.failing)
    assert loop.distinct_arguments == 2
    # {q weather paris france} + today ('current' is a stop word of the similarity tokens)
    assert loop.min_similarity == pytest.approx(4 / 5)


def test_repeated_calls_ignores_one_successful_reread_and_distinct_arguments():
    conn = new_db()
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", tool_name="read", tool_args={"key": "plan"}, outcome="ok"),
            make_span(1, agent_id="a", tool_name="read", tool_args={"key": "plan"}, outcome="ok"),
            make_span(2, agent_id="a", tool_name="read", tool_args={"key": "budget"}, outcome="error"),
            make_span(3, agent_id="a", tool_name="read", tool_args={"key": "notes"}, outcome="error"),
        ],
    )
    assert run_metric(conn, "repeated_calls").empty


def test_exact_failing_repeat_is_an_exact_loop_and_key_order_does_not_matter():
    conn = new_db()
    call = dict(agent_id="a", tool_name="deploy", outcome="error")
    insert_spans(
        conn,
        [
            make_span(0, tool_args='{"env": "prod", "force": true}', **call),
            make_span(5, tool_args='{"force": true, "env": "PROD"}', **call),
            make_span(9, tool_args='{"env":"prod","force":true}', **call),
        ],
    )
    loop = run_metric(conn, "repeated_calls").iloc[0]
    assert loop.kind == "exact" and loop.calls == 3 and loop.refused == 0


def test_two_failures_and_a_refused_third_call_is_not_a_loop():
    conn = new_db()
    call = dict(agent_id="a", tool_name="deploy", tool_args={"env": "prod"})
    insert_spans(
        conn,
        [
            make_span(0, outcome="error", **call),
            make_span(1, outcome="error", **call),
            make_span(2, outcome="rejected", reject_reason="repeated_call", **call),
        ],
    )
    assert run_metric(conn, "repeated_calls").empty


def test_connected_components_joins_transitive_edges():
    labels = connected_components(5, np.array([0, 3]), np.array([3, 4]))
    assert list(labels) == [0, 1, 2, 0, 0]


def test_ping_pong_needs_four_alternating_delegations_that_happened():
    conn = new_db()
    deleg = dict(op="delegate")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", delegate_to="b", **deleg),
            make_span(1, agent_id="b", delegate_to="a", **deleg),
            make_span(2, agent_id="a", delegate_to="b", **deleg),
            make_span(3, agent_id="b", delegate_to="a", **deleg),
            make_span(4, agent_id="a", delegate_to="c", **deleg),
            make_span(4, agent_id="c", delegate_to="b", run="run-2", **deleg),
            make_span(5, agent_id="b", delegate_to="c", run="run-2", **deleg),
            make_span(6, agent_id="c", delegate_to="b", run="run-2", **deleg),
            make_span(7, agent_id="b", delegate_to="c", run="run-2", outcome="rejected", **deleg),
        ],
    )
    found = run_metric(conn, "ping_pong")
    assert len(found) == 1
    assert list(found.iloc[0].agents) == ["a", "b"] and found.iloc[0].delegations == 4
    assert found.iloc[0].round_trips == 2


def test_budget_exhaustion_and_duplicate_side_effects():
    conn = new_db()
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", op="step", step=4, budget_max_steps=5),
            make_span(1, agent_id="b", op="step", step=5, budget_max_steps=5),
            make_span(2, agent_id="b", op="step", step=6, budget_max_steps=5, outcome="rejected",
                      reject_reason="step_budget"),
            make_span(3, agent_id="a", tool_name="send_email", tool_args={"to": "x"}, side_effect=True,
                      idempotency_key="k1", outcome="ok"),
            make_span(4, agent_id="a", tool_name="send_email", tool_args={"to": "x"}, side_effect=True,
                      idempotency_key="k1", outcome="ok"),
            make_span(5, agent_id="a", tool_name="send_email", tool_args={"to": "x"}, side_effect=True,
                      idempotency_key="k1", outcome="rejected", reject_reason="duplicate_side_effect"),
            make_span(6, agent_id="a", tool_name="charge", tool_args={"amount": "1"}, side_effect=True),
            make_span(7, agent_id="c", tool_name="charge", tool_args={"amount":  "1"}, side_effect=True),
        ],
    )  # fmt: skip
    budget = run_metric(conn, "budget_exhaustion")
    assert list(budget.agent) == ["b"] and budget.iloc[0].budget_rejections == 1
    dupes = run_metric(conn, "duplicate_side_effects").set_index("matched_by")
    assert dupes.loc["idempotency_key", "executions"] == 2
    assert dupes.loc["arguments", "tool_name"] == "charge"
    assert list(dupes.loc["arguments", "agents"]) == ["a", "c"]


def test_context_drift_holder_duration_and_stale_policy_sends():
    conn = new_db()
    obj = dict(objective_id="O")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="lead", op="objective", objective_version="1", **obj),
            make_span(1, agent_id="w", op="objective", objective_version="1", **obj),
            make_span(5, agent_id="lead", op="objective", objective_version="2", **obj),
            make_span(8, agent_id="w", op="step", objective_version="1", **obj),
            make_span(12, agent_id="w", op="objective", objective_version="2", **obj),
            make_span(14, agent_id="p", op="write", state_key="policy", policy_version="p1"),
            make_span(15, agent_id="p", op="write", state_key="policy", policy_version="p2"),
            make_span(16, agent_id="s", op="send", tool_name="email", policy_version="p1", outcome="ok"),
            make_span(17, agent_id="s", op="send", tool_name="email", policy_version="p1",
                      outcome="rejected", reject_reason="superseded_policy",
                      attrs={"driftscope.policy.current_version": "p2"}),
            make_span(18, agent_id="s", op="send", tool_name="email", policy_version="p2", outcome="ok"),
        ],
    )  # fmt: skip
    holders = run_metric(conn, "context_drift_holders")
    assert list(holders.agent) == ["w"]
    assert holders.iloc[0].held_s == pytest.approx(7.0)
    assert holders.iloc[0].superseded_by == "2"
    sends = run_metric(conn, "stale_policy_sends")
    assert list(sends.outcome) == ["ok", "rejected"]
    assert list(sends.allowed) == [True, False]
    assert set(sends.current_policy_version) == {"p2"}


def _code_output(query: str) -> str:
    return json.dumps(
        {
            "role": "assistant",
            "content": f'Thought: search again.\n<code>\nr = web_search(query="{query}")\nprint(r)\n</code>',
        }
    )


def test_code_actions_of_llm_outputs_are_calls_where_the_agent_has_no_tool_spans():
    conn = new_db()
    llm = dict(agent_id="coder", span_family="llm")
    queries = ["EU revenue 2024", "revenue of the EU in 2024", "What was the EU revenue in 2024?"]
    insert_spans(conn, [make_span(i, output_text=_code_output(q), **llm) for i, q in enumerate(queries)])
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["call_type"]) == ["code"] and list(loops["tool_name"]) == ["web_search"]
    assert loops.loc[0, "calls"] == 3 and loops.loc[0, "agent"] == "coder"
    # the same agent with tool spans of that tool: the tool spans are the calls, not the code
    conn = new_db()
    rows = [make_span(i, output_text=_code_output(q), **llm) for i, q in enumerate(queries)]
    rows += [make_span(10 + i, agent_id="coder", tool_name="web_search", tool_args={"query": q})
             for i, q in enumerate(queries)]  # fmt: skip
    insert_spans(conn, rows)
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["call_type"]) == ["tool"] and loops.loc[0, "calls"] == 3


def test_a_manager_re_asking_its_sub_agent_is_a_loop_of_agent_invocations():
    conn = new_db()
    manager = make_span(0, agent_id="manager", span_family="agent", SpanName="manager.run",
                        input_text=json.dumps({"task": "How many employees does Contoso have?"}))  # fmt: skip
    rows = [manager]
    for i, task in enumerate(["Find Contoso's employee count in 2023", "Find the Contoso employee count for 2023",
                              "Contoso employee count 2023"]):  # fmt: skip
        sub = make_span(1 + i * 3, agent_id="search_agent", span_family="agent", SpanName="search_agent.run",
                        ParentSpanId=manager["SpanId"], input_text=json.dumps({"task": task}))  # fmt: skip
        # the sub-agent's own step spans carry its task too: they are not invocations
        step = make_span(2 + i * 3, agent_id="search_agent", span_family="agent", SpanName="step",
                         ParentSpanId=sub["SpanId"], input_text=json.dumps({"task": task}))  # fmt: skip
        rows += [sub, step]
    insert_spans(conn, rows)
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["call_type"]) == ["agent"]
    loop = loops.iloc[0]
    assert (loop.agent, loop.tool_name, loop.calls) == ("manager", "search_agent", 3)
    assert list(loop.span_ids) == [rows[1]["SpanId"], rows[3]["SpanId"], rows[5]["SpanId"]]


def test_repeated_delegations_are_a_loop_unless_they_bounce_back():
    conn = new_db()
    deleg = dict(op="delegate", tool_name="delegate", goal_text="Compile Q3 churn numbers by segment")
    insert_spans(conn, [make_span(i, agent_id="planner", delegate_to="worker", **deleg) for i in range(3)])
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["call_type"]) == ["delegation"] and loops.loc[0, "tool_name"] == "worker"
    conn = new_db()  # planner -> worker -> planner ...: a ping-pong, the ping_pong detector's finding
    insert_spans(conn, [make_span(i, agent_id=a, delegate_to=b, **deleg)
                        for i, (a, b) in enumerate([("planner", "worker"), ("worker", "planner")] * 3)])  # fmt: skip
    assert run_metric(conn, "repeated_calls").empty
