"""Google ADK: a manager agent calling researcher and analyst agents as tools (``AgentTool``, the
documented way to hand a sub-agent a task of its own), the specialists consulting each other the
same way (the ping-pong run: ADK's peer hand-off, ``transfer_to_agent`` between sub-agents), with ADK's native OpenTelemetry GenAI spans and a ``BaseLlm`` subclass answering from a
script (no network). Each run is one ``Runner.run_async`` in a session whose id is the run
(``gen_ai.conversation.id``; an agent called as a tool runs in a nested session of its own).

Two run sets: ``adk`` as ADK traces by default (no message content, no tool arguments) and
``adk-content`` with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY`` (content on
the spans, GenAI conventions). The scenarios are PydanticAI's (corpus.frameworks.pydantic_ai_crew):
its ``ask_*`` / ``consult_*`` delegation tools become calls of the agents as tools.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from corpus.capture import start_tracing
from corpus.frameworks.pydantic_ai_crew import scenarios
from corpus.frameworks.topics import search_result
from corpus.truth import RunSet, RunTruth, Subtask, check_side_effects, package_versions

FAILING_QUERIES: set[str] = set()
OUTBOX: list[dict[str, str]] = []
# PydanticAI's delegation tools -> the agent ADK calls as a tool
AGENT_TOOLS = {
    "ask_researcher": "researcher",
    "ask_analyst": "analyst",
    "consult_researcher": "researcher",
    "consult_analyst": "analyst",
}
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def adk_script(script: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A scenario's replies with delegation tools as calls of the agent tools ({"request": task})."""
    out = []
    for reply in script:
        if reply.get("call") in AGENT_TOOLS:
            out.append({"call": AGENT_TOOLS[reply["call"]], "args": {"request": reply["args"]["task"]}})
        else:
            out.append(reply)
    return out


def transfer(agent: str) -> dict[str, Any]:
    return {"call": "transfer_to_agent", "args": {"agent_name": agent}}


def adk_ping_pong(spec: dict[str, Any]) -> dict[str, Any]:
    """The ping-pong run as ADK crews bounce: peers handing the conversation to each other with
    ``transfer_to_agent`` (ADK's own hand-off between sub-agents), 3 times each way. A transferred
    agent works on the conversation, so each one's task is the user's question."""
    question = spec["task"]
    return {
        **spec,
        "subtasks": [Subtask("analyst", question), Subtask("researcher", question)] * 3,
        "manager": [transfer("analyst")],
        "analyst": [transfer("researcher")] * 3 + [{"text": "Could not determine the growth."}],
        "researcher": [transfer("analyst")] * 3,
        "transfers": True,
        "note": "analyst and researcher transfer the conversation to each other (transfer_to_agent), "
        "3 times each way, after the manager transferred it to the analyst",
    }


