"""Map span attributes of every supported convention onto driftscope's typed columns.

Pure functions: attributes in (already converted to Python values), column values out. The
precedence is driftscope / OpenTelemetry GenAI first, then OpenInference, then OpenLLMetry
(docs/semantic-conventions.md).
"""

from __future__ import annotations

import json
from typing import Any

# The OpenTelemetry columns of `spans`, in table order (collector/migrations/0003_attribute_lists.sql);
# the coordination columns below follow them.
OTEL_COLUMNS = (
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ResourceAttributes",
    "ScopeName",
    "ScopeVersion",
    "SpanAttributes",
    "Duration",
    "StatusCode",
    "StatusMessage",
    "Events",
    "Links",
    "start_ns",
    "end_ns",
)
ATTRIBUTE_COLUMNS = ("ResourceAttributes", "SpanAttributes")

# Column order of the coordination fields, as in collector/migrations/0001_initial.sql.
COORDINATION_COLUMNS = (
    "span_family",
    "operation",
    "agent_id",
    "agent_name",
    "agent_source",
    "tool_name",
    "tool_call_id",
    "tool_args",
    "tool_result",
    "run_id",
    "input_text",
    "output_text",
    "graph_node_id",
    "graph_node_parent_id",
    "op",
    "state_key",
    "state_version",
    "state_expected_version",
    "outcome",
    "reject_reason",
    "task_id",
    "origin_task_id",
    "hop",
    "delegate_to",
    "constraints_ledger",
    "constraints_carried",
    "constraints_waived",
    "waiver_reasons",
    "acceptance_constraint_ids",
    "goal_root",
    "goal_text",
    "objective_id",
    "objective_version",
    "objective_superseded",
    "policy_version",
    "step",
    "budget_max_steps",
    "idempotency_key",
    "side_effect",
    "guard",
    "policy_current_version",
    "scenario",
)

LIST_COLUMNS = frozenset(
    {
        "constraints_ledger",
        "constraints_carried",
        "constraints_waived",
        "waiver_reasons",
        "acceptance_constraint_ids",
    }
)
INT_COLUMNS = frozenset({"hop", "step", "budget_max_steps"})
BOOL_COLUMNS = frozenset({"objective_superseded", "side_effect"})

# driftscope.* attribute -> column (one-to-one).
_DRIFTSCOPE_FIELDS = {
    "driftscope.op": "op",
    "driftscope.state.key": "state_key",
    "driftscope.state.version": "state_version",
    "driftscope.state.expected_version": "state_expected_version",
    "driftscope.outcome": "outcome",
    "driftscope.reject_reason": "reject_reason",
    "driftscope.task.id": "task_id",
    "driftscope.task.origin_id": "origin_task_id",
    "driftscope.hop": "hop",
    "driftscope.delegate.to": "delegate_to",
    "driftscope.constraints.ledger": "constraints_ledger",
    "driftscope.constraints.carried": "constraints_carried",
    "driftscope.constraints.waived": "constraints_waived",
    "driftscope.constraints.waiver_reasons": "waiver_reasons",
    "driftscope.acceptance.constraint_ids": "acceptance_constraint_ids",
    "driftscope.goal.root": "goal_root",
    "driftscope.goal.text": "goal_text",
    "driftscope.objective.id": "objective_id",
    "driftscope.objective.version": "objective_version",
    "driftscope.objective.superseded": "objective_superseded",
    "driftscope.policy.version": "policy_version",
    "driftscope.step": "step",
    "driftscope.budget.max_steps": "budget_max_steps",
    "driftscope.idempotency_key": "idempotency_key",
    "driftscope.side_effect": "side_effect",
    "driftscope.guard": "guard",
    "driftscope.policy.current_version": "policy_current_version",
    "driftscope.scenario": "scenario",
}

_OPENINFERENCE_FAMILY = {
    "AGENT": "agent",
    "TOOL": "tool",
    "CHAIN": "chain",
    "LLM": "llm",
    "RETRIEVER": "tool",
    "EMBEDDING": "llm",
    "RERANKER": "tool",
    "GUARDRAIL": "chain",
    "EVALUATOR": "chain",
}
_TRACELOOP_FAMILY = {
    "agent": "agent",
    "tool": "tool",
    "workflow": "chain",
    "task": "chain",
    "llm": "llm",
}
_GENAI_FAMILY = {
    "invoke_agent": "agent",
    "create_agent": "agent",
    "execute_tool": "tool",
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "llm",
}
_FAMILY_OPERATION = {"agent": "invoke_agent", "tool": "execute_tool"}


def _json_fallback(value: Any) -> str:
    return value.hex() if isinstance(value, (bytes, bytearray)) else str(value)


