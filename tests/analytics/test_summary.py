"""Enforcement coverage and the per-run summary verdict."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import duckdb
import pandas as pd
import pytest

from analytics import METRICS, Filters, Window, data_version, kept, kept_store, run_metric, summary
from analytics.thresholds import current_threshold
from driftscope.database import migrate
from tests import tiers
from tests.fixtures_analytics import BASE_TIME, insert_spans, make_span, new_db, trace_id


def test_enforcement_coverage_separates_enforced_partial_and_watch_only_tools():
    conn = new_db()
    insert_spans(
        conn,
        [
            make_span(0, agent_id="a", tool_name="state_write", op="write", state_key="k",
                      state_expected_version="v0", state_version="v1", outcome="ok"),
            make_span(1, agent_id="b", tool_name="state_write", op="write", state_key="k",
                      state_expected_version="v0", state_version="v2", outcome="rejected",
                      reject_reason="version_conflict"),
            make_span(2, agent_id="a", tool_name="notes_write", op="write", state_key="n", outcome="ok"),
            make_span(3, agent_id="a", tool_name="notes_write", op="write", state_key="n",
                      state_expected_version="v1", outcome="ok"),
            make_span(4, agent_id="a", tool_name="web_search", tool_args={"q": "x"}),
        ],
    )  # fmt: skip
    coverage = run_metric(conn, "enforcement_coverage").set_index("tool_name")
    assert coverage.loc["state_write", "coverage"] == "enforced"
    assert coverage.loc["state_write", "prevented"] == 1
    assert list(coverage.loc["state_write", "prevented_reasons"]) == ["version_conflict"]
    assert coverage.loc["notes_write", "coverage"] == "partial"
    assert coverage.loc["notes_write", "anti_patterns"] == 1
    assert coverage.loc["web_search", "coverage"] == "watch_only"


def test_run_summary_verdicts_failing_degraded_healthy():
    conn = new_db()
    write = dict(op="write", state_key="k", outcome="ok", tool_name="state_write")
    insert_spans(
        conn,
        [
            # run-bad: b's unversioned write clobbers a's unread write (lost update)
            make_span(0, run="run-bad", agent_id="a", state_version="v1", **write),
            make_span(1, run="run-bad", agent_id="b", state_version="v2", **write),
            # run-guarded: the guard refused a stale write
            make_span(0, run="run-guarded", agent_id="a", op="write", state_key="k", outcome="rejected",
                      reject_reason="version_conflict", state_expected_version="v0"),
            # run-ok: a clean versioned write
            make_span(0, run="run-ok", agent_id="a", state_version="v1", state_expected_version="v0",
                      **write),
        ],
    )  # fmt: skip
    summary = run_metric(conn, "run_summary").set_index("run_id")
    assert summary.loc["run-bad", "verdict"] == "failing"
    assert summary.loc["run-bad", "lost_updates_count"] == 1
    assert list(summary.loc["run-bad", "agents"]) == ["a", "b"]
    assert summary.loc["run-guarded", "verdict"] == "degraded"
    assert summary.loc["run-guarded", "rejections"] == 1
    assert summary.loc["run-ok", "verdict"] == "healthy"


# --- run_summary brought up to date incrementally equals a full recomputation -----------------

_AGENTS = ["a", "b", "c", None]
_KEYS = ["k1", "k2", "plan"]


def _random_batch(rng: random.Random, batch: int, runs: list[str]) -> list[dict]:
    """Spans of every kind the counted detectors look at, over a few runs, traces and origin
    tasks (an origin task may span runs), some without run or agent."""
    rows = []
    for _ in range(rng.randint(1, 12)):
        run = rng.choice(runs)
        trace = trace_id(f"{run}/{rng.randint(0, 2)}")
        fields: dict = dict(
            run=run,
            TraceId=trace,
            agent_id=rng.choice(_AGENTS),
            outcome=rng.choice(["ok", "ok", "ok", "rejected", None]),
            ingested_at=BASE_TIME + timedelta(seconds=batch),
        )
        if rng.random() < 0.1:
            fields["run_id"] = trace  # no run yet: counted under its trace id
        kind = rng.choice(["read", "write", "write", "send", "delegate", "step", "call"])
        if kind in ("read", "write"):
            fields.update(op=kind, state_key=rng.choice(_KEYS), state_version=f"v{rng.randint(1, 4)}")
            if kind == "write" and rng.random() < 0.6:
                fields["state_expected_version"] = f"v{rng.randint(0, 3)}"
        elif kind == "send":
            fields.update(op="send", tool_name="send_email", side_effect=True,
                          policy_version=f"p{rng.randint(1, 3)}",
                          idempotency_key=rng.choice([None, "i1", "i2"]),
                          tool_args={"to": rng.choice(["x", "y"])})  # fmt: skip
        elif kind == "delegate":
            ledger = ["C1", "C2", "C3"]
            fields.update(op="delegate", origin_task_id=rng.choice(["t1", "t2", f"t-{run}"]),
                          hop=rng.randint(1, 3), delegate_to=rng.choice(["a", "b", "c"]),
                          constraints_carried=rng.sample(ledger, rng.randint(0, 3)))  # fmt: skip
            if rng.random() < 0.3:
                fields["constraints_ledger"] = ledger
        elif kind == "step":
            fields.update(op="step", objective_id="goal", objective_version=f"o{rng.randint(1, 3)}",
                          budget_max_steps=3, step=rng.randint(1, 5))  # fmt: skip
        else:
            fields.update(tool_name=rng.choice(["search", "fetch"]), tool_args={"q": rng.choice(["a", "b"])})
        rows.append(make_span(batch * 5 + rng.random() * 20, **fields))
    return rows


@pytest.mark.parametrize(
    "seed",
    [
        0,  # make test-fast: one seed, three batches (tests/tiers.py); make test: two; make test-deep: twelve
        pytest.param(1, marks=pytest.mark.slow),
        *(pytest.param(s, marks=pytest.mark.deep) for s in range(2, 12)),
    ],
)
def test_incremental_run_summary_equals_a_full_one_on_random_span_sets(tmp_path, seed):
    rng = random.Random(seed)
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    runs = [f"run-{i}" for i in range(rng.randint(2, 5))]
    scopes = [(Window(), Filters()), (Window(), Filters(agent="a")),
              (Window(since=BASE_TIME + timedelta(seconds=8)), Filters(origin_task="t1"))]  # fmt: skip
    summary.clear_cache()
    for batch in range(tiers.batches(full=5, quick=3)):
        insert_spans(conn, _random_batch(rng, batch, runs))
        if rng.random() < 0.3:
            # The collector fills inherited fields of earlier spans of a trace in the commit that
            # stores new spans of that trace.
            trace = trace_id(f"{rng.choice(runs)}/0")
            conn.execute("UPDATE spans SET agent_id = 'c' WHERE agent_id IS NULL AND TraceId = ?", [trace])
            conn.execute("INSERT INTO spans SELECT * REPLACE (SpanId || 'x' AS SpanId, "
                         "ingested_at + INTERVAL 1 MICROSECOND AS ingested_at) FROM spans "
                         "WHERE TraceId = ? LIMIT 1", [trace])  # fmt: skip
        for window, filters in scopes:
            kept = run_metric(conn, "run_summary", window, filters)  # brought up to date
            pd.testing.assert_frame_equal(kept, _full_summary(conn, window, filters))


def _full_summary(conn, window, filters) -> pd.DataFrame:
    """run_summary recomputed from scratch, past the kept state (the registered column order)."""
    threshold = current_threshold(conn, "goal_divergence")
    with kept.computed_in_full():  # the detectors it reads run in full too
        parts = summary._compute_parts(conn, window, filters, threshold.value)
    frame = summary._assemble(conn, parts, threshold)
    return frame.loc[:, list(METRICS["run_summary"].columns)]


def test_incremental_run_summary_recomputes_only_touched_runs_and_follows_deletes(tmp_path):
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    summary.clear_cache()
    write = dict(op="write", state_key="k", outcome="ok", tool_name="state_write")
    insert_spans(conn, [make_span(0, run="run-1", agent_id="a", state_version="v1", **write),
                        make_span(1, run="run-2", agent_id="a", state_version="v1", **write)])  # fmt: skip
    assert list(run_metric(conn, "run_summary")["verdict"]) == ["healthy", "healthy"]
    version, touched = summary._read_version(conn, None)
    # b clobbers a's write in run-2 only: run-2 alone is touched
    insert_spans(conn, [make_span(2, run="run-2", agent_id="b", state_version="v2", **write)])
    assert summary._read_version(conn, version)[1] == {trace_id("run-2")}
    rows = run_metric(conn, "run_summary").set_index("run_id")
    assert rows.loc["run-2", "lost_updates_count"] == 1 and rows.loc["run-2", "verdict"] == "failing"
    assert rows.loc["run-1", "verdict"] == "healthy"
    # a delete (retention) cannot be followed span by span: everything is recomputed
    version = summary._read_version(conn, None)[0]
    conn.execute("DELETE FROM spans WHERE agent_id = 'b'")
    assert summary._read_version(conn, version)[1] is None
    assert list(run_metric(conn, "run_summary")["verdict"]) == ["healthy", "healthy"]
    # a batch stored late (ingested long before the newest span) is caught by the count
    late = make_span(3, run="run-1", agent_id="b", state_version="v2", **write)
    late["ingested_at"] = BASE_TIME - timedelta(hours=1)
    version = summary._read_version(conn, None)[0]
    insert_spans(conn, [late])
    assert summary._read_version(conn, version)[1] is None
    assert run_metric(conn, "run_summary").set_index("run_id").loc["run-1", "verdict"] == "failing"


def test_read_version_of_unchanged_data_and_an_equal_count_swap_of_recent_spans(tmp_path):
    """On unchanged data the version is read from two numbers of the recent spans (their
    fingerprint), not by listing them; a delete and a late insert that keep the count, the newest
    ingested_at and the thresholds still change the fingerprint, so the kept summary follows."""
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    summary.clear_cache()
    write = dict(op="write", state_key="k", outcome="ok", tool_name="state_write")
    first = make_span(0, run="run-1", agent_id="a", state_version="v1", **write)
    insert_spans(conn, [first, make_span(1, run="run-1", agent_id="a", state_version="v1", **write),
                        make_span(2, run="run-2", agent_id="a", state_version="v1", **write)])  # fmt: skip
    assert list(run_metric(conn, "run_summary")["verdict"]) == ["healthy", "healthy"]
    version, _ = data_version.read_version(conn, None)
    assert version.fingerprint is not None and version.fingerprint[0] == 3
    again, touched = data_version.read_version(conn, version)
    assert touched == set() and again == version
    # the version is stored with its fingerprint; one stored before it existed has none (listed)
    assert kept_store.parse_version(kept_store.version_text(version)) == version
    old_text = json.loads(kept_store.version_text(version))
    del old_text["fingerprint"]
    old = kept_store.parse_version(json.dumps(old_text))
    assert old.fingerprint is None and data_version.read_version(conn, old)[1] == set()
    # run-1 loses a span and run-2 gets a late one (b clobbers a's write): same count, same newest
    conn.execute("DELETE FROM spans WHERE SpanId = ?", [first["SpanId"]])
    late = make_span(3, run="run-2", agent_id="b", state_version="v2", **write)
    late["ingested_at"] = BASE_TIME - timedelta(seconds=1)
    insert_spans(conn, [late])
    spans, newest = conn.execute("SELECT count(*), max(ingested_at) FROM spans").fetchone()
    assert (spans, newest) == (version.spans, version.newest)
    assert data_version.read_version(conn, version)[1] is None  # run-1 shrank: everything again
    rows = run_metric(conn, "run_summary").set_index("run_id")
    assert rows.loc["run-2", "verdict"] == "failing"
    pd.testing.assert_frame_equal(run_metric(conn, "run_summary"), _full_summary(conn, Window(), Filters()))


def test_read_version_after_the_newest_spans_are_deleted(tmp_path):
    """The newest ingested_at is read from the earlier version's on (the newest row groups only);
    when every span that new is gone, it is read again over all spans and everything recomputed."""
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    summary.clear_cache()
    insert_spans(conn, [make_span(0, run="run-1", agent_id="a", op="write", outcome="ok")])
    newer = make_span(1, run="run-2", agent_id="a", op="write", outcome="rejected")
    newer["ingested_at"] = BASE_TIME + timedelta(minutes=5)
    insert_spans(conn, [newer])
    assert run_metric(conn, "run_summary").set_index("run_id").loc["run-2", "verdict"] == "degraded"
    version, _ = data_version.read_version(conn, None)
    assert version.newest == BASE_TIME + timedelta(minutes=5)
    conn.execute("DELETE FROM spans WHERE run_id = 'run-2'")
    after, touched = data_version.read_version(conn, version)
    assert touched is None and (after.spans, after.newest) == (1, BASE_TIME)
    assert list(run_metric(conn, "run_summary")["run_id"]) == ["run-1"]


def test_reads_within_one_version_see_the_data_at_the_first_read(tmp_path):
    """Within ``one_version()`` read_version answers each earlier version once: a span committed
    after the first read is not seen by a later read from the same earlier version in the block
    (run_summary's detector reads, a refresh pass), and is touched at the first read after it."""
    conn = duckdb.connect(str(tmp_path / "spans.duckdb"))
    migrate(conn)
    insert_spans(conn, [make_span(0, run="run-1", agent_id="a", op="write", outcome="ok")])
    before, _ = data_version.read_version(conn, None)
    insert_spans(conn, [make_span(1, run="run-2", agent_id="a", op="write", outcome="ok")])
    with data_version.one_version():
        first, touched = data_version.read_version(conn, before)
        late = make_span(2, run="run-3", agent_id="a", op="write", outcome="ok")
        late["ingested_at"] = BASE_TIME + timedelta(seconds=3)
        insert_spans(conn, [late])
        with data_version.one_version():  # nested: the outer block's answers
            again, touched_again = data_version.read_version(conn, before)
        touched_again.clear()  # each caller gets its own set
        assert data_version.read_version(conn, before) == (first, touched)
        assert touched and touched_again == set() and again == first and first.spans == 2
    after, touched_after = data_version.read_version(conn, before)
    assert after.spans == 3 and len(touched_after) == 2
    later, touched_later = data_version.read_version(conn, first)
    assert later.spans == 3 and touched_later == {late["TraceId"]}


def test_a_run_whose_framework_recorded_no_arguments_or_tasks_says_so_in_coverage():
    conn = new_db()
    insert_spans(
        conn,
        [
            make_span(0, run="blind", agent_id="manager", op="delegate", delegate_to="researcher"),
            make_span(1, run="blind", agent_id="researcher", span_family="agent", hop=1,
                      ScopeName="gcp.vertex.agent"),
            make_span(2, run="blind", agent_id="researcher", tool_name="web_search"),
            make_span(3, run="blind", agent_id="researcher", tool_name="web_search", tool_args={"query": "x"}),
            make_span(5, run="seen", agent_id="researcher", tool_name="web_search", tool_args={"query": "x"}),
        ],
    )  # fmt: skip
    summary = run_metric(conn, "run_summary").set_index("run_id")
    note = summary.loc["blind", "coverage"]
    assert "repeated calls and duplicate side effects not measurable (1 of 2 calls)" in note
    assert "goal drift not measurable" in note
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY" in note
    assert summary.loc["blind", "verdict"] == "healthy"  # not a failure: unknown, and said so
    assert pd.isna(summary.loc["seen", "coverage"])
