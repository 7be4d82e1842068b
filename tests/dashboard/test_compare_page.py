"""The run explorer's "Compare with healthy runs" view and the Overview's link to it (issue 35),
rendered with AppTest on a real DuckDB file; the view's figures and tables as pure functions."""

from __future__ import annotations

import json

import duckdb
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from analytics.compare import compare_run
from dashboard import app_main
from dashboard.figures_compare import aligned_waterfalls_figure, difference_table
from dashboard.launch import SOURCE_ENV
from driftscope.database import migrate
from tests.compare_crews import crew_rows, crew_steps
from tests.fixtures_analytics import insert_spans

TIMEOUT = 120


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    """Crew ``crew``: three healthy runs and ``bad`` (a failing loop of identical searches, the
    first three failing); crew ``lonely``: two failing runs and no healthy one."""
    path = tmp_path_factory.mktemp("compare") / "crew.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn)
    rows = []
    for i in range(3):
        rows += crew_rows(f"h{i}", crew_steps(searches=1 + i % 2, query=f"h{i}"), t0=100 * i)
    rows += crew_rows("bad", crew_steps(searches=5, failing=3, vary=False), t0=1000)
    for i in range(2):
        rows += crew_rows(
            f"lonely{i}", crew_steps(searches=5 + i, vary=False), service="lonely", t0=2000 + 100 * i
        )
    insert_spans(conn, rows)
    conn.close()
    return path


def _page(monkeypatch, db_path, page: str | None, query: dict) -> AppTest:
    monkeypatch.setenv(SOURCE_ENV, str(db_path))
    at = AppTest.from_file(app_main, default_timeout=TIMEOUT)
    at.run()
    if page:
        at.switch_page(f"views/{page}.py")
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_overview_links_a_failing_run_to_its_comparison(monkeypatch, db_path):
    at = _page(monkeypatch, db_path, None, {})
    links = [link.proto for link in at.get("page_link")]
    compare = [p for p in links if p.label.startswith("Compare run")]
    assert compare, [p.label for p in links]
    assert any("bad" in p.label for p in compare)
    assert all("compare=auto" in p.query_string for p in compare)


def test_the_comparison_names_the_departure_and_lists_the_differences(monkeypatch, db_path):
    at = _page(monkeypatch, db_path, "run_explorer", {"run": "bad", "compare": "auto"})
    assert at.toggle[0].value is True
    assert "What differs from healthy runs" in [s.value for s in at.subheader]
    assert any("compared with 3 healthy run" in c.value and "of crew crew" in c.value for c in at.caption)
    assert "First departs at step 3" in at.error[0].value and "researcher · web\\_search" in at.error[0].value
    differences = next(df.value for df in at.dataframe if "difference" in df.value.columns)
    assert {"more calls", "errors"} <= set(differences["difference"])
    assert all(link.startswith("run_explorer?run=bad&span=") for link in differences["span"])
    assert at.get("plotly_chart"), "the aligned waterfalls"
    assert "Trace" not in [s.value for s in at.subheader]  # the comparison replaces the trace view


def test_switching_the_comparison_off_shows_the_trace_again(monkeypatch, db_path):
    at = _page(monkeypatch, db_path, "run_explorer", {"run": "bad", "compare": "auto"})
    at.toggle[0].set_value(False).run()
    assert not at.exception
    assert "Trace" in [s.value for s in at.subheader] and "compare" not in at.query_params


def test_a_crew_without_healthy_runs_says_so_and_compares_with_a_picked_run(monkeypatch, db_path):
    at = _page(monkeypatch, db_path, "run_explorer", {"run": "lonely0", "compare": "auto"})
    assert "no baseline" in at.warning[0].value
    picker = next(s for s in at.selectbox if s.label == "Compare with")
    assert "lonely1" in picker.options[1]
    picker.set_value("lonely1").run()
    assert not at.exception
    assert at.query_params["compare"] == ["lonely1"] or at.query_params["compare"] == "lonely1"
    assert "Side by side" in [s.value for s in at.subheader]
    assert "No departure" in at.success[0].value  # five searches are within a run that made six


def test_aligned_waterfalls_mark_the_departure_and_the_table_links_spans(db_path):
    conn = duckdb.connect(str(db_path), read_only=True)
    answer = compare_run(conn, "bad")
    alignment = pd.DataFrame(answer["alignment"])
    fig = aligned_waterfalls_figure(alignment, "bad", answer["baseline"]["closest_run"])
    run_bars, baseline_bars = fig.data
    marked = alignment.index[alignment["departure"]].tolist()
    assert len(marked) == 1 and run_bars.marker.color[marked[0]] == "#9467bd"
    assert len(run_bars.y) == len(baseline_bars.y) == len(alignment)
    table = difference_table(answer)
    assert list(table["span"]) == [
        f"run_explorer?run=bad&span={d['span_ids'][0]}" for d in answer["differences"]
    ]
    assert (
        aligned_waterfalls_figure(pd.DataFrame(), "bad", None).layout.annotations[0].text
        == "No steps to align"
    )


def test_a_run_report_has_a_what_differs_section_and_a_window_report_none(db_path):
    from analytics.types import Filters, Window
    from dashboard.datasource import DuckDBFileSource
    from dashboard.report import build_report

    source = DuckDBFileSource(db_path)
    try:
        md = build_report(
            source, Window(), Filters(), run="bad", fmt="md", dashboard_url="http://127.0.0.1:8501"
        )
        html = build_report(source, Window(), Filters(), run="bad", fmt="html")
        doc = json.loads(build_report(source, Window(), Filters(), run="bad", fmt="json"))
        window = json.loads(build_report(source, Window(), Filters(), fmt="json"))
    finally:
        source.close()
    section = md[md.index("## What differs from healthy runs") :]
    assert "First departs at step 3" in section and "| more calls | researcher · web\\_search |" in section
    assert "](http://127.0.0.1:8501/run_explorer?run=bad&span=" in section
    assert "<h2>What differs from healthy runs</h2>" in html and "First departs at step 3" in html
    assert doc["comparison"]["departure"]["pos"] == 3 and doc["comparison"]["baseline"]["runs"] == 3
    assert window["comparison"] is None and "What differs" not in build_report_md_window(db_path)


def build_report_md_window(db_path) -> str:
    from analytics.types import Filters, Window
    from dashboard.datasource import DuckDBFileSource
    from dashboard.report import build_report

    source = DuckDBFileSource(db_path)
    try:
        return build_report(source, Window(), Filters(), fmt="md")
    finally:
        source.close()
