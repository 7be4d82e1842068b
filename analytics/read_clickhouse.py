"""Reads of a ClickHouse store's findings tables: ``materialize.read_findings`` and ``freshness``
on ClickHouse (``analytics.materialize`` hands a ClickHouse store here).

A read is one SELECT in the common case: the state row (built by this definition, its ``base``)
is checked in the statement itself, a partitioned result's rows are those of each partition's
current version (``findings_parts``), a whole result's those of its base version, and the list
columns' NULL flags are found by name (``COLUMNS``); rows come back in DuckDB's read order and
types. A read the tables cannot answer is None (the caller computes it).
"""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

import analytics.materialize as materialize
from analytics.engine import _naive_utc
from analytics.findings_clickhouse import (
    NULL_FLAG,
    VERSION,
    ChState,
    cell_columns,
    current_rows,
    dict_rows,
    qualified,
    read_states,
)
from analytics.materialize import POSITION, Maintained
from analytics.materialize_clickhouse import maintained
from analytics.types import Filters, Window


def ready(store, name: str, item: Maintained | None = None) -> tuple[ChState, list[str]] | None:
    """The state of ``name``'s table when it can answer reads (built by this definition), and the
    table's columns (none before its first rows): one round trip."""
    item = item or maintained().get(name)
    if item is None:
        return None
    try:
        (row,) = dict_rows(
            store,
            "SELECT count() AS n, argMax(version, ver) AS version, argMax(seq, ver) AS seq, "
            "argMax(base, ver) AS base, (SELECT groupArray(name) FROM system.columns "
            "WHERE database = {db:String} AND table = {t:String}) AS columns "
            f"FROM {qualified(store, 'findings_state')} WHERE metric = {{m:String}}",
            {"db": store.database, "t": item.table, "m": name},
        )
    except Exception:  # noqa: BLE001 - a store created before findings tables: every read computes
        return None
    if not row["n"] or row["seq"] < 0 or row["version"].split("|inputs=")[0] != item.version:
        return None
    return ChState(row["version"], row["seq"], 0, [], None, row["base"]), list(row["columns"])


def _run_behind(store, state: ChState, run: str) -> bool:
    """Whether a change the table does not reflect yet touched ``run`` (then it is computed)."""
    rows = store.execute(
        f"SELECT count() AS n FROM {qualified(store, 'change_partitions')} WHERE partition = 'run_id' "
        "AND key = {run:String} AND seq > {seq:UInt64}",
        {"run": run, "seq": state.seq},
    )
    return bool(rows.column("n")[0].as_py())


def _literal(pattern: str) -> str:
    """A regular expression of our column names as a ClickHouse string literal (``COLUMNS`` takes
    a literal, not a parameter)."""
    return "'" + pattern.replace("\\", "\\\\").replace("'", "\\'") + "'"


def read_findings(store, name: str, window: Window = Window(), filters: Filters = Filters(),
                  columns: list[str] | None = None, documented: list[str] | None = None,
                  runs: list[str] | None = None) -> pd.DataFrame | None:  # fmt: skip
    """``materialize.read_findings`` on ClickHouse: ``name``'s current rows (only ``columns``,
    only the rows of ``runs``), in DuckDB's read order; None when the tables cannot answer."""
    item = maintained().get(name)
    if item is None or not materialize.tables_answer(item, window, filters):
        return None
    if filters.run is None and (columns or documented):  # the common read: one statement
        frame = _read_if_ready(store, item, list(columns or documented), runs)
        if frame is not None:
            return frame
    found = ready(store, name, item)
    if found is None or (filters.run is not None and _run_behind(store, found[0], filters.run)):
        return None
    state, have = found
    wanted = list(columns or documented or cell_columns(list(have)))
    if not have:
        frame = pd.DataFrame({column: pd.Series(dtype=object) for column in wanted})
        frame.attrs["source"] = "table"
        return frame
    flags = [NULL_FLAG + c for c in wanted if NULL_FLAG + c in have]
    where = current_rows(store, name, state.base)
    params: dict[str, Any] = {}
    if filters.run is not None:
        where += " AND run_id = {run:String}"
        params["run"] = filters.run
    if runs is not None:
        where += " AND run_id IN {runs:Array(String)}"
        params["runs"] = list(runs)
    select = ", ".join(f"`{c}`" for c in wanted + flags)
    table = store.execute(
        f"SELECT {select} FROM {qualified(store, item.table)} WHERE {where} {_order(item)}", params
    )
    return _frame(table, wanted)


def _order(item: Maintained) -> str:
    """DuckDB's read order of ``item``'s rows (``materialize.read_findings``)."""
    order = [f"`{c}`{' DESC' if d else ''} NULLS LAST" for c, d in item.order]
    if item.partition is not None:
        order.append(f"`{item.partition}` NULLS LAST")
    return f"ORDER BY {', '.join([*order, POSITION])}"


