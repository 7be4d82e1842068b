"""Findings tables on a ClickHouse store: ``analytics.materialize``'s design on ClickHouse's operations.

The store's writer logs, around every write of `spans`, the runs and origin tasks it touched
(``change_partitions``, then a ``change_log`` row once the spans are written: the collector's
``clickhouse_changes``). A pass here reads that log in ``seq`` order up to the newest change
below any change still being written, and brings each result of ``maintained()`` up to date with
the same compute functions as on DuckDB (translated by ``analytics.dialect``):

* a result partitioned by ``run_id`` / ``origin_task_id`` recomputes the partitions logged since
  the change its table reflects; one with no partition (its answer depends on every run) is
  recomputed whole, at most every ``WHOLE_INTERVAL_S`` under ingest. run_summary is one of these
  here: assembled from the other tables (no span read), whole;
* DuckDB's per-span and per-(run, tool) folds (``analytics.loops_fold``, the comparison's tables)
  are DuckDB and Python: here repeated_calls and runaway_runs are their detectors' full
  computations scoped to the touched runs (and whole), and the comparison keeps no tables.

ClickHouse cannot replace a partition's rows in a transaction, so rows are versioned: every write
inserts the partition's new rows with a new ``_ver`` and then a ``findings_parts`` row naming
that version current for the partition; reads take, per partition, the rows of its newest version
at or above the state's ``base`` (a rebuild, a whole recomputation, moves ``base`` past every
older row). A kill between the rows and the marker leaves rows no read takes; between the marker
and the ``findings_state`` row, a table a little ahead of its state, recomputed again next pass.
Older versions are deleted by ``prune`` (lightweight DELETE: the rows are not read any more).

Reads (``read_findings``, ``freshness``) are SELECTs with DuckDB's read semantics; what the
tables cannot answer (a window, a service or agent filter, a table not built) is None and the
caller computes. Thresholds and goal scores (``inputs``) are part of a table's version: when they
change, the tables are rebuilt (on DuckDB such writes log a change; here they are written by
other processes, e.g. ``driftscope calibrate --store``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analytics import materialize
from analytics.engine import _naive_utc
from analytics.materialize import POSITION, Maintained, PassReport, State
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

PART, VERSION = "_part", "_ver"  # a row's partition key ('' when whole) and its write's version
NULL_FLAG = "_null_"  # a list column's NULL flag column (ClickHouse arrays are never NULL)
NULL_PART = "\x00"  # the partition of a row whose key is NULL (only an unscoped write writes it)
# Past this many touched partitions and this share of all, one unscoped computation (as DuckDB)
MANY_KEYS, MANY_SHARE, CHUNK_KEYS = materialize.MANY_KEYS, materialize.MANY_SHARE, materialize.CHUNK_KEYS
WHOLE_INTERVAL_S = materialize.WHOLE_INTERVAL_S
PRUNE_EVERY = 20  # passes that wrote something between two prunes


@dataclass
class ChState(State):
    """A ``findings_state`` row on ClickHouse: ``base``, the oldest row version reads take."""

    base: int = 0


def maintained() -> dict[str, Maintained]:
    """What is kept on ClickHouse: DuckDB's registry (``materialize.maintained``) without the
    per-span and per-(run, tool) folds and the comparison's tables; a result reading those is its
    detector's full computation, and run_summary (assembled from the other tables) is whole."""
    items = materialize.maintained()
    out: dict[str, Maintained] = {}
    for name, item in items.items():
        if (
            name.startswith("compare_")
            or name == materialize.RUN_ACTORS
            or item.partition in ("span", "run_tool")
        ):
            continue
        if item.depends and item.extra_keys is None:  # a fold's reader: its own computation
            if item.detector is None:
                continue
            item = dataclasses.replace(item, compute=materialize.detector_compute(item.detector), depends=())
        elif item.depends:  # run_summary: its runs changed by other tables are not logged here
            item = dataclasses.replace(
                item, partition=None, depends=tuple(d for d in item.depends if d in out)
            )
        version = item.version.split("|")[0] + "|" + materialize._settings_version() + "|ch1"
        out[name] = dataclasses.replace(
            item, version=version, extra_keys=None, touched=None, apply=None, build=None
        )
    return out


