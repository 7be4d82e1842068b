"""Enforcement tools that make multi-agent coordination failures unrepresentable.

Importing this package needs only ``opentelemetry-api`` and the standard library; the embedding
model (goal divergence) and pydantic (transition validation) are loaded only when used. Every
tool call emits one span on the tracer ``driftscope.guards`` (see docs/guards.md).
"""

from guards.delegation import AcceptanceCriterion, Constraint, ConstraintLedger, DelegationRejected
from guards.execution import ExecutionGuard, StepDecision, call_signature, normalize_arguments
from guards.objectives import ObjectiveRegistry, PolicyGate
from guards.side_effects import IdempotentTool, traced_call
from guards.state import VersionedStore
from guards.telemetry import TRACER_NAME, ActingAsSpanProcessor, Telemetry, acting_as
from guards.unguarded import (
    ForceStore,
    FreeTextDelegation,
    MergingStore,
    PlainStore,
    Scratchpad,
    UnguardedOutbox,
)

__all__ = [
    "TRACER_NAME",
    "AcceptanceCriterion",
    "ActingAsSpanProcessor",
    "Constraint",
    "ConstraintLedger",
    "DelegationRejected",
    "ExecutionGuard",
    "ForceStore",
    "FreeTextDelegation",
    "IdempotentTool",
    "MergingStore",
    "ObjectiveRegistry",
    "PlainStore",
    "PolicyGate",
    "Scratchpad",
    "StepDecision",
    "Telemetry",
    "UnguardedOutbox",
    "VersionedStore",
    "acting_as",
    "call_signature",
    "normalize_arguments",
    "traced_call",
]
