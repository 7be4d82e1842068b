"""The read API's Arrow answer: Arrow list columns (``pd.ArrowDtype``) read back with a plain
``to_pandas`` (``analytics.read.arrow_table``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from analytics.read import arrow_table

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


def test_an_arrow_table_of_arrow_lists_reads_back_with_a_plain_to_pandas():
    """A client (the dashboard's HTTP source) calls ``read_pandas``, which fails on pandas' own
    name of an Arrow list type; it gets the cells a column of Python lists gives (numpy arrays)."""
    frame = _frame()
    # the library mismatch this works around: when pandas reads its own name of the type back,
    # this fails and ``arrow_table`` can go
    with pytest.raises(TypeError, match="not understood"):
        pa.Table.from_pandas(frame, preserve_index=False).to_pandas()
    back = arrow_table(frame).to_pandas()
    assert list(back.columns) == list(frame.columns)
    assert [None if v is None else list(v) for v in back["span_ids"]] == [["a", "b"], [], None, ["c"]]
    assert [list(v) for v in back["agents"]] == [list(v) for v in frame["agents"]]
    plain = frame.drop(columns="span_ids")
    assert arrow_table(plain).equals(pa.Table.from_pandas(plain, preserve_index=False))
