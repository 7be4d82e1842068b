"""The incident path in Streamlit's AppTest (issue 34): every click lands on the right evidence,
the defaults point at failing data, and nothing reassures falsely.

A click on a table row is what the browser sends: the table's selection state (a cell), set on
the widget's key before a rerun (tests/e2e/test_browser.py clicks the real grid in Chromium).
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from analytics.types import Filters, Window
from dashboard import app_main
from dashboard.datasource import DuckDBFileSource
from dashboard.findings import as_list, finding_metrics, finding_rows
from dashboard.launch import SOURCE_ENV
from dashboard.overview import incident_runs, worst_first
from dashboard.tables import evidence_text, finding_key, lead_columns, row_target
from dashboard.ui import empty_message
from tests.dashboard.test_dashboard_db import build_dashboard_db

TIMEOUT = 120
EVIDENCE_ID = re.compile(r":gray\[([0-9a-f]+)\]")


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    return build_dashboard_db(tmp_path_factory.mktemp("path") / "crew.duckdb")


@pytest.fixture(scope="module")
def source(db_path):
    return DuckDBFileSource(db_path)


def _app(monkeypatch, db_path, page: str | None = None, query: dict | None = None) -> AppTest:
    monkeypatch.setenv(SOURCE_ENV, str(db_path))
    at = AppTest.from_file(app_main, default_timeout=TIMEOUT)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    if page:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def click_cell(at: AppTest, key: str, row: int, column: str = "what_happened") -> AppTest:
    """One click on a cell of the table ``key``, as the browser reports it."""
    at.session_state[key] = {"selection": {"rows": [], "columns": [], "cells": [[row, column]]}}
    return at.run()


def detectors_with_findings(source) -> list[dict]:
    return [
        m
        for m in finding_metrics(source.list_metrics())
        if not finding_rows(source.metric(m["name"], Window(), Filters()), m).empty
    ]


def test_a_click_on_any_findings_row_opens_exactly_that_finding(monkeypatch, db_path, source):
    """For every detector with findings, every finding row of its page's table: one click opens
    the run explorer in the same session with that finding selected, and the spans marked as
    evidence in the trace are exactly that finding's (not the run's finding #1)."""
    checked = 0
    for metric in detectors_with_findings(source):
        name, page = metric["name"], metric.get("page") or "findings"
        frame = source.metric(name, Window(), Filters())
        keys = {finding_key(name, ids): as_list(ids) for ids in finding_rows(frame, metric)["span_ids"]}
        at = _app(monkeypatch, db_path, page)
        table = at.dataframe(key=f"findings_{name}").value
        assert list(table.columns)[:3] == ["run_id", "what_happened", "evidence"], name
        for position in range(len(table)):
            if table["what_happened"][position].startswith("not a finding"):
                continue
            at = _app(monkeypatch, db_path, page)
            at = click_cell(at, f"findings_{name}", position)
            assert not at.exception, [e.value for e in at.exception]
            assert at.title[0].value == "Run explorer", (name, position)
            assert at.query_params["run"] == table["run_id"][position]
            wanted = at.query_params["finding"]
            evidence = keys[wanted]  # the key names one finding of this detector ...
            assert evidence_text(evidence) == table["evidence"][position]  # ... the row clicked
            line = next(m.value for m in at.markdown if m.value.startswith("**Finding "))
            assert re.findall(r"`([0-9a-f]+)`", line) == evidence[:12], (name, position)
            spans = set(source.run_spans(table["run_id"][position])["span_id"])
            marked = {EVIDENCE_ID.search(e.label).group(1) for e in at.expander if "[evidence]" in e.label}
            assert marked == set(evidence) & spans, (name, position)
            checked += 1
    assert checked >= 20  # every finding of the sample crews, each of the twelve detectors' pages


