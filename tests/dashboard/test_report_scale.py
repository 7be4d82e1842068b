"""Reports and findings on a window with many findings: complete counts, bounded listing, one run
of each detector, evidence matched by run and span id.

The sample crews are copied ``COPIES`` times in SQL, each copy under its own run, trace, task and
idempotency ids but with the *same span ids*, so every failure mode has many findings and span ids
repeat across runs, as they do in a real store.
"""

from __future__ import annotations

import json
import re

import duckdb
import pytest

from analytics.types import Filters, Window
from dashboard.datasource import DuckDBFileSource
from dashboard.evidence import evidence_keys
from dashboard.findings import Finding, gather_findings
from dashboard.report import LISTED_PER_MODE, build_report
from tests.dashboard.test_dashboard_db import build_dashboard_db, expected_findings

COPIES = 25
PER_RUN = [m for m in ("lost_updates", "constraint_drops", "ping_pong", "duplicate_side_effects")]


def grow(path, copies: int = COPIES):
    """Add ``copies`` copies of every span, each under new run/trace/task/idempotency ids."""
    conn = duckdb.connect(str(path))
    conn.execute(
        """
        INSERT INTO spans
        SELECT spans.* REPLACE (
            substr(TraceId, 1, 28) || printf('%04x', k) AS TraceId,
            run_id || '-copy' || k AS run_id,
            task_id || '-copy' || k AS task_id,
            origin_task_id || '-copy' || k AS origin_task_id,
            idempotency_key || '-copy' || k AS idempotency_key
        )
        FROM spans, range(1, ? + 1) AS r(k)
        """,
        [copies],
    )
    conn.close()
    return path


class CountingSource(DuckDBFileSource):
    """The real file source; counts how often each detector is asked for."""

    def __init__(self, path):
        super().__init__(path)
        self.calls: dict[str, int] = {}

    def metric(self, name, window, filters):
        self.calls[name] = self.calls.get(name, 0) + 1
        return super().metric(name, window, filters)


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    path = grow(build_dashboard_db(tmp_path_factory.mktemp("scale") / "crew.duckdb"))
    source = CountingSource(path)
    yield source
    source.close()


@pytest.fixture(scope="module")
def complete(grown):
    return json.loads(build_report(grown, Window(), Filters(), None, "json"))


def test_each_detector_runs_once_per_report(grown):
    grown.calls.clear()
    build_report(grown, Window(), Filters(), None, "html")
    assert grown.calls and set(grown.calls.values()) == {1}, grown.calls
    found = gather_findings(grown, Window(), Filters())
    assert set(found.by_metric) | {"run_summary"} == set(grown.calls)  # plus the per-run verdicts


def test_counts_cover_every_copy(complete):
    """Per-run failure modes are found once per injected failure in every copy of every run."""
    per_metric: dict[str, int] = {}
    for finding in complete["findings"]:
        per_metric[finding["metric"]] = per_metric.get(finding["metric"], 0) + 1
    injected = {m: sum(runs.get(m, 0) for runs in expected_findings().values()) for m in PER_RUN}
    for metric in PER_RUN:
        assert per_metric.get(metric, 0) == injected[metric] * (COPIES + 1), metric
    summary = complete["summary"]
    assert summary["findings"] == summary["findings_listed"] == len(complete["findings"])
    assert summary["runs"] == len(expected_findings()) * (COPIES + 1)
    by_mode = {row["metric"]: row for row in summary["by_failure_mode"]}
    assert all(row["listed"] == row["findings"] for row in by_mode.values())
    assert sum(summary["by_mast_category"].values()) == summary["findings"]


def test_capped_report_keeps_counts_ids_and_evidence(grown, complete):
    cap = LISTED_PER_MODE["html"]
    capped = json.loads(build_report(grown, Window(), Filters(), None, "json", max_findings=cap))
    keep = ("runs", "findings", "runs_with_findings", "by_mast_category")
    assert {k: capped["summary"][k] for k in keep} == {k: complete["summary"][k] for k in keep}
    modes = {row["metric"]: row for row in capped["summary"]["by_failure_mode"]}
    assert any(row["findings"] > cap for row in modes.values())
    for metric, row in modes.items():
        assert row["listed"] == min(cap, row["findings"]), metric
    assert capped["summary"]["findings_listed"] == len(capped["findings"]) < len(complete["findings"])

    # Each listed finding is one of the complete listing's, under the id that position has there
    # (detectors may order ties differently from call to call, so compare content without ids).
    def content(finding: dict) -> str:
        return json.dumps({k: v for k, v in finding.items() if k != "id"}, sort_keys=True)

    everything = {content(f) for f in complete["findings"]}
    assert all(content(f) in everything for f in capped["findings"])

    # Ids number the findings in listing order (grouped by run, worst first): F1, F2, ... (issue 34:
    # numbered detector by detector, a listing read F6, F7, F1, F2, F8).
    assert [f["id"] for f in capped["findings"]] == [f"F{i}" for i in range(1, len(capped["findings"]) + 1)]


def test_listing_shows_the_worst_first(grown):
    capped = json.loads(build_report(grown, Window(), Filters(), None, "json", max_findings=3))
    found = gather_findings(grown, Window(), Filters())
    rows = found.by_metric["repeated_calls"]
    calls = sorted(found.frames["repeated_calls"]["calls"], reverse=True)
    listed = [int(f["details"]["calls"]) for f in capped["findings"] if f["metric"] == "repeated_calls"]
    assert rows.count > 3 and sorted(listed, reverse=True) == calls[:3]


def test_html_and_markdown_list_a_bounded_number_and_say_how_to_get_the_rest(grown, complete):
    cap = LISTED_PER_MODE["html"]
    html = build_report(grown, Window(), Filters(), None, "html")
    md = build_report(grown, Window(), Filters(), None, "md")
    over = [row for row in complete["summary"]["by_failure_mode"] if row["findings"] > cap]
    assert over
    assert len(re.findall(r"<div class='finding [a-z-]+' id='F\d+'>", html)) == sum(
        min(cap, row["findings"]) for row in complete["summary"]["by_failure_mode"]
    )
    for row in over:
        more = f"{row['findings'] - cap:,} more findings of {row['failure_mode']}"
        assert more in html and f"/api/v1/metrics/{row['metric']}" in html
        assert "driftscope report --format json" in html
        assert more.replace("(", "\\(").replace(")", "\\)") in md or more in md
    assert f"<b>{complete['summary']['findings']:,}</b> findings" in html
    assert "newest of" in html and "limit=100000" in html  # the runs table is bounded too


def test_evidence_is_matched_by_run_and_span_id(grown, complete):
    """Span ids repeat in every copy: a copy's finding shows the copy's spans, not the original's."""
    copied = [f for f in complete["findings"] if (f["run_id"] or "").endswith("-copy7") and f["evidence"]]
    assert copied
    for finding in copied:
        assert {e["trace_id"][-4:] for e in finding["evidence"]} == {"0007"}
        assert [e["span_id"] for e in finding["evidence"]] == sorted(
            {e["span_id"] for e in finding["evidence"]},
            key=[e["span_id"] for e in finding["evidence"]].index,
        )
    finding = Finding(
        "m", "mode", "specification", copied[0]["run_id"], None, copied[0]["span_ids"], [], None, None
    )
    spans = grown.evidence_spans(evidence_keys([finding]))
    assert set(spans["run_id"]) == {copied[0]["run_id"]}
    assert set(spans["span_id"]) <= set(copied[0]["span_ids"])
