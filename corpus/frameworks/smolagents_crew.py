"""smolagents: a CodeAgent manager with managed ToolCallingAgents, traced by
openinference-instrumentation-smolagents, models scripted through smolagents' own OpenAIModel
with a scripted client. Each run is one ``manager.run`` inside OpenInference's ``using_session``
(the session id is the run id, as smolagents users set it).
"""

from __future__ import annotations

import json
from pathlib import Path

from corpus.capture import start_tracing
from corpus.frameworks.scripted_openai import ScriptedClient, call, say
from corpus.frameworks.topics import MORE_HEALTHY, search_result
from corpus.truth import RunSet, RunTruth, Subtask, check_side_effects, package_versions

FRAMEWORK = "smolagents"
SERVICE = "corpus-smolagents"


class SearchBackend:
    """The search tool's backend: canned results, and queries scripted to fail (a flaky service)."""

    def __init__(self) -> None:
        self.failing: set[str] = set()

    def search(self, query: str) -> str:
        if query in self.failing:
            raise RuntimeError("search backend timed out after 30s (HTTP 504)")
        return search_result(query)


BACKEND = SearchBackend()
OUTBOX: list[dict[str, str]] = []


def build_tools():
    from smolagents import tool

    @tool
    def web_search(query: str) -> str:
        """Searches the web and returns the top result.

        Args:
            query: The search query.
        """
        return BACKEND.search(query)

    @tool
    def send_report(recipient: str, subject: str, body: str) -> str:
        """Emails a report to a recipient (a side effect: every call sends one email).

        Args:
            recipient: Email address to send to.
            subject: Subject line.
            body: Report text.
        """
        OUTBOX.append({"recipient": recipient, "subject": subject, "body": body})
        return f"sent to {recipient}"

    @tool
    def compute_growth(current: float, previous: float) -> str:
        """Computes the relative growth between two values.

        Args:
            current: The newer value.
            previous: The older value.
        """
        return f"{(current - previous) / previous * 100:.1f}%"

    return web_search, send_report, compute_growth


def code(thought: str, body: str) -> dict:
    return say(f"Thought: {thought}\n<code>\n{body}\n</code>")


def delegate(agent: str, task: str) -> str:
    return f"report = {agent}(task={json.dumps(task)})\nprint(report)"


class Crew:
    """Fresh agents per run, each with its own scripted model."""

    def __init__(self, manager_script, search_script, analyst_script=None, search_steps=8):
        from smolagents import CodeAgent, OpenAIModel, ToolCallingAgent
        from smolagents.monitoring import LogLevel

        web_search, send_report, compute_growth = build_tools()
        self.clients = {
            "manager": ScriptedClient("manager", manager_script),
            "search_agent": ScriptedClient("search_agent", search_script),
            "analyst_agent": ScriptedClient("analyst_agent", analyst_script or []),
        }

        def model(name):
            return OpenAIModel(model_id="scripted-model", client=self.clients[name])

        search = ToolCallingAgent(
            tools=[web_search],
            model=model("search_agent"),
            name="search_agent",
            description="Searches the web for facts about companies and returns them with sources.",
            max_steps=search_steps,
            verbosity_level=LogLevel.OFF,
        )
        managed = [search]
        if analyst_script is not None:
            managed.append(
                ToolCallingAgent(
                    tools=[compute_growth],
                    model=model("analyst_agent"),
                    name="analyst_agent",
                    description="Computes growth rates and ratios from figures it is given.",
                    max_steps=6,
                    verbosity_level=LogLevel.OFF,
                )
            )
        self.manager = CodeAgent(
            tools=[send_report],
            model=model("manager"),
            managed_agents=managed,
            name="manager",
            max_steps=12,
            verbosity_level=LogLevel.OFF,
        )

    def run(self, task: str) -> str:
        result = self.manager.run(task)
        left = {name: c.remaining for name, c in self.clients.items() if c.remaining}
        if left:
            raise RuntimeError(f"run ended with unused scripted replies: {left}")
        return str(result)


