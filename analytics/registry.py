"""The registry of metrics: every detector registers itself once, with every fact others need.

A ``Metric`` record carries the detector, its documented columns and how its rows are read: the
failure mode they show, which column flags a finding, whether findings count toward a run's
verdict and whether they make it failing, and the dashboard page that shows them. The run summary,
the read API (``analytics.read``), the dashboard catalogue and the reports derive all of that from
``METRICS``; adding a detector is one SQL file and one ``@register``.

``METRICS`` keeps registration order, which is the catalogue order pages and reports list metrics
in (``analytics/__init__`` imports the detector modules in that order).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import duckdb
import pandas as pd
import pyarrow as pa

import analytics.materialize as materialize
from analytics.engine import fetch_rows, is_clickhouse
from analytics.materialize import read_findings, read_window
from analytics.schema import ensure_readable
from analytics.types import Filters, Page, Window

logger = logging.getLogger(__name__)

DetectorFunc = Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame]
Columns = dict[str, str] | Callable[[], dict[str, str]]

# The three MAST failure categories (Cemri et al., "Why Do Multi-Agent LLM Systems Fail?").
MAST_CATEGORIES = ("specification issues", "inter-agent misalignment", "task verification")


@dataclass(frozen=True)
class Metric:
    """A registered detector and everything pages, reports and the run summary need to know of it.

    ``columns`` maps every returned column to its meaning and unit, in output order; ``row`` says
    what one row is. A metric with ``findings`` lists coordination failures: each row (or each row
    whose ``flag_column`` is true) is one finding of ``failure_mode``, labelled ``title``. Metrics
    without it are tables and charts (coverage, distributions, the summary itself).
    """

    name: str
    func: DetectorFunc
    description: str
    column_source: Columns = field(repr=False)
    row: str
    title: str | None = None
    """Short label of the failure mode (tiles, chart axes, report headings)."""
    failure_mode: str | None = None
    mast_category: str | None = None
    """One of ``MAST_CATEGORIES``."""
    findings: bool = False
    """Its rows (those ``flag_column`` marks) are coordination failures."""
    flag_column: str | None = None
    """Boolean column marking the rows that are findings (the others are context: a bucket under
    its threshold, a subtask close to its goal, a stale send a guard refused)."""
    counted: bool = False
    """``run_summary`` counts its findings per run (``<name>_count``); a count over the calibrated
    ``count_per_run:<name>`` threshold (0 by default) moves the run's verdict."""
    failing: bool = False
    """Every finding means a failure took effect: its run is "failing" (else only "degraded": a
    guard or the agent caught it)."""
    failing_unless: str | None = None
    """Boolean column: a finding row where it is not true is a failure (its run is failing), one
    where it is true only a warning (the agent recovered)."""
    review_unless: str | None = None
    """Boolean column: a finding row where it is false is for a person to review (its threshold
    is the uncalibrated default), not a failure."""
    rank_column: str | None = None
    """Numeric column ranking findings for listing, largest (worst) first."""
    page: str | None = None
    """Dashboard page (url path) that shows it; None: the generic findings page."""
    blind_spots: str | None = None
    """What the detector cannot see, in plain words (reports print it beside its findings)."""
    needs: str | None = None
    """What the detector needs to see in the spans to find anything, in plain words (an empty
    table says it, rather than blaming ingest when spans did arrive). Every findings metric has it."""
    kept: str | None = None
    """How the materializer keeps its findings table (``analytics.materialize``): "whole"
    (recomputed whole after changes), or the column its findings are partitioned by ("run_id",
    "origin_task_id": only the partitions new spans touched are recomputed); None: not kept
    (computed on each read)."""
    order: tuple[tuple[str, bool], ...] = ()
    """A partitioned result's row order, as its SQL sorts it: (column, descending) pairs."""
    version: int = 1
    """Version of its definition: bumping it rebuilds its findings table (``analytics.materialize``)."""
    window_bounds: bool = False
    """Its result uses the window's bounds themselves (time buckets laid over the window), not
    only which spans start inside it; otherwise a window holding every stored span is answered as
    the whole store (``run_metric``), from its findings table."""

    @property
    def columns(self) -> dict[str, str]:
        """Every returned column and its meaning, in output order."""
        source = self.column_source
        return dict(source() if callable(source) else source)


METRICS: dict[str, Metric] = {}


