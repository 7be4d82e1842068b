"""The store interface and its engines: DuckDB (the default), chdb (ClickHouse in process on a
local path) and a ClickHouse server (clickhouse-connect over HTTP).

A store is small: ``execute(sql, params) -> pyarrow.Table``, ``insert_arrow(table, rows)``,
``migrate()``. Everything ClickHouse-specific above those calls (creating driftscope's objects
beside the exporter's ``otel_traces``, writing OTLP in the exporter's layout, resolving the span
tree) is one code path for chdb and a server; only the three calls differ.

URLs (``--store``): a DuckDB file path or ``duckdb:PATH``; ``chdb:PATH`` (optionally
``?database=otel&table=otel_traces``); ``clickhouse://[USER[:PASSWORD]@]HOST[:PORT]/DB``
(optionally ``?table=otel_traces&secure=1``).
"""

from __future__ import annotations

import abc
import functools
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from collector import clickhouse_schema as schema

logger = logging.getLogger(__name__)

_EXAMPLES = "a DuckDB file path, chdb:PATH or clickhouse://HOST:8123/DB"


class StoreURLError(ValueError):
    """A --store URL that names no usable store; the message says what was wrong and what to do."""


@dataclass(frozen=True)
class StoreURL:
    """A parsed --store URL."""

    engine: str  # duckdb | chdb | clickhouse
    path: str = ""  # duckdb / chdb: the local path
    host: str = ""
    port: int = 8123
    username: str = "default"
    password: str = ""
    secure: bool = False
    database: str = schema.DEFAULT_DATABASE
    table: str = schema.DEFAULT_TRACES_TABLE


