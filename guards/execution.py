"""The execution guard: checked before every agent step.

In order, a step is refused when the agent (or the whole crew) is out of step budget, when the
same call (tool name + normalised arguments) was already made too often, or when the subtask has
drifted from the root goal (embedding distance above the threshold). A refusal is never an
exception: :meth:`ExecutionGuard.check` returns a :class:`StepDecision` with ``allowed=False`` and a
graceful-degradation payload the agent returns instead of looping. State transitions can be
validated against a pydantic model with :meth:`ExecutionGuard.validate_transition` (pydantic is
only imported by the caller's model; nothing here imports it).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from guards.embedding import Embedder, SentenceTransformerEmbedder, cosine_distance
from guards.telemetry import Telemetry, canonical_json, conversation_attribute

logger = logging.getLogger(__name__)

GUARD_NAME = "execution_guard"
# The same default as the collector's uncalibrated goal-drift threshold (analytics.thresholds):
# on the 367 labelled pairs of sample_traces/calibration/goal_pairs.csv (all-MiniLM-L6-v2,
# AUROC 0.975), 1 - cos > 0.80 refuses 0.6% of on-goal subtasks and 77% of drifted ones; 0.45
# refused 55% of on-goal subtasks ("Plan the offsite" -> "Find venues" is 0.777). A refusal stops
# real work, so the default refuses only clear drift; pass the threshold `driftscope calibrate`
# stored for your own crews (e.g. Youden's J on those pairs: 0.745, 86% / 1.7%) to refuse more.
DEFAULT_DIVERGENCE_THRESHOLD = 0.80


def normalize_arguments(value: Any) -> Any:
    """Arguments as compared for repeats: strings stripped, case-folded and space-collapsed."""
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, dict):
        return {str(k).strip().casefold(): normalize_arguments(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalize_arguments(v) for v in value]
    return value


def call_signature(tool: str, args: Any) -> str:
    """sha256 of tool name + normalised arguments (key order, whitespace, case don't matter)."""
    material = normalize_arguments(tool) + "\n" + canonical_json(normalize_arguments(args))
    return hashlib.sha256(material.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class StepDecision:
    """Outcome of one guard check. When not allowed, return ``degraded`` instead of acting."""

    allowed: bool
    step: int
    signature: str | None = None
    reason: str | None = None
    message: str = ""
    divergence: float | None = None
    degraded: dict[str, Any] | None = None


class ExecutionGuard:
    """Step budgets, repeated-call detection, goal divergence and transition validation."""

    def __init__(
        self,
        telemetry: Telemetry | None = None,
        *,
        root_goal: str | None = None,
        max_steps_per_agent: int = 20,
        max_total_steps: int = 100,
        max_identical_calls: int = 2,
        divergence_threshold: float = DEFAULT_DIVERGENCE_THRESHOLD,
        embedder: Embedder | None = None,
    ):
        if max_steps_per_agent < 1 or max_total_steps < 1 or max_identical_calls < 1:
            raise ValueError("budgets and max_identical_calls must be at least 1")
        self._telemetry = telemetry or Telemetry()
        self.root_goal = root_goal
        self.max_steps_per_agent = max_steps_per_agent
        self.max_total_steps = max_total_steps
        self.max_identical_calls = max_identical_calls
        self.divergence_threshold = divergence_threshold
        self._embedder = embedder
        self._lock = threading.Lock()
        self._steps: Counter[str] = Counter()
        self._calls: Counter[tuple[str, str]] = Counter()
        self._root_vector: list[float] | None = None

    @property
    def total_steps(self) -> int:
        """Steps allowed so far across all agents."""
        return sum(self._steps.values())

    def steps_of(self, agent: str) -> int:
        """Steps allowed so far for one agent."""
        return self._steps[agent]

    def divergence(self, subtask_text: str) -> float:
        """1 - cos(root goal, subtask) with this guard's embedder."""
        if self.root_goal is None:
            raise ValueError("goal divergence needs root_goal")
        if self._embedder is None:
            self._embedder = SentenceTransformerEmbedder()
        if self._root_vector is None:
            self._root_vector = list(self._embedder([self.root_goal])[0])
        return cosine_distance(self._root_vector, list(self._embedder([subtask_text])[0]))

    def check(self, agent: str, tool: str, args: Any, subtask_text: str | None = None) -> StepDecision:
        """Decide whether ``agent`` may call ``tool`` with ``args`` now; emits one span either way."""
        signature = call_signature(tool, args)
        divergence = None
        if subtask_text is not None and self.root_goal is not None:
            divergence = round(self.divergence(subtask_text), 3)
        with self._lock:
            step = self._steps[agent] + 1
            total = self.total_steps
            reason = message = None
            if self._steps[agent] >= self.max_steps_per_agent:
                reason = "step_budget"
                message = f"{agent} used its {self.max_steps_per_agent} steps"
            elif total >= self.max_total_steps:
                reason = "step_budget"
                message = f"the crew used its {self.max_total_steps} total steps"
            elif self._calls[(agent, signature)] >= self.max_identical_calls:
                reason = "repeated_call"
                message = f"{agent} already called {tool} with these arguments {self._calls[(agent, signature)]} times"
            elif divergence is not None and divergence > self.divergence_threshold:
                reason = "goal_divergence"
                message = f"subtask is {divergence:.2f} from the root goal (threshold {self.divergence_threshold:.2f})"
            if reason is None:
                self._steps[agent] += 1
                self._calls[(agent, signature)] += 1
        degraded = None
        if reason is not None:
            degraded = {
                "status": "degraded",
                "reason": reason,
                "message": message,
                "agent": agent,
                "steps_taken": step - 1,
                "advice": _ADVICE[reason],
            }
            logger.info("step refused for %s: %s", agent, message)
        decision = StepDecision(reason is None, step, signature, reason, message or "", divergence, degraded)
        self._emit(agent, tool, args, decision, subtask_text)
        return decision

    def validate_transition(
        self, agent: str, key: str, current: Any, proposed: Any, schema: Any
    ) -> StepDecision:
        """Validate a state transition with a pydantic model class (``schema.model_validate``).

        The model receives ``{"key", "from_state", "to_state"}``; a ``ValidationError`` refuses the
        transition with reason ``schema_invalid``. Does not consume step budget.
        """
        payload = {"key": key, "from_state": current, "to_state": proposed}
        try:
            schema.model_validate(payload)
            reason, message = None, ""
        except Exception as exc:  # only pydantic's ValidationError is a refusal
            from pydantic import ValidationError

            if not isinstance(exc, ValidationError):
                raise
            reason = "schema_invalid"
            message = f"{schema.__name__}: " + "; ".join(err["msg"] for err in exc.errors())
        degraded = None
        if reason:
            degraded = {
                "status": "degraded",
                "reason": reason,
                "message": message,
                "agent": agent,
                "advice": _ADVICE[reason],
            }
        decision = StepDecision(reason is None, self._steps[agent], None, reason, message, None, degraded)
        self._telemetry.emit(
            "guard validate_transition",
            {
                **conversation_attribute(),
                "gen_ai.agent.id": agent,
                "gen_ai.tool.name": "validate_transition",
                "gen_ai.tool.call.arguments": canonical_json(payload),
                "driftscope.guard": GUARD_NAME,
                "driftscope.op": "step",
                "driftscope.state.key": key,
                "driftscope.schema": getattr(schema, "__name__", str(schema)),
                "driftscope.outcome": "ok" if decision.allowed else "rejected",
                "driftscope.reject_reason": reason,
                "driftscope.reject_message": message or None,
            },
        )
        return decision

    def _emit(
        self, agent: str, tool: str, args: Any, decision: StepDecision, subtask_text: str | None
    ) -> None:
        self._telemetry.emit(
            f"guard check {tool}",
            {
                **conversation_attribute(),
                "gen_ai.agent.id": agent,
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.arguments": canonical_json(args),
                "driftscope.guard": GUARD_NAME,
                "driftscope.op": "step",
                "driftscope.step": decision.step,
                "driftscope.budget.max_steps": self.max_steps_per_agent,
                "driftscope.budget.max_total_steps": self.max_total_steps,
                "driftscope.call.signature": decision.signature,
                "driftscope.goal.root": self.root_goal if subtask_text is not None else None,
                "driftscope.goal.text": subtask_text,
                "driftscope.goal.divergence": decision.divergence,
                "driftscope.goal.threshold": self.divergence_threshold
                if decision.divergence is not None
                else None,
                "driftscope.outcome": "ok" if decision.allowed else "rejected",
                "driftscope.reject_reason": decision.reason,
                "driftscope.reject_message": decision.message or None,
            },
        )


_ADVICE = {
    "step_budget": "stop and return partial results with a summary of what is unfinished",
    "repeated_call": "do not retry the same call; report the failure or change approach",
    "goal_divergence": "re-scope the subtask to the root goal or hand back to the planner",
    "schema_invalid": "keep the current state and report the invalid transition",
}
