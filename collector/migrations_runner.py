"""Numbered SQL migrations applied at start-up and recorded in `schema_migrations`."""

from __future__ import annotations

import importlib.resources
import logging
import re

import duckdb

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def list_migrations() -> list[tuple[int, str, str]]:
    """Return ``(number, name, sql)`` for every shipped migration, in order."""
    found = []
    for entry in importlib.resources.files("collector").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    return found


def apply_migrations(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply every migration not yet recorded; return the names applied now.

    Each migration runs in its own transaction together with its bookkeeping row, so a crash
    mid-migration leaves the database at the previous version.
    """
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations").fetchall()}
    applied = []
    for number, name, sql in list_migrations():
        if number in done:
            continue
        conn.execute("BEGIN TRANSACTION")
        try:
            conn.execute(sql)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, now()::TIMESTAMP)", [number, name])
            conn.execute("COMMIT")
        except Exception:
            conn.execute("ROLLBACK")
            raise
        logger.info("applied migration %s", name)
        applied.append(name)
    return applied
