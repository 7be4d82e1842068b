"""Write a labelled pair set as CSV (shared by the make_*_pairs.py scripts beside it)."""

from __future__ import annotations

import csv
import pathlib
from collections.abc import Iterable


def write_pairs(out: pathlib.Path, header: list[str], rows: Iterable[list]) -> None:
    """Write ``header`` then every row to ``out`` (UTF-8) and say how many pairs were written."""
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        count = 0
        for row in rows:
            writer.writerow(row)
            count += 1
    print(f"wrote {count} pairs to {out}")
