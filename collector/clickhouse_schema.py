"""ClickHouse DDL for scale-out: the exporter's `otel_traces` and driftscope's objects beside it.

Pure builders (strings in, SQL out, no I/O) used by ``collector.clickhouse_store`` and by tests
that build the tables in chdb.

* ``otel_traces_ddl``: the table otelcol-contrib's ``clickhouse`` exporter creates, as it creates
  it (we never alter it; we only create it when it is missing).
* ``spans_table_ddl``: driftscope's `spans`, with DuckDB's `spans` column names in DuckDB's order,
  its types translated from the DuckDB schema itself (the collector's migrations applied to an
  in-memory DuckDB), ordered for the detectors (run, agent, time).
* ``spans_view_ddl``: the materialized view that fills `spans` from `otel_traces`. Its
  coordination columns are generated from the convention table (``collector.conventions.RULES``
  with its ``READERS_SQL`` / ``CONDITIONS_SQL``), never a second list of keys.
* ``analytics_tables_ddl``: embeddings, thresholds and goal scores, translated from analytics'
  own DuckDB migrations the same way.

ClickHouse has no ``Nullable(Array)``: a nullable DuckDB list column becomes ``Array(String)``
plus a ``<column>_null`` UInt8 flag (1 where DuckDB holds NULL), after the DuckDB columns.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re

from collector.conventions import (
    CONDITIONS_SQL,
    COORDINATION_COLUMNS,
    READERS_SQL,
    RULES,
    Rule,
    Source,
    SqlContext,
    event_key,
    is_direct,
    sql_text,
)

# The exporter's DDL, copied from open-telemetry/opentelemetry-collector-contrib
# exporter/clickhouseexporter/internal/sqltemplates/traces_table.sql, traces_id_ts_lookup_table.sql
# and traces_id_ts_lookup_mv.sql: the Go-template versions (2026; `Duration UInt64 CODEC(T64, ...)`,
# `PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))`, `*AttributeItems` ALIAS columns,
# text indexes from ClickHouse 26.2, bloom filters before), rendered as exporter_traces.go renders
# them (`renderCreateTracesTableSQL`: engine `MergeTree()`, TTL `toDateTime(Timestamp) +
# toIntervalDay(N)`). Earlier layouts (e.g. commit f92a5763: ORDER BY (ServiceName, SpanName,
# toDateTime(Timestamp)), bloom filters only) hold the same columns the view reads.
EXPORTER_LAYOUT = "otelcol-contrib clickhouseexporter sqltemplates/traces_table.sql (Go template, 2026)"
# ClickHouse from which the exporter creates text indexes instead of bloom filters.
FULL_TEXT_SEARCH_VERSION = (26, 2)

DEFAULT_DATABASE = "otel"
DEFAULT_TRACES_TABLE = "otel_traces"
SPANS_TABLE = "spans"
SPANS_VIEW = "spans_mv"
# Tables of analytics' migrations that live beside `spans` in ClickHouse.
ANALYTICS_TABLES = ("embeddings", "thresholds", "goal_scores")
# Columns of few distinct values, stored as dictionaries (as the exporter stores its own).
_LOW_CARDINALITY = frozenset(
    {"SpanName", "SpanKind", "ServiceName", "StatusCode", "span_family", "operation", "op", "outcome"}
)
_SPAN_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
_STATUS_CODES = ("Unset", "Ok", "Error")

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SchemaError(ValueError):
    """A name or type that cannot be used in ClickHouse DDL; the message says which and why."""


def ident(name: str) -> str:
    """A ClickHouse identifier, back-quoted; only plain names (letters, digits, _) are accepted."""
    if not _IDENT.match(name or ""):
        raise SchemaError(
            f"Expected a database or table name of letters, digits and _ (not starting with a digit), got {name!r}"
        )
    return f"`{name}`"


def qualified(database: str, table: str) -> str:
    return f"{ident(database)}.{ident(table)}"


# --- the exporter's tables ------------------------------------------------------------------


def _ttl(column_expr: str, ttl_days: int) -> str:
    return f"TTL {column_expr} + toIntervalDay({int(ttl_days)})" if ttl_days and ttl_days > 0 else ""


def otel_traces_ddl(
    database: str = DEFAULT_DATABASE,
    table: str = DEFAULT_TRACES_TABLE,
    ttl_days: int = 0,
    full_text_search: bool = False,
) -> list[str]:
    """The exporter's three statements for traces, in its order: `otel_traces`, its trace-id
    lookup table and the view that fills it. ``full_text_search`` is what the exporter decides
    from the server version (``FULL_TEXT_SEARCH_VERSION``)."""
    if full_text_search:
        indexes = """
    INDEX idx_trace_id TraceId TYPE text(tokenizer = 'array'),
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE text(tokenizer = 'array'),
    INDEX idx_res_attr_items ResourceAttributeItems TYPE text(tokenizer = 'array'),
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE text(tokenizer = 'array'),
    INDEX idx_span_attr_items SpanAttributeItems TYPE text(tokenizer = 'array'),"""
    else:
        indexes = """
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,"""
    traces = f"""CREATE TABLE IF NOT EXISTS {qualified(database, table)} (
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    ResourceAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), CAST(ResourceAttributes, 'Array(Tuple(String, String))')),
    SpanAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), CAST(SpanAttributes, 'Array(Tuple(String, String))')),{indexes}
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
{_ttl("toDateTime(Timestamp)", ttl_days)}
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"""
    lookup = f"""CREATE TABLE IF NOT EXISTS {qualified(database, table + "_trace_id_ts")} (
    TraceId String CODEC(ZSTD(1)),
    Start SimpleAggregateFunction(min, DateTime) CODEC(ZSTD(1)),
    End SimpleAggregateFunction(max, DateTime) CODEC(ZSTD(1))
) ENGINE = AggregatingMergeTree()
PARTITION BY toStartOfWeek(Start)
ORDER BY (TraceId)
{_ttl("toDateTime(Start)", ttl_days)}
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"""
    view = f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {qualified(database, table + "_trace_id_ts_mv")}
TO {qualified(database, table + "_trace_id_ts")}
AS SELECT
    TraceId,
    min(toDateTime(Timestamp)) AS Start,
    max(toDateTime(Timestamp)) AS End
FROM {qualified(database, table)}
WHERE TraceId != ''
GROUP BY TraceId"""
    return [traces, lookup, view]


