"""Kept detector results in the store (table ``kept_results``, ``analytics/migrations/0003``).

A kept result (``analytics.kept``) lives in the process that computed it; after a restart, or in
another process reading the same file (an offline report, the dashboard's file source), the
first call would be a full computation. So ``serve``'s background refresh
(``analytics.kept_worker``) stores each result of the default scope with the data version it was
computed at, through the single writer; a process that has no kept result for a detector reads
the stored one (``load``) and brings it up to date as it would its own: unchanged data answers
from it, new spans recompute only the runs they touched.

A stored row is used only by the code that wrote it (``code_fingerprint``: a hash of the sources
the metric depends on, so a changed detector never answers from an old result, and a change to
another detector's code keeps this one's) and for the scope it was
computed for (window, filters, side-effect tool pattern). Frames are stored as an Arrow IPC
stream; a frame whose columns would not come back exactly as they were is not stored
(``encode`` returns None). Reads never write: ``load`` only selects, and a database without the
table (a read-only file of an older version) simply has nothing stored.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import importlib.resources
import io
import json
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analytics.data_version import Version, database_identity
from analytics.side_effects import SideEffectTools
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

TABLE = "kept_results"
# Schema metadata keys naming the columns whose cells were Python lists (Arrow gives arrays back),
# and the columns of Arrow lists (``pd.ArrowDtype``: pandas cannot name their type in its metadata).
_LISTS_KEY = b"driftscope.python_lists"
_ARROW_LISTS_KEY = b"driftscope.arrow_lists"
# Columns of text held as Python objects (str cells and None; e.g. repeated_calls' agent when some
# loop has none): Arrow holds them as text, which pandas reads back as its text type; they are
# made objects again, or the frame could not be stored (on the framework corpus repeated_calls
# was never stored, and a restart computed it again).
_OBJECT_TEXT_KEY = b"driftscope.object_text"


# Sources that cannot change a kept result: results are kept for DuckDB files only
# (analytics.data_version.database_identity), and this translates statements for ClickHouse.
_NOT_KEPT_ENGINES = {"dialect.py"}


@functools.cache
def _sources() -> dict[str, bytes]:
    """analytics' Python and SQL sources by path inside the package (``loops.py``, ``sql/x.sql``)."""
    root = importlib.resources.files("analytics")
    found: dict[str, bytes] = {}
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                if entry.name != "__pycache__":
                    stack.append((entry, f"{prefix}{entry.name}/"))
            elif entry.name.endswith((".py", ".sql")):
                found[prefix + entry.name] = entry.read_bytes()
    return found


def _module_path(module: str) -> str | None:
    """``analytics.loops`` -> ``loops.py`` (None for a module outside analytics' sources)."""
    if module == "analytics":
        return "__init__.py"
    if not module.startswith("analytics."):
        return None
    path = module.removeprefix("analytics.").replace(".", "/") + ".py"
    return path if path in _sources() else None


# An import statement (its names may span lines in parentheses), and a quoted name that could be a
# SQL file's. Read as text: parsing every module with ``ast`` and walking its ~28,000 nodes cost
# 0.14-0.24 CPU-s on the first stored-result read of each process (tests/analytics/test_kept.py holds the
# two readings equal on every analytics source).
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)|import[ \t]+([^\n]+))", re.M
)
_QUOTED = re.compile(r"""["']([a-z_][a-z0-9_]*)["']""")
_ARGUMENT_BEFORE = re.compile(r"(?:[(,]|(?<![=!<>])\b[A-Za-z_]\w*[ \t]*=)\s*\Z")


@functools.cache
def _direct_dependencies(path: str) -> frozenset[str]:
    """The analytics modules ``path`` imports (anywhere in it, function bodies included) and
    the SQL files it names (a string constant passed to a call, positionally or by keyword,
    equal to a file's name in ``sql/``: ``run_sql(conn, "name")``, ``register("name")``).
    Comments and docstrings that read as such count too: a larger set only makes the hash more
    cautious."""
    text = _sources()[path].decode("utf-8", errors="replace")
    found: set[str | None] = set()
    for module, names, plain in _IMPORT.findall(text):
        if module:
            found.add(_module_path(module))
            for name in re.findall(r"[A-Za-z_]\w*", re.sub(r"#[^\n]*", "", names)):
                found.add(_module_path(f"{module}.{name}"))
        else:
            for part in plain.split("#")[0].split(","):
                found.add(_module_path(part.split()[0]) if part.split() else None)
    sql = {name.removeprefix("sql/").removesuffix(".sql") for name in _sources() if name.startswith("sql/")}
    for match in _QUOTED.finditer(text):
        if (
            match.group(1) in sql
            and _ARGUMENT_BEFORE.search(text, max(0, match.start() - 200), match.start())
            and text[match.end() : match.end() + 200].lstrip()[:1] in (",", ")")
        ):
            found.add(f"sql/{match.group(1)}.sql")
    return frozenset(
        name for name in found if name is not None and name not in {"__init__.py", *_NOT_KEPT_ENGINES}
    )


