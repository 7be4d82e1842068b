"""Live findings: each maintained detector's findings are a table, brought up to date as spans commit.

The collector's writer logs, in the transaction of every commit, the runs and origin tasks it
touched (``change_log`` / ``change_partitions``). The ``Materializer`` reads that log in order and,
per detector, recomputes only the partitions listed since the change its table reflects: a
detector registered with a partition key (``run_id`` or ``origin_task_id``: each finding follows
from that partition's spans alone) gets those partitions' rows deleted and inserted again; one
without (its answer depends on every run) is recomputed whole, under ingest at most once per
``WHOLE_COST_RATIO`` times its last computation (``WholeSchedule``). Every write (rows and the
``findings_state`` row saying which change they reflect) is one transaction of the single
writer, so a kill at any point leaves tables and state that agree, and the next pass resumes
from the log.

Reads (``read_findings``) are SELECTs over those tables, with the state's "as of"; a read the
tables cannot answer (a window that cuts runs, a service or agent filter, a detector not yet
built) returns None and the caller computes it. ``maintained`` lists what is kept, from the
registry: a detector's ``kept`` fact names its partition, its ``version`` rebuilds its table.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from analytics.engine import fetch_rows, has_tables, is_clickhouse
from analytics.side_effects import current_side_effect_tools
from analytics.sql_loader import memory_cursor, quote_identifier
from analytics.types import Filters, Page, Window, WriteFn

logger = logging.getLogger(__name__)

TABLE_PREFIX = "findings__"
# Position of a row in the computation that produced it (its detector's order within a chunk).
POSITION = "_pos"
# Partitions recomputed in one statement and one write (a full build goes chunk by chunk).
CHUNK_KEYS = 2_000
# Past MANY_KEYS touched partitions, and at least MANY_SHARE of all, one unscoped computation
# replaces the table: a scan comparing every span's run with a list of a thousand costs more
# than the rows it saves. Only up to UNSCOPED_MAX_SPANS stored spans: past it, chunks of
# partitions bound what one computation holds in memory.
MANY_KEYS = 200
MANY_SHARE = 0.5
UNSCOPED_MAX_SPANS = 2_000_000
# A detector whose answer depends on every run is recomputed whole; under ingest, at most once
# per WHOLE_COST_RATIO times its last computation took, and never twice within
# WHOLE_MIN_INTERVAL_S: such results take at most a fifth of the materializer's time, and the
# cheap ones follow every pass. (A fixed 5 s held them to every other pass at 1M stored spans,
# where they take 0.1-0.3 s: the findings lag, the oldest result's, doubled with them.)
WHOLE_COST_RATIO = 5.0
WHOLE_MIN_INTERVAL_S = 1.0
WHOLE_COST_SAMPLES = 3
PARTITIONS = ("run_id", "origin_task_id", "run_tool", "span")
# A 'run_tool' key (collector.changes): "<run>\x1f<tool>" names one (run, tool) group of a
# result with run_id and tool_name columns; "<run>\x1f*" every group of the run.
RUN_TOOL_SEP = "\x1f"
RUN_TOOL_COLUMNS = ("run_id", "tool_name")
# The (run, tool) keys the spans committed after change $after up to $upto have now: every name a
# span is, or can change, a call of. The writer logs the keys a changed span had before
# (collector.changes, the same expression: analytics does not import the collector;
# tests/analytics/test_materialize.py holds the two together).
RUN_TOOL_KEYS_SQL = """
SELECT DISTINCT run_id || chr(31) || tool AS key FROM (
    SELECT run_id,
           unnest([tool_name, delegate_to, agent_id,
                   CASE WHEN span_family = 'agent' THEN coalesce(agent_id, agent_name, SpanName) END,
                   CASE WHEN span_family = 'llm'
                             AND (contains(output_text, '<code>') OR contains(output_text, '```')) THEN '*' END]) AS tool
    FROM spans s
    WHERE run_id IS NOT NULL
      AND s.ingested_at >= $since_ingested
      AND EXISTS (SELECT 1 FROM span_changes c WHERE c.seq > $after AND c.seq <= $upto
                  AND c.TraceId = s.TraceId AND c.SpanId = s.SpanId)
)
WHERE tool IS NOT NULL
"""
# A 'span' result holds a row per span (TraceId, SpanId): per-span state a pass folds the spans
# of ``span_changes`` into (SpanChanges) instead of reading every span of a touched run.


@dataclass(frozen=True)
class SpanChanges:
    """The spans committed (stored, changed or deleted) after change ``after`` up to ``upto``,
    as a 'span' result's ``compute`` is given them: its rows for those of them still stored.
    ``since``: a lower bound on their ``ingested_at`` (the writer's: the change log's
    ``oldest_ingested``; None: unknown), so a read of them from ``spans`` scans only the newest
    row groups (``bounded_params``; docs/performance.md, Live at 10M);
    ``only_new``: none of them was stored before, so no per-span state holds one yet."""

    after: int
    upto: int
    since: datetime | None = None
    only_new: bool = False

    def sql(self) -> str:
        """A relation of their (TraceId, SpanId), bound with ``params``."""
        return "(SELECT DISTINCT TraceId, SpanId FROM span_changes WHERE seq > $after AND seq <= $upto)"

    def params(self) -> dict[str, int]:
        return {"after": self.after, "upto": self.upto}

    def bounded_params(self) -> dict[str, Any]:
        """``params`` and ``since_ingested``, for SQL that also filters its spans on
        ``ingested_at >= $since_ingested``."""
        return {**self.params(), "since_ingested": self.since or datetime.min}


def span_changes(conn: duckdb.DuckDBPyConnection, after: int, upto: int) -> SpanChanges:
    """``SpanChanges`` of the changes after ``after`` up to ``upto``, with the bounds the change
    log holds for the changes that list spans (none known when one of them has none)."""
    ((unknown, oldest, only_new),) = conn.execute(
        "SELECT count(*) FILTER (WHERE oldest_ingested IS NULL), min(oldest_ingested), "
        "coalesce(bool_and(coalesce(only_new, false)), true) "
        "FROM change_log WHERE seq > $after AND seq <= $upto AND kind IN ('spans', 'delete')",
        {"after": after, "upto": upto},
    ).fetchall()
    return SpanChanges(after, upto, None if unknown else oldest, bool(only_new))


# The keys of a partition the changes after $after up to $upto logged, but those of the changes
# of spans every one of which was first stored after a fold's mark ($mark: the newest
# ``ingested_at`` its reads could have seen), which the fold never folded, so nothing of them is
# in the keys they left; with $adds_only, nor those of the changes whose walks only gave spans an
# agent or run they had none of (``change_log.walks_add_only``). Deletions always count, and
# every key counts while the fold has no mark.
_FOLDED_KEYS_SQL = """
WITH firsts AS (
    SELECT c.seq, min(s.ingested_at) AS first
    FROM span_changes c JOIN spans s ON s.TraceId = c.TraceId AND s.SpanId = c.SpanId
    WHERE c.seq > $after AND c.seq <= $upto AND s.ingested_at >= $since_ingested
    GROUP BY c.seq
)
SELECT p.key
FROM change_partitions p
LEFT JOIN change_log l ON l.seq = p.seq
LEFT JOIN firsts f ON f.seq = p.seq
WHERE p.seq > $after AND p.seq <= $upto AND p.partition = $partition
GROUP BY p.key
HAVING NOT bool_and(coalesce(l.kind = 'spans' AND (f.first > $mark::TIMESTAMP OR ($adds_only AND l.walks_add_only)),
                             false))
"""


def keys_of_folded_changes(
    conn: duckdb.DuckDBPyConnection,
    partition: str,
    changes: SpanChanges,
    mark: datetime | None,
    adds_only: bool = False,
) -> list[str]:
    """The ``partition`` keys of ``changes`` that a fold with ``mark`` must compute again from
    their spans (``_FOLDED_KEYS_SQL``): the others' spans it takes in as new ones."""
    params = {**changes.bounded_params(), "mark": mark, "partition": partition, "adds_only": adds_only}
    return [row[0] for row in conn.execute(_FOLDED_KEYS_SQL, params).fetchall()]


