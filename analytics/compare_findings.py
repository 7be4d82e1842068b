"""Detector findings as evidence of where a run departs from its baseline (issue 35).

A step (``compare_logic``) leaves out argument values, so a failure that lives in a span's
contents (a hand-off that dropped a constraint, a subtask that drifted from its goal, a reply
sent under a superseded policy) takes the same step a healthy run takes there. The detectors see
those contents. A finding of a detector whose every finding is a failure that took effect
(registry ``failing``; only its rows whose ``flag_column`` is true, and not those its
``failing_unless`` clears; those over a threshold still at its uncalibrated default too, marked
for review: a run with one is not healthy either) names spans where the run went wrong. When
the baseline never has a finding of that detector and the finding names one span of the run,
that span is a point where the run departs from the baseline: its step is a healthy one, its
contents are not.
``compare.compare_run`` takes the earlier of the earliest such span and the first step no
baseline run takes (``earliest``), and lists every finding among the differences (kind
``finding``). A finding over several spans (a loop, a ping-pong, a duplicate send) is about their
repetition or order, which the steps already see; its first span is one a healthy run takes too
(the first of the repeats), so it does not place the departure.

What the baseline has: healthy runs (``baseline=auto``) carry no finding that took effect, by
``run_summary``'s verdict, except for counted detectors under a crew's calibrated count, read from
``run_summary``'s ``<name>_count`` (``baseline_detectors``); a chosen run's are its own findings
(so a run compared with itself has none that differ).
"""

from __future__ import annotations

import logging
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analytics import compare_logic as logic
from analytics.registry import Metric, finding_metrics, run_metric
from analytics.types import Filters, Window

logger = logging.getLogger(__name__)

FINDING_COLUMNS = ["metric", "title", "failure_mode", "pos", "span_ids", "review"]


def evidence_metrics() -> list[Metric]:
    """The finding metrics whose every (flagged) finding is a failure that took effect and names
    its run and spans."""
    return [m for m in finding_metrics() if m.failing and {"run_id", "span_ids"} <= set(m.columns)]


def count_columns(summary_columns: list[str] | set[str]) -> dict[str, str]:
    """Per counted evidence metric, its ``run_summary`` count column (a healthy run may carry
    findings of it up to its crew's calibrated count)."""
    return {
        m.name: f"{m.name}_count"
        for m in evidence_metrics()
        if m.counted and f"{m.name}_count" in summary_columns
    }


def baseline_detectors(healthy: pd.DataFrame) -> set[str]:
    """The evidence metrics some of the ``healthy`` run_summary rows have findings of (the
    counted ones under a calibrated count; none of the others by the verdict's definition)."""
    return {
        name
        for name, column in count_columns(list(healthy.columns)).items()
        if len(healthy) and (healthy[column].fillna(0) > 0).any()
    }


def _took_effect(metric: Metric, frame: pd.DataFrame) -> pd.Series:
    keep = pd.Series(True, index=frame.index)
    if metric.flag_column:
        keep &= frame[metric.flag_column].eq(True).fillna(False).astype(bool)
    if metric.failing_unless:
        keep &= ~frame[metric.failing_unless].eq(True).fillna(False).astype(bool)
    return keep


