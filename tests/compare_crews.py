"""A small crew for the run-comparison tests (issue 35): a manager hands a question to a
researcher, who searches and answers; the manager answers the user. Variations inject what the
comparison should find: more searches, failing searches, a hand-off to another agent, a missing
final answer. Rows for ``tests.fixtures_analytics.insert_spans`` and OTLP span specs for
``tests.otlp_builders.make_request`` describe the same spans."""

from __future__ import annotations

import json

from tests.fixtures_analytics import make_span
from tests.otlp_builders import BASE_NS

# One step of a run: (agent, span family, tool, arguments, delegate to, failed).
Step = tuple[str, str, str | None, dict | None, str | None, bool]


def crew_steps(
    searches: int = 1,
    failing: int = 0,
    delegate_to: str = "researcher",
    final: bool = True,
    query: str = "q",
    vary: bool = True,
) -> list[Step]:
    """The run's steps in order; the first ``failing`` searches fail; without ``vary`` every
    search asks the same query (a loop repeated_calls finds)."""
    steps: list[Step] = [
        ("manager", "agent", None, None, None, False),
        ("manager", "tool", "delegate", {"task": "find it"}, delegate_to, False),
        (delegate_to, "agent", None, None, None, False),
    ]
    steps += [
        (delegate_to, "tool", "web_search", {"query": f"{query} {i}" if vary else query}, None, i < failing)
        for i in range(searches)
    ]
    if final:
        steps.append(("manager", "tool", "final_answer", {"answer": "42"}, None, False))
    return steps


def crew_rows(run: str, steps: list[Step], service: str = "crew", t0: float = 0.0) -> list[dict]:
    """``spans`` rows of one run (typed columns as the collector extracts them)."""
    rows = []
    for i, (agent, family, tool, args, to, failed) in enumerate(steps):
        rows.append(
            make_span(
                t=t0 + i,
                run=run,
                ServiceName=service,
                span_family=family,
                operation="invoke_agent" if family == "agent" else "execute_tool",
                op="delegate" if to and tool else None,
                agent_id=agent,
                tool_name=tool,
                tool_args=args,
                delegate_to=to if tool else None,
                StatusCode="Error" if failed else "Ok",
                outcome="error" if failed else None,
            )
        )
    return rows


def crew_otlp(run: str, steps: list[Step], trace: int, start_ns: int = BASE_NS) -> list[dict]:
    """The same run as OTLP span specs (GenAI and driftscope attributes) for ``make_request``."""
    specs = []
    for i, (agent, family, tool, args, to, failed) in enumerate(steps):
        attrs = {"gen_ai.conversation.id": run, "gen_ai.agent.id": agent}
        attrs["gen_ai.operation.name"] = "invoke_agent" if family == "agent" else "execute_tool"
        if tool:
            attrs["gen_ai.tool.name"] = tool
            attrs["gen_ai.tool.call.arguments"] = json.dumps(args)
        if to and tool:
            attrs["driftscope.op"] = "delegate"
            attrs["driftscope.delegate.to"] = to
        spec = {
            "name": f"{attrs['gen_ai.operation.name']} {tool or agent}",
            "trace_id": trace.to_bytes(16, "big"),
            "span_id": (trace * 1000 + i + 1).to_bytes(8, "big"),
            "start": start_ns + i * 1_000_000,
            "end": start_ns + i * 1_000_000 + 500_000,
            "attrs": attrs,
        }
        if failed:
            spec["status"] = 2
        specs.append(spec)
    return specs
