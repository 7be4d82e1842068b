"""The convention table: which span attribute becomes which coordination column, and the mapping
it drives.

``RULES`` is the one place where the precedence of driftscope / OpenTelemetry GenAI /
OpenInference / OpenLLMetry / framework keys is stated: per column, the places its value may
come from, in order (the first non-empty one wins), each with the condition under which it
applies and how its value is read. ``map_coordination`` (one span, the reference) and
``collector.mapping_plans.map_columns`` (a decoded batch, both decoders; the table specialised on
the keys a span has) apply it; docs/semantic-conventions.md documents it per framework and
tests/collector/test_mapping_plans.py holds the two equal. Decoders hand attributes over as OTLP's string map (the
``SpanAttributes`` values, non-strings JSON-encoded), which is also what a ClickHouse
``otel_traces`` row holds, so a view generated from this table would read the same values.

Pure functions, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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

# Instrumentation scope names (the OTLP InstrumentationScope.name each library sets).
SCOPE_SMOLAGENTS = "openinference.instrumentation.smolagents"
SCOPE_OPENAI_AGENTS = "openinference.instrumentation.openai_agents"
SCOPE_TRACELOOP_LANGCHAIN = "opentelemetry.instrumentation.langchain"
SCOPE_TRACELOOP_CREWAI = "opentelemetry.instrumentation.crewai"
# Microsoft Agent Framework: its `gen_ai.agent.id` is a new UUID per Agent object by default.
SCOPE_AGENT_FRAMEWORK = "agent_framework"
# CrewAI's tools through which a manager hands work to a coworker.
CREWAI_DELEGATION_TOOLS = frozenset({"Delegate work to coworker", "Ask question to coworker"})
# OpenAI Agents names a hand-off span "handoff to <agent>".
HANDOFF_PREFIX = "handoff to "
# Tools through which GenAI-native frameworks hand the conversation to another agent, named by
# the call's `agent_name` argument: Google ADK's `transfer_to_agent`, Strands' Swarm
# `handoff_to_agent`.
GENAI_HANDOFF_TOOLS = frozenset({"transfer_to_agent", "handoff_to_agent"})
GENAI_TOOL_NAME_KEY = "gen_ai.tool.name"
# Google ADK types an agent called as a tool (`AgentTool`) in `gen_ai.tool.type`; the tool is
# named after the agent.
ADK_AGENT_TOOL_TYPE = "AgentTool"
GENAI_TOOL_TYPE_KEY = "gen_ai.tool.type"
# Message texts that are a framework's transcript of other agents' turns, not a request: ADK
# quotes them to the agent a conversation is transferred to ("For context: below is a transcript
# of what another agent did ...").
TRANSCRIPT_PREFIXES = ("For context:",)
# The attributes two readers and a condition look at besides their source's value.
SMOLAGENTS_TASK_KEY = "input.value"  # a managed agent's prompt, which names it
CREWAI_TOOL_KEY = "tool.name"  # the tool a CrewAI span calls
# smolagents agent classes: a `<class>.run` span name names no agent of its own.
SMOLAGENTS_AGENT_CLASSES = frozenset(
    {"MultiStepAgent", "CodeAgent", "ToolCallingAgent", "StructuredCodeAgent", "ManagedAgent"}
)


@dataclass(frozen=True)
class Source:
    """One place a column's value may come from.

    ``key`` is a span attribute key, or ``resource:<key>`` (a resource attribute), ``span:name``
    (the span's name), ``column:<name>`` (a column mapped earlier in the table) or
    ``event:<event name>:<key>`` (the values of that attribute on the span's events of that name,
    in order: a list, so such a source always has a reader). ``when`` names
    a condition of ``CONDITIONS`` the span must meet (empty: always); ``read`` names a function of
    ``READERS`` that turns the raw value into the column's (empty: the value as it is); a source
    whose value is absent, empty, or read as None gives way to the next one.
    """

    convention: str
    key: str
    when: str = ""
    read: str = ""


@dataclass(frozen=True)
class Rule:
    """A coordination column: its sources in order of precedence, its type, its default."""

    column: str
    sources: tuple[Source, ...]
    kind: str = "text"  # text | int | bool | list
    default: str | None = None


def _kind(column: str) -> str:
    if column in LIST_COLUMNS:
        return "list"
    if column in INT_COLUMNS:
        return "int"
    if column in BOOL_COLUMNS:
        return "bool"
    return "text"


# driftscope.* attribute -> column (one-to-one; the guards write these).
_DRIFTSCOPE_KEYS = {
    "driftscope.state.key": "state_key",
    "driftscope.state.version": "state_version",
    "driftscope.state.expected_version": "state_expected_version",
    "driftscope.outcome": "outcome",
    "driftscope.reject_reason": "reject_reason",
    "driftscope.task.id": "task_id",
    "driftscope.task.origin_id": "origin_task_id",
    "driftscope.hop": "hop",
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

S = Source
# The convention table. Rules are applied in this order, so a `column:` source only names a
# column of an earlier rule; within a rule the first source with a value wins.
RULES: tuple[Rule, ...] = (
    *(Rule(column, (S("driftscope", key),), _kind(column)) for key, column in _DRIFTSCOPE_KEYS.items()),
    Rule(
        "op",
        (
            S("driftscope", "driftscope.op"),
            # Hand-offs between agents are delegations: an OpenAI Agents handoff ("handoff to
            # <agent>", a TOOL span), a LangGraph Command (OpenLLMetry's `goto <node>` span), a
            # CrewAI manager's "Delegate work to coworker" / "Ask question to coworker" tool.
            S("openai-agents", "span:name", when="openai_agents_handoff", read="delegate"),
            S("openllmetry", "langgraph.command.goto_node", read="delegate"),
            S("crewai", "tool.name", when="crewai_delegation", read="delegate"),
            # ADK's transfer_to_agent, Strands' handoff_to_agent; an ADK AgentTool call
            S("genai", "gen_ai.tool.name", when="genai_handoff", read="delegate"),
            S("adk", "gen_ai.tool.type", when="adk_agent_tool", read="delegate"),
        ),
    ),
    Rule(
        "delegate_to",
        (
            S("driftscope", "driftscope.delegate.to"),
            S("openai-agents", "output.value", when="openai_agents_handoff"),  # the target agent
            S("openllmetry", "langgraph.command.goto_node"),
            S("crewai", "input.value", when="crewai_delegation", read="crewai_coworker"),
            S("genai", "gen_ai.tool.call.arguments", when="genai_handoff", read="handoff_agent"),
            S("adk", "gen_ai.tool.name", when="adk_agent_tool"),  # the agent the tool is
        ),
    ),
    Rule(
        "span_family",
        (
            S("genai", "gen_ai.operation.name", read="genai_family"),
            S("openinference", "openinference.span.kind", read="openinference_family"),
            S("openllmetry", "traceloop.span.kind", read="traceloop_family"),
            S("driftscope", "driftscope.op", read="tool"),  # a guard's span is a tool call
        ),
        default="other",
    ),
    Rule(
        "operation",
        (
            S("genai", "gen_ai.operation.name"),
            S("driftscope", "column:span_family", read="family_operation"),
        ),
    ),
    Rule(
        "input_text",
        (
            S("openinference", "input.value"),
            S("openllmetry", "traceloop.entity.input"),
            S("openllmetry", "gen_ai.task.input"),
            # an agent turn's conversation (the request is its first user message)
            S("genai", "gen_ai.input.messages", when="agent"),
            S("pydantic-ai", "pydantic_ai.all_messages", when="agent"),
            # a model call's request: its last user message with text (not a transcript wrapper);
            # an agent span without input takes its first model call's (collector.store)
            S("genai", "gen_ai.input.messages", when="llm", read="genai_user_text"),
            # the GenAI event form (Strands under the latest conventions)
            S(
                "genai",
                "event:gen_ai.client.inference.operation.details:gen_ai.input.messages",
                when="agent_or_llm",
                read="last_genai_user_text",
            ),
            # Strands by default: the messages are span events (`content`: a list of blocks)
            S("strands", "event:gen_ai.user.message:content", when="agent_or_llm", read="last_text_blocks"),
        ),
    ),
    Rule(
        "output_text",
        (
            S("openinference", "output.value"),
            S("openllmetry", "traceloop.entity.output"),
            S("openllmetry", "gen_ai.task.output"),
        ),
    ),
    Rule(
        "graph_node_id",
        (
            S("openinference", "graph.node.id"),
            S("openinference", "metadata", read="langgraph_node"),  # LangGraph via LangChain
            S("openllmetry", "traceloop.association.properties.langgraph_node"),
        ),
    ),
    Rule("graph_node_parent_id", (S("openinference", "graph.node.parent_id"),)),
    Rule(
        "agent_name",
        (
            S("genai", "gen_ai.agent.name"),
            S("openinference", "agent.name"),
            # smolagents: `<agent name>.run` (`<class>.run` for an unnamed agent).
            S("smolagents", "span:name", when="smolagents_agent", read="smolagents_agent"),
            S("openai-agents", "input.value", when="openai_agents_handoff"),  # the handing agent
            S("crewai", "tool.agent_role"),
            # LangGraph: the top-level node a span runs in (first segment of the checkpoint
            # namespace), so a sub-agent's inner `agent` / `tools` nodes are that sub-agent.
            S("openinference", "metadata", read="langgraph_metadata_agent"),
            S(
                "openllmetry",
                "traceloop.association.properties.langgraph_checkpoint_ns",
                read="langgraph_agent",
            ),
            S("openllmetry", "traceloop.entity.name", when="agent"),
            S("openinference", "column:graph_node_id", when="agent"),  # CrewAI role, LangGraph node
        ),
    ),
    Rule(
        "agent_id",
        (
            # OpenLLMetry's LangChain and CrewAI instrumentations and Microsoft Agent Framework put
            # a run / object UUID here, a new "agent" per call, process or Agent object; their
            # agent name is the identity.
            S("genai", "gen_ai.agent.id", when="stable_agent_id"),
            S("genai", "column:agent_name"),
        ),
    ),
    Rule("agent_source", (S("driftscope", "column:agent_id", read="attribute"),)),
    Rule(
        "tool_name",
        (
            S("genai", "gen_ai.tool.name"),
            S("openinference", "tool.name"),
            S("openllmetry", "traceloop.entity.name", when="tool_call"),
        ),
    ),
    Rule("tool_call_id", (S("genai", "gen_ai.tool.call.id"), S("openinference", "tool_call.id"))),
    Rule(
        "tool_args",
        (
            # The call's own arguments, never `tool.parameters` (the tool's JSON schema).
            S("genai", "gen_ai.tool.call.arguments", read="call_arguments"),
            S("openinference", "input.value", when="tool_call", read="call_arguments"),
            S("openllmetry", "traceloop.entity.input", when="tool_call", read="call_arguments"),
            # a CrewAI delegation's arguments are the task handed over ({"task", "context", "coworker"})
            S("crewai", "input.value", when="crewai_delegation"),
            # Strands by default: the call's input is a `gen_ai.tool.message` event
            S("strands", "event:gen_ai.tool.message:content", when="tool", read="last_value"),
        ),
    ),
    Rule(
        "tool_result",
        (
            S("genai", "gen_ai.tool.call.result"),
            S("openinference", "output.value", when="tool_call"),
            S("openllmetry", "traceloop.entity.output", when="tool_call"),
        ),
    ),
    Rule(
        "run_id",
        (
            S("genai", "gen_ai.conversation.id"),
            S("openinference", "session.id"),
            S("openllmetry", "traceloop.association.properties.session_id"),
            S("openllmetry", "traceloop.association.properties.conversation_id"),
            S("openllmetry", "traceloop.association.properties.thread_id"),  # LangGraph thread
            S("genai", "resource:gen_ai.conversation.id"),
            S("openinference", "resource:session.id"),
        ),
    ),
)
del S

# driftscope.* attribute -> column, as the table states it (for tests and tools).
_DRIFTSCOPE_FIELDS = {
    source.key: rule.column
    for rule in RULES
    for source in rule.sources
    if source.convention == "driftscope" and "." in source.key and ":" not in source.key
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
    "invoke_workflow": "chain",
    "execute_tool": "tool",
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "llm",
}
_FAMILY_OPERATION = {"agent": "invoke_agent", "tool": "execute_tool"}


def _json_fallback(value: Any) -> str:
    return value.hex() if isinstance(value, (bytes, bytearray)) else str(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_fallback)


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
    return _dumps(value)


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
        # What the decoders write for an array of plain strings: split it without a JSON parse
        # (no item holds a quote when every quote inside is one of a separator's two).
        if value.startswith('["') and value.endswith('"]') and "\\" not in value:
            inner = value[2:-2]
            if inner.count('"') == 2 * inner.count('","'):
                return inner.split('","')
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


_COERCERS: dict[str, Callable[[Any], Any]] = {"text": _text, "int": _int, "bool": _bool, "list": _str_list}


def _coerce(column: str, value: Any) -> Any:
    return _COERCERS[_kind(column)](value)


# --- readers: raw value -> column value (None: this source gives way to the next) -------------


def _parse_json_object(value: Any) -> Any:
    if isinstance(value, str):
        if not value.startswith("{"):
            return None
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return None
    return value


def _langgraph_node(metadata: Any) -> str | None:
    """LangGraph's node name, which the OpenInference LangChain instrumentation puts in the
    ``metadata`` attribute (a JSON object) rather than in ``graph.node.id``."""
    if isinstance(metadata, str) and "langgraph_node" not in metadata:
        return None
    metadata = _parse_json_object(metadata)
    if isinstance(metadata, dict):
        node = metadata.get("langgraph_node")
        return node if isinstance(node, str) and node else None
    return None


def langgraph_agent(checkpoint_ns: Any) -> str | None:
    """The top-level LangGraph node of a checkpoint namespace (``"researcher:<id>|agent:<id>"``
    -> ``"researcher"``): in a supervisor or swarm graph, the agent a span works for."""
    if not isinstance(checkpoint_ns, str) or not checkpoint_ns:
        return None
    head = checkpoint_ns.split("|", 1)[0].split(":", 1)[0]
    return head if head and not head.startswith("__") else None


def _langgraph_metadata_agent(metadata: Any) -> str | None:
    if isinstance(metadata, str) and "langgraph_checkpoint_ns" not in metadata:
        return None
    metadata = _parse_json_object(metadata)
    return langgraph_agent(metadata.get("langgraph_checkpoint_ns")) if isinstance(metadata, dict) else None


def _handoff_agent(arguments: Any) -> str | None:
    """The agent a hand-off tool call names (``{"agent_name": ...}``)."""
    parsed = _parse_json_object(arguments)
    target = parsed.get("agent_name") if isinstance(parsed, dict) else None
    return (target.strip() or None) if isinstance(target, str) else None


def event_values(events: Any, name: str, key: str) -> list[str] | None:
    """The values of attribute ``key`` on the span's events named ``name``, in order (None when
    there are none). ``events`` is the decoders' ``Events`` JSON text (or its parsed list)."""
    if isinstance(events, str):
        if name not in events:  # most spans: no such event, no JSON parse
            return None
        try:
            events = json.loads(events)
        except (ValueError, RecursionError):
            return None
    if not isinstance(events, list):
        return None
    values = [
        _text(event["Attributes"].get(key))
        for event in events
        if isinstance(event, dict)
        and event.get("Name") == name
        and isinstance(event.get("Attributes"), dict)
        and event["Attributes"].get(key) is not None
    ]
    return values or None