# ----------------------------------------------------------------------------------------- store


def _t(store, name: str) -> str:
    return f"`{store.database}`.`{name}`"


def _rows(store, sql: str, params: dict[str, Any] | None = None) -> list[dict]:
    return store.execute(sql, params).to_pylist()


def inputs(store) -> str:
    """What every table also depends on besides the spans: the thresholds and goal scores stored."""
    row = _rows(
        store,
        f"SELECT (SELECT count() FROM {_t(store, 'thresholds')} FINAL) AS t, "
        f"(SELECT toString(max(created_at)) FROM {_t(store, 'thresholds')}) AS tm, "
        f"(SELECT count() FROM {_t(store, 'goal_scores')} FINAL) AS g, "
        f"(SELECT toString(max(created_at)) FROM {_t(store, 'goal_scores')}) AS gm",
    )[0]
    return f"{row['t']}@{row['tm']},{row['g']}@{row['gm']}"


def read_states(store) -> dict[str, ChState]:
    """Every ``findings_state`` row by result (empty when the store has no such table)."""
    try:
        rows = _rows(
            store,
            "SELECT metric, version, seq, base, rows, failed_keys, last_error "
            f"FROM {_t(store, 'findings_state')} FINAL",
        )
    except Exception:  # noqa: BLE001 - a store created before findings tables: every read computes
        return {}
    return {
        r["metric"]: ChState(
            r["version"],
            r["seq"] if r["seq"] >= 0 else None,
            r["rows"],
            json.loads(r["failed_keys"]) if r["failed_keys"] else [],
            r["last_error"] or None,
            r["base"],
        )  # fmt: skip
        for r in rows
    }


def target_change(store) -> int:
    """The newest committed change below every change begun and not committed (its spans may not
    all be written yet): what a pass may bring the tables up to."""
    try:
        return int(
            _rows(
                store,
                f"SELECT max(seq) AS s FROM {_t(store, 'change_log')} WHERE seq < coalesce(("
                f"SELECT minOrNull(seq) FROM {_t(store, 'change_partitions')} "
                f"WHERE seq NOT IN (SELECT seq FROM {_t(store, 'change_log')})), 18446744073709551615)",
            )[0]["s"]
            or 0
        )
    except Exception:  # noqa: BLE001 - no change log: nothing to bring up to date
        return 0


def _touched(store, partition: str, after: int, upto: int) -> list[str]:
    rows = store.execute(
        f"SELECT DISTINCT key FROM {_t(store, 'change_partitions')} WHERE partition = {{p:String}} "
        "AND seq > {a:UInt64} AND seq <= {u:UInt64}",
        {"p": partition, "a": after, "u": upto},
    )
    return rows.column("key").to_pylist() if rows.num_rows else []


def _count(store, sql: str) -> int:
    return int(_rows(store, sql)[0]["n"])


def _columns(store, table: str) -> dict[str, str]:
    rows = store.execute(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} "
        "ORDER BY position",
        {"db": store.database, "t": table},
    ).to_pylist()
    return {r["name"]: r["type"] for r in rows}


# ---------------------------------------------------------------------------------------- writes

_INTS = {8: "Int8", 16: "Int16", 32: "Int32", 64: "Int64"}


def _scalar_type(kind: pa.DataType) -> str:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind):
        return "String"
    if pa.types.is_boolean(kind):
        return "Bool"
    if pa.types.is_signed_integer(kind):
        return _INTS[kind.bit_width]
    if pa.types.is_unsigned_integer(kind):
        return "U" + _INTS[kind.bit_width]
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "Float64"
    if pa.types.is_timestamp(kind):
        return "DateTime64(6, 'UTC')"
    if pa.types.is_date(kind):
        return "Date32"
    raise TypeError(f"findings column of Arrow type {kind} has no ClickHouse type here")


