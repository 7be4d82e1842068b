"""The read interface: every question the read API and the dashboard's file source ask of a store.

One function per question, over a DuckDB connection (pass a cursor when several threads share a
connection). ``driftscope/api.py`` validates request parameters, calls these and serialises the
answers; the dashboard's ``DuckDBFileSource`` calls the same functions on a read-only incident
copy; its ``HttpSource`` only transports the API's answers. So there is one copy of each query.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from analytics import alerts as alert_state
from analytics import browse, compare, materialize, registry, search, thresholds
from analytics.engine import fetch_rows
from analytics.registry import Metric
from analytics.types import Filters, Page, Window

# Query parameters every metric accepts (the window, then the filters).
METRIC_PARAMS = ("since", "until", "service", "agent", "run", "origin_task")
# Most run ids or evidence keys one lookup may name.
MAX_LOOKUP_ITEMS = browse.MAX_EVIDENCE_KEYS
# Default most spans of one run returned.
RUN_SPAN_LIMIT = 20_000


def describe_metric(metric: Metric) -> dict[str, Any]:
    """A ``Metric`` record as plain data: documentation and every fact pages and reports use."""
    return {
        "name": metric.name,
        "description": metric.description,
        "row": metric.row,
        "columns": metric.columns,
        "params": list(METRIC_PARAMS),
        "title": metric.title,
        "failure_mode": metric.failure_mode,
        "mast_category": metric.mast_category,
        "findings": metric.findings,
        "flag_column": metric.flag_column,
        "counted": metric.counted,
        "failing": metric.failing,
        "failing_unless": metric.failing_unless,
        "review_unless": metric.review_unless,
        "rank_column": metric.rank_column,
        "page": metric.page,
        "blind_spots": metric.blind_spots,
        "needs": metric.needs,
    }


def describe_metrics() -> list[dict[str, Any]]:
    """Every registered metric described, in catalogue order."""
    return [describe_metric(m) for m in registry.catalogue()]


def metric_names() -> list[str]:
    """Names of the registered metrics, in catalogue order."""
    return [m.name for m in registry.catalogue()]


def metric_columns(name: str, columns: list[str] | str | None) -> list[str] | None:
    """``columns`` (a list, or comma-separated text) checked against ``name``'s documented
    columns: the list, or None for all. ``ValueError`` naming the documented ones otherwise
    (``KeyError`` for an unknown metric)."""
    if columns is None:
        return None
    wanted = [c.strip() for c in columns.split(",")] if isinstance(columns, str) else list(columns)
    found = registry.METRICS.get(name)
    if found is None:
        raise KeyError(f"Unknown metric {name!r}; known metrics: {', '.join(sorted(registry.METRICS))}")
    documented = found.columns
    unknown = [c for c in wanted if c not in documented]
    if not wanted or unknown:
        raise ValueError(
            f"columns of {name} must be some of its documented columns ({', '.join(documented)}), "
            f"got {', '.join(repr(c[:40]) for c in unknown) if unknown else 'none'}"
        )
    return list(dict.fromkeys(wanted))


def metric(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    columns: list[str] | str | None = None,
    page: Page | None = None,
) -> pd.DataFrame:
    """One metric's rows over ``window`` and ``filters`` (``KeyError`` for an unknown name); only
    ``columns`` when given (``metric_columns``: a projection, so a caller that shows counts never
    has the evidence lists built), equal to those columns of the whole frame; only ``page``'s
    rows when given (``attrs["total_rows"]``: the whole answer's length)."""
    return registry.run_metric(conn, name, window, filters, metric_columns(name, columns), page)


def metric_arrow(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    columns: list[str] | str | None = None,
    page: Page | None = None,
) -> tuple[pa.Table, int] | None:
    """``metric``'s answer as its findings table's Arrow rows and the whole answer's row count,
    when the table alone answers it (``registry.run_metric_arrow``); None: ask ``metric``."""
    return registry.run_metric_arrow(conn, name, window, filters, metric_columns(name, columns), page)


def findings_freshness(conn: duckdb.DuckDBPyConnection, frame: pd.DataFrame, name: str) -> dict[str, Any]:
    """How current ``frame`` (an answer of ``metric`` for ``name``; None: one of ``metric_arrow``,
    read from the table) is: ``source`` "table" (read
    from the findings tables, ``findings_as_of`` the change they reflect, ``lag_seconds`` how far
    behind the newest commit) or "computed" (computed for this request from the spans stored)."""
    if frame is not None and frame.attrs.get("source") != "table":
        return {"source": "computed", "findings_as_of": None, "lag_seconds": 0.0}
    names = [name] if name in materialize.maintained() else None  # run_summary: every table
    fresh = materialize.freshness(conn, names)
    return {"source": "table", "findings_as_of": fresh["findings_as_of"], "lag_seconds": fresh["lag_seconds"]}


def arrow_table(frame: pd.DataFrame) -> pa.Table:
    """``frame`` (an answer of this interface) as an Arrow table for the read API's Arrow answer,
    which any pandas reader reads back with a plain ``to_pandas``.

    A column of Arrow lists (``pd.ArrowDtype``, e.g. ``repeated_calls``' member span ids) is
    described in pandas' metadata by a type name pandas cannot parse back
    (``list<item: string>[pyarrow]``: ``to_pandas`` raises); it is described as a column of
    objects instead, which is what a column of Python lists gives, so a client (the dashboard's
    HTTP source, another version's) reads either as before."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    arrow = {
        str(column)
        for column, dtype in frame.dtypes.items()
        if isinstance(dtype, pd.ArrowDtype)
        and (pa.types.is_list(dtype.pyarrow_dtype) or pa.types.is_large_list(dtype.pyarrow_dtype))
    }
    metadata = table.schema.pandas_metadata
    if not arrow or metadata is None:
        return table
    for column in metadata.get("columns", []):
        if column.get("name") in arrow:
            column["numpy_type"] = "object"
    return table.replace_schema_metadata({**table.schema.metadata, b"pandas": json.dumps(metadata).encode()})


def arrow_frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow answer of the read API as this interface's frame: a findings table's own rows
    (``metric_arrow``: no pandas metadata) with the tables' types, an ``arrow_table`` answer by
    the pandas metadata it carries."""
    if table.schema.pandas_metadata is None:
        return table.to_pandas(types_mapper=materialize.pandas_type)
    return table.to_pandas()


def runs(
    conn: duckdb.DuckDBPyConnection, window: Window = Window(), filters: Filters = Filters(), limit: int = 500
) -> pd.DataFrame:
    """Runs with spans in the window, newest first, at most ``limit`` (``browse.list_runs``)."""
    return browse.list_runs(conn, window, filters, limit)


def run_totals(conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters) -> pd.DataFrame:
    """Every run in scope with its counts, no lists (``browse.run_totals``)."""
    return browse.run_totals(conn, window, filters)


def run_details(
    conn: duckdb.DuckDBPyConnection, window: Window, filters: Filters, run_ids: list[str]
) -> pd.DataFrame:
    """``runs`` rows of the given runs only."""
    return browse.run_details(conn, window, filters, list(run_ids))


def run_spans(
    conn: duckdb.DuckDBPyConnection,
    run_id: str,
    limit: int = RUN_SPAN_LIMIT,
    containing: list[str] | str | None = None,
) -> pd.DataFrame:
    """Every span of one run in start order (``attributes`` a dict). ``containing`` (a list, or
    comma-separated text) keeps only the spans whose tool arguments, input text or goal text
    contain one of those texts (``containing_texts`` checks them)."""
    return browse.run_spans(conn, run_id, limit, containing_texts(containing))


MAX_CONTAINING = 50  # texts in one run_spans(containing=...) call
MAX_CONTAINING_CHARS = 200


def compare_run(
    conn: duckdb.DuckDBPyConnection, run_id: str, baseline: str = compare.AUTO, window: Window = Window()
) -> dict[str, Any]:
    """How a run differs from its crew's healthy runs in ``window`` (``baseline="auto"``) or from
    one chosen run (``compare.compare_run``; issue 35); ``compare.RunNotFoundError`` when either
    run has no spans."""
    return compare.compare_run(conn, run_id, baseline, window)


def containing_texts(containing: list[str] | str | None) -> list[str] | None:
    """``containing`` as a list of 1 to ``MAX_CONTAINING`` texts of at most
    ``MAX_CONTAINING_CHARS`` characters each (None: no such filter); ``ValueError`` otherwise."""
    if containing is None:
        return None
    texts = containing.split(",") if isinstance(containing, str) else [str(t) for t in containing]
    texts = list(dict.fromkeys(texts))
    if not texts or len(texts) > MAX_CONTAINING or not all(0 < len(t) <= MAX_CONTAINING_CHARS for t in texts):
        raise ValueError(
            f"containing must be 1 to {MAX_CONTAINING} comma-separated texts of 1 to "
            f"{MAX_CONTAINING_CHARS} characters, got {len(texts)} text(s)"
        )
    return texts


def filter_options(conn: duckdb.DuckDBPyConnection, window: Window, limit: int = 500) -> dict:
    """Sidebar choices: services and agents seen in the window, the newest ``limit`` run ids."""
    return browse.filter_options(conn, window, limit)


def evidence_spans(
    conn: duckdb.DuckDBPyConnection, pairs: list[tuple[str, str]] | pd.DataFrame
) -> pd.DataFrame:
    """The spans named by (run_id, span_id) pairs, in start order."""
    keys = pairs if isinstance(pairs, pd.DataFrame) else pd.DataFrame(pairs, columns=["run_id", "span_id"])
    return browse.evidence_spans(conn, keys)


def search_spans(
    conn: duckdb.DuckDBPyConnection,
    text: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    limit: int = search.DEFAULT_SEARCH_LIMIT,
) -> pd.DataFrame:
    """Spans of any run matching a trace id, span id, run id, span name or attribute value
    (``search.search_spans``; issue 16); ``ValueError`` for text too short or too long."""
    return search.search_spans(conn, text, window, filters, limit)


def thresholds_in_force(conn: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The thresholds in force (newest calibrated version per name, else the default).

    ``provenance`` is JSON text, so every transport (Arrow, JSON, in process) gives the same column.
    """
    frame = pd.DataFrame(thresholds.list_thresholds(conn))
    if "provenance" in frame.columns:
        frame["provenance"] = frame["provenance"].map(
            lambda value: value if isinstance(value, str) or value is None else json.dumps(value, default=str)
        )
    return frame


def store_health(conn: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Span count, newest span, schema version and stored embeddings of the store."""
    spans, newest = conn.execute("SELECT count(*), max(Timestamp) FROM spans").fetchone()
    version = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
    embedded = conn.execute("SELECT count(*) FROM embeddings").fetchone()[0]
    return {"spans": spans, "newest_span": newest, "schema_version": version, "embeddings": embedded}


def alerts(conn: duckdb.DuckDBPyConnection, window: Window = Window(), limit: int = 500) -> pd.DataFrame:
    """Alert episodes (firing and resolved) active in ``window``, firing first, then newest, with
    the receivers that acknowledged each (``analytics.alerts.list_alerts``; issue 18)."""
    return alert_state.list_alerts(conn, window, limit)


def data_version(conn: duckdb.DuckDBPyConnection) -> str:
    """A string that changes whenever spans are committed or the findings tables move on (cache
    keys include it: a page showing findings as of one change must read again once they catch
    up): the newest change log seq, each findings table's seq, and the span count (a store
    without a change log, or a delete the log does not name)."""
    states = materialize.read_states(conn)
    seqs = sorted((name, state.seq) for name, state in states.items())
    ((spans,),) = fetch_rows(conn, "SELECT count(*) FROM spans")
    return f"{materialize.newest_change(conn)}:{spans}|{hash(tuple(seqs))}"


def findings_status(conn: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """How far behind the newest committed change the findings tables are
    (``analytics.materialize.freshness``: ``findings_as_of``, ``lag_seconds``, ``behind_changes``)."""
    return materialize.freshness(conn)


def describe_freshness(status: dict[str, Any] | None) -> str:
    """A sidebar line: "Findings as of 12:04:31 UTC, 2 s behind", or why there is none."""
    if not status or status.get("findings_as_of") is None:
        return "Findings: computed on request (no findings tables built yet)"
    at = status["findings_as_of"]
    at = at if isinstance(at, str) else at.isoformat()
    clock = at.replace("T", " ")[11:19]
    lag = status.get("lag_seconds") or 0.0
    behind = "up to date" if not status.get("behind_changes") else f"{lag:.0f} s behind"
    return f"Findings as of {clock} UTC, {behind}"