# A fold's mark: the newest ``ingested_at`` its reads could have seen (a span stored at or
# before it may be in its state already), kept in a one-row table of its own.
def read_mark(conn: duckdb.DuckDBPyConnection, floor: datetime | None) -> datetime | None:
    """The newest ``ingested_at`` stored now (at least ``floor``): read after a fold's reads, it
    bounds every span they saw (a span committed later may have been ingested earlier: it is
    then taken as maybe folded, which only keeps its keys)."""
    ((newest,),) = conn.execute(
        "SELECT max(ingested_at) FROM spans WHERE ingested_at >= $floor", {"floor": floor or datetime.min}
    ).fetchall()
    if newest is None:
        return floor
    return newest if floor is None else max(newest, floor)


def kept_mark(conn: duckdb.DuckDBPyConnection, table: str) -> datetime | None:
    """The mark a fold last wrote to ``table`` (None: none yet, unknown)."""
    if not table_exists(conn, table):
        return None
    return conn.execute(f"SELECT max(ingested) FROM {quote_identifier(table)}").fetchall()[0][0]


def write_mark(conn: duckdb.DuckDBPyConnection, table: str, mark: datetime | None) -> None:
    """In the writer's transaction, with the fold's rows: its new mark."""
    conn.execute(
        f"CREATE OR REPLACE TABLE {quote_identifier(table)} AS SELECT $mark::TIMESTAMP AS ingested",
        {"mark": mark},
    )


class WholeSchedule:
    """``whole_due`` of a materializer: a result kept whole is recomputed under ingest at most
    once per ``WHOLE_COST_RATIO`` times what it costs (the least of its last
    ``WHOLE_COST_SAMPLES`` computations: ``took``), and at most every ``WHOLE_MIN_INTERVAL_S``
    (called as it is about to be). One computation held up by a checkpoint or a burst does not
    hold the result (and the findings lag, the oldest result's) for five times the stall."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._costs: dict[str, deque[float]] = {}

    def __call__(self, name: str) -> bool:
        now = time.monotonic()
        costs = self._costs.get(name)
        wait = max(WHOLE_MIN_INTERVAL_S, WHOLE_COST_RATIO * (min(costs) if costs else 0.0))
        if now - self._at.get(name, -1e9) < wait:
            return False
        self._at[name] = now
        return True

    def took(self, seconds: dict[str, float]) -> None:
        """What a pass's computations took, per result (``PassReport.compute_seconds``)."""
        for name, spent in seconds.items():
            self._costs.setdefault(name, deque(maxlen=WHOLE_COST_SAMPLES)).append(spent)


class Stopping(Exception):
    """Raised before a result's computation once the materializer is asked to stop."""


# Passes that recomputed something between two prunes of the consumed change log.
PRUNE_EVERY = 20
# Ingest first: while INGEST_BACKLOG or more requests wait for the writer and the writer spent
# INGEST_SHARE or more of the last INGEST_SHARE_WINDOW_S seconds committing spans (ingest at the
# store's capacity, a burst), the materializer waits between results (INGEST_POLL_S at a time)
# instead of taking the cores ingest needs, but never more than INGEST_MAX_DEFER_S in one pass:
# under sustained saturation the findings still move, only later (the lag says so). A steady
# stream below capacity shows brief backlogs too (queued behind one commit or one of the
# materializer's writes) with the writer committing spans well under INGEST_SHARE of the time;
# the measured shares of both are in docs/performance.md ("Live incident").
INGEST_BACKLOG = 2
INGEST_SHARE = 0.6
INGEST_SHARE_WINDOW_S = 3.0
INGEST_POLL_S = 0.25
INGEST_MAX_DEFER_S = 10.0

# A result's rows: a DataFrame, or an Arrow table (what a large first build is computed as).
Compute = Callable[[duckdb.DuckDBPyConnection, str | None, list[str] | None], pd.DataFrame | pa.Table]
ExtraKeys = Callable[[duckdb.DuckDBPyConnection], list[str]]
Depends = tuple[str, ...] | Callable[[], tuple[str, ...]]


@dataclass(frozen=True)
class Maintained:
    """A result the materializer keeps in ``findings__<name>``.

    ``partition``: the column its rows are partitioned by (None: recomputed whole); ``compute``:
    ``(conn, partition, keys)`` -> its rows for those partitions (all when ``keys`` is None);
    ``order``: the read order, (column, descending) pairs; ``version``: its definition's version;
    ``detector``: the registered detector (``(conn, window, filters)``), for the runs a window cuts;
    ``depends``: results brought up to date before this one in a pass (its ``compute`` reads
    their tables); ``extra_keys(conn)``: partitions to recompute besides the ones the change log
    names (a result assembled from other tables: the partitions whose inputs those changed).
    """

    name: str
    partition: str | None
    compute: Compute
    order: tuple[tuple[str, bool], ...]
    version: str
    detector: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame] | None = None
    depends: tuple[str, ...] = ()
    extra_keys: ExtraKeys | None = None
    # A 'span' result that folds changes into its table itself: ``compute`` returns what changes
    # and ``apply(conn, that)`` writes it in the writer's transaction (analytics.loops_fold).
    apply: Callable[[duckdb.DuckDBPyConnection, Any], None] | None = None
    # A 'span' result's first build in parts, each written before the next is computed (what a
    # build holds is one part, not the store); without it, ``compute(conn, "span", None)``.
    # Called as ``build(conn, target)``: the change the build reflects. Its parts are what
    # ``apply`` takes, or (without ``apply``) rows: the first part's replace the table, the
    # others' are added (``run_chunks`` splits the store into runs of a bounded size).
    build: Callable[[duckdb.DuckDBPyConnection, int], Iterable[Any]] | None = None
    # The partitions changed after change ``after`` up to ``upto``, when a result knows them
    # better than the change log (a result of another's table: the partitions that table's fold
    # says it changed): ``touched(conn, after, upto)``; None from it: every partition.
    touched: Callable[[duckdb.DuckDBPyConnection, int, int], list[str] | None] | None = None
    # Whether a result reading ``depends`` reads them in a way either engine's tables answer
    # (``read_findings``, or on ClickHouse SQL over their current versions), so ClickHouse keeps
    # it as here; otherwise ClickHouse computes it from the spans (its ``compute`` reads DuckDB's
    # tables directly).
    portable: bool = False
    # Whether a run's rows come from that run's spans alone, so that a window holding the run
    # whole reads them from the table (``read_window``). Not so for a result assembled from
    # results keyed otherwise: run_summary counts constraint drops per origin task (other runs'
    # spans) and runaway runs against the crew's median in the window.
    run_local: bool = True

    @property
    def table(self) -> str:
        return TABLE_PREFIX + self.name


# What is kept: filled by the registry from each Metric record's ``kept`` fact (and by
# analytics.summary for run_summary's parts), so a detector states it once, where it registers.
_items: dict[str, Maintained] = {}
# Results kept besides the registered detectors (run_summary's parts): a scratch registry's
# restore leaves them alone.
PARTS: set[str] = set()


# How a registered detector is maintained when not by its own full computation scoped to the
# touched partitions: name -> (compute, depends), set by the detector's module.
_overrides: dict[str, tuple[Compute, Depends, ExtraKeys | None, bool, bool]] = {}


def maintain(item: Maintained) -> None:
    """Keep ``item`` (replacing an earlier one of its name)."""
    _items[item.name] = item


def maintain_with(
    name: str,
    compute: Compute,
    depends: Depends = (),
    extra_keys: ExtraKeys | None = None,
    portable: bool = False,
    run_local: bool = True,
) -> None:
    """Maintain the detector ``name`` with ``compute`` (reading the tables of ``depends``, which
    are brought up to date first; a function when they follow other registrations) instead of
    its full computation scoped to the touched partitions; ``extra_keys``, ``portable`` and
    ``run_local`` as in ``Maintained``. Its full computation stays what reads of cut runs use and
    what tests hold the table to."""
    depends = depends if callable(depends) else tuple(depends)
    _overrides[name] = (compute, depends, extra_keys, portable, run_local)


def forget(name: str) -> None:
    """Keep ``name`` no more."""
    _items.pop(name, None)


def _settings_version() -> str:
    """What every maintained result also depends on: the side-effect tool pattern in force."""
    return repr(current_side_effect_tools())


