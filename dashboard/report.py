"""Drift reports: gather findings with evidence and thresholds once, render HTML, Markdown or JSON.

``build_report`` is what ``driftscope report`` and the dashboard's download buttons call. The JSON
form is documented in docs/reports.md; HTML and Markdown carry the same content for people.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

import pandas as pd

from analytics.types import Filters, Window
from dashboard.findings import (
    EVIDENCE_COLUMNS,
    MAST_CATEGORIES,
    Finding,
    collect_findings,
    evidence_frame,
    summarise,
)

logger = logging.getLogger(__name__)

SCHEMA = "driftscope.report"
SCHEMA_VERSION = 1
MAX_EVIDENCE_SPANS = 25
Format = Literal["html", "md", "json"]
FORMATS = ("html", "md", "json")


@dataclass
class ReportData:
    """Everything a report shows, gathered once from a data source."""

    generated_at: datetime
    source: str
    window: Window
    filters: Filters
    runs: pd.DataFrame
    findings: list[Finding]
    evidence: list[pd.DataFrame]
    frames: dict[str, pd.DataFrame]
    thresholds: pd.DataFrame
    errors: dict[str, str]

    @property
    def summary(self) -> pd.DataFrame:
        """Counts per failure mode."""
        return summarise(self.findings)


def gather_report(source, window: Window, filters: Filters, run: str | None = None) -> ReportData:
    """Read findings, their evidence spans, the runs and the thresholds through ``source``."""
    if run:
        filters = replace(filters, run=run)
    findings, frames, errors = collect_findings(source, window, filters)
    spans_by_run: dict[str, pd.DataFrame] = {}
    evidence = []
    for finding in findings:
        if finding.run_id and finding.run_id not in spans_by_run:
            try:
                spans_by_run[finding.run_id] = source.run_spans(finding.run_id)
            except Exception as exc:  # evidence is best effort; the finding itself still stands
                logger.warning("spans of run %s unavailable: %s", finding.run_id, exc)
                spans_by_run[finding.run_id] = pd.DataFrame()
        spans = spans_by_run.get(finding.run_id or "", pd.DataFrame())
        evidence.append(evidence_frame(spans, finding.span_ids[:MAX_EVIDENCE_SPANS]))
    try:
        thresholds = source.thresholds()
    except Exception as exc:
        logger.warning("thresholds unavailable: %s", exc)
        errors["thresholds"] = f"{type(exc).__name__}: {exc}"
        thresholds = pd.DataFrame(columns=["name", "value", "version", "method", "calibrated", "provenance"])
    return ReportData(
        generated_at=datetime.now(UTC).replace(tzinfo=None, microsecond=0),
        source=source.description,
        window=window,
        filters=filters,
        runs=source.runs(window, filters),
        findings=findings,
        evidence=evidence,
        frames=frames,
        thresholds=thresholds,
        errors=errors,
    )


def build_report(
    source, window: Window, filters: Filters, run: str | None = None, fmt: Format = "html"
) -> str | bytes:
    """The report for ``window``/``filters`` (or one ``run``) as HTML, Markdown or JSON text."""
    if fmt not in FORMATS:
        raise ValueError(f"Expected a report format among {', '.join(FORMATS)}, got {fmt!r}")
    data = gather_report(source, window, filters, run)
    return render_report(data, fmt)


def render_report(data: ReportData, fmt: Format) -> str:
    """Render gathered data in one format."""
    if fmt == "json":
        return render_json(data)
    from dashboard.report_render import render_html, render_markdown

    return render_html(data) if fmt == "html" else render_markdown(data)


def _iso(value) -> str | None:
    if value is None or (not isinstance(value, datetime) and pd.isna(value)):
        return None
    return pd.Timestamp(value).isoformat()


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str):
        return _jsonable(value.tolist())
    if isinstance(value, datetime | pd.Timestamp):
        return _iso(value)
    if isinstance(value, float) and pd.isna(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def provenance_object(text) -> object:
    """Threshold provenance (stored as JSON text) as an object; unparsable text stays a string."""
    if isinstance(text, dict):
        return text
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def report_document(data: ReportData) -> dict:
    """The report as a JSON-ready dict (schema in docs/reports.md)."""
    summary = data.summary
    by_category = {c: 0 for c in MAST_CATEGORIES}
    for finding in data.findings:
        by_category[finding.mast_category] = by_category.get(finding.mast_category, 0) + 1
    findings = []
    for index, (finding, evidence) in enumerate(zip(data.findings, data.evidence, strict=True), start=1):
        findings.append(
            {
                "id": f"F{index}",
                "metric": finding.metric,
                "failure_mode": finding.failure_mode,
                "mast_category": finding.mast_category,
                "run_id": finding.run_id,
                "trace_id": finding.trace_id,
                "agents": finding.agents,
                "first_seen": _iso(finding.first_seen),
                "last_seen": _iso(finding.last_seen),
                "span_ids": finding.span_ids,
                "details": finding.details,
                "evidence": [
                    {k: _jsonable(v) for k, v in row.items()}
                    for row in evidence[EVIDENCE_COLUMNS].to_dict("records")
                ],
            }
        )
    thresholds = [
        {
            "name": row["name"],
            "value": _jsonable(row["value"]),
            "version": _jsonable(row["version"]),
            "method": row["method"],
            "calibrated": bool(row["calibrated"]) if row["calibrated"] is not None else None,
            "provenance": provenance_object(row["provenance"]),
        }
        for row in data.thresholds.to_dict("records")
    ]
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "generated_at": _iso(data.generated_at),
        "source": data.source,
        "scope": {
            "since": _iso(data.window.since),
            "until": _iso(data.window.until),
            "service": data.filters.service,
            "agent": data.filters.agent,
            "run": data.filters.run,
            "origin_task": data.filters.origin_task,
        },
        "summary": {
            "runs": int(len(data.runs)),
            "findings": len(data.findings),
            "runs_with_findings": len({f.run_id for f in data.findings if f.run_id}),
            "by_mast_category": by_category,
            "by_failure_mode": [
                {k: _jsonable(v) for k, v in row.items()} for row in summary.to_dict("records")
            ],
        },
        "findings": findings,
        "thresholds": thresholds,
        "errors": data.errors,
    }


def render_json(data: ReportData) -> str:
    """JSON text; ``<``, ``>`` and ``&`` are written as ``\\u`` escapes so it is safe to embed."""
    text = json.dumps(_jsonable(report_document(data)), indent=2, ensure_ascii=False, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
