"""The tables analytics owns (``analytics/migrations``) and how a read connection finds them.

A writable database gets them from its migrations, applied by the composition that opens it
(``driftscope.database``; analytics imports nothing of ours, the migration runner included). A
read-only file that never had them (written by ``driftscope ingest --db`` only, or by an older
version) gets empty temporary ones, so every detector reads defaults instead of failing.
"""

from __future__ import annotations

import importlib.resources
import re

import duckdb

from analytics.engine import has_tables, is_clickhouse

TABLES = ("embeddings", "thresholds", "goal_scores", "findings_state")
_CREATE = re.compile(r"CREATE TABLE IF NOT EXISTS", re.IGNORECASE)


class SchemaError(RuntimeError):
    """A writable database without the analytics tables: its migrations were never applied."""


def migration_sql() -> str:
    """The DDL of every analytics migration, in order."""
    folder = importlib.resources.files("analytics").joinpath("migrations")
    names = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".sql"))
    return "\n".join(folder.joinpath(name).read_text(encoding="utf-8") for name in names)


def ensure_readable(conn: duckdb.DuckDBPyConnection) -> None:
    """Make the analytics tables resolvable on ``conn``.

    Read-only connections missing them get empty temporary tables; a writable one missing them
    raises ``SchemaError`` (silently using temporary tables there would lose what it stores).
    A ClickHouse store has them from its own migrations (``driftscope clickhouse init``).
    """
    if is_clickhouse(conn) or has_tables(conn, *TABLES):  # a lookup by name: cheap on every read
        return
    (read_only,) = conn.execute(
        "SELECT readonly FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    if not read_only:
        missing = ", ".join(name for name in TABLES if not has_tables(conn, name))
        raise SchemaError(
            f"the database has no analytics tables ({missing}): open it with "
            "driftscope.database.open_database or apply the analytics migrations first"
        )
    conn.execute(_CREATE.sub("CREATE TEMP TABLE IF NOT EXISTS", migration_sql()))
