"""Drift reports: gather findings with evidence and thresholds once, render HTML, Markdown or JSON.

``build_report`` is what ``driftscope report`` and the dashboard's download buttons call. The JSON
form is documented in docs/reports.md; HTML and Markdown carry the same content for people.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal
from urllib.parse import quote

import pandas as pd

from analytics.types import Filters, Window
from dashboard.datasource import window_params
from dashboard.evidence import (
    MAX_EVIDENCE_SPANS,
    EvidenceIndex,
    evidence_keys,
    evidence_table,
)
from dashboard.findings import Finding, FindingSet, finding_status, gather_findings, order_by_run_and_severity

logger = logging.getLogger(__name__)

SCHEMA = "driftscope.report"
SCHEMA_VERSION = 1
Format = Literal["html", "md", "json"]
FORMATS = ("html", "md", "json")
# Findings listed in full (with evidence) per failure mode; the rest are counted, not listed.
# JSON lists every finding unless asked otherwise: it is the way to get them all.
LISTED_PER_MODE = {"html": 20, "md": 20, "json": None}
RUNS_LISTED = 50
# Runs whose spans are read to find the text of dropped constraints (one read per run).
CONSTRAINT_TEXT_RUNS = 20
INDENT_LIMIT = 2000


@dataclass
class ReportData:
    """Everything a report shows, gathered once from a data source.

    Counts (``found``, ``run_count``) cover the whole scope; ``listed`` holds the findings shown
    in full (at most ``max_findings`` per failure mode, or all), with their ids and evidence.
    """

    generated_at: datetime
    source: str
    window: Window
    filters: Filters
    found: FindingSet
    listed: list[Finding]
    ids: list[str]
    evidence: list[list[dict]]
    max_findings: int | None
    run_count: int
    runs: pd.DataFrame
    thresholds: pd.DataFrame
    errors: dict[str, str]
    verdicts: pd.DataFrame | None = None  # run_summary of the scope (None when unavailable)

    @property
    def findings(self) -> list[Finding]:
        """The listed findings (all of them unless the report caps them per failure mode)."""
        return self.listed

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        """Detector frames by metric."""
        return self.found.frames

    @functools.cached_property
    def summary(self) -> pd.DataFrame:
        """Counts per failure mode over every finding, and how many of them are listed."""
        summary = self.found.summary()
        listed = pd.Series([f.metric for f in self.listed], dtype=object).value_counts()
        summary["listed"] = summary["metric"].map(listed).fillna(0).astype(int)
        return summary

    @functools.cached_property
    def omitted(self) -> dict[str, tuple[int, int]]:
        """Failure modes with findings left out: metric -> (listed, total)."""
        return {
            row["metric"]: (int(row["listed"]), int(row["findings"]))
            for row in self.summary.to_dict("records")
            if row["listed"] < row["findings"]
        }

    def api_query(self) -> str:
        """The read API query string for this scope (``?since=...``), for 'get them all' hints."""
        params = window_params(self.window, self.filters)
        return ("?" + "&".join(f"{k}={quote(v, safe=':')}" for k, v in params.items())) if params else ""


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
    listed, ids = [], []
    offset = 0
    for metric in found.by_metric.values():
        chosen = metric.findings(max_findings)
        listed.extend(chosen)
        ids.extend(f"F{offset + i}" for i in range(1, len(chosen) + 1))
        offset += metric.count
    add_constraint_texts(source, listed, errors)
    # Grouped by run, worst first: the order an incident review reads them (and the run explorer lists them).
    order = order_by_run_and_severity(listed)
    listed, ids = [listed[i] for i in order], [ids[i] for i in order]
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
    )


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


def add_constraint_texts(source, findings: list[Finding], errors: dict[str, str]) -> None:
    """Put each dropped constraint's text beside its id (``details["constraint_text"]``)."""
    drops = [
        f for f in findings if f.metric == "constraint_drops" and f.run_id and f.details.get("constraint_id")
    ]
    runs = list(dict.fromkeys(f.run_id for f in drops))[:CONSTRAINT_TEXT_RUNS]
    for run in runs:
        wanted = [f for f in drops if f.run_id == run]
        try:
            texts = constraint_texts(source.run_spans(run), {f.details["constraint_id"] for f in wanted})
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
) -> str:
    """The report for ``window``/``filters`` (or one ``run``) as HTML, Markdown or JSON text.

    HTML and Markdown list the first ``LISTED_PER_MODE`` findings of each failure mode in full and
    count the rest; JSON lists every finding. ``max_findings`` overrides that (None = all).
    """
    if fmt not in FORMATS:
        raise ValueError(f"Expected a report format among {', '.join(FORMATS)}, got {fmt!r}")
    limit = LISTED_PER_MODE[fmt] if max_findings == "default" else max_findings
    data = gather_report(source, window, filters, run, limit, found)
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


def _json_default(value):
    """What ``json.dumps`` cannot write itself (numpy scalars and arrays, timestamps)."""
    converted = _jsonable(value)
    return str(converted) if converted is value else converted


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
    findings = [
        {
            "id": fid,
            "metric": finding.metric,
            "status": finding_status(finding),
            "failure_mode": finding.failure_mode,
            "mast_category": finding.mast_category,
            "run_id": finding.run_id,
            "trace_id": finding.trace_id,
            "agents": finding.agents,
            "first_seen": finding.first_seen.isoformat() if finding.first_seen else None,
            "last_seen": finding.last_seen.isoformat() if finding.last_seen else None,
            "span_ids": finding.span_ids,
            "details": finding.details,
            "evidence": evidence,
        }
        for fid, finding, evidence in zip(data.ids, data.listed, data.evidence, strict=True)
    ]
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
            "runs": data.run_count,
            "findings": data.found.total,
            "findings_listed": len(data.listed),
            "runs_with_findings": data.found.runs_with_findings(),
            "by_mast_category": data.found.by_category(),
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
    # Indented for people; past INDENT_LIMIT listed findings compact, which lets json use its C
    # encoder (indenting is pure Python and dominates a report with a million evidence rows).
    indent = 2 if len(data.listed) <= INDENT_LIMIT else None
    text = json.dumps(report_document(data), indent=indent, ensure_ascii=False, default=_json_default)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