def search_once(query: str, answer: str, n: int) -> list[dict]:
    return [
        call("web_search", {"query": query}, f"call_{n}_1"),
        call("final_answer", {"answer": answer}, f"call_{n}_2"),
    ]


def scenarios():
    """(label, failure, task, subtasks, crew kwargs, set-up) for every run."""
    runs = []
    # Healthy runs: one or two delegations, sometimes a single report email.
    healthy = [
        ("northwind", "What was Northwind Traders' revenue in the EU in 2024?",
         "Find Northwind Traders' EU revenue for fiscal year 2024.", "Northwind EU revenue 2024",
         "EUR 412 million", False),
        ("contoso", "How many employees did Contoso have at the end of 2023?",
         "Find Contoso's employee count at the end of 2023.", "Contoso employees December 2023",
         "18,250 employees", True),
        ("fabrikam", "What is Fabrikam's market share in Germany?",
         "Find Fabrikam's share of the German office-furniture market.", "Fabrikam market share Germany",
         "14%", False),
        ("initech", "What was Initech's operating margin in 2024?",
         "Find Initech's operating margin for fiscal year 2024.", "Initech operating margin FY2024",
         "11.8%", True),
        ("umbrella", "Which cities in Spain does Umbrella Logistics ship to?",
         "List the Spanish cities Umbrella Logistics ships to.", "Umbrella Logistics Spain cities",
         "Madrid, Barcelona, Valencia and Seville", False),
    ]  # fmt: skip
    for n, (key, question, subtask, query, answer, email) in enumerate(healthy):
        manager = [code("I will ask the search agent.", delegate("search_agent", subtask))]
        if email:
            manager.append(
                code(
                    "I will email the answer to the analyst team.",
                    f'send_report(recipient="analysts@example.com", subject={json.dumps(question)}, '
                    f"body={json.dumps(answer)})",
                )
            )
        manager.append(code("I have the answer.", f"final_answer({json.dumps(answer)})"))
        runs.append(
            dict(
                label=f"healthy-{key}",
                failure=None,
                task=question,
                subtasks=[Subtask("search_agent", subtask)],
                manager=manager,
                search=search_once(query, answer, n),
            )
        )
    for n, (key, question, subtask, queries, answer) in enumerate(MORE_HEALTHY, start=60):
        searches = [call("web_search", {"query": q}, f"call_{n}_{i}") for i, q in enumerate(queries)]
        runs.append(
            dict(
                label=f"healthy-{key}",
                failure=None,
                task=question,
                subtasks=[Subtask("search_agent", subtask)],
                manager=[
                    code("I will ask the search agent.", delegate("search_agent", subtask)),
                    code("I have the answer.", f"final_answer({json.dumps(answer)})"),
                ],
                search=searches + [call("final_answer", {"answer": answer}, f"call_{n}_f")],
            )
        )
    # A healthy run with two different delegations (a comparison), so that two sub-agent calls in
    # one run are not a loop by themselves.
    runs.append(
        dict(
            label="healthy-compare",
            failure=None,
            task="Compare Globex's revenue in 2023 and 2024.",
            subtasks=[
                Subtask("search_agent", "Find Globex's revenue for 2023."),
                Subtask("search_agent", "Find Globex's revenue for 2024."),
            ],
            manager=[
                code("First 2023.", delegate("search_agent", "Find Globex's revenue for 2023.")),
                code("Now 2024.", delegate("search_agent", "Find Globex's revenue for 2024.")),
                code("Done.", 'final_answer("USD 2.10 billion in 2023, USD 2.31 billion in 2024")'),
            ],
            search=search_once("Globex revenue 2023", "USD 2.10 billion", 20)
            + search_once("Globex revenue 2024", "USD 2.31 billion", 21),
        )
    )
    # Failure: a retry loop with re-worded queries, errors and successes mixed.
    retry_queries = [
        "Northwind EU revenue 2024",
        "revenue of Northwind in the EU in 2024",
        "Northwind 2024 EU revenue figures",
        "Northwind revenue EU 2024",
        "EU revenue Northwind 2024 annual",
    ]
    runs.append(
        dict(
            label="retry-loop",
            failure="retry_loop",
            task="What was Northwind Traders' revenue in the EU in 2024?",
            subtasks=[Subtask("search_agent", "Find Northwind Traders' EU revenue for fiscal year 2024.")],
            manager=[
                code("I will ask the search agent.", delegate("search_agent", "Find Northwind Traders' EU revenue for fiscal year 2024.")),
                code("The search failed.", 'final_answer("The figure could not be found.")'),
            ],
            search=[call("web_search", {"query": q}, f"call_r{i}") for i, q in enumerate(retry_queries)]
            + [call("final_answer", {"answer": "The search kept failing."}, "call_r9")],
            failing={retry_queries[0], retry_queries[2], retry_queries[4]},
            note="web_search called 5 times with re-worded queries; calls 1, 3 and 5 fail (timeout), 2 and 4 return a result",
        )
    )  # fmt: skip
    # Failure: the manager re-delegates the same question three times.
    same = "Find Contoso's employee count at the end of 2023."
    runs.append(
        dict(
            label="redelegation",
            failure="redelegation",
            task="How many employees did Contoso have at the end of 2023?",
            subtasks=[Subtask("search_agent", same)] * 2
            + [Subtask("search_agent", "Find the number of employees Contoso had at the end of 2023.")],
            manager=[
                code("I will ask the search agent.", delegate("search_agent", same)),
                code("Let me ask again to be sure.", delegate("search_agent", same)),
                code("Once more, worded differently.", delegate("search_agent", "Find the number of employees Contoso had at the end of 2023.")),
                code("Done.", 'final_answer("18,250 employees")'),
            ],
            search=search_once("Contoso employees 2023", "18,250", 30)
            + search_once("Contoso employees 2023", "18,250", 31)
            + search_once("Contoso employee count end of 2023", "18,250", 32),
            note="search_agent invoked three times with the same question (the third re-worded)",
        )
    )  # fmt: skip
    # Failure: the sub-agent is handed an off-topic task.
    runs.append(
        dict(
            label="off-topic",
            failure="off_topic_task",
            task="What is Fabrikam's market share in Germany?",
            subtasks=[Subtask("search_agent", "Find a recipe for Neapolitan pizza dough with high hydration.", off_topic=True)],
            manager=[
                code("I will ask the search agent.", delegate("search_agent", "Find a recipe for Neapolitan pizza dough with high hydration.")),
                code("Done.", 'final_answer("1 kg flour, 700 ml water")'),
            ],
            search=search_once("Neapolitan pizza dough recipe high hydration", "1 kg flour, 700 ml water", 40),
        )
    )  # fmt: skip
    # Failure: ping-pong between the two sub-agents through the manager.
    growth = "What was Globex's revenue growth from 2023 to 2024?"
    to_analyst = "Compute Globex's revenue growth from 2023 to 2024."
    to_search = "Find Globex's revenue growth from 2023 to 2024."
    manager, analyst, search, subtasks = [], [], [], []
    for i in range(3):
        manager.append(code("The analyst should compute this.", delegate("analyst_agent", to_analyst)))
        analyst.append(
            call(
                "final_answer",
                {"answer": "I need the revenue figures first: ask search_agent."},
                f"call_a{i}",
            )
        )
        manager.append(code("The search agent should find it.", delegate("search_agent", to_search)))
        search.append(
            call("final_answer", {"answer": "This is a calculation: ask analyst_agent."}, f"call_s{i}")
        )
        subtasks += [Subtask("analyst_agent", to_analyst), Subtask("search_agent", to_search)]
    manager.append(code("Giving up.", 'final_answer("Could not determine the growth.")'))
    runs.append(
        dict(
            label="ping-pong",
            failure="ping_pong",
            task=growth,
            subtasks=subtasks,
            manager=manager,
            search=search,
            analyst=analyst,
            note="the manager hands the question to analyst_agent and search_agent alternately, 3 times each; each hands it back",
        )
    )
    # Failure: the report email is sent twice with the same arguments.
    send = (
        'send_report(recipient="cfo@initech.example", subject="Initech operating margin 2024", body="11.8%")'
    )
    runs.append(
        dict(
            label="duplicate-email",
            failure="duplicate_side_effect",
            task="What was Initech's operating margin in 2024? Email it to the CFO.",
            subtasks=[Subtask("search_agent", "Find Initech's operating margin for fiscal year 2024.")],
            manager=[
                code("I will ask the search agent.", delegate("search_agent", "Find Initech's operating margin for fiscal year 2024.")),
                code("Email the CFO.", send),
                code("I am not sure the email went out; sending it again.", send),
                code("Done.", 'final_answer("11.8%, emailed to the CFO")'),
            ],
            search=search_once("Initech operating margin FY2024", "11.8%", 50),
        )
    )  # fmt: skip
    # Failure: runaway (no budget): the search agent makes 24 distinct searches.
    facets = [
        "Madrid depot", "Barcelona port", "Valencia warehouse", "Seville hub", "Bilbao route", "Malaga office",
        "Zaragoza rail", "Murcia customers", "Palma ferry", "Vigo trucks", "Alicante storage", "Cordoba partner",
        "Granada delivery", "Valladolid fleet", "Gijon terminal", "Oviedo clients", "Pamplona depot",
        "Santander shipping", "Toledo drivers", "Salamanca stock", "Cadiz containers", "Leon pickup",
        "Tarragona chemicals", "Girona express",
    ]  # fmt: skip
    runs.append(
        dict(
            label="runaway",
            failure="runaway",
            task="Which cities in Spain does Umbrella Logistics ship to?",
            subtasks=[Subtask("search_agent", "List the Spanish cities Umbrella Logistics ships to.")],
            manager=[
                code("I will ask the search agent.", delegate("search_agent", "List the Spanish cities Umbrella Logistics ships to.")),
                code("Done.", 'final_answer("Madrid, Barcelona, Valencia and Seville")'),
            ],
            search=[call("web_search", {"query": f"Umbrella Logistics {f}"}, f"call_u{i}") for i, f in enumerate(facets)]
            + [call("final_answer", {"answer": "Madrid, Barcelona, Valencia and Seville"}, "call_u99")],
            search_steps=40,
            note="search_agent makes 24 different searches (healthy runs make 1-2); no step budget is set",
        )
    )  # fmt: skip
    return runs