def run_scope(
    conn: duckdb.DuckDBPyConnection, keys: list[str] | None, partition: str | None = "run_id"
) -> Filters:
    """The filters of a computation over the spans of the runs (origin tasks) ``keys`` (every
    span when None), with ``scope_from``, the least ``ingested_at`` of those partitions' spans,
    so its scans read only the row groups since then: the findings of runs still arriving follow
    the runs, not the history stored before them (with 1,000 active runs among 10,000, a scoped
    statement read every stored span's run id and columns).

    Exact: every span of ``keys`` is at or after the bound when it is read. Read after the
    caller's target: a commit after it that moves older spans into one of the runs (a late
    parent's walk) is a change past the target, whose partitions the next pass computes again."""
    if keys is None:
        return Filters(from_spans=True)
    scope = Filters(runs=tuple(keys)) if partition == "run_id" else Filters(origin_tasks=tuple(keys))
    if not keys or is_clickhouse(conn):
        return scope
    column = quote_identifier(partition)
    ((first,),) = conn.execute(
        f"SELECT min(ingested_at) FROM spans WHERE {column} = ANY($keys::VARCHAR[])", {"keys": list(keys)}
    ).fetchall()
    return dataclasses.replace(scope, scope_from=first)


def spans_of_no_run(conn: duckdb.DuckDBPyConnection) -> bool:
    """Whether any stored span has no run (either engine). No run-partitioned part holds such
    spans (no change names a NULL partition), so a sum of parts counts them apart; the collector
    gives every span a run, so this is a store written otherwise."""
    ((count,),) = fetch_rows(conn, "SELECT count(*) FROM spans WHERE run_id IS NULL")
    return count > 0


def detector_compute(func: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame]) -> Compute:
    """A registered detector as a ``Compute``: its full computation, limited to the partitions
    given through the shared filter's internal run (origin task) scope."""

    def compute(
        conn: duckdb.DuckDBPyConnection, partition: str | None, keys: list[str] | None
    ) -> pd.DataFrame:
        return func(conn, Window(), run_scope(conn, keys, partition))

    return compute


def maintained() -> dict[str, Maintained]:
    """Everything the materializer keeps, by name, each version naming the settings in force;
    a result after every result it depends on."""
    settings = _settings_version()
    out: dict[str, Maintained] = {}
    for name, item in _items.items():
        compute, depends, extra, portable, run_local = _overrides.get(
            name, (item.compute, item.depends, item.extra_keys, item.portable, item.run_local)
        )
        depends = tuple(d for d in (depends() if callable(depends) else depends) if d in _items)
        # what a result reads is part of its definition: another set of inputs rebuilds it
        version = f"{item.version}|{settings}" + (f"|{','.join(depends)}" if depends else "")
        out[name] = dataclasses.replace(
            item, compute=compute, version=version, depends=depends, extra_keys=extra, portable=portable,
            run_local=run_local,
        )  # fmt: skip
    ordered: dict[str, Maintained] = {}

    def place(name: str, seen: tuple[str, ...] = ()) -> None:
        if name in ordered or name in seen:
            return
        for first in out[name].depends:
            place(first, (*seen, name))
        ordered[name] = out[name]

    for name in out:
        place(name)
    return ordered


# ---------------------------------------------------------------------------------------- state


@dataclass
class State:
    """One ``findings_state`` row."""

    version: str
    seq: int | None
    rows: int
    failed_keys: list[str]
    last_error: str | None


def read_states(conn: duckdb.DuckDBPyConnection) -> dict[str, State]:
    """Every ``findings_state`` row by metric (empty when the store has none: a ClickHouse store
    keeps no findings tables yet, every read there computes)."""
    if is_clickhouse(conn):
        return {}
    try:
        rows = conn.execute(
            "SELECT metric, version, seq, rows, failed_keys, last_error FROM findings_state"
        ).fetchall()
    except duckdb.CatalogException:
        return {}
    return {
        metric: State(version, seq, rows, json.loads(failed) if failed else [], error)
        for metric, version, seq, rows, failed, error in rows
    }


def _has_change_log(conn: duckdb.DuckDBPyConnection) -> bool:
    return not is_clickhouse(conn) and has_tables(conn, "change_log", "change_partitions")


def newest_change(conn: duckdb.DuckDBPyConnection) -> int:
    """The newest change log seq (0 when nothing was logged)."""
    return _newest(conn) if _has_change_log(conn) else 0


def _newest(conn: duckdb.DuckDBPyConnection) -> int:
    """``newest_change`` of a store known to have a change log (a pass asks before each result:
    the catalog lookup cost more than the seq)."""
    return conn.execute("SELECT coalesce(max(seq), 0) FROM change_log").fetchall()[0][0]


def log_rebuild(conn: duckdb.DuckDBPyConnection) -> None:
    """In the caller's (writer's) transaction: log that every maintained result is stale (a
    threshold changed). Nothing when the store has no change log (a bare in-memory database)."""
    if _has_change_log(conn):
        conn.execute(
            "INSERT INTO change_log (seq, committed_at, kind, spans) "
            "SELECT nextval('change_seq'), now()::TIMESTAMP, 'rebuild', 0"
        )


def log_change(
    conn: duckdb.DuckDBPyConnection, kind: str, partition: str, keys_sql: str, params: dict[str, Any]
) -> None:
    """In the caller's (writer's) transaction: log a change of ``kind`` that stored no span,
    touching the ``partition`` keys ``keys_sql`` returns (one column, bound with ``params``).
    Nothing when the store has no change log. A pass consumes it as any change: results kept
    whole recompute, partitioned ones recompute the keys of their own partition it lists."""
    if not _has_change_log(conn):
        return
    ((seq,),) = conn.execute(
        "INSERT INTO change_log (seq, committed_at, kind, spans) "
        "SELECT nextval('change_seq'), now()::TIMESTAMP, $kind, 0 RETURNING seq",
        {"kind": kind},
    ).fetchall()
    conn.execute(
        f"INSERT INTO change_partitions SELECT DISTINCT $seq, $partition, k.key FROM ({keys_sql}) k(key) "
        "WHERE k.key IS NOT NULL",
        {**params, "seq": seq, "partition": partition},
    )


# ClickHouse's reads of the same tables (``freshness``, ``read_findings``): analytics.read_clickhouse
# registers them when imported (the package imports it), so this module never imports it back.
_clickhouse_reads: dict[str, Callable[..., Any]] = {}


def use_clickhouse_reads(**reads: Callable[..., Any]) -> None:
    """Register the ClickHouse store's ``freshness``, ``read_findings`` and ``read_window``."""
    _clickhouse_reads.update(reads)


# freshness' figures from the change log: the newest change, when change $floor was committed,
# and when the oldest change after it was.
_FRESHNESS_SQL = (
    "SELECT coalesce(max(seq), 0), max(committed_at) FILTER (WHERE seq = $floor), "
    "min(committed_at) FILTER (WHERE seq > $floor) FROM change_log"
)


def freshness(conn: duckdb.DuckDBPyConnection, names: list[str] | None = None) -> dict[str, Any]:
    """How far behind the newest committed change the findings are.

    ``findings_as_of``: when the oldest change every maintained result (of ``names``) reflects
    was committed (naive UTC, None when none is built); ``lag_seconds``: age of the oldest
    committed change some result does not reflect yet (0 when none); ``behind_changes``: how many.
    """
    if is_clickhouse(conn):  # the same tables on ClickHouse's operations
        return _clickhouse_reads["freshness"](conn, names)
    items = maintained()
    wanted = [n for n in (names or list(items)) if n in items]
    out: dict[str, Any] = {"findings_as_of": None, "lag_seconds": None, "behind_changes": None}
    if not wanted:
        return out
    states = read_states(conn)
    seqs = [
        state.seq if state is not None and state.version == items[n].version else None
        for n, state in ((n, states.get(n)) for n in wanted)
    ]
    floor = min(seqs) if None not in seqs else None  # type: ignore[type-var]
    newest, floor_at, oldest = 0, None, None
    if floor is not None and _has_change_log(conn):  # one statement: asked beside every answer
        ((newest, floor_at, oldest),) = conn.execute(_FRESHNESS_SQL, {"floor": floor}).fetchall()
    if floor is not None:
        out["behind_changes"] = int(newest - floor)
        if floor:
            out["findings_as_of"] = floor_at
        if newest > floor:
            now = datetime.now(UTC).replace(tzinfo=None)
            out["lag_seconds"] = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
        else:
            out["lag_seconds"] = 0.0
            if out["findings_as_of"] is None:
                out["findings_as_of"] = datetime.now(UTC).replace(tzinfo=None)
    return out


# ---------------------------------------------------------------------------------------- reads


def ready(conn: duckdb.DuckDBPyConnection, name: str) -> State | None:
    """The state of ``name``'s table when it can answer reads (built by this definition)."""
    item = maintained().get(name)
    if item is None:
        return None
    state = read_states(conn).get(name)
    if state is None or state.seq is None or state.version != item.version:
        return None
    return state