def _last_value(values: Any) -> str | None:
    found = [v for v in values if isinstance(v, str) and v] if isinstance(values, list) else []
    return found[-1] if found else None


def _last_genai_user_text(values: Any) -> str | None:
    """``genai_user_text`` of the last of several ``gen_ai.input.messages`` values that has one."""
    for value in reversed(values) if isinstance(values, list) else ():
        text = genai_user_text(value)
        if text:
            return text
    return None


def _last_text_blocks(values: Any) -> str | None:
    """The text of the last message (a JSON list of content blocks, ``[{"text": ...}]``) that has
    any, a framework's transcript of other agents' turns left out."""
    if not isinstance(values, list):
        return None
    for value in reversed(values):
        blocks = _parse_json_list(value)
        texts = [
            block["text"]
            for block in blocks
            if isinstance(block, dict) and isinstance(block.get("text"), str) and block["text"]
        ]
        if texts and not any(text.startswith(TRANSCRIPT_PREFIXES) for text in texts):
            return "\n".join(texts)
    return None


def _parse_json_list(value: Any) -> list:
    if isinstance(value, str) and value.startswith("["):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return []
    return value if isinstance(value, list) else []


def genai_user_text(messages: Any) -> str | None:
    """The request of a GenAI ``gen_ai.input.messages`` list: the text parts of its last user
    message that has any (``parts``, or an OpenAI-style ``content`` string as AG2 writes it), a
    framework's transcript of other agents' turns left out."""
    if isinstance(messages, str):
        if not messages.startswith("["):
            return None
        try:
            messages = json.loads(messages)
        except (ValueError, RecursionError):
            return None
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str) and content and not content.startswith(TRANSCRIPT_PREFIXES):
            return content
        parts = message.get("parts")
        texts = [
            part["content"]
            for part in (parts if isinstance(parts, list) else [])
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("content"), str)
        ]
        # a transcript message opens with the framework's note, then quotes other agents' turns
        if any(texts) and not any(text.startswith(TRANSCRIPT_PREFIXES) for text in texts):
            return "\n".join(texts)
    return None


