"""OpenAI Agents SDK: a manager agent that asks a researcher agent through ``as_tool`` and hands
off to an analyst (handoffs), traced by openinference-instrumentation-openai-agents (its tracing
processor, exclusive: nothing goes to the SDK's own trace backend). Every agent has a scripted
SDK ``OpenAIChatCompletionsModel`` over a scripted client (no network). Each run is one ``Runner.run`` with
``RunConfig(group_id=<run>)`` (the SDK's conversation grouping) inside OpenInference's
``using_session(<run>)``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from corpus.capture import start_tracing
from corpus.frameworks.topics import MORE_HEALTHY, search_result
from corpus.truth import RunSet, RunTruth, Subtask, check_side_effects, package_versions

FAILING_QUERIES: set[str] = set()
OUTBOX: list[dict[str, str]] = []


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"call": name, "args": args}


def answer(text: str) -> dict[str, Any]:
    return {"text": text}


class ScriptedAsyncClient:
    """The part of ``openai.AsyncOpenAI`` the SDK's chat-completions model uses, answering from a
    script with real ``ChatCompletion`` objects (no network)."""

    base_url = "scripted://local/v1"

    def __init__(self, owner: str, script: list[dict[str, Any]]) -> None:
        from types import SimpleNamespace

        self.owner = owner
        self.script = script
        self.calls = 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **_kwargs: Any):
        from openai.types.chat import ChatCompletion, ChatCompletionMessage
        from openai.types.chat.chat_completion import Choice
        from openai.types.chat.chat_completion_message_function_tool_call import (
            ChatCompletionMessageFunctionToolCall,
            Function,
        )
        from openai.types.completion_usage import CompletionUsage

        if not self.script:
            raise RuntimeError(f"the scripted model of {self.owner} has no reply left")
        reply = self.script.pop(0)
        self.calls += 1
        if "call" in reply:
            message = ChatCompletionMessage(
                role="assistant",
                content=None,
                tool_calls=[
                    ChatCompletionMessageFunctionToolCall(
                        id=f"call_{self.owner}_{self.calls}",
                        type="function",
                        function=Function(name=reply["call"], arguments=json.dumps(reply["args"])),
                    )
                ],
            )
            finish = "tool_calls"
        else:
            message = ChatCompletionMessage(role="assistant", content=reply["text"])
            finish = "stop"
        return ChatCompletion(
            id=f"chatcmpl-{self.owner}-{self.calls}",
            choices=[Choice(finish_reason=finish, index=0, message=message)],
            created=1_767_225_600,
            model="scripted-model",
            object="chat.completion",
            usage=CompletionUsage(prompt_tokens=200, completion_tokens=40, total_tokens=240),
        )


def build_crew(scripts: dict[str, list[dict[str, Any]]], research_turns: int = 10):
    from agents import Agent, OpenAIChatCompletionsModel, function_tool

    clients = {name: ScriptedAsyncClient(name, script) for name, script in scripts.items()}
    models = {
        name: OpenAIChatCompletionsModel(model="scripted-model", openai_client=client)
        for name, client in clients.items()
    }

    @function_tool
    def web_search(query: str) -> str:
        """Search the web and return the top result."""
        if query in FAILING_QUERIES:
            raise RuntimeError("search backend timed out after 30s (HTTP 504)")
        return search_result(query)

    @function_tool
    def compute_growth(current: float, previous: float) -> str:
        """Compute the relative growth between two values."""
        return f"{(current - previous) / previous * 100:.1f}%"

    @function_tool
    def send_report(recipient: str, subject: str, body: str) -> str:
        """Email a report (a side effect: every call sends one email)."""
        OUTBOX.append({"recipient": recipient, "subject": subject, "body": body})
        return f"sent to {recipient}"

    researcher = Agent(
        name="researcher",
        instructions="You find facts about companies with web_search and cite them.",
        model=models["researcher"],
        tools=[web_search],
    )
    analyst = Agent(
        name="analyst",
        instructions="You compute growth rates and ratios from the figures you are given.",
        model=models["analyst"],
        tools=[compute_growth],
    )
    # The two specialists can hand a conversation to each other (ping-pong needs both directions).
    researcher.handoffs = [analyst]
    analyst.handoffs = [researcher]
    manager = Agent(
        name="manager",
        instructions="You answer questions about companies. Ask the researcher for facts; hand "
        "calculations to the analyst; email reports when asked.",
        model=models["manager"],
        tools=[
            researcher.as_tool(
                tool_name="ask_researcher",
                tool_description="Ask the research agent to find a fact; pass the question as input.",
                max_turns=research_turns,
            ),
            send_report,
        ],
        handoffs=[analyst],
    )
    return manager, clients


def scenarios() -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    healthy = [
        ("northwind", "What was Northwind Traders' revenue in the EU in 2024?",
         "Find Northwind Traders' EU revenue for fiscal year 2024.", "Northwind EU revenue 2024", "EUR 412 million"),
        ("contoso", "How many employees did Contoso have at the end of 2023?",
         "Find Contoso's employee count at the end of 2023.", "Contoso employees December 2023", "18,250 employees"),
        ("fabrikam", "What is Fabrikam's market share in Germany?",
         "Find Fabrikam's share of the German office-furniture market.", "Fabrikam market share Germany", "14%"),
        ("initech", "What was Initech's operating margin in 2024?",
         "Find Initech's operating margin for fiscal year 2024.", "Initech operating margin FY2024", "11.8%"),
        ("umbrella", "Which cities in Spain does Umbrella Logistics ship to?",
         "List the Spanish cities Umbrella Logistics ships to.", "Umbrella Logistics Spain cities",
         "Madrid, Barcelona, Valencia and Seville"),
    ]  # fmt: skip
    for key, question, subtask, query, result in healthy:
        runs.append(
            dict(
                label=f"healthy-{key}",
                failure=None,
                task=question,
                subtasks=[Subtask("researcher", subtask)],
                manager=[call("ask_researcher", {"input": subtask}), answer(result)],
                researcher=[call("web_search", {"query": query}), answer(result)],
                analyst=[],
            )
        )
    for key, question, subtask, queries, result in MORE_HEALTHY:
        runs.append(
            dict(
                label=f"healthy-{key}",
                failure=None,
                task=question,
                subtasks=[Subtask("researcher", subtask)],
                manager=[call("ask_researcher", {"input": subtask}), answer(result)],
                researcher=[call("web_search", {"query": q}) for q in queries] + [answer(result)],
                analyst=[],
            )
        )
    growth_task = "What was Globex's revenue growth from 2023 to 2024?"
    runs.append(
        dict(
            label="healthy-handoff",
            failure=None,
            task=growth_task,
            subtasks=[Subtask("researcher", "Find Globex's revenue for 2023 and 2024."), Subtask("analyst", growth_task)],
            manager=[call("ask_researcher", {"input": "Find Globex's revenue for 2023 and 2024."}),
                     call("transfer_to_analyst", {})],
            researcher=[call("web_search", {"query": "Globex revenue 2023 2024"}),
                        answer("USD 2.10 billion (2023), USD 2.31 billion (2024)")],
            analyst=[call("compute_growth", {"current": 2.31, "previous": 2.10}), answer("10.0%")],
            note="one handoff manager -> analyst after one researcher question (healthy)",
        )
    )  # fmt: skip
    retry_queries = [
        "Northwind EU revenue 2024",
        "revenue of Northwind in the EU in 2024",
        "Northwind 2024 EU revenue figures",
        "Northwind revenue EU 2024",
        "EU revenue Northwind 2024 annual",
    ]
    task = "Find Northwind Traders' EU revenue for fiscal year 2024."
    runs.append(
        dict(
            label="retry-loop",
            failure="retry_loop",
            task="What was Northwind Traders' revenue in the EU in 2024?",
            subtasks=[Subtask("researcher", task)],
            manager=[call("ask_researcher", {"input": task}), answer("The figure could not be found.")],
            researcher=[call("web_search", {"query": q}) for q in retry_queries]
            + [answer("The search kept failing.")],
            analyst=[],
            failing={retry_queries[0], retry_queries[2], retry_queries[4]},
            note="web_search called 5 times with re-worded queries; calls 1, 3 and 5 fail (timeout), 2 and 4 return a result",
        )
    )
    same = "Find Contoso's employee count at the end of 2023."
    reworded = "Find the number of employees Contoso had at the end of 2023."
    runs.append(
        dict(
            label="redelegation",
            failure="redelegation",
            task="How many employees did Contoso have at the end of 2023?",
            subtasks=[Subtask("researcher", same), Subtask("researcher", same), Subtask("researcher", reworded)],
            manager=[call("ask_researcher", {"input": same}), call("ask_researcher", {"input": same}),
                     call("ask_researcher", {"input": reworded}), answer("18,250 employees")],
            researcher=[call("web_search", {"query": "Contoso employees 2023"}), answer("18,250"),
                        call("web_search", {"query": "Contoso employees 2023"}), answer("18,250"),
                        call("web_search", {"query": "Contoso employee count end of 2023"}), answer("18,250")],
            analyst=[],
            note="the manager asks the researcher (as_tool) the same question three times (the third re-worded)",
        )
    )  # fmt: skip
    pizza = "Find a recipe for Neapolitan pizza dough with high hydration."
    runs.append(
        dict(
            label="off-topic",
            failure="off_topic_task",
            task="What is Fabrikam's market share in Germany?",
            subtasks=[Subtask("researcher", pizza, off_topic=True)],
            manager=[call("ask_researcher", {"input": pizza}), answer("1 kg flour, 700 ml water")],
            researcher=[
                call("web_search", {"query": "Neapolitan pizza dough recipe high hydration"}),
                answer("1 kg flour, 700 ml water"),
            ],
            analyst=[],
        )
    )
    analyst, researcher = [], []
    for _ in range(3):
        analyst.append(call("transfer_to_researcher", {}))
        researcher.append(call("transfer_to_analyst", {}))
    analyst.append(answer("Could not compute the growth."))
    runs.append(
        dict(
            label="ping-pong",
            failure="ping_pong",
            task=growth_task,
            subtasks=[Subtask("analyst", growth_task)] + [Subtask("researcher", growth_task), Subtask("analyst", growth_task)] * 3,
            manager=[call("transfer_to_analyst", {})],
            researcher=researcher,
            analyst=analyst,
            note="manager hands off to analyst; analyst and researcher then hand the conversation to each other 3 times each way",
        )
    )  # fmt: skip
    send = {"recipient": "cfo@initech.example", "subject": "Initech operating margin 2024", "body": "11.8%"}
    subtask = "Find Initech's operating margin for fiscal year 2024."
    runs.append(
        dict(
            label="duplicate-email",
            failure="duplicate_side_effect",
            task="What was Initech's operating margin in 2024? Email it to the CFO.",
            subtasks=[Subtask("researcher", subtask)],
            manager=[call("ask_researcher", {"input": subtask}), call("send_report", send), call("send_report", send),
                     answer("11.8%, emailed to the CFO")],
            researcher=[call("web_search", {"query": "Initech operating margin FY2024"}), answer("11.8%")],
            analyst=[],
            note="send_report called twice with identical arguments by the manager",
        )
    )  # fmt: skip
    facets = [
        "Madrid depot", "Barcelona port", "Valencia warehouse", "Seville hub", "Bilbao route", "Malaga office",
        "Zaragoza rail", "Murcia customers", "Palma ferry", "Vigo trucks", "Alicante storage", "Cordoba partner",
        "Granada delivery", "Valladolid fleet", "Gijon terminal", "Oviedo clients", "Pamplona depot",
        "Santander shipping", "Toledo drivers", "Salamanca stock", "Cadiz containers", "Leon pickup",
        "Tarragona chemicals", "Girona express",
    ]  # fmt: skip
    cities = "List the Spanish cities Umbrella Logistics ships to."
    runs.append(
        dict(
            label="runaway",
            failure="runaway",
            task="Which cities in Spain does Umbrella Logistics ship to?",
            subtasks=[Subtask("researcher", cities)],
            manager=[
                call("ask_researcher", {"input": cities}),
                answer("Madrid, Barcelona, Valencia and Seville"),
            ],
            researcher=[call("web_search", {"query": f"Umbrella Logistics {f}"}) for f in facets]
            + [answer("Madrid, Barcelona, Valencia and Seville")],
            analyst=[],
            research_turns=40,
            note="the researcher makes 24 different searches (healthy runs make 1); max_turns raised to 40, no budget",
        )
    )
    return runs


def generate(out_dir: Path) -> Path:
    from agents import RunConfig, Runner
    from openinference.instrumentation import using_session
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    service = "corpus-openai-agents"
    tracing = start_tracing(service)
    OpenAIAgentsInstrumentor().instrument(tracer_provider=tracing.provider)
    run_set = RunSet(
        framework="openai-agents",
        instrumentation="openinference-instrumentation-openai-agents",
        service_name=service,
        versions=package_versions(
            "openai-agents",
            "openinference-instrumentation-openai-agents",
            "opentelemetry-exporter-otlp-proto-http",
        ),
        session="RunConfig(group_id=<run>) (not exported by the instrumentation) and OpenInference "
        "using_session(<run>) -> session.id where the processor's spans pick it up",
        agent_span_names={"manager": "manager", "researcher": "researcher", "analyst": "analyst"},
        notes=[
            "Agent spans are named after the agent; a handoff is a TOOL span 'handoff to <agent>' and the "
            "next agent's span follows as a sibling; as_tool runs a nested Runner under the tool span.",
        ],
    )
    for spec in scenarios():
        FAILING_QUERIES.clear()
        FAILING_QUERIES.update(spec.get("failing", ()))
        scripts = {name: list(spec[name]) for name in ("manager", "researcher", "analyst")}
        manager, models = build_crew(scripts, spec.get("research_turns", 10))
        session_id = f"oai-{spec['label']}"
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]), using_session(session_id):
            asyncio.run(
                Runner.run(
                    manager,
                    spec["task"],
                    max_turns=20,
                    run_config=RunConfig(workflow_name="company-facts", group_id=session_id),
                )
            )
        left = {name: len(model.script) for name, model in models.items() if model.script}
        if left:
            raise RuntimeError(f"{spec['label']}: unused scripted replies {left}")
        sent = check_side_effects(spec, len(OUTBOX) - sent_before)
        tracing.flush()
        run_set.runs.append(
            RunTruth(
                run=spec["label"],
                failure=spec["failure"],
                task=spec["task"],
                session_id=session_id,
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