def _text(value: Any) -> str | None:
    """A scalar as text; structured values as compact JSON; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_fallback)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if -(2**31) <= value < 2**31 else None
    if isinstance(value, float) and value.is_integer():
        return _int(int(value))
    if isinstance(value, str):
        try:
            return _int(int(value.strip()))
        except ValueError:
            return None
    return None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
    if isinstance(value, int):
        return bool(value)
    return None


def _str_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [_text(item) or "" for item in value]
    if isinstance(value, str):
        # Some SDKs flatten arrays into JSON strings; accept those, else a single id.
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                parsed = json.loads(stripped)
            except (ValueError, RecursionError):  # "[" * 5000 nests past the recursion limit
                return [value]
            if isinstance(parsed, list):
                try:
                    return [_text(item) or "" for item in parsed]
                except RecursionError:
                    return [value]
        return [value]
    return [_text(value) or ""]


def _coerce(column: str, value: Any) -> Any:
    if column in LIST_COLUMNS:
        return _str_list(value)
    if column in INT_COLUMNS:
        return _int(value)
    if column in BOOL_COLUMNS:
        return _bool(value)
    return _text(value)


_COERCERS = {
    column: _str_list
    if column in LIST_COLUMNS
    else _int
    if column in INT_COLUMNS
    else _bool
    if column in BOOL_COLUMNS
    else _text
    for column in _DRIFTSCOPE_FIELDS.values()
}


def _first(attrs: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


def _langgraph_node(metadata: Any) -> str | None:
    """LangGraph's node name, which the OpenInference LangChain instrumentation puts in the
    ``metadata`` attribute (a JSON object) rather than in ``graph.node.id``."""
    if isinstance(metadata, str) and "langgraph_node" in metadata:
        try:
            metadata = json.loads(metadata)
        except (ValueError, RecursionError):
            return None
    if isinstance(metadata, dict):
        node = metadata.get("langgraph_node")
        return node if isinstance(node, str) and node else None
    return None


def map_coordination(attrs: dict[str, Any], resource: dict[str, Any]) -> dict[str, Any]:
    """Extract the coordination columns from one span's attributes.

    ``attrs`` and ``resource`` map attribute keys to Python values (str, int, float, bool,
    bytes, list, dict). Returns a dict with every name in ``COORDINATION_COLUMNS``; unknown or
    absent fields are None. Values of the wrong type are coerced when unambiguous, else None.
    """
    out: dict[str, Any] = dict.fromkeys(COORDINATION_COLUMNS)
    # Each driftscope.* key maps to its own column, so walking whichever of the two is smaller
    # gives the same result; spans usually carry far fewer attributes than the 25 fields.
    if len(attrs) < len(_DRIFTSCOPE_FIELDS):
        fields = _DRIFTSCOPE_FIELDS
        for key, value in attrs.items():
            column = fields.get(key)
            if column is not None and value is not None:
                out[column] = _COERCERS[column](value)
    else:
        for key, column in _DRIFTSCOPE_FIELDS.items():
            value = attrs.get(key)
            if value is not None:
                out[column] = _coerce(column, value)

    oi_kind = _text(attrs.get("openinference.span.kind"))
    tl_kind = _text(attrs.get("traceloop.span.kind"))
    operation = _text(attrs.get("gen_ai.operation.name"))
    family = None
    if operation:
        family = _GENAI_FAMILY.get(operation)
    if family is None and oi_kind:
        family = _OPENINFERENCE_FAMILY.get(oi_kind.upper())
    if family is None and tl_kind:
        family = _TRACELOOP_FAMILY.get(tl_kind.lower())
    if family is None and out["op"] is not None:
        family = "tool"
    out["span_family"] = family or "other"
    out["operation"] = operation or _FAMILY_OPERATION.get(family or "")

    entity = _text(attrs.get("traceloop.entity.name"))
    out["input_text"] = _text(_first(attrs, "input.value", "traceloop.entity.input"))
    out["output_text"] = _text(_first(attrs, "output.value", "traceloop.entity.output"))
    out["graph_node_id"] = _text(attrs.get("graph.node.id")) or _langgraph_node(attrs.get("metadata"))
    out["graph_node_parent_id"] = _text(attrs.get("graph.node.parent_id"))

    agent_name = _first(attrs, "gen_ai.agent.name", "agent.name")
    if agent_name is None and family == "agent":
        agent_name = entity or out["graph_node_id"]
    agent_id = _first(attrs, "gen_ai.agent.id")
    if agent_id is None:
        agent_id = agent_name
    out["agent_id"] = _text(agent_id)
    out["agent_name"] = _text(agent_name)
    out["agent_source"] = "attribute" if agent_id is not None else None

    tool_name = _first(attrs, "gen_ai.tool.name", "tool.name")
    if tool_name is None and family == "tool":
        tool_name = entity
    out["tool_name"] = _text(tool_name)
    out["tool_call_id"] = _text(_first(attrs, "gen_ai.tool.call.id", "tool_call.id"))
    args = _first(attrs, "gen_ai.tool.call.arguments", "tool.parameters")
    if args is None and family == "tool":
        args = out["input_text"]
    out["tool_args"] = _text(args)
    result = _first(attrs, "gen_ai.tool.call.result")
    if result is None and family == "tool":
        result = out["output_text"]
    out["tool_result"] = _text(result)

    run = _first(
        attrs,
        "gen_ai.conversation.id",
        "session.id",
        "traceloop.association.properties.session_id",
        "traceloop.association.properties.conversation_id",
    )
    if run is None:
        run = _first(resource, "gen_ai.conversation.id", "session.id")
    out["run_id"] = _text(run)
    return out
