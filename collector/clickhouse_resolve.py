"""The second step after the materialized view: resolve the span tree in ClickHouse's `spans`.

The view maps each span on its own (as the decoders do). What needs a span's ancestors and
descendants - an agent inherited from the nearest agent span, a run inherited or merged into
the invoking run, delegation hops, an agent's input from its caller or first model call, and
exporter retries stored twice - is resolved here by DuckDB's own statements
(``collector.store.insert_batches``, the one definition) over the touched traces only, in an
in-memory DuckDB, in the order the rows arrived. Rows whose values change are rewritten in
`spans` (delete + insert: run_id and agent_id are its sort key, which ClickHouse cannot UPDATE).

Until a pass has run, new rows hold per-span values (no inherited agent, run = trace id when no
span names one). Run it after inserts (``driftscope serve --store`` does after each batch) or on
a schedule (``driftscope clickhouse resolve``) next to an OpenTelemetry Collector.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from collector import clickhouse_schema as schema
from collector.clickhouse_changes import PARTITIONS, ChangeLog, touched_rows
from collector.clickhouse_store import ChdbStore, StoreURLError, init_clickhouse, open_store_url
from collector.decode import SPAN_SCHEMA, DecodedBatch
from collector.migrations_runner import apply_migrations
from collector.store import insert_batches

logger = logging.getLogger(__name__)

_STATE = "driftscope_resolve_state"
WORK_TABLE = "driftscope_resolve_work"  # trace and span ids of the pass under way (one resolver)
TRACES_PER_CHUNK = 5_000
# Columns the tree statements of collector/store.py may change.
_TREE_COLUMNS = ("run_id", "agent_id", "agent_name", "agent_source", "hop", "input_text", "op", "delegate_to")


def clickhouse_to_duckdb(rows: pa.Table) -> pa.Table:
    """Rows of ClickHouse's `spans` as DuckDB's `spans` schema (``collector.decode.SPAN_SCHEMA``):
    maps back to key/value lists, flagged lists back to NULL, time zones dropped."""
    flags = schema.list_null_columns()
    arrays = []
    for field in SPAN_SCHEMA:
        column = rows.column(field.name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        if pa.types.is_map(column.type):
            entries = pa.StructArray.from_arrays(
                [column.keys.cast(pa.string()), column.items.cast(pa.string())], names=["key", "value"]
            )
            column = pa.ListArray.from_arrays(column.offsets, entries)
        elif field.name in flags:
            null = pc.equal(rows.column(flags[field.name]).combine_chunks(), 1)
            column = pc.if_else(null, pa.scalar(None, field.type), column.cast(field.type))
        arrays.append(column.cast(field.type))
    return pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)


def duckdb_to_clickhouse(rows: pa.Table) -> pa.Table:
    """Rows of DuckDB's `spans` schema in ClickHouse's `spans` columns (lists: [] plus a NULL flag)."""
    flags = schema.list_null_columns()
    columns: dict[str, pa.Array] = {}
    for name in schema.spans_clickhouse_types():
        if name in flags.values():
            continue
        column = rows.column(name).combine_chunks()
        if name in ("ResourceAttributes", "SpanAttributes"):
            values = column.values
            column = pa.MapArray.from_arrays(
                column.offsets,
                values.field("key"),
                values.field("value"),
                type=pa.map_(pa.string(), pa.string()),
            )
        elif name in flags:
            columns[name] = pc.if_else(pc.is_null(column), pa.scalar([], column.type), column)
            columns[flags[name]] = pc.cast(pc.is_null(column), pa.uint8())
            continue
        elif pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us", "UTC"))
        columns[name] = column
    return pa.table(columns)


def _ch_time(value: datetime) -> str:
    """A UTC time as a DateTime64(6) parameter value."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")


