"""Side-effecting tools: the idempotent guarded form and a traced wrapper for any tool call."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, MutableMapping
from typing import Any

from opentelemetry.trace import Status, StatusCode

from guards.telemetry import Telemetry, canonical_json, resolve_agent, tool_attributes

logger = logging.getLogger(__name__)

GUARD_NAME = "idempotent_tool"


class IdempotentTool:
    """A side-effecting action that runs at most once per idempotency key.

    ``seen`` maps keys to the first call's result; pass a durable mapping (for example a shelf
    or a table-backed dict) so a resumed run sees the keys of the run it resumes.
    """

    def __init__(
        self,
        name: str,
        action: Callable[[dict[str, Any]], Any],
        telemetry: Telemetry | None = None,
        *,
        seen: MutableMapping[str, Any] | None = None,
    ):
        self.name = name
        self._action = action
        self._telemetry = telemetry or Telemetry()
        self._seen: MutableMapping[str, Any] = seen if seen is not None else {}
        self._lock = threading.Lock()

    def __call__(
        self, payload: dict[str, Any], *, idempotency_key: str, agent_id: str | None = None
    ) -> dict[str, Any]:
        """Run the action once for ``idempotency_key``.

        Returns ``{"rejected": False, "result": ...}``, or for a key already used
        ``{"rejected": True, "reason": "duplicate_side_effect", "original_result": ...}``.
        """
        if not idempotency_key or not idempotency_key.strip():
            raise ValueError(f"{self.name} needs a non-empty idempotency_key")
        agent = resolve_agent(agent_id)
        attributes = {
            **tool_attributes(self.name, agent, payload, guard=GUARD_NAME),
            "driftscope.op": "send",
            "driftscope.side_effect": True,
            "driftscope.idempotency_key": idempotency_key,
        }
        with self._lock:
            duplicate = idempotency_key in self._seen
            original = self._seen.get(idempotency_key)
        if duplicate:
            result = {"rejected": True, "reason": "duplicate_side_effect", "original_result": original}
            self._telemetry.emit(
                f"execute_tool {self.name}",
                {
                    **attributes,
                    "gen_ai.tool.call.result": _json(result),
                    "driftscope.outcome": "rejected",
                    "driftscope.reject_reason": "duplicate_side_effect",
                },
            )
            logger.info("%s refused duplicate idempotency key %r", self.name, idempotency_key)
            return result
        with self._telemetry.span(f"execute_tool {self.name}", attributes) as span:
            try:
                outcome = self._action(payload)
            except Exception as exc:
                self._telemetry.set_attributes(span, {"driftscope.outcome": "error"})
                _mark_error(span, exc)
                raise
            with self._lock:
                self._seen[idempotency_key] = outcome
            result = {"rejected": False, "result": outcome}
            self._telemetry.set_attributes(
                span, {"gen_ai.tool.call.result": _json(result), "driftscope.outcome": "ok"}
            )
        return result


def traced_call(
    telemetry: Telemetry,
    tool: str,
    args: dict[str, Any],
    action: Callable[[], Any],
    *,
    agent_id: str | None = None,
    side_effect: bool = False,
    extra: dict[str, Any] | None = None,
) -> Any:
    """Run ``action()`` inside one ``execute_tool`` span (no guard): outcome ok, or error and re-raise."""
    attributes = {
        **tool_attributes(tool, resolve_agent(agent_id), args),
        "driftscope.side_effect": True if side_effect else None,
        "driftscope.op": "send" if side_effect else None,
        **(extra or {}),
    }
    with telemetry.span(f"execute_tool {tool}", attributes) as span:
        try:
            result = action()
        except Exception as exc:
            telemetry.set_attributes(
                span, {"driftscope.outcome": "error", "gen_ai.tool.call.result": str(exc)}
            )
            _mark_error(span, exc)
            raise
        telemetry.set_attributes(span, {"driftscope.outcome": "ok", "gen_ai.tool.call.result": _json(result)})
    return result


def _json(value: Any) -> str:
    return canonical_json(value)


def _mark_error(span: Any, exc: Exception) -> None:
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
