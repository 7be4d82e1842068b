"""Value types shared by every detector: the time window and the filters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime


def _naive_utc(value: datetime | None) -> datetime | None:
    """Return ``value`` as a naive UTC datetime (spans.Timestamp is naive UTC)."""
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class Window:
    """Half-open time window ``[since, until)`` on span start; ``None`` leaves a side open."""

    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "since", _naive_utc(self.since))
        object.__setattr__(self, "until", _naive_utc(self.until))


@dataclass(frozen=True)
class Filters:
    """Optional equality filters; ``None`` means no filter on that field."""

    service: str | None = None
    agent: str | None = None
    run: str | None = None
    origin_task: str | None = None
