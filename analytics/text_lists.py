"""Result columns of text lists (evidence span ids, agents) held as Arrow lists.

DuckDB (and the ClickHouse path, ``analytics.engine``) gives a LIST column as a column of
objects, each cell a numpy array of Python strings. A findings table read back
(``analytics.materialize``) gives Arrow lists; detectors give them too, so a result's types do
not depend on where it came from, as ``repeated_calls``' member span ids are (``analytics.loops``).

Readers see what they saw: ``Series.tolist()``, iteration, ``.loc`` / ``.iloc`` and
``to_dict`` give Python lists (as before: numpy arrays); ``Series.map`` and ``to_numpy`` give
numpy arrays. The read API's Arrow answer describes the column as objects
(``analytics.read.arrow_table``), so an HTTP client gets the cells it got before.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

TEXT_LISTS = pd.ArrowDtype(pa.list_(pa.string()))


def as_text_lists(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """``frame`` with ``columns`` (cells: lists or arrays of text, or None) as ``TEXT_LISTS``
    columns; an empty frame too, so a result's type does not depend on what it found."""
    converted = {
        column: pd.Series(
            pa.array(frame[column].to_numpy(dtype=object), type=TEXT_LISTS.pyarrow_dtype, from_pandas=True),
            index=frame.index,
            dtype=TEXT_LISTS,
        )
        for column in columns
        if column in frame.columns and frame[column].dtype != TEXT_LISTS
    }
    return frame.assign(**converted) if converted else frame
