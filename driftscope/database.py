"""Opening the database as the whole product uses it: the collector's span store plus the tables
analytics owns, each package's migrations applied from its own folder."""

from __future__ import annotations

import os

import duckdb

from collector.migrations_runner import apply_migrations
from collector.store import open_store

PACKAGES_WITH_MIGRATIONS = ("collector", "analytics")


def migrate(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply every package's pending migrations to a writable connection; return what ran."""
    applied = []
    for package in PACKAGES_WITH_MIGRATIONS:
        applied += apply_migrations(conn, package)
    return applied


def open_database(
    path: str | os.PathLike, read_only: bool = False, memory_limit: int | None = None
) -> duckdb.DuckDBPyConnection:
    """``collector.store.open_store`` plus, when writable, analytics' migrations."""
    conn = open_store(path, read_only=read_only, memory_limit=memory_limit)
    if not read_only:
        apply_migrations(conn, "analytics")
    return conn