def _crewai_coworker(arguments: Any) -> str | None:
    parsed = _parse_json_object(arguments)
    coworker = parsed.get("coworker") if isinstance(parsed, dict) else None
    return (coworker.strip() or None) if isinstance(coworker, str) else None


_WRAPPER_MARKERS = ('"args"', '"kwargs"', '"input_str"')
_SMOLAGENTS_WRAPPER_KEYS = frozenset({"args", "kwargs", "sanitize_inputs_outputs"})
_TRACELOOP_WRAPPER_KEYS = frozenset({"input_str", "inputs", "tags", "metadata", "kwargs"})


def call_arguments(value: Any) -> Any:
    """A tool call's own arguments, unwrapped from what instrumentations wrap them in.

    smolagents' ``Tool.__call__`` is traced (OpenInference) as its bound arguments
    ``{"args": [...], "sanitize_inputs_outputs": ..., "kwargs": {...}}``; OpenLLMetry's LangChain
    tool spans hold ``{"input_str", "tags", "metadata", "inputs", "kwargs"}`` (metadata carries
    per-call ids, so no two calls would look alike). Both become the arguments alone, as compact
    JSON; anything else is kept as it is.
    """
    if isinstance(value, str):
        for marker in _WRAPPER_MARKERS:
            if marker in value:
                break
        else:
            return value  # no wrapper key in the text: no JSON parse needed
    parsed = _parse_json_object(value)
    if not isinstance(parsed, dict) or not parsed:
        return value
    keys = parsed.keys()
    if keys <= _SMOLAGENTS_WRAPPER_KEYS and ("args" in keys or "kwargs" in keys):
        args = parsed.get("args") or []
        kwargs = parsed.get("kwargs") or {}
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return value
        if not args:
            return _dumps(kwargs)
        if not kwargs:
            return (
                args[0]
                if len(args) == 1 and isinstance(args[0], str)
                else _dumps(args[0] if len(args) == 1 else args)
            )
        return _dumps({"args": args, "kwargs": kwargs})
    if keys <= _TRACELOOP_WRAPPER_KEYS and "input_str" in keys:
        inputs = parsed.get("inputs")
        if isinstance(inputs, dict) and inputs:
            return _dumps(inputs)
        input_str = parsed.get("input_str")
        return input_str if isinstance(input_str, str) else value
    return value