def _query_options(query: str, url: str, allowed: tuple[str, ...]) -> dict[str, str]:
    options = {key: values[-1] for key, values in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise StoreURLError(
            f"Unknown option(s) {', '.join(unknown)} in store URL {url!r}; allowed: {', '.join(allowed)}"
        )
    return options


def _checked_name(value: str, what: str, url: str) -> str:
    try:
        schema.ident(value)
    except schema.SchemaError:
        raise StoreURLError(
            f"Expected the {what} in store URL {url!r} to be a name of letters, digits and _, got {value!r}"
        ) from None
    return value


def parse_store_url(url: str) -> StoreURL:
    """Parse a --store URL; raise ``StoreURLError`` saying what was wrong and what to give."""
    if not isinstance(url, str) or not url.strip():
        raise StoreURLError(f"Expected --store to be {_EXAMPLES}, got an empty value")
    url = url.strip()
    if url.startswith("chdb:"):
        rest = url[len("chdb:") :]
        path, _, query = rest.partition("?")
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise StoreURLError(
                f"Expected a local data path after chdb: (e.g. chdb:/var/lib/driftscope/ch), got {url!r}"
            )
        options = _query_options(query, url, ("database", "table"))
        return StoreURL(
            engine="chdb",
            path=path,
            database=_checked_name(options.get("database", schema.DEFAULT_DATABASE), "database", url),
            table=_checked_name(options.get("table", schema.DEFAULT_TRACES_TABLE), "table", url),
        )
    if url.startswith("duckdb:"):
        path = url[len("duckdb:") :]
        if not path:
            raise StoreURLError(f"Expected a DuckDB file path after duckdb:, got {url!r}")
        return StoreURL(engine="duckdb", path=path)
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme not in ("clickhouse", "clickhouses"):
            raise StoreURLError(f"Unknown store scheme {parts.scheme!r} in {url!r}; expected {_EXAMPLES}")
        if not parts.hostname:
            raise StoreURLError(f"Expected a host in {url!r}, e.g. clickhouse://127.0.0.1:8123/otel")
        try:
            port = parts.port or 8123
        except ValueError:
            raise StoreURLError(
                f"Expected the port in {url!r} to be an integer between 1 and 65535 (ClickHouse HTTP: 8123)"
            ) from None
        database = parts.path.strip("/") or schema.DEFAULT_DATABASE
        options = _query_options(parts.query, url, ("table", "secure"))
        return StoreURL(
            engine="clickhouse",
            host=parts.hostname,
            port=port,
            username=unquote(parts.username) if parts.username else "default",
            password=unquote(parts.password) if parts.password else "",
            secure=parts.scheme == "clickhouses" or options.get("secure", "") in ("1", "true"),
            database=_checked_name(database, "database", url),
            table=_checked_name(options.get("table", schema.DEFAULT_TRACES_TABLE), "table", url),
        )
    if ":" in url.split("/", 1)[0] and not Path(url).suffix:
        scheme = url.split(":", 1)[0]
        if len(scheme) > 1:  # not a Windows drive letter
            raise StoreURLError(f"Unknown store scheme {scheme!r} in {url!r}; expected {_EXAMPLES}")
    return StoreURL(engine="duckdb", path=url)


# --- engines ------------------------------------------------------------------------------------


class DuckDBStore:
    """The embedded default: a DuckDB file (opened and migrated by ``collector.store``)."""

    engine = "duckdb"

    def __init__(self, path: str, read_only: bool = False) -> None:
        from collector.store import open_store  # noqa: PLC0415

        self.path = path
        self.database = ""
        self.traces_table = "otel_traces"
        self.conn = open_store(path, read_only=read_only)

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Run a DuckDB statement (``$name`` parameters); its rows as Arrow (empty if none)."""
        relation = self.conn.sql(sql, params=params or None)
        return relation.to_arrow_table() if relation is not None else pa.table({})

    def insert_arrow(self, table: str, rows: pa.Table) -> None:
        self.conn.register("_insert_rows", rows)
        try:
            self.conn.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM _insert_rows')
        finally:
            self.conn.unregister("_insert_rows")

    def migrate(self) -> list[str]:
        from collector.migrations_runner import apply_migrations  # noqa: PLC0415

        return apply_migrations(self.conn)

    def close(self) -> None:
        self.conn.close()


class ClickHouseStore(abc.ABC):
    """What chdb and a server share: everything above execute / insert_arrow / command."""

    engine = "clickhouse"
    database: str
    traces_table: str

    @abc.abstractmethod
    def execute(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table: ...

    @abc.abstractmethod
    def insert_arrow(self, table: str, rows: pa.Table) -> None: ...

    @abc.abstractmethod
    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        """Run a statement that returns no rows (DDL, DELETE)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def server_version(self) -> tuple[int, int]:
        text = self.execute("SELECT version() AS v").column("v")[0].as_py()
        major, minor, *_ = (int(part) for part in text.split(".")[:2])
        return major, minor

    @functools.cached_property
    def patch_deletes(self) -> bool:
        """Whether this server writes a DELETE as a patch part (lightweight updates: the
        `lightweight_delete_mode` setting and block-number columns). Without them each DELETE on
        `spans` is a mutation whose cost grows with the table's parts, not the rows deleted."""
        rows = self.execute(
            "SELECT (SELECT count() FROM system.settings WHERE name = 'lightweight_delete_mode') "
            "+ (SELECT count() FROM system.merge_tree_settings WHERE name IN "
            "('enable_block_number_column', 'enable_block_offset_column')) AS n"
        )
        return rows.column("n")[0].as_py() == 3

    def delete_settings(self) -> str:
        """The SETTINGS clause of a DELETE on `spans` (empty where the server has no patch parts)."""
        return schema.PATCH_DELETE_SETTINGS if self.patch_deletes else ""

    def table_exists(self, table: str) -> bool:
        rows = self.execute(
            "SELECT count() AS n FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            {"db": self.database, "t": table},
        )
        return rows.column("n")[0].as_py() > 0

    def migrate(self, ttl_days: int = 0) -> list[str]:
        """Create driftscope's objects beside the exporter's table (that table too when it is
        missing, in the exporter's layout); idempotent. Returns what was created."""
        return init_clickhouse(self, ttl_days=ttl_days)


_TEXT_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"})


def _chdb_item(value: Any) -> str:
    """A value inside an array literal (strings quoted and escaped)."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.translate(_TEXT_ESCAPES).replace("'", "\\'") + "'"
    if isinstance(value, datetime):
        return "'" + _chdb_value(value) + "'"
    return _chdb_value(value)


def _chdb_value(value: Any) -> str:
    """A query parameter in ClickHouse's text format, as chdb takes it. A str is passed as it is:
    it is taken to be ClickHouse text already (analytics escapes its strings that way)."""
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_chdb_item(item) for item in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _chdb_params(params: dict[str, Any] | None) -> dict[str, str] | None:
    """chdb takes parameter values as ClickHouse text (NULL as \\N, arrays as literals);
    clickhouse-connect formats Python values itself."""
    if not params:
        return None
    return {name: _chdb_value(value) for name, value in params.items()}


def chdb_path_holder(path: Path) -> str | None:
    """Who holds the chdb data path ``path`` (its ``status`` file, which the embedded server
    locks while a process has the path open), as "process PID (command line)"; None when no
    other process holds it."""
    import fcntl  # noqa: PLC0415 - POSIX only, as chdb is

    status = path / "status"
    try:
        handle = status.open("rb")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # locked: another process holds the path
            text = handle.read(4096).decode("utf-8", "replace")
        else:
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None
    pid = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("PID:")), "")
    if not pid.isdigit():
        return "process unknown"
    try:
        command = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        )
    except OSError:
        command = ""
    command = " ".join(command.split())  # one line, however it was started
    if len(command) > 160:
        command = command[:157] + "..."
    return f"process {pid}" + (f": {command}" if command else "")


class ChdbStore(ClickHouseStore):
    """ClickHouse in process (chdb) on a local data path."""

    engine = "chdb"

    def __init__(
        self, path: str, database: str = schema.DEFAULT_DATABASE, table: str = "otel_traces"
    ) -> None:
        try:
            from chdb import session  # noqa: PLC0415
        except ImportError as exc:
            raise StoreURLError(
                "chdb is not installed: pip install 'driftscope[clickhouse]' (or give a DuckDB file path)"
            ) from exc
        self.path = path
        self.database = database
        self.traces_table = table
        Path(path).mkdir(parents=True, exist_ok=True)
        try:
            self._session = session.Session(str(path))
        except Exception as exc:
            holder = chdb_path_holder(Path(path))
            if holder is not None:
                raise StoreURLError(
                    f"chdb:{path} is open in another process ({holder}): a chdb path is one process's "
                    "at a time. Stop that process first, or read the store through the serve that "
                    "holds it (`--source http://HOST:PORT`, its read API), or keep the spans "
                    "on a ClickHouse server (clickhouse://HOST:8123/DB), which many processes share."
                ) from exc
            if "already initialized" not in str(exc):
                raise
            raise StoreURLError(
                f"chdb runs one data path per process and this process already has another open "
                f"({exc}); close that store first, or use a ClickHouse server (clickhouse://HOST:8123/DB)."
            ) from exc
        self._lock = threading.Lock()  # one chdb session is not safe for concurrent queries

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Run a ClickHouse statement (``{name:Type}`` parameters); its rows as Arrow."""
        with self._lock:
            result = self._session.query(sql, "ArrowTable", params=_chdb_params(params))
        return result if isinstance(result, pa.Table) else pa.table({})

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._session.query(sql, params=_chdb_params(params))

    def insert_arrow(self, table: str, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        columns = ", ".join(f"`{name}`" for name in rows.column_names)
        with self._lock:
            with self._session.send_insert(
                f"INSERT INTO {schema.qualified(self.database, table)} ({columns})", "ArrowStream"
            ) as inserter:
                inserter.append(sink.getvalue().to_pybytes())
                inserter.finish()

    def close(self) -> None:
        with self._lock:
            self._session.close()


class ServerStore(ClickHouseStore):
    """A ClickHouse server over HTTP (clickhouse-connect, Arrow results). A thin layer: the tests
    that need a server run when DRIFTSCOPE_CLICKHOUSE_URL is set."""

    engine = "clickhouse"

    def __init__(self, url: StoreURL) -> None:
        try:
            import clickhouse_connect  # noqa: PLC0415
        except ImportError as exc:
            raise StoreURLError(
                "clickhouse-connect is not installed: pip install 'driftscope[clickhouse]'"
            ) from exc
        self.database = url.database
        self.traces_table = url.table
        try:
            self._client = clickhouse_connect.get_client(
                host=url.host,
                port=url.port,
                username=url.username,
                password=url.password,
                secure=url.secure,
                # one session, so temporary tables (analytics' goal_scores_local) live between
                # statements as they do in a chdb session; a session takes one query at a time
                session_id=f"driftscope-{uuid.uuid4()}",
            )
        except Exception as exc:  # clickhouse-connect raises its own OperationalError family
            raise StoreURLError(
                f"Could not reach ClickHouse at {url.host}:{url.port} over HTTP ({exc}). Check the "
                "host, the HTTP port (8123 by default, 8443 with TLS) and the credentials in the URL."
            ) from exc

        self._lock = threading.Lock()

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        with self._lock:
            return self._client.query_arrow(sql, parameters=params or None, use_strings=True)

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._client.command(sql, parameters=params or None)

    def insert_arrow(self, table: str, rows: pa.Table) -> None:
        if rows.num_rows:
            with self._lock:
                self._client.insert_arrow(table, rows, database=self.database)

    def close(self) -> None:
        with self._lock:
            self._client.close()


def open_store_url(url: str | StoreURL, read_only: bool = False) -> DuckDBStore | ClickHouseStore:
    """Open the store a --store URL names (DuckDB files are created and migrated as before;
    ClickHouse stores are not changed until ``migrate()`` / ``driftscope clickhouse init``)."""
    parsed = url if isinstance(url, StoreURL) else parse_store_url(url)
    if parsed.engine == "duckdb":
        return DuckDBStore(parsed.path, read_only=read_only)
    if parsed.engine == "chdb":
        return ChdbStore(parsed.path, parsed.database, parsed.table)
    return ServerStore(parsed)


# --- driftscope's objects in ClickHouse -----------------------------------------------------------

# Columns of `otel_traces` the spans view reads; a table without them is not the exporter's.
_REQUIRED_TRACE_COLUMNS = schema.OTEL_TRACES_INSERT_COLUMNS  # every column the exporter writes
_RESOLVE_STATE_TABLE = "driftscope_resolve_state"


def _resolve_state_ddl(database: str) -> list[str]:
    return [
        f"CREATE TABLE IF NOT EXISTS {schema.qualified(database, _RESOLVE_STATE_TABLE)} "
        "(name String, resolved_to DateTime64(6, 'UTC'), at DateTime64(6, 'UTC')) "
        "ENGINE = ReplacingMergeTree(at) ORDER BY name",
        f"CREATE TABLE IF NOT EXISTS {schema.qualified(database, 'driftscope_resolve_work')} "
        "(kind LowCardinality(String), key String) ENGINE = MergeTree ORDER BY (kind, key)",
    ]


def init_clickhouse(store: ClickHouseStore, ttl_days: int = 0) -> list[str]:
    """``driftscope clickhouse init``: create driftscope's objects beside `otel_traces` (and
    `otel_traces` itself, in the exporter's layout, only when missing). ``ttl_days`` is the TTL of
    the tables created now (`spans`; `otel_traces` when created here). Idempotent; returns the
    objects created now."""
    db = store.database
    store.command(f"CREATE DATABASE IF NOT EXISTS {schema.ident(db)}")
    before = set(
        store.execute("SELECT name FROM system.tables WHERE database = {db:String}", {"db": db})
        .column("name")
        .to_pylist()
    )
    if store.traces_table in before:
        columns = set(
            store.execute(
                "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String}",
                {"db": db, "t": store.traces_table},
            )
            .column("name")
            .to_pylist()
        )
        missing = [column for column in _REQUIRED_TRACE_COLUMNS if column not in columns]
        if missing:
            raise StoreURLError(
                f"{db}.{store.traces_table} exists but lacks the columns {', '.join(missing)} of the "
                "OpenTelemetry Collector clickhouse exporter's traces table; point the store URL at the "
                "exporter's table (?table=NAME) or let `driftscope clickhouse init` create it in an empty database."
            )
    else:
        full_text = store.server_version() >= schema.FULL_TEXT_SEARCH_VERSION
        for statement in schema.otel_traces_ddl(db, store.traces_table, ttl_days, full_text):
            store.command(statement)
    if schema.SPANS_TABLE in before:
        upgraded = _upgrade_spans(store)
    else:
        upgraded = []
    ddl = schema.driftscope_ddl(db, store.traces_table, ttl_days, patch_deletes=store.patch_deletes)
    for statement in [*ddl, *_resolve_state_ddl(db)]:
        store.command(statement)
    if schema.SPANS_VIEW not in before:
        # Spans the exporter stored before the view existed; a span that also reached the view
        # while this ran is stored twice and made one by the next resolve pass.
        store.command(
            f"INSERT INTO {schema.qualified(db, schema.SPANS_TABLE)} "
            f"{schema.spans_select_sql(db, store.traces_table)}"
        )
    after = set(
        store.execute("SELECT name FROM system.tables WHERE database = {db:String}", {"db": db})
        .column("name")
        .to_pylist()
    )
    created = sorted(after - before) + upgraded
    if created:
        logger.info("created in ClickHouse %s: %s", db, ", ".join(created))
    return created


def _upgrade_spans(store: ClickHouseStore) -> list[str]:
    """Bring an existing `spans` and its view up to this version: add the columns it lacks (in
    DuckDB's order; rows stored before keep NULL there) and replace a view whose query changed
    (the convention table changed). The new view is created before the old one is dropped, so no
    insert is missed; a span both views saw is stored twice and made one by the resolve pass."""
    db = store.database
    done = []
    present = (
        store.execute(
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
            {"db": db, "t": schema.SPANS_TABLE},
        )
        .column("name")
        .to_pylist()
    )
    previous = None
    for name, kind in schema.spans_clickhouse_types().items():
        if name not in present:
            after = f" AFTER {schema.ident(previous)}" if previous else " FIRST"
            store.command(
                f"ALTER TABLE {schema.qualified(db, schema.SPANS_TABLE)} "
                f"ADD COLUMN IF NOT EXISTS {schema.ident(name)} {kind}{after}"
            )
            done.append(f"spans.{name} (column added)")
        previous = name
    indexes = store.execute(
        "SELECT name FROM system.data_skipping_indices WHERE database = {db:String} AND table = {t:String}",
        {"db": db, "t": schema.SPANS_TABLE},
    )
    have = set(indexes.column("name").to_pylist()) if indexes.num_rows else set()
    for name, definition in schema.SPANS_INDEXES.items():
        if name not in have:
            # parts written before are read without skipping until merges rebuild them
            store.command(
                f"ALTER TABLE {schema.qualified(db, schema.SPANS_TABLE)} ADD INDEX IF NOT EXISTS {name} {definition}"
            )
            done.append(f"spans.{name} (index added)")
    if store.patch_deletes:
        engine = store.execute(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            {"db": db, "t": schema.SPANS_TABLE},
        )
        if "enable_block_offset_column = 1" not in engine.column("engine_full")[0].as_py():
            # parts written before get their block numbers from their names; deletes after this
            # are patch parts instead of mutations over every part
            store.command(
                f"ALTER TABLE {schema.qualified(db, schema.SPANS_TABLE)} MODIFY SETTING {schema.PATCH_TABLE_SETTINGS}"
            )
            done.append("spans (deletes as patch parts)")
    views = store.execute(
        "SELECT comment FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        {"db": db, "t": schema.SPANS_VIEW},
    )
    if views.num_rows and views.column("comment")[0].as_py() != schema.spans_view_comment(
        db, store.traces_table
    ):
        staging = f"{schema.SPANS_VIEW}_next"
        store.command(f"DROP VIEW IF EXISTS {schema.qualified(db, staging)}")
        store.command(schema.spans_view_ddl(db, store.traces_table, name=staging))
        store.command(f"DROP VIEW {schema.qualified(db, schema.SPANS_VIEW)}")
        store.command(
            f"RENAME TABLE {schema.qualified(db, staging)} TO {schema.qualified(db, schema.SPANS_VIEW)}"
        )
        done.append(f"{schema.SPANS_VIEW} (view replaced: the convention table changed)")
    return done


# --- OTLP in the exporter's layout ----------------------------------------------------------------


def _string_map(attributes: dict[str, Any]) -> list[tuple[str, str]]:
    """Typed attribute values as the exporter's string map holds them (as the decoders'
    ``SpanAttributes``: strings as they are, others as compact JSON)."""
    out = []
    for key, value in attributes.items():
        if isinstance(value, str):
            out.append((key, value))
        elif isinstance(value, bool):
            out.append((key, "true" if value else "false"))
        elif value is None:
            out.append((key, ""))
        else:
            out.append((key, json.dumps(value, ensure_ascii=False, separators=(",", ":"))))
    return out


_MAP = pa.map_(pa.string(), pa.string())


def _key_value_list_to_map(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    values = array.values
    return pa.MapArray.from_arrays(array.offsets, values.field("key"), values.field("value"), type=_MAP)


def _nested_columns(texts: pa.ChunkedArray | pa.Array, fields: dict[str, tuple[str, pa.DataType]]) -> dict:
    """The decoders' `Events` / `Links` JSON text as the exporter's Nested columns (parallel
    arrays, one per field). Only rows that have items are parsed: most spans have none."""
    array = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    rows = len(array)
    has_items = pc.not_equal(array, "[]")
    if not pc.any(has_items).as_py():
        offsets = pa.array([0] * (rows + 1), pa.int32())
        return {
            name: pa.ListArray.from_arrays(offsets, pa.array([], kind), type=pa.list_(kind))
            for name, (_, kind) in fields.items()
        }
    parsed = [json.loads(text) if text != "[]" else () for text in array.to_pylist()]
    out = {}
    for name, (key, kind) in fields.items():
        if kind == _MAP:
            values = [[_string_map(item[key]) for item in row] for row in parsed]
        else:
            values = [[item[key] for item in row] for row in parsed]
        out[name] = pa.array(values, pa.list_(kind))
    return out


def otel_traces_rows(spans: pa.Table) -> pa.Table:
    """Rows of driftscope's `spans` schema (a ``collector.decode`` batch table) in the columns the
    OpenTelemetry Collector clickhouse exporter inserts into `otel_traces` (its order, Nested
    Events / Links as parallel arrays)."""
    start_ns = spans.column("start_ns")
    ns = pa.timestamp("ns", "UTC")
    events = _nested_columns(
        spans.column("Events"),
        {
            "Events.Timestamp": ("Timestamp", ns),
            "Events.Name": ("Name", pa.string()),
            "Events.Attributes": ("Attributes", _MAP),
        },
    )
    links = _nested_columns(
        spans.column("Links"),
        {
            "Links.TraceId": ("TraceId", pa.string()),
            "Links.SpanId": ("SpanId", pa.string()),
            "Links.TraceState": ("TraceState", pa.string()),
            "Links.Attributes": ("Attributes", _MAP),
        },
    )
    columns = {
        "Timestamp": pc.cast(start_ns, ns),
        "TraceId": spans.column("TraceId"),
        "SpanId": spans.column("SpanId"),
        "ParentSpanId": spans.column("ParentSpanId"),
        "TraceState": spans.column("TraceState"),
        "SpanName": spans.column("SpanName"),
        "SpanKind": spans.column("SpanKind"),
        "ServiceName": spans.column("ServiceName"),
        "ResourceAttributes": _key_value_list_to_map(spans.column("ResourceAttributes")),
        "ScopeName": spans.column("ScopeName"),
        "ScopeVersion": spans.column("ScopeVersion"),
        "SpanAttributes": _key_value_list_to_map(spans.column("SpanAttributes")),
        "Duration": pc.cast(spans.column("Duration"), pa.uint64()),
        "StatusCode": spans.column("StatusCode"),
        "StatusMessage": spans.column("StatusMessage"),
        **events,
        **links,
    }
    assert tuple(columns) == schema.OTEL_TRACES_INSERT_COLUMNS
    return pa.table(columns)


def insert_otel_traces(store: ClickHouseStore, spans: pa.Table) -> int:
    """Insert decoded spans into the store's `otel_traces` as the exporter would; returns rows.
    The materialized view fills `spans` in the same insert."""
    if spans.num_rows == 0:
        return 0
    store.insert_arrow(store.traces_table, otel_traces_rows(spans))
    return spans.num_rows
