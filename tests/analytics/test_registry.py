"""A detector is one SQL file and one registration (issue 15).

A toy detector, registered in a scratch registry with its SQL in a file of its own, shows up in
the read API (in-process ASGI client over a real DuckDB file), the run summary, the dashboard
(Streamlit AppTest on the file) and the report (the real renderers), with nothing else changed.
"""

from __future__ import annotations

import json
import threading
import time

import duckdb
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.testclient import TestClient
from streamlit.testing.v1 import AppTest

from analytics import read
from analytics._evidence import EVIDENCE, TIMES
from analytics.registry import METRICS, register, run_metric, scratch_registry
from analytics.sql_loader import expand_fragments, filter_params, query_df
from analytics.types import Filters, Window
from dashboard import app_main
from dashboard.datasource import DuckDBFileSource, HttpSource
from dashboard.findings import gather_findings
from dashboard.launch import SOURCE_ENV
from dashboard.report import build_report
from driftscope.api import build_api_routes
from driftscope.database import migrate
from tests.fixtures_analytics import insert_spans, make_span
from tests.serve_helpers import free_port

TOY = "toy_unchecked_refunds"
TITLE = "refund without a check (toy)"
MODE = "toy: money went out before anyone checked the order"
TOY_SQL = """-- toy_unchecked_refunds: calls of the tool 'refund' (a toy detector for the registry test).
WITH s AS ({filtered_spans})
SELECT TraceId AS trace_id, [SpanId] AS span_ids, run_id, agent_id AS agent, Timestamp AS first_seen,
       Timestamp AS last_seen
FROM s
WHERE tool_name = 'refund'
ORDER BY first_seen
"""


@pytest.fixture
def toy_db(tmp_path):
    """A DuckDB file with one run that refunds and one that does not; the toy detector registered."""
    path = tmp_path / "toy.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn)
    insert_spans(
        conn,
        [
            make_span(0, run="run-refund", agent_id="cashier", tool_name="lookup_order"),
            make_span(1, run="run-refund", agent_id="cashier", tool_name="refund"),
            make_span(0, run="run-quiet", agent_id="cashier", tool_name="lookup_order"),
        ],
    )
    conn.close()
    sql_file = tmp_path / f"{TOY}.sql"  # the one SQL file
    sql_file.write_text(TOY_SQL, encoding="utf-8")
    with scratch_registry():

        @register(  # the one registration
            TOY,
            description="Refunds issued without an order check (toy).",
            columns={**EVIDENCE, "agent": "agent that refunded", **TIMES},
            row="one refund call",
            title=TITLE,
            failure_mode=MODE,
            mast_category="task verification",
            findings=True,
            needs="refund calls (`gen_ai.tool.name` = refund)",
            counted=True,
            failing=True,
        )
        def toy_unchecked_refunds(conn, window, filters):
            return query_df(conn, expand_fragments(sql_file.read_text()), filter_params(window, filters))

        yield path
    assert TOY not in METRICS  # the scratch registry forgot it


def test_a_scratch_registration_is_checked_and_forgotten():
    with scratch_registry(), pytest.raises(ValueError, match="needs title"):
        register(TOY, description="d", columns={"run_id": "r"}, row="r", findings=True)(lambda *a: None)
    with scratch_registry(), pytest.raises(ValueError, match="flag_column 'nope'"):
        register(
            TOY, description="d", columns={"run_id": "r"}, row="r", title="t", failure_mode="m",
            mast_category="task verification", findings=True, needs="n", flag_column="nope",
        )(lambda *a: None)  # fmt: skip
    # a findings detector says what it needs to see (an empty table says it instead of blaming ingest)
    with scratch_registry(), pytest.raises(ValueError, match="needs needs"):
        register(
            TOY, description="d", columns={"run_id": "r"}, row="r", title="t", failure_mode="m",
            mast_category="task verification", findings=True,
        )(lambda *a: None)  # fmt: skip
    assert TOY not in METRICS


def test_a_new_detector_reaches_the_api(toy_db):
    conn = duckdb.connect(str(toy_db), read_only=True)
    try:
        app = Starlette(routes=build_api_routes(conn.cursor, None, dict))
        with TestClient(app) as client:
            described = {m["name"]: m for m in client.get("/api/v1/metrics").json()["metrics"]}
            toy = described[TOY]
            assert (toy["title"], toy["failure_mode"], toy["mast_category"]) == (
                TITLE,
                MODE,
                "task verification",
            )
            assert toy["findings"] and toy["counted"] and toy["failing"] and toy["flag_column"] is None
            assert list(toy["columns"]) == [
                "trace_id",
                "span_ids",
                "run_id",
                "agent",
                "first_seen",
                "last_seen",
            ]
            assert toy == json.loads(json.dumps(read.describe_metric(METRICS[TOY]), default=str))
            rows = client.get(f"/api/v1/metrics/{TOY}").json()["rows"]
            assert [(r["run_id"], r["agent"]) for r in rows] == [("run-refund", "cashier")]
            summary = client.get("/api/v1/metrics/run_summary").json()
            assert f"{TOY}_count" in summary["columns"]
            verdicts = {r["run_id"]: (r[f"{TOY}_count"], r["verdict"]) for r in summary["rows"]}
            assert verdicts == {"run-refund": (1, "failing"), "run-quiet": (0, "healthy")}
    finally:
        conn.close()


