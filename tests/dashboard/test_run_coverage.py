"""The run explorer says what a run's telemetry did not let the detectors see (run_summary's
``coverage``), on spans Google ADK's own exporter sent in its default configuration."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from collector.decode import PROTOBUF, decode_payload
from collector.store import TraceIndex, insert_batches, open_store
from corpus.dump import read_requests
from dashboard import app_main
from dashboard.launch import SOURCE_ENV
from driftscope.database import open_database

CORPUS = Path(__file__).resolve().parents[2] / "sample_traces" / "frameworks"
TIMEOUT = 120


def _store_captures(db: Path, run_sets: list[str]) -> None:
    """The captured requests of corpus run sets, decoded and stored as serve stores them."""
    open_database(db).close()
    conn = open_store(db)
    traces = TraceIndex(conn)
    try:
        for run_set in run_sets:
            for record in read_requests(CORPUS / run_set / "otlp.jsonl"):
                body = record["body"]
                if record.get("content_encoding") == "gzip":
                    body = gzip.decompress(body)
                conn.execute("BEGIN TRANSACTION")
                insert_batches(conn, [decode_payload(body, PROTOBUF)], traces)
                conn.execute("COMMIT")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def adk_db(tmp_path_factory):
    """ADK's default configuration (runs adk-*) and with content capture on (runs adkc-*)."""
    db = tmp_path_factory.mktemp("coverage") / "adk.duckdb"
    _store_captures(db, ["adk", "adk-content"])
    return db


def _explorer(monkeypatch, db: Path, run: str) -> AppTest:
    monkeypatch.setenv(SOURCE_ENV, str(db))
    at = AppTest.from_file(app_main, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("views/run_explorer.py")
    at.query_params["run"] = run
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_run_explorer_says_which_detectors_a_runs_default_telemetry_leaves_blind(monkeypatch, adk_db):
    at = _explorer(monkeypatch, adk_db, "adk-healthy-northwind")
    notes = [box.value for box in at.info if "could not be fully measured" in box.value]
    assert len(notes) == 1, [box.value for box in at.info]
    note = notes[0]
    assert "repeated calls and duplicate side effects not measurable" in note
    assert "goal drift not measurable" in note
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY (Google ADK)" in note


def test_run_explorer_shows_no_coverage_note_where_content_was_captured(monkeypatch, adk_db):
    at = _explorer(monkeypatch, adk_db, "adkc-healthy-northwind")
    assert not [box.value for box in at.info if "could not be fully measured" in box.value]
    assert any(metric.label == "Spans" for metric in at.metric)  # the run itself is shown
