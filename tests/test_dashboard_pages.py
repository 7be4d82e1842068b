"""Every dashboard page rendered with Streamlit's AppTest against a real DuckDB file."""

from __future__ import annotations

import socket

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import app_main
from dashboard.launch import SOURCE_ENV
from tests.test_dashboard_db import BOUNCE_RUN, CREW_RUN, XSS, build_dashboard_db

TIMEOUT = 120


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    return build_dashboard_db(tmp_path_factory.mktemp("dash") / "crew.duckdb")


def _run_page(monkeypatch, source: str, page: str | None, query: dict | None = None) -> AppTest:
    monkeypatch.setenv(SOURCE_ENV, source)
    at = AppTest.from_file(app_main, default_timeout=TIMEOUT)
    at.run()
    if page:
        at.switch_page(f"views/{page}.py")
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _table_text(at: AppTest) -> str:
    return "\n".join(df.value.to_string() for df in at.dataframe)


def test_overview_tiles_count_each_injected_failure_mode(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), None)
    assert at.title[0].value == "Coordination failures"
    tiles = {m.label: m.value for m in at.metric}
    breached = {label for label, value in tiles.items() if value not in ("0", 0)}
    assert any("lost update" in label for label in breached)
    assert any("duplicate side effect" in label for label in breached)
    assert any("delegation loop" in label for label in breached)
    worst = _table_text(at)
    assert CREW_RUN in worst and BOUNCE_RUN in worst


def test_split_brain_lists_divergent_reads_and_lost_updates(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "split_brain")
    text = _table_text(at)
    assert "plan" in text and "budget" in text
    reads, updates = at.dataframe[0].value, at.dataframe[1].value
    assert set(reads["state_key"]) == {"plan"}
    assert list(updates["clobbered_agent"]) == ["planner"] and list(updates["agent"]) == ["writer"]
    assert len(at.get("plotly_chart")) == 1  # the version timeline


def test_rejections_page_shows_rates_and_over_threshold_buckets(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "rejections")
    assert len(at.get("plotly_chart")) == 2
    over = at.dataframe[0].value
    assert set(over["agent"]) == {"alice", "planner"} and (over["rejection_rate"] > over["threshold"]).all()


def test_constraints_page_shows_dropped_constraint_with_hop_and_agent(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "constraints")
    drops = at.dataframe[-1].value
    row = drops[drops["constraint_id"] == "cite-sources"].iloc[0]
    assert row["hop"] == 1 and row["agent"] == "planner"
    waivers = at.dataframe[0].value
    assert list(waivers["constraint_id"]) == ["deadline=friday"]
    assert XSS in waivers["waiver_reason"].iloc[0]  # shown as text in a grid, never rendered
    assert len(at.get("plotly_chart")) == 1


def test_goal_drift_page_flags_the_drifted_subtask(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "goal_drift")
    drifted = at.dataframe[0].value
    assert list(drifted["run_id"].str.contains("run-crew")) == [True]
    assert len(at.get("plotly_chart")) == 1


def test_context_drift_page_names_the_stale_holder_and_stale_send(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "context_drift")
    holders, sends = at.dataframe[0].value, at.dataframe[1].value
    assert list(holders["agent"]) == ["writer"]
    assert list(sends["policy_version"]) == ["p1"] and list(sends["current_policy_version"]) == ["p2"]


def test_loops_page_lists_all_four_loop_failures(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "loops")
    repeated, ping_pong, budget, dupes = (df.value for df in at.dataframe)
    assert list(repeated["tool_name"]) == ["search"] and repeated["calls"].iloc[0] == 4
    assert set(ping_pong["agents"].iloc[0].split(", ")) == {"alice", "bob"}
    assert list(budget["agent"]) == ["alice"]
    assert "mail-1" in dupes.to_string()
    # every finding links to its run in the run explorer
    assert all(link.startswith("run_explorer?run=") for link in repeated["explore"])


def test_run_explorer_opens_the_run_named_in_the_query(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": BOUNCE_RUN})
    assert at.selectbox(key="explorer_run").value == BOUNCE_RUN
    assert len(at.get("plotly_chart")) == 2  # waterfall and delegation graph
    findings = at.dataframe[0].value
    assert {"delegation loop without progress", "unaware of termination conditions"} <= set(
        findings["failure_mode"]
    )


def test_run_explorer_shows_span_text_as_json_not_markup(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "run_explorer", {"run": CREW_RUN})
    spans = at.dataframe[-1].value
    assert len(spans) > 10
    assert all(XSS not in m.value for m in at.markdown)


def test_calibration_page_lists_thresholds_with_provenance(monkeypatch, db_path):
    at = _run_page(monkeypatch, str(db_path), "calibration")
    names = set(at.dataframe[0].value["name"])
    assert {"goal_divergence", "rejection_rate"} <= names
    assert len(at.expander) >= 2 and len(at.json) >= 2
    assert any("no ROC curve" in i.value for i in at.info)
    assert len(at.get("plotly_chart")) == 1  # divergence histogram


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_collector_down_gives_a_banner_not_a_traceback(monkeypatch):
    at = _run_page(monkeypatch, f"http://127.0.0.1:{_free_port()}", None)
    assert len(at.error) == 1
    assert "Data source unavailable" in at.error[0].value and "driftscope serve" in at.error[0].value
    assert not at.title  # the page itself did not run


def test_empty_database_says_how_to_send_spans(monkeypatch, tmp_path):
    import duckdb

    from collector.migrations_runner import apply_migrations

    path = tmp_path / "empty.duckdb"
    conn = duckdb.connect(str(path))
    apply_migrations(conn)
    conn.close()
    at = _run_page(monkeypatch, str(path), "loops")
    assert len(at.info) == 4
    assert all("OTEL_EXPORTER_OTLP_ENDPOINT" in i.value and "driftscope demo" in i.value for i in at.info)


def test_missing_database_file_gives_a_banner(monkeypatch, tmp_path):
    at = _run_page(monkeypatch, str(tmp_path / "nope.duckdb"), None)
    assert "driftscope ingest" in at.error[0].value