# The exporter's insert columns, in its order (sqltemplates/traces_insert.sql).
OTEL_TRACES_INSERT_COLUMNS = (
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ResourceAttributes",
    "ScopeName",
    "ScopeVersion",
    "SpanAttributes",
    "Duration",
    "StatusCode",
    "StatusMessage",
    "Events.Timestamp",
    "Events.Name",
    "Events.Attributes",
    "Links.TraceId",
    "Links.SpanId",
    "Links.TraceState",
    "Links.Attributes",
)


# --- DuckDB schema -> ClickHouse types ----------------------------------------------------------


@functools.cache
def _duckdb_schema() -> dict[str, tuple[list[tuple[str, str, bool]], tuple[str, ...]]]:
    """Every table the DuckDB store creates (collector and analytics migrations applied to an
    in-memory database): table -> ([(column, DuckDB type, nullable)], primary key)."""
    import duckdb  # noqa: PLC0415 (only needed to read the schema once)

    from collector.migrations_runner import apply_migrations  # noqa: PLC0415

    conn = duckdb.connect()
    quiet = logging.getLogger("collector.migrations_runner")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # an in-memory copy, not the user's database being migrated
    try:
        apply_migrations(conn)
        apply_migrations(conn, "analytics")
        columns: dict[str, list[tuple[str, str, bool]]] = {}
        for table, column, data_type, nullable in conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable FROM duckdb_columns() "
            "WHERE NOT internal ORDER BY table_name, column_index"
        ).fetchall():
            columns.setdefault(table, []).append((column, data_type, nullable))
        keys = {
            table: tuple(names)
            for table, names in conn.execute(
                "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
                "WHERE constraint_type = 'PRIMARY KEY'"
            ).fetchall()
        }
    finally:
        quiet.setLevel(level)
        conn.close()
    return {table: (cols, keys.get(table, ())) for table, cols in columns.items()}


_SCALAR_TYPES = {
    "VARCHAR": "String",
    "BIGINT": "Int64",
    "INTEGER": "Int32",
    "BOOLEAN": "Bool",
    "DOUBLE": "Float64",
    "FLOAT": "Float32",
    "TIMESTAMP": "DateTime64(6, 'UTC')",
}
_KEY_VALUE_LIST = 'STRUCT("key" VARCHAR, "value" VARCHAR)[]'


