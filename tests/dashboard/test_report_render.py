"""Run, trace and span ids in a report link to the dashboard's run explorer when the report knows
the dashboard's address (issue 16 §2), and stay plain text otherwise."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlsplit

import pytest

from analytics.types import Filters, Window
from dashboard.datasource import DuckDBFileSource
from dashboard.filters import dashboard_base
from dashboard.report import build_report
from tests.dashboard.test_dashboard_db import build_dashboard_db

BASE = "http://127.0.0.1:8501"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return build_dashboard_db(tmp_path_factory.mktemp("links") / "crew.duckdb")


@pytest.fixture(scope="module")
def source(db):
    src = DuckDBFileSource(db)
    yield src
    src.close()


class _Links(HTMLParser):
    """Every ``<a href>`` with the text inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text)))
            self._href = None


def _links(html: str) -> list[tuple[str, dict, str]]:
    parser = _Links()
    parser.feed(html)
    out = []
    for href, text in parser.links:
        parts = urlsplit(href)
        assert f"{parts.scheme}://{parts.netloc}{parts.path}" == f"{BASE}/run_explorer", href
        out.append((href, {k: v[0] for k, v in parse_qs(parts.query).items()}, text))
    return out


def test_html_report_links_every_run_trace_and_evidence_span_to_the_run_explorer(source):
    doc = json.loads(build_report(source, Window(), Filters(), None, "json"))
    html = build_report(source, Window(), Filters(), None, "html", dashboard_url=BASE + "/")
    links = _links(html)
    spans = {(q["run"], q["span"]) for _, q, text in links if "span" in q and text == q["span"]}
    traces = {(q["run"], q["q"]) for _, q, text in links if "q" in q and text == q["q"]}
    runs = {q["run"] for _, q, text in links if set(q) == {"run"} and text == q["run"]}
    for finding in doc["findings"]:
        assert {(finding["run_id"], e["span_id"]) for e in finding["evidence"]} <= spans, finding["id"]
        if finding["trace_id"]:  # findings over a time bucket name no trace
            assert (finding["run_id"], finding["trace_id"]) in traces, finding["id"]
        assert finding["run_id"] in runs
    stored = set(source.run_totals(Window(), Filters())["run_id"])
    assert stored <= runs  # the verdict and runs tables: every run
    assert "&amp;span=" in html  # the query's & escaped inside the attribute


def test_markdown_report_links_ids_and_without_an_address_ids_are_plain(source):
    md = build_report(source, Window(), Filters(), None, "md", dashboard_url=BASE)
    doc = json.loads(build_report(source, Window(), Filters(), None, "json"))
    finding = doc["findings"][0]
    span = finding["evidence"][0]["span_id"]
    run_link = f"{BASE}/run_explorer?run={finding['run_id']}"
    assert f"]({run_link}&span={span})" in md and f"]({run_link}&q={finding['trace_id']})" in md
    for fmt in ("html", "md"):
        plain = build_report(source, Window(), Filters(), None, fmt)
        assert "run_explorer" not in plain and span in plain


@pytest.mark.slow
def test_cli_report_takes_the_dashboard_address_and_refuses_a_wrong_one(db, tmp_path):
    out = tmp_path / "r.html"
    args = [sys.executable, "-m", "driftscope", "report", "--source", str(db), "-o", str(out)]
    ok = subprocess.run([*args, "--dashboard-url", BASE], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert len(_links(out.read_text(encoding="utf-8"))) > 10
    bad = subprocess.run([*args, "--dashboard-url", "ftp://x/"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "--dashboard-url must be the dashboard's http(s) address, like http://127.0.0.1:8501" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    ("page_url", "base"),
    [
        ("http://127.0.0.1:8501/run_explorer", "http://127.0.0.1:8501"),
        ("http://127.0.0.1:8501/", "http://127.0.0.1:8501"),
        ("https://ops.example:443/driftscope/overview", "https://ops.example:443/driftscope"),
        ("", None),
        (None, None),
        ("javascript:alert(1)", None),
    ],
)
def test_dashboard_base_is_the_address_without_the_page(page_url, base):
    assert dashboard_base(page_url) == base


def test_every_format_says_what_goal_drift_cannot_see(source):
    """Issue 13 §5: the report says plainly what embedding divergence cannot see, from the
    goal_divergence Metric record (one text, every format)."""
    from analytics.registry import METRICS

    text = METRICS["goal_divergence"].blind_spots
    assert text and "on-topic" in text
    doc = json.loads(build_report(source, Window(), Filters(), None, "json"))
    assert {"metric": "goal_divergence", "title": "goal drift along delegation", "text": text} in doc[
        "blind_spots"
    ]
    assert all(METRICS[b["metric"]].blind_spots == b["text"] for b in doc["blind_spots"])
    html = build_report(source, Window(), Filters(), None, "html")
    assert "<h2>What these detectors cannot see</h2>" in html and "an answer from memory" in html
    md = build_report(source, Window(), Filters(), None, "md")
    assert "## What these detectors cannot see" in md and "**goal drift along delegation**" in md


def test_the_html_report_reads_well_in_chromium(tmp_path):
    """Issue 34, as a reviewer reads it: the span text gets the width (it wrapped one character per
    line in ~60 px while empty columns took equal shares), verdicts and headers do not break
    mid-word, findings are numbered in the order they are listed, the rejection-rate chart draws
    a bar per bucket, and the page is not 26,700 px tall for the sample crews."""
    from playwright.sync_api import sync_playwright

    from analytics.types import Filters, Window
    from dashboard.datasource import DuckDBFileSource
    from dashboard.report import build_report
    from tests.dashboard.test_dashboard_db import build_dashboard_db
    from tests.e2e.screenshots import CHROMIUM, CHROMIUM_ARGS, VIEWPORT

    source = DuckDBFileSource(build_dashboard_db(tmp_path / "crew.duckdb"))
    path = tmp_path / "report.html"
    path.write_text(build_report(source, Window(), Filters(), None, "html"), encoding="utf-8")
    ids = re.findall(r"<div class='finding [a-z-]+' id='(F\d+)'>", path.read_text(encoding="utf-8"))
    assert ids == [f"F{i}" for i in range(1, len(ids) + 1)]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(path.as_uri())
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        text_widths = page.eval_on_selector_all(
            "table.evidence td.text", "cells => cells.map(c => c.getBoundingClientRect().width)"
        )
        empty_columns = page.eval_on_selector_all(
            "table.evidence",
            """tables => tables.flatMap(t => [...t.tHead.rows[0].cells].map((th, i) =>
                [...t.tBodies[0].rows].every(r => !r.cells[i].textContent.trim() || r.cells[i].textContent.trim() === 'Unset')
                ? th.textContent : null).filter(Boolean))""",
        )
        # a header or verdict whose text takes more than one line broke inside a word ("failin/g")
        broken = page.eval_on_selector_all(
            "th, td.nowrap",
            """cells => cells.filter(c => {
                const range = document.createRange(); range.selectNodeContents(c);
                return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1;
            }).map(c => c.textContent)""",
        )
        bars = page.locator("svg[aria-label='rejection rate per time bucket'] rect").count()
        height = page.evaluate("document.documentElement.scrollHeight")
        browser.close()
    assert text_widths and min(text_widths) >= 400, text_widths
    assert not empty_columns, empty_columns
    assert not broken, broken
    assert bars >= 3  # the plot area and a bar per bucket
    assert height < 18_000, height