def test_a_new_detector_reaches_the_http_source_through_the_api(toy_db):
    """The dashboard's HTTP source learns the detector's facts from the API's descriptions alone."""
    conn = duckdb.connect(str(toy_db), read_only=True)
    port = free_port()
    app = Starlette(routes=build_api_routes(conn.cursor, None, dict))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        source = HttpSource(f"http://127.0.0.1:{port}")
        found = gather_findings(source, Window(), Filters())
        (finding,) = found.by_metric[TOY].findings()
        assert (finding.run_id, finding.failure_mode, finding.status) == ("run-refund", MODE, "failure")
        doc = json.loads(build_report(source, Window(), Filters(), None, "json"))
        assert [f["run_id"] for f in doc["findings"] if f["metric"] == TOY] == ["run-refund"]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        conn.close()


def test_a_new_detector_counts_in_the_run_summary(toy_db):
    conn = duckdb.connect(str(toy_db), read_only=True)
    try:
        summary = run_metric(conn, "run_summary").set_index("run_id")
    finally:
        conn.close()
    assert (
        summary.loc["run-refund", f"{TOY}_count"] == 1 and summary.loc["run-refund", "verdict"] == "failing"
    )
    assert summary.loc["run-quiet", "verdict"] == "healthy"
    assert TITLE in METRICS["run_summary"].columns["verdict"]  # the verdict's documentation names it