def _check_facts(name: str, columns: dict[str, str], facts: dict) -> None:
    """Refuse a registration whose facts contradict each other or name unknown columns."""
    if facts["findings"]:
        missing = [key for key in ("title", "failure_mode", "mast_category", "needs") if not facts[key]]
        if missing:
            raise ValueError(f"metric {name!r} lists findings, so it needs {', '.join(missing)}")
    else:
        given = [
            key
            for key in ("flag_column", "counted", "failing", "failing_unless", "review_unless")
            if facts[key]
        ]
        if given:
            raise ValueError(f"metric {name!r} sets {', '.join(given)} but not findings=True")
    category = facts["mast_category"]
    if category is not None and category not in MAST_CATEGORIES:
        raise ValueError(
            f"metric {name!r}: mast_category must be one of {', '.join(MAST_CATEGORIES)}, got {category!r}"
        )
    for key in ("flag_column", "failing_unless", "review_unless", "rank_column"):
        column = facts[key]
        if column is not None and column not in columns:
            raise ValueError(f"metric {name!r}: {key} {column!r} is not one of its documented columns")
    kept, order = facts["kept"], facts["order"]
    if kept not in (None, "whole", *materialize.PARTITIONS):
        raise ValueError(
            f"metric {name!r}: kept must be 'whole' or one of {', '.join(materialize.PARTITIONS)}, got {kept!r}"
        )
    if kept not in (None, "whole") and kept not in columns:
        raise ValueError(f"metric {name!r}: kept by {kept!r}, which is not one of its documented columns")
    if kept not in (None, "whole") and not order:
        raise ValueError(f"metric {name!r}: a result partitioned by {kept} needs its row order (order=...)")
    if order and kept in (None, "whole"):
        raise ValueError(f"metric {name!r}: order is only for a result partitioned by a column (kept=...)")
    for column, _descending in order:
        if column not in columns:
            raise ValueError(f"metric {name!r}: order column {column!r} is not one of its documented columns")


def register(
    name: str,
    *,
    description: str,
    columns: Columns,
    row: str,
    title: str | None = None,
    failure_mode: str | None = None,
    mast_category: str | None = None,
    findings: bool = False,
    flag_column: str | None = None,
    counted: bool = False,
    failing: bool = False,
    failing_unless: str | None = None,
    review_unless: str | None = None,
    rank_column: str | None = None,
    page: str | None = None,
    blind_spots: str | None = None,
    needs: str | None = None,
    kept: str | None = None,
    order: tuple[tuple[str, bool], ...] | list[tuple[str, bool]] = (),
    window_bounds: bool = False,
    version: int = 1,
) -> Callable[[DetectorFunc], DetectorFunc]:
    """Register the decorated detector under ``name`` with the facts of its ``Metric`` record.

    The registered callable returns exactly the documented columns in the documented order, so
    the documentation cannot drift from the output. ``columns`` may be a function returning them
    when they follow other registrations (run_summary has one count column per counted metric).
    """
    facts = dict(
        title=title, failure_mode=failure_mode, mast_category=mast_category, findings=findings,
        flag_column=flag_column, counted=counted, failing=failing, failing_unless=failing_unless,
        review_unless=review_unless, rank_column=rank_column, page=page, blind_spots=blind_spots, needs=needs,
        kept=kept, order=tuple(tuple(pair) for pair in order), window_bounds=window_bounds,
        version=version,
    )  # fmt: skip
    if not callable(columns):
        _check_facts(name, columns, facts)

    def decorate(func: DetectorFunc) -> DetectorFunc:
        def checked(
            conn: duckdb.DuckDBPyConnection, window: Window = Window(), filters: Filters = Filters()
        ) -> pd.DataFrame:
            frame = func(conn, window, filters)
            wanted = list(_evaluate(columns))
            missing = [column for column in wanted if column not in frame.columns]
            if missing:
                raise RuntimeError(f"detector {name} did not return documented columns {missing}")
            return frame.loc[:, wanted].reset_index(drop=True)

        checked.__name__ = func.__name__
        checked.__doc__ = func.__doc__
        checked.__wrapped__ = func
        METRICS[name] = Metric(
            name=name,
            func=checked,
            description=description,
            column_source=dict(columns) if not callable(columns) else columns,
            row=row,
            **facts,
        )
        _maintain(METRICS[name])
        return checked

    return decorate


def _evaluate(columns: Columns) -> dict[str, str]:
    return dict(columns() if callable(columns) else columns)


def list_metrics() -> list[Metric]:
    """All registered metrics, sorted by name."""
    return [METRICS[name] for name in sorted(METRICS)]


def catalogue() -> list[Metric]:
    """All registered metrics in catalogue (registration) order."""
    return list(METRICS.values())


def finding_metrics() -> list[Metric]:
    """The metrics whose rows are findings, in catalogue order."""
    return [m for m in METRICS.values() if m.findings]


def counted_metrics() -> list[Metric]:
    """The metrics run_summary counts per run, in catalogue order."""
    return [m for m in METRICS.values() if m.counted]


@contextlib.contextmanager
def scratch_registry() -> Iterator[dict[str, Metric]]:
    """Registrations made inside the block are forgotten when it ends (tests, experiments)."""
    saved = dict(METRICS)
    try:
        yield METRICS
    finally:
        METRICS.clear()
        METRICS.update(saved)
        for metric in METRICS.values():  # a scratch registration may have replaced a kept fact
            _maintain(metric)
        for name in set(materialize.maintained()) - set(METRICS) - set(materialize.PARTS):
            materialize.forget(name)