def build_crew(scripts: dict[str, list[dict[str, Any]]], transfers: bool = False):
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.adk.tools.agent_tool import AgentTool
    from google.genai import types

    class ScriptedLlm(BaseLlm):
        owner: str = ""

        async def generate_content_async(self, llm_request, stream: bool = False):
            script = scripts[self.owner]
            if not script:
                raise RuntimeError(f"the scripted model of {self.owner} has no reply left")
            reply = script.pop(0)
            if "call" in reply:
                call = types.FunctionCall(
                    name=reply["call"], args=reply["args"], id=f"call_{self.owner}_{len(script)}"
                )
                part = types.Part(function_call=call)
            else:
                part = types.Part(text=reply["text"])
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    def web_search(query: str) -> dict[str, str]:
        """Search the web and return the top result."""
        if query in FAILING_QUERIES:
            # ADK's documented way for a tool to report a failure to the model
            return {"status": "error", "error_message": "search backend timed out after 30s (HTTP 504)"}
        return {"status": "success", "result": search_result(query)}

    def compute_growth(current: float, previous: float) -> str:
        """Compute the relative growth between two values."""
        return f"{(current - previous) / previous * 100:.1f}%"

    def send_report(recipient: str, subject: str, body: str) -> str:
        """Email a report (a side effect: every call sends one email)."""
        OUTBOX.append({"recipient": recipient, "subject": subject, "body": body})
        return f"sent to {recipient}"

    def model(owner: str) -> BaseLlm:
        return ScriptedLlm(model="scripted-model", owner=owner)

    researcher = LlmAgent(
        name="researcher",
        model=model("researcher"),
        description="Finds facts about companies with web_search and cites them.",
        instruction="You find facts about companies with web_search and cite them.",
        tools=[web_search],
    )
    analyst = LlmAgent(
        name="analyst",
        model=model("analyst"),
        description="Computes growth rates and ratios from the figures it is given.",
        instruction="You compute growth rates and ratios from the figures you are given.",
        tools=[compute_growth],
    )
    if transfers:  # sub-agents of the manager, handing the conversation to each other
        return LlmAgent(
            name="manager",
            model=model("manager"),
            instruction="You answer questions about companies. Transfer to the researcher for facts "
            "and to the analyst for calculations.",
            sub_agents=[researcher, analyst],
        )
    # The specialists may consult each other (ping-pong needs both directions).
    researcher.tools.append(AgentTool(agent=analyst))
    analyst.tools.append(AgentTool(agent=researcher))
    manager = LlmAgent(
        name="manager",
        model=model("manager"),
        instruction="You answer questions about companies. Ask the researcher for facts and the "
        "analyst for calculations; email reports when asked.",
        tools=[AgentTool(agent=researcher), AgentTool(agent=analyst), send_report],
    )
    return manager


async def _run(manager, task: str, session_id: str) -> None:
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    runner = InMemoryRunner(agent=manager, app_name="corpus")
    await runner.session_service.create_session(app_name="corpus", user_id="user", session_id=session_id)
    message = types.Content(role="user", parts=[types.Part(text=task)])
    async for _ in runner.run_async(user_id="user", session_id=session_id, new_message=message):
        pass


def _generate(out_dir: Path, content: bool) -> Path:
    if content:
        os.environ[CONTENT_ENV] = "SPAN_ONLY"
    else:
        os.environ.pop(CONTENT_ENV, None)
    service = "corpus-adk-content" if content else "corpus-adk"
    tracing = start_tracing(service)
    run_set = RunSet(
        framework="google-adk",
        instrumentation="Google ADK native OpenTelemetry (GenAI semantic conventions), "
        + (f"{CONTENT_ENV}=SPAN_ONLY" if content else "default settings (no content captured)"),
        service_name=service,
        versions=package_versions("google-adk", "opentelemetry-exporter-otlp-proto-http"),
        session="Runner.run_async(session_id=<run>) -> gen_ai.conversation.id; an agent called as a "
        "tool (AgentTool) runs in a nested session with a generated id",
        agent_span_names={
            "invoke_agent manager": "manager",
            "invoke_agent researcher": "researcher",
            "invoke_agent analyst": "analyst",
        },
        notes=[
            "Delegations are AgentTool calls (execute_tool <agent>, gen_ai.tool.type AgentTool) whose "
            "child is the agent's nested invoke_workflow / invoke_agent spans.",
            "By default ADK records no message content and no tool arguments; "
            f"{CONTENT_ENV}=SPAN_ONLY puts gen_ai.input.messages / gen_ai.tool.call.arguments on the spans.",
        ],
    )
    prefix = "adkc" if content else "adk"
    for spec in scenarios():
        if spec["failure"] == "ping_pong":
            spec = adk_ping_pong(spec)
        FAILING_QUERIES.clear()
        FAILING_QUERIES.update(spec.get("failing", ()))
        scripts = {name: adk_script(spec[name]) for name in ("manager", "researcher", "analyst")}
        manager = build_crew(scripts, transfers=spec.get("transfers", False))
        session = f"{prefix}-{spec['label']}"
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]):
            asyncio.run(_run(manager, spec["task"], session))
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


def generate(out_dir: Path) -> Path:
    """The ``adk`` run set: ADK's default telemetry settings."""
    return _generate(out_dir, content=False)


def generate_content(out_dir: Path) -> Path:
    """The ``adk-content`` run set: message content and tool arguments captured on the spans."""
    return _generate(out_dir, content=True)