def generate(out_dir: Path) -> Path:
    from openinference.instrumentation import using_session
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    tracing = start_tracing(SERVICE)
    SmolagentsInstrumentor().instrument(tracer_provider=tracing.provider)
    run_set = RunSet(
        framework=FRAMEWORK,
        instrumentation="openinference-instrumentation-smolagents",
        service_name=SERVICE,
        versions=package_versions(
            "smolagents", "openinference-instrumentation-smolagents", "opentelemetry-exporter-otlp-proto-http"
        ),
        session="OpenInference using_session(<run>) -> session.id on every span",
        agent_span_names={
            "manager.run": "manager",
            "search_agent.run": "search_agent",
            "analyst_agent.run": "analyst_agent",
        },
        notes=[
            "Named agents appear as AGENT spans '<name>.run' (a managed agent's run is nested in the "
            "manager's Step span, no TOOL span for the invocation); expected agent of a span = nearest "
            "ancestor-or-self whose span name is in agent_span_names.",
            "The CodeAgent manager acts through code blocks in its LLM output; its tool calls "
            "(send_report, managed agents) run inside the code executor.",
        ],
    )
    for spec in scenarios():
        session_id = f"smol-{spec['label']}"
        BACKEND.failing = set(spec.get("failing", ()))
        crew = Crew(spec["manager"], spec["search"], spec.get("analyst"), spec.get("search_steps", 8))
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]), using_session(session_id):
            crew.run(spec["task"])
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
