"""HTML and Markdown renderings of a drift report.

HTML is one self-contained file: inline CSS, charts drawn as plain HTML and inline SVG (no
JavaScript, no charting library: the size follows the findings), no external requests. Every
value that may come from a span goes through ``html.escape`` (HTML) or ``md_escape`` (Markdown).
"""

from __future__ import annotations

import html
import json

import pandas as pd

from dashboard.evidence import EVIDENCE_COLUMNS
from dashboard.filters import describe_filters, describe_window, run_link
from dashboard.findings import MAST_CATEGORIES
from dashboard.overview import incident_runs
from dashboard.report_document import ReportData, provenance_object, report_document
from dashboard.text_cells import cell_text, md_escape

MAST_HELP = {
    "specification": "the task or role was specified badly or not followed (constraints lost, loops, budgets)",
    "inter-agent misalignment": "agents worked from different views of the task or state (split-brain, drift)",
    "task verification": "results were not checked before they took effect (stale sends, duplicate side effects)",
}

# The trace id is named once above each evidence table (JSON keeps it per span).
SHOWN_EVIDENCE = [c for c in EVIDENCE_COLUMNS if c != "trace_id"]
# Short evidence cells kept on one line, so the span text gets the width.
EVIDENCE_NOWRAP = ("span_id", "timestamp", "op", "outcome", "status")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1200px;color:#1d2433;padding:0 1rem}
h1{margin-bottom:.2rem}h2{border-bottom:2px solid #e3e8ee;padding-bottom:.3rem;margin-top:2.2rem}
.meta{color:#5b6675}table{border-collapse:collapse;width:100%;margin:.6rem 0;font-size:.88rem;table-layout:auto}
th,td{border:1px solid #dde3ea;padding:.3rem .5rem;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f4f6f8;white-space:nowrap}td.text{font-family:ui-monospace,monospace;white-space:pre-wrap;overflow-wrap:anywhere;width:45%}
td.nowrap{white-space:nowrap}code,a code{overflow-wrap:anywhere}
table.evidence td,table.evidence th{font-size:.8rem}table.evidence td{overflow-wrap:anywhere}
table.evidence td.text{width:55%;min-width:26rem}
.facts{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:.15rem .8rem;margin:.5rem 0;font-size:.88rem}
.facts dt{font-weight:600;color:#3b4656}.facts dd{margin:0;font-family:ui-monospace,monospace;overflow-wrap:anywhere}
.bar{background:#d62728;height:.8rem;display:inline-block;vertical-align:middle}
.v-failing{color:#a61b1b;font-weight:600}.v-review{color:#9a5b00;font-weight:600}.v-degraded{color:#9a5b00}
.status-failure{border-left-color:#d62728}.status-review,.status-warning{border-left-color:#ff7f0e}
.finding{border:1px solid #dde3ea;border-left:5px solid #d62728;border-radius:4px;padding:.4rem 1rem;margin:.8rem 0}
.finding h4{margin:.3rem 0}.finding p{margin:.3rem 0}
.tag{display:inline-block;border-radius:3px;padding:0 .4rem;margin-right:.4rem;font-size:.8rem;color:#fff}
.specification{background:#9467bd}.inter-agent{background:#d62728}.task{background:#ff7f0e}.unclassified{background:#9aa5b1}
pre{background:#f4f6f8;padding:.5rem;overflow-x:auto;white-space:pre-wrap;word-break:break-word}
.error{color:#a61b1b}.omitted{background:#fff8e6;border:1px solid #f2c14e;padding:.5rem 1rem;border-radius:4px}
"""


def _e(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return html.escape(str(value))


def explorer_url(base: str | None, run, span=None, trace=None) -> str | None:
    """The run explorer of the dashboard at ``base`` showing ``run`` (``span`` inspected, ``trace``
    searched), or None when the report knows no dashboard (ids stay plain text)."""
    if not base or run is None or (isinstance(run, float) and pd.isna(run)) or run == "":
        return None
    span = span if isinstance(span, str) and span else None
    trace = trace if isinstance(trace, str) and trace else None
    return f"{base}/{run_link(str(run), span=span, query=trace)}"


def _id_html(value, url: str | None) -> str:
    """An id as code, linked to ``url`` when there is one (both escaped)."""
    code = f"<code>{_e(value)}</code>"
    return f"<a href='{_e(url)}'>{code}</a>" if url else code


def _id_md(value, url: str | None) -> str:
    """An id as Markdown text, as a link to ``url`` when there is one."""
    text = md_escape(value)
    if not url:
        return text
    return f"[{text}]({url.replace('(', '%28').replace(')', '%29').replace(' ', '%20')})"


def _tag_class(category: str) -> str:
    return {
        "specification": "specification",
        "inter-agent misalignment": "inter-agent",
        "task verification": "task",
    }.get(category, "unclassified")


def _html_table(frame: pd.DataFrame, text_columns: tuple[str, ...] = ()) -> str:
    if frame is None or frame.empty:
        return "<p class='meta'>none</p>"
    return _html_rows(list(frame.columns), frame.to_dict("records"), text_columns)


def _html_rows(
    columns: list[str],
    records: list[dict],
    text_columns: tuple[str, ...] = (),
    css: str = "",
    links: dict | None = None,
    nowrap: tuple[str, ...] = (),
) -> str:
    """An escaped HTML table of ``records`` (dicts) in ``columns`` order; a column in ``links``
    links each cell to the URL its function gives for the record (None: plain); ``text_columns``
    take the width left (monospace, wrapped anywhere), ``nowrap`` ones never wrap."""
    if not records:
        return "<p class='meta'>none</p>"
    links = links or {}
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    opening = [
        "<td class='text'>" if c in text_columns else "<td class='nowrap'>" if c in nowrap else "<td>"
        for c in columns
    ]

    def cell(record: dict, column: str) -> str:
        text = _e(_cell(record.get(column)))
        url = links[column](record) if column in links else None
        return f"<a href='{_e(url)}'>{text}</a>" if url else text

    rows = [
        "<tr>" + "".join(f"{o}{cell(r, c)}</td>" for c, o in zip(columns, opening, strict=True)) + "</tr>"
        for r in records
    ]
    klass = f" class='{css}'" if css else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


_cell = cell_text


def _figures_html(data: ReportData) -> str:
    """Findings per failure mode as bars, and the rejection rate per bucket as an inline SVG line."""
    summary = data.summary
    parts = []
    if not summary.empty:
        most = max(int(summary["findings"].max()), 1)
        rows = "".join(
            f"<tr><td>{_e(r['title'])}</td><td>{int(r['findings']):,}</td>"
            f"<td><span class='bar' style='width:{max(2, round(300 * int(r['findings']) / most))}px'></span></td></tr>"
            for r in summary.to_dict("records")
        )
        parts.append(
            "<h3>Findings per failure mode</h3><table><thead><tr><th>failure mode</th><th>findings</th>"
            f"<th></th></tr></thead><tbody>{rows}</tbody></table>"
        )
    rates = data.frames.get("rejection_rates")
    if rates is not None and not rates.empty and "rejection_rate" in rates:
        parts.append(_rate_svg(rates))
    return "\n".join(parts)


def _rate_svg(rates: pd.DataFrame, width: int = 900, height: int = 160) -> str:
    """The rejection rate of each time bucket (all tools together: the worst tool per bucket) as SVG
    bars, red over the threshold: a bar per bucket reads with one bucket or many (a line between
    two hourly buckets drew one meaningless diagonal)."""
    frame = rates.copy()
    frame["bucket"] = (
        pd.to_datetime(frame["bucket_start"], errors="coerce") if "bucket_start" in frame else pd.NaT
    )
    worst = frame.dropna(subset=["bucket"]).groupby("bucket")["rejection_rate"].max().sort_index()
    if worst.empty:
        return ""
    threshold = float(frame["threshold"].iloc[0]) if "threshold" in frame and len(frame) else None
    if threshold is not None and pd.isna(threshold):
        threshold = None
    left, right, top, bottom = 40, 20, 20, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    slot = plot_w / len(worst)
    bar_w = max(min(slot * 0.7, 60), 1)

    def y_of(value: float) -> float:
        return top + plot_h * (1 - min(max(value, 0.0), 1.0))

    bars = []
    labelled = len(worst) <= 12
    for i, (bucket, value) in enumerate(worst.items()):
        x = left + slot * i + (slot - bar_w) / 2
        over = threshold is not None and float(value) > threshold
        bars.append(
            f"<rect x='{x:.1f}' y='{y_of(float(value)):.1f}' width='{bar_w:.1f}' "
            f"height='{top + plot_h - y_of(float(value)):.1f}' fill='{'#d62728' if over else '#1f77b4'}'>"
            f"<title>{_e(bucket)}: {float(value):.0%}</title></rect>"
        )
        if labelled:
            bars.append(
                f"<text x='{x + bar_w / 2:.1f}' y='{height - 8}' font-size='11' text-anchor='middle'>"
                f"{_e(pd.Timestamp(bucket).strftime('%m-%d %H:%M'))}</text>"
            )
    if not labelled:
        bars.append(f"<text x='{left}' y='{height - 8}' font-size='11'>{_e(worst.index[0])}</text>")
        bars.append(
            f"<text x='{width - right}' y='{height - 8}' font-size='11' text-anchor='end'>"
            f"{_e(worst.index[-1])}</text>"
        )
    line = ""
    if threshold is not None:
        ty = y_of(threshold)
        line = (
            f"<line x1='{left}' x2='{width - right}' y1='{ty:.1f}' y2='{ty:.1f}' stroke='#d62728' "
            f"stroke-dasharray='4 3'/><text x='{width - right}' y='{ty - 4:.1f}' text-anchor='end' "
            f"font-size='11' fill='#d62728'>threshold {threshold:.0%}</text>"
        )
    axis = "".join(
        f"<text x='{left - 4}' y='{y_of(v) + 4:.1f}' font-size='11' text-anchor='end'>{v:.0%}</text>"
        for v in (0.0, 0.5, 1.0)
    )
    return (
        "<h3>Rejection rate per time bucket (the highest tool's; red: over the threshold)</h3>"
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}' width='100%' "
        f"role='img' aria-label='rejection rate per time bucket'>"
        f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='#f8f9fb' stroke='#dde3ea'/>"
        f"{axis}{''.join(bars)}{line}</svg>"
    )


def _verdicts_html(data: ReportData) -> str:
    """Per-run verdicts, failing first: what an incident review reads before the findings."""
    if data.verdicts is None:
        return "<p class='meta'>Run verdicts unavailable (see the failed detectors below).</p>"
    table = incident_runs(data.verdicts, data.found, data.generated_at, limit=50, include_healthy=True)
    if table.empty:
        return "<p class='meta'>No runs in this scope.</p>"
    rows = []
    # "not measurable" only when some run's telemetry lacked what a detector needs
    blind = any(_cell(r["coverage"]) for r in table.to_dict("records"))
    for r in table.to_dict("records"):
        klass = {"failing": "v-failing", "to review": "v-review", "degraded": "v-degraded"}.get(
            r["verdict"], ""
        )
        coverage = f"<td>{_e(r['coverage'])}</td>" if blind else ""
        rows.append(
            f"<tr><td class='{klass} nowrap'>{_e(r['verdict'])}</td>"
            f"<td class='nowrap'>{_id_html(r['run_id'], explorer_url(data.dashboard_url, r['run_id']))}</td>"
            f"<td>{_e(r['worst_failure_mode'])}</td>{coverage}<td>{r['findings']}</td>"
            f"<td>{_e(', '.join(r['agents']))}</td><td>{_e(r['last_span'])}</td></tr>"
        )
    total = len(data.verdicts)
    note = f"<p class='meta'>The first {len(table)} of {total:,} runs.</p>" if total > len(table) else ""
    return (
        "<table><thead><tr><th>verdict</th><th>run</th><th>worst failure mode</th>"
        + ("<th>not measurable</th>" if blind else "")
        + "<th>findings</th>"
        f"<th>agents</th><th>last span</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{note}"
    )


def render_html(data: ReportData) -> str:
    """The report as one self-contained HTML document."""
    doc = report_document(data)
    summary = doc["summary"]
    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>driftscope report — {_e(describe_window(data.window))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>driftscope coordination-failure report</h1>",
        f"<p class='meta'>Generated {_e(doc['generated_at'])} UTC from {_e(data.source)}. "
        f"Window: {_e(describe_window(data.window))}; {_e(describe_filters(data.filters))}.</p>",
        "<h2>Runs by verdict</h2>",
        _verdicts_html(data),
        _comparison_html(data),
        "<h2>Summary</h2>",
        f"<p><b>{summary['findings']:,}</b> findings in <b>{summary['runs_with_findings']:,}</b> of "
        f"<b>{summary['runs']:,}</b> runs.{_listing_note(data)}</p>",
        "<table><thead><tr><th>MAST category</th><th>findings</th><th>meaning</th></tr></thead><tbody>",
    ]
    for category, count in summary["by_mast_category"].items():
        out.append(
            f"<tr><td><span class='tag {_tag_class(category)}'>{_e(category)}</span></td><td>{count}</td>"
            f"<td>{_e(MAST_HELP.get(category, ''))}</td></tr>"
        )
    out.append("</tbody></table>")
    out.append(_html_table(data.summary))
    out.append(_figures_html(data))
    out.append("<h2>Findings</h2>")
    if not doc["findings"] and not summary["findings"]:
        out.append("<p>No coordination failures were found in this scope.</p>")
    omitted = data.omitted
    run = object()
    for finding in doc["findings"]:
        if finding["run_id"] != run:
            run = finding["run_id"]
            out.append(f"<h3 class='run'>Run {_id_html(run, explorer_url(data.dashboard_url, run))}</h3>")
        out.append(_finding_html(finding, data.dashboard_url))
    for row in data.summary.to_dict("records"):  # listings capped per failure mode
        if row["metric"] in omitted:
            out.append(_omitted_html(data, row["metric"], row["failure_mode"], *omitted[row["metric"]]))
    if data.alerts is not None:
        out.append("<h2>Alerts</h2>")
        if doc["alerts"]:
            out.append(_html_table(pd.DataFrame(doc["alerts"]).drop(columns=["alert_id"])))
        else:
            out.append("<p>No alert fired in this window.</p>")
    if doc["blind_spots"]:
        out.append("<h2>What these detectors cannot see</h2><ul>")
        out.extend(f"<li><b>{_e(b['title'])}</b>: {_e(b['text'])}</li>" for b in doc["blind_spots"])
        out.append("</ul>")
    out.append("<h2>Thresholds in force</h2>")
    out.append(_thresholds_html(doc["thresholds"]))
    if doc["errors"]:
        out.append("<h2>Detectors that failed</h2><ul>")
        out.extend(f"<li class='error'><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in doc["errors"].items())
        out.append("</ul>")
    out.append(_runs_html(data.runs, data.run_count, data.api_query(), data.dashboard_url))
    out.append("</body></html>")
    return "\n".join(out)


def _listing_note(data: ReportData) -> str:
    if not data.omitted:
        return ""
    return (
        f" Each failure mode below lists at most its first {data.max_findings} findings in full "
        "(the worst first where the detector scores them); the counts cover every finding."
    )


def get_all_hint(data: ReportData, metric: str) -> tuple[str, str]:
    """(CLI command, read API path) that return every finding of ``metric`` in this scope."""
    cli = "driftscope report --format json" + (f" --run {data.filters.run}" if data.filters.run else "")
    return cli, f"GET /api/v1/metrics/{metric}{data.api_query()}"


def _omitted_html(data: ReportData, metric: str, mode: str, listed: int, total: int) -> str:
    cli, api = get_all_hint(data, metric)
    return (
        f"<p class='omitted'><b>{total - listed:,} more findings of {_e(mode)}</b> are counted above but "
        f"not listed here ({listed:,} of {total:,} shown). Every finding with its evidence: "
        f"<code>{_e(cli)}</code> (the JSON report lists them all); the detector's rows: "
        f"<code>{_e(api)}</code> on the collector's read API.</p>"
    )


def evidence_columns(rows: list[dict]) -> list[str]:
    """The evidence columns a finding's table shows: those with a value in some row (an empty
    column took the width the span text needs)."""
    return [c for c in SHOWN_EVIDENCE if any(_cell(r.get(c)) not in ("", "Unset") for r in rows)]


def _time_of_day(rows: list[dict]) -> list[dict]:
    """Evidence rows with ``timestamp`` as the time of day (the finding's line gives the date)."""
    return [
        {**r, "timestamp": _cell(r.get("timestamp")).partition("T")[2] or r.get("timestamp")} for r in rows
    ]


def _finding_html(finding: dict, dashboard_url: str | None = None) -> str:
    category = finding["mast_category"]
    run = finding["run_id"]
    span_links = {"span_id": lambda r: explorer_url(dashboard_url, run, span=r.get("span_id"))}
    details = "".join(
        f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in finding["details"].items() if _cell(v) != ""
    )
    status = {"failure": "status-failure", "warning": "status-warning"}.get(
        finding["status"], "status-review"
    )
    rows = _time_of_day(finding["evidence"])
    return (
        f"<div class='finding {status}' id='{_e(finding['id'])}'>"
        f"<h4>{_e(finding['id'])}: {_e(finding['failure_mode'])} ({_e(finding['status'])})</h4>"
        f"<p><span class='tag {_tag_class(category)}'>MAST: {_e(category)}</span>"
        f"detector <code>{_e(finding['metric'])}</code> · run {_id_html(run, explorer_url(dashboard_url, run))} · "
        f"agents {_e(', '.join(finding['agents']))} · {_e(finding['first_seen'])} – {_e(finding['last_seen'])}</p>"
        f"<dl class='facts'>{details}</dl>"
        f"<p><b>Evidence spans</b> (trace "
        f"{_id_html(finding['trace_id'], explorer_url(dashboard_url, run, trace=finding['trace_id']))})</p>"
        f"{_html_rows(evidence_columns(rows), rows, ('text',), 'evidence', span_links, EVIDENCE_NOWRAP)}</div>"
    )


def _thresholds_html(thresholds: list[dict]) -> str:
    if not thresholds:
        return "<p class='meta'>No thresholds recorded.</p>"
    rows = []
    for t in thresholds:
        state = "calibrated" if t["calibrated"] else "uncalibrated default"
        provenance = json.dumps(t["provenance"], indent=2, sort_keys=True, default=str)
        rows.append(
            f"<tr><td>{_e(t['name'])}</td><td>{_e(t['value'])}</td><td>{_e(t['version'])}</td>"
            f"<td>{_e(t['method'])}</td><td>{_e(state)}</td>"
            f"<td><details><summary>provenance</summary><pre>{_e(provenance)}</pre></details></td></tr>"
        )
    return (
        "<table><thead><tr><th>name</th><th>value</th><th>version</th><th>method</th><th>state</th>"
        f"<th>provenance</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _runs_html(runs: pd.DataFrame, total: int, api_query: str, dashboard_url: str | None = None) -> str:
    if runs is None or runs.empty:
        return "<h2>Runs</h2><p class='meta'>No runs in this scope.</p>"
    columns = [
        c for c in ("run_id", "first_seen", "last_seen", "spans", "agents", "rejected", "errors") if c in runs
    ]
    note = ""
    if total > len(runs):
        note = (
            f"<p class='meta'>The {len(runs):,} newest of {total:,} runs; every run: "
            f"<code>{_e('GET /api/v1/runs' + (api_query + '&' if api_query else '?') + 'limit=100000')}</code>.</p>"
        )
    links = {"run_id": lambda r: explorer_url(dashboard_url, r.get("run_id"))}
    return "<h2>Runs</h2>" + note + _html_rows(columns, runs[columns].to_dict("records"), links=links)


def _md_table(frame: pd.DataFrame) -> list[str]:
    if frame is None or frame.empty:
        return ["_none_", ""]
    return _md_rows(list(frame.columns), frame.to_dict("records"))


def _md_rows(columns: list[str], records: list[dict], links: dict | None = None) -> list[str]:
    if not records:
        return ["_none_", ""]
    links = links or {}
    lines = ["| " + " | ".join(md_escape(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    for record in records:
        cells = [
            _id_md(record.get(c), links[c](record)) if c in links else md_escape(record.get(c))
            for c in columns
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _omitted_md(data: ReportData, metric: str, mode: str, listed: int, total: int) -> str:
    cli, api = get_all_hint(data, metric)
    return (
        f"> **{total - listed:,} more findings of {md_escape(mode)}** are counted above but not listed "
        f"({listed:,} of {total:,} shown). Every finding with its evidence: {md_escape(cli)} (the JSON "
        f"report lists them all); the detector's rows: {md_escape(api)} on the collector's read API."
    )


def render_markdown(data: ReportData) -> str:
    """The report as Markdown for a ticket or pull request."""
    doc = report_document(data)
    summary = doc["summary"]
    out = [
        "# driftscope coordination-failure report",
        "",
        f"Generated {md_escape(doc['generated_at'])} UTC from {md_escape(data.source)}. "
        f"Window: {md_escape(describe_window(data.window))}; {md_escape(describe_filters(data.filters))}.",
        "",
        "## Summary",
        "",
        f"**{summary['findings']:,}** findings in **{summary['runs_with_findings']:,}** of "
        f"**{summary['runs']:,}** runs.{_listing_note(data)}",
        "",
        "| MAST category | findings | meaning |",
        "|---|---|---|",
    ]
    for category in list(MAST_CATEGORIES) + [
        c for c in summary["by_mast_category"] if c not in MAST_CATEGORIES
    ]:
        count = summary["by_mast_category"].get(category, 0)
        out.append(f"| {md_escape(category)} | {count} | {md_escape(MAST_HELP.get(category, ''))} |")
    out.append("")
    out.extend(_md_table(data.summary))
    out = out[:4] + _verdicts_md(data) + _comparison_md(data) + out[4:]
    out += ["## Findings", ""]
    if not doc["findings"] and not summary["findings"]:
        out += ["No coordination failures were found in this scope.", ""]
    omitted = data.omitted
    for finding in doc["findings"]:
        out += [
            f"### {finding['id']}: {md_escape(finding['failure_mode'])} ({md_escape(finding['status'])})",
            "",
            f"- MAST category: **{md_escape(finding['mast_category'])}**",
            f"- detector: {md_escape(finding['metric'])}, "
            f"run: {_id_md(finding['run_id'], explorer_url(data.dashboard_url, finding['run_id']))}, "
            f"trace: {_id_md(finding['trace_id'], explorer_url(data.dashboard_url, finding['run_id'], trace=finding['trace_id']))}",
            f"- agents: {md_escape(', '.join(finding['agents']))}; "
            f"seen {md_escape(finding['first_seen'])} to {md_escape(finding['last_seen'])}",
        ]
        out += [f"- {md_escape(k)}: {md_escape(v)}" for k, v in finding["details"].items()]
        out += ["", "Evidence spans:", ""]
        run_url = finding["run_id"]
        out.extend(
            _md_rows(
                SHOWN_EVIDENCE,
                finding["evidence"],
                {
                    "span_id": lambda r, run=run_url: explorer_url(
                        data.dashboard_url, run, span=r.get("span_id")
                    )
                },
            )
        )
    for row in data.summary.to_dict("records"):
        if row["metric"] in omitted:
            out += [_omitted_md(data, row["metric"], row["failure_mode"], *omitted[row["metric"]]), ""]
    if data.alerts is not None:
        out += ["## Alerts", ""]
        if doc["alerts"]:
            out.extend(_md_table(pd.DataFrame(doc["alerts"]).drop(columns=["alert_id"])))
        else:
            out += ["No alert fired in this window.", ""]
    if doc["blind_spots"]:
        out += ["## What these detectors cannot see", ""]
        out += [f"- **{md_escape(b['title'])}**: {md_escape(b['text'])}" for b in doc["blind_spots"]]
        out.append("")
    out += ["## Thresholds in force", ""]
    rows = [
        {
            "name": t["name"],
            "value": t["value"],
            "version": t["version"],
            "method": t["method"],
            "state": "calibrated" if t["calibrated"] else "uncalibrated default",
            "provenance": json.dumps(provenance_object(t["provenance"]), sort_keys=True, default=str),
        }
        for t in doc["thresholds"]
    ]
    out.extend(_md_table(pd.DataFrame(rows)))
    if doc["errors"]:
        out += ["## Detectors that failed", ""]
        out += [f"- {md_escape(k)}: {md_escape(v)}" for k, v in doc["errors"].items()]
        out.append("")
    return "\n".join(out)


def _verdicts_md(data: ReportData) -> list[str]:
    """The per-run verdict table as Markdown lines (failing runs first)."""
    if data.verdicts is None:
        return ["## Runs by verdict", "", "_run verdicts unavailable_", ""]
    table = incident_runs(data.verdicts, data.found, data.generated_at, limit=50, include_healthy=True)
    columns = ["verdict", "run_id", "worst_failure_mode", "coverage", "findings", "agents", "last_span"]
    links = {"run_id": lambda r: explorer_url(data.dashboard_url, r.get("run_id"))}
    return ["## Runs by verdict", "", *_md_rows(columns, table.to_dict("records"), links)]


COMPARISON_TITLE = "What differs from healthy runs"


def _span_url(data: ReportData):
    return lambda run, span: explorer_url(data.dashboard_url, run, span=span)


def _comparison_html(data: ReportData) -> str:
    """A run report's "What differs from healthy runs" section (issue 35); empty otherwise."""
    if data.comparison is None:
        return ""
    # Imported here: compare_render reads this module's md_escape.
    from dashboard.compare_render import comparison_html

    return f"<h2>{COMPARISON_TITLE}</h2>\n" + comparison_html(data.comparison, _span_url(data))


def _comparison_md(data: ReportData) -> list[str]:
    """The same section as Markdown lines."""
    if data.comparison is None:
        return []
    from dashboard.compare_render import comparison_markdown

    return [f"## {COMPARISON_TITLE}", "", *comparison_markdown(data.comparison, _span_url(data))]