def clickhouse_type(duckdb_type: str, nullable: bool, column: str = "") -> str:
    """The ClickHouse type equivalent to a DuckDB column type (list columns are never Nullable:
    see ``LIST_NULL_COLUMNS``)."""
    if duckdb_type == _KEY_VALUE_LIST:
        return "Map(LowCardinality(String), String)"
    if duckdb_type.endswith("[]"):
        inner = _SCALAR_TYPES.get(duckdb_type[:-2])
        if inner is None:
            raise SchemaError(f"no ClickHouse type for DuckDB list type {duckdb_type} (column {column!r})")
        return f"Array({inner})"
    base = _SCALAR_TYPES.get(duckdb_type)
    if base is None:
        raise SchemaError(f"no ClickHouse type for DuckDB type {duckdb_type} (column {column!r})")
    if nullable:
        base = f"Nullable({base})"
    if column in _LOW_CARDINALITY and base in ("String", "Nullable(String)"):
        base = f"LowCardinality({base})"
    return base


def _table_types(table: str) -> dict[str, str]:
    schema = _duckdb_schema()
    if table not in schema:
        raise SchemaError(f"the DuckDB store has no table {table!r}")
    columns, _ = schema[table]
    out = {name: clickhouse_type(data_type, nullable, name) for name, data_type, nullable in columns}
    for name, data_type, nullable in columns:
        if nullable and data_type.endswith("[]") and data_type != _KEY_VALUE_LIST:
            out[f"{name}_null"] = "UInt8"
    return out


def spans_clickhouse_types() -> dict[str, str]:
    """`spans` column -> ClickHouse type: DuckDB's columns in DuckDB's order, then one
    ``<list column>_null`` flag per nullable list column."""
    return _table_types(SPANS_TABLE)


def list_null_columns() -> dict[str, str]:
    """Nullable DuckDB list column of `spans` -> its ClickHouse NULL flag column."""
    return {name[: -len("_null")]: name for name in spans_clickhouse_types() if name.endswith("_null")}


def duckdb_spans_columns() -> list[str]:
    """DuckDB's `spans` columns in table order."""
    return [name for name, _, _ in _duckdb_schema()[SPANS_TABLE][0]]


# Data-skipping indexes of `spans`: the resolve pass finds a trace's rows (the table is sorted by
# run and agent, not trace) and the rows ingested since its watermark (rows of one insert share
# one ingested_at, so a granule's range is narrow) without reading every granule.
SPANS_INDEXES = {
    "idx_trace_id": "TraceId TYPE bloom_filter(0.001) GRANULARITY 1",
    "idx_ingested_at": "ingested_at TYPE minmax GRANULARITY 1",
}


def spans_table_ddl(database: str = DEFAULT_DATABASE, ttl_days: int = 0, patch_deletes: bool = False) -> str:
    """driftscope's `spans` table (the materialized view's target); ``ttl_days`` drops whole days
    as the exporter's TTL does for `otel_traces`. ``patch_deletes`` (servers that have lightweight
    updates) stores each row's block number and offset, which lets a DELETE write a patch part
    instead of a mutation over every part of the table (``PATCH_DELETE_SETTINGS``)."""
    columns = ",\n".join(
        [f"    {ident(name)} {kind}" for name, kind in spans_clickhouse_types().items()]
        + [f"    INDEX {name} {definition}" for name, definition in SPANS_INDEXES.items()]
    )
    return f"""CREATE TABLE IF NOT EXISTS {qualified(database, SPANS_TABLE)} (
{columns}
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (run_id, agent_id, Timestamp)
{_ttl("toDateTime(Timestamp)", ttl_days)}
SETTINGS index_granularity = 8192, allow_nullable_key = 1, ttl_only_drop_parts = 1{", " + PATCH_TABLE_SETTINGS if patch_deletes else ""}"""


# What lets a DELETE on `spans` be a patch part: the table stores block numbers and offsets, and
# the DELETE asks for a lightweight update (it falls back to a mutation where one is not possible).
PATCH_TABLE_SETTINGS = "enable_block_number_column = 1, enable_block_offset_column = 1"
PATCH_DELETE_SETTINGS = " SETTINGS lightweight_delete_mode = 'lightweight_update'"


