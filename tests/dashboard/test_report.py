"""Drift reports in all three formats, from a real DuckDB file, against the injected failures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analytics.types import Filters, Window
from dashboard.datasource import DuckDBFileSource
from dashboard.report import build_report
from dashboard.report_render import md_escape
from tests.dashboard.test_dashboard_db import XSS, XSS_RUN, build_dashboard_db, expected_findings, truths

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reports.md"
MAST = {"specification", "inter-agent misalignment", "task verification"}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = DuckDBFileSource(build_dashboard_db(tmp_path_factory.mktemp("report") / "crew.duckdb"))
    yield src
    src.close()


@pytest.fixture(scope="module")
def reports(source):
    return {fmt: build_report(source, Window(), Filters(), None, fmt) for fmt in ("html", "md", "json")}


def _documented_fields(section: str) -> list[str]:
    """Field names of the table that follows ``section`` in docs/reports.md."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index(section)
    fields = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("| `"):
            fields.append(line.split("`")[1])
        elif fields and not line.startswith("|"):
            break
    return fields


def _ping_pong_run() -> str:
    return next(t["run_id"] for t in truths() if t["scenario"] == "ping_pong" and t["variant"] == "unguarded")


def test_json_report_findings_match_the_ground_truth(reports):
    """Per run and detector, as many findings as the simulator injected; none in healthy runs."""
    doc = json.loads(reports["json"])
    found: dict[str, dict[str, int]] = {}
    for finding in doc["findings"]:
        if finding["metric"] == "rejection_rates":  # guard refusals per time bucket: symptoms, not injected
            continue
        per_run = found.setdefault(finding["run_id"], {})
        per_run[finding["metric"]] = per_run.get(finding["metric"], 0) + 1
    expected = {run: counts for run, counts in expected_findings().items() if counts}
    assert found == expected
    assert not any(run.startswith("run-healthy") for run in found)
    assert doc["errors"] == {}
    assert doc["summary"]["findings"] == len(doc["findings"])
    assert doc["summary"]["runs"] == len(expected_findings())


def test_report_evidence_spans_are_the_ground_truth_spans(reports):
    doc = json.loads(reports["json"])
    for truth in truths():
        for drop in truth["constraint_drops"]:
            finding = next(
                f
                for f in doc["findings"]
                if f["metric"] == "constraint_drops" and f["run_id"] == truth["run_id"]
            )
            assert drop["span_id"] in [e["span_id"] for e in finding["evidence"]]
        for loop in truth["looped_calls"]:
            finding = next(
                f
                for f in doc["findings"]
                if f["metric"] == "repeated_calls" and f["run_id"] == truth["run_id"]
            )
            assert set(loop["span_ids"]) <= set(finding["span_ids"])


def test_every_finding_is_named_by_failure_mode_and_mast_category(reports):
    doc = json.loads(reports["json"])
    assert set(doc["summary"]["by_mast_category"]) == MAST
    for finding in doc["findings"]:
        assert finding["failure_mode"] and finding["mast_category"] in MAST
    drop = next(f for f in doc["findings"] if f["metric"] == "constraint_drops")
    assert drop["details"]["constraint_id"] == "C2" and drop["failure_mode"].startswith("constraint dropped")


def test_json_report_follows_the_documented_schema(reports):
    doc = json.loads(reports["json"])
    assert list(doc) == _documented_fields("Top level:")
    assert list(doc["scope"]) == _documented_fields("`scope`:")
    assert list(doc["summary"]) == _documented_fields("`summary`:")
    assert list(doc["findings"][0]) == _documented_fields("Each element of `findings`:")
    assert list(doc["findings"][0]["evidence"][0]) == _documented_fields("Each element of `evidence`:")
    assert list(doc["thresholds"][0]) == _documented_fields("Each element of `thresholds`:")
    assert doc["schema"] == "driftscope.report" and doc["schema_version"] == 1
    goal = next(t for t in doc["thresholds"] if t["name"] == "goal_divergence")
    assert goal["calibrated"] is False and goal["version"] == 0 and "note" in goal["provenance"]


def test_json_report_escapes_markup_but_keeps_the_text(reports):
    assert "<script" not in reports["json"] and "<img" not in reports["json"]
    doc = json.loads(reports["json"])
    texts = [e["text"] for f in doc["findings"] for e in f["evidence"]]
    assert any(XSS in t for t in texts)


def test_html_report_escapes_span_text(reports):
    html = reports["html"]
    assert XSS not in html
    assert "<img src=x" not in html and 'alert("driftscope-xss")' not in html
    assert "&lt;script&gt;alert(&quot;driftscope-xss&quot;)&lt;/script&gt;" in html
    assert "<script" not in html  # charts are HTML and SVG: no script at all


