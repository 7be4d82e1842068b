"""The unguarded anti-patterns, instrumented but not enforced.

These are what crews commonly use and what the guards replace. They emit spans with the same
descriptive fields (key, observed version, task, hop, policy version) but no guard fields: no
``driftscope.guard``, no expected version, no constraint ledger, never ``outcome=rejected``. The
simulator uses them to produce the failures they let through, so the detectors have something to
find.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import Any

from guards.telemetry import Telemetry, content_hash, resolve_agent, tool_attributes

logger = logging.getLogger(__name__)


class PlainStore:
    """Unversioned get/set: last writer wins, nobody notices. Observed versions are content hashes."""

    def __init__(self, telemetry: Telemetry | None = None):
        self._telemetry = telemetry or Telemetry()
        self._data: dict[str, Any] = {}

    def get(self, key: str, *, agent_id: str | None = None) -> Any:
        """Return the value (None when missing)."""
        value = self._data.get(key)
        self._telemetry.emit(
            "execute_tool get",
            {
                **tool_attributes("get", agent_id, {"key": key}, value),
                "driftscope.op": "read",
                "driftscope.state.key": key,
                "driftscope.state.version": content_hash(value) if key in self._data else None,
                "driftscope.outcome": "ok",
            },
        )
        return value

    def set(self, key: str, value: Any, *, agent_id: str | None = None) -> None:
        """Overwrite the value."""
        self._data[key] = value
        self._telemetry.emit(
            "execute_tool set",
            {
                **tool_attributes("set", agent_id, {"key": key, "value": value}, None),
                "driftscope.op": "write",
                "driftscope.state.key": key,
                "driftscope.state.version": content_hash(value),
                "driftscope.outcome": "ok",
            },
        )


class Scratchpad:
    """Append-only shared notes: contradictory entries pile up and readers pick whichever."""

    def __init__(self, telemetry: Telemetry | None = None, *, name: str = "scratchpad"):
        self._telemetry = telemetry or Telemetry()
        self.key = name
        self._notes: list[str] = []

    def append(self, note: str, *, agent_id: str | None = None) -> int:
        """Add a note; returns the number of notes."""
        self._notes.append(note)
        self._telemetry.emit(
            "execute_tool scratchpad_append",
            {
                **tool_attributes("scratchpad_append", agent_id, {"note": note}, len(self._notes)),
                "driftscope.op": "write",
                "driftscope.state.key": self.key,
                "driftscope.state.version": content_hash(self._notes),
                "driftscope.outcome": "ok",
            },
        )
        return len(self._notes)

    def read_all(self, *, agent_id: str | None = None) -> list[str]:
        """Every note so far."""
        notes = list(self._notes)
        self._telemetry.emit(
            "execute_tool scratchpad_read",
            {
                **tool_attributes("scratchpad_read", agent_id, {}, notes),
                "driftscope.op": "read",
                "driftscope.state.key": self.key,
                "driftscope.state.version": content_hash(notes),
                "driftscope.outcome": "ok",
            },
        )
        return notes


class MergingStore(PlainStore):
    """``update`` shallow-merges dicts silently: concurrent edits of one field overwrite each other."""

    def update(self, key: str, partial: dict[str, Any], *, agent_id: str | None = None) -> dict[str, Any]:
        """Merge ``partial`` into the stored dict and return the result."""
        merged = {**(self._data.get(key) or {}), **partial}
        self._data[key] = merged
        self._telemetry.emit(
            "execute_tool update",
            {
                **tool_attributes("update", agent_id, {"key": key, "partial": partial}, merged),
                "driftscope.op": "write",
                "driftscope.state.key": key,
                "driftscope.state.version": content_hash(merged),
                "driftscope.outcome": "ok",
            },
        )
        return merged


class ForceStore:
    """A versioned store with a ``force=True`` escape hatch that agents learn to always pass."""

    def __init__(self, telemetry: Telemetry | None = None, *, salt: str | None = None):
        self._telemetry = telemetry or Telemetry()
        self._salt = salt if salt is not None else secrets.token_hex(16)
        self._sequence = 0
        self._data: dict[str, tuple[Any, str]] = {}

    def read(self, key: str, *, agent_id: str | None = None) -> tuple[Any, str | None]:
        """Return ``(value, version)``."""
        value, version = self._data.get(key, (None, None))
        self._telemetry.emit(
            "execute_tool read",
            {
                **tool_attributes("read", agent_id, {"key": key}, {"value": value, "version": version}),
                "driftscope.op": "read",
                "driftscope.state.key": key,
                "driftscope.state.version": version,
                "driftscope.outcome": "ok",
            },
        )
        return value, version

    def write(
        self,
        key: str,
        value: Any,
        expected_version: str | None = None,
        force: bool = False,
        *,
        agent_id: str | None = None,
    ) -> str:
        """Write; a stale ``expected_version`` raises unless ``force=True``, which skips the check."""
        _, current = self._data.get(key, (None, None))
        if not force and expected_version != current:
            # the tool fails (an error, not a guard rejection); agents learn to retry with force=True
            message = f"stale write to {key!r}"
            self._telemetry.emit(
                "execute_tool write",
                {
                    **tool_attributes(
                        "write",
                        agent_id,
                        {"key": key, "value": value, "expected_version": expected_version, "force": force},
                        message,
                    ),
                    "driftscope.op": "write",
                    "driftscope.state.key": key,
                    "driftscope.outcome": "error",
                },
                error=message,
            )
            raise RuntimeError(message)
        self._sequence += 1
        version = hashlib.sha256(f"{self._salt}|{key}|{self._sequence}".encode()).hexdigest()[:20]
        self._data[key] = (value, version)
        arguments = {"key": key, "value": value, "expected_version": expected_version, "force": force}
        self._telemetry.emit(
            "execute_tool write",
            {
                **tool_attributes("write", agent_id, arguments, version),
                "driftscope.op": "write",
                "driftscope.state.key": key,
                "driftscope.state.version": version,
                "driftscope.outcome": "ok",
            },
        )
        return version


class FreeTextDelegation:
    """``delegate(subtask, context)``: constraints travel as prose and can silently fall out."""

    def __init__(self, telemetry: Telemetry | None = None):
        self._telemetry = telemetry or Telemetry()
        self._tasks: dict[str, dict[str, Any]] = {}

    def open_task(self, task_id: str, goal: str) -> None:
        """Remember a root task so hops and the root goal can be recorded (emits no span)."""
        self._tasks[task_id] = {"origin": task_id, "hop": 0, "goal": goal, "children": 0}

    def delegate(
        self,
        subtask: str,
        context: str,
        *,
        to_agent: str,
        parent_task_id: str,
        agent_id: str | None = None,
    ) -> str:
        """Hand ``subtask`` with free-text ``context`` to ``to_agent``; returns the new task id."""
        parent = self._tasks[parent_task_id]
        parent["children"] += 1
        task_id = f"{parent_task_id}.{parent['children']}"
        origin = self._tasks[parent["origin"]]
        self._tasks[task_id] = {
            "origin": parent["origin"],
            "hop": parent["hop"] + 1,
            "goal": subtask,
            "children": 0,
        }
        arguments = {"subtask": subtask, "context": context, "to": to_agent}
        self._telemetry.emit(
            "execute_tool delegate",
            {
                **tool_attributes("delegate", resolve_agent(agent_id), arguments, {"task_id": task_id}),
                "driftscope.op": "delegate",
                "driftscope.task.id": task_id,
                "driftscope.task.origin_id": parent["origin"],
                "driftscope.task.parent_id": parent_task_id,
                "driftscope.hop": parent["hop"] + 1,
                "driftscope.delegate.to": to_agent,
                "driftscope.goal.root": origin["goal"],
                "driftscope.goal.text": subtask,
                "driftscope.outcome": "ok",
            },
        )
        return task_id


class UnguardedOutbox:
    """Customer messages sent without checking the policy they were drafted against."""

    def __init__(self, telemetry: Telemetry | None = None):
        self._telemetry = telemetry or Telemetry()
        self.outbox: list[dict[str, Any]] = []

    def send_customer_message(
        self, ticket_id: str, body: str, policy_version: str | None = None, *, agent_id: str | None = None
    ) -> dict[str, Any]:
        """Send; ``policy_version`` is only recorded."""
        message_id = f"msg-{len(self.outbox) + 1}"
        self.outbox.append({"message_id": message_id, "ticket_id": ticket_id, "body": body})
        result = {"message_id": message_id}
        arguments = {"ticket_id": ticket_id, "body": body, "policy_version": policy_version}
        self._telemetry.emit(
            "execute_tool send_customer_message",
            {
                **tool_attributes("send_customer_message", agent_id, arguments, result),
                "driftscope.op": "send",
                "driftscope.side_effect": True,
                "driftscope.policy.version": policy_version,
                "driftscope.ticket.id": ticket_id,
                "driftscope.outcome": "ok",
            },
        )
        return result