def _ch_type(kind: pa.DataType) -> str:
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"Array(Nullable({_scalar_type(kind.value_type)}))"
    return f"Nullable({_scalar_type(kind)})"


def _stored(rows: pa.Table, partition: str | None, ver: int) -> pa.Table:
    """``rows`` (``materialize._arrow``'s) as stored: list NULLs as [] plus a flag, the partition
    key and the version."""
    columns, names = [], []
    for name, column in zip(rows.column_names, rows.columns, strict=True):
        kind = column.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            null = pc.is_null(column)
            columns += [pc.if_else(null, pa.scalar([], kind), column), pc.cast(null, pa.uint8())]
            names += [name, NULL_FLAG + name]
            continue
        if pa.types.is_decimal(kind):
            column = pc.cast(column, pa.float64())
        columns.append(column)
        names.append(name)
    if partition is None:
        part = pa.array([""] * rows.num_rows, pa.string())
    else:
        part = pc.fill_null(pc.cast(rows.column(partition), pa.string()), NULL_PART)
    columns += [part, pa.array([ver] * rows.num_rows, pa.uint64())]
    names += [PART, VERSION]
    return pa.table(columns, names=names)


_ARROW = {
    **{f"Int{b}": getattr(pa, f"int{b}")() for b in (8, 16, 32, 64)},
    **{f"UInt{b}": getattr(pa, f"uint{b}")() for b in (8, 16, 32, 64)},
    "Float64": pa.float64(), "Bool": pa.bool_(), "String": pa.string(), "Date32": pa.date32(),
    "DateTime64(6, 'UTC')": pa.timestamp("us", "UTC"),
}  # fmt: skip


def _arrow_type(kind: str) -> pa.DataType | None:
    """The Arrow type of a findings table's ClickHouse column type (None: not one of ours)."""
    inner = kind.removeprefix("Array(")
    listed = inner != kind
    inner = inner.removesuffix(")") if listed else inner
    inner = inner.removeprefix("Nullable(").removesuffix(")") if inner.startswith("Nullable(") else inner
    scalar = _ARROW.get(inner)
    return pa.list_(scalar) if listed and scalar is not None else scalar


