"""PydanticAI: a manager agent delegating to researcher and analyst agents from its tools (the
"agent delegation" pattern: ``await other.run(task, usage=ctx.usage)``), with PydanticAI's native
OpenTelemetry GenAI-convention spans (``Agent.instrument_all``) and ``FunctionModel`` models
answering from a script (no network). Each run is one ``manager.run(..., conversation_id=<run>)``
(``gen_ai.conversation.id`` on the agent run span).
"""

# No `from __future__ import annotations`: PydanticAI reads the tools' annotations at run time.

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


def scripted_model(owner: str, script: list[dict[str, Any]]):
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    counter = {"n": 0}

    def respond(messages, info) -> ModelResponse:
        if not script:
            raise RuntimeError(f"the scripted model of {owner} has no reply left")
        reply = script.pop(0)
        counter["n"] += 1
        if "call" in reply:
            part = ToolCallPart(
                tool_name=reply["call"],
                args=json.dumps(reply["args"]),
                tool_call_id=f"call_{owner}_{counter['n']}",
            )
            return ModelResponse(parts=[part], model_name="scripted-model")
        return ModelResponse(parts=[TextPart(reply["text"])], model_name="scripted-model")

    return FunctionModel(respond, model_name="scripted-model")


def build_crew(scripts: dict[str, list[dict[str, Any]]]):
    from pydantic_ai import Agent, ModelRetry, RunContext

    researcher = Agent(
        scripted_model("researcher", scripts["researcher"]),
        name="researcher",
        instructions="You find facts about companies with web_search and cite them.",
    )
    analyst = Agent(
        scripted_model("analyst", scripts["analyst"]),
        name="analyst",
        instructions="You compute growth rates and ratios from the figures you are given.",
    )
    manager = Agent(
        scripted_model("manager", scripts["manager"]),
        name="manager",
        instructions="You answer questions about companies. Ask the researcher for facts and the "
        "analyst for calculations; email reports when asked.",
    )

    @researcher.tool_plain(retries=4)
    def web_search(query: str) -> str:
        """Search the web and return the top result."""
        if query in FAILING_QUERIES:
            raise ModelRetry("search backend timed out after 30s (HTTP 504)")
        return search_result(query)

    @analyst.tool_plain
    def compute_growth(current: float, previous: float) -> str:
        """Compute the relative growth between two values."""
        return f"{(current - previous) / previous * 100:.1f}%"

    @manager.tool_plain
    def send_report(recipient: str, subject: str, body: str) -> str:
        """Email a report (a side effect: every call sends one email)."""
        OUTBOX.append({"recipient": recipient, "subject": subject, "body": body})
        return f"sent to {recipient}"

    @manager.tool
    async def ask_researcher(ctx: RunContext[None], task: str) -> str:
        """Ask the research agent to find a fact."""
        result = await researcher.run(task, usage=ctx.usage)
        return result.output

    @manager.tool
    async def ask_analyst(ctx: RunContext[None], task: str) -> str:
        """Ask the analyst agent to compute something."""
        result = await analyst.run(task, usage=ctx.usage)
        return result.output

    # The specialists may consult each other (ping-pong needs both directions).
    @researcher.tool
    async def consult_analyst(ctx: RunContext[None], task: str) -> str:
        """Hand a calculation to the analyst agent."""
        result = await analyst.run(task, usage=ctx.usage)
        return result.output

    @analyst.tool
    async def consult_researcher(ctx: RunContext[None], task: str) -> str:
        """Hand a fact-finding question to the research agent."""
        result = await researcher.run(task, usage=ctx.usage)
        return result.output

    return manager


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
                manager=[call("ask_researcher", {"task": subtask}), answer(result)],
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
                manager=[call("ask_researcher", {"task": subtask}), answer(result)],
                researcher=[call("web_search", {"query": q}) for q in queries] + [answer(result)],
                analyst=[],
            )
        )
    growth_task = "Compute Globex's revenue growth from USD 2.10 billion (2023) to USD 2.31 billion (2024)."
    runs.append(
        dict(
            label="healthy-growth",
            failure=None,
            task="What was Globex's revenue growth from 2023 to 2024?",
            subtasks=[Subtask("researcher", "Find Globex's revenue for 2023 and 2024."), Subtask("analyst", growth_task)],
            manager=[call("ask_researcher", {"task": "Find Globex's revenue for 2023 and 2024."}),
                     call("ask_analyst", {"task": growth_task}), answer("10.0%")],
            researcher=[call("web_search", {"query": "Globex revenue 2023 2024"}),
                        answer("USD 2.10 billion (2023), USD 2.31 billion (2024)")],
            analyst=[call("compute_growth", {"current": 2.31, "previous": 2.10}), answer("10.0%")],
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
            manager=[call("ask_researcher", {"task": task}), answer("The figure could not be found.")],
            researcher=[call("web_search", {"query": q}) for q in retry_queries]
            + [answer("The search kept failing.")],
            analyst=[],
            failing={retry_queries[0], retry_queries[2], retry_queries[4]},
            note="web_search called 5 times with re-worded queries; calls 1, 3 and 5 raise ModelRetry (timeout), 2 and 4 return a result",
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
            manager=[call("ask_researcher", {"task": same}), call("ask_researcher", {"task": same}),
                     call("ask_researcher", {"task": reworded}), answer("18,250 employees")],
            researcher=[call("web_search", {"query": "Contoso employees 2023"}), answer("18,250"),
                        call("web_search", {"query": "Contoso employees 2023"}), answer("18,250"),
                        call("web_search", {"query": "Contoso employee count end of 2023"}), answer("18,250")],
            analyst=[],
            note="the manager delegates the same question to the researcher three times (the third re-worded)",
        )
    )  # fmt: skip
    pizza = "Find a recipe for Neapolitan pizza dough with high hydration."
    runs.append(
        dict(
            label="off-topic",
            failure="off_topic_task",
            task="What is Fabrikam's market share in Germany?",
            subtasks=[Subtask("researcher", pizza, off_topic=True)],
            manager=[call("ask_researcher", {"task": pizza}), answer("1 kg flour, 700 ml water")],
            researcher=[
                call("web_search", {"query": "Neapolitan pizza dough recipe high hydration"}),
                answer("1 kg flour, 700 ml water"),
            ],
            analyst=[],
        )
    )
    growth = "Compute Globex's revenue growth from 2023 to 2024."
    # manager -> analyst -> researcher -> analyst -> researcher -> analyst -> researcher (nested
    # delegations), the innermost researcher gives up, and every level passes the failure back.
    # Model calls in order: a1 r1 a2 r2 a3 r3 (r3 gives up), then a3 r2 a2 r1 a1 answer in turn.
    analyst = [call("consult_researcher", {"task": growth})] * 3 + [
        answer("Could not compute the growth.")
    ] * 3
    researcher = [call("consult_analyst", {"task": growth})] * 2 + [answer("Cannot compute this.")]
    researcher += [answer("Could not compute the growth.")] * 2
    runs.append(
        dict(
            label="ping-pong",
            failure="ping_pong",
            task="What was Globex's revenue growth from 2023 to 2024?",
            subtasks=[Subtask("analyst", growth), Subtask("researcher", growth)] * 3,
            manager=[call("ask_analyst", {"task": growth}), answer("Could not determine the growth.")],
            researcher=researcher,
            analyst=analyst,
            note="analyst and researcher delegate the same task to each other (consult_* tools), 3 times each way, nested",
        )
    )
    send = {"recipient": "cfo@initech.example", "subject": "Initech operating margin 2024", "body": "11.8%"}
    subtask = "Find Initech's operating margin for fiscal year 2024."
    runs.append(
        dict(
            label="duplicate-email",
            failure="duplicate_side_effect",
            task="What was Initech's operating margin in 2024? Email it to the CFO.",
            subtasks=[Subtask("researcher", subtask)],
            manager=[call("ask_researcher", {"task": subtask}), call("send_report", send), call("send_report", send),
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
                call("ask_researcher", {"task": cities}),
                answer("Madrid, Barcelona, Valencia and Seville"),
            ],
            researcher=[call("web_search", {"query": f"Umbrella Logistics {f}"}) for f in facets]
            + [answer("Madrid, Barcelona, Valencia and Seville")],
            analyst=[],
            note="the researcher makes 24 different searches (healthy runs make 1); no usage limit set",
        )
    )
    return runs


