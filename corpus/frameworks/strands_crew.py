"""Strands Agents: a manager agent delegating to researcher and analyst agents through tools (the
documented "agents as tools" pattern: a ``@tool`` function that runs an ``Agent`` it creates), the
specialists consulting each other the same way, with Strands' native OpenTelemetry GenAI spans and
a ``Model`` subclass streaming replies from a script (no network). Each run is one call of the
manager with ``trace_attributes={"session.id": <run>}``.

Two run sets: ``strands`` as Strands traces by default (messages and tool inputs in span events)
and ``strands-content`` with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` (the
latest GenAI conventions: content as span attributes). The scenarios are PydanticAI's
(corpus.frameworks.pydantic_ai_crew), with the same tool names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from corpus.capture import start_tracing
from corpus.frameworks.pydantic_ai_crew import scenarios
from corpus.frameworks.topics import search_result
from corpus.truth import RunSet, RunTruth, check_side_effects, package_versions

FAILING_QUERIES: set[str] = set()
OUTBOX: list[dict[str, str]] = []
CONTENT_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
CONTENT_VALUE = "gen_ai_latest_experimental"


def scripted_model(owner: str, scripts: dict[str, list[dict[str, Any]]]):
    from strands.models.model import Model

    class ScriptedModel(Model):
        def __init__(self) -> None:
            self.config: dict[str, Any] = {"model_id": "scripted-model"}
            self.calls = 0

        def update_config(self, **model_config: Any) -> None:
            self.config.update(model_config)

        def get_config(self) -> dict[str, Any]:
            return self.config

        async def structured_output(self, *args: Any, **kwargs: Any):
            raise NotImplementedError("the scripted crew asks for no structured output")
            yield  # an async generator, as the interface declares

        async def stream(self, messages, tool_specs=None, system_prompt=None, **kwargs: Any):
            script = scripts[owner]
            if not script:
                raise RuntimeError(f"the scripted model of {owner} has no reply left")
            reply = script.pop(0)
            self.calls += 1
            yield {"messageStart": {"role": "assistant"}}
            if "call" in reply:
                use = {"name": reply["call"], "toolUseId": f"call_{owner}_{len(script)}"}
                yield {"contentBlockStart": {"start": {"toolUse": use}}}
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(reply["args"])}}}}
                yield {"contentBlockStop": {}}
                yield {"messageStop": {"stopReason": "tool_use"}}
            else:
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": reply["text"]}}}
                yield {"contentBlockStop": {}}
                yield {"messageStop": {"stopReason": "end_turn"}}
            usage = {"inputTokens": 200, "outputTokens": 30, "totalTokens": 230}
            yield {"metadata": {"usage": usage, "metrics": {"latencyMs": 1}}}

    return ScriptedModel()


def build_crew(scripts: dict[str, list[dict[str, Any]]]):
    from strands import Agent, tool

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

    # Agents as tools, as Strands documents them: the tool creates the agent and runs it.
    def researcher() -> Agent:
        return Agent(
            name="researcher",
            model=scripted_model("researcher", scripts),
            system_prompt="You find facts about companies with web_search and cite them.",
            tools=[web_search, consult_analyst],
            callback_handler=None,
        )

    def analyst() -> Agent:
        return Agent(
            name="analyst",
            model=scripted_model("analyst", scripts),
            system_prompt="You compute growth rates and ratios from the figures you are given.",
            tools=[compute_growth, consult_researcher],
            callback_handler=None,
        )

    @tool
    def ask_researcher(task: str) -> str:
        """Ask the research agent to find a fact."""
        return str(researcher()(task))

    @tool
    def ask_analyst(task: str) -> str:
        """Ask the analyst agent to compute something."""
        return str(analyst()(task))

    @tool
    def consult_analyst(task: str) -> str:
        """Hand a calculation to the analyst agent."""
        return str(analyst()(task))

    @tool
    def consult_researcher(task: str) -> str:
        """Hand a fact-finding question to the research agent."""
        return str(researcher()(task))

    def manager(session: str) -> Agent:
        return Agent(
            name="manager",
            model=scripted_model("manager", scripts),
            system_prompt="You answer questions about companies. Ask the researcher for facts and the "
            "analyst for calculations; email reports when asked.",
            tools=[ask_researcher, ask_analyst, send_report],
            callback_handler=None,
            trace_attributes={"session.id": session},
        )

    return manager


def _generate(out_dir: Path, content: bool) -> Path:
    if content:
        os.environ[CONTENT_ENV] = CONTENT_VALUE
    else:
        os.environ.pop(CONTENT_ENV, None)
    service = "corpus-strands-content" if content else "corpus-strands"
    tracing = start_tracing(service)
    run_set = RunSet(
        framework="strands-agents",
        instrumentation="Strands Agents native OpenTelemetry (GenAI semantic conventions), "
        + (f"{CONTENT_ENV}={CONTENT_VALUE}" if content else "default settings (content in span events)"),
        service_name=service,
        versions=package_versions("strands-agents", "opentelemetry-exporter-otlp-proto-http"),
        session='Agent(trace_attributes={"session.id": <run>}) on the manager -> session.id on its spans; '
        "the agents its tools run carry none (they are in the manager's trace)",
        agent_span_names={
            "invoke_agent manager": "manager",
            "invoke_agent researcher": "researcher",
            "invoke_agent analyst": "analyst",
        },
        notes=[
            "Delegations are tool calls (execute_tool ask_* / consult_*) whose child is the delegate's "
            "invoke_agent span (agents as tools).",
            "By default Strands puts messages and tool inputs in span events (gen_ai.user.message, "
            f"gen_ai.tool.message); {CONTENT_ENV}={CONTENT_VALUE} puts them on the spans.",
        ],
    )
    prefix = "strc" if content else "str"
    for spec in scenarios():
        FAILING_QUERIES.clear()
        FAILING_QUERIES.update(spec.get("failing", ()))
        scripts = {name: list(spec[name]) for name in ("manager", "researcher", "analyst")}
        manager = build_crew(scripts)
        session = f"{prefix}-{spec['label']}"
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]):
            manager(session)(spec["task"])
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
    """The ``strands`` run set: Strands' default telemetry settings."""
    return _generate(out_dir, content=False)


def generate_content(out_dir: Path) -> Path:
    """The ``strands-content`` run set: the latest GenAI conventions, content on the spans."""
    return _generate(out_dir, content=True)
