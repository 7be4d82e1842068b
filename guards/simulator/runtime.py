"""The machinery a scripted crew runs on: seeded ids, a fake clock, the SDK pipeline, ground truth.

One :class:`SimRun` is one crew execution (one ``gen_ai.conversation.id``). It owns a
``TracerProvider`` whose id generator is seeded and whose guard spans carry timestamps from a
clock the run controls, so the same seed gives byte-identical OTLP output. ``inject=False`` runs
the scenario's crew without its failure: one of the crew's ordinary, healthy runs.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator

from guards.embedding import Embedder
from guards.telemetry import Telemetry, acting_as

SERVICE_NAME = "crew-sim"
SIMULATOR_TRACER = "driftscope.simulator"

TRUTH_CATEGORIES = (
    "divergent_reads",
    "lost_updates",
    "constraint_drops",
    "waivers",
    "drifted_subtasks",
    "stale_holders",
    "stale_policy_sends",
    "looped_calls",
    "ping_pong",
    "budget_exhaustion",
    "runaway_steps",
    "duplicate_side_effects",
    "prevented",
)


class SeededIdGenerator(IdGenerator):
    """Trace and span ids drawn from a seeded ``random.Random`` (never zero)."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def generate_span_id(self) -> int:
        while True:
            value = self._rng.getrandbits(64)
            if value:
                return value

    def generate_trace_id(self) -> int:
        while True:
            value = self._rng.getrandbits(128)
            if value:
                return value


class FakeClock:
    """A clock that advances a fixed step on every reading (ns since the epoch)."""

    def __init__(self, start_ns: int, step_ns: int = 150_000_000):
        self._now = start_ns
        self._step = step_ns

    def __call__(self) -> int:
        self._now += self._step
        return self._now


class PacedClock:
    """Wall-clock time, sleeping ``pace_s`` before each reading so a live demo unfolds slowly."""

    def __init__(self, pace_s: float):
        self._pace = pace_s

    def __call__(self) -> int:
        if self._pace > 0:
            time.sleep(self._pace)
        return time.time_ns()


class RunAttributesProcessor(SpanProcessor):
    """Stamps every span of a run with its conversation id, scenario and variant."""

    def __init__(self, run_id: str, scenario: str, variant: str):
        self._attributes = {
            "gen_ai.conversation.id": run_id,
            "driftscope.scenario": scenario,
            "driftscope.variant": variant,
        }

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        span.set_attributes(self._attributes)

    def on_end(self, span: ReadableSpan) -> None:
        return None


class SimRun:
    """One scripted crew execution and the ground truth it writes down as it goes."""

    def __init__(
        self,
        scenario: str,
        variant: str,
        *,
        seed: int,
        clock: Any,
        exporters: Sequence[SpanExporter] = (),
        embedder: Embedder | None = None,
        inject: bool = True,
    ):
        self.scenario = scenario
        self.variant = variant
        self.guarded = variant == "guarded"
        # False: the crew runs without the scenario's failure (a healthy run of the same crew).
        self.inject = inject
        self.rng = random.Random(seed)
        marker = "" if inject else "-ok"
        self.run_id = f"run-{scenario}-{variant}{marker}-{self.rng.getrandbits(32):08x}"
        self.embedder = embedder
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider(
            resource=Resource({"service.name": SERVICE_NAME}),
            id_generator=SeededIdGenerator(seed * 2 + 1),
        )
        self.provider.add_span_processor(RunAttributesProcessor(self.run_id, scenario, variant))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        for exporter in exporters:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.telemetry = Telemetry(self.provider, clock)
        self._crew = Telemetry(self.provider, clock, tracer_name=SIMULATOR_TRACER)
        self.truth: dict[str, Any] = {
            "scenario": scenario,
            "variant": variant,
            "run_id": self.run_id,
            "service_name": SERVICE_NAME,
            "seed": seed,
            **({} if inject else {"failure_injected": False}),
            **{category: [] for category in TRUTH_CATEGORIES},
        }

    def scoped(self, task_id: str) -> str:
        """A task id unique to this run (each simulated run is its own world; ids must not collide)."""
        return f"{task_id}-{self.run_id.rsplit('-', 1)[1]}"

    def salt(self) -> str:
        """A per-run deterministic salt for version tokens."""
        return format(self.rng.getrandbits(64), "016x")

    @property
    def last_span(self) -> str:
        """Hex id of the last guard/tool span emitted."""
        assert self.telemetry.last_span_id is not None
        return self.telemetry.last_span_id

    def record(self, category: str, **fields: Any) -> None:
        """Add one ground-truth record."""
        if category not in TRUTH_CATEGORIES:
            raise KeyError(f"unknown truth category {category!r}; known: {TRUTH_CATEGORIES}")
        self.truth[category].append(fields)

    @contextmanager
    def crew(self, description: str, *, resumed: bool = False) -> Iterator[None]:
        """The root span of one trace of the run (a resumed run opens a second trace)."""
        name = "crew resumed" if resumed else "crew run"
        attributes = {"driftscope.crew.description": description, "driftscope.crew.resumed": resumed}
        with self._crew.span(name, attributes):
            yield

    @contextmanager
    def agent(self, agent_id: str, task_id: str | None = None) -> Iterator[None]:
        """One agent turn: an ``invoke_agent`` span, with guard calls inside attributed to the agent."""
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": agent_id,
            "gen_ai.agent.name": agent_id.replace("_", " ").title(),
            "driftscope.task.id": task_id,
        }
        with self._crew.span(f"invoke_agent {agent_id}", attributes), acting_as(agent_id):
            yield

    def finish(self) -> list[ReadableSpan]:
        """Flush, close the provider and complete the truth with span counts; returns the spans."""
        self.provider.force_flush()
        self.provider.shutdown()
        spans = list(self.memory.get_finished_spans())
        self.truth["trace_ids"] = sorted({format(s.context.trace_id, "032x") for s in spans})
        self.truth["span_counts"] = count_spans(spans)
        return spans


def count_spans(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """Span counts: total, by ``driftscope.outcome`` (``none`` when absent), by reject reason, by op."""
    outcomes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    for span in spans:
        attributes = span.attributes or {}
        outcomes[str(attributes.get("driftscope.outcome", "none"))] += 1
        if "driftscope.reject_reason" in attributes:
            reasons[str(attributes["driftscope.reject_reason"])] += 1
        ops[str(attributes.get("driftscope.op", "none"))] += 1
    return {
        "total": len(spans),
        "by_outcome": dict(sorted(outcomes.items())),
        "by_reject_reason": dict(sorted(reasons.items())),
        "by_op": dict(sorted(ops.items())),
    }
