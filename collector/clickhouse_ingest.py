"""serve's own inserts into a ClickHouse store: `otel_traces` and `spans` written side by side.

Behind an OpenTelemetry Collector the materialized view `spans_mv` maps every block the exporter
inserts into `otel_traces`. serve has already mapped its spans (``collector.decode``: the same
convention table, held equal to the view by tests/collector/test_clickhouse_store.py), and the
view's query is large: ClickHouse analyses it again for every INSERT, which costs more than
writing a batch of a few thousand spans. So serve writes the exporter's rows into a staging
table of the same structure (no view reads it), its own `spans` rows directly, and then attaches
the staged parts to `otel_traces` (``ALTER TABLE ... ATTACH PARTITION ... FROM``, which moves
parts and runs no view). The exporter's trace-id lookup (`otel_traces_trace_id_ts`, filled by its
own view) gets the rows that view would have written. The result is the tables a collector would
have produced; only if `otel_traces` feeds views of someone else's does serve insert through the
views instead (``direct_ingest_possible``).

Nothing is acknowledged before the last step returned. A crash in between leaves rows in the
staging table (dropped and recreated at the next start: they were never acknowledged, the SDKs
send them again) or in `spans` only (made one with the resent copy by the resolve pass).
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from collector import clickhouse_schema as schema

logger = logging.getLogger(__name__)

STAGING_SUFFIX = "_driftscope_staging"
_PARTITION_ID = re.compile(r"^[0-9A-Za-z_-]+$")


def lookup_table(traces_table: str) -> str:
    """The exporter's trace-id lookup table beside ``traces_table`` (its view's target)."""
    return f"{traces_table}_trace_id_ts"


def staging_table(traces_table: str) -> str:
    """The table serve stages `otel_traces` rows in (one serve per store)."""
    return f"{traces_table}{STAGING_SUFFIX}"


def direct_ingest_possible(store) -> tuple[bool, str]:
    """Whether serve may write `spans` itself: true when the only views reading `otel_traces` are
    driftscope's `spans_mv` and the exporter's trace-id lookup view (what it would skip is done
    here); otherwise the reason, and inserts go through the views."""
    db, traces = store.database, store.traces_table
    # the views ClickHouse runs on an insert into `otel_traces` (in any database)
    rows = store.execute(
        "SELECT dependencies_database AS dbs, dependencies_table AS names FROM system.tables "
        "WHERE database = {db:String} AND name = {t:String}",
        {"db": db, "t": traces},
    ).to_pylist()
    views = set()
    for row in rows:
        for database, name in zip(row["dbs"], row["names"], strict=True):
            views.add(name if database == db else f"{database}.{name}")
    # and any view whose query names it (as a second look)
    rows = store.execute(
        "SELECT name, create_table_query FROM system.tables WHERE database = {db:String} "
        "AND engine = 'MaterializedView'",
        {"db": db},
    )
    names, queries = rows.column("name").to_pylist(), rows.column("create_table_query").to_pylist()
    for name, query in zip(names, queries, strict=True):
        if f"FROM {db}.{traces}" in query or f"FROM `{db}`.`{traces}`" in query:
            views.add(name)
    known = {schema.SPANS_VIEW, lookup_table(traces) + "_mv"}
    others = sorted(views - known)
    if others:
        return False, f"{db}.{traces} feeds other materialized views ({', '.join(others)})"
    return True, ""


def prepare_staging(store) -> str:
    """(Re)create the staging table as `otel_traces` is now, without its data-skipping indexes;
    returns its name. Rows left there by a serve that stopped before attaching them were never
    acknowledged.

    Parts attached from it have no index files (as parts written before an ``ADD INDEX``): a
    query reads them without skipping until a merge, which builds the indexes of the merged part
    as it would anyway. Building them at insert was most of the cost of writing `otel_traces`."""
    db, name = store.database, staging_table(store.traces_table)
    staged = schema.qualified(db, name)
    store.command(f"DROP TABLE IF EXISTS {staged}")
    store.command(f"CREATE TABLE {staged} AS {schema.qualified(db, store.traces_table)}")
    indexes = store.execute(
        "SELECT name FROM system.data_skipping_indices WHERE database = {db:String} AND table = {t:String}",
        {"db": db, "t": name},
    )
    for index in indexes.column("name").to_pylist() if indexes.num_rows else []:
        store.command(f"ALTER TABLE {staged} DROP INDEX {schema.ident(index)}")
    return name


def _ch_json(value: list[dict]) -> str:
    """JSON text as ClickHouse's ``toJSONString`` writes it (the view's `Events` / `Links`)."""
    if not value:
        return "[]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("/", "\\/")


def _string_attributes(attributes: dict) -> dict:
    from collector.clickhouse_store import _string_map  # noqa: PLC0415 (one definition)

    return dict(_string_map(attributes))


def _exporter_json(column: pa.ChunkedArray) -> pa.Array:
    """Decoders' `Events` / `Links` JSON (typed attribute values) as the view builds them from
    the exporter's columns (attribute values as the exporter's strings, ClickHouse's escaping)."""
    texts = column.to_pylist()
    out = []
    for text in texts:
        if text == "[]":
            out.append(text)
            continue
        items = json.loads(text)
        for item in items:
            item["Attributes"] = _string_attributes(item["Attributes"])
        out.append(_ch_json(items))
    return pa.array(out, pa.string())