_SMOLAGENTS_NAMED = re.compile(r"helpful agent named '([^'\n]{1,200})'")


def smolagents_agent(span_name: Any, get: Callable[[str], Any]) -> str | None:
    """The agent a smolagents ``<name>.run`` span is the run of: its name, or for an agent
    traced under its class name (instrumentations before names were used, or an unnamed
    manager), the name its managed-agent prompt gives it, else the class. ``get`` reads the
    span's attributes."""
    if not isinstance(span_name, str) or not span_name.endswith(".run"):
        return None
    name = span_name[:-4]
    if name in SMOLAGENTS_AGENT_CLASSES:
        task = get(SMOLAGENTS_TASK_KEY)
        if isinstance(task, str) and "helpful agent named" in task:
            match = _SMOLAGENTS_NAMED.search(task)
            if match:
                return match.group(1)
    return name or None


_INDEX = {column: index for index, column in enumerate(COORDINATION_COLUMNS)}

# Readers and conditions are named Python expressions, so the generated mapper inlines them (a
# ClickHouse view generated from the table would give each name its SQL expression). A reader
# turns the raw value ``v`` into the column's (``get`` reads the span's other attributes); a
# condition sees ``out`` (the columns mapped so far, by ``COLUMN[...]`` index), ``get``, the span
# ``name`` and its instrumentation ``scope``.
READERS: dict[str, str] = {
    "genai_family": "GENAI_FAMILY.get(v) if v.__class__ is str else None",
    "openinference_family": "OPENINFERENCE_FAMILY.get(str(v).upper())",
    "traceloop_family": "TRACELOOP_FAMILY.get(str(v).lower())",
    "family_operation": "FAMILY_OPERATION.get(v)",
    "langgraph_node": "langgraph_node(v)",
    # most arguments name no wrapper key: kept as they are without a call
    "call_arguments": (
        "(v if v.__class__ is str and "
        + " and ".join(f"{marker!r} not in v" for marker in _WRAPPER_MARKERS)
        + " else call_arguments(v))"
    ),
    "smolagents_agent": "smolagents_agent(v, get)",
    "langgraph_agent": "langgraph_agent(v)",
    "langgraph_metadata_agent": "langgraph_metadata_agent(v)",
    "crewai_coworker": "crewai_coworker(v)",
    "handoff_agent": "handoff_agent(v)",
    "genai_user_text": "genai_user_text(v)",
    "last_value": "last_value(v)",
    "last_text_blocks": "last_text_blocks(v)",
    "last_genai_user_text": "last_genai_user_text(v)",
    "tool": "'tool'",
    "delegate": "'delegate'",
    "attribute": "'attribute'",
}
CONDITIONS: dict[str, str] = {
    "agent": "out[COLUMN['span_family']] == 'agent'",
    "tool": "out[COLUMN['span_family']] == 'tool'",
    # a tool call proper: a tool span that is not a hand-off between agents
    "tool_call": "out[COLUMN['span_family']] == 'tool' and out[COLUMN['op']] != 'delegate'",
    "smolagents_agent": "scope == SCOPE_SMOLAGENTS and out[COLUMN['span_family']] == 'agent'",
    "openai_agents_handoff": "scope == SCOPE_OPENAI_AGENTS and name.startswith(HANDOFF_PREFIX)",
    "crewai_delegation": "str(get(CREWAI_TOOL_KEY)) in CREWAI_DELEGATION_TOOLS",
    "llm": "out[COLUMN['span_family']] == 'llm'",
    "agent_or_llm": "out[COLUMN['span_family']] in ('agent', 'llm')",
    "genai_handoff": "str(get(GENAI_TOOL_NAME_KEY)) in GENAI_HANDOFF_TOOLS",  # a list value: no hand-off
    "adk_agent_tool": "get(GENAI_TOOL_TYPE_KEY) == ADK_AGENT_TOOL_TYPE",
    "stable_agent_id": (
        "scope != SCOPE_TRACELOOP_LANGCHAIN and scope != SCOPE_TRACELOOP_CREWAI and scope != SCOPE_AGENT_FRAMEWORK"
    ),
}