def _maintain(metric: Metric) -> None:
    """Have serve's materializer keep ``metric``'s findings table when it names a partition."""
    if metric.kept is None:
        materialize.forget(metric.name)
        return
    materialize.maintain(
        materialize.Maintained(
            name=metric.name,
            partition=None if metric.kept == "whole" else metric.kept,
            compute=materialize.detector_compute(metric.func),
            order=tuple(metric.order),
            version=str(metric.version),
            detector=metric.func,
        )
    )


def run_metric(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    columns: list[str] | None = None,
    page: Page | None = None,
) -> pd.DataFrame:
    """Run the metric ``name`` over ``window`` and ``filters``; only ``columns`` of its result
    when given (in that order; the caller checks them against the documented columns); only
    ``page``'s rows when given, the whole answer's length in ``attrs["total_rows"]`` (a findings
    table gives just the page; an answer computed for the question is computed whole, then cut).

    A maintained detector is read from its findings table (``materialize.read_findings``), or
    for a window that cuts runs from the table plus the cut runs computed alone
    (``materialize.read_window``; on ClickHouse for windows and run filters only). Anything else
    (a detector kept whole or by origin task under a window or filter, a service, agent or
    origin-task filter on ClickHouse, a store whose tables are not built, ``Filters.from_spans``)
    is the detector computed over the spans the window and filters select.

    Raises ``KeyError`` naming the known metrics when ``name`` is not registered.
    """
    metric = _metric(name)
    logger.debug("running metric %s window=%s filters=%s", name, window, filters)
    ensure_readable(conn)
    if not filters.reads_spans():
        scope = _table_scope(conn, metric, window)
        tabled = read_findings(conn, name, scope, filters, columns, list(metric.columns), page=page)
        if tabled is None and not metric.window_bounds:  # the runs a window cuts, computed alone
            tabled = read_window(conn, name, scope, filters, columns, list(metric.columns))
            if tabled is not None and page is not None:
                tabled = page.cut(tabled)
        if tabled is not None:  # maintained as spans commit: a SELECT (analytics.materialize)
            return tabled
    frame = _project(metric.func(conn, window, filters), columns)
    return frame if page is None else page.cut(frame)


def run_metric_arrow(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    columns: list[str] | None = None,
    page: Page | None = None,
) -> tuple[pa.Table, int] | None:
    """``run_metric``'s answer as the findings table's own Arrow rows and the whole answer's row
    count, when its table alone answers (``materialize.read_findings_arrow``: no run cut by the
    window, nothing computed; DuckDB only); None otherwise, for ``run_metric`` to answer. What
    the read API sends an Arrow client: read back with ``read.arrow_frame`` it is
    ``run_metric``'s frame."""
    metric = _metric(name)
    if is_clickhouse(conn) or filters.reads_spans():
        return None  # ClickHouse's tables answer through run_metric only
    ensure_readable(conn)
    scope = _table_scope(conn, metric, window)
    return materialize.read_findings_arrow(
        conn, name, scope, filters, columns, list(metric.columns), page=page
    )


def _metric(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        known = ", ".join(sorted(METRICS))
        raise KeyError(f"Unknown metric {name!r}; known metrics: {known}") from None


def _table_scope(conn: duckdb.DuckDBPyConnection, metric: Metric, window: Window) -> Window:
    """The window a findings table is asked for: a result laid over the window's own bounds
    (time buckets) answers only the unbounded window; any other answers a window holding every
    stored span as the unbounded one."""
    return window if metric.window_bounds else whole_if_covering(conn, window)


def compute_metric(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window = Window(),
    filters: Filters = Filters(),
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """``run_metric`` computed from the spans, never read from a findings table (the reference
    the tables are held equal to; a calibration's dry run under thresholds not committed)."""
    return run_metric(conn, name, window, dataclasses.replace(filters, from_spans=True), columns)


def _project(frame: pd.DataFrame, columns: list[str] | None) -> pd.DataFrame:
    """``frame``'s ``columns`` (in that order, those it has; all when None)."""
    if columns is None:
        return frame
    return frame[[c for c in dict.fromkeys(columns) if c in frame.columns]]


def whole_if_covering(conn: duckdb.DuckDBPyConnection, window: Window) -> Window:
    """``Window()`` when ``window`` holds the start of every stored span (a report or page over
    "the last 2 hours" of a store that has nothing older): the same spans, so the same result, and
    it is the scope the findings tables answer. Otherwise ``window`` itself."""
    if window == Window():
        return window
    if is_clickhouse(conn):
        ((count, first, last),) = fetch_rows(
            conn, "SELECT count(*), min(Timestamp), max(Timestamp) FROM spans"
        )
        first = None if not count else first  # ClickHouse's min() of no rows is the epoch
    else:
        first, last = conn.execute("SELECT min(Timestamp), max(Timestamp) FROM spans").fetchone()
    if first is None:
        return window
    if (window.since is None or window.since <= first) and (window.until is None or window.until > last):
        return Window()
    return window
