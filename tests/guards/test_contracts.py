"""Contracts of the guarded tools: required parameters, opaque tokens, rejection payloads."""

from __future__ import annotations

import inspect
import re

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from guards import (
    ConstraintLedger,
    DelegationRejected,
    ExecutionGuard,
    IdempotentTool,
    ObjectiveRegistry,
    PolicyGate,
    Telemetry,
    VersionedStore,
    acting_as,
    call_signature,
)

LEDGER = [
    {"id": "C1", "text": "Total cost under $5,000"},
    {"id": "C2", "text": "Venue wheelchair accessible"},
]
CRITERIA = [{"text": "Quotes under budget", "constraint_ids": ["C1"]}]


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, Telemetry(provider)
    provider.shutdown()


def finished(exporter):
    return list(exporter.get_finished_spans())


# --- versioned store -------------------------------------------------------------------------


def test_write_state_requires_expected_version_and_has_no_force_flag():
    parameters = inspect.signature(VersionedStore.write_state).parameters
    assert parameters["expected_version"].default is inspect.Parameter.empty
    assert "force" not in parameters
    with pytest.raises(TypeError):
        VersionedStore().write_state("k", 1)  # type: ignore[call-arg]


def test_version_tokens_are_opaque_and_unpredictable(spans):
    exporter, telemetry = spans
    store = VersionedStore(telemetry)
    tokens = []
    version = None
    for value in range(5):
        version = store.write_state("k", value, version)["version"]
        tokens.append(version)
    assert len(set(tokens)) == 5
    for token in tokens:
        assert isinstance(token, str)
        assert not token.isdigit()
        assert re.fullmatch(r"[0-9a-f]{20}", token)
    # two stores with different (random) salts give different tokens for the same history
    other = VersionedStore(telemetry)
    assert other.write_state("k", 0, None)["version"] != tokens[0]


def test_stale_write_is_rejected_with_current_value_and_version(spans):
    exporter, telemetry = spans
    store = VersionedStore(telemetry)
    base = store.write_state("doc", "v0", None)["version"]
    first = store.write_state("doc", "researcher", base)
    stale = store.write_state("doc", "writer", base)
    assert stale == {
        "rejected": True,
        "reason": "version_conflict",
        "current_value": "researcher",
        "current_version": first["version"],
    }
    assert store.read_state("doc")["value"] == "researcher"
    retried = store.write_state("doc", "researcher+writer", stale["current_version"])
    assert retried["rejected"] is False
    assert store.read_state("doc") == {"value": "researcher+writer", "version": retried["version"]}
    rejected = [s for s in finished(exporter) if s.attributes.get("driftscope.outcome") == "rejected"]
    assert len(rejected) == 1
    assert rejected[0].attributes["driftscope.reject_reason"] == "version_conflict"
    assert rejected[0].attributes["driftscope.state.expected_version"] == base


def test_creating_a_key_needs_expected_version_none(spans):
    _, telemetry = spans
    store = VersionedStore(telemetry)
    store.write_state("k", 1, None)
    again = store.write_state("k", 2, None)
    assert again["rejected"] is True and again["current_value"] == 1


def test_override_records_who_forced_it_and_needs_a_reason(spans):
    exporter, telemetry = spans
    store = VersionedStore(telemetry)
    base = store.write_state("k", 1, None)["version"]
    with pytest.raises(ValueError, match="reason"):
        store.override_state("k", 2, forced_by="oncall", reason=" ")
    with pytest.raises(ValueError, match="forced_by"):
        store.override_state("k", 2, forced_by="", reason="incident")
    result = store.override_state(
        "k", 2, forced_by="oncall@example.com", reason="incident 12", agent_id="ops"
    )
    assert result["previous_version"] == base and result["version"] != base
    span = finished(exporter)[-1]
    assert span.attributes["gen_ai.tool.name"] == "override_state"
    assert span.attributes["driftscope.forced_by"] == "oncall@example.com"
    assert span.attributes["driftscope.override.reason"] == "incident 12"
    assert "driftscope.state.expected_version" not in span.attributes


# --- constraint ledger -----------------------------------------------------------------------


def test_delegate_parameters_are_required():
    parameters = inspect.signature(ConstraintLedger.delegate).parameters
    for name in (
        "subtask",
        "origin_task_id",
        "constraints",
        "acceptance_criteria",
        "waived_constraints",
        "to_agent",
    ):
        assert parameters[name].default is inspect.Parameter.empty, name


