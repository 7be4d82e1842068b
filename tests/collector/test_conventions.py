from collector.conventions import COORDINATION_COLUMNS, map_coordination


def test_genai_and_driftscope_fields_map_to_typed_columns():
    attrs = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.agent.id": "writer-1",
        "gen_ai.agent.name": "Writer",
        "gen_ai.tool.name": "write_state",
        "gen_ai.tool.call.id": "call-7",
        "gen_ai.tool.call.arguments": '{"key": "plan"}',
        "gen_ai.tool.call.result": "ok",
        "gen_ai.conversation.id": "run-1",
        "driftscope.op": "write",
        "driftscope.state.key": "plan",
        "driftscope.state.version": "v-b",
        "driftscope.state.expected_version": "v-a",
        "driftscope.outcome": "rejected",
        "driftscope.reject_reason": "version_conflict",
        "driftscope.hop": 2,
        "driftscope.constraints.carried": ["c1", "c2"],
        "driftscope.constraints.waived": ["c3"],
        "driftscope.constraints.waiver_reasons": ["not applicable to research"],
        "driftscope.objective.superseded": True,
        "driftscope.step": "4",
        "driftscope.side_effect": True,
    }
    out = map_coordination(attrs, {})
    assert set(out) == set(COORDINATION_COLUMNS)
    assert out["span_family"] == "tool" and out["operation"] == "execute_tool"
    assert (out["agent_id"], out["agent_name"], out["agent_source"]) == ("writer-1", "Writer", "attribute")
    assert (out["tool_name"], out["tool_call_id"], out["tool_args"]) == (
        "write_state",
        "call-7",
        '{"key": "plan"}',
    )
    assert out["run_id"] == "run-1"
    assert (out["op"], out["state_key"], out["state_version"], out["state_expected_version"]) == (
        "write", "plan", "v-b", "v-a",
    )  # fmt: skip
    assert (out["outcome"], out["reject_reason"], out["hop"]) == ("rejected", "version_conflict", 2)
    assert out["constraints_carried"] == ["c1", "c2"] and out["waiver_reasons"] == [
        "not applicable to research"
    ]
    assert out["objective_superseded"] is True and out["step"] == 4 and out["side_effect"] is True


def test_unversioned_write_has_no_expected_version():
    out = map_coordination({"driftscope.op": "write", "driftscope.state.key": "k"}, {})
    assert out["state_expected_version"] is None and out["span_family"] == "tool"


def test_openinference_spans_land_in_the_same_columns():
    agent = map_coordination(
        {
            "openinference.span.kind": "AGENT",
            "agent.name": "researcher",
            "session.id": "s-9",
            "input.value": "Find X",
        },
        {},
    )
    assert (agent["span_family"], agent["operation"], agent["agent_id"], agent["run_id"]) == (
        "agent", "invoke_agent", "researcher", "s-9",
    )  # fmt: skip
    assert agent["input_text"] == "Find X"
    tool = map_coordination(
        {
            "openinference.span.kind": "TOOL",
            "tool.name": "web_search",
            "input.value": '{"q": "fx"}',
            "output.value": "[]",
            "graph.node.id": "tools",
            "graph.node.parent_id": "agent",
        },
        {},
    )
    assert (tool["span_family"], tool["tool_name"], tool["tool_args"], tool["tool_result"]) == (
        "tool", "web_search", '{"q": "fx"}', "[]",
    )  # fmt: skip
    assert tool["agent_id"] is None and tool["graph_node_parent_id"] == "agent"


def test_openllmetry_spans_land_in_the_same_columns():
    agent = map_coordination(
        {
            "traceloop.span.kind": "agent",
            "traceloop.entity.name": "planner",
            "traceloop.entity.input": "plan it",
        },
        {},
    )
    assert (agent["span_family"], agent["agent_id"], agent["input_text"]) == ("agent", "planner", "plan it")
    tool = map_coordination(
        {
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "lookup",
            "traceloop.entity.input": '{"id": 1}',
        },
        {},
    )
    assert (tool["span_family"], tool["tool_name"], tool["tool_args"]) == ("tool", "lookup", '{"id": 1}')
    workflow = map_coordination({"traceloop.span.kind": "workflow", "traceloop.workflow.name": "crew"}, {})
    assert workflow["span_family"] == "chain"


def test_precedence_prefers_genai_over_openinference():
    out = map_coordination(
        {"gen_ai.tool.name": "a", "tool.name": "b", "gen_ai.conversation.id": "r", "session.id": "s"}, {}
    )
    assert out["tool_name"] == "a" and out["run_id"] == "r"


def test_wrongly_typed_values_are_coerced_or_dropped():
    out = map_coordination(
        {
            "driftscope.hop": "two",
            "driftscope.constraints.ledger": '["c1","c2"]',
            "driftscope.side_effect": "yes",
        },
        {},
    )
    assert out["hop"] is None and out["constraints_ledger"] == ["c1", "c2"] and out["side_effect"] is True


def test_langgraph_node_in_openinference_metadata_names_the_agent():
    metadata = '{"langgraph_step": 2, "langgraph_node": "researcher", "thread_id": "t1"}'
    agent = map_coordination({"openinference.span.kind": "AGENT", "metadata": metadata}, {})
    assert (agent["graph_node_id"], agent["agent_id"]) == ("researcher", "researcher")
    chain = map_coordination({"openinference.span.kind": "CHAIN", "metadata": "not json langgraph_node"}, {})
    assert chain["graph_node_id"] is None and chain["agent_id"] is None


def test_tool_schema_is_never_taken_for_the_call_arguments():
    schema = '{"query": {"type": "string", "description": "The search query"}}'
    out = map_coordination(
        {"openinference.span.kind": "TOOL", "tool.name": "web_search", "tool.parameters": schema}, {}
    )
    assert out["tool_name"] == "web_search" and out["tool_args"] is None
    out = map_coordination(
        {"openinference.span.kind": "TOOL", "tool.parameters": schema, "input.value": '{"query": "fx"}'}, {}
    )
    assert out["tool_args"] == '{"query": "fx"}'


def test_resource_run_and_string_values_as_the_decoders_pass_them():
    out = map_coordination(
        {"driftscope.hop": "2", "driftscope.constraints.ledger": '["C1","C2"]'}, {"session.id": "s"}
    )
    assert (out["hop"], out["constraints_ledger"], out["run_id"]) == (2, ["C1", "C2"], "s")
