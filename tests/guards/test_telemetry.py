"""Each guard call emits exactly one span with exactly the attributes documented in docs/guards.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from guards import (
    TRACER_NAME,
    ConstraintLedger,
    DelegationRejected,
    ExecutionGuard,
    ForceStore,
    FreeTextDelegation,
    IdempotentTool,
    MergingStore,
    ObjectiveRegistry,
    PlainStore,
    PolicyGate,
    Scratchpad,
    Telemetry,
    UnguardedOutbox,
    VersionedStore,
    acting_as,
    traced_call,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "guards.md"
GUARD_FIELDS = {
    "driftscope.guard",
    "driftscope.reject_reason",
    "driftscope.state.expected_version",
    "driftscope.constraints.ledger",
    "driftscope.constraints.carried",
    "driftscope.constraints.waived",
    "driftscope.acceptance.constraint_ids",
    "driftscope.idempotency_key",
}


def _names(cell: str) -> list[str]:
    return [part.strip() for part in cell.split(",") if part.strip()]


def documented_attributes() -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    """(call, outcome) -> (required, optional) attribute names, parsed from docs/guards.md."""
    text = DOC.read_text()
    shorthand = {
        match.group(1): re.findall(r"`([a-z_.]+\??)`", match.group(2))
        for match in re.finditer(r"^- \*\*(\w+)\*\*: (.+)$", text, re.M)
    }
    assert set(shorthand) == {"tool", "unguarded", "step"}, f"shorthands missing from {DOC}"
    table: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    section = text.split("## Span attributes by call", 1)[1]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        call, outcome, attributes = cells[0].strip("`"), cells[1], cells[2]
        names: dict[str, bool] = {}
        for item in _names(attributes):
            if item in shorthand:
                for name in shorthand[item]:
                    names[name.rstrip("?")] = name.endswith("?")
            else:
                name = re.match(r"`([a-z_.]+\??)`", item).group(1)
                names[name.rstrip("?")] = name.endswith("?")
        required = {n for n, optional in names.items() if not optional}
        optional = {n for n, opt in names.items() if opt}
        table[(call, outcome)] = (required, optional)
    return table


DOCUMENTED = documented_attributes()


def test_doc_table_parses_and_covers_every_call():
    assert len(DOCUMENTED) >= 27
    assert "gen_ai.tool.call.id" in DOCUMENTED[("read_state", "ok")][0]
    assert "driftscope.guard" not in DOCUMENTED[("set", "ok")][0] | DOCUMENTED[("set", "ok")][1]
    assert "gen_ai.operation.name" not in DOCUMENTED[("check", "ok")][0]


@pytest.fixture
def harness():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(provider)

    def one_span(call, outcome, action):
        before = len(exporter.get_finished_spans())
        try:
            action()
        except DelegationRejected:
            pass
        except (LookupError, RuntimeError):
            pass
        new = exporter.get_finished_spans()[before:]
        assert len(new) == 1, f"{call} emitted {len(new)} spans"
        span = new[0]
        attributes = set(span.attributes)
        required, optional = DOCUMENTED[(call, outcome)]
        assert span.attributes.get("driftscope.outcome") == outcome
        assert span.instrumentation_scope.name == TRACER_NAME
        assert required <= attributes, f"{call}/{outcome} misses {required - attributes}"
        assert attributes <= required | optional, (
            f"{call}/{outcome} has undocumented {attributes - required - optional}"
        )
        return span

    yield telemetry, one_span
    provider.shutdown()


def test_guarded_calls_emit_exactly_the_documented_attributes(harness):
    telemetry, one_span = harness
    store = VersionedStore(telemetry)
    ledger = ConstraintLedger(telemetry)
    registry = ObjectiveRegistry(telemetry)
    gate = PolicyGate(registry, "policy")
    guard = ExecutionGuard(
        telemetry,
        root_goal="root",
        embedder=lambda texts: [[1.0, 0.0] if t == "root" else [0.0, 1.0] for t in texts],
    )
    tool = IdempotentTool("send_invoice", lambda payload: "ok", telemetry)
    constraints = [{"id": "C1", "text": "under budget"}]
    criteria = [{"text": "check budget", "constraint_ids": ["C1"]}]
    with acting_as("agent-a"):
        v = one_span("write_state", "ok", lambda: store.write_state("k", 1, None))
        assert v.attributes["driftscope.state.expected_version"] == ""
        one_span("read_state", "ok", lambda: store.read_state("k"))
        one_span("write_state", "rejected", lambda: store.write_state("k", 2, "stale-token"))
        one_span("override_state", "ok", lambda: store.override_state("k", 3, forced_by="me", reason="why"))
        one_span("open_task", "ok", lambda: ledger.open_task("T", "goal", constraints, to_agent="planner"))
        one_span(
            "delegate", "ok", lambda: ledger.delegate("sub", "T", constraints, criteria, {}, to_agent="b")
        )
        one_span("delegate", "rejected", lambda: ledger.delegate("sub", "T", [], criteria, {}, to_agent="b"))
        one_span("set_objective", "ok", lambda: registry.set_objective("O", "objective"))
        one_span("get_objective", "ok", lambda: registry.get_objective("O", "agent-a"))
        one_span("supersede_objective", "ok", lambda: registry.supersede("O", "objective 2"))
        one_span("set_objective", "ok", lambda: gate.publish_policy("p1"))
        p1 = registry.current("policy")["version"]
        one_span("send_customer_message", "ok", lambda: gate.send_customer_message("T-1", "hi", p1))
        one_span("supersede_objective", "ok", lambda: gate.publish_policy("p2"))
        one_span("send_customer_message", "rejected", lambda: gate.send_customer_message("T-1", "hi", p1))
        one_span("IdempotentTool", "ok", lambda: tool({"a": 1}, idempotency_key="x"))
        one_span("IdempotentTool", "rejected", lambda: tool({"a": 1}, idempotency_key="x"))
    one_span("check", "ok", lambda: guard.check("agent-a", "search", {"q": 1}))
    one_span("check", "ok", lambda: guard.check("agent-a", "delegate", {"q": 2}, subtask_text="root"))
    one_span(
        "check", "rejected", lambda: guard.check("agent-a", "delegate", {"q": 3}, subtask_text="fx history")
    )


def test_transition_validation_spans(harness):
    from pydantic import BaseModel

    class Transition(BaseModel):
        key: str
        from_state: int
        to_state: int

    telemetry, one_span = harness
    guard = ExecutionGuard(telemetry)
    one_span("validate_transition", "ok", lambda: guard.validate_transition("a", "n", 1, 2, Transition))
    one_span(
        "validate_transition", "rejected", lambda: guard.validate_transition("a", "n", 1, "x", Transition)
    )


def test_unguarded_calls_carry_no_guard_fields(harness):
    telemetry, one_span = harness
    plain, merging = PlainStore(telemetry), MergingStore(telemetry)
    pad, forced = Scratchpad(telemetry), ForceStore(telemetry)
    handoff, outbox = FreeTextDelegation(telemetry), UnguardedOutbox(telemetry)
    handoff.open_task("T", "root goal")
    spans = []
    with acting_as("agent-a"):
        spans.append(one_span("set", "ok", lambda: plain.set("k", 1)))
        spans.append(one_span("get", "ok", lambda: plain.get("k")))
        spans.append(one_span("update", "ok", lambda: merging.update("m", {"a": 1})))
        spans.append(one_span("scratchpad_append", "ok", lambda: pad.append("note")))
        spans.append(one_span("scratchpad_read", "ok", lambda: pad.read_all()))
        spans.append(one_span("write", "ok", lambda: forced.write("f", 1, "stale", force=True)))
        spans.append(one_span("write", "error", lambda: forced.write("f", 2, "stale")))
        spans.append(
            one_span(
                "free_text_delegate",
                "ok",
                lambda: handoff.delegate("s", "ctx", to_agent="b", parent_task_id="T"),
            )
        )
        spans.append(
            one_span(
                "unguarded_send_customer_message", "ok", lambda: outbox.send_customer_message("T-1", "hi")
            )
        )
        spans.append(
            one_span("traced_call", "ok", lambda: traced_call(telemetry, "search", {"q": 1}, lambda: [1]))
        )
        spans.append(
            one_span(
                "traced_call", "error", lambda: traced_call(telemetry, "sql", {"q": 1}, lambda: {}["missing"])
            )
        )
    for span in spans:
        assert not GUARD_FIELDS & set(span.attributes), span.name
        assert span.attributes["driftscope.outcome"] != "rejected"
    assert spans[5].attributes["driftscope.state.key"] == "f"
    assert spans[-1].status.status_code.name == "ERROR"


def test_bound_conversation_id_is_recorded_on_every_guard_span():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(provider)
    store = VersionedStore(telemetry)
    guard = ExecutionGuard(telemetry)
    with acting_as("writer", conversation_id="run-42"):
        store.write_state("k", 1, None)
        guard.check("writer", "t", {})
    store.read_state("k", agent_id="critic")
    first, second, third = exporter.get_finished_spans()
    assert first.attributes["gen_ai.conversation.id"] == "run-42"
    assert first.attributes["gen_ai.agent.id"] == "writer"
    assert second.attributes["gen_ai.conversation.id"] == "run-42"
    assert "gen_ai.conversation.id" not in third.attributes
    assert third.attributes["gen_ai.agent.id"] == "critic"
    assert first.attributes["gen_ai.tool.call.id"] == f"call_{first.context.span_id:016x}"
