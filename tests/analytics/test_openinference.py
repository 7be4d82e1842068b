"""Detectors on real instrumented traces without any driftscope attribute.

OpenInference: a LangGraph graph driven by a fake chat model, instrumented by
openinference-instrumentation-langchain. OpenLLMetry: spans with traceloop.* attributes as its
SDK writes them. Both are exported with the real OpenTelemetry SDK into an InMemorySpanExporter,
encoded to OTLP protobuf, decoded by the collector's decoder and stored, then analysed.
"""

from __future__ import annotations

import json
from typing import TypedDict

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from analytics import Filters, Window, run_metric
from analytics.goals import goal_pairs
from collector.decode import decode_export_request
from collector.store import insert_batches
from tests.fixtures_analytics import new_db

GOAL = "Plan a three-day team offsite in Lisbon for 25 people under a 20,000 EUR budget"
ON_GOAL = "Find venues in Lisbon that can host 25 people for three days"
DRIFTED = "Write a poem about the sea and the sailors of old"


def _store(spans):
    conn = new_db()
    batch = decode_export_request(encode_spans(spans))
    assert insert_batches(conn, [batch]) == len(spans)
    return conn


@pytest.fixture(scope="module")
def langgraph_db():
    pytest.importorskip("langgraph")
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, StateGraph
    from openinference.instrumentation.langchain import LangChainInstrumentor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)

    class State(TypedDict, total=False):
        question: str
        task: str

    llm = FakeListChatModel(responses=["plan", "venues", "poem"])

    @tool
    def search_venues(query: str) -> str:
        """Search the venue directory."""
        raise ValueError("venue search backend unavailable")

    def planner(state: State) -> State:
        llm.invoke([SystemMessage("You are a planner. Be concise."), HumanMessage(state["question"])])
        return {"task": ON_GOAL}

    def venue_agent(state: State) -> State:
        # The agent retries a failing search with small variations: a near-duplicate loop.
        for query in (
            "venues Lisbon 25 people",
            "Venues in Lisbon for 25  people",
            "venues lisbon 25 people offsite",
        ):
            try:
                search_venues.invoke({"query": query})
            except ValueError:
                pass
        llm.invoke([HumanMessage(state["task"])])
        return {"task": DRIFTED}

    def poet_agent(state: State) -> State:
        llm.invoke([HumanMessage(state["task"])])
        return {}

    graph = StateGraph(State)
    for name, node in (("planner", planner), ("venue_agent", venue_agent), ("poet_agent", poet_agent)):
        graph.add_node(name, node)
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "venue_agent")
    graph.add_edge("venue_agent", "poet_agent")
    graph.add_edge("poet_agent", END)
    try:
        graph.compile().invoke({"question": GOAL})
    finally:
        instrumentor.uninstrument()
    spans = exporter.get_finished_spans()
    assert {span.attributes.get("openinference.span.kind") for span in spans} >= {"AGENT", "TOOL", "LLM"}
    return _store(spans)


def test_langgraph_goal_divergence_infers_root_goal_and_nested_agent_tasks(langgraph_db):
    found = goal_pairs(langgraph_db, Window(), Filters()).set_index("agent")  # every subtask
    assert set(found.index) == {"venue_agent", "poet_agent"}
    assert (found["source"] == "inferred").all() and (found["root_goal"] == GOAL).all()
    assert found.loc["venue_agent", "subtask"] == ON_GOAL
    assert found.loc["poet_agent", "subtask"] == DRIFTED
    drifted = run_metric(langgraph_db, "goal_divergence")  # the detector lists the drifted one
    assert list(drifted["agent"]) == ["poet_agent"] and drifted["drifted"].all()


def test_langgraph_near_duplicate_failing_tool_calls_are_one_loop(langgraph_db):
    loops = run_metric(langgraph_db, "repeated_calls")
    assert len(loops) == 1
    loop = loops.iloc[0]
    assert loop.tool_name == "search_venues" and loop.calls == 3 and bool(loop.failing)
    assert loop.kind == "near_duplicate"