def test_dropped_constraint_is_rejected_naming_the_hop(spans):
    exporter, telemetry = spans
    ledger = ConstraintLedger(telemetry)
    ledger.open_task("T", "Plan the offsite", LEDGER, to_agent="planner")
    t1 = ledger.delegate("Research venues", "T", LEDGER, CRITERIA, {}, to_agent="researcher")["task_id"]
    assert t1 == "T.1"
    with acting_as("researcher"), pytest.raises(DelegationRejected) as caught:
        ledger.delegate("Draft proposal", "T", LEDGER[:1], CRITERIA, {}, to_agent="writer", parent_task_id=t1)
    rejection = caught.value
    assert rejection.reason == "missing_constraint"
    assert rejection.hop == 2
    assert rejection.missing_constraints == ["C2"]
    assert "hop 2" in str(rejection) and "researcher -> writer" in str(rejection) and "C2" in str(rejection)
    span = finished(exporter)[-1]
    assert span.attributes["driftscope.outcome"] == "rejected"
    assert span.attributes["driftscope.hop"] == 2
    assert span.attributes["driftscope.delegate.to"] == "writer"
    assert list(span.attributes["driftscope.constraints.carried"]) == ["C1"]
    assert list(span.attributes["driftscope.constraints.ledger"]) == ["C1", "C2"]


def test_altered_constraint_text_is_not_carried(spans):
    _, telemetry = spans
    ledger = ConstraintLedger(telemetry)
    ledger.open_task("T", "Plan", LEDGER, to_agent="planner")
    altered = [LEDGER[0], {"id": "C2", "text": "Venue accessible if possible"}]
    with pytest.raises(DelegationRejected, match="text altered: C2"):
        ledger.delegate("Research", "T", altered, CRITERIA, {}, to_agent="researcher")


def test_waiver_needs_a_non_empty_reason(spans):
    exporter, telemetry = spans
    ledger = ConstraintLedger(telemetry)
    ledger.open_task("T", "Plan", LEDGER, to_agent="planner")
    with pytest.raises(DelegationRejected, match="waiver without reason: C2"):
        ledger.delegate("Review copy", "T", LEDGER[:1], CRITERIA, {"C2": "  "}, to_agent="critic")
    result = ledger.delegate(
        "Review copy", "T", LEDGER[:1], CRITERIA, {"C2": "copy review only"}, to_agent="critic"
    )
    assert result["rejected"] is False
    span = finished(exporter)[-1]
    assert list(span.attributes["driftscope.constraints.waived"]) == ["C2"]
    assert list(span.attributes["driftscope.constraints.waiver_reasons"]) == ["copy review only"]


def test_acceptance_criterion_citing_no_constraint_is_rejected(spans):
    exporter, telemetry = spans
    ledger = ConstraintLedger(telemetry)
    ledger.open_task("T", "Plan", LEDGER, to_agent="planner")
    bad = [
        *CRITERIA,
        {"text": "Looks good", "constraint_ids": []},
        {"text": "Nice", "constraint_ids": ["C9"]},
    ]
    with pytest.raises(DelegationRejected) as caught:
        ledger.delegate("Research", "T", LEDGER, bad, {}, to_agent="researcher")
    assert caught.value.reason == "uncited_criterion"
    assert caught.value.uncited_criteria == ["Looks good", "Nice"]
    assert finished(exporter)[-1].attributes["driftscope.reject_reason"] == "uncited_criterion"
    # a rejected delegation creates no task: the retry gets the same id
    assert ledger.delegate("Research", "T", LEDGER, CRITERIA, {}, to_agent="researcher")["task_id"] == "T.1"


# --- objectives and policy --------------------------------------------------------------------


def test_superseding_marks_holders_stale_until_they_refresh(spans):
    exporter, telemetry = spans
    registry = ObjectiveRegistry(telemetry)
    registry.set_objective("T", "Refund order 7731")
    first = registry.get_objective("T", "responder")
    assert set(first) == {"objective", "version", "as_of", "superseded", "refresh_required"}
    assert first["superseded"] is False and first["refresh_required"] is False
    change = registry.supersede("T", "Refund order 7731 minus shipping", agent_id="manager")
    assert change["stale_holders"] == ["responder"]
    assert registry.holders("T") == {"responder": {"version": first["version"], "stale": True}}
    held = registry.get_objective("T", "responder", version=first["version"])
    assert held["superseded"] is True and held["refresh_required"] is True
    fresh = registry.get_objective("T", "responder")
    assert fresh["version"] == change["version"] and fresh["refresh_required"] is True
    assert registry.get_objective("T", "responder")["refresh_required"] is False
    supersede_span = [
        s for s in finished(exporter) if s.attributes["gen_ai.tool.name"] == "supersede_objective"
    ][0]
    assert list(supersede_span.attributes["driftscope.objective.stale_holders"]) == ["responder"]


