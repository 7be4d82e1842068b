"""constraint_ledger's and duplicate_side_effects' lists are Arrow lists (``analytics.text_lists``) on
every path: a full computation, a stored result read back, a result brought up to date after a
batch, a window derived from the whole result; their readers see the cells as Python lists."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics import Filters, Window, kept, kept_store, read, run_metric, summary
from analytics.text_lists import TEXT_LISTS, as_text_lists
from driftscope.database import migrate
from tests.analytics.test_kept import _assert_same, _full, _stored_conn
from tests.analytics.test_summary import _random_batch
from tests.fixtures_analytics import BASE_TIME, insert_spans

LISTS = {
    "constraint_ledger": ("span_ids", "agents", "delegate_to"),
    "duplicate_side_effects": ("span_ids", "agents"),
}


def _assert_lists(frame: pd.DataFrame, name: str) -> None:
    for column in LISTS[name]:
        assert frame[column].dtype == TEXT_LISTS, (name, column)


def test_a_stored_result_reads_back_as_arrow_lists_equal_to_a_full_computation(tmp_path):
    conn, rng, runs = _stored_conn(tmp_path, 1)
    for name in LISTS:
        full = _full(conn, name, Window(), Filters())
        assert len(full) > 0, name  # the random spans found something to read back
        _assert_lists(full, name)
        before = kept.stats["loaded"]
        cold = run_metric(conn, name)  # read from the store, decoded
        assert kept.stats["loaded"] == before + 1
        _assert_lists(cold, name)
        _assert_same(cold, full, name)
        assert all(type(ids) is list and ids for ids in cold["span_ids"])  # iteration: Python lists
    # the kept rows merged with the rows of the runs (origin tasks) a batch touched
    before = kept.stats.copy()
    insert_spans(conn, _random_batch(rng, 3, runs))
    for name in LISTS:
        merged = run_metric(conn, name)
        _assert_lists(merged, name)
        _assert_same(merged, _full(conn, name, Window(), Filters()), name)
    assert kept.stats["partial"] > before["partial"]
    # a window derived from the whole result (duplicate_side_effects is partitioned by run)
    window = Window(since=BASE_TIME + timedelta(seconds=8))
    derived_before = kept.stats["window_derived"]
    windowed = run_metric(conn, "duplicate_side_effects", window)
    assert kept.stats["window_derived"] == derived_before + 1
    _assert_same(windowed, _full(conn, "duplicate_side_effects", window, Filters()), "duplicate_side_effects")
    _assert_lists(windowed, "duplicate_side_effects")
    kept.clear_cache()
    summary.clear_cache()


def test_an_empty_result_has_the_same_list_type():
    conn = duckdb.connect()
    migrate(conn)
    for name in LISTS:
        frame = run_metric(conn, name)
        assert frame.empty
        _assert_lists(frame, name)
        back = kept_store.decode(kept_store.encode(frame))
        pd.testing.assert_frame_equal(back, frame)


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

    conn, _, _ = _stored_conn(tmp_path, 1)
    frame = run_metric(conn, "duplicate_side_effects")  # read from the store
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
    kept.clear_cache()
    summary.clear_cache()
