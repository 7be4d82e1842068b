"""The gathered data of a drift report and its JSON document (schema in docs/reports.md).

``dashboard.report`` gathers a ``ReportData``; ``report_render`` and ``render_json`` turn it into
text. This module imports neither, so the dependency runs one way.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

import pandas as pd

from analytics.types import Filters, Window
from dashboard.datasource import window_params
from dashboard.findings import Finding, FindingSet, finding_status

SCHEMA = "driftscope.report"
SCHEMA_VERSION = 1
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
    # The dashboard the report links ids to (issue 16); None: ids are plain text.
    dashboard_url: str | None = None
    # Alert episodes of the window (issue 18); None: the source gave none.
    alerts: pd.DataFrame | None = None
    # A run report's run beside its crew's healthy runs (issue 35); None for a window report.
    comparison: dict | None = None

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
        "blind_spots": blind_spots(data),
        "alerts": alert_items(data),
        "comparison": data.comparison,
        "thresholds": thresholds,
        "errors": data.errors,
    }


ALERT_FIELDS = ("alert_id", "alertname", "severity", "state", "summary", "run_id", "starts_at", "ends_at")


def alert_items(data: ReportData) -> list[dict]:
    """The alerts of the report's window: firing first, then the newest."""
    if data.alerts is None:
        return []
    return [
        {
            key: _iso(row.get(key)) if key in ("starts_at", "ends_at") else _jsonable(row.get(key))
            for key in ALERT_FIELDS
        }
        for row in data.alerts.to_dict("records")
    ]


def blind_spots(data: ReportData) -> list[dict]:
    """What the report's detectors cannot see (each Metric record's ``blind_spots``), in
    catalogue order: a clean report is not proof of what they are blind to."""
    return [
        {"metric": name, "title": m.metric.get("title") or name, "text": m.metric["blind_spots"]}
        for name, m in data.found.by_metric.items()
        if m.metric.get("blind_spots")
    ]


def render_json(data: ReportData) -> str:
    """JSON text; ``<``, ``>`` and ``&`` are written as ``\\u`` escapes so it is safe to embed."""
    # Indented for people; past INDENT_LIMIT listed findings compact, which lets json use its C
    # encoder (indenting is pure Python and dominates a report with a million evidence rows).
    indent = 2 if len(data.listed) <= INDENT_LIMIT else None
    text = json.dumps(report_document(data), indent=indent, ensure_ascii=False, default=_json_default)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
