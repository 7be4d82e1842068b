"""A deterministic generator of multi-agent tool-call spans, at any volume.

One run (a crew execution, one trace) has an orchestrator agent span, four worker agent spans
under it and tool spans under each worker. Tool spans carry about ten attributes: the tool, the
run, a ``driftscope.op`` with its state key and versions, carried constraint arrays, goal text and
JSON arguments; some name their agent, the rest inherit it from the agent span above them. A few
runs contain stale writes, refusals, repeated calls and re-used idempotency keys so the detectors
have something to find.

Everything is a function of ``seed`` except a 64-bit *namespace* that appears in every trace id
(as its last 8 bytes) and in every run, task and ticket id (as 16 hex characters). Requests
generated with ``TEMPLATE_NAMESPACE`` can therefore be *stamped* into requests of any other
namespace by replacing bytes (``stamp``), which is exactly what ``generate_requests`` with that
namespace would produce; the load client uses this to send millions of distinct spans without
generating each one in Python.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

TEMPLATE_NAMESPACE = 0xFEEDFACEDEADBEEF
_MARK_BYTES = TEMPLATE_NAMESPACE.to_bytes(8, "big")
_MARK_HEX = f"{TEMPLATE_NAMESPACE:016x}".encode()
BASE_NS = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z
RUN_STRIDE_NS = 60_000_000_000  # runs start a minute apart within one namespace

AGENTS = ("planner", "researcher", "writer", "reviewer")
TOOLS = {
    "read": ("read_state", "fetch_doc", "search_kb"),
    "write": ("write_state", "update_plan"),
    "delegate": ("delegate_task",),
    "send": ("send_email", "post_message"),
    "step": ("run_code", "summarise"),
}
OPS = ("read", "read", "read", "write", "write", "delegate", "send", "step")
STATE_KEYS = ("plan", "budget", "draft", "findings", "schedule", "customer")
CONSTRAINTS = tuple(f"C{i}" for i in range(1, 13))
VERBS = ("Draft", "Review", "Summarise", "Research", "Schedule", "Estimate", "Negotiate", "Verify")
OBJECTS = (
    "the refund email",
    "the quarterly budget",
    "the vendor shortlist",
    "the launch plan",
    "the incident timeline",
    "the onboarding checklist",
)
QUALIFIERS = (
    "without exceeding the approved budget",
    "citing every source",
    "in under 200 words",
    "for the EU customers only",
    "before Friday",
)
TOOL_SPANS_PER_AGENT = (5, 9)  # inclusive range per worker agent


def _attr(span: Span, key: str, value) -> None:
    kv = span.attributes.add(key=key)
    if isinstance(value, bool):
        kv.value.bool_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    elif isinstance(value, (list, tuple)):
        for item in value:
            kv.value.array_value.values.add().string_value = item
    else:
        kv.value.string_value = value


class SpanGenerator:
    """Yields spans run by run; ``seed`` fixes everything but the namespace."""

    def __init__(self, seed: int = 7, namespace: int = TEMPLATE_NAMESPACE, base_ns: int = BASE_NS):
        self.rng = random.Random(seed)
        self.namespace = namespace
        self.base_ns = base_ns
        self.ns_hex = f"{namespace:016x}"
        self.run_index = 0

    def _span_id(self) -> bytes:
        return (self.rng.getrandbits(64) | 1).to_bytes(8, "big")

    def next_run(self) -> list[Span]:
        """All spans of the next run, parents before children."""
        rng = self.rng
        index = self.run_index
        self.run_index += 1
        run_id = f"run-{self.ns_hex}-{index:06d}"
        # Random-looking leading bytes, as real trace ids have (no zone-map luck in DuckDB); the
        # namespace sits in the last 8 bytes.
        trace_id = (rng.getrandbits(64) | 1).to_bytes(8, "big") + self.namespace.to_bytes(8, "big")
        start = self.base_ns + index * RUN_STRIDE_NS
        ticket = f"ticket {self.ns_hex}-{index:06d}"
        verb, obj = rng.choice(VERBS), rng.choice(OBJECTS)
        goal_root = f"{verb} {obj} for {ticket}"
        ledger = sorted(rng.sample(CONSTRAINTS, 4))
        origin_task = f"task-{self.ns_hex}-{index:06d}-0"
        # Injected failure modes, a few runs each.
        stale_writer = rng.random() < 0.15
        repeat_tool = rng.random() < 0.1
        reuse_key = rng.random() < 0.08
        # Goal drift: one hop's subtask is about something else. The other hops restate the root
        # goal with a qualifier, as a delegating planner does.
        drift_hop = rng.randint(1, len(AGENTS)) if rng.random() < 0.1 else None
        spans: list[Span] = []
        clock = start

        def new_span(name: str, parent: bytes, duration: int) -> Span:
            nonlocal clock
            span = Span(trace_id=trace_id, span_id=self._span_id(), parent_span_id=parent, name=name)
            span.kind = Span.SPAN_KIND_INTERNAL
            span.start_time_unix_nano = clock
            span.end_time_unix_nano = clock + duration
            clock += duration // 4 + 1000
            spans.append(span)
            return span

        root = new_span("invoke_agent orchestrator", b"", 30_000_000_000)
        _attr(root, "gen_ai.operation.name", "invoke_agent")
        _attr(root, "gen_ai.agent.id", "orchestrator")
        _attr(root, "gen_ai.conversation.id", run_id)
        _attr(root, "driftscope.task.id", origin_task)
        _attr(root, "driftscope.goal.root", goal_root)
        _attr(root, "driftscope.constraints.ledger", ledger)
        versions = dict.fromkeys(STATE_KEYS, 0)
        for hop, agent in enumerate(AGENTS, start=1):
            task_id = f"task-{self.ns_hex}-{index:06d}-{hop}"
            if hop == drift_hop:
                other = rng.choice([o for o in OBJECTS if o != obj])
                subtask = f"{rng.choice(VERBS)} {other} {rng.choice(QUALIFIERS)}"
            else:
                subtask = f"{verb} {obj} {rng.choice(QUALIFIERS)} for {ticket}"
            carried = ledger if rng.random() > 0.2 else ledger[: rng.randint(1, 3)]
            agent_span = new_span(f"invoke_agent {agent}", root.span_id, 5_000_000_000)
            _attr(agent_span, "gen_ai.operation.name", "invoke_agent")
            _attr(agent_span, "gen_ai.agent.id", agent)
            _attr(agent_span, "gen_ai.conversation.id", run_id)
            _attr(agent_span, "driftscope.task.id", task_id)
            _attr(agent_span, "driftscope.task.origin_id", origin_task)
            _attr(agent_span, "driftscope.hop", hop)
            _attr(agent_span, "driftscope.goal.text", subtask)
            previous_call = None
            for call in range(rng.randint(*TOOL_SPANS_PER_AGENT)):
                op = rng.choice(OPS)
                tool = rng.choice(TOOLS[op])
                key = rng.choice(STATE_KEYS)
                arguments = {
                    "key": key,
                    "query": f"{tool} #{rng.randint(1, 40)}",
                    "limit": rng.randint(1, 50),
                }
                if repeat_tool and previous_call is not None and call % 3 == 2:
                    tool, op, key, arguments = previous_call
                previous_call = (tool, op, key, arguments)
                span = new_span(f"execute_tool {tool}", agent_span.span_id, rng.randint(2, 900) * 1_000_000)
                _attr(span, "gen_ai.operation.name", "execute_tool")
                _attr(span, "gen_ai.tool.name", tool)
                _attr(span, "gen_ai.conversation.id", run_id)
                _attr(span, "gen_ai.tool.call.arguments", json.dumps(arguments, separators=(",", ":")))
                if rng.random() < 0.5:
                    _attr(span, "gen_ai.agent.id", agent)  # the rest inherit it from the agent span
                _attr(span, "driftscope.op", op)
                _attr(span, "driftscope.state.key", key)
                outcome = "ok"
                if op == "write":
                    expected = versions[key]
                    if stale_writer and hop == 3 and expected > 0:
                        expected -= 1
                    versions[key] += 1
                    _attr(span, "driftscope.state.expected_version", f"v{expected}")
                    if rng.random() < 0.05:
                        outcome = "rejected"
                        _attr(span, "driftscope.reject_reason", "version_conflict")
                _attr(span, "driftscope.state.version", f"v{versions[key]}")
                _attr(span, "driftscope.constraints.carried", carried)
                _attr(span, "driftscope.goal.text", subtask)
                if op == "send":
                    _attr(span, "driftscope.side_effect", True)
                    suffix = 0 if reuse_key else call
                    _attr(span, "driftscope.idempotency_key", f"idem-{self.ns_hex}-{index:06d}-{suffix}")
                    _attr(span, "driftscope.policy.version", f"p{1 + (index % 3)}")
                if op == "delegate":
                    _attr(span, "driftscope.delegate.to", AGENTS[(hop) % len(AGENTS)])
                    _attr(span, "driftscope.task.origin_id", origin_task)
                _attr(span, "driftscope.outcome", outcome)
        return spans

    def spans(self, count: int) -> Iterator[Span]:
        """Exactly ``count`` spans (the last run may be cut short)."""
        produced = 0
        while produced < count:
            for span in self.next_run():
                if produced == count:
                    return
                produced += 1
                yield span


def generate_requests(
    count: int,
    seed: int = 7,
    batch_size: int = 512,
    namespace: int = TEMPLATE_NAMESPACE,
    base_ns: int = BASE_NS,
    service: str = "crew-bench",
) -> Iterator[ExportTraceServiceRequest]:
    """``count`` spans as OTLP requests of ``batch_size`` spans (one resource, one scope each)."""
    generator = SpanGenerator(seed, namespace, base_ns)
    request = None
    for span in generator.spans(count):
        if request is None:
            request = ExportTraceServiceRequest()
            resource_spans = request.resource_spans.add()
            kv = resource_spans.resource.attributes.add(key="service.name")
            kv.value.string_value = service
            scope = resource_spans.scope_spans.add()
            scope.scope.name = "driftscope.benchmarks"
            scope.scope.version = "1"
        scope.spans.append(span)
        if len(scope.spans) == batch_size:
            yield request
            request = None
    if request is not None:
        yield request


def stamp(payload: bytes, namespace: int) -> bytes:
    """A template-namespace payload rewritten to ``namespace`` (same length, same structure)."""
    return payload.replace(_MARK_BYTES, namespace.to_bytes(8, "big")).replace(
        _MARK_HEX, f"{namespace:016x}".encode()
    )


def template_payloads(spans_per_template: int, seed: int = 7, batch_size: int = 512) -> list[bytes]:
    """Serialized template requests covering ``spans_per_template`` spans, ready for ``stamp``."""
    return [r.SerializeToString() for r in generate_requests(spans_per_template, seed, batch_size)]