def _ensure_table(store, item: Maintained, rows: pa.Table) -> pa.Table:
    """Create ``item``'s table from its first rows, or add the columns it lacks; returns ``rows``
    in the table's types. A computation's column may come in another type than the table's
    (integers with a NULL come back from ClickHouse as floats): cast when no value changes,
    else a NULL-only column takes the new type and an integer column widens to Float64."""
    table = item.table
    have = _columns(store, table)
    given = {
        name: _ch_type(rows.column(name).type)
        for name in rows.column_names
        if not name.startswith(NULL_FLAG) and name not in (PART, VERSION, POSITION)
    }
    flags = {name: "UInt8" for name in rows.column_names if name.startswith(NULL_FLAG)}
    if not have:
        spec = ", ".join(f"`{n}` {k}" for n, k in {**given, **flags}.items())
        store.command(
            f"CREATE TABLE IF NOT EXISTS {_t(store, table)} ({spec}, `{PART}` String, `{VERSION}` UInt64, "
            f"`{POSITION}` Int64) ENGINE = MergeTree ORDER BY (`{PART}`, `{VERSION}`, `{POSITION}`)"
        )
        return rows
    for name, kind in {**given, **flags}.items():
        if name not in have:
            store.command(f"ALTER TABLE {_t(store, table)} ADD COLUMN `{name}` {kind}")
            continue
        if have[name] == kind or rows.column(name).null_count == rows.num_rows:
            continue
        target = _arrow_type(have[name])
        if target is not None:
            try:
                cast = pc.cast(rows.column(name), target, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                cast = None
            column = rows.column(name)
            if cast is not None and pc.all(pc.equal(pc.cast(cast, column.type), column)).as_py() is not False:
                rows = rows.set_column(rows.schema.get_field_index(name), name, cast)
                continue
        widen = kind == "Nullable(Float64)" and have[name].startswith("Nullable(Int")
        if widen or not _count(store, f"SELECT count(`{name}`) AS n FROM {_t(store, table)}"):
            store.command(f"ALTER TABLE {_t(store, table)} MODIFY COLUMN `{name}` {kind}")
            continue
        raise TypeError(
            f"{item.name}: column {name} was {have[name]}, now {kind}; bump the detector's "
            "version so its table is rebuilt"
        )
    return rows


def _write_rows(store, item: Maintained, frame, keys: list[str] | None, ver: int) -> int:
    """Insert ``frame``'s rows as version ``ver`` and make it current for ``keys`` (for the
    partitions the rows name when None: an unscoped write). Returns the rows written."""
    rows = materialize._arrow(frame) if frame is not None else None
    stored = _stored(rows, item.partition, ver) if rows is not None else None
    if stored is not None and stored.num_rows:
        stored = _ensure_table(store, item, stored)
        store.insert_arrow(item.table, stored)
    if keys is None:
        keys = [""] if item.partition is None else (
            pc.unique(stored.column(PART)).to_pylist() if stored is not None else []
        )  # fmt: skip
    if keys:
        store.insert_arrow(
            "findings_parts",
            pa.table(
                {
                    "metric": [item.name] * len(keys),
                    "key": keys,
                    "ver": pa.array([ver] * len(keys), pa.uint64()),
                }
            ),
        )
    return stored.num_rows if stored is not None else 0


def _write_state(store, item: Maintained, version: str, seq: int | None, base: int, ver: int,
                 rows: int = 0, failed: list[str] | None = None, error: str | None = None) -> None:  # fmt: skip
    store.insert_arrow(
        "findings_state",
        pa.table(
            {
                "metric": [item.name],
                "version": [version],
                "seq": pa.array([-1 if seq is None else seq], pa.int64()),
                "base": pa.array([base], pa.uint64()),
                "rows": pa.array([rows], pa.uint64()),
                "failed_keys": [json.dumps(sorted(failed)) if failed else ""],
                "last_error": [error or ""],
                "updated_at": pa.array([datetime.now(UTC)], pa.timestamp("us", "UTC")),
                "ver": pa.array([ver], pa.uint64()),
            }  # fmt: skip
        ),
    )


class _Versions:
    """Row versions: increasing, past every version the store holds (a restart continues)."""

    def __init__(self, store) -> None:
        held = _rows(
            store,
            f"SELECT greatest((SELECT max(ver) FROM {_t(store, 'findings_parts')}), "
            f"(SELECT max(ver) FROM {_t(store, 'findings_state')})) AS v",
        )[0]["v"]
        self.last = int(held or 0)

    def next(self) -> int:
        self.last = max(self.last + 1, time.time_ns())
        return self.last


# ---------------------------------------------------------------------------------------- passes


def bring_up_to_date(
    store,
    names: list[str] | None = None,
    whole_due: Callable[[str], bool] | None = None,
    turn: threading.Lock | None = None,
    versions: _Versions | None = None,
) -> PassReport:
    """One pass: bring every result (of ``names``, and what they read) up to the newest change a
    pass may take (``target_change``). ``whole_due(name)``: whether a result kept whole may be
    recomputed now (None: always). ``turn``: held while each result is computed and written (serve
    shares the store's session with its reads)."""
    report = PassReport(recomputed={}, failed={})
    target = report.target = target_change(store)
    states = read_states(store)
    items = maintained()
    fingerprint = inputs(store)
    versions = versions or _Versions(store)
    if names is not None:
        wanted, names = list(names), set()
        while wanted:
            name = wanted.pop()
            if name not in names:
                names.add(name)
                wanted += list(items[name].depends) if name in items else []
    current: set[str] = set()
    totals: dict[str, int] = {}
    for name, item in items.items():
        if names is not None and name not in names:
            continue
        version = f"{item.version}|inputs={fingerprint}"
        state = states.get(name)
        fresh = state is not None and state.version == version and state.seq is not None
        if fresh and state.seq >= target:
            current.add(name)
            continue
        if any(first not in current for first in item.depends):
            continue
        if item.partition is None and fresh and whole_due is not None and not whole_due(name):
            continue
        started = time.perf_counter()
        try:
            with turn or nullcontext():
                report.recomputed[name] = _bring_one(
                    store, item, version, state if fresh else None, target, versions, totals
                )
            current.add(name)
        except Exception as exc:  # noqa: BLE001 - one result's failure must not stop the others
            message = f"{type(exc).__name__}: {exc}"
            logger.warning("materializer (ClickHouse): %s not brought up to date: %s", name, message)
            report.failed[name] = message
            if state is not None:
                try:
                    _write_state(store, item, state.version, state.seq, state.base, versions.next(),
                                 state.rows, state.failed_keys, message)  # fmt: skip
                except Exception:  # noqa: BLE001 - the store itself is failing: health says so
                    logger.debug("could not record the failure of %s", name, exc_info=True)
        finally:
            report.compute_seconds[name] = time.perf_counter() - started
    return report


def _bring_one(store, item: Maintained, version: str, state: ChState | None, target: int,
               versions: _Versions, totals: dict[str, int]) -> int:  # fmt: skip
    """Bring ``item`` from ``state`` (None: not built by this version) to ``target``; returns the
    partitions recomputed (-1: whole)."""
    if item.partition is None:
        ver = versions.next()
        rows = _write_rows(store, item, item.compute(store, None, None), None, ver)
        _write_state(store, item, version, target, ver, versions.next(), rows)
        return -1
    keys = None if state is None else _touched(store, item.partition, state.seq, target)
    if state is None or _unscoped(store, keys, item.partition, totals):
        if state is None:  # another definition's rows: reads compute until the table is rebuilt
            _write_state(store, item, version, None, 0, versions.next())
            store.command(f"DROP TABLE IF EXISTS {_t(store, item.table)} SYNC")
        ver = versions.next()
        rows = _write_rows(store, item, item.compute(store, item.partition, None), None, ver)
        _write_state(store, item, version, target, ver, versions.next(), rows)
        return -1 if keys is None else len(keys)
    failed = [key for key in state.failed_keys if key not in set(keys)]
    error = None
    for start in range(0, len(keys), CHUNK_KEYS):
        chunk = keys[start : start + CHUNK_KEYS]
        frame, bad, message = materialize._compute_keys(store, item, chunk)
        failed += bad
        error = message or error
        _write_rows(store, item, frame, [key for key in chunk if key not in set(bad)], versions.next())
    _write_state(store, item, version, target, state.base, versions.next(), state.rows, failed, error)
    return len(keys)


def _unscoped(store, keys: list[str] | None, partition: str, totals: dict[str, int]) -> bool:
    """Whether ``keys`` are better computed as one unscoped computation (most partitions)."""
    if keys is None or len(keys) <= MANY_KEYS:
        return False
    if partition not in totals:
        totals[partition] = _count(
            store,
            f"SELECT uniqExact(`{partition}`) AS n FROM {_t(store, 'spans')} WHERE `{partition}` IS NOT NULL",
        )
    return len(keys) >= MANY_SHARE * totals[partition]


def _current(store, name: str, base: int) -> str:
    """The (partition, version) pairs a read of ``name`` takes (a subquery)."""
    return (
        f"SELECT key, max(ver) FROM {_t(store, 'findings_parts')} WHERE metric = '{name}' "
        f"GROUP BY key HAVING max(ver) >= {int(base)}"
    )


def prune(store) -> int:
    """Delete the rows no read takes any more (older versions, partitions a rebuild left) and
    the change log every table consumed (never the newest entry). Returns the results pruned."""
    states = read_states(store)
    pruned = 0
    for name, item in maintained().items():
        state = states.get(name)
        if state is None or state.seq is None or not _columns(store, item.table):
            continue
        store.command(
            f"DELETE FROM {_t(store, item.table)} WHERE (`{PART}`, `{VERSION}`) NOT IN ({_current(store, name, state.base)})"
        )
        store.command(
            f"DELETE FROM {_t(store, 'findings_parts')} WHERE metric = '{name}' AND ver < {int(state.base)}"
        )
        pruned += 1
    seqs = [states[n].seq for n in maintained() if n in states and states[n].seq is not None]
    if seqs and len(seqs) == len(maintained()):
        floor = min(min(seqs), target_change(store) - 1)
        for table in ("change_log", "change_partitions"):
            store.command(f"DELETE FROM {_t(store, table)} WHERE seq <= {int(floor)}")
    return pruned


# ----------------------------------------------------------------------------------------- reads


def ready(store, name: str) -> ChState | None:
    """The state of ``name``'s table when it can answer reads (built by this definition)."""
    item = maintained().get(name)
    state = read_states(store).get(name) if item is not None else None
    if state is None or state.seq is None or state.version.split("|inputs=")[0] != item.version:
        return None
    return state


def _run_behind(store, state: ChState, run: str) -> bool:
    return bool(
        _count(
            store,
            f"SELECT count() AS n FROM {_t(store, 'change_partitions')} WHERE partition = 'run_id' "
            f"AND key = {_quote(run)} AND seq > {int(state.seq)}",
        )
    )


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def read_findings(store, name: str, window: Window = Window(), filters: Filters = Filters(),
                  columns: list[str] | None = None, documented: list[str] | None = None,
                  runs: list[str] | None = None) -> pd.DataFrame | None:  # fmt: skip
    """``materialize.read_findings`` on ClickHouse: ``name``'s current rows (only ``columns``,
    only the rows of ``runs``), in DuckDB's read order; None when the tables cannot answer."""
    item = maintained().get(name)
    if item is None or window != Window() or filters.reads_spans():
        return None
    if filters.service is not None or filters.agent is not None or filters.origin_task is not None:
        return None
    if filters.run is not None and item.partition != "run_id":
        return None
    state = ready(store, name)
    if state is None or (filters.run is not None and _run_behind(store, state, filters.run)):
        return None
    have = _columns(store, item.table)
    wanted = list(
        columns or documented or [c for c in have if not c.startswith(("_null_", "_part", "_ver", "_pos"))]
    )
    if not have:
        frame = pd.DataFrame({column: pd.Series(dtype=object) for column in wanted})
        frame.attrs["source"] = "table"
        return frame
    flags = [NULL_FLAG + c for c in wanted if NULL_FLAG + c in have]
    select = ", ".join(f"`{c}`" for c in wanted + flags)
    order = [f"`{c}`{' DESC' if d else ''} NULLS LAST" for c, d in item.order]
    if item.partition is not None:
        order.append(f"`{item.partition}` NULLS LAST")
    where = f"(`{PART}`, `{VERSION}`) IN ({_current(store, name, state.base)})"
    params: dict[str, Any] = {}
    if filters.run is not None:
        where += " AND run_id = {run:String}"
        params["run"] = filters.run
    if runs is not None:
        where += " AND run_id IN {runs:Array(String)}"
        params["runs"] = list(runs)
    table = _naive_utc(
        store.execute(
            f"SELECT {select} FROM {_t(store, item.table)} WHERE {where} ORDER BY {', '.join([*order, POSITION])}",
            params or None,
        )
    )
    for flag in flags:  # [] flagged NULL back to NULL
        name_ = flag[len(NULL_FLAG) :]
        column = table.column(name_)
        null = pc.equal(table.column(flag), 1)
        table = table.set_column(
            table.schema.get_field_index(name_), name_, pc.if_else(null, pa.scalar(None, column.type), column)
        )
    table = table.select(wanted)
    frame = table.to_pandas(types_mapper=materialize.pandas_type)
    frame.attrs["source"] = "table"
    return frame


def freshness(store, names: list[str] | None = None) -> dict[str, Any]:
    """``materialize.freshness`` on ClickHouse: ``findings_as_of`` (when the oldest change every
    result of ``names`` reflects was committed), ``lag_seconds`` (age of the oldest committed
    change one does not reflect yet), ``behind_changes``."""
    states, items = read_states(store), maintained()
    wanted = [n for n in (names or list(items)) if n in items]
    out: dict[str, Any] = {"findings_as_of": None, "lag_seconds": None, "behind_changes": None}
    seqs = []
    for name in wanted:
        state = states.get(name)
        ok = (
            state is not None
            and state.seq is not None
            and state.version.split("|inputs=")[0] == items[name].version
        )
        seqs.append(state.seq if ok else None)
    if not wanted or any(s is None for s in seqs):
        return out
    floor = min(seqs)
    log = _t(store, "change_log")
    row = _rows(
        store,
        f"SELECT (SELECT max(seq) FROM {log}) AS newest, "
        f"(SELECT anyOrNull(committed_at) FROM {log} WHERE seq = {int(floor)}) AS at, "
        f"(SELECT minOrNull(committed_at) FROM {log} WHERE seq > {int(floor)}) AS oldest",
    )[0]
    now = datetime.now(UTC).replace(tzinfo=None)
    out["behind_changes"] = max(0, int(row["newest"] or 0) - floor)
    out["findings_as_of"] = row["at"].astimezone(UTC).replace(tzinfo=None) if row["at"] is not None else None
    if row["oldest"] is not None:
        oldest = row["oldest"].astimezone(UTC).replace(tzinfo=None)
        out["lag_seconds"] = max(0.0, (now - oldest).total_seconds())
    else:
        out["lag_seconds"] = 0.0
        out["findings_as_of"] = out["findings_as_of"] or now
    return out


# ----------------------------------------------------------------------------------------- serve


class ClickHouseMaterializer(threading.Thread):
    """``serve --store``'s thread: brings the store's findings tables up to date after the
    writer's changes (its computations take ``turn``, the read API's turns on the store)."""

    def __init__(self, store, turn: threading.Lock | None = None, interval: float = 0.5) -> None:
        super().__init__(name="driftscope-clickhouse-materializer", daemon=True)
        self.store, self.turn, self.interval = store, turn, interval
        self._stop_event = threading.Event()
        self._whole_at: dict[str, float] = {}
        self.passes = 0
        self.last_error: str | None = None
        self.last_failed: dict[str, str] = {}
        self.last_pass_seconds = 0.0
        self.pass_seconds_total = 0.0
        self._since_prune = 0

    def _whole_due(self, name: str) -> bool:
        now = time.monotonic()
        if now - self._whole_at.get(name, -1e9) < WHOLE_INTERVAL_S:
            return False
        self._whole_at[name] = now
        return True

    def versions(self) -> _Versions:
        """Row versions continuing from the store's (what ``run_once`` takes)."""
        return _Versions(self.store)

    def run_once(self, versions: _Versions) -> PassReport:
        started = time.perf_counter()
        report = bring_up_to_date(self.store, whole_due=self._whole_due, turn=self.turn, versions=versions)
        if report.recomputed:
            self._since_prune += 1
        if self._since_prune >= PRUNE_EVERY:
            with self.turn or nullcontext():
                prune(self.store)
            self._since_prune = 0
        self.passes += 1
        self.last_failed = dict(report.failed or {})
        self.last_pass_seconds = time.perf_counter() - started
        self.pass_seconds_total += self.last_pass_seconds
        return report

    def run(self) -> None:
        versions = None
        while not self._stop_event.is_set():
            report = None
            try:
                versions = versions or self.versions()
                report = self.run_once(versions)
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - keep going; health shows the error
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("ClickHouse materializer pass failed (will retry): %s", self.last_error)
            if report is not None and report.recomputed and not self._stop_event.is_set():
                continue  # more may have arrived meanwhile
            self._stop_event.wait(self.interval)

    def health(self) -> dict[str, Any]:
        """The thread's counters for serve's health answer."""
        return {
            "materializer_passes": self.passes,
            "last_pass_seconds": round(self.last_pass_seconds, 3),
            "pass_seconds_total": round(self.pass_seconds_total, 2),
            "last_error": self.last_error,
            "failed": self.last_failed,
        }

    def stop(self, timeout: float = 30.0) -> None:
        self._stop_event.set()
        self.join(timeout)
