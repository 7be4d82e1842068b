"""Load detector SQL from ``analytics/sql`` and run it with parameters only.

A detector file may contain the placeholder ``{filtered_spans}``; it is replaced by the shared
fragment ``_filtered_spans.sql`` (every column of the spans passing the window/service/run/
origin-task filter), so every detector filters the same way. ``{span_filter}`` expands to that
filter's WHERE condition alone (``_span_filter.sql``), for detectors that select only the columns
they need; ``{constraint_cells}`` and ``{held_versions}`` expand their fragments likewise. Values never enter SQL text: they are bound as DuckDB named parameters
(``$since``, ``$agent``, ...), and only the parameters a statement mentions are passed.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from typing import Any

import duckdb
import pandas as pd

from analytics.types import Filters, Window

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


@functools.cache
def _read(name: str) -> str:
    resource = importlib.resources.files("analytics").joinpath("sql", f"{name}.sql")
    return resource.read_text(encoding="utf-8")


def load_sql(name: str) -> str:
    """Return the SQL text of ``analytics/sql/<name>.sql`` with shared fragments expanded."""
    if not re.fullmatch(r"_?[a-z0-9_]+", name):
        raise ValueError(f"Expected a metric SQL name like 'lost_updates', got {name!r}")
    text = _read(name)
    # Fragments may include fragments; expand until none is left (fragments never recurse).
    for fragment in ("constraint_cells", "held_versions", "filtered_spans", "span_filter"):
        placeholder = "{" + fragment + "}"
        if placeholder in text:
            body = _read("_" + fragment)
            if fragment == "span_filter":  # a condition: parenthesised, on its own lines
                body = "(\n" + body.strip() + "\n)"
            text = text.replace(placeholder, body)
    return text


def quote_identifier(name: str) -> str:
    """Quote an SQL identifier (the only way identifiers may be built dynamically)."""
    return '"' + name.replace('"', '""') + '"'


def filter_params(window: Window, filters: Filters) -> dict[str, Any]:
    """Named parameters every detector understands."""
    return {
        "since": window.since,
        "until": window.until,
        "service": filters.service,
        "agent": filters.agent,
        "run": filters.run,
        "origin_task": filters.origin_task,
        "ingested_after": None,
    }


def query_df(conn: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pd.DataFrame:
    """Execute ``sql`` binding only the named parameters it mentions; return a DataFrame."""
    used = set(_PARAM.findall(sql))
    missing = used - params.keys()
    if missing:
        raise KeyError(f"SQL needs parameters {sorted(missing)} that were not supplied")
    return conn.execute(sql, {key: params[key] for key in used}).df()


def run_sql(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window,
    filters: Filters,
    **extra: Any,
) -> pd.DataFrame:
    """Run ``analytics/sql/<name>.sql`` with the standard filters plus ``extra`` parameters."""
    params = filter_params(window, filters)
    params.update(extra)
    return query_df(conn, load_sql(name), params)