# --- the same readers and conditions as ClickHouse SQL (collector.clickhouse_schema generates the
# `spans` materialized view from RULES with them; tests/collector/test_clickhouse_store.py holds
# the view equal to this module's mapping on real spans). Each takes a ``SqlContext``: ``v`` is the
# source's raw value (a non-empty String expression), ``q.get(key)`` a span attribute ('' when
# absent), ``q.name`` / ``q.scope`` the span's name and scope, ``q.column(name)`` a column mapped
# earlier.


def sql_text(text: str) -> str:
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_set(values: Any) -> str:
    return "(" + ", ".join(sql_text(value) for value in sorted(values)) + ")"


def _sql_lookup(mapping: Mapping[str, str], expr: str) -> str:
    pairs = ", ".join(f"{sql_text(k)}, {sql_text(v)}" for k, v in mapping.items())
    return f"nullIf(map({pairs})[{expr}], '')"


def _sql_json_string(v: str, key: str) -> str:
    return f"JSONExtractString({v}, {sql_text(key)})"


def _sql_langgraph_agent(v: str) -> str:
    head = f"splitByChar(':', splitByChar('|', {v})[1])[1]"
    return f"if(startsWith({head}, '__'), NULL, nullIf({head}, ''))"


def _sql_call_arguments(v: str) -> str:
    markers = " OR ".join(f"position({v}, {sql_text(marker)}) > 0" for marker in _WRAPPER_MARKERS)
    keys = f"JSONExtractKeys({v})"
    smol_keys = "[" + ", ".join(sql_text(k) for k in sorted(_SMOLAGENTS_WRAPPER_KEYS)) + "]"
    loop_keys = "[" + ", ".join(sql_text(k) for k in sorted(_TRACELOOP_WRAPPER_KEYS)) + "]"
    args = f"JSONExtractArrayRaw({v}, 'args')"
    no_args = f"(NOT JSONHas({v}, 'args') OR JSONType({v}, 'args') = 'Null' OR empty({args}))"
    no_kwargs = (
        f"(NOT JSONHas({v}, 'kwargs') OR JSONType({v}, 'kwargs') = 'Null' "
        f"OR empty(JSONExtractKeys({v}, 'kwargs')))"
    )
    kwargs = f"if({no_kwargs}, '{{}}', JSONExtractRaw({v}, 'kwargs'))"
    bad_types = (
        f"(JSONHas({v}, 'args') AND JSONType({v}, 'args') NOT IN ('Array', 'Null')) OR "
        f"(JSONHas({v}, 'kwargs') AND JSONType({v}, 'kwargs') NOT IN ('Object', 'Null'))"
    )
    one_arg = f"arrayElement({args}, 1)"
    smolagents = (
        f"multiIf({bad_types}, {v}, {no_args}, {kwargs}, {no_kwargs}, "
        f"if(length({args}) = 1, if(JSONType({one_arg}) = 'String', JSONExtractString({one_arg}), {one_arg}), "
        f"JSONExtractRaw({v}, 'args')), "
        f"concat('{{\"args\":', JSONExtractRaw({v}, 'args'), ',\"kwargs\":', {kwargs}, '}}'))"
    )
    traceloop = (
        f"multiIf(JSONType({v}, 'inputs') = 'Object' AND notEmpty(JSONExtractKeys({v}, 'inputs')), "
        f"JSONExtractRaw({v}, 'inputs'), JSONType({v}, 'input_str') = 'String', "
        f"JSONExtractString({v}, 'input_str'), {v})"
    )
    return (
        f"multiIf(NOT ({markers}), {v}, NOT (startsWith({v}, '{{') AND isValidJSON({v})) OR empty({keys}), {v}, "
        f"hasAll({smol_keys}, {keys}) AND (has({keys}, 'args') OR has({keys}, 'kwargs')), {smolagents}, "
        f"hasAll({loop_keys}, {keys}) AND has({keys}, 'input_str'), {traceloop}, {v})"
    )


