"""GenAI-native hand-offs and task text (Google ADK, Strands) through the convention table."""

from __future__ import annotations

import json

from collector.conventions import genai_user_text, map_coordination


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
