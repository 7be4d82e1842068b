"""Which tool calls have side effects, for ``duplicate_side_effects``.

A span's explicit ``driftscope.side_effect`` (the guards set it) always decides, ``false``
included. Framework tool calls carry no such attribute, so for them the detector reads the tool's
MCP annotations (``readOnlyHint`` / ``destructiveHint``) where recorded, else the tool name (at
query time: a changed setting applies to the spans already stored). A name is turned
into its lower-case words joined by ``_`` (``sendEmail``, ``send-email`` and ``Send Email`` all
read ``send_email``); the pattern is an RE2 regular expression matched (anywhere, as
``regexp_matches``) against the name as written or against those words.

The default pattern finds a side-effecting verb as a whole word (``send_report``,
``create-ticket``, ``slack_post_message``); names that begin with a read-only verb
(``get_order``, ``search_email``) and the OpenAI Agents SDK's hand-off tools
(``transfer_to_<agent>``) are excluded. A configured pattern (``--side-effect-tools``) replaces
both: it lists a crew's own side-effecting tools and nothing else is inferred.

The setting is process-wide: ``driftscope serve`` configures it once at start-up, so the read
API (and the dashboard and reports reading through it) use that value; a process reading a
database file configures it the same way from the same setting.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import duckdb

# Verbs whose call changes something outside the agent: messages, money, bookings, records,
# files, deployments. Matched as whole words of the normalized name.
SIDE_EFFECT_VERBS = (
    "send", "email", "mail", "notify", "message", "sms", "text_message", "reply", "forward",
    "post", "publish", "tweet", "share", "broadcast", "alert", "page",
    "pay", "charge", "refund", "transfer", "withdraw", "deposit", "invoice", "bill",
    "book", "reserve", "order", "purchase", "buy", "checkout", "cancel", "subscribe",
    "unsubscribe", "enroll", "register", "invite", "schedule",
    "create", "insert", "delete", "remove", "drop", "update", "upsert", "patch", "put", "set",
    "write", "save", "upload", "modify", "edit", "rename", "move", "archive", "close",
    "submit", "approve", "reject", "assign", "escalate", "dispatch", "ship",
    "deploy", "release", "rollback", "merge", "push", "commit", "provision", "terminate",
    "restart", "grant", "revoke",
)  # fmt: skip
# A name that begins with one of these only reads (``get_order``, ``search_email``).
READ_ONLY_VERBS = (
    "search", "get", "read", "fetch", "list", "lookup", "look_up", "query", "find", "check",
    "count", "describe", "view", "show", "load", "retrieve", "browse", "inspect", "preview",
    "validate", "verify", "compute", "calculate", "estimate", "summarize", "ask", "consult",
    "is", "has", "can",
)  # fmt: skip

# The hand-off tools of LangGraph supervisors and swarms and of OpenAI Agents are named
# transfer_to_<agent> (analytics.loops reads them as hand-offs).
HANDOFF_TOOL_PREFIX = "transfer_to_"

DEFAULT_PATTERN = r"(^|_)(" + "|".join(SIDE_EFFECT_VERBS) + r")(_|$)"
# Read-only first words, and hand-offs between agents, are no side effect.
DEFAULT_EXCLUDE = r"^((" + "|".join(READ_ONLY_VERBS) + r")(_|$)|" + HANDOFF_TOOL_PREFIX + ")"


@dataclass(frozen=True)
class SideEffectTools:
    """Tool names treated as side-effecting when a span does not say (``driftscope.side_effect``).

    ``pattern`` and ``exclude`` are RE2 expressions matched against the tool name and its
    normalized words; ``exclude`` (None: nothing) wins over ``pattern``.
    """

    pattern: str
    exclude: str | None
    configured: bool  # False: the documented default

    def params(self) -> dict[str, str | None]:
        """The SQL parameters of ``duplicate_side_effects``."""
        return {"side_effect_tools": self.pattern, "side_effect_exclude": self.exclude}


DEFAULT = SideEffectTools(DEFAULT_PATTERN, DEFAULT_EXCLUDE, configured=False)

_lock = threading.Lock()
_current = DEFAULT


def check_pattern(pattern: str) -> str:
    """Return ``pattern`` if DuckDB's RE2 compiles it; raise ``ValueError`` saying why if not."""
    if not pattern.strip():
        raise ValueError(
            "the side-effect tool pattern is empty; give a regular expression such as '^(send_report|file_claim)$'"
        )
    try:
        duckdb.execute("SELECT regexp_matches('', ?)", [pattern]).fetchone()
    except duckdb.Error as exc:
        raise ValueError(f"{pattern!r} is not a valid RE2 regular expression ({exc})") from None
    return pattern


def side_effect_tools_for(pattern: str | None) -> SideEffectTools:
    """The setting for ``pattern`` (None: the default); raises ``ValueError`` for a bad pattern."""
    if pattern is None:
        return DEFAULT
    return SideEffectTools(check_pattern(pattern), None, configured=True)


def configure_side_effect_tools(pattern: str | None) -> SideEffectTools:
    """Set this process's side-effect tool pattern (None: back to the default) and return it."""
    global _current
    tools = side_effect_tools_for(pattern)
    with _lock:
        _current = tools
    return tools


def current_side_effect_tools() -> SideEffectTools:
    """The side-effect tool pattern in force in this process."""
    return _current
