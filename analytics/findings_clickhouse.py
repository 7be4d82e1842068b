"""The findings tables of a ClickHouse store: how rows, versions and state are stored and read.

``analytics.materialize_clickhouse`` decides what to recompute; this module holds its store
operations. A result's table ``findings__<name>`` holds its rows with ``_key`` (the partition
key, '' when kept whole), ``_ver`` (the write's version) and ``_pos`` (the row's place in its
computation); a list column NULL in DuckDB is ``[]`` plus a ``_null_<column>`` flag (ClickHouse
arrays are never NULL). ``findings_parts`` names, per result and partition, the version of its
current rows; ``findings_state`` per result the change its table reflects and ``base``, the oldest
version a read takes. Tables are created from a result's first rows (a column of NULLs only
takes the type of its first value later, an integer column widens to Float64).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import analytics.materialize as materialize
from analytics.materialize import POSITION, Maintained, State
from analytics.sql_loader import quote_identifier

# a row's partition key ('' when whole) and its write's version (not `_part`: MergeTree's
# virtual column of that name, the data part, shadows it in a DELETE's WHERE)
PART, VERSION = "_key", "_ver"
NULL_FLAG = "_null_"  # a list column's NULL flag column (ClickHouse arrays are never NULL)


def cell_columns(names: list[str]) -> list[str]:
    """Of a findings table's column ``names``, the result's own: not the partition, version,
    position or NULL flag columns the table keeps beside them."""
    return [n for n in names if not n.startswith(NULL_FLAG) and n not in (PART, VERSION, POSITION)]


NULL_PART = "\x00"  # the partition of a row whose key is NULL (only an unscoped write writes it)


@dataclass
class ChState(State):
    """A ``findings_state`` row on ClickHouse: ``base``, the oldest row version reads take."""

    base: int = 0


# ----------------------------------------------------------------------------------------- store


def qualified(store, name: str) -> str:
    return f"`{store.database}`.`{name}`"


def dict_rows(store, sql: str, params: dict[str, Any] | None = None) -> list[dict]:
    return store.execute(sql, params).to_pylist()


def read_states(store) -> dict[str, ChState]:
    """Every ``findings_state`` row by result (empty when the store has no such table)."""
    try:
        rows = dict_rows(
            store,
            "SELECT metric, version, seq, base, rows, failed_keys, last_error "
            f"FROM {qualified(store, 'findings_state')} FINAL",
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
            dict_rows(
                store,
                f"SELECT max(seq) AS s FROM {qualified(store, 'change_log')} WHERE seq < coalesce(("
                f"SELECT minOrNull(seq) FROM {qualified(store, 'change_partitions')} "
                f"WHERE seq NOT IN (SELECT seq FROM {qualified(store, 'change_log')})), 18446744073709551615)",
            )[0]["s"]
            or 0
        )
    except Exception:  # noqa: BLE001 - no change log: nothing to bring up to date
        return 0


def touched_keys(store, partition: str, after: int, upto: int) -> list[str]:
    rows = store.execute(
        f"SELECT DISTINCT key FROM {qualified(store, 'change_partitions')} WHERE partition = {{p:String}} "
        "AND seq > {a:UInt64} AND seq <= {u:UInt64}",
        {"p": partition, "a": after, "u": upto},
    )
    return rows.column("key").to_pylist() if rows.num_rows else []


def count_of(store, sql: str) -> int:
    return int(dict_rows(store, sql)[0]["n"])


def table_columns(store, table: str) -> dict[str, str]:
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
    have = table_columns(store, table)
    given = {name: _ch_type(rows.column(name).type) for name in cell_columns(rows.column_names)}
    flags = {name: "UInt8" for name in rows.column_names if name.startswith(NULL_FLAG)}
    if not have:
        spec = ", ".join(f"`{n}` {k}" for n, k in {**given, **flags}.items())
        store.command(
            f"CREATE TABLE IF NOT EXISTS {qualified(store, table)} ({spec}, `{PART}` String, `{VERSION}` UInt64, "
            f"`{POSITION}` Int64) ENGINE = MergeTree ORDER BY (`{PART}`, `{VERSION}`, `{POSITION}`)"
        )
        return rows
    for name, kind in {**given, **flags}.items():
        if name not in have:
            store.command(f"ALTER TABLE {qualified(store, table)} ADD COLUMN `{name}` {kind}")
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
        if widen or not count_of(store, f"SELECT count(`{name}`) AS n FROM {qualified(store, table)}"):
            store.command(f"ALTER TABLE {qualified(store, table)} MODIFY COLUMN `{name}` {kind}")
            continue
        raise TypeError(
            f"{item.name}: column {name} was {have[name]}, now {kind}; bump the detector's "
            "version so its table is rebuilt"
        )
    return rows


def write_rows(store, item: Maintained, frame, keys: list[str] | None, ver: int) -> int:
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


def write_state(store, item: Maintained, version: str, seq: int | None, base: int, ver: int,
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


class RowVersions:
    """Row versions: increasing, past every version the store holds (a restart continues)."""

    def __init__(self, store) -> None:
        held = dict_rows(
            store,
            f"SELECT greatest((SELECT max(ver) FROM {qualified(store, 'findings_parts')}), "
            f"(SELECT max(ver) FROM {qualified(store, 'findings_state')})) AS v",
        )[0]["v"]
        self.last = int(held or 0)

    def next(self) -> int:
        self.last = max(self.last + 1, time.time_ns())
        return self.last


def current_versions(store, name: str, base: int) -> str:
    """The (partition, version) pairs current in ``name``'s table (a subquery): each partition's
    newest version in `findings_parts`, from ``base`` on. What a prune keeps; reads take
    ``current_rows``, which sorts out only the partitions written since the last prune."""
    return (
        f"SELECT key, max(ver) FROM {qualified(store, 'findings_parts')} WHERE metric = {_string(name)} "
        f"GROUP BY key HAVING max(ver) >= {int(base)}"
    )


def current_rows(store, name: str, base: int | str, dialect: str = "clickhouse") -> str:
    """The condition a row of ``name``'s partitioned table is current by (a WHERE clause on its
    `_part` and `_ver` columns; every reader of a findings table takes its rows by it): its
    version from ``base`` on (an integer, or an SQL expression of the statement), and either its
    partition's newest in `findings_parts` since the version the last prune recorded
    (`findings_pruned`), or at or below that version in a partition not written since: a prune's
    synchronous DELETE (and an unscoped build) leaves one version per partition, so only the
    partitions written after it are sorted out, not every partition of the table (a GROUP BY
    over all of them and a tuple IN as large, per read). ``dialect``: "duckdb" for a statement
    written in DuckDB's SQL and translated (identifiers quoted its way)."""
    if dialect == "duckdb":
        database = quote_identifier(store.database)
        parts, pruned_table = f"{database}.findings_parts", f"{database}.findings_pruned"
        part, version = quote_identifier(PART), quote_identifier(VERSION)
    else:
        parts, pruned_table = qualified(store, "findings_parts"), qualified(store, "findings_pruned")
        part, version = f"`{PART}`", f"`{VERSION}`"
    metric = _string(name)
    pruned = f"(SELECT coalesce(max(ver), 0) FROM {pruned_table} WHERE metric = {metric})"
    since = f"FROM {parts} WHERE metric = {metric} AND ver > {pruned}"
    return (
        f"{version} >= {base} AND (({part}, {version}) IN (SELECT key, max(ver) {since} GROUP BY key) "
        f"OR ({version} <= {pruned} AND {part} NOT IN (SELECT key {since})))"
    )


def _string(name: str) -> str:
    """A result's name (an identifier, as the registry takes it) as an SQL string literal that
    reads the same in both dialects."""
    if "'" in name or "\\" in name:
        raise ValueError(f"not a result name: {name!r}")
    return f"'{name}'"
