"""Which engine a read runs on: a DuckDB connection, or a ClickHouse store (chdb or a server).

Every read function in analytics takes ``conn``: a ``duckdb.DuckDBPyConnection`` (the default
store), or a ClickHouse store built outside analytics (``collector.clickhouse_store``: analytics
imports nothing of ours) that has ``engine`` in ``CLICKHOUSE_ENGINES`` and
``execute(sql, params) -> pyarrow.Table`` with ``{name:Type}`` placeholders (and ``command`` for
the temporary tables of a statement run in stages). On ClickHouse the
DuckDB statement is translated (``analytics.dialect``) and the answer comes back as the
DataFrame DuckDB would have given: naive UTC timestamps (microseconds), signed integers,
booleans.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

CLICKHOUSE_ENGINES = ("chdb", "clickhouse")


class ClickHouseStore(Protocol):
    """What analytics needs of a ClickHouse store."""

    engine: str

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Run ``sql`` with ``{name:Type}`` placeholders bound to ``params`` (Python values)."""

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        """Run a statement that returns no rows (here: a temporary table of the session)."""


def is_clickhouse(conn: Any) -> bool:
    """True when ``conn`` is a ClickHouse store rather than a DuckDB connection."""
    return (
        not isinstance(conn, duckdb.DuckDBPyConnection)
        and getattr(conn, "engine", None) in CLICKHOUSE_ENGINES
    )


def has_tables(conn: duckdb.DuckDBPyConnection, *names: str) -> bool:
    """Whether every one of the tables (or views) ``names`` resolves on the DuckDB connection
    ``conn``: a catalog lookup by name (binding a relation), not a scan of ``duckdb_tables()``,
    which sizes every table of the store and, under ingest, waits for the writer. A name that
    does not resolve leaves an open transaction usable (the error is the binder's)."""
    for name in names:
        try:
            conn.table(name)
        except duckdb.CatalogException:
            return False
    return True


def _naive_utc(table: pa.Table) -> pa.Table:
    """Timestamps as DuckDB gives them (naive UTC, microseconds), unsigned integers signed."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        kind = field.type
        if pa.types.is_timestamp(kind):
            column = column.cast(pa.timestamp(kind.unit, tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
            column = column.cast(pa.timestamp("us"))
        elif pa.types.is_unsigned_integer(kind):
            column = column.cast(pa.int64())
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _frame(table: pa.Table) -> pd.DataFrame:
    table = _naive_utc(table)
    frame = table.to_pandas()
    for name, field in zip(table.column_names, table.schema, strict=True):
        if pa.types.is_boolean(field.type) and frame[name].dtype == object:
            frame[name] = frame[name].astype("boolean")  # DuckDB: nullable boolean
        elif pa.types.is_list(field.type):
            frame[name] = [None if v is None else np.asarray(v, dtype=object) for v in frame[name]]
    return frame


def clickhouse_df(conn: ClickHouseStore, sql: str, params: dict[str, Any]) -> pd.DataFrame:
    """Run DuckDB ``sql`` (named ``$parameters``) on a ClickHouse store; a DataFrame as DuckDB's."""
    return _frame(clickhouse_table(conn, sql, params))


class PlanTooLarge(RuntimeError):
    """ClickHouse refused a translated statement whose query tree is past
    ``analytics.dialect.MAX_QUERY_TREE`` nodes (it would have taken long to plan)."""


def _plan_too_large(error: Exception, sql: str) -> PlanTooLarge | None:
    """``error`` as a ``PlanTooLarge`` naming the statement, if it is ClickHouse's refusal of a
    query tree past ``max_expanded_ast_elements``; else None."""
    if "Query tree is too big" not in str(error):
        return None
    from analytics.dialect import MAX_QUERY_TREE

    first = " ".join(sql.split())[:160]
    return PlanTooLarge(
        f"ClickHouse refused to plan a driftscope statement: its query tree is past "
        f"{MAX_QUERY_TREE:,} nodes (analytics.dialect.MAX_QUERY_TREE; ClickHouse copies a CTE at "
        f"every mention, so planning it would take long). This is a driftscope bug, not your data: "
        f"report it with the statement, which begins {first!r}. ({error})"
    )


def clickhouse_table(conn: ClickHouseStore, sql: str, params: dict[str, Any]) -> pa.Table:
    """``clickhouse_df``'s answer as an Arrow table (naive UTC timestamps, signed integers).
    Raises ``PlanTooLarge`` for a statement ClickHouse would take long to plan."""
    try:
        return _clickhouse_table(conn, sql, params)
    except Exception as error:
        too_large = _plan_too_large(error, sql)
        if too_large is not None:
            raise too_large from error
        raise


def _clickhouse_table(conn: ClickHouseStore, sql: str, params: dict[str, Any]) -> pa.Table:
    # SQLGlot: imported only where a ClickHouse store is used
    from analytics.dialect import STAGE_PREFIX, format_param, to_clickhouse_staged

    query = to_clickhouse_staged(sql, params, getattr(conn, "database", None))
    if conn.engine == "chdb":  # chdb takes ClickHouse text (NULL as \\N, escaped strings)
        params = {key: format_param(value) for key, value in params.items()}
    if not query.stages:
        return _naive_utc(conn.execute(query.sql, params))
    # Stage tables of this run: temporary (the store's session only, never written to disk) and
    # named for this run, so runs on one store from several threads do not meet.
    prefix = f"_driftscope_{uuid.uuid4().hex[:16]}_"
    made = []
    try:
        for name, select in query.stages:
            table = name.replace(STAGE_PREFIX, prefix, 1)
            made.append(table)
            conn.command(
                f"CREATE TEMPORARY TABLE {table} ENGINE = Memory AS {select.replace(STAGE_PREFIX, prefix)}",
                params,
            )
        return _naive_utc(conn.execute(query.sql.replace(STAGE_PREFIX, prefix), params))
    finally:
        for table in reversed(made):
            conn.command(f"DROP TEMPORARY TABLE IF EXISTS {table}")


def fetch_rows(conn: Any, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
    """Rows of DuckDB ``sql`` (named ``$parameters``) on either engine, as tuples."""
    params = params or {}
    if not is_clickhouse(conn):
        return conn.execute(sql, params).fetchall() if params else conn.execute(sql).fetchall()
    frame = clickhouse_df(conn, sql, params)
    return [tuple(None if _missing(v) else v for v in row) for row in frame.itertuples(index=False)]


def _missing(value: Any) -> bool:
    return (
        value is None or value is pd.NaT or (isinstance(value, float) and np.isnan(value)) or value is pd.NA
    )