def analytics_tables_ddl(database: str = DEFAULT_DATABASE) -> list[str]:
    """embeddings, thresholds and goal_scores as in analytics' DuckDB migrations; each keeps the
    newest row per DuckDB primary key (ReplacingMergeTree on ``created_at``: read with FINAL)."""
    out = []
    schema = _duckdb_schema()
    for table in ANALYTICS_TABLES:
        types = _table_types(table)
        key = schema[table][1]
        columns = ",\n".join(f"    {ident(name)} {kind}" for name, kind in types.items())
        out.append(
            f"CREATE TABLE IF NOT EXISTS {qualified(database, table)} (\n{columns}\n) "
            f"ENGINE = ReplacingMergeTree(created_at)\nORDER BY ({', '.join(ident(k) for k in key)})"
        )
    return out


def ingest_counters_ddl(database: str = DEFAULT_DATABASE) -> str:
    """Persistent ingest counters: rows are added, ClickHouse sums them per name."""
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified(database, 'ingest_counters')} "
        "(name String, value Int64) ENGINE = SummingMergeTree(value) ORDER BY name"
    )


# --- the materialized view ----------------------------------------------------------------------

_Q = SqlContext()
_WHITESPACE = "' \\t\\n\\r\\x0B\\x0C'"


def _trim(expr: str) -> str:
    return f"trim(BOTH {_WHITESPACE} FROM {expr})"


def _coerce_sql(kind: str, raw: str) -> str:
    """A rule's chosen raw value (Nullable(String)) as the column's type (lists: not here)."""
    if kind == "text":
        return raw
    if kind == "int":
        number = f"toInt64OrNull({_trim(raw)})"
        return f"if({number} BETWEEN -2147483648 AND 2147483647, toInt32({number}), NULL)"
    if kind == "bool":
        lowered = f"lowerUTF8({_trim(raw)})"
        return (
            f"CAST(multiIf({lowered} IN ('true', '1', 'yes'), true, {lowered} IN ('false', '0', 'no'), false, NULL), "
            "'Nullable(Bool)')"
        )
    raise SchemaError(f"no SQL coercion for kind {kind!r}")


def _list_sql(raw: str) -> str:
    """A list column's value from its raw text, as ``conventions._str_list`` reads it (a JSON
    array: its items as text; anything else: a one-item list)."""
    text = f"assumeNotNull({raw})"
    trimmed = _trim(text)
    item = "e -> multiIf(JSONType(e) = 'String', JSONExtractString(e), JSONType(e) = 'Null', '', e)"
    return (
        f"if(isNull({raw}), CAST([], 'Array(String)'), if(startsWith({trimmed}, '[') AND isValidJSON({trimmed}), "
        f"arrayMap({item}, JSONExtractArrayRaw({trimmed})), [{text}]))"
    )


def _source_sql(source: Source) -> str:
    key = source.key
    if key.startswith("resource:"):
        raw = _Q.resource(key[len("resource:") :])
    elif key == "span:name":
        raw = _Q.name
    elif key.startswith("column:"):
        raw = f"ifNull({_Q.column(key[len('column:') :])}, '')"
    elif key.startswith("event:"):
        event, attribute = event_key(source)
        values = _Q.event_values(event, attribute)
        value = f"if(notEmpty({values}), nullIf({READERS_SQL[source.read](values, _Q)}, ''), NULL)"
        return f"if({CONDITIONS_SQL[source.when](_Q)}, {value}, NULL)" if source.when else value
    else:
        raw = _Q.get(key)
    if source.read:
        value = f"if({raw} != '', nullIf({READERS_SQL[source.read](raw, _Q)}, ''), NULL)"
    else:
        value = f"nullIf({raw}, '')"
    if source.when:
        value = f"if({CONDITIONS_SQL[source.when](_Q)}, {value}, NULL)"
    return value


def _raw_sql(rule: Rule) -> str:
    """The value a rule picks before coercion: Nullable(String), NULL when no source has one."""
    if is_direct(rule):
        key = rule.sources[0].key
        return f"if(mapContains(SpanAttributes, {sql_text(key)}), {_Q.get(key)}, NULL)"
    sources = [_source_sql(source) for source in rule.sources]
    return sources[0] if len(sources) == 1 else f"coalesce({', '.join(sources)})"


