"""Pure functions that pull the task statement out of an agent's input.

Goal divergence compares task statements, never whole prompts: on real traces the shared
system-prompt boilerplate and tool transcripts dominate both texts and push every span above
the threshold. So from JSON inputs we take the task / question / query / objective /
instruction field or the last user message, from plain text we drop the preamble before a task
marker, and when we must truncate we keep the task, not the preamble.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_TASK_CHARS = 1000
# Bump when extract_task's output can change: stored goal-pair scores (analytics.goals) are keyed
# by it, so pairs are scored again with the new statements.
EXTRACTION_VERSION = 3

TASK_KEYS = (
    "task", "question", "query", "objective", "instruction", "instructions", "goal",
    "task_description", "description", "request", "user_input", "input", "prompt",
)  # fmt: skip
_USER_ROLES = {"user", "human", "humanmessage", "humanmessagechunk"}
_MESSAGE_LIST_KEYS = ("messages", "chat_history", "conversation", "history")

# "Task:", "## Task", "Your task is ...", "Question:", "Objective:", "User:" markers in prompts.
_MARKER = re.compile(
    r"(?im)^\s*(?:#+\s*)?(?:task|your task|current task|question|objective|goal|instruction|"
    r"instructions|request|user|human)\s*(?:is)?\s*[:\-]\s*"
)
_YOUR_TASK = re.compile(r"(?i)\byour (?:task|job|goal|objective) is(?: to)?\s*[:\-]?\s*")
# A line that is only a horizontal rule ends the task section a marker opens: prompt templates put
# their own instructions after it (smolagents' managed-agent prompt: "Task:\n<request>\n---\n
# You're helping your manager ... Your final_answer WILL HAVE to contain these parts ...").
_RULE_LINE = re.compile(r"(?m)^[ \t]*(?:-{3,}|\*{3,}|_{3,}|={3,})[ \t]*$")
# Where frameworks append their own instructions to the task they hand an agent (CrewAI's
# translations: `expected_output`, `task_with_context`, `task`; smolagents' managed-agent prompt):
# the statement ends before them.
_FRAMEWORK_INSTRUCTIONS = re.compile(
    r"(?:This is the expected criteria for your final answer:|This is the context you're working with:|"
    r"Begin! This is VERY important to you|You're helping your manager solve a wider task)"
)


def extract_task(value: Any, max_chars: int = MAX_TASK_CHARS) -> str | None:
    """The task statement in ``value`` (text, JSON text, dict or message list), or None."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        parsed = _parse_json(text)
        task = _task_from_structure(parsed) if parsed is not None else task_from_text(text)
    else:
        task = _task_from_structure(value)
    if task is None:
        return None
    task = _FRAMEWORK_INSTRUCTIONS.split(task, maxsplit=1)[0].strip() or task
    return truncate_task(_normalize_space(task), max_chars)


def task_from_text(text: str) -> str:
    """The part of a plain-text prompt after its last task marker (the preamble dropped), up to
    a horizontal-rule line if one closes it (the template's instructions after it dropped)."""
    markers = list(_MARKER.finditer(text))
    if markers:
        tail = text[markers[-1].end() :]
        section = _RULE_LINE.split(tail, maxsplit=1)[0].strip()
        tail = section or tail.strip()
        if tail:
            return tail
    match = _YOUR_TASK.search(text)
    if match and text[match.end() :].strip():
        return text[match.end() :].strip()
    return text


def truncate_task(text: str, max_chars: int = MAX_TASK_CHARS) -> str:
    """Shorten ``text`` to ``max_chars`` keeping the task.

    Task markers have already been applied, so what remains starts with the task when it is
    short; a long unmarked prompt usually ends with the request, so we keep its last paragraphs.
    """
    if len(text) <= max_chars:
        return text
    paragraphs = [part.strip() for part in re.split(r"\n\s*\n", text) if part.strip()]
    if len(paragraphs) > 1:
        kept: list[str] = []
        for paragraph in reversed(paragraphs):
            if sum(len(p) + 2 for p in kept) + len(paragraph) > max_chars:
                break
            kept.insert(0, paragraph)
        if kept:
            return "\n\n".join(kept)
    return text[:max_chars].rsplit(" ", 1)[0] or text[:max_chars]


def _normalize_space(text: str) -> str:
    text = re.sub(r"[ \t]+", " ", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _parse_json(text: str) -> Any | None:
    if not text or text[0] not in "{[":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _content_text(content: Any) -> str | None:
    """Text of a message content: a string, or a list of parts with 'text'."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [_content_text(part) for part in content]
        joined = "\n".join(part for part in parts if part)
        return joined or None
    if isinstance(content, dict):
        for key in ("text", "content"):
            if isinstance(content.get(key), str):
                return content[key]
    return None


def _message_role_and_text(message: Any) -> tuple[str | None, str | None]:
    """(role, text) of one chat message in the common encodings, else (None, None)."""
    if isinstance(message, list | tuple) and len(message) == 2 and isinstance(message[0], str):
        return message[0].lower(), _content_text(message[1])
    if not isinstance(message, dict):
        return None, None
    if message.get("lc") and isinstance(message.get("kwargs"), dict):  # LangChain serialized
        kwargs = message["kwargs"]
        ids = message.get("id") or []
        role = kwargs.get("type") or (ids[-1] if ids else None)
        return (str(role).lower() if role else None), _content_text(kwargs.get("content"))
    role = message.get("role") or message.get("type") or message.get("message.role")
    content = message.get("content", message.get("message.content", message.get("text")))
    if content is None and isinstance(message.get("parts"), list):
        content = message["parts"]  # GenAI semconv messages: {"role", "parts": [{"type": "text", "content"}]}
    return (str(role).lower() if role else None), _content_text(content)


def last_user_message(messages: Any) -> str | None:
    """Text of the last user/human message in a (possibly nested) message list."""
    if not isinstance(messages, list):
        return None
    flat: list[Any] = []
    for item in messages:
        if isinstance(item, list) and item and not isinstance(item[0], str):
            flat.extend(item)  # LangChain batches: [[msg, msg, ...]]
        else:
            flat.append(item)
    for message in reversed(flat):
        role, text = _message_role_and_text(message)
        if role in _USER_ROLES and text and text.strip():
            return text.strip()
    return None


def _task_from_structure(value: Any, depth: int = 0) -> str | None:
    """Task field, else last user message, searched breadth-first to a small depth."""
    if depth > 4:
        return None
    if isinstance(value, str):
        inner = _parse_json(value.strip())
        return _task_from_structure(inner, depth + 1) if inner is not None else task_from_text(value)
    if isinstance(value, list):
        found = last_user_message(value)
        if found:
            return task_from_text(found)
        for item in value:
            task = _task_from_structure(item, depth + 1)
            if task:
                return task
        return None
    if not isinstance(value, dict):
        return None
    lowered = {str(key).lower(): item for key, item in value.items()}
    for key in TASK_KEYS:
        item = lowered.get(key)
        if isinstance(item, str) and item.strip():
            return task_from_text(item.strip())
    for key in _MESSAGE_LIST_KEYS:
        found = last_user_message(lowered.get(key))
        if found:
            return task_from_text(found)
    role, text = _message_role_and_text(value)
    if role in _USER_ROLES and text:
        return task_from_text(text)
    for item in value.values():
        if isinstance(item, dict | list):
            task = _task_from_structure(item, depth + 1)
            if task:
                return task
    for key in TASK_KEYS:
        item = lowered.get(key)
        if isinstance(item, dict | list):
            task = _task_from_structure(item, depth + 1)
            if task:
                return task
    return None