def test_a_new_detector_appears_in_the_dashboard(toy_db, monkeypatch):
    monkeypatch.setenv(SOURCE_ENV, str(toy_db))
    at = AppTest.from_file(app_main, default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    tiles = {m.label: m.value for m in at.metric}
    assert tiles[TITLE] == "1"  # the Overview's tile of its failure mode
    incidents = at.dataframe[0].value.set_index("run_id")
    assert incidents.loc["run-refund", "verdict"] == "failing"
    assert incidents.loc["run-refund", "worst_failure_mode"] == MODE
    at.switch_page("views/findings.py")  # a detector without a page of its own is listed here
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert TITLE in [s.value for s in at.subheader]
    assert "run-refund" in "\n".join(df.value.to_string() for df in at.dataframe)


def test_a_new_detector_appears_in_the_report(toy_db):
    source = DuckDBFileSource(toy_db)
    try:
        doc = json.loads(build_report(source, Window(), Filters(), None, "json"))
        html = build_report(source, Window(), Filters(), None, "html")
        markdown = build_report(source, Window(), Filters(), None, "md")
    finally:
        source.close()
    modes = {row["metric"]: row for row in doc["summary"]["by_failure_mode"]}
    assert modes[TOY]["title"] == TITLE and modes[TOY]["findings"] == 1
    assert modes[TOY]["mast_category"] == "task verification"
    (finding,) = [f for f in doc["findings"] if f["metric"] == TOY]
    assert (finding["run_id"], finding["status"], finding["failure_mode"]) == ("run-refund", "failure", MODE)
    assert doc["summary"]["by_mast_category"]["task verification"] == 1
    for text in (html, markdown):
        assert MODE in text and "run-refund" in text
    assert TITLE in html  # the findings-per-mode chart


def test_a_detector_whose_rows_can_recover_gets_its_own_summary_counts(tmp_path):
    """failing_unless: a row without the recovery column is a failure whatever the count; a row
    with it only a warning. The summary's columns and verdicts follow from the registration."""
    path = tmp_path / "recover.duckdb"
    conn = duckdb.connect(str(path))
    migrate(conn)
    insert_spans(
        conn,
        [
            make_span(0, run="run-unchecked", agent_id="cashier", tool_name="refund"),
            make_span(0, run="run-checked", agent_id="cashier", tool_name="refund", outcome="ok"),
            make_span(0, run="run-quiet", agent_id="cashier", tool_name="lookup_order"),
        ],
    )
    sql = TOY_SQL.replace("Timestamp AS last_seen", "Timestamp AS last_seen, outcome = 'ok' AS checked")
    with scratch_registry():

        @register(
            TOY,
            description="Refunds, checked afterwards or not (toy).",
            columns={**EVIDENCE, "agent": "agent that refunded", **TIMES, "checked": "checked afterwards"},
            row="one refund call",
            title=TITLE,
            failure_mode=MODE,
            mast_category="task verification",
            findings=True,
            needs="refund calls",
            failing_unless="checked",
        )
        def toy_refunds(conn, window, filters):
            return query_df(conn, expand_fragments(sql), filter_params(window, filters))

        columns = METRICS["run_summary"].columns
        summary = run_metric(conn, "run_summary").set_index("run_id")
    conn.close()
    assert f"{TOY}_count" in columns and f"{TOY}_unrecovered" in columns
    assert f"{TITLE} without checked" in columns["verdict"]
    assert summary.loc["run-unchecked", [f"{TOY}_count", f"{TOY}_unrecovered", "verdict"]].tolist() == [
        1, 1, "failing"
    ]  # fmt: skip
    assert summary.loc["run-checked", [f"{TOY}_count", f"{TOY}_unrecovered", "verdict"]].tolist() == [
        1, 0, "degraded"
    ]  # fmt: skip
    assert summary.loc["run-quiet", "verdict"] == "healthy"


def test_what_is_kept_is_stated_at_registration_and_forgotten_with_it():
    from analytics import materialize

    maintained = materialize.maintained()
    kept = {m.name: m for m in METRICS.values() if m.kept}
    assert set(kept) <= set(maintained)
    for name, metric in kept.items():
        item = maintained[name]
        assert item.partition == (None if metric.kept == "whole" else metric.kept), name
        assert item.order == metric.order, name
    columns = {**EVIDENCE, "agent": "a", **TIMES}
    with scratch_registry():
        register(
            TOY, description="d", columns=columns, row="r", kept="run_id", order=[("first_seen", False)]
        )(lambda *a: None)
        toy = materialize.maintained()[TOY]
        assert toy.partition == "run_id" and toy.order == (("first_seen", False),)
        with pytest.raises(ValueError, match="kept by 'origin_task_id'"):
            register(TOY, description="d", columns=columns, row="r", kept="origin_task_id")(lambda *a: None)
        with pytest.raises(ValueError, match="kept must be 'whole' or one of run_id, origin_task_id"):
            register(TOY, description="d", columns=columns, row="r", kept="agent")(lambda *a: None)
        with pytest.raises(ValueError, match="order column 'nope'"):
            register(TOY, description="d", columns=columns, row="r", kept="run_id", order=[("nope", False)])(
                lambda *a: None
            )
        with pytest.raises(ValueError, match="needs its row order"):
            register(TOY, description="d", columns=columns, row="r", kept="run_id")(lambda *a: None)
    assert TOY not in materialize.maintained()


def test_a_window_holding_every_span_is_answered_as_the_whole_store_except_by_window_shaped_metrics(tmp_path):
    """A page or report over "the last N hours" of a store with nothing older reads the findings
    tables; a window that leaves one span out, and a metric whose result uses the window's bounds
    (rejection_rates' buckets), are computed for that window (or, for a run-partitioned
    detector, the runs it cuts)."""
    from datetime import timedelta
    from pathlib import Path

    import pandas as pd

    from analytics import materialize
    from analytics.registry import compute_metric
    from analytics.types import direct_write
    from collector.files import ingest_files
    from driftscope.database import migrate
    from tests.analytics.test_materialize import _canonical

    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    samples = Path(__file__).resolve().parents[2] / "sample_traces"
    ingest_files(
        None, sorted(p for p in samples.glob("*.json") if not p.name.endswith(".truth.json")), conn=conn
    )
    cursor = conn.cursor()
    materialize.bring_up_to_date(cursor, direct_write(conn))
    cursor.close()
    first, last = conn.execute("SELECT min(Timestamp), max(Timestamp) FROM spans").fetchone()
    covering = Window(since=first, until=last + timedelta(microseconds=1))
    short = Window(since=first, until=last)  # the last span starts at `until`: outside
    shaped = [name for name, m in METRICS.items() if m.window_bounds]
    assert shaped == ["rejection_rates"]
    kept = sorted(name for name, m in METRICS.items() if m.kept)
    assert kept
    for name in kept:
        got = run_metric(conn, name, covering)
        expected = compute_metric(conn, name, covering)
        pd.testing.assert_frame_equal(_canonical(got), _canonical(expected), obj=name)
        if name in shaped:
            assert got.attrs.get("source") != "table", name
            continue
        assert got.attrs.get("source") == "table", name  # the whole store's table, a SELECT
        pd.testing.assert_frame_equal(got, run_metric(conn, name), obj=name)
        cut = run_metric(conn, name, short)
        pd.testing.assert_frame_equal(
            _canonical(cut), _canonical(compute_metric(conn, name, short)), obj=name
        )
        if materialize.maintained()[name].partition != "run_id":
            assert cut.attrs.get("source") != "table", name  # computed for that window