def coordination_sql(rules: tuple[Rule, ...] = RULES) -> dict[str, str]:
    """Coordination column -> ClickHouse expression over an `otel_traces` row (plus
    ``<column>_null`` flags of list columns), generated from the convention table."""
    out: dict[str, str] = {}
    by_column = {rule.column: rule for rule in rules}
    missing = [column for column in COORDINATION_COLUMNS if column not in by_column]
    if missing:
        raise SchemaError(f"no convention rule for columns {missing}")
    for column in COORDINATION_COLUMNS:
        rule = by_column[column]
        raw = _raw_sql(rule)
        if rule.kind == "list":
            out[column] = _list_sql(raw)
            out[f"{column}_null"] = f"toUInt8(isNull({raw}))"
            continue
        value = _coerce_sql(rule.kind, raw)
        if rule.default is not None:
            value = f"ifNull({value}, {sql_text(rule.default)})"
        if column == "run_id":
            value = f"ifNull({value}, TraceId)"  # as collector.mapping_plans.map_columns
        out[column] = value
    return out


def _enum_sql(expr: str, prefix: str, names: tuple[str, ...]) -> str:
    """Older exporters wrote SPAN_KIND_SERVER / STATUS_CODE_OK; DuckDB holds Server / Ok."""
    pairs = ", ".join(f"{sql_text(prefix + name.upper())}, {sql_text(name)}" for name in names)
    return f"if(startsWith({expr}, {sql_text(prefix)}), map({pairs})[{expr}], {expr})"


def spans_select_sql(database: str = DEFAULT_DATABASE, source: str = DEFAULT_TRACES_TABLE) -> str:
    """The SELECT that turns `otel_traces` rows into `spans` rows (the view's query; also run once
    by ``driftscope clickhouse init`` over rows stored before the view existed)."""
    events = (
        "toJSONString(arrayMap((t, n, a) -> CAST(tuple(toUnixTimestamp64Nano(t), n, a), "
        "'Tuple(Timestamp Int64, Name String, Attributes Map(String, String))'), "
        "`Events.Timestamp`, `Events.Name`, `Events.Attributes`))"
    )
    links = (
        "toJSONString(arrayMap((t, s, st, a) -> CAST(tuple(t, s, st, a), "
        "'Tuple(TraceId String, SpanId String, TraceState String, Attributes Map(String, String))'), "
        "`Links.TraceId`, `Links.SpanId`, `Links.TraceState`, `Links.Attributes`))"
    )
    otel = {
        "Timestamp": "fromUnixTimestamp64Micro(intDiv(_start_ns, 1000), 'UTC')",
        "TraceId": "TraceId",
        "SpanId": "SpanId",
        "ParentSpanId": "ParentSpanId",
        "TraceState": "TraceState",
        "SpanName": "SpanName",
        "SpanKind": _enum_sql("_kind", "SPAN_KIND_", _SPAN_KINDS),
        "ServiceName": "if(_service = '', 'unknown_service', _service)",
        "ResourceAttributes": "ResourceAttributes",
        "ScopeName": "ScopeName",
        "ScopeVersion": "ScopeVersion",
        "SpanAttributes": "SpanAttributes",
        "Duration": "_duration",
        "StatusCode": _enum_sql("_status", "STATUS_CODE_", _STATUS_CODES),
        "StatusMessage": "StatusMessage",
        "Events": "_events",
        "Links": "_links",
        "start_ns": "_start_ns",
        "end_ns": "_start_ns + _duration",
        "ingested_at": "now64(6, 'UTC')",
    }
    expressions = {**otel, **coordination_sql()}
    types = spans_clickhouse_types()
    if set(expressions) != set(types):
        raise SchemaError(
            f"the view and `spans` disagree on columns: {sorted(set(expressions) ^ set(types))}"
        )
    select = ",\n    ".join(f"{expressions[name]} AS {ident(name)}" for name in types)
    return f"""SELECT
    {select}
FROM (
    SELECT toUnixTimestamp64Nano(Timestamp) AS _start_ns, TraceId, SpanId, ParentSpanId, TraceState,
           SpanName, toString(SpanKind) AS _kind, toString(ServiceName) AS _service, ResourceAttributes,
           ScopeName, ScopeVersion, SpanAttributes, toInt64(Duration) AS _duration,
           toString(StatusCode) AS _status, StatusMessage, {events} AS _events, {links} AS _links,
           `Events.Name` AS _event_names, `Events.Attributes` AS _event_attributes
    FROM {qualified(database, source)}
)"""


def spans_view_comment(database: str = DEFAULT_DATABASE, source: str = DEFAULT_TRACES_TABLE) -> str:
    """The view's comment: names the version of its query, so init sees a stale view."""
    digest = hashlib.sha256(spans_select_sql(database, source).encode()).hexdigest()[:16]
    return f"driftscope spans view {digest}"


