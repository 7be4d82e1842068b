"""`driftscope compare` (issue 35) on a database file: Markdown and JSON, a missing run, a
mistyped flag."""

import json
import subprocess
import sys

import duckdb

from driftscope.database import migrate
from tests.compare_crews import crew_rows, crew_steps
from tests.fixtures_analytics import insert_spans


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "driftscope", "compare", *args], capture_output=True, text=True, timeout=120
    )


def crew_file(path) -> str:
    conn = duckdb.connect(str(path))
    migrate(conn)
    rows = []
    for i in range(3):
        rows += crew_rows(f"h{i}", crew_steps(searches=1 + i % 2), t0=100 * i)
    rows += crew_rows("bad", crew_steps(delegate_to="writer"), t0=1000)
    insert_spans(conn, rows)
    conn.close()
    return str(path)


def test_compare_prints_the_departure_and_differences_as_markdown_and_json(tmp_path):
    db = crew_file(tmp_path / "crew.duckdb")
    md = _cli("bad", "--source", db)
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("# What differs: run bad")
    assert "First departs at step 1" in md.stdout and "new delegation target" in md.stdout
    out = tmp_path / "compare.json"
    done = _cli("bad", "--source", db, "--format", "json", "-o", str(out))
    assert done.returncode == 0, done.stderr
    answer = json.loads(out.read_text())
    assert answer["departure"]["tool"] == "delegate -> writer" and answer["baseline"]["runs"] == 3
    pair = json.loads(_cli("h0", "--baseline", "h0", "--source", db, "--format", "json").stdout)
    assert pair["departure"] is None and pair["differences"] == []


def test_compare_names_a_missing_run_and_a_mistyped_flag(tmp_path):
    db = crew_file(tmp_path / "crew.duckdb")
    missing = _cli("nope", "--source", db)
    assert (
        missing.returncode == 2
        and "No spans of run 'nope'" in missing.stderr
        and "Newest runs:" in missing.stderr
    )
    gone = _cli("bad", "--baseline", "gone", "--source", db)
    assert gone.returncode == 2 and "No spans of run 'gone'" in gone.stderr
    typo = _cli("bad", "--basline", "h0", "--source", db)
    assert typo.returncode == 2 and "did you mean --baseline?" in typo.stderr