def _sql_genai_user_text(v: str) -> str:
    wrapper = " OR ".join(
        f"startsWith(JSONExtractString(p, 'content'), {sql_text(x)})" for x in TRANSCRIPT_PREFIXES
    )
    texts = (
        "arrayMap(p -> JSONExtractString(p, 'content'), arrayFilter(p -> JSONExtractString(p, 'type') = 'text' "
        "AND JSONType(p, 'content') = 'String', JSONExtractArrayRaw(m, 'parts')))"
    )
    # a message any of whose text parts is a transcript note is no request
    parts_text = (
        f"if(arrayExists(p -> JSONExtractString(p, 'type') = 'text' AND ({wrapper}), JSONExtractArrayRaw(m, 'parts')), "
        f"'', arrayStringConcat({texts}, '\\n'))"
    )
    own = " OR ".join(
        f"startsWith(JSONExtractString(m, 'content'), {sql_text(x)})" for x in TRANSCRIPT_PREFIXES
    )
    text = (
        f"if(JSONType(m, 'content') = 'String' AND JSONExtractString(m, 'content') != '' AND NOT ({own}), "
        f"JSONExtractString(m, 'content'), {parts_text})"
    )
    per_message = (
        f"arrayMap(m -> if(JSONExtractString(m, 'role') = 'user', {text}, ''), JSONExtractArrayRaw({v}))"
    )
    return f"if(startsWith({v}, '['), nullIf(arrayLast(t -> t != '', {per_message}), ''), NULL)"


def _sql_last_text_blocks(v: str) -> str:
    wrapper = " OR ".join(
        f"startsWith(JSONExtractString(b, 'text'), {sql_text(x)})" for x in TRANSCRIPT_PREFIXES
    )
    texts = (
        "arrayMap(b -> JSONExtractString(b, 'text'), arrayFilter(b -> JSONType(b, 'text') = 'String' "
        "AND JSONExtractString(b, 'text') != '', JSONExtractArrayRaw(c)))"
    )
    # a message any of whose blocks is a transcript note is no request
    joined = f"if(arrayExists(b -> {wrapper}, JSONExtractArrayRaw(c)), '', arrayStringConcat({texts}, '\\n'))"
    return f"arrayLast(t -> t != '', arrayMap(c -> {joined}, {v}))"


def _sql_smolagents_agent(v: str, q: SqlContext) -> str:
    name = f"substring({v}, 1, length({v}) - 4)"
    named = f"extract({q.get(SMOLAGENTS_TASK_KEY)}, {sql_text(_SMOLAGENTS_NAMED.pattern)})"
    classes = _sql_set(SMOLAGENTS_AGENT_CLASSES)
    return f"if(endsWith({v}, '.run'), if({name} IN {classes} AND {named} != '', {named}, nullIf({name}, '')), NULL)"


class SqlContext:
    """Where the SQL readers and conditions find a span's fields (``otel_traces`` columns; its
    events' names and attributes as ``_event_names`` / ``_event_attributes``, the view's inner
    query's names for ``Events.Name`` / ``Events.Attributes``)."""

    name = "SpanName"
    scope = "ScopeName"

    def get(self, key: str) -> str:
        return f"SpanAttributes[{sql_text(key)}]"

    def resource(self, key: str) -> str:
        return f"ResourceAttributes[{sql_text(key)}]"

    def column(self, name: str) -> str:
        return name

    def event_values(self, name: str, key: str) -> str:
        """Array(String): ``key`` of the span's events named ``name``, those that have it, in order."""
        return (
            f"arrayMap(a -> a[{sql_text(key)}], arrayFilter((a, n) -> n = {sql_text(name)} "
            f"AND mapContains(a, {sql_text(key)}), _event_attributes, _event_names))"
        )


