"""Search across runs from the dashboard (issue 16 §2): the run explorer's "Search all runs" box
finds a trace id, span id or attribute value in any run and links each result to the run explorer
at that span; the same search through a running collector's read API."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboard.datasource import DuckDBFileSource, HttpSource
from dashboard.search import describe_results, search_results_table
from tests.dashboard.test_dashboard_db import build_dashboard_db
from tests.dashboard.test_pages import _run_page
from tests.serve_helpers import new_serve


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    return build_dashboard_db(tmp_path_factory.mktemp("search") / "crew.duckdb")


def test_results_link_to_the_run_explorer_at_their_span():
    results = pd.DataFrame(
        {
            "run_id": ["run a/1", "run-b"],
            "trace_id": ["t1", "t2"],
            "span_id": ["s1", "s2"],
            "span_name": ["x", "y"],
            "agent_id": ["a", "b"],
            "service": ["crew", "crew"],
            "start": pd.to_datetime(["2026-01-01", "2026-01-02"]),
            "matched": ["trace id", "gen_ai.tool.call.arguments"],
        }
    )
    table = search_results_table(results)
    assert table.columns[0] == "open"
    assert table["open"].tolist() == [
        "run_explorer?run=run%20a%2F1&span=s1&q=t1",  # a trace match also marks the trace's spans
        "run_explorer?run=run-b&span=s2",
    ]
    assert describe_results(results, "t1", 2) == (
        "2 span(s) in 2 run(s) match 't1' (the first 2; narrow the window or filters for the rest)."
    )
    assert describe_results(results.iloc[:0], "zz", 2) == "No span matches 'zz'."


def test_search_box_finds_a_span_id_of_another_run_and_links_there(monkeypatch, db_path):
    source = DuckDBFileSource(db_path)
    runs = source.run_totals(*_all())["run_id"].tolist()
    spans = source.run_spans(runs[-1])  # not the run the explorer opens first
    span = str(spans["span_id"].iloc[3])
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"find": span})
    caption = " ".join(c.value for c in at.caption)
    assert f"1 span(s) in 1 run(s) match '{span}'" in caption
    table = at.dataframe[0].value
    assert table["open"].tolist() == [f"run_explorer?run={runs[-1]}&span={span}"]
    assert table["matched"].tolist() == ["span id"]
    # Following the link opens that run with the span inspected.
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": runs[-1], "span": span})
    assert f"Attributes of span {span}" in [s.value for s in at.subheader]


def test_search_box_finds_an_attribute_value_across_runs(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"find": "INV-9001"})
    table = at.dataframe[0].value
    assert table["run_id"].nunique() > 1 and set(table["matched"]) == {"gen_ai.tool.call.result"}
    assert all(link.startswith("run_explorer?run=") and "&span=" in link for link in table["open"])
    at.text_input(key="find").set_value("ab").run()
    assert "Type at least 3 characters to search." in [c.value for c in at.caption]
    at.text_input(key="find").set_value("no-such-value-anywhere").run()
    assert not at.exception and any("No span matches" in c.value for c in at.caption)


def _all():
    from analytics.types import Filters, Window

    return Window(), Filters()


def test_search_through_the_read_api_answers_as_the_file_does(tmp_path, db_path):
    db = tmp_path / "live.duckdb"
    db.write_bytes(db_path.read_bytes())
    serve = new_serve(tmp_path, db=db).start()
    try:
        http = HttpSource(serve.http_url)
        offline = DuckDBFileSource(db_path)
        for text in ("INV-9001", "report/q3"):
            over_http = http.search_spans(text, *_all(), limit=500)
            in_file = offline.search_spans(text, *_all(), limit=500)
            assert len(over_http) > 0
            pd.testing.assert_frame_equal(over_http, in_file, check_dtype=False)
        import httpx

        short = httpx.get(f"{serve.http_url}/api/v1/search", params={"q": "ab"}, timeout=30)
        assert short.status_code == 400 and "at least 3 characters" in short.json()["error"]
        missing = httpx.get(f"{serve.http_url}/api/v1/search", timeout=30)
        assert missing.status_code == 400 and "q is required" in missing.json()["error"]
    finally:
        assert serve.stop() == 0
