"""The two data sources read the same answers: the read API of a real `driftscope serve` and a file."""

from __future__ import annotations

import json
import shutil
import threading

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from analytics.types import Filters, Window
from dashboard import app_main
from dashboard.datasource import DuckDBFileSource, HttpSource, SourceUnavailable, open_source, window_params
from dashboard.findings import collect_findings, counted_columns, gather_findings
from dashboard.launch import SOURCE_ENV, TOKEN_ENV
from dashboard.report import build_report
from tests.dashboard.test_dashboard_db import XSS_RUN, build_dashboard_db, expected_findings
from tests.serve_helpers import free_port

TOKEN = "dashboard-test-token"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """(HttpSource on a serve holding one copy, DuckDBFileSource on another copy)."""
    from tests.serve_helpers import new_serve

    folder = tmp_path_factory.mktemp("sources")
    served = build_dashboard_db(folder / "served.duckdb")
    offline = folder / "offline.duckdb"
    shutil.copy(served, offline)
    server = new_serve(folder, db=served, token=TOKEN).start()
    try:
        yield HttpSource(server.http_url, TOKEN), DuckDBFileSource(offline)
    finally:
        server.stop()


def _comparable(frame: pd.DataFrame) -> list[dict]:
    """Rows as JSON-normal dicts (arrays as lists, timestamps as text) for equality across transports."""
    return json.loads(frame.to_json(orient="records", date_format="iso", default_handler=str))


@pytest.mark.slow
def test_http_and_file_sources_agree_on_every_metric(sources):
    http, offline = sources
    assert http.health().ok and offline.health().ok
    names = [m["name"] for m in offline.list_metrics()]
    # One description of each metric (analytics.read.describe_metric), in catalogue order, both ways.
    assert http.list_metrics() == json.loads(json.dumps(offline.list_metrics()))
    for name in names:
        remote, local = http.metric(name, Window(), Filters()), offline.metric(name, Window(), Filters())
        assert list(remote.columns) == list(local.columns), name
        assert _comparable(remote) == _comparable(local), name


@pytest.mark.slow
def test_run_spans_containing_keeps_the_spans_whose_texts_state_an_id_on_both_sources(sources):
    """A report looks for where a dropped constraint is stated among a run's spans: the filter
    keeps exactly the spans whose tool arguments, input or goal text contain one of the texts."""
    import httpx

    from tests.dashboard.test_dashboard_db import truths

    http, offline = sources
    run, drop = next((t["run_id"], d) for t in truths() for d in t["constraint_drops"])
    every = offline.run_spans(run)
    texts = [drop["constraint_id"], "no such text anywhere"]
    stating = [
        row.span_id
        for row in every.itertuples()
        if any(
            t in str(v)
            for t in texts
            for v in (row.tool_args, row.input_text, row.goal_text)
            if v is not None
        )
    ]
    assert 0 < len(stating) < len(every)
    for source in (http, offline):
        assert list(source.run_spans(run, containing=texts)["span_id"]) == stating
        assert source.run_spans(run, containing=["no such text anywhere"]).empty
    assert list(http.run_spans(run, containing=["a,b"])["span_id"]) == list(every["span_id"])  # no filter
    too_many = ",".join(f"C{i}" for i in range(51))
    answer = httpx.get(
        f"{http.url}/api/v1/runs/{run}/spans", params={"containing": too_many},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )  # fmt: skip
    assert answer.status_code == 400 and "containing must be 1 to 50" in answer.json()["error"]


@pytest.mark.slow
def test_http_and_file_sources_agree_on_runs_spans_thresholds_and_findings(sources):
    http, offline = sources
    runs_http, runs_file = http.runs(Window(), Filters()), offline.runs(Window(), Filters())
    assert set(runs_http["run_id"]) == set(runs_file["run_id"]) == set(expected_findings())
    spans_http, spans_file = http.run_spans(XSS_RUN), offline.run_spans(XSS_RUN)
    assert list(spans_http["span_id"]) == list(spans_file["span_id"]) and len(spans_file) == 4
    assert spans_http["attributes"].iloc[0] == spans_file["attributes"].iloc[0]
    assert http.run_spans("no-such-run").empty and offline.run_spans("no-such-run").empty
    assert _comparable(http.thresholds()) == _comparable(offline.thresholds())
    found_http, _, errors_http = collect_findings(http, Window(), Filters())
    found_file, _, errors_file = collect_findings(offline, Window(), Filters())
    assert errors_http == errors_file == {}
    assert [(f.metric, f.run_id, f.span_ids) for f in found_http] == [
        (f.metric, f.run_id, f.span_ids) for f in found_file
    ]


