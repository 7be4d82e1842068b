"""Load detector SQL from ``analytics/sql`` and run it with parameters only.

A detector file may contain the placeholder ``{filtered_spans}``; it is replaced by the shared
fragment ``_filtered_spans.sql`` (every column of the spans passing the window/service/run/
origin-task filter), so every detector filters the same way. ``{span_filter}`` expands to that
filter's WHERE condition alone (``_span_filter.sql``), for detectors that select only the columns
they need; ``{constraint_cells}``, ``{constraint_delegations}``, ``{held_versions}`` and
``{declared_tool_key}`` (the attributes that declare an agent's tool list) expand their fragments
likewise.

Values never enter SQL text: they are bound as DuckDB named parameters (``$since``, ``$agent``,
...), and only the parameters a statement mentions are passed. Optional filters are written as
``($name::TYPE IS NULL OR <condition>)``; before running a statement, ``query_df`` rewrites each
such group to ``(TRUE)`` when the parameter is None and to ``(<condition>)`` when it is set
(``prune_unset_filters``). Both rewrites mean exactly what the original means, but DuckDB sees a
plain predicate it can push into the scan (row-group pruning) instead of an OR it cannot.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import re
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from analytics.engine import clickhouse_df, clickhouse_table, is_clickhouse
from analytics.types import Filters, Window

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
# "(" then "$name", an optional cast such as ::VARCHAR or ::VARCHAR[], then "IS NULL OR".
_OPTIONAL = re.compile(
    r"\(\s*\$([A-Za-z_][A-Za-z0-9_]*)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*(?:\[\])?)?"
    r"\s+IS\s+NULL\s+OR\s",
    re.IGNORECASE,
)


@functools.cache
def _read(name: str) -> str:
    resource = importlib.resources.files("analytics").joinpath("sql", f"{name}.sql")
    return resource.read_text(encoding="utf-8")


def load_sql(name: str, span_condition: str | None = None) -> str:
    """Return the SQL text of ``analytics/sql/<name>.sql`` with shared fragments expanded;
    ``span_condition`` as in ``expand_fragments``."""
    if not re.fullmatch(r"_?[a-z0-9_]+", name):
        raise ValueError(f"Expected a metric SQL name like 'lost_updates', got {name!r}")
    return expand_fragments(_read(name), span_condition)


def expand_fragments(text: str, span_condition: str | None = None) -> str:
    """``text`` with the shared fragments (``{filtered_spans}``, ``{span_filter}``, ...) expanded.
    ``span_condition`` (SQL of ours, never a user's text): a condition every ``{span_filter}``
    also requires, e.g. ``run_id IS NULL`` for a statement over the spans of no run."""
    # Fragments may include fragments; expand until none is left (fragments never recurse).
    for fragment in (
        "compare_baseline_parts",
        "compare_sequences_of",
        "compare_run_steps_of",
        "compare_subjects_of",
        "compare_spans",
        "goal_subtasks",
        "goal_subtask_counts",
        "goal_spread",
        "constraint_cells",
        "constraint_delegations",
        "context_versions",
        "context_found",
        "context_evidence",
        "enforcement_per_tool",
        "enforcement_cells",
        "held_versions",
        "filtered_spans",
        "span_filter",
        "run_scope",
        "compare_step_columns",
        "declared_tool_key",
        "loop_tool_calls",
    ):
        placeholder = "{" + fragment + "}"
        if placeholder in text:
            body = _read("_" + fragment)
            # a condition: parenthesised, on its own lines
            if fragment in ("span_filter", "run_scope", "declared_tool_key"):
                body = "(\n" + body.strip() + "\n)"
            if fragment == "span_filter" and span_condition is not None:
                body = f"({body} AND {span_condition})"
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
        # Internal (``Filters.runs`` / ``origin_tasks``): the materializer recomputes only the
        # partitions new spans touched, a read only the runs its window cuts.
        "runs": None if filters.runs is None else list(filters.runs),
        "origin_tasks": None if filters.origin_tasks is None else list(filters.origin_tasks),
        # Internal, only with ``runs`` / ``origin_tasks``: the least ``ingested_at`` of those
        # partitions' spans (``materialize.run_scope``): a bound the scan prunes row groups by.
        "scope_from": None if filters.runs is None and filters.origin_tasks is None else filters.scope_from,
    }


def _code_mask(sql: str) -> str:
    """``sql`` with the insides of string literals, quoted identifiers and comments blanked.

    Positions are kept, so matches found in the mask index the original text; nothing inside a
    literal or comment can be mistaken for a filter or a parenthesis.
    """
    out = list(sql)
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"":
            j = i + 1
            while j < n:
                if sql[j] == ch:
                    if j + 1 < n and sql[j + 1] == ch:  # doubled quote inside the literal
                        j += 2
                        continue
                    break
                j += 1
            end = min(j, n - 1)
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            end = (n if j < 0 else j) - 1
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            end = n - 1 if j < 0 else j + 1
        else:
            i += 1
            continue
        for k in range(i, end + 1):
            if out[k] != "\n":
                out[k] = " "
        i = end + 1
    return "".join(out)


def _matching_paren(mask: str, open_at: int) -> int | None:
    """Index of the ")" closing the "(" at ``open_at``; None if a top-level comma comes first."""
    depth = 0
    for i in range(open_at, len(mask)):
        ch = mask[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        elif ch == "," and depth == 1:
            return None  # an argument list, not one condition: leave it alone
    return None


@functools.lru_cache(maxsize=512)
def _prune(sql: str, unset: frozenset[str], known: frozenset[str]) -> str:
    mask = _code_mask(sql)
    pieces: list[str] = []
    pos = 0
    search_from = 0
    while True:
        match = _OPTIONAL.search(mask, search_from)
        if match is None:
            break
        name = match.group(1)
        close = _matching_paren(mask, match.start())
        if close is None or name not in known:
            search_from = match.start() + 1
            continue
        pieces.append(sql[pos : match.start()])
        if name in unset:
            pieces.append("(TRUE)")
        else:  # set: FALSE OR cond is cond, including when cond is NULL
            inner = sql[match.end() : close]
            pieces.append("(" + _prune(inner, unset, known) + ")")
        pos = search_from = close + 1
    pieces.append(sql[pos:])
    return "".join(pieces)


def prune_unset_filters(sql: str, params: dict[str, Any]) -> str:
    """Rewrite every ``($p IS NULL OR cond)`` group: ``(TRUE)`` if ``params[p]`` is None, else ``(cond)``.

    The cast after ``$p`` is optional. A group whose parameter is not in ``params`` is kept as
    written (the caller's missing-parameter check then names it). Values stay parameters: only
    text that was already in the statement is removed, nothing from ``params`` is inserted.
    """
    unset = frozenset(key for key, value in params.items() if value is None)
    return _prune(sql, unset, frozenset(params))


@functools.lru_cache(maxsize=512)
def mentioned_params(sql: str) -> frozenset[str]:
    """Names of the ``$parameters`` in the code of ``sql`` (not in its comments or literals)."""
    return frozenset(_PARAM.findall(_code_mask(sql)))


def query_df(conn: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pd.DataFrame:
    """Execute ``sql`` binding only the named parameters it mentions; return a DataFrame.

    Conditions of unset optional filters are dropped first (``prune_unset_filters``). ``conn``
    may be a ClickHouse store (``analytics.engine``): the statement is then translated.
    """
    sql, bound = _bound(sql, params)
    if is_clickhouse(conn):
        return clickhouse_df(conn, sql, bound)
    return conn.execute(sql, bound).df()


def _bound(sql: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``sql`` without the conditions of unset optional filters, and the parameters it mentions
    (a KeyError names those not supplied)."""
    sql = prune_unset_filters(sql, params)
    used = mentioned_params(sql)
    missing = used - params.keys()
    if missing:
        raise KeyError(f"SQL needs parameters {sorted(missing)} that were not supplied")
    return sql, {key: params[key] for key in used}


def query_arrow(conn: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pa.Table:
    """``query_df``'s rows as an Arrow table: each column has the statement's SQL type whatever
    its values (a column all NULL is still text), so answers over different runs concatenate
    into what one statement over all of them gives."""
    sql, bound = _bound(sql, params)
    if is_clickhouse(conn):
        return clickhouse_table(conn, sql, bound)
    # execute, not conn.sql: a connection with a result not fetched to its end (a fetchone)
    # refuses a relation. DuckDB warns that this copies the rows once: they are few (the filter,
    # set once at import, is below: catch_warnings here swapped the process's filters per call,
    # which is not safe beside other threads).
    return conn.execute(sql, bound).to_arrow_table()


warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)


_memory: duckdb.DuckDBPyConnection | None = None
_memory_lock = threading.Lock()


@contextlib.contextmanager
def memory_cursor() -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of this process's one in-memory DuckDB (its registrations are its own): for
    statements over frames and Arrow tables, not over a store. Opening a database took 50 ms,
    a cursor 2."""
    global _memory
    with _memory_lock:
        if _memory is None:
            _memory = duckdb.connect()
        mem = _memory.cursor()
    try:
        yield mem
    finally:
        mem.close()


def query_tables(name: str, tables: dict[str, pa.Table], params: dict[str, Any]) -> pd.DataFrame:
    """Run ``analytics/sql/<name>.sql`` over Arrow ``tables`` (by name), not over a store: in the
    process's in-memory DuckDB (``memory_cursor``), so it runs alike whichever engine the tables
    came from."""
    with memory_cursor() as mem:
        for table_name, table in tables.items():
            mem.register(table_name, table)
        return query_df(mem, load_sql(name), params)


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