def _read_if_ready(store, item: Maintained, wanted: list[str], runs: list[str] | None) -> pd.DataFrame | None:
    """``item``'s current rows of ``wanted`` columns in one statement that also checks its state
    (built by this definition) and finds its list columns' NULL flags by name (``COLUMNS``); with
    no rows, ``ready`` says whether it is built and empty. None when it cannot answer (not built,
    no table yet: the caller's ``ready`` path says which)."""
    names = "|".join(re.escape(c) for c in [*wanted, *(NULL_FLAG + c for c in wanted)])
    # the state row: (base, built by this definition); a whole result's rows are its base's
    state = (
        "WITH (SELECT tuple(argMax(base, ver), argMax(seq, ver) >= 0 AND startsWith(argMax(version, ver), "
        f"{{v:String}})) FROM {qualified(store, 'findings_state')} WHERE metric = {{m:String}}) AS st "
    )
    if item.partition is None:
        where = f"`{VERSION}` = st.1 AND st.2"
    else:
        where = f"st.2 AND {current_rows(store, item.name, 'st.1')}"
    params: dict[str, Any] = {"m": item.name, "v": item.version + "|inputs="}
    if runs is not None:
        where += " AND run_id IN {runs:Array(String)}"
        params["runs"] = list(runs)
    try:
        table = store.execute(
            f"{state}SELECT COLUMNS({_literal('^(' + names + ')$')}) FROM {qualified(store, item.table)} "
            f"WHERE {where} {_order(item)}",
            params,
        )
    except Exception:  # noqa: BLE001 - no table yet (or another failure, which ready's path raises)
        return None
    if any(c not in table.column_names for c in wanted):
        return None
    if table.num_rows == 0 and ready(store, item.name, item) is None:
        return None  # no rows because not built (by this definition)
    return _frame(table, wanted)


def _frame(table: pa.Table, wanted: list[str]) -> pd.DataFrame:
    """Rows read from a findings table as DuckDB's read gives them: ``wanted`` columns, a list
    flagged NULL back to NULL, timestamps naive UTC, nullable integers."""
    table = _naive_utc(table)
    for name in wanted:
        flag = NULL_FLAG + name
        if flag in table.column_names:
            column = table.column(name)
            null = pc.equal(table.column(flag), 1)
            table = table.set_column(
                table.schema.get_field_index(name),
                name,
                pc.if_else(null, pa.scalar(None, column.type), column),
            )
    frame = table.select(wanted).to_pandas(types_mapper=materialize.pandas_type)
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
    log = qualified(store, "change_log")
    row = dict_rows(
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


def read_window(store, name: str, window: Window, filters: Filters, columns: list[str] | None,
                documented: list[str]) -> pd.DataFrame | None:  # fmt: skip
    """``materialize.read_window`` on ClickHouse, for a window (with or without a run filter) on
    a run-partitioned detector: the table's rows of the runs the window holds whole, plus the runs
    it cuts computed for the question alone (only those). The runs and their span ranges come
    from run_summary's base part (``materialize.RANGES``). None when the tables cannot answer:
    not built, a service, agent or origin-task filter (no table of each run's actors is kept
    here), a run a change not taken in yet touched."""
    item = maintained().get(name)
    if not materialize.reads_whole_runs(item, filters):
        return None
    if window == Window() or any(
        f is not None for f in (filters.service, filters.agent, filters.origin_task)
    ):
        return None
    found = ready(store, name, item)
    if found is None or (filters.run is not None and _run_behind(store, found[0], filters.run)):
        return None
    ranges = read_findings(store, materialize.RANGES, documented=["run_id", "first_seen", "last_seen"])
    if ranges is None:
        return None
    first, last = ranges["first_seen"], ranges["last_seen"]
    touched = pd.Series(True, index=ranges.index) if filters.run is None else ranges["run_id"] == filters.run
    whole = touched.copy()
    if window.since is not None:
        touched &= last >= pd.Timestamp(window.since)
        whole &= first >= pd.Timestamp(window.since)
    if window.until is not None:
        touched &= first < pd.Timestamp(window.until)
        whole &= last < pd.Timestamp(window.until)
    whole &= touched
    held = ranges["run_id"][whole].tolist()
    cut = ranges["run_id"][touched & ~whole].tolist()
    wanted = list(columns or documented)
    frames = []
    if held:
        frame = read_findings(store, name, Window(), Filters(), None, wanted, runs=held)
        if frame is None:
            return None
        frames.append(frame)
    if cut:
        frames.append(item.detector(store, window, dataclasses.replace(filters, runs=tuple(cut)))[wanted])
    return materialize.window_answer(item, frames, wanted)


materialize.use_clickhouse_reads(freshness=freshness, read_findings=read_findings, read_window=read_window)
