"""How a report writes a cell: plain text of a value, and that text safe inside Markdown.

Shared by the report renderer and the run-comparison renderer (neither imports the other's
module for it)."""

from __future__ import annotations

import html
import re
from datetime import datetime

import pandas as pd

_MD_SPECIALS = re.compile(r"([\\`*_{}\[\]()#+!|~])")


def cell_text(value) -> str:
    """A value as one cell's text: lists joined, times ISO-8601, missing values empty."""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, pd.Timestamp | datetime):
        return value.isoformat(sep=" ")
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return str(value)


def md_escape(value) -> str:
    """Text safe inside Markdown (and a table cell): HTML-escaped, specials backslashed, one line."""
    text = html.escape(cell_text(value), quote=False)
    text = _MD_SPECIALS.sub(r"\\\1", text)
    return re.sub(r"[\r\n]+", " ", text)
