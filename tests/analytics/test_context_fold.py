"""context_drift_holders kept from state: a commit's observations are merged into the holdings,
versions, keys and agents they touch (not their runs recomputed), and after every pass the
state equals the state of every span and the table a full recomputation."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest

from analytics import context_fold, materialize, run_metric
from analytics.registry import compute_metric
from tests import tiers
from tests.analytics.test_materialize import _canonical, _commit, _pass, _store
from tests.fixtures_analytics import make_span, trace_id

AGENTS = ["planner", "writer", "checker"]
SUBJECTS = ["policy", "plan"]
# A pass brings up to date only the table under test and what it reads.
NAMES = ["context_drift_holders"]


def _activity(rng: random.Random, start: float, runs: list[str], count: int, versions: dict) -> list[dict]:
    """``count`` spans from ``start`` (seconds) on: agents reading the subjects' versions (as
    state keys or objectives), writing new ones (some refused), flagging superseded objectives
    and doing other work, in ``runs``."""
    rows = []
    for number in range(count):
        run, agent, subject = rng.choice(runs), rng.choice(AGENTS), rng.choice(SUBJECTS)
        t = start + number * 0.5 + rng.random() * 0.2
        key = (run, subject)
        current = versions.setdefault(key, 1)
        common = {"run": run, "TraceId": trace_id(f"{run}/{rng.randint(0, 2)}"), "agent_id": agent}
        kind = rng.random()
        if kind < 0.4:  # a read, of the current version or an older one
            version = current if rng.random() < 0.7 else max(1, current - 1)
            rows.append(make_span(t, op="read", state_key=subject, state_version=f"v{version}", **common))
        elif kind < 0.55:  # a write: a new version, unless a guard refused it
            refused = rng.random() < 0.3
            if not refused:
                versions[key] = current + 1
            rows.append(
                make_span(
                    t,
                    op="write",
                    state_key=subject,
                    state_version=f"v{current + (0 if refused else 1)}",
                    outcome="rejected" if refused else "ok",
                    **common,
                )  # fmt: skip
            )
        elif kind < 0.7:  # the objective, as an attribute of any span (sometimes flagged)
            rows.append(
                make_span(
                    t,
                    tool_name="plan_step",
                    objective_id=f"goal-{subject}",
                    objective_version=f"o{versions.setdefault((run, 'goal'), 1)}",
                    objective_superseded=rng.random() < 0.1,
                    **common,
                )  # fmt: skip
            )
            if rng.random() < 0.2:
                versions[(run, "goal")] += 1
        else:  # other work: it extends the agent's last span
            rows.append(make_span(t, tool_name="search", tool_args={"q": "x"}, **common))
    return rows


def _fold_now(conn) -> context_fold.Fold:
    """What the next pass would fold (computed, not written)."""
    state = materialize.ready(conn, context_fold.STATE)
    cursor = conn.cursor()
    try:
        changes = materialize.span_changes(cursor, state.seq, materialize.newest_change(conn))
        return context_fold.compute(cursor, "span", changes)
    finally:
        cursor.close()


def _sorted(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas()
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def _assert_state_equals_full(conn) -> None:
    full = context_fold._state_of(conn, None)
    for table in context_fold.TABLES:
        kept = conn.sql(f"SELECT * FROM {table}").to_arrow_table()
        pd.testing.assert_frame_equal(_sorted(kept), _sorted(full[table]), check_dtype=False, obj=table)
    pd.testing.assert_frame_equal(
        _canonical(run_metric(conn, "context_drift_holders")),
        _canonical(compute_metric(conn, "context_drift_holders")),
    )


def test_observations_after_the_kept_ones_are_merged_not_recomputed(tmp_path):
    rng, versions = random.Random(1), {}
    conn = _store(tmp_path)
    runs = ["run-1", "run-2"]
    _commit(conn, _activity(rng, 0, runs, 80, versions))
    assert not _pass(conn, NAMES).failed
    _assert_state_equals_full(conn)
    for round_ in range(1, 4):
        _commit(conn, _activity(rng, 100 * round_, runs, 60, versions))
        fold = _fold_now(conn)
        counts = fold.counts()
        assert counts["keys_merged"] > 0 and counts["keys_from_spans"] == 0 and counts["runs_from_spans"] == 0
        assert fold.redo == [] and fold.keys is None
        assert not _pass(conn, NAMES).failed
        _assert_state_equals_full(conn)
    assert len(run_metric(conn, "context_drift_holders")) > 0  # the merged state found holders


def test_a_key_whose_new_spans_start_before_its_latest_is_computed_again_alone(tmp_path):
    rng, versions = random.Random(2), {}
    conn = _store(tmp_path)
    _commit(conn, _activity(rng, 0, ["run-1", "run-2"], 80, versions))
    assert not _pass(conn, NAMES).failed
    # a read of an old version that started before the writer's latest observation of "policy"
    late = make_span(1, run="run-1", TraceId=trace_id("run-1/0"), agent_id="writer", op="read",
                     state_key="policy", state_version="v1")  # fmt: skip
    after = make_span(500, run="run-2", TraceId=trace_id("run-2/0"), agent_id="checker", op="read",
                      state_key="plan", state_version="v1")  # fmt: skip
    _commit(conn, [late, after])
    fold = _fold_now(conn)
    assert fold.keys is not None and fold.keys.to_pylist() == [
        {"run_id": "run-1", "agent_id": "writer", "subject": "policy"}
    ]
    assert fold.counts()["keys_merged"] == 1 and fold.redo == []
    assert not _pass(conn, NAMES).failed
    _assert_state_equals_full(conn)


def test_a_walk_recomputes_a_run_only_when_it_takes_back_what_folded_spans_said(tmp_path):
    """A parent arriving after its children gives them their agent (the exporter's order): they
    become observations. Whether the children were folded before (without an agent) or not,
    that only adds to the state: they are merged as new spans. A child folded under its trace
    id's run that a late root moves into its conversation's run takes back what the state held
    of the trace's run: both runs are computed again from their spans."""
    conn = _store(tmp_path)
    _commit(conn, _activity(random.Random(3), 0, ["run-1", "run-2"], 40, {}))
    assert not _pass(conn, NAMES).failed

    def family(t: float, trace: str) -> tuple[dict, list[dict]]:
        parent = make_span(
            t, run="run-1", TraceId=trace_id(trace), agent_id="checker", SpanName="invoke_agent"
        )
        children = [
            make_span(
                t + 1 + i,
                run="run-1",
                TraceId=trace_id(trace),
                ParentSpanId=parent["SpanId"],
                op="read",
                state_key="policy",
                state_version="v1",
            )  # fmt: skip
            for i in range(3)
        ]
        return parent, children

    parent, children = family(500, "run-1/late")
    _commit(conn, children)  # not folded yet: no pass between the two commits
    _commit(conn, [parent])
    assert _fold_now(conn).redo == [], "the children were never folded"
    assert not _pass(conn, NAMES).failed
    _assert_state_equals_full(conn)

    parent, children = family(600, "run-1/folded")
    _commit(conn, children)
    assert not _pass(conn, NAMES).failed  # folded with no agent: no observation
    _commit(conn, [parent])
    fold = _fold_now(conn)
    assert fold.redo == [] and fold.counts()["keys_merged"] == 1, "given an agent: merged"
    assert not _pass(conn, NAMES).failed
    _assert_state_equals_full(conn)
    last = conn.execute(
        f"SELECT last_ns FROM {context_fold.KEYS} WHERE run_id = 'run-1' AND agent_id = 'checker' "
        "AND subject = 'policy'"
    ).fetchone()[0]
    assert last == children[-1]["start_ns"]  # the children are the checker's observations now

    trace = trace_id("moved")
    child = make_span(700, run="x", TraceId=trace, agent_id="writer", ParentSpanId="p" * 16,
                      op="read", state_key="plan", state_version="v1")  # fmt: skip
    child["run_id"] = trace  # no conversation id yet: its run is its trace id
    _commit(conn, [child])
    assert not _pass(conn, NAMES).failed  # folded into the trace id's run
    _commit(conn, [make_span(699, run="run-2", TraceId=trace, agent_id="writer", SpanId="p" * 16)])
    assert sorted(_fold_now(conn).redo) == sorted([trace, "run-2"])
    assert not _pass(conn, NAMES).failed
    _assert_state_equals_full(conn)
    assert not conn.execute(
        f"SELECT count(*) FROM {context_fold.KEYS} WHERE run_id = $t", {"t": trace}
    ).fetchone()[0]


@pytest.mark.parametrize("seed", range(4))
def test_the_state_equals_every_spans_state_after_every_batch(tmp_path, seed):
    """Batches in time order, late ones and spans of runs stored long before, in random sizes."""
    rng, versions = random.Random(seed), {}
    conn = _store(tmp_path)
    runs = [f"run-{i}" for i in range(3)]
    clock, seen = 0.0, set()
    for _ in range(tiers.batches(full=6, quick=3)):
        if rng.random() < 0.25:  # a batch that starts before what is kept
            rows = _activity(rng, rng.uniform(0, clock), runs, rng.randint(5, 30), versions)
        else:
            rows = _activity(rng, clock, runs, rng.randint(5, 60), versions)
            clock += 40
        _commit(conn, rows)
        if materialize.ready(conn, context_fold.STATE) is not None:
            seen |= {key for key, value in _fold_now(conn).counts().items() if value}
        assert not _pass(conn, NAMES).failed
        _assert_state_equals_full(conn)
    assert len(compute_metric(conn, "context_drift_holders")) > 0
    assert "keys_merged" in seen
