"""What the Overview page shows, computed from a ``FindingSet`` and per-run totals (no Streamlit).

Everything here is aggregated: the incident table lists the runs that need attention (failing
first, then those to review, then degraded) with each run's worst failure mode; a tile is a count
and twelve bucket counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd

from dashboard.findings import FindingSet, MetricFindings, fails_runs, naming, short_title

# The page of findings whose detector has no page of its own (url path).
FINDINGS_PAGE = "findings"


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
    has_times = found is not None and "first_seen" in found.frame.columns
    times = found.column("first_seen") if has_times else pd.Series(dtype="datetime64[ns]")
    count = found.count if found is not None else 0
    return Tile(
        metric=metric["name"],
        title=short_title(metric),
        failure_mode=mode,
        mast_category=category,
        page=metric.get("page") or FINDINGS_PAGE,
        count=count,
        breached=bool(count),
        trend=trend_counts(times),
    )


# The verdicts of run_summary that need a person, in the order the Overview lists them.
VERDICT_ORDER = {"failing": 0, "to review": 1, "degraded": 2}
INCIDENT_COLUMNS = ["verdict", "worst_failure_mode", "coverage", "last_span", "agents", "findings", "run_id"]
REVIEW_NOTE = "to review (threshold not calibrated)"


def severity_order(metrics: list[dict]) -> list[dict]:
    """Finding metrics worst first: those whose findings make a run failing, then the rest (each
    in the order given, the catalogue's)."""
    return sorted(metrics, key=lambda m: not fails_runs(m))


def worst_modes(found: FindingSet, run_ids: list[str]) -> dict[str, str]:
    """For each of ``run_ids`` with findings, the failure mode of its most severe detector."""
    wanted = set(run_ids)
    worst: dict[str, str] = {}
    for described in severity_order([m.metric for m in found.by_metric.values()]):
        metric = found.by_metric[described["name"]]
        if not metric.count:
            continue
        runs = metric.run_ids
        for run in pd.unique(runs[runs.isin(wanted)].astype(object)):
            worst.setdefault(str(run), naming(metric.metric)[0])
    return worst


def age_text(seconds: float | None) -> str:
    """``4 s ago``, ``3 min ago``, ``5 h ago``, ``12 d ago`` (``unknown`` when None)."""
    if seconds is None or pd.isna(seconds):
        return "unknown"
    seconds = max(float(seconds), 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def last_span_text(last_seen, now: datetime) -> str:
    """``2026-01-15 09:00:05 UTC (4 s ago)`` for a naive-UTC time."""
    if last_seen is None or pd.isna(last_seen):
        return "unknown"
    stamp = pd.Timestamp(last_seen)
    if stamp.tzinfo is not None:
        stamp = stamp.tz_convert("UTC").tz_localize(None)
    ago = (pd.Timestamp(now) - stamp).total_seconds()
    return f"{stamp.isoformat(sep=' ', timespec='seconds')} UTC ({age_text(ago)})"


def incident_runs(
    summary: pd.DataFrame, found: FindingSet, now: datetime, limit: int = 25, include_healthy: bool = False
) -> pd.DataFrame:
    """Runs that need a person (``INCIDENT_COLUMNS``): failing, then to review, then degraded
    (then healthy, with ``include_healthy``).

    ``summary`` is ``run_summary`` (verdict per run). Within a verdict the newest activity comes
    first. A run to review names its goal drift as ``to review (threshold not calibrated)``.
    """
    if summary is None or summary.empty:
        return pd.DataFrame(columns=INCIDENT_COLUMNS)
    order = {**VERDICT_ORDER, "healthy": len(VERDICT_ORDER)} if include_healthy else VERDICT_ORDER
    frame = summary[summary["verdict"].isin(list(order))].copy()
    frame["_order"] = frame["verdict"].map(order)
    frame["_last"] = pd.to_datetime(frame["last_seen"], errors="coerce")
    frame = frame.sort_values(["_order", "_last"], ascending=[True, False], kind="stable").head(limit)
    runs = [str(r) for r in frame["run_id"]]
    worst = worst_modes(found, runs)
    counts = found.run_counts()
    rows = []
    notes = frame["coverage"] if "coverage" in frame else pd.Series(None, index=frame.index, dtype=object)
    for run, verdict, last, agents, rejections, errors, note in zip(
        runs, frame["verdict"], frame["last_seen"], frame["agents"], frame["rejections"], frame["errors"], notes,
        strict=True,
    ):  # fmt: skip
        mode = worst.get(run)
        if verdict == "to review" and mode:
            mode = f"{mode} — {REVIEW_NOTE}"
        elif not mode:
            mode = "refused calls only" if rejections else "failed spans" if errors else ""
        rows.append(
            {
                "verdict": verdict,
                "worst_failure_mode": mode,
                "coverage": note if isinstance(note, str) else "",
                "last_span": last_span_text(last, now),
                "agents": [str(a) for a in (agents if agents is not None else [])],
                "findings": int(counts.get(run, 0)),
                "run_id": run,
            }
        )
    return pd.DataFrame(rows, columns=INCIDENT_COLUMNS)


def unmeasured_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """Runs whose telemetry left a detector blind (run_summary's ``coverage``), whatever their
    verdict: a "healthy" run here is healthy as far as the detectors could see. Columns
    ``verdict``, ``coverage``, ``run_id``."""
    columns = ["verdict", "coverage", "run_id"]
    if summary is None or summary.empty or "coverage" not in summary:
        return pd.DataFrame(columns=columns)
    blind = summary[summary["coverage"].notna() & (summary["coverage"] != "")]
    return blind[columns].reset_index(drop=True)


def verdict_counts(summary: pd.DataFrame) -> dict[str, int]:
    """Runs per verdict (failing, to review, degraded, healthy; all present)."""
    counts = {v: 0 for v in (*VERDICT_ORDER, "healthy")}
    if summary is not None and not summary.empty:
        for verdict, n in summary["verdict"].value_counts().items():
            counts[str(verdict)] = int(n)
    return counts


def newest_span(totals: pd.DataFrame):
    """The newest span time among the runs in scope (None without runs)."""
    if totals is None or totals.empty:
        return None
    newest = pd.to_datetime(totals["last_seen"], errors="coerce").max()
    return None if pd.isna(newest) else newest
