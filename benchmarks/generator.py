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
from dataclasses import dataclass, fields

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


@dataclass(frozen=True)
class Shape:
    """The shape of the generated crews; every field left at its default keeps the classic shape.

    ``calls_per_session``: tool calls per run (conversation id), spread evenly over its agent
    spans (classic: 5-9 per worker). ``agents_per_run``: distinct agent ids among the workers.
    ``depth`` / ``fanout``: the delegation tree under the orchestrator (``fanout ** level`` agent
    spans at each hop ``1..depth``). ``writes_per_key``: state writes per key in a run (hot keys:
    a large value means few keys written by every agent; classic: six keys). ``spans_per_trace``:
    a run is cut into traces of this many spans (1 = every span its own trace; classic: one trace
    per run). ``distinct_args``: share of calls whose arguments appear nowhere else in the run
    (the rest pick one of eight argument sets; classic: a query of 40 and a limit of 50 values).
    """

    calls_per_session: int | None = None
    agents_per_run: int = 4
    depth: int = 1
    fanout: int = 4
    writes_per_key: int | None = None
    spans_per_trace: int | None = None
    distinct_args: float | None = None

    def __post_init__(self) -> None:
        checks = (
            ("calls_per_session", self.calls_per_session is None or 1 <= self.calls_per_session <= 1_000_000),
            ("agents_per_run", 1 <= self.agents_per_run <= 10_000),
            ("depth", 1 <= self.depth <= 32),
            ("fanout", 1 <= self.fanout <= 1_000),
            ("agent spans", self.agent_spans <= 100_000),
            ("writes_per_key", self.writes_per_key is None or self.writes_per_key >= 1),
            ("spans_per_trace", self.spans_per_trace is None or self.spans_per_trace >= 1),
            ("distinct_args", self.distinct_args is None or 0.0 <= self.distinct_args <= 1.0),
        )
        for name, ok in checks:
            if not ok:
                raise ValueError(f"Shape.{name} is out of range in {self!r}; see the Shape docstring")

    @property
    def classic(self) -> bool:
        """True when this is the original generator shape (byte-identical output)."""
        return self == Shape()

    @property
    def agent_spans(self) -> int:
        """Agent spans under the orchestrator (every level of the delegation tree)."""
        return sum(self.fanout**level for level in range(1, self.depth + 1))

    @property
    def spans_per_run(self) -> int | None:
        """Spans in one run (orchestrator + agent spans + calls); None when it varies (classic)."""
        if self.calls_per_session is None:
            return None
        return 1 + self.agent_spans + self.calls_per_session

    @property
    def label(self) -> str:
        """A short name listing the fields that differ from the classic shape."""
        parts = [
            f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) != f.default
        ]
        return ",".join(parts) or "classic"

    @classmethod
    def parse(cls, text: str) -> Shape:
        """``"calls_per_session=1000,agents_per_run=8"`` (or ``classic``) as a Shape."""
        if text.strip() in ("", "classic"):
            return cls()
        kinds = {f.name: f for f in fields(cls)}
        values = {}
        for part in text.split(","):
            name, _, raw = part.partition("=")
            name = name.strip()
            if name not in kinds or not raw:
                raise ValueError(f"Expected shape fields as name=value among {sorted(kinds)}, got {part!r}")
            values[name] = float(raw) if name == "distinct_args" else int(raw)
        return cls(**values)


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

    def __init__(
        self,
        seed: int = 7,
        namespace: int = TEMPLATE_NAMESPACE,
        base_ns: int = BASE_NS,
        shape: Shape | None = None,
    ):
        self.shape = shape or Shape()
        self.rng = random.Random(seed)
        self.namespace = namespace
        self.base_ns = base_ns
        self.ns_hex = f"{namespace:016x}"
        self.run_index = 0

    def _span_id(self) -> bytes:
        return (self.rng.getrandbits(64) | 1).to_bytes(8, "big")

    def next_run(self) -> list[Span]:
        """All spans of the next run, parents before children."""
        if not self.shape.classic:
            return self._shaped_run()
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

    def _shaped_run(self) -> list[Span]:
        """The next run in a non-classic ``Shape`` (same attributes and failure modes as classic)."""
        shape, rng = self.shape, self.rng
        index = self.run_index
        self.run_index += 1
        run_id = f"run-{self.ns_hex}-{index:06d}"
        start = self.base_ns + index * RUN_STRIDE_NS
        ticket = f"ticket {self.ns_hex}-{index:06d}"
        verb, obj = rng.choice(VERBS), rng.choice(OBJECTS)
        goal_root = f"{verb} {obj} for {ticket}"
        ledger = sorted(rng.sample(CONSTRAINTS, 4))
        origin_task = f"task-{self.ns_hex}-{index:06d}-0"
        stale_writer = rng.random() < 0.15
        repeat_tool = rng.random() < 0.1
        reuse_key = rng.random() < 0.08
        agents = [f"agent-{i:02d}" for i in range(shape.agents_per_run)]
        # The delegation tree, breadth first: (hop, parent position or None for the orchestrator).
        tree: list[tuple[int, int | None]] = [(1, None)] * shape.fanout
        level = range(len(tree))
        for hop in range(2, shape.depth + 1):
            first = len(tree)
            for parent in level:
                tree.extend([(hop, parent)] * shape.fanout)
            level = range(first, len(tree))
        children: dict[int, int] = {}  # first child of each agent span (its delegation target)
        for position, (_, parent) in enumerate(tree):
            if parent is not None:
                children.setdefault(parent, position)
        drift_at = rng.randrange(len(tree)) if rng.random() < 0.1 else None
        calls = shape.calls_per_session
        per_agent = [
            calls // len(tree) + (1 if i < calls % len(tree) else 0)
            if calls is not None
            else rng.randint(*TOOL_SPANS_PER_AGENT)
            for i in range(len(tree))
        ]
        total_calls = sum(per_agent)
        if shape.writes_per_key is None:
            keys = STATE_KEYS
        else:
            expected_writes = total_calls * OPS.count("write") / len(OPS)
            keys = tuple(f"key-{i:04d}" for i in range(max(1, round(expected_writes / shape.writes_per_key))))
        arg_pool = [{"key": keys[i % len(keys)], "query": f"shared #{i}", "limit": 10} for i in range(8)]
        spans: list[Span] = []
        clock = start
        trace_state = {"id": b"", "left": 0}

        def new_span(name: str, parent: Span | None, duration: int) -> Span:
            nonlocal clock
            if trace_state["left"] == 0:  # start the next trace of the run
                trace_state["id"] = (rng.getrandbits(64) | 1).to_bytes(8, "big") + self.namespace.to_bytes(
                    8, "big"
                )
                trace_state["left"] = shape.spans_per_trace or 1 << 62
            trace_state["left"] -= 1
            same_trace = parent is not None and parent.trace_id == trace_state["id"]
            span = Span(
                trace_id=trace_state["id"],
                span_id=self._span_id(),
                parent_span_id=parent.span_id if same_trace else b"",
                name=name,
            )
            span.kind = Span.SPAN_KIND_INTERNAL
            span.start_time_unix_nano = clock
            span.end_time_unix_nano = clock + duration
            clock += duration // 4 + 1000
            spans.append(span)
            return span

        root = new_span("invoke_agent orchestrator", None, 30_000_000_000)
        _attr(root, "gen_ai.operation.name", "invoke_agent")
        _attr(root, "gen_ai.agent.id", "orchestrator")
        _attr(root, "gen_ai.conversation.id", run_id)
        _attr(root, "driftscope.task.id", origin_task)
        _attr(root, "driftscope.goal.root", goal_root)
        _attr(root, "driftscope.constraints.ledger", ledger)
        versions = dict.fromkeys(keys, 0)
        agent_spans: list[Span] = []
        for position, (hop, parent) in enumerate(tree):
            agent = agents[position % len(agents)]
            task_id = f"task-{self.ns_hex}-{index:06d}-{position + 1}"
            if position == drift_at:
                other = rng.choice([o for o in OBJECTS if o != obj])
                subtask = f"{rng.choice(VERBS)} {other} {rng.choice(QUALIFIERS)}"
            else:
                subtask = f"{verb} {obj} {rng.choice(QUALIFIERS)} for {ticket}"
            carried = ledger if rng.random() > 0.2 else ledger[: rng.randint(1, 3)]
            parent_span = root if parent is None else agent_spans[parent]
            agent_span = new_span(f"invoke_agent {agent}", parent_span, 5_000_000_000)
            agent_spans.append(agent_span)
            _attr(agent_span, "gen_ai.operation.name", "invoke_agent")
            _attr(agent_span, "gen_ai.agent.id", agent)
            _attr(agent_span, "gen_ai.conversation.id", run_id)
            _attr(agent_span, "driftscope.task.id", task_id)
            _attr(agent_span, "driftscope.task.origin_id", origin_task)
            _attr(agent_span, "driftscope.hop", hop)
            _attr(agent_span, "driftscope.goal.text", subtask)
            previous_call = None
            for call in range(per_agent[position]):
                op = rng.choice(OPS)
                tool = rng.choice(TOOLS[op])
                key = rng.choice(keys)
                if shape.distinct_args is None:
                    arguments = {
                        "key": key,
                        "query": f"{tool} #{rng.randint(1, 40)}",
                        "limit": rng.randint(1, 50),
                    }
                elif rng.random() < shape.distinct_args:
                    arguments = {"key": key, "query": f"{tool} {position}.{call}", "limit": 10}
                else:
                    arguments = dict(rng.choice(arg_pool))
                    key = arguments["key"]
                if repeat_tool and previous_call is not None and call % 3 == 2:
                    tool, op, key, arguments = previous_call
                previous_call = (tool, op, key, arguments)
                span = new_span(f"execute_tool {tool}", agent_span, rng.randint(2, 900) * 1_000_000)
                _attr(span, "gen_ai.operation.name", "execute_tool")
                _attr(span, "gen_ai.tool.name", tool)
                _attr(span, "gen_ai.conversation.id", run_id)
                _attr(span, "gen_ai.tool.call.arguments", json.dumps(arguments, separators=(",", ":")))
                # Spans cut from their agent span's trace name their agent; half of the others
                # inherit it from the agent span above them.
                if span.parent_span_id != agent_span.span_id or rng.random() < 0.5:
                    _attr(span, "gen_ai.agent.id", agent)
                _attr(span, "driftscope.op", op)
                _attr(span, "driftscope.state.key", key)
                outcome = "ok"
                if op == "write":
                    expected = versions[key]
                    if stale_writer and position % 3 == 2 and expected > 0:
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
                    suffix = 0 if reuse_key else f"{position}.{call}"
                    _attr(span, "driftscope.idempotency_key", f"idem-{self.ns_hex}-{index:06d}-{suffix}")
                    _attr(span, "driftscope.policy.version", f"p{1 + (index % 3)}")
                if op == "delegate":
                    _attr(
                        span,
                        "driftscope.delegate.to",
                        agents[children.get(position, position + 1) % len(agents)],
                    )
                    _attr(span, "driftscope.task.origin_id", origin_task)
                    # The delegation's hop, so constraint ledgers have cells (a classic run's
                    # delegations carry none).
                    _attr(span, "driftscope.hop", hop)
                _attr(span, "driftscope.outcome", outcome)
            agent_span.end_time_unix_nano = max(agent_span.end_time_unix_nano, clock)
        root.end_time_unix_nano = max(root.end_time_unix_nano, clock)
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
    shape: Shape | None = None,
) -> Iterator[ExportTraceServiceRequest]:
    """``count`` spans as OTLP requests of ``batch_size`` spans (one resource, one scope each)."""
    generator = SpanGenerator(seed, namespace, base_ns, shape)
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


def shift_to(payload: bytes, start_ns: int) -> bytes:
    """``payload`` with every span (and event) moved in time so its earliest span starts at
    ``start_ns``: what crews still running send (``benchmarks.live --times now``), later than
    every stored span, instead of the template's own times."""
    request = ExportTraceServiceRequest.FromString(payload)
    spans = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    if not spans:
        return payload
    offset = start_ns - min(span.start_time_unix_nano for span in spans)
    for span in spans:
        span.start_time_unix_nano += offset
        span.end_time_unix_nano += offset
        for event in span.events:
            event.time_unix_nano += offset
    return request.SerializeToString()


def template_payloads(
    spans_per_template: int, seed: int = 7, batch_size: int = 512, shape: Shape | None = None
) -> list[bytes]:
    """Serialized template requests covering ``spans_per_template`` spans, ready for ``stamp``."""
    return [
        r.SerializeToString() for r in generate_requests(spans_per_template, seed, batch_size, shape=shape)
    ]
