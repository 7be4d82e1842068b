"""Finding counts a run of a crew may have without failing, calibrated per crew.

``driftscope calibrate --allow-findings`` on a baseline window that holds findings stores, for
each crew (service) with enough baseline runs, ``count_per_run:<detector>:<service>``: the
baseline's quantile of that detector's findings per run. ``run_summary`` compares each run's
count with its own crew's limit; a crew without one keeps 0 (any finding counts). A limit is
never global: false findings in one crew's baseline must not switch a detector off for every
other crew. A global ``count_per_run:<detector>`` stored by an older version still applies, to the
runs of crews without a limit of their own.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from analytics.engine import fetch_rows
from analytics.sql_loader import load_sql, query_df

PREFIX = "count_per_run"


def count_threshold_name(detector: str, service: str | None = None) -> str:
    """The threshold name of ``detector``'s finding count per run (of crew ``service``)."""
    return f"{PREFIX}:{detector}" if service is None else f"{PREFIX}:{detector}:{service}"


def stored_count_limits(conn: duckdb.DuckDBPyConnection) -> dict[tuple[str, str | None], float]:
    """Newest stored count limits: (detector, service or None for a legacy global one) -> value."""
    rows = fetch_rows(
        conn,
        "SELECT name, arg_max(value, version) FROM thresholds WHERE name LIKE $prefix GROUP BY name",
        {"prefix": f"{PREFIX}:%"},
    )
    limits: dict[tuple[str, str | None], float] = {}
    for name, value in rows:
        _, detector, *service = name.split(":", 2)
        limits[(detector, service[0] if service else None)] = float(value)
    return limits


def run_services(conn: duckdb.DuckDBPyConnection, runs: pd.Index | pd.Series) -> pd.Series:
    """The crew (service of the first span) of each run in ``runs``, a Series on ``runs``."""
    runs = pd.Index(runs)
    if not len(runs):
        return pd.Series(None, index=runs, dtype=object)
    found = query_df(conn, load_sql("run_services"), {"run_list": [str(run) for run in runs]})
    return found.set_index("run_id")["service"].reindex(runs)


def count_limits(conn: duckdb.DuckDBPyConnection, runs: pd.Index) -> dict[str, pd.Series]:
    """Per detector with a stored limit: the findings each run of ``runs`` may have (its crew's
    limit, else a legacy global one, else 0), a Series on ``runs``."""
    limits = stored_count_limits(conn)
    if not limits:
        return {}
    if any(service is not None for _, service in limits):
        services = run_services(conn, runs)
    else:
        services = pd.Series(None, index=runs, dtype=object)
    out = {}
    for detector in {detector for detector, _ in limits}:
        fallback = limits.get((detector, None), 0.0)
        own = {service: value for (name, service), value in limits.items() if name == detector and service}
        out[detector] = services.map(own).fillna(fallback).astype("float64")
    return out
