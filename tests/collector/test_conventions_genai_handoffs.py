"""GenAI-native hand-offs and task text (Google ADK, Strands) through the convention table."""

from __future__ import annotations

import json

import duckdb

from collector.conventions import genai_user_text, map_coordination
from collector.decode import PROTOBUF, decode_payload
from collector.migrations_runner import apply_migrations
from collector.store import insert_batches
from tests.otlp_builders import make_request


def _tool(name: str, **attrs: str) -> dict:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.agent.name": "manager",
        **attrs,
    }


def test_hand_off_tools_are_delegations_to_the_agent_they_name():
    for tool in ("transfer_to_agent", "handoff_to_agent"):
        args = json.dumps({"agent_name": "researcher", "message": "over to you"})
        row = map_coordination(_tool(tool, **{"gen_ai.tool.call.arguments": args}), {})
        assert (row["op"], row["agent_id"], row["delegate_to"]) == ("delegate", "manager", "researcher")
    # without captured arguments it is still a hand-off, its target unknown
    row = map_coordination(_tool("transfer_to_agent"), {})
    assert (row["op"], row["delegate_to"]) == ("delegate", None)


def test_an_adk_agent_called_as_a_tool_is_a_delegation_to_that_agent():
    row = map_coordination(_tool("researcher", **{"gen_ai.tool.type": "AgentTool"}), {})
    assert (row["op"], row["delegate_to"], row["tool_name"]) == ("delegate", "researcher", "researcher")
    row = map_coordination(_tool("web_search", **{"gen_ai.tool.type": "FunctionTool"}), {})
    assert row["op"] is None and row["delegate_to"] is None


def test_a_model_calls_request_is_its_last_user_text_without_transcript_wrappers():
    messages = [
        {"role": "user", "parts": [{"type": "text", "content": "What was Northwind's EU revenue in 2024?"}]},
        {"role": "user", "parts": [{"type": "text", "content": "For context: below is a transcript of ..."}]},
        # ADK's quote of another agent's turn: the note, then the quoted turn as a second part
        {
            "role": "user",
            "parts": [
                {
                    "type": "text",
                    "content": "For context: below is a transcript of what another agent did ...",
                },
                {"type": "text", "content": "[manager] `transfer_to_agent` tool returned result: ..."},
            ],
        },
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "name": "web_search", "arguments": {"query": "x"}}],
        },
        {"role": "user", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"result": "y"}}]},
    ]
    row = map_coordination(
        {"gen_ai.operation.name": "generate_content", "gen_ai.input.messages": json.dumps(messages)}, {}
    )
    assert row["span_family"] == "llm"
    assert row["input_text"] == "What was Northwind's EU revenue in 2024?"
    assert genai_user_text("not json") is None and genai_user_text("[1, 2]") is None


def test_an_adk_agent_tool_nested_session_joins_the_invoking_run():
    trace = bytes(range(16))

    def span(n: int, name: str, parent: int | None, **attrs: str) -> dict:
        out = {"name": name, "span_id": n.to_bytes(8, "big"), "trace_id": trace, "attrs": attrs}
        if parent:
            out["parent"] = parent.to_bytes(8, "big")
        return out

    spans = [
        span(1, "invoke_workflow manager", None, **{"gen_ai.operation.name": "invoke_workflow",
             "gen_ai.conversation.id": "adk-1"}),
        span(2, "invoke_agent manager", 1, **{"gen_ai.operation.name": "invoke_agent",
             "gen_ai.agent.name": "manager", "gen_ai.conversation.id": "adk-1"}),
        # ADK's tool span names no conversation; the agent it calls runs in a nested session
        span(3, "execute_tool researcher", 2, **{"gen_ai.operation.name": "execute_tool",
             "gen_ai.tool.name": "researcher", "gen_ai.tool.type": "AgentTool", "gen_ai.agent.name": "manager"}),
        span(4, "invoke_workflow researcher", 3, **{"gen_ai.operation.name": "invoke_workflow",
             "gen_ai.conversation.id": "nested-uuid"}),
        span(5, "invoke_agent researcher", 4, **{"gen_ai.operation.name": "invoke_agent",
             "gen_ai.agent.name": "researcher", "gen_ai.conversation.id": "nested-uuid"}),
    ]  # fmt: skip
    conn = duckdb.connect(":memory:")
    apply_migrations(conn)
    conn.execute("BEGIN")
    insert_batches(conn, [decode_payload(make_request(spans).SerializeToString(), PROTOBUF)])
    conn.execute("COMMIT")
    runs = dict(conn.execute("SELECT SpanName, run_id FROM spans").fetchall())
    assert set(runs.values()) == {"adk-1"}, runs