@pytest.mark.slow
def test_parallel_reads_gather_what_one_at_a_time_does(sources):
    """The dashboard reads a collector's detectors several at once: the same findings as one
    after another, and a detector that fails is still reported alone."""
    http, _ = sources
    serial = gather_findings(http, Window(), Filters())
    threads: set[str] = set()

    def read(name: str) -> pd.DataFrame:
        threads.add(threading.current_thread().name)
        if name == "ping_pong":
            raise RuntimeError("ping_pong broke")
        return http.metric(name, Window(), Filters())

    together = gather_findings(http, Window(), Filters(), read=read, parallel=4)
    assert len(threads) > 1  # read at once, not one after another
    assert together.errors == {"ping_pong": "RuntimeError: ping_pong broke"}
    expected = [(f.metric, f.run_id, f.span_ids) for f in serial.findings() if f.metric != "ping_pong"]
    assert [(f.metric, f.run_id, f.span_ids) for f in together.findings()] == expected
    assert expected  # the store has findings besides ping-pong's


@pytest.mark.slow
def test_http_and_file_sources_agree_on_browse_queries(sources):
    http, offline = sources
    everything = offline.runs(Window(), Filters())
    agent = sorted({a for agents in everything["agents"] for a in agents})[0]
    for filters in (
        Filters(),
        Filters(agent=agent),
        Filters(run=XSS_RUN),
        Filters(service="no-such-service"),
    ):
        remote, local = http.run_totals(Window(), filters), offline.run_totals(Window(), filters)
        assert _comparable(remote) == _comparable(local), filters
        assert list(local.columns) == ["run_id", "spans", "rejected", "errors", "first_seen", "last_seen"]
    totals = offline.run_totals(Window(), Filters())
    assert set(totals["run_id"]) == set(everything["run_id"])
    assert dict(zip(totals["run_id"], totals["spans"], strict=True)) == dict(
        zip(everything["run_id"], everything["spans"], strict=True)
    )
    chosen = list(everything["run_id"][:2]) + ["no-such-run"]
    remote, local = (
        http.run_details(Window(), Filters(), chosen),
        offline.run_details(Window(), Filters(), chosen),
    )
    assert _comparable(remote) == _comparable(local) and set(local["run_id"]) == set(chosen[:2])
    assert http.filter_options(Window()) == offline.filter_options(Window())
    options = offline.filter_options(Window())
    assert agent in options["agents"] and set(options["runs"]) == set(everything["run_id"])
    spans = offline.run_spans(XSS_RUN)
    keys = pd.DataFrame(
        {"run_id": [XSS_RUN] * 2 + ["no-such-run"], "span_id": list(spans["span_id"][:2]) + ["00"]}
    )
    remote, local = http.evidence_spans(keys), offline.evidence_spans(keys)
    assert _comparable(remote) == _comparable(local)
    assert sorted(local["span_id"]) == sorted(spans["span_id"][:2])


@pytest.mark.slow
def test_lookup_endpoints_refuse_bad_bodies_with_what_to_send(sources):
    import httpx

    http, _ = sources
    headers = {"Authorization": f"Bearer {TOKEN}"}
    cases = [
        ("/api/v1/evidence-spans", b"not json", "JSON object"),
        ("/api/v1/evidence-spans", json.dumps({"keys": [["only-one"]]}).encode(), "[run_id, span_id] pairs"),
        ("/api/v1/evidence-spans", json.dumps({"keys": [], "extra": 1}).encode(), "exactly one key"),
        ("/api/v1/evidence-spans", json.dumps({"keys": [["r", "s"]] * 10_001}).encode(), "at most 10000"),
        ("/api/v1/runs/details", json.dumps({"run_ids": [1, 2]}).encode(), "list of strings"),
        ("/api/v1/runs/details", json.dumps({"run_ids": ["x\u0000"]}).encode(), "control characters"),
    ]
    for path, body, message in cases:
        response = httpx.post(http.url + path, content=body, headers=headers, timeout=30)
        assert response.status_code == 400 and message in response.json()["error"], (path, response.text)
    assert httpx.post(http.url + "/api/v1/evidence-spans", json={"keys": []}, timeout=30).status_code == 401
    response = httpx.get(
        http.url + "/api/v1/filter-options", params={"limit": "0"}, headers=headers, timeout=30
    )
    assert response.status_code == 400 and "limit" in response.json()["error"]
    # the store still answers after every refusal
    assert http.filter_options(Window())["runs"]


@pytest.mark.slow
def test_reports_from_the_api_and_from_a_file_match(sources):
    http, offline = sources
    remote = json.loads(build_report(http, Window(), Filters(), None, "json"))
    local = json.loads(build_report(offline, Window(), Filters(), None, "json"))
    assert remote["findings"] == local["findings"] and remote["summary"] == local["summary"]
    assert remote["source"].startswith("collector at http://127.0.0.1:")


@pytest.mark.slow
def test_wrong_token_is_a_clear_error(sources):
    http, _ = sources
    wrong = HttpSource(http.url, "not-the-token")
    health = wrong.health()
    assert not health.ok and "DRIFTSCOPE_TOKEN" in health.detail
    with pytest.raises(SourceUnavailable, match="refused"):
        wrong.runs(Window(), Filters())