def spans_view_ddl(
    database: str = DEFAULT_DATABASE, source: str = DEFAULT_TRACES_TABLE, name: str = SPANS_VIEW
) -> str:
    """The materialized view filling `spans` from the exporter's table, one row per span row."""
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {qualified(database, name)}\n"
        f"TO {qualified(database, SPANS_TABLE)}\nAS {spans_select_sql(database, source)}\n"
        f"COMMENT {sql_text(spans_view_comment(database, source))}"
    )


# The change log and the findings tables' bookkeeping (analytics.materialize_clickhouse reads
# them by these names; the findings tables themselves, `findings__<result>`, are created by the
# materializer from its first rows). A change is logged in two steps around the writes of `spans`
# (``collector.clickhouse_changes``): its partitions first, its `change_log` row after.
CHANGE_LOG = "change_log"
CHANGE_PARTITIONS = "change_partitions"
FINDINGS_STATE = "findings_state"
FINDINGS_PARTS = "findings_parts"
FINDINGS_PRUNED = "findings_pruned"


def findings_ddl(database: str = DEFAULT_DATABASE) -> list[str]:
    """The change log and the findings tables' state, beside `spans`: ``change_log`` (one row
    per committed change, monotonic ``seq``), ``change_partitions`` (the runs and origin tasks each
    change touched), ``findings_state`` (per result: the change its table reflects, its
    definition's version and ``base``, the oldest row version it still reads) and
    ``findings_parts`` (per result and partition, the version of its current rows). The last two
    keep the newest row per key (ReplacingMergeTree: read with FINAL or max). ``findings_pruned``
    (per result, the newest row version its last prune saw: every row at or below it that is
    still there is its partition's only one, so a read sorts out only the partitions written
    since)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {qualified(database, CHANGE_LOG)} (seq UInt64, "
        "committed_at DateTime64(6, 'UTC'), kind LowCardinality(String), spans UInt64) "
        "ENGINE = MergeTree ORDER BY seq",
        f"CREATE TABLE IF NOT EXISTS {qualified(database, CHANGE_PARTITIONS)} (seq UInt64, "
        "partition LowCardinality(String), key String) ENGINE = MergeTree ORDER BY (partition, key, seq)",
        f"CREATE TABLE IF NOT EXISTS {qualified(database, FINDINGS_STATE)} (metric String, version String, "
        "seq Int64, base UInt64, rows UInt64, failed_keys String, last_error String, "
        "updated_at DateTime64(6, 'UTC'), ver UInt64) ENGINE = ReplacingMergeTree(ver) ORDER BY metric",
        f"CREATE TABLE IF NOT EXISTS {qualified(database, FINDINGS_PARTS)} (metric LowCardinality(String), "
        "key String, ver UInt64) ENGINE = ReplacingMergeTree(ver) ORDER BY (metric, key)",
        f"CREATE TABLE IF NOT EXISTS {qualified(database, FINDINGS_PRUNED)} (metric LowCardinality(String), "
        "ver UInt64) ENGINE = ReplacingMergeTree(ver) ORDER BY metric",
    ]


# One writer per database (collector.clickhouse_lease): the newest claim by version holds it.
WRITER_LEASE = "driftscope_writer"


def writer_lease_ddl(database: str = DEFAULT_DATABASE) -> str:
    """The writer lease's table: a row per claim (holder '' releases it), times and versions
    from the server's clock."""
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified(database, WRITER_LEASE)} (holder String, role String, "
        "host String, pid UInt32, claimed_at DateTime64(3, 'UTC'), ver UInt64) "
        "ENGINE = ReplacingMergeTree(ver) ORDER BY tuple()"
    )


def driftscope_ddl(
    database: str = DEFAULT_DATABASE,
    source: str = DEFAULT_TRACES_TABLE,
    ttl_days: int = 0,
    patch_deletes: bool = False,
) -> list[str]:
    """Every object driftscope adds beside the exporter's table, in creation order (all
    ``IF NOT EXISTS``: running them again changes nothing)."""
    return [
        spans_table_ddl(database, ttl_days, patch_deletes),
        spans_view_ddl(database, source),
        *analytics_tables_ddl(database),
        ingest_counters_ddl(database),
        *findings_ddl(database),
        writer_lease_ddl(database),
    ]
