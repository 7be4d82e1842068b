"""The ClickHouse side of `driftscope calibrate --store chdb:PATH|clickhouse://...`.

The reads (pairs scored against the store's embedding cache, baseline detectors, thresholds in
force) go through analytics' read interface, which runs on ClickHouse. The one write calibration
makes, a new threshold version (``analytics.thresholds.store_threshold``), is DuckDB SQL handed to
a write function; ``threshold_write`` runs it on a scratch in-memory DuckDB holding the store's
thresholds (so the version number is the same one DuckDB would pick) and inserts the rows it added
into the store, the way ``driftscope clickhouse resolve`` runs DuckDB's own statements.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa

logger = logging.getLogger(__name__)

# What a calibration may write; the scratch database's other tables must stay empty.
THRESHOLD_COLUMNS = ("name", "version", "value", "method", "provenance", "created_at")


def threshold_write(store) -> Callable[[Callable[[duckdb.DuckDBPyConnection], Any]], Any]:
    """A write function (``analytics.types.WriteFn``) for a ClickHouse ``store``: ``fn`` runs on a
    scratch DuckDB with the store's thresholds; the threshold rows it adds are inserted into the
    store. Anything else it writes is refused (``RuntimeError``), never dropped silently."""
    from driftscope.database import migrate

    def write(fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        scratch = duckdb.connect()
        try:
            migrate(scratch)
            stored = store.execute(f"SELECT name, version FROM {store.database}.thresholds")
            scratch.register("stored_keys", stored)
            scratch.execute(
                "INSERT INTO thresholds SELECT name, version, 0, 'stored', '{}', TIMESTAMP '2000-01-01' "
                "FROM stored_keys"
            )
            before = _other_rows(scratch)
            result = fn(scratch)
            if _other_rows(scratch) != before:
                raise RuntimeError("a calibration on a ClickHouse store may write thresholds only")
            added = scratch.sql(
                f"SELECT {', '.join('t.' + c for c in THRESHOLD_COLUMNS)} FROM thresholds t "
                "ANTI JOIN stored_keys s ON t.name = s.name AND t.version = s.version"
            ).to_arrow_table()
        finally:
            scratch.close()
        store.insert_arrow("thresholds", pa.table(added.columns, names=list(THRESHOLD_COLUMNS)))
        return result

    return write


def _other_rows(conn: duckdb.DuckDBPyConnection) -> tuple[int, ...]:
    return tuple(
        conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        for table in ("embeddings", "goal_scores", "spans")
    )


def open_calibration_store(url: str, dry_run: bool = False):
    """The ClickHouse store ``url`` names, opened to calibrate on; ``ConfigError`` for a URL that
    is not a ClickHouse store, a store that cannot be opened, or a dry run (its trial thresholds
    need a DuckDB transaction)."""
    from collector.clickhouse_store import ClickHouseStore, StoreURLError, open_store_url
    from driftscope.settings import ConfigError

    if dry_run:
        raise ConfigError(
            "--dry-run needs a DuckDB store (the trial thresholds live in a transaction that is rolled "
            "back); on a ClickHouse store, calibrate without it and compare the versions it lists"
        )
    try:
        store = open_store_url(url)
    except StoreURLError as exc:
        raise ConfigError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - chdb's own error for a data path another process holds
        raise ConfigError(
            f"Cannot open {url} ({exc}). chdb lets one process open a data path: stop the `driftscope serve "
            "--store` that holds it, or calibrate a copy of the directory."
        ) from None
    if not isinstance(store, ClickHouseStore):
        store.close()
        raise ConfigError(f"--store {url!r} is not a ClickHouse store; use --db PATH for a DuckDB file")
    return store