READERS_SQL: dict[str, Callable[[str, SqlContext], str]] = {
    "genai_family": lambda v, q: _sql_lookup(_GENAI_FAMILY, v),
    "openinference_family": lambda v, q: _sql_lookup(_OPENINFERENCE_FAMILY, f"upperUTF8({v})"),
    "traceloop_family": lambda v, q: _sql_lookup(_TRACELOOP_FAMILY, f"lowerUTF8({v})"),
    "family_operation": lambda v, q: _sql_lookup(_FAMILY_OPERATION, v),
    "langgraph_node": lambda v, q: (
        f"if(position({v}, 'langgraph_node') > 0, nullIf(JSONExtractString({v}, 'langgraph_node'), ''), NULL)"
    ),
    "call_arguments": lambda v, q: _sql_call_arguments(v),
    "smolagents_agent": _sql_smolagents_agent,
    "langgraph_agent": lambda v, q: _sql_langgraph_agent(v),
    "langgraph_metadata_agent": lambda v, q: (
        f"if(position({v}, 'langgraph_checkpoint_ns') > 0, "
        f"{_sql_langgraph_agent(_sql_json_string(v, 'langgraph_checkpoint_ns'))}, NULL)"
    ),
    "crewai_coworker": lambda v, q: f"nullIf(trimBoth(JSONExtractString({v}, 'coworker')), '')",
    "handoff_agent": lambda v, q: f"nullIf(trimBoth(JSONExtractString({v}, 'agent_name')), '')",
    "genai_user_text": lambda v, q: _sql_genai_user_text(v),
    # event sources: ``v`` is an Array(String) of the events' values
    "last_value": lambda v, q: f"arrayLast(x -> x != '', {v})",
    "last_text_blocks": lambda v, q: _sql_last_text_blocks(v),
    "last_genai_user_text": lambda v, q: (
        f"arrayLast(t -> t != '', arrayMap(x0 -> ifNull({_sql_genai_user_text('x0')}, ''), {v}))"
    ),
    "tool": lambda v, q: "'tool'",
    "delegate": lambda v, q: "'delegate'",
    "attribute": lambda v, q: "'attribute'",
}
CONDITIONS_SQL: dict[str, Callable[[SqlContext], str]] = {
    "agent": lambda q: f"{q.column('span_family')} = 'agent'",
    "tool": lambda q: f"{q.column('span_family')} = 'tool'",
    "tool_call": lambda q: (
        f"{q.column('span_family')} = 'tool' AND ifNull({q.column('op')}, '') != 'delegate'"
    ),
    "smolagents_agent": lambda q: (
        f"{q.scope} = {sql_text(SCOPE_SMOLAGENTS)} AND {q.column('span_family')} = 'agent'"
    ),
    "openai_agents_handoff": lambda q: (
        f"{q.scope} = {sql_text(SCOPE_OPENAI_AGENTS)} AND startsWith({q.name}, {sql_text(HANDOFF_PREFIX)})"
    ),
    "crewai_delegation": lambda q: f"{q.get(CREWAI_TOOL_KEY)} IN {_sql_set(CREWAI_DELEGATION_TOOLS)}",
    "llm": lambda q: f"{q.column('span_family')} = 'llm'",
    "agent_or_llm": lambda q: f"{q.column('span_family')} IN ('agent', 'llm')",
    "genai_handoff": lambda q: f"{q.get(GENAI_TOOL_NAME_KEY)} IN {_sql_set(GENAI_HANDOFF_TOOLS)}",
    "adk_agent_tool": lambda q: f"{q.get(GENAI_TOOL_TYPE_KEY)} = {sql_text(ADK_AGENT_TOOL_TYPE)}",
    "stable_agent_id": lambda q: (
        f"{q.scope} NOT IN {_sql_set((SCOPE_TRACELOOP_LANGCHAIN, SCOPE_TRACELOOP_CREWAI, SCOPE_AGENT_FRAMEWORK))}"
    ),
}
_ENV: dict[str, Any] = {
    "COLUMN": _INDEX,
    "GENAI_FAMILY": _GENAI_FAMILY,
    "OPENINFERENCE_FAMILY": _OPENINFERENCE_FAMILY,
    "TRACELOOP_FAMILY": _TRACELOOP_FAMILY,
    "FAMILY_OPERATION": _FAMILY_OPERATION,
    "SCOPE_SMOLAGENTS": SCOPE_SMOLAGENTS,
    "SCOPE_OPENAI_AGENTS": SCOPE_OPENAI_AGENTS,
    "SCOPE_TRACELOOP_LANGCHAIN": SCOPE_TRACELOOP_LANGCHAIN,
    "SCOPE_TRACELOOP_CREWAI": SCOPE_TRACELOOP_CREWAI,
    "SCOPE_AGENT_FRAMEWORK": SCOPE_AGENT_FRAMEWORK,
    "CREWAI_DELEGATION_TOOLS": CREWAI_DELEGATION_TOOLS,
    "CREWAI_TOOL_KEY": CREWAI_TOOL_KEY,
    "HANDOFF_PREFIX": HANDOFF_PREFIX,
    "GENAI_HANDOFF_TOOLS": GENAI_HANDOFF_TOOLS,
    "GENAI_TOOL_NAME_KEY": GENAI_TOOL_NAME_KEY,
    "GENAI_TOOL_TYPE_KEY": GENAI_TOOL_TYPE_KEY,
    "ADK_AGENT_TOOL_TYPE": ADK_AGENT_TOOL_TYPE,
    "handoff_agent": _handoff_agent,
    "genai_user_text": genai_user_text,
    "event_values": event_values,
    "last_value": _last_value,
    "last_text_blocks": _last_text_blocks,
    "last_genai_user_text": _last_genai_user_text,
    "langgraph_node": _langgraph_node,
    "call_arguments": call_arguments,
    "smolagents_agent": smolagents_agent,
    "langgraph_agent": langgraph_agent,
    "langgraph_metadata_agent": _langgraph_metadata_agent,
    "crewai_coworker": _crewai_coworker,
    "text": _text,
    "int_": _int,
    "bool_": _bool,
    "str_list": _str_list,
}
_COERCE_EXPR = {
    "text": "(v if v.__class__ is str else text(v))",
    "int": "int_(v)",
    "bool": "bool_(v)",
    "list": "str_list(v)",
}


