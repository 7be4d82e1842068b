"""Value types shared by every detector: the time window, the filters, and the write hook."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb

# Runs a function on the connection of the process's single writer, in a transaction of its own,
# and returns its result (``SpanWriter.execute_write_fn`` in ``serve``). Analytics persists
# embeddings, goal scores and thresholds only through one of these; reads never write.
WriteFn = Callable[[Callable[[duckdb.DuckDBPyConnection], Any]], Any]


def direct_write(conn: duckdb.DuckDBPyConnection) -> WriteFn:
    """A ``WriteFn`` for a process that is the only writer of ``conn``'s file (offline tools,
    tests): runs each function on ``conn`` in its own transaction."""

    def write(fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        conn.execute("BEGIN TRANSACTION")
        try:
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return result

    return write


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
class Page:
    """Rows ``offset`` to ``offset + limit`` of an answer in its documented read order (the read
    API's ``?limit=&offset=``). A findings table gives just those rows (``LIMIT`` / ``OFFSET`` in
    its SELECT); an answer computed for the question is computed whole and then cut. Either way
    the answer's ``attrs["total_rows"]`` says how many rows the whole answer has."""

    limit: int | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"a page's limit must be at least 0, got {self.limit}")
        if self.offset < 0:
            raise ValueError(f"a page's offset must be at least 0, got {self.offset}")

    def cut(self, frame):
        """``frame``'s rows of this page (a pandas DataFrame), its whole length as ``total_rows``."""
        total = len(frame)
        end = None if self.limit is None else self.offset + self.limit
        page = (
            frame.iloc[self.offset : end].reset_index(drop=True)
            if (self.offset or end is not None)
            else frame
        )
        page.attrs.update(frame.attrs)
        page.attrs["total_rows"] = total
        return page


@dataclass(frozen=True)
class Filters:
    """Optional equality filters; ``None`` means no filter on that field.

    ``runs``, ``origin_tasks`` and ``from_spans`` are internal (neither the read API nor the CLI
    takes them): the materializer limits a detector to the partitions new spans touched, and a
    read limits it to the runs a window cuts, through ``runs`` / ``origin_tasks`` (the shared
    span filter, ``analytics/sql/_span_filter.sql``); ``from_spans`` computes the answer from
    the spans even where a findings table could give it (a reference for differential tests, a
    dry-run calibration under thresholds the tables were not built with)."""

    service: str | None = None
    agent: str | None = None
    run: str | None = None
    origin_task: str | None = None
    runs: tuple[str, ...] | None = None
    origin_tasks: tuple[str, ...] | None = None
    from_spans: bool = False
    # Internal, with ``runs`` or ``origin_tasks``: no span of those partitions was ingested
    # before this (``materialize.run_scope``), so the scan skips the row groups of older history.
    scope_from: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("runs", "origin_tasks"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    def reads_spans(self) -> bool:
        """Whether the answer must be computed from the spans: an internal run or origin-task
        scope, or ``from_spans`` (no findings table answers it)."""
        return self.from_spans or self.runs is not None or self.origin_tasks is not None
