"""collector/migrations_runner.py: numbered migrations, each number once."""

from __future__ import annotations

import sys

import duckdb
import pytest

from collector.migrations_runner import apply_migrations, list_migrations


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A throwaway package with a migrations folder, importable by name."""
    root = tmp_path / "toy_pkg_migrations"
    (root / "migrations").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    sys.modules.pop("toy_pkg_migrations", None)


def test_two_migrations_with_one_number_are_refused_by_name(package):
    (package / "migrations" / "0001_first.sql").write_text("CREATE TABLE a (x INT);")
    (package / "migrations" / "0002_alerts.sql").write_text("CREATE TABLE b (x INT);")
    (package / "migrations" / "0002_kept.sql").write_text("CREATE TABLE c (x INT);")
    with pytest.raises(RuntimeError, match="0002_alerts.sql, 0002_kept.sql share a number"):
        list_migrations("toy_pkg_migrations")
    conn = duckdb.connect()
    with pytest.raises(RuntimeError, match="share a number"):
        apply_migrations(conn, "toy_pkg_migrations")
    assert conn.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name IN ('a','b','c')"
    ).fetchone() == (0,)


def test_migrations_apply_in_number_order_once(package):
    (package / "migrations" / "0002_second.sql").write_text("INSERT INTO a VALUES (2);")
    (package / "migrations" / "0001_first.sql").write_text("CREATE TABLE a (x INT);")
    conn = duckdb.connect()
    assert apply_migrations(conn, "toy_pkg_migrations") == ["0001_first.sql", "0002_second.sql"]
    assert apply_migrations(conn, "toy_pkg_migrations") == []
    assert conn.execute("SELECT x FROM a").fetchall() == [(2,)]
