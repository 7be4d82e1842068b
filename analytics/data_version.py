"""The data version of a database and the runs new spans touched since an earlier one.

Spans are only inserted, except for retention's deletes; the collector fills inherited fields
(agent, run) of earlier spans only in traces that get new spans in the same commit. So the runs
whose spans changed are the runs of the traces whose spans changed. Those traces are found among
the spans ingested from ``SLACK`` before the newest one seen last time (a batch decoded earlier
than that but committed later, or a delete, changes the total count differently from the counts
of those recent spans: then everything must be recomputed). A change of thresholds also means
everything. When the count, the newest ingested_at and the thresholds are those of the earlier
version, a fingerprint of the recent spans (their count and the sum of their trace ids' hashes)
stands in for listing them: a call on unchanged data reads two numbers, not one row per recently
ingested trace (254,440 of them on every call at 10M one-span traces). Results kept by data
version (``analytics.summary``, ``analytics.kept``) use this to recompute only the runs new spans
touched.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import duckdb
import pandas as pd

from analytics.engine import is_clickhouse

SLACK = timedelta(seconds=10)


@dataclass
class Version:
    """What a kept summary was computed from: spans, the newest ingested_at, the recent spans
    per trace (ingested from ``newest - SLACK`` on), the thresholds in force, and the recent
    spans' fingerprint (``_fingerprint``; None in a version stored before it existed)."""

    spans: int
    newest: datetime | None
    recent: dict[str, int]
    thresholds: tuple
    fingerprint: tuple[int, int] | None = None

    @property
    def bound(self) -> datetime | None:
        return None if self.newest is None else self.newest - SLACK


# A connection's identity, once found: the file it opened is the one it reads (1.4 ms a lookup,
# two per detector read).
_identities: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def database_identity(conn: duckdb.DuckDBPyConnection) -> tuple | None:
    """Identity of the database file behind ``conn``; None when it must not be cached (an
    in-memory database, a ClickHouse store: results are not kept there)."""
    if is_clickhouse(conn):
        return None
    try:
        return _identities[conn]
    except (KeyError, TypeError):  # TypeError: an object that takes no weak reference
        pass
    identity = _file_identity(conn)
    try:
        _identities[conn] = identity
    except TypeError:
        pass
    return identity


def _file_identity(conn: duckdb.DuckDBPyConnection) -> tuple | None:
    (path,) = conn.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    if not path or path == ":memory:":
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (path, stat.st_dev, stat.st_ino)


def _recent_counts(
    conn: duckdb.DuckDBPyConnection, since: datetime, bound: datetime
) -> tuple[dict[str, int], dict[str, int]]:
    """Spans per trace ingested at or after ``since``, and at or after ``bound`` (>= since)."""
    rows = conn.execute(
        "SELECT TraceId, count(*), count(*) FILTER (WHERE ingested_at >= $bound) FROM spans "
        "WHERE ingested_at >= $since GROUP BY TraceId",
        {"since": since, "bound": bound},
    ).fetchall()
    return {t: n for t, n, _ in rows}, {t: m for t, _, m in rows if m}


def _fingerprint(conn: duckdb.DuckDBPyConnection, bound: datetime) -> tuple[int, int]:
    """The spans ingested at or after ``bound``: how many, and the sum of their trace ids' hashes
    (equal for the same spans per trace, but for a hash collision)."""
    count, total = conn.execute(
        "SELECT count(*), coalesce(sum(hash(TraceId)), 0) FROM spans WHERE ingested_at >= $bound",
        {"bound": bound},
    ).fetchone()
    return int(count), int(total)


def _head(conn: duckdb.DuckDBPyConnection, floor: datetime | None) -> tuple:
    """Spans stored, the newest ingested_at (of those ingested at or after ``floor``: None when
    none is), and the thresholds' count and newest. After an insert DuckDB scans every row group
    for a max (26 ms at 10M spans, on every call until a checkpoint); from ``floor`` on, only the
    newest row groups are read (3 ms)."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM spans), "
        "(SELECT max(ingested_at) FROM spans WHERE $floor::TIMESTAMP IS NULL OR ingested_at >= $floor::TIMESTAMP), "
        "(SELECT count(*) FROM thresholds), (SELECT max(created_at) FROM thresholds)",
        {"floor": floor},
    ).fetchone()


# Within ``one_version()``: each (database, earlier version) answered once, e.g. run_summary's
# eleven detector reads after a batch, whose kept results share one version (~12 ms a read at
# 10M spans under load).
_answers: contextvars.ContextVar[dict | None] = contextvars.ContextVar("data_version_answers", default=None)


@contextlib.contextmanager
def one_version() -> Iterator[None]:
    """Within the block ``read_version`` reads each database once per earlier version and gives
    every later caller with an equal earlier version the same answer: the reads of a block (a
    run_summary and the detectors it counts, a refresh pass) whose results were kept at one
    version all see the data at one version (a result kept at another version reads on its
    own). Spans committed during the block are touched at the next read after it. Nested
    blocks are the outer one."""
    if _answers.get() is not None:
        yield
        return
    token = _answers.set({})
    try:
        yield
    finally:
        _answers.reset(token)


def read_version(
    conn: duckdb.DuckDBPyConnection, previous: Version | None
) -> tuple[Version, set[str] | None]:
    """The current version, and the traces changed since ``previous`` (None: recompute all);
    within ``one_version()`` the block's answer for an equal ``previous``."""
    answers = _answers.get()
    identity = None if answers is None else database_identity(conn)
    if identity is None:
        return _read_version(conn, previous)
    if previous is None:
        key = (identity, None)
    elif previous.fingerprint is None:  # a version stored before fingerprints: not compared
        return _read_version(conn, previous)
    else:
        key = (identity, previous.spans, previous.newest, previous.thresholds, previous.fingerprint)
    answer = answers.get(key)
    if answer is None:
        answer = answers[key] = _read_version(conn, previous)
    version, touched = answer
    return version, None if touched is None else set(touched)