def test_strands_default_content_in_span_events_is_read():
    tool_events = json.dumps(
        [
            {
                "Timestamp": 1,
                "Name": "gen_ai.tool.message",
                "Attributes": {"role": "tool", "content": '{"query": "x"}'},
            }
        ]
    )
    row = map_coordination(_tool("web_search"), {}, events=tool_events)
    assert row["tool_args"] == '{"query": "x"}'
    user = [
        {
            "Timestamp": 1,
            "Name": "gen_ai.system.message",
            "Attributes": {"content": '[{"text": "You find facts."}]'},
        },
        {"Timestamp": 2, "Name": "gen_ai.user.message", "Attributes": {"content": '[{"text": "Find X."}]'}},
        {
            "Timestamp": 3,
            "Name": "gen_ai.user.message",
            "Attributes": {"content": '[{"toolResult": {"id": "t1"}}]'},
        },
    ]
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher"}
    assert map_coordination(agent, {}, events=json.dumps(user))["input_text"] == "Find X."
    # the GenAI event form (Strands under the latest conventions)
    details = [
        {
            "Timestamp": 1,
            "Name": "gen_ai.client.inference.operation.details",
            "Attributes": {"gen_ai.input.messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": "Find Y."}]}])},
        }
    ]  # fmt: skip
    assert map_coordination(agent, {}, events=json.dumps(details))["input_text"] == "Find Y."
    # a tool span's own arguments attribute wins over its event
    row = map_coordination(
        _tool("web_search", **{"gen_ai.tool.call.arguments": '{"query": "z"}'}), {}, events=tool_events
    )
    assert row["tool_args"] == '{"query": "z"}'


def test_agent_framework_agent_ids_are_per_object_uuids_so_the_name_is_the_agent():
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher",
             "gen_ai.agent.id": "7dce1aab-1820-4987-bb81-4f0bbf90f7a8"}  # fmt: skip
    assert map_coordination(attrs, {}, scope="agent_framework")["agent_id"] == "researcher"
    assert (
        map_coordination(attrs, {}, scope="pydantic-ai")["agent_id"] == "7dce1aab-1820-4987-bb81-4f0bbf90f7a8"
    )


def test_a_tool_that_runs_another_agent_is_a_delegation_to_it():
    trace = bytes(range(1, 17))

    def span(n: int, name: str, parent: int | None, **attrs: str) -> dict:
        out = {"name": name, "span_id": n.to_bytes(8, "big"), "trace_id": trace, "attrs": attrs}
        if parent:
            out["parent"] = parent.to_bytes(8, "big")
        return out

    agent = {"gen_ai.operation.name": "invoke_agent"}
    tool = {"gen_ai.operation.name": "execute_tool"}
    spans = [  # children end (and are exported) first
        span(3, "invoke_agent researcher", 2, **agent, **{"gen_ai.agent.name": "researcher"}),
        span(4, "execute_tool web_search", 3, **tool, **{"gen_ai.tool.name": "web_search"}),
        span(2, "execute_tool ask_researcher", 1, **tool, **{"gen_ai.tool.name": "ask_researcher",
             "gen_ai.tool.call.arguments": '{"task": "Find X."}'}),
        span(1, "invoke_agent manager", None, **agent, **{"gen_ai.agent.name": "manager",
             "gen_ai.conversation.id": "run-7"}),
    ]  # fmt: skip
    conn = duckdb.connect(":memory:")
    apply_migrations(conn)
    for one in spans:  # one request per span, as a batching exporter may send them
        conn.execute("BEGIN")
        insert_batches(conn, [decode_payload(make_request([one]).SerializeToString(), PROTOBUF)])
        conn.execute("COMMIT")
    rows = {
        r[0]: r[1:] for r in conn.execute("SELECT SpanName, agent_id, op, delegate_to FROM spans").fetchall()
    }
    assert rows["execute_tool ask_researcher"] == ("manager", "delegate", "researcher")
    assert rows["execute_tool web_search"] == ("researcher", None, None)  # a tool that runs no agent
