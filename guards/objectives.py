"""Objective freshness and the policy-gated outbound action.

Agents read their objective through :class:`ObjectiveRegistry`, which remembers which version
each agent holds. Superseding an objective marks every holder of an older version stale, and their
next read says ``refresh_required``. :class:`PolicyGate` keeps the customer-facing policy as such
an objective and refuses an outbound message drafted against a superseded policy version, handing
back the current policy so the caller can redraft.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from guards.telemetry import Telemetry, resolve_agent, tool_attributes

logger = logging.getLogger(__name__)

GUARD_NAME = "objective_registry"
POLICY_GUARD_NAME = "policy_gate"


@dataclass
class _Objective:
    versions: list[tuple[str, str, str]] = field(default_factory=list)  # (version, text, as_of)
    holders: dict[str, str] = field(default_factory=dict)  # agent -> version held
    stale: set[str] = field(default_factory=set)


class ObjectiveRegistry:
    """Current objectives by task id, with the agents holding each version."""

    def __init__(self, telemetry: Telemetry | None = None, *, salt: str | None = None):
        self._telemetry = telemetry or Telemetry()
        self._salt = salt if salt is not None else secrets.token_hex(16)
        self._lock = threading.Lock()
        self._objectives: dict[str, _Objective] = {}
        self._sequence = 0

    def _token(self, task_id: str, text: str) -> str:
        self._sequence += 1
        return hashlib.sha256(f"{self._salt}|{task_id}|{self._sequence}|{text}".encode()).hexdigest()[:20]

    @property
    def telemetry(self) -> Telemetry:
        """Where this registry's spans go (shared by a PolicyGate built on it)."""
        return self._telemetry

    def current(self, task_id: str) -> dict[str, str]:
        """``{"objective", "version", "as_of"}`` of the current version, without registering a holder."""
        version, text, as_of = self._objectives[task_id].versions[-1]
        return {"objective": text, "version": version, "as_of": as_of}

    def holders(self, task_id: str) -> dict[str, dict[str, Any]]:
        """Agent -> ``{"version", "stale"}`` for every agent that read the objective."""
        entry = self._objectives[task_id]
        return {
            agent: {"version": v, "stale": agent in entry.stale} for agent, v in sorted(entry.holders.items())
        }

    def set_objective(self, task_id: str, objective: str, *, agent_id: str | None = None) -> dict[str, Any]:
        """Create the first version of a task's objective (use :meth:`supersede` to change it)."""
        with self._lock:
            if task_id in self._objectives:
                raise ValueError(f"objective {task_id!r} exists; supersede it instead")
            version = self._token(task_id, objective)
            as_of = self._telemetry.now_iso()
            self._objectives[task_id] = _Objective(versions=[(version, objective, as_of)])
        result = {"objective": objective, "version": version, "as_of": as_of}
        self._telemetry.emit(
            "execute_tool set_objective",
            {
                **tool_attributes(
                    "set_objective",
                    agent_id,
                    {"task_id": task_id, "objective": objective},
                    result,
                    guard=GUARD_NAME,
                ),
                "driftscope.op": "objective",
                "driftscope.task.id": task_id,
                "driftscope.objective.id": task_id,
                "driftscope.objective.version": version,
                "driftscope.outcome": "ok",
            },
        )
        return result

    def get_objective(self, task_id: str, agent_id: str, version: str | None = None) -> dict[str, Any]:
        """Read a task's objective and register ``agent_id`` as a holder of the version returned.

        Returns ``{"objective", "version", "as_of", "superseded", "refresh_required"}``. Without
        ``version`` the current version is returned and ``refresh_required`` says the agent's earlier
        copy was superseded since its last read (so work based on it must be redone). With the
        ``version`` the agent holds, that version is returned with ``superseded`` telling whether it
        is still current.
        """
        with self._lock:
            entry = self._objectives[task_id]
            known = {v: (text, as_of) for v, text, as_of in entry.versions}
            current_version = entry.versions[-1][0]
            if version is None:
                version = current_version
            if version not in known:
                raise KeyError(f"objective {task_id!r} has no version {version!r}")
            superseded = version != current_version
            refresh_required = superseded or agent_id in entry.stale
            if not superseded:
                entry.stale.discard(agent_id)
            entry.holders[agent_id] = version
        text, as_of = known[version]
        result = {
            "objective": text,
            "version": version,
            "as_of": as_of,
            "superseded": superseded,
            "refresh_required": refresh_required,
        }
        self._telemetry.emit(
            "execute_tool get_objective",
            {
                **tool_attributes(
                    "get_objective",
                    agent_id,
                    {"task_id": task_id, "version": version},
                    result,
                    guard=GUARD_NAME,
                ),
                "driftscope.op": "objective",
                "driftscope.task.id": task_id,
                "driftscope.objective.id": task_id,
                "driftscope.objective.version": version,
                "driftscope.objective.superseded": superseded,
                "driftscope.objective.refresh_required": refresh_required,
                "driftscope.outcome": "ok",
            },
        )
        return result

    def supersede(
        self, task_id: str, objective: str, *, agent_id: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Replace a task's objective; every agent holding an older version is marked stale.

        Returns ``{"version", "previous_version", "as_of", "stale_holders"}``.
        """
        with self._lock:
            entry = self._objectives[task_id]
            previous = entry.versions[-1][0]
            version = self._token(task_id, objective)
            as_of = self._telemetry.now_iso()
            entry.versions.append((version, objective, as_of))
            stale = sorted(agent for agent, held in entry.holders.items() if held != version)
            entry.stale.update(stale)
        result = {"version": version, "previous_version": previous, "as_of": as_of, "stale_holders": stale}
        arguments = {"task_id": task_id, "objective": objective, "reason": reason}
        self._telemetry.emit(
            "execute_tool supersede_objective",
            {
                **tool_attributes("supersede_objective", agent_id, arguments, result, guard=GUARD_NAME),
                "driftscope.op": "objective",
                "driftscope.task.id": task_id,
                "driftscope.objective.id": task_id,
                "driftscope.objective.version": version,
                "driftscope.objective.previous_version": previous,
                "driftscope.objective.stale_holders": stale,
                "driftscope.outcome": "ok",
            },
        )
        return result


class PolicyGate:
    """Outbound customer messages, refused when drafted against a superseded policy version."""

    def __init__(
        self,
        registry: ObjectiveRegistry,
        policy_id: str = "customer_policy",
        *,
        telemetry: Telemetry | None = None,
    ):
        self._registry = registry
        self._telemetry = telemetry or registry.telemetry
        self.policy_id = policy_id
        self.outbox: list[dict[str, Any]] = []

    def publish_policy(
        self, text: str, *, agent_id: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Publish the first policy version or supersede the current one."""
        try:
            self._registry.current(self.policy_id)
        except KeyError:
            return self._registry.set_objective(self.policy_id, text, agent_id=agent_id)
        return self._registry.supersede(self.policy_id, text, agent_id=agent_id, reason=reason)

    def read_policy(self, agent_id: str) -> dict[str, Any]:
        """The current policy, registering the reader as a holder (see ObjectiveRegistry.get_objective)."""
        return self._registry.get_objective(self.policy_id, agent_id)

    def send_customer_message(
        self, ticket_id: str, body: str, policy_version: str, *, agent_id: str | None = None
    ) -> dict[str, Any]:
        """Send ``body`` on ``ticket_id`` if ``policy_version`` is the current policy.

        Returns ``{"rejected": False, "message_id": ...}`` or ``{"rejected": True, "reason":
        "superseded_policy", "current_policy": {"objective", "version", "as_of"}}``.
        """
        current = self._registry.current(self.policy_id)
        sender = resolve_agent(agent_id)
        if policy_version != current["version"]:
            result: dict[str, Any] = {
                "rejected": True,
                "reason": "superseded_policy",
                "current_policy": current,
            }
        else:
            message_id = f"msg-{len(self.outbox) + 1}"
            self.outbox.append(
                {"message_id": message_id, "ticket_id": ticket_id, "body": body, "agent": sender}
            )
            result = {"rejected": False, "message_id": message_id}
        arguments = {"ticket_id": ticket_id, "body": body, "policy_version": policy_version}
        self._telemetry.emit(
            "execute_tool send_customer_message",
            {
                **tool_attributes(
                    "send_customer_message", sender, arguments, result, guard=POLICY_GUARD_NAME
                ),
                "driftscope.op": "send",
                "driftscope.side_effect": True,
                "driftscope.policy.id": self.policy_id,
                "driftscope.policy.version": policy_version,
                "driftscope.policy.current_version": current["version"] if result["rejected"] else None,
                "driftscope.ticket.id": ticket_id,
                "driftscope.outcome": "rejected" if result["rejected"] else "ok",
                "driftscope.reject_reason": "superseded_policy" if result["rejected"] else None,
            },
        )
        if result["rejected"]:
            logger.info(
                "message on %s refused: policy %s superseded by %s",
                ticket_id,
                policy_version,
                current["version"],
            )
        return result