@pytest.mark.slow
def test_dashboard_pages_read_through_the_api(sources, monkeypatch):
    http, _ = sources
    monkeypatch.setenv(SOURCE_ENV, http.url)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    at = AppTest.from_file(app_main, default_timeout=120)
    at.run()
    assert not at.exception and not at.error
    tiles = {m.label: int(m.value) for m in at.metric}
    assert tiles["ping-pong between agents"] == 1 and tiles["lost updates (split-brain)"] == 2
    at.switch_page("views/loops.py")
    at.run()
    assert not at.exception
    assert "planner, worker" in at.dataframe[1].value.to_string()


def test_collector_down_is_source_unavailable_naming_what_to_do():
    source = HttpSource(f"http://127.0.0.1:{free_port()}")
    health = source.health()
    assert not health.ok and "driftscope serve" in health.detail
    with pytest.raises(SourceUnavailable, match="Cannot reach"):
        source.metric("ping_pong", Window(), Filters())


def test_open_source_picks_transport_by_form(tmp_path):
    assert isinstance(open_source("http://127.0.0.1:4318"), HttpSource)
    assert isinstance(open_source(None), HttpSource)
    assert isinstance(open_source(str(tmp_path / "x.duckdb")), DuckDBFileSource)
    missing = DuckDBFileSource(tmp_path / "x.duckdb")
    assert not missing.health().ok and "driftscope ingest" in missing.health().detail


def test_window_params_are_iso_and_only_set_filters():
    from datetime import datetime

    params = window_params(Window(since=datetime(2026, 1, 15, 9)), Filters(run="r1"))
    assert params == {"since": "2026-01-15T09:00:00", "run": "r1"}


@pytest.mark.slow
def test_collector_stopping_mid_session_turns_into_a_banner(serve_factory, monkeypatch):
    server = serve_factory().start()
    monkeypatch.setenv(SOURCE_ENV, server.http_url)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    at = AppTest.from_file(app_main, default_timeout=120)
    at.run()
    assert not at.exception and not at.error
    # an empty collector: not green tiles, but where to send spans (this collector's own endpoint)
    assert not at.metric and "No spans received yet" in at.warning[0].value
    assert f"OTEL_EXPORTER_OTLP_ENDPOINT={server.http_url}" in at.warning[0].value
    assert at.toggle(key="auto_refresh").value  # live source: auto-refresh on by default
    server.stop()
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and "Cannot reach the driftscope collector" in at.error[0].value


@pytest.mark.slow
def test_a_projection_read_is_those_columns_of_the_whole_frame_from_a_file_and_the_api(
    tmp_path, in_process_factory
):
    offline = DuckDBFileSource(build_dashboard_db(tmp_path / "offline.duckdb"))
    shutil.copy(offline.path, tmp_path / "served.duckdb")
    http = HttpSource("http://127.0.0.1")
    http._client = in_process_factory(db=str(tmp_path / "served.duckdb"))  # the API in process
    found = 0
    for metric in offline.list_metrics():
        name, documented = metric["name"], list(metric["columns"])
        columns = list(counted_columns(metric) or documented[:2])[::-1]  # an order of its own
        whole = offline.metric(name, Window(), Filters())
        local = offline.metric(name, Window(), Filters(), columns)
        pd.testing.assert_frame_equal(local, whole[columns], obj=name)
        remote = http.metric(name, Window(), Filters(), columns)
        assert list(remote.columns) == columns, name
        assert _comparable(remote) == _comparable(local), name
        found += len(local)
    assert found  # the sample traces have findings
    with pytest.raises(ValueError, match="documented columns .* got 'nope'"):
        offline.metric("repeated_calls", Window(), Filters(), ["run_id", "nope"])
    with pytest.raises(SourceUnavailable, match="HTTP 400.*documented columns"):
        http.metric("repeated_calls", Window(), Filters(), ["run_id", "nope"])


def test_a_file_source_says_how_current_its_findings_are_and_reads_again_when_they_move(tmp_path):
    from tests.analytics.test_materialize import _commit, _pass, _store
    from tests.fixtures_analytics import make_span

    conn = _store(tmp_path)
    write = dict(op="write", state_key="k", outcome="ok")
    _commit(conn, [make_span(0, run="run-1", agent_id="a", **write)])
    conn.close()
    source = DuckDBFileSource(tmp_path / "spans.duckdb")
    assert source.health().findings.startswith("Findings: computed on request")
    before = source.data_version()
    source._conn.close()
    source._conn = None
    conn = _store(tmp_path)
    _pass(conn)  # the materializer brings the tables in: same spans, a new version for the pages
    conn.close()
    source = DuckDBFileSource(tmp_path / "spans.duckdb")
    assert source.health().findings.startswith("Findings as of ") and "up to date" in source.health().findings
    assert source.data_version() != before
