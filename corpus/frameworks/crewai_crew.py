"""CrewAI: a hierarchical crew (``Process.hierarchical``: CrewAI's manager agent delegates with its
"Delegate work to coworker" tool to a Researcher and an Analyst), traced by
openinference-instrumentation-crewai. Every LLM is a ``crewai.BaseLLM`` subclass answering from a
script in CrewAI's ReAct text format (no network). CrewAI's own telemetry is switched off. Each run
is one ``crew.kickoff`` inside OpenInference's ``using_session(<run>)``.

Runs in its own venv (.venv-crewai): crewai pins an openai major version the OpenAI Agents SDK
of the main framework venv cannot use.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from corpus.capture import start_tracing
from corpus.frameworks.topics import MORE_HEALTHY, search_result
from corpus.truth import RunSet, RunTruth, Subtask, check_side_effects, package_versions

FAILING_QUERIES: set[str] = set()
OUTBOX: list[dict[str, str]] = []
MANAGER = "Crew Manager"


def act(tool: str, args: dict[str, Any], thought: str = "I should use a tool.") -> str:
    return f"Thought: {thought}\nAction: {tool}\nAction Input: {json.dumps(args)}"


def final(text: str) -> str:
    return f"Thought: I now know the final answer\nFinal Answer: {text}"


def delegate(coworker: str, task: str, context: str = "The user asked the crew this question.") -> str:
    return act("Delegate work to coworker", {"task": task, "context": context, "coworker": coworker},
               f"I will delegate this to the {coworker}.")  # fmt: skip


def make_llm_class():
    from crewai.llms.base_llm import BaseLLM

    class ScriptedLLM(BaseLLM):
        """A CrewAI LLM answering from a script (CrewAI's text ReAct format; no function calling)."""

        owner: str = ""
        script: list[str] = []

        def call(self, messages, tools=None, callbacks=None, available_functions=None, from_task=None,
                 from_agent=None, response_model=None):  # fmt: skip
            if not self.script:
                raise RuntimeError(f"the scripted LLM of {self.owner} has no reply left")
            return self.script.pop(0)

        def supports_function_calling(self) -> bool:
            return False

        def supports_stop_words(self) -> bool:
            return True

        def get_context_window_size(self) -> int:
            return 16_000

    return ScriptedLLM


def build_crew(scripts: dict[str, list[str]], question: str):
    from crewai import Agent, Crew, Process, Task
    from crewai.tools import tool

    llm_class = make_llm_class()
    llms = {
        name: llm_class(model="scripted-model", owner=name, script=list(script))
        for name, script in scripts.items()
    }

    @tool("web_search")
    def web_search(query: str) -> str:
        """Search the web and return the top result."""
        if query in FAILING_QUERIES:
            raise RuntimeError("search backend timed out after 30s (HTTP 504)")
        return search_result(query)

    @tool("compute_growth")
    def compute_growth(current: float, previous: float) -> str:
        """Compute the relative growth between two values."""
        return f"{(current - previous) / previous * 100:.1f}%"

    @tool("send_report")
    def send_report(recipient: str, subject: str, body: str) -> str:
        """Email a report (a side effect: every call sends one email)."""
        OUTBOX.append({"recipient": recipient, "subject": subject, "body": body})
        return f"sent to {recipient}"

    researcher = Agent(
        role="Researcher",
        goal="Find accurate facts about companies",
        backstory="A diligent analyst who searches the web and cites sources.",
        tools=[web_search],
        llm=llms["Researcher"],
        allow_delegation=False,
        max_iter=40,
        verbose=False,
        cache=False,
    )
    analyst = Agent(
        role="Analyst",
        goal="Compute figures and email reports",
        backstory="A finance analyst.",
        tools=[compute_growth, send_report],
        llm=llms["Analyst"],
        allow_delegation=False,
        max_iter=10,
        verbose=False,
        # CrewAI's tool cache answers an identical second call without running the tool: off, so
        # a repeated send really sends (and a repeated search really searches) as in the other crews.
        cache=False,
    )
    task = Task(description=question, expected_output="A short factual answer.")
    crew = Crew(
        agents=[researcher, analyst],
        tasks=[task],
        process=Process.hierarchical,
        manager_llm=llms[MANAGER],
        verbose=False,
    )
    return crew, llms


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
                subtasks=[Subtask("Researcher", subtask)],
                scripts={
                    MANAGER: [delegate("Researcher", subtask), final(result)],
                    "Researcher": [act("web_search", {"query": query}), final(result)],
                    "Analyst": [],
                },
            )
        )
    for key, question, subtask, queries, result in MORE_HEALTHY:
        runs.append(
            dict(
                label=f"healthy-{key}",
                failure=None,
                task=question,
                subtasks=[Subtask("Researcher", subtask)],
                scripts={
                    MANAGER: [delegate("Researcher", subtask), final(result)],
                    "Researcher": [act("web_search", {"query": q}) for q in queries] + [final(result)],
                    "Analyst": [],
                },
            )
        )
    growth = "Compute Globex's revenue growth from USD 2.10 billion (2023) to USD 2.31 billion (2024)."
    runs.append(
        dict(
            label="healthy-growth",
            failure=None,
            task="What was Globex's revenue growth from 2023 to 2024?",
            subtasks=[Subtask("Researcher", "Find Globex's revenue for 2023 and 2024."), Subtask("Analyst", growth)],
            scripts={
                MANAGER: [delegate("Researcher", "Find Globex's revenue for 2023 and 2024."), delegate("Analyst", growth),
                          final("10.0%")],
                "Researcher": [act("web_search", {"query": "Globex revenue 2023 2024"}),
                               final("USD 2.10 billion (2023), USD 2.31 billion (2024)")],
                "Analyst": [act("compute_growth", {"current": 2.31, "previous": 2.10}), final("10.0%")],
            },
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
            subtasks=[Subtask("Researcher", task)],
            scripts={
                MANAGER: [delegate("Researcher", task), final("The figure could not be found.")],
                "Researcher": [act("web_search", {"query": q}) for q in retry_queries]
                + [final("The search kept failing.")],
                "Analyst": [],
            },
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
            subtasks=[Subtask("Researcher", same), Subtask("Researcher", same), Subtask("Researcher", reworded)],
            scripts={
                MANAGER: [delegate("Researcher", same), delegate("Researcher", same, "Asking again to be sure."),
                          delegate("Researcher", reworded, "Asking once more."), final("18,250 employees")],
                "Researcher": [act("web_search", {"query": "Contoso employees 2023"}), final("18,250"),
                               act("web_search", {"query": "Contoso employees 2023"}), final("18,250"),
                               act("web_search", {"query": "Contoso employee count end of 2023"}), final("18,250")],
                "Analyst": [],
            },
            note="the manager delegates the same question to the Researcher three times (the third re-worded)",
        )
    )  # fmt: skip
    pizza = "Find a recipe for Neapolitan pizza dough with high hydration."
    runs.append(
        dict(
            label="off-topic",
            failure="off_topic_task",
            task="What is Fabrikam's market share in Germany?",
            subtasks=[Subtask("Researcher", pizza, off_topic=True)],
            scripts={
                MANAGER: [delegate("Researcher", pizza), final("1 kg flour, 700 ml water")],
                "Researcher": [act("web_search", {"query": "Neapolitan pizza dough recipe high hydration"}),
                               final("1 kg flour, 700 ml water")],
                "Analyst": [],
            },
        )
    )  # fmt: skip
    growth_q = "Compute Globex's revenue growth from 2023 to 2024."
    manager, researcher, analyst = [], [], []
    for _ in range(3):
        manager.append(delegate("Analyst", growth_q))
        analyst.append(final("I need the revenue figures first: ask the Researcher."))
        manager.append(delegate("Researcher", growth_q))
        researcher.append(final("This is a calculation: ask the Analyst."))
    manager.append(final("Could not determine the growth."))
    runs.append(
        dict(
            label="ping-pong",
            failure="ping_pong",
            task="What was Globex's revenue growth from 2023 to 2024?",
            subtasks=[Subtask("Analyst", growth_q), Subtask("Researcher", growth_q)] * 3,
            scripts={MANAGER: manager, "Researcher": researcher, "Analyst": analyst},
            note="the manager hands the task to the Analyst and the Researcher alternately, 3 times each; each hands it back",
        )
    )
    send = {"recipient": "cfo@initech.example", "subject": "Initech operating margin 2024", "body": "11.8%"}
    mail = "Email Initech's 2024 operating margin of 11.8% to cfo@initech.example."
    runs.append(
        dict(
            label="duplicate-email",
            failure="duplicate_side_effect",
            task="What was Initech's operating margin in 2024? Email it to the CFO.",
            subtasks=[Subtask("Researcher", "Find Initech's operating margin for fiscal year 2024."), Subtask("Analyst", mail)],
            scripts={
                MANAGER: [delegate("Researcher", "Find Initech's operating margin for fiscal year 2024."),
                          delegate("Analyst", mail), final("11.8%, emailed to the CFO")],
                "Researcher": [act("web_search", {"query": "Initech operating margin FY2024"}), final("11.8%")],
                # CrewAI refuses a tool call identical to the one just before it, so the repeated send
                # comes after another call (as an agent re-checking and re-sending would).
                "Analyst": [act("send_report", send),
                            act("compute_growth", {"current": 11.8, "previous": 11.8}, "Let me check the figure."),
                            act("send_report", send, "Not sure it went out; sending again."),
                            final("Emailed.")],
            },
            note="send_report called twice with identical arguments by the Analyst (a compute_growth call between)",
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
            subtasks=[Subtask("Researcher", cities)],
            scripts={
                MANAGER: [delegate("Researcher", cities), final("Madrid, Barcelona, Valencia and Seville")],
                "Researcher": [act("web_search", {"query": f"Umbrella Logistics {f}"}) for f in facets]
                + [final("Madrid, Barcelona, Valencia and Seville")],
                "Analyst": [],
            },
            note="the Researcher makes 24 different searches (healthy runs make 1); max_iter 40, no budget",
        )
    )
    return runs


