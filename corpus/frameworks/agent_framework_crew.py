"""Microsoft Agent Framework: a manager agent calling researcher and analyst agents as tools
(``Agent.as_tool()``), the specialists consulting each other the same way, with the framework's
native OpenTelemetry GenAI spans (``enable_instrumentation``) and a chat client answering from a
script (``BaseChatClient`` with the framework's function-invocation and telemetry layers, as its
own clients compose them; no network). Each run is one ``manager.run(task)``: the framework puts
no conversation id on the spans of an in-memory session, so a run is its trace.

Two run sets: ``agent-framework`` as the framework traces by default (no message content, no
tool arguments) and ``agent-framework-content`` with ``enable_sensitive_data=True``
(``ENABLE_SENSITIVE_DATA=true``). The scenarios are PydanticAI's
(corpus.frameworks.pydantic_ai_crew): its ``ask_*`` / ``consult_*`` tools become the agents'
tools (``{"task": ...}``, the framework's own argument name).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from corpus.capture import start_tracing
from corpus.frameworks.pydantic_ai_crew import scenarios
from corpus.frameworks.topics import search_result
from corpus.truth import RunSet, RunTruth, check_side_effects, package_versions

FAILING_QUERIES: set[str] = set()
OUTBOX: list[dict[str, str]] = []
AGENT_TOOLS = {
    "ask_researcher": "researcher",
    "ask_analyst": "analyst",
    "consult_researcher": "researcher",
    "consult_analyst": "analyst",
}


def maf_script(script: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A scenario's replies with delegation tools as calls of the agents as tools."""
    return [
        {"call": AGENT_TOOLS[reply["call"]], "args": reply["args"]}
        if reply.get("call") in AGENT_TOOLS
        else reply
        for reply in script
    ]


def build_crew(scripts: dict[str, list[dict[str, Any]]]):
    from agent_framework import (
        Agent,
        BaseChatClient,
        ChatResponse,
        ChatResponseUpdate,
        Content,
        FunctionInvocationLayer,
        Message,
        ResponseStream,
        tool,
    )
    from agent_framework.observability import ChatTelemetryLayer

    class ScriptedClient(FunctionInvocationLayer, ChatTelemetryLayer, BaseChatClient):
        OTEL_PROVIDER_NAME = "scripted"

        def __init__(self, owner: str) -> None:
            super().__init__()
            self.owner = owner

        def _inner_get_response(self, *, messages, stream, options, **kwargs):
            script = scripts[self.owner]
            if not script:
                raise RuntimeError(f"the scripted model of {self.owner} has no reply left")
            reply = script.pop(0)
            if "call" in reply:
                call_id = f"call_{self.owner}_{len(script)}"
                content = Content.from_function_call(
                    call_id=call_id, name=reply["call"], arguments=json.dumps(reply["args"])
                )
            else:
                content = Content.from_text(reply["text"])
            if stream:  # an agent called as a tool streams

                async def updates():
                    yield ChatResponseUpdate(role="assistant", contents=[content], response_id=self.owner)

                return ResponseStream(updates(), finalizer=ChatResponse.from_updates)

            async def whole() -> ChatResponse:
                return ChatResponse(
                    messages=[Message(role="assistant", contents=[content])], response_id=self.owner
                )

            return whole()

    @tool
    def web_search(query: str) -> str:
        """Search the web and return the top result."""
        if query in FAILING_QUERIES:
            raise TimeoutError("search backend timed out after 30s (HTTP 504)")
        return search_result(query)

    @tool
    def compute_growth(current: float, previous: float) -> str:
        """Compute the relative growth between two values."""
        return f"{(current - previous) / previous * 100:.1f}%"

    @tool
    def send_report(recipient: str, subject: str, body: str) -> str:
        """Email a report (a side effect: every call sends one email)."""
        OUTBOX.append({"recipient": recipient, "subject": subject, "body": body})
        return f"sent to {recipient}"

    researcher = Agent(
        client=ScriptedClient("researcher"),
        name="researcher",
        description="Finds facts about companies with web_search and cites them.",
        instructions="You find facts about companies with web_search and cite them.",
        tools=[web_search],
    )
    analyst = Agent(
        client=ScriptedClient("analyst"),
        name="analyst",
        description="Computes growth rates and ratios from the figures it is given.",
        instructions="You compute growth rates and ratios from the figures you are given.",
        tools=[compute_growth],
    )
    # The specialists may consult each other (ping-pong needs both directions).
    researcher_tool = researcher.as_tool(arg_name="task")
    analyst_tool = analyst.as_tool(arg_name="task")
    researcher.default_options["tools"] = [web_search, analyst_tool]
    analyst.default_options["tools"] = [compute_growth, researcher_tool]
    return Agent(
        client=ScriptedClient("manager"),
        name="manager",
        instructions="You answer questions about companies. Ask the researcher for facts and the "
        "analyst for calculations; email reports when asked.",
        tools=[researcher_tool, analyst_tool, send_report],
    )