def _dependencies(path: str) -> set[str]:
    """``path`` with every source it depends on: the modules it imports, transitively, the SQL
    files they name, and the fragments (``{filtered_spans}`` -> ``sql/_filtered_spans.sql``)
    those files expand."""
    done: set[str] = set()
    pending = [path]
    while pending:
        current = pending.pop()
        if current in done:
            continue
        done.add(current)
        if current.endswith(".py"):
            pending.extend(_direct_dependencies(current))
        else:
            text = _sources()[current].decode("utf-8", errors="replace")
            pending.extend(
                f"sql/_{name}.sql"
                for name in re.findall(r"\{([a-z_]+)\}", text)
                if f"sql/_{name}.sql" in _sources()
            )
    return done


@functools.cache
def code_fingerprint(modules: frozenset[str] | None = None) -> str:
    """sha256 over the sources a result computed by ``modules`` depends on: those modules with
    every analytics module they import (transitively, so the kept-result code and this store's
    format too) and the SQL files they name, plus the library versions that compute and encode
    it. Stored results of other code are not used; a change to another detector's code leaves
    this one's stored result in use. Without ``modules`` every analytics source counts.

    The registry knows which module computes a metric (``analytics.kept.result_code``,
    ``analytics.summary.result_codes``); this module imports neither."""
    files = set(_sources())
    if modules is not None:
        files = set()
        for module in sorted(modules):
            path = _module_path(module)
            files |= set(_sources()) if path is None else _dependencies(path)
    digest = hashlib.sha256()
    for library in (duckdb, np, pd, pa):
        digest.update(f"{library.__name__} {library.__version__}\n".encode())
    for name in sorted(files):
        digest.update(name.encode())
        digest.update(_sources()[name])
    return digest.hexdigest()


# Read once at import: the hashes describe the code this process runs, not files changed since.
_sources()


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
            "fingerprint": None if version.fingerprint is None else list(version.fingerprint),
        },
        sort_keys=True,
    )


