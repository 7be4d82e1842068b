"""Versioned shared state: compare-and-set writes with opaque version tokens.

A write names the version it was based on; if someone else wrote in between, the write is
rejected and the caller gets the current value and version back so it can redo its work. There
is no ``force`` flag: overriding is :meth:`VersionedStore.override_state`, which records who forced
it and why.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from typing import Any

from guards.telemetry import Telemetry, canonical_json, resolve_agent, tool_attributes

logger = logging.getLogger(__name__)

GUARD_NAME = "versioned_store"


class VersionedStore:
    """Key-value state shared by agents, with optimistic concurrency.

    Version tokens are opaque strings (a hash of a per-store salt, a sequence number and the
    value), never counters: callers cannot guess the next one or compare them by size. Pass
    ``salt`` only to make tokens reproducible (the simulator does); by default it is random.
    """

    def __init__(self, telemetry: Telemetry | None = None, *, salt: str | None = None, name: str = "state"):
        self._telemetry = telemetry or Telemetry()
        self._salt = salt if salt is not None else secrets.token_hex(16)
        self._name = name
        self._lock = threading.Lock()
        self._sequence = 0
        self._data: dict[str, tuple[Any, str]] = {}

    def _next_token(self, key: str, value: Any) -> str:
        self._sequence += 1
        material = f"{self._salt}|{self._name}|{key}|{self._sequence}|{canonical_json(value)}"
        return hashlib.sha256(material.encode()).hexdigest()[:20]

    def read_state(self, key: str, *, agent_id: str | None = None) -> dict[str, Any]:
        """Return ``{"value": ..., "version": token}``; a missing key reads as value and version None."""
        with self._lock:
            value, version = self._data.get(key, (None, None))
        result = {"value": value, "version": version}
        self._telemetry.emit(
            "execute_tool read_state",
            {
                **tool_attributes("read_state", agent_id, {"key": key}, result, guard=GUARD_NAME),
                "driftscope.op": "read",
                "driftscope.state.key": key,
                "driftscope.state.version": version,
                "driftscope.outcome": "ok",
            },
        )
        return result

    def write_state(
        self, key: str, value: Any, expected_version: str | None, *, agent_id: str | None = None
    ) -> dict[str, Any]:
        """Write ``value`` if the key is still at ``expected_version`` (None: the key must not exist).

        Returns ``{"rejected": False, "version": new_token}``, or on a stale base
        ``{"rejected": True, "reason": "version_conflict", "current_value": ..., "current_version": ...}``.
        """
        with self._lock:
            current_value, current_version = self._data.get(key, (None, None))
            if current_version != expected_version:
                result: dict[str, Any] = {
                    "rejected": True,
                    "reason": "version_conflict",
                    "current_value": current_value,
                    "current_version": current_version,
                }
                new_version = None
            else:
                new_version = self._next_token(key, value)
                self._data[key] = (value, new_version)
                result = {"rejected": False, "version": new_version}
        arguments = {"key": key, "value": value, "expected_version": expected_version}
        attributes = {
            **tool_attributes("write_state", agent_id, arguments, result, guard=GUARD_NAME),
            "driftscope.op": "write",
            "driftscope.state.key": key,
            "driftscope.state.expected_version": expected_version if expected_version is not None else "",
            "driftscope.state.version": new_version,
            "driftscope.outcome": "rejected" if result["rejected"] else "ok",
            "driftscope.reject_reason": "version_conflict" if result["rejected"] else None,
            "driftscope.state.current_version": current_version if result["rejected"] else None,
        }
        self._telemetry.emit("execute_tool write_state", attributes)
        if result["rejected"]:
            logger.info(
                "write to %r rejected: based on %r, current %r", key, expected_version, current_version
            )
        return result

    def override_state(
        self, key: str, value: Any, *, forced_by: str, reason: str, agent_id: str | None = None
    ) -> dict[str, Any]:
        """Write ``value`` regardless of version, recording who forced it and why.

        Returns ``{"rejected": False, "version": new_token, "previous_version": old_token}``.
        """
        if not forced_by or not forced_by.strip():
            raise ValueError("override_state needs forced_by: the person or agent taking responsibility")
        if not reason or not reason.strip():
            raise ValueError("override_state needs a non-empty reason")
        with self._lock:
            _, previous_version = self._data.get(key, (None, None))
            new_version = self._next_token(key, value)
            self._data[key] = (value, new_version)
        result = {"rejected": False, "version": new_version, "previous_version": previous_version}
        arguments = {"key": key, "value": value, "forced_by": forced_by, "reason": reason}
        self._telemetry.emit(
            "execute_tool override_state",
            {
                **tool_attributes(
                    "override_state", resolve_agent(agent_id), arguments, result, guard=GUARD_NAME
                ),
                "driftscope.op": "write",
                "driftscope.state.key": key,
                "driftscope.state.version": new_version,
                "driftscope.state.previous_version": previous_version,
                "driftscope.forced_by": forced_by,
                "driftscope.override.reason": reason,
                "driftscope.outcome": "ok",
            },
        )
        return result