def table_exists(conn: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether ``table`` exists (a findings table is created by its first rows)."""
    return has_tables(conn, table)


def run_behind(conn: duckdb.DuckDBPyConnection, state: State, run: str) -> bool:
    """Whether a change the table of ``state`` does not reflect yet touched ``run``: a question
    about that one run is then computed from its spans (the run explorer of a run still
    streaming shows it as committed), not answered from rows a pass or more old."""
    if state.seq is None or not _has_change_log(conn):
        return False
    return bool(
        conn.execute(
            "SELECT count(*) FROM change_partitions WHERE partition = 'run_id' AND key = $run AND seq > $seq",
            {"run": run, "seq": state.seq},
        ).fetchall()[0][0]
    )


def tables_answer(item: Maintained, window: Window, filters: Filters) -> bool:
    """Whether ``item``'s table can answer a read of ``window`` and ``filters`` (no window, no
    filter but a run on a run-partitioned result), on either engine."""
    if window != Window() or filters.reads_spans():
        return False
    if filters.service is not None or filters.agent is not None or filters.origin_task is not None:
        return False
    return filters.run is None or item.partition == "run_id"


def read_findings(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    columns: list[str] | None = None,
    documented: list[str] | None = None,
    runs: list[str] | None = None,
    page: Page | None = None,
) -> pd.DataFrame | None:
    """``name``'s rows from its findings table (only ``columns`` when given; only the rows of
    ``runs`` when given; only ``page``'s rows when given, with ``attrs["total_rows"]``), or None
    when the table cannot answer this read: not built (or built by another definition), a window
    (the caller passes ``Window()`` when it holds every stored span), or a filter other than a
    run on a run-partitioned detector."""
    if is_clickhouse(conn):  # the same tables on ClickHouse's operations; pages cut after the read
        frame = _clickhouse_reads["read_findings"](conn, name, window, filters, columns, documented, runs)
        return frame if frame is None or page is None else page.cut(frame)
    found = read_findings_arrow(conn, name, window, filters, columns, documented, runs, page)
    if found is None:
        return None
    table, total = found
    frame = table.to_pandas(types_mapper=pandas_type)
    frame.attrs["source"] = "table"
    if page is not None:
        frame.attrs["total_rows"] = total
    return frame


def read_findings_arrow(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    columns: list[str] | None = None,
    documented: list[str] | None = None,
    runs: list[str] | None = None,
    page: Page | None = None,
) -> tuple[pa.Table, int] | None:
    """``read_findings``' rows as DuckDB's Arrow answer (no pandas on the way: what the read API
    sends an Arrow client), with the whole answer's row count; None when the table cannot answer
    (as ``read_findings``) or on ClickHouse. A table not made yet answers no rows, every column
    of Arrow's null type."""
    if is_clickhouse(conn):
        return None
    item = maintained().get(name)
    if item is None or not tables_answer(item, window, filters):
        return None
    state = ready(conn, name)
    if state is None:
        return None
    if filters.run is not None and run_behind(conn, state, filters.run):
        return None  # one run the table does not hold as committed yet: computed, it is current
    wanted = list(columns or documented or [])
    if not table_exists(conn, item.table):
        return pa.table({column: pa.nulls(0) for column in wanted}), 0
    select = ", ".join(quote_identifier(c) for c in wanted) if wanted else "* EXCLUDE (_pos)"
    order = [f"{quote_identifier(c)}{' DESC' if d else ''} NULLS LAST" for c, d in item.order]
    if item.partition is not None:
        order.append(f"{quote_identifier(item.partition)} NULLS LAST")
    order.append(POSITION)
    where, params = "", {}
    if filters.run is not None:
        where, params = "WHERE run_id = $run", {"run": filters.run}
    if runs is not None:
        where = f"{where} {'AND' if where else 'WHERE'} run_id IN (SELECT unnest($runs::VARCHAR[]))"
        params["runs"] = list(runs)
    source = f"FROM {quote_identifier(item.table)} {where}"
    if page is None:
        table = conn.sql(
            f"SELECT {select} {source} ORDER BY {', '.join(order)}", params=params
        ).to_arrow_table()
        return table, table.num_rows
    # the page and the whole answer's length in one statement (one snapshot of the table)
    count = f"(SELECT count(*) {source})"
    sql = f"SELECT {select}, {count} AS {quote_identifier(_TOTAL)} {source} ORDER BY {', '.join(order)}"
    if page.limit is not None:
        sql += " LIMIT $limit"
        params["limit"] = page.limit
    if page.offset:
        sql += " OFFSET $offset"
        params["offset"] = page.offset
    table = conn.sql(sql, params=params).to_arrow_table()
    if table.num_rows:
        total = table.column(_TOTAL)[0].as_py()
    else:  # a page past the end has no row to carry the count: asked again (a commit later, maybe)
        scope = {k: v for k, v in params.items() if k not in ("limit", "offset")}
        total = conn.execute(f"SELECT count(*) {source}", scope).fetchone()[0]
    return table.drop_columns([_TOTAL]), int(total)


# The page's column carrying the whole answer's row count (dropped before the answer leaves).
_TOTAL = "__driftscope_total_rows"


# Lists as Arrow lists (as the detectors give them: ``analytics.text_lists``); integers and
# booleans as pandas' nullable types, so a NULL does not turn a count into a float.
_NULLABLE = {
    pa.int8(): pd.Int8Dtype(),
    pa.int16(): pd.Int16Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
    pa.bool_(): pd.BooleanDtype(),
}


def pandas_type(kind: pa.DataType):
    """The pandas type a findings table's Arrow column reads back as (``to_pandas(types_mapper=)``)."""
    if pa.types.is_list(kind):
        return pd.ArrowDtype(kind)
    return _NULLABLE.get(kind)


# The table of each run's first and last span start (run_summary's base part): which runs a window
# holds whole, and which it cuts.
RANGES = "run_summary_base"
# The table of each run's services and agents (analytics/sql/run_actors.sql): which runs a service
# or agent filter names.
RUN_ACTORS = "run_actors"


def reads_whole_runs(item: Maintained | None, filters: Filters) -> bool:
    """Whether a read of ``item`` under a window may take the runs it holds whole from the table
    (``read_window``, either engine): a run-partitioned detector whose rows of a run come from
    that run's spans alone (``run_local``), asked without ``Filters.from_spans``."""
    return (
        item is not None
        and item.partition == "run_id"
        and item.detector is not None
        and item.run_local
        and not filters.reads_spans()
    )


