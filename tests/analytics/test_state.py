"""Shared-state detectors on an in-memory DuckDB built from fixture rows."""

from __future__ import annotations

import pytest

from analytics import Filters, Window, list_metrics, run_metric
from analytics.registry import METRICS
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, new_db

DETECTORS = [
    "divergent_reads", "lost_updates", "rejection_rates", "constraint_ledger", "constraint_drops",
    "goal_divergence", "context_drift_holders", "stale_policy_sends", "repeated_calls", "ping_pong",
    "budget_exhaustion", "duplicate_side_effects", "enforcement_coverage", "run_summary",
]  # fmt: skip


def _stale_write_crew(run: str = "run-1") -> list[dict]:
    read = dict(op="read", tool_name="state_read", state_key="plan", outcome="ok", run=run)
    write = dict(op="write", tool_name="state_write", state_key="plan", outcome="ok", run=run)
    return [
        make_span(0, agent_id="a", state_version="v1", **read),
        make_span(1, agent_id="b", state_version="v1", **read),
        make_span(2, agent_id="b", state_version="v2", state_expected_version="v1", **write),
        make_span(3, agent_id="c", state_version="v2", **read),
        make_span(4, agent_id="a", state_version="v3", state_expected_version="v1", **write),
        make_span(6, agent_id="c", op="step", run=run),
    ]


def test_every_contract_detector_is_registered_with_documented_columns():
    import analytics  # noqa: F401

    names = {metric.name for metric in list_metrics()}
    assert set(DETECTORS) <= names
    for metric in list_metrics():
        assert metric.columns and metric.row and metric.description


def test_unknown_metric_raises_key_error_naming_known_metrics():
    conn = new_db()
    with pytest.raises(KeyError, match="lost_updates"):
        run_metric(conn, "no_such_metric")


@pytest.mark.parametrize("name", DETECTORS)
def test_every_detector_returns_its_documented_columns_on_empty_db(name):
    frame = run_metric(new_db(), name)
    assert list(frame.columns) == list(METRICS[name].columns)
    assert frame.empty


def test_divergent_reads_pairs_agents_that_read_same_version_and_both_wrote():
    conn = new_db()
    insert_spans(conn, _stale_write_crew())
    found = run_metric(conn, "divergent_reads")
    assert len(found) == 1
    row = found.iloc[0]
    assert list(row.agents) == ["a", "b"] and row.version == "v1" and row.state_key == "plan"
    assert len(row.read_span_ids) == 2 and len(row.write_span_ids) == 2
    assert set(row.span_ids) == set(row.read_span_ids) | set(row.write_span_ids)


def test_divergent_reads_ignores_reader_who_saw_the_write_before_writing():
    conn = new_db()
    read = dict(op="read", state_key="k", outcome="ok")
    write = dict(op="write", state_key="k", outcome="ok")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", state_version="v1", **read),
            make_span(1, agent_id="b", state_version="v1", **read),
            make_span(2, agent_id="a", state_version="v2", state_expected_version="v1", **write),
            make_span(3, agent_id="b", state_version="v2", **read),  # b refreshes first
            make_span(4, agent_id="b", state_version="v3", state_expected_version="v2", **write),
        ],
    )
    assert run_metric(conn, "divergent_reads").empty


def test_divergent_reads_ignores_sequential_handoff():
    conn = new_db()
    read = dict(op="read", state_key="k", outcome="ok")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", state_version="v1", **read),
            make_span(1, agent_id="a", op="write", state_key="k", state_version="v2",
                      state_expected_version="v1", outcome="ok"),
            make_span(2, agent_id="b", state_version="v2", **read),
        ],
    )  # fmt: skip
    assert run_metric(conn, "divergent_reads").empty


def test_lost_update_names_clobbered_writer_and_version():
    conn = new_db()
    write = dict(op="write", state_key="budget", outcome="ok")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", state_version="v1", state_expected_version="v0", **write),
            make_span(1, agent_id="b", state_version="v2", **write),  # unversioned, nobody read v1
            make_span(2, agent_id="c", op="read", state_key="budget", state_version="v2"),
            make_span(3, agent_id="c", state_version="v3", state_expected_version="v2", **write),
        ],
    )
    found = run_metric(conn, "lost_updates")
    assert len(found) == 1
    row = found.iloc[0]
    assert (row.agent, row.clobbered_agent, row.clobbered_version, row.kind) == (
        "b", "a", "v1", "unversioned",
    )  # fmt: skip


