"""Numbered SQL migrations applied at start-up and recorded in a bookkeeping table.

Each package owns its tables: the collector's migrations (``collector/migrations``, recorded in
``schema_migrations``) create the span store; another package's (``<package>/migrations``, e.g.
analytics' embeddings, thresholds and goal scores) are applied by the composition that uses it
(``driftscope.database``) and recorded in ``schema_migrations_<package>``.
"""

from __future__ import annotations

import importlib.resources
import logging
import re

import duckdb

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def _bookkeeping_table(package: str) -> str:
    return "schema_migrations" if package == "collector" else f"schema_migrations_{package}"


def list_migrations(package: str = "collector") -> list[tuple[int, str, str]]:
    """Return ``(number, name, sql)`` for every migration ``package`` ships, in order."""
    found = []
    for entry in importlib.resources.files(package).joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    numbers = [number for number, _, _ in found]
    clashes = sorted({name for number, name, _ in found if numbers.count(number) > 1})
    if clashes:
        raise RuntimeError(
            f"{package}/migrations: {', '.join(clashes)} share a number; every migration needs its own "
            "(renumber the newer one to the next free number)"
        )
    return found


def apply_migrations(conn: duckdb.DuckDBPyConnection, package: str = "collector") -> list[str]:
    """Apply every migration of ``package`` not yet recorded; return the names applied now.

    Each migration runs in its own transaction together with its bookkeeping row, so a crash
    mid-migration leaves the database at the previous version.
    """
    table = _bookkeeping_table(package)
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} ("
        " version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)"
    )
    done = {row[0] for row in conn.execute(f"SELECT version FROM {table}").fetchall()}
    applied = []
    for number, name, sql in list_migrations(package):
        if number in done:
            continue
        conn.execute("BEGIN TRANSACTION")
        try:
            conn.execute(sql)
            conn.execute(f"INSERT INTO {table} VALUES (?, ?, now()::TIMESTAMP)", [number, name])
            conn.execute("COMMIT")
        except Exception:
            conn.execute("ROLLBACK")
            raise
        logger.info("applied migration %s", name)
        applied.append(name)
    return applied