def run_findings(
    conn: duckdb.DuckDBPyConnection, run_id: str, steps: pd.DataFrame, verdict: str | None = None
) -> pd.DataFrame:
    """The run's findings that took effect (``evidence_metrics``), one row each: metric, title,
    failure mode, ``pos`` (the earliest of its spans in ``steps``, the run's ``compare_steps.sql``
    rows), ``span_ids`` (those of its spans in the run, in the run's order) and ``review`` (over
    a threshold still at its uncalibrated default: a finding for a person to review, which also
    keeps a run from being healthy). Findings naming no span of the run are left out. A run
    whose ``verdict`` is healthy has none (none read)."""
    rows: list[dict[str, Any]] = []
    if verdict == "healthy":
        return pd.DataFrame(rows, columns=FINDING_COLUMNS)
    pos_of = dict(zip(steps["span_id"].astype(str), steps["pos"].astype(int), strict=True))
    for metric in evidence_metrics():
        flags = (metric.flag_column, metric.failing_unless, metric.review_unless)
        wanted = ["run_id", "span_ids", *dict.fromkeys(c for c in flags if c)]
        frame = run_metric(conn, metric.name, Window(), Filters(run=run_id), wanted)
        frame = frame[(frame["run_id"] == run_id) & _took_effect(metric, frame)]
        review = (
            ~frame[metric.review_unless].eq(True).fillna(False).astype(bool)
            if metric.review_unless
            else pd.Series(False, index=frame.index)
        )
        for spans, to_review in zip(frame["span_ids"], review, strict=True):
            mine = sorted({str(s) for s in _listed(spans) if str(s) in pos_of}, key=pos_of.__getitem__)
            if mine:
                rows.append({
                    "metric": metric.name, "title": metric.title or metric.name,
                    "failure_mode": metric.failure_mode or "", "pos": pos_of[mine[0]], "span_ids": mine,
                    "review": bool(to_review),
                })  # fmt: skip
    found = pd.DataFrame(rows, columns=FINDING_COLUMNS)
    return found.sort_values(["pos", "metric"], kind="stable").reset_index(drop=True)


def _listed(value: Any) -> list:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    return list(value)


def earliest(
    found: dict[str, Any] | None, findings: pd.DataFrame, steps: pd.DataFrame, baseline_runs: int
) -> dict[str, Any] | None:
    """The first point of departure: the step departure ``found`` (``compare.departure``), or
    the earliest span of the ``findings`` that name one span (``run_findings`` of detectors the
    baseline never has) when that comes first. The answer says which (``evidence``: 'step' or 'finding'; a finding names
    its ``metric``), and a finding's departure keeps the step departure beside it
    (``step_departure``: its pos, span and step, or None)."""
    if found is not None:
        found = {**found, "evidence": "step"}
    single = findings[[len(ids) == 1 for ids in findings["span_ids"]]]
    if single.empty or (found is not None and int(single["pos"].iloc[0]) >= found["pos"]):
        return found
    first = single.iloc[0]
    row = steps[steps["pos"] == int(first["pos"])].iloc[0]
    fields = logic.step_fields(row)
    step = fields["step"]
    return {
        **fields,
        # Before the step departure, the runs that cover the run furthest take this same step
        # here: what differs is in its contents, which the detector reads.
        "reason": f"the {first['metric']} detector finds {first['title'].lower()} here"
        + (" (to review: its threshold is the uncalibrated default)" if first["review"] else "")
        + ", which no baseline run has (healthy runs take this same step here; its contents differ)",
        "expected": [step],
        "covered_by": found["covered_by"] if found is not None else baseline_runs,
        "evidence": "finding",
        "metric": str(first["metric"]),
        "step_departure": None
        if found is None
        else {k: found[k] for k in ("pos", "span_id", "step", "reason")},
    }


def finding_differences(findings: pd.DataFrame, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """One difference (kind ``finding``) per detector and agent, tool of its findings' first
    spans: how many findings, the detector's title, and their spans (``MAX_DIFFERENCE_SPANS``
    at most)."""
    if findings.empty:
        return []
    by_pos = steps.set_index("pos")
    out: list[dict[str, Any]] = []
    keyed = findings.assign(
        **{f: [by_pos.at[int(p), f] for p in findings["pos"]] for f in logic.SUBJECT_FIELDS}
    )
    for (metric, agent, operation, tool), group in keyed.groupby(
        ["metric", *logic.SUBJECT_FIELDS], sort=False
    ):
        spans = list(dict.fromkeys(s for ids in group["span_ids"] for s in ids))
        title = str(group["title"].iloc[0])
        review = " to review (uncalibrated threshold)" if group["review"].all() else ""
        out.append({
            "agent": agent, "operation": operation, "tool": tool, "calls": len(spans), "kind": "finding",
            "baseline": "never",
            "detail": f"{len(group)} {metric} finding(s){review} ({title.lower()}); no baseline run has one",
            "span_ids": spans[: logic.MAX_DIFFERENCE_SPANS],
        })  # fmt: skip
    return out