def read_window(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window,
    filters: Filters,
    columns: list[str] | None,
    documented: list[str],
) -> pd.DataFrame | None:
    """``name``'s rows over a ``window`` and ``filters`` the table cannot answer alone, for a
    run-partitioned detector: the table's rows of the runs the question takes whole, plus the
    runs it only partly takes computed for the question (only those). None when the tables cannot
    answer it (not built, or not a run-partitioned detector).

    A run is taken whole when the window holds all its spans and the filters keep all of them: a
    run filter or an origin-task filter selects whole runs; a service filter keeps a run whole
    when that service sent all its spans. An agent filter keeps the findings that involve the
    agent, which each detector decides: the runs the agent acted or was handed a task in are
    computed with the filter (``RUN_ACTORS``), the others have no such finding."""
    if is_clickhouse(conn):  # windows only there (analytics.read_clickhouse.read_window)
        return _clickhouse_reads["read_window"](conn, name, window, filters, columns, documented)
    item = maintained().get(name)
    if not reads_whole_runs(item, filters):
        return None
    if (
        window == Window()
        and filters.service is None
        and filters.agent is None
        and filters.origin_task is None
    ):
        return None  # read_findings answers it
    state = ready(conn, name)
    if state is None or ready(conn, RANGES) is None or ready(conn, RUN_ACTORS) is None:
        return None
    if filters.run is not None and run_behind(conn, state, filters.run):
        return None
    ranges = quote_identifier(TABLE_PREFIX + RANGES)
    actors = quote_identifier(TABLE_PREFIX + RUN_ACTORS)
    params = {
        "since": window.since,
        "until": window.until,
        "run": filters.run,
        "service": filters.service,
        "agent": filters.agent,
        "origin_task": filters.origin_task,
    }
    # the runs the question touches (a span in the window, of its service, naming its run and
    # origin task) and whether it takes each whole
    plan = conn.execute(
        f"""
        WITH touched AS (
            SELECT r.run_id,
                   ($since::TIMESTAMP IS NULL OR r.first_seen >= $since::TIMESTAMP)
                   AND ($until::TIMESTAMP IS NULL OR r.last_seen < $until::TIMESTAMP) AS in_window
            FROM {ranges} r
            WHERE ($since::TIMESTAMP IS NULL OR r.last_seen >= $since::TIMESTAMP)
              AND ($until::TIMESTAMP IS NULL OR r.first_seen < $until::TIMESTAMP)
              AND ($run::VARCHAR IS NULL OR r.run_id = $run::VARCHAR)
              AND ($origin_task::VARCHAR IS NULL OR r.run_id IN (
                   SELECT run_id FROM spans WHERE origin_task_id = $origin_task::VARCHAR))
              AND ($service::VARCHAR IS NULL OR r.run_id IN (
                   SELECT run_id FROM {actors} WHERE kind = 'service' AND name = $service::VARCHAR))
              AND ($agent::VARCHAR IS NULL OR r.run_id IN (
                   SELECT run_id FROM {actors} WHERE kind = 'agent' AND name = $agent::VARCHAR))
        ),
        one_service AS (
            SELECT run_id FROM {actors} WHERE kind = 'service' GROUP BY run_id HAVING count(*) = 1
        )
        SELECT t.run_id,
               t.in_window AND $agent::VARCHAR IS NULL
               AND ($service::VARCHAR IS NULL OR t.run_id IN (SELECT run_id FROM one_service)) AS whole
        FROM touched t
        """,
        params,
    ).fetchall()
    whole = [run for run, is_whole in plan if is_whole]
    partial = [run for run, is_whole in plan if not is_whole]
    wanted = list(columns or documented)
    frames = []
    if whole and table_exists(conn, item.table):
        select = ", ".join(quote_identifier(c) for c in wanted)
        table = conn.sql(
            f"SELECT {select} FROM {quote_identifier(item.table)} "
            "WHERE run_id IN (SELECT unnest($runs::VARCHAR[])) ORDER BY _pos",
            params={"runs": whole},
        ).to_arrow_table()
        frames.append(table.to_pandas(types_mapper=pandas_type))
    if partial:
        frames.append(item.detector(conn, window, dataclasses.replace(filters, runs=tuple(partial)))[wanted])
    return window_answer(item, frames, wanted)


def window_answer(item: Maintained, frames: list[pd.DataFrame], wanted: list[str]) -> pd.DataFrame:
    """A window's answer from its parts (the table's rows of the runs it holds whole, the cut
    runs computed), in ``item``'s read order, said to come from the table."""
    frames = [f for f in frames if not f.empty] or frames[:1]
    if not frames:
        frame = pd.DataFrame({column: pd.Series(dtype=object) for column in wanted})
    else:
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    if item.order and len(frame) > 1 and all(c in frame.columns for c, _ in item.order):
        frame = _ordered(frame, item.order)
    frame.attrs["source"] = "table"
    return frame


def _ordered(frame: pd.DataFrame, order: tuple[tuple[str, bool], ...]) -> pd.DataFrame:
    """``frame`` in ``order`` as DuckDB orders it (NULLs last, lists element by element); ties
    keep their place. Only the key columns go through DuckDB; the rows are taken by position."""
    keys = pd.DataFrame(
        {f"k{i}": frame[column].reset_index(drop=True) for i, (column, _) in enumerate(order)}
    )
    keys["pos"] = range(len(keys))
    clause = ", ".join(f"k{i}{' DESC' if desc else ''} NULLS LAST" for i, (_, desc) in enumerate(order))
    with memory_cursor() as mem:
        mem.register("keys", keys)
        positions = mem.execute(f"SELECT pos FROM keys ORDER BY {clause}, pos").fetchnumpy()["pos"]
    return frame.take(positions).reset_index(drop=True)


# ---------------------------------------------------------------------------------------- writes


def _arrow(frame: pd.DataFrame | pa.Table, start: int = 0) -> pa.Table:
    """A result's rows as the Arrow table written, numbered from ``start`` (``POSITION``). A
    result may be computed as Arrow already (a per-span result's first build: a million rows
    as pandas took 0.9 GiB more at 1M spans)."""
    if isinstance(frame, pa.Table):
        table = frame
    else:
        table = pa.Table.from_pandas(frame.reset_index(drop=True), preserve_index=False)
    fields = []
    for field in table.schema:
        kind = field.type
        if pa.types.is_null(kind):
            kind = pa.string()  # a column with no value yet: text until a value says otherwise
        elif pa.types.is_list(kind) and pa.types.is_null(kind.value_type):
            kind = pa.list_(pa.string())
        fields.append(pa.field(field.name, kind))
    table = table.cast(pa.schema(fields))
    return table.append_column(POSITION, pa.array(range(start, start + table.num_rows), pa.int64()))


def column_types(conn: duckdb.DuckDBPyConnection, name: str) -> dict[str, str]:
    """The columns of the table (or registered relation) ``name`` (unquoted) and their DuckDB
    types, as DESCRIBE gives them: from binding the name, not a statement (cheaper than DESCRIBE,
    and a name that does not resolve raises ``CatalogException`` without aborting the
    transaction)."""
    relation = conn.table(name)
    return dict(zip(relation.columns, (str(kind) for kind in relation.types), strict=True))


def _write_rows(
    conn: duckdb.DuckDBPyConnection,
    item: Maintained,
    rows: pa.Table,
    keys: list[str] | SpanChanges | None,
    append: bool = False,
) -> None:
    """In the writer's transaction: replace ``keys``' rows of ``item``'s table by ``rows`` (all
    rows when ``keys`` is None), or add ``rows`` (``append``: a later part of a build). The table
    is made from the first rows; a column that held no value yet takes the type of the first
    value it is given."""
    table = quote_identifier(item.table)
    try:
        have: dict[str, str] | None = column_types(conn, item.table)
    except duckdb.CatalogException:
        have = None  # no table yet
    conn.register("_findings_rows", rows)
    try:
        if keys is None and have is not None and not append:
            conn.execute(f"DROP TABLE {table}")
            have = None
        if have is None:
            conn.execute(f"CREATE TABLE {table} AS SELECT * FROM _findings_rows")
            return
        given = column_types(conn, "_findings_rows")
        for column, kind in given.items():
            if column not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {quote_identifier(column)} {kind}")
            elif have[column] != kind and rows.num_rows and rows.column(column).null_count < rows.num_rows:
                ((held,),) = conn.execute(f"SELECT count({quote_identifier(column)}) FROM {table}").fetchall()
                if held:
                    raise TypeError(
                        f"{item.name}: column {column} was {have[column]}, now {kind}; bump the "
                        "detector's version so its table is rebuilt"
                    )
                conn.execute(f"ALTER TABLE {table} ALTER {quote_identifier(column)} TYPE {kind}")
        if not append:
            _delete_partitions(conn, item, table, keys)
        names = ", ".join(quote_identifier(c) for c in rows.column_names)
        conn.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM _findings_rows")
    finally:
        conn.unregister("_findings_rows")


def _delete_partitions(
    conn: duckdb.DuckDBPyConnection, item: Maintained, table: str, keys: list[str] | SpanChanges
) -> None:
    """In the writer's transaction: delete the rows of ``keys`` (of ``item``'s partition kind)
    from ``table``, before their new rows go in."""
    if item.partition == "span":
        if not keys.only_new:  # a span first stored by these changes has no row yet
            conn.execute(
                f"DELETE FROM {table} t USING {keys.sql()} c "
                "WHERE t.TraceId = c.TraceId AND t.SpanId = c.SpanId",
                keys.params(),
            )
    elif item.partition == "run_tool":
        where, params = run_tool_where(keys)
        conn.execute(f"DELETE FROM {table} WHERE {where}", params)
    elif item.partition is not None:
        conn.execute(
            f"DELETE FROM {table} WHERE {quote_identifier(item.partition)} IN (SELECT unnest($keys::VARCHAR[]))",
            {"keys": keys},
        )


def run_chunks(conn: duckdb.DuckDBPyConnection, max_spans: int) -> list[list[str]]:
    """The stored runs in chunks of at most ``max_spans`` spans (a larger run alone), in run
    order: the parts of a first build, so what one part computes is bounded, not the store."""
    sizes = conn.execute(
        "SELECT run_id, count(*) FROM spans WHERE run_id IS NOT NULL GROUP BY run_id ORDER BY run_id"
    ).fetchall()
    chunks: list[list[str]] = [[]]
    held = 0
    for run, count in sizes:
        if chunks[-1] and held + count > max_spans:
            chunks.append([])
            held = 0
        chunks[-1].append(run)
        held += count
    return chunks


