"""The DuckDB store: opening the file, turning decoded batches into Arrow, inserting them.

Only the writer thread (``collector.writer.SpanWriter``) calls ``insert_batches`` on a live
server; ``driftscope ingest --db`` uses the same functions on a file no server holds.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import duckdb
import pyarrow as pa

from collector.decode import SPAN_COLUMNS, DecodedBatch
from collector.migrations_runner import apply_migrations

logger = logging.getLogger(__name__)

_STR_MAP = pa.map_(pa.string(), pa.string())
_STR_LIST = pa.list_(pa.string())
_TYPES = {
    "Timestamp": pa.timestamp("us"),
    "ResourceAttributes": _STR_MAP,
    "SpanAttributes": _STR_MAP,
    "Duration": pa.int64(),
    "start_ns": pa.int64(),
    "end_ns": pa.int64(),
    "hop": pa.int32(),
    "step": pa.int32(),
    "budget_max_steps": pa.int32(),
    "objective_superseded": pa.bool_(),
    "side_effect": pa.bool_(),
    "constraints_ledger": _STR_LIST,
    "constraints_carried": _STR_LIST,
    "constraints_waived": _STR_LIST,
    "waiver_reasons": _STR_LIST,
    "acceptance_constraint_ids": _STR_LIST,
    "ingested_at": pa.timestamp("us"),
}
SPAN_SCHEMA = pa.schema([(name, _TYPES.get(name, pa.string())) for name in SPAN_COLUMNS])


class StoreLockedError(RuntimeError):
    """Another process (usually a running ``driftscope serve``) holds the database file."""


def open_store(path: str | os.PathLike, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating and migrating if needed) the database file at ``path``.

    Raises ``StoreLockedError`` with an actionable message when another process holds it.
    """
    path = Path(path)
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise StoreLockedError(
                f"The database {path} is held by another process (a running `driftscope serve`?). "
                "Send spans to that server with --endpoint URL instead, or stop it first; for "
                "offline analysis copy the file and open the copy."
            ) from exc
        raise
    if not read_only:
        apply_migrations(conn)
    return conn


def batch_to_arrow(batches: list[DecodedBatch]) -> pa.Table:
    """Concatenate decoded batches into one Arrow table with the `spans` schema."""
    arrays = []
    for field in SPAN_SCHEMA:
        values: list = []
        for batch in batches:
            values.extend(batch.columns[field.name])
        arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)


# The spans of the traces a commit touches, read from `spans` in one scan; the ancestor walks
# below then join this small table instead of scanning `spans` once per step of the recursion.
_TREE_SQL = """
CREATE OR REPLACE TEMP TABLE _tree AS
SELECT rowid AS rid, TraceId, SpanId, ParentSpanId, agent_id, agent_name, run_id
FROM spans WHERE TraceId IN (SELECT TraceId FROM _incoming)
"""

_TREE_NEEDS_WORK_SQL = """
SELECT count(*) FILTER (WHERE agent_id IS NULL), count(*) FILTER (WHERE run_id = TraceId)
FROM _tree WHERE ParentSpanId <> ''
"""

# A span that names no agent takes its nearest ancestor's agent (an agent span or any span with
# an agent id), however many agentless spans lie between them (up to 256).
_INHERIT_AGENT_SQL = """
WITH RECURSIVE walk(rid, TraceId, parent, depth) AS (
    SELECT s.rid, s.TraceId, s.ParentSpanId, 0
    FROM _tree s
    WHERE s.agent_id IS NULL AND s.ParentSpanId <> ''
  UNION ALL
    SELECT w.rid, w.TraceId, p.ParentSpanId, w.depth + 1
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE p.agent_id IS NULL AND p.ParentSpanId <> '' AND w.depth < 256
),
found AS (
    SELECT w.rid, p.agent_id, p.agent_name
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE p.agent_id IS NOT NULL
)
UPDATE spans SET agent_id = found.agent_id, agent_name = found.agent_name, agent_source = 'ancestor'
FROM found WHERE spans.rowid = found.rid
"""

# A span whose run fell back to its trace id takes the run of its nearest ancestor that has one.
_INHERIT_RUN_SQL = """
WITH RECURSIVE walk(rid, TraceId, parent, depth) AS (
    SELECT s.rid, s.TraceId, s.ParentSpanId, 0
    FROM _tree s
    WHERE s.run_id = s.TraceId AND s.ParentSpanId <> ''
  UNION ALL
    SELECT w.rid, w.TraceId, p.ParentSpanId, w.depth + 1
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE p.run_id = p.TraceId AND p.ParentSpanId <> '' AND w.depth < 256
),
found AS (
    SELECT w.rid, p.run_id
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE p.run_id <> p.TraceId
)
UPDATE spans SET run_id = found.run_id
FROM found WHERE spans.rowid = found.rid
"""


def _first_copies(batches: list[DecodedBatch], table: pa.Table) -> pa.Table:
    """``table`` without repeated TraceId + SpanId rows (the first copy wins)."""
    keys = [
        key
        for batch in batches
        for key in zip(batch.columns["TraceId"], batch.columns["SpanId"], strict=True)
    ]
    if len(set(keys)) == len(keys):
        return table
    seen: set[tuple[str, str]] = set()
    keep = []
    for index, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            keep.append(index)
    return table.take(keep)


def insert_batches(conn: duckdb.DuckDBPyConnection, batches: list[DecodedBatch]) -> int:
    """Insert the batches' rows in the caller's transaction; return rows newly stored.

    Duplicates (same TraceId + SpanId, as exporter retries send) are stored once: the first
    copy wins. Spans without an agent take their nearest agent ancestor's, including ancestors
    stored by earlier requests and descendants stored before their ancestor arrived.
    """
    table = batch_to_arrow(batches)
    if table.num_rows == 0:
        return 0
    table = _first_copies(batches, table)
    conn.register("_incoming", table)
    try:
        inserted = conn.execute("INSERT OR IGNORE INTO spans SELECT * FROM _incoming").fetchone()[0]
        conn.execute(_TREE_SQL)
        agentless, runless = conn.execute(_TREE_NEEDS_WORK_SQL).fetchone()
        if agentless:
            conn.execute(_INHERIT_AGENT_SQL)
        if runless:
            conn.execute(_INHERIT_RUN_SQL)
        conn.execute("DROP TABLE _tree")
    finally:
        conn.unregister("_incoming")
    return inserted


def bump_counter(conn: duckdb.DuckDBPyConnection, name: str, amount: int = 1) -> None:
    """Add ``amount`` to a persistent ingest counter."""
    conn.execute(
        "INSERT INTO ingest_counters VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
        [name, amount],
    )
