"""Each package creates its own tables: the span store (collector) and analytics' tables."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analytics import run_metric
from analytics.schema import SchemaError
from analytics.thresholds import list_thresholds, store_threshold
from collector.files import ingest_files
from collector.migrations_runner import apply_migrations, list_migrations
from collector.store import open_store
from driftscope.database import migrate, open_database

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"

ANALYTICS_TABLES = {"embeddings", "thresholds", "goal_scores"}


def _tables(conn) -> set[str]:
    return {row[0] for row in conn.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def test_the_collector_creates_only_the_span_store_and_analytics_its_own_tables(tmp_path):
    collector_only = open_store(tmp_path / "c.duckdb")
    assert not _tables(collector_only) & ANALYTICS_TABLES
    collector_only.close()
    conn = open_database(tmp_path / "all.duckdb")
    assert ANALYTICS_TABLES <= _tables(conn)
    recorded = conn.execute("SELECT version, name FROM schema_migrations_analytics").fetchall()
    assert recorded == [(n, name) for n, name, _ in list_migrations("analytics")]
    assert migrate(conn) == []  # applied once
    conn.close()


def test_a_database_from_before_the_move_keeps_its_analytics_rows(tmp_path):
    path = tmp_path / "old.duckdb"
    old = duckdb.connect(str(path))
    apply_migrations(old)  # the span store as today
    # what driftscope <= 0.1 also created from the collector's migrations
    old.execute(
        "CREATE TABLE thresholds (name VARCHAR NOT NULL, version INTEGER NOT NULL, value DOUBLE NOT NULL,"
        " method VARCHAR NOT NULL, provenance VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL,"
        " PRIMARY KEY (name, version))"
    )
    old.execute("INSERT INTO thresholds VALUES ('goal_divergence', 1, 0.61, 'youden_j', '{}', now())")
    old.close()
    upgraded = open_database(path)
    assert ANALYTICS_TABLES <= _tables(upgraded)
    assert {t["name"]: t["value"] for t in list_thresholds(upgraded)}["goal_divergence"] == 0.61
    upgraded.close()


def test_a_read_only_file_without_analytics_tables_reads_defaults(tmp_path):
    path = tmp_path / "ingested.duckdb"
    result = ingest_files(path, [SAMPLES / "split_brain_unguarded.json"])  # the collector's store only
    assert result.accepted > 0
    conn = duckdb.connect(str(path), read_only=True)
    assert not _tables(conn) & ANALYTICS_TABLES
    assert len(run_metric(conn, "lost_updates")) >= 1
    assert all(not t["calibrated"] for t in list_thresholds(conn))
    conn.close()


def test_a_writable_database_without_analytics_tables_is_a_clear_error(tmp_path):
    conn = open_store(tmp_path / "c.duckdb")
    with pytest.raises(SchemaError, match="analytics migrations"):
        run_metric(conn, "lost_updates")
    migrate(conn)
    store_threshold(conn, "goal_divergence", 0.5, "target_fpr", {"note": "test"})
    assert len(run_metric(conn, "lost_updates")) == 0
    conn.close()