def spans_rows(rows: pa.Table) -> pa.Table:
    """Rows of the decoders' `spans` schema as rows of ClickHouse's `spans` (Events and Links as
    the view writes them)."""
    from collector.clickhouse_resolve import duckdb_to_clickhouse  # noqa: PLC0415

    table = rows
    for name in ("Events", "Links"):
        column = table.column(name)
        if len(column) and pc.any(pc.not_equal(column, "[]")).as_py():
            table = table.set_column(table.schema.get_field_index(name), name, _exporter_json(column))
    return duckdb_to_clickhouse(table)


def lookup_rows(decoded: pa.Table) -> pa.Table:
    """The rows the exporter's `otel_traces_trace_id_ts_mv` writes for these spans: per trace id
    (not empty), its first and last span start, to the second."""
    seconds = pc.cast(pc.divide(decoded.column("start_ns"), 1_000_000_000), pa.int64())
    table = pa.table({"TraceId": decoded.column("TraceId"), "s": seconds})
    table = table.filter(pc.not_equal(table.column("TraceId"), ""))
    grouped = table.group_by("TraceId").aggregate([("s", "min"), ("s", "max")])
    return pa.table(
        {
            "TraceId": grouped.column("TraceId"),
            "Start": pc.cast(grouped.column("s_min"), pa.timestamp("s", "UTC")),
            "End": pc.cast(grouped.column("s_max"), pa.timestamp("s", "UTC")),
        }
    )


def insert_direct(
    store, decoded: pa.Table, staging: str, lookup: bool, resolver=None, changes=None
) -> tuple[datetime, int]:
    """Insert a decoded batch: the exporter's rows staged then attached to `otel_traces` (and
    its trace-id lookup rows when ``lookup``), and `spans` rows. With ``resolver`` (a
    ``clickhouse_resolve.scratch_duckdb()``) the batch is resolved against the stored rows of
    its traces first, as the DuckDB writer does: its rows go in resolved, a span already stored
    is not stored again, and the stored rows it changes are replaced. With ``changes`` (the
    process's ``clickhouse_changes.ChangeLog``) the batch is a change of the store's log: its
    runs and origin tasks logged before `spans` is written, the change committed after. Returns
    the ingest time the rows were stamped with (ClickHouse's clock) and the `spans` rows it added."""
    from collector import clickhouse_resolve  # noqa: PLC0415
    from collector.clickhouse_changes import touched_rows  # noqa: PLC0415

    now = store.execute("SELECT now64(6, 'UTC') AS t").column("t")[0].as_py().replace(tzinfo=None)
    index = decoded.schema.get_field_index("ingested_at")
    stamped = decoded.set_column(index, "ingested_at", pa.array([now] * decoded.num_rows, pa.timestamp("us")))
    changed = None
    touched: list[tuple[str, str]] = []
    if resolver is not None:
        rows, changed = clickhouse_resolve.resolve_batch(store, resolver, stamped, touched)
    else:
        rows = stamped
    seq = changes.begin(touched + touched_rows(rows)) if changes is not None else None
    try:
        _write_batch(store, decoded, staging, lookup, rows, changed)
    finally:
        if seq is not None:
            changes.commit(seq, "spans", rows.num_rows)
    return now, rows.num_rows


def _write_batch(store, decoded: pa.Table, staging: str, lookup: bool, rows: pa.Table, changed) -> None:
    """``insert_direct``'s writes: the staged exporter rows, the lookup rows, `spans`."""
    from collector import clickhouse_resolve  # noqa: PLC0415
    from collector.clickhouse_store import otel_traces_rows  # noqa: PLC0415

    db, traces = store.database, store.traces_table
    staged = schema.qualified(db, staging)
    if store.execute(f"SELECT count() AS n FROM {staged}").column("n")[0].as_py():
        store.command(f"TRUNCATE TABLE {staged}")  # a batch that failed part-way: never acknowledged
    store.insert_arrow(staging, otel_traces_rows(decoded))
    if lookup:
        store.insert_arrow(lookup_table(traces), lookup_rows(decoded))
    partitions = store.execute(f"SELECT DISTINCT _partition_id AS p FROM {staged}").column("p").to_pylist()
    added = spans_rows(rows)
    if changed is not None and changed.num_rows:
        clickhouse_resolve.replace_changed(store, changed)
        added = pa.concat_tables([added, clickhouse_resolve.duckdb_to_clickhouse(changed)])
    store.insert_arrow(schema.SPANS_TABLE, added)
    for partition in partitions:
        if not _PARTITION_ID.match(partition):
            raise ValueError(f"unexpected partition id {partition!r} in {staged}")
        # the staged parts become `otel_traces`' (no view runs), then leave the staging table
        store.command(
            f"ALTER TABLE {schema.qualified(db, traces)} ATTACH PARTITION ID '{partition}' FROM {staged}"
        )
        store.command(f"ALTER TABLE {staged} DROP PARTITION ID '{partition}'")
