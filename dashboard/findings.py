"""Findings: detector rows turned into named failures with evidence, shared by pages and reports.

Pure functions over DataFrames plus one collector (``collect_findings``) that reads through a
data source. The failure-mode name and MAST category come from the analytics registry; the table
below only supplies the page each metric lives on and a fallback when a remote API omits them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd

from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

MAST_CATEGORIES = ("specification", "inter-agent misalignment", "task verification")


@dataclass(frozen=True)
class FailureMode:
    """Where a detector's findings are shown and how they are named when the registry is silent."""

    metric: str
    title: str
    mast_category: str
    page: str


FAILURE_MODES: dict[str, FailureMode] = {
    m.metric: m
    for m in (
        FailureMode(
            "divergent_reads", "divergent reads (split-brain)", "inter-agent misalignment", "split_brain"
        ),
        FailureMode("lost_updates", "lost updates (split-brain)", "inter-agent misalignment", "split_brain"),
        FailureMode(
            "rejection_rates", "rejection rate over threshold", "inter-agent misalignment", "rejections"
        ),
        FailureMode(
            "constraint_drops", "constraint dropped on delegation", "inter-agent misalignment", "constraints"
        ),
        FailureMode(
            "goal_divergence", "goal drift along delegation", "inter-agent misalignment", "goal_drift"
        ),
        FailureMode(
            "context_drift_holders",
            "acting on a superseded objective",
            "inter-agent misalignment",
            "context_drift",
        ),
        FailureMode(
            "stale_policy_sends",
            "send against a superseded policy",
            "inter-agent misalignment",
            "context_drift",
        ),
        FailureMode("repeated_calls", "repeated tool calls (loop)", "specification", "loops"),
        FailureMode("ping_pong", "ping-pong between agents", "inter-agent misalignment", "loops"),
        FailureMode("budget_exhaustion", "step budget exhausted", "specification", "loops"),
        FailureMode("duplicate_side_effects", "duplicate side effect", "task verification", "loops"),
    )
}
# Registered metrics that describe state rather than list failures (the ledger matrix is the
# context of constraint_drops; coverage and summaries are tables, not findings).
NOT_FINDINGS = frozenset({"constraint_ledger", "enforcement_coverage", "run_summary"})


def mast_category(text: str | None) -> str:
    """One of the three MAST categories for the registry's wording ("specification issues" ...)."""
    lowered = (text or "").lower()
    if lowered.startswith("spec"):
        return "specification"
    if "inter" in lowered or "misalign" in lowered:
        return "inter-agent misalignment"
    if "verif" in lowered or "termination" in lowered:
        return "task verification"
    return lowered or "unclassified"


# Detectors whose rows include non-failures, and the boolean column that marks the failures: a
# bucket under the threshold, a subtask close to its goal, a stale send a guard refused.
FLAG_COLUMNS = {
    "rejection_rates": "over_threshold",
    "goal_divergence": "drifted",
    "stale_policy_sends": "allowed",
}
_EVIDENCE = ("run_id", "trace_id", "span_ids", "agents", "agent", "first_seen", "last_seen")


@dataclass
class Finding:
    """One detector row that is a coordination failure, with its evidence."""

    metric: str
    failure_mode: str
    mast_category: str
    run_id: str | None
    trace_id: str | None
    span_ids: list[str]
    agents: list[str]
    first_seen: datetime | None
    last_seen: datetime | None
    details: dict[str, str] = field(default_factory=dict)


def finding_metrics(metrics: list[dict]) -> list[dict]:
    """The metrics whose rows are findings (those naming a failure mode), in catalogue order."""
    by_name = {m["name"]: m for m in metrics if m["name"] not in NOT_FINDINGS}
    ordered = [by_name[name] for name in FAILURE_MODES if name in by_name]
    extra = [m for m in by_name.values() if m.get("failure_mode") and m["name"] not in FAILURE_MODES]
    return [m for m in ordered if m.get("failure_mode", True)] + extra


def short_title(name: str) -> str:
    """A short label for a detector's failure mode (tiles and chart axes)."""
    fallback = FAILURE_MODES.get(name)
    return fallback.title if fallback else name.replace("_", " ")


def naming(metric: dict) -> tuple[str, str]:
    """(failure mode, MAST category) for a metric description, registry first."""
    fallback = FAILURE_MODES.get(metric["name"])
    mode = metric.get("failure_mode") or (fallback.title if fallback else metric["name"])
    category = metric.get("mast_category") or (fallback.mast_category if fallback else None)
    return mode, mast_category(category)