def split_run_tools(keys: list[str]) -> tuple[list[str], list[str]]:
    """'run_tool' keys as (runs whose every group is meant, "<run>\x1f<tool>" group keys of the
    other runs)."""
    runs = sorted({key[: -len(RUN_TOOL_SEP) - 1] for key in keys if key.endswith(RUN_TOOL_SEP + "*")})
    whole = set(runs)
    groups = sorted(
        {
            key
            for key in keys
            if key.split(RUN_TOOL_SEP, 1)[0] not in whole and not key.endswith(RUN_TOOL_SEP + "*")
        }
    )
    return runs, groups


def run_tool_where(keys: list[str]) -> tuple[str, dict[str, list[str]]]:
    """The condition selecting the rows of 'run_tool' ``keys`` from a table with run_id and
    tool_name, and its parameters. The keys' runs are joined first, so a group key is built
    only for the rows of those runs, not for every row of the table (the per-pass deletes of the
    loop tables scanned all of them)."""
    runs, groups = split_run_tools(keys)
    key_runs = sorted({*runs, *(group.split(RUN_TOOL_SEP, 1)[0] for group in groups)})
    sql = (
        "(run_id IN (SELECT unnest($key_runs::VARCHAR[])) AND (run_id IN (SELECT unnest($runs::VARCHAR[])) "
        "OR run_id || chr(31) || tool_name IN (SELECT unnest($groups::VARCHAR[]))))"
    )
    return sql, {"key_runs": key_runs, "runs": runs, "groups": groups}


def _write_state(
    conn: duckdb.DuckDBPyConnection,
    item: Maintained,
    seq: int | None,
    failed: list[str] | None = None,
    error: str | None = None,
) -> None:
    """In the writer's transaction: ``item``'s state row (the change its table reflects, its
    rows). An UPDATE of the row a result has after its first write (an upsert on the primary
    key cost more, once per result and pass); an INSERT for its first."""
    rows = 0
    if table_exists(conn, item.table):  # (a statement naming no table would abort the transaction)
        ((rows,),) = conn.execute(f"SELECT count(*) FROM {quote_identifier(item.table)}").fetchall()
    values = {
        "metric": item.name,
        "version": item.version,
        "seq": seq,
        "rows": rows,
        "failed": json.dumps(sorted(failed)) if failed else None,
        "error": error,
    }
    ((updated,),) = conn.execute(
        "UPDATE findings_state SET version = $version, seq = $seq, rows = $rows, updated_at = now()::TIMESTAMP, "
        "failed_keys = $failed, last_error = $error WHERE metric = $metric",
        values,
    ).fetchall()
    if not updated:
        conn.execute(
            "INSERT INTO findings_state VALUES ($metric, $version, $seq, $rows, now()::TIMESTAMP, $failed, $error)",
            values,
        )


# ---------------------------------------------------------------------------------------- passes


@dataclass
class PassReport:
    """What one pass of the materializer did."""

    target: int = 0
    recomputed: dict[str, int] | None = None  # partitions (or -1: whole) per result
    failed: dict[str, str] | None = None
    # seconds per result: computing it (this thread, without waiting for writes) and running
    # its writes (in the writer); and all the pass waited for writes (queued behind span commits)
    compute_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    write_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    waited_seconds: float = 0.0
    # what a result's own change reported doing (a state fold's ``counts()``), per result
    counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)


def _partitions_of(conn: duckdb.DuckDBPyConnection, partition: str) -> list[str]:
    if partition == "run_tool":  # every group of every run
        return [row[0] + RUN_TOOL_SEP + "*" for row in conn.execute(
            "SELECT DISTINCT run_id FROM spans WHERE run_id IS NOT NULL").fetchall()]  # fmt: skip
    column = quote_identifier(partition)
    return [
        row[0]
        for row in conn.execute(f"SELECT DISTINCT {column} FROM spans WHERE {column} IS NOT NULL").fetchall()
    ]


def _unscoped(conn: duckdb.DuckDBPyConnection, keys: list[str], partition: str, totals: dict) -> bool:
    """Whether ``keys`` are better computed as one unscoped computation than scoped to them."""
    if len(keys) <= MANY_KEYS:
        return False
    if "spans" not in totals:
        totals["spans"] = conn.execute("SELECT count(*) FROM spans").fetchall()[0][0]
    if totals["spans"] > UNSCOPED_MAX_SPANS:
        return False  # chunks of partitions bound the memory of one computation
    if partition == "run_tool":  # only every group of most runs is a computation of most of it
        keys = [key for key in keys if key.endswith(RUN_TOOL_SEP + "*")]
        partition = "run_id"
    if partition not in totals:
        column = quote_identifier(partition)
        totals[partition] = conn.execute(f"SELECT count(DISTINCT {column}) FROM spans").fetchall()[0][0]
    return len(keys) >= MANY_SHARE * totals[partition]


def _touched(conn: duckdb.DuckDBPyConnection, partition: str, after: int, upto: int) -> list[str]:
    derived: list[str] = []
    if partition == "run_tool":  # the keys the committed spans have now (collector.changes)
        derived = [
            row[0]
            for row in conn.execute(
                RUN_TOOL_KEYS_SQL, span_changes(conn, after, upto).bounded_params()
            ).fetchall()
        ]
    return derived + [
        row[0]
        for row in conn.execute(
            "SELECT DISTINCT key FROM change_partitions WHERE seq > $after AND seq <= $upto "
            "AND partition = $partition",
            {"after": after, "upto": upto, "partition": partition},
        ).fetchall()
    ]


def _rebuild_logged(conn: duckdb.DuckDBPyConnection, after: int, upto: int) -> bool:
    return bool(
        conn.execute(
            "SELECT count(*) FROM change_log WHERE seq > $after AND seq <= $upto AND kind = 'rebuild'",
            {"after": after, "upto": upto},
        ).fetchall()[0][0]
    )


def _compute_keys(
    conn: duckdb.DuckDBPyConnection, item: Maintained, keys: list[str]
) -> tuple[pd.DataFrame | None, list[str], str | None]:
    """``item``'s rows for ``keys``; a failing chunk is retried key by key, so one partition
    that fails is isolated: (rows, failed keys, last error)."""
    try:
        return item.compute(conn, item.partition, keys), [], None
    except duckdb.InterruptException:
        raise  # the materializer is stopping: no partition failed, and the others must not start
    except Exception as exc:  # noqa: BLE001 - isolate the failing partition below
        if len(keys) == 1:
            logger.warning("materializer: %s failed on %s %s: %s", item.name, item.partition, keys[0], exc)
            return None, keys, f"{type(exc).__name__}: {exc}"
    frames, failed, error = [], [], None
    for key in keys:
        frame, bad, message = _compute_keys(conn, item, [key])
        if frame is not None:
            frames.append(frame)
        failed += bad
        error = message or error
    frames = [f for f in frames if not f.empty] or frames[:1]
    return (pd.concat(frames, ignore_index=True) if frames else None), failed, error


