"""Span emission shared by every guard: one tracer, one clock, one attribute vocabulary.

Only ``opentelemetry-api`` and the standard library are imported here, so agent code can import
the guards without pulling in the SDK; spans go to whatever tracer provider the process set up
(or to the provider passed explicitly, which is what the simulator and the tests do).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

logger = logging.getLogger(__name__)

TRACER_NAME = "driftscope.guards"
SCOPE_VERSION = "0.1.0"

_current_agent: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "driftscope_guards_agent", default=None
)
_current_conversation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "driftscope_guards_conversation", default=None
)

Clock = Callable[[], int]
"""A clock returns nanoseconds since the epoch; the simulator passes a deterministic one."""


@contextmanager
def acting_as(agent_id: str, conversation_id: str | None = None) -> Iterator[None]:
    """Attribute every guard call inside the block to ``agent_id`` (and optionally a run).

    Guard methods also take an explicit ``agent_id=``; the explicit value wins.
    """
    agent_token = _current_agent.set(agent_id)
    conv_token = _current_conversation.set(conversation_id) if conversation_id is not None else None
    try:
        yield
    finally:
        _current_agent.reset(agent_token)
        if conv_token is not None:
            _current_conversation.reset(conv_token)


def current_agent() -> str | None:
    """The agent bound by the innermost :func:`acting_as` block, if any."""
    return _current_agent.get()


class ActingAsSpanProcessor:
    """Stamps the run and agent bound by :func:`acting_as` on every span started inside it.

    Add it to the SDK's provider (``provider.add_span_processor(ActingAsSpanProcessor())``) so the
    caller's own spans (``invoke_agent``, LLM calls, a framework's spans) land in the same run as
    the guard spans, not in a run named after their trace id. Attributes a span already carries
    win. It has the SDK's span-processor methods without importing the SDK, so ``guards`` keeps
    needing only ``opentelemetry-api``.
    """

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        """Add ``gen_ai.conversation.id`` and ``gen_ai.agent.id`` when a block binds them."""
        present = getattr(span, "attributes", None) or {}
        for key, value in (
            ("gen_ai.conversation.id", _current_conversation.get()),
            ("gen_ai.agent.id", _current_agent.get()),
        ):
            if value is not None and key not in present:
                span.set_attribute(key, value)

    def _on_ending(self, span: Span) -> None:
        """Nothing to do as a span ends (the SDK calls this on every processor)."""

    def on_end(self, span: Any) -> None:
        """Nothing to do once a span ended."""

    def shutdown(self) -> None:
        """Nothing held."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing buffered."""
        return True


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys: the form arguments and results are recorded in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(value: Any) -> str:
    """A short stable hash of a JSON-able value (used as an observed version by unguarded stores)."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def format_span_id(span_id: int) -> str:
    """Lower-case 16-hex-digit form of a span id, as stored by the collector."""
    return format(span_id, "016x")


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {}
    for name, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, list | tuple | set | frozenset):
            items = sorted(value) if isinstance(value, set | frozenset) else list(value)
            cleaned[name] = [str(item) for item in items]
        else:
            cleaned[name] = value
    return cleaned


class Telemetry:
    """Where guard spans go and what time they carry.

    ``tracer_provider`` defaults to the global one (set by the agent process or by
    ``opentelemetry-instrument``); ``clock`` defaults to wall time. After each emitted span,
    ``last_span_id`` / ``last_trace_id`` hold its ids (hex), which the simulator uses to write
    ground truth that points at exact spans.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        clock: Clock | None = None,
        *,
        tracer_name: str = TRACER_NAME,
    ):
        self._tracer = trace.get_tracer(tracer_name, SCOPE_VERSION, tracer_provider=tracer_provider)
        self._clock = clock
        self.last_span_id: str | None = None
        self.last_trace_id: str | None = None

    def now_ns(self) -> int:
        """Current time by this telemetry's clock, in ns since the epoch."""
        return self._clock() if self._clock is not None else time.time_ns()

    def now_iso(self) -> str:
        """Current time by this telemetry's clock as ISO-8601 UTC."""
        stamp = datetime.fromtimestamp(self.now_ns() / 1e9, tz=UTC)
        return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
        """Open one span as the current span; attributes with value None are dropped.

        Tool spans (``gen_ai.operation.name == "execute_tool"``) get ``gen_ai.tool.call.id``
        derived from their span id, so it is unique and deterministic under a seeded id generator.
        """
        start = self._clock() if self._clock is not None else None
        span = self._tracer.start_span(name, attributes=_clean(attributes), start_time=start)
        context = span.get_span_context()
        if attributes.get("gen_ai.operation.name") == "execute_tool":
            span.set_attribute("gen_ai.tool.call.id", f"call_{format_span_id(context.span_id)}")
        try:
            with trace.use_span(
                span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ):
                yield span
        finally:
            span.end(end_time=self._clock() if self._clock is not None else None)
            self.last_span_id = format_span_id(context.span_id)
            self.last_trace_id = format(context.trace_id, "032x")

    def emit(self, name: str, attributes: Mapping[str, Any], error: str | None = None) -> str:
        """Emit one finished span; returns its span id (hex)."""
        with self.span(name, attributes) as span:
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
        assert self.last_span_id is not None
        return self.last_span_id

    def set_attributes(self, span: Span, attributes: Mapping[str, Any]) -> None:
        """Add attributes to an open span, dropping None values."""
        span.set_attributes(_clean(attributes))


def tool_attributes(
    tool: str,
    agent_id: str | None,
    arguments: Any,
    result: Any = None,
    *,
    guard: str | None = None,
) -> dict[str, Any]:
    """The GenAI fields every tool span carries (plus ``driftscope.guard`` on guarded tools)."""
    agent = agent_id if agent_id is not None else _current_agent.get()
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.agent.id": agent,
        "gen_ai.conversation.id": _current_conversation.get(),
        "gen_ai.tool.call.arguments": canonical_json(arguments),
        "gen_ai.tool.call.result": None if result is None else canonical_json(result),
        "driftscope.guard": guard,
    }


def resolve_agent(agent_id: str | None) -> str | None:
    """Explicit agent id, else the one bound by :func:`acting_as`."""
    return agent_id if agent_id is not None else _current_agent.get()


def conversation_attribute() -> dict[str, Any]:
    """``gen_ai.conversation.id`` when a run is bound, for spans built without tool_attributes."""
    return {"gen_ai.conversation.id": _current_conversation.get()}