def test_a_row_that_is_no_finding_opens_at_its_evidence_span():
    metric = {"name": "stale_policy_sends", "flag_column": "allowed"}
    frame = pd.DataFrame(
        {
            "run_id": ["r1", "r1"],
            "span_ids": [["a", "b"], ["c"]],
            "allowed": [True, False],
            "agent": ["x", "y"],
        }
    )
    assert row_target(frame, metric, 0) == {
        "run": "r1",
        "finding": finding_key("stale_policy_sends", ["b", "a"]),
    }
    assert row_target(frame, metric, 1) == {"run": "r1", "span": "c"}
    shown = lead_columns(frame, metric)
    assert list(shown.columns[:3]) == ["run_id", "what_happened", "evidence"]
    assert shown["what_happened"][1].startswith("not a finding") and shown["evidence"][0] == "a, b"
    # a bucket over several runs names no single run to open
    buckets = pd.DataFrame({"run_ids": [["r1", "r2"]], "span_ids": [["a"]]})
    assert row_target(buckets, {"name": "rejection_rates"}, 0) is None


def test_the_run_explorer_opens_on_the_worst_failing_run_and_shows_verdicts(monkeypatch, db_path, source):
    at = _app(monkeypatch, db_path, "run_explorer")
    summary = worst_first(source.metric("run_summary", Window(), Filters()))
    picker = at.selectbox(key="explorer_run")
    assert picker.value == summary["run_id"].iloc[0] and summary["verdict"].iloc[0] == "failing"
    verdicts = dict(zip(summary["run_id"], summary["verdict"], strict=True))
    assert all(label.endswith(f" · {verdicts[label.split(' · ')[0]]}") for label in picker.options)
    # one "Run" control: the picker, not a sidebar run filter too
    assert [s.label for s in at.selectbox].count("Run") == 1


def test_the_split_brain_timeline_opens_on_a_lost_update(monkeypatch, db_path, source):
    at = _app(monkeypatch, db_path, "split_brain")
    lost = set(source.metric("lost_updates", Window(), Filters())["run_id"])
    assert at.selectbox(key="split_brain_run").value in lost
    assert [s.label for s in at.selectbox].count("Run") == 1


def test_empty_tables_blame_ingest_only_when_no_span_arrived():
    help_text = "export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318"
    empty = empty_message("lost updates", 0, "all time, no filters", help_text, "writes")
    assert help_text in empty and "no span has been received" in empty
    some = empty_message("lost updates", 274, "all time, no filters", help_text, "`driftscope.state.key`")
    assert help_text not in some
    assert some.startswith("Spans arrived (274 stored)") and "needs to see `driftscope.state.key`" in some


def test_every_findings_detector_says_what_it_needs_to_see(source):
    metrics = finding_metrics(source.list_metrics())
    assert metrics and all(m.get("needs") for m in metrics)
    assert "driftscope.state.key" in next(m["needs"] for m in metrics if m["name"] == "lost_updates")


def test_overview_tiles_link_to_their_page_and_show_refusals_as_prevented(monkeypatch, db_path):
    at = _app(monkeypatch, db_path)
    verdicts = {f"{v} runs" for v in ("failing", "to review", "degraded", "healthy")}
    tiles = {m.label: m for m in at.metric if m.label not in verdicts}
    assert tiles["lost updates (split-brain)"].proto.delta == "failing"
    assert tiles["rejection rate over threshold"].proto.delta == "prevented"  # guards refusing
    assert tiles["goal drift along delegation"].proto.delta == "to review"
    assert tiles["runaway runs"].proto.delta == "clear"
    assert not any(m.proto.chart_data for m in at.metric)  # no bars without a time axis
    links = [link.proto for link in at.get("page_link") if link.proto.label.endswith(" →")]
    assert len(links) == len(tiles)
    assert {p.label for p in links} >= {"Split-brain →", "Loops & budgets →", "Rejections & enforcement →"}
    # a tile opens its page for the window the Overview shows
    at.selectbox(key="window").set_value("Last 24 h").run()
    links = [link.proto for link in at.get("page_link") if link.proto.label.endswith(" →")]
    assert links and all(p.query_string == "window=Last+24+h" for p in links), links[0].query_string


def test_the_runs_table_lists_every_failing_run_first_column_the_run(source):
    summary = source.metric("run_summary", Window(), Filters())
    from dashboard.findings import gather_findings

    found = gather_findings(source, Window(), Filters())
    failing = int((summary["verdict"] == "failing").sum())
    listed = incident_runs(summary, found, pd.Timestamp("2026-02-01").to_pydatetime(), limit=2)
    assert failing > 2 and (listed["verdict"] == "failing").sum() == failing
