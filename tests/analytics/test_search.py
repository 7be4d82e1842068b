"""Search across runs (analytics.search): ids exactly, any attribute value as a substring."""

from __future__ import annotations

from datetime import timedelta

import duckdb
import pytest

from analytics.search import search_spans
from analytics.types import Filters, Window
from tests.dashboard.test_dashboard_db import build_dashboard_db


@pytest.fixture(scope="module")
def conn(tmp_path_factory):
    path = build_dashboard_db(tmp_path_factory.mktemp("search") / "crew.duckdb")
    connection = duckdb.connect(str(path), read_only=True)
    yield connection
    connection.close()


def test_a_trace_id_finds_every_span_of_that_trace_in_its_run(conn):
    trace, run, spans = conn.execute(
        "SELECT TraceId, any_value(run_id), count(*) FROM spans GROUP BY TraceId ORDER BY count(*) DESC LIMIT 1"
    ).fetchone()
    found = search_spans(conn, trace.upper(), limit=1000)  # pasted in any case
    assert len(found) == spans and set(found["trace_id"]) == {trace} and set(found["run_id"]) == {run}
    assert set(found["matched"]) == {"trace id"}


def test_a_span_id_finds_that_span_only(conn):
    span, run = conn.execute("SELECT SpanId, run_id FROM spans ORDER BY SpanId LIMIT 1 OFFSET 77").fetchone()
    found = search_spans(conn, f"  {span} ")
    assert found[["span_id", "run_id", "matched"]].values.tolist() == [[span, run, "span id"]]


def test_an_attribute_value_finds_spans_across_runs_and_names_the_key(conn):
    found = search_spans(conn, "inv-9001", limit=1000)  # INV-9001: the invoice the healthy crews send
    expected = conn.execute(
        "SELECT count(*) FROM spans WHERE len(list_filter(SpanAttributes, lambda a: a.value ILIKE '%inv-9001%')) > 0"
    ).fetchone()[0]
    assert len(found) == expected > 1 and found["run_id"].nunique() > 1
    assert set(found["matched"]) <= {"gen_ai.tool.call.result", "gen_ai.tool.call.arguments"}


def test_window_filters_and_limit_scope_the_search(conn):
    everything = search_spans(conn, "report/q3", limit=1000)
    run = everything["run_id"].iloc[0]
    scoped = search_spans(conn, "report/q3", filters=Filters(run=run), limit=1000)
    assert len(scoped) and set(scoped["run_id"]) == {run} and len(scoped) < len(everything)
    assert len(search_spans(conn, "report/q3", limit=3)) == 3
    newest = everything["start"].max()
    assert search_spans(conn, "report/q3", Window(since=newest + timedelta(seconds=1))).empty


def test_id_matches_come_before_text_matches_and_nothing_matches_nothing(conn):
    span = conn.execute("SELECT SpanId FROM spans LIMIT 1").fetchone()[0]
    assert search_spans(conn, span)["matched"].iloc[0] == "span id"
    assert search_spans(conn, "no-such-value-anywhere").empty


@pytest.mark.parametrize("text", ["", "  ", "ab", "x" * 513])
def test_too_short_or_too_long_text_is_refused_with_the_reason(conn, text):
    with pytest.raises(ValueError, match="Search text must be"):
        search_spans(conn, text)
