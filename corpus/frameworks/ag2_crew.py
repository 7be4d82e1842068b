"""AG2 (the ``ag2`` package, 1.x): a manager agent delegating to researcher and analyst agents
exposed as tools (``Agent.as_tool``: each call runs the agent as a sub-task with the ``objective``
it is given), the specialists consulting each other the same way, traced by AG2's OpenTelemetry
``TelemetryMiddleware`` (GenAI conventions; the documented way to trace AG2 agents, content
captured by default) and scripted by AG2's own test model client (``ag2.testing``), fed one reply
at a time from each agent's script (no network). The run id is the middleware's
``span_attributes={"gen_ai.conversation.id": <run>}`` on the manager.

One run set, ``ag2``: AG2's default (``capture_content=True``) is the content-capture configuration.
The scenarios are PydanticAI's (corpus.frameworks.pydantic_ai_crew), with the same tool names
(``{"objective": task}``, AG2's argument name).
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
DELEGATION_TOOLS = {"ask_researcher", "ask_analyst", "consult_researcher", "consult_analyst"}


class _Replies:
    """One agent's scripted replies, consumed across every model client AG2 creates for it."""

    def __init__(self, owner: str, script: list[dict[str, Any]]) -> None:
        self.owner, self.script = owner, script

    def __iter__(self) -> _Replies:
        return self

    def __next__(self) -> Any:
        from ag2.events import ToolCallEvent

        if not self.script:
            raise RuntimeError(f"the scripted model of {self.owner} has no reply left")
        reply = self.script.pop(0)
        if "call" not in reply:
            return reply["text"]
        args = reply["args"]
        if reply["call"] in DELEGATION_TOOLS:
            args = {"objective": args["task"]}
        return ToolCallEvent(reply["call"], arguments=json.dumps(args))


def build_crew(scripts: dict[str, list[dict[str, Any]]], session: str):
    from ag2 import Agent, tool
    from ag2.middleware.builtin.telemetry import TelemetryMiddleware
    from ag2.testing import TestClient, TestConfig

    class ScriptedConfig(TestConfig):
        def __init__(self, owner: str) -> None:
            super().__init__(model="scripted-model", raise_tool_errors=False)
            self.replies = _Replies(owner, scripts[owner])

        def create(self) -> TestClient:
            client = TestClient(raise_tool_errors=False)
            client.events = self.replies
            return client

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

    def agent(name: str, prompt: str, tools: list, **telemetry: Any) -> Agent:
        return Agent(
            name,
            prompt,
            config=ScriptedConfig(name),
            tools=tools,
            middleware=[TelemetryMiddleware(agent_name=name, model_name="scripted-model", **telemetry)],
        )

    researcher = agent(
        "researcher", "You find facts about companies with web_search and cite them.", [web_search]
    )
    analyst = agent(
        "analyst", "You compute growth rates and ratios from the figures you are given.", [compute_growth]
    )
    # The specialists may consult each other (ping-pong needs both directions).
    researcher.tools.append(
        analyst.as_tool(name="consult_analyst", description="Hand a calculation to the analyst agent.")
    )
    analyst.tools.append(
        researcher.as_tool(
            name="consult_researcher", description="Hand a fact-finding question to the research agent."
        )
    )
    return agent(
        "manager",
        "You answer questions about companies. Ask the researcher for facts and the analyst for "
        "calculations; email reports when asked.",
        [
            researcher.as_tool(name="ask_researcher", description="Ask the research agent to find a fact."),
            analyst.as_tool(name="ask_analyst", description="Ask the analyst agent to compute something."),
            send_report,
        ],
        span_attributes={"gen_ai.conversation.id": session},
    )


def generate(out_dir: Path) -> Path:
    """The ``ag2`` run set."""
    service = "corpus-ag2"
    tracing = start_tracing(service)
    run_set = RunSet(
        framework="ag2",
        instrumentation="AG2 TelemetryMiddleware (OpenTelemetry GenAI conventions), default capture_content=True",
        service_name=service,
        versions=package_versions("ag2", "opentelemetry-exporter-otlp-proto-http"),
        session='TelemetryMiddleware(span_attributes={"gen_ai.conversation.id": <run>}) on the manager; '
        "the sub-agents' spans carry none (they are in the manager's trace)",
        agent_span_names={
            "invoke_agent manager": "manager",
            "invoke_agent researcher": "researcher",
            "invoke_agent analyst": "analyst",
        },
        notes=[
            "Delegations are tool calls (execute_tool ask_* / consult_*, Agent.as_tool) whose child is the "
            "delegate's invoke_agent span; its task is the first user message of its model calls.",
        ],
    )
    for spec in scenarios():
        FAILING_QUERIES.clear()
        FAILING_QUERIES.update(spec.get("failing", ()))
        scripts = {name: list(spec[name]) for name in ("manager", "researcher", "analyst")}
        session = f"ag2-{spec['label']}"
        manager = build_crew(scripts, session)
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]):
            asyncio.run(manager.ask(spec["task"]))
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
                session_id=session,
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
