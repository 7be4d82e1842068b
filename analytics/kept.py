"""Detector results kept per data version: after new spans, only the runs they touched are recomputed.

``run_metric`` answers a detector listed here from a result kept per database file, metric,
window and filters (and the side-effect tool pattern in force), brought up to date on each call
(``kept_result``):

- nothing changed since the kept result (same data version, ``analytics.data_version``): the kept
  frame is returned;
- new spans only touched some runs, and the detector is *partitioned* (``PARTITIONS``: each
  finding is derived from the spans of one run, or of one origin task, alone): the detector runs
  again limited to the touched runs (origin tasks) through the shared filter's internal run scope
  (``analytics.sql_loader.run_scope``), its rows replace those partitions' kept rows, and the
  merged rows are put back in the detector's own order (``ORDER``);
- anything else (a delete, a late batch, a threshold change, too many touched runs, a detector
  whose findings depend on every run, such as ``runaway_runs``' crew medians): one full run.

The result equals a full recomputation (``tests/analytics/test_kept.py`` compares them on random
span sets after every batch). Only file databases are kept (an in-memory one has no stable
identity). Reads never write: the kept results live in this process, and a result this process
has not kept yet is looked up in the store first (``analytics.kept_store``: what ``serve``'s
background refresh, ``analytics.kept_worker``, stored through the single writer, with the data
version it was computed at), then brought up to date the same way.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import contextvars
import functools
import inspect
import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

import analytics.kept_store as kept_store
from analytics.data_version import Scope, Version, database_identity, read_version, touched_scope
from analytics.engine import is_clickhouse
from analytics.side_effects import current_side_effect_tools
from analytics.sql_loader import memory_cursor, run_scope
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

# What is kept, filled by the registry from each Metric record (``register(kept=..., order=...)``;
# analytics.registry calls ``declare``), so a detector states it once, where it is registered.
# PARTITIONS: detector -> the column its findings are partitioned by: a finding of a run (origin
# task) is derived from that run's (origin task's) spans alone, and the detector honours the
# shared filter's run scope ($runs / $runs_since, or $origin_tasks for origin-task partitions).
PARTITIONS: dict[str, str] = {}
# Each partitioned detector's row order (its SQL's ORDER BY, or its Python sort): (column,
# descending). Merged rows are sorted by it; rows tied on it keep kept-before-fresh order.
ORDER: dict[str, list[tuple[str, bool]]] = {}
# Detectors kept whole: reused while nothing changed, recomputed whole after any change.
WHOLE: set[str] = set()
KEPT: set[str] = set()
PARTITION_COLUMNS = ("run_id", "origin_task_id")


def declare(name: str, how: str | None, order: list[tuple[str, bool]] | None = None) -> None:
    """Keep ``name``'s results: ``how`` is "whole" or its partition column (then ``order`` is
    its row order); None keeps nothing (and forgets an earlier declaration)."""
    PARTITIONS.pop(name, None)
    ORDER.pop(name, None)
    WHOLE.discard(name)
    KEPT.discard(name)
    if how is None:
        return
    if how == "whole":
        WHOLE.add(name)
    elif how in PARTITION_COLUMNS:
        if not order:
            raise ValueError(f"{name}: a result partitioned by {how} needs its row order")
        PARTITIONS[name] = how
        ORDER[name] = list(order)
    else:
        raise ValueError(
            f"{name}: kept must be 'whole' or one of {', '.join(PARTITION_COLUMNS)}, got {how!r}"
        )
    KEPT.add(name)


_CACHE_SIZE = 64
# Rows kept over every entry: past it the least recently used results are dropped.
MAX_KEPT_ROWS = 4_000_000
# Past this many touched runs one full run is cheaper than a filtered one (each filtered scan
# compares every span's run with the list).
MAX_TOUCHED = 200


@dataclass
class _Kept:
    version: Version
    frame: pd.DataFrame
    stored: bool = False  # the store holds this frame at this version (analytics.kept_store)


_cache: collections.OrderedDict[tuple, _Kept] = collections.OrderedDict()
_cache_lock = threading.Lock()
# Statistics for benchmarks and tests: how each call was answered.
stats: collections.Counter[str] = collections.Counter()


_bypass: contextvars.ContextVar[bool] = contextvars.ContextVar("kept_bypass", default=False)


def clear_cache() -> None:
    """Forget every kept detector result (and stored rows fetched ahead of their reads)."""
    with _cache_lock:
        _cache.clear()
        _scopes.clear()
    with _parts_lock:
        for keeper in PARTS.values():
            keeper.kept.clear()
            keeper.too_many.clear()
    kept_store.forget_fetched()


@contextlib.contextmanager
def computed_in_full() -> Iterator[None]:
    """Within the block every detector runs in full and nothing is kept (a reference to compare
    kept results with)."""
    token = _bypass.set(True)
    try:
        yield
    finally:
        _bypass.reset(token)


def in_full() -> bool:
    """Inside ``computed_in_full``: every read computes (no kept result, no findings table)."""
    return _bypass.get()


def _sorted(frame: pd.DataFrame, order: list[tuple[str, bool]]) -> pd.DataFrame:
    """``frame`` in ``order`` as DuckDB orders (NULLs last; lists element by element); ties keep
    their current order. Only the key columns go through DuckDB; the rows are taken by position."""
    keys = frame[[column for column, _ in order]].reset_index(drop=True)
    keys.columns = [f"k{i}" for i in range(len(order))]
    keys["pos"] = range(len(keys))
    if all(_sorts_alike(keys[f"k{i}"]) for i in range(len(order))):
        # no NULL, and numbers, times or text: pandas orders them as DuckDB does (text by code
        # point, DuckDB's binary collation) without a round trip of the keys (0.1-0.2 s for 44,000
        # repeated_calls rows)
        ascending = [not desc for _, desc in order] + [True]
        positions = keys.sort_values([*keys.columns], ascending=ascending)["pos"].to_numpy()
    else:
        clause = ", ".join(f"k{i}{' DESC' if desc else ''} NULLS LAST" for i, (_, desc) in enumerate(order))
        # the process's in-memory DuckDB: opening one per call cost 0.04-0.05 CPU-s, twice per
        # merge of goal_divergence's rows (its span lists do not sort alike in pandas)
        with memory_cursor() as mem:
            mem.register("keys", keys)
            positions = mem.execute(f"SELECT pos FROM keys ORDER BY {clause}, pos").fetchnumpy()["pos"]
    if len(positions) < 2 or bool((positions[1:] > positions[:-1]).all()):
        return frame  # already in order: no copy of the rows (the caller relies on identity)
    return frame.take(positions).reset_index(drop=True)


def _sorts_alike(column: pd.Series) -> bool:
    """Whether pandas sorts ``column`` as DuckDB's ORDER BY does: no missing value, and numbers,
    times or text only."""
    if column.hasnans:
        return False
    if column.dtype.kind in "biufmM" or isinstance(column.dtype, pd.StringDtype):
        return True
    return column.dtype == object and all(type(value) is str for value in column)


def merge_rows(
    old: pd.DataFrame, keep: pd.Series | np.ndarray, fresh: pd.DataFrame, name: str
) -> pd.DataFrame:
    """The rows of ``old`` where ``keep`` holds, plus ``fresh``, in detector ``name``'s order."""
    kept = _rows_where(old, np.asarray(keep, dtype=bool))
    if kept.empty:
        # Nothing found either way: the kept (empty) frame, whose dtypes a full run gave; an
        # empty frame of a scoped run can carry other dtypes (strings from rows it filtered out).
        return (fresh if not fresh.empty else kept).reset_index(drop=True)
    merged = concat_as_computed(kept, fresh)
    if fresh.empty:
        return _compacted(merged)
    # Both sides are sorted: each fresh row goes after the kept rows that sort at or before it
    # (ties keep kept-before-fresh order), so when the fresh rows land in a few places the rows
    # are put together from slices, and when the first fresh row does not sort before the last
    # kept one (new findings usually come last) the concatenation is the answer.
    order = ORDER[name]
    places = _insertion_points(merged, len(kept), order)
    if places is None:
        return _compacted(_sorted(merged, order))
    if places[0] == len(kept):
        return _compacted(merged)
    pieces, start, fresh_from = [], 0, len(kept)
    for j, place in enumerate([*places, None]):
        if j and place == places[j - 1]:
            continue  # fresh rows with the same place go in one slice
        if j:
            pieces.append(merged.iloc[fresh_from : len(kept) + j])
            fresh_from = len(kept) + j
        if place is not None and place > start:
            pieces.append(merged.iloc[start:place])
            start = place
    pieces.append(merged.iloc[start : len(kept)])
    return _compacted(pd.concat(pieces, ignore_index=True))


