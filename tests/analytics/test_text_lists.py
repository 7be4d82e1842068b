"""constraint_ledger's and duplicate_side_effects' lists are Arrow lists (``analytics.text_lists``) on
every path: a full computation, a findings table read back, a window whose cut runs are computed
beside the table's rows; their readers see the cells as Python lists."""

from __future__ import annotations

import io
import json
import random
from datetime import timedelta

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics import Window, materialize, read, run_metric
from analytics.registry import compute_metric
from analytics.text_lists import TEXT_LISTS, as_text_lists
from analytics.types import direct_write
from driftscope.database import migrate
from tests.analytics.test_materialize import _canonical, _commit, _loop_batch
from tests.analytics.test_summary import _random_batch
from tests.fixtures_analytics import BASE_TIME

LISTS = {
    "constraint_ledger": ("span_ids", "agents", "delegate_to"),
    "duplicate_side_effects": ("span_ids", "agents"),
}


def _assert_lists(frame: pd.DataFrame, name: str) -> None:
    for column in LISTS[name]:
        assert frame[column].dtype == TEXT_LISTS, (name, column)


def _tabled_conn(tmp_path, seed: int) -> tuple[duckdb.DuckDBPyConnection, random.Random, list[str]]:
    """A file database of random batches (committed as the writer does) with every findings
    table brought up to date (as serve's materializer does)."""
    rng = random.Random(seed)
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    runs = [f"run-{i}" for i in range(rng.randint(2, 6))]
    for batch in range(3):
        _commit(conn, _random_batch(rng, batch, runs) + _loop_batch(rng, batch, runs))
    _pass(conn)
    return conn, rng, runs


def _pass(conn: duckdb.DuckDBPyConnection) -> None:
    cursor = conn.cursor()
    try:
        materialize.bring_up_to_date(cursor, direct_write(conn))
    finally:
        cursor.close()


def _assert_same(got: pd.DataFrame, full: pd.DataFrame, name: str) -> None:
    assert list(got.columns) == list(full.columns), name
    pd.testing.assert_frame_equal(_canonical(got), _canonical(full), obj=name)


def test_a_findings_table_reads_back_as_arrow_lists_equal_to_a_full_computation(tmp_path):
    conn, rng, runs = _tabled_conn(tmp_path, 1)
    for name in LISTS:
        full = compute_metric(conn, name)
        assert len(full) > 0, name  # the random spans found something to read back
        _assert_lists(full, name)
        tabled = run_metric(conn, name)
        assert tabled.attrs.get("source") == "table", name
        _assert_lists(tabled, name)
        _assert_same(tabled, full, name)
        assert all(type(ids) is list and ids for ids in tabled["span_ids"])  # iteration: Python lists
    # the table's rows after a batch touched some runs (origin tasks)
    _commit(conn, _random_batch(rng, 3, runs))
    _pass(conn)
    for name in LISTS:
        updated = run_metric(conn, name)
        _assert_lists(updated, name)
        _assert_same(updated, compute_metric(conn, name), name)
    # a window: the table's rows of the runs it holds whole, the cut runs computed
    # (duplicate_side_effects is partitioned by run)
    window = Window(since=BASE_TIME + timedelta(seconds=8))
    windowed = run_metric(conn, "duplicate_side_effects", window)
    assert windowed.attrs.get("source") == "table"
    _assert_same(windowed, compute_metric(conn, "duplicate_side_effects", window), "duplicate_side_effects")
    _assert_lists(windowed, "duplicate_side_effects")


def test_an_empty_result_has_the_same_list_type():
    conn = duckdb.connect()
    migrate(conn)
    for name in LISTS:
        frame = run_metric(conn, name)
        assert frame.empty
        _assert_lists(frame, name)


def test_as_text_lists_keeps_cells_order_and_missing_lists():
    frame = pd.DataFrame(
        {
            "n": [1, 2, 3],
            "ids": [["b", "a"], [], None],
            "agents": [np.array([a], dtype=object) for a in "xyz"],
        }
    )
    out = as_text_lists(frame, ("ids", "agents", "absent"))
    assert list(out.columns) == ["n", "ids", "agents"] and out["ids"].dtype == TEXT_LISTS
    assert out["ids"].tolist()[:2] == [["b", "a"], []] and out["ids"].isna().tolist() == [False, False, True]
    assert out["agents"].tolist() == [["x"], ["y"], ["z"]]
    assert as_text_lists(out, ("ids",)) is out  # already Arrow lists: nothing to do


def test_readers_of_the_read_interface_see_python_lists(tmp_path):
    """The read API's JSON and Arrow answers and the findings of the dashboard and report."""
    from dashboard.findings import findings_from_frame
    from driftscope.api import dumps, frame_payload

    conn, _, _ = _tabled_conn(tmp_path, 1)
    frame = run_metric(conn, "duplicate_side_effects")  # read from its findings table
    _assert_lists(frame, "duplicate_side_effects")
    rows = json.loads(dumps(frame_payload(frame)))["rows"]
    assert [row["span_ids"] for row in rows] == frame["span_ids"].tolist()
    assert all(type(row["agents"]) is list for row in rows)
    # Arrow answer: an HTTP client reads the columns as objects (numpy arrays), as before
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, read.arrow_table(frame).schema) as writer:
        writer.write_table(read.arrow_table(frame))
    client = pa.ipc.open_stream(sink.getvalue()).read_all().to_pandas()
    assert client["span_ids"].dtype == object
    assert [list(ids) for ids in client["span_ids"]] == frame["span_ids"].tolist()
    metric = {"name": "duplicate_side_effects", "failure_mode": "duplicate side effect", "mast_category": "x"}
    found = findings_from_frame(metric, frame)
    assert [f.span_ids for f in found] == frame["span_ids"].tolist()
    assert [f.agents for f in found] == frame["agents"].tolist()