def test_lost_update_not_reported_when_clobbered_write_was_read_or_rejected():
    conn = new_db()
    write = dict(op="write", state_key="k", outcome="ok")
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", state_version="v1", **write),
            make_span(1, agent_id="b", op="read", state_key="k", state_version="v1"),
            make_span(2, agent_id="b", state_version="v2", **write),
            make_span(3, agent_id="c", op="write", state_key="k", state_version="v3",
                      state_expected_version="v1", outcome="rejected", reject_reason="version_conflict"),
        ],
    )  # fmt: skip
    assert run_metric(conn, "lost_updates").empty


def test_rejection_rates_count_rejections_apart_from_errors_and_flag_threshold():
    conn = new_db()
    call = dict(agent_id="a", tool_name="state_write", state_key="k", op="write")
    insert_spans(
        conn,
        [
            make_span(0, outcome="ok", **call),
            make_span(10, outcome="rejected", reject_reason="version_conflict", **call),
            make_span(20, outcome="error", **call),
            make_span(30, outcome="rejected", reject_reason="version_conflict", **call),
            make_span(900, outcome="ok", **call),
        ],
    )
    found = run_metric(conn, "rejection_rates")
    first = found.iloc[0]
    assert (first.attempts, first.rejections, first.errors) == (4, 2, 1)
    assert first.rejection_rate == pytest.approx(0.5)
    assert bool(first.over_threshold) and first.threshold == 0.25
    assert first.threshold_version == 0 and not first.calibrated
    assert found.iloc[-1].rejection_rate == 0.0
    assert found.iloc[0].trend_per_hour < 0  # rate falls from 0.5 to 0


def test_filters_window_run_and_agent_restrict_findings():
    conn = new_db()
    insert_spans(conn, _stale_write_crew("run-1") + _stale_write_crew("run-2"))
    assert len(run_metric(conn, "divergent_reads")) == 2
    assert len(run_metric(conn, "divergent_reads", filters=Filters(run="run-2"))) == 1
    assert run_metric(conn, "divergent_reads", filters=Filters(agent="c")).empty
    assert len(run_metric(conn, "divergent_reads", filters=Filters(agent="b"))) == 2
    assert run_metric(conn, "divergent_reads", filters=Filters(service="other")).empty
    from tests.fixtures_analytics import BASE_TIME

    assert run_metric(conn, "divergent_reads", Window(until=BASE_TIME)).empty


@pytest.mark.parametrize("when", ["1999-12-31 23:59:59.5", "2000-01-03 00:00:00", "2026-03-01 10:17:03"])
def test_rejection_rate_buckets_start_where_time_bucket_puts_them(when):
    # rejection_rates buckets calls by integer division from time_bucket's origin (2000-01-03);
    # calls before the origin need floor division, not truncation.
    from datetime import datetime

    start = datetime.fromisoformat(when)
    offset = (start - BASE_TIME).total_seconds()
    conn = new_db()
    call = dict(agent_id="a", tool_name="send", outcome="rejected")
    insert_spans(conn, [make_span(offset, **call), make_span(offset + 30, **call)])
    found = run_metric(conn, "rejection_rates")
    (seconds,) = set(found.bucket_seconds)
    expected = conn.execute(
        "SELECT time_bucket(to_seconds(?::BIGINT), Timestamp) AS b, count(*) FROM spans GROUP BY b ORDER BY b",
        [seconds],
    ).fetchall()
    assert list(zip(found.bucket_start, found.attempts, strict=True)) == expected


def test_lost_updates_with_equal_first_seen_and_key_are_ordered_by_run():
    conn = new_db()
    write = dict(op="write", state_key="k", outcome="ok")
    rows = []
    for run in ("run-b", "run-a", "run-c"):
        rows += [
            make_span(0, run=run, agent_id="a", state_version="v1", **write),
            make_span(1, run=run, agent_id="b", state_version="v2", **write),
        ]
    insert_spans(conn, rows)
    found = run_metric(conn, "lost_updates")
    assert list(found.run_id) == ["run-a", "run-b", "run-c"]