# A kept frame is filtered by slices of its runs of kept rows (no copy of Arrow columns) when it
# has at most this many; else by one take.
_MAX_SLICES = 64
# An Arrow column of more chunks than this (slices and concatenations add chunks, merge after
# merge) is made one chunk again.
_MAX_CHUNKS = 32


def _rows_where(frame: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """``frame[keep]``; the touched partitions are usually a few runs of rows, so the rows are
    taken as slices of the runs kept (Arrow columns are not copied; a take copies every list)."""
    if keep.all():
        return frame
    edges = np.flatnonzero(np.diff(keep.astype(np.int8))) + 1
    bounds = np.concatenate(([0], edges, [len(keep)]))
    runs = [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if keep[a]]
    if not runs or len(runs) > _MAX_SLICES:
        return frame[keep]
    return pd.concat([frame.iloc[a:b] for a, b in runs])


def _compacted(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each Arrow-backed column of more than ``_MAX_CHUNKS`` chunks in one chunk."""
    for column in frame.columns:
        values = frame[column].array
        chunked = getattr(values, "_pa_array", None)
        if chunked is not None and chunked.num_chunks > _MAX_CHUNKS:
            combined = chunked.combine_chunks()
            if isinstance(values, pd.arrays.ArrowStringArray):  # keeps its StringDtype's missing value
                frame[column] = pd.Series(type(values)(combined, dtype=values.dtype), index=frame.index)
            else:
                frame[column] = pd.Series(type(values)(combined), index=frame.index)
    return frame


def _insertion_points(
    merged: pd.DataFrame, kept_rows: int, order: list[tuple[str, bool]]
) -> list[int] | None:
    """For each fresh row of ``merged`` (those after its first ``kept_rows``, sorted as the kept
    ones are), how many kept rows sort at or before it: found by bisection where every key
    column sorts alike in pandas and DuckDB. None when the rows must go through ``_sorted``
    instead: a key column that does not sort alike (unless the boundary pair shows the fresh rows
    all come last), or the fresh rows landing in more than ``_MAX_SLICES`` places."""
    columns = [merged[column] for column, _ in order]
    fresh_rows = len(merged) - kept_rows
    # A key column that does not sort alike may hold lists of text (goal_divergence's span ids):
    # those compare as tuples, value by value as the bisection reaches them (a value that is not
    # a list of text gives up: the boundary pair or _sorted decides). Sorting the keys in DuckDB
    # instead cost 0.06 of goal_divergence's update after a batch at 1M spans of 10-call runs.
    alike = [_sorts_alike(column) for column in columns]
    descending = [desc for _, desc in order]

    def key(i: int) -> tuple:
        values = (c.iat[i] if a else _text_list(c.iat[i]) for c, a in zip(columns, alike, strict=True))
        return tuple(_Desc(v) if desc else v for v, desc in zip(values, descending, strict=True))

    places: list[int] = []
    distinct = 0
    try:
        for j in range(fresh_rows):
            place = bisect.bisect_right(
                range(kept_rows), key(kept_rows + j), lo=places[-1] if places else 0, key=key
            )
            distinct += not places or place != places[-1]
            if distinct > _MAX_SLICES:
                return None
            places.append(place)
    except _NotAlike:
        boundary = merged.iloc[[kept_rows - 1, kept_rows]]
        return [kept_rows] * fresh_rows if _sorted(boundary, order) is boundary else None
    return places


class _NotAlike(Exception):
    """A key value that pandas would not compare as DuckDB orders it."""


def _text_list(value) -> tuple[str, ...]:
    """A list of text as a tuple: tuples compare element by element, a prefix first, and text by
    code point, as DuckDB orders lists of text. Anything else (NULL, a NULL element, another
    type) raises ``_NotAlike``."""
    if isinstance(value, list | tuple | np.ndarray) and all(type(item) is str for item in value):
        return tuple(value)
    raise _NotAlike


@functools.total_ordering
class _Desc:
    """A value that sorts in reverse (a descending key column in ``_insertion_points``' tuples)."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.value == other.value

    def __lt__(self, other: _Desc) -> bool:
        return other.value < self.value

    def __hash__(self) -> int:
        return hash(self.value)


def concat_as_computed(kept: pd.DataFrame, fresh: pd.DataFrame) -> pd.DataFrame:
    """``kept`` rows then ``fresh`` ones (both non-empty, or ``fresh`` empty), with the column
    types computing them together gives: a column that is all NULL on one side comes out of
    DuckDB as objects, where a full run would give the other side's type (e.g. text), so the NULL
    side takes it; a text column all missing on both is DuckDB's objects."""
    if fresh.empty:
        return as_duckdb_types(kept.reset_index(drop=True))
    for column_name in kept.columns:
        left, right = kept[column_name], fresh[column_name]
        if left.dtype != right.dtype:
            if right.dtype == object and right.isna().all():
                fresh = fresh.astype({column_name: left.dtype})
            elif left.dtype == object and left.isna().all():
                kept = kept.astype({column_name: right.dtype})
    return as_duckdb_types(pd.concat([kept, fresh], ignore_index=True))


def as_duckdb_types(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each text column whose rows are all missing (or that has no rows) as DuckDB
    gives such a column: objects, each None (DuckDB gives text only when some value is). A subset
    of rows keeps the whole frame's text type; computing the subset alone would not give it."""
    empty = [
        column
        for column, dtype in frame.dtypes.items()
        if isinstance(dtype, pd.StringDtype) and frame[column].count() == 0
    ]
    if not empty:
        return frame
    frame = frame.copy(deep=False)
    for column in empty:
        frame[column] = np.full(len(frame), None, dtype=object)
    return frame


def _merge(old: pd.DataFrame, fresh: pd.DataFrame, column: str, values: list[str], name: str) -> pd.DataFrame:
    """``old`` without the partitions ``values`` of ``column``, plus ``fresh``, in the detector's order."""
    return merge_rows(old, ~old[column].isin(values), fresh[fresh[column].isin(values)], name)


# Detector -> a finer update than its touched partitions (analytics.loops: repeated_calls
# recomputes only the groups of a run new spans may have changed), or for a detector kept whole
# than a full run (analytics.runaway: the span counts of the touched runs only). Called as
# ``refine(conn, compute, window, filters, kept_frame, touched_traces, scope)``; returns the
# frame brought up to date, or None for the partition update.
REFINERS: dict[str, Callable[..., pd.DataFrame | None]] = {}


def refines(name: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as ``name``'s finer update (see ``REFINERS``)."""

    def decorate(func: Callable) -> Callable:
        REFINERS[name] = func
        return func

    return decorate


# Detectors kept whole whose result can be formed from per-run parts (``keeps_parts``):
# runaway_runs' span counts, enforcement_coverage's counts per tool, ... The parts a result was
# formed from are kept with it (by the result frame's identity, as analytics.loops keeps its
# groups), so that after a batch only the touched runs' parts are counted again.
@dataclass
class _Parts:
    count: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame | pa.Table]
    max_rows: int
    # what else the parts depend on (rejection_rates: the bucket width over the whole window)
    depends: Callable[[duckdb.DuckDBPyConnection, Window, Filters], object] | None
    kept: dict[int, tuple[pd.DataFrame, pd.DataFrame | pa.Table, object]]
    too_many: set[tuple]  # result keys (``_key``) whose parts were over ``max_rows``/``max_bytes``
    max_runs: int | None = None
    # Arrow parts kept with their text columns dictionary-encoded (``compact_parts``), at most
    # this many bytes per detector (None: only ``max_rows`` bounds them)
    max_bytes: int | None = None


PARTS: dict[str, _Parts] = {}
# Results whose parts are kept, per detector (the scopes a dashboard and serve keep up to date).
MAX_KEPT_PARTS = 8
# Part rows kept per detector, by default (past them a result is computed in full after each
# batch; runaway_runs and goal_divergence_distribution keep theirs compact and by bytes).
MAX_PART_ROWS = 2_000_000
_parts_lock = threading.Lock()
_given_parts: contextvars.ContextVar[tuple[str, pd.DataFrame | pa.Table] | None] = contextvars.ContextVar(
    "given_parts", default=None
)


def keeps_parts(
    name: str,
    count: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame | pa.Table],
    max_rows: int = MAX_PART_ROWS,
    depends: Callable[[duckdb.DuckDBPyConnection, Window, Filters], object] | None = None,
    max_runs: int | None = None,
    max_bytes: int | None = None,
) -> None:
    """Detector ``name`` (kept whole) can form its result from per-run parts:
    ``count(conn, window, filters)`` returns them (a DataFrame, or an Arrow table: its columns
    keep their SQL types whatever the values), one or more rows per run (column ``run_id``), each
    from that run's spans alone, honouring the shared filter's run scope
    (``sql_loader.run_scope``). After a batch, the parts kept with the result are brought up to
    date (the touched runs counted again; without kept parts, every run is counted) and the
    detector forms its result from them (``given_parts``). Results whose parts are more than
    ``max_rows`` are computed in full after each batch instead. ``depends(conn, window, filters)``:
    what else the parts depend on; kept parts are used only while it gives the same value.
    ``max_runs``: with more runs stored, parts are not counted at all (a full computation costs
    less than counting them once to find them too many). ``max_bytes`` (Arrow parts only): the
    parts are kept compact (``compact_parts``: each text column dictionary-encoded, so a run id,
    agent or crew repeated on many rows is held once) and bounded by their bytes as well; the
    detector then gets text columns of either type, dictionary or plain (``plain_columns``)."""
    PARTS[name] = _Parts(count, max_rows, depends, {}, set(), max_runs, max_bytes)
    REFINERS[name] = functools.partial(update_from_parts, name)


def given_parts(name: str) -> pd.DataFrame | pa.Table | None:
    """Inside detector ``name``: the parts to form its result from, when ``kept_result`` brings a
    kept result up to date (``keeps_parts``); else None (compute it as usual)."""
    given = _given_parts.get()
    return given[1] if given is not None and given[0] == name else None


def update_from_parts(
    name: str,
    conn: duckdb.DuckDBPyConnection,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    window: Window,
    filters: Filters,
    old: pd.DataFrame | None,
    traces: set[str],
    scope: Scope | None,
) -> pd.DataFrame | None:
    """``old`` brought up to date after spans of ``traces`` came: the parts ``old`` was formed
    from, with the touched runs' (``scope.runs``) counted again, then the result formed from them
    by ``compute``. A run named by a touched trace's id (a span without a run counts under its
    trace until a parent gives it one) is dropped too: it may have lost every span. Without kept
    parts (the first batch after a full computation, a result read from the store) every run is
    counted (also for a result computed from nothing: ``old`` None). None (a full computation)
    for a result whose parts were too many to keep."""
    keeper = PARTS[name]
    key = _key(conn, name, window, filters)
    with _parts_lock:
        entry = keeper.kept.pop(id(old), None)
        if key in keeper.too_many:
            return None
    depends = None if keeper.depends is None else keeper.depends(conn, window, filters)
    if entry is not None and old is not None and entry[0] is old and entry[2] == depends:
        counted = _recounted(keeper, conn, window, filters, entry[1], traces, scope)
        stats["parts_kept"] += 1
    else:
        if keeper.max_runs is not None:
            (runs,) = conn.execute("SELECT count(DISTINCT run_id) FROM spans").fetchone()
            if runs > keeper.max_runs:
                with _parts_lock:
                    keeper.too_many.add(key)
                return None
        counted = keeper.count(conn, window, filters)
    token = _given_parts.set((name, counted))
    try:
        frame = compute(conn, window, filters)
    finally:
        _given_parts.reset(token)
    if keeper.max_bytes is not None and len(counted) <= keeper.max_rows:
        counted = compact_parts(counted)
    with _parts_lock:
        if len(counted) > keeper.max_rows or _bytes(counted) > (keeper.max_bytes or math.inf):
            keeper.too_many.add(key)
        elif not _has_runless(counted):
            keeper.kept[id(frame)] = (frame, counted, depends)
            while (
                len(keeper.kept) > MAX_KEPT_PARTS
                or sum(len(p) for _, p, _ in keeper.kept.values()) > keeper.max_rows
                or sum(_bytes(p) for _, p, _ in keeper.kept.values()) > (keeper.max_bytes or math.inf)
            ):
                del keeper.kept[next(iter(keeper.kept))]
    return frame


def _bytes(parts: pd.DataFrame | pa.Table) -> int:
    """The bytes an Arrow table of parts holds, each buffer once (0 for a DataFrame: bounded by
    its rows only). Not ``nbytes``: it counts a dictionary once per chunk referring to it, and a
    batch's filter and concatenation leave many chunks sharing one (690 MB for 101 held, 10M
    spans of 10-call runs)."""
    return parts.get_total_buffer_size() if isinstance(parts, pa.Table) else 0


def compact_parts(parts: pd.DataFrame | pa.Table) -> pd.DataFrame | pa.Table:
    """Arrow ``parts`` with every text column dictionary-encoded (one chunk each): at 10M spans of
    10-call runs runaway_runs' 5.3M count rows take 276 MB so, 632 MB as plain text (each run id
    on ~5 rows, a few agents and crews on every row). Columns already encoded (the kept parts a
    batch's rows were cast to) are left as they are; a DataFrame is returned unchanged."""
    if not isinstance(parts, pa.Table):
        return parts
    text = [pa.types.is_string(f.type) or pa.types.is_large_string(f.type) for f in parts.schema]
    if not any(text):
        return parts
    # Every column one chunk: a batch's filter then leaves one chunk too. Filtered in a query's
    # 43 chunks, the run ids came back as 43 chunks whose dictionaries Arrow no longer saw as one,
    # and making them one chunk again unified a 1M-entry dictionary 43 times (5.3 CPU-s).
    parts = parts.combine_chunks()
    columns = [
        column.dictionary_encode() if is_text else column
        for column, is_text in zip(parts.columns, text, strict=True)
    ]
    return pa.Table.from_arrays(columns, names=parts.column_names)


def plain_columns(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary-encoded columns decoded (for a frame of the few rows a
    detector reports: pandas would make them categorical)."""
    columns = [
        column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
        for column in table.columns
    ]
    return pa.Table.from_arrays(columns, names=table.column_names)


def _recounted(
    keeper: _Parts,
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    parts: pd.DataFrame | pa.Table,
    traces: set[str],
    scope: Scope,
) -> pd.DataFrame | pa.Table:
    """``parts`` with the touched runs (``scope.runs``, and runs named by a touched trace's id)
    counted again."""
    with run_scope(runs=scope.runs, runs_since=scope.since):
        fresh = keeper.count(conn, window, filters)
    return replace_runs(parts, [*scope.runs, *traces], fresh)


def carry_parts(
    name: str,
    conn: duckdb.DuckDBPyConnection,
    window: Window,
    filters: Filters,
    old: pd.DataFrame,
    new: pd.DataFrame,
    traces: set[str],
    scope: Scope,
) -> None:
    """``name``'s result ``old`` was brought up to date as ``new`` by a finer update of its own
    (``REFINERS``), not from its parts: the parts kept with ``old``, the touched runs counted
    again, are kept with ``new`` (else the next update from parts would count every run)."""
    keeper = PARTS[name]
    with _parts_lock:
        entry = keeper.kept.pop(id(old), None)
    if entry is None or entry[0] is not old:
        return
    depends = None if keeper.depends is None else keeper.depends(conn, window, filters)
    if entry[2] != depends:
        return
    counted = _recounted(keeper, conn, window, filters, entry[1], traces, scope)
    stats["parts_kept"] += 1
    with _parts_lock:
        keeper.kept[id(new)] = (new, counted, depends)


def _has_runless(parts: pd.DataFrame | pa.Table) -> bool:
    """Whether some part has no run (it cannot be brought up to date run by run)."""
    if isinstance(parts, pa.Table):
        return parts.column("run_id").null_count > 0
    return bool(parts["run_id"].isna().any())


def replace_runs(
    old: pd.DataFrame | pa.Table, runs: list[str], fresh: pd.DataFrame | pa.Table
) -> pd.DataFrame | pa.Table:
    """``old``'s rows of runs other than ``runs``, plus ``fresh`` (the rows of ``runs``), with the
    column types counting every run gives (``concat_as_computed``; Arrow tables carry their SQL
    types whatever the values, and are concatenated as they are)."""
    if isinstance(old, pa.Table):
        run_type = old.schema.field("run_id").type
        if pa.types.is_dictionary(run_type):  # compact parts (``compact_parts``)
            run_type = run_type.value_type
        dropped = pc.is_in(old.column("run_id"), value_set=pa.array(runs, run_type))
        table = pa.concat_tables([old.filter(pc.invert(dropped)), fresh.cast(old.schema)])
        # a chunk more per batch: past _MAX_CHUNKS the columns are made one chunk again
        return (
            table.combine_chunks()
            if table.num_columns and table.column(0).num_chunks > _MAX_CHUNKS
            else table
        )
    keep = old[~old["run_id"].isin(runs)]
    if keep.empty:
        return fresh.reset_index(drop=True)
    return concat_as_computed(keep, fresh)


_scopes: collections.OrderedDict[tuple, Scope] = collections.OrderedDict()


def _scope_for(
    conn: duckdb.DuckDBPyConnection, identity: tuple, version: Version, touched: set[str]
) -> Scope:
    """``touched_scope`` of these traces at this data version, computed once for every detector
    brought up to date after the same batch (each lookup scans the run and trace columns)."""
    key = (identity, version.spans, version.newest, frozenset(touched))
    with _cache_lock:
        scope = _scopes.get(key)
    if scope is None:
        scope = touched_scope(conn, touched, pd.Index([]))
        with _cache_lock:
            _scopes[key] = scope
            while len(_scopes) > 8:
                _scopes.popitem(last=False)
    return scope


# Partitioned detectors computed from nothing a chunk of runs at a time (their findings of a run
# come from its spans alone, so the chunks' rows together are the full result): in one pass over
# 10M spans of 100,000-call runs, repeated_calls ran out of serve's 1 GiB DuckDB memory (and grew
# to 18.8 GB without a limit). Each chunk holds runs of at most CHUNK_SPANS spans together.
CHUNKED = frozenset({"repeated_calls"})
CHUNK_SPANS = 500_000


def _compute_full(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    window: Window,
    filters: Filters,
) -> pd.DataFrame:
    """``compute(conn, window, filters)``; for a ``CHUNKED`` detector on more than
    ``CHUNK_SPANS`` spans, computed over chunks of runs and merged in the detector's order."""
    if name not in CHUNKED:
        return compute(conn, window, filters)
    runs = conn.execute(
        "SELECT run_id, count(*) AS n, min(Timestamp) AS first FROM spans WHERE run_id IS NOT NULL "
        "GROUP BY run_id ORDER BY first, run_id"
    ).fetchall()
    if sum(n for _, n, _ in runs) <= CHUNK_SPANS:
        return compute(conn, window, filters)
    chunks: list[list[tuple]] = [[]]
    held = 0
    for row in runs:
        if chunks[-1] and held + row[1] > CHUNK_SPANS:
            chunks.append([])
            held = 0
        chunks[-1].append(row)
        held += row[1]
    stats["chunks"] += len(chunks)
    frame = None
    for chunk in chunks:
        with run_scope(runs=[run for run, _, _ in chunk], runs_since=min(first for _, _, first in chunk)):
            part = compute(conn, window, filters)
        frame = part if frame is None else merge_rows(frame, np.ones(len(frame), dtype=bool), part, name)
    return frame


def result_code(compute: Callable) -> str:
    """The code hash stored results of the detector ``compute`` are valid for
    (``kept_store.code_fingerprint`` of the module that defines it)."""
    return kept_store.code_fingerprint(frozenset({inspect.unwrap(compute).__module__}))


def has_result(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    window: Window,
    filters: Filters,
) -> bool:
    """Whether ``kept_result`` would start from a result at hand (kept in this process, or stored
    by this code for that scope) rather than compute one from nothing."""
    key = _key(conn, name, window, filters)
    if key is None:
        return False
    with _cache_lock:
        if key in _cache:
            return True
    scope = kept_store.scope_text(window, filters, key[4])
    return kept_store.has_stored(conn, name, scope, result_code(compute))


def _key(conn: duckdb.DuckDBPyConnection, name: str, window: Window, filters: Filters) -> tuple | None:
    """(database identity, name, window, filters, side-effect tools): the key a result is kept
    under, or None when ``name``'s results are not kept for ``conn``."""
    identity = database_identity(conn) if name in KEPT and not _bypass.get() else None
    return None if identity is None else (identity, name, window, filters, current_side_effect_tools())


def is_kept(conn: duckdb.DuckDBPyConnection, name: str, window: Window, filters: Filters) -> bool:
    """Whether this process keeps ``name``'s result for this scope (``kept_result`` then brings
    that result up to date rather than compute one)."""
    key = _key(conn, name, window, filters)
    with _cache_lock:
        return key is not None and key in _cache


def kept_version(
    conn: duckdb.DuckDBPyConnection, name: str, window: Window, filters: Filters
) -> Version | None:
    """The data version of ``name``'s result this process keeps for this scope (None if none)."""
    key = _key(conn, name, window, filters)
    with _cache_lock:
        entry = None if key is None else _cache.get(key)
    return None if entry is None else entry.version


def stored_runs(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    filters: Filters,
    runs: set[str],
) -> tuple[Version, pd.DataFrame] | None:
    """The rows of ``runs`` in ``name``'s stored all-time result for ``filters`` and its data
    version, when this process keeps no such result, the store holds one of this code and no
    span came since; else None (``kept_result_at`` then brings the whole result up to date).
    Only those rows are decoded, and nothing is kept: a window over a tenth of a store's runs
    converts a tenth of its result (``analytics.window_scope``)."""
    key = _key(conn, name, Window(), filters)
    with _cache_lock:
        if key is None or key in _cache:
            return None
    loaded = kept_store.load_encoded(
        conn, name, kept_store.scope_text(Window(), filters, key[4]), result_code(compute)
    )
    if loaded is None:
        return None
    version, touched = read_version(conn, loaded[0])
    if touched is None or touched or version.spans != loaded[0].spans:
        return None
    frame = kept_store.decoded_runs(name, loaded[1], runs)
    if frame is None:
        return None
    stats["loaded_runs"] += 1
    return loaded[0], frame


def seed(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window,
    filters: Filters,
    version: Version,
    frame: pd.DataFrame,
) -> None:
    """Keep ``frame`` as ``name``'s result for this scope at ``version`` (unless one is kept):
    the result derived for a window (``analytics.window_scope``), so a later call brings it up
    to date like any kept result. ``version`` may be older than the data ``frame`` saw: the runs
    touched since are computed again, which gives the same rows."""
    key = _key(conn, name, window, filters)
    if key is None:
        return
    with _cache_lock:
        if key in _cache:
            return
        _cache[key] = _Kept(version, frame)
        _evict()


def kept_result(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    window: Window,
    filters: Filters,
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """The result of detector ``name`` (``compute``) over ``window`` / ``filters``, from the kept
    result brought up to date (see the module docstring); equal to ``compute(conn, window, filters)``.

    ``columns``: only those columns (``project``). A stored result that is up to date is then
    decoded for those columns only and not kept (a later whole read decodes it whole); any other
    answer is the whole result, kept as usual, projected."""
    # pandas copy-on-write: a caller changing the frame changes its own copy, never the kept one.
    return project(_up_to_date(conn, name, compute, window, filters, columns)[1], columns)


def kept_result_at(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    window: Window,
    filters: Filters,
) -> tuple[Version | None, pd.DataFrame]:
    """``kept_result`` (every column) with the data version it is of (None when not kept)."""
    version, frame = _up_to_date(conn, name, compute, window, filters, None)
    return version, project(frame, None)


def _up_to_date(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    compute: Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame],
    window: Window,
    filters: Filters,
    columns: list[str] | None,
) -> tuple[Version | None, pd.DataFrame]:
    """``kept_result``'s answer before projection, with its data version (None if not kept).

    One thread at a time brings a key's result up to date (``_one_flight``): a request arriving
    while serve's worker (or another request) computes the same result waits for that answer
    and reads it, instead of computing it a second time beside it."""
    key = _key(conn, name, window, filters)
    if key is None:  # nothing kept: in-memory DuckDB, ClickHouse, or a reference in full
        if is_clickhouse(conn):
            return None, compute(conn, window, filters)
        # A reference computed in full over 10M spans must stay within memory as the kept path
        # does: repeated_calls in one pass took the hot-key benchmark to 23 GB and the kernel's
        # kill (8.7 GB at 3M spans); in chunks of runs it is the same rows.
        return None, _compute_full(conn, name, compute, window, filters)
    with _one_flight(key):
        identity, tools = key[0], key[4]
        with _cache_lock:
            kept = _cache.get(key)
        checked = None
        if kept is None:  # not kept in this process: start from the stored result, if any
            loaded = kept_store.load_encoded(
                conn, name, kept_store.scope_text(window, filters, tools), result_code(compute)
            )
            if loaded is not None and columns is not None:
                checked = read_version(conn, loaded[0])
                if checked[1] is not None and not checked[1] and checked[0].spans == loaded[0].spans:
                    part = kept_store.decoded(name, loaded[1], columns)
                    if part is not None:
                        stats["loaded_columns"] += 1
                        return None, part
            frame = None if loaded is None else kept_store.decoded(name, loaded[1])
            if frame is not None:
                kept = _Kept(loaded[0], frame, stored=True)
                stats["loaded"] += 1
            else:
                checked = None
        version, touched = checked or read_version(conn, kept.version if kept is not None else None)
        frame = None
        stored = False
        if kept is not None and touched is not None:
            if not touched and version.spans == kept.version.spans:
                frame = kept.frame
                stored = kept.stored
                stats["unchanged"] += 1
            elif name in PARTITIONS:
                scope = _scope_for(conn, identity, version, touched)
                if len(scope.runs) <= MAX_TOUCHED:
                    column = PARTITIONS[name]
                    if column == "origin_task_id":
                        values, limit = scope.origin_tasks, {"origin_tasks": scope.origin_tasks}
                    else:
                        values, limit = scope.runs, {"runs": scope.runs, "runs_since": scope.since}
                    if values:
                        refine = REFINERS.get(name)
                        if refine is not None:
                            frame = refine(conn, compute, window, filters, kept.frame, touched, scope)
                            stats["refined"] += frame is not None
                        if frame is None:
                            with run_scope(**limit):
                                fresh = compute(conn, window, filters)
                            frame = _merge(kept.frame, fresh, column, values, name)
                    else:
                        frame = kept.frame
                    stats["partial"] += 1
            elif name in REFINERS:  # kept whole, with a finer update of its own (runaway_runs' counts)
                scope = _scope_for(conn, identity, version, touched)
                if len(scope.runs) <= MAX_TOUCHED:
                    frame = REFINERS[name](conn, compute, window, filters, kept.frame, touched, scope)
                    stats["refined"] += frame is not None
        if frame is None:
            if name in PARTS:  # from every run's parts, kept for the next batch (unless too many)
                frame = update_from_parts(name, conn, compute, window, filters, None, set(), None)
            if frame is None:
                frame = _compute_full(conn, name, compute, window, filters)
            stats["full"] += 1
        with _cache_lock:
            _cache[key] = _Kept(version, frame, stored)
            _cache.move_to_end(key)
            _evict()
        return version, frame


class _Flight:
    """The lock of one kept key while some thread holds or waits for it (re-entrant: a detector
    may read another's kept result, never its own, but a nested read of the same key must not
    wait for itself)."""

    __slots__ = ("lock", "__weakref__")

    def __init__(self) -> None:
        self.lock = threading.RLock()


# One entry per key some thread holds or waits for (weak: gone once no thread refers to it).
_flights: weakref.WeakValueDictionary[tuple, _Flight] = weakref.WeakValueDictionary()


def _flight(key: tuple) -> _Flight:
    with _cache_lock:
        flight = _flights.get(key)
        if flight is None:
            flight = _flights[key] = _Flight()
        return flight


@contextlib.contextmanager
def _one_flight(key: tuple) -> Iterator[None]:
    """The block run by one thread at a time for ``key`` (``_Flight``); a thread that waits is
    counted (``stats["waited"]``)."""
    flight = _flight(key)  # held here: the entry lives while a thread holds or waits for it
    if not flight.lock.acquire(blocking=False):
        stats["waited"] += 1
        flight.lock.acquire()
    try:
        yield
    finally:
        flight.lock.release()


def _evict() -> None:
    """Drop the least recently used results past the bounds (``_cache_lock`` held): entries and
    rows kept. Results of a window go first: a dashboard's relative windows and every alert
    evaluation ("since 15 minutes ago") make new keys, and must not push out the all-time results
    serve keeps up to date (computing one again costs far more than a window's)."""
    while len(_cache) > 1 and (
        len(_cache) > _CACHE_SIZE or sum(len(k.frame) for k in _cache.values()) > MAX_KEPT_ROWS
    ):
        oldest_window = next((key for key in _cache if key[2] != Window()), None)
        if oldest_window is not None:
            del _cache[oldest_window]
        else:
            _cache.popitem(last=False)


def project(frame: pd.DataFrame, columns: list[str] | None) -> pd.DataFrame:
    """``frame``'s ``columns`` (in that order, those it has; all when None), a shallow copy."""
    if columns is None:
        return frame.copy(deep=False)
    return frame[[c for c in dict.fromkeys(columns) if c in frame.columns]].copy(deep=False)


def unstored(identity: tuple, window: Window, filters: Filters) -> list[tuple[str, Version, pd.DataFrame]]:
    """(name, version, frame) of every result kept for the database ``identity`` and this scope
    (under the side-effect tool pattern in force) that the store does not hold at its version."""
    tools = current_side_effect_tools()
    with _cache_lock:
        return [
            (key[1], entry.version, entry.frame)
            for key, entry in _cache.items()
            if key[0] == identity and key[2:] == (window, filters, tools) and not entry.stored
        ]


def mark_stored(identity: tuple, name: str, window: Window, filters: Filters, version: Version) -> None:
    """Record that the store now holds ``name``'s result at ``version`` (unless it moved on)."""
    key = (identity, name, window, filters, current_side_effect_tools())
    with _cache_lock:
        entry = _cache.get(key)
        if entry is not None and entry.version is version:
            entry.stored = True
