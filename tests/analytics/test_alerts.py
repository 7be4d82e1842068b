"""Alert rules (analytics.alert_rules) and their evaluation into stored alert episodes (analytics.alerts),
on a DuckDB file holding the simulator's sample crews."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from analytics import alerts, registry
from analytics.alert_rules import RuleError, default_rules, parse_rules
from analytics.types import Window, direct_write
from collector.files import ingest_files
from driftscope.database import open_database

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _db(tmp_path: Path, *names: str):
    conn = open_database(tmp_path / "alerts.duckdb")
    _ingest(conn, *names)
    return conn


def _ingest(conn, *names: str) -> None:
    result = ingest_files(None, [SAMPLES / f"{name}.json" for name in names], conn=conn)
    assert not result.errors and result.rejected == 0


def _newest(conn):
    return conn.execute("SELECT max(Timestamp) FROM spans").fetchone()[0]


def _stored(conn) -> dict[str, str]:
    return dict(conn.execute("SELECT alert_id, state FROM alerts ORDER BY alert_id").fetchall())


def _evaluate(conn, rules, now):
    evaluation = alerts.evaluate(conn, rules, now)
    direct_write(conn)(alerts.store_changes(evaluation.changes))
    return evaluation


# --- rules -------------------------------------------------------------------------------


def test_default_rules_are_one_per_finding_detector_with_severity_from_its_metric_record():
    rules = default_rules()
    assert [rule.detector for rule in rules] == [m.name for m in registry.finding_metrics()]
    for rule in rules:
        metric = registry.METRICS[rule.detector]
        assert rule.severity == ("critical" if metric.failing or metric.failing_unless else "warning")
        assert rule.threshold == 1 and rule.name == rule.detector
    assert {r.name: r.severity for r in rules}["lost_updates"] == "critical"
    assert {r.name: r.severity for r in rules}["divergent_reads"] == "warning"


def test_rules_file_adds_replaces_and_disables_default_rules():
    text = """
window = "5m"

[[rule]]
detector = "lost_updates"
threshold = 2
for = "1m"
labels = { team = "agents" }

[[rule]]
name = "prod_lost_updates"
detector = "lost_updates"
severity = "info"
run = "^prod-"
summary = "{count} lost updates in {run_id}"