def parse_version(text: str) -> Version:
    """The ``Version`` ``version_text`` wrote."""
    data = json.loads(text)
    count, newest_threshold = data["thresholds"]
    fingerprint = data.get("fingerprint")  # absent in a version stored before it existed
    return Version(
        spans=int(data["spans"]),
        newest=_parse_when(data["newest"]),
        recent={str(k): int(v) for k, v in data["recent"].items()},
        thresholds=(count, _parse_when(newest_threshold)),
        fingerprint=None if fingerprint is None else (int(fingerprint[0]), int(fingerprint[1])),
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


def _object_text_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of ``frame`` of dtype object whose cells are text or None, some text."""
    found = []
    for column in frame.columns:
        values = frame[column]
        if values.dtype == object and values.notna().any():
            cells = values[values.notna()]
            if all(type(v) is str for v in cells) and values.isna().sum() == sum(v is None for v in values):
                found.append(str(column))
    return found


def _as_objects(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``frame`` with ``columns`` (read back as pandas' text type) as objects: text, or None."""
    for column in columns:
        values = frame[column]
        cells = np.where(values.notna().to_numpy(), values.to_numpy(dtype=object), None)
        frame[column] = pd.Series(cells, index=frame.index, dtype=object)  # not inferred as text
    return frame


def _arrow_list_columns(frame: pd.DataFrame) -> list[str]:
    """Columns of Arrow lists (``pd.ArrowDtype`` of a list type)."""
    return [
        str(column)
        for column, dtype in frame.dtypes.items()
        if isinstance(dtype, pd.ArrowDtype)
        and (pa.types.is_list(dtype.pyarrow_dtype) or pa.types.is_large_list(dtype.pyarrow_dtype))
    ]


def arrow_table(frame: pd.DataFrame, preserve_index: bool = False) -> pa.Table:
    """``frame`` as an Arrow table any pandas reader reads back with a plain ``to_pandas``.

    A column of Arrow lists (``pd.ArrowDtype``, e.g. ``repeated_calls``' member span ids) is
    described in pandas' metadata by a type name pandas cannot parse back
    (``list<item: string>[pyarrow]``: ``to_pandas`` raises); it is described as a column of
    objects instead, which is what a column of Python lists gives, so a client (the dashboard's
    HTTP source, another version's) reads either as before (``decode`` makes it Arrow again)."""
    table = pa.Table.from_pandas(frame, preserve_index=preserve_index)
    arrow = set(_arrow_list_columns(frame))
    metadata = table.schema.pandas_metadata
    if not arrow or metadata is None:
        return table
    for column in metadata.get("columns", []):
        if column.get("name") in arrow:
            column["numpy_type"] = "object"
    return table.replace_schema_metadata({**table.schema.metadata, b"pandas": json.dumps(metadata).encode()})


# Rows per record batch of a stored frame. The Arrow IPC file format reads a batch at a time, so
# a read of some runs' rows (``decode_runs``) decompresses only the batches that hold them: a
# result's rows follow its order (mostly time), so one run's rows sit in a few batches.
BATCH_ROWS = 8_192


def _reader(data: bytes, options: pa.ipc.IpcReadOptions | None = None) -> pa.ipc.RecordBatchFileReader:
    return pa.ipc.open_file(pa.BufferReader(data), options=options)


def encode(frame: pd.DataFrame) -> bytes | None:
    """``frame`` as an Arrow IPC file (zstd, ``BATCH_ROWS`` rows per batch), or None when it would
    not come back as it is (a column Arrow cannot hold, or one whose dtype or cell type would
    change)."""
    lists = _list_columns(frame)
    try:
        table = arrow_table(frame, preserve_index=True)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        logger.debug("kept result not stored (no Arrow form): %s", exc)
        return None
    metadata = dict(table.schema.metadata or {})
    metadata[_LISTS_KEY] = json.dumps(lists).encode()
    metadata[_ARROW_LISTS_KEY] = json.dumps(_arrow_list_columns(frame)).encode()
    metadata[_OBJECT_TEXT_KEY] = json.dumps(_object_text_columns(frame)).encode()
    table = table.replace_schema_metadata(metadata)
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as out:
        out.write_table(table, max_chunksize=BATCH_ROWS)
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


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block.

    Rebuilding a large frame's list cells (440,200 span-id lists at 10M spans) allocates one
    tracked list per row, and every few hundred allocations start a collection that walks the
    lists built so far: 4-5x the time of building them (0.32 s against 0.07 s for 44,020 lists
    of 715k ids). Nothing in the block makes cycles, so nothing is left for a later collection.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode(data: bytes, columns: list[str] | None = None) -> pd.DataFrame:
    """The frame ``encode`` stored; only ``columns`` of it (in that order, those it has) when given.

    Columns that held Python lists are built straight from Arrow as lists (``to_pylist``), not
    as numpy arrays converted cell by cell, with the collector paused (``_collection_paused``);
    columns that held Arrow lists (``pd.ArrowDtype``) stay Arrow, built without a Python object
    per value.
    A column left out is neither decompressed nor converted (``included_fields``): the
    Overview's read of ``repeated_calls`` at 10M spans skips its 7.1M span ids (0.05 CPU-s
    against 0.27-1.0 for the whole frame)."""
    options = None
    if columns is not None:  # the stored index (a column in pandas' metadata) comes along
        with _reader(data) as reader:  # the footer's schema only
            schema = reader.schema
        index = [c for c in (schema.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)]
        wanted = [c for c in dict.fromkeys(columns) if c in schema.names and c not in index] + index
        options = pa.ipc.IpcReadOptions(included_fields=sorted(schema.get_field_index(c) for c in wanted))
    with _reader(data, options) as reader:
        table = reader.read_all()
    metadata = table.schema.metadata or {}
    if columns is not None:
        table = table.select(wanted)  # in the order asked for
    return _frame(table, metadata)


def decode_runs(data: bytes, runs: Iterable[str]) -> pd.DataFrame | None:
    """The rows of the frame ``encode`` stored whose ``run_id`` is one of ``runs``, in their
    stored order and numbered from 0; None when some stored row has no run id. The ``run_id``
    column is read first; only the batches holding such rows are then read whole (a window's or
    one run's rows of a result that holds every run: ``analytics.window_scope``)."""
    whole = _reader(data)
    schema = whole.schema
    if "run_id" not in schema.names:
        return None
    wanted = pa.array(sorted(set(runs)), type=pa.string())
    kept: list[int] = []
    options = pa.ipc.IpcReadOptions(included_fields=[schema.get_field_index("run_id")])
    with _reader(data, options) as reader:
        for index in range(reader.num_record_batches):
            column = reader.get_batch(index).column(0)
            if column.null_count:
                return None
            if pa.types.is_null(column.type):  # an empty frame's run_id (Arrow's null type)
                continue
            if pc.any(pc.is_in(column, value_set=wanted.cast(column.type))).as_py():
                kept.append(index)
    table = pa.Table.from_batches([whole.get_batch(index) for index in kept], schema=schema)
    if table.num_rows:
        table = table.filter(
            pc.is_in(table.column("run_id"), value_set=wanted.cast(table.schema.field("run_id").type))
        )
    return _frame(table, schema.metadata or {}).reset_index(drop=True)


def _frame(table: pa.Table, metadata: dict[bytes, bytes]) -> pd.DataFrame:
    """``table`` as the frame it was stored from (``metadata``: the stored schema's, naming its
    columns of Python lists and of Arrow lists; the latter are Arrow again, their values not
    copied)."""
    names = table.column_names
    lists = [c for c in json.loads(metadata.get(_LISTS_KEY, b"[]")) if c in names]
    arrow = [c for c in json.loads(metadata.get(_ARROW_LISTS_KEY, b"[]")) if c in names]
    texts = [c for c in json.loads(metadata.get(_OBJECT_TEXT_KEY, b"[]")) if c in names]
    with _collection_paused():
        if not lists and not arrow:
            return _as_objects(table.to_pandas(), texts)
        frame = _as_objects(table.drop_columns(lists + arrow).to_pandas(), texts)
        for column in sorted(lists + arrow, key=names.index):  # each at its place among the columns
            values = table.column(column)
            if column in arrow:
                cells = pd.Series(values, index=frame.index, dtype=pd.ArrowDtype(values.type))
            else:
                cells = pd.Series(values.to_pylist(), index=frame.index, dtype=object)
            frame.insert(names.index(column), column, cells)
    return frame


def _has_table(conn: duckdb.DuckDBPyConnection) -> bool:
    (found,) = conn.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND database_name = current_database()",
        [TABLE],
    ).fetchone()
    return bool(found)