def _expression(source: Source, columns: Sequence[str]) -> str:
    """Python expression reading a source's raw value."""
    key = source.key
    if key.startswith("resource:"):
        return f"resource.get({key[len('resource:') :]!r})"
    if key == "span:name":
        return "name"
    if key.startswith("column:"):
        column = key[len("column:") :]
        if column not in columns:
            raise ValueError(f"source {key!r} reads a column not mapped before it")
        return f"out[{_INDEX[column]}]"
    if key.startswith("event:"):
        event, attribute = event_key(source)
        return f"event_values(events, {event!r}, {attribute!r})"
    return f"get({key!r})"


def event_key(source: Source) -> tuple[str, str]:
    """(event name, attribute key) of an ``event:<name>:<key>`` source, which needs a reader."""
    event, _, attribute = source.key[len("event:") :].rpartition(":")
    if not event or not attribute or not source.read:
        raise ValueError(f"source {source.key!r}: write event:<event name>:<attribute key>, with a reader")
    return event, attribute


def is_direct(rule: Rule) -> bool:
    """A rule that copies one span attribute as it is (its key present: even '' is kept)."""
    (first, *more) = rule.sources
    return not more and not first.when and not first.read and rule.default is None and ":" not in first.key


def generate_mapper(rules: Sequence[Rule] = RULES) -> str:
    """Python source of ``map_span(attrs, resource, name, scope, events) -> list`` for the table.

    Generated once at import (as a SQL view could be generated from the same table): rules with
    a single plain attribute (the driftscope.* fields) become a key -> column lookup walked over
    the span's attributes; the others are inlined in table order. Interpreting the table per span
    instead costs several times more, and this runs for every span ingested.
    """
    direct: list[str] = []
    body: list[str] = []
    done: list[str] = []
    for rule in rules:
        if rule.column not in _INDEX:
            raise ValueError(f"convention rule for unknown column {rule.column!r}")
        if rule.column in done:
            raise ValueError(f"two convention rules for column {rule.column!r}")
        first = rule.sources[0]
        index = _INDEX[rule.column]
        if is_direct(rule):
            direct.append(f"    {first.key!r}: ({index}, {rule.kind!r}),")
            done.append(rule.column)
            continue
        body.append(f"    # {rule.column}")
        for n, source in enumerate(rule.sources):
            test = "v is None" if n else "True"
            if source.when:
                condition = re.sub(
                    r"COLUMN\['(\w+)'\]", lambda m: str(_INDEX[m.group(1)]), CONDITIONS[source.when]
                )
                test += f" and ({condition})"
            body.append(f"    if {test}:" if n or source.when else "    if True:")
            body.append(f"        v = {_expression(source, done)}")
            if source.read:
                body.append("        if v is not None and v != '':")
                body.append(f"            v = {READERS[source.read]}")
            body.append("        if v == '':")
            body.append("            v = None")
        coerce = _COERCE_EXPR[rule.kind]
        body.append(f"    out[{index}] = {coerce} if v is not None else {rule.default!r}")
        done.append(rule.column)
    lines = [
        "DIRECT = {",
        *direct,
        "}",
        "",
        "",
        "def map_span(attrs, resource, name, scope, events='[]'):",
        f"    out = [None] * {len(COORDINATION_COLUMNS)}",
        "    get = attrs.get",
        "    # each direct key has its own column: walk the span's attributes or the keys, the fewer",
        "    if len(attrs) <= len(DIRECT):",
        "        pairs = attrs.items()",
        "    else:",
        "        pairs = [(key, get(key)) for key in DIRECT]",
        "    for key, value in pairs:",
        "        hit = DIRECT.get(key)",
        "        if hit is not None and value is not None:",
        "            kind = hit[1]",
        "            if kind == 'text':",
        "                out[hit[0]] = value if value.__class__ is str else text(value)",
        "            elif kind == 'list':",
        "                out[hit[0]] = str_list(value)",
        "            elif kind == 'int':",
        "                out[hit[0]] = int_(value)",
        "            else:",
        "                out[hit[0]] = bool_(value)",
        "    v = None",
        *body,
        "    return out",
    ]
    return "\n".join(lines) + "\n"


MAPPER_SOURCE = generate_mapper()
_namespace = dict(_ENV)
exec(compile(MAPPER_SOURCE, "<collector.conventions mapper>", "exec"), _namespace)  # noqa: S102 (our own table)
_map_span: Callable[..., list] = _namespace["map_span"]
del _namespace


def map_coordination(
    attrs: Mapping[str, Any], resource: Mapping[str, Any], name: str = "", scope: str = "", events: Any = "[]"
) -> dict[str, Any]:
    """Extract the coordination columns of one span by the convention table.

    ``attrs`` and ``resource`` map attribute keys to values (the decoders pass OTLP's string map;
    typed Python values are accepted too), ``name`` is the span's name and ``scope`` its
    instrumentation scope's, ``events`` its events (the decoders' ``Events`` JSON text, or a
    list of ``{"Name", "Attributes"}``). Returns a dict with every name in ``COORDINATION_COLUMNS``; unknown
    or absent fields are None. Values of the wrong type are coerced when unambiguous, else None.
    """
    return dict(zip(COORDINATION_COLUMNS, _map_span(attrs, resource, name, scope, events), strict=True))