[[rule]]
detector = "divergent_reads"
enabled = false
"""
    rules = {rule.name: rule for rule in parse_rules(text)}
    assert "divergent_reads" not in rules
    assert rules["lost_updates"].threshold == 2 and rules["lost_updates"].for_s == 60
    assert rules["lost_updates"].labels == {"team": "agents"}
    assert rules["prod_lost_updates"].run == "^prod-" and rules["prod_lost_updates"].severity == "info"
    assert rules["ping_pong"].window_s == 300  # the top-level window applies to shipped rules too
    assert [r.name for r in parse_rules('defaults = false\n[[rule]]\ndetector = "ping_pong"\n')] == [
        "ping_pong"
    ]


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ('[[rule]]\ndetector = "lost_updates"\nthreshhold = 2\n', 3, "did you mean threshold"),
        ('[[rule]]\ndetector = "lost_update"\n', 2, "use one of: divergent_reads"),
        ('[[rule]]\ndetector = "run_summary"\n', 2, "lists no findings"),
        (
            '[[rule]]\ndetector = "ping_pong"\n\n[[rule]]\ndetector = "lost_updates"\nrate = 0.5\n',
            6,
            "rate applies to rejection_rates",
        ),
        ('[[rule]]\ndetector = "rejection_rates"\nrate = 5\n', 3, "at most 1"),
        ('[[rule]]\ndetector = "lost_updates"\nseverity = "page"\n', 3, "critical, warning, info"),
        ('[[rule]]\ndetector = "lost_updates"\nwindow = "soon"\n', 3, "duration such as 30s"),
        ('[[rule]]\ndetector = "lost_updates"\nrun = "(prod"\n', 3, "regular expression"),
        ('[[rule]]\ndetector = "lost_updates"\nsummary = "{runid} broke"\n', 3, "{run_id}"),
        ('[[rule]]\ndetector = "lost_updates"\nlabels = { severity = "x" }\n', 3, "driftscope sets those"),
        ('[[rule]]\ndetector = "lost_updates"\n[[rule]]\ndetector = "lost_updates"\n', 3, "also named"),
        ('[[rule]]\ndetector = "lost_updates"\nthreshold = \n', 3, "not valid TOML"),
        ('[[rule]]\nseverity = "warning"\n', 1, 'needs detector = "NAME"'),
    ],
)
def test_a_wrong_rules_file_names_the_line_and_the_fix(text, line, says):
    with pytest.raises(RuleError) as raised:
        parse_rules(text, "rules.toml")
    assert raised.value.line == line, str(raised.value)
    assert f"rules.toml, line {line}:" in str(raised.value)
    assert says in str(raised.value)


# --- evaluation --------------------------------------------------------------------------


def test_a_failing_crew_fires_one_alert_per_finding_group_with_labels_from_the_metric_record(tmp_path):
    conn = _db(tmp_path, "split_brain_unguarded")
    now = _newest(conn) + timedelta(seconds=5)
    evaluation = _evaluate(conn, default_rules(), now)
    run = conn.execute("SELECT DISTINCT run_id FROM spans WHERE run_id IS NOT NULL").fetchone()[0]
    assert _stored(conn) == {f"divergent_reads/{run}/1": "firing", f"lost_updates/{run}/1": "firing"}
    lost = conn.execute(
        "SELECT labels, summary, findings, evidence_span FROM alerts WHERE rule = 'lost_updates'"
    ).fetchone()
    labels = json.loads(lost[0])
    assert labels == {
        "alertname": "lost_updates",
        "severity": "critical",
        "service": "crew-sim",
        "run_id": run,
        "agent": labels["agent"],
    }
    expected = len(registry.run_metric(conn, "lost_updates"))
    assert lost[2] == expected and f"{expected} finding(s) in run {run}" in lost[1]
    assert lost[3]  # an evidence span for the dashboard link
    assert not evaluation.errors
    # Nothing new: the same state, nothing to write.
    assert alerts.evaluate(conn, default_rules(), now + timedelta(seconds=1)).changes == []


def test_a_healthy_crew_raises_no_alert(tmp_path):
    conn = _db(tmp_path, "healthy_unguarded", "healthy_guarded")
    evaluation = _evaluate(conn, default_rules(), _newest(conn) + timedelta(seconds=5))
    assert evaluation.changes == [] and _stored(conn) == {}


def test_pending_for_the_rules_duration_then_firing_then_resolved_then_a_new_episode(tmp_path):
    conn = _db(tmp_path, "split_brain_unguarded")
    rules = parse_rules(
        'defaults = false\n[[rule]]\ndetector = "lost_updates"\nfor = "30s"\nwindow = "10m"\n'
    )
    now = _newest(conn) + timedelta(seconds=1)
    _evaluate(conn, rules, now)
    (alert_id,) = _stored(conn)
    assert _stored(conn)[alert_id] == "pending"
    _evaluate(conn, rules, now + timedelta(seconds=29))
    assert _stored(conn)[alert_id] == "pending"
    _evaluate(conn, rules, now + timedelta(seconds=31))
    assert _stored(conn)[alert_id] == "firing"
    # The findings age out of the 10-minute window: resolved, with its end time.
    _evaluate(conn, rules, now + timedelta(minutes=11))
    assert _stored(conn)[alert_id] == "resolved"
    assert conn.execute("SELECT ends_at FROM alerts").fetchone()[0] == now + timedelta(minutes=11)
    # The same run failing again later is a second episode of the alert.
    _ingest(conn, "split_brain_unguarded")
    conn.execute("UPDATE spans SET Timestamp = Timestamp + INTERVAL 1 HOUR")  # fresh findings
    _evaluate(conn, rules, now + timedelta(hours=1, seconds=5))
    states = _stored(conn)
    assert states[alert_id] == "resolved" and states[alert_id[:-1] + "2"] == "pending"


def test_a_group_under_the_threshold_or_outside_the_run_pattern_does_not_alert(tmp_path):
    conn = _db(tmp_path, "split_brain_unguarded")
    now = _newest(conn) + timedelta(seconds=5)
    findings = len(registry.run_metric(conn, "lost_updates"))
    over = parse_rules(f'defaults = false\n[[rule]]\ndetector = "lost_updates"\nthreshold = {findings + 1}\n')
    assert alerts.evaluate(conn, over, now).changes == []
    other = parse_rules('defaults = false\n[[rule]]\ndetector = "lost_updates"\nrun = "^prod-"\n')
    assert alerts.evaluate(conn, other, now).changes == []
    old = alerts.evaluate(conn, default_rules(), now + timedelta(hours=1))  # findings older than 15m
    assert old.changes == []


def test_a_groups_agents_count_newest_finding_and_evidence_come_from_its_own_rows(tmp_path):
    conn = _db(tmp_path, "split_brain_unguarded")
    run = conn.execute("SELECT DISTINCT run_id FROM spans WHERE run_id IS NOT NULL").fetchone()[0]
    now = _newest(conn) + timedelta(seconds=5)
    (rule,) = parse_rules('defaults = false\n[[rule]]\ndetector = "lost_updates"\nthreshold = 2\n')
    at = [now - timedelta(seconds=s) for s in (50, 10, 30, 20, 40, 3600)]
    rows = pd.DataFrame(
        {
            "run_id": [run, run, "other", "other", "lonely", run],
            "last_seen": at,
            # a name, lists with gaps, nothing: the agents of a group are its rows' names, once
            "agent": ["writer-b", None, "", "writer-a", "solo", "old-agent"],
            "clobbered_agent": [["writer-a", None], ["writer-c", ""], None, [], None, ["old"]],
            "span_ids": [["s-run-50"], ["s-run-10", "x"], ["s-other-30"], [], ["s-lonely"], ["s-old"]],
        }
    )
    groups = alerts.group_findings(conn, rule, rows, now)
    # "lonely" is under the threshold; the row an hour old is outside the window
    assert sorted(groups) == ["other", run]
    mine, other = groups[run], groups["other"]
    assert (mine.count, mine.agent, mine.service, mine.evidence_span) == (
        2,
        "writer-a,writer-b,writer-c",
        "crew-sim",
        "s-run-10",
    )
    assert mine.last_at == at[1]
    assert (other.count, other.agent, other.evidence_span, other.last_at) == (2, "writer-a", None, at[3])
    assert other.service is None and other.run_id == "other"


def test_rejection_rates_alert_per_agent_over_a_rate(tmp_path):
    conn = _db(tmp_path, "split_brain_guarded")
    frame = registry.run_metric(conn, "rejection_rates")
    top = float(frame["rejection_rate"].max())
    assert top > 0
    rules = parse_rules(f'defaults = false\n[[rule]]\ndetector = "rejection_rates"\nrate = {top}\n')
    evaluation = alerts.evaluate(conn, rules, _newest(conn) + timedelta(seconds=5))
    agents = set(frame.loc[frame["rejection_rate"] >= top, "agent"])
    assert {c.row["group_key"] for c in evaluation.changes} == agents
    assert all(json.loads(c.row["labels"])["agent"] in agents for c in evaluation.changes)


def test_notifications_are_due_until_a_receiver_acknowledges_each_state(tmp_path):
    conn = _db(tmp_path, "split_brain_unguarded")
    now = _newest(conn) + timedelta(seconds=5)
    _evaluate(conn, default_rules(), now)
    write = direct_write(conn)
    due = alerts.due_notifications(conn, "webhook", now)
    assert set(due["state"]) == {"firing"} and len(due) == 2
    write(alerts.mark_delivered("webhook", [(a, "firing") for a in due["alert_id"]], now))
    assert alerts.due_notifications(conn, "webhook", now).empty
    assert len(alerts.due_notifications(conn, "slack", now)) == 2  # each receiver on its own
    # Alertmanager wants firing alerts re-sent; a plain webhook does not.
    assert (
        len(alerts.due_notifications(conn, "webhook", now + timedelta(minutes=2), timedelta(minutes=1))) == 2
    )
    later = now + timedelta(hours=1)
    _evaluate(conn, default_rules(), later)
    resolved = alerts.due_notifications(conn, "webhook", later)
    assert set(resolved["state"]) == {"resolved"} and len(resolved) == 2
    write(alerts.mark_delivered("webhook", [(a, "resolved") for a in resolved["alert_id"]], later))
    assert alerts.due_notifications(conn, "webhook", later).empty
    listed = alerts.list_alerts(conn, Window())
    assert set(listed["state"]) == {"resolved"} and all(
        "webhook:resolved" in d for d in listed["delivered_to"]
    )


def test_beside_a_materializer_rules_wait_for_their_tables_instead_of_computing(tmp_path):
    """serve evaluates rules beside its materializer: before a detector's findings table is
    built its rule is not evaluated (computing it from every span during the first build took
    serve from 1.8 to 7.6 GiB at 10M spans), its alerts are left as they are, and the reason is
    said; once the tables are built the same rules fire."""
    from analytics import materialize

    conn = _db(tmp_path, "split_brain_unguarded")
    now = _newest(conn) + timedelta(seconds=5)
    waiting = alerts.evaluate(conn, default_rules(), now, wait_for_tables=True)
    assert waiting.changes == [] and not any(waiting.groups.values())
    assert waiting.errors["lost_updates"].startswith("not evaluated yet: the findings table of lost_updates")
    cursor = conn.cursor()
    try:
        assert not materialize.bring_up_to_date(cursor, direct_write(conn)).failed
    finally:
        cursor.close()
    built = alerts.evaluate(conn, default_rules(), now, wait_for_tables=True)
    assert not built.errors
    assert {change.row["rule"] for change in built.changes} == {"divergent_reads", "lost_updates"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stored_changes_equal_them_applied_one_by_one(tmp_path, seed):
    """store_changes writes an evaluation's changes as one DELETE and one INSERT OR REPLACE (a
    statement per change held the single writer 19 s at 1M spans): the table equals applying
    them in order, one statement each, whatever inserts, replacements and deletes of one alert
    the list holds; NULLs, timestamps and integers keep their values."""
    import random
    from datetime import datetime

    rng = random.Random(seed)
    base = datetime(2026, 12, 6, 8, 0, 0, 123456)

    def row(alert: str, k: int) -> dict:
        moment = base + timedelta(seconds=k)
        return {
            "alert_id": alert, "rule": "r", "group_key": f"run-{k}", "episode": k % 3 + 1,
            "alertname": "lost_updates", "severity": rng.choice(["page", "ticket"]),
            "labels": json.dumps({"k": k}), "summary": f"s{k}", "description": f"d{k}",
            "run_id": rng.choice([None, f"run-{k}"]), "evidence_span": rng.choice([None, "ab" * 8]),
            "state": rng.choice(["pending", "firing", "resolved"]), "findings": k,
            "active_since": moment, "starts_at": rng.choice([None, moment]),
            "ends_at": rng.choice([None, moment + timedelta(seconds=5)]),
            "last_finding_at": rng.choice([None, moment]), "updated_at": moment,
        }  # fmt: skip

    ids = [f"r/run-{i}/1" for i in range(8)]
    batches = [
        [alerts.Change(row(rng.choice(ids), k), delete=rng.random() < 0.3) for k in range(rng.randint(0, 12))]
        for _ in range(4)
    ]
    got, want = (open_database(tmp_path / f"{name}.duckdb") for name in ("batched", "one-by-one"))
    placeholders = ", ".join("?" for _ in alerts.ALERT_COLUMNS)
    for changes in batches:
        direct_write(got)(alerts.store_changes(changes))
        for change in changes:
            if change.delete:
                want.execute("DELETE FROM alerts WHERE alert_id = ?", [change.row["alert_id"]])
            else:
                want.execute(
                    f"INSERT OR REPLACE INTO alerts ({', '.join(alerts.ALERT_COLUMNS)}) VALUES ({placeholders})",
                    [change.row[c] for c in alerts.ALERT_COLUMNS],
                )
        query = "SELECT * FROM alerts ORDER BY alert_id"
        assert got.execute(query).fetchall() == want.execute(query).fetchall()
    assert want.execute("SELECT count(*) FROM alerts").fetchone()[0]  # rows compared, not two empty tables


def test_deliveries_marked_at_once_equal_them_marked_one_by_one(tmp_path):
    """mark_delivered writes every acknowledged (alert, state) in one statement; an alert listed
    twice keeps its last state, as applying them in order did, and other receivers' rows stay."""
    from datetime import datetime

    at = datetime(2026, 12, 6, 8, 0, 0, 5)
    sent = [("a/1", "firing"), ("b/1", "firing"), ("a/1", "resolved"), ("c/2", "resolved")]
    got, want = (open_database(tmp_path / f"{name}.duckdb") for name in ("at-once", "one-by-one"))
    for conn in (got, want):
        direct_write(conn)(alerts.mark_delivered("slack", [("a/1", "firing")], at))
    direct_write(got)(alerts.mark_delivered("alertmanager", sent, at))
    direct_write(got)(alerts.mark_delivered("alertmanager", [], at))
    for alert_id, state in sent:
        want.execute(
            "INSERT OR REPLACE INTO alert_deliveries VALUES (?, ?, ?, ?)",
            [alert_id, "alertmanager", state, at],
        )
    query = "SELECT * FROM alert_deliveries ORDER BY receiver, alert_id"
    assert got.execute(query).fetchall() == want.execute(query).fetchall()
    assert len(got.execute(query).fetchall()) == 4