def test_send_against_superseded_policy_is_refused_with_current_policy(spans):
    exporter, telemetry = spans
    gate = PolicyGate(ObjectiveRegistry(telemetry), "policy/refunds")
    gate.publish_policy("30 days")
    old = gate.read_policy("responder")
    current = gate.publish_policy("14 days", reason="finance update")
    refusal = gate.send_customer_message(
        "T-1", "refund approved (30 days)", old["version"], agent_id="responder"
    )
    assert refusal["rejected"] is True and refusal["reason"] == "superseded_policy"
    assert refusal["current_policy"]["version"] == current["version"]
    assert refusal["current_policy"]["objective"] == "14 days"
    assert gate.outbox == []
    span = finished(exporter)[-1]
    assert span.attributes["driftscope.policy.version"] == old["version"]
    assert span.attributes["driftscope.policy.current_version"] == current["version"]
    sent = gate.send_customer_message(
        "T-1", "refund approved (14 days)", current["version"], agent_id="responder"
    )
    assert sent == {"rejected": False, "message_id": "msg-1"}
    assert len(gate.outbox) == 1


# --- execution guard --------------------------------------------------------------------------


def test_per_agent_budget_stops_the_loop_with_a_degraded_result(spans):
    exporter, telemetry = spans
    guard = ExecutionGuard(telemetry, max_steps_per_agent=3, max_total_steps=100)
    decisions = []
    for i in range(1000):  # an agent that would never stop by itself
        decision = guard.check("researcher", "search_web", {"query": f"topic {i}"})
        decisions.append(decision)
        if not decision.allowed:
            break
    assert len(decisions) == 4
    last = decisions[-1]
    assert last.reason == "step_budget" and last.step == 4
    assert last.degraded["status"] == "degraded" and last.degraded["steps_taken"] == 3
    assert guard.steps_of("researcher") == 3
    assert guard.check("researcher", "search_web", {"query": "again"}).allowed is False
    assert guard.check("writer", "draft", {"part": 1}).allowed is True  # other agents keep their budget
    assert [s.attributes["driftscope.outcome"] for s in finished(exporter)][-3:] == [
        "rejected",
        "rejected",
        "ok",
    ]


def test_total_budget_stops_the_crew(spans):
    _, telemetry = spans
    guard = ExecutionGuard(telemetry, max_steps_per_agent=10, max_total_steps=3)
    allowed = [guard.check(agent, "t", {"n": n}).allowed for n, agent in enumerate("abcab")]
    assert allowed == [True, True, True, False, False]
    assert guard.total_steps == 3


def test_repeated_call_normalises_key_order_whitespace_and_case(spans):
    exporter, telemetry = spans
    variants = [
        {"database": "warehouse", "query": "SELECT revenue FROM q3"},
        {"query": "  select revenue from q3  ", "database": "Warehouse"},
        {"query": "\tSELECT REVENUE FROM Q3\n", "database": " WAREHOUSE"},
    ]
    assert len({call_signature("run_sql", v) for v in variants}) == 1
    assert call_signature(" Run_SQL ", variants[0]) == call_signature("run_sql", variants[1])
    assert call_signature("run_sql", {"query": "SELECT revenue FROM q4"}) != call_signature(
        "run_sql", variants[0]
    )
    guard = ExecutionGuard(telemetry, max_identical_calls=2)
    results = [guard.check("analyst", "run_sql", v) for v in variants]
    assert [r.allowed for r in results] == [True, True, False]
    assert results[2].reason == "repeated_call"
    assert guard.check("analyst", "run_sql", {"query": "SELECT revenue FROM q4"}).allowed is True
    assert guard.check("analyst", "run_sql", variants[0]).allowed is False  # still refused on the next try
    assert finished(exporter)[2].attributes["driftscope.reject_reason"] == "repeated_call"


