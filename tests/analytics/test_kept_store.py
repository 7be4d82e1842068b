"""Stored frames with Arrow list columns (``pd.ArrowDtype``) come back as Arrow lists."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from analytics import kept_store

LISTS = pd.ArrowDtype(pa.list_(pa.string()))


def _frame() -> pd.DataFrame:
    """Arrow lists beside Python lists and numpy-array cells (what DuckDB gives a list column)."""
    return pd.DataFrame(
        {
            "run_id": ["r1", "r2", "r1", "r3"],
            "span_ids": pd.Series(
                pa.array([["a", "b"], [], None, ["c"]], type=pa.list_(pa.string())), dtype=LISTS
            ),
            "agents": [["x"], ["y", "z"], [], ["x"]],
            "arrays": [np.array(["p"], dtype=object)] * 4,
            "n": [1, 2, 3, 4],
        }
    )


def test_arrow_list_columns_come_back_as_arrow_lists_in_their_place():
    frame = _frame()
    data = kept_store.encode(frame)
    assert data is not None
    back = kept_store.decode(data)
    pd.testing.assert_frame_equal(back, frame)
    assert back["span_ids"].dtype == LISTS and back["agents"].dtype == object
    assert [type(v) for v in back["agents"]] == [list] * 4
    assert [type(v) for v in back["arrays"]] == [np.ndarray] * 4
    assert back["span_ids"].tolist() == [["a", "b"], [], pd.NA, ["c"]]
    pd.testing.assert_frame_equal(kept_store.decode(data, ["n", "span_ids"]), frame[["n", "span_ids"]])
    want = frame[frame["run_id"].isin({"r1"})].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept_store.decode_runs(data, {"r1"}), want)
    empty = frame.iloc[0:0]
    pd.testing.assert_frame_equal(kept_store.decode(kept_store.encode(empty)), empty)


def test_an_arrow_table_of_arrow_lists_reads_back_with_a_plain_to_pandas():
    """The read API's Arrow answer: a client (the dashboard's HTTP source) calls ``read_pandas``,
    which fails on pandas' own name of an Arrow list type; it gets the cells a column of Python
    lists gives (numpy arrays)."""
    frame = _frame()
    # the library mismatch this works around: when pandas reads its own name of the type back,
    # this fails and ``kept_store.arrow_table`` can go
    with pytest.raises(TypeError, match="not understood"):
        pa.Table.from_pandas(frame, preserve_index=False).to_pandas()
    back = kept_store.arrow_table(frame).to_pandas()
    assert list(back.columns) == list(frame.columns)
    assert [None if v is None else list(v) for v in back["span_ids"]] == [["a", "b"], [], None, ["c"]]
    assert [list(v) for v in back["agents"]] == [list(v) for v in frame["agents"]]
    plain = frame.drop(columns="span_ids")
    assert kept_store.arrow_table(plain).equals(pa.Table.from_pandas(plain, preserve_index=False))


def test_text_held_as_objects_comes_back_as_objects():
    """A column of text and None held as objects (repeated_calls' agent when some loop has none)
    is stored and read back as objects, whole, by columns and by runs; on the framework corpus
    repeated_calls was otherwise never stored."""
    frame = pd.DataFrame(
        {
            "run_id": ["r1", "r2", "r1"],
            "agent": pd.Series(["researcher", None, "manager"], dtype=object),
            "text": ["a", "b", "c"],  # pandas' text type stays that type
        }
    )
    data = kept_store.encode(frame)
    assert data is not None
    back = kept_store.decode(data)
    pd.testing.assert_frame_equal(back, frame)
    assert (
        back["agent"].tolist() == ["researcher", None, "manager"]
        and back["text"].dtype == frame["text"].dtype
    )
    pd.testing.assert_frame_equal(kept_store.decode(data, ["agent"]), frame[["agent"]])
    pd.testing.assert_frame_equal(
        kept_store.decode_runs(data, ["r1"]), frame[frame["run_id"] == "r1"].reset_index(drop=True)
    )
    # objects that are not all text (or whose missing cells are not None) are still not stored
    assert kept_store.encode(pd.DataFrame({"agent": pd.Series(["a", float("nan")], dtype=object)})) is None