def test_html_report_is_self_contained_and_carries_no_charting_library(reports):
    html = reports["html"]
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=[\"']?(https?:)?//", html)
    assert "plotly" not in html.lower() and html.count("<svg") == 1  # the rejection-rate line
    # the size follows the findings: the sample traces' report is tens of kilobytes, not megabytes
    assert len(html.encode()) < 400_000
    for section in ("Runs by verdict", "Summary", "Findings", "Thresholds in force"):
        assert f"<h2>{section}</h2>" in html
    assert html.index("<h2>Runs by verdict</h2>") < html.index("<h2>Summary</h2>")
    assert "MAST: inter-agent misalignment" in html and "MAST: specification" in html


def test_markdown_report_has_the_same_findings_escaped(reports):
    md = reports["md"]
    doc = json.loads(reports["json"])
    headings = re.findall(r"^### (F\d+): (.*)$", md, flags=re.M)
    assert [h[0] for h in headings] == [f["id"] for f in doc["findings"]]
    assert [h[1] for h in headings] == [
        f"{md_escape(f['failure_mode'])} ({md_escape(f['status'])})" for f in doc["findings"]
    ]
    assert "<script" not in md and "<img" not in md
    assert "&lt;script&gt;" in md
    assert "## Thresholds in force" in md


def test_markdown_escape_neutralises_markdown_and_html():
    assert md_escape("[x](javascript:alert(1)) <b>|</b> *a*\nb") == (
        "\\[x\\]\\(javascript:alert\\(1\\)\\) &lt;b&gt;\\|&lt;/b&gt; \\*a\\* b"
    )


def test_report_for_one_run_only_names_that_run(source):
    run = _ping_pong_run()
    doc = json.loads(build_report(source, Window(), Filters(), run, "json"))
    assert doc["scope"]["run"] == run
    assert {f["run_id"] for f in doc["findings"]} == {run}
    assert {f["metric"] for f in doc["findings"]} == set(expected_findings()[run])
    assert doc["summary"]["runs"] == 1


def test_report_text_of_the_xss_run_is_escaped_in_every_format(source):
    for fmt in ("html", "md", "json"):
        text = build_report(source, Window(), Filters(), XSS_RUN, fmt)
        assert "<script>alert" not in text and "<img src=x" not in text, fmt
    html = build_report(source, Window(), Filters(), XSS_RUN, "html")
    assert (
        "error: &lt;script&gt;alert(&quot;driftscope-xss&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
        in html
    )


def test_report_window_outside_the_data_has_no_findings(source):
    from datetime import datetime

    doc = json.loads(build_report(source, Window(since=datetime(2030, 1, 1)), Filters(), None, "json"))
    assert doc["findings"] == [] and doc["summary"]["runs"] == 0
    html = build_report(source, Window(since=datetime(2030, 1, 1)), Filters(), None, "html")
    assert "No coordination failures were found" in html


def test_unknown_format_is_refused_with_the_choices(source):
    with pytest.raises(ValueError, match="html, md, json"):
        build_report(source, Window(), Filters(), None, "pdf")


def test_report_lists_runs_by_verdict_then_findings_by_run_and_severity(reports):
    doc = json.loads(reports["json"])
    runs = [f["run_id"] for f in doc["findings"]]
    # grouped by run: once a run's findings end, it does not come back
    assert [r for i, r in enumerate(runs) if i == 0 or runs[i - 1] != r] == list(dict.fromkeys(runs))
    rank = {"failure": 0, "to review (threshold not calibrated)": 1, "warning": 2}
    for run in set(runs):
        statuses = [rank[f["status"]] for f in doc["findings"] if f["run_id"] == run]
        assert statuses == sorted(statuses), run
    assert doc["findings"][0]["status"] == "failure"
    drift = [f for f in doc["findings"] if f["metric"] == "goal_divergence"]
    assert drift and all(f["status"] == "to review (threshold not calibrated)" for f in drift)
    html = reports["html"]
    table = html[html.index("<h2>Runs by verdict</h2>") : html.index("<h2>Summary</h2>")]
    verdicts = re.findall(r"<td class='v-[a-z]+ nowrap'>([a-z ]+)</td>", table)
    assert verdicts[0] == "failing" and "to review" in verdicts
    assert verdicts == sorted(verdicts, key=["failing", "to review", "degraded"].index)


def test_dropped_constraints_are_listed_with_their_text(reports):
    from tests.dashboard.test_dashboard_db import truths

    doc = json.loads(reports["json"])
    drops = {
        (f["run_id"], f["details"]["constraint_id"]): f
        for f in doc["findings"]
        if f["metric"] == "constraint_drops"
    }
    expected = {
        (t["run_id"], d["constraint_id"]): d["constraint_text"]
        for t in truths()
        for d in t["constraint_drops"]
    }
    assert expected and {k: f["details"].get("constraint_text") for k, f in drops.items()} == expected
    assert "Venue must be wheelchair accessible" in reports["html"] and "constraint\\_text" in reports["md"]