def generate(out_dir: Path) -> Path:
    from pydantic_ai import Agent
    from pydantic_ai.models.instrumented import InstrumentationSettings

    service = "corpus-pydantic-ai"
    tracing = start_tracing(service)
    Agent.instrument_all(InstrumentationSettings(tracer_provider=tracing.provider))
    run_set = RunSet(
        framework="pydantic-ai",
        instrumentation="pydantic-ai native OpenTelemetry (GenAI semantic conventions)",
        service_name=service,
        versions=package_versions("pydantic-ai-slim", "opentelemetry-exporter-otlp-proto-http"),
        session="manager.run(..., conversation_id=<run>) -> gen_ai.conversation.id on the top agent run; "
        "delegated runs (other.run(task, usage=ctx.usage), as the docs show) get a generated id of their own",
        agent_span_names={
            "invoke_agent manager": "manager",
            "invoke_agent researcher": "researcher",
            "invoke_agent analyst": "analyst",
            "manager run": "manager",
            "researcher run": "researcher",
            "analyst run": "analyst",
        },
        notes=["Agent run spans carry gen_ai.agent.name; delegations are tool calls (execute_tool ask_*) "
               "whose child is the delegate's agent run span."],
    )  # fmt: skip
    import asyncio

    for spec in scenarios():
        FAILING_QUERIES.clear()
        FAILING_QUERIES.update(spec.get("failing", ()))
        scripts = {name: list(spec[name]) for name in ("manager", "researcher", "analyst")}
        manager = build_crew(scripts)
        conversation = f"pai-{spec['label']}"
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]):
            asyncio.run(manager.run(spec["task"], conversation_id=conversation))
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
                session_id=conversation,
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