def generate(out_dir: Path) -> Path:
    # CrewAI's own telemetry and trace upload would reach the network: off.
    os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
    os.environ["CREWAI_TRACING_ENABLED"] = "false"
    os.environ["CREWAI_DISABLE_TRACKING"] = "true"
    from openinference.instrumentation import using_session
    from openinference.instrumentation.crewai import CrewAIInstrumentor

    service = "corpus-crewai"
    tracing = start_tracing(service)
    # The event-listener mode: CrewAI's own event bus -> spans for agents, tools and LLM calls. The
    # default (wrapper) mode traces only Crew.kickoff and the manager's Task._execute_core with
    # crewai 1.15: 2 spans per hierarchical run, none for the coworkers or their tools.
    CrewAIInstrumentor().instrument(tracer_provider=tracing.provider, use_event_listener=True)
    run_set = RunSet(
        framework="crewai",
        instrumentation="openinference-instrumentation-crewai (use_event_listener=True)",
        service_name=service,
        versions=package_versions("crewai", "openinference-instrumentation-crewai", "opentelemetry-exporter-otlp-proto-http"),
        session="OpenInference using_session(<run>) -> session.id",
        agent_span_names={},
        notes=["Hierarchical process: CrewAI creates the 'Crew Manager' agent; delegations are its "
               "'Delegate work to coworker' tool calls (task, context, coworker role)."],
    )  # fmt: skip
    for spec in scenarios():
        FAILING_QUERIES.clear()
        FAILING_QUERIES.update(spec.get("failing", ()))
        crew, llms = build_crew(spec["scripts"], spec["task"])
        session_id = f"crew-{spec['label']}"
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]), using_session(session_id):
            crew.kickoff()
        left = {name: len(llm.script) for name, llm in llms.items() if llm.script}
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
    run_set.agent_span_names = AGENT_SPAN_NAMES
    out_dir.mkdir(parents=True, exist_ok=True)
    tracing.finish(out_dir / "otlp.jsonl")
    truth = out_dir / "truth.json"
    run_set.write(truth)
    return truth


# The event listener names an agent's span "<role>.<first 50 characters of its task>.execute"; a
# trailing "*" in agent_span_names is a prefix match (corpus/README.md).
AGENT_SPAN_NAMES: dict[str, str] = {f"{role}.*": role for role in (MANAGER, "Researcher", "Analyst")}
