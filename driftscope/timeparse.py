"""Parse the time-window parameters shared by the read API, the CLI and reports."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_RELATIVE = re.compile(r"^(\d{1,7})(s|m|h|d|w)$")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_instant(name: str, raw: str, now: datetime | None = None) -> datetime:
    """A naive-UTC datetime from ISO-8601 (``2026-11-30T10:00:00Z``), epoch seconds, or a
    duration ago (``2h`` = two hours before now). Raises ``ValueError`` with an actionable message.
    """
    text = raw.strip()
    now = now or datetime.now(UTC).replace(tzinfo=None)
    match = _RELATIVE.match(text)
    if match:
        return now - timedelta(**{_UNIT[match.group(2)]: int(match.group(1))})
    if re.fullmatch(r"\d{9,11}(\.\d+)?", text):
        return datetime.fromtimestamp(float(text), UTC).replace(tzinfo=None)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"Expected {name} to be an ISO-8601 time (2026-11-30T10:00:00Z), epoch seconds, "
            f"or a duration ago such as 15m, 2h, 7d; got {raw[:60]!r}"
        ) from None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed
