"""A scripted stand-in for an OpenAI-compatible chat-completions client (no network, no key).

Frameworks that talk to ``client.chat.completions.create`` (smolagents' OpenAIModel, ...) get the
next scripted reply from a list; running out of script is an error, so a run that takes a step
the script did not plan fails loudly instead of looping.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any


def say(text: str) -> dict[str, Any]:
    """A scripted assistant message with text content."""
    return {"content": text, "tool_calls": None}


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    """A scripted assistant message calling one tool."""
    return {
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


class ScriptExhaustedError(RuntimeError):
    pass


class _Completions:
    def __init__(self, owner: str, script: list[dict[str, Any]]) -> None:
        self.owner = owner
        self.script = list(script)

    def create(self, **_kwargs: Any) -> SimpleNamespace:
        if not self.script:
            raise ScriptExhaustedError(f"the scripted model of {self.owner} has no reply left")
        reply = self.script.pop(0)
        message = SimpleNamespace(role="assistant", content=reply["content"], tool_calls=reply["tool_calls"])
        text = reply["content"] or json.dumps(reply["tool_calls"])
        return SimpleNamespace(
            id="chatcmpl-scripted",
            model="scripted-model",
            choices=[SimpleNamespace(index=0, message=message, finish_reason="stop")],
            usage=SimpleNamespace(
                prompt_tokens=200, completion_tokens=max(1, len(text) // 4), total_tokens=0
            ),
        )


class ScriptedClient:
    """``client.chat.completions.create(**kwargs)`` answering from a script."""

    def __init__(self, owner: str, script: list[dict[str, Any]]) -> None:
        self.chat = SimpleNamespace(completions=_Completions(owner, script))

    @property
    def remaining(self) -> int:
        return len(self.chat.completions.script)
