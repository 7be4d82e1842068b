"""Kept detector results in the store (table ``kept_results``, ``analytics/migrations/0003``).

A kept result (``analytics.kept``) lives in the process that computed it; after a restart, or in
another process reading the same file (an offline report, the dashboard's file source), the
first call would be a full computation. So ``serve``'s background refresh
(``analytics.kept_worker``) stores each result of the default scope with the data version it was
computed at, through the single writer; a process that has no kept result for a detector reads
the stored one (``load``) and brings it up to date as it would its own: unchanged data answers
from it, new spans recompute only the runs they touched.

A stored row is used only by the code that wrote it (``code_fingerprint``: a hash of analytics'
sources, so a changed detector never answers from an old result) and for the scope it was
computed for (window, filters, side-effect tool pattern). Frames are stored as an Arrow IPC
stream; a frame whose columns would not come back exactly as they were is not stored
(``encode`` returns None). Reads never write: ``load`` only selects, and a database without the
table (a read-only file of an older version) simply has nothing stored.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import io
import json
import logging
from collections.abc import Iterable
from datetime import datetime

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics.data_version import Version
from analytics.side_effects import SideEffectTools
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

TABLE = "kept_results"
# Schema metadata key naming the columns whose cells were Python lists (Arrow gives arrays back).
_LISTS_KEY = b"driftscope.python_lists"


@functools.cache
def code_fingerprint() -> str:
    """sha256 over analytics' Python and SQL sources: stored results of other code are not used."""
    digest = hashlib.sha256()
    root = importlib.resources.files("analytics")
    stack = [root]
    files = []
    while stack:
        folder = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                if entry.name != "__pycache__":
                    stack.append(entry)
            elif entry.name.endswith((".py", ".sql")):
                files.append(entry)
    for entry in sorted(files, key=lambda e: str(e)):
        digest.update(entry.name.encode())
        digest.update(entry.read_bytes())
    return digest.hexdigest()


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_when(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def scope_text(window: Window, filters: Filters, tools: SideEffectTools) -> str:
    """The stored scope of a result: its window, filters and side-effect tool pattern, as JSON."""
    return json.dumps(
        {
            "since": _when(window.since),
            "until": _when(window.until),
            "service": filters.service,
            "agent": filters.agent,
            "run": filters.run,
            "origin_task": filters.origin_task,
            "side_effect_tools": tools.pattern,
            "side_effect_exclude": tools.exclude,
        },
        sort_keys=True,
    )


def version_text(version: Version) -> str:
    """``version`` as JSON."""
    count, newest_threshold = version.thresholds
    return json.dumps(
        {
            "spans": version.spans,
            "newest": _when(version.newest),
            "recent": version.recent,
            "thresholds": [count, _when(newest_threshold)],
        },
        sort_keys=True,
    )


def parse_version(text: str) -> Version:
    """The ``Version`` ``version_text`` wrote."""
    data = json.loads(text)
    count, newest_threshold = data["thresholds"]
    return Version(
        spans=int(data["spans"]),
        newest=_parse_when(data["newest"]),
        recent={str(k): int(v) for k, v in data["recent"].items()},
        thresholds=(count, _parse_when(newest_threshold)),
    )


def _list_columns(frame: pd.DataFrame) -> list[str]:
    """Object columns whose non-null cells are Python lists."""
    columns = []
    for column in frame.columns:
        if frame[column].dtype != object:
            continue
        values = frame[column].dropna()
        if len(values) and isinstance(values.iloc[0], list):
            columns.append(str(column))
    return columns


def _cell_types(frame: pd.DataFrame) -> list[tuple]:
    """Per column: its dtype and the Python type of its first non-null cell (what must survive)."""
    types = []
    for column in frame.columns:
        values = frame[column].dropna() if frame[column].dtype == object else frame[column]
        first = type(values.iloc[0]) if len(values) else None
        inner = None
        if first is np.ndarray:
            inner = values.iloc[0].dtype
        types.append((str(column), str(frame[column].dtype), first, inner))
    return types


def encode(frame: pd.DataFrame) -> bytes | None:
    """``frame`` as an Arrow IPC stream (zstd), or None when it would not come back as it is
    (a column Arrow cannot hold, or one whose dtype or cell type would change)."""
    lists = _list_columns(frame)
    try:
        table = pa.Table.from_pandas(frame, preserve_index=True)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        logger.debug("kept result not stored (no Arrow form): %s", exc)
        return None
    metadata = dict(table.schema.metadata or {})
    metadata[_LISTS_KEY] = json.dumps(lists).encode()
    table = table.replace_schema_metadata(metadata)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as out:
        out.write_table(table)
    data = sink.getvalue()
    back = decode(data)
    if (
        list(back.columns) != list(frame.columns)
        or len(back) != len(frame)
        or not back.index.equals(frame.index)
        or _cell_types(back) != _cell_types(frame)
    ):
        logger.debug("kept result not stored (its columns would not round-trip)")
        return None
    return data


def decode(data: bytes) -> pd.DataFrame:
    """The frame ``encode`` stored."""
    with pa.ipc.open_stream(io.BytesIO(data)) as reader:
        table = reader.read_all()
    lists = json.loads((table.schema.metadata or {}).get(_LISTS_KEY, b"[]"))
    frame = table.to_pandas()
    for column in lists:
        frame[column] = [v.tolist() if isinstance(v, np.ndarray) else v for v in frame[column]]
    return frame


def _has_table(conn: duckdb.DuckDBPyConnection) -> bool:
    (found,) = conn.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND database_name = current_database()",
        [TABLE],
    ).fetchone()
    return bool(found)


def load(conn: duckdb.DuckDBPyConnection, metric: str, scope: str) -> tuple[Version, pd.DataFrame] | None:
    """The stored result of ``metric`` for ``scope`` written by this code, or None."""
    if not _has_table(conn):
        return None
    row = conn.execute(
        f"SELECT version, frame FROM {TABLE} WHERE metric = ? AND scope = ? AND code = ?",
        [metric, scope, code_fingerprint()],
    ).fetchone()
    if row is None:
        return None
    try:
        return parse_version(row[0]), decode(row[1])
    except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        logger.warning("stored result of %s unreadable, computing it again: %s", metric, exc)
        return None


def store_rows(entries: Iterable[tuple[str, str, Version, bytes, int]]):
    """A write function (for the single writer) replacing the stored rows of ``entries``
    ((metric, scope, version, encoded frame, rows)) and dropping rows of other code."""
    rows = [
        (metric, scope, code_fingerprint(), version_text(v), data, n) for metric, scope, v, data, n in entries
    ]

    def write(conn: duckdb.DuckDBPyConnection) -> int:
        conn.execute(f"DELETE FROM {TABLE} WHERE code <> ?", [code_fingerprint()])
        for metric, scope, code, version, data, n in rows:
            conn.execute(f"DELETE FROM {TABLE} WHERE metric = ? AND scope = ?", [metric, scope])
            conn.execute(
                f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
                [metric, scope, code, version, data, n],
            )
        return len(rows)

    return write
