"""Constraint, loop, side-effect and context-drift detectors on fixture rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analytics import run_metric
from analytics.loops import MEMBER_LISTS, _member_lists, connected_components
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


def test_member_lists_equal_a_list_aggregation_per_loop():
    rng = np.random.default_rng(3)
    loops = np.sort(rng.choice([2, 5, 9, 40, 41], size=60))
    members = pd.DataFrame({"loop": loops, "SpanId": [f"{i:016x}" for i in rng.permutation(60)]})
    expected = members.groupby("loop", sort=False)["SpanId"].agg(list)
    got = _member_lists(members["loop"].to_numpy(), members["SpanId"])
    assert got.dtype == MEMBER_LISTS  # Arrow lists: read back from the store without Python strings
    assert got.tolist() == expected.tolist()
    assert all(type(v) is list and all(type(x) is str for x in v) for v in got)
    assert got.index.tolist() == [2, 5, 9, 40, 41]


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


def test_code_actions_are_calls_of_tools_the_run_has_where_the_agent_has_no_tool_spans():
    conn = new_db()
    llm = dict(agent_id="coder", span_family="llm")
    queries = ["EU revenue 2024", "revenue of the EU in 2024", "What was the EU revenue in 2024?"]
    rows = [make_span(i, output_text=_code_output(q), **llm) for i, q in enumerate(queries)]
    # no tool of that name in the run: the code is not a call of a tool the agent has
    insert_spans(conn, rows)
    assert run_metric(conn, "repeated_calls").empty
    # another agent of the run has web_search (a tool span): the coder's code calls it
    conn = new_db()
    rows = [make_span(i, output_text=_code_output(q), **llm) for i, q in enumerate(queries)]
    rows.append(make_span(9, agent_id="helper", tool_name="web_search", tool_args={"query": "x"}))
    insert_spans(conn, rows)
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


def test_code_actions_count_only_tools_the_agent_declares():
    queries = ["EU revenue 2024", "revenue of the EU in 2024", "What was the EU revenue in 2024?"]

    def run_with(declaration: dict, on_agent_span: bool, helper_tool: bool):
        conn = new_db()
        rows = [make_span(i, agent_id="coder", span_family="llm", output_text=_code_output(q),
                          attrs={} if on_agent_span else declaration) for i, q in enumerate(queries)]  # fmt: skip
        if on_agent_span:
            rows.append(make_span(0, agent_id="coder", span_family="agent", attrs=declaration))
        if helper_tool:  # another agent of the run has web_search
            rows.append(make_span(9, agent_id="helper", tool_name="web_search", tool_args={"query": "x"}))
        insert_spans(conn, rows)
        return run_metric(conn, "repeated_calls")

    # smolagents' CodeAgent (OpenInference): its tools on its agent span, not web_search: the code
    # calling web_search is no call of a tool the coder has, though the run has one
    loops = run_with({"smolagents.tools_names": '["send_report", "final_answer"]'}, True, True)
    assert loops.empty
    # declared, with no tool span in the run at all: a loop of code actions
    loops = run_with({"smolagents.tools_names": '["web_search", "final_answer"]'}, True, False)
    assert list(loops["call_type"]) == ["code"] and loops.loc[0, "calls"] == 3
    # OpenTelemetry GenAI definitions and OpenInference llm.tools on the model calls
    definitions = json.dumps([{"type": "function", "name": "web_search", "description": "Search."}])
    loops = run_with({"gen_ai.tool.definitions": definitions}, False, False)
    assert list(loops["tool_name"]) == ["web_search"]
    schema = json.dumps({"type": "function", "function": {"name": "web_search", "parameters": {}}})
    loops = run_with({"llm.tools.0.tool.json_schema": schema}, False, False)
    assert list(loops["tool_name"]) == ["web_search"]


def test_code_actions_as_real_models_write_them_are_no_loop_of_prose_escapes_or_builtins():
    # GAIA-like outputs: escaped newlines before parentheses, prose in the code, builtins,
    # keywords and a class the code constructs, each repeated over five steps
    def content(i: int) -> str:
        return (
            "Thought: I will not (yet) answer and the (cached) result is True (see above).\n"
            "<code>\nclass TrieNode:\n    pass\nnode = TrieNode()\n"
            'text = "a\\n(b)"\nif not (len(text) > 1) and True:\n    print(f"{text} (x)")\n'
            f'r = web_search(query="trie topic {i}")\n</code>'
        )

    conn = new_db()
    rows = [make_span(i, agent_id="coder", span_family="llm",
                      output_text=json.dumps({"role": "assistant", "content": content(i)}))
            for i in range(5)]  # fmt: skip
    rows.append(make_span(9, agent_id="helper", tool_name="web_search", tool_args={"query": "x"}))
    insert_spans(conn, rows)
    loops = run_metric(conn, "repeated_calls")
    assert set(loops["tool_name"]) <= {"web_search"}, loops[["tool_name", "signature"]]


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


def _invocations(tasks: list[str], run: str = "run-1") -> list[dict]:
    """A manager agent span and, under it, one sub-agent span per task (with a step span each)."""
    manager = make_span(0, run=run, agent_id="manager", span_family="agent", SpanName="manager.run",
                        input_text=json.dumps({"task": "How many people work at Contoso?"}))  # fmt: skip
    rows = [manager]
    for i, task in enumerate(tasks):
        sub = make_span(1 + i * 3, run=run, agent_id="search_agent", span_family="agent",
                        SpanName="search_agent.run", ParentSpanId=manager["SpanId"],
                        input_text=json.dumps({"task": task}))  # fmt: skip
        rows.append(sub)
    return rows


def test_a_re_worded_re_delegation_is_linked_on_task_similarity():
    # "employee count" / "number of employees": argument Jaccard 0.67, below any argument threshold
    conn = new_db()
    same = "Find Contoso's employee count at the end of 2023."
    rows = _invocations([same, same, "Find the number of employees Contoso had at the end of 2023."])
    insert_spans(conn, rows)
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["call_type"]) == ["agent"] and list(loops["kind"]) == ["near_duplicate"]
    loop = loops.iloc[0]
    assert (loop.agent, loop.tool_name, loop.calls) == ("manager", "search_agent", 3)
    assert 0.75 <= loop.min_similarity < 1


def test_delegations_that_change_the_year_or_the_company_are_progress_not_a_loop():
    # the embeddings alone score these 0.95+: the numbers and names they name differ
    for tasks in (
        [
            "Find Globex's revenue for 2022.",
            "Find Globex's revenue for 2023.",
            "Find Globex's revenue for 2024.",
        ],
        [
            "Find Globex's revenue for 2024.",
            "Find Initech's revenue for 2024.",
            "Find Hooli's revenue for 2024.",
        ],
    ):
        conn = new_db()
        insert_spans(conn, _invocations(tasks))
        assert run_metric(conn, "repeated_calls").empty, tasks
    conn = new_db()  # as delegate spans
    deleg = dict(op="delegate", tool_name="delegate", agent_id="planner", delegate_to="worker")
    years = [
        "Compile Q3 2022 churn for Acme",
        "Compile Q3 2023 churn for Acme",
        "Compile Q3 2024 churn for Acme",
    ]
    insert_spans(conn, [make_span(i, goal_text=goal, **deleg) for i, goal in enumerate(years)])
    assert run_metric(conn, "repeated_calls").empty


def test_the_agent_spans_under_one_entry_into_an_agent_are_one_invocation():
    # LangGraph: the worker's node span (its entry, under a root without agent) holds a sub-graph
    # whose 'agent' node runs twice per visit; three visits with one question are one loop of 3.
    conn = new_db()
    root = make_span(0, agent_id=None, span_family="chain", SpanName="LangGraph")
    rows = [root]
    for visit in range(3):
        node = make_span(1 + visit * 10, agent_id="researcher", span_family="chain", SpanName="researcher",
                         ParentSpanId=root["SpanId"])  # fmt: skip
        graph = make_span(2 + visit * 10, agent_id="researcher", span_family="chain", SpanName="researcher",
                          ParentSpanId=node["SpanId"])  # fmt: skip
        steps = [make_span(3 + visit * 10 + k, agent_id="researcher", span_family="agent", SpanName="agent",
                           ParentSpanId=graph["SpanId"],
                           input_text=json.dumps({"task": "Find the Q3 2024 churn of Acme's EU segment"}))
                 for k in range(2)]  # fmt: skip
        rows += [node, graph, *steps]
    insert_spans(conn, rows)
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["call_type"]) == ["agent"] and loops.loc[0, "calls"] == 3
    assert loops.loc[0, "agent"] is None and loops.loc[0, "tool_name"] == "researcher"
    firsts = [rows[i]["SpanId"] for i in (3, 7, 11)]  # the first step of each visit
    assert list(loops.loc[0, "span_ids"]) == firsts
    conn = new_db()  # one visit with six steps: one invocation, no loop
    one = rows[:4] + [make_span(4 + k, agent_id="researcher", span_family="agent", SpanName="agent",
                                ParentSpanId=rows[2]["SpanId"], input_text=rows[3]["input_text"])
                      for k in range(5)]  # fmt: skip
    insert_spans(conn, one)
    assert run_metric(conn, "repeated_calls").empty


def _hand(t: float, src: str, dst: str, task: str, run: str = "run-1") -> dict:
    return make_span(
        t, run=run, op="delegate", agent_id=src, delegate_to=dst, tool_args=json.dumps({"task": task})
    )


def test_ping_pong_through_a_manager_needs_the_same_tasks_handed_again():
    conn = new_db()  # the manager hands the same question to A and B alternately: each sends it back
    bounce = [_hand(i, "manager", "A" if i % 2 == 0 else "B", "Compute the 2024 growth") for i in range(6)]
    insert_spans(conn, bounce)
    found = run_metric(conn, "ping_pong")
    assert len(found) == 1
    row = found.iloc[0]
    assert (list(row.agents), row.via, row.delegations, row.source) == (
        ["A", "B"],
        "manager",
        6,
        "driftscope",
    )
    assert list(row.span_ids) == [span["SpanId"] for span in bounce]
    conn = new_db()  # a plan: research then compute, three times, each on a new year
    plan = []
    for i, year in enumerate(["2022", "2023", "2024"]):
        plan += [_hand(2 * i, "manager", "A", f"Find the {year} revenue"),
                 _hand(2 * i + 1, "manager", "B", f"Compute the {year} margin")]  # fmt: skip
    insert_spans(conn, plan)
    assert run_metric(conn, "ping_pong").empty


def test_ping_pong_of_nested_agent_invocations():
    # PydanticAI / smolagents: an agent invoked inside another agent's span is a hand-off
    conn = new_db()
    rows = [make_span(0, agent_id="manager", span_family="agent", SpanName="invoke_agent manager")]
    for i in range(5):
        who = "analyst" if i % 2 == 0 else "researcher"
        rows.append(make_span(1 + i, agent_id=who, span_family="agent", SpanName=f"invoke_agent {who}",
                              ParentSpanId=rows[-1]["SpanId"], input_text=f"round {i}"))  # fmt: skip
    insert_spans(conn, rows)
    found = run_metric(conn, "ping_pong")
    assert len(found) == 1
    row = found.iloc[0]
    assert (list(row.agents), row.source, row.delegations) == (["analyst", "researcher"], "nested", 4)
    assert row.via is None
    conn = new_db()  # manager -> analyst -> researcher: one nested hand-off each, no bounce
    insert_spans(conn, rows[:3])
    assert run_metric(conn, "ping_pong").empty


def test_a_bounce_through_a_manager_is_one_finding_the_ping_pong():
    conn = new_db()
    insert_spans(
        conn, [_hand(i, "manager", "A" if i % 2 == 0 else "B", "Compute the 2024 growth") for i in range(6)]
    )
    assert len(run_metric(conn, "ping_pong")) == 1
    assert run_metric(conn, "repeated_calls").empty  # its repeated hand-offs to A and to B are the bounce
    conn = new_db()  # the same hand-offs to A alone: a re-delegation loop, no ping-pong
    insert_spans(conn, [_hand(i, "manager", "A", "Compute the 2024 growth") for i in range(3)])
    assert run_metric(conn, "ping_pong").empty
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["call_type"]) == ["delegation"] and loops.loc[0, "tool_name"] == "A"


def test_hand_off_tool_calls_of_a_ping_pong_are_the_ping_pong():
    # LangGraph swarm: each agent calls transfer_to_<other> (same text each time) and hands off
    conn = new_db()
    rows = []
    for _round in range(3):
        for src, dst in (("analyst", "researcher"), ("researcher", "analyst")):
            t = len(rows)
            rows += [make_span(t, agent_id=src, tool_name=f"transfer_to_{dst}", tool_args={"reason": "not mine"}),
                     make_span(t + 0.5, op="delegate", agent_id=src, delegate_to=dst)]  # fmt: skip
    insert_spans(conn, rows)
    assert len(run_metric(conn, "ping_pong")) == 1
    assert run_metric(conn, "repeated_calls").empty
    conn = new_db()  # the same tool calls without the bounce: a loop of the tool
    insert_spans(conn, [span for span in rows if span["tool_name"] == "transfer_to_researcher"])
    assert list(run_metric(conn, "repeated_calls")["tool_name"]) == ["transfer_to_researcher"]


def test_calls_whose_arguments_were_not_captured_are_no_loop_on_an_empty_signature():
    # ADK's and Strands' defaults record no tool arguments: three different searches look alike
    conn = new_db()
    insert_spans(conn, [make_span(i, agent_id="researcher", tool_name="web_search") for i in range(3)])
    insert_spans(conn, [make_span(5 + i, agent_id="manager", op="delegate", delegate_to="researcher")
                        for i in range(3)])  # fmt: skip
    assert run_metric(conn, "repeated_calls").empty
    # the same calls with their arguments captured (identical): a loop
    conn = new_db()
    insert_spans(conn, [make_span(i, agent_id="researcher", tool_name="web_search", tool_args={"query": "x"})
                        for i in range(3)])  # fmt: skip
    loops = run_metric(conn, "repeated_calls")
    assert list(loops["kind"]) == ["exact"] and loops.loc[0, "calls"] == 3


def test_calls_without_arguments_that_fail_with_the_same_error_are_a_loop_matched_on_it():
    # Microsoft Agent Framework's default: no arguments, status Error and error.type on a failure
    conn = new_db()
    search = dict(agent_id="researcher", tool_name="web_search")
    failed = dict(StatusCode="Error", attrs={"error.type": "TimeoutError"}, **search)
    insert_spans(conn, [make_span(0, **failed), make_span(1, **search), make_span(2, **failed),
                        make_span(3, **search), make_span(4, **failed)])  # fmt: skip
    loops = run_metric(conn, "repeated_calls")
    assert len(loops) == 1
    loop = loops.iloc[0]
    assert (loop.matched_on, loop.kind, loop.calls, loop.failed, bool(loop.failing)) == (
        "error", "exact", 3, 3, True,
    )  # fmt: skip
    assert loop.signature == "TimeoutError"
    # Strands: the exception's message as the status message, with error.type when both are set
    conn = new_db()
    insert_spans(conn, [make_span(i, StatusCode="Error", StatusMessage="backend timed out (HTTP 504)",
                                  attrs={"error.type": "TimeoutError"}, **search) for i in range(3)])  # fmt: skip
    assert list(run_metric(conn, "repeated_calls")["signature"]) == [
        "TimeoutError: backend timed out (HTTP 504)"
    ]


def test_calls_without_arguments_that_fail_differently_or_succeed_quietly_are_no_loop():
    search = dict(agent_id="researcher", tool_name="web_search")
    conn = new_db()  # three failures, three different errors
    insert_spans(conn, [make_span(i, StatusCode="Error", StatusMessage=message, **search)
                        for i, message in enumerate(["HTTP 504", "HTTP 429", "no such index"])])  # fmt: skip
    assert run_metric(conn, "repeated_calls").empty
    conn = new_db()  # a failure without any error text: nothing to compare
    insert_spans(conn, [make_span(i, StatusCode="Error", **search) for i in range(3)])
    assert run_metric(conn, "repeated_calls").empty
    conn = new_db()  # a healthy run: different calls all acknowledged alike
    insert_spans(conn, [make_span(i, tool_result=result, **search)
                        for i, result in enumerate(["ok", "ok", "ok", '{"status": "success"}'] * 2)])  # fmt: skip
    assert run_metric(conn, "repeated_calls").empty
    conn = new_db()  # different substantial results: progress
    insert_spans(conn, [make_span(i, tool_result=f"Northwind annual report {year}: EU revenue up", **search)
                        for i, year in enumerate([2022, 2023, 2024])])  # fmt: skip
    assert run_metric(conn, "repeated_calls").empty


def test_calls_without_arguments_with_the_same_substantial_result_are_a_loop_matched_on_it():
    conn = new_db()
    result = "Northwind Traders annual report 2024: EU revenue EUR 412 million (up 6%)."
    insert_spans(conn, [make_span(i, agent_id="researcher", tool_name="web_search", tool_result=result)
                        for i in range(3)])  # fmt: skip
    loop = run_metric(conn, "repeated_calls").iloc[0]
    assert (loop.matched_on, loop.calls, bool(loop.failing), loop.signature) == ("output", 3, False, result)


def test_a_loop_says_it_matched_on_arguments_or_similar_arguments():
    conn = new_db()
    search = dict(agent_id="a", tool_name="search", outcome="error")
    insert_spans(conn, [make_span(i, tool_args={"q": "current weather in Paris France" + " today" * (i == 2)},
                                  **search) for i in range(3)])  # fmt: skip
    insert_spans(
        conn, [make_span(10 + i, agent_id="a", tool_name="fetch", tool_args={"url": "x"}) for i in range(3)]
    )
    loops = run_metric(conn, "repeated_calls").set_index("tool_name")
    assert loops.loc["search", "matched_on"] == "similar arguments"
    assert loops.loc["fetch", "matched_on"] == "arguments"
