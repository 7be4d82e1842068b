"""Alerts on `driftscope serve --store chdb:PATH`, in process: a failing crew's spans sent over
OTLP/HTTP into `otel_traces` give the same alert episodes as the DuckDB store, delivered once per
state to a real local webhook sink, listed by `GET /api/v1/alerts`, and a restarted serve sends
nothing already acknowledged (the alert state file beside the store is the outbox)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("chdb", reason="chdb is in the dev extra (pip install 'driftscope[clickhouse]')")

from analytics import alerts as alert_state  # noqa: E402
from analytics.alert_rules import load_rules  # noqa: E402
from collector.clickhouse_store import parse_store_url  # noqa: E402
from collector.files import ingest_files, iter_file_requests  # noqa: E402
from driftscope.alert_receivers import iso  # noqa: E402
from driftscope.database import open_database  # noqa: E402
from driftscope.serve import ServeConfig, build_service  # noqa: E402
from driftscope.serve_clickhouse import alert_state_path  # noqa: E402
from tests.driftscope.test_alerting import SECRET, Sink  # noqa: E402
from tests.serve_helpers import wait_until  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "split_brain_unguarded.json"


def _wait(predicate, what: str, timeout: float = 60) -> None:
    wait_until(predicate, what, timeout)


def _start(config: ServeConfig):
    """serve --store in process behind an ASGI client, once its evaluator's first pass is done
    (it runs at start, on the empty or old store; the interval keeps it from running again)."""
    from starlette.testclient import TestClient

    service = build_service(config)
    alerting = service.app.state.alerting
    _wait(lambda: alerting.evaluations + alerting.skipped >= 1 or alerting.last_error, "first evaluation")
    assert alerting.last_error is None
    return service, TestClient(service.app, base_url="http://127.0.0.1").__enter__(), alerting


def _delivered(sink: Sink) -> tuple[int, int, int]:
    """Alerts received by the Alertmanager API (lists of alerts), the webhook and Slack."""
    return (
        sum(len(body) for body in sink.bodies("/api/v2/alerts")),
        len(sink.bodies("/hook")),
        len(sink.bodies("/slack")),
    )


def _episodes(changes) -> set[tuple]:
    return {
        (c.row["alert_id"], c.row["state"], c.row["findings"], c.row["summary"], c.row["labels"])
        for c in changes
    }


@pytest.mark.slow
def test_alerts_on_a_chdb_store_fire_and_resolve_as_on_duckdb_and_are_delivered_once(tmp_path, sink):
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text('window = "10m"\n')  # every finding detector, as serve's default rules
    rules = load_rules(rules_file)
    config = ServeConfig(
        db=str(tmp_path / "unused.duckdb"),
        store=f"chdb:{tmp_path / 'ch'}",
        embeddings=False,
        alert_rules=str(rules_file),
        alert_webhook_url=sink.url("/hook"),
        alert_webhook_secret=SECRET,
        alert_slack_url=sink.url("/slack"),
        alertmanager_url=sink.url(""),
        alert_interval=3600,
    )
    # The DuckDB store's answer for the same spans and times: what the ClickHouse one must give.
    reference = open_database(tmp_path / "ref.duckdb")
    assert not ingest_files(None, [SAMPLE], conn=reference).errors
    newest = reference.execute("SELECT max(Timestamp) FROM spans").fetchone()[0]
    fire_at, resolve_at = newest + timedelta(seconds=1), newest + timedelta(minutes=11)
    expected_firing = alert_state.evaluate(reference, rules, fire_at)
    assert not expected_firing.errors
    alert_ids = sorted(c.row["alert_id"] for c in expected_firing.changes)
    assert len(alert_ids) >= 2 and all(c.row["state"] == "firing" for c in expected_firing.changes)

    service, client, alerting = _start(config)
    try:
        service.writer.resolve_interval = 0.0  # passes back to back
        for _, payload in iter_file_requests(SAMPLE):
            response = client.post(
                "/v1/traces", content=payload, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 200, response.text
        _wait(
            lambda: (
                service.writer.commits > 0
                and client.get("/api/v1/health").json()["resolve"]["unresolved_spans"] == 0
            ),
            "resolved spans",
        )
        # the detectors answer from the findings tables: evaluate once they hold every change
        _wait(
            lambda: client.get("/api/v1/health").json()["findings"]["behind_changes"] == 0,
            "findings tables up to date",
        )

        firing = alerting.evaluate_once(fire_at)
        assert firing is not None and firing.errors == {}
        assert _episodes(firing.changes) == _episodes(expected_firing.changes)  # one per finding group
        assert alerting.queue_due(fire_at) == 3 * len(alert_ids)  # Alertmanager, webhook, Slack
        _wait(lambda: _delivered(sink) == (len(alert_ids),) * 3, "firing notifications")
        time.sleep(0.3)
        assert alerting.queue_due(fire_at) == 0  # acknowledged: not queued again
        listed = client.get("/api/v1/alerts").json()["rows"]
        assert sorted(r["alert_id"] for r in listed) == alert_ids
        assert {(r["state"], r["delivered_to"]) for r in listed} == {
            ("firing", "alertmanager:firing, slack:firing, webhook:firing")
        }
        health = client.get("/api/v1/health").json()["alerting"]
        assert health["status"] == "ok" and health["receivers"]["webhook"]["sent"] == len(alert_ids)

        # Back under the threshold (the findings left the rule's window): resolved, as on DuckDB.
        alert_state.store_changes(expected_firing.changes)(reference)
        expected_resolved = alert_state.evaluate(reference, rules, resolve_at)
        resolved = alerting.evaluate_once(resolve_at)
        assert _episodes(resolved.changes) == _episodes(expected_resolved.changes)
        assert {c.row["state"] for c in resolved.changes} == {"resolved"}
        assert alerting.queue_due(resolve_at) == 3 * len(alert_ids)
        _wait(lambda: _delivered(sink) == (2 * len(alert_ids),) * 3, "resolved notifications")
    finally:
        client.__exit__(None, None, None)
        service.stop()
        reference.close()
    bodies = sink.bodies("/hook")
    assert [b["status"] for b in bodies] == ["firing"] * len(alert_ids) + ["resolved"] * len(alert_ids)
    assert sorted(
        f"{b['alerts'][0]['labels']['alertname']}/{b['alerts'][0]['labels']['run_id']}/1"
        for b in bodies[: len(alert_ids)]
    ) == sorted(alert_ids)
    managed = [alert for body in sink.bodies("/api/v2/alerts") for alert in body]
    resolved_ids = [
        f"{a['labels']['alertname']}/{a['labels']['run_id']}/1" for a in managed[len(alert_ids) :]
    ]
    assert sorted(resolved_ids) == alert_ids
    assert {a["endsAt"] for a in managed[len(alert_ids) :]} == {iso(resolve_at)}  # resolved at that time
    assert [b["text"][:10] for b in sink.bodies("/slack")][-1] == "[RESOLVED]"
    assert alert_state_path(parse_store_url(config.store)) == tmp_path / "ch.alerts.duckdb"

    # A restarted serve on the same store and state file sends nothing already acknowledged.
    service, client, alerting = _start(config)
    try:
        assert alerting.evaluate_once(resolve_at + timedelta(seconds=1)) is None  # no spans, none active
        assert alerting.queue_due(resolve_at + timedelta(seconds=1)) == 0
        listed = client.get("/api/v1/alerts").json()["rows"]
        assert {(r["state"], r["delivered_to"]) for r in listed} == {
            ("resolved", "alertmanager:resolved, slack:resolved, webhook:resolved")
        }
    finally:
        client.__exit__(None, None, None)
        service.stop()
    assert _delivered(sink) == (2 * len(alert_ids),) * 3


def test_evaluation_waits_for_a_pause_in_the_clickhouse_writers_commits(tmp_path):
    from driftscope.alerting import AlertService, AlertStateFile

    state = AlertStateFile(tmp_path / "ch.alerts.duckdb")
    commits = [0]
    try:
        service = AlertService(state.cursor, state.write, [], [], interval_s=5, commits=lambda: commits[0])
        now = time.monotonic()
        assert service._due(float("-inf"))  # nothing committed since start: runs at once
        commits[0] += 1  # the writer committed: ingest first
        assert not service._due(now - 10) and service.health()["deferred_for_ingest"] == 1
        assert not service._due(now - 10)  # no new commit, but not quiet for quiet_s yet
        service._last_commit = time.monotonic() - 2  # quiet for longer than quiet_s
        assert service._due(now - 10)
        commits[0] += 1
        assert service._due(now - 61)  # past max_defer it runs under sustained ingest too
    finally:
        state.close()


@pytest.mark.slow
def test_a_second_serve_evaluating_alerts_on_the_store_is_refused_with_a_clear_message(tmp_path):
    import subprocess
    import sys

    from driftscope.settings import ConfigError

    state = tmp_path / "ch.alerts.duckdb"
    holder = subprocess.Popen(  # another process evaluating alerts holds the state file
        [
            sys.executable,
            "-c",
            f"import duckdb, sys; c = duckdb.connect({str(state)!r}); print('ok', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        config = ServeConfig(
            db=str(tmp_path / "unused.duckdb"),
            store=f"chdb:{tmp_path / 'ch'}",
            embeddings=False,
            alert_webhook_url="http://127.0.0.1:9/hook",
        )
        with pytest.raises(ConfigError, match="could not open the alert state file .*One serve per store"):
            build_service(config)
    finally:
        holder.communicate("", timeout=30)
    # The refused serve closed the store: this process can open it again, alerts and all.
    service = build_service(config)
    service.stop()


def test_evaluation_takes_one_read_turn_per_rule_so_other_reads_go_in_between(tmp_path, monkeypatch):
    import contextlib

    from analytics.alert_rules import default_rules

    conn = open_database(tmp_path / "a.duckdb")
    assert not ingest_files(None, [SAMPLE], conn=conn).errors
    held, turns, seen = [], [], []

    @contextlib.contextmanager
    def turn():
        turns.append(1)
        held.append(True)
        yield
        held.pop()

    original = alert_state.finding_frame

    def reading(conn, rule, since):  # the real detector run, noting whether a turn is held
        seen.append(bool(held))
        return original(conn, rule, since)

    rules = default_rules()
    now = conn.execute("SELECT max(Timestamp) FROM spans").fetchone()[0] + timedelta(seconds=1)
    monkeypatch.setattr(alert_state, "finding_frame", reading)
    with_turns = alert_state.evaluate(conn, rules, now, turn=turn)
    assert seen == [True] * len(rules) and len(turns) == len(rules) and held == []
    without = alert_state.evaluate(conn, rules, now)
    assert _episodes(with_turns.changes) == _episodes(without.changes) != set()
    conn.close()


def test_a_stopping_evaluator_takes_no_further_read_turn(tmp_path):
    import contextlib

    from analytics.alert_rules import default_rules
    from driftscope.alerting import AlertService, AlertStateFile

    conn = open_database(tmp_path / "a.duckdb")
    assert not ingest_files(None, [SAMPLE], conn=conn).errors
    state = AlertStateFile(tmp_path / "a.alerts.duckdb")
    turns = []

    @contextlib.contextmanager
    def turn():
        turns.append(1)
        yield

    try:
        service = AlertService(
            conn.cursor, state.write, default_rules(), [], state_cursor=state.cursor, turn=turn
        )
        service._stop.set()  # serve is stopping: the store may be closed after the current turn
        evaluation = service.evaluate_once()
        assert len(turns) == 1  # the data version's; no rule read the store
        assert set(evaluation.errors) == {r.name for r in default_rules()} and evaluation.changes == []
        assert "serve is stopping" in next(iter(evaluation.errors.values()))
    finally:
        state.close()
        conn.close()
