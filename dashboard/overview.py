"""What the Overview page shows, computed from a ``FindingSet`` and per-run totals (no Streamlit).

Everything here is aggregated: a tile is a count and twelve bucket counts, the worst-runs table is
the top few runs of a ranking over every run in scope.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dashboard.findings import FAILURE_MODES, FindingSet, MetricFindings, naming, short_title

WORST_RUN_COLUMNS = ["run_id", "findings", "failure_modes", "rejected", "errors", "agents", "last_seen"]


@dataclass(frozen=True)
class Tile:
    """One overview tile: a failure mode's count, trend and whether its threshold is breached."""

    metric: str
    title: str
    failure_mode: str
    mast_category: str
    page: str
    count: int
    breached: bool
    trend: list[int]


def trend_counts(times: pd.Series, buckets: int = 12) -> list[int]:
    """Counts of ``times`` in ``buckets`` equal slices of their range (all in one if one instant)."""
    times = pd.to_datetime(times, errors="coerce").dropna()
    if times.empty:
        return [0] * buckets
    values = times.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    start, end = values.min(), values.max()
    if start == end:
        return [0] * (buckets - 1) + [len(values)]
    counts, _ = np.histogram(values, bins=buckets, range=(start, end))
    return [int(c) for c in counts]


def tile_for(metric: dict, found: MetricFindings | None) -> Tile:
    """The tile of one finding metric (a count-based mode is breached when any finding exists)."""
    mode, category = naming(metric)
    fallback = FAILURE_MODES.get(metric["name"])
    has_times = found is not None and "first_seen" in found.frame.columns
    times = found.column("first_seen") if has_times else pd.Series(dtype="datetime64[ns]")
    count = found.count if found is not None else 0
    return Tile(
        metric=metric["name"],
        title=short_title(metric["name"]),
        failure_mode=mode,
        mast_category=category,
        page=fallback.page if fallback else "overview",
        count=count,
        breached=bool(count),
        trend=trend_counts(times),
    )


def worst_runs(totals: pd.DataFrame, found: FindingSet, limit: int = 10) -> pd.DataFrame:
    """Runs ranked by findings, then rejections and errors (newest first on ties).

    ``totals`` is every run in scope (``run_totals``, newest first). Runs without findings,
    rejections or errors are left out. The ``agents`` column is empty; ``with_agents`` fills it
    for the few runs shown.
    """
    if totals is None or totals.empty:
        return pd.DataFrame(columns=WORST_RUN_COLUMNS)
    counts = found.run_counts()
    frame = totals.copy()
    frame["findings"] = counts.reindex(frame["run_id"].astype(object)).fillna(0).astype(int).to_numpy()
    frame = frame[(frame["findings"] > 0) | (frame["rejected"] > 0) | (frame["errors"] > 0)]
    frame = frame.sort_values(["findings", "rejected", "errors"], ascending=False, kind="stable")
    frame = frame.head(limit).reset_index(drop=True)
    modes = found.failure_modes([str(r) for r in frame["run_id"]])
    frame["failure_modes"] = [modes.get(str(r), []) for r in frame["run_id"]]
    frame["agents"] = [[] for _ in range(len(frame))]
    return frame[WORST_RUN_COLUMNS]


def with_agents(ranked: pd.DataFrame, details: pd.DataFrame) -> pd.DataFrame:
    """``ranked`` with each run's agents taken from ``details`` (``runs`` columns)."""
    if ranked.empty or details is None or details.empty:
        return ranked
    agents = dict(zip(details["run_id"], details["agents"], strict=True))
    ranked = ranked.copy()
    ranked["agents"] = [list(agents.get(r, [])) for r in ranked["run_id"]]
    return ranked