def test_goal_divergence_uses_the_pluggable_embedder(spans):
    exporter, telemetry = spans
    vectors = {"root": [1.0, 0.0], "close": [0.9, 0.1], "far": [0.1, 0.9]}
    guard = ExecutionGuard(telemetry, root_goal="root", embedder=lambda texts: [vectors[t] for t in texts])
    assert guard.check("a", "delegate", {"s": 1}, subtask_text="close").allowed is True
    refused = guard.check("a", "delegate", {"s": 2}, subtask_text="far")
    assert refused.allowed is False and refused.reason == "goal_divergence"
    assert refused.divergence == pytest.approx(1 - 0.1 / (0.9055385138), abs=1e-3)
    span = finished(exporter)[-1]
    assert span.attributes["driftscope.goal.divergence"] == refused.divergence
    assert span.attributes["driftscope.goal.threshold"] == 0.80  # the default


def test_schema_validation_of_state_transitions(spans):
    from typing import Literal

    from pydantic import BaseModel, model_validator

    allowed = {("draft", "review"), ("review", "published"), ("review", "draft")}

    class StatusTransition(BaseModel):
        key: str
        from_state: Literal["draft", "review", "published"]
        to_state: Literal["draft", "review", "published"]

        @model_validator(mode="after")
        def edge_allowed(self):
            if (self.from_state, self.to_state) not in allowed:
                raise ValueError(f"{self.from_state} -> {self.to_state} is not allowed")
            return self

    exporter, telemetry = spans
    guard = ExecutionGuard(telemetry)
    assert guard.validate_transition("writer", "status", "draft", "review", StatusTransition).allowed
    skipped = guard.validate_transition("writer", "status", "draft", "published", StatusTransition)
    assert skipped.allowed is False and skipped.reason == "schema_invalid"
    assert "draft -> published is not allowed" in skipped.message
    unknown = guard.validate_transition("writer", "status", "draft", "archived", StatusTransition)
    assert unknown.reason == "schema_invalid"
    assert [s.attributes["driftscope.outcome"] for s in finished(exporter)] == ["ok", "rejected", "rejected"]
    assert guard.total_steps == 0


# --- idempotent side effects ------------------------------------------------------------------


def test_duplicate_idempotency_key_is_refused_with_the_original_result(spans):
    exporter, telemetry = spans
    sent = []

    def send(payload):
        sent.append(payload)
        return {"invoice_id": f"INV-{len(sent)}"}

    seen: dict = {}
    tool = IdempotentTool("send_invoice", send, telemetry, seen=seen)
    first = tool({"order": "7731"}, idempotency_key="invoice:7731")
    assert first == {"rejected": False, "result": {"invoice_id": "INV-1"}}
    resumed = IdempotentTool("send_invoice", send, telemetry, seen=seen)  # a resumed run, same durable keys
    again = resumed({"order": "7731"}, idempotency_key="invoice:7731")
    assert again == {
        "rejected": True,
        "reason": "duplicate_side_effect",
        "original_result": {"invoice_id": "INV-1"},
    }
    assert len(sent) == 1
    assert tool({"order": "7732"}, idempotency_key="invoice:7732")["rejected"] is False
    with pytest.raises(ValueError):
        tool({"order": "1"}, idempotency_key="")
    outcomes = [
        (s.attributes["driftscope.outcome"], s.attributes.get("driftscope.reject_reason"))
        for s in finished(exporter)
    ]
    assert outcomes == [("ok", None), ("rejected", "duplicate_side_effect"), ("ok", None)]


def test_failing_side_effect_is_recorded_as_error_and_not_remembered(spans):
    exporter, telemetry = spans
    attempts = []

    def flaky(payload):
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("smtp down")
        return "sent"

    tool = IdempotentTool("send_email", flaky, telemetry)
    with pytest.raises(ConnectionError):
        tool({"to": "a@example.com"}, idempotency_key="mail:1")
    assert tool({"to": "a@example.com"}, idempotency_key="mail:1") == {"rejected": False, "result": "sent"}
    first, second = finished(exporter)
    assert first.attributes["driftscope.outcome"] == "error"
    assert first.status.status_code.name == "ERROR"
    assert second.attributes["driftscope.outcome"] == "ok"


def test_concurrent_read_modify_write_loses_no_update(spans):
    import threading

    _, telemetry = spans
    store = VersionedStore(telemetry)
    store.write_state("counter", 0, None)
    conflicts = []

    def worker():
        for _ in range(25):
            while True:
                current = store.read_state("counter")
                result = store.write_state("counter", current["value"] + 1, current["version"])
                if not result["rejected"]:
                    break
                conflicts.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.read_state("counter")["value"] == 100