def _generate(out_dir: Path, content: bool) -> Path:
    from agent_framework.observability import enable_instrumentation

    service = "corpus-agent-framework-content" if content else "corpus-agent-framework"
    tracing = start_tracing(service)
    enable_instrumentation(enable_sensitive_data=content)
    run_set = RunSet(
        framework="microsoft-agent-framework",
        instrumentation="Microsoft Agent Framework native OpenTelemetry (GenAI semantic conventions), "
        + ("enable_sensitive_data=True" if content else "default settings (no content captured)"),
        service_name=service,
        versions=package_versions("agent-framework-core", "opentelemetry-exporter-otlp-proto-http"),
        session="no conversation id on the spans of an in-memory session: each run is one trace "
        "(manager.run(task))",
        agent_span_names={
            "invoke_agent manager": "manager",
            "invoke_agent researcher": "researcher",
            "invoke_agent analyst": "analyst",
        },
        notes=[
            "Delegations are tool calls (execute_tool researcher / analyst, Agent.as_tool()) whose child "
            "is the agent's invoke_agent span.",
            "By default the framework records neither message content nor tool arguments; "
            "enable_sensitive_data=True (ENABLE_SENSITIVE_DATA=true) puts them on the spans.",
        ],
    )
    for spec in scenarios():
        FAILING_QUERIES.clear()
        FAILING_QUERIES.update(spec.get("failing", ()))
        scripts = {name: maf_script(spec[name]) for name in ("manager", "researcher", "analyst")}
        manager = build_crew(scripts)
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]):
            asyncio.run(manager.run(spec["task"]))
        left = {name: len(script) for name, script in scripts.items() if script}
        if left:
            raise RuntimeError(f"{spec['label']}: unused scripted replies {left}")
        sent = check_side_effects(spec, len(OUTBOX) - sent_before)
        tracing.flush()
        run_set.runs.append(
            RunTruth(
                run=spec["label"],
                failure=spec["failure"],
                task=spec["task"],
                session_id=None,
                trace_ids=tracing.recorder.traces.get(spec["label"], []),
                emitted_run_ids=tracing.recorder.emitted_ids.get(spec["label"], []),
                spans_started=tracing.recorder.span_counts.get(spec["label"], 0),
                side_effects_executed=sent,
                subtasks=spec["subtasks"],
                note=spec.get("note", ""),
            )
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    tracing.finish(out_dir / "otlp.jsonl")
    truth = out_dir / "truth.json"
    run_set.write(truth)
    return truth


def generate(out_dir: Path) -> Path:
    """The ``agent-framework`` run set: the framework's default telemetry settings."""
    return _generate(out_dir, content=False)


def generate_content(out_dir: Path) -> Path:
    """The ``agent-framework-content`` run set: ``enable_sensitive_data=True``."""
    return _generate(out_dir, content=True)
