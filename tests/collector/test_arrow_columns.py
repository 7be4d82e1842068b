"""The decoder's Arrow columns: ``string_array`` (buffers laid out by the compiled decoder) and
the one-value-per-row shortcuts of ``build_table`` give exactly what ``pa.array`` gives."""

import pyarrow as pa
import pytest

from collector import decode
from collector.decode import _column_array, string_array

CASES = [
    [],
    ["a"],
    ["a", None, "ümlaut ✓", "", "\x00nul"],
    [None] * 9,
    ["same"] * 17,
    [""] * 4,
    ("tuple", None, "x"),
    ["x" * 70_000, "y"],
    [None, "last"],
    ["first", None],
    ["ok", b"bytes"],  # not a str: pyarrow converts it, as before
]


@pytest.mark.parametrize("values", CASES, ids=range(len(CASES)))
def test_string_array_equals_pyarrows(values):
    want = pa.array(values, type=pa.string())
    got = string_array(values)
    assert got.equals(want) and got.null_count == want.null_count
    column = _column_array(values, len(values), pa.string())
    assert column.equals(want) and column.null_count == want.null_count


@pytest.mark.parametrize(
    "values,kind",
    [
        ([None] * 5, pa.int32()),
        ([3] * 5, pa.int64()),
        ([True, None], pa.bool_()),
        ([["a"], None], pa.list_(pa.string())),
    ],
)
def test_other_columns_equal_pyarrows(values, kind):
    assert _column_array(values, len(values), kind).equals(pa.array(values, type=kind))


@pytest.mark.parametrize("values", [["a", 1], ["\ud800"]])
def test_values_pyarrow_refuses_are_refused_the_same_way(values):
    with pytest.raises(Exception) as want:
        pa.array(values, type=pa.string())
    with pytest.raises(type(want.value)):
        string_array(values)


def test_without_the_compiled_helper_pyarrow_converts(monkeypatch):
    monkeypatch.setattr(decode, "_utf8_column", None)
    assert string_array(["a", None]).equals(pa.array(["a", None], type=pa.string()))


def test_every_row_gets_the_batch_ingest_time():
    from datetime import datetime

    from collector.decode import SPAN_COLUMNS, build_table

    columns = {name: [None] * 3 for name in SPAN_COLUMNS}
    columns["SpanAttributes"] = columns["ResourceAttributes"] = ([0, 0, 0, 0], [], [])
    now = datetime(2026, 12, 5, 12, 0, 0, 123456)
    table = build_table(columns, 3, now)
    assert table.column("ingested_at").to_pylist() == [now] * 3
