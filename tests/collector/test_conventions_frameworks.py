"""Real frameworks' spans -> coordination columns, through the decoder and the store.

Each test builds OTLP the way the instrumentation emits it (span names, scope names, attribute
keys and value shapes read from openinference-instrumentation-smolagents 0.1.43,
-openai-agents 2.6, -langchain 0.1.80, -crewai; opentelemetry-instrumentation-langchain 0.62
(OpenLLMetry); PydanticAI's GenAI spans), ingests it with the real decoder and writer functions,
and checks what lands in `spans`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest

from collector.conventions import RULES, call_arguments, map_coordination
from collector.decode import PROTOBUF, decode_payload
from collector.migrations_runner import apply_migrations
from collector.store import insert_batches
from tests.otlp_builders import make_request

TRACE = b"\x0a" * 16
SMOLAGENTS = "openinference.instrumentation.smolagents"
OPENAI_AGENTS = "openinference.instrumentation.openai_agents"
OPENLLMETRY_LANGCHAIN = "opentelemetry.instrumentation.langchain"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "semantic-conventions.md"


def _sid(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _ingest(conn, spans: list[dict], scope: str) -> None:
    request = make_request(spans)
    request.resource_spans[0].scope_spans[0].scope.name = scope
    batch = decode_payload(request.SerializeToString(), PROTOBUF)
    conn.execute("BEGIN")
    insert_batches(conn, [batch])
    conn.execute("COMMIT")


def _rows(conn, columns: str) -> dict[str, tuple]:
    """Span name -> the columns (span names are unique in these tests)."""
    return {
        row[0]: row[1:]
        for row in conn.execute(f"SELECT SpanName, {columns} FROM spans ORDER BY start_ns").fetchall()
    }


@pytest.fixture
def conn():
    connection = duckdb.connect(":memory:")
    apply_migrations(connection)
    yield connection
    connection.close()


MANAGED_TASK = (
    "You're a helpful agent named 'search_agent'.\nYou have been submitted this task by your manager.\n"
    "---\nTask:\nFind Contoso's employee count at the end of 2023.\n---\nYou're helping your manager "
    "solve a wider task ...\n\nYour final_answer WILL HAVE to contain these parts:\n"
)


def _smolagents_crew(
    manager_span_name: str = "CodeAgent.run", sub_name: str = "search_agent.run"
) -> list[dict]:
    session = {"session.id": "smol-run-1"}
    return [
        {
            "name": manager_span_name,
            "span_id": _sid(1),
            "trace_id": TRACE,
            "attrs": {
                "openinference.span.kind": "AGENT",
                "input.value": json.dumps({"task": "How many employees did Contoso have?", "stream": False}),
                "smolagents.managed_agents.0.name": "search_agent",
                **session,
            },
        },
        {
            "name": "Step 1",
            "span_id": _sid(2),
            "parent": _sid(1),
            "trace_id": TRACE,
            "attrs": {"openinference.span.kind": "CHAIN", **session},
        },
        {
            "name": sub_name,
            "span_id": _sid(3),
            "parent": _sid(2),
            "trace_id": TRACE,
            "attrs": {
                "openinference.span.kind": "AGENT",
                "input.value": json.dumps({"task": MANAGED_TASK, "stream": False, "reset": True}),
                **session,
            },
        },
        {
            "name": "SimpleTool",
            "span_id": _sid(4),
            "parent": _sid(3),
            "trace_id": TRACE,
            "attrs": {
                "openinference.span.kind": "TOOL",
                "tool.name": "web_search",
                "tool.parameters": '{"query": {"type": "string", "description": "The search query"}}',
                "input.value": json.dumps(
                    {
                        "args": [],
                        "sanitize_inputs_outputs": True,
                        "kwargs": {"query": "Contoso employees 2023"},
                    }
                ),
                "output.value": "Contoso had 18,250 employees.",
                **session,
            },
        },
        {
            "name": "OpenAIModel.generate",
            "span_id": _sid(5),
            "parent": _sid(3),
            "trace_id": TRACE,
            "attrs": {"openinference.span.kind": "LLM", **session},
        },
    ]


def test_smolagents_agents_tool_arguments_and_hops(conn):
    # the exporter sends children first: the sub-agent's spans before the manager's
    spans = _smolagents_crew()
    _ingest(conn, spans[2:], SMOLAGENTS)
    _ingest(conn, spans[:2], SMOLAGENTS)
    rows = _rows(conn, "agent_id, agent_source, hop, tool_name, tool_args, tool_result, run_id")
    assert rows["CodeAgent.run"][:3] == ("CodeAgent", "attribute", 0)
    assert rows["Step 1"][:3] == ("CodeAgent", "ancestor", 0)
    assert rows["search_agent.run"][:3] == ("search_agent", "attribute", 1)
    # the sub-agent's own spans get the sub-agent, not the manager
    assert rows["SimpleTool"] == (
        "search_agent",
        "ancestor",
        1,
        "web_search",
        '{"query":"Contoso employees 2023"}',  # the call's arguments, not the tool.parameters schema
        "Contoso had 18,250 employees.",
        "smol-run-1",
    )
    assert rows["OpenAIModel.generate"][:3] == ("search_agent", "ancestor", 1)


def test_smolagents_class_named_run_takes_the_name_from_its_managed_agent_prompt():
    attrs = {"openinference.span.kind": "AGENT", "input.value": json.dumps({"task": MANAGED_TASK})}
    out = map_coordination(attrs, {}, name="ToolCallingAgent.run", scope=SMOLAGENTS)
    assert (out["agent_id"], out["span_family"]) == ("search_agent", "agent")
    unnamed = map_coordination(
        {"openinference.span.kind": "AGENT"}, {}, name="CodeAgent.run", scope=SMOLAGENTS
    )
    assert unnamed["agent_id"] == "CodeAgent"
    # `<x>.run` names an agent only in smolagents' scope
    assert map_coordination(attrs, {}, name="CodeAgent.run", scope="other")["agent_id"] is None


@pytest.mark.parametrize(
    ("wrapped", "arguments"),
    [
        ('{"args": [], "sanitize_inputs_outputs": true, "kwargs": {"query": "q"}}', '{"query":"q"}'),
        (
            '{"args": ["18,250 employees"], "sanitize_inputs_outputs": false, "kwargs": {}}',
            "18,250 employees",
        ),
        ('{"args": [{"query": "q"}], "sanitize_inputs_outputs": true, "kwargs": {}}', '{"query":"q"}'),
        ('{"args": [1, 2], "kwargs": {"k": "v"}}', '{"args":[1,2],"kwargs":{"k":"v"}}'),
        (
            '{"input_str": "{\'query\': \'q\'}", "tags": null, "metadata": {"langgraph_step": 2}, '
            '"inputs": {"query": "q"}, "kwargs": {"run_id": "x"}}',
            '{"query":"q"}',
        ),
        (
            '{"input_str": "plain text", "tags": [], "metadata": {}, "inputs": null, "kwargs": {}}',
            "plain text",
        ),
        ('{"query": "q"}', '{"query": "q"}'),  # already the arguments: kept as they are
        ("not json", "not json"),
    ],
)
def test_call_arguments_are_unwrapped(wrapped, arguments):
    assert call_arguments(wrapped) == arguments


def test_openai_agents_handoff_is_a_delegation_and_an_agent_tool_passes_its_input(conn):
    session = {"session.id": "oai-1"}
    spans = [
        {
            "name": "Agent workflow",
            "span_id": _sid(1),
            "trace_id": TRACE,
            "attrs": {"openinference.span.kind": "AGENT"},
        },
        {
            "name": "manager",
            "span_id": _sid(2),
            "parent": _sid(1),
            "trace_id": TRACE,
            "attrs": {
                "openinference.span.kind": "AGENT",
                "agent.name": "manager",
                "graph.node.id": "manager",
                **session,
            },
        },
        {
            "name": "ask_researcher",
            "span_id": _sid(3),
            "parent": _sid(2),
            "trace_id": TRACE,
            "attrs": {
                "openinference.span.kind": "TOOL",
                "tool.name": "ask_researcher",
                "input.value": '{"input": "Find Fabrikam\'s market share in Germany."}',
                **session,
            },
        },
        {
            "name": "researcher",
            "span_id": _sid(4),
            "parent": _sid(3),
            "trace_id": TRACE,
            "attrs": {"openinference.span.kind": "AGENT", "agent.name": "researcher", **session},
        },
        {
            "name": "handoff to analyst",
            "span_id": _sid(5),
            "parent": _sid(2),
            "trace_id": TRACE,
            "attrs": {
                "openinference.span.kind": "TOOL",
                "input.value": "manager",
                "output.value": "analyst",
                **session,
            },
        },
    ]
    _ingest(conn, spans, OPENAI_AGENTS)
    rows = _rows(conn, "agent_id, op, delegate_to, tool_args, hop, input_text")
    assert rows["handoff to analyst"][:4] == ("manager", "delegate", "analyst", None)
    assert rows["researcher"][0] == "researcher" and rows["researcher"][4] == 1
    assert rows["researcher"][5] == '{"input": "Find Fabrikam\'s market share in Germany."}'
    assert rows["Agent workflow"][0] is None  # the workflow root is no agent


def test_openllmetry_langgraph_agents_runs_tools_and_gotos(conn):
    run = {"traceloop.association.properties.thread_id": "lg-1"}

    def node(ns: str) -> dict:
        return {
            "traceloop.association.properties.langgraph_checkpoint_ns": ns,
            "traceloop.association.properties.langgraph_node": ns.rsplit("|", 1)[-1].split(":")[0],
            **run,
        }

    spans = [
        {
            "name": "LangGraph.workflow",
            "span_id": _sid(1),
            "trace_id": TRACE,
            "attrs": {
                "traceloop.span.kind": "workflow",
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "LangGraph",
                "gen_ai.agent.id": "01a231fa-928c-7323-9159-c623eb604c72",  # a run id, not an agent
                **run,
            },
        },
        {
            "name": "execute_task supervisor",
            "span_id": _sid(2),
            "parent": _sid(1),
            "trace_id": TRACE,
            "attrs": {
                "traceloop.span.kind": "task",
                "gen_ai.operation.name": "execute_task",
                **node("supervisor:a1"),
            },
        },
        {
            "name": "goto researcher",
            "span_id": _sid(3),
            "parent": _sid(2),
            "trace_id": TRACE,
            "attrs": {
                "gen_ai.operation.name": "goto",
                "langgraph.command.source_node": "supervisor",
                "langgraph.command.goto_node": "researcher",
            },
        },
        {
            "name": "execute_task agent",
            "span_id": _sid(4),
            "parent": _sid(1),
            "trace_id": TRACE,
            "attrs": {"traceloop.span.kind": "task", **node("researcher:b1|agent:b2")},
        },
        {
            "name": "web_search.tool",
            "span_id": _sid(5),
            "parent": _sid(4),
            "trace_id": TRACE,
            "attrs": {
                "traceloop.span.kind": "tool",
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "web_search",
                "gen_ai.tool.call.arguments": json.dumps(
                    {
                        "input_str": "{'query': 'Northwind EU revenue 2024'}",
                        "tags": None,
                        "metadata": {
                            "langgraph_step": 2,
                            "langgraph_checkpoint_ns": "researcher:b1|tools:b3",
                        },
                        "inputs": {"query": "Northwind EU revenue 2024"},
                        "kwargs": {"tool_call_id": "call_1"},
                    }
                ),
                **node("researcher:b1|tools:b3"),
            },
        },
    ]
    _ingest(conn, spans, OPENLLMETRY_LANGCHAIN)
    rows = _rows(conn, "agent_id, run_id, op, delegate_to, tool_args")
    assert rows["LangGraph.workflow"][:2] == ("LangGraph", "lg-1")
    assert rows["execute_task supervisor"][:2] == ("supervisor", "lg-1")
    assert rows["goto researcher"][:4] == ("supervisor", "lg-1", "delegate", "researcher")
    assert rows["execute_task agent"][0] == "researcher"  # the sub-agent, not its inner node
    assert rows["web_search.tool"] == (
        "researcher",
        "lg-1",
        None,
        None,
        '{"query":"Northwind EU revenue 2024"}',
    )


def test_openinference_langgraph_sub_agent_inner_nodes_get_the_sub_agent():
    metadata = json.dumps(
        {"langgraph_node": "agent", "langgraph_checkpoint_ns": "researcher:4d1c|agent:d634", "thread_id": "t"}
    )
    out = map_coordination({"openinference.span.kind": "AGENT", "metadata": metadata}, {}, name="agent")
    assert (out["agent_id"], out["graph_node_id"]) == ("researcher", "agent")


def test_pydantic_ai_delegated_runs_belong_to_the_invoking_run(conn):
    def agent(name: str, conversation: str) -> dict:
        return {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": name,
            "gen_ai.conversation.id": conversation,
            "pydantic_ai.all_messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": f"task of {name}"}]}]
            ),
        }

    spans = [
        {
            "name": "invoke_agent manager",
            "span_id": _sid(1),
            "trace_id": TRACE,
            "attrs": agent("manager", "pai-1"),
        },
        {
            "name": "execute_tool ask_researcher",
            "span_id": _sid(2),
            "parent": _sid(1),
            "trace_id": TRACE,
            "attrs": {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "ask_researcher",
                "gen_ai.tool.call.arguments": '{"task":"Find X"}',
                "gen_ai.agent.name": "manager",
                "gen_ai.conversation.id": "pai-1",
            },
        },
        {
            "name": "invoke_agent researcher",
            "span_id": _sid(3),
            "parent": _sid(2),
            "trace_id": TRACE,
            "attrs": agent("researcher", "generated-1"),
        },
        {
            "name": "execute_tool ask_analyst",
            "span_id": _sid(4),
            "parent": _sid(3),
            "trace_id": TRACE,
            "attrs": {"gen_ai.operation.name": "execute_tool", "gen_ai.conversation.id": "generated-1"},
        },
        {
            "name": "invoke_agent analyst",
            "span_id": _sid(5),
            "parent": _sid(4),
            "trace_id": TRACE,
            "attrs": agent("analyst", "generated-2"),
        },
    ]
    _ingest(conn, spans[2:], "pydantic-ai")  # the delegated runs end (and are exported) first
    _ingest(conn, spans[:2], "pydantic-ai")
    rows = _rows(conn, "run_id, agent_id, hop, input_text")
    assert {row[0] for row in rows.values()} == {"pai-1"}
    assert [rows[f"invoke_agent {name}"][2] for name in ("manager", "researcher", "analyst")] == [0, 1, 2]
    assert "task of researcher" in rows["invoke_agent researcher"][3]


def test_crewai_coworker_tool_is_a_delegation():
    out = map_coordination(
        {
            "openinference.span.kind": "TOOL",
            "tool.name": "Delegate work to coworker",
            "tool.agent_role": "Crew Manager",
            "input.value": '{"task": "Find X", "context": "...", "coworker": "Researcher"}',
        },
        {},
        name="Delegate work to coworker.run",
    )
    assert (out["op"], out["agent_id"], out["delegate_to"], out["span_family"]) == (
        "delegate",
        "Crew Manager",
        "Researcher",
        "tool",
    )
    assert out["tool_args"] == '{"task": "Find X", "context": "...", "coworker": "Researcher"}'


def test_driftscope_spans_keep_their_stated_hops_and_runs(conn):
    """Guards state hops and runs themselves; nesting does not overwrite them."""
    spans = [
        {
            "name": "orchestrator",
            "span_id": _sid(1),
            "trace_id": TRACE,
            "attrs": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": "orch", "gen_ai.conversation.id": "r1",
                      "driftscope.task.id": "t0"},
        },
        {
            "name": "planner",
            "span_id": _sid(2),
            "parent": _sid(1),
            "trace_id": TRACE,
            "attrs": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": "planner", "gen_ai.conversation.id": "r2",
                      "driftscope.hop": 3, "driftscope.task.id": "t1"},
        },
    ]  # fmt: skip
    _ingest(conn, spans, "guards")
    assert _rows(conn, "run_id, hop") == {"orchestrator": ("r1", None), "planner": ("r2", 3)}


def test_every_key_of_the_convention_table_is_documented():
    """docs/semantic-conventions.md names every attribute key the table reads."""
    text = DOCS.read_text()

    def documented_as(key: str) -> str:  # an event source is documented by its event's name
        return key.split(":")[1] if key.startswith("event:") else key.split(":", 1)[-1]

    missing = sorted(
        {
            documented_as(source.key)
            for rule in RULES
            for source in rule.sources
            if not source.key.startswith(("column:", "span:"))
            and f"`{documented_as(source.key)}`" not in text
        }
    )
    assert not missing, f"not in {DOCS.name}: {missing}"
    assert re.search(r"(?m)^## smolagents", text)


def test_agent_without_input_takes_its_invocation_or_first_model_call_input(conn):
    session = {"session.id": "oai-2"}
    spans = [
        {
            "name": "manager",
            "span_id": _sid(1),
            "trace_id": TRACE,
            "attrs": {"openinference.span.kind": "AGENT", "agent.name": "manager", **session},
        },
        {"name": "turn", "span_id": _sid(2), "parent": _sid(1), "trace_id": TRACE,
         "attrs": {"openinference.span.kind": "CHAIN", **session}},
        {
            "name": "generation",
            "span_id": _sid(3),
            "parent": _sid(2),
            "trace_id": TRACE,
            "start": 1_700_000_000_000_000_100,
            "attrs": {
                "openinference.span.kind": "LLM",
                "input.value": '[{"role": "user", "content": "What is Fabrikam\'s market share in Germany?"}]',
                **session,
            },
        },
        {
            "name": "later generation",
            "span_id": _sid(4),
            "parent": _sid(2),
            "trace_id": TRACE,
            "start": 1_700_000_000_000_000_900,
            "attrs": {"openinference.span.kind": "LLM", "input.value": "later", **session},
        },
        {
            "name": "execute_task researcher",
            "span_id": _sid(5),
            "parent": _sid(1),
            "trace_id": TRACE,
            "attrs": {"traceloop.span.kind": "task", "gen_ai.task.input": '{"inputs": {"task": "Find X"}}', **session},
        },
        {
            "name": "invoke_agent researcher",
            "span_id": _sid(6),
            "parent": _sid(5),
            "trace_id": TRACE,
            "attrs": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher", **session},
        },
    ]  # fmt: skip
    _ingest(conn, spans, OPENAI_AGENTS)
    rows = _rows(conn, "input_text")
    assert rows["manager"] == (
        '[{"role": "user", "content": "What is Fabrikam\'s market share in Germany?"}]',
    )
    assert rows["invoke_agent researcher"] == ('{"inputs": {"task": "Find X"}}',)


def test_a_rule_added_to_the_table_needs_no_other_code():
    """The mapper is generated from the rules: a new source in a rule is all it takes."""
    from collector import conventions

    rules = tuple(
        conventions.Rule(
            rule.column, (conventions.Source("example", "example.agent"), *rule.sources), rule.kind
        )
        if rule.column == "agent_name"
        else rule
        for rule in RULES
    )
    namespace = dict(conventions._ENV)
    exec(conventions.generate_mapper(rules), namespace)  # noqa: S102
    out = namespace["map_span"]({"example.agent": "scout"}, {}, "", "")
    assert (out[conventions._INDEX["agent_name"]], out[conventions._INDEX["agent_id"]]) == ("scout", "scout")
    with pytest.raises(ValueError, match="not mapped before"):
        conventions.generate_mapper(
            (conventions.Rule("agent_id", (conventions.Source("x", "column:agent_name"),)),)
        )
