"""LangGraph: a supervisor crew (supervisor node routing with Command to prebuilt ReAct sub-agents
``researcher`` and ``analyst``), traced either by openinference-instrumentation-langchain or by
OpenLLMetry's opentelemetry-instrumentation-langchain. Models are a scripted langchain_core chat
model. Each run is one ``graph.invoke`` with ``configurable.thread_id`` = the run, as LangGraph
users name a conversation (OpenInference turns it into ``session.id``; OpenLLMetry into
``traceloop.association.properties.thread_id``).

The supervisor delegates with a handoff tool call ``transfer_to_<agent>(task=...)``; the
sub-agent node runs its ReAct agent on a fresh conversation whose first user message is the task
(LangGraph's "subgraph with its own state" pattern) and hands back to the supervisor, or, when
its agent called ``transfer_to_<other>``, straight to the other sub-agent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corpus.capture import start_tracing
from corpus.frameworks.topics import MORE_HEALTHY, search_result
from corpus.truth import RunSet, RunTruth, Subtask, check_side_effects, package_versions

FAILING_QUERIES: set[str] = set()
OUTBOX: list[dict[str, str]] = []


def make_chat_model_class():
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(BaseChatModel):
        """A chat model answering from a script (no network); ``bind_tools`` keeps the script."""

        owner: str
        script: list[dict[str, Any]]

        @property
        def _llm_type(self) -> str:
            return "scripted-chat-model"

        def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
            if not self.script:
                raise RuntimeError(f"the scripted model of {self.owner} has no reply left")
            reply = self.script.pop(0)
            message = AIMessage(content=reply.get("content", ""), tool_calls=reply.get("tool_calls", []))
            text = message.content or json.dumps(reply.get("tool_calls", []))
            message.usage_metadata = {
                "input_tokens": 200,
                "output_tokens": max(1, len(text) // 4),
                "total_tokens": 200 + max(1, len(text) // 4),
            }
            return ChatResult(
                generations=[ChatGeneration(message=message)], llm_output={"model_name": "scripted"}
            )

        def bind_tools(self, tools, **kwargs):
            return self

    return ScriptedChatModel


def tool_call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "args": args, "id": call_id, "type": "tool_call"}]}


def answer(text: str) -> dict[str, Any]:
    return {"content": text, "tool_calls": []}


def build_tools():
    from langchain_core.tools import tool

    @tool
    def web_search(query: str) -> str:
        """Search the web and return the top result."""
        if query in FAILING_QUERIES:
            raise RuntimeError("search backend timed out after 30s (HTTP 504)")
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

    @tool
    def transfer_to_analyst(reason: str) -> str:
        """Hand the question to the analyst agent."""
        return "transferring to analyst"

    @tool
    def transfer_to_researcher(reason: str) -> str:
        """Hand the question to the researcher agent."""
        return "transferring to researcher"

    return web_search, compute_growth, send_report, transfer_to_analyst, transfer_to_researcher


def build_graph(scripts: dict[str, list[dict[str, Any]]]):
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, create_react_agent
    from langgraph.types import Command

    chat_model = make_chat_model_class()
    web_search, compute_growth, send_report, to_analyst, to_researcher = build_tools()
    agent_models = {name: chat_model(owner=name, script=scripts[name]) for name in ("researcher", "analyst")}
    agents = {
        "researcher": create_react_agent(
            agent_models["researcher"],
            # Tool errors go back to the model as error messages, as most crews configure it.
            tools=ToolNode([web_search, to_analyst], handle_tool_errors=True),
            name="researcher",
            prompt="You are a research agent. Find facts with web_search and cite them.",
        ),
        "analyst": create_react_agent(
            agent_models["analyst"],
            tools=ToolNode([compute_growth, send_report, to_researcher], handle_tool_errors=True),
            name="analyst",
            prompt="You are an analyst. Compute figures and email reports when asked.",
        ),
    }
    supervisor_model = chat_model(owner="supervisor", script=scripts["supervisor"])
    # pydantic copies the lists: the models' own scripts are what the run consumes
    models = {"supervisor": supervisor_model, **{name: agent_models[name] for name in agent_models}}

    class CrewState(MessagesState):
        task: str

    def supervisor(state: CrewState) -> Command:
        reply = supervisor_model.invoke(state["messages"])
        if reply.tool_calls:
            call = reply.tool_calls[0]
            target = call["name"].removeprefix("transfer_to_")
            return Command(goto=target, update={"messages": [reply], "task": call["args"]["task"]})
        return Command(goto=END, update={"messages": [reply]})

    def sub_agent(name: str):
        other = "analyst" if name == "researcher" else "researcher"

        def node(state: CrewState) -> Command:
            result = agents[name].invoke({"messages": [HumanMessage(state["task"])]})
            handoff = any(
                call["name"] == f"transfer_to_{other}"
                for message in result["messages"]
                for call in getattr(message, "tool_calls", None) or []
            )
            update = {"messages": [AIMessage(result["messages"][-1].content, name=name)]}
            return Command(goto=other if handoff else "supervisor", update=update)

        return node

    graph = StateGraph(CrewState)
    graph.add_node("supervisor", supervisor, destinations=("researcher", "analyst", END))
    graph.add_node("researcher", sub_agent("researcher"), destinations=("supervisor", "analyst"))
    graph.add_node("analyst", sub_agent("analyst"), destinations=("supervisor", "researcher"))
    graph.add_edge(START, "supervisor")
    return graph.compile(), models


def delegate(agent: str, task: str, n: str) -> dict[str, Any]:
    return tool_call(f"transfer_to_{agent}", {"task": task}, f"call_sup_{n}")


def search(query: str, n: str) -> dict[str, Any]:
    return tool_call("web_search", {"query": query}, f"call_ws_{n}")


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
                supervisor=[delegate("researcher", subtask, "1"), answer(result)],
                researcher=[search(query, "1"), answer(result)],
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
                supervisor=[delegate("researcher", subtask, "1"), answer(result)],
                researcher=[search(q, str(i)) for i, q in enumerate(queries)] + [answer(result)],
                analyst=[],
            )
        )
    runs.append(
        dict(
            label="healthy-growth",
            failure=None,
            task="What was Globex's revenue growth from 2023 to 2024? Email it to the CFO.",
            subtasks=[
                Subtask("researcher", "Find Globex's revenue for 2023 and 2024."),
                Subtask("analyst", "Compute Globex's revenue growth from USD 2.10 billion to USD 2.31 billion and email it to cfo@globex.example."),
            ],
            supervisor=[
                delegate("researcher", "Find Globex's revenue for 2023 and 2024.", "1"),
                delegate("analyst", "Compute Globex's revenue growth from USD 2.10 billion to USD 2.31 billion and email it to cfo@globex.example.", "2"),
                answer("10.0%, emailed to the CFO"),
            ],
            researcher=[search("Globex revenue 2023 2024", "1"), answer("USD 2.10 billion (2023), USD 2.31 billion (2024)")],
            analyst=[
                tool_call("compute_growth", {"current": 2.31, "previous": 2.10}, "call_cg_1"),
                tool_call("send_report", {"recipient": "cfo@globex.example", "subject": "Globex revenue growth 2024", "body": "10.0%"}, "call_sr_1"),
                answer("Growth 10.0%, emailed."),
            ],
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
            supervisor=[delegate("researcher", task, "1"), answer("The figure could not be found.")],
            researcher=[search(q, str(i)) for i, q in enumerate(retry_queries)]
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
            supervisor=[delegate("researcher", same, "1"), delegate("researcher", same, "2"),
                        delegate("researcher", reworded, "3"), answer("18,250 employees")],
            researcher=[search("Contoso employees 2023", "1"), answer("18,250"),
                        search("Contoso employees 2023", "2"), answer("18,250"),
                        search("Contoso employee count end of 2023", "3"), answer("18,250")],
            analyst=[],
            note="the supervisor hands the same question to the researcher three times (the third re-worded)",
        )
    )  # fmt: skip
    pizza = "Find a recipe for Neapolitan pizza dough with high hydration."
    runs.append(
        dict(
            label="off-topic",
            failure="off_topic_task",
            task="What is Fabrikam's market share in Germany?",
            subtasks=[Subtask("researcher", pizza, off_topic=True)],
            supervisor=[delegate("researcher", pizza, "1"), answer("1 kg flour, 700 ml water")],
            researcher=[
                search("Neapolitan pizza dough recipe high hydration", "1"),
                answer("1 kg flour, 700 ml water"),
            ],
            analyst=[],
        )
    )
    growth = "Compute Globex's revenue growth from 2023 to 2024."
    researcher, analyst, subtasks = [], [], [Subtask("analyst", growth)]
    for i in range(3):
        analyst += [tool_call("transfer_to_researcher", {"reason": "I need the revenue figures first."}, f"call_tr_{i}"),
                    answer("Handing over to the researcher.")]  # fmt: skip
        researcher += [tool_call("transfer_to_analyst", {"reason": "This is a calculation."}, f"call_ta_{i}"),
                       answer("Handing over to the analyst.")]  # fmt: skip
        subtasks += [Subtask("researcher", growth), Subtask("analyst", growth)]
    analyst.append(answer("Could not compute the growth."))
    runs.append(
        dict(
            label="ping-pong",
            failure="ping_pong",
            task="What was Globex's revenue growth from 2023 to 2024?",
            subtasks=subtasks,
            supervisor=[delegate("analyst", growth, "1"), answer("Could not determine the growth.")],
            researcher=researcher,
            analyst=analyst,
            note="analyst and researcher hand the task to each other directly (transfer_to_* tools), 3 times each way",
        )
    )
    send = {"recipient": "cfo@initech.example", "subject": "Initech operating margin 2024", "body": "11.8%"}
    mail_task = "Email Initech's 2024 operating margin of 11.8% to cfo@initech.example."
    runs.append(
        dict(
            label="duplicate-email",
            failure="duplicate_side_effect",
            task="What was Initech's operating margin in 2024? Email it to the CFO.",
            subtasks=[Subtask("researcher", "Find Initech's operating margin for fiscal year 2024."), Subtask("analyst", mail_task)],
            supervisor=[delegate("researcher", "Find Initech's operating margin for fiscal year 2024.", "1"),
                        delegate("analyst", mail_task, "2"), answer("11.8%, emailed to the CFO")],
            researcher=[search("Initech operating margin FY2024", "1"), answer("11.8%")],
            analyst=[tool_call("send_report", send, "call_sr_1"), tool_call("send_report", send, "call_sr_2"),
                     answer("Emailed (sent twice to be sure).")],
            note="send_report called twice with identical arguments by the analyst",
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
            supervisor=[
                delegate("researcher", cities, "1"),
                answer("Madrid, Barcelona, Valencia and Seville"),
            ],
            researcher=[search(f"Umbrella Logistics {f}", str(i)) for i, f in enumerate(facets)]
            + [answer("Madrid, Barcelona, Valencia and Seville")],
            analyst=[],
            note="the researcher makes 24 different searches (healthy runs make 1); no step budget is set",
        )
    )
    return runs


def instrument(kind: str, provider) -> str:
    if kind == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        LangChainInstrumentor().instrument(tracer_provider=provider)
        return "openinference-instrumentation-langchain"
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    LangchainInstrumentor().instrument(tracer_provider=provider)
    return "opentelemetry-instrumentation-langchain"


def generate_with(kind: str, out_dir: Path) -> Path:
    service = f"corpus-langgraph-{kind}"
    tracing = start_tracing(service)
    package = instrument(kind, tracing.provider)
    session = (
        "configurable.thread_id = <run> -> session.id (OpenInference reads LangChain metadata thread_id)"
        if kind == "openinference"
        else "configurable.thread_id = <run> -> traceloop.association.properties.thread_id (OpenLLMetry copies "
        "LangChain metadata into association properties)"
    )
    run_set = RunSet(
        framework="langgraph",
        instrumentation=package,
        service_name=service,
        versions=package_versions(
            "langgraph", "langchain-core", package, "opentelemetry-exporter-otlp-proto-http"
        ),
        session=session,
        agent_span_names={},  # filled below from the span names this instrumentation uses
        notes=[
            "Supervisor node routes with Command; sub-agents are prebuilt ReAct agents (create_react_agent, "
            "name=researcher/analyst) invoked inside their node on a fresh conversation whose first user "
            "message is the task the supervisor wrote in its transfer_to_<agent>(task=...) tool call.",
        ],
    )
    for spec in scenarios():
        thread = f"lg-{kind}-{spec['label']}"
        FAILING_QUERIES.clear()
        FAILING_QUERIES.update(spec.get("failing", ()))
        scripts = {name: list(spec[name]) for name in ("supervisor", "researcher", "analyst")}
        with tracing.recorder.run("__setup__"):
            graph, models = build_graph(scripts)
        sent_before = len(OUTBOX)
        with tracing.recorder.run(spec["label"]):
            graph.invoke(
                {"messages": [("user", spec["task"])], "task": ""},
                config={"configurable": {"thread_id": thread}, "recursion_limit": 100},
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
                session_id=thread,
                trace_ids=tracing.recorder.traces.get(spec["label"], []),
                emitted_run_ids=tracing.recorder.emitted_ids.get(spec["label"], []),
                spans_started=tracing.recorder.span_counts.get(spec["label"], 0),
                side_effects_executed=sent,
                subtasks=spec["subtasks"],
                note=spec.get("note", ""),
            )
        )
    # OpenInference names a node's span after the node (the ReAct sub-agent's graph span too);
    # OpenLLMetry names them "execute_task <node>" and adds "invoke_agent <agent>" for a named
    # sub-graph. Spans of the ReAct loop inside (agent, tools, call_model) belong to the sub-agent.
    run_set.setup_trace_ids = tracing.recorder.traces.get("__setup__", [])
    names = ("supervisor", "researcher", "analyst")
    if kind == "openinference":
        run_set.agent_span_names = {name: name for name in names}
    else:
        run_set.agent_span_names = {
            **{f"execute_task {name}": name for name in names},
            **{f"invoke_agent {name}": name for name in names[1:]},
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    tracing.finish(out_dir / "otlp.jsonl")
    truth = out_dir / "truth.json"
    run_set.write(truth)
    return truth


def generate_openinference(out_dir: Path) -> Path:
    return generate_with("openinference", out_dir)


def generate_openllmetry(out_dir: Path) -> Path:
    return generate_with("openllmetry", out_dir)