def _naive(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo is not None else value


def resolved_to(store) -> datetime | None:
    """The resolve watermark (naive UTC): every `spans` row ingested up to it is resolved."""
    since = _resolved_to(store)
    return _naive(since) if since is not None else None


def spans_since(store, mark: datetime | None) -> int:
    """How many `spans` rows were ingested after ``mark`` (all of them for None)."""
    rows = store.execute(
        f"SELECT count() AS n FROM {schema.qualified(store.database, schema.SPANS_TABLE)} "
        "WHERE ingested_at > {since:DateTime64(6, 'UTC')}",
        {"since": _ch_time(mark if mark is not None else datetime(1970, 1, 1))},
    )
    return int(rows.column("n")[0].as_py())


def _resolved_to(store) -> datetime | None:
    rows = store.execute(
        f"SELECT argMax(resolved_to, at) AS t, count() AS n FROM {schema.qualified(store.database, _STATE)} "
        "WHERE name = 'spans'"
    )
    if rows.column("n")[0].as_py() == 0:
        return None
    return rows.column("t")[0].as_py()


def resolve_status(store) -> dict:
    """How far the resolve pass is behind the rows in `spans`: ``resolved_to`` (every row
    ingested up to then has been through a pass; naive UTC, None before the first pass),
    ``unresolved_spans`` (rows ingested since) and ``lag_seconds`` (age of the oldest of them,
    0 when none), as serve's health and ``driftscope clickhouse resolve --follow`` report it."""
    since = _resolved_to(store)
    bound = _naive(since) if since is not None else datetime(1970, 1, 1)
    rows = store.execute(
        "SELECT count() AS n, min(ingested_at) AS oldest, now64(6, 'UTC') AS now "
        f"FROM {schema.qualified(store.database, schema.SPANS_TABLE)} "
        "WHERE ingested_at > {since:DateTime64(6, 'UTC')}",
        {"since": _ch_time(bound)},
    ).to_pylist()[0]
    unresolved = int(rows["n"])
    lag = (_naive(rows["now"]) - _naive(rows["oldest"])).total_seconds() if unresolved else 0.0
    return {
        "resolved_to": _naive(since).isoformat() if since is not None else None,
        "unresolved_spans": unresolved,
        "lag_seconds": round(max(lag, 0.0), 3),
    }


def resolve_spans(
    store,
    settle_seconds: float = 2.0,
    traces_per_chunk: int = TRACES_PER_CHUNK,
    inserting: threading.Lock | None = None,
    changes: ChangeLog | None = None,
) -> int:
    """Resolve the trees of the traces that gained rows since the last pass; return the number
    of `spans` rows rewritten. Rows younger than ``settle_seconds`` wait for the next pass (an
    insert still in flight might otherwise land behind the watermark); ``inserting``, a lock
    the one inserting thread of this process holds from stamping rows until they are stored,
    makes that exact (then ``settle_seconds`` 0). Traces are resolved ``traces_per_chunk`` at a
    time (their rows are read into this process). Each chunk's rewrite is a change of the store's
    change log (``changes``: the process's ``ChangeLog``; one is opened when None)."""
    db = store.database
    spans_table = schema.qualified(db, schema.SPANS_TABLE)
    since = _resolved_to(store)
    if inserting is not None:
        with inserting:
            now = _naive(store.execute("SELECT now64(6, 'UTC') AS t").column("t")[0].as_py())
    else:
        now = _naive(store.execute("SELECT now64(6, 'UTC') AS t").column("t")[0].as_py())
    until = now - timedelta(seconds=settle_seconds)
    since = _naive(since) if since is not None else datetime(1970, 1, 1)
    bounds = {"since": _ch_time(since), "until": _ch_time(until)}
    window = "ingested_at > {since:DateTime64(6, 'UTC')} AND ingested_at <= {until:DateTime64(6, 'UTC')}"
    traces = store.execute(
        f"SELECT DISTINCT TraceId FROM {spans_table} WHERE {window} ORDER BY TraceId", bounds
    )
    trace_ids = traces.column("TraceId").to_pylist() if traces.num_rows else []
    rewritten = 0
    # a bounded number of traces per round trip: the rows come into this process, and ids go
    # through a work table rather than as query parameters (an HTTP URL has a length limit)
    if trace_ids and changes is None:
        changes = ChangeLog(store)
    conn = scratch_duckdb()  # the DuckDB store's tables, emptied for each chunk
    try:
        for start in range(0, len(trace_ids), traces_per_chunk):
            chunk = trace_ids[start : start + traces_per_chunk]
            rewritten += _resolve_traces(store, conn, chunk, bounds, since, changes)
    finally:
        conn.close()
    store.insert_arrow(
        _STATE,
        pa.table(
            {
                "name": ["spans"],
                "resolved_to": pa.array([until], pa.timestamp("us", "UTC")),
                "at": pa.array([now], pa.timestamp("us", "UTC")),
            }
        ),
    )
    logger.debug("resolved %d traces, rewrote %d span rows", len(trace_ids), rewritten)
    return rewritten


def open_for_reading(url: str):
    """The store a reading command names (``report``, ``dashboard`` ``--source``), ready to read.

    A ``chdb:`` path is this process's alone (chdb locks it), so reading it first does what a
    collector deployment schedules: driftscope's objects are created beside `otel_traces` if only
    the OpenTelemetry Collector's exporter has written there (``driftscope clickhouse init``; the
    spans it stored are copied into `spans`), and a resolve pass runs over the traces that gained
    rows. A server is read as it is (its resolver runs on a schedule, one per database); a
    database without driftscope's `spans` is an error saying what to run. DuckDB files open
    read-only."""
    store = open_store_url(url, read_only=True)
    if store.engine == "duckdb":
        return store
    try:
        if isinstance(store, ChdbStore):
            created = init_clickhouse(store)
            rewritten = resolve_spans(store, settle_seconds=0)
            if created:
                logger.info("%s had no driftscope objects: created %s", url, ", ".join(created))
            logger.info("resolved %s before reading: %d span rows rewritten", url, rewritten)
            return store
        tables = store.execute(
            "SELECT name FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            {"db": store.database, "t": schema.SPANS_TABLE},
        )
        if tables.num_rows == 0:
            raise StoreURLError(
                f"ClickHouse database {store.database!r} has no driftscope `spans` table: run "
                f"`driftscope clickhouse init --store {url}` once beside the exporter's otel_traces and "
                "`driftscope clickhouse resolve` on a schedule (docs/scale-out.md)"
            )
    except BaseException:
        store.close()
        raise
    return store


def _quiet_migrations(conn) -> None:
    """The DuckDB store's tables in a scratch in-memory database (not a user's database being
    migrated: no log lines)."""
    quiet = logging.getLogger("collector.migrations_runner")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        apply_migrations(conn)
    finally:
        quiet.setLevel(level)


def _put_work(store, kind: str, keys: list[str]) -> None:
    store.insert_arrow(WORK_TABLE, pa.table({"kind": pa.array([kind] * len(keys), pa.string()), "key": keys}))


def _changed_rows(conn, stored: pa.Table) -> pa.Table:
    """Rows of the scratch DuckDB's `spans` whose tree columns differ from ``stored`` (rows as
    they are in ClickHouse), or that are stored more than once: what a pass writes back."""
    conn.register("_stored", stored.select(["TraceId", "SpanId", *_TREE_COLUMNS]))
    try:
        return conn.sql(
            f"""
            WITH stored AS (SELECT TraceId, SpanId, count(*) AS copies,
                                   {", ".join(f"any_value({c}) AS {c}" for c in _TREE_COLUMNS)}
                            FROM _stored GROUP BY TraceId, SpanId)
            SELECT s.* FROM spans s JOIN stored c USING (TraceId, SpanId)
            WHERE c.copies > 1 OR {" OR ".join(f"s.{c} IS DISTINCT FROM c.{c}" for c in _TREE_COLUMNS)}
            """
        ).to_arrow_table()
    finally:
        conn.unregister("_stored")


def scratch_duckdb():
    """An in-memory DuckDB with the DuckDB store's tables, for resolving trees."""
    conn = duckdb.connect()
    _quiet_migrations(conn)
    return conn


def logged_partitions(conn) -> list[tuple[str, str]]:
    """The runs and origin tasks the scratch DuckDB's writer logged as touched (the DuckDB store's
    own definition, ``collector.changes``: the run a span leaves included)."""
    rows = conn.execute(
        "SELECT DISTINCT partition, key FROM change_partitions WHERE partition IN (SELECT unnest($p::VARCHAR[]))",
        {"p": list(PARTITIONS)},
    ).fetchall()
    return [(partition, key) for partition, key in rows]


def resolve_batch(
    store, conn, batch: pa.Table, touched: list[tuple[str, str]] | None = None
) -> tuple[pa.Table, pa.Table]:
    """Resolve a decoded batch (``collector.decode``'s `spans` schema, stamped with its ingest
    time) against the rows `spans` holds of its traces, before it is inserted: returns the
    batch's rows to store, resolved (a span already stored is not stored again), and the stored
    rows the batch changes (a descendant that arrived before its ancestor) or that are stored
    twice: these replace their stored copies. ``conn``: a ``scratch_duckdb()``. ``touched``, a
    list, is extended with the runs and origin tasks the batch touches (new and changed rows)."""
    trace_ids = pc.unique(batch.column("TraceId")).to_pylist()
    stored = store.execute(
        f"SELECT * FROM {schema.qualified(store.database, schema.SPANS_TABLE)} "
        "WHERE TraceId IN {ids:Array(String)}",
        {"ids": trace_ids},
    )
    old = clickhouse_to_duckdb(stored) if stored.num_rows else SPAN_SCHEMA.empty_table()
    conn.execute("DELETE FROM spans")
    conn.register("_old", old)
    try:
        conn.execute("INSERT INTO spans SELECT * FROM _old")
        insert_batches(conn, [DecodedBatch(table=batch)])
        changed = _changed_rows(conn, old)
        new = conn.sql("SELECT s.* FROM spans s ANTI JOIN _old o USING (TraceId, SpanId)").to_arrow_table()
        if touched is not None:
            touched += logged_partitions(conn)
    finally:
        conn.unregister("_old")
        conn.execute("DELETE FROM change_partitions; DELETE FROM span_changes; DELETE FROM change_log")
    return new, changed


def replace_changed(store, changed: pa.Table) -> None:
    """Delete the stored copies of ``changed`` rows (DuckDB schema) before they are inserted again
    (`run_id` and `agent_id` are the sort key: ClickHouse cannot update them)."""
    trace_ids = pc.unique(changed.column("TraceId")).to_pylist()
    keys = pc.binary_join_element_wise(changed.column("TraceId"), changed.column("SpanId"), "").to_pylist()
    store.command(
        f"DELETE FROM {schema.qualified(store.database, schema.SPANS_TABLE)} "
        "WHERE TraceId IN {ids:Array(String)} AND concat(TraceId, SpanId) IN {keys:Array(String)}"
        + store.delete_settings(),
        {"ids": trace_ids, "keys": keys},
    )


def advance_to(store, until: datetime) -> None:
    """Record that every `spans` row ingested up to ``until`` is resolved (the watermark)."""
    now = _naive(store.execute("SELECT now64(6, 'UTC') AS t").column("t")[0].as_py())
    store.insert_arrow(
        _STATE,
        pa.table(
            {
                "name": ["spans"],
                "resolved_to": pa.array([_naive(until)], pa.timestamp("us", "UTC")),
                "at": pa.array([now], pa.timestamp("us", "UTC")),
            }
        ),
    )


def _resolve_traces(
    store, conn, trace_ids: list[str], bounds: dict, since: datetime, changes: ChangeLog
) -> int:
    db = store.database
    spans_table = schema.qualified(db, schema.SPANS_TABLE)
    work = schema.qualified(db, WORK_TABLE)
    store.command(f"TRUNCATE TABLE {work}")
    _put_work(store, "trace", trace_ids)
    stored = store.execute(
        f"SELECT * FROM {spans_table} WHERE TraceId IN (SELECT key FROM {work} WHERE kind = 'trace') "
        "AND ingested_at <= {until:DateTime64(6, 'UTC')}",
        {"until": bounds["until"]},
    )
    rows = clickhouse_to_duckdb(stored)
    is_new = pc.greater(rows.column("ingested_at"), pa.scalar(since, pa.timestamp("us")))
    old, new = rows.filter(pc.invert(is_new)), rows.filter(is_new)
    conn.execute("DELETE FROM spans")
    conn.register("_old", old)
    conn.execute("INSERT INTO spans SELECT * FROM _old")
    conn.unregister("_old")
    # the new rows in one insert, in arrival order (the first stored copy of a span wins, as the
    # DuckDB writer keeps it): the walks resolve ancestors and descendants whatever batch
    # brought them, so one insert gives what one per arrival gives
    new = new.sort_by([("ingested_at", "ascending")])
    insert_batches(conn, [DecodedBatch(table=new)])
    changed = _changed_rows(conn, stored)
    # the new rows' partitions as stored (before their tree was resolved: a run a span leaves)
    # and as resolved, logged before `spans` is written (collector.clickhouse_changes)
    touched = touched_rows(new) + logged_partitions(conn)
    conn.execute("DELETE FROM change_partitions; DELETE FROM span_changes; DELETE FROM change_log")
    seq = changes.begin(touched)
    try:
        if changed.num_rows == 0:
            return 0
        keys = pc.binary_join_element_wise(
            changed.column("TraceId"), changed.column("SpanId"), ""
        ).to_pylist()
        _put_work(store, "span", keys)
        store.command(
            f"DELETE FROM {spans_table} WHERE TraceId IN (SELECT key FROM {work} WHERE kind = 'trace') "
            f"AND concat(TraceId, SpanId) IN (SELECT key FROM {work} WHERE kind = 'span') "
            "AND ingested_at <= {until:DateTime64(6, 'UTC')}" + store.delete_settings(),
            {"until": bounds["until"]},
        )
        store.insert_arrow(schema.SPANS_TABLE, duckdb_to_clickhouse(changed))
        return changed.num_rows
    finally:
        changes.commit(seq, "resolve", new.num_rows)