def _read_version(
    conn: duckdb.DuckDBPyConnection, previous: Version | None
) -> tuple[Version, set[str] | None]:
    floor = previous.newest if previous is not None else None
    spans, newest, thresholds, newest_threshold = _head(conn, floor)
    if newest is None and floor is not None and spans:  # nothing as new as before: spans deleted
        spans, newest, thresholds, newest_threshold = _head(conn, None)
    bound = None if newest is None else newest - SLACK
    fingerprint = None if bound is None else _fingerprint(conn, bound)
    if (
        previous is not None
        and fingerprint is not None
        and (spans, newest, (thresholds, newest_threshold), fingerprint)
        == (previous.spans, previous.newest, previous.thresholds, previous.fingerprint)
    ):
        # The same spans per recent trace as before (the listing below would find none touched).
        return previous, set()
    if previous is None or previous.bound is None or newest is None or newest < previous.newest:
        recent = _recent_counts(conn, bound, bound)[1] if bound is not None else {}
        return Version(spans, newest, recent, (thresholds, newest_threshold), fingerprint), None
    since_previous, recent = _recent_counts(conn, previous.bound, bound)
    version = Version(spans, newest, recent, (thresholds, newest_threshold), fingerprint)
    if version.thresholds != previous.thresholds:
        return version, None
    # Spans ingested before the previous bound cannot have changed (no delete, no late batch)
    # when the count grew by exactly the growth of the recent spans, and no recent trace shrank.
    if spans - previous.spans != sum(since_previous.values()) - sum(previous.recent.values()):
        return version, None
    touched = set()
    for trace, count in since_previous.items():
        before = previous.recent.get(trace, 0)
        if count < before:
            return version, None
        if count > before:
            touched.add(trace)
    if any(trace not in since_previous for trace in previous.recent):
        return version, None
    return version, touched


@dataclass
class Scope:
    """The runs (and origin tasks) to recompute, and the first span of each of those runs."""

    runs: list[str]
    origin_tasks: list[str]
    first_seen: dict[str, datetime]

    @property
    def since(self) -> datetime | None:
        """No span of these runs starts earlier (older row groups can be skipped)."""
        return min(self.first_seen.values()) if self.first_seen else None


def touched_scope(conn: duckdb.DuckDBPyConnection, traces: set[str], kept_runs: pd.Index) -> Scope:
    """Runs and origin tasks whose pieces may have changed with the spans of ``traces``.

    The runs with a span in those traces (and those of the traces' own ids that are kept runs: a
    span without a run counts under its trace id until a parent gives it one, and that run then
    loses it), their origin tasks, and every run working on one of those origin tasks (its goal
    root or constraint ledger may come from them)."""
    rows = conn.execute(
        "SELECT DISTINCT run_id FROM spans WHERE TraceId = ANY($traces::VARCHAR[]) AND run_id IS NOT NULL",
        {"traces": sorted(traces)},
    ).fetchall()
    runs = {run for (run,) in rows} | set(kept_runs.intersection(list(traces)))
    rows = conn.execute(
        "SELECT DISTINCT origin_task_id FROM spans WHERE run_id = ANY($runs::VARCHAR[]) "
        "AND origin_task_id IS NOT NULL",
        {"runs": sorted(runs)},
    ).fetchall()
    tasks = sorted(task for (task,) in rows)
    if tasks:
        rows = conn.execute(
            "SELECT DISTINCT run_id FROM spans WHERE origin_task_id = ANY($tasks::VARCHAR[]) AND run_id IS NOT NULL",
            {"tasks": tasks},
        ).fetchall()
        runs |= {run for (run,) in rows}
    first = conn.execute(
        "SELECT run_id, min(Timestamp) FROM spans WHERE run_id = ANY($runs::VARCHAR[]) GROUP BY run_id",
        {"runs": sorted(runs)},
    ).fetchall()
    return Scope(sorted(runs), tasks, dict(first))