def finding_rows(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows of a detector frame that are findings (all, unless the metric has a flag column)."""
    column = FLAG_COLUMNS.get(metric)
    if column and column in frame.columns:
        return frame[frame[column].fillna(False).astype(bool)]
    return frame


def as_list(value) -> list[str]:
    """A list-ish cell (list, numpy array, None, scalar) as a list of strings."""
    if value is None:
        return []
    if isinstance(value, list | tuple | np.ndarray | pd.Series):
        return [str(v) for v in value if v is not None]
    if isinstance(value, float) and np.isnan(value):
        return []
    return [str(value)]


def _time(value) -> datetime | None:
    if value is None or (not isinstance(value, datetime) and pd.isna(value)):
        return None
    stamp = pd.Timestamp(value)
    if stamp.tzinfo is not None:
        stamp = stamp.tz_convert("UTC").tz_localize(None)
    return stamp.to_pydatetime()


def cell_text(value) -> str:
    """A cell as plain text for details (lists joined, floats rounded, NaN empty)."""
    if isinstance(value, list | tuple | np.ndarray):
        return ", ".join(str(v) for v in value)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, pd.Timestamp | datetime):
        return _time(value).isoformat(sep=" ", timespec="milliseconds")
    return str(value)


def findings_from_frame(metric: dict, frame: pd.DataFrame) -> list[Finding]:
    """Turn a detector frame into findings named by failure mode and MAST category."""
    mode, category = naming(metric)
    out = []
    for record in finding_rows(frame, metric["name"]).to_dict("records"):
        agents = as_list(record.get("agents")) or as_list(record.get("agent"))
        details = {k: cell_text(v) for k, v in record.items() if k not in _EVIDENCE}
        run_id = _opt_str(record.get("run_id"))
        runs = as_list(record.get("run_ids"))
        if run_id is None and len(runs) == 1:  # a per-bucket row that involves a single run
            run_id = runs[0]
        out.append(
            Finding(
                metric=metric["name"],
                failure_mode=mode,
                mast_category=category,
                run_id=run_id,
                trace_id=_opt_str(record.get("trace_id")),
                span_ids=as_list(record.get("span_ids")),
                agents=agents,
                first_seen=_time(record.get("first_seen")),
                last_seen=_time(record.get("last_seen")),
                details=details,
            )
        )
    return out


def _opt_str(value) -> str | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    return str(value)


def collect_findings(
    source, window: Window, filters: Filters
) -> tuple[list[Finding], dict[str, pd.DataFrame], dict[str, str]]:
    """Run every finding metric: (findings, frames by metric, errors by metric).

    A detector that fails is reported in ``errors`` (its message) rather than aborting the rest.
    """
    findings: list[Finding] = []
    frames: dict[str, pd.DataFrame] = {}
    errors: dict[str, str] = {}
    for metric in finding_metrics(source.list_metrics()):
        name = metric["name"]
        try:
            frame = source.metric(name, window, filters)
        except Exception as exc:  # one broken detector must not hide the others' findings
            logger.warning("metric %s failed: %s", name, exc)
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        frames[name] = frame
        findings.extend(findings_from_frame(metric, frame))
    return findings, frames, errors


def summarise(findings: list[Finding]) -> pd.DataFrame:
    """Counts per failure mode and MAST category, with the runs affected."""
    rows = [
        {
            "metric": f.metric,
            "failure_mode": f.failure_mode,
            "mast_category": f.mast_category,
            "run_id": f.run_id,
        }
        for f in findings
    ]
    frame = pd.DataFrame(rows, columns=["metric", "failure_mode", "mast_category", "run_id"])
    if frame.empty:
        return pd.DataFrame(columns=["metric", "failure_mode", "mast_category", "findings", "runs"])
    return (
        frame.groupby(["metric", "failure_mode", "mast_category"], sort=False)
        .agg(findings=("metric", "size"), runs=("run_id", "nunique"))
        .reset_index()
    )


TEXT_COLUMNS = (
    "goal_root",
    "goal_text",
    "tool_args",
    "tool_result",
    "input_text",
    "output_text",
    "status_message",
)
EVIDENCE_COLUMNS = [
    "span_id",
    "trace_id",
    "timestamp",
    "span_name",
    "agent",
    "tool",
    "op",
    "outcome",
    "reject_reason",
    "status",
    "text",
]


def evidence_frame(spans: pd.DataFrame, span_ids: list[str], max_text: int = 400) -> pd.DataFrame:
    """The evidence spans of a finding as a small table (text unescaped; renderers escape it)."""
    if spans.empty or not span_ids:
        return pd.DataFrame(columns=EVIDENCE_COLUMNS)
    chosen = spans[spans["span_id"].isin(span_ids)]
    rows = []
    for record in chosen.to_dict("records"):
        texts = [str(record[c]) for c in TEXT_COLUMNS if c in record and _present(record[c])]
        text = " | ".join(texts)
        rows.append(
            {
                "span_id": record.get("span_id"),
                "trace_id": record.get("trace_id"),
                "timestamp": _time(record.get("Timestamp")),
                "span_name": record.get("span_name"),
                "agent": record.get("agent_id"),
                "tool": record.get("tool_name"),
                "op": record.get("op"),
                "outcome": record.get("outcome"),
                "reject_reason": record.get("reject_reason"),
                "status": record.get("status_code"),
                "text": text[:max_text] + ("…" if len(text) > max_text else ""),
            }
        )
    return pd.DataFrame(rows, columns=EVIDENCE_COLUMNS)


def _present(value) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and np.isnan(value):
        return False
    return str(value) != ""


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
    start, end = times.min(), times.max()
    if start == end:
        return [0] * (buckets - 1) + [len(times)]
    edges = pd.date_range(start, end, periods=buckets + 1)
    counts = pd.cut(times, bins=edges, include_lowest=True).value_counts(sort=False)
    return [int(c) for c in counts.to_numpy()]


def tile_for(metric: dict, frame: pd.DataFrame | None) -> Tile:
    """The tile of one finding metric (a count-based mode is breached when any finding exists)."""
    mode, category = naming(metric)
    fallback = FAILURE_MODES.get(metric["name"])
    rows = finding_rows(frame, metric["name"]) if frame is not None else pd.DataFrame()
    times = rows["first_seen"] if "first_seen" in rows.columns else pd.Series(dtype="datetime64[ns]")
    return Tile(
        metric=metric["name"],
        title=short_title(metric["name"]),
        failure_mode=mode,
        mast_category=category,
        page=fallback.page if fallback else "overview",
        count=int(len(rows)),
        breached=bool(len(rows)),
        trend=trend_counts(times),
    )


def worst_runs(runs: pd.DataFrame, findings: list[Finding], limit: int = 10) -> pd.DataFrame:
    """Runs ranked by findings, then rejections and errors; with the failure modes seen in each."""
    columns = ["run_id", "findings", "failure_modes", "rejected", "errors", "agents", "last_seen"]
    if runs is None or runs.empty:
        return pd.DataFrame(columns=columns)
    per_run: dict[str, list[str]] = {}
    for finding in findings:
        if finding.run_id:
            per_run.setdefault(finding.run_id, []).append(finding.failure_mode)
    frame = runs.copy()
    frame["findings"] = frame["run_id"].map(lambda r: len(per_run.get(r, [])))
    frame["failure_modes"] = frame["run_id"].map(lambda r: sorted(set(per_run.get(r, []))))
    frame = frame.sort_values(["findings", "rejected", "errors"], ascending=False, kind="stable")
    frame = frame[(frame["findings"] > 0) | (frame["rejected"] > 0) | (frame["errors"] > 0)]
    return frame[columns].head(limit).reset_index(drop=True)


def run_failures(findings: list[Finding]) -> tuple[set[str], set[str]]:
    """(evidence span ids, agents involved) of a run's findings, for highlighting."""
    spans = {s for f in findings for s in f.span_ids}
    agents = {a for f in findings for a in f.agents}
    return spans, agents


def findings_frame(findings: list[Finding]) -> pd.DataFrame:
    """Findings as a table: failure mode, MAST category, run, agents, time, detail summary."""
    rows = [
        {
            "failure_mode": f.failure_mode,
            "mast_category": f.mast_category,
            "run_id": f.run_id,
            "agents": f.agents,
            "first_seen": f.first_seen,
            "details": "; ".join(f"{k}={v}" for k, v in f.details.items() if v)[:300],
        }
        for f in findings
    ]
    return pd.DataFrame(
        rows, columns=["failure_mode", "mast_category", "run_id", "agents", "first_seen", "details"]
    )
