"""Parse the time-window parameters shared by the read API, the CLI and reports."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_RELATIVE = re.compile(r"^(\d{1,7})(s|m|h|d|w)$", re.ASCII)
_EPOCH = re.compile(r"\d{9,11}(\.\d+)?", re.ASCII)
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_instant(name: str, raw: str, now: datetime | None = None) -> datetime:
    """A naive-UTC datetime from ISO-8601 (``2026-11-30T10:00:00Z``), epoch seconds, or a
    duration ago (``2h`` = two hours before now). Raises ``ValueError`` with an actionable message.
    """
    text = raw.strip()
    now = now or datetime.now(UTC).replace(tzinfo=None)
    match = _RELATIVE.match(text)
    if match:
        try:
            return now - timedelta(**{_UNIT[match.group(2)]: int(match.group(1))})
        except OverflowError:
            # 9999999w is before year 1: no span can be that old.
            raise ValueError(
                f"Expected {name} to be a duration ago that stays after year 1 (such as 15m, 2h, 7d "
                f"or 520w), got {raw[:60]!r}"
            ) from None
    if _EPOCH.fullmatch(text):
        try:
            return datetime.fromtimestamp(float(text), UTC).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"Expected {name} as epoch seconds before year 9999, got {raw[:60]!r}") from None
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
