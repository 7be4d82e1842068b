"""The registry of metrics: every detector registers itself once, with documented columns.

The read API, the dashboard and reports list ``METRICS`` and call ``run_metric``; nothing else
needs wiring when a detector is added.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pandas as pd

from analytics.schema import ensure_readable
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

DetectorFunc = Callable[[duckdb.DuckDBPyConnection, Window, Filters], pd.DataFrame]


@dataclass(frozen=True)
class Metric:
    """A registered detector and its documentation.

    ``columns`` maps every returned column to its meaning and unit, in output order; ``row``
    says what one row is.
    """

    name: str
    func: DetectorFunc
    description: str
    columns: dict[str, str]
    row: str
    failure_mode: str | None = None
    mast_category: str | None = None


METRICS: dict[str, Metric] = {}


def register(
    name: str,
    *,
    description: str,
    columns: dict[str, str],
    row: str,
    failure_mode: str | None = None,
    mast_category: str | None = None,
) -> Callable[[DetectorFunc], DetectorFunc]:
    """Register the decorated detector under ``name``.

    The registered callable returns exactly the documented columns in the documented order, so
    the documentation cannot drift from the output.
    """

    def decorate(func: DetectorFunc) -> DetectorFunc:
        def checked(
            conn: duckdb.DuckDBPyConnection, window: Window = Window(), filters: Filters = Filters()
        ) -> pd.DataFrame:
            frame = func(conn, window, filters)
            missing = [column for column in columns if column not in frame.columns]
            if missing:
                raise RuntimeError(f"detector {name} did not return documented columns {missing}")
            return frame.loc[:, list(columns)].reset_index(drop=True)

        checked.__name__ = func.__name__
        checked.__doc__ = func.__doc__
        METRICS[name] = Metric(
            name=name,
            func=checked,
            description=description,
            columns=dict(columns),
            row=row,
            failure_mode=failure_mode,
            mast_category=mast_category,
        )
        return checked

    return decorate


def list_metrics() -> list[Metric]:
    """All registered metrics, sorted by name."""
    return [METRICS[name] for name in sorted(METRICS)]


def run_metric(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    window: Window = Window(),
    filters: Filters = Filters(),
) -> pd.DataFrame:
    """Run the metric ``name`` over ``window`` and ``filters``.

    Raises ``KeyError`` naming the known metrics when ``name`` is not registered.
    """
    try:
        metric = METRICS[name]
    except KeyError:
        known = ", ".join(sorted(METRICS))
        raise KeyError(f"Unknown metric {name!r}; known metrics: {known}") from None
    logger.debug("running metric %s window=%s filters=%s", name, window, filters)
    ensure_readable(conn)
    return metric.func(conn, window, filters)
