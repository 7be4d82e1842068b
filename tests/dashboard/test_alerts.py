"""The Alerts page (dashboard/views/alerts.py, dashboard/alerts.py) on a DuckDB file holding alert state."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from analytics import alerts
from analytics.alert_rules import default_rules
from analytics.types import Window, direct_write
from collector.files import ingest_files
from dashboard import app_main
from dashboard.alerts import alert_table, delivery_problems
from dashboard.datasource import DuckDBFileSource
from dashboard.launch import SOURCE_ENV
from driftscope.database import open_database

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.fixture(scope="module")
def alert_db(tmp_path_factory) -> Path:
    """Two crews: split-brain's alerts resolved (and acknowledged by a webhook), ping-pong's firing."""
    path = tmp_path_factory.mktemp("alerts") / "alerts.duckdb"
    conn = open_database(path)
    write = direct_write(conn)
    for name in ("split_brain_unguarded", "ping_pong_unguarded"):
        assert not ingest_files(None, [SAMPLES / f"{name}.json"], conn=conn).errors
        newest = conn.execute("SELECT max(Timestamp) FROM spans").fetchone()[0]
        write(
            alerts.store_changes(
                alerts.evaluate(conn, default_rules(), newest + timedelta(seconds=1)).changes
            )
        )
        if name.startswith("split"):
            write(
                alerts.store_changes(
                    alerts.evaluate(conn, default_rules(), newest + timedelta(hours=1)).changes
                )
            )
            ids = [row[0] for row in conn.execute("SELECT alert_id FROM alerts").fetchall()]
            write(alerts.mark_delivered("webhook", [(a, "resolved") for a in ids]))
            # The next crew's spans come later than these resolved alerts.
            conn.execute("UPDATE spans SET Timestamp = Timestamp - INTERVAL 2 HOUR")
    conn.execute("CHECKPOINT")
    conn.close()
    return path


def test_file_source_lists_firing_alerts_first_with_their_receivers(alert_db):
    frame = DuckDBFileSource(alert_db).alerts(Window())
    assert (
        list(frame["state"])
        == ["firing"] * (frame["state"] == "firing").sum()
        + ["resolved"] * (frame["state"] == "resolved").sum()
    )
    assert set(frame.loc[frame["state"] == "firing", "alertname"]) == {"ping_pong"}
    assert set(frame.loc[frame["state"] == "resolved", "alertname"]) == {"lost_updates", "divergent_reads"}
    assert set(frame.loc[frame["state"] == "resolved", "delivered_to"]) == {"webhook:resolved"}
    table = alert_table(frame)
    assert all(len(spans) == 1 for spans in table["span_ids"])


def test_alerts_page_shows_firing_and_recent_alerts_with_links(monkeypatch, alert_db):
    monkeypatch.setenv(SOURCE_ENV, str(alert_db))
    at = AppTest.from_file(app_main, default_timeout=120)
    at.run()
    at.switch_page("views/alerts.py")
    at.query_params["window"] = "All time"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    headers = [h.value for h in at.subheader]
    assert any(h.startswith("Firing (") and h != "Firing (0)" for h in headers), headers
    text = "\n".join(df.value.to_string() for df in at.dataframe)
    assert "ping_pong" in text
    assert "run_explorer?run=" in text


def test_delivery_problems_name_the_failing_receiver():
    health = {
        "enabled": True,
        "receivers": {
            "alertmanager": {"consecutive_failures": 0, "failures": 0},
            "slack": {
                "consecutive_failures": 3,
                "failures": 5,
                "last_error": "HTTP 500",
                "last_error_at": "t",
            },
        },
        "last_error": None,
        "rule_errors": {},
    }
    (problem,) = delivery_problems(health)
    assert problem.startswith("Delivery to slack is failing (3 attempt(s) in a row") and "HTTP 500" in problem
    assert delivery_problems({"enabled": False}) == [] and delivery_problems(None) == []


def test_report_lists_the_alerts_of_its_window_in_every_format(alert_db):
    from analytics.types import Filters
    from dashboard.report import build_report

    source = DuckDBFileSource(alert_db)
    document = json.loads(build_report(source, Window(), Filters(), fmt="json"))
    states = {(a["alertname"], a["state"]) for a in document["alerts"]}
    assert states == {("ping_pong", "firing"), ("lost_updates", "resolved"), ("divergent_reads", "resolved")}
    assert all(a["starts_at"] for a in document["alerts"])
    assert "<h2>Alerts</h2>" in build_report(source, Window(), Filters(), fmt="html")
    markdown = build_report(source, Window(), Filters(), fmt="md")
    assert "## Alerts" in markdown and "ping\\_pong" in markdown.split("## Alerts")[1]  # escaped
    run = document["alerts"][0]["run_id"]
    one_run = json.loads(build_report(source, Window(), Filters(), run=run, fmt="json"))
    assert {a["run_id"] for a in one_run["alerts"]} == {run}


def test_rule_states_and_receivers_from_the_collectors_health():
    import pandas as pd

    from dashboard.alerts import receivers_line, rule_states

    health = {
        "enabled": True,
        "rule_list": [
            {
                "name": "lost_updates",
                "detector": "lost_updates",
                "severity": "critical",
                "window_seconds": 900,
            },
            {"name": "ping_pong", "detector": "ping_pong", "severity": "warning", "window_seconds": 600},
        ],
        "receivers": {},
    }
    frame = pd.DataFrame({"alertname": ["ping_pong", "ping_pong"], "state": ["firing", "firing"]})
    states = rule_states(health, frame)
    assert list(states["state"]) == ["not firing", "firing (2)"] and list(states["looks_back"]) == [
        "15 min",
        "10 min",
    ]
    assert receivers_line(health) is None
    assert receivers_line({"receivers": {"alertmanager": {}, "slack": {}}}) == "alertmanager, slack"


def test_a_file_read_offline_does_not_say_no_alert_is_firing_in_green(monkeypatch, tmp_path):
    from tests.dashboard.test_dashboard_db import build_dashboard_db

    monkeypatch.setenv(SOURCE_ENV, str(build_dashboard_db(tmp_path / "crew.duckdb")))
    at = AppTest.from_file(app_main, default_timeout=120)
    at.run()
    at.switch_page("views/alerts.py").run()
    assert not at.exception and not at.success
    assert any("no rule is evaluated here" in i.value for i in at.info)
