"""Drift reports: gather findings with evidence and thresholds once, render HTML, Markdown or JSON.

``build_report`` is what ``driftscope report`` and the dashboard's download buttons call. The
gathered data and its JSON form live in ``report_document`` (documented in docs/reports.md); HTML
and Markdown (``report_render``) carry the same content for people. Imports go one way:
report -> report_render -> report_document.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Literal

import pandas as pd

from analytics.read import MAX_CONTAINING, MAX_CONTAINING_CHARS
from analytics.types import Filters, Window
from dashboard.evidence import (
    MAX_EVIDENCE_SPANS,
    EvidenceIndex,
    evidence_keys,
    evidence_table,
)
from dashboard.findings import Finding, FindingSet, gather_findings, order_by_run_and_severity
from dashboard.report_document import ReportData, render_json
from dashboard.report_render import render_html, render_markdown

logger = logging.getLogger(__name__)

Format = Literal["html", "md", "json"]
FORMATS = ("html", "md", "json")
# Findings listed in full (with evidence) per failure mode; the rest are counted, not listed.
# JSON lists every finding unless asked otherwise: it is the way to get them all.
LISTED_PER_MODE = {"html": 20, "md": 20, "json": None}
RUNS_LISTED = 50
# Runs whose spans are read to find the text of dropped constraints (one read per run).
CONSTRAINT_TEXT_RUNS = 20


def gather_report(
    source,
    window: Window,
    filters: Filters,
    run: str | None = None,
    max_findings: int | None = None,
    found: FindingSet | None = None,
) -> ReportData:
    """Read findings, their evidence spans, the runs and the thresholds through ``source``.

    Every detector runs once (or not at all when ``found`` is given, e.g. the dashboard's cached
    findings). Evidence is read in one request for the listed findings only.
    """
    if run:
        filters = replace(filters, run=run)
    if found is None:
        found = gather_findings(source, window, filters)
    errors = dict(found.errors)
    listed = [f for metric in found.by_metric.values() for f in metric.findings(max_findings)]
    add_constraint_texts(source, listed, errors)
    # Grouped by run, worst first: the order an incident review reads them (and the run explorer
    # lists them), numbered in that order.
    listed = [listed[i] for i in order_by_run_and_severity(listed)]
    ids = [f"F{i}" for i in range(1, len(listed) + 1)]
    try:
        verdicts = source.metric("run_summary", window, filters)
    except Exception as exc:  # the findings stand without the per-run verdicts
        logger.warning("run summary unavailable: %s", exc)
        errors["run_summary"] = f"{type(exc).__name__}: {exc}"
        verdicts = None
    try:
        spans = source.evidence_spans(evidence_keys(listed, MAX_EVIDENCE_SPANS))
    except Exception as exc:  # evidence is best effort; the findings themselves still stand
        logger.warning("evidence spans unavailable: %s", exc)
        errors["evidence"] = f"{type(exc).__name__}: {exc}"
        spans = None
    index = EvidenceIndex(evidence_table(spans))
    evidence = [index.rows(f, MAX_EVIDENCE_SPANS) for f in listed]
    try:
        thresholds = source.thresholds()
    except Exception as exc:
        logger.warning("thresholds unavailable: %s", exc)
        errors["thresholds"] = f"{type(exc).__name__}: {exc}"
        thresholds = pd.DataFrame(columns=["name", "value", "version", "method", "calibrated", "provenance"])
    alerts = gather_alerts(source, window, filters, errors)
    comparison = gather_comparison(source, run, window, errors) if run else None
    totals = source.run_totals(window, filters)
    newest = [str(r) for r in totals["run_id"].head(RUNS_LISTED)]
    runs = source.run_details(window, filters, newest) if newest else pd.DataFrame()
    return ReportData(
        generated_at=datetime.now(UTC).replace(tzinfo=None, microsecond=0),
        source=source.description,
        window=window,
        filters=filters,
        found=found,
        listed=listed,
        ids=ids,
        evidence=evidence,
        max_findings=max_findings,
        run_count=int(len(totals)),
        runs=runs,
        thresholds=thresholds,
        errors=errors,
        verdicts=verdicts,
        alerts=alerts,
        comparison=comparison,
    )


def gather_comparison(source, run: str, window: Window, errors: dict[str, str]) -> dict | None:
    """The run beside its crew's healthy runs in the window (issue 35); None (and the reason in
    ``errors``) when the source cannot answer: the report stands without it."""
    try:
        return source.compare(run, "auto", window)
    except Exception as exc:
        logger.warning("run comparison unavailable: %s", exc)
        errors["compare"] = f"{type(exc).__name__}: {exc}"
        return None


def gather_alerts(source, window: Window, filters: Filters, errors: dict[str, str]) -> pd.DataFrame | None:
    """The alert episodes of the window (of the run, when the report is about one); None when the
    source has no alerts to give (issue 18)."""
    if not hasattr(source, "alerts"):
        return None
    try:
        alerts = source.alerts(window)
    except Exception as exc:  # the findings stand without the alerts
        logger.warning("alerts unavailable: %s", exc)
        errors["alerts"] = f"{type(exc).__name__}: {exc}"
        return None
    if filters.run:
        alerts = alerts[alerts["run_id"] == filters.run]
    return alerts.reset_index(drop=True)


def constraint_texts(spans: pd.DataFrame, ids: set[str]) -> dict[str, str]:
    """The text of each constraint id as the run's spans state it: a guard's ledger
    (``{"id": "C2", "text": "..."}`` in tool arguments) or a free-text context (``[C2] ...;``)."""
    found: dict[str, str] = {}
    columns = [c for c in ("tool_args", "input_text", "goal_text") if c in spans.columns]
    texts = [str(v) for c in columns for v in spans[c].dropna().tolist()]
    for cid in ids:
        quoted = re.escape(cid)
        patterns = (
            rf'"id"\s*:\s*"{quoted}"\s*,\s*"text"\s*:\s*"((?:[^"\\]|\\.)*)"',
            rf'"text"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"id"\s*:\s*"{quoted}"',
            rf"\[{quoted}\]\s*([^;\[\]\n\"]+)",
        )
        for text in texts:
            match = next((m for m in (re.search(p, text) for p in patterns) if m), None)
            if match:
                found[cid] = match.group(1).strip()
                break
    return found


def mentioning(ids: set[str]) -> list[str] | None:
    """The ids as a ``run_spans`` text filter (only the spans that mention one: a long run holds
    100,000 spans), or None (every span) where they are too many or too long for one."""
    texts = sorted(ids)
    if 0 < len(texts) <= MAX_CONTAINING and all(0 < len(t) <= MAX_CONTAINING_CHARS for t in texts):
        return texts
    return None


def add_constraint_texts(source, findings: list[Finding], errors: dict[str, str]) -> None:
    """Put each dropped constraint's text beside its id (``details["constraint_text"]``)."""
    drops = [
        f for f in findings if f.metric == "constraint_drops" and f.run_id and f.details.get("constraint_id")
    ]
    runs = list(dict.fromkeys(f.run_id for f in drops))[:CONSTRAINT_TEXT_RUNS]
    for run in runs:
        wanted = [f for f in drops if f.run_id == run]
        try:
            ids = {f.details["constraint_id"] for f in wanted}
            texts = constraint_texts(source.run_spans(run, containing=mentioning(ids)), ids)
        except Exception as exc:  # the ids stand without their text
            logger.warning("constraint texts of run %s unavailable: %s", run, exc)
            errors.setdefault("constraint_text", f"{type(exc).__name__}: {exc}")
            continue
        for finding in wanted:
            text = texts.get(finding.details["constraint_id"])
            if text:
                finding.details = {**finding.details, "constraint_text": text}


def build_report(
    source,
    window: Window,
    filters: Filters,
    run: str | None = None,
    fmt: Format = "html",
    max_findings: int | None | Literal["default"] = "default",
    found: FindingSet | None = None,
    dashboard_url: str | None = None,
) -> str:
    """The report for ``window``/``filters`` (or one ``run``) as HTML, Markdown or JSON text.

    HTML and Markdown list the first ``LISTED_PER_MODE`` findings of each failure mode in full and
    count the rest; JSON lists every finding. ``max_findings`` overrides that (None = all). With
    ``dashboard_url`` run, trace and span ids link to that dashboard's run explorer.
    """
    if fmt not in FORMATS:
        raise ValueError(f"Expected a report format among {', '.join(FORMATS)}, got {fmt!r}")
    limit = LISTED_PER_MODE[fmt] if max_findings == "default" else max_findings
    data = gather_report(source, window, filters, run, limit, found)
    data.dashboard_url = dashboard_url.rstrip("/") if dashboard_url else None
    return render_report(data, fmt)


def render_report(data: ReportData, fmt: Format) -> str:
    """Render gathered data in one format."""
    if fmt == "json":
        return render_json(data)
    return render_html(data) if fmt == "html" else render_markdown(data)