def test_langgraph_run_summary_and_coverage(langgraph_db):
    summary = run_metric(langgraph_db, "run_summary")
    assert len(summary) == 1 and summary.iloc[0]["verdict"] == "failing"
    assert summary.iloc[0]["errors"] == 3 and summary.iloc[0]["drifted_subtasks"] == 1
    coverage = run_metric(langgraph_db, "enforcement_coverage").set_index("tool_name")
    assert coverage.loc["search_venues", "coverage"] == "watch_only"
    for name in (
        "divergent_reads",
        "lost_updates",
        "constraint_drops",
        "ping_pong",
        "duplicate_side_effects",
    ):
        assert run_metric(langgraph_db, name).empty


def test_openllmetry_workflow_with_agents_and_tools():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("opentelemetry.instrumentation.langchain")
    workflow_input = json.dumps({"inputs": {"objective": GOAL}, "tags": [], "metadata": {}})
    with tracer.start_as_current_span("offsite.workflow") as workflow:
        workflow.set_attribute("traceloop.span.kind", "workflow")
        workflow.set_attribute("traceloop.workflow.name", "offsite")
        workflow.set_attribute("traceloop.entity.input", workflow_input)
        for name, task in (("venue_scout", ON_GOAL), ("poet", DRIFTED)):
            with tracer.start_as_current_span(f"{name}.agent") as agent:
                agent.set_attribute("traceloop.span.kind", "agent")
                agent.set_attribute("traceloop.entity.name", name)
                agent.set_attribute("traceloop.entity.input", json.dumps({"inputs": {"task": task}}))
                if name == "venue_scout":
                    for query in ("lisbon venues 25", "Lisbon venues  25", "lisbon VENUES 25"):
                        with tracer.start_as_current_span("search.tool") as call:
                            call.set_attribute("traceloop.span.kind", "tool")
                            call.set_attribute("traceloop.entity.name", "search")
                            call.set_attribute("traceloop.entity.input", json.dumps({"query": query}))
                            call.set_status(Status(StatusCode.ERROR, "timeout"))
    conn = _store(exporter.get_finished_spans())
    goals = goal_pairs(conn, Window(), Filters()).set_index("agent")  # every subtask
    assert set(goals.index) == {"venue_scout", "poet"}
    assert (goals["root_goal"] == GOAL).all()
    assert list(run_metric(conn, "goal_divergence")["agent"]) == ["poet"]  # the drifted one
    loops = run_metric(conn, "repeated_calls")
    assert len(loops) == 1 and loops.iloc[0].kind == "exact" and loops.iloc[0].calls == 3
    assert loops.iloc[0].agent == "venue_scout"


def _bouncing_graph_spans(rounds: int):
    """LangGraph: researcher_agent and critic_agent hand the draft back and forth ``rounds`` times."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph
    from openinference.instrumentation.langchain import LangChainInstrumentor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)

    class Draft(TypedDict, total=False):
        question: str
        round: int

    llm = FakeListChatModel(responses=["draft", "needs work"])

    def researcher_agent(state: Draft) -> Draft:
        llm.invoke([HumanMessage(state["question"])])
        return {"round": state.get("round", 0) + 1}

    def critic_agent(state: Draft) -> Draft:
        llm.invoke([HumanMessage("Review the draft")])
        return {}

    graph = StateGraph(Draft)
    graph.add_node("researcher_agent", researcher_agent)
    graph.add_node("critic_agent", critic_agent)
    graph.add_edge(START, "researcher_agent")
    graph.add_edge("researcher_agent", "critic_agent")
    graph.add_conditional_edges(
        "critic_agent", lambda state: END if state["round"] >= rounds else "researcher_agent"
    )
    try:
        graph.compile().invoke({"question": "Summarise Q3 churn by segment"})
    finally:
        instrumentor.uninstrument()
    return exporter.get_finished_spans()


@pytest.mark.parametrize(("rounds", "expected_handoffs"), [(4, 7), (2, None)])
def test_langgraph_ping_pong_inferred_from_agent_turns(rounds, expected_handoffs):
    pytest.importorskip("langgraph")
    conn = _store(_bouncing_graph_spans(rounds))
    found = run_metric(conn, "ping_pong")
    if expected_handoffs is None:  # researcher -> critic -> researcher -> critic: a normal revision
        assert found.empty
        return
    assert len(found) == 1
    row = found.iloc[0]
    assert list(row.agents) == ["critic_agent", "researcher_agent"] and row.source == "inferred"
    assert row.delegations == expected_handoffs and len(row.span_ids) == expected_handoffs
