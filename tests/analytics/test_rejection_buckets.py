"""rejection_rates after a batch: the touched buckets counted again, the other buckets' rows kept."""

from __future__ import annotations

import random
from datetime import timedelta

import duckdb
import pandas as pd
import pytest

from analytics import Filters, Window, kept, run_metric, state
from driftscope.database import migrate
from tests import tiers
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, trace_id

HOUR = 3600


def _call(rng: random.Random, t: float, run: str, trace: str, batch: int) -> dict:
    """A guarded call: a refusal, a failure or a success, by one of three agents."""
    return make_span(
        t, run=run, TraceId=trace, agent_id=rng.choice(["a", "b", None]),
        op="write", tool_name=rng.choice(["state_write", "send_email"]),
        state_key=rng.choice(["k1", "k2", None]), outcome=rng.choice(["ok", "ok", "rejected", "error"]),
        ServiceName=rng.choice(["crew", "crew", "other"]), ingested_at=BASE_TIME + timedelta(seconds=batch),
    )  # fmt: skip


def _full(conn, window, filters) -> pd.DataFrame:
    with kept.computed_in_full():
        return run_metric(conn, "rejection_rates", window, filters)


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_rejection_rates_after_each_batch_equal_a_full_computation_bucket_by_bucket(tmp_path, seed):
    """Twenty hours of guarded calls in hourly buckets; each batch adds calls to the newest runs'
    latest hours, sometimes to an old run's old hour (its trace: that bucket is counted again) or
    fills the agent of a trace's earlier calls (as the collector does in the commit of their new
    spans). After each batch every scope's answer equals a full computation (values, types, order),
    and the touched buckets were counted again rather than every span."""
    rng = random.Random(seed)
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    rows = []
    for run_index in range(20):
        run = f"run-{run_index}"
        rows += [_call(rng, run_index * HOUR + rng.random() * HOUR, run, trace_id(run), 0) for _ in range(12)]
    insert_spans(conn, rows)
    scopes = [(Window(), Filters()), (Window(), Filters(agent="a")), (Window(), Filters(service="other")),
              (Window(since=BASE_TIME + timedelta(hours=6)), Filters())]  # fmt: skip
    kept.clear_cache()
    for window, filters in scopes:
        run_metric(conn, "rejection_rates", window, filters)
    before = kept.stats.copy()
    batches = tiers.batches(full=6, quick=4)
    for batch in range(1, batches + 1):
        now = 20 * HOUR + batch * 60
        new = [
            _call(rng, now - rng.random() * 600, f"run-{19 - i}", trace_id(f"run-{19 - i}"), batch)
            for i in range(3)
        ]
        if rng.random() < 0.5:  # a late call in an old run, in an old hour
            old = rng.randrange(0, 15)
            new.append(
                _call(rng, old * HOUR + rng.random() * HOUR, f"run-{old}", trace_id(f"run-{old}"), batch)
            )
        insert_spans(conn, new)
        if rng.random() < 0.5:
            conn.execute(
                "UPDATE spans SET agent_id = 'a' WHERE agent_id IS NULL AND TraceId = ?", [new[0]["TraceId"]]
            )
        for window, filters in scopes:
            got = run_metric(conn, "rejection_rates", window, filters)
            pd.testing.assert_frame_equal(got, _full(conn, window, filters))
    # most answers came from the touched buckets (some scopes' batches touch none of their calls)
    assert kept.stats["rejection_buckets"] - before["rejection_buckets"] >= batches * len(scopes) // 2


def test_rejection_rates_with_most_buckets_touched_or_a_wider_bucket_are_counted_otherwise(
    tmp_path, monkeypatch
):
    """Past REJECTION_BUCKET_SHARE of the buckets, or when the data outgrows 48 buckets (they
    widen), the bucket update gives way (to the per-run parts, or a full computation); the answer
    is the same."""
    rng = random.Random(7)
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    insert_spans(conn, [_call(rng, h * HOUR + 5, f"run-{h}", trace_id(f"run-{h}"), 0) for h in range(10)])
    kept.clear_cache()
    run_metric(conn, "rejection_rates")
    monkeypatch.setattr(state, "REJECTION_BUCKET_SHARE", 0.0)
    before = kept.stats.copy()
    insert_spans(conn, [_call(rng, 9 * HOUR + 50, "run-9", trace_id("run-9"), 1)])
    pd.testing.assert_frame_equal(run_metric(conn, "rejection_rates"), _full(conn, Window(), Filters()))
    assert kept.stats["rejection_buckets"] == before["rejection_buckets"]
    monkeypatch.setattr(state, "REJECTION_BUCKET_SHARE", 0.25)
    # 60 hours of data: 6-hour buckets, not the kept result's hours
    insert_spans(conn, [_call(rng, 60 * HOUR, "run-9", trace_id("run-9"), 2)])
    got = run_metric(conn, "rejection_rates")
    pd.testing.assert_frame_equal(got, _full(conn, Window(), Filters()))
    assert set(got["bucket_seconds"]) == {6 * HOUR}
    assert kept.stats["rejection_buckets"] == before["rejection_buckets"]