# Every stored row of a scope is fetched at its first read in a process, and kept (bytes, not
# decoded) for the reads of its other detectors during FETCHED_FOR_S: DuckDB reads the blob
# column of every stored row to return one (0.025-0.034 CPU-s for an empty frame at 10M spans,
# 112 MB stored; all 16 rows 0.17, the largest alone 0.14), and a page or report reads them all.
# A row taken from here may be older than the table's by then; it carries its data version and
# is brought up to date like any stored result. 0 fetches one row per read.
FETCHED_FOR_S = 60.0
# Frames larger than this are not fetched ahead but at their own read: at 10M spans of
# 100,000-call runs, repeated_calls' 88 MB, constraint_ledger's 14 and duplicate_side_effects'
# 10 made the first read of any detector in a process fetch 115 MB (0.20-0.26 CPU-s); the rows
# without them come in 0.03, as one row does.
FETCH_AHEAD_BYTES = 4 << 20
_fetched: dict[tuple, tuple[float, dict[str, tuple[str, str, bytes | None]]]] = {}
_fetched_lock = threading.Lock()


def forget_fetched() -> None:
    """Drop the rows fetched ahead of their reads (``FETCHED_FOR_S``)."""
    with _fetched_lock:
        _fetched.clear()


def _stored_row(
    conn: duckdb.DuckDBPyConnection, metric: str, scope: str, peek: bool = False
) -> tuple[str, str, bytes | None] | None:
    """(code, version, frame) of ``metric``'s stored row for ``scope``, or None. A row fetched
    ahead is handed out once (its bytes are then the reader's), unless ``peek``; a ``peek`` at a
    row whose frame was too large to fetch ahead gives None for the frame."""
    identity = database_identity(conn) if FETCHED_FOR_S > 0 else None
    if identity is not None:
        key, now = (identity, scope), time.monotonic()
        with _fetched_lock:
            for stale in [k for k, (at, _) in _fetched.items() if now - at > FETCHED_FOR_S]:
                del _fetched[stale]
            entry = _fetched.get(key)
            row = None
            if entry is not None and metric in entry[1]:
                row = entry[1][metric] if peek else entry[1].pop(metric)
        if entry is None:  # this scope's first read here: every row of it at once
            rows = conn.execute(
                f"SELECT metric, code, version, CASE WHEN octet_length(frame) <= ? THEN frame END "
                f"FROM {TABLE} WHERE scope = ?",
                [FETCH_AHEAD_BYTES, scope],
            ).fetchall()
            found = {name: (code, version, frame) for name, code, version, frame in rows}
            row = found.get(metric) if peek else found.pop(metric, None)
            with _fetched_lock:
                _fetched[key] = (now, found)
        if row is not None and (row[2] is not None or peek):
            return row
        if row is None and entry is None:
            return None  # not stored (the fetch held every row of the scope)
    row = conn.execute(
        f"SELECT code, version, frame FROM {TABLE} WHERE metric = ? AND scope = ?", [metric, scope]
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def load_encoded(
    conn: duckdb.DuckDBPyConnection, metric: str, scope: str, code: str
) -> tuple[Version, bytes] | None:
    """(data version, encoded frame) of ``metric``'s stored result for ``scope`` written by the
    code ``code`` (its ``code_fingerprint``), or None; ``decode`` the frame (whole or some columns)."""
    if not _has_table(conn):
        return None
    row = _stored_row(conn, metric, scope)
    if row is None or row[0] != code:
        return None
    try:
        return parse_version(row[1]), row[2]
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("stored result of %s unreadable, computing it again: %s", metric, exc)
        return None


def has_stored(conn: duckdb.DuckDBPyConnection, metric: str, scope: str, code: str) -> bool:
    """Whether ``load_encoded`` would find a result (without taking the row fetched ahead: the
    read that follows still finds it there)."""
    if not _has_table(conn):
        return False
    row = _stored_row(conn, metric, scope, peek=True)
    return row is not None and row[0] == code


def decoded(metric: str, data: bytes, columns: list[str] | None = None) -> pd.DataFrame | None:
    """``decode(data, columns)``, or None (logged) when the stored bytes are unreadable."""
    try:
        return decode(data, columns)
    except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        logger.warning("stored result of %s unreadable, computing it again: %s", metric, exc)
        return None


def decoded_runs(metric: str, data: bytes, runs: Iterable[str]) -> pd.DataFrame | None:
    """``decode_runs(data, runs)``, or None (logged when the stored bytes are unreadable)."""
    try:
        return decode_runs(data, runs)
    except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        logger.warning("stored result of %s unreadable, computing it again: %s", metric, exc)
        return None


def load(
    conn: duckdb.DuckDBPyConnection, metric: str, scope: str, code: str
) -> tuple[Version, pd.DataFrame] | None:
    """The stored result of ``metric`` for ``scope`` written by the code ``code`` (its
    ``code_fingerprint``), or None."""
    found = load_encoded(conn, metric, scope, code)
    frame = None if found is None else decoded(metric, found[1])
    return None if frame is None else (found[0], frame)


def store_rows(entries: Iterable[tuple[str, str, Version, bytes, int]], codes: dict[str, str]):
    """A write function (for the single writer) replacing the stored rows of ``entries``
    ((metric, scope, version, encoded frame, rows)), written by the code ``codes[metric]``, and
    dropping the rows no reader of this code would use: of a metric written by other code than
    ``codes`` names, or of a metric ``codes`` does not name (one this code does not register)."""
    rows = [(metric, scope, codes[metric], version_text(v), data, n) for metric, scope, v, data, n in entries]

    def write(conn: duckdb.DuckDBPyConnection) -> int:
        for metric, code in conn.execute(f"SELECT DISTINCT metric, code FROM {TABLE}").fetchall():
            if codes.get(metric) != code:
                conn.execute(f"DELETE FROM {TABLE} WHERE metric = ? AND code = ?", [metric, code])
        for metric, scope, code, version, data, n in rows:
            conn.execute(f"DELETE FROM {TABLE} WHERE metric = ? AND scope = ?", [metric, scope])
            conn.execute(
                f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
                [metric, scope, code, version, data, n],
            )
        return len(rows)

    return write
