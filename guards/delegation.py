"""Delegation with a constraint ledger: constraints cannot silently vanish between agents.

The root task registers its constraints (the ledger). Every delegation down the chain must carry
each ledger constraint verbatim (same id, same text) or waive it with a non-empty reason, and
every acceptance criterion must cite at least one ledger constraint id. A delegation that breaks
either rule raises :class:`DelegationRejected`, naming the hop, after emitting its span.

Data shapes (plain dicts are accepted everywhere):
- constraint: ``{"id": "C1", "text": "Total cost under $5,000"}``
- acceptance criterion: ``{"text": "Quote within budget", "constraint_ids": ["C1"]}``
- waived constraints: ``{"C3": "critic reviews copy only; dates are out of scope"}``
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from guards.telemetry import Telemetry, resolve_agent, tool_attributes

logger = logging.getLogger(__name__)

GUARD_NAME = "constraint_ledger"


@dataclass(frozen=True)
class Constraint:
    """One constraint of the origin task; ``text`` must travel unchanged."""

    id: str
    text: str


@dataclass(frozen=True)
class AcceptanceCriterion:
    """A check the receiving agent's result must pass, citing the constraints it verifies."""

    text: str
    constraint_ids: tuple[str, ...] = ()


@dataclass
class TaskRecord:
    """A task in a delegation chain."""

    task_id: str
    origin_task_id: str
    parent_task_id: str | None
    hop: int
    goal: str
    assigned_to: str
    children: int = 0
    constraints: dict[str, str] = field(default_factory=dict)


class DelegationRejected(ValueError):
    """A delegation broke the ledger rules; ``hop``, ``reason`` and the offending ids say how."""

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        hop: int,
        task_id: str,
        missing_constraints: list[str],
        uncited_criteria: list[str],
    ):
        super().__init__(message)
        self.reason = reason
        self.hop = hop
        self.task_id = task_id
        self.missing_constraints = missing_constraints
        self.uncited_criteria = uncited_criteria


def _as_constraint(item: Constraint | Mapping[str, Any]) -> Constraint:
    if isinstance(item, Constraint):
        return item
    return Constraint(id=str(item["id"]), text=str(item["text"]))


def _as_criterion(item: AcceptanceCriterion | Mapping[str, Any]) -> AcceptanceCriterion:
    if isinstance(item, AcceptanceCriterion):
        return item
    return AcceptanceCriterion(text=str(item["text"]), constraint_ids=tuple(item.get("constraint_ids") or ()))