class _PassWrites:
    """A pass's writes, by result. With ``submit`` (the writer's queue) they are queued without
    waiting: the next result is computed while the writer runs them (in serve, each write waited
    behind span commits: a third of a pass's time at 1M stored spans under live ingest). A
    result's writes are awaited before a result that reads its table is computed, and every write
    at the end of the pass. Without ``submit``, each write runs at once through ``write``."""

    def __init__(self, write: WriteFn, submit: Callable[[Callable], Future] | None):
        self.write, self.submit = write, submit
        self.pending: dict[str, list[Future]] = {}
        self.waited = 0.0  # seconds spent waiting for writes
        self.spent: dict[str, float] = {}  # seconds the writer ran each result's writes

    def __call__(self, name: str, fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> None:
        def timed(conn: duckdb.DuckDBPyConnection) -> Any:
            started = time.perf_counter()
            try:
                return fn(conn)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - started

        if self.submit is not None:
            self.pending.setdefault(name, []).append(self.submit(timed))
            return
        started = time.perf_counter()
        try:
            self.write(timed)
        finally:
            self.waited += time.perf_counter() - started

    def wait(self, names: Iterable[str]) -> dict[str, str]:
        """Wait for the writes of ``names``; the message of each one's first failed write."""
        failed: dict[str, str] = {}
        started = time.perf_counter()
        for name in names:
            for future in self.pending.pop(name, []):
                try:
                    future.result()
                except Exception as exc:  # noqa: BLE001 - reported as the result's failure
                    failed.setdefault(name, f"{type(exc).__name__}: {exc}")
        self.waited += time.perf_counter() - started
        return failed


def bring_up_to_date(
    read: duckdb.DuckDBPyConnection,
    write: WriteFn,
    names: list[str] | None = None,
    whole_due: Callable[[str], bool] | None = None,
    between: Callable[[str], None] | None = None,
    submit: Callable[[Callable], Future] | None = None,
) -> PassReport:
    """One pass: bring every maintained result (of ``names``) up to the newest logged change.

    ``read`` is a connection (cursor) of this process for the computations; every write goes
    through ``write`` (the single writer), or is queued to it with ``submit`` (``_PassWrites``).
    ``whole_due(name)`` says whether a result kept whole may be recomputed now (serve limits how
    often); None: always. ``between(name)`` is called before each result (serve's materializer
    yields to ingest there and says what it works on)."""
    report = PassReport(recomputed={}, failed={})
    writes = _PassWrites(write, submit)
    write_fn = write
    try:
        return _bring_up_to_date(read, write_fn, writes, report, names, whole_due, between)
    finally:
        for name, message in writes.wait(list(writes.pending)).items():
            _write_failed(write_fn, report, name, message)
        report.write_seconds = {name: writes.spent.get(name, 0.0) for name in report.compute_seconds}
        report.waited_seconds = writes.waited


def _write_failed(write: WriteFn, report: PassReport, name: str, message: str) -> None:
    """Report and record that ``name``'s writes failed (its table stays where it was)."""
    logger.warning("materializer: %s not brought up to date: %s", name, message)
    report.failed[name] = message
    item = _items.get(name)
    if item is not None:
        try:
            write(lambda c, i=item, m=message: _record_error(c, i, m))
        except Exception:  # noqa: BLE001 - the store itself is failing: health says so
            logger.debug("materializer: could not record the failure of %s", name, exc_info=True)


def with_dependencies(items: dict[str, Maintained], names: Iterable[str]) -> set[str]:
    """``names`` and every result they read, directly or not (``Maintained.depends``)."""
    wanted, found = list(names), set()
    while wanted:
        name = wanted.pop()
        if name not in found:
            found.add(name)
            wanted += list(items[name].depends) if name in items else []
    return found


def visit_order(items: dict[str, Maintained]) -> list[str]:
    """The order a pass visits ``items`` in: as registered (what a result reads is registered
    before it), and a result whose inputs are spread over more than a third of the pass also
    midway between its first input and itself, where it takes in what its inputs reflect then."""
    order = list(items)
    position = {name: number for number, name in enumerate(order)}
    extra: dict[int, list[str]] = {}
    for name, item in items.items():
        inputs = [position[first] for first in item.depends if first in position]
        if inputs and position[name] - min(inputs) > len(order) // 3:
            extra.setdefault((min(inputs) + position[name]) // 2, []).append(name)
    return [visit for number, name in enumerate(order) for visit in (name, *extra.get(number, ()))]


def _bring_up_to_date(
    read: duckdb.DuckDBPyConnection,
    write_fn: WriteFn,
    writes: _PassWrites,
    report: PassReport,
    names: list[str] | None,
    whole_due: Callable[[str], bool] | None,
    between: Callable[[str], None] | None,
) -> PassReport:
    timed = {"write": 0.0}
    if not _has_change_log(read):
        return report
    report.target = newest_change(read)
    states = read_states(read)
    totals: dict[str, int] = {}
    items = maintained()
    if names is not None:  # and what they read, first
        names = with_dependencies(items, names)
    # The change each result's table reflects (built by its definition): what a dependent result
    # may read. Each result is brought up to the newest change when its turn comes, not when the
    # pass began (with a pass of several seconds under ingest, the first target left every result
    # a whole pass older than it needed to be). A dependent goes no further than what it reads,
    # so one reading results spread over the pass (run_summary) is visited midway too
    # (``visit_order``): it then reflects what its oldest input reflects, about one pass, instead
    # of up to two.
    current: dict[str, int] = {
        name: state.seq
        for name, state in states.items()
        if name in items and state.version == items[name].version and state.seq is not None
    }
    for name in visit_order(items):
        item = items[name]
        if names is not None and name not in names:
            continue
        if name in report.failed:
            continue
        state = states.get(name)
        if name in report.recomputed:  # visited before in this pass: its state as written then
            for first, message in writes.wait([name]).items():
                _write_failed(write_fn, report, first, message)
                current.pop(first, None)
            if name not in current:
                continue
            state = read_states(read).get(name)
        fresh = state is not None and state.version == item.version and state.seq is not None
        target = _newest(read)  # read before its computation: it sees at least this much
        if fresh and state.seq >= target:
            current[name] = state.seq
            continue
        if any(first not in current for first in item.depends):
            continue  # what it reads is behind: next pass
        if between is not None:
            between(name)
        started, waited = time.perf_counter(), writes.waited
        for first, message in writes.wait(item.depends).items():  # its table, written
            _write_failed(write_fn, report, first, message)
            current.pop(first, None)
        if any(first not in current for first in item.depends):
            continue
        target = min([_newest(read), *(current[first] for first in item.depends)])
        if fresh and state.seq >= target:
            current[name] = state.seq
            continue
        timed["write"] = writes.waited - waited

        def write(fn: Callable[[duckdb.DuckDBPyConnection], Any], name: str = name) -> None:
            before = writes.waited
            writes(name, fn)
            timed["write"] += writes.waited - before

        full = not fresh or _rebuild_logged(read, state.seq, target)
        try:
            if item.partition is None:
                if fresh and whole_due is not None and not whole_due(name):
                    continue
                frame = item.compute(read, None, None)
                rows = _arrow(frame)
                write(lambda c, i=item, r=rows, t=target: (_write_rows(c, i, r, None), _write_state(c, i, t)))
                current[name] = target
                report.recomputed[name] = -1
                continue
            if item.partition == "span":
                span_keys = None if full else span_changes(read, state.seq, target)
                if span_keys is None and item.build is not None:
                    for number, part in enumerate(item.build(read, target)):
                        before = writes.waited  # the part before, written: one part held at once
                        problems = writes.wait([name])
                        timed["write"] += writes.waited - before
                        if problems:
                            raise RuntimeError(problems[name])
                        if item.apply is not None:
                            write(lambda c, i=item, f=part: i.apply(c, f))
                        else:
                            rows = _arrow(part)
                            write(
                                lambda c, i=item, r=rows, a=number > 0: _write_rows(c, i, r, None, append=a)
                            )
                    write(lambda c, i=item, t=target: _write_state(c, i, t))
                elif item.apply is not None:
                    change = item.compute(read, "span", span_keys)
                    if callable(getattr(change, "counts", None)):
                        report.counts[name] = change.counts()
                    write(lambda c, i=item, f=change, t=target: (i.apply(c, f), _write_state(c, i, t)))
                else:
                    rows = _arrow(item.compute(read, "span", span_keys))
                    write(
                        lambda c, i=item, r=rows, k=span_keys, t=target: (
                            _write_rows(c, i, r, k),
                            _write_state(c, i, t),
                        )
                    )
                current[name] = target
                report.recomputed[name] = -1 if full else int(target - state.seq)
                continue
            keys = None
            if not full and item.touched is not None:
                keys = item.touched(read, state.seq, target)
                full = keys is None
            if keys is None:
                keys = (
                    _partitions_of(read, item.partition)
                    if full
                    else _touched(read, item.partition, state.seq, target)
                )
            if not full and item.extra_keys is not None:
                keys = list(dict.fromkeys([*keys, *item.extra_keys(read)]))
            if _unscoped(read, keys, item.partition, totals):
                # most partitions touched: one unscoped computation replaces the table
                rows = _arrow(item.compute(read, item.partition, None))
                write(lambda c, i=item, r=rows, t=target: (_write_rows(c, i, r, None), _write_state(c, i, t)))
                current[name] = target
                report.recomputed[name] = len(keys)
                continue
            if full:
                write(lambda c, i=item: (_drop_table(c, i), _write_state(c, i, None)))
            failed: list[str] = list(state.failed_keys) if fresh else []
            failed = [key for key in failed if key not in set(keys)]
            error = None
            chunks = [keys[i : i + CHUNK_KEYS] for i in range(0, len(keys), CHUNK_KEYS)] or [[]]
            for number, chunk in enumerate(chunks):
                last = number == len(chunks) - 1
                frame, bad, message = _compute_keys(read, item, chunk) if chunk else (None, [], None)
                failed += bad
                error = message or error
                good = [key for key in chunk if key not in set(bad)]
                rows = _arrow(frame) if frame is not None else None

                done = (target, tuple(failed), error) if last else None
                write(functools.partial(_apply_chunk, item=item, rows=rows, keys=good, state=done))
            current[name] = target
            report.recomputed[name] = len(keys)
            if error:
                report.failed[name] = error
        except duckdb.InterruptException:
            raise  # the materializer is stopping (Materializer.stop): no failure of the result
        except Exception as exc:  # noqa: BLE001 - one detector's failure must not stop the others
            _write_failed(write_fn, report, name, f"{type(exc).__name__}: {exc}")
            current.pop(name, None)
        finally:
            if name in report.recomputed or name in report.failed:
                spent = time.perf_counter() - started - timed["write"]
                report.compute_seconds[name] = report.compute_seconds.get(name, 0.0) + spent
    return report


def _apply_chunk(
    conn: duckdb.DuckDBPyConnection,
    item: Maintained,
    rows: pa.Table | None,
    keys: list[str],
    state: tuple[int, tuple[str, ...], str | None] | None,
) -> None:
    """One chunk's write: its partitions' rows, and with the last chunk the state row."""
    if keys and rows is not None:
        _write_rows(conn, item, rows, keys)
    if state is not None:
        _write_state(conn, item, state[0], list(state[1]), state[2])


def _drop_table(conn: duckdb.DuckDBPyConnection, item: Maintained) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {quote_identifier(item.table)}")


def _record_error(conn: duckdb.DuckDBPyConnection, item: Maintained, message: str) -> None:
    conn.execute(
        "UPDATE findings_state SET last_error = $error, updated_at = now()::TIMESTAMP WHERE metric = $metric",
        {"error": message, "metric": item.name},
    )


def prune_change_log(conn: duckdb.DuckDBPyConnection) -> int:
    """In the writer's transaction: delete the change log entries every maintained result has
    consumed (never the newest: its seq tells readers how far the log went). Returns how many."""
    states = read_states(conn)
    items = maintained()
    seqs = [states[n].seq for n in items if n in states and states[n].seq is not None]
    if len(seqs) < len(items) or not seqs:
        return 0
    floor = min(min(seqs), newest_change(conn) - 1)
    ((deleted,),) = conn.execute("DELETE FROM change_log WHERE seq <= ?", [floor]).fetchall()
    conn.execute("DELETE FROM change_partitions WHERE seq <= ?", [floor])
    conn.execute("DELETE FROM span_changes WHERE seq <= ?", [floor])
    return deleted


class Materializer(threading.Thread):
    """Serve's background thread: brings the findings tables up to date after each commit.

    ``cursor()`` gives this thread its own read cursor; ``write`` is the single writer's
    ``execute_write_fn``. Ingest never waits on it: it only reads, and its writes queue behind
    span commits like any other write."""

    def __init__(
        self,
        cursor: Callable[[], duckdb.DuckDBPyConnection],
        write: WriteFn,
        interval: float = 0.5,
        ingest_backlog: Callable[[], int] | None = None,
        submit: Callable[[Callable], Future] | None = None,
        ingest_share: Callable[[float], float] | None = None,
    ):
        super().__init__(name="driftscope-materializer", daemon=True)
        self._cursor = cursor
        self._write = write
        self._submit = submit  # the writer's queue: a pass's writes queued, not awaited one by one
        self.interval = interval
        self._wake = threading.Event()
        self._stop_event = threading.Event()
        self.passes = 0
        self.last_error: str | None = None
        self.last_failed: dict[str, str] = {}
        self.last_pass_seconds = 0.0
        self._whole_due = WholeSchedule()  # results kept whole: as often as they are cheap
        self._since_prune = 0
        # requests waiting for the writer (``len(IngestQueue)``), and the share of the last seconds
        # it spent committing spans (``SpanWriter.span_commit_share``; None: not asked)
        self._ingest_backlog = ingest_backlog
        self._ingest_share = ingest_share
        self._deferred = 0.0  # seconds this pass waited for ingest
        self.deferred_seconds = 0.0  # in all passes (health)
        # since start, per result: [seconds computing, seconds in its writes]; and all passes'
        self.seconds_by_result: dict[str, list[float]] = {}
        self.counts_by_result: dict[str, dict[str, int]] = {}  # PassReport.counts, summed
        self.pass_seconds_total = 0.0
        self.write_wait_seconds = 0.0  # of all passes' time, waiting for their writes
        self.working_on: tuple[str, float] | None = None  # (result, since: monotonic) in a pass
        self._cursor_lock = threading.Lock()
        self._running_cursor: duckdb.DuckDBPyConnection | None = None  # what stop() interrupts

    def notify(self) -> None:
        """New spans were committed (serve's on_commit)."""
        self._wake.set()

    def _yield_to_ingest(self, name: str) -> None:
        """Before each result (``name``): while requests queue for a writer busy committing spans
        (a burst: ``INGEST_SHARE``), wait, up to ``INGEST_MAX_DEFER_S`` a pass."""
        if self._stop_event.is_set():
            raise Stopping(name)
        self.working_on = (name, time.monotonic())
        if self._ingest_backlog is None:
            return
        while (
            self._ingest_backlog() >= INGEST_BACKLOG
            and (self._ingest_share is None or self._ingest_share(INGEST_SHARE_WINDOW_S) >= INGEST_SHARE)
            and self._deferred < INGEST_MAX_DEFER_S
        ):
            if self._stop_event.wait(INGEST_POLL_S):
                return
            self._deferred += INGEST_POLL_S
            self.deferred_seconds += INGEST_POLL_S

    def run_once(self, cursor: duckdb.DuckDBPyConnection) -> PassReport:
        started = time.perf_counter()
        self._deferred = 0.0
        report = bring_up_to_date(
            cursor, self._write, whole_due=self._whole_due, between=self._yield_to_ingest, submit=self._submit
        )
        self._whole_due.took(report.compute_seconds)
        if report.recomputed:
            self._since_prune += 1
        if self._since_prune >= PRUNE_EVERY:  # idle, it writes nothing at all
            self._write(prune_change_log)
            self._since_prune = 0
        self.working_on = None
        self.passes += 1
        self.last_failed = dict(report.failed or {})
        self.last_pass_seconds = time.perf_counter() - started
        self.pass_seconds_total += self.last_pass_seconds
        self.write_wait_seconds += report.waited_seconds
        for name, seconds in report.compute_seconds.items():
            spent = self.seconds_by_result.setdefault(name, [0.0, 0.0])
            spent[0] += seconds
            spent[1] += report.write_seconds.get(name, 0.0)
        for name, counts in report.counts.items():
            total = self.counts_by_result.setdefault(name, {})
            for key, value in counts.items():
                total[key] = total.get(key, 0) + value
        return report

    def run(self) -> None:
        cursor = self._cursor()
        with self._cursor_lock:
            self._running_cursor = cursor
        try:
            while not self._stop_event.is_set():
                try:
                    report = self.run_once(cursor)
                    self.last_error = None
                except (Stopping, duckdb.InterruptException):
                    if self._stop_event.is_set():
                        break  # what the pass wrote so far stays; the next start resumes from the log
                    raise
                except Exception as exc:  # noqa: BLE001 - keep going; health shows the error
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    logger.warning("materializer pass failed (will retry): %s", self.last_error)
                    report = None
                if report is not None and report.recomputed:
                    continue  # more may have arrived meanwhile
                self._wake.wait(self.interval)
                self._wake.clear()
        finally:
            with self._cursor_lock:
                self._running_cursor = None
            cursor.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop before the next result, interrupting the query running now (a first build at 10M
        computes one result for minutes: serve's shutdown must not wait for it, nor close the
        store under it)."""
        self._stop_event.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        while self.is_alive() and time.monotonic() < deadline:
            # again until it ends: a query started just after an interrupt is not interrupted
            with self._cursor_lock:
                if self._running_cursor is not None:
                    self._running_cursor.interrupt()
            self.join(min(0.5, max(0.0, deadline - time.monotonic())))
