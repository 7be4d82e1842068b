"""What the Overview page shows, computed from a ``FindingSet`` and per-run totals (no Streamlit).

Everything here is aggregated: the incident table lists the runs that need attention (failing
first, then those to review, then degraded) with each run's worst failure mode; a tile is a
failure mode's count, its runs and whether its findings took effect or were prevented.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from dashboard.findings import (
    REVIEW,
    FindingSet,
    MetricFindings,
    fails_runs,
    naming,
    row_statuses,
    short_title,
)

# The page of findings whose detector has no page of its own (url path).
FINDINGS_PAGE = "findings"


@dataclass(frozen=True)
class Tile:
    """One overview tile: a failure mode's count, the runs it touched, its state and its page."""

    metric: str
    title: str
    failure_mode: str
    mast_category: str
    page: str
    count: int
    runs: int
    state: str
    """``failing`` (a finding took effect), ``to review``, ``prevented`` (a guard or the agent
    caught every finding: refusals are the guards working) or ``clear`` (none)."""


# How each tile state is drawn: (delta text, colour).
TILE_STATES = {
    "failing": ("failing", "red"),
    "to review": ("to review", "orange"),
    "prevented": ("prevented", "gray"),
    "clear": ("clear", "green"),
}


def tile_state(metric: dict, found: MetricFindings | None) -> str:
    """The state of a failure mode's tile from its findings' statuses (``row_statuses``)."""
    if found is None or not found.count:
        return "clear"
    statuses = set(row_statuses(metric, found.frame.iloc[found.positions]))
    if "failure" in statuses:
        return "failing"
    return "to review" if REVIEW in statuses else "prevented"


def tile_for(metric: dict, found: MetricFindings | None) -> Tile:
    """The tile of one finding metric."""
    mode, category = naming(metric)
    return Tile(
        metric=metric["name"],
        title=short_title(metric),
        failure_mode=mode,
        mast_category=category,
        page=metric.get("page") or FINDINGS_PAGE,
        count=found.count if found is not None else 0,
        runs=int(len(found.distinct_runs)) if found is not None and found.count else 0,
        state=tile_state(metric, found),
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


def worst_first(summary: pd.DataFrame, include_healthy: bool = True) -> pd.DataFrame:
    """``run_summary`` rows failing first, then to review, degraded (and healthy), newest activity
    first within a verdict."""
    order = {**VERDICT_ORDER, "healthy": len(VERDICT_ORDER)} if include_healthy else VERDICT_ORDER
    frame = summary[summary["verdict"].isin(list(order))].copy()
    frame["_order"] = frame["verdict"].map(order)
    frame["_last"] = pd.to_datetime(frame["last_seen"], errors="coerce")
    frame = frame.sort_values(["_order", "_last"], ascending=[True, False], kind="stable")
    return frame.drop(columns=["_order", "_last"])


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
    frame = worst_first(summary, include_healthy)
    # Every failing run is listed, however many; the others up to ``limit`` rows in all.
    frame = frame.head(max(limit, int((frame["verdict"] == "failing").sum())))
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