class ConstraintLedger:
    """Registry of delegation chains and their constraint ledgers."""

    def __init__(self, telemetry: Telemetry | None = None):
        self._telemetry = telemetry or Telemetry()
        self._lock = threading.Lock()
        self._tasks: dict[str, TaskRecord] = {}

    def task(self, task_id: str) -> TaskRecord:
        """The record of a registered task (KeyError if unknown)."""
        return self._tasks[task_id]

    def open_task(
        self,
        task_id: str,
        goal: str,
        constraints: Iterable[Constraint | Mapping[str, Any]],
        *,
        to_agent: str,
        agent_id: str | None = None,
    ) -> dict[str, Any]:
        """Register a root task (hop 0) and its constraint ledger, assigned to ``to_agent``."""
        ledger = [_as_constraint(c) for c in constraints]
        ids = [c.id for c in ledger]
        if len(set(ids)) != len(ids):
            raise ValueError(f"constraint ids must be unique, got {ids}")
        with self._lock:
            if task_id in self._tasks:
                raise ValueError(f"task {task_id!r} is already registered")
            self._tasks[task_id] = TaskRecord(
                task_id, task_id, None, 0, goal, to_agent, constraints={c.id: c.text for c in ledger}
            )
        result = {"rejected": False, "task_id": task_id, "hop": 0}
        arguments = {
            "task_id": task_id,
            "goal": goal,
            "constraints": [c.__dict__ for c in ledger],
            "to": to_agent,
        }
        self._telemetry.emit(
            "execute_tool open_task",
            {
                **tool_attributes("open_task", agent_id, arguments, result, guard=GUARD_NAME),
                "driftscope.op": "delegate",
                "driftscope.task.id": task_id,
                "driftscope.task.origin_id": task_id,
                "driftscope.hop": 0,
                "driftscope.delegate.to": to_agent,
                "driftscope.constraints.ledger": ids,
                "driftscope.constraints.carried": ids,
                "driftscope.goal.root": goal,
                "driftscope.goal.text": goal,
                "driftscope.outcome": "ok",
            },
        )
        return result

    def delegate(
        self,
        subtask: str,
        origin_task_id: str,
        constraints: Iterable[Constraint | Mapping[str, Any]],
        acceptance_criteria: Iterable[AcceptanceCriterion | Mapping[str, Any]],
        waived_constraints: Mapping[str, str],
        *,
        to_agent: str,
        parent_task_id: str | None = None,
        agent_id: str | None = None,
    ) -> dict[str, Any]:
        """Delegate ``subtask`` to ``to_agent`` one hop below ``parent_task_id`` (default: the origin).

        Returns ``{"rejected": False, "task_id": ..., "hop": ...}``; raises
        :class:`DelegationRejected` (reason ``missing_constraint`` or ``uncited_criterion``).
        """
        with self._lock:
            if origin_task_id not in self._tasks:
                raise KeyError(f"unknown origin task {origin_task_id!r}; register it with open_task first")
            origin = self._tasks[origin_task_id]
            parent = self._tasks[parent_task_id or origin_task_id]
            if parent.origin_task_id != origin_task_id:
                raise ValueError(f"task {parent.task_id!r} does not belong to origin {origin_task_id!r}")
            task_id = f"{parent.task_id}.{parent.children + 1}"
        hop = parent.hop + 1
        given = [_as_constraint(c) for c in constraints]
        criteria = [_as_criterion(c) for c in acceptance_criteria]
        ledger = origin.constraints
        carried = [c.id for c in given if c.id in ledger and ledger[c.id] == c.text]
        waived = {cid: reason for cid, reason in waived_constraints.items()}
        empty_waivers = [cid for cid, reason in waived.items() if not (reason or "").strip()]
        missing = [
            cid for cid in ledger if cid not in carried and (cid not in waived or cid in empty_waivers)
        ]
        uncited = [c.text for c in criteria if not any(cid in ledger for cid in c.constraint_ids)]
        cited = sorted({cid for c in criteria for cid in c.constraint_ids})
        delegator = resolve_agent(agent_id)
        reason = "missing_constraint" if missing else ("uncited_criterion" if uncited else None)
        message = ""
        if missing:
            altered = [c.id for c in given if c.id in missing]
            message = (
                f"delegation at hop {hop} ({delegator or '?'} -> {to_agent}) drops constraint(s) "
                f"{', '.join(missing)} of origin task {origin_task_id}"
                + (f" (text altered: {', '.join(altered)})" if altered else "")
                + (f" (waiver without reason: {', '.join(empty_waivers)})" if empty_waivers else "")
                + "; carry them verbatim or waive them with a reason"
            )
        elif uncited:
            message = (
                f"delegation at hop {hop} ({delegator or '?'} -> {to_agent}) has acceptance criteria citing "
                f"no constraint id: {uncited}"
            )
        if reason is None:
            with self._lock:
                # numbered at registration, so concurrent delegations from one parent never share an id
                parent.children += 1
                task_id = f"{parent.task_id}.{parent.children}"
                self._tasks[task_id] = TaskRecord(
                    task_id, origin_task_id, parent.task_id, hop, subtask, to_agent
                )
            result: dict[str, Any] = {"rejected": False, "task_id": task_id, "hop": hop}
        else:
            result = {"rejected": True, "reason": reason, "task_id": task_id, "hop": hop, "message": message}
        arguments = {
            "subtask": subtask,
            "origin_task_id": origin_task_id,
            "parent_task_id": parent.task_id,
            "constraints": [c.__dict__ for c in given],
            "acceptance_criteria": [
                {"text": c.text, "constraint_ids": list(c.constraint_ids)} for c in criteria
            ],
            "waived_constraints": waived,
            "to": to_agent,
        }
        waived_ids = [cid for cid in waived if cid not in empty_waivers]
        self._telemetry.emit(
            "execute_tool delegate",
            {
                **tool_attributes("delegate", delegator, arguments, result, guard=GUARD_NAME),
                "driftscope.op": "delegate",
                "driftscope.task.id": task_id,
                "driftscope.task.origin_id": origin_task_id,
                "driftscope.task.parent_id": parent.task_id,
                "driftscope.hop": hop,
                "driftscope.delegate.to": to_agent,
                "driftscope.constraints.ledger": list(ledger),
                "driftscope.constraints.carried": carried,
                "driftscope.constraints.waived": waived_ids,
                "driftscope.constraints.waiver_reasons": [waived[cid] for cid in waived_ids],
                "driftscope.acceptance.constraint_ids": cited,
                "driftscope.goal.root": origin.goal,
                "driftscope.goal.text": subtask,
                "driftscope.outcome": "rejected" if reason else "ok",
                "driftscope.reject_reason": reason,
            },
        )
        if reason is not None:
            logger.info("%s", message)
            raise DelegationRejected(
                message,
                reason=reason,
                hop=hop,
                task_id=task_id,
                missing_constraints=missing,
                uncited_criteria=uncited,
            )
        return result
